"""The ArtifactStore contract, run against both drivers (Filesystem on a temp dir, S3 on moto_server)."""

from __future__ import annotations

import hashlib
import io
import os
import threading

import pytest

from dynrunner.executor.runtime.artifacts.errors import ArtifactError, ScopeError
from dynrunner.executor.runtime.artifacts.store import ArtifactStore, Cancelled, Producer, Writable
from tests.fixtures.artifact_backends import Backend

MIB = 1024 * 1024


def producer_of(data: bytes, chunk: int = 64 * 1024) -> Producer:
    def produce(out: Writable) -> None:
        view = memoryview(data)
        for start in range(0, len(data), chunk):
            out.write(bytes(view[start : start + chunk]))

    return produce


def read_all(store: ArtifactStore, location: str) -> bytes:
    buf = io.BytesIO()
    with store.open(location) as src:
        while chunk := src.read(MIB):
            buf.write(chunk)
    return buf.getvalue()


@pytest.mark.parametrize("size", [0, 1, 3 * MIB, 17 * MIB + 5], ids=["empty", "byte", "3MiB", "17MiB-multipart"])
def test_put_then_open_returns_the_same_bytes_at_their_content_address(backend: Backend, size: int) -> None:
    data = os.urandom(size)
    store = backend.store(run_id="42")
    blob = store.put(producer_of(data, chunk=MIB), threading.Event())
    hexdigest = hashlib.sha256(data).hexdigest()
    assert blob.digest == f"sha256:{hexdigest}"
    assert blob.size == size
    assert blob.location == f"owner/repo/42/sha256/{hexdigest}"
    assert read_all(store, blob.location) == data
    assert backend.stored() == [backend.blob_path(blob.location)]


def test_same_content_is_stored_once(backend: Backend) -> None:
    store = backend.store()
    first = store.put(producer_of(b"same bytes"), threading.Event())
    second = store.put(producer_of(b"same bytes"), threading.Event())
    assert first == second
    assert backend.stored() == [backend.blob_path(first.location)]


def test_delete_removes_a_blob_once_and_only_in_its_own_scope(backend: Backend) -> None:
    store = backend.store()
    blob = store.put(producer_of(b"evict me"), threading.Event())
    with pytest.raises(ScopeError):
        backend.store(repository="other/repo").delete(blob.location)
    store.delete(blob.location)
    store.delete(blob.location)  # already gone: no error
    assert backend.stored() == []
    with pytest.raises(ArtifactError, match="missing"):
        read_all(store, blob.location)


def test_repository_names_are_case_insensitive_in_the_scope(backend: Backend) -> None:
    blob = backend.store(repository="Owner/Repo").put(producer_of(b"x"), threading.Event())
    assert blob.location.startswith("owner/repo/")
    assert read_all(backend.store(repository="OWNER/repo"), blob.location) == b"x"


def test_an_artifact_over_the_size_limit_is_refused_and_nothing_is_published(backend: Backend) -> None:
    store = backend.store(max_size=MIB)
    with pytest.raises(ArtifactError, match=r"larger than 1048576 bytes, the store's limit for one artifact"):
        store.put(producer_of(os.urandom(MIB + 1)), threading.Event())
    assert backend.stored() == []


def test_a_producer_failing_midway_leaves_nothing_behind(backend: Backend) -> None:
    def produce(out: Writable) -> None:
        out.write(os.urandom(9 * MIB))
        raise ArtifactError("the source vanished")

    with pytest.raises(ArtifactError, match="the source vanished"):
        backend.store().put(produce, threading.Event())
    assert backend.stored() == []


def test_a_stopped_transfer_publishes_nothing(backend: Backend) -> None:
    stop = threading.Event()

    def produce(out: Writable) -> None:
        out.write(b"a" * MIB)
        stop.set()
        out.write(b"b" * MIB)

    with pytest.raises(Cancelled):
        backend.store().put(produce, stop)
    assert backend.stored() == []


def test_opening_a_missing_blob_names_it(backend: Backend) -> None:
    store = backend.store()
    location = f"owner/repo/1/sha256/{'0' * 64}"
    with pytest.raises(ArtifactError, match=f"the artifact blob .*{location} is missing from the store"):
        read_all(store, location)


def test_a_store_cannot_open_another_repositorys_blob(backend: Backend) -> None:
    theirs = backend.store(repository="other/secret").put(producer_of(b"private"), threading.Event())
    mine = backend.store(repository="owner/repo")
    with pytest.raises(ScopeError, match="not in this repository's part of the store"):
        read_all(mine, theirs.location)
    for forged in (
        f"owner/repo/../../other/secret/1/sha256/{theirs.digest[7:]}",
        f"owner/repo/1/sha256/../../../other/secret/1/sha256/{theirs.digest[7:]}",
        f"/other/secret/1/sha256/{theirs.digest[7:]}",
    ):
        with pytest.raises(ScopeError):
            read_all(mine, forged)


def test_each_repository_writes_only_below_its_own_prefix(backend: Backend) -> None:
    a = backend.store(repository="alpha/app").put(producer_of(b"same"), threading.Event())
    b = backend.store(repository="beta/app").put(producer_of(b"same"), threading.Event())
    assert a.location.startswith("alpha/app/") and b.location.startswith("beta/app/")
    assert backend.stored() == sorted([backend.blob_path(a.location), backend.blob_path(b.location)])
