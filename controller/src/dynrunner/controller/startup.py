"""What the controller builds from its configuration before it runs, shared by `run`, `check`
and `render`: the sealing key, each pool's backend and claim settings, and the one error type
that says what to change."""

from __future__ import annotations

import logging
import os

from dynrunner.controller.backends.base import Backend, BackendError
from dynrunner.controller.backends.registry import create_backend
from dynrunner.controller.cache.grants import CacheGrants
from dynrunner.controller.claiming.build import ClaimSettings
from dynrunner.controller.config.model import ControllerConfig, PoolConfig
from dynrunner.controller.infra.sealing import Sealer, SealingError, ensure_key_file
from dynrunner.proto.assignment import ExecutorOptions

log = logging.getLogger("dynrunner.controller")


class StartupError(RuntimeError):
    """The controller cannot start as configured (the message says what to change)."""


def executor_options(cfg: ControllerConfig, pool: PoolConfig) -> ExecutorOptions:
    """What a pool's executors are told about their runtime: the pool's backend says where the
    workspace is and whether they wait for a workload identity."""
    needs = pool.backend.executor_needs(cfg.identity)
    return ExecutorOptions(
        workspace=needs.workspace or cfg.executor.workspace,
        artifacts=cfg.artifacts.options(),
        identity=needs.identity,
        outputs_total_limit_bytes=cfg.executor.outputs_total_limit_bytes,
        log_level=cfg.executor.log_level,
    )


def claim_settings(cfg: ControllerConfig, pool: PoolConfig, *, cache: CacheGrants | None = None) -> ClaimSettings:
    """How a pool's claimers build assignments (also what `render` builds one with)."""
    return ClaimSettings(
        pool=pool.name,
        backend=pool.backend.kind,
        gitea_url=cfg.gitea.url,
        fetch_interval_s=cfg.gitea.fetch_interval_s,
        fetch_interval_max_s=cfg.gitea.fetch_interval_max_s,
        request_timeout_s=cfg.gitea.request_timeout_s,
        default_timeout_minutes=pool.job_timeout_minutes,
        trust_domain=cfg.identity.trust_domain,
        ref_in_spiffe_id=pool.ref_in_spiffe_id,
        executor=executor_options(cfg, pool),
        cache=cache,
    )


def open_sealer(cfg: ControllerConfig, *, create: bool = True) -> Sealer | None:
    """The sealing key; created on first start only for a single-machine (embedded NATS)
    controller — with an external NATS every replica must share one key, made by an admin.
    Without `create` (for `check`), None where it would be created. Every problem with a key
    file is a StartupError whose one line `run` and `check` both print."""
    key_file = cfg.sealing.key_file
    assert key_file is not None, "ControllerConfig derives key_file"
    for path in (key_file, *cfg.sealing.retired_key_files):
        if path.is_symlink() and not path.exists():
            raise StartupError(
                f"sealing key file {path} is a symbolic link to {os.readlink(path)}, which does not exist"
            )
    if not key_file.exists():
        if cfg.nats.url is not None:
            raise StartupError(
                f"sealing key file {key_file} does not exist; create one (e.g. `head -c 32 /dev/urandom | base64 > "
                f"{key_file}`) and give every controller replica the same key"
            )
        if not create:
            return None
        ensure_key_file(key_file)
        log.info("created a new sealing key", extra={"key_file": str(key_file)})
    try:
        return Sealer.from_key_file(key_file, cfg.sealing.retired_key_files)
    except SealingError as err:
        raise StartupError(str(err)) from None


def open_backend(pool: PoolConfig, cfg: ControllerConfig) -> Backend:
    """The pool's backend; one it cannot make (its executor program is missing, say) is a
    StartupError naming the pool, as `check` reports it."""
    try:
        return create_backend(pool, cfg)
    except (ValueError, BackendError, OSError) as err:
        raise StartupError(f"pool {pool.name}: {err}") from err
