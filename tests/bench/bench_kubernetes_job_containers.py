"""Per-job overhead of a job container and of a service in a Pod pool: claim to the first step,
against a plain Pod job. Figures are printed, never asserted.

The controller runs in this process against the Gitea double, a real nats-server and the
Kubernetes doubles (API, scheduler, kubelet, SPIRE), whose kubelet runs each Pod's containers
as local processes (tests/fixtures/pod_job_containers.py): the real executor, the real agent
staged by `dynrunner-executor stage-agent` for `container:`, and `redis:7`
(tests/fixtures/redis_like.py, ready at once) with an exec startup probe. Jobs run one at a
time, the variants round robin (a load spike on this shared machine hits each alike). The
claim is the controller's "claimed by pool" line in the job's log (its timestamp); the first
step prints `date +%s.%N` (the same clock). The kubelet double pulls in no time and starts
processes, not containers: the figures are the product's part (Pod build, SVID wait, init
container, agent start, service probe), not a real node's.

    .venv/bin/python -m tests.bench.bench_kubernetes_job_containers
    .venv/bin/python -m pytest -q -s tests/bench/bench_kubernetes_job_containers.py
DYNRUNNER_BENCH_REPEAT sets the repetitions (default 5; median, min and max reported).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from dynrunner.controller.config.model import ControllerConfig
from dynrunner.doubles.gitea import GiteaDouble
from tests.fixtures import redis_like
from tests.fixtures.harness import in_process, wait_run_done
from tests.fixtures.kubernetes_backend import kube_controller_data
from tests.fixtures.pod_job_containers import JOB_IMAGE, REDIS, job_container_cluster_options, redis_image
from tests.fixtures.ports import reserve_port

REPEAT = int(os.environ.get("DYNRUNNER_BENCH_REPEAT", "5"))
FIRST_STEP = 'echo "first step at $(date +%s.%N)"'


def workflow(*, container: bool, service: int | None) -> str:
    text = "on: push\njobs:\n  bench:\n    runs-on: [self-hosted, local]\n"
    if container:
        text += f"    container: {JOB_IMAGE}\n"
    if service is not None:
        probe = f"python {redis_like.__file__} probe {service}"
        text += (
            f"    services:\n      redis:\n        image: {REDIS}\n"
            f'        options: --health-cmd "{probe}" --health-interval 1s --health-retries 30\n'
        )
    return text + f"    steps:\n      - run: {FIRST_STEP}\n"


def claim_to_first_step(gitea: GiteaDouble, run_id: int) -> float:
    task = gitea.task(gitea.run(run_id).jobs[0].task_id)
    claimed = next(t for t, row in zip(task.log_times, task.log_rows, strict=True) if "claimed by pool" in row)
    first = next(row for row in task.log_rows if row.startswith("first step at "))
    at = datetime.fromisoformat(claimed[:26] + "+00:00").timestamp()  # 100 ns digits → µs
    return float(first.removeprefix("first step at ")) - at


async def test_claim_to_first_step_in_pods(
    gitea: GiteaDouble, nats_url: str, kube_cluster_factory: Any, tmp_path: Path
) -> None:
    port, lock = reserve_port()
    with lock:
        options = job_container_cluster_options(tmp_path, port)
        options["images"][REDIS] = redis_image(port, delay=0.0)
        variants: dict[str, dict[str, Any]] = {
            "plain Pod job": {"container": False, "service": None},
            "job container": {"container": True, "service": None},
            "job container + redis service": {"container": True, "service": port},
            "redis service, steps in the executor": {"container": False, "service": port},
        }
        figures: dict[str, dict[str, list[float]]] = {name: {"delay": [], "wall": []} for name in variants}
        with kube_cluster_factory(**options) as cluster:
            kubeconfig = cluster.api.write_kubeconfig(tmp_path / "kubeconfig")
            data = kube_controller_data(gitea.url, gitea.registration_token, nats_url, kubeconfig, tmp_path / "s")
            async with in_process(ControllerConfig.model_validate(data)):
                for _ in range(REPEAT):
                    for name, variant in variants.items():
                        started = time.monotonic()
                        run = gitea.submit("acme/bench", workflow(**variant))
                        done = await wait_run_done(gitea, run.id, within=180)
                        assert done.status == "success", gitea.task(done.jobs[0].task_id).log_rows
                        figures[name]["wall"].append(time.monotonic() - started)
                        figures[name]["delay"].append(claim_to_first_step(gitea, run.id))
    for name, f in figures.items():
        delays = f["delay"]
        print(
            f"{name}: claim to first step median {statistics.median(delays) * 1000:.0f} ms "
            f"(min {min(delays) * 1000:.0f}, max {max(delays) * 1000:.0f}); "
            f"submit to done median {statistics.median(f['wall']):.2f} s"
        )
    plain = figures["plain Pod job"]["delay"]
    for name, f in figures.items():
        if name != "plain Pod job":
            print(
                f"overhead of {name} over a plain Pod job: median "
                f"{(statistics.median(f['delay']) - statistics.median(plain)) * 1000:.0f} ms, "
                f"min-to-min {(min(f['delay']) - min(plain)) * 1000:.0f} ms"
            )


def main() -> None:
    sys.exit(pytest.main(["-q", "-s", "-p", "no:cacheprovider", __file__]))


if __name__ == "__main__":
    main()
