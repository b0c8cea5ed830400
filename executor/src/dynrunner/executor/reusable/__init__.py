"""Reusable workflows: a job-level `uses:` run inside the calling job's task (see `call`)."""

from dynrunner.executor.reusable.call import Caller, CallFrame, CallResult, run_call
from dynrunner.executor.reusable.calls import MAX_LEVELS, CallError, CallRef, CallSpec, call_spec, parse_call

__all__ = [
    "MAX_LEVELS",
    "CallError",
    "CallFrame",
    "CallRef",
    "CallResult",
    "CallSpec",
    "Caller",
    "call_spec",
    "parse_call",
    "run_call",
]
