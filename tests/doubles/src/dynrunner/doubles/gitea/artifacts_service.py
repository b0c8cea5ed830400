"""What both artifact APIs share at run time: one write transaction per request in the
double's worker pool, the caller's task, merging and confirming, and read-only views."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from dynrunner.doubles.gitea import artifacts as model

if TYPE_CHECKING:
    from dynrunner.doubles.gitea.engine import Engine

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ArtifactView:
    id: int
    run_id: int
    name: str
    path: str
    status: str
    size: int
    compressed_size: int
    content_encoding: str
    storage_path: str


class ArtifactService:
    def __init__(self, engine: Engine, pool: concurrent.futures.Executor) -> None:
        self.engine = engine
        self.pool = pool
        self.files = model.ArtifactFiles(engine.state_dir / "actions_artifacts")

    @property
    def root_url(self) -> str:
        """AppURL without its trailing slash (`strings.TrimSuffix(GuessCurrentAppURL, "/")`)."""
        return self.engine.instance.root_url.rstrip("/")

    @property
    def secret(self) -> bytes:
        return self.engine.instance.signing_secret

    def now(self) -> int:
        return self.engine.clock.now()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(conn, *args)` in one write transaction, in a worker thread."""

        def run() -> T:
            with self.engine.store.write() as conn:
                return fn(conn, *args)

        return await asyncio.get_running_loop().run_in_executor(self.pool, run)

    def authorize(self, conn: sqlite3.Connection, authorization: str) -> model.ArtifactTask:
        task = model.task_of_request(
            conn,
            authorization,
            secret=self.secret,
            iterations=self.engine.options.pbkdf2_iterations,
            now=self.now(),
        )
        return model.artifact_task(conn, task)

    def confirm(self, conn: sqlite3.Connection, artifact: Any, chunks: list[model.Chunk], checksum: str = "") -> None:
        """Merge the chunks; once complete, the artifact points at the merged file, confirmed."""
        storage_path = self.files.merge(artifact, chunks, checksum)
        if storage_path is not None:
            model.update_artifact(
                conn,
                artifact["id"],
                self.now(),
                storage_path=storage_path,
                status=int(model.ArtifactStatus.UPLOAD_CONFIRMED),
            )

    def views(self, run_id: int) -> list[ArtifactView]:
        with self.engine.store.read() as conn:
            rows = model.find_artifacts(conn, run_id)
        return [
            ArtifactView(
                id=row["id"],
                run_id=row["run_id"],
                name=row["artifact_name"],
                path=row["artifact_path"],
                status=model.ArtifactStatus(row["status"]).name.lower(),
                size=row["file_size"],
                compressed_size=row["file_compressed_size"],
                content_encoding=row["content_encoding"],
                storage_path=row["storage_path"],
            )
            for row in rows
        ]
