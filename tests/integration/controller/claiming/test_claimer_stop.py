"""A claim loop's stop needs no cancellation wherever the loop waits inside its turn: for its
replica's lease to be held, for a permit of the pool to come free. Python 3.11's
`asyncio.wait_for` can swallow a cancellation, and a loop waiting for a lease that had stopped
renewing then waited for good."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dynrunner.controller.claiming.registrations import Replica
from dynrunner.controller.coordination.leases import Lease, replica_key
from dynrunner.controller.infra.loops import Stopping
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures.assignments_memory import MemoryAssignmentLog
from tests.fixtures.claim_side import ClaimSide
from tests.fixtures.gitea_inprocess import InProcessGitea
from tests.fixtures.kv_memory import MemoryKeyValue
from tests.fixtures.lost_cancel import ended


class NeverHeld(Lease):
    """A replica lease nobody renews (its loop stopped): `waiting` is set once a claim loop
    waits for it."""

    def __init__(self) -> None:
        super().__init__(MemoryKeyValue(), replica_key("a"), "a", exclusive=False)  # type: ignore[arg-type]
        self.waiting = asyncio.Event()

    async def wait_held(self, *until: Stopping | None) -> None:
        self.waiting.set()
        await super().wait_held(*until)


async def test_a_claim_loop_waiting_for_its_replicas_lease_ends_on_its_stop_flag(tmp_path: Path) -> None:
    double = GiteaDouble(tmp_path / "gitea", pbkdf2_iterations=1, profile="1.26")
    side = ClaimSide(InProcessGitea(double, asyncio.get_running_loop()), double.registration_token)
    lease = NeverHeld()
    [claimer] = side.claimers(MemoryAssignmentLog(), loops=1, replica=Replica("a", lease=lease))
    running = asyncio.create_task(claimer.run())
    await asyncio.wait_for(lease.waiting.wait(), 10)
    claimer.stop()  # no cancellation: as if the stop's had been swallowed on the way
    assert await ended(running, 10), "the claim loop still waits for the lease"
    await running
    assert not double.runners(), "a runner was registered without the lease"
