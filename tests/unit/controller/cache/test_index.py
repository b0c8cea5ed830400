"""The cache index: GitHub's matching rules, scopes, reservations, LRU and retention (virtual time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynrunner.controller.cache.grants import Grant
from dynrunner.controller.cache.index import Conflict, Index


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def job(
    repo: str = "acme/app", scope: str = "refs/heads/feature", reads: tuple[str, ...] = (), token: str = "t1"
) -> Grant:
    return Grant(repo, scope, reads or (scope, "refs/heads/main"), token, 1, 10**10, "")


@pytest.fixture
def index(tmp_path: Path) -> Index:
    return Index(tmp_path / "index.db", Clock())


def save(index: Index, writer: Grant, key: str, version: str = "v", size: int = 10) -> int:
    entry = index.reserve(writer, key, version)
    index.complete(entry.id, f"loc-{entry.id}", size)
    return entry.id


def test_matching_is_exact_then_prefix_newest_per_key_then_the_next_scope(index: Index) -> None:
    main = job(scope="refs/heads/main", token="m")
    feature = job()
    save(index, main, "deps-abc")
    older = save(index, feature, "deps-1")
    newer = save(index, feature, "deps-2")
    exact = save(index, feature, "deps")
    found = index.lookup(feature, ["deps"], "v")
    assert found is not None and found.id == exact
    found = index.lookup(feature, ["nothing", "deps-"], "v")
    assert found is not None and found.id == newer and found.id != older
    assert index.lookup(feature, ["deps-abc"], "v") is not None  # the default branch's, in the next scope
    assert index.lookup(main, ["deps-1"], "v") is None  # main does not see the branch
    assert index.lookup(feature, ["deps"], "other-version") is None
    assert index.lookup(job(repo="other/repo"), ["deps"], "v") is None


def test_prefix_matching_takes_keys_literally(index: Index) -> None:
    writer = job()
    save(index, writer, "a_b%c")
    assert index.lookup(writer, ["a_"], "v") is not None
    assert index.lookup(writer, ["a%"], "v") is None
    assert index.lookup(writer, ["a\\"], "v") is None


def test_a_key_and_version_is_written_once_per_scope(index: Index) -> None:
    writer, other = job(token="w"), job(token="o")
    pending = index.reserve(writer, "k", "v")
    assert index.reserve(writer, "k", "v").id == pending.id  # the same job retrying
    with pytest.raises(Conflict, match="another job"):
        index.reserve(other, "k", "v")
    index.complete(pending.id, "loc", 1)
    with pytest.raises(Conflict, match="already exists"):
        index.reserve(other, "k", "v")
    assert index.reserve(job(scope="refs/heads/main", token="o"), "k", "v").scope == "refs/heads/main"


def test_eviction_takes_the_least_recently_used_first_and_never_the_new_entry(index: Index) -> None:
    writer = job()
    a, b, c = (save(index, writer, key, size=40) for key in ("a", "b", "c"))
    index.touch(a)
    victims = index.over_limit("acme/app", 80, keep=c)
    assert [v.id for v in victims] == [b]
    assert [v.id for v in index.over_limit("acme/app", 10, keep=c)] == [b, a]
    assert index.over_limit(None, 120, keep=c) == []


def test_retention_drops_unused_entries_stale_reservations_and_expired_jobs(tmp_path: Path) -> None:
    clock = Clock()
    index = Index(tmp_path / "i.db", clock)
    writer = job()
    index.register(Grant("acme/app", "r", ("r",), "tok", 1, int(clock.now + 50), ""))
    old = save(index, writer, "old")
    stale = index.reserve(writer, "never-committed", "v")
    clock.now += 100
    fresh = save(index, writer, "fresh")
    gone = index.stale(unused_before=clock.now - 50, pending_before=clock.now - 50)
    assert sorted(e.id for e in gone) == sorted([old, stale.id])
    assert fresh not in [e.id for e in gone]
    assert index.job("tok") is None
