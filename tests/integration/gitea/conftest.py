"""Fixtures for the Gitea double's integration tests."""

from __future__ import annotations

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.proto.gitea import GiteaClient
from tests.fixtures.gitea_calls import base_client


@pytest.fixture
def client(gitea: GiteaDouble) -> GiteaClient:
    """An unauthenticated client of the `gitea` fixture's double."""
    return base_client(gitea)
