"""A Gitea double: Gitea's Actions RunnerService semantics over SQLite, for tests and demos.

See docs/gitea-double.md for what it reproduces (and from which upstream file) and what
it leaves out. The product never imports this package.
"""

from dynrunner.doubles.gitea.double import GiteaDouble
from dynrunner.doubles.gitea.jobparser import WorkflowError
from dynrunner.doubles.gitea.views import JobView, RunnerView, RunView, StepView, TaskView

__all__ = ["GiteaDouble", "JobView", "RunView", "RunnerView", "StepView", "TaskView", "WorkflowError"]
