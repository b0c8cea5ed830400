"""The kubelet double's container config: Kubernetes' $(VAR) expansion, env sources and their
errors, argv from image and spec, and the container-path map."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from dynrunner.doubles.kubernetes.containers import ConfigError, PathMap, argv, environment, expand
from dynrunner.doubles.kubernetes.images import Image


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)-$(B)", "1-$(B)"),
        ("$$(A)", "$(A)"),
        ("$$$(A)", "$1"),
        ("$(A", "$(A"),
        ("$A $", "$A $"),
        ("x$(A)y$(A)", "x1y1"),
    ],
)
def test_expansion(text, expected):
    assert expand(text, {"A": "1"}) == expected


def pod(**spec):
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"app": "web"}},
        "spec": {"nodeName": "n1", **spec},
    }


def secret(**data):
    return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def test_environment_sources_in_order():
    container = {
        "name": "c",
        "envFrom": [{"secretRef": {"name": "s"}, "prefix": "S_"}, {"secretRef": {"name": "missing", "optional": True}}],
        "env": [
            {"name": "A", "value": "a"},
            {"name": "B", "value": "$(A)$(S_k)"},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "s", "key": "nope", "optional": True}}},
        ],
    }
    env = environment(
        pod(), container, Image(env={"PATH": "/bin"}), lambda name: secret(k="v") if name == "s" else None
    )
    assert env["B"] == "av" and env["APP"] == "web" and env["S_k"] == "v" and "OPT" not in env
    assert env["PATH"] == "/bin" and env["HOSTNAME"] == "p"


def test_missing_secret_or_key_is_a_config_error():
    missing = {"name": "c", "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "x"}}}]}
    with pytest.raises(ConfigError, match=r"^secret \"s\" not found$"):
        environment(pod(), missing, Image(), lambda _: None)
    with pytest.raises(ConfigError, match=r"^couldn't find key x in Secret ns/s$"):
        environment(pod(), missing, Image(), lambda _: secret(y="1"))


def test_argv_from_image_and_spec():
    image = Image(entrypoint=("/entry",), cmd=("default",))
    assert argv({}, image, {}) == ["/entry", "default"]
    assert argv({"args": ["$(X)"]}, image, {"X": "x"}) == ["/entry", "x"]
    assert argv({"command": ["run"]}, image, {}) == ["run"], "a command drops the image's cmd too"


def test_path_map_rewrites_mount_paths_at_boundaries_once():
    paths = PathMap()
    paths.add("/spiffe-workload-api", Path("/tmp/spire-x/node"))
    paths.add("/workspace", Path("/h/ws"))
    paths.add("/workspace/cache", Path("/h/cache"))
    assert paths.rewrite("unix:///spiffe-workload-api/spire-agent.sock") == "unix:///tmp/spire-x/node/spire-agent.sock"
    assert paths.rewrite("--dir=/workspace/cache/a:/workspace") == "--dir=/h/cache/a:/h/ws"
    assert paths.rewrite("/workspace2 /data/workspace") == "/workspace2 /data/workspace"
    assert paths.host("/workspace/x") == Path("/h/ws/x") and paths.host("/etc") is None
