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

Held connections: a body or a download that moves no byte for `Timeouts.body_s` ends the
request; one job (by its token, or whom its signed URL was handed to) has at most
`MAX_JOB_REQUESTS` requests in progress (429 beyond). Connections without a request in
progress are capped and timed out by `connections.ConnectionGuard`.
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
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from dynrunner.controller.cache.connections import ConnectionGuard
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
from dynrunner.controller.cache.uploads import Pieces

log = logging.getLogger(__name__)

API = "/_apis/artifactcache"
CACHE_SERVICE = "/twirp/github.actions.results.api.v1.CacheService"
ARTIFACT_SERVICE = "/twirp/github.actions.results.api.v1.ArtifactService"
WRITE_CHUNK = 1024 * 1024
_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
_TWIRP_CODES = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied", 404: "not_found",
                408: "deadline_exceeded", 409: "already_exists", 413: "resource_exhausted",
                429: "resource_exhausted", 500: "internal"}  # fmt: skip
MAX_JOB_REQUESTS = 16
"""Requests of one job in progress at once: the toolkit uploads and downloads 4-8 pieces in
parallel; more is a job holding connections open."""
_HOLDER = web.RequestKey("holder", str)
T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _bearer(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


@dataclass(frozen=True, slots=True)
class Timeouts:
    headers_s: float = 30.0
    """A connection that has not sent a whole request head within this of its start or its
    last answer is closed (idle keep-alive connections too)."""
    body_s: float = 60.0
    """A request body or a download that moves no byte for this long ends."""


class CacheServer:
    def __init__(
        self,
        service: CacheService,
        public_url: str,
        *,
        forward_artifacts: bool = True,
        timeouts: Timeouts | None = None,
    ) -> None:
        self.service = service
        self.public_url = public_url.rstrip("/")
        self.forward_artifacts = forward_artifacts
        self.timeouts = timeouts or Timeouts()
        self.connections: ConnectionGuard | None = None
        """Set by `serve_cache`: the connections' cap, told by a middleware which are busy."""
        self.requests: collections.Counter[str] = collections.Counter()
        """Requests served, by protocol: v1, v2, blob, download, artifacts (forwarded), jobs."""
        self._http: aiohttp.ClientSession | None = None
        self._in_progress: collections.Counter[str] = collections.Counter()
        self.pieces = Pieces(service, self.timeouts.body_s)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024**2, middlewares=[self._busy, self._errors])
        add = app.router.add_route
        add("GET", f"{API}/cache", self._v1_lookup)
        add("GET", f"{API}/caches", self._v1_list)
        add("POST", f"{API}/caches", self._v1_reserve)
        add("PATCH", f"{API}/caches/{{id:\\d{{1,18}}}}", self._v1_upload)
        add("POST", f"{API}/caches/{{id:\\d{{1,18}}}}", self._v1_commit)
        add("POST", f"{API}/clean", self._v1_clean)
        add("GET", f"{API}/artifacts/{{id:\\d{{1,18}}}}", self._download)
        add("PUT", f"{API}/blobs/{{id:\\d{{1,18}}}}", self._v2_blob)
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
    async def _busy(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.connections is None:
            return await handler(request)
        return await self.connections.middleware(request, handler)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.requests[_protocol(request.path)] += 1
        try:
            try:
                return await handler(request)
            except UploadError as err:
                raise Refused(400, str(err)) from None
            finally:
                holder = request.get(_HOLDER)
                if holder is not None:
                    self._in_progress[holder] -= 1
                    if self._in_progress[holder] <= 0:
                        del self._in_progress[holder]
        except Refused as refused:
            if request.path.startswith("/twirp/"):
                code = _TWIRP_CODES.get(refused.status, "internal")
                return web.json_response({"code": code, "msg": str(refused)}, status=refused.status)
            return web.json_response({"message": str(refused)}, status=refused.status)

    def _hold(self, request: web.Request, holder: str) -> None:
        """Count this request against `holder`'s (a job's) requests in progress."""
        if self._in_progress[holder] >= MAX_JOB_REQUESTS:
            raise Refused(429, f"this job has {MAX_JOB_REQUESTS} cache requests in progress, the most it may")
        self._in_progress[holder] += 1
        request[_HOLDER] = holder

    async def _job(self, request: web.Request) -> Grant:
        job = await self._call(self.service.job, _bearer(request))
        self._hold(request, _holder(job.token_sha256))
        return job

    async def _body(self, request: web.Request) -> bytes:
        try:
            async with asyncio.timeout(self.timeouts.body_s):
                return await request.read()
        except TimeoutError:
            raise Refused(408, "the request body stalled") from None

    async def _json(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await self._body(request))
        except (ValueError, RecursionError):
            raise Refused(400, "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise Refused(400, "the request body must be a JSON object")
        return body

    def _download_url(self, entry_id: int, job: Grant) -> str:
        query = self.service.signed_query("download", entry_id, DOWNLOAD_URL_TTL_S, _holder(job.token_sha256))
        return f"{self.public_url}{API}/artifacts/{entry_id}?{query}"

    # -- v1 ------------------------------------------------------------------------------------

    async def _v1_lookup(self, request: web.Request) -> web.StreamResponse:
        job = await self._job(request)
        keys = [k for k in request.query.get("keys", "").split(",") if k]
        entry = await self._call(self.service.lookup, job, keys, request.query.get("version", ""))
        if entry is None:
            return web.Response(status=204)
        location = self._download_url(entry.id, job)
        return web.json_response(_v1_entry(entry) | {"result": "hit", "archiveLocation": location})

    async def _v1_list(self, request: web.Request) -> web.StreamResponse:
        job = await self._job(request)
        key = check_key(request.query.get("key", ""))
        entries = await self._call(self.service.index.listing, job, key)
        return web.json_response({"totalCount": len(entries), "artifactCaches": [_v1_entry(e) for e in entries]})

    async def _v1_reserve(self, request: web.Request) -> web.StreamResponse:
        job = await self._job(request)
        body = await self._json(request)
        key, version = _string(body, "key"), _string(body, "version")
        entry = await self._call(self.service.reserve, job, key, version, _int_or_none(body, "cacheSize"))
        return web.json_response({"cacheId": entry.id})

    async def _v1_upload(self, request: web.Request) -> web.StreamResponse:
        job = await self._job(request)
        entry = await self._call(self.service.writable, job, int(request.match_info["id"]))
        match = _RANGE.match(request.headers.get("Content-Range", ""))
        if match is None:
            raise Refused(400, "a chunk needs Content-Range: bytes <start>-<end>/*")
        start, end = int(match.group(1)), int(match.group(2))
        if end < start:
            raise Refused(400, f"Content-Range {match.group(0)!r} ends before it starts")
        target = await self._call(self.service.storage.range_file, entry.id, start)
        await self.pieces.receive(request, entry, target, length=end - start + 1)
        return web.Response(status=204)

    async def _v1_commit(self, request: web.Request) -> web.StreamResponse:
        job = await self._job(request)
        entry = await self._call(self.service.writable, job, int(request.match_info["id"]))
        body = await self._json(request)
        with self.pieces.settled(entry):
            await self._call(self.service.commit, entry, _int_or_none(body, "size"))
        return web.Response(status=204)

    async def _v1_clean(self, request: web.Request) -> web.StreamResponse:
        await self._job(request)
        return web.Response(status=204)

    async def _download(self, request: web.Request) -> web.StreamResponse:
        entry_id = int(request.match_info["id"])
        query = request.query
        by = query.get("by", "")
        self.service.check_signature("download", entry_id, query.get("exp", ""), query.get("sig", ""), by)
        self._hold(request, by)
        opened = self.service.open(entry_id)
        entry, stream = await self._call(opened.__enter__)
        try:
            response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            response.content_length = entry.size
            await response.prepare(request)
            while chunk := await self._call(stream.read, WRITE_CHUNK):
                try:
                    async with asyncio.timeout(self.timeouts.body_s):
                        await response.write(chunk)
                except TimeoutError:  # a reader that stopped reading: the connection goes
                    if request.transport is not None:
                        request.transport.abort()
                    return response
            await response.write_eof()
            return response
        finally:
            await self._call(opened.__exit__, None, None, None)

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
            entry = await self._call(self.service.reserve, job, _string(body, "key"), _string(body, "version"))
        except Refused as refused:
            if refused.status == 409:
                return {"ok": False, "message": str(refused)}
            raise
        query = self.service.signed_query("upload", entry.id, UPLOAD_URL_TTL_S)
        return {"ok": True, "signed_upload_url": f"{self.public_url}{API}/blobs/{entry.id}?{query}"}

    async def _v2_finalize(self, job: Grant, body: dict[str, Any]) -> dict[str, Any]:
        key, version = _string(body, "key"), _string(body, "version")
        size = _int_or_none(body, "size_bytes", "sizeBytes")
        entry = await self._call(self.service.pending, job, key, version)
        if entry is None:
            return {"ok": False, "message": f"no upload of cache {key!r} by this job to finalize"}
        try:
            with self.pieces.settled(entry):
                done = await self._call(self.service.commit, entry, size)
        except Refused as refused:
            return {"ok": False, "message": str(refused)}
        return {"ok": True, "entry_id": str(done.id)}

    async def _v2_download_url(self, job: Grant, body: dict[str, Any]) -> dict[str, Any]:
        restore = _field(body, "restore_keys", "restoreKeys")
        if restore is None:
            restore = []
        if not isinstance(restore, list) or not all(isinstance(k, str) for k in restore):
            raise Refused(400, "restore_keys must be a list of strings")
        keys = [_string(body, "key"), *restore]
        entry = await self._call(self.service.lookup, job, keys, _string(body, "version"))
        if entry is None:
            return {"ok": False}
        return {"ok": True, "signed_download_url": self._download_url(entry.id, job), "matched_key": entry.key}

    async def _v2_blob(self, request: web.Request) -> web.StreamResponse:
        """Azure's Put Blob, Put Block and Put Block List, as `@azure/storage-blob` sends them."""
        entry_id = int(request.match_info["id"])
        self.service.check_signature("upload", entry_id, request.query.get("exp", ""), request.query.get("sig", ""))
        entry = await self._call(self.service.index.get, entry_id)
        if entry is None or entry.complete:
            raise Refused(400, f"cache {entry_id}: not reserved, or already complete")
        self._hold(request, _holder(entry.writer))
        storage = self.service.storage
        comp = request.query.get("comp", "").lower()
        if comp == "block":
            target = await self._call(storage.block_file, entry_id, request.query.get("blockid", ""))
            await self.pieces.receive(request, entry, target)
        elif comp == "blocklist":
            ids = _block_list(await self._body(request))
            await self._call(storage.order_blocks, entry_id, ids)
        else:
            await self.pieces.receive(request, entry, await self._call(storage.whole_file, entry_id))
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
                request.method, url, params=request.query, data=await self._body(request), headers=headers
            ) as upstream:
                body = await upstream.read()
                content_type = upstream.headers.get("Content-Type", "application/octet-stream")
                if upstream.status == 200 and request.match_info["method"] == "CreateArtifact":
                    body = _escaped_upload_url(body)
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


def _escaped_upload_url(body: bytes) -> bytes:
    """CreateArtifact's answer with each `=` inside a query value of its signed upload URL sent
    as `%3D`. Gitea 1.24 signs that URL with padded base64url (`sig=…=`) and refuses the
    signature without its padding; the Azure blob client of `@actions/artifact` 2.x drops
    a value's `=` when it appends `comp=block` to the URL, so every v4 upload failed there
    with "Error unauthorized" (docs/compatibility.md). Escaped, the client keeps it and Gitea
    reads the same value; URLs without padding (1.25 on) are unchanged."""
    try:
        answer = json.loads(body)
    except ValueError:
        return body
    if not isinstance(answer, dict):
        return body
    changed = False
    for field in ("signedUploadUrl", "signed_upload_url"):
        url = answer.get(field)
        if not isinstance(url, str) or "?" not in url:
            continue
        base, _, query = url.partition("?")
        params = []
        for param in query.split("&"):
            name, eq, value = param.partition("=")
            params.append(name + eq + value.replace("=", "%3D"))
        escaped = base + "?" + "&".join(params)
        if escaped != url:
            answer[field] = escaped
            changed = True
    return json.dumps(answer).encode() if changed else body


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


def _holder(token_sha256: str) -> str:
    """A job's short name in signed URLs and per-job counts."""
    return token_sha256[:16]


def _field(body: dict[str, Any], *names: str) -> Any:
    """A field by its proto name or its JSON name."""
    return next((body[name] for name in names if name in body), None)


def _string(body: dict[str, Any], *names: str) -> str:
    value = _field(body, *names)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Refused(400, f"{names[0]} must be a string")
    return value


def _int_or_none(body: dict[str, Any], *names: str) -> int | None:
    """An integer field (int64 comes as a JSON string in proto JSON)."""
    value = _field(body, *names)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise Refused(400, f"{names[0]} must be a number")
    try:
        return int(value)
    except ValueError:
        raise Refused(400, f"{names[0]} must be a number, not {value!r}") from None


def _block_list(data: bytes) -> list[str]:
    """The block ids of a Put Block List body (`Latest`, `Committed`, `Uncommitted`), in order."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError as err:
        raise Refused(400, f"malformed block list: {err}") from None
    return [element.text or "" for element in root if element.tag in ("Latest", "Committed", "Uncommitted")]
