"""The one module that talks to the Kubernetes API (an import-linter contract checks it).

Requests go through the official client's `ApiClient` (its configuration from a kubeconfig
or the in-cluster service account, authentication, TLS, proxies and connection pool), with
the paths and parameters of the Kubernetes API. The generated API classes are not used:
`CoreV1Api` alone imports some 250 modules of pydantic models (+81 MiB in the controller,
more than half of its memory budget), and the controller needs none of them — objects cross
this boundary as the plain JSON dictionaries Kubernetes sends, which the builders make and
the classifier reads. Errors cross it as `KubeError`s.

The client is synchronous, so every request runs in a small thread pool of its own (never
the event loop's default executor, which long calls would starve), and each watch streams
from a thread of its own into the loop; a watch always carries `timeoutSeconds` (and a read
timeout a little longer), so its thread ends, and closing the stream interrupts a blocked
read at once. Transient failures (429, 5xx, a dropped connection) are retried a few times with
backoff (tenacity) before they reach the caller.

Every method is marked with the permission its request needs (`permissions.requires`):
that is the declaration docs/kubernetes.md's RBAC rules are generated from.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
import urllib3
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from dynrunner.controller.backends.kubernetes.identity import CSE_GROUP, CSE_PLURAL, CSE_VERSION
from dynrunner.controller.backends.kubernetes.permissions import requires

log = logging.getLogger(__name__)

WORKERS = 16
CONNECT_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 30.0
WATCH_READ_SLACK_S = 30.0
CSE_CRD = f"{CSE_PLURAL}.{CSE_GROUP}"
MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    """A request Kubernetes refused or could not answer; `status` 0 is no answer at all."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{message} ({status} {reason})" if status else message)
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def transient(self) -> bool:
        return self.status in (0, 429, 500, 502, 503, 504)


class NotFound(KubeError):
    pass


class AlreadyExists(KubeError):
    pass


class Conflict(KubeError):
    pass


class Gone(KubeError):
    """410: the resourceVersion a watch asked for is too old; list again."""


class Forbidden(KubeError):
    pass


def _error(status: int, body: str | bytes | None, fallback: str) -> KubeError:
    reason, message = fallback, fallback
    try:
        status_obj = json.loads(body or b"{}")
        reason = str(status_obj.get("reason") or fallback)
        message = str(status_obj.get("message") or fallback)
    except (ValueError, AttributeError):
        pass
    kind: type[KubeError] = KubeError
    if status == 404:
        kind = NotFound
    elif status == 409:
        kind = AlreadyExists if reason == "AlreadyExists" else Conflict
    elif status == 410:
        kind = Gone
    elif status == 403:
        kind = Forbidden
    return kind(status, reason, message)


def _translate(err: BaseException) -> BaseException:
    if isinstance(err, ApiException):
        return _error(int(err.status or 0), err.body, str(err.reason or "error"))
    if isinstance(err, urllib3.exceptions.HTTPError | OSError):
        return KubeError(0, "Unavailable", f"the Kubernetes API cannot be reached: {err}")
    return err


def _transient(err: BaseException) -> bool:
    return isinstance(err, KubeError) and err.transient


def load_client(kubeconfig: Path | None = None, context: str | None = None) -> kubernetes.client.ApiClient:
    """A client configured from `kubeconfig`, else in-cluster (a Pod's service account), else
    $KUBECONFIG or ~/.kube/config — as kubectl finds its configuration."""
    configuration = kubernetes.client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    else:
        kubernetes.config.load_kube_config(
            config_file=str(kubeconfig) if kubeconfig is not None else None,
            context=context,
            client_configuration=configuration,
        )
    configuration.connection_pool_maxsize = WORKERS + 4
    return kubernetes.client.ApiClient(configuration)


Query = dict[str, str | int | bool | None]
CORE = "/api/v1"
CSE_PATH = f"/apis/{CSE_GROUP}/{CSE_VERSION}/{CSE_PLURAL}"


