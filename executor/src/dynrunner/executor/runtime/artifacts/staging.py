"""Safe staging: put an artifact's bytes at a relative path inside the workspace, or nothing at all.

The destination is reached one component at a time without following links (a symlink anywhere
on the way, or already at the destination, is refused). The content goes to a fresh temporary
entry next to the destination, hashed as it streams, and is renamed into place only when its
size and digest match the ref. An archive may hold only regular files and directories with
canonical relative names: absolute names, '..', backslashes, links, devices, FIFOs, duplicate or
case-colliding names and a total over the size limit are refused, and a refusal removes the
temporary entry, so nothing is written outside the destination and nothing partial remains.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tarfile
import threading
import unicodedata
import uuid
from collections.abc import Sequence

from dynrunner.executor.runtime.artifacts.errors import StagingError
from dynrunner.executor.runtime.artifacts.paths import opened_dir, relative_parts
from dynrunner.executor.runtime.artifacts.refs import ArtifactRef, ArtifactType
from dynrunner.executor.runtime.artifacts.store import CHUNK, Cancelled, Readable

_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class VerifyingReader:
    """Hashes and counts what it reads; refuses to read past the ref's size."""

    def __init__(self, source: Readable, ref: ArtifactRef, stop: threading.Event) -> None:
        self._source = source
        self._ref = ref
        self._stop = stop
        self._hash = hashlib.sha256()
        self.size = 0

    def read(self, size: int = -1, /) -> bytes:
        if self._stop.is_set():
            raise Cancelled(f"import of artifact '{self._ref.name}' cancelled")
        data = self._source.read(CHUNK if size < 0 else size)
        self.size += len(data)
        if self.size > self._ref.size:
            raise StagingError(f"artifact '{self._ref.name}' is larger than its ref says ({self._ref.size} bytes)")
        self._hash.update(data)
        return data

    def finish(self) -> None:
        """Read to the end and compare size and digest with the ref."""
        while self.read(CHUNK):
            pass
        digest = f"sha256:{self._hash.hexdigest()}"
        if self.size != self._ref.size or digest != self._ref.digest:
            raise StagingError(
                f"artifact '{self._ref.name}' does not match its ref: expected {self._ref.size} bytes with "
                f"{self._ref.digest}, got {self.size} bytes with {digest}; the stored blob is damaged or was replaced"
            )


def stage(
    source: Readable,
    ref: ArtifactRef,
    base_fd: int,
    destination: Sequence[str],
    *,
    max_size: int,
    stop: threading.Event,
    shown: str,
) -> None:
    """Write artifact `ref`, read from `source`, to `destination` (components below `base_fd`)."""
    if ref.size > max_size:
        raise StagingError(f"artifact '{ref.name}' is {ref.size} bytes; the limit for one artifact is {max_size} bytes")
    *parents, name = destination
    reader = VerifyingReader(source, ref, stop)
    created: list[str] = []
    try:
        with opened_dir(base_fd, parents, create=True, created=created) as parent:
            _check_destination(parent, name, ref, shown)
            tmp = f".dynrunner-import-{uuid.uuid4().hex}"
            try:
                if ref.type is ArtifactType.FILE:
                    _stage_file(reader, parent, tmp)
                else:
                    os.mkdir(tmp, 0o700, dir_fd=parent)
                    _extract(reader, parent, tmp, ref)
                reader.finish()
                _check_destination(parent, name, ref, shown)
                if ref.type is ArtifactType.DIRECTORY:
                    os.chmod(tmp, 0o755, dir_fd=parent, follow_symlinks=False)
                os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                _remove(parent, tmp)
                raise
    except BaseException:
        for path in reversed(created):
            with contextlib.suppress(OSError):
                os.rmdir(path, dir_fd=base_fd)
        raise


