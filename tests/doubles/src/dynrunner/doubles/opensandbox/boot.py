"""Booting a sandbox as a local process: what the double runs instead of a microVM.

A sandbox gets a directory, its *rootfs*. The image's files are placed in it; the VM's own
runtime directories (`LocalImage.private_dirs`, `/run` by default) live in it too and are
bind-mounted over the host's in a private mount namespace, so the entrypoint, and everything
it starts, sees `/run/...` exactly where a process in the VM would, while execd's file API
(which the double serves) writes to the same place from outside. Everything else of the host
stays visible: the interpreter and the executor are the host's, as the image's would be.

The process gets the image's environment (`{rootfs}` in a value is replaced by the rootfs
path, so an image can point at its own files) overlaid by the request's `env`, and nothing of
the host's environment, as a VM would not. It runs in its own session, so killing the
sandbox kills everything it started.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOTFS_PLACEHOLDER = "{rootfs}"
ROOT = os.geteuid() == 0

_NAMESPACE_INIT = r"""
root=$1; shift
while [ "$1" != -- ]; do
  command -p mkdir -p "$root$1" && command -p mount --bind "$root$1" "$1" ||
    { echo "cannot mount $root$1 on $1" >&2; exit 125; }
  shift
done
shift
cd "$DOUBLE_WORKDIR" 2>/dev/null || cd "$root$DOUBLE_WORKDIR" 2>/dev/null || cd /
unset DOUBLE_WORKDIR
exec "$@"
"""


@dataclass(frozen=True)
class LocalImage:
    """What an image URI boots in the double: files copied into the rootfs (VM path → host
    file), the image's environment, its working directory and its private runtime dirs."""

    files: Mapping[str, Path] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = "/"
    private_dirs: tuple[str, ...] = ("/run",)


def vm_path(rootfs: Path, path: str, cwd: str = "/") -> Path:
    """The host path of a path inside the sandbox; `..` cannot leave the rootfs."""
    absolute = posixpath.normpath(posixpath.join("/", cwd, path))
    return rootfs / absolute.lstrip("/")


def _install(rootfs: Path, image: LocalImage) -> None:
    for target, source in image.files.items():
        dest = vm_path(rootfs, target)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)
    for directory in image.private_dirs:
        vm_path(rootfs, directory).mkdir(parents=True, exist_ok=True)


def environment(rootfs: Path, image: LocalImage, request_env: Mapping[str, str | None]) -> dict[str, str]:
    """The sandbox's environment: the image's (`{rootfs}` filled in) overlaid by the request's."""
    env = {key: value.replace(ROOTFS_PLACEHOLDER, str(rootfs)) for key, value in image.env.items()}
    env.update({key: value for key, value in request_env.items() if value is not None})
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def _command(rootfs: Path, argv: list[str], env: Mapping[str, str]) -> list[str]:
    """argv[0] as the VM resolves it: a path inside the rootfs, else a name on the image's PATH."""
    program = argv[0]
    if "/" in program:
        inside = vm_path(rootfs, program)
        if inside.exists():
            return [str(inside), *argv[1:]]
        return argv
    found = shutil.which(program, path=env.get("PATH"))
    return [found or program, *argv[1:]]


async def start(
    rootfs: Path, image: LocalImage, argv: list[str], env: Mapping[str, str], console: Path
) -> asyncio.subprocess.Process:
    """Start the entrypoint in a fresh session with `env` (see `environment`); its output goes
    to `console`."""
    _install(rootfs, image)
    unshare = [shutil.which("unshare") or "/usr/bin/unshare", "--mount", "--propagation", "private"]
    if not ROOT:
        unshare[1:1] = ["--user", "--map-root-user"]
    command = [
        *unshare,
        "/bin/sh",
        "-c",
        _NAMESPACE_INIT,
        "sandbox-init",
        str(rootfs),
        *image.private_dirs,
        "--",
        *_command(rootfs, argv, env),
    ]
    with console.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env={**env, "DOUBLE_WORKDIR": image.workdir},
            start_new_session=True,
        )


def enter(pid: int, argv: list[str]) -> list[str]:
    """argv run inside the namespaces of the sandbox whose entrypoint is `pid` (execd's view)."""
    nsenter = [shutil.which("nsenter") or "/usr/bin/nsenter", "--target", str(pid), "--mount"]
    if not ROOT:
        nsenter[3:3] = ["--user", "--preserve-credentials"]
    return [*nsenter, "--", *argv]
