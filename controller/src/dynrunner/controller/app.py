"""The composition root: everything the controller runs, built from one ControllerConfig.

`Controller.run(stop)` connects (embedded NATS when `nats.url` is absent), recovers each
pool's capacity from the environments that exist and the assignments still queued, then
runs one TaskGroup: a launcher and a claimer per pool, the reaper and the health server,
each a named task under supervision. When `stop` is set it shuts down in order: claimers
stop claiming and finish claims already taken, launchers stop pulling and finish launches
in hand, the reaper stops; running environments are left alone, then clients close.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from dynrunner.controller.assignments.finalize_records import FinalizeRecordStore
from dynrunner.controller.assignments.launched import LaunchedRecord
from dynrunner.controller.assignments.log import AssignmentLog
from dynrunner.controller.backends.base import Backend, Environment, ReportsIsolation, Watches
from dynrunner.controller.cache.grants import CacheGrants
from dynrunner.controller.cache.revoke import CacheRevoker
from dynrunner.controller.claiming.claimer import Claimer, pool_pacer
from dynrunner.controller.claiming.registration_token import RegistrationToken
from dynrunner.controller.claiming.registrations import Registrations, Replica
from dynrunner.controller.claiming.registrations_store import RegistrationStore
from dynrunner.controller.config.model import GITEA_ENDLESS_TASK_MINUTES, ControllerConfig, PoolConfig
from dynrunner.controller.coordination.capacity import Capacity
from dynrunner.controller.coordination.leases import Lease, exclusive, open_lease_bucket, replica_alive, replica_key
from dynrunner.controller.coordination.permits import LedgerFactory, PermitLedger, ledger_factory, open_permits_bucket
from dynrunner.controller.infra.embedded_nats import EmbeddedNats
from dynrunner.controller.infra.health import HealthServer
from dynrunner.controller.infra.loops import Backoff, supervise
from dynrunner.controller.infra.metrics import Metrics
from dynrunner.controller.infra.nats_auth import client_options
from dynrunner.controller.infra.sealing import Sealer
from dynrunner.controller.launching.launcher import Launcher
from dynrunner.controller.reaping.reaper import PoolWatch, Reaper
from dynrunner.controller.startup import StartupError, claim_settings, open_backend, open_sealer
from dynrunner.proto.gitea import GiteaClient, GiteaError
from dynrunner.proto.gitea.client import NO_RETRY

log = logging.getLogger(__name__)

READY_ERROR_LIMIT = 5
"""A claim loop is failing (for /readyz) after this many errors in a row — or after one,
while it has not reached Gitea since the start."""
GITEA_PROBE_TIMEOUT_S = 10.0
CLAIM_LOOPS = 2
"""Claim loops per pool and replica in ephemeral mode, each with its own armed runner: while
one waits for Gitea, the other claims."""


def claim_loop_backoff() -> Backoff:
    """How a claim loop that failed unexpectedly is restarted (`supervise`): after 1 s, then
    longer while it keeps failing, at most a minute apart."""
    return Backoff(1.0, 60.0)


@dataclass
class Pool:
    config: PoolConfig
    backend: Backend
    capacity: Capacity
    claimers: list[Claimer]
    launcher: Launcher


class Controller:
    def __init__(
        self,
        cfg: ControllerConfig,
        *,
        metrics: Metrics | None = None,
        backends: Mapping[str, Backend] | None = None,
    ) -> None:
        """`backends` replaces the configured backend of the named pools (tests wrap one)."""
        self.cfg = cfg
        self.metrics = metrics or Metrics()
        self._backend_overrides = dict(backends or {})
        self.ready = asyncio.Event()
        """Set once every loop runs (the demo and tests wait for it)."""
        self.pools: dict[str, Pool] = {}
        self.health_url = ""
        self._log: AssignmentLog | None = None
        self._reaper: Reaper | None = None
        self._embedded: EmbeddedNats | None = None
        self._token = RegistrationToken.from_config(cfg.gitea)
        self._cache_grants: CacheGrants | None = None
        self._cache_revoker: CacheRevoker | None = None
        self.cache_url = ""
        self.replica = Replica.alone(cfg.replica)
        self._new_ledger: LedgerFactory | None = None
        self._exclusive: Callable[[str], contextlib.AbstractAsyncContextManager[bool]] | None = None
        """Exclusive leases among the replicas, by key (`leases.exclusive`)."""

    async def run(self, stop: asyncio.Event) -> None:
        cfg = self.cfg
        sealer = open_sealer(cfg)
        assert sealer is not None
        async with contextlib.AsyncExitStack() as stack:
            nats_url, options = cfg.nats.url, client_options(cfg.nats)
            if nats_url is None:
                assert cfg.nats.data_dir is not None
                self._embedded = await stack.enter_async_context(EmbeddedNats(cfg.nats.data_dir))
                nats_url, options = self._embedded.url, self._embedded.client_options()
            self._log = await AssignmentLog.connect(
                nats_url, cfg.nats, [p.name for p in cfg.pools], metrics=self.metrics, options=options
            )
            stack.push_async_callback(self._log.close)
            self.metrics.nats_connected.set_function(lambda: float(self._log is not None and self._log.nc.is_connected))
            store = await RegistrationStore.open(self._log, sealer)
            await self._join_replicas(stack)
            record = await LaunchedRecord.open(self._log.js, cfg.nats.launched_bucket, replicas=cfg.nats.replicas)
            records = await FinalizeRecordStore.open(
                self._log.js, sealer, cfg.nats.finalize_bucket, replicas=cfg.nats.replicas
            )
            gitea = GiteaClient(cfg.gitea.url, timeout_s=cfg.gitea.request_timeout_s)
            await self._probe_gitea()
            if cfg.cache.enabled:
                await self._start_cache(stack)
            for pool_cfg in cfg.pools:
                pool = await self._build_pool(pool_cfg, gitea, store, sealer, record, records)
                stack.push_async_callback(pool.backend.aclose)
                pool.launcher.starts.exclusive = self._exclusive
                self.pools[pool_cfg.name] = pool
            self._reaper = reaper = Reaper(
                [
                    PoolWatch(
                        name=p.config.name,
                        backend=p.backend,
                        capacity=p.capacity,
                        launching=p.launcher.busy,
                        records=records,
                        follow=p.launcher.starts.follow,
                        pending=lambda name=p.config.name: self._pending(name),  # type: ignore[misc]
                        unacknowledged=self._unacknowledged,
                        watched=isinstance(p.backend, Watches),
                        exclusive=self._exclusive,
                    )
                    for p in self.pools.values()
                ],
                gitea=gitea,
                metrics=self.metrics,
                revoke_cache=self._cache_revoker,
            )
            if cfg.metrics.enabled:
                health = HealthServer(cfg.metrics.address, self.metrics, self.readiness, self.liveness)
                await stack.enter_async_context(health)
                self.health_url = health.url
            await self._run_loops(stop, reaper)
        log.info("controller stopped")

    async def _join_replicas(self, stack: contextlib.AsyncExitStack) -> None:
        """Hold this replica's lease (docs/operations.md#several-replicas): taken before any
        claim, renewed by a loop of the task group, released after a graceful stop."""
        assert self._log is not None
        kv = await open_lease_bucket(self._log.js, self.cfg.nats.replicas_bucket, replicas=self.cfg.nats.replicas)
        permits = await open_permits_bucket(self._log.js, self.cfg.nats.permits_bucket, replicas=self.cfg.nats.replicas)
        name = self.cfg.replica
        lease = Lease(kv, replica_key(name), name, exclusive=False)
        await lease.renew()
        stack.push_async_callback(lease.release)

        async def alive(other: str) -> bool:
            return await replica_alive(kv, other)

        self.replica = Replica(name, lease=lease, alive=alive)
        self._new_ledger = ledger_factory(permits, kv, replica=name, incarnation=lease.incarnation)
        self._exclusive = functools.partial(exclusive, kv, holder=name)
        log.info("running as replica %s", name, extra={"replica": name})

    def _ledger(self, pool: str, limit: int, backend: Backend, record: LaunchedRecord) -> PermitLedger | None:
        """The pool's permits shared with the other replicas (`maxConcurrency` is per pool)."""
        if self._new_ledger is None:
            return None

        async def over(assignment_ids: set[str]) -> set[str]:
            """Launched and finished: the launch record says done (written once the environment
            existed, or the task was ended without one), then no environment is seen."""
            launching = self.pools[pool].launcher.busy() if pool in self.pools else set()
            done = set()
            for assignment_id in assignment_ids - set(launching):
                launched = await record.state(assignment_id)
                if launched is not None and launched.state == "done":
                    done.add(assignment_id)
            if not done:
                return done
            return done - {env.assignment_id for env in await backend.list_owned()}

        return self._new_ledger(pool, limit, over)

    async def _start_cache(self, stack: contextlib.AsyncExitStack) -> None:
        """Serve the actions cache here (`cache.serve`), or only sign grants for the one at `cache.url`."""
        from dynrunner.controller.cache.serve import cache_key, serve_cache

        cache = self.cfg.cache
        self.cache_url = cache.url
        served = await stack.enter_async_context(serve_cache(cache)) if cache.serve else None
        if served is not None:
            self.cache_url = served.public_url
        self._cache_grants = CacheGrants(url=self.cache_url, v2=cache.v2, key=cache_key(cache, create=cache.serve))
        self._cache_revoker = CacheRevoker(self.cache_url, served.service if served is not None else None)

    async def _probe_gitea(self) -> None:
        """Ping Gitea once. A Gitea that does not answer (down, restarting, a proxy's 502) does
        not stop the start: the reaper and the launchers need no Gitea, the claim loops retry
        with backoff, and /readyz says what fails. Exiting instead would add a restart
        backoff to the outage. An answer that is no RunnerService's (a wrong `gitea.url`)
        stops it."""
        url = self.cfg.gitea.url
        probe = GiteaClient(url, timeout_s=min(GITEA_PROBE_TIMEOUT_S, self.cfg.gitea.request_timeout_s), retry=NO_RETRY)
        try:
            await probe.ping()
        except GiteaError as err:
            if not err.transient:
                raise StartupError(f"Gitea at {url} does not answer as Gitea's runner API: {err}") from err
            log.warning("Gitea at %s does not answer (%s); starting anyway, claiming once it does", url, err)

    async def _build_pool(
        self,
        pool_cfg: PoolConfig,
        gitea: GiteaClient,
        store: RegistrationStore,
        sealer: Sealer,
        record: LaunchedRecord,
        records: FinalizeRecordStore,
    ) -> Pool:
        assert self._log is not None
        name = pool_cfg.name
        backend = self._backend_overrides.get(name) or open_backend(pool_cfg, self.cfg)
        if isinstance(backend, ReportsIsolation):
            isolation = backend.isolation()
            log.info("pool %s: %s", name, isolation.summary)
            for warning in isolation.warnings:
                log.warning("pool %s: %s", name, warning)
        ledger = self._ledger(name, pool_cfg.max_concurrency, backend, record)
        capacity = Capacity(name, pool_cfg.max_concurrency, ledger)
        if pool_cfg.job_timeout_minutes > GITEA_ENDLESS_TASK_MINUTES:
            log.warning(
                "pool %s: jobTimeoutMinutes is %d, but Gitea stops every task that runs longer than its [actions] "
                "ENDLESS_TASK_TIMEOUT (%d minutes unless raised in app.ini, checked every 30 minutes), whatever the "
                "job's timeout-minutes: raise that setting as well, or such jobs fail after %d to %d minutes",
                name,
                pool_cfg.job_timeout_minutes,
                GITEA_ENDLESS_TASK_MINUTES,
                GITEA_ENDLESS_TASK_MINUTES,
                GITEA_ENDLESS_TASK_MINUTES + 30,
            )
        self.metrics.capacity.labels(pool=name).set(pool_cfg.max_concurrency)
        self.metrics.capacity_in_use.labels(pool=name).set_function(lambda: capacity.pool_in_use)
        settings = claim_settings(self.cfg, pool_cfg, cache=self._cache_grants)
        loops = CLAIM_LOOPS if self.cfg.gitea.credential_mode == "ephemeral" else 1
        pacer = pool_pacer(settings)
        claimers = [
            Claimer(
                settings,
                registrations=Registrations(
                    gitea,
                    store,
                    pool=name,
                    labels=pool_cfg.labels,
                    registration_token=self._token,
                    mode=self.cfg.gitea.credential_mode,
                    name_prefix=self.cfg.gitea.runner_name_prefix,
                    metrics=self.metrics,
                    replica=self.replica,
                ),
                capacity=capacity,
                publisher=self._log,
                sealer=sealer,
                metrics=self.metrics,
                pacer=pacer,
            )
            for _ in range(loops)
        ]
        launcher = Launcher(
            name,
            backend=backend,
            source=self._log,
            sealer=sealer,
            record=record,
            records=records,
            gitea=gitea,
            capacity=capacity,
            metrics=self.metrics,
            on_released=lambda assignment_id: self._wake(name, assignment_id),
        )
        return Pool(pool_cfg, backend, capacity, claimers, launcher)

    async def _run_loops(self, stop: asyncio.Event, reaper: Reaper) -> None:
        def counted(pool: str, kind: str):  # type: ignore[no-untyped-def]
            return lambda err: self.metrics.errors.labels(pool=pool, kind=kind).inc()

        async with asyncio.TaskGroup() as tg, self._stopped_on_failure(reaper):
            lease = self.replica.lease
            renewing = None
            if lease is not None:
                renewing = tg.create_task(
                    supervise("replica lease", lease.run, stop=lease.stopping), name="replica-lease"
                )
            ledgers = [
                tg.create_task(
                    supervise(f"permits {name}", p.capacity.ledger.run, stop=p.capacity.ledger.stopping),
                    name=f"permits-{name}",
                )
                for name, p in self.pools.items()
                if p.capacity.ledger is not None
            ]
            watching = [
                tg.create_task(
                    supervise(
                        f"watch {name}",
                        functools.partial(p.backend.watch, functools.partial(self._wake, name)),
                        on_error=counted(name, "watch"),
                        on_fatal=functools.partial(self._stop_loops, reaper),
                    ),
                    name=f"watch-{name}",
                )
                for name, p in self.pools.items()
                if isinstance(p.backend, Watches)
            ]
            for p in self.pools.values():
                await self._recover(p)
            reaping = tg.create_task(supervise("reaper", reaper.run, stop=stop), name="reaper")
            launching = [
                tg.create_task(
                    supervise(
                        f"launcher {name}", p.launcher.run, on_error=counted(name, "launcher"), stop=p.launcher.stopping
                    ),
                    name=f"launcher-{name}",
                )
                for name, p in self.pools.items()
            ]
            claiming = [
                tg.create_task(
                    supervise(
                        f"claimer {name}/{slot}",
                        claimer.run,
                        backoff=claim_loop_backoff(),
                        on_error=counted(name, "claimer"),
                        stop=stop,
                        on_fatal=functools.partial(self._stop_loops, reaper),
                    ),
                    name=f"claimer-{name}-{slot}",
                )
                for name, p in self.pools.items()
                for slot, claimer in enumerate(p.claimers)
            ]
            self.ready.set()
            log.info("controller running", extra={"pools": list(self.pools)})
            await stop.wait()
            log.info("stopping: no new claims; finishing claims and launches in hand")
            for p in self.pools.values():
                for claimer in p.claimers:
                    claimer.stop()
            await asyncio.gather(*claiming, return_exceptions=True)
            for p in self.pools.values():
                p.launcher.stop()
            for task in launching:
                task.cancel()  # an idle pull ends at once; one that swallows this ends on the flag
            await asyncio.gather(*launching, return_exceptions=True)
            reaper.stop()
            await reaping
            await asyncio.gather(*(p.capacity.ledger.flush() for p in self.pools.values() if p.capacity.ledger))
            for p in self.pools.values():
                if p.capacity.ledger is not None:
                    p.capacity.ledger.stop()
            for task in ledgers:
                task.cancel()
            if renewing is not None and lease is not None:
                lease.stop()
                renewing.cancel()
            for task in watching:
                task.cancel()
            await asyncio.gather(*watching, return_exceptions=True)

    @contextlib.asynccontextmanager
    async def _stopped_on_failure(self, reaper: Reaper) -> AsyncIterator[None]:
        """A loop that failed for good makes the task group cancel the others: their flags are
        set as well, so one whose cancellation a request lost does not hold up the exit."""
        try:
            yield
        except BaseException:
            self._stop_loops(reaper)
            raise

    def _stop_loops(self, reaper: Reaper) -> None:
        """Set every loop's stop flag (before the cancellations, when a loop fails for good)."""
        for p in self.pools.values():
            for claimer in p.claimers:
                claimer.stop()
            p.launcher.stop()
            if p.capacity.ledger is not None:
                p.capacity.ledger.stop()
        reaper.stop()
        if self.replica.lease is not None:
            self.replica.lease.stop()

    async def _recover(self, pool: Pool) -> None:
        """Capacity for the environments that exist and the assignments still queued (a
        watching backend answers once its watch has synced)."""
        assert self._log is not None
        name = pool.config.name
        envs = await pool.backend.list_owned()
        pending = await self._log.pending(name)
        pool.capacity.restore((e.assignment_id for e in envs), pending)
        if envs or pending:
            log.info("pool %s: recovered %d environments and %d queued assignments", name, len(envs), pending)

    def _wake(self, pool: str, assignment_id: str | None) -> None:
        """A backend's watch or a start follower says an environment may have changed."""
        if self._reaper is not None:
            self._reaper.wake(pool, assignment_id)

    async def _pending(self, pool: str) -> int:
        assert self._log is not None
        return await self._log.pending(pool)

    async def _unacknowledged(self, env: Environment) -> bool:
        assert self._log is not None and env.stream_seq is not None
        return await self._log.unacknowledged(env.stream_seq, env.assignment_id)

    def liveness(self) -> tuple[bool, str]:
        """Not healthy while the embedded nats-server is down: nothing can be claimed or launched
        until it is running again (it is restarted with backoff)."""
        if self._embedded is not None and not self._embedded.running:
            return False, "the embedded nats-server is down (being restarted): nothing can be claimed or launched"
        return True, ""

    def readiness(self) -> tuple[bool, str]:
        if not self.ready.is_set():
            return False, "starting"
        alive, why = self.liveness()
        if not alive:
            return False, why
        if self._log is None or not self._log.nc.is_connected:
            return False, "not connected to NATS"
        refusal = self._token.refusal
        if refusal is not None:
            return False, refusal
        failing = [name for name, p in self.pools.items() if all(_failing(c) for c in p.claimers)]
        if failing:
            last = next((c.last_error for c in self.pools[failing[0]].claimers if c.last_error), "")
            return False, f"claiming keeps failing in pools {', '.join(failing)} (last error: {last}; see the log)"
        return True, ""


def _failing(claimer: Claimer) -> bool:
    """Failing again and again — or failing from the start: a controller started during a
    Gitea outage is not ready until it reached Gitea (a loop waiting for capacity, with no
    attempt yet, is not failing)."""
    errors = claimer.consecutive_errors
    return errors >= READY_ERROR_LIMIT or (errors > 0 and not claimer.reached_gitea)
