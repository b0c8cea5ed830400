"""Gitea's artifacts API v4 (`actions/upload-artifact@v4`, `@actions/artifact` 2.x): twirp JSON
under `/twirp/github.actions.results.api.v1.ArtifactService/` (Gitea v1.26.1
`routers/api/actions/artifactsv4.go`, messages from its `artifact.proto`):

    CreateArtifact         → {ok, signedUploadUrl}   (an UploadArtifact URL signed for an hour)
    PUT UploadArtifact?sig=…&comp=block&blockid=…     a block (Azure's Put Block), 201 "appended"
    PUT UploadArtifact?sig=…&comp=blocklist           the blocks' order (Azure's Put Block List), 201 "created"
    FinalizeArtifact {size, hash: sha256:…}            merge, check size and digest → {ok, artifactId}
    ListArtifacts, GetSignedArtifactURL, DeleteArtifact
    GET DownloadArtifact?sig=…                        the zip

Requests are protojson (proto or JSON field names; unknown fields refused: 500 "Error decode
request body"); answers are protojson with JSON names, int64 as strings, defaults omitted.
The signed URLs carry `sig` = base64url(HMAC-SHA256(secret, endpoint + expires + name +
taskID + artifactID)) and `expires` in Go's `2006-01-02 15:04:05.999999999 -0700 MST`.
"""

from __future__ import annotations

import base64
import hmac
import json
import re
import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from email.message import Message as MimeHeader
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote_plus

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory, timestamp_pb2, wrappers_pb2
from google.protobuf.message import Message

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
from dynrunner.doubles.gitea.status import Status

if TYPE_CHECKING:
    from dynrunner.doubles.gitea.artifacts_service import ArtifactService

ROUTE_BASE = "/twirp/github.actions.results.api.v1.ArtifactService"
ROUTE = re.compile(r"^/twirp/github\.actions\.results\.api\.v1\.ArtifactService/([A-Za-z]+)$")
SIGNED_URL_TTL_S = 3600
_GO_TIME = "%Y-%m-%d %H:%M:%S"
_PACKAGE = "github.actions.results.api.v1"

_S, _I32, _I64, _BOOL, _MSG = 9, 5, 3, 8, 11
_RUN_JOB = [("workflow_run_backend_id", _S), ("workflow_job_run_backend_id", _S)]
_MESSAGES: dict[str, list[tuple[str, int] | tuple[str, int, str] | tuple[str, int, str, bool]]] = {
    "CreateArtifactRequest": [
        *_RUN_JOB,
        ("name", _S),
        ("expires_at", _MSG, ".google.protobuf.Timestamp"),
        ("version", _I32),
        ("mime_type", _MSG, ".google.protobuf.StringValue"),
    ],
    "CreateArtifactResponse": [("ok", _BOOL), ("signed_upload_url", _S)],
    "FinalizeArtifactRequest": [
        *_RUN_JOB,
        ("name", _S),
        ("size", _I64),
        ("hash", _MSG, ".google.protobuf.StringValue"),
    ],
    "FinalizeArtifactResponse": [("ok", _BOOL), ("artifact_id", _I64)],
    "ListArtifactsRequest": [
        *_RUN_JOB,
        ("name_filter", _MSG, ".google.protobuf.StringValue"),
        ("id_filter", _MSG, ".google.protobuf.Int64Value"),
    ],
    "ListArtifactsResponse": [("artifacts", _MSG, f".{_PACKAGE}.ListArtifactsResponse_MonolithArtifact", True)],
    "ListArtifactsResponse_MonolithArtifact": [
        *_RUN_JOB,
        ("database_id", _I64),
        ("name", _S),
        ("size", _I64),
        ("created_at", _MSG, ".google.protobuf.Timestamp"),
    ],
    "GetSignedArtifactURLRequest": [*_RUN_JOB, ("name", _S)],
    "GetSignedArtifactURLResponse": [("signed_url", _S)],
    "DeleteArtifactRequest": [*_RUN_JOB, ("name", _S)],
    "DeleteArtifactResponse": [("ok", _BOOL), ("artifact_id", _I64)],
}


