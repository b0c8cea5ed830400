"""A job's `container:` as the `job` container of its Pod: the agent's init container and
volume, the job container beside the executor (with services, credentials, volumes, options
and identity), what fails the job before any object is made, and the pod template's merge."""

from __future__ import annotations

import base64
import json
from typing import Any

import kubernetes_validate
import pytest

from dynrunner.controller.backends.kubernetes import builders, services
from tests.fixtures.kubernetes_backend import IMAGE, claimed, settings


def workflow(container_yaml: str, services_yaml: str = "") -> str:
    return (
        "name: ci\non: push\njobs:\n  build:\n    runs-on: pod\n    container:\n"
        + container_yaml
        + (f"    services:\n{services_yaml}" if services_yaml else "")
        + "    steps:\n      - run: node --version\n"
    )


def pod_of(container_yaml: str, services_yaml: str = "", **backend: Any) -> dict[str, Any]:
    pod = builders.pod(claimed(workflow=workflow(container_yaml, services_yaml)), settings(**backend))
    kubernetes_validate.validate(pod, "1.32", strict=True)
    return pod


def named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(item for item in items if item["name"] == name)


def test_the_job_container_runs_the_agent_beside_the_executor() -> None:
    pod = pod_of("      image: node:20\n      env: {NODE_ENV: test}\n")
    spec = pod["spec"]
    assert [c["name"] for c in spec["containers"]] == ["executor", "job"]
    executor, job = spec["containers"]
    assert job == {
        "name": "job",
        "image": "node:20",
        "command": ["/__dynrunner/dynrunner-agent", "/__dynrunner/agent.sock"],
        "env": [{"name": "NODE_ENV", "value": "test"}],
        "volumeMounts": [
            {"name": "dynrunner-agent", "mountPath": "/__dynrunner"},
            {"name": "workspace", "mountPath": "/workspace"},
            {"name": "spiffe-workload-api", "mountPath": "/spiffe-workload-api", "readOnly": True},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
            "capabilities": {"drop": ["ALL"]},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    assert spec["initContainers"] == [
        {
            "name": "dynrunner-agent-install",
            "image": IMAGE,
            "command": ["dynrunner-executor", "stage-agent", "/__dynrunner"],
            "volumeMounts": [{"name": "dynrunner-agent", "mountPath": "/__dynrunner"}],
            "securityContext": executor["securityContext"],
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
    ]
    assert {"name": "dynrunner-agent", "emptyDir": {}} in spec["volumes"]
    assert {"name": "dynrunner-agent", "mountPath": "/__dynrunner"} in executor["volumeMounts"]
    env = {e["name"]: e["value"] for e in executor["env"]}
    assert env["DYNRUNNER_JOB_CONTAINER_SOCKET"] == "/__dynrunner/agent.sock"
    assert env["DYNRUNNER_JOB_CONTAINER_NODE"] == "/__dynrunner/node/bin/node"
    assert "DYNRUNNER_SERVICES_PROVIDED" not in env
    assert executor["args"] == ["run", "--assignment", "/var/run/dynrunner/assignment.pb"]
    assert spec["automountServiceAccountToken"] is False
    assert "imagePullSecrets" not in spec and "hostAliases" not in spec


def test_a_string_container_and_the_pools_executor_settings() -> None:
    resources = {"limits": {"memory": "4Gi"}}
    pod = builders.pod(
        claimed(workflow=workflow("").replace("container:\n", "container: alpine:3\n")),
        settings(
            image_pull_policy="Always", resources=resources, executor_command=["/opt/bin/executor"], identity=False
        ),
    )
    install = pod["spec"]["initContainers"][0]
    assert install["command"] == ["/opt/bin/executor", "stage-agent", "/__dynrunner"]
    assert (install["imagePullPolicy"], install["resources"]) == ("Always", resources)
    job = named(pod["spec"]["containers"], "job")
    assert job["image"] == "alpine:3"
    assert [m["name"] for m in job["volumeMounts"]] == ["dynrunner-agent", "workspace"]  # no identity


def test_with_services_the_agent_is_installed_before_the_sidecars_start() -> None:
    pod = pod_of("      image: node:20\n", "      redis:\n        image: redis:7\n        ports: ['6379']\n")
    spec = pod["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["dynrunner-agent-install", "redis"]
    assert spec["initContainers"][1]["restartPolicy"] == "Always"
    assert spec["hostAliases"] == [{"ip": "127.0.0.1", "hostnames": ["redis"]}]
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert env["DYNRUNNER_SERVICES_PROVIDED"] == "redis"
    assert env["DYNRUNNER_JOB_CONTAINER_SOCKET"] == "/__dynrunner/agent.sock"


def test_options_of_the_job_container() -> None:
    job = named(
        pod_of(
            "      image: node:20\n      ports: ['8080:80']\n"
            "      options: --user 1001:1001 --cpus 1.5 -m 1g --env CI_MODE=pod -e EMPTY=\n"
        )["spec"]["containers"],
        "job",
    )
    assert job["securityContext"]["runAsUser"] == 1001 and job["securityContext"]["runAsGroup"] == 1001
    assert job["resources"] == {
        "limits": {"cpu": "1500m", "memory": "1Gi"},
        "requests": {"cpu": "1500m", "memory": "1Gi"},
    }
    assert job["env"] == [{"name": "CI_MODE", "value": "pod"}, {"name": "EMPTY", "value": ""}]
    assert job["ports"] == [{"containerPort": 80, "protocol": "TCP"}]


def test_baseline_lets_the_job_image_run_as_root_without_privilege() -> None:
    job = named(pod_of("      image: ubuntu:24.04\n", service_pod_security="baseline")["spec"]["containers"], "job")
    assert job["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "runAsNonRoot": False,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_named_volumes_are_empty_dirs_shared_with_the_services_that_name_them() -> None:
    pod = pod_of(
        "      image: node:20\n      volumes: ['cache:/cache', 'My_Data:/data:ro']\n",
        "      db:\n        image: postgres:16\n        volumes: ['My_Data:/var/lib/postgresql/data']\n",
    )
    spec = pod["spec"]
    data = services.pod_volume_name("My_Data")
    assert data.startswith("vol-my-data-") and len(data) <= 63
    assert [v for v in spec["volumes"] if v["name"].startswith("vol-")] == [
        {"name": "vol-cache", "emptyDir": {}},
        {"name": data, "emptyDir": {}},
    ]
    job = named(spec["containers"], "job")
    assert job["volumeMounts"][-2:] == [
        {"name": "vol-cache", "mountPath": "/cache"},
        {"name": data, "mountPath": "/data", "readOnly": True},
    ]
    db = named(spec["initContainers"], "db")
    assert db["volumeMounts"] == [{"name": data, "mountPath": "/var/lib/postgresql/data"}]
    assert services.pod_volume_name("my-data") != data  # distinct names stay distinct


def test_credentials_of_the_job_container_join_the_pull_secret() -> None:
    text = workflow(
        "      image: registry.example.com/team/builder:1\n      credentials: {username: ci, password: s3cret}\n",
        "      cache:\n        image: ghcr.io/team/redis:7\n        credentials: {username: bot, password: hunter2}\n",
    )
    assignment = claimed(workflow=text)
    found = builders.job_containers(assignment)
    pod = builders.pod(assignment, settings(), containers=found)
    name = pod["metadata"]["name"]
    assert pod["spec"]["imagePullSecrets"] == [{"name": f"{name}-pull"}]
    secret = services.pull_secret(found.all, name=name, namespace="ci-jobs", labels={})
    assert secret is not None and secret["metadata"]["name"] == f"{name}-pull"
    auths = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))["auths"]
    assert sorted(auths) == ["ghcr.io", "registry.example.com"]
    assert (auths["registry.example.com"]["username"], auths["registry.example.com"]["password"]) == ("ci", "s3cret")


def test_a_job_without_container_has_no_agent() -> None:
    spec = builders.pod(claimed(), settings())["spec"]
    assert [c["name"] for c in spec["containers"]] == ["executor"]
    assert "initContainers" not in spec
    assert all(v["name"] != "dynrunner-agent" for v in spec["volumes"])
    assert all(not e["name"].startswith("DYNRUNNER_JOB_CONTAINER") for e in spec["containers"][0]["env"])


def test_an_empty_image_means_no_job_container() -> None:
    found = builders.job_containers(claimed(workflow=workflow("      image: ''\n")))
    assert found.job is None


@pytest.mark.parametrize(
    ("container_yaml", "message"),
    [
        ("      image: node:20\n      options: --workdir /src\n", "`--workdir` is not supported for the job container"),
        ("      image: node:20\n      options: --entrypoint /bin/bash\n", "its command is the runner's agent"),
        ("      image: node:20\n      options: --health-cmd true\n", "health options are for services"),
        ("      image: node:20\n      options: --privileged\n", "`--privileged` is not supported in `options`"),
        (
            "      image: node:${{ env.NODE }}\n",
            "`container`: `jobs.<job_id>.container`: node:${{ env.NODE }}: Unrecognized named-value: 'env'",
        ),
        ("      image: node:20\n      env: {A: '${{ job.status }}'}\n", "builds the job's containers before the job"),
        ("      image: node:20\n      volumes: ['/srv:/srv']\n", "only named volumes are mounted"),
        ("      image: node:20\n      volumes: ['ws:/workspace']\n", "would overlap /workspace"),
        ("      image: node:20\n      volumes: ['x:/__dynrunner/x']\n", "would overlap /__dynrunner"),
        ("      image: node:20\n      volumes: ['x:/']\n", "would overlap"),
        ("      image: node:20\n      options: --user node\n", "`container`: `--user node`: in Pod pools"),
        ("      image: node:20\n      options: --user 0:0\n", "`container`: `--user 0:0` is root"),
        ("      image: node:20\n      options: --cpus none\n", "`container`: `--cpus none`"),
        ("      image: node:20\n      ports: ['http']\n", "`container`: port 'http' is not a port number"),
    ],
)
def test_a_job_container_that_cannot_run_fails_before_the_pod_exists(container_yaml: str, message: str) -> None:
    with pytest.raises(services.JobContainerError) as raised:
        pod_of(container_yaml)
    assert message in str(raised.value)
    assert raised.value.key == "container"


def test_two_logins_for_one_registry_are_refused() -> None:
    text = workflow(
        "      image: ghcr.io/team/builder:1\n      credentials: {username: ci, password: a}\n",
        "      cache:\n        image: ghcr.io/team/redis:7\n        credentials: {username: bot, password: b}\n",
    )
    with pytest.raises(services.JobContainerError) as raised:
        builders.pod(claimed(workflow=text), settings())
    assert "`container` and service `cache` give different `credentials` for the registry ghcr.io" in str(raised.value)
    two_services = (
        "      a:\n        image: ghcr.io/team/a:1\n        credentials: {username: x, password: a}\n"
        "      b:\n        image: ghcr.io/team/b:1\n        credentials: {username: y, password: b}\n"
    )
    with pytest.raises(services.ServicesError) as raised:
        builders.pod(claimed(workflow=workflow("      image: node:20\n", two_services)), settings())
    assert raised.value.key == "services" and "service `a` and service `b` give different" in str(raised.value)


def test_root_is_allowed_as_a_user_in_a_baseline_pool() -> None:
    pod = pod_of("      image: node:20\n      options: --user 0\n", service_pod_security="baseline")
    job = named(pod["spec"]["containers"], "job")
    assert job["securityContext"]["runAsUser"] == 0


def test_a_template_tunes_the_job_container_but_cannot_break_it() -> None:
    template = {
        "spec": {
            "containers": [
                {"name": "docker", "image": "docker:27-dind"},
                {
                    "name": "job",
                    "command": ["/bin/sh"],
                    "args": ["-c", "sleep 1d"],
                    "resources": {"limits": {"memory": "2Gi"}},
                    "volumeMounts": [{"name": "other", "mountPath": "/__dynrunner"}],
                },
                {"name": "executor", "env": [{"name": "DYNRUNNER_JOB_CONTAINER_SOCKET", "value": "/tmp/x"}]},
            ],
            "initContainers": [{"name": "setup", "image": "busybox", "command": ["true"]}],
            "volumes": [{"name": "dynrunner-agent", "hostPath": {"path": "/srv"}}],
        }
    }
    pod = builders.pod(claimed(workflow=workflow("      image: node:20\n")), settings(pod_template=template))
    kubernetes_validate.validate(pod, "1.32", strict=True)
    spec = pod["spec"]
    assert [c["name"] for c in spec["containers"]] == ["executor", "job", "docker"]
    job = spec["containers"][1]
    assert job["command"] == ["/__dynrunner/dynrunner-agent", "/__dynrunner/agent.sock"] and "args" not in job
    assert job["resources"] == {"limits": {"memory": "2Gi"}}
    assert job["volumeMounts"][0] == {"name": "dynrunner-agent", "mountPath": "/__dynrunner"}
    assert all(m["mountPath"] != "/__dynrunner" for m in job["volumeMounts"][1:])
    assert [c["name"] for c in spec["initContainers"]] == ["dynrunner-agent-install", "setup"]
    assert named(spec["volumes"], "dynrunner-agent") == {"name": "dynrunner-agent", "emptyDir": {}}
    env = [e for e in spec["containers"][0]["env"] if e["name"] == "DYNRUNNER_JOB_CONTAINER_SOCKET"]
    assert env == [{"name": "DYNRUNNER_JOB_CONTAINER_SOCKET", "value": "/__dynrunner/agent.sock"}]


def test_a_template_job_entry_without_an_image_only_tunes_job_containers() -> None:
    template = {"spec": {"containers": [{"name": "job", "resources": {"limits": {"memory": "2Gi"}}}]}}
    plain = builders.pod(claimed(), settings(pod_template=template))
    assert [c["name"] for c in plain["spec"]["containers"]] == ["executor"]
    kubernetes_validate.validate(plain, "1.32", strict=True)
    with_job = builders.pod(claimed(workflow=workflow("      image: node:20\n")), settings(pod_template=template))
    assert named(with_job["spec"]["containers"], "job")["resources"] == {"limits": {"memory": "2Gi"}}


def test_the_executors_mounts_keep_their_order() -> None:
    executor = pod_of("      image: node:20\n")["spec"]["containers"][0]
    assert [m["mountPath"] for m in executor["volumeMounts"]] == [
        "/var/run/dynrunner",
        "/workspace",
        "/spiffe-workload-api",
        "/__dynrunner",
    ]


def test_values_are_evaluated_and_secret_env_values_stay_out_of_the_pod() -> None:
    text = (
        "name: ci\non: push\njobs:\n  build:\n    runs-on: pod\n"
        "    strategy:\n      matrix:\n        node: ['22']\n"
        "    container:\n      image: node:${{ matrix.node }}\n"
        "      env: {TOKEN: '${{ secrets.API_KEY }}', PLAIN: '${{ matrix.node }}'}\n"
        "    steps:\n      - run: node --version\n"
    )
    assignment = claimed(workflow=text)
    found = builders.job_containers(assignment)
    pod = builders.pod(assignment, settings(), containers=found)
    kubernetes_validate.validate(pod, "1.32", strict=True)
    name = pod["metadata"]["name"]
    job = named(pod["spec"]["containers"], "job")
    assert job["image"] == "node:22"
    assert job["env"] == [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": name, "key": "env.job.TOKEN"}}},
        {"name": "PLAIN", "value": "22"},
    ]
    assert "s3cret" not in json.dumps(pod)
    assert services.secret_env(found.all) == {"env.job.TOKEN": "s3cret"}
