"""`container:` and `services:` specs: the parser lives in `dynrunner.proto.containers`, shared
with the controller (which builds a Pod's service sidecars from the same values)."""

from dynrunner.proto.containers import (
    JOB_CONTAINER,
    JOB_CONTAINER_CREDENTIALS,
    JOB_CONTAINER_ENV,
    SERVICE_CREDENTIALS,
    SERVICE_ENV,
    SERVICE_NAME_RE,
    SERVICES,
    VOLUME_NAME_RE,
    ContainerSpec,
    Health,
    SpecError,
    container_port,
    duration,
    image_problem,
    parse_options,
    port_clashes,
    read_container,
    read_job_containers,
)

__all__ = [
    "JOB_CONTAINER",
    "JOB_CONTAINER_CREDENTIALS",
    "JOB_CONTAINER_ENV",
    "SERVICES",
    "SERVICE_CREDENTIALS",
    "SERVICE_ENV",
    "SERVICE_NAME_RE",
    "VOLUME_NAME_RE",
    "ContainerSpec",
    "Health",
    "SpecError",
    "container_port",
    "duration",
    "image_problem",
    "parse_options",
    "port_clashes",
    "read_container",
    "read_job_containers",
]
