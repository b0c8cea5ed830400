"""`dynrunner-controller check`: the start-up validators plus reachability, one line each.

Nothing here changes Gitea or NATS: the registration token is not tried (registering would
leave a runner behind), and an embedded NATS is not started (a running controller holds
its store).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol, TextIO
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import nats.errors
import nats.js.errors

from dynrunner.controller.assignments.log import AssignmentLogError, connect_nats
from dynrunner.controller.backends.base import ReportsIsolation
from dynrunner.controller.claiming.registration_token import WHERE_TO_GET_ONE
from dynrunner.controller.config.model import ConfigError, ControllerConfig, load_config
from dynrunner.controller.infra.embedded_nats import EmbeddedNatsError, find_nats_server
from dynrunner.controller.infra.health import parse_address
from dynrunner.controller.infra.nats_auth import anonymous_options, client_options
from dynrunner.controller.startup import StartupError, open_backend, open_sealer
from dynrunner.proto.gitea import GiteaClient, GiteaError
from dynrunner.proto.gitea.client import RetryPolicy

CHECK_RETRY = RetryPolicy(attempts=2, max_delay_s=10.0)
MIN_TOKEN_LENGTH = 32


class Report:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.failed = 0

    def line(self, ok: bool, what: str, detail: str) -> None:
        if not ok:
            self.failed += 1
        self.write("OK  " if ok else "FAIL", what, detail)

    def warn(self, what: str, detail: str) -> None:
        """Works, but not as safely as a user would expect (not a failure)."""
        self.write("WARN", what, detail)

    def write(self, status: str, what: str, detail: str) -> None:
        self.out.write(f"{status} {what}: {detail}\n")
        self.out.flush()

    async def check(self, what: str, probe: Callable[[], Awaitable[str]]) -> None:
        try:
            detail = await probe()
        except Exception as err:
            self.line(False, what, str(err) or type(err).__name__)
        else:
            self.line(True, what, detail)


async def run_checks(path: Path | None, out: TextIO = sys.stdout) -> int:
    report = Report(out)
    try:
        cfg = load_config(path)
    except ConfigError as err:
        report.line(False, "config", f"{err.source}")
        for problem in err.problems:
            out.write(f"       - {problem}\n")
        return 1
    names = ", ".join(p.name for p in cfg.pools)
    report.line(True, "config", f"{path or 'environment'}: {len(cfg.pools)} pool(s): {names}")
    await report.check("sealing key", lambda: _sealing(cfg))
    await report.check("registration token", lambda: _token(cfg))
    await report.check("gitea", lambda: _gitea(cfg))
    nats_warnings: list[str] = []
    await report.check("nats", lambda: _nats(cfg, nats_warnings))
    for warning in nats_warnings:
        report.warn("nats", warning)
    for pool in cfg.pools:
        warnings: list[str] = []
        findings: list[Finding] = []
        await report.check(f"pool {pool.name}", functools.partial(_pool, cfg, pool.name, warnings, findings))
        for finding in findings:
            report.line(finding.ok, f"pool {pool.name} {finding.what}", finding.detail)
        for warning in warnings:
            report.warn(f"pool {pool.name}", warning)
    if cfg.metrics.enabled:
        await report.check("controller", lambda: _running(cfg))
    return 1 if report.failed else 0


async def _sealing(cfg: ControllerConfig) -> str:
    sealer = open_sealer(cfg, create=False)
    if sealer is None:
        return f"{cfg.sealing.key_file} does not exist yet; it is created at the first start (embedded NATS)"
    return f"{cfg.sealing.key_file} (key id {sealer.key_id})"


async def _token(cfg: ControllerConfig) -> str:
    """What can be told without registering: Gitea's tokens are 40 characters (at least 32 when
    preset with GITEA_RUNNER_REGISTRATION_TOKEN), without spaces. Whether Gitea still takes it
    only a Register shows: a running controller that was refused says so (see `_running`)."""
    token = cfg.gitea.registration_token()
    where = f"from {cfg.gitea.registration_token_file}" if cfg.gitea.registration_token_file else "inline"
    if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
        raise ValueError(
            f"the token ({where}) has {len(token)} characters{' and spaces' if any(c.isspace() for c in token) else ''}"
            f": Gitea's registration tokens are 40 characters without spaces ({WHERE_TO_GET_ONE})"
        )
    return f"{len(token)} characters ({where}); Gitea checks it when a runner registers (check registers none)"


async def _running(cfg: ControllerConfig) -> str:
    """A controller of this configuration running on this machine: its /readyz (say a refused
    registration token), read-only."""
    host, port = parse_address(cfg.metrics.address)
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}/readyz"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.get(url) as response,
        ):
            body = (await response.text()).strip()
            status = response.status
    except (aiohttp.ClientConnectionError, TimeoutError):
        return f"none answers at {url} (not running here)"
    if status == 503:
        raise RuntimeError(f"running here and {body} ({url})")
    if status != 200:
        return f"{url} answers {status}: not a dynrunner controller"
    return f"running here and ready ({url})"


async def _gitea(cfg: ControllerConfig) -> str:
    client = GiteaClient(cfg.gitea.url, timeout_s=10.0, retry=CHECK_RETRY)
    try:
        await client.ping("dynrunner-check")
    except GiteaError as err:
        raise GiteaError(f"{cfg.gitea.url} does not answer Ping: {err}") from err
    return f"{cfg.gitea.url} answers; credential mode {cfg.gitea.credential_mode}"


async def _nats(cfg: ControllerConfig, warnings: list[str]) -> str:
    if cfg.nats.url is None:
        try:
            binary = find_nats_server()
        except EmbeddedNatsError as err:
            raise RuntimeError(str(err)) from None
        return f"embedded server {binary}, store {cfg.nats.data_dir}, clients need its generated credentials"
    try:
        nc = await connect_nats(cfg.nats.url, options=client_options(cfg.nats), name="dynrunner-check")
    except AssignmentLogError as err:
        raise RuntimeError(str(err)) from None
    try:
        js = nc.jetstream(timeout=5.0)
        try:
            info = await js.account_info()
        except (nats.errors.Error, nats.js.errors.Error) as err:
            raise RuntimeError(f"{cfg.nats.display_url} is reachable but JetStream is not enabled: {err}") from None
        detail = f"{cfg.nats.display_url} with JetStream ({info.streams} streams)"
    finally:
        await nc.close()
    if await _accepts_anonymous(cfg):
        warnings.append(
            f"{cfg.nats.display_url} accepts clients without credentials: anyone who can reach it can delete or "
            "withhold assignments and read which tasks run (forged ones are refused); require authentication "
            "(see docs/security.md#nats)",
        )
    return detail


async def _accepts_anonymous(cfg: ControllerConfig) -> bool:
    assert cfg.nats.url is not None
    url = ",".join(_without_userinfo(one.strip()) for one in cfg.nats.url.split(","))
    try:
        nc = await connect_nats(url, options=anonymous_options(cfg.nats), name="dynrunner-check", connect_wait_s=1)
    except AssignmentLogError:
        return False
    await nc.close()
    return True


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=host))


class Finding(Protocol):
    ok: bool
    what: str
    detail: str


async def _pool(cfg: ControllerConfig, name: str, warnings: list[str], findings: list[Finding]) -> str:
    """The pool's backend opens and lists its environments; a backend with checks of its own
    (`check()`: e.g. the Kubernetes API, namespace, RBAC) adds their lines to `findings`."""
    pool = cfg.pool(name)
    try:
        backend = open_backend(pool, cfg)
    except StartupError as err:
        raise RuntimeError(str(err.__cause__ or err)) from None  # the line already names the pool
    try:
        own_checks = getattr(backend, "check", None)
        if own_checks is not None:
            findings.extend(await own_checks())
            failed = [f for f in findings if not f.ok]
            if failed:
                raise RuntimeError(f"backend {pool.backend.kind}: {len(failed)} problem(s), below")
        envs = await backend.list_owned()
    finally:
        await backend.aclose()
    detail = f"backend {pool.backend.kind}, labels {', '.join(pool.labels)}, {len(envs)} environment(s) now"
    if isinstance(backend, ReportsIsolation):
        isolation = backend.isolation()
        warnings.extend(isolation.warnings)
        detail += f"; {isolation.summary}"
    return detail
