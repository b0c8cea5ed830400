"""A double of opensandbox-server 1.1.1's lifecycle API and of execd's file API, whose sandboxes
are local processes; see docs/opensandbox-double.md."""

from dynrunner.doubles.opensandbox.boot import LocalImage
from dynrunner.doubles.opensandbox.double import OpenSandboxDouble
from dynrunner.doubles.opensandbox.sandboxes import CreateFailure

__all__ = ["CreateFailure", "LocalImage", "OpenSandboxDouble"]
