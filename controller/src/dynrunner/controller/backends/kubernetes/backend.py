"""The `kubernetes` backend: one Pod per job, its assignment in a Secret the Pod owns, and its
SPIFFE identity in a ClusterStaticEntry (docs/kubernetes.md).

What the controller knows about the pool's Pods comes from one list-then-watch (`Informer`):
finding, listing, observing and following starts read that cache and send no request; the
Pods' events come from a second watch. `watch` (the `Watches` hook) wakes the reaper for each
Pod whose phase changed, including a start whose time ran out. Creating is idempotent (409 is success,
a half-made pair is completed) and returns once the Secret and the Pod exist; `follow_start`
turns the Pod's progress into stage lines. Deleting removes the Pod and the entry (and the
Secret when Kubernetes was not told it belongs to the Pod). A Pod deleted by someone else
stays visible as a tombstone — its last state — until the reaper has finalized its task and
reaped it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import AsyncIterator, Collection
from datetime import UTC, datetime, timedelta
from typing import Any

from dynrunner.controller import contract
from dynrunner.controller.backends.base import (
    BackendError,
    Diagnosis,
    Environment,
    FailureReason,
    JobRefused,
    Observation,
    Phase,
    StartEvent,
    StartStage,
    Wake,
)
from dynrunner.controller.backends.kubernetes import builders, identity, services
from dynrunner.controller.backends.kubernetes.api import AlreadyExists, KubeApi, NotFound
from dynrunner.controller.backends.kubernetes.builders import PodSettings
from dynrunner.controller.backends.kubernetes.check import Finding, check
from dynrunner.controller.backends.kubernetes.diagnosis import (
    PodFacts,
    classify,
    essentials,
    executor_ran,
    job_container_waits,
    parse_time,
)
from dynrunner.controller.backends.kubernetes.entries import Entries
from dynrunner.controller.backends.kubernetes.informer import Informer
from dynrunner.controller.backends.kubernetes.progress import start_lines, started_line
from dynrunner.controller.config.model import ControllerConfig, PoolConfig
from dynrunner.proto.assignment import Assignment, decode, encode

log = logging.getLogger(__name__)

NAME = "kubernetes"
SYNC_TIMEOUT_S = 30.0
ORPHAN_AGE = timedelta(minutes=1)
EVENTS_KEPT = 30
POD_EVENTS = "involvedObject.kind=Pod"
TICK_S = 1.0
"""How often time-based verdicts (an image pull or a start that took too long) are looked for."""


class KubernetesBackend:
    name = NAME

    def __init__(self, settings: PodSettings, api: KubeApi) -> None:
        self.settings = settings
        self.api = api
        self.pool = settings.pool
        self.namespace = settings.namespace
        self.selector = f"{contract.LABEL_POOL}={self.pool},{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY}"
        self.pods = Informer(
            f"pods of pool {self.pool}",
            lambda: api.list_pods(self.namespace, self.selector),
            lambda version, timeout: api.watch_pods(self.namespace, self.selector, version, timeout),
            self._on_pod,
            on_list=self._on_list,
            transform=essentials,
        )
        self.pod_events = Informer(
            f"events in {self.namespace}",
            lambda: api.list_events(self.namespace, POD_EVENTS, limit=1),
            lambda version, timeout: api.watch_events(self.namespace, POD_EVENTS, version, timeout),
            self._on_event,
            cache=False,
        )
        self.entries = Entries(api, settings, self._assignment_of)
        self._wake: Wake | None = None
        self._followers: dict[str, set[asyncio.Event]] = {}
        self._phases: dict[str, Phase] = {}
        """Each Pod's phase when the reaper was last woken for it (woken again on a change only)."""
        self._assignments: dict[str, Assignment] = {}
        self._tombstones: dict[str, dict[str, Any]] = {}
        self._deleted: set[str] = set()
        self._owned: set[str] = set()
        self._events: dict[str, dict[str, dict[str, Any]]] = {}
        self._running: asyncio.Task[None] | None = None
        self.orphan_age = ORPHAN_AGE
        """A Secret without its Pod younger than this may be a launch in progress elsewhere."""

    @classmethod
    def from_config(cls, pool: PoolConfig, config: ControllerConfig) -> KubernetesBackend:
        settings = PodSettings.from_config(pool, config)
        problems = settings.problems()
        if problems:
            raise BackendError("; ".join(problems))
        backend = settings.backend
        return cls(settings, KubeApi.connect(backend.kubeconfig, backend.context))

    # -- the watches --------------------------------------------------------------------------

    async def run(self) -> None:
        """Watch the pool's Pods and their events until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.pods.run(), name=f"watch-pods-{self.pool}")
            group.create_task(self.pod_events.run(), name=f"watch-events-{self.pool}")

    async def _ready(self) -> None:
        if self._running is None:
            self._running = asyncio.create_task(self.run(), name=f"kubernetes-{self.pool}")
        if self.pods.synced.is_set():
            return
        try:
            await asyncio.wait_for(asyncio.shield(self.pods.synced.wait()), SYNC_TIMEOUT_S)
        except TimeoutError:
            raise BackendError(
                f"the Pods of pool {self.pool} cannot be listed in namespace {self.namespace} "
                f"at {self.api.host} (see the controller's log)"
            ) from None

    async def watch(self, wake: Wake) -> None:
        """The `Watches` hook: wake the reaper for each Pod whose phase changed (as the
        classifier sees it), and for a start that ran out of time (nothing in the Pod changes
        then: a tick over the cached Pods still starting notices)."""
        self._wake = wake
        try:
            await self._ready()
            while True:
                await asyncio.sleep(TICK_S)
                self._look_at_starts()
        finally:
            self._wake = None

    def _look_at_starts(self) -> None:
        """Starts can fail by time alone (an image pull or a start that took too long; the job
        container's image is pulled after the executor started)."""
        for name, pod in list(self.pods.cache.items()):
            phase = self._phases.get(name, Phase.STARTING)
            if phase is Phase.STARTING or (phase is Phase.RUNNING and job_container_waits(pod)):
                self._wake_on_change(name, pod)

    def _notify(self, pod: dict[str, Any], *, deleted: bool = False) -> None:
        """Followers look at every change; the reaper is woken when the Pod's phase changed."""
        name = (pod.get("metadata") or {}).get("name", "")
        for changed in self._followers.get(name, ()):
            changed.set()
        if deleted:
            self._phases.pop(name, None)
            self._wake_for(pod)
        else:
            self._wake_on_change(name, pod)

    def _wake_on_change(self, name: str, pod: dict[str, Any]) -> None:
        if name in self._deleted or not _labels_ok(pod):
            return
        phase = self._classify(name, pod, gone=False).phase
        if self._phases.get(name) is not phase:
            self._phases[name] = phase
            self._wake_for(pod)

    def _wake_for(self, pod: dict[str, Any]) -> None:
        assignment_id = ((pod.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_ASSIGNMENT_ID)
        if self._wake is not None and assignment_id:
            self._wake(assignment_id)

    def _on_list(self) -> None:
        """Listed again (first sync, or after 410 Gone): any environment may have changed."""
        for followers in self._followers.values():
            for changed in followers:
                changed.set()
        if self._wake is not None:
            self._wake(None)

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            if name in self._deleted:
                self._deleted.discard(name)
            elif _labels_ok(pod):
                self._tombstones[name] = pod
            self._events.pop(name, None)
        elif self.settings.backend.identity and name not in self._deleted:
            self.entries.ensure(pod)  # not for a Pod being deleted: a late event would remake its entry
        self._notify(pod, deleted=kind == "DELETED")

    def _on_event(self, kind: str, event: dict[str, Any]) -> None:
        """Keep the recent events of the pool's Pods (a repeated event comes MODIFIED, with
        its count raised): for start lines and diagnoses that only events carry."""
        involved = event.get("involvedObject") or {}
        name = str(involved.get("name") or "")
        if kind == "DELETED" or name not in self.pods.cache:
            return
        kept = self._events.setdefault(name, {})
        kept.pop(event["metadata"]["name"], None)
        kept[event["metadata"]["name"]] = {
            "reason": event.get("reason"),
            "message": event.get("message"),
            "fieldPath": involved.get("fieldPath") or "",
        }
        while len(kept) > EVENTS_KEPT:
            del kept[next(iter(kept))]
        pod = self.pods.cache.get(name)
        if pod is not None and not executor_ran(pod):
            self._notify(pod)  # a start line or a diagnosis only events carry

    # -- the Backend protocol -----------------------------------------------------------------

    async def create(self, assignment: Assignment, *, stream_seq: int | None = None) -> Environment:
        await self._ready()
        if self.settings.backend.identity:
            try:
                identity.expected_spiffe_id(assignment, self.settings.trust_domain)
            except contract.ContractError as err:
                raise BackendError(str(err)) from err
        name = contract.environment_name(assignment.assignment_id)
        labels = builders.job_labels(assignment, stream_seq)
        try:
            found = builders.job_containers(assignment)
            spec = builders.pod(assignment, self.settings, stream_seq=stream_seq, containers=found)
        except services.ServicesError as err:
            raise JobRefused(f"The job's `{err.key}:` cannot run in this pool: {err}") from None
        pull = services.pull_secret(found.all, name=name, namespace=self.namespace, labels=labels)
        handed = builders.handed(assignment, self.settings)
        self._assignments[assignment.assignment_id] = handed
        secret = builders.secret(
            encode(handed), name=name, namespace=self.namespace, labels=labels, env=services.secret_env(found.all)
        )
        for made in (secret, pull) if pull is not None else (secret,):
            with contextlib.suppress(AlreadyExists):
                await self.api.create_secret(self.namespace, made)
        pod = self.pods.cache.get(name)
        if pod is None:
            try:
                pod = await self.api.create_pod(self.namespace, spec)
                self.pods.remember(pod)
                log.info("Pod %s/%s created", self.namespace, name)
            except AlreadyExists:
                pod = self.pods.cache.get(name) or await self.api.get_pod(self.namespace, name)
        await self._own_secrets(name, pod["metadata"]["uid"], pull=pull is not None)
        return self._environment(pod)

    async def _own_secrets(self, name: str, pod_uid: str, *, pull: bool) -> None:
        """The Secrets belong to the Pod from now on: Kubernetes deletes them with the Pod."""
        if name in self._owned:
            return
        patch = {"metadata": {"ownerReferences": [builders.owner_reference(name, pod_uid)]}}
        if pull:
            await self.api.patch_secret(self.namespace, name + services.PULL_SECRET_SUFFIX, patch)
        await self.api.patch_secret(self.namespace, name, patch)
        self._owned.add(name)

    async def follow_start(self, env: Environment) -> AsyncIterator[StartEvent]:
        """Stage lines from the Pod and its events as they change, then STARTED once the
        executor container runs (or ran), or FAILED with the classifier's diagnosis. Every
        wait is bounded by the classifier's time-outs (image pull, start) and the Pod's
        deadline; nothing is requested from the API."""
        await self._ready()
        changed = asyncio.Event()
        self._followers.setdefault(env.name, set()).add(changed)
        written: set[str] = set()
        try:
            while True:
                changed.clear()
                pod = self.pods.cache.get(env.name)
                gone = pod is None or env.name in self._deleted
                last = pod if pod is not None else self._tombstones.get(env.name)
                for line in start_lines(last, tuple(self._events.get(env.name, {}).values())) if last else ():
                    if line not in written:
                        written.add(line)
                        yield StartEvent(StartStage.PROGRESS, line)
                if last is not None and executor_ran(last):
                    yield StartEvent(StartStage.STARTED, started_line(last))
                    return
                observation = self._classify(env.name, last, gone=gone)
                if observation.phase.finished:
                    diagnosis = observation.diagnosis or Diagnosis(
                        FailureReason.VANISHED, "the job's Pod disappeared before its executor started"
                    )
                    yield StartEvent(StartStage.FAILED, diagnosis=diagnosis)
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), TICK_S)
        finally:
            followers = self._followers.get(env.name)
            if followers is not None:
                followers.discard(changed)
                if not followers:
                    del self._followers[env.name]

    async def find(self, assignment_id: str) -> Environment | None:
        """Its Pod, or the last state of one deleted by someone else (for the reaper's
        diagnosis) until it is reaped."""
        await self._ready()
        name = contract.environment_name(assignment_id)
        if name in self._deleted:
            return None
        pod = self.pods.cache.get(name) or self._tombstones.get(name)
        return None if pod is None else self._environment(pod)

    async def list_owned(self) -> list[Environment]:
        await self._ready()
        pods = [p for name, p in self.pods.cache.items() if name not in self._deleted and _labels_ok(p)]
        return [self._environment(p) for p in [*pods, *self._tombstones.values()]]

    async def observe(self, env: Environment) -> Observation:
        if env.name in self._deleted:
            return Observation(Phase.GONE)  # deleted by us, its Pod still terminating
        pod = self.pods.cache.get(env.name)
        gone = pod is None
        if pod is None:
            pod = self._tombstones.get(env.name)
        if pod is None:
            return Observation(Phase.GONE)
        observation = self._classify(env.name, pod, gone=gone)
        if self.settings.backend.identity and not gone and not observation.phase.finished:
            self.entries.ensure(pod)  # again, if making it failed before
        return observation

    def _classify(self, name: str, pod: dict[str, Any] | None, *, gone: bool) -> Observation:
        cfg = self.settings.backend
        facts = PodFacts(
            pod,
            datetime.now(UTC),
            gone=gone,
            deleted_by_us=name in self._deleted,
            events=tuple(self._events.get(name, {}).values()),
            image_pull_timeout=timedelta(seconds=cfg.image_pull_timeout_s),
            start_timeout=timedelta(seconds=cfg.start_timeout_s),
        )
        return classify(facts)

    async def _assignment_of(self, assignment_id: str) -> Assignment:
        """The assignment as handed to the executor: kept from `create`, else read back from
        the job's Secret (after a restart)."""
        known = self._assignments.get(assignment_id)
        if known is None:
            name = contract.environment_name(assignment_id)
            secret = await self.api.get_secret(self.namespace, name)
            data = (secret.get("data") or {}).get(builders.ASSIGNMENT_KEY)
            if not data:
                raise BackendError(f"Secret {self.namespace}/{name} holds no assignment")
            known = decode(base64.b64decode(data))
            self._assignments[assignment_id] = known
        return known

    async def delete(self, env: Environment) -> None:
        name = env.name
        self._deleted.add(name)
        try:
            try:
                await self.api.delete_pod(self.namespace, name)
            except NotFound:
                self._deleted.discard(name)
            if self.settings.backend.identity:
                await self.entries.forget(env.assignment_id)
            if name not in self._owned:
                with contextlib.suppress(NotFound):
                    await self.api.delete_secret(self.namespace, name)
                with contextlib.suppress(NotFound):
                    await self.api.delete_secret(self.namespace, name + services.PULL_SECRET_SUFFIX)
        except BaseException:
            self._deleted.discard(name)
            raise
        if self._tombstones.pop(name, None) is not None:
            self._deleted.discard(name)
        self._owned.discard(name)
        self._assignments.pop(env.assignment_id, None)
        self._events.pop(name, None)
        self._phases.pop(name, None)
        log.info("Pod %s/%s deleted", self.namespace, name)

    async def collect_orphans(self, launching: Collection[str]) -> list[str]:
        """Entries whose Pod is gone, and Secrets of launches that never made their Pod."""
        await self._ready()
        live = {p["metadata"].get("uid", "") for p in self.pods.cache.values()}
        removed = await self.entries.collect(live, launching) if self.settings.backend.identity else []
        listed = await self.api.list_secrets(self.namespace, self.selector)
        now = datetime.now(UTC)
        for secret in listed.get("items") or []:
            meta = secret.get("metadata") or {}
            name, labels = meta.get("name", ""), meta.get("labels") or {}
            created = parse_time(meta.get("creationTimestamp")) or now
            if (
                name.removesuffix(services.PULL_SECRET_SUFFIX) in self.pods.cache
                or meta.get("ownerReferences")
                or labels.get(contract.LABEL_ASSIGNMENT_ID) in launching
                or now - created < self.orphan_age
            ):
                continue
            with contextlib.suppress(NotFound):
                await self.api.delete_secret(self.namespace, name)
            removed.append(f"Secret {self.namespace}/{name}")
        return removed

    async def check(self) -> list[Finding]:
        """For `dynrunner-controller check`: API, namespace, RBAC, the entry CRD."""
        return await check(self.api, self.namespace, identity=self.settings.backend.identity)

    async def aclose(self) -> None:
        """Stop watching; running Pods are left alone."""
        if self._running is not None:
            self._running.cancel()
            await asyncio.gather(self._running, return_exceptions=True)
        await self.entries.aclose()
        await self.api.aclose()
        calls = dict(sorted(self.api.calls.items()))
        log.info(
            "pool %s: %d Kubernetes API requests since start", self.pool, self.api.requests, extra={"calls": calls}
        )

    # -- helpers ------------------------------------------------------------------------------

    def _environment(self, pod: dict[str, Any]) -> Environment:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k.startswith(contract.LABEL_PREFIX)}
        return Environment(
            backend=NAME,
            name=meta["name"],
            labels=labels,
            created_at=parse_time(meta.get("creationTimestamp")) or datetime.now(UTC),
            extra={"namespace": self.namespace, "uid": meta.get("uid", ""), "node": spec.get("nodeName", "")},
        )


def _labels_ok(pod: dict[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(contract.LABEL_ASSIGNMENT_ID)) and str(labels.get(contract.LABEL_TASK_ID, "")).isdigit()
