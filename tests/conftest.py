"""Shared pytest wiring: fixtures live in tests/fixtures/, one module per seam."""

pytest_plugins = [
    "tests.fixtures.ports",
    "tests.fixtures.gitea",
    "tests.fixtures.executor",
    "tests.fixtures.nats",
    "tests.fixtures.s3",
    "tests.fixtures.faults",
    "tests.fixtures.githost",
    "tests.fixtures.git",
    "tests.fixtures.kubernetes",
    "tests.fixtures.kubernetes_backend",
    "tests.fixtures.clients",
    "tests.fixtures.opensandbox",
    "tests.fixtures.spire_server",
    "tests.fixtures.opensandbox_backend",
    "tests.fixtures.cache",
    "tests.fixtures.images",
    "tests.fixtures.local_backend",
    "tests.fixtures.chart",
    "tests.fixtures.controller_nats",
    "tests.fixtures.real_gitea",
]
