"""The HTTP surface of the API double (aiohttp): kube-apiserver's REST paths, verbs, query
parameters, status codes and Status bodies, over the Store.

Create answers 201, get/list/replace/patch 200, delete 200 with the object (pods, custom
resources) or a Status of Success (others); watches stream newline-delimited JSON events
in a chunked response, with BOOKMARKs when asked and a 410 ERROR event when the asked
resourceVersion was compacted away.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from dynrunner.doubles.kubernetes import discovery, podlogs, status
from dynrunner.doubles.kubernetes.faults import Faults
from dynrunner.doubles.kubernetes.rbac import Attributes, Authorizer
from dynrunner.doubles.kubernetes.resources import Resource
from dynrunner.doubles.kubernetes.selectors import matcher, parse_fields, parse_labels
from dynrunner.doubles.kubernetes.store import Store

DROP = object()


class Served(Protocol):
    """What the routes use of the API double (`server.ApiServer`): its store, settings and faults."""

    store: Store
    faults: Faults
    authorizer: Authorizer
    tokens: set[str] | None
    bookmark_interval: float
    default_watch_timeout: float
    pod_logs: podlogs.LogSource | None
    requests: int


def _json(body: Any, code: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(), status=code, content_type="application/json"
    )


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("1", "t", "true")


class Routes:
    def __init__(self, server: Served) -> None:
        self._server = server
        self.open_watches: set[asyncio.Queue[Any]] = set()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=8 * 1024 * 1024)
        app.router.add_get("/version", self._version)
        app.router.add_get("/version/", self._version)
        app.router.add_get("/api", self._api)
        app.router.add_get("/api/", self._api)
        app.router.add_get("/apis", self._apis)
        app.router.add_get("/apis/", self._apis)
        app.router.add_get("/api/v1", self._core_resources)
        app.router.add_get("/api/v1/", self._core_resources)
        app.router.add_get("/apis/{group}/{version}/", self._group_resources)
        app.router.add_route("*", "/api/v1/{rest:.+}", self._core)
        app.router.add_get("/apis/{group}/{version}", self._group_resources)
        app.router.add_route("*", "/apis/{group}/{version}/{rest:.+}", self._grouped)
        return app

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        server = self._server
        server.requests += 1
        try:
            if server.faults.latency:
                await asyncio.sleep(server.faults.latency)
            if server.tokens is not None:
                header = request.headers.get("Authorization", "")
                if not header.startswith("Bearer ") or header[7:] not in server.tokens:
                    raise status.unauthorized()
            fault = server.faults.pick(request.method, request.path)
            if fault is not None:
                raise fault
            return await handler(request)
        except status.ApiError as err:
            response = _json(err.body(), err.code)
            if err.details and "retryAfterSeconds" in err.details:
                response.headers["Retry-After"] = str(err.details["retryAfterSeconds"])
            return response
        except web.HTTPException:
            raise
        except json.JSONDecodeError as exc:
            return _json(status.bad_request(f"json: {exc}").body(), 400)

    async def _version(self, _: web.Request) -> web.Response:
        return _json(discovery.VERSION)

    async def _api(self, _: web.Request) -> web.Response:
        return _json(discovery.api_versions())

    async def _apis(self, _: web.Request) -> web.Response:
        return _json(discovery.api_groups(self._server.store.served()))

    async def _core_resources(self, _: web.Request) -> web.Response:
        return _json(discovery.resource_list("v1", self._server.store.served()))

    async def _group_resources(self, request: web.Request) -> web.Response:
        gv = f"{request.match_info['group']}/{request.match_info['version']}"
        listed = discovery.resource_list(gv, self._server.store.served())
        if not listed["resources"]:
            raise status.not_found_path()
        return _json(listed)

    async def _core(self, request: web.Request) -> web.StreamResponse:
        return await self._dispatch(request, "", "v1", request.match_info["rest"])

    async def _grouped(self, request: web.Request) -> web.StreamResponse:
        return await self._dispatch(
            request, request.match_info["group"], request.match_info["version"], request.match_info["rest"]
        )

    async def _dispatch(self, request: web.Request, group: str, version: str, rest: str) -> web.StreamResponse:
        parts = [p for p in rest.split("/") if p]
        namespace = ""
        if len(parts) >= 3 and parts[0] == "namespaces" and parts[2] not in ("status", "finalize"):
            namespace, parts = parts[1], parts[2:]
        plural = parts[0]
        name = parts[1] if len(parts) > 1 else ""
        sub = parts[2] if len(parts) > 2 else ""
        store = self._server.store
        res = store.resource(group, version, plural)
        if res is None or len(parts) > 3 or (sub and sub not in res.subresources):
            raise status.not_found_path()
        if namespace and not res.namespaced:
            raise status.not_found_path()
        query = request.query
        method = request.method
        if method == "GET":
            verb = ("watch" if _flag(query.get("watch")) else "list") if not name else "get"
        else:
            verb = {
                "POST": "create",
                "PUT": "update",
                "PATCH": "patch",
                "DELETE": "delete" if name else "deletecollection",
            }.get(method, "")
        if not verb or verb not in res.verbs or (method == "POST" and name):
            raise status.method_not_supported(res, verb or method.lower())
        self._authorize(Attributes(verb, group, plural, sub, namespace, name), res)
        if sub == "log":
            if verb != "get":
                raise status.method_not_supported(res, verb)
            text = podlogs.read(store.get(res, namespace, name), query, self._server.pod_logs)
            return web.Response(body=text, content_type="text/plain")
        if verb == "get":
            return _json(store.get(res, namespace, name))
        if verb in ("list", "watch"):
            match = matcher(parse_labels(query.get("labelSelector")), parse_fields(query.get("fieldSelector"), res))
            if verb == "watch":
                return await self._watch(request, res, namespace or None, match)
            return self._list(res, namespace or None, match, query)
        body = await request.json() if request.can_read_body else {}
        if verb == "create":
            if res.plural == "selfsubjectaccessreviews":
                return _json(self._server.authorizer.review(body), 201)
            return _json(store.create(res, namespace, body), 201)
        if verb == "update":
            if res.custom and not (body.get("metadata") or {}).get("resourceVersion"):
                # Custom resources refuse unconditional updates (customresource strategy).
                cause = (
                    "FieldValueInvalid",
                    "metadata.resourceVersion",
                    "Invalid value: 0x0: must be specified for an update",
                )
                raise status.invalid(res, name, [cause])
            return _json(store.update(res, namespace, name, body, sub))
        if verb == "patch":
            return _json(store.patch(res, namespace, name, request.content_type, body, sub))
        if verb == "deletecollection":
            match = matcher(parse_labels(query.get("labelSelector")), parse_fields(query.get("fieldSelector"), res))
            items, _ = store.list_objects(res, namespace or None, match)
            for item in items:
                store.delete(res, item["metadata"].get("namespace", ""), item["metadata"]["name"], body or {})
            return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"})
        options = dict(body or {})
        for key in ("gracePeriodSeconds", "propagationPolicy", "orphanDependents"):
            if key in query:
                options[key] = (
                    int(query[key])
                    if key == "gracePeriodSeconds"
                    else (_flag(query[key]) if key == "orphanDependents" else query[key])
                )
        obj, _ = store.delete(res, namespace, name, options)
        if res.returns_deleted_object:
            return _json(obj)
        details: dict[str, Any] = {"name": name, "kind": res.plural, "uid": obj["metadata"]["uid"]}
        if res.group:
            details["group"] = res.group
        return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})

    def _authorize(self, attrs: Attributes, res: Resource) -> None:
        authorizer = self._server.authorizer
        if not authorizer.allowed(attrs):
            raise status.forbidden(res.group_resource, attrs.name, authorizer.denial(attrs), res.group, res.plural)

    def _list(self, res: Resource, namespace: str | None, match: Callable[[Any], bool], query: Any) -> web.Response:
        items, revision = self._server.store.list_objects(res, namespace, match)
        meta: dict[str, Any] = {"resourceVersion": str(revision)}
        limit = int(query.get("limit") or 0)
        start = 0
        if query.get("continue"):
            try:
                cont = json.loads(bytes.fromhex(query["continue"]).decode())
                start, meta["resourceVersion"] = int(cont["start"]), cont["rv"]
            except (ValueError, KeyError) as exc:
                raise status.bad_request(f"continue key is not valid: {exc}") from exc
        if limit:
            remaining = len(items) - start - limit
            if remaining > 0:
                meta["continue"] = json.dumps({"start": start + limit, "rv": meta["resourceVersion"]}).encode().hex()
                meta["remainingItemCount"] = remaining
            items = items[start : start + limit]
        if not res.custom:
            for item in items:
                item.pop("apiVersion", None), item.pop("kind", None)
        return _json({"kind": res.list_kind, "apiVersion": res.api_version, "metadata": meta, "items": items})

    async def _watch(
        self, request: web.Request, res: Resource, namespace: str | None, match: Callable[[Any], bool]
    ) -> web.StreamResponse:
        query = request.query
        server = self._server
        watcher = server.store.watch(res, namespace, match, query.get("resourceVersion"))
        timeout = float(query.get("timeoutSeconds") or server.default_watch_timeout)
        bookmarks = _flag(query.get("allowWatchBookmarks"))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_bookmark = loop.time() + server.bookmark_interval
        self.open_watches.add(watcher.queue)
        try:
            while (remaining := deadline - loop.time()) > 0:
                wait = min(remaining, next_bookmark - loop.time()) if bookmarks else remaining
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), max(wait, 0))
                except TimeoutError:
                    if bookmarks and loop.time() >= next_bookmark:
                        await self._write(response, self._bookmark(res))
                        next_bookmark = loop.time() + server.bookmark_interval
                    continue
                if item is None:
                    break
                if item is DROP:
                    if request.transport is not None:
                        request.transport.abort()
                    return response
                if isinstance(item, status.ApiError):
                    await self._write(response, {"type": "ERROR", "object": item.body()})
                    continue
                await self._write(response, {"type": item.type, "object": item.obj})
            else:
                # What reached the queue before the deadline is sent first: a bookmark promises
                # that every event up to its resourceVersion was delivered (the cacher's rule).
                while not watcher.queue.empty():
                    item = watcher.queue.get_nowait()
                    if item is None or item is DROP:
                        break
                    if isinstance(item, status.ApiError):
                        await self._write(response, {"type": "ERROR", "object": item.body()})
                        continue
                    await self._write(response, {"type": item.type, "object": item.obj})
                if bookmarks:
                    await self._write(response, self._bookmark(res))
        except (ConnectionResetError, asyncio.CancelledError):
            return response
        finally:
            server.store.unwatch(watcher)
            self.open_watches.discard(watcher.queue)
        await response.write_eof()
        return response

    def _bookmark(self, res: Resource) -> dict[str, Any]:
        meta = {"resourceVersion": str(self._server.store.revision)}
        return {"type": "BOOKMARK", "object": {"kind": res.kind, "apiVersion": res.api_version, "metadata": meta}}

    @staticmethod
    async def _write(response: web.StreamResponse, event: dict[str, Any]) -> None:
        await response.write(json.dumps(event, separators=(",", ":")).encode() + b"\n")
