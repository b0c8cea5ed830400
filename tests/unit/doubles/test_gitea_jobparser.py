"""The double's jobparser against Gitea's jobparser testdata and act's matrix rules."""

from __future__ import annotations

import pytest

from dynrunner.doubles.gitea.jobparser import (
    WorkflowError,
    legacy_step_display_name,
    parse_workflow,
    runs_on_labels,
    step_display_name,
)
from dynrunner.doubles.gitea.yamlio import load

# modules/actions/jobparser/testdata/multiple_matrix.in.yaml
MULTIPLE_MATRIX = """\
name: test
jobs:
  job1:
    strategy:
      matrix:
        os: [ubuntu-22.04, ubuntu-20.04]
        version: [1.17, 1.18, 1.19]
    runs-on: ${{ matrix.os }}
    steps:
      - uses: actions/setup-go@v3
        with:
          go-version: ${{ matrix.version }}
      - run: uname -a && go version
"""

# the first document of multiple_matrix.out.yaml, minus the later-upstream job-index/job-total keys
FIRST_OUT = """\
name: test
jobs:
  job1:
    name: job1 (ubuntu-20.04, 1.17)
    runs-on: ubuntu-20.04
    steps:
      - uses: actions/setup-go@v3
        with:
          go-version: ${{ matrix.version }}
      - run: uname -a && go version
    strategy:
      matrix:
        os:
          - ubuntu-20.04
        version:
          - 1.17
"""


def names(text: str) -> list[str]:
    return [j.name for j in parse_workflow(text).jobs]


def test_matrix_combinations_are_sorted_by_name_and_narrowed() -> None:
    parsed = parse_workflow(MULTIPLE_MATRIX)
    assert [j.name for j in parsed.jobs] == [
        "job1 (ubuntu-20.04, 1.17)",
        "job1 (ubuntu-20.04, 1.18)",
        "job1 (ubuntu-20.04, 1.19)",
        "job1 (ubuntu-22.04, 1.17)",
        "job1 (ubuntu-22.04, 1.18)",
        "job1 (ubuntu-22.04, 1.19)",
    ]
    assert parsed.jobs[0].payload.decode() == FIRST_OUT
    assert [j.runs_on for j in parsed.jobs[:1]] == [("ubuntu-20.04",)]


def test_a_name_with_an_expression_is_interpolated_instead_of_suffixed() -> None:
    text = MULTIPLE_MATRIX.replace(
        "    runs-on:", "    name: test_version_${{ matrix.version }}_on_${{ matrix.os }}\n    runs-on:"
    )
    assert names(text)[0] == "test_version_1.17_on_ubuntu-20.04"


def test_matrix_values_are_formatted_like_go() -> None:
    text = "jobs:\n  j:\n    strategy:\n      matrix:\n        v: [1.0, 2.50, true, 3, 'x y']\n    steps: [{run: a}]\n"
    assert names(text) == ["j (1)", "j (2.5)", "j (3)", "j (true)", "j (x y)"]


def test_include_extends_matching_combinations_and_adds_the_rest() -> None:
    text = """
jobs:
  j:
    strategy:
      matrix:
        os: [linux, mac]
        py: ['3.11']
        include:
          - os: linux
            extra: yes
          - os: windows
            py: '3.12'
    steps: [{run: a}]
"""
    parsed = parse_workflow(text)
    # sorted by name: "(mac, 3.11)" < "(windows, 3.12)" < "(yes, linux, 3.11)"
    assert [dict(j.matrix) for j in parsed.jobs] == [
        {"os": "mac", "py": "3.11"},
        {"os": "windows", "py": "3.12"},
        {"os": "linux", "py": "3.11", "extra": "yes"},
    ]


