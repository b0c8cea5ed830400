"""Gitea's artifacts API v3 (`actions/upload-artifact@v3`, `@actions/artifact` 1.x), under
`/api/actions_pipeline/_apis/pipelines/workflows/{run_id}/artifacts` (Gitea v1.26.1
`routers/api/actions/artifacts.go`):

    POST   …/artifacts                         {Type, Name, RetentionDays}
                                               → {fileContainerResourceUrl: …/{md5(name)}/upload}
    PUT    …/artifacts/{md5}/upload?itemPath=name/path   one chunk (Content-Range, x-actions-results-md5)
    PATCH  …/artifacts?artifactName=name       merge every file's chunks, confirm
    GET    …/artifacts                         {count, value: [{name, fileContainerResourceUrl: …/{md5}/download_url}]}
    GET    …/artifacts/{md5}/download_url?itemPath=name   {value: [{path, itemType, contentLocation: …/{id}/download}]}
    GET    …/artifacts/{id}/download           the file (Content-Encoding: gzip when uploaded gzipped)
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynrunner.doubles.gitea import artifacts as model
from dynrunner.doubles.gitea.httpio import (
    HTTPError,
    Receive,
    Scope,
    Send,
    headers_of,
    http_error,
    json_response,
    query_of,
    read_body,
    respond,
)

if TYPE_CHECKING:
    from dynrunner.doubles.gitea.artifacts_service import ArtifactService

PREFIX = "/api/actions_pipeline"
ROUTE = re.compile(r"^/api/actions_pipeline/_apis/pipelines/workflows/([^/]+)/artifacts(?:/([^/]+)/([a-z_]+))?/?$")
_CONTENT_RANGE = re.compile(r"^bytes (-?\d+)-(-?\d+)/(-?\d+)")


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    run: str
    item: str
    action: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


class ArtifactsV3:
    def __init__(self, service: ArtifactService) -> None:
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = ROUTE.match(scope["path"])
        assert match is not None
        run, item, action = match.group(1), match.group(2) or "", match.group(3) or ""
        request = Request(
            scope["method"], run, item, action, query_of(scope), headers_of(scope), await read_body(receive)
        )
        handler = self._route(request)
        if handler is None:
            known = action in ("", "upload", "download_url", "download")
            await http_error(send, HTTPError(405, "Method Not Allowed") if known else HTTPError(404))
            return
        try:
            result = await self.service.call(self._handle, handler, request)
        except HTTPError as err:
            await http_error(send, err)
            return
        if isinstance(result, tuple):
            body, headers = result
            await respond(send, 200, "application/octet-stream", body, headers)
        else:
            await json_response(send, 200, result)

    def _route(self, r: Request) -> Callable[[Any, model.ArtifactTask, Request], Any] | None:
        routes: dict[tuple[str, str], Callable[[Any, model.ArtifactTask, Request], Any]] = {
            ("POST", ""): self._upload_url,
            ("GET", ""): self._list,
            ("PATCH", ""): self._confirm,
            ("PUT", "upload"): self._upload,
            ("GET", "download_url"): self._download_url,
            ("GET", "download"): self._download,
        }
        return routes.get((r.method, r.action))

    def _handle(self, conn: Any, handler: Callable[..., Any], request: Request) -> Any:
        task = self.service.authorize(conn, request.headers.get("authorization", ""))
        return handler(conn, task, request)

    def _url(self, run_id: int, item: str, suffix: str) -> str:
        """`buildArtifactURL`."""
        return f"{self.service.root_url}{PREFIX}/_apis/pipelines/workflows/{run_id}/artifacts/{item}/{suffix}"

    def _upload_url(self, conn: Any, task: model.ArtifactTask, r: Request) -> Any:
        run_id = model.check_run(task, r.run)
        try:
            body = _go_json_object(r.body)
        except ValueError:
            raise HTTPError(500, "Error decode request body") from None
        retention = _int(body.get("retentiondays"))
        query = f"?retentionDays={retention}" if retention > 0 else ""
        name = str(body.get("name") or "")
        return {"fileContainerResourceUrl": self._url(run_id, model.artifact_hash(name), "upload" + query)}

    def _upload(self, conn: Any, task: model.ArtifactTask, r: Request) -> Any:
        run_id = model.check_run(task, r.run)
        item_path = model.path_join_rel_x(r.query.get("itemPath", ""))
        name = item_path.split("/")[0]
        path = item_path.removeprefix(name + "/")
        if r.item != model.artifact_hash(name):
            raise HTTPError(400, "Invalid artifact hash")
        model.check_name(name)
        real_size = _int(r.headers.get("x-tfs-filelength")) or len(r.body)
        expired_days = model.RETENTION_DAYS
        if "retentionDays" in r.query and r.query["retentionDays"] != "":
            try:
                expired_days = int(r.query["retentionDays"])
            except ValueError:
                raise HTTPError(400, "Error parse retention days") from None
        now = self.service.now()
        artifact = model.create_artifact(conn, task, name, path, expired_days, now)
        match = _CONTENT_RANGE.match(r.headers.get("content-range", ""))
        try:
            if match is None:
                raise ValueError("parse content range error")
            start, end, total = (int(g) for g in match.groups())
            self.service.files.save_chunk_v3(
                run_id, artifact["id"], start, end, r.body, r.headers.get("x-actions-results-md5", "")
            )
        except (ValueError, OSError):
            raise HTTPError(500, "Error save upload chunk") from None
        if (
            artifact["file_size"] == 0
            or artifact["file_compressed_size"] == 0
            or artifact["file_size"] != real_size
            or artifact["file_compressed_size"] != total
        ):
            encoding = r.headers.get("content-encoding", "")
            sizes = {"file_size": real_size, "file_compressed_size": total}
            model.update_artifact(conn, artifact["id"], now, content_encoding=encoding, **sizes)
        return {"message": "success"}

    def _confirm(self, conn: Any, task: model.ArtifactTask, r: Request) -> Any:
        run_id = model.check_run(task, r.run)
        name = r.query.get("artifactName", "")
        if not name:
            raise HTTPError(400, "Error artifact name is empty")
        chunks = self.service.files.v3_chunks(run_id)
        try:
            for artifact in model.find_artifacts(conn, run_id, name=name):
                if artifact["id"] in chunks:
                    self.service.confirm(conn, artifact, chunks[artifact["id"]])
        except (ValueError, OSError):
            raise HTTPError(500, "Error merge chunks") from None
        return {"message": "success"}

    def _list(self, conn: Any, task: model.ArtifactTask, r: Request) -> Any:
        run_id = model.check_run(task, r.run)
        rows = model.find_artifacts(conn, run_id, status=model.ArtifactStatus.UPLOAD_CONFIRMED)
        if not rows:
            raise HTTPError(404)
        names = list(dict.fromkeys(row["artifact_name"] for row in rows))
        items = [
            {"name": n, "fileContainerResourceUrl": self._url(run_id, model.artifact_hash(n), "download_url")}
            for n in names
        ]
        return {"count": len(items), "value": items}

    def _download_url(self, conn: Any, task: model.ArtifactTask, r: Request) -> Any:
        run_id = model.check_run(task, r.run)
        item_path = model.path_join_rel(r.query.get("itemPath", ""))
        if r.item != model.artifact_hash(item_path):
            raise HTTPError(400, "Invalid artifact hash")
        rows = model.find_artifacts(conn, run_id, name=item_path, status=model.ArtifactStatus.UPLOAD_CONFIRMED)
        if not rows:
            raise HTTPError(404)
        if item_path != rows[0]["artifact_name"]:
            raise HTTPError(400, "Error mismatch artifact name")
        return {
            "value": [
                {
                    "path": model.path_join_rel(item_path, row["artifact_path"]),
                    "itemType": "file",
                    "contentLocation": self._url(run_id, str(row["id"]), "download"),
                }
                for row in rows
            ]
        }

    def _download(self, conn: Any, task: model.ArtifactTask, r: Request) -> Any:
        run_id = model.check_run(task, r.run)
        artifact_id = _int(r.item)
        row = conn.execute("SELECT * FROM artifact WHERE id = ?", (artifact_id,)).fetchone()
        if row is None:
            raise HTTPError(404, f"artifact with ID {artifact_id} does not exist")
        if row["run_id"] != run_id:
            raise HTTPError(400)
        if row["status"] != model.ArtifactStatus.UPLOAD_CONFIRMED:
            raise HTTPError(404, "Error artifact not found")
        headers = [(b"content-disposition", f'inline; filename="{row["artifact_name"]}"'.encode())]
        if row["content_encoding"] == model.CONTENT_ENCODING_V3_GZIP:
            headers.append((b"content-encoding", b"gzip"))
        return self.service.files.read(row["storage_path"]), headers


def _go_json_object(raw: bytes) -> dict[str, Any]:
    """A JSON object as Go's `encoding/json` decodes into a struct: keys match field names
    ignoring case (here: lower-cased)."""
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return {str(k).lower(): v for k, v in value.items()}


def _int(value: object) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0
