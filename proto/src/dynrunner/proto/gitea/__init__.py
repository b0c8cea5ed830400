"""Typed async client of Gitea's Actions RunnerService (shared by controller and executor)."""

from dynrunner.proto.gitea.client import GiteaClient, RunnerCredentials
from dynrunner.proto.gitea.errors import (
    AlreadyExists,
    ErrorPage,
    GiteaError,
    Internal,
    InvalidArgument,
    NotFound,
    RegistrationRefused,
    RequestTooLarge,
    RunnerRemoved,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from dynrunner.proto.gitea.types import (
    FetchResult,
    LogRow,
    Need,
    Result,
    RunnerInfo,
    StepState,
    Task,
    TaskState,
    UpdateTaskResult,
)

__all__ = [
    "AlreadyExists",
    "ErrorPage",
    "FetchResult",
    "GiteaClient",
    "GiteaError",
    "Internal",
    "InvalidArgument",
    "LogRow",
    "Need",
    "NotFound",
    "RegistrationRefused",
    "RequestTooLarge",
    "Result",
    "RunnerCredentials",
    "RunnerInfo",
    "RunnerRemoved",
    "StepState",
    "Task",
    "TaskState",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "UpdateTaskResult",
]
