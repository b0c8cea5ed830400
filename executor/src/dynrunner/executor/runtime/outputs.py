"""Bounded step outputs: GITHUB_OUTPUT read with explicit limits, and a per-job total.

Gitea stores an output only if its name is at most 255 bytes and its value at most 1 MiB, and
silently ignores the rest; we fail the step instead, naming the output and the limit, so a value
is never dropped or cut without the user seeing why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from dynrunner.executor.runtime.envfile import iter_env_stream

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class OutputLimits:
    key_bytes: int = 255
    value_bytes: int = MIB
    total_bytes: int = MIB
    """All step outputs of one job together (names and values, counted once per step and name)."""


class OutputLimitError(ValueError):
    """An output breaks a limit. `key` names it; `size` and `limit` are in bytes."""

    def __init__(self, message: str, *, key: str, size: int, limit: int) -> None:
        super().__init__(message)
        self.key = key
        self.size = size
        self.limit = limit


def read_output_file(path: Path, limits: OutputLimits, *, source: str = "GITHUB_OUTPUT") -> dict[str, str]:
    """The outputs a step wrote, the last write of a name winning. Raises OutputLimitError or EnvFileError;
    an oversized value is counted, never loaded."""

    def oversize(name: str, size: int, line: int) -> NoReturn:
        raise _value_error(name, size, limits)

    outputs: dict[str, str] = {}
    try:
        fp = open(path, "rb")  # noqa: SIM115 - closed below; a missing file is an empty one
    except FileNotFoundError:
        return outputs
    with fp:
        for name, value in iter_env_stream(fp, source=source, max_value=limits.value_bytes, on_oversize=oversize):
            check_output(name, value, limits)
            outputs[name] = value
    return outputs


def check_output(name: str, value: str, limits: OutputLimits) -> None:
    key_size = len(name.encode())
    if key_size > limits.key_bytes:
        # Not quoted, not even in part: a name that long is usually a value written without `name=`
        # (a base64 secret ending in '=' becomes the name), and a piece of a secret escapes masking.
        raise OutputLimitError(
            f"an output name of {key_size} bytes was written; the limit for an output name is {limits.key_bytes} "
            "bytes (the name is not shown: a name that long is usually a value written without `name=`)",
            key=name,
            size=key_size,
            limit=limits.key_bytes,
        )
    size = len(value.encode())
    if size > limits.value_bytes:
        raise _value_error(name, size, limits)


def check_outputs(outputs: Mapping[str, str], limits: OutputLimits) -> None:
    """Name and value limits for a finished set of outputs (e.g. a job's `outputs:` once evaluated)."""
    for name, value in outputs.items():
        check_output(name, value, limits)


@dataclass(slots=True)
class OutputBudget:
    """The job-wide total. Recording the same step again replaces its share, so re-reading a step's
    file never counts it twice."""

    limits: OutputLimits
    _by_step: dict[str, int] = field(default_factory=dict)
    _total: int = 0

    def record(self, step: str, outputs: Mapping[str, str]) -> None:
        others = self._total - self._by_step.get(step, 0)
        total = others
        for name, value in outputs.items():
            total += len(name.encode()) + len(value.encode())
            if total > self.limits.total_bytes:
                raise OutputLimitError(
                    f"outputs of this job reach {total} bytes with output '{name}'; the limit for all outputs of "
                    f"one job is {self.limits.total_bytes} bytes",
                    key=name,
                    size=total,
                    limit=self.limits.total_bytes,
                )
        self._by_step[step] = total - others
        self._total = total

    @property
    def used(self) -> int:
        return self._total


def _value_error(name: str, size: int, limits: OutputLimits) -> OutputLimitError:
    return OutputLimitError(
        f"output '{name}' is {size} bytes; the limit for one output value is {limits.value_bytes} bytes",
        key=name,
        size=size,
        limit=limits.value_bytes,
    )
