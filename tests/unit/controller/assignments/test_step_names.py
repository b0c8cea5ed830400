"""The job's steps as the finalize record keeps them: by index, named as Gitea names its task
steps at claim (act's Step.String(): name, else uses, else run, else id)."""

from __future__ import annotations

from dynrunner.controller.assignments.finalize_records import step_names


def test_each_step_is_named_by_name_then_uses_then_run_then_id() -> None:
    payload = b"""
on: push
jobs:
  build:
    runs-on: [self-hosted]
    steps:
      - name: Check out
        uses: actions/checkout@v4
      - uses: actions/setup-go@v5
      - run: |
          make test
      - id: only-an-id
        shell: bash
      - name: 42
        run: echo
"""
    assert step_names(payload) == ["Check out", "actions/setup-go@v5", "make test\n", "only-an-id", "42"]


def test_a_long_name_is_cut_to_what_gitea_keeps() -> None:
    payload = ("jobs:\n  j:\n    steps:\n      - run: " + "x" * 300 + "\n").encode()
    [name] = step_names(payload)
    assert len(name) == 255 and name.endswith("…")


def test_no_readable_steps_is_an_empty_list() -> None:
    assert step_names(None) == []
    assert step_names(b"") == []
    assert step_names(b"jobs: [unclosed") == []
    assert step_names(b"jobs:\n  a: {steps: [{run: x}]}\n  b: {steps: [{run: y}]}\n") == []  # not one job
    assert step_names(b"jobs:\n  a:\n    runs-on: x\n") == []
    assert step_names(b"jobs:\n  a:\n    steps:\n      - just a string\n") == [""]
