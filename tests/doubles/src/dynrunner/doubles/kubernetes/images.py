"""What an image means to the kubelet double: images are configured, not pulled.

An `Image` maps a reference (`registry.example/dynrunner/executor:1.0`) to the command its
entrypoint runs on this host, its environment, and how pulling it behaves: a delay, or a
failure with containerd's messages (as the kubelet reports them in ErrImagePull), or a hold
the test releases.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Image:
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str = ""
    pull_seconds: float = 0.0
    size: int = 52_428_800
    # "not-found", "unauthorized", or a containerd message of one's own; None pulls fine.
    pull_error: str | None = None
    # A test's hand on the pull: it lasts (after pull_seconds) until this is set, so a test can
    # see the "Pulling" stage before the container runs without betting on a duration.
    pull_hold: threading.Event | None = None


def this_environment(*entrypoint: str, pull_seconds: float = 0.0) -> Image:
    """An image whose programs are this Python environment's: its bin directory comes first on
    PATH, so a Pod whose command is `dynrunner-executor` runs this venv's executor."""
    import os
    import sys
    from pathlib import Path

    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return Image(entrypoint=entrypoint, env={"PATH": path}, pull_seconds=pull_seconds)


def _qualified(reference: str) -> str:
    """docker.io/library/ qualification, as containerd reports references."""
    first = reference.split("/", 1)[0]
    if "/" not in reference:
        return f"docker.io/library/{reference}"
    if "." not in first and ":" not in first and first != "localhost":
        return f"docker.io/{reference}"
    return reference


def pull_error_message(reference: str, error: str) -> str:
    ref = _qualified(reference if ":" in reference.rsplit("/", 1)[-1] or "@" in reference else f"{reference}:latest")
    if error == "not-found":
        return (
            f'rpc error: code = NotFound desc = failed to pull and unpack image "{ref}": '
            f'failed to resolve reference "{ref}": {ref}: not found'
        )
    if error == "unauthorized":
        return (
            f'rpc error: code = Unknown desc = failed to pull and unpack image "{ref}": failed to resolve reference '
            f'"{ref}": pull access denied, repository does not exist or may require authorization: server message: '
            "insufficient_scope: authorization failed"
        )
    return error


def image_id(reference: str) -> str:
    import hashlib

    return f"{_qualified(reference).rsplit(':', 1)[0]}@sha256:{hashlib.sha256(reference.encode()).hexdigest()}"
