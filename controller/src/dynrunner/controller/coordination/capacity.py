"""Per-pool capacity: a permit is reserved *before* polling Gitea and released by the reaper.

A permit goes through three states:

* **reserved** — the claimer holds it while it polls; nothing is claimed yet. A poll that
  returns no task keeps the reservation for the next poll; a claim that fails before
  publishing cancels it.
* **held** — bound to an assignment id once a task is claimed, until the reaper has
  deleted that assignment's environment (or the task was finalized without one).
* **recovered** — after a restart, the count of assignments still waiting in JetStream whose
  ids are not known yet; the launcher adopts one per delivery it has not seen.

Assignments already claimed always get a permit (`adopt` may overcommit, e.g. after
`maxConcurrency` was lowered): refusing would strand a claimed task. Only new claims wait.

With a `PermitLedger` (the controller always has one) `maxConcurrency` bounds the pool across
all replicas: a reservation takes one of the pool's shared permits (`permits`), and binding,
releasing and adopting change it there as well. The counts above then only report this
replica's view (what it claimed, launched and sees running); they do not hold claims back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from dynrunner.controller.coordination.permits import Permit, PermitLedger
from dynrunner.controller.infra.loops import Stopping


class Capacity:
    def __init__(self, pool: str, limit: int, ledger: PermitLedger | None = None) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.pool = pool
        self.limit = limit
        self.ledger = ledger
        self._bound: dict[str, Permit] = {}
        """Shared permits this replica bound, by assignment (the mirror may not show them yet)."""
        self._held: set[str] = set()
        self._reserved = 0
        self._recovered = 0
        self._waiters: list[asyncio.Future[None]] = []

    # -- views ------------------------------------------------------------------------

    @property
    def in_use(self) -> int:
        """Permits taken by assignments (held or recovered); the capacity metric."""
        return len(self._held) + self._recovered

    @property
    def pool_in_use(self) -> int:
        """Permits bound to assignments in the whole pool (all replicas), else `in_use`."""
        if self.ledger is None:
            return self.in_use
        return sum(1 for p in self.ledger.entries() if p.assignment is not None)

    @property
    def taken(self) -> int:
        """Everything that counts against the limit, reservations included."""
        return self.in_use + self._reserved

    @property
    def free(self) -> int:
        return max(0, self.limit - self.taken)

    def holds(self, assignment_id: str) -> bool:
        return assignment_id in self._held

    def held(self) -> frozenset[str]:
        return frozenset(self._held)

    # -- transitions ------------------------------------------------------------------

    async def reserve(self, until: Stopping | None = None) -> Reservation:
        """Wait for a free permit and reserve it for one claim: one of the pool's shared
        permits when there is a ledger (this replica's own count then only reports: a job
        it claimed may be launched and reaped by another replica without it ever seeing the
        environment), else one of this count's."""
        if self.ledger is not None:
            self._reserved += 1
            try:
                permit = await self.ledger.acquire(until)
            except BaseException:
                self._cancel()
                raise
            return Reservation(self, permit)
        while self.taken >= self.limit:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
        self._reserved += 1
        return Reservation(self)

    def restore(self, assignment_ids: Iterable[str], pending: int) -> None:
        """After a restart: permits for environments that exist and for `pending` assignments
        in JetStream not launched yet (counted, their ids unknown until delivered)."""
        self._held.update(assignment_ids)
        self._recovered = max(0, pending)
        self._notify()

    def adopt(self, assignment_id: str) -> None:
        """A delivery for `assignment_id` arrived: make sure it holds a permit."""
        if assignment_id in self._held:
            return
        if self._recovered > 0:
            self._recovered -= 1
        self._held.add(assignment_id)
        if self.ledger is not None:
            # Bound here meanwhile (the delivery came before its claimer's publish returned):
            # that permit's write is queued, and will show.
            self.ledger.adopt(
                assignment_id, still=lambda: assignment_id in self._held and assignment_id not in self._bound
            )

    def release(self, assignment_id: str) -> bool:
        """The assignment is over (environment deleted or task finalized); True if it held one
        here. Its shared permit goes too, whichever replica holds it."""
        if self.ledger is not None:
            self.ledger.release(assignment_id, bound_here=self._bound.pop(assignment_id, None))
        if assignment_id not in self._held:
            return False
        self._held.discard(assignment_id)
        self._notify()
        return True

    def limit_recovered(self, pending: int) -> None:
        """Recovered permits never exceed what JetStream still holds for the pool: a message
        counted at restart may belong to an environment that already existed."""
        if self._recovered > max(0, pending):
            self._recovered = max(0, pending)
            self._notify()

    def _bind(self, assignment_id: str) -> None:
        self._reserved -= 1
        self._held.add(assignment_id)

    def _cancel(self) -> None:
        self._reserved -= 1
        self._notify()

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


class Reservation:
    """One reserved permit; `bind` it to the claimed assignment or `cancel` it. Once."""

    def __init__(self, capacity: Capacity, permit: Permit | None = None) -> None:
        self._capacity = capacity
        self._permit = permit
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def bind(self, assignment_id: str) -> None:
        self._finish()
        self._capacity._bind(assignment_id)
        ledger = self._capacity.ledger
        if ledger is not None and self._permit is not None:
            self._capacity._bound[assignment_id] = self._permit
            ledger.bind(self._permit, assignment_id)

    def cancel(self) -> None:
        self._finish()
        self._capacity._cancel()
        ledger = self._capacity.ledger
        if ledger is not None and self._permit is not None:
            ledger.cancel(self._permit)

    def _finish(self) -> None:
        if self._done:
            raise RuntimeError("this reservation was already bound or cancelled")
        self._done = True
