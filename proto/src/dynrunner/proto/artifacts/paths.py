"""Path handling that never follows a link: relative paths are checked component by component and
directories are opened one component at a time with O_NOFOLLOW, relative to a trusted directory fd."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence

from dynrunner.proto.artifacts.errors import StagingError


class MissingPath(StagingError):
    """A component of the path does not exist (and was not to be created)."""


DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def relative_parts(path: str, *, what: str) -> list[str]:
    """The components of a relative path, refusing anything that could leave its base: an absolute
    path, '..', a backslash (a separator elsewhere), NUL or an empty path. '.' components are dropped."""
    if not path:
        raise StagingError(f"{what} is empty")
    if "\x00" in path:
        raise StagingError(f"{what} {path!r} contains a NUL byte")
    if path.startswith("/"):
        raise StagingError(f"{what} '{path}' is absolute; it must be relative to the workspace")
    if "\\" in path:
        raise StagingError(f"{what} '{path}' contains a backslash")
    parts = [p for p in path.split("/") if p not in {"", "."}]
    if ".." in parts:
        raise StagingError(f"{what} '{path}' contains '..'")
    if not parts:
        raise StagingError(f"{what} '{path}' names no file or directory")
    try:
        path.encode()
    except UnicodeEncodeError:
        raise StagingError(f"{what} {path!r} is not valid UTF-8") from None
    return parts


def open_dir(
    base_fd: int, parts: Sequence[str], *, create: bool, shown: str = "", created: list[str] | None = None
) -> int:
    """An fd for the directory `parts` below `base_fd`, creating missing directories when asked (and
    noting them in `created`). A component that is a symlink or not a directory is refused with a
    message naming it."""
    fd = os.dup(base_fd)
    walked: list[str] = []
    try:
        for part in parts:
            walked.append(part)
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if created is not None:
                        created.append("/".join(walked))
            try:
                nfd = os.open(part, DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                raise _refusal(err, fd, part, os.path.join(shown, *walked)) from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def opened_dir(
    base_fd: int, parts: Sequence[str], *, create: bool, shown: str = "", created: list[str] | None = None
) -> Iterator[int]:
    fd = open_dir(base_fd, parts, create=create, shown=shown, created=created)
    try:
        yield fd
    finally:
        os.close(fd)


def _refusal(err: OSError, dir_fd: int, part: str, shown: str) -> StagingError:
    if err.errno == errno.ENOTDIR:
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.stat(part, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                return StagingError(f"'{shown}' is a symbolic link; refusing to follow it")
    if err.errno == errno.ELOOP:
        return StagingError(f"'{shown}' is a symbolic link; refusing to follow it")
    if err.errno == errno.ENOTDIR:
        return StagingError(f"'{shown}' exists and is not a directory")
    if err.errno == errno.ENOENT:
        return MissingPath(f"'{shown}' does not exist")
    return StagingError(f"cannot open '{shown}': {err.strerror}")
