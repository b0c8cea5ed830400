"""Contract strings: labels, names, the job-key rule and the SPIFFE ID builder."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dynrunner.controller import contract
from dynrunner.proto.assignment import Assignment, ClaimingRunner
from dynrunner.proto.gitea import Task


def test_environment_name_is_a_dns_label() -> None:
    name = contract.environment_name("0b8f5a8e-6c4e-4b8e-9a5e-3f1f2b1c0d9e")
    assert name == "dr-0b8f5a8e-6c4e-4b8e-9a5e-3f1f2b1c0d9e"
    assert len(name) <= 63


@pytest.mark.parametrize("job", ["build", "_x", "a-b_c9", "Build2"])
def test_valid_job_keys(job: str) -> None:
    assert contract.job_key_of({"job": job}) == job


@pytest.mark.parametrize("job", ["9lives", "with space", "dot.ted", "-dash", "ünï", "", "build\n"])
def test_invalid_job_keys_say_why(job: str) -> None:
    with pytest.raises(contract.ContractError, match=r"\[A-Za-z_\]|no job id"):
        contract.job_key_of({"job": job})


def test_missing_job_key() -> None:
    with pytest.raises(contract.ContractError, match="no job id"):
        contract.job_key_of({})


def test_spiffe_id_lowercases_owner_and_repository() -> None:
    assert (
        contract.spiffe_id("example.org", "Acme", "My.Repo_1", "build")
        == "spiffe://example.org/ci/acme/my.repo_1/build"
    )


@pytest.mark.parametrize(
    ("owner", "repo", "job", "domain"),
    [
        ("acme", "..", "build", "example.org"),
        ("ac me", "r", "build", "example.org"),
        ("acme", "r/x", "build", "example.org"),
        ("acme", "r", "bad key", "example.org"),
        ("acme", "r", "build", "Example.org"),
        ("acme\n", "r", "build", "example.org"),
        ("acme", "r\n", "build", "example.org"),
        ("acme", "r", "build\n", "example.org"),
        ("acme", "r", "build", "example.org\n"),
    ],
)
def test_spiffe_id_rejects_what_spiffe_forbids(owner: str, repo: str, job: str, domain: str) -> None:
    with pytest.raises(contract.ContractError):
        contract.spiffe_id(domain, owner, repo, job)


@pytest.mark.parametrize(
    ("ref", "path"),
    [
        ("refs/heads/main", "refs/heads/main"),
        ("refs/tags/v1.2.3", "refs/tags/v1.2.3"),
        ("refs/pull/7/head", "refs/pull/7/head"),
        ("refs/heads/feature/x-y", "refs/heads/feature/x-y"),
        ("refs/heads/feature_x", "refs/heads/feature_5fx"),
        ("refs/heads/a+b@c", "refs/heads/a_2bb_40c"),
        ("refs/heads/grüße", "refs/heads/gr_c3_bc_c3_9fe"),
    ],
)
def test_a_pool_can_put_the_ref_in_the_spiffe_id(ref: str, path: str) -> None:
    assert (
        contract.spiffe_id("example.org", "acme", "app", "deploy", ref)
        == f"spiffe://example.org/ci/acme/app/deploy/{path}"
    )


def test_distinct_refs_never_share_an_id() -> None:
    """`_` always starts an escape, so no branch name can spell another ref's path."""
    refs = ["refs/heads/a_2fb", "refs/heads/a/b", "refs/heads/a_b", "refs/heads/a_5fb", "refs/heads/a__b"]
    ids = {contract.spiffe_id("example.org", "acme", "app", "deploy", ref) for ref in refs}
    assert len(ids) == len(refs)


@pytest.mark.parametrize("ref", ["main", "refs//x", "refs/heads/..", "refs/heads/"])
def test_refs_that_cannot_name_an_identity(ref: str) -> None:
    with pytest.raises(contract.ContractError, match="ref"):
        contract.spiffe_id("example.org", "acme", "app", "deploy", ref)
    with pytest.raises(contract.ContractError, match="longer than 2048 bytes"):
        contract.spiffe_id("example.org", "acme", "app", "deploy", "refs/heads/" + "x" * 2048)


def test_ref_of() -> None:
    assert contract.ref_of({"ref": "refs/heads/main"}) == "refs/heads/main"
    with pytest.raises(contract.ContractError, match="no git ref"):
        contract.ref_of({})


def test_repository_of() -> None:
    assert contract.repository_of({"repository": "Owner/Repo"}) == ("owner", "repo")
    for bad in ({}, {"repository": "norepo"}, {"repository": "a/b/c"}, {"repository": "/x"}):
        with pytest.raises(contract.ContractError):
            contract.repository_of(bad)


def test_label_values_are_valid_kubernetes_label_values() -> None:
    assert contract.label_value("owner/repo") == "owner_repo"
    long = contract.label_value("x" * 100)
    assert len(long) == 63
    assert contract.label_value("-a b-") == "a_b"


def test_environment_labels() -> None:
    a = Assignment(
        assignment_id="aid",
        pool="pod",
        backend="local",
        claimed_at=datetime.now(UTC),
        task=Task(id=42, context={"repository": "Acme/Web", "job": "build"}),
        runner=ClaimingRunner(id=1, uuid="u", token="t"),
        gitea_url="http://g",
        job_key="build",
    )
    assert contract.environment_labels(a) == {
        "dynrunner.io/assignment-id": "aid",
        "dynrunner.io/task-id": "42",
        "dynrunner.io/pool": "pod",
        "dynrunner.io/repository": "acme.web",
        "dynrunner.io/job-key": "build",
    }
