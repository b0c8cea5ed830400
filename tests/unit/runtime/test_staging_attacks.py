"""The attack corpus for safe staging: every case is refused with a clear message, nothing is
written outside the destination, and nothing partial is left at it."""

from __future__ import annotations

import tarfile
import unicodedata
from pathlib import Path

import pytest

from dynrunner.executor.runtime import ArtifactError, StagingError
from dynrunner.executor.runtime.artifacts.refs import ArtifactType
from tests.fixtures.staging import Scene, make_scene, member, tar_of

FROM = "jobs.build.artifacts.pkg"


@pytest.fixture
def scene(tmp_path: Path) -> Scene:
    return make_scene(tmp_path)


async def refused(scene: Scene, data: bytes, destination: str, message: str, **kw: object) -> None:
    kind = kw.pop("kind", ArtifactType.DIRECTORY)
    ref = scene.publish("pkg", data, kind)  # type: ignore[arg-type]
    runtime = scene.runtime(ref, **kw)  # type: ignore[arg-type]
    before = scene.snapshot()
    with pytest.raises(ArtifactError, match=message):
        await runtime.import_artifact(FROM, destination, lambda line: None)
    assert scene.snapshot() == before, "staging changed the disk although it was refused"


GOOD_TAR = tar_of(member("a.txt", data=b"hello"))

# -- the destination -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("destination", "message"),
    [
        ("/tmp/evil", "import path '/tmp/evil' is absolute"),
        ("../evil", "import path '../evil' contains '..'"),
        ("a/../../evil", "contains '..'"),
        ("a/..", "contains '..'"),
        ("..\\evil", "contains a backslash"),
        ("", "import path is empty"),
        (".", "names no file or directory"),
        ("./", "names no file or directory"),
        ("nul\x00byte", "contains a NUL byte"),
    ],
)
async def test_destinations_that_leave_the_workspace_are_refused(scene: Scene, destination: str, message: str) -> None:
    await refused(scene, GOOD_TAR, destination, message)


async def test_a_symlinked_directory_on_the_way_is_not_followed(scene: Scene) -> None:
    runtime = scene.runtime()
    (runtime.workspace.path / "link").symlink_to(scene.outside, target_is_directory=True)
    await refused(
        scene, b"payload", "link/evil", "'link' is a symbolic link; refusing to follow it", kind=ArtifactType.FILE
    )
    assert not (scene.outside / "evil").exists()


@pytest.mark.parametrize("kind", [ArtifactType.FILE, ArtifactType.DIRECTORY])
async def test_an_existing_symlink_at_the_destination_is_neither_followed_nor_replaced(
    scene: Scene, kind: ArtifactType
) -> None:
    runtime = scene.runtime()
    target = scene.outside / "secret" if kind is ArtifactType.FILE else scene.outside
    (runtime.workspace.path / "dist").symlink_to(target)
    data = b"payload" if kind is ArtifactType.FILE else GOOD_TAR
    await refused(
        scene, data, "dist", "destination 'dist' is a symbolic link; refusing to follow or replace it", kind=kind
    )
    assert (scene.outside / "secret").read_text() == "do not touch"


async def test_a_dangling_symlink_at_the_destination_is_refused(scene: Scene) -> None:
    runtime = scene.runtime()
    (runtime.workspace.path / "dist").symlink_to(scene.outside / "created-through-link")
    await refused(scene, b"x", "dist", "is a symbolic link", kind=ArtifactType.FILE)
    assert not (scene.outside / "created-through-link").exists()


async def test_a_file_is_not_staged_over_a_directory(scene: Scene) -> None:
    (scene.runtime().workspace.path / "dist").mkdir()
    await refused(scene, b"x", "dist", "destination 'dist' exists and is not a regular file", kind=ArtifactType.FILE)


async def test_a_directory_is_not_staged_into_a_non_empty_directory(scene: Scene) -> None:
    (scene.runtime().workspace.path / "dist").mkdir()
    (scene.runtime().workspace.path / "dist" / "keep").write_text("mine")
    await refused(scene, GOOD_TAR, "dist", "destination 'dist' is a directory that is not empty")


