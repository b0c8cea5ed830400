"""An action's metadata and the inputs a step gives it."""

from __future__ import annotations

import pytest

from dynrunner.executor.actions.inputs import env_name, resolve_inputs
from dynrunner.executor.actions.manifest import ManifestError, parse_manifest

COMPOSITE = """
name: x
inputs:
  who:
    required: true
  greeting:
    default: ${{ github.actor }}
  old:
    deprecationMessage: use greeting
  plain:
outputs:
  said:
    value: ${{ steps.s.outputs.v }}
runs:
  using: composite
  steps:
    - id: s
      shell: bash
      run: echo v=1 >> "$GITHUB_OUTPUT"
    - uses: ./other
"""


def test_a_composite_manifest() -> None:
    manifest = parse_manifest(COMPOSITE)
    assert manifest.kind == "composite"
    assert [s.id for s in manifest.steps] == ["s", "__1"]
    assert [s.action for s in manifest.steps] == ["s", "__self"]
    assert manifest.outputs == {"said": "${{ steps.s.outputs.v }}"}
    assert manifest.inputs["who"].required and manifest.inputs["greeting"].default == "${{ github.actor }}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("runs:\n  using: node16\n", "runs.main is required for a node16 action"),
        ("runs:\n  using: composite\n  steps:\n    - run: x\n", "runs a script without `shell:`"),
        (
            "runs:\n  using: composite\n  steps:\n    - run: x\n      shell: sh\n      timeout-minutes: 1\n",
            "unknown keys",
        ),
        ("runs:\n  using: deno\n", "runs.using is 'deno'"),
        ("name: x\n", "has no `runs:` mapping"),
        ("runs: [\n", "not valid YAML"),
    ],
)
def test_manifests_that_cannot_be_used(text: str, message: str) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(text, "action a: ")
    assert str(caught.value).startswith("action a: ") and message in str(caught.value)


def test_inputs_defaults_required_case_and_surplus() -> None:
    manifest = parse_manifest(COMPOSITE)
    inputs = resolve_inputs(manifest, {"WHO": "me", "old": "o", "extra": "e"}, lambda v: f"<{v}>", action="a")
    assert inputs.values == {
        "who": "me",
        "greeting": "<${{ github.actor }}>",
        "old": "o",
        "plain": "",
        "extra": "e",
    }
    assert inputs.warnings == [
        "Input 'old' has been deprecated with message: use greeting",
        "Unexpected input(s) 'extra', valid inputs are ['who', 'greeting', 'old', 'plain']",
    ]
    # GitHub's runner does not check a required input (actions/runner#1070): a warning, an empty value
    missing = resolve_inputs(manifest, {}, str, action="o/r@v1")
    assert missing.values["who"] == ""
    assert missing.warnings == [
        "Input required and not supplied: 'who'. The action 'o/r@v1' declares it required and runs with it "
        "empty, as on GitHub; give it under `with:` if the action needs it."
    ]


def test_input_variable_names_follow_github() -> None:
    assert env_name("fetch-depth") == "INPUT_FETCH-DEPTH"
    assert env_name("my input.x") == "INPUT_MY_INPUT.X"
