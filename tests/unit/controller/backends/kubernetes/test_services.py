"""A job's `services:` as native sidecars of its Pod: the sidecar, its startup probe, the
host names, the pull secret, and what fails the job before any object is made."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from dynrunner.controller.backends.kubernetes import builders, services
from tests.fixtures.kubernetes_backend import claimed, settings


def workflow(services_yaml: str, extra: str = "") -> str:
    return (
        "name: ci\non: push\njobs:\n  build:\n    runs-on: pod\n"
        + extra
        + "    services:\n"
        + services_yaml
        + "    steps:\n      - run: redis-cli -h redis ping\n"
    )


REDIS = """      redis:
        image: redis:7
        ports: ['6379']
        env: {REDIS_ARGS: --save ''}
        options: >-
          --health-cmd "redis-cli ping" --health-interval 2s --health-timeout 3s --health-retries 5
          --health-start-period 4s --user 999:999 --cpus 0.5 --memory 256m
"""


def pod_of(services_yaml: str, **backend: Any) -> dict[str, Any]:
    return builders.pod(claimed(workflow=workflow(services_yaml)), settings(**backend))


def test_a_service_is_a_native_sidecar_with_a_startup_probe() -> None:
    spec = pod_of(REDIS)["spec"]
    assert spec["initContainers"] == [
        {
            "name": "redis",
            "image": "redis:7",
            "restartPolicy": "Always",
            "env": [{"name": "REDIS_ARGS", "value": "--save ''"}],
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "privileged": False,
                "runAsNonRoot": True,
                "seccompProfile": {"type": "RuntimeDefault"},
                "capabilities": {"drop": ["ALL"]},
                "runAsUser": 999,
                "runAsGroup": 999,
            },
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "ports": [{"containerPort": 6379, "protocol": "TCP"}],
            "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"cpu": "500m", "memory": "256Mi"}},
            "startupProbe": {
                "exec": {"command": ["/bin/sh", "-c", "redis-cli ping"]},
                "periodSeconds": 1,
                "timeoutSeconds": 3,
                "failureThreshold": 14,  # 4 s start period + 5 × 2 s
            },
        }
    ]
    assert spec["hostAliases"] == [{"ip": "127.0.0.1", "hostnames": ["redis"]}]
    assert "imagePullSecrets" not in spec
    assert spec["automountServiceAccountToken"] is False
    executor = spec["containers"][0]
    assert {"name": "DYNRUNNER_SERVICES_PROVIDED", "value": "redis"} in executor["env"]


def test_a_job_without_services_gets_no_sidecar() -> None:
    spec = builders.pod(claimed(), settings())["spec"]
    assert "initContainers" not in spec and "hostAliases" not in spec
    assert all(e["name"] != "DYNRUNNER_SERVICES_PROVIDED" for e in spec["containers"][0]["env"])


def test_a_job_with_container_gets_its_services_too() -> None:
    payload = workflow("      redis: redis:7\n", extra="    container: node:20\n")
    found = builders.job_containers(claimed(workflow=payload))
    assert found.job is not None and found.job.image == "node:20"
    assert [s.name for s in found.services] == ["redis"]


def test_baseline_lets_a_service_run_as_root_without_privilege() -> None:
    sidecar = pod_of("      postgres: postgres:16\n", service_pod_security="baseline")["spec"]["initContainers"][0]
    assert sidecar["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "runAsNonRoot": False,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "startupProbe" not in sidecar  # no --health-cmd: started when it runs, as on GitHub


def test_credentials_become_a_pull_secret_the_pod_names() -> None:
    services_yaml = (
        "      cache:\n        image: registry.example.com/team/redis:7\n"
        "        credentials: {username: bot, password: hunter2}\n"
    )
    specs = builders.job_containers(claimed(workflow=workflow(services_yaml))).all
    secret = services.pull_secret(specs, name="dr-x", namespace="ci-jobs", labels={"a": "b"})
    assert secret is not None
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    assert secret["metadata"]["name"] == "dr-x-pull"
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    entry = config["auths"]["registry.example.com"]
    assert (entry["username"], entry["password"]) == ("bot", "hunter2")
    assert base64.b64decode(entry["auth"]) == b"bot:hunter2"
    name = builders.pod(claimed(workflow=workflow(services_yaml)), settings())["metadata"]["name"]
    spec = pod_of(services_yaml)["spec"]
    assert spec["imagePullSecrets"] == [{"name": f"{name}-pull"}]
    assert services.registry("redis:7") == services.DOCKER_HUB
    assert services.registry("localhost:5000/redis") == "localhost:5000"


@pytest.mark.parametrize(
    ("services_yaml", "message"),
    [
        (
            "      a:\n        image: redis\n        ports: ['6379']\n      b:\n        image: valkey\n"
            "        ports: ['6380:6379']\n",
            "services `a` and `b` both listen on port 6379",
        ),
        ("      db:\n        image: postgres\n        options: --privileged\n", "`--privileged` is not supported"),
        ("      my_db: postgres\n", "service `my_db`: in Pod pools a service name is a host name"),
        ("      executor: postgres\n", "(not `executor` or `dynrunner-agent-install`)"),
        ("      dynrunner-agent-install: postgres\n", "service `dynrunner-agent-install`: in Pod pools"),
        ("      db:\n        image: postgres\n        options: --user postgres\n", "a user is numeric"),
        ("      db:\n        image: postgres:${{ secrets.V }}\n", "Unrecognized named-value: 'secrets'"),
        ("      db:\n        image: postgres\n        volumes: ['/srv:/var/lib']\n", "only named volumes are mounted"),
        ("      db:\n        image: postgres\n        volumes: ['a:/x', 'b:/x/']\n", "two volumes are mounted at /x"),
        ("      db:\n        image: postgres\n        volumes: ['a:/x:z']\n", "a mode is `ro` or `rw`"),
        ("      db:\n        image: postgres\n        options: --user 0\n", "`--user 0` is root"),
        ("      db:\n        image: postgres\n        options: --memory lots\n", "`--memory lots`"),
    ],
)
def test_services_that_cannot_run_fail_before_the_pod_exists(services_yaml: str, message: str) -> None:
    with pytest.raises(services.ServicesError) as raised:
        pod_of(services_yaml)
    assert message in str(raised.value)
