"""What the doubles serve validates strictly (no unknown fields, right types) against the
Kubernetes 1.32 OpenAPI schemas shipped with kubernetes-validate: Pods in every state the
kubelet double reports, Nodes (also lost), Secrets, Namespaces, the CRD, Events, lists."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import kubernetes_validate
from kubernetes import client

from dynrunner.doubles.kubernetes.images import Image
from tests.fixtures.kubernetes import api_client, wait_for

VERSION = "1.32"


def served(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def validate(obj: dict[str, Any], api_version: str = "v1", kind: str = "") -> None:
    obj = {**obj}
    obj.setdefault("apiVersion", api_version)
    obj.setdefault("kind", kind)
    kubernetes_validate.validate(obj, VERSION, strict=True)


def test_served_objects_validate_against_the_kubernetes_schemas(kube_cluster_factory):
    images = {"sh:1": Image(entrypoint=("/bin/sh", "-c")), "denied:1": Image(pull_error="unauthorized")}
    with (
        kube_cluster_factory(images=images, node_monitor_grace=0.1, eviction_seconds=0.1) as cluster,
        api_client(cluster.api) as api,
    ):
        v1 = client.CoreV1Api(api)
        base = f"{cluster.api.url}/api/v1/namespaces/default"
        v1.create_namespaced_secret("default", {"metadata": {"name": "s"}, "stringData": {"k": "v"}})

        def pod(name: str, image: str = "sh:1", script: str = "true", **spec: Any) -> None:
            container = {"name": "c", "image": image, "args": [script], "resources": {"requests": {"cpu": "100m"}}}
            v1.create_namespaced_pod(
                "default",
                {"metadata": {"name": name}, "spec": {"restartPolicy": "Never", "containers": [container], **spec}},
            )

        pod("done")
        pod("failed", script="exit 3")
        pod("running", script="sleep 30")
        pod("oom", script="sleep 30")
        pod("pulling", image="denied:1")
        pod("unschedulable", nodeSelector={"disk": "ssd"})
        for name, phase in (("done", "Succeeded"), ("failed", "Failed"), ("running", "Running"), ("oom", "Running")):
            wait_for(lambda n=name, p=phase: v1.read_namespaced_pod(n, "default").status.phase == p)
        cluster.oom_kill("default", "oom")
        wait_for(lambda: v1.read_namespaced_pod("oom", "default").status.phase == "Failed")
        wait_for(
            lambda: (v1.read_namespaced_pod("pulling", "default").status.container_statuses or [None])[0] is not None
        )
        wait_for(lambda: v1.read_namespaced_pod("unschedulable", "default").status.conditions)
        for name in ("done", "failed", "running", "oom", "pulling", "unschedulable"):
            validate(served(f"{base}/pods/{name}"), kind="Pod")
        validate(served(f"{base}/secrets/s"), kind="Secret")
        validate(served(f"{cluster.api.url}/api/v1/namespaces/default"), kind="Namespace")
        validate(served(f"{base}/pods"), kind="PodList")
        for event in served(f"{base}/events")["items"]:
            validate(event, kind="Event")
        crd = served(
            f"{cluster.api.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/clusterstaticentries.spire.spiffe.io"
        )
        validate(crd, "apiextensions.k8s.io/v1", "CustomResourceDefinition")
        cluster.lose_node("node-a")
        wait_for(lambda: v1.read_namespaced_pod("running", "default").metadata.deletion_timestamp)
        validate(served(f"{cluster.api.url}/api/v1/nodes/node-a"), kind="Node")
        validate(served(f"{base}/pods/running"), kind="Pod")
