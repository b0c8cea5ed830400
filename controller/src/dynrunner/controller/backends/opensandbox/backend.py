"""The `opensandbox` backend: one OpenSandbox sandbox — a microVM booting the VM image built from
vm/ — per job (docs/opensandbox.md).

- `create` finds the job's sandbox by its metadata (create takes no idempotency key; see
  `selection` for duplicates), else makes the sandbox; waits, within `startTimeoutSeconds`,
  until it runs and execd answers; registers the job's SPIRE entry (parented on the VM agent's
  alias) and *stages* the delivery — the assignment, a one-time SPIRE join token and the trust
  bundle — in `/run/dynrunner/delivery.partial` (stage `staged`). The assignment is in the VM
  before the launcher acknowledges its message, so a controller that dies afterwards loses
  nothing. A sandbox that fails meanwhile is returned as it is: its start reports why.
- `follow_start` starts the executor: one rename makes the delivery appear to the VM's
  entrypoint (execd refuses a rename onto an existing directory, so a VM is started once, by
  whichever controller gets there first); stage `delivered`.
- `observe` classifies the sandbox (`diagnosis`); it and `find` answer from the watch's last
  list while the watch runs (the reaper looks when the watch woke it), else read or list. A
  job that failed while its VM still runs (past its deadline) is observed with the task state
  Gitea last accepted from the executor, read through execd (`builders.STATE_FILE`); one
  whose VM ended (its executor killed, out of memory), with the same state as the entrypoint
  printed it on the console (`diagnosis.accepted_state`: execd has gone with the VM); a VM
  that did not start, with its console's last lines. The console is read once per sandbox,
  and only for a failed job.
- `watch` lists the pool's sandboxes, wakes the reaper and renews leases (`watch`).
- `delete` removes the sandbox (and any duplicate), the VM's SPIRE agent and its alias entry,
  and the job's entry.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Collection
from datetime import timedelta
from urllib.parse import urlsplit

from dynrunner.controller import contract
from dynrunner.controller.backends.base import (
    BackendError,
    Environment,
    FailureReason,
    Isolation,
    Observation,
    Phase,
    StartEvent,
    StartStage,
    Wake,
)
from dynrunner.controller.backends.opensandbox import builders, selection
from dynrunner.controller.backends.opensandbox.agents import Agents, SpireServerError
from dynrunner.controller.backends.opensandbox.api import NotFound, OpenSandboxApi, OpenSandboxError, SandboxFiles
from dynrunner.controller.backends.opensandbox.builders import VmSettings
from dynrunner.controller.backends.opensandbox.diagnosis import (
    DEADLINE_SLACK,
    SandboxView,
    accepted_state,
    classify,
    without_state,
)
from dynrunner.controller.backends.opensandbox.watch import Clock, PoolWatch, utcnow
from dynrunner.controller.config.model import ControllerConfig, PoolConfig
from dynrunner.proto.assignment import Assignment, encode
from dynrunner.proto.gitea import TaskState

log = logging.getLogger(__name__)

NAME = "opensandbox"
EXECD_WAIT_S = 10.0
"""How long one attempt to reach execd in a running sandbox may take."""
CONSOLE_LINES = 20
"""How much of a VM's console the job log gets when the VM did not start."""


