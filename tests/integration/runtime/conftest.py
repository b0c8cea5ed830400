"""Both artifact store drivers behind one fixture, so every contract test runs against each:
Filesystem on a temporary directory, S3 against moto_server on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynrunner.proto.assignment import ArtifactStoreOptions
from tests.fixtures.artifact_backends import Backend
from tests.fixtures.s3 import REGION, S3Server


@pytest.fixture(params=["Filesystem", "S3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "Filesystem":
        root = tmp_path / "store"
        root.mkdir()
        return Backend(ArtifactStoreOptions(driver="Filesystem", path=str(root)), None)
    server: S3Server = request.getfixturevalue("s3_server")
    request.getfixturevalue("s3_credentials")
    options = ArtifactStoreOptions(
        driver="S3", bucket=server.new_bucket(), prefix="ci/artifacts", endpoint=server.endpoint, region=REGION
    )
    return Backend(options, server)