# -- the archive -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ([member("/etc/evil", data=b"x")], "archive member '/etc/evil' .* is absolute"),
        ([member("../evil", data=b"x")], "archive member '../evil' .* contains '..'"),
        ([member("a/../../evil", data=b"x")], "contains '..'"),
        ([member("..\\..\\evil", data=b"x")], "contains a backslash"),
        ([member("C:\\evil", data=b"x")], "contains a backslash"),
        ([member("./a", data=b"x")], "is not a canonical relative name"),
        ([member("a//b", data=b"x")], "is not a canonical relative name"),
        ([member("file/", data=b"x")], "is not a canonical relative name"),
        ([member("fichier-é/", data=b"x")], "is not a canonical relative name"),  # a pax path, read without its '/'
        ([member("link", tarfile.SYMTYPE, linkname="/tmp")], "'link' .* is a symbolic link"),
        (
            [member("link", tarfile.SYMTYPE, linkname="../outside"), member("link/evil", data=b"x")],
            "'link' .* is a symbolic link",
        ),
        ([member("hl", tarfile.LNKTYPE, linkname="../outside/secret")], "'hl' .* is a hard link"),
        ([member("dev", tarfile.CHRTYPE, devmajor=1, devminor=3)], "'dev' .* is a device file"),
        ([member("blk", tarfile.BLKTYPE, devmajor=8, devminor=0)], "'blk' .* is a device file"),
        ([member("fifo", tarfile.FIFOTYPE)], "'fifo' .* is a FIFO"),
        ([member("c", tarfile.CONTTYPE, data=b"x")], "is an entry of unsupported type"),
        ([member("a", data=b"1"), member("a", data=b"2")], "archive member 'a' .* appears twice"),
        ([member("d", tarfile.DIRTYPE), member("d", tarfile.DIRTYPE)], "appears twice"),
        ([member("README", data=b"1"), member("readme", data=b"2")], "'readme' .* collides with 'README'"),
        ([member("Dir/a", data=b"1"), member("dir/b", data=b"2")], "collides with 'Dir'"),
        (
            [
                member(unicodedata.normalize("NFC", "café"), data=b"1"),
                member(unicodedata.normalize("NFD", "café"), data=b"2"),
            ],
            "collides with",
        ),
        ([member("a", data=b"1"), member("a/b", data=b"2")], "'a/b' .* lies inside 'a', which is a file"),
        ([member("a/b", data=b"1"), member("a", data=b"2")], "'a' .* is a file, but the archive also has entries"),
    ],
    ids=lambda v: None if isinstance(v, str) else "-".join(m[0].name for m in v)[:40],
)
async def test_unsafe_archive_members_are_refused(
    scene: Scene, members: list[tuple[tarfile.TarInfo, bytes | None]], message: str
) -> None:
    await refused(scene, tar_of(member("first.txt", data=b"ok"), *members), "out", message)


async def test_a_gnu_sparse_member_is_refused(scene: Scene) -> None:
    info, _ = member("sparse", tarfile.GNUTYPE_SPARSE)
    await refused(scene, tar_of((info, None)), "out", "unsupported type")


async def test_something_that_is_not_an_archive_is_refused(scene: Scene) -> None:
    await refused(scene, b"\x00garbage" * 200, "out", "artifact 'pkg' is not a valid archive")


async def test_a_truncated_archive_is_refused(scene: Scene) -> None:
    data = tar_of(member("big", data=b"z" * 50_000))
    await refused(scene, data[:20_000], "out", "not a valid archive|unexpected end")


# -- sizes and digests -----------------------------------------------------------------------


async def test_an_artifact_over_the_limit_is_refused_before_it_is_read(scene: Scene) -> None:
    await refused(
        scene,
        b"x" * 2048,
        "big",
        "artifact 'pkg' is 2048 bytes; the limit for one artifact is 1024",
        kind=ArtifactType.FILE,
        max_size=1024,
    )


