"""A pool's configuration turned into what the local backend needs on this machine: the
executor's command and environment, how jobs are contained, and how (or whether) they are
isolated from the controller. Everything here is checked once, at start."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from dynrunner.controller.backends.base import BackendError
from dynrunner.controller.backends.local.containment import Containment, choose
from dynrunner.controller.backends.local.isolation import (
    IsolationError,
    RunAs,
    Sandbox,
    configured_paths,
    require_root_controller,
    resolve_user,
    sandbox,
)
from dynrunner.controller.config.model import ControllerConfig, LocalBackendConfig, PoolConfig

PASSED_ENV = (
    "LANG", "LC_ALL", "LC_CTYPE", "TZ", "SSL_CERT_FILE", "SSL_CERT_DIR",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    # How the executor runs job containers, services and container actions (docs/containers.md).
    "DYNRUNNER_PODMAN", "DYNRUNNER_PODMAN_RUN_OPTIONS", "DYNRUNNER_AGENT",
)  # fmt: skip
# With an S3 artifact store, the executor needs credentials from boto3's standard chain; the
# controller's own environment is otherwise not handed to jobs (its registration token is there).
S3_ENV = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE", "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE", "AWS_PROFILE",
)  # fmt: skip


class SetupError(BackendError):
    """The backend cannot run jobs as configured on this machine (the message says why)."""


@dataclass(frozen=True, slots=True)
class Settings:
    command: list[str]
    passed_env: tuple[str, ...]
    containment: Containment
    sandbox: Sandbox | None
    config_file: Path | None


def resolve_program(program: str, path: str) -> str:
    """An absolute path for `program`: as given, from PATH, or next to this Python (the
    executor is installed beside the controller)."""
    if "/" in program:
        given = Path(program).absolute()  # not resolve(): a venv's python is a symlink
        if not given.is_file():
            raise ValueError(f"the executor program {program!r} does not exist (or is not a file)")
        if not os.access(given, os.X_OK):
            raise ValueError(f"the executor program {program!r} is not executable")
        return str(given)
    beside = Path(sys.executable).parent
    found = shutil.which(program, path=path) or shutil.which(program, path=str(beside))
    if found is None:
        raise ValueError(f"the executor program {program!r} was not found on PATH or in {beside}")
    return found


def settings(pool: PoolConfig, config: ControllerConfig) -> Settings:
    backend = pool.backend
    assert isinstance(backend, LocalBackendConfig), "the registry picks the backend by its kind"
    root = backend.root_dir
    assert root is not None, "ControllerConfig derives root_dir"
    program, *args = backend.executor_command
    resolved = resolve_program(program, os.environ.get("PATH", os.defpath))
    run_as = None
    if backend.run_as_user is not None:
        try:
            run_as = resolve_user(backend.run_as_user, backend.run_as_group)
            require_root_controller()
        except IsolationError as err:
            raise SetupError(str(err)) from None
    passed: tuple[str, ...] = PASSED_ENV
    store = ""
    if config.artifacts.driver == "S3":
        passed += S3_ENV
    elif config.artifacts.driver == "Filesystem":
        store = config.artifacts.path
        _make_store(Path(store), run_as)
    try:
        containment = choose(backend.containment, root, pool.name)
    except ValueError as err:
        raise SetupError(str(err)) from None
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(root, 0o700)
    isolated = None
    if run_as is not None:
        try:
            isolated = sandbox(
                run_as,
                controller_paths=configured_paths(config),
                config_file=config.source_file,
                root_dir=root,
                executor=resolved,
                store=store,
            )
        except IsolationError as err:
            raise SetupError(str(err)) from None
    return Settings([resolved, *args], passed, containment, isolated, config.source_file)


def _make_store(store: Path, run_as: RunAs | None) -> None:
    """The Filesystem store is on this machine: make its root, as a volume mount would
    provide it — owned by the jobs' user when they run as one, who must be able to write it."""
    if not store.exists():
        store.mkdir(parents=True)
        if run_as is not None:
            os.chown(store, run_as.uid, run_as.gid)
    if run_as is None:
        return
    info = store.stat()
    writable = (
        (info.st_uid == run_as.uid and info.st_mode & stat.S_IWUSR)
        or (info.st_gid == run_as.gid and info.st_mode & stat.S_IWGRP)
        or info.st_mode & stat.S_IWOTH
    )
    if not writable:
        raise SetupError(
            f"the Filesystem artifact store {store} is not writable by the jobs' user {run_as}; chown it to that user"
        )
