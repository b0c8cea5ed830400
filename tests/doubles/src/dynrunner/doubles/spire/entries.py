"""Registration entries and agents, as the SPIRE server keeps them and an agent's cache
applies them (pkg/agent/manager/cache): a workload gets every entry authorized for its agent
— parented on the agent, on one of its node aliases (entries parented on the server whose
node selectors the agent has), or on the SPIFFE ID of an entry already authorized (a
descendant: e.g. parented on a join token's `agent_id` alias, whose entry is parented on the
agent) — and whose selectors are all among the workload's."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

Selector = tuple[str, str]  # (type, value): "k8s:pod-uid:abc" → ("k8s", "pod-uid:abc")


def parse_selector(text: str) -> Selector:
    """Split on the first colon, as spire-controller-manager's parseSelector does."""
    kind, sep, value = text.partition(":")
    if not sep or not kind or not value:
        raise ValueError(f"selector {text!r} is not of the form type:value")
    return (kind, value)


@dataclass(frozen=True)
class Entry:
    spiffe_id: str
    parent_id: str
    selectors: frozenset[Selector]
    x509_svid_ttl: dt.timedelta | None = None
    dns_names: tuple[str, ...] = ()
    hint: str = ""
    federates_with: tuple[str, ...] = ()
    admin: bool = False
    downstream: bool = False
    id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def key(self) -> tuple[str, str, tuple[Selector, ...]]:
        """spire-controller-manager's entry key: the fields that identify an entry."""
        return (self.spiffe_id, self.parent_id, tuple(sorted(self.selectors)))


@dataclass(frozen=True)
class Agent:
    spiffe_id: str
    node_selectors: frozenset[Selector] = frozenset()


class EntryStore:
    """The server's entries; agents wait on `changed()` to re-evaluate their workloads."""

    def __init__(self, trust_domain: str) -> None:
        self.trust_domain = trust_domain
        self.server_id = f"spiffe://{trust_domain}/spire/server"
        self._entries: dict[str, Entry] = {}
        self._version = 0
        self._waiters: set[asyncio.Event] = set()
        self.listeners: list[Callable[[], None]] = []

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def get(self, entry_id: str) -> Entry | None:
        return self._entries.get(entry_id)

    def put(self, entry: Entry) -> Entry:
        self._entries[entry.id] = entry
        self._bump()
        return entry

    def delete(self, entry_id: str) -> Entry | None:
        entry = self._entries.pop(entry_id, None)
        if entry is not None:
            self._bump()
        return entry

    def _bump(self) -> None:
        self._version += 1
        for listener in self.listeners:
            listener()
        for waiter in self._waiters:
            waiter.set()

    @property
    def version(self) -> int:
        return self._version

    async def wait_changed(self, since: int, within: float) -> None:
        """Return once the entries changed after version `since`, or after `within` seconds."""
        if self._version != since:
            return
        waiter = asyncio.Event()
        self._waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter.wait(), within)
        except TimeoutError:
            return
        finally:
            self._waiters.discard(waiter)

    def parents_of(self, agent: Agent) -> set[str]:
        """The IDs whose child entries are the agent's: its own, its node aliases', and those
        of the entries found so (descendants), as the server's authorized entries."""
        parents = {agent.spiffe_id}
        for entry in self._entries.values():
            if entry.parent_id == self.server_id and entry.selectors and entry.selectors <= agent.node_selectors:
                parents.add(entry.spiffe_id)
        grew = True
        while grew:
            children = {e.spiffe_id for e in self._entries.values() if e.parent_id in parents}
            grew = not children <= parents
            parents |= children
        return parents

    def match(self, agent: Agent, selectors: Iterable[Selector]) -> list[Entry]:
        have = set(selectors)
        parents = self.parents_of(agent)
        found = [e for e in self._entries.values() if e.parent_id in parents and e.selectors and e.selectors <= have]
        return sorted(found, key=lambda e: (e.spiffe_id, e.id))
