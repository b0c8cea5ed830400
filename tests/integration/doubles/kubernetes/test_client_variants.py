"""The other parts of the official client a backend may use: the asyncio client
(`kubernetes.aio`) and the `SharedInformer`, which must resume, and relist on 410."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kubernetes import client
from kubernetes.aio import client as aclient
from kubernetes.aio import watch as awatch
from kubernetes.informer.informer import SharedInformer

from tests.fixtures.kubernetes import CSE, cse_body, wait_for


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}


async def test_the_asyncio_client(kube_api):
    async with aclient.ApiClient(aclient.Configuration(host=kube_api.url)) as api:
        v1 = aclient.CoreV1Api(api)
        created = await v1.create_namespaced_pod("default", pod("p"))
        assert created.metadata.uid
        with pytest.raises(aclient.ApiException) as exc:
            await v1.create_namespaced_pod("default", pod("p"))
        assert exc.value.status == 409
        assert (await aclient.CustomObjectsApi(api).create_cluster_custom_object(*CSE, cse_body("e")))["metadata"][
            "uid"
        ]
        seen = [
            (e["type"], e["raw_object"]["metadata"].get("name"))
            async for e in awatch.Watch().stream(
                v1.list_namespaced_pod, "default", allow_watch_bookmarks=True, timeout_seconds=1
            )
        ]
        assert seen[0] == ("ADDED", "p") and {t for t, _ in seen[1:]} == {"BOOKMARK"}


def test_the_shared_informer_follows_and_relists_after_410(kube_api, kube_client):
    v1 = client.CoreV1Api(kube_client)
    v1.create_namespaced_pod("default", pod("a"))
    informer = SharedInformer(v1.list_namespaced_pod, namespace="default")
    errors: list[Any] = []
    informer.add_event_handler("ERROR", errors.append)
    informer.start()
    try:
        wait_for(lambda: [p.metadata.name for p in informer.cache.list()] == ["a"])
        v1.create_namespaced_pod("default", pod("b"))
        wait_for(lambda: sorted(p.metadata.name for p in informer.cache.list()) == ["a", "b"])
        v1.create_namespaced_secret("default", {"metadata": {"name": "s"}})  # moves the revision past the informer's
        kube_api.compact()
        kube_api.expire_watches()
        v1.delete_namespaced_pod("a", "default")
        wait_for(lambda: [p.metadata.name for p in informer.cache.list()] == ["b"])
        assert any(getattr(e, "status", None) == 410 for e in errors)
    finally:
        # Without a resync period its watch has no timeout, and `stop()` joins a thread blocked
        # reading it: an event lets the thread see the stop (it hung 2 runs in 5 without one).
        stopper = threading.Thread(target=informer.stop)
        stopper.start()
        wakes = 0
        while stopper.is_alive():
            v1.create_namespaced_pod("default", pod(f"wake-{wakes}"))
            wakes += 1
            stopper.join(0.5)
