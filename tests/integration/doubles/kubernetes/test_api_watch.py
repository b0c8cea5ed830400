"""Watches through the official client's `watch.Watch`: replay from a resourceVersion, 410
after compaction, bookmarks, timeouts, selector transitions, dropped connections."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client import ApiException

from tests.fixtures.kubernetes import CSE, cse_body


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}


def later(fn: Any, delay: float = 0.2) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        fn()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_watch_without_resource_version_lists_then_follows(kube_client):
    v1 = client.CoreV1Api(kube_client)
    v1.create_namespaced_pod("default", pod("a"))
    writer = later(lambda: v1.delete_namespaced_pod("a", "default"))
    events = []
    for event in watch.Watch().stream(v1.list_namespaced_pod, "default", timeout_seconds=2):
        events.append((event["type"], event["object"].metadata.name))
        if event["type"] == "DELETED":
            break
    writer.join()
    assert events == [("ADDED", "a"), ("DELETED", "a")]


def test_watch_replays_from_a_resource_version_in_order(kube_client):
    v1 = client.CoreV1Api(kube_client)
    start = v1.list_namespaced_pod("default").metadata.resource_version
    v1.create_namespaced_pod("default", pod("a"))
    v1.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"x": "1"}}})
    v1.create_namespaced_pod("default", pod("b"))
    seen = [
        (e["type"], e["object"].metadata.name, int(e["object"].metadata.resource_version))
        for e in watch.Watch().stream(v1.list_namespaced_pod, "default", resource_version=start, timeout_seconds=1)
    ]
    assert [(t, n) for t, n, _ in seen] == [("ADDED", "a"), ("MODIFIED", "a"), ("ADDED", "b")]
    assert [rv for _, _, rv in seen] == sorted(rv for _, _, rv in seen)


def test_a_compacted_resource_version_is_410_expired(kube_api, kube_client):
    v1 = client.CoreV1Api(kube_client)
    start = v1.list_namespaced_pod("default").metadata.resource_version
    v1.create_namespaced_pod("default", pod("a"))
    kube_api.compact()
    with pytest.raises(ApiException) as exc:
        list(watch.Watch().stream(v1.list_namespaced_pod, "default", resource_version=start, timeout_seconds=1))
    assert exc.value.status == 410 and exc.value.reason.startswith("Expired: too old resource version")
    # The informer's answer: relist, and watch from the list's resourceVersion.
    relisted = v1.list_namespaced_pod("default")
    assert [p.metadata.name for p in relisted.items] == ["a"]
    assert (
        list(
            watch.Watch().stream(
                v1.list_namespaced_pod,
                "default",
                resource_version=relisted.metadata.resource_version,
                timeout_seconds=1,
            )
        )
        == []
    )


def test_an_open_watch_can_be_expired(kube_api, kube_client):
    v1 = client.CoreV1Api(kube_client)
    rv = v1.list_namespaced_pod("default").metadata.resource_version
    later(kube_api.expire_watches, 0.3)
    raw = v1.list_namespaced_pod("default", watch=True, resource_version=rv, timeout_seconds=3, _preload_content=False)
    lines = [line for line in raw.stream() if line.strip()]
    assert b'"type":"ERROR"' in lines[0] and b'"code":410' in lines[0] and b'"reason":"Expired"' in lines[0]


def test_bookmarks_carry_the_current_resource_version(kube_api, kube_client):
    v1 = client.CoreV1Api(kube_client)
    v1.create_namespaced_pod("default", pod("other"))
    w = watch.Watch()
    rv = v1.list_namespaced_pod("default").metadata.resource_version
    later(lambda: v1.create_namespaced_secret("default", {"metadata": {"name": "s"}}), 0.1)
    types = [
        e["type"]
        for e in w.stream(
            v1.list_namespaced_pod, "default", resource_version=rv, allow_watch_bookmarks=True, timeout_seconds=1
        )
    ]
    assert "BOOKMARK" in types and set(types) == {"BOOKMARK"}
    assert int(w.resource_version) > int(rv), "a bookmark moves the client's resourceVersion past unrelated writes"


def test_timeout_seconds_ends_the_stream(kube_client):
    v1 = client.CoreV1Api(kube_client)
    started = time.monotonic()
    assert list(watch.Watch().stream(v1.list_namespaced_pod, "default", timeout_seconds=1)) == []
    assert 0.9 <= time.monotonic() - started < 3


def test_selectors_filter_watches_and_turn_modified_into_added_or_deleted(kube_client):
    v1 = client.CoreV1Api(kube_client)
    rv = v1.list_namespaced_pod("default").metadata.resource_version
    v1.create_namespaced_pod("default", pod("a", app="x"))
    v1.create_namespaced_pod("default", pod("b", app="y"))
    v1.patch_namespaced_pod("b", "default", {"metadata": {"labels": {"app": "x"}}})
    v1.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"app": "z"}}})
    events = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(
            v1.list_namespaced_pod, "default", label_selector="app=x", resource_version=rv, timeout_seconds=1
        )
    ]
    assert events == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    by_field = [
        e["object"].metadata.name
        for e in watch.Watch().stream(
            v1.list_namespaced_pod, "default", field_selector="metadata.name=b", resource_version=rv, timeout_seconds=1
        )
    ]
    assert set(by_field) == {"b"}


def test_a_dropped_watch_breaks_the_clients_stream(kube_api, kube_client):
    v1 = client.CoreV1Api(kube_client)
    later(kube_api.drop_watches, 0.3)
    with pytest.raises(urllib3.exceptions.HTTPError):
        list(watch.Watch().stream(v1.list_namespaced_pod, "default", timeout_seconds=5))


def test_watch_of_custom_objects(kube_client):
    custom = client.CustomObjectsApi(kube_client)
    args = CSE
    rv = custom.list_cluster_custom_object(*args)["metadata"]["resourceVersion"]
    body = cse_body("e", {"spiffeID": "spiffe://td/a", "parentID": "spiffe://td/b", "selectors": ["k8s:ns:a"]})
    custom.create_cluster_custom_object(*args, body)
    custom.delete_cluster_custom_object(*args, "e")
    events = [
        (e["type"], e["object"]["metadata"]["name"])
        for e in watch.Watch().stream(custom.list_cluster_custom_object, *args, resource_version=rv, timeout_seconds=1)
    ]
    assert events == [("ADDED", "e"), ("DELETED", "e")]


def test_resuming_from_the_final_bookmark_misses_no_event(kube_api_factory):
    """A watch that ends (timeoutSeconds) while events are queued for it sends them before its
    final BOOKMARK: a client resuming from that bookmark's resourceVersion misses nothing (the
    events queued at the deadline were skipped: a few of ~10,000 objects made in 3 s)."""
    from kubernetes.watch.watch import iter_resp_lines

    from tests.fixtures.kubernetes import api_client

    with kube_api_factory() as api, api_client(api) as watcher_client:
        watcher = client.CustomObjectsApi(watcher_client)
        listed = watcher.list_cluster_custom_object(*CSE, _preload_content=False)
        version = json.loads(listed.data)["metadata"]["resourceVersion"]
        stop, made, seen = threading.Event(), [], set()

        def write(prefix: str) -> None:
            with api_client(api) as own:
                mine = client.CustomObjectsApi(own)
                while not stop.is_set():
                    name = f"{prefix}{len(made)}"
                    mine.create_cluster_custom_object(*CSE, cse_body(name))
                    made.append(name)

        def follow(seconds: float, bookmarks: bool) -> None:
            nonlocal version
            response = watcher.list_cluster_custom_object(
                *CSE,
                watch=True,
                resource_version=version,
                timeout_seconds=seconds,
                allow_watch_bookmarks=bookmarks,
                _preload_content=False,
            )
            for line in iter_resp_lines(response):
                if line:
                    event = json.loads(line)
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] == "ADDED":
                        seen.add(event["object"]["metadata"]["name"])
            response.release_conn()

        threads = [threading.Thread(target=write, args=(prefix,)) for prefix in "ab"]
        for thread in threads:
            thread.start()
        # At least 3 s and 1,000 objects: a loaded machine makes fewer in 3 s (the check below
        # needs many watches ending while events are queued); at most a minute.
        started = time.monotonic()
        while time.monotonic() < started + 3 or (len(made) < 1000 and time.monotonic() < started + 60):
            follow(1, True)
        stop.set()
        for thread in threads:
            thread.join()
        follow(1, False)
    assert len(made) >= 1000 and set(made) - seen == set()
