"""The ClusterStaticEntries of one pool's jobs: made once a Pod has a UID and a node, deleted
with the Pod, and collected when their Pod is gone.

A cluster-scoped object cannot be owned by a Pod (Kubernetes' garbage collector never
collects it), so the controller deletes each entry itself and collects leftovers by label.
The entry's SPIFFE ID comes from the job's assignment, never from the Pod's annotations
(anyone who may patch Pods could rewrite those). `status.set` is not read: spire-controller-
manager sets it back to false on its next pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from dynrunner.controller import contract
from dynrunner.controller.backends.kubernetes import identity
from dynrunner.controller.backends.kubernetes.api import AlreadyExists, KubeApi, KubeError, NotFound
from dynrunner.controller.backends.kubernetes.builders import PodSettings, cluster_static_entry
from dynrunner.proto.assignment import Assignment

log = logging.getLogger(__name__)

NODE_TTL_S = 600.0
"""How long a Node's UID is reused (a Node deleted and registered again gets a new one)."""

AssignmentSource = Callable[[str], Awaitable[Assignment]]


class Entries:
    def __init__(self, api: KubeApi, settings: PodSettings, assignment_of: AssignmentSource) -> None:
        self._api = api
        self._settings = settings
        self._assignment_of = assignment_of
        self._nodes: dict[str, tuple[float, str]] = {}
        self._node_fetches: dict[str, asyncio.Future[str]] = {}
        self._made: dict[str, str] = {}
        """Assignment id → the Pod UID its entry names (made, or found right)."""
        self._making: dict[str, asyncio.Task[None]] = {}

    @property
    def selector(self) -> str:
        return ",".join(
            [
                f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}",
                f"{contract.LABEL_POOL}={self._settings.pool}",
                f"{identity.LABEL_NAMESPACE}={self._settings.namespace}",
            ]
        )

    def made_for(self, assignment_id: str) -> str | None:
        return self._made.get(assignment_id)

    def ensure(self, pod: dict[str, Any]) -> None:
        """Start making the entry of a scheduled Pod, unless it is made or being made."""
        meta = pod.get("metadata") or {}
        assignment_id = (meta.get("labels") or {}).get(contract.LABEL_ASSIGNMENT_ID)
        uid, node = meta.get("uid"), (pod.get("spec") or {}).get("nodeName")
        if not assignment_id or not uid or not node or meta.get("deletionTimestamp"):
            return
        if self._made.get(assignment_id) == uid or assignment_id in self._making:
            return
        task = asyncio.create_task(self._make(assignment_id, uid, node, meta), name=f"entry-{assignment_id}")
        self._making[assignment_id] = task
        task.add_done_callback(lambda _: self._making.pop(assignment_id, None))

    async def _make(self, assignment_id: str, uid: str, node: str, meta: dict[str, Any]) -> None:
        try:
            assignment = await self._assignment_of(assignment_id)
            labels = meta.get("labels") or {}
            seq = labels.get(contract.LABEL_STREAM_SEQ, "")
            body = cluster_static_entry(
                assignment,
                self._settings,
                pod_uid=uid,
                node_name=node,
                node_uid=await self.node_uid(node),
                stream_seq=int(seq) if seq.isdigit() else None,
            )
            await self._create(body)
            self._made[assignment_id] = uid
            log.info("identity %s registered for Pod %s on %s", body["spec"]["spiffeID"], uid, node)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # tried again at the Pod's next change or the next sweep
            log.warning("the identity entry of %s could not be made yet: %s", assignment_id, err)

    async def _create(self, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        try:
            await self._api.create_entry(body)
        except AlreadyExists:
            existing = await self._api.get_entry(name)
            if identity.same_binding(existing, body):
                return
            # Bound to an earlier Pod of the same job (deleted and launched again): replace it.
            await self.delete(name)
            await self._api.create_entry(body)

    async def node_uid(self, name: str) -> str:
        """The Node's UID (SPIRE's k8s_psat agent ID names it): one GET per node and TTL,
        shared by the jobs that ask at the same time."""
        cached = self._nodes.get(name)
        if cached is not None and time.monotonic() - cached[0] < NODE_TTL_S:
            return cached[1]
        pending = self._node_fetches.get(name)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch_node(name))
            self._node_fetches[name] = pending
            pending.add_done_callback(_retrieved)
            pending.add_done_callback(lambda _: self._node_fetches.pop(name, None))
        return await asyncio.shield(pending)

    async def _fetch_node(self, name: str) -> str:
        node = await self._api.get_node(name)
        uid = str((node.get("metadata") or {}).get("uid") or "")
        if not uid:
            raise KubeError(0, "NoUID", f"Node {name} has no UID")
        self._nodes[name] = (time.monotonic(), uid)
        return uid

    async def delete(self, name: str) -> None:
        try:
            await self._api.delete_entry(name)
        except NotFound:
            pass

    async def forget(self, assignment_id: str) -> None:
        """The job is reaped: let a making in flight end (its request runs in a thread that
        cancelling would not stop: the entry would appear after the delete), delete its entry."""
        task = self._making.pop(assignment_id, None)
        if task is not None:
            await asyncio.gather(asyncio.shield(task), return_exceptions=True)
        self._made.pop(assignment_id, None)
        await self.delete(contract.environment_name(assignment_id))

    async def collect(self, live_uids: Collection[str], launching: Collection[str]) -> list[str]:
        """Delete this pool's entries whose Pod no longer exists."""
        listed = await self._api.list_entries(self.selector)
        removed = []
        for item in listed.get("items") or []:
            labels = (item.get("metadata") or {}).get("labels") or {}
            if labels.get(identity.LABEL_POD_UID) in live_uids:
                continue
            if labels.get(contract.LABEL_ASSIGNMENT_ID) in launching:
                continue
            name = item["metadata"]["name"]
            await self.delete(name)
            self._made.pop(labels.get(contract.LABEL_ASSIGNMENT_ID, ""), None)
            removed.append(f"ClusterStaticEntry {name}")
        return removed

    async def aclose(self) -> None:
        tasks = list(self._making.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _retrieved(future: asyncio.Future[str]) -> None:
    if not future.cancelled():
        future.exception()  # its waiters may all be gone: no "never retrieved" noise