def _check_destination(parent: int, name: str, ref: ArtifactRef, shown: str) -> None:
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise StagingError(f"destination '{shown}' is a symbolic link; refusing to follow or replace it")
    if ref.type is ArtifactType.FILE:
        if not stat.S_ISREG(st.st_mode):
            raise StagingError(f"destination '{shown}' exists and is not a regular file")
        return
    if not stat.S_ISDIR(st.st_mode):
        raise StagingError(f"destination '{shown}' exists and is not a directory")
    with opened_dir(parent, [name], create=False, shown=shown.rpartition("/")[0]) as fd:
        if os.listdir(fd):
            raise StagingError(f"destination '{shown}' is a directory that is not empty")


def _stage_file(reader: VerifyingReader, parent: int, tmp: str) -> None:
    fd = os.open(tmp, _FILE_FLAGS, 0o644, dir_fd=parent)
    with open(fd, "wb", buffering=0) as out:
        while data := reader.read(CHUNK):
            out.write(data)


class _Tree:
    """What an archive has put in the temporary directory so far, to refuse duplicates and collisions."""

    def __init__(self, ref: ArtifactRef) -> None:
        self.kinds: dict[str, bytes] = {}
        self.explicit: set[str] = set()
        self.folded: dict[str, str] = {}
        self.ref = ref

    def admit(self, member: tarfile.TarInfo) -> list[str]:
        # tarfile drops the trailing '/' of a pax path even for a file: judge the name as written
        written = member.pax_headers.get("path", member.name)
        name = written.rstrip("/") if member.isdir() else written
        what = f"archive member '{name}' of artifact '{self.ref.name}'"
        parts = relative_parts(name, what=what)
        if "/".join(parts) != name:
            raise StagingError(f"{what} is not a canonical relative name")
        if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE):
            raise StagingError(f"{what} is {_member_kind(member)}; only regular files and directories are staged")
        if name in self.explicit:
            raise StagingError(f"{what} appears twice in the archive")
        kind = tarfile.DIRTYPE if member.isdir() else tarfile.REGTYPE
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            folded = unicodedata.normalize("NFC", prefix).casefold()
            seen = self.folded.setdefault(folded, prefix)
            if seen != prefix:
                raise StagingError(f"{what} collides with '{seen}' (names differing only in case or Unicode form)")
            known = self.kinds.setdefault(prefix, kind if i == len(parts) else tarfile.DIRTYPE)
            if i < len(parts) and known != tarfile.DIRTYPE:
                raise StagingError(f"{what} lies inside '{prefix}', which is a file")
            if i == len(parts) and known != kind:
                raise StagingError(f"{what} is a file, but the archive also has entries inside '{name}'")
        self.explicit.add(name)
        return parts


def _member_kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return "a symbolic link"
    if member.islnk():
        return "a hard link"
    if member.ischr() or member.isblk():
        return "a device file"
    if member.isfifo():
        return "a FIFO"
    return f"an entry of unsupported type {member.type!r}"


def _extract(reader: VerifyingReader, parent: int, tmp: str, ref: ArtifactRef) -> None:
    tree = _Tree(ref)
    with opened_dir(parent, [tmp], create=False) as root:
        try:
            with tarfile.open(fileobj=reader, mode="r|", bufsize=CHUNK, encoding="utf-8", errors="strict") as tar:  # type: ignore[call-overload]
                for member in tar:
                    parts = tree.admit(member)
                    with opened_dir(root, parts[:-1], create=True) as directory:
                        if member.isdir():
                            with contextlib.suppress(FileExistsError):
                                os.mkdir(parts[-1], 0o755, dir_fd=directory)
                            continue
                        mode = 0o755 if member.mode & stat.S_IXUSR else 0o644
                        fd = os.open(parts[-1], _FILE_FLAGS, mode, dir_fd=directory)
                    source = tar.extractfile(member)
                    assert source is not None
                    with open(fd, "wb", buffering=0) as out:
                        while data := source.read(CHUNK):
                            out.write(data)
        except (tarfile.TarError, UnicodeError, EOFError) as err:
            raise StagingError(f"artifact '{ref.name}' is not a valid archive: {err}") from None
        except OSError as err:
            raise StagingError(f"artifact '{ref.name}' cannot be unpacked: {err}") from None


def _remove(parent: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=parent)
    else:
        os.unlink(name, dir_fd=parent)