@pytest.mark.parametrize("kind", [ArtifactType.FILE, ArtifactType.DIRECTORY])
async def test_a_replaced_blob_fails_digest_verification_and_stages_nothing(scene: Scene, kind: ArtifactType) -> None:
    data = GOOD_TAR if kind is ArtifactType.DIRECTORY else b"the real bytes"
    ref = scene.publish("pkg", data, kind)
    scene.tamper(ref, tar_of(member("a.txt", data=b"HELLO")) if kind is ArtifactType.DIRECTORY else b"the fake bytes")
    runtime = scene.runtime(ref)
    before = scene.snapshot()
    with pytest.raises(
        StagingError, match=r"artifact 'pkg' does not match its ref: expected .* got .*damaged or was replaced"
    ):
        await runtime.import_artifact(FROM, "dest", lambda line: None)
    assert scene.snapshot() == before


async def test_a_blob_longer_than_its_ref_is_refused(scene: Scene) -> None:
    ref = scene.publish("pkg", b"0123456789", ArtifactType.FILE)
    scene.tamper(ref, b"0123456789 and more")
    runtime = scene.runtime(ref)
    before = scene.snapshot()
    with pytest.raises(StagingError, match=r"is larger than its ref says \(10 bytes\)"):
        await runtime.import_artifact(FROM, "dest", lambda line: None)
    assert scene.snapshot() == before


# -- what does get staged --------------------------------------------------------------------


async def test_a_safe_archive_is_staged_with_modes_and_no_leftovers(scene: Scene) -> None:
    data = tar_of(
        member("bin", tarfile.DIRTYPE),
        member("bin/tool", data=b"#!/bin/sh\n", mode=0o4755),
        member("lib/deep/x.txt", data=b"implicit parents"),
        member("empty", tarfile.DIRTYPE),
    )
    ref = scene.publish("pkg", data)
    runtime = scene.runtime(ref)
    lines: list[str] = []
    await runtime.import_artifact(FROM, "sub/dir/out", lines.append)
    out = runtime.workspace.path / "sub" / "dir" / "out"
    assert (out / "bin" / "tool").read_bytes() == b"#!/bin/sh\n"
    assert (out / "bin" / "tool").stat().st_mode & 0o7777 == 0o755  # no setuid from the archive
    assert (out / "lib" / "deep" / "x.txt").read_text() == "implicit parents"
    assert (out / "empty").is_dir()
    assert out.stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in (runtime.workspace.path / "sub" / "dir").iterdir()) == ["out"]
    assert lines == [lines[0]] and "Imported artifact 'pkg' of job 'build' (Directory" in lines[0]


async def test_a_file_replaces_an_existing_regular_file_atomically(scene: Scene) -> None:
    ref = scene.publish("pkg", b"new contents", ArtifactType.FILE)
    runtime = scene.runtime(ref)
    target = runtime.workspace.path / "dist.tgz"
    target.write_text("old")
    await runtime.import_artifact(FROM, "./dist.tgz", lambda line: None)
    assert target.read_bytes() == b"new contents"
    assert [p.name for p in runtime.workspace.path.iterdir()] == ["dist.tgz"]


async def test_a_directory_may_be_staged_into_an_empty_directory(scene: Scene) -> None:
    ref = scene.publish("pkg", GOOD_TAR)
    runtime = scene.runtime(ref)
    (runtime.workspace.path / "out").mkdir()
    await runtime.import_artifact(FROM, "out", lambda line: None)
    assert (runtime.workspace.path / "out" / "a.txt").read_bytes() == b"hello"


async def test_a_refused_import_removes_the_parent_directories_it_created(scene: Scene) -> None:
    ref = scene.publish("pkg", tar_of(member("ok", data=b"1"), member("../evil", data=b"2")))
    runtime = scene.runtime(ref)
    (runtime.workspace.path / "existing").mkdir()
    with pytest.raises(StagingError, match=r"contains '\.\.'"):
        await runtime.import_artifact(FROM, "existing/new/deeper/out", lambda line: None)
    assert [p.name for p in runtime.workspace.path.iterdir()] == ["existing"]
    assert list((runtime.workspace.path / "existing").iterdir()) == []
