"""Arming runner registrations: each pool claims with one registered runner at a time.

`ephemeral` mode (the default, Gitea ≥ 1.24): each claim uses a fresh *ephemeral* runner
registered with the pool's labels. Gitea binds the claimed task to it, refuses it a second
task and deletes it after the task's final UpdateTask, so the credential an executor
receives can report on its one task only. The armed (registered, not yet used) runner is
kept sealed in the KV store: Gitea never deletes an ephemeral runner that claimed nothing,
so a restarted controller reuses it instead of leaving it behind.

Several controller replicas serve a pool at once (docs/operations.md#several-replicas): each
armed runner is stored under its own key and owned by one replica (`Replica`); a replica
claims only with runners it owns, takes ownership by compare-and-set, and does not claim
while its lease is not held. The runners of a replica whose lease expired (killed, or a Pod
that never comes back) are adopted by the others and used for their next claims.

`shared` mode (older Gitea, less safe): one ordinary runner per pool, kept in the same
store and reused for every claim; every executor of the pool receives its credential, which
could claim further tasks or report on any task of that runner.

The registration token never leaves this module's Register call; a token Gitea refuses
stops registering (`registration_token`).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Literal

from dynrunner.controller import contract
from dynrunner.controller.claiming.registration_token import RegistrationToken
from dynrunner.controller.claiming.registrations_store import (
    ArmedRegistration,
    RegistrationStore,
    StoredRegistration,
    runner_key,
)
from dynrunner.controller.coordination.leases import LEASE_TTL_S, Lease
from dynrunner.controller.infra.loops import Fatal, Stopping
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.infra.sealing import SealingError
from dynrunner.proto.gitea import ErrorPage, GiteaClient, RegistrationRefused, RunnerCredentials, Unauthenticated
from dynrunner.proto.gitea.client import NO_RETRY, RetryPolicy

log = logging.getLogger(__name__)

MIN_GITEA_FOR_EPHEMERAL = "1.24"
EXECUTOR_CAPABILITIES: tuple[str, ...] = ("cancelling",)
"""Runner capabilities declared on the executor's behalf. "cancelling": on a user's cancel
Gitea marks the task cancelling and tells the executor in its next UpdateTask answer; the
executor stops the job, reports its last lines and ends the task cancelled. Gitea 1.24-1.26
drop it unread (their protocol has no field for it): there a cancel ends the task at once
and deletes the runner, and the executor runs the job's cleanup without reporting it."""

CredentialMode = Literal["ephemeral", "shared"]
CONFIRM_RETRY = RetryPolicy(attempts=3, max_delay_s=5.0)
"""`confirm`'s Declare: a passing failure is tried again a little, a lasting one decides."""

LOOK_INTERVAL_S = LEASE_TTL_S
"""How often a claim loop that keeps claiming looks at the store again for runners to adopt
(between looks, the next runner after a claim is registered without reading the store)."""


class StoreUnreachable(RuntimeError):
    """The registration store (NATS) is not connected: registering now would make a runner
    that could not be kept, and Gitea never removes one that claimed nothing."""


class GiteaTooOld(Fatal):
    """Gitea registered an ordinary runner although an ephemeral one was asked for."""


