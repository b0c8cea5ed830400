"""Upload side: what a step may leave in KRUNTIME_ARTIFACTS_DIR, and deterministic directory archives."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import stat
import tarfile
from pathlib import Path

import pytest

from dynrunner.executor.runtime.artifacts.collect import collect
from dynrunner.executor.runtime.artifacts.errors import ArtifactError
from dynrunner.executor.runtime.artifacts.refs import ArtifactType
from tests.fixtures.privileges import require_root


def archive(directory: Path) -> bytes:
    (entry,) = collect(directory.parent)
    out = io.BytesIO()
    entry.produce(out)
    return out.getvalue()


def tree(root: Path) -> Path:
    (root / "site" / "css").mkdir(parents=True)
    (root / "site" / "index.html").write_text("<h1>hi</h1>")
    (root / "site" / "css" / "a.css").write_text("body{}")
    (root / "site" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "site" / "run.sh", 0o700)
    (root / "site" / "empty").mkdir()
    return root / "site"


def test_top_level_files_and_directories_become_artifacts_by_name(tmp_path: Path) -> None:
    (tmp_path / "b.tgz").write_bytes(b"x")
    (tmp_path / ".hidden").write_text("h")
    (tmp_path / "dir").mkdir()
    entries = collect(tmp_path)
    assert [(e.name, e.type) for e in entries] == [
        (".hidden", ArtifactType.FILE),
        ("b.tgz", ArtifactType.FILE),
        ("dir", ArtifactType.DIRECTORY),
    ]


def test_an_empty_directory_has_no_artifacts(tmp_path: Path) -> None:
    assert collect(tmp_path) == []


def test_a_file_artifact_is_its_bytes(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"content")
    (entry,) = collect(tmp_path)
    out = io.BytesIO()
    entry.produce(out)
    assert out.getvalue() == b"content"


def test_directory_archives_are_deterministic_and_hold_only_names_modes_and_bytes(tmp_path: Path) -> None:
    site = tree(tmp_path / "one")
    first = archive(site)
    os.utime(site / "index.html", (1, 1))
    os.chmod(site / "index.html", 0o600)
    assert archive(site) == first
    other = tree(tmp_path / "two")
    assert hashlib.sha256(archive(other)).digest() == hashlib.sha256(first).digest()
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        members = [(m.name, m.type, m.mode, m.mtime, m.uid, m.uname) for m in tar.getmembers()]
    assert members == [
        ("css", tarfile.DIRTYPE, 0o755, 0, 0, ""),
        ("css/a.css", tarfile.REGTYPE, 0o644, 0, 0, ""),
        ("empty", tarfile.DIRTYPE, 0o755, 0, 0, ""),
        ("index.html", tarfile.REGTYPE, 0o644, 0, 0, ""),
        ("run.sh", tarfile.REGTYPE, 0o755, 0, 0, ""),
    ]


def test_content_changes_change_the_archive(tmp_path: Path) -> None:
    site = tree(tmp_path)
    before = archive(site)
    (site / "index.html").write_text("<h1>changed</h1>")
    assert archive(site) != before


def make_symlink(path: Path, outside: Path) -> str:
    path.symlink_to(outside)
    return "is a symbolic link"


def make_hardlink(path: Path, outside: Path) -> str:
    os.link(outside, path)
    return r"is a hard link \(2 names for one file\).*copy it"


def make_fifo(path: Path, outside: Path) -> str:
    os.mkfifo(path)
    return "is a FIFO"


def make_socket(path: Path, outside: Path) -> str:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
    return "is a socket"


def make_device(path: Path, outside: Path) -> str:
    require_root("creating a device node")
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    return "is a device file"


@pytest.mark.parametrize("make", [make_symlink, make_hardlink, make_fifo, make_socket, make_device])
@pytest.mark.parametrize("where", ["top", "nested"])
def test_links_and_special_files_fail_with_their_path(tmp_path: Path, make, where: str) -> None:  # type: ignore[no-untyped-def]
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    artifacts = tmp_path / "artifacts"
    (artifacts / "pkg" / "deep").mkdir(parents=True)
    (artifacts / "pkg" / "ok.txt").write_text("fine")
    if where == "top":
        path, shown = artifacts / "thing", r"\$KRUNTIME_ARTIFACTS_DIR/thing"
    else:
        path, shown = artifacts / "pkg" / "deep" / "thing", r"\$KRUNTIME_ARTIFACTS_DIR/pkg/deep/thing"
    reason = make(path, outside)
    with pytest.raises(ArtifactError, match=rf"^{shown} {reason}"):
        collect(artifacts)


def test_a_symlink_to_a_directory_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_text("x")
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    (artifacts / "dir").symlink_to(tmp_path / "real", target_is_directory=True)
    with pytest.raises(ArtifactError, match=r"\$KRUNTIME_ARTIFACTS_DIR/dir is a symbolic link"):
        collect(artifacts)


def test_a_file_swapped_for_a_link_after_checking_is_refused_when_read(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    site = tree(artifacts)
    (entry,) = collect(artifacts)
    (site / "index.html").unlink()
    (site / "index.html").symlink_to("/etc/passwd")
    with pytest.raises(ArtifactError, match=r"\$KRUNTIME_ARTIFACTS_DIR/site/index.html cannot be opened"):
        entry.produce(io.BytesIO())


def test_names_that_cannot_travel_are_refused(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    (artifacts / "d").mkdir(parents=True)
    (artifacts / "d" / "a\\b").write_text("x")
    with pytest.raises(ArtifactError, match=r"d/a\\b: the name contains a backslash"):
        collect(artifacts)
    os.unlink(artifacts / "d" / "a\\b")
    bad = os.fsencode(str(artifacts / "d")) + b"/caf\xe9"
    with open(bad, "wb"):
        pass
    with pytest.raises(ArtifactError, match="the name is not valid UTF-8"):
        collect(artifacts)


def test_a_removed_artifacts_directory_publishes_nothing(tmp_path: Path) -> None:
    assert collect(tmp_path / "gone") == []


def test_an_artifacts_directory_replaced_by_a_link_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "app.tgz").write_bytes(b"x")
    (tmp_path / "artifacts").symlink_to(tmp_path / "dist", target_is_directory=True)
    with pytest.raises(ArtifactError, match=r"^\$KRUNTIME_ARTIFACTS_DIR itself was replaced by a symbolic link"):
        collect(tmp_path / "artifacts")
