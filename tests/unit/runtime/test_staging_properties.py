"""Property tests: any archive either stages exactly its safe content inside the destination or is
refused with an ArtifactError, and nothing outside the destination ever changes; any tree a step
publishes comes back identical."""

from __future__ import annotations

import asyncio
import os
import tarfile
import tempfile
import unicodedata
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, cast

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dynrunner.executor.runtime import ArtifactError
from dynrunner.executor.runtime.artifacts.refs import ArtifactType
from dynrunner.executor.runtime.envfile import EnvFileError, parse_env_file
from tests.fixtures.staging import make_scene, member, tar_of

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

safe = st.sampled_from(["a", "b", "A", "é", "x y"])
unsafe = st.sampled_from(["..", ".", "", "c\\d", unicodedata.normalize("NFD", "é")])
component = st.one_of(safe, safe, safe, safe, safe, unsafe)
paths = st.lists(component, min_size=1, max_size=4).map("/".join)
names = st.one_of(paths, paths, paths, paths, st.sampled_from(["/abs", "/", "a/", "./a"]))
good_kinds = st.sampled_from([tarfile.REGTYPE, tarfile.REGTYPE, tarfile.DIRTYPE])
bad_kinds = st.sampled_from([tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE])
kinds = st.one_of(good_kinds, good_kinds, good_kinds, good_kinds, bad_kinds)
members = st.lists(st.tuples(names, kinds, st.binary(max_size=64)), min_size=1, max_size=5)


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def files_under(root: Path) -> dict[str, bytes | None]:
    found: dict[str, bytes | None] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs:
            found[os.path.relpath(os.path.join(directory, name), root)] = None
        for name in files:
            path = os.path.join(directory, name)
            assert not os.path.islink(path)
            found[os.path.relpath(path, root)] = Path(path).read_bytes()
    return found


@SETTINGS
@given(members)
def test_any_archive_is_staged_safely_or_refused(entries: list[tuple[str, bytes, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        scene = make_scene(Path(tmp))
        data = tar_of(*(member(name, kind, body, linkname="../outside/secret") for name, kind, body in entries))
        ref = scene.publish("pkg", data)
        runtime = scene.runtime(ref)
        before = scene.snapshot()
        destination = runtime.workspace.path / "dest"
        try:
            run(runtime.import_artifact("jobs.build.artifacts.pkg", "dest", lambda line: None))
        except ArtifactError:
            event("refused")
            assert scene.snapshot() == before
            return
        event("staged")
        after = scene.snapshot()
        changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
        assert all(Path(p) == destination or Path(p).is_relative_to(destination) for p in changed)
        staged = files_under(destination)
        expected: dict[str, bytes | None] = {}
        for name, kind, body in entries:
            assert kind in (tarfile.REGTYPE, tarfile.DIRTYPE)
            clean = name.rstrip("/") if kind == tarfile.DIRTYPE else name
            parts = clean.split("/")
            assert "" not in parts and "." not in parts and ".." not in parts and "\\" not in clean
            for i in range(1, len(parts)):
                expected.setdefault("/".join(parts[:i]), None)
            expected[clean] = body if kind == tarfile.REGTYPE else None
        assert staged == expected


tree_names = st.text(alphabet="abcXYZ_-.é", min_size=1, max_size=8).filter(lambda n: n not in {".", ".."})


@st.composite
def trees(draw, depth: int = 0):  # type: ignore[no-untyped-def]
    entries = draw(st.dictionaries(tree_names, st.none(), max_size=4))
    tree: dict[str, object] = {}
    folded: set[str] = set()
    for name in entries:
        key = unicodedata.normalize("NFC", name).casefold()
        if key in folded:
            continue
        folded.add(key)
        if depth < 2 and draw(st.booleans()):
            tree[name] = draw(trees(depth + 1))
        else:
            tree[name] = (draw(st.binary(max_size=300)), draw(st.booleans()))
    return tree


def write_tree(root: Path, tree: dict[str, object]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, value in tree.items():
        if isinstance(value, dict):
            write_tree(root / name, value)
        else:
            body, executable = cast(tuple[bytes, bool], value)
            (root / name).write_bytes(body)
            os.chmod(root / name, 0o755 if executable else 0o644)


def read_tree(root: Path) -> dict[str, object]:
    tree: dict[str, object] = {}
    for entry in os.scandir(root):
        if entry.is_dir(follow_symlinks=False):
            tree[entry.name] = read_tree(Path(entry.path))
        else:
            tree[entry.name] = (Path(entry.path).read_bytes(), bool(os.stat(entry.path).st_mode & 0o100))
    return tree


@settings(SETTINGS, max_examples=40)
@given(trees())
def test_a_published_directory_comes_back_identical(tree: dict[str, object]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        scene = make_scene(Path(tmp))
        producer = scene.runtime()
        files = producer.step_files(0)
        write_tree(files.artifacts_dir / "site", tree)
        run(producer.after_step_success(files, lambda line: None))
        (ref,) = producer.published.values()
        assert ref.type is ArtifactType.DIRECTORY
        consumer = scene.runtime(ref)
        run(consumer.import_artifact("jobs.build.artifacts.site", "copy", lambda line: None))
        assert read_tree(consumer.workspace.path / "copy") == tree


env_names = st.text(alphabet=st.characters(blacklist_characters="=<\n\x00", blacklist_categories=["Cs"]), min_size=1)
env_values = st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"))


@SETTINGS
@given(st.lists(st.tuples(env_names, env_values), max_size=5))
def test_env_files_written_the_documented_way_parse_back(pairs: list[tuple[str, str]]) -> None:
    chunks = []
    for name, value in pairs:
        if "\n" in value:
            delimiter = "ghadelimiter_7f3b"
            chunks.append(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")
        else:
            chunks.append(f"{name}={value}\n")
    assert parse_env_file("".join(chunks), source="GITHUB_ENV") == pairs


@SETTINGS
@given(st.binary(max_size=300))
def test_arbitrary_bytes_parse_or_raise_env_file_error(data: bytes) -> None:
    try:
        pairs = parse_env_file(data, source="GITHUB_OUTPUT")
    except EnvFileError as err:
        assert "(GITHUB_OUTPUT, line " in str(err)
        return
    assert all(name for name, _ in pairs)
