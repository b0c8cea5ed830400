"""The single-job workflow payload Gitea sends, parsed into the workflow model."""

from __future__ import annotations

import pytest

from dynrunner.executor.workflow import WorkflowError, parse_workflow
from dynrunner.executor.workflow.model import Step, _action_names
from dynrunner.executor.workflow.yaml12 import Scalar, load

# A payload as Gitea's jobparser writes it (modules/actions/jobparser testdata, one matrix combination).
GITEA_PAYLOAD = b"""name: test
on: push
env:
  VERSION: 1.10
  FLAG: yes
defaults:
  run:
    shell: bash
jobs:
  job1:
    name: job1 (ubuntu-20.04, 1.17)
    runs-on: ubuntu-20.04
    needs: [build, lint]
    if: ${{ always() }}
    env:
      TIME: 1:20
    defaults:
      run:
        working-directory: src
    outputs:
      answer: ${{ steps.calc.outputs.answer }}
    timeout-minutes: 30
    continue-on-error: true
    steps:
      - uses: actions/setup-go@v3
        with:
          go-version: ${{ matrix.version }}
          check-latest: true
      - id: calc
        name: Calculate
        run: uname -a && go version
        env:
          ON: on
        timeout-minutes: 5
        continue-on-error: ${{ matrix.os == 'x' }}
        if: false
    strategy:
      matrix:
        os:
          - ubuntu-20.04
        version:
          - 1.17
      job-index: 3
      job-total: 6
"""


def test_gitea_payload_parses_to_one_job() -> None:
    wf = parse_workflow(GITEA_PAYLOAD)
    job = wf.job
    assert wf.name == "test"
    assert wf.on == "push"
    assert job.key == "job1"
    assert job.name == "job1 (ubuntu-20.04, 1.17)"
    assert job.needs == ("build", "lint")
    assert job.if_ == "${{ always() }}"
    assert job.timeout_minutes == 30
    assert job.continue_on_error is True
    assert job.outputs == {"answer": "${{ steps.calc.outputs.answer }}"}
    assert wf.defaults.shell == "bash"
    assert job.defaults.working_directory == "src"
    assert job.strategy is not None
    assert job.strategy.matrix == {"os": "ubuntu-20.04", "version": 1.17}
    assert (job.strategy.job_index, job.strategy.job_total) == (3, 6)


def test_env_and_with_values_are_strings_as_written() -> None:
    """YAML 1.2 as Gitea reads it: `yes`/`on` stay strings, `1:20` is not 80, `1.10` keeps its zero."""
    wf = parse_workflow(GITEA_PAYLOAD)
    assert wf.env == {"VERSION": "1.10", "FLAG": "yes"}
    assert wf.job.env == {"TIME": "1:20"}
    uses, calc = wf.job.steps
    assert uses.with_ == {"go-version": "${{ matrix.version }}", "check-latest": "true"}
    assert calc.env == {"ON": "on"}


def test_steps_keep_their_fields_and_get_ids() -> None:
    uses, calc = parse_workflow(GITEA_PAYLOAD).job.steps
    assert (uses.index, uses.id, uses.user_id, uses.kind, uses.uses) == (0, "__0", False, "uses", "actions/setup-go@v3")
    assert (calc.id, calc.user_id, calc.kind, calc.name) == ("calc", True, "run", "Calculate")
    assert calc.run == "uname -a && go version"
    assert calc.timeout_minutes == 5
    assert calc.continue_on_error == "${{ matrix.os == 'x' }}"
    assert calc.if_ == "false"
    assert uses.display_name() == "Run actions/setup-go@v3"


def test_steps_without_an_id_get_githubs_generated_action_names() -> None:
    """`github.action`/`GITHUB_ACTION` of a step without an id: GitHub's docs name the first script
    `__run` and the second `__run_2`; actions are named after `owner/repo` (non-name characters
    become `_`), local actions `__self`, docker images after the image. (A user's id cannot
    collide: ids starting with `__` are reserved here.)"""
    steps = parse_workflow(
        _payload(
            "      - run: a\n"
            "      - uses: actions/checkout@v4\n"
            "      - id: run_2x\n        run: b\n"
            "      - id: Named\n        run: c\n"
            "      - run: d\n"
            "      - uses: actions/checkout/sub@v4\n"
            "      - uses: ./local/action\n"
            "      - uses: docker://alpine:3.20\n"
            "      - run: e\n"
        )
    ).job.steps
    assert [s.action for s in steps] == [
        "__run",
        "__actions_checkout",
        "run_2x",
        "Named",
        "__run_2",
        "__actions_checkout_2",
        "__self",
        "__alpine_3_20",
        "__run_3",
    ]
    assert [s.id for s in steps][:3] == ["__0", "__1", "run_2x"]


class _CountingSet(set[str]):
    lookups = 0

    def __contains__(self, item: object) -> bool:
        type(self).lookups += 1
        return super().__contains__(item)


