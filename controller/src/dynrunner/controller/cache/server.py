"""The cache server's HTTP face: both `actions/cache` protocols, the results-service forward,
job registration. Served by the controller (`cache.serve`) or `dynrunner-controller cache-server`.

    v1 (base ACTIONS_CACHE_URL, Bearer ACTIONS_RUNTIME_TOKEN)
      GET   /_apis/artifactcache/cache?keys=k1,k2&version=v   200 {cacheKey, archiveLocation, …} | 204
      GET   /_apis/artifactcache/caches?key=k                 the repository's entries with that key
      POST  /_apis/artifactcache/caches {key, version, cacheSize}   200 {cacheId} | 409 | 400
      PATCH /_apis/artifactcache/caches/{id}   one byte range (Content-Range: bytes s-e/*)
      POST  /_apis/artifactcache/caches/{id} {size}            publish
      GET   /_apis/artifactcache/artifacts/{id}?exp=&sig=      the archive (signed: the toolkit sends no token)
    v2 (origin of ACTIONS_RESULTS_URL; twirp JSON, Bearer ACTIONS_RUNTIME_TOKEN)
      POST  /twirp/github.actions.results.api.v1.CacheService/CreateCacheEntry | FinalizeCacheEntryUpload |
            GetCacheEntryDownloadURL
      PUT   /_apis/artifactcache/blobs/{id}?exp=&sig=[&comp=block&blockid=…|&comp=blocklist]   Azure blob upload
      POST  /twirp/github.actions.results.api.v1.ArtifactService/*   forwarded to the job's Gitea
    jobs
      POST  /_dynrunner/register {grant, token}   200 {"results_url": <this server>} | 403
      POST  /_dynrunner/revoke {token}            204
      GET   /healthz
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import secrets
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from dynrunner.controller.cache.grants import Grant
from dynrunner.controller.cache.index import Entry
from dynrunner.controller.cache.service import (
    DOWNLOAD_URL_TTL_S,
    UPLOAD_URL_TTL_S,
    CacheService,
    Refused,
    check_key,
)
from dynrunner.controller.cache.storage import UploadError

log = logging.getLogger(__name__)

API = "/_apis/artifactcache"
CACHE_SERVICE = "/twirp/github.actions.results.api.v1.CacheService"
ARTIFACT_SERVICE = "/twirp/github.actions.results.api.v1.ArtifactService"
WRITE_CHUNK = 1024 * 1024
_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
_TWIRP_CODES = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied", 404: "not_found",
                409: "already_exists", 413: "resource_exhausted", 500: "internal"}  # fmt: skip
T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _bearer(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class CacheServer:
    def __init__(self, service: CacheService, public_url: str, *, forward_artifacts: bool = True) -> None:
        self.service = service
        self.public_url = public_url.rstrip("/")
        self.forward_artifacts = forward_artifacts
        self.requests: collections.Counter[str] = collections.Counter()
        """Requests served, by protocol: v1, v2, blob, download, artifacts (forwarded), jobs."""
        self._http: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**2, middlewares=[self._errors])
        add = app.router.add_route
        add("GET", f"{API}/cache", self._v1_lookup)
        add("GET", f"{API}/caches", self._v1_list)
        add("POST", f"{API}/caches", self._v1_reserve)
        add("PATCH", f"{API}/caches/{{id:\\d+}}", self._v1_upload)
        add("POST", f"{API}/caches/{{id:\\d+}}", self._v1_commit)
        add("POST", f"{API}/clean", self._v1_clean)
        add("GET", f"{API}/artifacts/{{id:\\d+}}", self._download)
        add("PUT", f"{API}/blobs/{{id:\\d+}}", self._v2_blob)
        add("POST", f"{CACHE_SERVICE}/{{method}}", self._v2_rpc)
        add("*", f"{ARTIFACT_SERVICE}/{{method:[A-Za-z]+}}", self._forward)
        add("POST", "/_dynrunner/register", self._register)
        add("POST", "/_dynrunner/revoke", self._revoke)
        add("GET", "/healthz", self._health)
        app.on_cleanup.append(self._close_http)
        return app

    async def _close_http(self, app: web.Application) -> None:
        if self._http is not None:
            await self._http.close()

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.requests[_protocol(request.path)] += 1
        try:
            return await handler(request)
        except Refused as refused:
            if request.path.startswith("/twirp/"):
                code = _TWIRP_CODES.get(refused.status, "internal")
                return web.json_response({"code": code, "msg": str(refused)}, status=refused.status)
            return web.json_response({"message": str(refused)}, status=refused.status)

    async def _job(self, request: web.Request) -> Grant:
        return await self._call(self.service.job, _bearer(request))

    async def _json(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json(loads=json.loads)
        except (ValueError, UnicodeDecodeError):
            raise Refused(400, "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise Refused(400, "the request body must be a JSON object")
        return body

    def _download_url(self, entry_id: int) -> str:
        query = self.service.signed_query("download", entry_id, DOWNLOAD_URL_TTL_S)
        return f"{self.public_url}{API}/artifacts/{entry_id}?{query}"

    # -- v1 ------------------------------------------------------------------------------------

    async def _v1_lookup(self, request: web.Request) -> web.StreamResponse:
        job = await self._job(request)
        keys = [k for k in request.query.get("keys", "").split(",") if k]
        entry = await self._call(self.service.lookup, job, keys, request.query.get("version", ""))
        if entry is None:
            return web.Response(status=204)
        return web.json_response(_v1_entry(entry) | {"result": "hit", "archiveLocation": self._download_url(entry.id)})

    async def _v1_list(self, request: web.Request) -> web.StreamResponse:
        job = await self._job(request)
        key = check_key(request.query.get("key", ""))
        entries = [
            e
            for e in await self._call(self.service.index.entries)
            if e.repo == job.repo and e.key == key and e.complete
        ]
        return web.json_response({"totalCount": len(entries), "artifactCaches": [_v1_entry(e) for e in entries]})

    async def _v1_reserve(self, request: web.Request) -> web.StreamResponse:
        job = await self._job(request)
        body = await self._json(request)
        size = body.get("cacheSize")
        entry = await self._call(
            self.service.reserve, job, str(body.get("key", "")), str(body.get("version", "")), _int_or_none(size)
        )
        return web.json_response({"cacheId": entry.id})

    async def _v1_upload(self, request: web.Request) -> web.StreamResponse:
        job = await self._job(request)
        entry = await self._call(self.service.writable, job, int(request.match_info["id"]))
        match = _RANGE.match(request.headers.get("Content-Range", ""))
        if match is None:
            raise Refused(400, "a chunk needs Content-Range: bytes <start>-<end>/*")
        start, end = int(match.group(1)), int(match.group(2))
        target = await self._call(self.service.storage.range_file, entry.id, start)
        await self._receive(request, entry, target, limit=end - start + 1)
        return web.Response(status=204)

    async def _v1_commit(self, request: web.Request) -> web.StreamResponse:
        job = await self._job(request)
        entry = await self._call(self.service.writable, job, int(request.match_info["id"]))
        body = await self._json(request)
        await self._call(self.service.commit, entry, _int_or_none(body.get("size")))
        return web.Response(status=204)

    async def _v1_clean(self, request: web.Request) -> web.StreamResponse:
        await self._job(request)
        return web.Response(status=204)

    async def _download(self, request: web.Request) -> web.StreamResponse:
        entry_id = int(request.match_info["id"])
        self.service.check_signature("download", entry_id, request.query.get("exp", ""), request.query.get("sig", ""))
        opened = self.service.open(entry_id)
        entry, stream = await self._call(opened.__enter__)
        try:
            response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            response.content_length = entry.size
            await response.prepare(request)
            while chunk := await self._call(stream.read, WRITE_CHUNK):
                await response.write(chunk)
            await response.write_eof()
            return response
        finally:
            await self._call(opened.__exit__, None, None, None)

    async def _receive(self, request: web.Request, entry: Entry, target: Path, limit: int | None = None) -> int:
        """Stream the request body into `target`; no more than `limit` bytes, and never more
        than the entry's and its repository's staging room (`CacheService.staging_room`)."""
        room = await self._call(self.service.staging_room, entry, target)
        limits = self.service.limits
        too_large = Refused(
            413,
            f"cache {entry.id} ({entry.key}): the upload would stage more than this cache allows "
            f"({limits.max_entry_bytes} B per entry, {limits.repo_bytes} B of uploads pending per repository)",
        )
        if limit is not None and limit > room:
            raise too_large
        cap = room if limit is None else limit
        written = 0
        handle = await self._call(open, target, "wb")
        try:
            async for chunk in request.content.iter_chunked(WRITE_CHUNK):
                written += len(chunk)
                if written > cap:
                    raise too_large
                await self._call(handle.write, chunk)
        except BaseException:
            await self._call(handle.close)
            await self._call(target.unlink, True)
            raise
        await self._call(handle.close)
        if limit is not None and written != limit:
            raise Refused(400, f"the chunk has {written} bytes, but its Content-Range says {limit}")
        return written

    # -- v2 ------------------------------------------------------------------------------------

    async def _v2_rpc(self, request: web.Request) -> web.StreamResponse:
        methods = {
            "CreateCacheEntry": self._v2_create,
            "FinalizeCacheEntryUpload": self._v2_finalize,
            "GetCacheEntryDownloadURL": self._v2_download_url,
        }
        method = methods.get(request.match_info["method"])
        if method is None:
            raise Refused(404, f"no such method: {request.match_info['method']}")
        job = await self._job(request)
        answer = await method(job, await self._json(request))
        return web.json_response(answer)

    async def _v2_create(self, job: Grant, body: dict[str, Any]) -> dict[str, Any]:
        try:
            entry = await self._call(self.service.reserve, job, str(body.get("key", "")), str(body.get("version", "")))
        except Refused as refused:
            if refused.status == 409:
                return {"ok": False, "message": str(refused)}
            raise
        query = self.service.signed_query("upload", entry.id, UPLOAD_URL_TTL_S)
        return {"ok": True, "signed_upload_url": f"{self.public_url}{API}/blobs/{entry.id}?{query}"}

    async def _v2_finalize(self, job: Grant, body: dict[str, Any]) -> dict[str, Any]:
        key, version = str(body.get("key", "")), str(body.get("version", ""))
        entry = await self._call(self.service.pending, job, key, version)
        if entry is None:
            return {"ok": False, "message": f"no upload of cache {key!r} by this job to finalize"}
        size = _int_or_none(body.get("size_bytes", body.get("sizeBytes")))
        try:
            done = await self._call(self.service.commit, entry, size)
        except Refused as refused:
            return {"ok": False, "message": str(refused)}
        return {"ok": True, "entry_id": str(done.id)}

    async def _v2_download_url(self, job: Grant, body: dict[str, Any]) -> dict[str, Any]:
        restore = body.get("restore_keys", body.get("restoreKeys")) or []
        keys = [str(body.get("key", "")), *(str(k) for k in restore)]
        entry = await self._call(self.service.lookup, job, keys, str(body.get("version", "")))
        if entry is None:
            return {"ok": False}
        return {"ok": True, "signed_download_url": self._download_url(entry.id), "matched_key": entry.key}

    async def _v2_blob(self, request: web.Request) -> web.StreamResponse:
        """Azure's Put Blob, Put Block and Put Block List, as `@azure/storage-blob` sends them."""
        entry_id = int(request.match_info["id"])
        self.service.check_signature("upload", entry_id, request.query.get("exp", ""), request.query.get("sig", ""))
        entry = await self._call(self.service.index.get, entry_id)
        if entry is None or entry.complete:
            raise Refused(400, f"cache {entry_id}: not reserved, or already complete")
        storage = self.service.storage
        comp = request.query.get("comp", "").lower()
        try:
            if comp == "block":
                target = await self._call(storage.block_file, entry_id, request.query.get("blockid", ""))
                await self._receive(request, entry, target)
            elif comp == "blocklist":
                ids = _block_list(await request.read())
                await self._call(storage.order_blocks, entry_id, ids)
            else:
                await self._receive(request, entry, await self._call(storage.whole_file, entry_id))
        except UploadError as err:
            raise Refused(400, str(err)) from None
        return web.Response(status=201, headers={"x-ms-request-id": secrets.token_hex(8), "x-ms-version": "2024-08-04"})

    # -- the artifact half of the results service ----------------------------------------------

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        """ACTIONS_RESULTS_URL points here, so a job's ArtifactService calls arrive here too: they go
        on to the Gitea its grant names (only for registered jobs: no open proxy). Gitea builds
        the signed upload and download URLs from its own address, so the bytes go to Gitea."""
        job = await self._job(request)
        if not self.forward_artifacts or not job.results_url:
            raise Refused(404, "this cache server does not serve artifacts for this job")
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type", "accept")}
        url = f"{job.results_url.rstrip('/')}{ARTIFACT_SERVICE}/{request.match_info['method']}"
        try:
            async with self._http.request(
                request.method, url, params=request.query, data=await request.read(), headers=headers
            ) as upstream:
                body = await upstream.read()
                content_type = upstream.headers.get("Content-Type", "application/octet-stream")
                return web.Response(status=upstream.status, body=body, headers={"Content-Type": content_type})
        except aiohttp.ClientError as err:
            log.warning("cache: forwarding %s to %s failed: %s", request.path, job.results_url, err)
            raise Refused(502, f"the artifact service at {job.results_url} cannot be reached: {err}") from None

    # -- jobs ----------------------------------------------------------------------------------

    async def _register(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        grant = await self._call(self.service.register, str(body.get("grant", "")), str(body.get("token", "")))
        results = self.public_url if self.forward_artifacts and grant.results_url else ""
        return web.json_response({"results_url": results})

    async def _revoke(self, request: web.Request) -> web.StreamResponse:
        body = await self._json(request)
        await self._call(self.service.revoke, str(body.get("token", "")))
        return web.Response(status=204)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok\n")


def _protocol(path: str) -> str:
    if path.startswith(CACHE_SERVICE):
        return "v2"
    if path.startswith(ARTIFACT_SERVICE):
        return "artifacts"
    if path.startswith(f"{API}/blobs"):
        return "blob"
    if path.startswith(f"{API}/artifacts"):
        return "download"
    return "v1" if path.startswith(API) else "jobs"


def _v1_entry(entry: Entry) -> dict[str, Any]:
    return {"cacheKey": entry.key, "cacheVersion": entry.version, "scope": entry.scope, "creationTime": entry.created}


def _int_or_none(value: object) -> int | None:
    try:
        return int(str(value)) if value is not None else None
    except ValueError:
        raise Refused(400, f"{value!r} is not a number") from None


def _block_list(data: bytes) -> list[str]:
    """The block ids of a Put Block List body (`Latest`, `Committed`, `Uncommitted`), in order."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError as err:
        raise Refused(400, f"malformed block list: {err}") from None
    return [element.text or "" for element in root if element.tag in ("Latest", "Committed", "Uncommitted")]
