"""Waiting for the job's workload identity before the first step (a pre-step of `run`).

The backend registers the job's SPIFFE ID with SPIRE once the environment exists; the
agent then serves an X.509 SVID for it over the Workload API. Steps that talk to a registry
or secret store need it, so the executor waits until the Workload API at the configured
socket returns an SVID whose SPIFFE ID equals the assignment's *exactly*; an SVID for any
other ID does not count. Not issued in time → the task fails with
"workload identity <id> not issued within Ns".

py-spiffe's client is blocking, so each attempt runs in a thread with its own deadline.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

RETRY_MIN_S = 0.2
RETRY_MAX_S = 2.0
ATTEMPT_MAX_S = 5.0


class IdentityError(Exception):
    """The identity was not issued in time; the message is for the job log."""


SPIFFE_ENDPOINT_ENV = "SPIFFE_ENDPOINT_SOCKET"


def _endpoint(socket: str) -> str:
    if "://" in socket or socket.startswith("unix:"):
        return socket
    return f"unix://{socket}"


def workload_api_endpoint(configured: str) -> str:
    """The Workload API address for py-spiffe: the assignment's socket, else
    SPIFFE_ENDPOINT_SOCKET (set by a backend that knows where it is); "" when neither."""
    socket = configured or os.environ.get(SPIFFE_ENDPOINT_ENV, "")
    return _endpoint(socket) if socket else ""


def _fetch_ids(endpoint: str, timeout_s: float) -> list[str]:
    from spiffe import WorkloadApiClient  # grpc and cryptography load only when needed

    client = WorkloadApiClient(socket_path=endpoint)
    try:
        return [str(svid.spiffe_id) for svid in client.fetch_x509_svids(timeout=timeout_s)]
    finally:
        client.close()


async def wait_for_svid(
    spiffe_id: str,
    socket: str,
    timeout_s: float,
    log: Callable[[str], None],
    *,
    fetch: Callable[[str, float], list[str]] = _fetch_ids,
) -> float:
    """Wait for an X.509 SVID for `spiffe_id`; returns the seconds waited, raises IdentityError."""
    if not spiffe_id:
        raise IdentityError("the assignment asks to wait for a workload identity but names no SPIFFE ID")
    if not socket:
        raise IdentityError(
            "the assignment asks to wait for a workload identity but names no Workload API socket, "
            "and SPIFFE_ENDPOINT_SOCKET is not set"
        )
    endpoint = _endpoint(socket)
    started = time.monotonic()
    deadline = started + timeout_s
    delay = RETRY_MIN_S
    seen: list[str] = []
    last_error = ""
    log(f"Waiting up to {timeout_s:g}s for workload identity {spiffe_id}")
    while True:
        remaining = deadline - time.monotonic()
        try:
            seen = await asyncio.to_thread(fetch, endpoint, max(0.1, min(ATTEMPT_MAX_S, remaining)))
            last_error = ""
        except Exception as err:
            last_error = str(err) or type(err).__name__
        if spiffe_id in seen:
            waited = time.monotonic() - started
            log(f"Workload identity {spiffe_id} issued after {waited:.1f}s")
            return waited
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            detail = f"; the Workload API returned {', '.join(seen)}" if seen else ""
            if last_error:
                detail += f"; last error: {last_error}"
            raise IdentityError(f"workload identity {spiffe_id} not issued within {timeout_s:g}s{detail}")
        await asyncio.sleep(min(delay, remaining))
        delay = min(RETRY_MAX_S, delay * 2)