def _message_classes() -> dict[str, type[Message]]:
    """Gitea's `artifact.proto`, built at import time in a pool of its own."""
    pool = descriptor_pool.DescriptorPool()
    for dependency in (timestamp_pb2, wrappers_pb2):
        pool.AddSerializedFile(dependency.DESCRIPTOR.serialized_pb)
    file = descriptor_pb2.FileDescriptorProto(
        name="gitea/artifact.proto",
        package=_PACKAGE,
        syntax="proto3",
        dependency=["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"],
    )
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for number, spec in enumerate(fields, start=1):
            field = message.field.add(name=spec[0], number=number, type=spec[1], label=3 if len(spec) == 4 else 1)
            if len(spec) >= 3:
                field.type_name = spec[2]
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")) for name in _MESSAGES
    }


MESSAGES = _message_classes()


def go_time(instant: float) -> str:
    """Go's `2006-01-02 15:04:05.999999999 -0700 MST` in UTC (trailing zeros of the fraction dropped)."""
    moment = datetime.fromtimestamp(instant, UTC)
    fraction = f"{moment.microsecond:06d}".rstrip("0")
    return moment.strftime(_GO_TIME) + (f".{fraction}" if fraction else "") + " +0000 UTC"


def parse_go_time(text: str) -> float:
    match = re.fullmatch(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.(\d{1,9}))? ([+-]\d{4}) \S+", text)
    if not match:
        raise ValueError(f"not a Go time: {text!r}")
    base = datetime.strptime(match.group(1) + match.group(3), "%Y-%m-%d %H:%M:%S%z")
    return base.timestamp() + float("0." + (match.group(2) or "0"))


def _strict_b64url(text: str) -> bytes:
    """Go's `base64.URLEncoding.DecodeString`, its error dropped (1.24): b"" unless padded."""
    if len(text) % 4:
        return b""
    try:
        return base64.urlsafe_b64decode(text)
    except ValueError:
        return b""


def _lenient_b64url(text: str) -> bytes:
    """`base64.RawURLEncoding` (1.25 on), also taking a padded value as the double always did."""
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        raise HTTPError(400, "Error decoding signature values") from None


