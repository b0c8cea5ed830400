"""spire-controller-manager's ClusterStaticEntry reconciliation (pkg/spireentry/reconciler.go,
pkg/reconciler/reconciler.go), against the API double's store and the double's entries.

- Any ClusterStaticEntry event triggers a pass (bursts coalesce); a pass also runs every
  `gc_interval` (10 s by default).
- A pass renders every CSE of its class (`className`; `watch_classless` takes those with
  none), keys each by (spiffeID, parentID, sorted selectors), masks duplicates (the older
  creationTimestamp wins), creates missing entries, updates changed non-key fields, and
  **deletes every entry no CSE declares** except join-token alias entries (and, with
  `entry_id_prefix`, entries whose id lacks the prefix).
- Status: `rendered`, `masked`, and `set` — true only in the pass that created the entry,
  false again in the next one. Do not rely on it.
- `issue_delay` models the propagation to the agents (server cache reload, agent sync): a
  created entry becomes visible that many seconds after the pass that created it.
- IDs outside the trust domain render, but SPIRE's server refuses them: no entry is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime as dt
import re
from typing import Any

from dynrunner.doubles.kubernetes import status
from dynrunner.doubles.kubernetes.store import Obj, Store
from dynrunner.doubles.spire.entries import Entry, EntryStore, parse_selector

GROUP, VERSION, PLURAL = "spire.spiffe.io", "v1alpha1", "clusterstaticentries"
_ID = re.compile(r"^spiffe://([a-z0-9._-]+)(/[A-Za-z0-9._-]+)*$")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> dt.timedelta:
    """Go's time.ParseDuration, for metav1.Duration fields such as x509SVIDTTL."""
    if not text or _DURATION.sub("", text) != "":
        raise ValueError(f"time: invalid duration {text!r}")
    return dt.timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(text)))


def render(cse: Obj) -> Entry:
    spec = cse["spec"]
    for field in ("spiffeID", "parentID"):
        if not _ID.match(spec.get(field, "")) or spec[field].endswith("/"):
            raise ValueError(f"invalid {field} {spec.get(field)!r}")
    ttl = parse_duration(spec["x509SVIDTTL"]) if spec.get("x509SVIDTTL") else None
    return Entry(
        spiffe_id=spec["spiffeID"],
        parent_id=spec["parentID"],
        selectors=frozenset(parse_selector(s) for s in spec.get("selectors") or []),
        x509_svid_ttl=ttl,
        dns_names=tuple(spec.get("dnsNames") or ()),
        hint=spec.get("hint", ""),
        federates_with=tuple(spec.get("federatesWith") or ()),
        admin=bool(spec.get("admin")),
        downstream=bool(spec.get("downstream")),
    )


def _is_join_token_alias(entry: Entry) -> bool:
    return "/spire/agent/join_token/" in entry.parent_id and any(kind == "spiffe_id" for kind, _ in entry.selectors)


class ControllerManager:
    def __init__(
        self,
        store: Store,
        entries: EntryStore,
        *,
        class_name: str = "",
        watch_classless: bool = True,
        gc_interval: float = 10.0,
        issue_delay: float = 0.0,
        entry_id_prefix: str = "",
    ) -> None:
        self._store = store
        self._entries = entries
        self._class_name, self._watch_classless = class_name, watch_classless
        self._gc_interval, self.issue_delay = gc_interval, issue_delay
        self._prefix = entry_id_prefix
        self._trigger = asyncio.Event()
        self._pending: dict[tuple[Any, ...], asyncio.TimerHandle] = {}
        self.passes = 0
        store.listeners.append(
            lambda res, _: self._trigger.set() if res.group == GROUP and res.plural == PLURAL else None
        )

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._trigger.wait(), self._gc_interval)
            self._trigger.clear()
            self.reconcile()

    def _ours(self, cse: Obj) -> bool:
        name = cse["spec"].get("className", "")
        return name == self._class_name if name else self._watch_classless

    def reconcile(self) -> None:
        self.passes += 1
        res = self._store.resource(GROUP, VERSION, PLURAL)
        cses = [c for c in self._store.objects(res) if self._ours(c)] if res is not None else []
        declared: dict[tuple[Any, ...], tuple[Entry, Obj]] = {}
        outcome: dict[str, dict[str, bool]] = {}
        for cse in sorted(cses, key=lambda c: (c["metadata"]["creationTimestamp"], c["metadata"]["name"])):
            name = cse["metadata"]["name"]
            if cse["metadata"].get("deletionTimestamp"):
                continue
            try:
                entry = render(cse)
            except (ValueError, KeyError):
                outcome[name] = {"rendered": False, "masked": False, "set": False}
                continue
            masked = entry.key() in declared
            outcome[name] = {"rendered": True, "masked": masked, "set": False}
            if not masked:
                declared[entry.key()] = (entry, cse)
        current = {e.key(): e for e in self._entries.entries() if self._managed(e)}
        for key, entry in current.items():
            if key not in declared:
                self._entries.delete(entry.id)
        for key, (entry, cse) in declared.items():
            existing = current.get(key)
            if existing is not None:
                wanted = Entry(**{**entry.__dict__, "id": existing.id})
                if wanted != existing:
                    self._entries.put(wanted)
            elif key not in self._pending and self._in_trust_domain(entry):
                outcome[cse["metadata"]["name"]]["set"] = True
                self._create(key, entry)
        for key in [k for k in self._pending if k not in declared]:
            self._pending.pop(key).cancel()
        if res is not None:
            self._write_status(res, cses, outcome)

    def _managed(self, entry: Entry) -> bool:
        if _is_join_token_alias(entry):
            return False
        return entry.id.startswith(f"{self._prefix}.") if self._prefix else True

    def _in_trust_domain(self, entry: Entry) -> bool:
        td = f"spiffe://{self._entries.trust_domain}"
        return all(i == td or i.startswith(td + "/") for i in (entry.spiffe_id, entry.parent_id))

    def _create(self, key: tuple[Any, ...], entry: Entry) -> None:
        if self._prefix:
            entry = Entry(**{**entry.__dict__, "id": f"{self._prefix}.{entry.id}"})

        def put() -> None:
            self._pending.pop(key, None)
            self._entries.put(entry)

        if self.issue_delay <= 0:
            self._entries.put(entry)
        else:
            self._pending[key] = asyncio.get_running_loop().call_later(self.issue_delay, put)

    def _write_status(self, res: Any, cses: list[Obj], outcome: dict[str, dict[str, bool]]) -> None:
        for cse in cses:
            name = cse["metadata"]["name"]
            if name not in outcome or cse.get("status") == outcome[name]:
                continue
            new = copy.deepcopy(cse)
            new["status"] = outcome[name]
            with contextlib.suppress(status.ApiError):
                self._store.update(res, "", name, new, "status")