def test_naming_many_unnamed_steps_looks_each_name_up_about_once() -> None:
    """20,000 `run:` steps without an id: the last is `__run_20000`, and each step's name is
    found with a bounded number of look-ups (trying `__run_2` ... `__run_k` for the k-th step
    made such a job wait ~40 s before its first step)."""
    steps = tuple(Step(index=i, id=f"__{i}", user_id=False, name=None, run="true") for i in range(20_000))
    taken = _CountingSet()
    named = _action_names(steps, taken)
    assert named[0].action == "__run" and named[1].action == "__run_2"
    assert named[-1].action == "__run_20000"
    assert len({s.action for s in named}) == 20_000
    assert _CountingSet.lookups <= 2 * len(steps)


def test_yaml_12_scalars() -> None:
    doc = load("a: on\nb: yes\nc: true\nd: 0o17\ne: 0x1F\nf: .inf\ng: ~\nh: '1'\ni: 1e3\nj: 2024-01-01\n")
    assert doc["a"] == "on" and doc["b"] == "yes" and doc["c"] is True
    assert doc["d"] == 15 and doc["e"] == 31 and doc["f"] == float("inf") and doc["g"] is None
    assert doc["h"] == "1" and doc["i"] == 1000.0 and doc["j"] == "2024-01-01"
    kept = load("v: 1.10\n", keep_text=True)
    assert kept == {"v": Scalar(1.1, "1.10")}


def test_merge_keys_and_anchors() -> None:
    doc = load("base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  y: 3\n")
    assert doc["use"] == {"x": 1, "y": 3}


def _payload(steps: str, job: str = "build", extra: str = "") -> bytes:
    return f"on: push\njobs:\n  {job}:\n    runs-on: self-hosted\n{extra}    steps:\n{steps}".encode()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"jobs: [1, 2", "not valid YAML"),
        (b"- a\n- b\n", "must be a YAML mapping"),
        (b"on: push\n", "exactly one job"),
        (b"jobs:\n  a: {steps: [{run: x}]}\n  b: {steps: [{run: y}]}\n", "exactly one job"),
        (_payload("      - name: nothing\n"), "exactly one of `run` or `uses`"),
        (_payload("      - run: a\n        uses: b\n"), "exactly one of `run` or `uses`"),
        (_payload("      - id: x\n        run: a\n      - id: x\n        run: b\n"), "repeats the step id 'x'"),
        (_payload("      - id: 1x\n        run: a\n"), "invalid id '1x'"),
        (_payload('      - id: "x\\n"\n        run: a\n'), "has the invalid id 'x"),
        (_payload("      - id: __0\n        run: a\n"), "reserved"),
        (_payload("      - id: Build\n        run: a\n      - id: build\n        run: b\n"), "ignoring case"),
        (_payload("      - run: a\n        colour: red\n"), "unknown keys: colour"),
        (_payload("      - run: [a]\n"), "step 1.run must be a string"),
        (_payload("      - run: a\n        env: [x]\n"), "step 1.env must be a mapping"),
        (_payload("      - run: a\n", extra="    strategy:\n      matrix:\n        os: [a, b]\n"), "exactly one value"),
        (b"jobs:\n  a:\n    runs-on: x\n    steps: []\n", "has no steps"),
        (b"jobs:\n  a:\n    steps: [{run: x}]\n    x: 1\n    x: 2\n", "defined twice"),
    ],
)
def test_invalid_payloads_say_why(payload: bytes, message: str) -> None:
    with pytest.raises(WorkflowError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse_workflow(payload)


def test_job_key_is_kept_for_the_engine_to_check() -> None:
    """A key outside JOB_KEY_RE parses; the engine refuses it with a message in the job log."""
    assert parse_workflow(_payload("      - run: a\n", job="1bad")).job.key == "1bad"


def test_services_container_and_reusable_calls_are_recognised() -> None:
    wf = parse_workflow(
        b"jobs:\n  a:\n    container: node:20\n    services:\n      db: {image: postgres}\n    steps: [{run: x}]\n"
    )
    assert wf.job.container == "node:20"
    assert wf.job.services == {"db": {"image": "postgres"}}
    call = parse_workflow(b"jobs:\n  a:\n    uses: ./.gitea/workflows/x.yml\n")
    assert call.job.uses == "./.gitea/workflows/x.yml" and call.job.steps == ()


def test_a_recursive_alias_is_a_workflow_error() -> None:
    payload = _payload("      - run: echo\n        env: &e\n          X: *e\n")
    with pytest.raises(WorkflowError, match="an alias refers to itself"):
        parse_workflow(payload)


def test_an_alias_bomb_is_refused_before_it_expands() -> None:
    """Gitea's YAML library refuses excessive aliasing and its payloads carry no aliases; a payload
    that does is refused here too instead of expanding into 10^9 nodes."""
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    body = "".join(f"  {line}\n" for line in levels)
    payload = f"on: push\nx:\n{body}jobs:\n  a:\n    runs-on: x\n    steps:\n      - run: echo\n".encode()
    with pytest.raises(WorkflowError, match=r"not valid YAML: .*nodes"):
        parse_workflow(payload)
