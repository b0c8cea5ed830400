"""Arming runner registrations: each pool claims with one registered runner at a time.

`ephemeral` mode (the default, Gitea ≥ 1.24): each claim uses a fresh *ephemeral* runner
registered with the pool's labels. Gitea binds the claimed task to it, refuses it a second
task and deletes it after the task's final UpdateTask, so the credential an executor
receives can report on its one task only. The armed (registered, not yet used) runner is
kept sealed in the KV store: Gitea never deletes an ephemeral runner that claimed nothing,
so a restarted controller reuses it instead of leaving it behind.

`shared` mode (older Gitea, less safe): one ordinary runner per pool, kept in the same
store and reused for every claim; every executor of the pool receives its credential, which
could claim further tasks or report on any task of that runner.

The registration token never leaves this module's Register call; a token Gitea refuses
stops registering (`registration_token`).
"""

from __future__ import annotations

import logging
import secrets
from datetime import UTC, datetime
from typing import Literal

from dynrunner.controller import contract
from dynrunner.controller.loops import Fatal
from dynrunner.controller.metrics import Metrics
from dynrunner.controller.registration_token import RegistrationToken
from dynrunner.controller.registrations_store import ArmedRegistration, RegistrationStore
from dynrunner.controller.sealing import SealingError
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


def store_key(pool: str, slot: int) -> str:
    """The KV key of a pool's claim loop `slot`: the pool's name, then `<pool>.<slot>` (a dot
    never occurs in a pool name, so keys of different pools never collide)."""
    return pool if slot == 0 else f"{pool}.{slot}"


class StoreUnreachable(RuntimeError):
    """The registration store (NATS) is not connected: registering now would make a runner
    that could not be kept, and Gitea never removes one that claimed nothing."""


class GiteaTooOld(Fatal):
    """Gitea registered an ordinary runner although an ephemeral one was asked for."""


class Registrations:
    """The armed registration of one claim loop of a pool. Used by that loop only: two
    concurrent FetchTasks on one ephemeral runner can each win a job before Gitea records
    the first. A pool runs a fixed number of claim loops (`app.CLAIM_LOOPS`), so the set of
    keys is the same across restarts and every armed registration is found again."""

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
        slot: int = 0,
    ) -> None:
        self._gitea = gitea
        self._store = store
        self.pool = pool
        self.key = store_key(pool, slot)
        """Where this claim loop's armed registration is kept (one key per claim loop)."""
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
        self._current: ArmedRegistration | None = None
        self._spent: set[int] = set()
        """Runners of this loop that claimed a task, while the store may still hold one of them
        (cleared once a newer registration is stored over them)."""
        self._store_empty = False
        """The store holds nothing this loop may arm again: the next arm need not read it."""
        self._unstored: ArmedRegistration | None = None
        """Registered in Gitea, but the store did not take it (NATS down): the next arm stores
        this one instead of registering another (Gitea never removes a runner that claimed
        nothing, so every retry would leave one behind)."""

    @property
    def ephemeral(self) -> bool:
        return self.mode == "ephemeral"

    def client(self, reg: ArmedRegistration) -> GiteaClient:
        return self._gitea.with_credentials(RunnerCredentials(reg.uuid, reg.token))

    async def armed(self) -> ArmedRegistration:
        """The registration to claim with: the current one, the stored one if Gitea still
        knows it, or a newly registered one (stored before it is used)."""
        if self._current is not None:
            return self._current
        if self._unstored is not None:
            await self._store_new(self._unstored)
            self._current, self._unstored = self._unstored, None
            return self._current
        reg = None if self._store_empty else await self._stored()
        if reg is not None and not await self._still_registered(reg):
            await self._store.delete(self.key)
            reg = None
        if reg is None:
            reg = await self._register()
        self._current = reg
        return reg

    def spend(self) -> None:
        """The armed runner claimed a task: never hand it out again (in shared mode the runner
        stays). The next `armed()` registers the next runner without reading the store, and
        storing it replaces the spent one there; the claim also `forget`s the spent one once
        its assignment is published, whichever comes first."""
        if not self.ephemeral:
            return
        if self._current is not None:
            self._spent.add(self._current.id)
            self._current = None
        self._store_empty = True

    async def forget(self, reg: ArmedRegistration) -> None:
        """Remove the spent `reg` from the store if it is still the stored one (a newer armed
        registration, even one stored between the read and the delete, is left alone)."""
        await self._store.delete_if(self.key, reg.id)

    async def lost(self) -> None:
        """Gitea no longer accepts the armed runner (deleted by an admin, or removed after a
        task): forget it, whatever the mode."""
        self._current = None
        self._store_empty = False
        await self._store.delete(self.key)
        self._store_empty = True

    async def _stored(self) -> ArmedRegistration | None:
        try:
            reg = await self._store.get(self.key)
        except SealingError as err:
            log.error(
                "the armed registration of pool %s cannot be opened (%s); registering a new one. "
                "The old runner stays in Gitea until an admin deletes it",
                self.pool,
                err,
            )
            return None
        if reg is not None and reg.id in self._spent and self.ephemeral:
            return None  # spent, its removal from the store failed: never claim with it again
        return reg

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
        """Register a runner and store it before it is used."""
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
        reg = ArmedRegistration(
            id=info.id,
            uuid=info.uuid,
            token=info.token,
            name=info.name or name,
            labels=tuple(self.labels),
            created_at=datetime.now(UTC),
        )
        self._unstored = reg
        await self._store_new(reg)
        self._unstored = None
        return reg

    async def _store_new(self, reg: ArmedRegistration) -> None:
        """Store a newly registered runner over whatever the key held (a spent runner whose
        claim has not retired it yet). A failure leaves it in `_unstored`."""
        self._store_empty = False  # a put whose answer was lost may still have stored it
        try:
            await self._store.put(self.key, reg)
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
        self._spent.clear()  # the key holds this one now, none of the spent ones
        log.info("pool %s: registered %s runner %s (id %s)", self.pool, self.mode, reg.name, reg.id)
