"""Reporting one task to Gitea: log rows, step state, outputs, heartbeats, finalization."""

from dynrunner.executor.reporter.config import ReporterConfig
from dynrunner.executor.reporter.outputs import OutputLimitError, OutputViolation
from dynrunner.executor.reporter.reporter import Reporter, ReporterClosedError

__all__ = ["OutputLimitError", "OutputViolation", "Reporter", "ReporterClosedError", "ReporterConfig"]
