"""`Spire`: a SPIRE server (CA, entries), one agent per Kubernetes node (k8s_psat agent IDs,
unix and k8s workload attestation) with its Workload API socket, and spire-controller-manager
turning ClusterStaticEntries into entries. Runs on the API double's loop (see
kubernetes/cluster.py, which mounts each agent's socket directory for csi.spiffe.io volumes).

Agents for other attestation (a join-token agent in a VM) are added with `add_agent`.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dynrunner.doubles.kubernetes import resources
from dynrunner.doubles.kubernetes.kubelet import ContainerRef
from dynrunner.doubles.kubernetes.store import Store
from dynrunner.doubles.spire.attestor import Caller, k8s_selectors, unix_selectors
from dynrunner.doubles.spire.ca import TrustDomainCA
from dynrunner.doubles.spire.controller_manager import ControllerManager
from dynrunner.doubles.spire.entries import Agent, EntryStore, Selector
from dynrunner.doubles.spire.jwt import JwtAuthority
from dynrunner.doubles.spire.workload_api import WorkloadApi


@dataclass(frozen=True)
class SpireOptions:
    trust_domain: str = "example.org"
    cluster: str = "ci"  # the k8s_psat cluster name the agents attest with
    issue_delay: float = 0.0
    gc_interval: float = 10.0
    class_name: str = ""
    watch_classless: bool = True
    entry_id_prefix: str = ""
    socket_name: str = "spire-agent.sock"
    agent_namespace: str = "spire"
    agent_service_account: str = "spire-agent"
    jwt_issuer: str = ""
    """The server's `jwt_issuer`: the `iss` claim of JWT-SVIDs (none when empty)."""


def k8s_psat_agent_id(trust_domain: str, cluster: str, node_uid: str) -> str:
    return f"spiffe://{trust_domain}/spire/agent/k8s_psat/{cluster}/{node_uid}"


class Spire:
    def __init__(self, store: Store, options: SpireOptions, containers: dict[int, ContainerRef]) -> None:
        self.options = options
        self.ca = TrustDomainCA(options.trust_domain)
        self.jwt = JwtAuthority(options.trust_domain, issuer=options.jwt_issuer)
        self.entries = EntryStore(options.trust_domain)
        self.controller_manager = ControllerManager(
            store,
            self.entries,
            class_name=options.class_name,
            watch_classless=options.watch_classless,
            gc_interval=options.gc_interval,
            issue_delay=options.issue_delay,
            entry_id_prefix=options.entry_id_prefix,
        )
        self.agents: dict[str, WorkloadApi] = {}
        self._store = store
        self._containers = containers
        # Unix socket paths are limited to 107 bytes: keep them under a short directory.
        self.socket_root = Path(tempfile.mkdtemp(prefix="spire-", dir="/tmp"))

    async def add_k8s_agent(self, node: str, node_uid: str) -> WorkloadApi:
        agent = Agent(
            k8s_psat_agent_id(self.options.trust_domain, self.options.cluster, node_uid),
            frozenset(
                {
                    ("k8s_psat", f"cluster:{self.options.cluster}"),
                    ("k8s_psat", f"agent_node_name:{node}"),
                    ("k8s_psat", f"agent_node_uid:{node_uid}"),
                    ("k8s_psat", f"agent_ns:{self.options.agent_namespace}"),
                    ("k8s_psat", f"agent_sa:{self.options.agent_service_account}"),
                }
            ),
        )

        def attest(caller: Caller) -> set[Selector]:
            return unix_selectors(caller) | k8s_selectors(caller, node, self._lookup)

        return await self._start(node, agent, attest)

    async def add_agent(
        self, name: str, agent_id: str, node_selectors: frozenset[Selector] = frozenset()
    ) -> WorkloadApi:
        """An agent with only the unix workload attestor (a join-token agent in a VM)."""
        return await self._start(name, Agent(agent_id, node_selectors), unix_selectors)

    async def _start(self, name: str, agent: Agent, attest: object) -> WorkloadApi:
        path = self.socket_root / name / self.options.socket_name
        api = WorkloadApi(agent, self.entries, self.ca, path, attest, jwt_authority=self.jwt)  # type: ignore[arg-type]
        await api.start()
        self.agents[name] = api
        return api

    def _lookup(self, pid: int) -> tuple[ContainerRef, dict[str, object] | None] | None:
        ref = self._containers.get(pid)
        if ref is None:
            return None
        return ref, self._store.peek(resources.PODS, ref.namespace, ref.pod_name)

    async def stop(self) -> None:
        for api in self.agents.values():
            await api.stop()
        shutil.rmtree(self.socket_root, ignore_errors=True)