def test_exclude_removes_combinations_and_rejects_unknown_keys() -> None:
    base = (
        "jobs:\n  j:\n    strategy:\n      matrix:\n        a: [1, 2]\n        b: [x, y]\n"
        "        exclude:\n{}    steps: [{{run: a}}]\n"
    )
    assert names(base.format("          - a: 1\n            b: y\n")) == ["j (1, x)", "j (2, x)", "j (2, y)"]
    with pytest.raises(WorkflowError, match="Matrix exclude key 'c'"):
        parse_workflow(base.format("          - c: 1\n"))


def test_only_include_makes_one_job_per_entry_and_empty_matrix_one_job() -> None:
    only = "jobs:\n  j:\n    strategy:\n      matrix:\n        include: [{k: a}, {k: b}]\n    steps: [{run: a}]\n"
    assert names(only) == ["j (a)", "j (b)"]
    empty = "jobs:\n  j:\n    strategy:\n      fail-fast: false\n    steps: [{run: a}]\n"
    [job] = parse_workflow(empty).jobs
    assert job.name == "j"
    assert 'fail-fast: "false"' in job.payload.decode()  # a Go string that reads as a bool is quoted


@pytest.mark.parametrize(
    ("node", "labels"),
    [
        ("ubuntu-latest", ("ubuntu-latest",)),
        (["self-hosted", "pod"], ("self-hosted", "pod")),
        ({"group": "g", "labels": ["a"]}, ("a", "g")),
        ({"group": "g"}, ("g",)),
        ({"labels": "solo"}, ("solo",)),
        (None, ()),
        ([], ()),
    ],
)
def test_runs_on_flattening(node: object, labels: tuple[str, ...]) -> None:
    assert runs_on_labels(node) == labels


def test_needs_as_scalar_or_list_and_unknown_needs_accepted() -> None:
    parsed = parse_workflow(
        "jobs:\n  a: {steps: [{run: a}]}\n  b: {needs: a, steps: [{run: b}]}\n  c: {needs: [a, b]}\n"
    )
    assert [j.needs for j in parsed.jobs] == [(), ("a",), ("a", "b")]
    # Gitea's jobparser does not check needs: a job needing no existing job only waits for the others
    assert parse_workflow("jobs:\n  a: {needs: ghost}\n").jobs[0].needs == ("ghost",)
    assert parse_workflow("jobs:\n  a: {needs: [[x]]}\n").jobs[0].needs == ()


def test_the_payload_keeps_giteas_job_fields_in_order_and_drops_others() -> None:
    text = """
on: [push]
defaults: {run: {shell: bash}}
permissions: read-all
jobs:
  j:
    runs-on: x
    permissions: {contents: read}
    concurrency: {group: g, cancel-in-progress: true}
    container: {image: alpine}
    services:
      db: {image: postgres, env: {PORT: 5432}, unknown: 1}
    continue-on-error: true
    timeout-minutes: 5
    if: github.ref == 'refs/heads/main'
    env: {A: 1.10}
    steps:
      - {timeout-minutes: 2, shell: bash, run: echo, continue-on-error: true, entrypoint: nope}
    outputs: {o: x}
    custom-key: dropped
"""
    [job] = parse_workflow(text).jobs
    doc = load(job.payload.decode())
    assert list(doc) == ["on", "jobs", "defaults", "permissions"]
    assert list(doc["jobs"]["j"]) == [
        "name",
        "runs-on",
        "env",
        "if",
        "steps",
        "timeout-minutes",
        "continue-on-error",
        "services",
        "container",
        "outputs",
        "concurrency",
        "permissions",
    ]
    assert doc["jobs"]["j"]["services"] == {"db": {"image": "postgres", "env": {"PORT": "5432"}}}
    assert doc["jobs"]["j"]["steps"] == [
        {"run": "echo", "shell": "bash", "continue-on-error": True, "timeout-minutes": "2"}
    ]
    assert "A: 1.10" in job.payload.decode()  # raw nodes keep their text
    assert job.has_if and job.continue_on_error


