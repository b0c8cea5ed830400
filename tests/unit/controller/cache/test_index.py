"""The cache index: GitHub's matching rules, scopes, reservations, LRU and retention (virtual time)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dynrunner.controller.cache.grants import Grant
from dynrunner.controller.cache.index import Conflict, Index, Revoked, TooManyPending


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
    entry = index.reserve(writer, key, version, max_pending=100)
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
    pending = index.reserve(writer, "k", "v", 2)
    assert index.reserve(writer, "k", "v", 2).id == pending.id  # the same job retrying
    with pytest.raises(Conflict, match="another job"):
        index.reserve(other, "k", "v", 2)
    index.complete(pending.id, "loc", 1)
    with pytest.raises(Conflict, match="already exists"):
        index.reserve(other, "k", "v", 2)
    assert index.reserve(job(scope="refs/heads/main", token="o"), "k", "v", 2).scope == "refs/heads/main"


def test_a_job_holds_a_bounded_number_of_reservations_open(index: Index) -> None:
    writer = job()
    first = index.reserve(writer, "a", "v", 2)
    index.reserve(writer, "b", "v", 2)
    with pytest.raises(TooManyPending):
        index.reserve(writer, "c", "v", 2)
    index.complete(first.id, "loc", 0)
    assert index.reserve(writer, "c", "v", 2).key == "c"


def test_entries_belong_to_the_repository_id_and_name(index: Index) -> None:
    old = Grant("acme/app", "refs/heads/main", ("refs/heads/main",), "t", 1, 10**10, "", repo_id=1)
    save(index, old, "deps")
    assert index.lookup(old, ["deps"], "v") is not None
    for other in ((2, "acme/app"), (0, "acme/app"), (1, "acme/other")):
        stranger = Grant(other[1], "refs/heads/main", ("refs/heads/main",), "s", 1, 10**10, "", repo_id=other[0])
        assert index.lookup(stranger, ["deps"], "v") is None
        assert index.listing(stranger, "deps") == []


def test_a_new_index_has_a_new_epoch_and_ids_that_do_not_restart(tmp_path: Path) -> None:
    first = Index(tmp_path / "a.db", Clock())
    entry = first.reserve(job(), "k", "v", 1)
    again = Index(tmp_path / "a.db", Clock())
    assert again.epoch == first.epoch
    lost = Index(tmp_path / "b.db", Clock())
    assert lost.epoch != first.epoch
    assert entry.id >= 1_000_000  # from the index's creation time in ms, not 1


def test_eviction_takes_the_least_recently_used_first_and_never_the_new_entry(index: Index) -> None:
    writer = job()
    a, b, c = (save(index, writer, key, size=40) for key in ("a", "b", "c"))
    index.touch(a)
    repo = (0, "acme/app")
    victims = index.over_limit(repo, 80, keep=c)
    assert [v.id for v in victims] == [b]
    assert [v.id for v in index.over_limit(repo, 10, keep=c)] == [b, a]
    assert index.over_limit(None, 120, keep=c) == []
    assert [v.id for v in index.over_limit(repo, 1000, keep=c, max_entries=1)] == [b, a]


def test_retention_drops_unused_entries_stale_reservations_and_expired_jobs(tmp_path: Path) -> None:
    clock = Clock()
    index = Index(tmp_path / "i.db", clock)
    writer = job()
    index.register(Grant("acme/app", "r", ("r",), "tok", 1, int(clock.now + 50), ""))
    old = save(index, writer, "old")
    stale = index.reserve(writer, "never-committed", "v", 10)
    clock.now += 100
    fresh = save(index, writer, "fresh")
    assert index.repositories() == [(0, "acme/app")]
    gone = index.stale((0, "acme/app"), unused_before=clock.now - 50, pending_before=clock.now - 50)
    assert sorted(e.id for e in gone) == sorted([old, stale.id])
    assert fresh not in [e.id for e in gone]
    assert index.job("tok") is None
    index.forget_expired()
    assert sorted(e.id for e in index.abandoned()) == [stale.id]  # "t1" never registered


def test_prefix_matching_is_case_sensitive_like_githubs(index: Index) -> None:
    writer = job()
    save(index, writer, "Deps-linux")
    assert index.lookup(writer, ["deps"], "v") is None
    assert index.lookup(writer, ["DEPS"], "v") is None
    found = index.lookup(writer, ["Deps"], "v")
    assert found is not None and found.key == "Deps-linux"


def test_a_revoked_registration_is_not_registered_again_before_it_expires(tmp_path: Path) -> None:
    clock = Clock()
    index = Index(tmp_path / "i.db", clock)
    grant = Grant("acme/app", "r", ("r",), "tok", 1, int(clock.now + 50), "")
    index.register(grant)
    assert index.revoke("tok")
    with pytest.raises(Revoked):
        index.register(grant)
    assert index.job("tok") is None
    clock.now += 100
    index.forget_expired()  # the sweep forgets revocations past their grant's expiry
    assert index.revoked_count() == 0


def test_an_index_written_before_repository_ids_opens_with_its_entries_as_name_only(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    try:
        conn.executescript(
            """
            CREATE TABLE entry (
              id INTEGER PRIMARY KEY AUTOINCREMENT, repo TEXT NOT NULL, scope TEXT NOT NULL, key TEXT NOT NULL,
              version TEXT NOT NULL, size INTEGER NOT NULL DEFAULT 0, location TEXT NOT NULL DEFAULT '',
              complete INTEGER NOT NULL DEFAULT 0, writer TEXT NOT NULL, created REAL NOT NULL, used REAL NOT NULL
            );
            CREATE INDEX entry_match ON entry (repo, scope, version, key);
            CREATE TABLE job (
              token_sha256 TEXT PRIMARY KEY, repo TEXT NOT NULL, scope TEXT NOT NULL, reads TEXT NOT NULL,
              results_url TEXT NOT NULL, task_id INTEGER NOT NULL, expires REAL NOT NULL
            );
            INSERT INTO entry (repo, scope, key, version, complete, writer, created, used)
              VALUES ('acme/app', 'refs/heads/feature', 'deps', 'v', 1, 'w', 1, 1);
            """
        )
    finally:
        conn.close()
    index = Index(path, Clock())
    [entry] = index.entries()
    assert entry.repository == (0, "acme/app")
    assert index.lookup(job(), ["deps"], "v") == entry
    with_id = Grant("acme/app", "refs/heads/feature", ("refs/heads/feature",), "t", 1, 10**10, "", repo_id=5)
    assert index.lookup(with_id, ["deps"], "v") is None
    assert index.reserve(with_id, "new", "v", 1).id == 2  # the old sequence goes on