class ArtifactsV4:
    def __init__(self, service: ArtifactService) -> None:
        self.service = service

    def signature(self, endpoint: str, expires: str, name: str, task_id: int, artifact_id: int) -> bytes:
        """`buildSignature`."""
        message = f"{endpoint}{expires}{name}{task_id}{artifact_id}".encode()
        return hmac.new(self.service.secret, message, "sha256").digest()

    def signed_url(self, endpoint: str, name: str, task_id: int, artifact_id: int) -> str:
        """`buildArtifactURL`: valid for an hour."""
        expires = go_time(time.time() + SIGNED_URL_TTL_S)
        sig = base64.urlsafe_b64encode(self.signature(endpoint, expires, name, task_id, artifact_id))
        if not self.service.engine.profile.padded_artifact_signatures:
            sig = sig.rstrip(b"=")  # RawURLEncoding from 1.25
        return (
            f"{self.service.root_url}{ROUTE_BASE}/{endpoint}?sig={sig.decode()}&expires={quote_plus(expires)}"
            f"&artifactName={quote_plus(name)}&taskID={task_id}&artifactID={artifact_id}"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = ROUTE.match(scope["path"])
        assert match is not None
        method, verb = match.group(1), scope["method"]
        query, headers, body = query_of(scope), headers_of(scope), await read_body(receive)
        rpcs = {
            "CreateArtifact": self._create,
            "FinalizeArtifact": self._finalize,
            "ListArtifacts": self._list,
            "GetSignedArtifactURL": self._signed_url,
            "DeleteArtifact": self._delete,
        }
        try:
            if method in rpcs and verb == "POST":
                request_type = MESSAGES[method + "Request"]
                answer = await self.service.call(self._rpc, rpcs[method], request_type, headers, body)
                await respond(send, 200, "application/json;charset=utf-8", _to_json(answer))
            elif method == "UploadArtifact" and verb == "PUT":
                status, value = await self.service.call(self._upload, query, headers, body)
                await json_response(send, status, value)
            elif method == "DownloadArtifact" and verb == "GET":
                data, content_type, filename = await self.service.call(self._download, query)
                disposition = f"attachment; filename={json.dumps(filename)}".encode()
                await respond(send, 200, content_type, data, [(b"content-disposition", disposition)])
            elif method in (*rpcs, "UploadArtifact", "DownloadArtifact"):
                raise HTTPError(405, "Method Not Allowed")
            else:
                raise HTTPError(404, "404 page not found")
        except HTTPError as err:
            await http_error(send, err)

    def _rpc(self, conn: Any, rpc: Any, request_type: type[Message], headers: dict[str, str], body: bytes) -> Message:
        task = self.service.authorize(conn, headers.get("authorization", ""))
        request = request_type()
        try:
            json_format.Parse(body.decode("utf-8"), request)
        except (json_format.ParseError, UnicodeDecodeError):
            raise HTTPError(500, "Error decode request body") from None
        answer: Message = rpc(conn, task, request)
        return answer

    def _create(self, conn: Any, task: model.ArtifactTask, req: Any) -> Message:
        model.check_run(task, req.workflow_run_backend_id)
        now = self.service.now()
        retention = model.RETENTION_DAYS
        if req.HasField("expires_at"):
            retention = int((req.expires_at.ToSeconds() - time.time()) / 3600 / 24)
        encoding = req.mime_type.value if req.HasField("mime_type") else ""
        if encoding:
            header = MimeHeader()
            header["content-type"] = encoding
            encoding = header.get_content_type() if "/" in encoding else encoding.strip().lower()
        name = file_name = req.name
        if "/" not in encoding or (encoding.lower() == model.CONTENT_TYPE_ZIP and not file_name.endswith(".zip")):
            encoding, file_name = model.CONTENT_TYPE_ZIP, f"{name}.zip"
        artifact = model.create_artifact(conn, task, name, file_name, retention, now)
        model.update_artifact(conn, artifact["id"], now, content_encoding=encoding, file_size=0, file_compressed_size=0)
        url = self.signed_url("UploadArtifact", name, task.id, artifact["id"])
        return MESSAGES["CreateArtifactResponse"](ok=True, signed_upload_url=url)

    def _verify(self, conn: Any, query: dict[str, str], endpoint: str) -> tuple[model.ArtifactTask, str]:
        """`verifySignature`."""
        name = query.get("artifactName", "")
        raw = query.get("sig", "")
        # 1.24 decodes with padding required and ignores the error: a `sig` without its `=`
        # decodes to nothing, which matches no signature.
        strict = self.service.engine.profile.padded_artifact_signatures
        sig = _strict_b64url(raw) if strict else _lenient_b64url(raw)
        try:
            task_id, artifact_id = int(query.get("taskID", "")), int(query.get("artifactID", ""))
        except ValueError:
            raise HTTPError(400, "Error decoding signature values") from None
        expires = query.get("expires", "")
        if not hmac.compare_digest(sig, self.signature(endpoint, expires, name, task_id, artifact_id)):
            raise HTTPError(401, "Error unauthorized")
        try:
            if parse_go_time(expires) < time.time():
                raise ValueError("expired")
        except ValueError:
            raise HTTPError(401, "Error link expired") from None
        task = conn.execute("SELECT * FROM task WHERE id = ?", (task_id,)).fetchone()
        if task is None:
            raise HTTPError(500, "Error runner api getting task by ID")
        if task["status"] != Status.RUNNING:
            raise HTTPError(500, "Error runner api getting task: task is not running")
        return model.artifact_task(conn, task), name

    def _by_name(self, conn: Any, run_id: int, name: str) -> Any:
        """`getArtifactByName`: the run's v4 artifact of that name."""
        rows = model.find_artifacts(conn, run_id, name=name, v4_only=True)
        if not rows:
            raise HTTPError(404, "Error artifact not found")
        return rows[0]

    def _upload(self, conn: Any, query: dict[str, str], headers: dict[str, str], body: bytes) -> tuple[int, Any]:
        task, name = self._verify(conn, query, "UploadArtifact")
        files, comp = self.service.files, query.get("comp", "")
        if comp in ("block", "appendBlock"):
            artifact = self._by_name(conn, task.run_id, name)
            block_id = query.get("blockid", "")
            if not block_id:
                start = artifact["file_size"]
                try:
                    files.save_chunk_v3(task.run_id, artifact["id"], start, start + len(body) - 1, body, None)
                except OSError:
                    raise HTTPError(500, "Error appending Chunk") from None
                sizes = {"file_size": start + len(body), "file_compressed_size": artifact["file_compressed_size"]}
                sizes["file_compressed_size"] += len(body)
                model.update_artifact(conn, artifact["id"], self.service.now(), **sizes)
            else:
                size = _content_length(headers, body)
                encoded = base64.urlsafe_b64encode(block_id.encode()).decode()
                block = f"block-{task.run_id}-{artifact['id']}-{max(size, 0)}-{encoded}"
                files.save(files.v4_dir(task.run_id).relative_to(files.root) / block, body)
            return 201, "appended"
        if comp == "blocklist":
            artifact_id = int(query.get("artifactID", "0") or 0)
            files.save(
                files.v4_dir(task.run_id).relative_to(files.root) / f"{task.run_id}-{artifact_id}-blocklist", body
            )
            return 201, "created"
        return 200, None

    def _finalize(self, conn: Any, task: model.ArtifactTask, req: Any) -> Message:
        run_id = model.check_run(task, req.workflow_run_backend_id)
        artifact = self._by_name(conn, run_id, req.name)
        files = self.service.files
        try:
            chunks = _ordered_chunks(files, run_id, artifact["id"], _read_block_list(files, run_id, artifact["id"]))
        except (ValueError, OSError):
            raise HTTPError(500, "Error list chunks") from None
        size = chunks[-1].end + 1
        if req.size != size:
            raise HTTPError(500, "Error merge chunks size mismatch")
        model.update_artifact(conn, artifact["id"], self.service.now(), file_size=size, file_compressed_size=size)
        artifact = conn.execute("SELECT * FROM artifact WHERE id = ?", (artifact["id"],)).fetchone()
        try:
            self.service.confirm(conn, artifact, chunks, req.hash.value if req.HasField("hash") else "")
        except (ValueError, OSError):
            raise HTTPError(500, "Error merge chunks") from None
        return MESSAGES["FinalizeArtifactResponse"](ok=True, artifact_id=artifact["id"])

    def _list(self, conn: Any, task: model.ArtifactTask, req: Any) -> Message:
        """`listArtifacts`, with Gitea's table: a name seen twice, or filtered out once, is dropped."""
        run_id = model.check_run(task, req.workflow_run_backend_id)
        rows = model.find_artifacts(conn, run_id, status=model.ArtifactStatus.UPLOAD_CONFIRMED, v4_only=True)
        table: dict[str, Any] = {}
        for row in rows:
            name = row["artifact_name"]
            if (
                name in table
                or (req.HasField("id_filter") and row["id"] != req.id_filter.value)
                or (req.HasField("name_filter") and name != req.name_filter.value)
            ):
                table[name] = None
                continue
            item = MESSAGES["ListArtifactsResponse_MonolithArtifact"](
                name=name,
                database_id=row["id"],
                workflow_run_backend_id=req.workflow_run_backend_id,
                workflow_job_run_backend_id=req.workflow_job_run_backend_id,
                size=row["file_size"],
            )
            item.created_at.FromSeconds(row["created"])
            table[name] = item
        return MESSAGES["ListArtifactsResponse"](artifacts=[item for item in table.values() if item is not None])

    def _signed_url(self, conn: Any, task: model.ArtifactTask, req: Any) -> Message:
        run_id = model.check_run(task, req.workflow_run_backend_id)
        artifact = self._by_name(conn, run_id, req.name)
        if artifact["status"] != model.ArtifactStatus.UPLOAD_CONFIRMED:
            raise HTTPError(404, "Error artifact not found")
        url = self.signed_url("DownloadArtifact", req.name, task.id, artifact["id"])
        return MESSAGES["GetSignedArtifactURLResponse"](signed_url=url)

    def _download(self, conn: Any, query: dict[str, str]) -> tuple[bytes, str, str]:
        task, name = self._verify(conn, query, "DownloadArtifact")
        artifact = self._by_name(conn, task.run_id, name)
        if artifact["status"] != model.ArtifactStatus.UPLOAD_CONFIRMED:
            raise HTTPError(404, "Error artifact not found")
        try:
            data = self.service.files.read(artifact["storage_path"])
        except OSError:
            raise HTTPError(500, "failed to download artifact") from None
        return data, artifact["content_encoding"], artifact["artifact_path"]

    def _delete(self, conn: Any, task: model.ArtifactTask, req: Any) -> Message:
        run_id = model.check_run(task, req.workflow_run_backend_id)
        artifact = self._by_name(conn, run_id, req.name)
        conn.execute(
            "UPDATE artifact SET status = ? WHERE run_id = ? AND artifact_name = ?",
            (int(model.ArtifactStatus.PENDING_DELETION), run_id, req.name),
        )
        return MESSAGES["DeleteArtifactResponse"](ok=True, artifact_id=artifact["id"])


def _to_json(message: Message) -> bytes:
    return json.dumps(json_format.MessageToDict(message), separators=(",", ":")).encode()


def _content_length(headers: dict[str, str], body: bytes) -> int:
    try:
        return int(headers["content-length"])
    except (KeyError, ValueError):
        return -1 if not body else len(body)


def _read_block_list(files: model.ArtifactFiles, run_id: int, artifact_id: int) -> list[str] | None:
    """`readBlockList`: the uploaded block order (then deleted), or None without one."""
    path = files.v4_dir(run_id) / f"{run_id}-{artifact_id}-blocklist"
    try:
        root = ET.fromstring(path.read_bytes())
    except (OSError, ET.ParseError):
        return None
    finally:
        Path(path).unlink(missing_ok=True)
    return [element.text or "" for element in root.iter("Latest")]


def _ordered_chunks(
    files: model.ArtifactFiles, run_id: int, artifact_id: int, block_list: list[str] | None
) -> list[model.Chunk]:
    """`listOrderedChunksForArtifact`: the blocks in the block list's order; without a list,
    one block, else the appended (v3-style) chunks."""
    blocks = files.v4_blocks(run_id, artifact_id)
    if block_list is None:
        if len(blocks) > 1:
            raise ValueError("blockmap is required for chunks > 1")
        chunks = blocks or sorted(files.v3_chunks(run_id).get(artifact_id, []), key=lambda c: c.start)
        if not blocks:
            if not chunks:
                raise ValueError(f"no chunk found for artifact id: {artifact_id}")
            return chunks
    else:
        by_name = {block.name: block for block in blocks}
        chunks = []
        for index, name in enumerate(block_list):
            if name not in by_name:
                raise ValueError(f"missing chunk ({index}/{len(block_list)}): {name}")
            chunks.append(by_name[name])
    at = 0
    for chunk in chunks:
        chunk.start, chunk.end = at, at + chunk.size - 1
        at = chunk.end + 1
    if not chunks:
        raise ValueError(f"no chunk found for artifact id: {artifact_id}")
    return chunks
