"""Both artifact store drivers behind one fixture, so every contract test runs against each:
Filesystem on a temporary directory, S3 against moto_server on loopback."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from dynrunner.executor.runtime.artifacts.store import ArtifactStore, Scope, open_store
from dynrunner.executor.runtime.repository import Repository
from dynrunner.proto.assignment import ArtifactStoreOptions
from tests.fixtures.s3 import REGION, S3Server


class Backend:
    """One driver's configuration plus a way to look at what it really stored."""

    def __init__(self, options: ArtifactStoreOptions, s3: S3Server | None) -> None:
        self.options = options
        self._s3 = s3

    @property
    def driver(self) -> str:
        return self.options.driver

    def store(self, repository: str = "owner/repo", run_id: str = "1", max_size: int = 0) -> ArtifactStore:
        options = dataclasses.replace(self.options, max_size_bytes=max_size) if max_size else self.options
        return open_store(options, Scope(Repository.parse(repository), run_id))

    def stored(self) -> list[str]:
        """Every blob and leftover the driver holds, relative to its base (sorted)."""
        if self._s3 is None:
            root = Path(self.options.path)
            return sorted(str(Path(d, f).relative_to(root)) for d, _dirs, files in os.walk(root) for f in files)
        client = self._s3.client()
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=self.options.bucket).get("Contents", [])]
        uploads = client.list_multipart_uploads(Bucket=self.options.bucket).get("Uploads", [])
        return sorted(keys + [f"(multipart upload) {u['Key']}" for u in uploads])

    def blob_path(self, location: str) -> str:
        return location if self._s3 is None else f"{self.options.prefix}/{location}"

    def tamper(self, location: str, data: bytes) -> None:
        """Replace a stored blob's bytes (what an attacker with store write access could do)."""
        if self._s3 is None:
            path = Path(self.options.path, location)
            path.chmod(0o644)
            path.write_bytes(data)
        else:
            self._s3.client().put_object(Bucket=self.options.bucket, Key=self.blob_path(location), Body=data)


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
