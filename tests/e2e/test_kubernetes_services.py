"""End to end on the kubernetes backend, `services:`: the controller makes each service a
native sidecar of the job's Pod; the kubelet double runs it (the image `redis:7` is a small
Python server, tests/fixtures/redis_like.py) with its startup probe before the executor, so the
first step reaches it; an unhealthy service fails the job naming it; `${{ }}` in its values is
evaluated by the controller, a secret reaching the service through a secretKeyRef, never in the
Pod spec; nothing is left."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.kubernetes.cluster import Cluster
from dynrunner.doubles.kubernetes.images import Image
from tests.fixtures import redis_like
from tests.fixtures.harness import first_job_log, in_process, wait_run_done
from tests.fixtures.kubernetes_backend import (
    ObjectLog,
    all_reaped,
    executor_cluster_options,
    kube_controller_config,
)

PROBE = f"python {redis_like.__file__} probe {{port}}"


@pytest.fixture
def services_cluster(kube_cluster_factory: Any, tmp_path: Path, service_port: int) -> Iterator[Cluster]:
    """The executor cluster, plus `redis:7`: a server that listens on `service_port` after 1.5 s."""
    options = executor_cluster_options(tmp_path)
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    server = Image(entrypoint=(sys.executable, redis_like.__file__, str(service_port), "1.5"), env={"PATH": path})
    options["images"] = {**options["images"], "redis:7": server}
    with kube_cluster_factory(**options) as cluster:
        yield cluster


def workflow(port: int, health: str) -> str:
    return f"""
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    services:
      redis:
        image: redis:7
        ports: ['{port}']
        options: >-
          --health-cmd "{health}" --health-interval 1s --health-retries 10 --user 1000
    steps:
      - run: |
          python - <<'PY'
          import socket
          with socket.create_connection(("localhost", {port}), 2) as s:
              s.sendall(b"PING\\r\\n")
              print("service answered", s.recv(64).decode().strip())
          PY
      - run: echo "port ${{{{ job.services.redis.ports['{port}'] }}}}"
"""


async def test_a_step_reaches_a_healthy_service_started_before_it(
    gitea: GiteaDouble, nats_url: str, services_cluster: Cluster, tmp_path: Path, service_port: int
) -> None:
    async with in_process(kube_controller_config(gitea, nats_url, services_cluster, tmp_path)) as running:
        run = gitea.submit("acme/app", workflow(service_port, PROBE.format(port=service_port)))
        done = await wait_run_done(gitea, run.id, within=90)
        text = first_job_log(gitea, run.id)
        assert done.status == "success", text
        assert "service answered +PONG" in text, text
        assert f"port {service_port}" in text, text
        assert "service redis started" in text, text
        await all_reaped(services_cluster, running)


async def test_an_unhealthy_service_fails_the_job_naming_it(
    gitea: GiteaDouble, nats_url: str, services_cluster: Cluster, tmp_path: Path, service_port: int
) -> None:
    async with in_process(kube_controller_config(gitea, nats_url, services_cluster, tmp_path)) as running:
        run = gitea.submit("acme/app", workflow(service_port, "echo not ready; exit 1"))
        done = await wait_run_done(gitea, run.id, within=90)
        text = first_job_log(gitea, run.id)
        assert done.status == "failure", text
        assert "Service 'redis' is unhealthy: its startup probe (`--health-cmd`) kept failing" in text, text
        assert "Startup probe failed: not ready" in text, text
        assert "last lines of service 'redis' output:\n[dynrunner] Ready to accept connections" in text, text
        assert "service answered" not in text, text
        await all_reaped(services_cluster, running)


async def test_two_services_on_one_port_fail_the_job_before_any_pod(
    gitea: GiteaDouble, nats_url: str, services_cluster: Cluster, tmp_path: Path, service_port: int
) -> None:
    clash = workflow(service_port, "true").replace(
        "    steps:", f"      cache:\n        image: redis:7\n        ports: ['{service_port}']\n    steps:", 1
    )
    with ObjectLog(services_cluster.api) as seen:
        async with in_process(kube_controller_config(gitea, nats_url, services_cluster, tmp_path)) as running:
            run = gitea.submit("acme/app", clash)
            done = await wait_run_done(gitea, run.id, within=60)
            text = first_job_log(gitea, run.id)
            assert done.status == "failure", text
            assert "the job failed: The job's `services:` cannot run in this pool: services `" in text, text
            assert f"both listen on port {service_port}" in text and "`cache`" in text and "`redis`" in text, text
            await all_reaped(services_cluster, running)
    assert seen.pods == {}


def evaluated_workflow(port: int) -> str:
    """A matrix job whose service's image, env and credentials-free values use `${{ }}`; its
    startup probe passes only when the secret reached the service (by its length: the secret's
    text must not be in the Pod spec, not even in the probe)."""
    probe = PROBE.format(port=port)
    return f"""
on: push
jobs:
  build:
    runs-on: [self-hosted, local]
    strategy:
      matrix:
        v: ['7']
    services:
      redis:
        image: redis:${{{{ matrix.v }}}}
        ports: ['{port}']
        env:
          REDIS_PASSWORD: ${{{{ secrets.REDIS_PW }}}}
          REDIS_USER: ${{{{ github.actor }}}}
        options: >-
          --health-cmd "test ${{#REDIS_PASSWORD}} = 14 && test $REDIS_USER = alice && {probe}"
          --health-interval 1s --health-retries 10 --user 1000
    steps:
      - run: echo "reached redis:${{{{ matrix.v }}}}"
"""


async def test_service_values_are_evaluated_and_a_secret_reaches_it_outside_the_pod_spec(
    gitea: GiteaDouble, nats_url: str, services_cluster: Cluster, tmp_path: Path, service_port: int
) -> None:
    with ObjectLog(services_cluster.api) as seen:
        async with in_process(kube_controller_config(gitea, nats_url, services_cluster, tmp_path)) as running:
            run = gitea.submit(
                "acme/app", evaluated_workflow(service_port), secrets={"REDIS_PW": "pw-e2e-secret1"}, actor="alice"
            )
            done = await wait_run_done(gitea, run.id, within=90)
            text = first_job_log(gitea, run.id)
            assert done.status == "success", text
            assert "reached redis:7" in text and "service redis started" in text, text
            await all_reaped(services_cluster, running)
    versions = [pod for history in seen.pods.values() for pod in history]
    assert versions, "no Pod was seen"
    assert all("pw-e2e-secret1" not in repr(pod) for pod in versions)
    sidecar = versions[-1]["spec"]["initContainers"][0]
    assert sidecar["image"] == "redis:7"
    env = {e["name"]: e for e in sidecar["env"]}
    assert env["REDIS_USER"] == {"name": "REDIS_USER", "value": "alice"}
    ref = env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": versions[-1]["metadata"]["name"], "key": "env.redis.REDIS_PASSWORD"}
