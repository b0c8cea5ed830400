"""The workflow model: Gitea's single-job payload as typed values."""

from dynrunner.executor.workflow.model import (
    AUTO_ID_PREFIX,
    Job,
    RunDefaults,
    Step,
    Strategy,
    Workflow,
    WorkflowError,
    load_workflow,
    parse_action_steps,
    parse_document,
    parse_workflow,
)

__all__ = [
    "AUTO_ID_PREFIX",
    "Job",
    "RunDefaults",
    "Step",
    "Strategy",
    "Workflow",
    "WorkflowError",
    "load_workflow",
    "parse_action_steps",
    "parse_document",
    "parse_workflow",
]