class Replica:
    """This controller replica as its claim loops see it: its name, its lease (no claim
    without it), whether another replica is alive, and the stored runners its loops hold
    (so two loops of one replica never take the same one)."""

    def __init__(
        self,
        name: str,
        *,
        lease: Lease | None = None,
        alive: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        self.name = name
        self.lease = lease
        self._alive = alive
        self.holding: set[str] = set()
        self.spent: set[int] = set()
        """Runners of this replica that claimed a task while the store may still hold them."""

    @classmethod
    def alone(cls, name: str = "dynrunner") -> Replica:
        """A replica that needs no lease: the only one (tests, tools). Pass one object to all
        claim loops of the process."""
        return cls(name)

    @property
    def term(self) -> int:
        return 0 if self.lease is None else self.lease.term

    @property
    def held(self) -> bool:
        return self.lease is None or self.lease.held

    async def wait_held(self, until: Stopping | None = None) -> None:
        if self.lease is not None:
            await self.lease.wait_held(until)

    async def alive(self, name: str) -> bool:
        if name == self.name:
            return True
        return False if self._alive is None else await self._alive(name)


class Registrations:
    """The armed registration of one claim loop of a pool. Used by that loop only: two
    concurrent FetchTasks on one ephemeral runner can each win a job before Gitea records
    the first."""

    def __init__(
        self,
        gitea: GiteaClient,
        store: RegistrationStore,
        *,
        pool: str,
        labels: list[str],
        registration_token: str | RegistrationToken,
        mode: CredentialMode = "ephemeral",
        name_prefix: str = "dynrunner",
        metrics: Metrics | None = None,
        replica: Replica,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gitea = gitea
        self._store = store
        self.pool = pool
        self.labels = list(labels)
        self.token = (
            registration_token
            if isinstance(registration_token, RegistrationToken)
            else RegistrationToken(registration_token)
        )
        """The registration token, shared by the claim loops (and Gitea's refusal of it)."""
        self.mode = mode
        self._name_prefix = name_prefix
        self._metrics = metrics
        self.replica = replica
        """Shared by every claim loop of this process (it knows which runners they hold)."""
        self._clock = clock
        self._current: StoredRegistration | None = None
        self._term = 0
        """The replica's lease term `_current` was taken under."""
        self._next_look: float | None = None
        """When the store is read again for runners to reuse or adopt (None: at the next arm)."""
        self._unstored: ArmedRegistration | None = None
        """Registered in Gitea, but the store did not take it (NATS down): the next arm stores
        this one instead of registering another (Gitea never removes a runner that claimed
        nothing, so every retry would leave one behind)."""

    @property
    def ephemeral(self) -> bool:
        return self.mode == "ephemeral"

    def client(self, reg: ArmedRegistration) -> GiteaClient:
        return self._gitea.with_credentials(RunnerCredentials(reg.uuid, reg.token))

    async def armed(self, until: Stopping | None = None) -> ArmedRegistration:
        """The registration to claim with: the current one, one of this replica's stored ones
        or one adopted from a replica that is gone (if Gitea still knows it), or a newly
        registered one (stored before it is used). Waits while the replica's lease is not held,
        and raises `Stopped` once `until` (the claim loop's stop flag) is set meanwhile."""
        if not self.ephemeral:
            return await self._shared()
        await self.replica.wait_held(until)
        if self._current is not None and self._term != self.replica.term:
            await self._take_again()
        if self._current is not None:
            return self._current.registration
        if self._unstored is not None:
            return self._hold(await self._add(self._unstored))
        if self._next_look is None or self._clock() >= self._next_look:
            self._next_look = self._clock() + LOOK_INTERVAL_S
            found = await self._reuse_or_adopt()
            if found is not None:
                return found
        return self._hold(await self._add(await self._register()))

    def spend(self) -> None:
        """The armed runner claimed a task: never hand it out again (in shared mode the runner
        stays). The next `armed()` registers the next runner; the claim `forget`s the spent
        one once its assignment is published."""
        if not self.ephemeral or self._current is None:
            return
        self.replica.spent.add(self._current.registration.id)
        self._current = None

    async def forget(self, reg: ArmedRegistration) -> None:
        """Remove the spent `reg` from the store."""
        if not self.ephemeral:
            return
        key = runner_key(self.pool, reg.id)
        await self._store.delete_if(key, reg.id)
        self.replica.holding.discard(key)
        self.replica.spent.discard(reg.id)

    async def lost(self) -> None:
        """Gitea no longer accepts the armed runner (deleted by an admin, or removed after a
        task): forget it, whatever the mode."""
        if not self.ephemeral:
            await self._store.delete(self.pool)
            return
        current, self._current = self._current, None
        self._next_look = None
        if current is not None:
            self.replica.holding.discard(current.key)
            await self._store.delete(current.key)

    # -- ephemeral -------------------------------------------------------------------------

    def _hold(self, stored: StoredRegistration) -> ArmedRegistration:
        self._current = stored
        self._term = self.replica.term
        self.replica.holding.add(stored.key)
        return stored.registration

    async def _take_again(self) -> None:
        """The lease lapsed since the current runner was taken: another replica may have
        adopted it. Take it again by compare-and-set, or leave it to whoever has it."""
        current = self._current
        assert current is not None
        taken = await self._store.take(current, self.replica.name)
        if taken is None:
            log.warning(
                "pool %s: runner %s was adopted by another replica while this one's lease lapsed",
                self.pool,
                current.registration.name,
            )
            self.replica.holding.discard(current.key)
            self._current = None
            return
        self._hold(taken)

    async def _reuse_or_adopt(self) -> ArmedRegistration | None:
        """A stored runner this replica owns and no loop of it holds, or one whose owner is gone
        (its lease expired) or that was stored before replicas: taken by compare-and-set, then
        checked with Gitea. It is held among this replica's loops from before the take: a
        sibling looking while it is taken and confirmed would find it owned by this replica and
        take it as well, and two loops would poll with one runner."""
        alive: dict[str, bool] = {}
        for stored in await self._store.listing(self.pool):
            owner = stored.owner
            if owner and owner not in alive:
                alive[owner] = await self.replica.alive(owner)
            if owner and owner != self.replica.name and alive[owner]:
                continue
            key = runner_key(self.pool, stored.registration.id)  # its key once taken
            if key in self.replica.holding or stored.registration.id in self.replica.spent:
                continue
            self.replica.holding.add(key)
            try:
                taken = await self._take(stored)
            finally:
                if self._current is None or self._current.key != key:
                    self.replica.holding.discard(key)
            if taken is not None:
                return taken
        return None

    async def _take(self, stored: StoredRegistration) -> ArmedRegistration | None:
        """`stored` for this loop, unless another replica took it first or Gitea no longer knows it."""
        taken = await self._store.take(stored, self.replica.name)
        if taken is None:
            return None  # another replica took it first
        if stored.owner and stored.owner != self.replica.name:
            log.info(
                "pool %s: adopted runner %s (id %s) of replica %s, which is gone",
                self.pool,
                stored.registration.name,
                stored.registration.id,
                stored.owner,
            )
        if not await self._still_registered(taken.registration):
            await self._store.remove(taken)
            return None
        return self._hold(taken)

    async def _add(self, reg: ArmedRegistration) -> StoredRegistration:
        """Store a newly registered runner before it is used. A failure keeps it in `_unstored`."""
        self._unstored = reg
        try:
            stored = await self._store.add(self.pool, reg, self.replica.name)
        except Exception as err:
            log.warning(
                "pool %s: runner %s (id %s) is registered but could not be stored (%s); it is stored, "
                "not replaced, on the next attempt",
                self.pool,
                reg.name,
                reg.id,
                err or type(err).__name__,
            )
            raise
        self._unstored = None
        log.info("pool %s: registered %s runner %s (id %s)", self.pool, self.mode, reg.name, reg.id)
        return stored

    # -- shared ----------------------------------------------------------------------------

    async def _shared(self) -> ArmedRegistration:
        """Shared mode: one ordinary runner per pool under the pool's name, used by every claim
        loop of every replica (concurrent FetchTasks are fine for an ordinary runner)."""
        if self._current is not None:
            return self._current.registration
        reg = await self._stored_shared()
        if reg is not None and not await self._still_registered(reg):
            await self._store.delete(self.pool)
            reg = None
        if reg is None:
            reg = self._unstored or await self._register()
            self._unstored = reg
            await self._store.put(self.pool, reg)
            self._unstored = None
            log.info("pool %s: registered %s runner %s (id %s)", self.pool, self.mode, reg.name, reg.id)
        self._current = StoredRegistration(self.pool, reg, "", 0)
        return reg

    async def _stored_shared(self) -> ArmedRegistration | None:
        try:
            return await self._store.get(self.pool)
        except SealingError as err:
            log.error(
                "the armed registration of pool %s cannot be opened (%s); registering a new one. "
                "The old runner stays in Gitea until an admin deletes it",
                self.pool,
                err,
            )
            return None

    # -- both ------------------------------------------------------------------------------

    async def _still_registered(self, reg: ArmedRegistration) -> bool:
        if not await self.confirm(reg):
            log.info("pool %s: armed runner %s (id %s) is gone from Gitea", self.pool, reg.name, reg.id)
            return False
        log.info("pool %s: reusing armed runner %s (id %s)", self.pool, reg.name, reg.id)
        return True

    async def confirm(self, reg: ArmedRegistration) -> bool:
        """Whether Gitea still knows `reg`, asked with Declare (which also brings its labels up
        to date with the pool's configuration). Declare fails only for an unknown runner or a
        failing database: behind a front end that replaces Gitea's error bodies with its own
        page, the page while Gitea answers a Ping sent right after (once: a front end failing
        every call fails that too) is read as "unregistered runner". Raises GiteaError when
        Gitea itself does not answer (nothing can be told then)."""
        try:
            await self.client(reg).declare(labels=self.labels, capabilities=EXECUTOR_CAPABILITIES, retry=CONFIRM_RETRY)
        except Unauthenticated:
            return False
        except ErrorPage:
            await self._gitea.ping(retry=NO_RETRY)  # right after: a front end failing every call fails this too
            log.warning(
                "pool %s: Gitea answers Ping, but runner %s (id %s) only gets an HTTP 500 page that is not Gitea's "
                "own: a front end before /api/actions/ replaces Gitea's error bodies, which say why (here most likely "
                '"unregistered runner"). Taking the runner as gone. Let the front end pass 5xx bodies through '
                '(docs/operations.md, "Gitea behind a reverse proxy")',
                self.pool,
                reg.name,
                reg.id,
            )
            return False
        return True

    async def _register(self) -> ArmedRegistration:
        """Register a runner (the caller stores it before it is used)."""
        if not self._store.reachable:
            raise StoreUnreachable(f"pool {self.pool}: NATS is not connected; no runner is registered until it is")
        name = contract.runner_name(self._name_prefix, self.pool, secrets.token_hex(4))
        token = self.token.value
        try:
            info = await self._gitea.register(
                name=name,
                registration_token=token,
                labels=self.labels,
                ephemeral=self.ephemeral,
                capabilities=EXECUTOR_CAPABILITIES,
            )
        except RegistrationRefused as err:
            self.token.refused(token, err)
            raise
        if self._metrics is not None:
            self._metrics.registrations.labels(pool=self.pool).inc()
        if self.ephemeral and not info.ephemeral:
            raise GiteaTooOld(
                f"Gitea registered runner {info.name!r} (id {info.id}) as an ordinary runner although an "
                f"ephemeral one was requested: ephemeral runners need Gitea {MIN_GITEA_FOR_EPHEMERAL} or newer. "
                f"Delete that runner in Gitea's admin panel (Site Administration → Actions → Runners), then "
                "upgrade Gitea, or set gitea.credentialMode: shared (less safe: every executor of a pool "
                "receives one long-lived runner credential)"
            )
        return ArmedRegistration(
            id=info.id,
            uuid=info.uuid,
            token=info.token,
            name=info.name or name,
            labels=tuple(self.labels),
            created_at=datetime.now(UTC),
        )