def test_step_display_names() -> None:
    assert step_display_name({"name": "Build"}) == "Build"
    assert step_display_name({"run": "\n  make all  \nmake test"}) == "Run make all"
    assert step_display_name({"uses": "actions/checkout@v4"}) == "Run actions/checkout@v4"
    assert step_display_name({"id": "s1"}) == "Run s1"
    # util.EllipsisDisplayString: 252 columns and "…"
    assert step_display_name({"name": "n" * 300}) == "n" * 252 + "…"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "jobs: []",
        "on: push",
        "- a",
        "jobs:\n  a: 3\n",
        "jobs: {a: {steps: [}",
    ],
)
def test_bad_workflows_are_explained(text: str) -> None:
    with pytest.raises(WorkflowError):
        parse_workflow(text)


def test_a_reusable_workflow_call_is_one_job_kept_as_written() -> None:
    """Gitea 1.24-1.26 keep `uses`, `with` and `secrets` (model.go `Job`, after `outputs`) and
    expand nothing: the runner runs the called workflow. No steps, no labels to match."""
    text = (
        "on: push\njobs:\n  call:\n    uses: o/r/.gitea/workflows/w.yml@v1\n"
        "    with: {b: 2, a: x}\n    secrets: inherit\n"
    )
    [job] = parse_workflow(text).jobs
    payload = job.payload.decode()
    assert job.runs_on == () and job.step_names == ()
    assert "    runs-on: []\n" in payload
    assert (
        "    uses: o/r/.gitea/workflows/w.yml@v1\n    with:\n      a: x\n      b: 2\n    secrets: inherit\n" in payload
    )


def test_yaml_on_stays_a_key_and_dicts_are_accepted() -> None:
    parsed = parse_workflow({"on": "push", "jobs": {"a": {"runs-on": "x", "steps": [{"run": "true"}]}}})
    # go-yaml quotes strings a YAML 1.1 reader would take for booleans, so `on` survives PyYAML too
    assert parsed.jobs[0].payload.decode().startswith('"on": push\n')


def payload_of(text: str) -> str:
    [job] = parse_workflow(text).jobs
    return job.payload.decode()


@pytest.mark.parametrize(
    ("runs_on", "written", "labels"),
    [
        ("[pod]", "runs-on: pod\n", ("pod",)),  # `encodeRunsOn`: one label is written as a string
        ("[self-hosted, pod]", "runs-on:\n      - self-hosted\n      - pod\n", ("self-hosted", "pod")),
        ("{group: g, labels: [a]}", "runs-on:\n      - a\n      - g\n", ("a", "g")),
        ("{labels: solo}", "runs-on: solo\n", ("solo",)),
        (None, "runs-on: []\n", ()),  # no runs-on: an empty list, which every runner matches
    ],
)
def test_runs_on_is_flattened_into_the_payload(runs_on: str | None, written: str, labels: tuple[str, ...]) -> None:
    line = f"    runs-on: {runs_on}\n" if runs_on else ""
    [job] = parse_workflow(f"jobs:\n  j:\n{line}    steps: [{{run: a}}]\n").jobs
    assert "    " + written in job.payload.decode()
    assert job.runs_on == labels


def test_matrix_scalars_are_one_value_lists_and_mappings_void_the_matrix() -> None:
    """act v1.0.8 `Matrix()`: a scalar is a one-value list; a mapping value is invalid and
    the job runs once without a matrix."""
    assert names("jobs:\n  j:\n    strategy: {matrix: {os: linux, py: [1, 2]}}\n    steps: [{run: a}]\n") == [
        "j (linux, 1)",
        "j (linux, 2)",
    ]
    assert names("jobs:\n  j:\n    strategy: {matrix: {os: {a: 1}, py: [1]}}\n    steps: [{run: a}]\n") == ["j"]


def test_an_include_without_matrix_keys_is_a_combination_of_its_own() -> None:
    """act adds an include that names none of the matrix's keys as a new combination; it
    does not extend the others (unlike GitHub)."""
    text = "jobs:\n  j:\n    strategy:\n      matrix: {os: [a, b], include: [{extra: x}]}\n    steps: [{run: a}]\n"
    assert [dict(j.matrix) for j in parse_workflow(text).jobs] == [{"os": "a"}, {"os": "b"}, {"extra": "x"}]


