"""dynrunner's wire contract: generated stubs (``_gen``), the Assignment and the Gitea client."""

__version__ = "0.1.0"
