"""execd, the daemon in every sandbox that the SDK's `files` API talks to (`components/execd`
of OpenSandbox: `pkg/web/router.go`, `controller/filesystem*.go`, `controller/utils.go`).

Modelled: `GET /ping`, `POST /files/upload` (multipart pairs of a `metadata` JSON part and a
`file` part, processed in order, each written, synced and chmodded before the next),
`GET /files/download`, `GET /files/info`, `POST /files/mv` (fails if the destination exists),
`DELETE /files`, `POST /directories`. A file's `mode` is an octal number written in decimal
digits (755 is rwxr-xr-x), `owner`/`group` are names. Errors are `{code, message}` with
execd's codes. Paths are the VM's: they land in the sandbox's rootfs (see `boot`).

`POST /command` runs a command in the sandbox (see execd_command). Not modelled: command
status and logs, interrupts, sessions, code interpreting, search/replace, metrics, PTY.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from dynrunner.doubles.opensandbox import execd_command
from dynrunner.doubles.opensandbox.boot import vm_path


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"code": code, "message": message})


def _chmod(path: Path, meta: dict[str, Any]) -> None:
    mode = int(meta.get("mode") or 0)
    if mode:
        os.chmod(path, int(str(mode), 8))
    owner, group = meta.get("owner") or "", meta.get("group") or ""
    if owner or group:
        os.chown(path, pwd.getpwnam(owner).pw_uid if owner else -1, grp.getgrnam(group).gr_gid if group else -1)


def _info(host: Path, vm: str) -> dict[str, Any]:
    st = host.lstat()
    kind = "symlink" if host.is_symlink() else "directory" if host.is_dir() else "file" if host.is_file() else "other"
    return {
        "path": vm,
        "type": kind,
        "size": st.st_size,
        "modified_at": datetime.fromtimestamp(st.st_mtime, UTC).isoformat(),
        "created_at": datetime.fromtimestamp(st.st_ctime, UTC).isoformat(),
        "owner": str(st.st_uid),
        "group": str(st.st_gid),
        "mode": int(oct(st.st_mode & 0o777)[2:]),
    }


async def _json_body(request: Request) -> Any:
    """The JSON body, or execd's 400 for one it cannot decode."""
    try:
        return json.loads(await request.body())
    except ValueError as err:
        return _error(400, "INVALID_REQUEST_BODY", f"error parsing request, MAYBE invalid body format. {err}")


async def _part_bytes(part: Any) -> bytes:
    return await part.read() if hasattr(part, "read") else str(part).encode()


async def _write_pairs(rootfs: Path, metas: list[Any], files: list[Any]) -> Response:
    """Each (metadata, file) pair in order: written, synced and chmodded before the next."""
    if not metas:
        return _error(400, "INVALID_FILE_METADATA", "metadata file is missing")
    if not files:
        return _error(400, "INVALID_FILE_CONTENT", "file is missing")
    if len(metas) != len(files):
        return _error(400, "INVALID_FILE", f"metadata and file count mismatch: {len(metas)} vs {len(files)}")
    for meta_part, file_part in zip(metas, files, strict=True):
        try:
            meta = json.loads(await _part_bytes(meta_part))
        except ValueError as err:
            return _error(400, "INVALID_FILE_METADATA", f"invalid metadata format. {err}")
        if not isinstance(meta, dict) or not meta.get("path"):
            return _error(400, "INVALID_FILE_METADATA", "metadata path is empty")
        target = vm_path(rootfs, meta["path"])
        content = await _part_bytes(file_part)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o777)
            with os.fdopen(fd, "wb") as out:
                out.write(content)
                out.flush()
                os.fsync(out.fileno())
            _chmod(target, meta)
        except (OSError, KeyError) as err:
            return _error(500, "RUNTIME_ERROR", f"error writing file {meta['path']}. {err}")
    return Response(status_code=200)


def build_router(sandbox_of: Any) -> APIRouter:
    """`sandbox_of(request)` returns the sandbox a request is for (it raises the proxy's error
    when the sandbox is missing or its execd does not answer)."""
    router = APIRouter()

    def rootfs_of(request: Request) -> Path:
        return Path(sandbox_of(request).rootfs)

    @router.post("/command")
    async def command(request: Request) -> Response:
        return await execd_command.run(sandbox_of(request), await request.body())

    @router.get("/ping")
    async def ping(request: Request) -> Response:
        rootfs_of(request)
        return Response(status_code=200)

    @router.post("/files/upload")
    async def upload(request: Request) -> Response:
        rootfs = rootfs_of(request)
        try:
            form = await request.form()
        except Exception:
            return _error(400, "INVALID_FILE", "multipart form is empty")
        try:
            return await _write_pairs(rootfs, form.getlist("metadata"), form.getlist("file"))
        finally:
            await form.close()

    @router.get("/files/download")
    async def download(request: Request, path: str = "") -> Response:
        rootfs = rootfs_of(request)
        if not path:
            return _error(400, "MISSING_QUERY", "missing query parameter 'path'")
        target = vm_path(rootfs, path)
        if not target.is_file():
            return _error(404, "FILE_NOT_FOUND", f"file not found. {path}")
        return FileResponse(target, media_type="application/octet-stream")

    @router.get("/files/info")
    async def info(request: Request) -> Response:
        rootfs = rootfs_of(request)
        answer: dict[str, Any] = {}
        for path in request.query_params.getlist("path"):
            target = vm_path(rootfs, path)
            if not target.exists() and not target.is_symlink():
                return _error(404, "FILE_NOT_FOUND", f"file not found. file not found: {path}")
            answer[path] = _info(target, "/" + str(target.relative_to(rootfs)))
        return JSONResponse(answer)

    @router.post("/files/mv")
    async def move(request: Request) -> Response:
        rootfs = rootfs_of(request)
        items = await _json_body(request)
        if isinstance(items, Response):
            return items
        for item in items or []:
            src, dest = vm_path(rootfs, item.get("src", "")), vm_path(rootfs, item.get("dest", ""))
            if not src.exists():
                return _error(404, "FILE_NOT_FOUND", f"file not found. source path not found: {item.get('src')}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.exists():
                return _error(
                    500, "RUNTIME_ERROR", f"error accessing file: destination path already exists: {item.get('dest')}"
                )
            src.rename(dest)
        return Response(status_code=200)

    @router.delete("/files")
    async def remove(request: Request) -> Response:
        rootfs = rootfs_of(request)
        for path in request.query_params.getlist("path"):
            target = vm_path(rootfs, path)
            if target.is_dir():
                return _error(500, "RUNTIME_ERROR", f"error removing file {path}. path is a directory: {path}")
            target.unlink(missing_ok=True)
        return Response(status_code=200)

    @router.post("/directories")
    async def make_dirs(request: Request) -> Response:
        rootfs = rootfs_of(request)
        wanted = await _json_body(request)
        if isinstance(wanted, Response):
            return wanted
        for path, meta in (wanted or {}).items():
            target = vm_path(rootfs, path)
            existed = target.exists()
            target.mkdir(parents=True, exist_ok=True)
            if not existed:
                _chmod(target, meta or {})
        return Response(status_code=200)

    return router
