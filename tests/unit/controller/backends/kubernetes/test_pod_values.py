"""`${{ }}` in a Pod job's `container:` and `services:` values: the contexts GitHub allows there,
built from the assignment; values made from secrets kept out of the Pod spec; expressions that
cannot be evaluated there refused naming the key and the reason."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import pytest

from dynrunner.controller.backends.kubernetes import builders, pod_values, services
from dynrunner.proto.containers import JOB_CONTAINER, SERVICE_ENV, SERVICES, SpecError, read_job_containers
from dynrunner.proto.gitea import Need, Result
from tests.fixtures.kubernetes_backend import claimed, settings

MATRIX_JOB = """name: ci
on:
  workflow_dispatch:
    inputs:
      debug: {type: boolean}
      level: {type: number, default: 3}
env:
  DB_USER: app
  DB_PASSWORD: ${{ secrets.DB }}
jobs:
  test:
    name: test (16, node:20)
    runs-on: pod
    strategy:
      matrix:
        pg: [16]
        image: ['node:20']
      job-index: 1
      job-total: 4
    env:
      DB_NAME: ${{ format('{0}-{1}', github.run_number, matrix.pg) }}
    services:
SERVICES_HERE
    steps:
      - run: psql -h postgres
"""


def job_yaml(services_yaml: str) -> str:
    return MATRIX_JOB.replace("SERVICES_HERE\n", services_yaml)


def assignment(services_yaml: str, **task: Any) -> Any:
    defaults: dict[str, Any] = {
        "context": {
            "actor": "alice",
            "event_name": "workflow_dispatch",
            "event": {"inputs": {"debug": "true"}},
            "run_number": "42",
        },
        "secrets": {"DB": "pg-pass-123", "REGISTRY_TOKEN": "reg-token-456"},
        "variables": {"REGISTRY": "registry.example.com"},
        "needs": {"build": Need(outputs={"tag": "v1.2"}, result=Result.SUCCESS)},
    }
    return claimed(job="test", workflow=job_yaml(services_yaml), **{**defaults, **task})


def pod_and_secret(a: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = builders.pod(a, settings())
    secret = builders.secret(
        b"assignment",
        name=pod["metadata"]["name"],
        namespace="ci-jobs",
        labels={},
        env=services.secret_env(builders.job_containers(a).all),
    )
    return pod, secret


def test_the_contexts_github_allows_come_from_the_assignment() -> None:
    values = pod_values.PodValues.of(assignment("      db: postgres\n"))
    evaluate = values.evaluate
    assert evaluate(SERVICES, "postgres:${{ matrix.pg }}") == "postgres:16"
    assert evaluate(SERVICES, "${{ strategy.job-index }}/${{ strategy.job-total }}") == "1/4"
    assert evaluate(SERVICES, "${{ github.actor }}@${{ gitea.server_url }}") == "alice@https://gitea.example.com"
    image = "${{ vars.REGISTRY }}/app:${{ needs.build.outputs.tag }}"
    assert evaluate(SERVICES, image) == "registry.example.com/app:v1.2"
    assert evaluate(SERVICES, "${{ needs.build.result }}") == "success"
    # workflow_dispatch inputs are typed by their declaration, defaults filling gaps
    assert evaluate(SERVICES, "${{ inputs.debug && 'on' }} ${{ inputs.level == 3 }}") == "on true"
    # `env` (the workflow's, then the job's) where GitHub allows it: a service's `env:`
    assert evaluate(SERVICE_ENV, "${{ env.DB_USER }}/${{ env.DB_NAME }}") == "app/42-16"
    assert evaluate(SERVICE_ENV, 5432) == "5432"
    assert evaluate(SERVICE_ENV, None) == ""
    assert evaluate(SERVICE_ENV, True) == "true"


def test_a_matrix_image_for_the_job_container_and_a_service() -> None:
    evaluate = pod_values.evaluator(assignment("      db: postgres\n"))
    job, found = read_job_containers(
        "${{ matrix.image }}", {"postgres": {"image": "postgres:${{ matrix.pg }}"}}, evaluate
    )
    assert job is not None and job.image == "node:20"
    assert [spec.image for spec in found] == ["postgres:16"]
    pod = builders.pod(assignment("      postgres:\n        image: postgres:${{ matrix.pg }}\n"), settings())
    assert pod["spec"]["initContainers"][0]["image"] == "postgres:16"


def test_credentials_from_github_actor_and_a_secret_go_to_the_pull_secret_only() -> None:
    a = assignment(
        "      cache:\n        image: ${{ vars.REGISTRY }}/redis:7\n"
        "        credentials:\n          username: ${{ github.actor }}\n"
        "          password: ${{ secrets.REGISTRY_TOKEN }}\n"
    )
    specs = builders.job_containers(a).all
    pull = services.pull_secret(specs, name="dr-x", namespace="ci-jobs", labels={})
    assert pull is not None
    entry = json.loads(base64.b64decode(pull["data"][".dockerconfigjson"]))["auths"]["registry.example.com"]
    assert (entry["username"], entry["password"]) == ("alice", "reg-token-456")
    pod = builders.pod(a, settings())
    assert pod["spec"]["initContainers"][0]["image"] == "registry.example.com/redis:7"
    assert "reg-token-456" not in json.dumps(pod)


def test_env_values_made_from_secrets_are_secret_key_refs_never_in_the_pod() -> None:
    a = assignment(
        "      postgres:\n        image: postgres:16\n        env:\n"
        "          POSTGRES_USER: ${{ env.DB_USER }}\n"
        "          POSTGRES_PASSWORD: ${{ secrets.DB }}\n"
        "          DSN: postgres://app:${{ env.DB_PASSWORD }}@localhost/db\n"
        "          DERIVED: ${{ format('{0}!', secrets.DB) }}\n"
        "          TOKEN_COPY: ${{ github.token }}\n"
        "          PLAIN: literal\n"
    )
    pod, secret = pod_and_secret(a)
    name = pod["metadata"]["name"]
    env = pod["spec"]["initContainers"][0]["env"]
    assert env[0] == {"name": "POSTGRES_USER", "value": "app"}
    assert env[-1] == {"name": "PLAIN", "value": "literal"}
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "valueFrom" in e}
    assert refs == {
        "POSTGRES_PASSWORD": {"name": name, "key": "env.postgres.POSTGRES_PASSWORD"},
        "DSN": {"name": name, "key": "env.postgres.DSN"},
        "DERIVED": {"name": name, "key": "env.postgres.DERIVED"},
        "TOKEN_COPY": {"name": name, "key": "env.postgres.TOKEN_COPY"},  # github.token is the task's token
    }
    text = json.dumps(pod)
    assert "pg-pass-123" not in text and "task-token-secret" not in text
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data == {
        builders.ASSIGNMENT_KEY: "assignment",
        "env.postgres.POSTGRES_PASSWORD": "pg-pass-123",
        "env.postgres.DSN": "postgres://app:pg-pass-123@localhost/db",
        "env.postgres.DERIVED": "pg-pass-123!",
        "env.postgres.TOKEN_COPY": "task-token-secret",
    }
    # the executor mounts only the assignment's key of that Secret
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == builders.ASSIGNMENT_VOLUME)
    assert volume["secret"]["items"] == [{"key": builders.ASSIGNMENT_KEY, "path": builders.ASSIGNMENT_KEY}]


def test_a_secret_piece_taken_apart_is_still_a_secret() -> None:
    a = assignment(
        "      db:\n        image: postgres\n        env:\n          PW: ${{ fromJSON(secrets.JSON).password }}\n"
        "          VIA_ENV: ${{ env.PIECE }}\n          OTHER: ${{ env.DB_USER }}\n",
        secrets={"JSON": '{"password": "inner-pw"}'},
    )
    a = a.replace(
        task=dataclasses.replace(
            a.task,
            workflow_payload=a.task.workflow_payload.replace(
                b"  DB_USER: app\n", b"  DB_USER: app\n  PIECE: ${{ fromJSON(secrets.JSON).password }}\n"
            ),
        )
    )
    pod, secret = pod_and_secret(a)
    assert "inner-pw" not in json.dumps(pod)
    assert base64.b64decode(secret["data"]["env.db.PW"]) == b"inner-pw"
    assert base64.b64decode(secret["data"]["env.db.VIA_ENV"]) == b"inner-pw"
    assert {"name": "OTHER", "value": "app"} in pod["spec"]["initContainers"][0]["env"]


def test_an_env_name_that_is_no_secret_key_uses_its_index() -> None:
    assert pod_values.secret_env_key("db", "MY VAR", 3) == "env.db.3"
    assert pod_values.secret_env_key("db", "MY_VAR", 3) == "env.db.MY_VAR"


@pytest.mark.parametrize(
    ("services_yaml", "message"),
    [
        (
            "      db:\n        image: postgres:${{ matrix.pg\n",
            "service `db`: `jobs.<job_id>.services`: postgres:${{ matrix.pg: The expression is not closed",
        ),
        (
            "      db:\n        image: ${{ fromJSON('not json') }}\n",
            "`jobs.<job_id>.services`: ${{ fromJSON('not json') }}:",
        ),
        (
            "      db:\n        image: postgres:${{ env.PG }}\n",
            "service `db`: `jobs.<job_id>.services`: postgres:${{ env.PG }}: Unrecognized named-value: 'env'",
        ),
        (
            "      db:\n        image: postgres\n        env:\n          X: ${{ steps.a.outputs.x }}\n",
            "Unrecognized named-value: 'steps'",
        ),
        (
            "      db:\n        image: postgres\n        env:\n          X: ${{ runner.temp }}\n",
            "Unrecognized named-value: 'runner'. Located at position 1 within expression: runner.temp "
            "(GitHub allows `runner` here, but a Pod pool builds the job's containers before the job runs",
        ),
        (
            "      db:\n        image: postgres\n        ports: ['${{ secrets.PORT }}']\n",
            "Unrecognized named-value: 'secrets'",
        ),
    ],
)
def test_expressions_that_cannot_be_evaluated_there_are_refused_naming_the_key(
    services_yaml: str, message: str
) -> None:
    with pytest.raises(services.ServicesError) as raised:
        builders.pod(assignment(services_yaml), settings())
    assert message in str(raised.value)


def test_a_bad_expression_in_the_job_container_is_a_spec_error() -> None:
    evaluate = pod_values.evaluator(assignment("      db: postgres\n"))
    with pytest.raises(SpecError, match=r"^`jobs.<job_id>.container`: \$\{\{ env.IMAGE \}\}: Unrecognized"):
        evaluate(JOB_CONTAINER, "${{ env.IMAGE }}")


def test_a_broken_env_section_is_named_when_a_value_uses_env() -> None:
    a = claimed(
        workflow="on: push\nenv:\n  A: ${{ nope }}\njobs:\n  b:\n    services:\n"
        "      db:\n        image: postgres\n        env:\n          X: ${{ env.A }}\n"
    )
    with pytest.raises(services.ServicesError, match=r"uses `env`, which cannot be evaluated: `env` A: Unrecognized"):
        builders.job_containers(a)


def test_without_matrix_or_dispatch_the_contexts_are_githubs_defaults() -> None:
    a = claimed(workflow="on: push\njobs:\n  b:\n    services:\n      db: postgres\n")
    values = pod_values.PodValues.of(a)
    assert values.contexts["matrix"] == {}
    assert values.contexts["strategy"] == {"fail-fast": True, "job-index": 0, "job-total": 1, "max-parallel": 1}
    assert values.contexts["inputs"] == {}
    assert values.contexts["github"]["job"] == "build"
    assert "gitea_runtime_token" not in values.contexts["github"]


@pytest.mark.parametrize("on_key", ["on", '"on"'])
def test_dispatch_inputs_whether_on_is_quoted_or_not(on_key: str) -> None:
    """Gitea's jobparser (go-yaml) may quote `on`; YAML 1.1 reads it bare as `true`."""
    a = claimed(
        workflow=f"{on_key}:\n  workflow_dispatch:\n    inputs:\n      n: {{type: number}}\n"
        "jobs:\n  b:\n    services:\n      db: postgres\n",
        context={"event_name": "workflow_dispatch", "event": {"inputs": {"n": "2.5"}}},
    )
    assert pod_values.PodValues.of(a).contexts["inputs"] == {"n": 2.5}
