"""Artifact refs, the reserved output that carries them, `from:` addresses and the scope check."""

from __future__ import annotations

import json

import pytest

from dynrunner.executor.runtime.artifacts.errors import ArtifactError, ScopeError
from dynrunner.executor.runtime.artifacts.refs import (
    ARTIFACTS_OUTPUT_KEY,
    ArtifactRef,
    ArtifactType,
    check_name,
    decode_refs,
    encode_refs,
    parse_from,
)
from dynrunner.executor.runtime.artifacts.store import Scope
from dynrunner.executor.runtime.repository import Repository

HEX = "ab" * 32


def ref(name: str = "dist.tgz", location: str = f"owner/repo/7/sha256/{HEX}", **kw: object) -> ArtifactRef:
    values: dict[str, object] = {
        "name": name,
        "driver": "Filesystem",
        "type": ArtifactType.FILE,
        "location": location,
        "digest": f"sha256:{HEX}",
        "size": 10,
    }
    values.update(kw)
    return ArtifactRef(**values)  # type: ignore[arg-type]


def test_the_reserved_output_key() -> None:
    assert ARTIFACTS_OUTPUT_KEY == "dynrunner_artifacts"


def test_refs_round_trip_compactly_and_sorted() -> None:
    encoded = encode_refs([ref("b"), ref("a", type=ArtifactType.DIRECTORY)])
    assert " " not in encoded
    doc = json.loads(encoded)
    assert doc["v"] == 1 and [r["name"] for r in doc["refs"]] == ["a", "b"]
    assert set(doc["refs"][0]) == {"name", "driver", "type", "location", "digest", "size"}
    decoded = decode_refs(encoded, job="build")
    assert decoded["a"].type is ArtifactType.DIRECTORY and decoded["a"].job == "build"
    assert decoded["b"] == ref("b")
    assert len(encoded) < 2 * 260  # about 250 bytes a ref: some 4000 fit in the 1 MiB Gitea keeps


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not json", "is not valid JSON"),
        ('{"v":2,"refs":[]}', "is not a version 1 artifact list"),
        ('{"v":1}', "is not a version 1 artifact list"),
        ('{"v":1,"refs":[1]}', "is not an object"),
        ('{"v":1,"refs":[{"name":"x"}]}', "lacks the field 'driver'"),
        (json.dumps({"v": 1, "refs": [{**ref().to_json(), "size": -1}]}), "invalid size -1"),
        (json.dumps({"v": 1, "refs": [{**ref().to_json(), "size": True}]}), "invalid size True"),
        (json.dumps({"v": 1, "refs": [{**ref().to_json(), "type": "Link"}]}), "unknown type 'Link'"),
        (json.dumps({"v": 1, "refs": [{**ref().to_json(), "digest": "md5:00"}]}), "invalid digest"),
        (json.dumps({"v": 1, "refs": [{**ref().to_json(), "name": "../x"}]}), "must be one file or directory name"),
        (json.dumps({"v": 1, "refs": [ref().to_json(), ref().to_json()]}), "published artifact 'dist.tgz' twice"),
    ],
)
def test_malformed_refs_are_refused_naming_the_job(value: str, message: str) -> None:
    with pytest.raises(ArtifactError, match=message) as info:
        decode_refs(value, job="build")
    assert "build" in str(info.value)


def test_from_addresses() -> None:
    assert parse_from("jobs.build.artifacts.dist.tgz") == ("build", "dist.tgz")
    assert parse_from("jobs.build-2.artifacts.site") == ("build-2", "site")
    for bad in ("build.artifacts.x", "jobs.build.outputs.x", "jobs.build.artifacts.", "jobs.b@d.artifacts.x", "x"):
        with pytest.raises(ArtifactError, match=r"jobs\.<job-id>\.artifacts\.<name>|is not a job id"):
            parse_from(bad)
    with pytest.raises(ArtifactError, match="must be one file or directory name"):
        parse_from("jobs.build.artifacts.a/b")


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\\b", "tab\there", "x" * 256, "bad\udcff"])
def test_artifact_names_are_single_plain_components(bad: str) -> None:
    with pytest.raises(ArtifactError):
        check_name(bad)


def test_names_may_be_dotted_hidden_or_unicode() -> None:
    for good in ("dist.tgz", ".hidden", "résumé.pdf", "x" * 255):
        assert check_name(good) == good


SCOPE = Scope(Repository.parse("Owner/Repo"), "7")


def test_scope_accepts_its_own_content_addresses() -> None:
    assert SCOPE.location(f"sha256:{HEX}") == f"owner/repo/7/sha256/{HEX}"
    assert SCOPE.check(ref(job="build"), "Filesystem") == f"owner/repo/7/sha256/{HEX}"
    assert SCOPE.check(ref(location=f"owner/repo/6/sha256/{HEX}"), "Filesystem")  # an earlier run of the repo


@pytest.mark.parametrize(
    ("location", "message"),
    [
        (f"other/repo/7/sha256/{HEX}", "belongs to repository 'other/repo', not to 'Owner/Repo'"),
        (f"owner/repo2/7/sha256/{HEX}", "belongs to repository 'owner/repo2'"),
        (f"owner/repo/7/sha256/{'cd' * 32}", "does not match its digest"),
        (f"owner/repo/../other/7/sha256/{HEX}", "not a content address"),
        (f"/owner/repo/7/sha256/{HEX}", "not a content address"),
        (f"owner/repo/7/sha256/{HEX}/x", "not a content address"),
        (f"owner/repo/7/sha256/{HEX}\n", "not a content address"),
        ("s3://bucket/key", "not a content address"),
    ],
)
def test_scope_refuses_refs_outside_the_repository(location: str, message: str) -> None:
    with pytest.raises(ScopeError, match=message):
        SCOPE.check(ref(location=location, job="build"), "Filesystem")


def test_scope_refuses_a_ref_of_another_driver() -> None:
    with pytest.raises(ScopeError, match="stored with driver 'S3', but this runner's store is 'Filesystem'"):
        SCOPE.check(ref(driver="S3"), "Filesystem")
