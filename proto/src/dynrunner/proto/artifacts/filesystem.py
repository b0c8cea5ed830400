"""The Filesystem driver: a directory tree, e.g. a shared PVC mount.

The job sees `<root>/<owner>/<repo>/` only. With the local backend that is a path check made
here: every directory below the root is opened one component at a time without following a
link, so nothing resolves outside the repository's directory. With Kubernetes the launcher
mounts just that subPath at the same place, so the layout inside the environment is the same.
A blob is written to a temporary file beside its final place, hashed while written, fsynced
and renamed to its content address: readers never see a partial blob.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import uuid
from collections.abc import Iterator

from dynrunner.proto.artifacts.base import HashingWriter, Producer, Readable, Scope, StoredBlob
from dynrunner.proto.artifacts.errors import ArtifactError, ScopeError, StagingError
from dynrunner.proto.artifacts.paths import DIR_FLAGS, MissingPath, opened_dir


class FilesystemStore:
    driver = "Filesystem"

    def __init__(self, root: str, scope: Scope, max_size: int) -> None:
        if not root or not os.path.isabs(root):
            raise ArtifactError(f"the Filesystem artifact store needs an absolute path (artifacts.path), got {root!r}")
        self.scope = scope
        self.max_size = max_size
        self._root = root

    @contextlib.contextmanager
    def _dir(self, parts: list[str], *, create: bool) -> Iterator[int]:
        """A directory below the job's scope, reached without following any link."""
        try:
            root_fd = os.open(self._root, DIR_FLAGS & ~os.O_NOFOLLOW)
        except OSError as err:
            raise ArtifactError(f"the artifact store path {self._root} cannot be opened: {err.strerror}") from None
        try:
            with opened_dir(root_fd, [*self.scope.prefix.split("/"), *parts], create=create, shown=self._root) as fd:
                yield fd
        except MissingPath:
            raise
        except StagingError as err:
            raise ArtifactError(f"the artifact store is not usable: {err}") from None
        finally:
            os.close(root_fd)

    def put(self, producer: Producer, stop: threading.Event) -> StoredBlob:
        run = self.scope.run_id
        tmp = f"{uuid.uuid4().hex}.partial"
        with self._dir([run, ".tmp"], create=True) as tmp_dir:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, 0o600, dir_fd=tmp_dir)
            try:
                with open(fd, "wb", buffering=0, closefd=False) as out:
                    writer = HashingWriter(out, self.max_size, stop, "the artifact")
                    producer(writer)
                    os.fsync(fd)
                os.fchmod(fd, 0o444)
                location = self.scope.location(writer.digest)
                with self._dir([run, "sha256"], create=True) as final_dir:
                    os.replace(tmp, location.rsplit("/", 1)[1], src_dir_fd=tmp_dir, dst_dir_fd=final_dir)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=tmp_dir)
                raise
            finally:
                os.close(fd)
        return StoredBlob(location, writer.digest, writer.size)

    def delete(self, location: str) -> None:
        if not self.scope.owns(location):
            raise ScopeError(f"location {location!r} is not in this repository's part of the store")
        parts = location.split("/")
        try:
            with self._dir(parts[2:4], create=False) as directory:
                os.unlink(parts[4], dir_fd=directory)
        except (FileNotFoundError, MissingPath):
            return
        except OSError as err:
            raise ArtifactError(f"cannot delete the artifact blob {location}: {err.strerror}") from None

    @contextlib.contextmanager
    def open(self, location: str) -> Iterator[Readable]:
        if not self.scope.owns(location):
            raise ScopeError(f"location {location!r} is not in this repository's part of the store")
        parts = location.split("/")
        try:
            with self._dir(parts[2:4], create=False) as directory:
                fd = os.open(parts[4], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
        except (FileNotFoundError, MissingPath):
            raise ArtifactError(f"the artifact blob {location} is missing from the store") from None
        except OSError as err:
            raise ArtifactError(f"cannot open the artifact blob {location}: {err.strerror}") from None
        with open(fd, "rb", buffering=0) as fp:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ArtifactError(f"the artifact blob {location} is not a regular file")
            yield fp