def test_go_maps_are_written_in_go_yaml_key_order_and_old_booleans_quoted() -> None:
    text = """
env: {b: 1, a10: 2, a9: 3}
jobs:
  j:
    runs-on: x
    outputs: {z: '1', m: '2'}
    services: {web: {image: nginx}, db: {image: postgres, env: {Y: 1, X: 2}}}
    env: {K2: v, K1: v}
    steps:
      - with: {b: yes, a: 'on', c: 1.10}
        run: x
"""
    payload = payload_of(text)
    doc = load(payload)
    assert list(doc["env"]) == ["a9", "a10", "b"]  # digits compare as numbers
    job = doc["jobs"]["j"]
    assert list(job["outputs"]) == ["m", "z"]
    assert list(job["services"]) == ["db", "web"] and list(job["services"]["db"]["env"]) == ["X", "Y"]
    assert list(job["env"]) == ["K2", "K1"]  # a raw node keeps its order
    assert job["steps"][0]["with"] == {"a": "on", "b": "yes", "c": "1.10"}
    assert 'a: "on"' in payload and 'b: "yes"' in payload and 'c: "1.10"' in payload


def test_the_payload_keeps_the_full_name_and_the_job_row_a_cut_one() -> None:
    long = "n" * 300
    [job] = parse_workflow(f"jobs:\n  j:\n    name: {long}\n    steps: [{{run: a}}]\n").jobs
    assert load(job.payload.decode())["jobs"]["j"]["name"] == long
    assert job.name == "n" * 252 + "…"


@pytest.mark.parametrize(
    ("step", "match"),
    [
        ("{run: a, continue-on-error: '${{ matrix.x }}'}", "into bool"),
        ("{run: a, continue-on-error: 1}", "into bool"),
        ("{run: a, with: {k: [1, 2]}}", "into string"),
        ("{run: [a]}", "into string"),
        ("just-a-string", "must be a mapping"),
    ],
)
def test_steps_gitea_cannot_decode_make_the_workflow_invalid(step: str, match: str) -> None:
    with pytest.raises(WorkflowError, match=match):
        parse_workflow(f"jobs:\n  j:\n    steps:\n      - {step}\n")


def test_yaml_11_booleans_decode_into_step_continue_on_error_and_empty_steps_are_dropped() -> None:
    [job] = parse_workflow("jobs:\n  j:\n    steps:\n      - {run: a, continue-on-error: yes}\n      -\n").jobs
    assert load(job.payload.decode())["jobs"]["j"]["steps"] == [{"run": "a", "continue-on-error": True}]
    assert job.step_names == ("Run a",)


def test_raw_nodes_keep_their_scalar_style_and_go_strings_are_quoted() -> None:
    """go-yaml writes a raw `yaml.Node` (step `env`, `if`) back in the style it was read in,
    while a value decoded into a Go string (`with`) is encoded anew."""
    text = "jobs:\n  j:\n    steps:\n      - run: x\n        env: {A: yes, B: 'no', C: \"on\"}\n        with: {d: yes}"
    payload = payload_of(text)
    assert "A: yes\n" in payload and "B: 'no'\n" in payload and 'C: "on"\n' in payload
    assert 'd: "yes"\n' in payload


def test_legacy_step_display_names() -> None:
    """Gitea 1.24 and 1.25 show an unnamed step as its whole `run` script (real 1.25.5)."""
    assert legacy_step_display_name({"name": "Build"}) == "Build"
    assert legacy_step_display_name({"run": 'echo "a"\nexit 1\n'}) == 'echo "a"\nexit 1\n'
    assert legacy_step_display_name({"uses": "actions/checkout@v4"}) == "actions/checkout@v4"
    assert legacy_step_display_name({"id": "s1"}) == "s1"
