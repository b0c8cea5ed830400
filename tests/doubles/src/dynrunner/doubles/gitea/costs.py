"""What answering runners costs the server, counted so benchmarks can measure polling.

Gitea's expensive steps per runner call are the ones the double performs too: the PBKDF2
check of the runner token (10,000 iterations of HMAC-SHA256, `auth_model.HashToken`), the
write of the runner row's `last_online` (every call before main's debouncing), the job scan
of a FetchTask whose tasks_version is not the latest. `Costs` counts them, and the CPU time
each RPC spent in the double's worker thread (`time.thread_time`: not the wall time, not the
HTTP layer), per method. `GiteaDouble.costs()` returns a snapshot; `reset_costs()` zeroes it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class CostView:
    pbkdf2: int = 0
    """Token hashes computed (a runner's authentication, a new runner or task token)."""
    runner_writes: int = 0
    """Runner rows written by the interceptor's heartbeat bookkeeping."""
    version_reads: int = 0
    """FetchTasks answered (each reads the scope's tasks_version)."""
    scans: int = 0
    """FetchTasks that looked for a job (their tasks_version was not the latest)."""
    calls: dict[str, int] = field(default_factory=dict)
    """Authenticated RPCs answered, by method."""
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds the double's worker threads spent on them, by method."""


class Costs:
    """Thread-safe counters (RPCs run on the double's worker threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._calls: Counter[str] = Counter()
        self._cpu: dict[str, float] = {}

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self._counts[what] += n

    @contextmanager
    def measure(self, method: str) -> Iterator[None]:
        """Count one `method` call and the CPU time this thread spends inside the block."""
        started = time.thread_time()
        try:
            yield
        finally:
            spent = time.thread_time() - started
            with self._lock:
                self._calls[method] += 1
                self._cpu[method] = self._cpu.get(method, 0.0) + spent

    def view(self) -> CostView:
        with self._lock:
            return CostView(
                pbkdf2=self._counts["pbkdf2"],
                runner_writes=self._counts["runner_writes"],
                version_reads=self._counts["version_reads"],
                scans=self._counts["scans"],
                calls=dict(self._calls),
                cpu_s=dict(self._cpu),
            )

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._calls.clear()
            self._cpu.clear()