class OpenSandboxBackend:
    name = NAME

    def __init__(
        self,
        settings: VmSettings,
        api: OpenSandboxApi,
        *,
        agents: Agents | None = None,
        clock: Clock = utcnow,
        deadline_grace: timedelta = DEADLINE_SLACK,
    ) -> None:
        self.settings = settings
        self.api = api
        self.agents = agents
        self.pool = settings.pool
        self.watcher = PoolWatch(api, settings, clock, deadline_grace)
        self._clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self._consoles: dict[str, str] = {}
        """Sandbox id → the console of a VM that failed (read once)."""
        self._staged_files: dict[str, SandboxFiles] = {}
        """Assignment id → the execd file API its staging reached, for its start to use."""
        self._started_in: dict[str, float] = {}
        """Assignment id → how long its sandbox took to accept the job (for the start line)."""

    @classmethod
    def from_config(cls, pool: PoolConfig, config: ControllerConfig, *, clock: Clock = utcnow) -> OpenSandboxBackend:
        settings = VmSettings.from_config(pool, config)
        backend = settings.backend
        api = OpenSandboxApi.connect(
            backend.url,
            api_key_file=backend.api_key_file,
            request_timeout_s=backend.request_timeout_s,
            use_server_proxy=backend.use_server_proxy,
        )
        agents = Agents(config.identity.spire_server) if backend.identity and config.identity.spire_server else None
        return cls(settings, api, agents=agents, clock=clock)

    def isolation(self) -> Isolation:
        """What `check` and the start say about this pool's VMs."""
        backend = self.settings.backend
        source = f"template {backend.template_id}" if backend.template_id else f"image {backend.image}"
        identity = "a SPIRE join token per VM" if self.agents is not None else "no workload identity"
        execd = (
            "execd behind a token per VM (secureAccess)"
            if backend.secure_access
            else "execd open to whoever reaches the server's proxy route with a sandbox id"
        )
        warnings = []
        policy = backend.network_policy
        if policy is None or policy.default_action == "allow":
            warnings.append(
                "the VMs' egress is not restricted (backend.networkPolicy): a job can reach any host "
                "the OpenSandbox runtime can, other jobs' services included"
            )
        else:
            server = (urlsplit(backend.url).hostname or "").lower()
            opened = [
                rule.target
                for rule in policy.egress
                if rule.action == "allow"
                and (rule.target == server or (rule.target.startswith("*.") and server.endswith(rule.target[1:])))
            ]
            if opened:
                warnings.append(
                    f"backend.networkPolicy lets the VMs reach the OpenSandbox server ({', '.join(opened)}): "
                    "its proxy route opens any sandbox's execd to a job that learns the sandbox's id"
                )
        return Isolation(f"one microVM per job on {self.api.url} ({source}), {identity}, {execd}", tuple(warnings))

    @property
    def _start_timeout(self) -> timedelta:
        return timedelta(seconds=self.settings.backend.start_timeout_s)

    def _alias(self, assignment_id: str) -> str:
        return builders.agent_alias(self.settings.trust_domain, self.pool, assignment_id)

    def _environment(self, view: SandboxView) -> Environment:
        labels = builders.labels_of(view.metadata)
        return Environment(
            backend=NAME,
            name=contract.environment_name(labels[contract.LABEL_ASSIGNMENT_ID]),
            labels=labels,
            created_at=view.created_at or self._clock(),
            deadline=builders.deadline_of(view.metadata),
            extra={"sandbox": view.id, "url": self.api.url},
        )

    # -- create ---------------------------------------------------------------------------------

    async def create(self, assignment: Assignment, *, stream_seq: int | None = None) -> Environment:
        aid = assignment.assignment_id
        lock = self._locks.setdefault(aid, asyncio.Lock())
        try:
            async with lock:
                self.watcher.finished.discard(aid)
                try:
                    view, found = await self._sandbox(assignment, stream_seq)
                except OpenSandboxError as err:
                    raise BackendError(f"OpenSandbox could not make the VM: {err.public}") from err
                if builders.stage_of(view.metadata) == builders.STAGE_CREATED and not view.ended:
                    try:
                        view = await self._stage(assignment, view, found=found)
                    except Exception as err:
                        await self._withdraw(aid, view.id)
                        if isinstance(err, OpenSandboxError):
                            raise BackendError(f"the VM could not be given its job: {err.public}") from err
                        raise
                self.watcher.note(aid, view)
                return self._environment(view)
        finally:
            if not lock.locked():
                self._locks.pop(aid, None)

    async def _withdraw(self, assignment_id: str, sandbox_id: str) -> None:
        """A launch that failed removes what it made: its sandbox and the job's SPIRE entry and
        alias (the next attempt makes them again). Nothing of it is renewed meanwhile."""
        self.watcher.finished.add(assignment_id)
        self._staged_files.pop(assignment_id, None)
        try:
            if await self.api.delete(sandbox_id):
                log.info("sandbox %s of the failed launch of %s deleted", sandbox_id, assignment_id)
            await self._remove_identity(assignment_id)
        except (OpenSandboxError, SpireServerError) as err:
            log.warning(
                "the failed launch of %s left something behind (the orphan collection removes it): %s",
                assignment_id,
                err,
            )

    async def _job_sandboxes(self, assignment_id: str) -> list[SandboxView]:
        listed = await self.api.list({builders.metadata_key(contract.LABEL_ASSIGNMENT_ID): assignment_id})
        return selection.by_assignment(listed, self.pool).get(assignment_id, [])

    async def _known_sandboxes(self, assignment_id: str) -> list[SandboxView]:
        """The job's sandboxes as the watch last listed them, while it runs; else listed now."""
        if self.watcher.fresh:
            return list(self.watcher.listed.get(assignment_id, []))
        return await self._job_sandboxes(assignment_id)

    async def _keep_one(self, views: list[SandboxView]) -> SandboxView:
        kept, duplicates = selection.keeper(views)
        for duplicate in duplicates:
            log.warning("sandbox %s duplicates %s of the same job: deleting it", duplicate.id, kept.id)
            await self.api.delete(duplicate.id)
        return kept

    async def _sandbox(self, assignment: Assignment, stream_seq: int | None) -> tuple[SandboxView, bool]:
        """The job's sandbox, made if there is none. Whether there is one is the watch's last
        list (a redelivery comes after ack-wait, long after it); a sandbox made since by a racing
        create is found by the list after this one's create, and every replica keeps the same."""
        found = await self._known_sandboxes(assignment.assignment_id)
        if found:
            return await self._keep_one(found), True
        request = builders.sandbox_request(assignment, self.settings, now=self._clock(), stream_seq=stream_seq)
        try:
            sandbox_id = await self.api.create(request)
        except OpenSandboxError as err:
            if not err.transient:
                raise BackendError(f"OpenSandbox refused the VM: {err.public}") from err
            # A lost answer may hide a sandbox that was made: only listing can tell.
            found = await self._job_sandboxes(assignment.assignment_id)
            if not found:
                raise BackendError(f"OpenSandbox could not make the VM: {err.public}") from err
            log.info("the create answer was lost, but the sandbox exists: %s", found[0].id)
            return await self._keep_one(found), True
        log.info("sandbox %s created for %s", sandbox_id, assignment.assignment_id)
        found = await self._job_sandboxes(assignment.assignment_id)
        if not found:  # listed before it shows (eventually consistent runtime): read it
            found = [await self.api.get(sandbox_id)]
        kept = await self._keep_one(found)
        return kept, kept.id != sandbox_id

    async def _stage(self, assignment: Assignment, view: SandboxView, *, found: bool) -> SandboxView:
        """Wait until the sandbox takes files, then put the delivery in it (`found`: the sandbox
        was there before this create, so another controller may have staged and started it)."""
        began = time.monotonic()
        reached = await self._reach(view)
        if isinstance(reached, SandboxView):
            return reached  # it ended, or never accepted the job within the start timeout
        view, files = reached
        token, bundle = "", b""
        if self.agents is not None:
            alias = self._alias(assignment.assignment_id)
            uid, ttl = self.settings.backend.executor_uid, self.settings.svid_ttl_s
            try:
                if assignment.spiffe_id:
                    await self.agents.register(assignment.spiffe_id, alias, uid, ttl)
                grant = await self.agents.grant(alias)
            except SpireServerError as err:
                raise BackendError(f"the VM's SPIRE agent and the job's entry could not be set up: {err}") from err
            token, bundle = grant.token, grant.bundle_pem
        delivery = builders.delivery_files(
            encode(assignment), join_token=token, bundle_pem=bundle, env=self.settings.artifact_env
        )
        own = f"{builders.PARTIAL_DIR}.{secrets.token_hex(8)}"
        await files.write(own, delivery, builders.FILE_MODE)
        withdrawn, started = "", False
        if not await files.rename(own, builders.PARTIAL_DIR):
            withdrawn = own  # another controller staged it first; its delivery is whole (one rename)
        elif found and await files.exists(builders.DELIVERY_DIR):
            withdrawn, started = builders.PARTIAL_DIR, True  # and started it since this one listed it
        if withdrawn:
            log.info("sandbox %s was staged by another controller: withdrawing this one's delivery", view.id)
            await files.delete([f"{withdrawn}/{name}" for name in delivery])
            if self.agents is not None and token:
                await self.agents.revoke(self._alias(assignment.assignment_id), token)
        if started:
            return await self.api.get(view.id)
        staged = await self.api.patch_metadata(view.id, {builders.KEY_STAGE: builders.STAGE_STAGED})
        self._started_in[assignment.assignment_id] = time.monotonic() - began
        self._staged_files[assignment.assignment_id] = files
        return staged

    async def _reach(self, view: SandboxView) -> tuple[SandboxView, SandboxFiles] | SandboxView:
        """The sandbox's file API once it runs and execd answers; or the sandbox as it is when
        it ended, or when the start timeout passed."""
        interval = self.settings.backend.poll_interval_s
        while True:
            now = self._clock()
            if view.ended:
                return view
            timeout_left = (view.created_at or now) + self._start_timeout - now
            if timeout_left <= timedelta(0):
                log.warning("sandbox %s did not accept its job within the start timeout: %s", view.id, view.message)
                return view
            if view.state == "Running":
                try:
                    wait = min(EXECD_WAIT_S, max(1.0, timeout_left.total_seconds()))
                    return view, await self.api.files(view.id, wait)
                except OpenSandboxError as err:
                    log.debug("execd in sandbox %s does not answer yet: %s", view.id, err)
            else:
                await asyncio.sleep(interval)
            try:
                view = await self.api.get(view.id)
            except NotFound:
                raise BackendError("the VM disappeared while it started") from None

    # -- the start ----------------------------------------------------------------------------

    async def follow_start(self, env: Environment) -> AsyncIterator[StartEvent]:
        aid = env.assignment_id
        view = await self._read(env)
        interval = self.settings.backend.poll_interval_s
        while True:
            observed = self._observation(env, view)
            if view is None or observed.phase.finished:
                yield StartEvent(StartStage.FAILED, diagnosis=observed.diagnosis)
                return
            if view.delivered:
                yield StartEvent(StartStage.STARTED, f"executor started in sandbox {view.id}")
                return
            if builders.stage_of(view.metadata) == builders.STAGE_STAGED:
                break
            await asyncio.sleep(interval)  # a create still staging it (bounded: the start timeout)
            view = await self._read(env)
        sandbox = view.id
        took = self._started_in.pop(aid, None)
        # The job log names no sandbox: its id reaches execd (docs/security.md, "MicroVMs").
        yield StartEvent(
            StartStage.PROGRESS,
            "the VM is running" + (f" (it took {took:.1f}s to accept the job)" if took is not None else ""),
        )
        log.info("handing %s to sandbox %s", aid, sandbox)
        yield StartEvent(StartStage.STARTING, "handing the job to the VM; starting the executor")
        files = self._staged_files.pop(aid, None) or await self.api.files(sandbox, EXECD_WAIT_S)
        if not await files.rename(builders.PARTIAL_DIR, builders.DELIVERY_DIR):
            log.info("sandbox %s was started already (by another controller)", sandbox)
        view = await self.api.patch_metadata(sandbox, {builders.KEY_STAGE: builders.STAGE_DELIVERED})
        self.watcher.note(aid, view)
        yield StartEvent(StartStage.STARTED, f"executor started in sandbox {sandbox}")

    # -- observing ----------------------------------------------------------------------------

    async def _read(self, env: Environment) -> SandboxView | None:
        """The job's sandbox now (None: it does not exist): as the watch last listed it (or a
        read since noted), while the watch runs; else read."""
        aid = env.assignment_id
        if self.watcher.fresh and (aid in self.watcher.seen or aid in self.watcher.gone):
            return self.watcher.seen.get(aid)
        view: SandboxView | None
        try:
            view = await self.api.get(env.extra.get("sandbox", "")) if env.extra.get("sandbox") else None
        except NotFound:
            view = None
        if view is None:  # not the one the handle names (a duplicate kept elsewhere), or gone
            found = await self._job_sandboxes(env.assignment_id)
            view = selection.keeper(found)[0] if found else None
        self.watcher.note(env.assignment_id, view)
        return view

    def _observation(self, env: Environment, view: SandboxView | None) -> Observation:
        return classify(
            view,
            deadline=env.deadline,
            now=self._clock(),
            start_timeout=self._start_timeout,
            last_seen=self.watcher.gone.get(env.assignment_id),
            deadline_grace=self.watcher.deadline_grace,
        )

    async def observe(self, env: Environment) -> Observation:
        view = await self._read(env)
        observed = self._observation(env, view)
        diagnosis = observed.diagnosis
        if view is not None and diagnosis is not None and diagnosis.reason is FailureReason.START_FAILED:
            console = await self._console(view.id)
            if console:
                observed = dataclasses.replace(observed, diagnosis=dataclasses.replace(diagnosis, detail=console))
        if observed.phase is Phase.FAILED and view is not None and view.delivered:
            if view.state == "Running":
                observed = dataclasses.replace(observed, reported=await self._reported(view))
            elif view.ended:  # execd ended with the VM: the entrypoint put the state on the console
                observed = dataclasses.replace(observed, reported=accepted_state(await self._console_text(view.id)))
        return observed

    async def _reported(self, view: SandboxView) -> TaskState | None:
        """What the executor in the VM kept of the task's accepted state; None when it cannot
        be had (nothing accepted yet, execd not answering)."""
        try:
            files = await self.api.files(view.id, EXECD_WAIT_S)
            data = await files.read(builders.STATE_FILE)
            return TaskState.decode(data) if data else None
        except (OpenSandboxError, ValueError) as err:
            log.warning("sandbox %s: the executor's accepted state cannot be read: %s", view.id, err)
            return None

    async def _console(self, sandbox_id: str) -> str:
        """The last lines of a VM's console, which tell why it did not start (the entrypoint's
        and the agent's words), without the sandbox's id or the entrypoint's state line."""
        text = without_state(await self._console_text(sandbox_id)).replace(sandbox_id, "<the VM>")
        return "\n".join(text.splitlines()[-CONSOLE_LINES:])

    async def _console_text(self, sandbox_id: str) -> str:
        """A VM's console as the server keeps it: read once per sandbox (only for one that
        failed), "" when the server has none or cannot say (tried again at the next look)."""
        if sandbox_id not in self._consoles:
            try:
                self._consoles[sandbox_id] = await self.api.console(sandbox_id)
            except OpenSandboxError as err:
                log.info("the console of sandbox %s cannot be read: %s", sandbox_id, err)
                return ""
        return self._consoles[sandbox_id]

    async def find(self, assignment_id: str) -> Environment | None:
        """From the watch's last list while it runs (the reaper looks when the watch woke it),
        else from a list now."""
        if self.watcher.fresh:
            kept: SandboxView | None = self.watcher.seen.get(assignment_id)
        else:
            found = await self._job_sandboxes(assignment_id)
            kept = selection.keeper(found)[0] if found else None
            self.watcher.note(assignment_id, kept)
        if kept is not None:
            visible = selection.is_environment(kept, now=self._clock(), start_timeout=self._start_timeout)
            return self._environment(kept) if visible else None
        tombstone = self.watcher.gone.get(assignment_id)
        return self._environment(tombstone) if tombstone is not None else None

    async def list_owned(self) -> list[Environment]:
        listed = await self.api.list({builders.metadata_key(contract.LABEL_POOL): self.pool})
        now = self._clock()
        envs = []
        groups = selection.by_assignment(listed, self.pool)
        for aid, views in groups.items():
            kept = selection.keeper(views)[0]
            self.watcher.note(aid, kept)
            if selection.is_environment(kept, now=now, start_timeout=self._start_timeout):
                envs.append(self._environment(kept))
        for aid in [a for a in self.watcher.seen if a not in groups]:
            self.watcher.note(aid, None)
        envs += [self._environment(v) for aid, v in self.watcher.gone.items() if aid not in groups]
        return envs

    # -- deleting -------------------------------------------------------------------------------

    async def delete(self, env: Environment) -> None:
        aid = env.assignment_id
        self.watcher.finished.add(aid)
        self._staged_files.pop(aid, None)
        self._started_in.pop(aid, None)
        ids = {v.id for v in await self._known_sandboxes(aid)}
        if env.extra.get("sandbox"):
            ids.add(env.extra["sandbox"])
        for sandbox_id in sorted(ids):
            self._consoles.pop(sandbox_id, None)
            if await self.api.delete(sandbox_id):
                log.info("sandbox %s of %s deleted", sandbox_id, aid)
        await self._remove_identity(aid)
        self.watcher.forget(aid)

    async def _remove_identity(self, assignment_id: str) -> None:
        if self.agents is not None:
            removed = await self.agents.remove(self._alias(assignment_id))
            if removed:
                log.info("SPIRE agent %s of %s deleted", ", ".join(removed), assignment_id)

    async def collect_orphans(self, launching: Collection[str]) -> list[str]:
        """Duplicate sandboxes of one job (a create raced another), and the SPIRE agents and
        entries of jobs without a sandbox."""
        listed = await self.api.list({builders.metadata_key(contract.LABEL_POOL): self.pool})
        groups = selection.by_assignment(listed, self.pool)
        removed = []
        for views in groups.values():
            kept, duplicates = selection.keeper(views)
            for duplicate in duplicates:
                if await self.api.delete(duplicate.id):
                    removed.append(f"sandbox {duplicate.id} (a duplicate of {kept.id})")
        if self.agents is not None:
            prefix = self._alias("")
            for alias in sorted(await self.agents.aliases_under(prefix)):
                aid = alias.removeprefix(prefix)
                if aid not in groups and aid not in launching:
                    await self.agents.remove(alias)
                    removed.append(f"the SPIRE agent and entries of {aid} ({alias})")
        return removed

    # -- the watch ------------------------------------------------------------------------------

    async def watch(self, wake: Wake) -> None:
        await self.watcher.run(wake)

    async def aclose(self) -> None:
        """Release clients; sandboxes go on running (and expire unless renewed)."""
        await self.api.aclose()
        if self.agents is not None:
            await self.agents.aclose()
        calls = dict(sorted(self.api.requests.items()))
        log.info(
            "pool %s: %d OpenSandbox API requests since start", self.pool, sum(calls.values()), extra={"calls": calls}
        )
