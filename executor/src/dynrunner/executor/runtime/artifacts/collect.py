"""What a step left at the top level of its KRUNTIME_ARTIFACTS_DIR, checked and turned into producers.

Only regular files (with one link) and directories are artifacts. A symlink, a hard link, a
device, a FIFO or a socket anywhere inside fails the step with a message naming its path: it is
never followed and never skipped. Entries are checked once before anything is uploaded and again
when opened (O_NOFOLLOW + fstat), so a change in between is refused too.

A directory is stored as one deterministic tar archive (sorted names, no owners, times or
extended attributes; mode 0755 or 0644 from the owner's execute bit), so the same tree always
yields the same digest and a driver can produce it twice (hash first, upload second).
"""

from __future__ import annotations

import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

from dynrunner.executor.runtime.artifacts.errors import ArtifactError
from dynrunner.executor.runtime.artifacts.refs import ArtifactType, check_name
from dynrunner.executor.runtime.artifacts.store import CHUNK, Writable

SHOWN_ROOT = "$KRUNTIME_ARTIFACTS_DIR"


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    type: ArtifactType
    path: Path

    def produce(self, out: Writable) -> None:
        if self.type is ArtifactType.FILE:
            _copy_file(self.path, out, self.name)
        else:
            _write_tar(self.path, out, self.name)


def collect(artifacts_dir: Path) -> list[Entry]:
    """The artifacts a step published, by name; raises ArtifactError for anything unsafe inside."""
    try:
        st = os.lstat(artifacts_dir)
    except FileNotFoundError:
        return []  # the step removed the directory: it left nothing to publish
    if not stat.S_ISDIR(st.st_mode):
        raise ArtifactError(f"{SHOWN_ROOT} itself was replaced by {_kind(st.st_mode)}; publish files inside it instead")
    names = sorted(os.listdir(artifacts_dir))
    entries = []
    for name in names:
        shown = f"{SHOWN_ROOT}/{name}"
        try:
            check_name(name)
        except ArtifactError as err:
            raise ArtifactError(f"{shown}: {err}") from None
        path = artifacts_dir / name
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            _check_tree(path, shown)
            entries.append(Entry(name, ArtifactType.DIRECTORY, path))
        else:
            _check_file(st, shown)
            entries.append(Entry(name, ArtifactType.FILE, path))
    return entries


def _check_file(st: os.stat_result, shown: str) -> None:
    mode = st.st_mode
    if stat.S_ISREG(mode):
        if st.st_nlink > 1:
            raise ArtifactError(
                f"{shown} is a hard link ({st.st_nlink} names for one file); artifacts must be plain files "
                "(copy it instead of linking it)"
            )
        return
    raise ArtifactError(f"{shown} is {_kind(mode)}; only regular files and directories can be artifacts")


def _check_tree(path: Path, shown: str) -> None:
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        inner = f"{shown}/{_printable(entry.name)}"
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            _check_tree(Path(entry.path), inner)
        else:
            _check_file(st, inner)
        _check_member_name(entry.name, inner)


def _check_member_name(name: str, shown: str) -> None:
    try:
        name.encode()
    except UnicodeEncodeError:
        raise ArtifactError(f"{shown}: the name is not valid UTF-8") from None
    if "\\" in name:
        raise ArtifactError(f"{shown}: the name contains a backslash, which other systems read as a separator")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    return "not a regular file"


def _printable(name: str) -> str:
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _open_checked(path: Path | str, shown: str, dir_fd: int | None = None) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as err:
        raise ArtifactError(f"{shown} cannot be opened ({err.strerror}); it changed after the step ended?") from None
    st = os.fstat(fd)
    try:
        _check_file(st, shown)
    except BaseException:
        os.close(fd)
        raise
    os.set_blocking(fd, True)
    return fd, st


def _copy_file(path: Path, out: Writable, name: str) -> None:
    fd, _st = _open_checked(path, f"{SHOWN_ROOT}/{name}")
    with open(fd, "rb", buffering=0) as fp:
        while data := fp.read(CHUNK):
            out.write(data)


def _write_tar(path: Path, out: Writable, name: str) -> None:
    root_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK, encoding="utf-8") as tar:  # type: ignore[call-overload]
            tar.copybufsize = CHUNK
            _add_dir(tar, root_fd, "", f"{SHOWN_ROOT}/{name}")
    finally:
        os.close(root_fd)


def _add_dir(tar: tarfile.TarFile, dir_fd: int, prefix: str, shown: str) -> None:
    for entry in sorted(os.listdir(dir_fd)):
        member = f"{prefix}{entry}"
        inner = f"{shown}/{_printable(entry)}"
        _check_member_name(entry, inner)
        st = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            tar.addfile(_info(member, tarfile.DIRTYPE, 0o755, 0))
            try:
                sub = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            except OSError as err:
                raise ArtifactError(f"{inner} cannot be opened ({err.strerror})") from None
            try:
                _add_dir(tar, sub, f"{member}/", inner)
            finally:
                os.close(sub)
            continue
        fd, fst = _open_checked(entry, inner, dir_fd)
        with open(fd, "rb", buffering=0) as fp:
            mode = 0o755 if fst.st_mode & stat.S_IXUSR else 0o644
            try:
                tar.addfile(_info(member, tarfile.REGTYPE, mode, fst.st_size), fp)
            except OSError as err:
                raise ArtifactError(f"{inner} changed while it was archived ({err})") from None


def _info(name: str, kind: bytes, mode: int, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
