"""`dynrunner-controller render` and `rbac`: the objects validate offline against the Kubernetes
1.32 schemas (kubernetes-validate) and the ClusterStaticEntry CRD's; the RBAC rules in
docs/kubernetes.md are exactly the ones generated from the API module's declarations."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from dynrunner.controller.backends.kubernetes import permissions, rbac
from dynrunner.controller.backends.kubernetes.api import KubeApi
from dynrunner.controller.cli import main
from tests.fixtures.kubernetes_backend import IMAGE

HERE = Path(__file__).parent
DOC = Path(__file__).parents[5] / "docs" / "kubernetes.md"
SCHEMA = json.loads((HERE / "clusterstaticentry.schema.json").read_text())
TASK = """\
id: 42
context: {repository: Acme/Widgets, job: JOB, run_id: "100", run_number: "7", workflow: ci.yml}
secrets: {TOKEN: hunter2}
workflowPayload: |
  on: push
  jobs:
    JOB:
      name: Build
      runs-on: [self-hosted, pod]
      timeout-minutes: 30
      steps:
        - run: make
"""


def files(tmp_path: Path, job: str = "build", **backend: Any) -> tuple[Path, Path]:
    config = {
        "gitea": {"url": "https://gitea.example.com", "registrationToken": "a" * 40},
        "identity": {"trustDomain": "example.org", "cluster": "ci"},
        "pools": [
            {
                "name": "pod",
                "labels": ["self-hosted", "pod"],
                "backend": {"kind": "kubernetes", "namespace": "ci-jobs", "image": IMAGE, **backend},
            },
            {"name": "local", "labels": ["self-hosted", "local"]},
        ],
        "stateDir": str(tmp_path / "state"),
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "task.yaml").write_text(TASK.replace("JOB", job))
    return tmp_path / "config.yaml", tmp_path / "task.yaml"


def render(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str, **backend: Any) -> tuple[int, str, str]:
    config, task = files(tmp_path, **backend)
    code = main(["render", "--config", str(config), "--pool", "pod", "--task", str(task), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_render_prints_objects_that_validate_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = render(
        tmp_path, capsys, podTemplate={"spec": {"containers": [{"name": "docker", "image": "docker:27-dind"}]}}
    )
    assert code == 0
    secret, pod, entry = yaml.safe_load_all(out)
    for obj in (secret, pod):
        kubernetes_validate.validate(obj, "1.32", strict=True)
    jsonschema.validate(entry, SCHEMA)
    assert "hunter2" not in out and "<redacted:" in secret["data"]["assignment.pb"]
    assert pod["spec"]["activeDeadlineSeconds"] == 35 * 60 + 60
    assert entry["spec"]["spiffeID"] == "spiffe://example.org/ci/acme/widgets/build"
    assert entry["spec"]["parentID"] == "spiffe://example.org/spire/agent/k8s_psat/ci/<node-uid>"
    assert "k8s:pod-uid:<pod-uid>" in entry["spec"]["selectors"]


def test_render_without_identity_has_no_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = render(tmp_path, capsys, identity=False)
    assert code == 0
    assert [d["kind"] for d in yaml.safe_load_all(out)] == ["Secret", "Pod"]


def test_render_refuses_an_invalid_job_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, task = files(tmp_path, job="build.all")
    assert main(["render", "--config", str(config), "--pool", "pod", "--task", str(task)]) == 1
    err = capsys.readouterr().err
    assert "job id 'build.all' is not a valid job key: it must match [A-Za-z_][A-Za-z0-9_-]*" in err


def test_render_names_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, task = files(tmp_path)
    assert main(["render", "--config", str(config), "--pool", "local", "--task", str(task)]) == 1
    assert "pool local uses the local backend; render shows kubernetes pools" in capsys.readouterr().err
    assert main(["render", "--config", str(config), "--pool", "nope", "--task", str(task)]) == 1
    assert "no pool named 'nope' (pools: pod, local)" in capsys.readouterr().err
    assert main(["render", "--config", str(config), "--pool", "pod", "--task", str(tmp_path / "none.yaml")]) == 1
    assert "cannot read the task file" in capsys.readouterr().err


def test_every_api_method_declares_its_permission() -> None:
    public = [name for name in vars(KubeApi) if not name.startswith("_") and callable(vars(KubeApi)[name])]
    plumbing = {"connect", "aclose", "host"}
    undeclared = [n for n in public if n not in plumbing and not hasattr(vars(KubeApi)[n], permissions.MARK)]
    assert undeclared == []


def test_the_documented_rbac_is_the_generated_one(capsys: pytest.CaptureFixture[str]) -> None:
    text = DOC.read_text()
    block = re.search(r"<!-- rbac:begin -->\n```yaml\n(.*?)```\n<!-- rbac:end -->", text, re.S)
    assert block is not None, "docs/kubernetes.md lacks the generated RBAC block"
    assert main(["rbac", "--namespace", "ci-jobs"]) == 0
    generated = capsys.readouterr().out
    assert block.group(1) == generated, "run `dynrunner-controller rbac --namespace ci-jobs` and paste its output"
    role, _, cluster_role, _ = yaml.safe_load_all(generated)
    for obj in yaml.safe_load_all(generated):
        kubernetes_validate.validate(obj, "1.32", strict=True)
    rules = rbac.rules("ci-jobs")
    assert (role["rules"], cluster_role["rules"]) == (rules.role, rules.cluster_role)


def test_render_shows_a_job_container_and_its_pull_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, task = files(tmp_path)
    text = task.read_text().replace(
        "      steps:",
        "      container:\n        image: ghcr.io/acme/builder:1\n"
        "        credentials: {username: ci, password: pull-pass}\n      steps:",
    )
    task.write_text(text)
    assert main(["render", "--config", str(config), "--pool", "pod", "--task", str(task)]) == 0
    out = capsys.readouterr().out
    secret, pull, pod, _ = yaml.safe_load_all(out)
    for obj in (secret, pull, pod):
        kubernetes_validate.validate(obj, "1.32", strict=True)
    assert pull["metadata"]["name"] == secret["metadata"]["name"] + "-pull"
    assert "pull-pass" not in out
    assert [c["name"] for c in pod["spec"]["containers"]] == ["executor", "job"]
    task.write_text(text.replace("ghcr.io/acme/builder:1", "ghcr.io/acme/builder:1\n        options: --workdir /x"))
    assert main(["render", "--config", str(config), "--pool", "pod", "--task", str(task)]) == 1
    assert "the job's `container:` cannot run in this pool: `container`: `--workdir`" in capsys.readouterr().err