class KubeApi:
    """Kubernetes requests as coroutines returning JSON dictionaries."""

    def __init__(self, client: kubernetes.client.ApiClient, *, workers: int = WORKERS, attempts: int = 4) -> None:
        self.client = client
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube-api")
        self._attempts = attempts
        self.calls: Counter[str] = Counter()
        """Requests sent, by verb and resource (a watch counts once per connection): for the
        benchmark and the tests that prove no Pod is polled."""
        self._counting = threading.Lock()

    @classmethod
    def connect(cls, kubeconfig: Path | None = None, context: str | None = None) -> KubeApi:
        return cls(load_client(kubeconfig, context))

    @property
    def requests(self) -> int:
        return sum(self.calls.values())

    @property
    def host(self) -> str:
        return str(self.client.configuration.host)

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)
        self.client.close()

    # -- plumbing ----------------------------------------------------------------------------

    def _count(self, name: str) -> None:
        with self._counting:
            self.calls[name] += 1

    def _send(
        self,
        method: str,
        path: str,
        query: Query | None,
        body: Any,
        content_type: str,
        timeout: tuple[float, float],
    ) -> Any:
        """One request through the client's ApiClient; the urllib3 response, not read yet."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        params = self.client.param_serialize(
            method=method,
            resource_path=path,
            query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.client.call_api(*params, _request_timeout=timeout).response
        if not 200 <= response.status <= 299:
            data = response.data
            response.release_conn()
            raise _error(response.status, data, str(response.reason or "error"))
        return response

    async def _call(
        self,
        name: str,
        method: str,
        path: str,
        query: Query | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """A request in the pool, its JSON answer decoded; transient errors retried."""
        timeout = (CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S)

        def blocking() -> dict[str, Any]:
            self._count(name)
            try:
                data = self._send(method, path, query, body, content_type, timeout).data
            except KubeError:
                raise
            except BaseException as err:
                raise _translate(err) from err
            return json.loads(data) if data else {}

        loop = asyncio.get_running_loop()
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._attempts),
            wait=wait_exponential_jitter(multiplier=0.2, max=2.0, jitter=0.2),
            retry=retry_if_exception(_transient),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await loop.run_in_executor(self._pool, blocking)
        raise AssertionError("unreachable")

    async def _watch(
        self, name: str, path: str, query: Query, resource_version: str, timeout_s: int
    ) -> AsyncIterator[dict[str, Any]]:
        """The events of one watch connection, from a thread of its own, until the server
        closes it (after `timeout_s`). An ERROR event is raised as a KubeError (410: Gone)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        held: list[Any] = []
        closing = threading.Event()
        query = {**query, "watch": True, "allowWatchBookmarks": True, "resourceVersion": resource_version}
        query["timeoutSeconds"] = timeout_s

        def put(kind: str, value: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens any more
                loop.call_soon_threadsafe(queue.put_nowait, (kind, value))

        def stream() -> None:
            self._count(name)
            try:
                response = self._send("GET", path, query, None, "", (CONNECT_TIMEOUT_S, timeout_s + WATCH_READ_SLACK_S))
                held.append(response)
                if closing.is_set():
                    return
                for line in iter_resp_lines(response):
                    if line:
                        put("event", json.loads(line))
            except BaseException as err:
                if not closing.is_set():
                    put("error", err if isinstance(err, KubeError) else _translate(err))
            finally:
                for response in held:
                    response.release_conn()
                put("end", None)

        thread = threading.Thread(target=stream, name=f"kube-{name.replace(' ', '-')}", daemon=True)
        thread.start()
        try:
            while True:
                kind, value = await queue.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                if value.get("type") == "ERROR":
                    status = value.get("object") or {}
                    raise _error(int(status.get("code") or 0), json.dumps(status), "watch error")
                yield value
        finally:
            closing.set()
            for response in held:
                with contextlib.suppress(Exception):
                    response.shutdown()  # wakes a read blocked in the thread

    # -- the jobs' namespace ---------------------------------------------------------------

    @requires("", "pods", "create")
    async def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("create pods", "POST", f"{CORE}/namespaces/{namespace}/pods", body=body)

    @requires("", "pods", "get")
    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._call("get pods", "GET", f"{CORE}/namespaces/{namespace}/pods/{name}")

    @requires("", "pods", "list")
    async def list_pods(self, namespace: str, label_selector: str) -> dict[str, Any]:
        path = f"{CORE}/namespaces/{namespace}/pods"
        return await self._call("list pods", "GET", path, {"labelSelector": label_selector})

    @requires("", "pods", "watch")
    def watch_pods(
        self, namespace: str, label_selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[dict[str, Any]]:
        path = f"{CORE}/namespaces/{namespace}/pods"
        return self._watch("watch pods", path, {"labelSelector": label_selector}, resource_version, timeout_s)

    @requires("", "pods", "delete")
    async def delete_pod(self, namespace: str, name: str, grace_period_s: int | None = None) -> None:
        path = f"{CORE}/namespaces/{namespace}/pods/{name}"
        await self._call("delete pods", "DELETE", path, {"gracePeriodSeconds": grace_period_s})

    @requires("", "secrets", "create")
    async def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("create secrets", "POST", f"{CORE}/namespaces/{namespace}/secrets", body=body)

    @requires("", "secrets", "get")
    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        return await self._call("get secrets", "GET", f"{CORE}/namespaces/{namespace}/secrets/{name}")

    @requires("", "secrets", "list")
    async def list_secrets(self, namespace: str, label_selector: str) -> dict[str, Any]:
        path = f"{CORE}/namespaces/{namespace}/secrets"
        return await self._call("list secrets", "GET", path, {"labelSelector": label_selector})

    @requires("", "secrets", "patch")
    async def patch_secret(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        path = f"{CORE}/namespaces/{namespace}/secrets/{name}"
        return await self._call("patch secrets", "PATCH", path, body=patch, content_type=MERGE_PATCH)

    @requires("", "secrets", "delete")
    async def delete_secret(self, namespace: str, name: str) -> None:
        await self._call("delete secrets", "DELETE", f"{CORE}/namespaces/{namespace}/secrets/{name}")

    @requires("", "events", "list")
    async def list_events(self, namespace: str, field_selector: str, limit: int | None = None) -> dict[str, Any]:
        path = f"{CORE}/namespaces/{namespace}/events"
        return await self._call("list events", "GET", path, {"fieldSelector": field_selector, "limit": limit})

    @requires("", "events", "watch")
    def watch_events(
        self, namespace: str, field_selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[dict[str, Any]]:
        path = f"{CORE}/namespaces/{namespace}/events"
        return self._watch("watch events", path, {"fieldSelector": field_selector}, resource_version, timeout_s)

    # -- cluster-wide --------------------------------------------------------------------

    @requires("", "nodes", "get", namespaced=False, identity=True)
    async def get_node(self, name: str) -> dict[str, Any]:
        return await self._call("get nodes", "GET", f"{CORE}/nodes/{name}")

    @requires(CSE_GROUP, CSE_PLURAL, "create", namespaced=False, identity=True)
    async def create_entry(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("create clusterstaticentries", "POST", CSE_PATH, body=body)

    @requires(CSE_GROUP, CSE_PLURAL, "get", namespaced=False, identity=True)
    async def get_entry(self, name: str) -> dict[str, Any]:
        return await self._call("get clusterstaticentries", "GET", f"{CSE_PATH}/{name}")

    @requires(CSE_GROUP, CSE_PLURAL, "list", namespaced=False, identity=True)
    async def list_entries(self, label_selector: str) -> dict[str, Any]:
        return await self._call("list clusterstaticentries", "GET", CSE_PATH, {"labelSelector": label_selector})

    @requires(CSE_GROUP, CSE_PLURAL, "delete", namespaced=False, identity=True)
    async def delete_entry(self, name: str) -> None:
        await self._call("delete clusterstaticentries", "DELETE", f"{CSE_PATH}/{name}")

    # -- for `check` -----------------------------------------------------------------------

    @requires("", "namespaces", "get", namespaced=False, resource_names=("{namespace}",))
    async def get_namespace(self, name: str) -> dict[str, Any]:
        return await self._call("get namespaces", "GET", f"{CORE}/namespaces/{name}")

    @requires(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "get",
        namespaced=False,
        resource_names=(CSE_CRD,),
        identity=True,
    )
    async def get_entry_definition(self) -> dict[str, Any]:
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CSE_CRD}"
        return await self._call("get customresourcedefinitions", "GET", path)

    @requires("authorization.k8s.io", "selfsubjectaccessreviews", "create", granted_by_default=True)
    async def may(self, verb: str, group: str, resource: str, namespace: str = "", name: str = "") -> tuple[bool, str]:
        """Whether Kubernetes lets this client do `verb` on `resource` (a SelfSubjectAccessReview)."""
        attributes = {"verb": verb, "group": group, "resource": resource}
        if namespace:
            attributes["namespace"] = namespace
        if name:
            attributes["name"] = name
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        review = await self._call("create selfsubjectaccessreviews", "POST", path, body=body)
        status = review.get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason") or status.get("evaluationError") or "")

    @requires("", "version", "get", namespaced=False, granted_by_default=True)
    async def server_version(self) -> str:
        info = await self._call("get version", "GET", "/version/")
        return str(info.get("gitVersion") or "unknown")
