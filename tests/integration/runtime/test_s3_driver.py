"""What only the S3 driver does: two passes with verification, server-checked checksums, clear
errors for unreachable endpoints and missing configuration."""

from __future__ import annotations

import itertools
import threading

import pytest

from dynrunner.executor.runtime.artifacts.errors import ArtifactError
from dynrunner.executor.runtime.artifacts.s3 import PART_SIZE
from dynrunner.executor.runtime.artifacts.store import Scope, Writable, open_store
from dynrunner.executor.runtime.repository import Repository
from dynrunner.proto.assignment import ArtifactStoreOptions
from tests.fixtures.s3 import REGION, S3Server

SCOPE = Scope(Repository.parse("owner/repo"), "9")


def options(server: S3Server, bucket: str, prefix: str = "p") -> ArtifactStoreOptions:
    return ArtifactStoreOptions(driver="S3", bucket=bucket, prefix=prefix, endpoint=server.endpoint, region=REGION)


@pytest.mark.parametrize("size", [1000, PART_SIZE * 2 + 1], ids=["single-put", "multipart"])
def test_content_that_changes_between_hash_and_upload_is_never_published(
    s3_server: S3Server, s3_credentials: dict[str, str], size: int
) -> None:
    bucket = s3_server.new_bucket()
    store = open_store(options(s3_server, bucket), SCOPE)
    passes = itertools.count()

    def produce(out: Writable) -> None:
        fill = b"a" if next(passes) == 0 else b"b"
        out.write(fill * size)

    with pytest.raises(ArtifactError, match="changed while it was uploaded"):
        store.put(produce, threading.Event())
    client = s3_server.client()
    assert client.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_keys_live_under_the_prefix_and_the_repository(s3_server: S3Server, s3_credentials: dict[str, str]) -> None:
    bucket = s3_server.new_bucket()
    store = open_store(options(s3_server, bucket, prefix="/team/ci/"), SCOPE)
    blob = store.put(lambda out: out.write(b"hello"), threading.Event())
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == [f"team/ci/owner/repo/9/sha256/{blob.digest[7:]}"]


def test_a_missing_bucket_is_reported_with_its_address(s3_server: S3Server, s3_credentials: dict[str, str]) -> None:
    store = open_store(options(s3_server, "no-such-bucket"), SCOPE)
    with pytest.raises(
        ArtifactError,
        match=r"S3 PutObject of s3://no-such-bucket/p/owner/repo/9/sha256/\w+ failed: .*bucket does not exist",
    ):
        store.put(lambda out: out.write(b"x"), threading.Event())


def test_an_unreachable_endpoint_is_an_artifact_error(s3_credentials: dict[str, str]) -> None:
    unreachable = ArtifactStoreOptions(driver="S3", bucket="b", endpoint="http://127.0.0.1:9", region=REGION)
    store = open_store(unreachable, SCOPE)
    with pytest.raises(
        ArtifactError, match=r"S3 HeadObject of s3://b/owner/repo/9/sha256/\w+ failed: Could not connect"
    ):
        store.put(lambda out: out.write(b"x"), threading.Event())


def test_a_bucket_is_required() -> None:
    with pytest.raises(ArtifactError, match=r"needs a bucket \(artifacts.bucket\)"):
        open_store(ArtifactStoreOptions(driver="S3"), SCOPE)
