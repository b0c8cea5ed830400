"""A Kubernetes API server double (plus scheduler, kubelet and SPIRE Workload API doubles)
that the official `kubernetes` client talks to unmodified. See docs/kubernetes-doubles.md
for what each models, after which upstream source, and what it leaves out. The product
never imports this package."""

from dynrunner.doubles.kubernetes.server import ApiServer
from dynrunner.doubles.kubernetes.status import ApiError

__all__ = ["ApiError", "ApiServer"]
