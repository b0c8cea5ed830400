"""Backend name → factory: the explicit map a pool's `backend.kind` is looked up in.

Factories import their backend lazily, so a controller with only `local` pools never
imports the Kubernetes or OpenSandbox clients.
"""

from __future__ import annotations

from collections.abc import Callable

from dynrunner.controller.backends.base import Backend
from dynrunner.controller.config.model import ControllerConfig, PoolConfig

Factory = Callable[[PoolConfig, ControllerConfig], Backend]


def _local(pool: PoolConfig, config: ControllerConfig) -> Backend:
    from dynrunner.controller.backends.local.backend import LocalBackend

    return LocalBackend.from_config(pool, config)


def _kubernetes(pool: PoolConfig, config: ControllerConfig) -> Backend:
    from dynrunner.controller.backends.kubernetes.backend import KubernetesBackend

    return KubernetesBackend.from_config(pool, config)


def _opensandbox(pool: PoolConfig, config: ControllerConfig) -> Backend:
    from dynrunner.controller.backends.opensandbox.backend import OpenSandboxBackend

    return OpenSandboxBackend.from_config(pool, config)


FACTORIES: dict[str, Factory] = {
    "local": _local,
    "kubernetes": _kubernetes,
    "opensandbox": _opensandbox,
}


def create_backend(pool: PoolConfig, config: ControllerConfig) -> Backend:
    try:
        factory = FACTORIES[pool.backend.kind]
    except KeyError:
        known = ", ".join(sorted(FACTORIES))
        raise ValueError(f"pool {pool.name}: unknown backend {pool.backend.kind!r} (known: {known})") from None
    return factory(pool, config)
