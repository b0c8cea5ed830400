"""The configuration the chart renders is what the controller's own loader accepts — read from
the files a Pod of the rendered Deployment would see (its ConfigMap and Secrets laid out at their
mount paths), with the container's environment — so the chart cannot drift from the code. And
its secrets stay secret: only files, only in Secrets, one sealing key for every replica."""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from dynrunner.controller.backends.kubernetes.builders import PodSettings
from dynrunner.controller.backends.kubernetes.config import KubernetesBackendConfig
from dynrunner.controller.backends.opensandbox.config import OpenSandboxBackendConfig
from dynrunner.controller.config.model import load_cache_server_config, load_config
from dynrunner.controller.infra.sealing import Sealer
from tests.fixtures.chart import (
    EXISTING_SECRET_CONTENT,
    VALUES_FILES,
    Chart,
    RenderError,
    container_files,
    find,
    one,
)
from tests.fixtures.privileges import require_root

TOKEN = "0123456789abcdef0123456789abcdef01234567"


@functools.cache
def rendered(chart: Chart, values: str) -> list[dict[str, Any]]:
    return chart.render([values])


@pytest.mark.parametrize("values", VALUES_FILES)
def test_the_controller_loads_the_rendered_configuration(chart: Chart, values: str, tmp_path: Path) -> None:
    objects = rendered(chart, values)
    files = container_files(objects, "-controller", "controller", tmp_path)
    for path in files.named_files:
        assert path.is_file(), f"the configuration names {path}, which no mount provides"
    cfg = load_config(files.config, files.env)
    pools = yaml.safe_load(one(objects, "ConfigMap", "-controller")["data"]["config.yaml"])["pools"]
    assert [p.name for p in cfg.pools] == [p["name"] for p in pools]
    assert cfg.metrics.address == f"0.0.0.0:{_metrics_port(objects)}"
    assert str(cfg.state_dir) == "/var/lib/dynrunner"
    assert cfg.gitea.registration_token()  # read from the mounted file
    assert cfg.nats.url is not None  # never the embedded server: replicas share one NATS
    for pool in cfg.pools:
        assert isinstance(pool.backend, KubernetesBackendConfig | OpenSandboxBackendConfig)
        if isinstance(pool.backend, KubernetesBackendConfig):
            assert PodSettings.from_config(pool, cfg).problems() == []  # what the backend checks at start


def test_a_vm_pool_gets_its_api_key_and_the_spire_admin_credentials_as_files(chart: Chart, tmp_path: Path) -> None:
    """An opensandbox pool through the chart: its API key (openSandbox.apiKeys, or a volume of
    the admin's own named by apiKeyFile) and identity.spireServer's admin X509-SVID, key and
    bundle (openSandbox.spireServer) are mounted where the configuration points."""
    objects = rendered(chart, "ci/opensandbox-values.yaml")
    files = container_files(objects, "-controller", "controller", tmp_path)
    cfg = load_config(files.config, files.env)
    vm, large = cfg.pool("vm").backend, cfg.pool("vm-large").backend
    assert isinstance(vm, OpenSandboxBackendConfig) and isinstance(large, OpenSandboxBackendConfig)
    assert vm.api_key_file is not None and vm.api_key_file.read_text() == "(opensandbox-api-key/api-key)\n"
    assert large.api_key_file is not None
    assert large.api_key_file.read_text() == "(opensandbox-large-api-key/api-key)\n"
    server = cfg.identity.spire_server
    assert server is not None and server.address == "spire-server.spire.svc:8081"
    assert server.cert_file is not None and server.key_file is not None and server.bundle_file is not None
    assert server.cert_file.read_text() == EXISTING_SECRET_CONTENT["tls.crt"]  # the Secret's tls.crt
    assert server.key_file.read_text() == EXISTING_SECRET_CONTENT["tls.key"]
    assert server.bundle_file.read_text() == "(dynrunner-spire-admin/bundle.crt)\n"
    inline = {"openSandbox": {"apiKeys": {"vm": {"value": "osb-key-1", "existingSecret": ""}}}}
    inline_objects = chart.render(["ci/opensandbox-values.yaml"], overlay=inline)
    inline_files = container_files(inline_objects, "-controller", "controller", tmp_path / "inline")
    key_file = load_config(inline_files.config, inline_files.env).pool("vm").backend
    assert isinstance(key_file, OpenSandboxBackendConfig) and key_file.api_key_file is not None
    assert key_file.api_key_file.read_text() == "osb-key-1"
    assert "osb-key-1" not in one(inline_objects, "ConfigMap", "-controller")["data"]["config.yaml"]


@pytest.mark.parametrize(
    ("overlay", "message"),
    [
        ({"openSandbox": {"apiKeys": {"other": {"value": "k"}}}}, "there is no opensandbox pool other"),
        (
            {"openSandbox": {"apiKeys": {"vm-large": {"value": "k"}}}},
            "set openSandbox.apiKeys.vm-large or backend.apiKeyFile",
        ),
        (
            {"openSandbox": {"apiKeys": {"vm": {"existingSecret": ""}}}},
            "openSandbox.apiKeys.vm: set value or existingSecret",
        ),
        (
            {"config": {"identity": {"spireServer": {"address": "s:8081", "certFile": "/x"}}}},
            "spireServer.certFile: the chart mounts it",
        ),
        ({"config": {"identity": {"spireServer": None}}}, "needs config.identity.spireServer.address"),
    ],
)
def test_a_vm_pools_secrets_given_twice_or_for_no_pool_are_refused(
    chart: Chart, overlay: dict[str, Any], message: str
) -> None:
    with pytest.raises(RenderError, match=re.escape(message)):
        chart.render(["ci/opensandbox-values.yaml"], overlay=overlay)


def test_the_bundled_nats_credentials_reach_the_controller_as_files(chart: Chart, tmp_path: Path) -> None:
    objects = rendered(chart, "ci/minimal-values.yaml")
    files = container_files(objects, "-controller", "controller", tmp_path)
    cfg = load_config(files.config, files.env)
    secret = one(objects, "Secret", "rel-dynrunner")
    assert cfg.nats.url == "nats://rel-dynrunner-nats.ci.svc:4222"
    assert cfg.nats.user == "dynrunner"
    assert cfg.nats.password() == base64.b64decode(secret["data"]["nats-password"]).decode()
    conf = base64.b64decode(secret["data"]["nats.conf"]).decode()
    assert "password: $DYNRUNNER_NATS_PASSWORD" in conf and cfg.nats.password() not in conf
    statefulset = one(objects, "StatefulSet", "-nats")["spec"]["template"]
    (container,) = statefulset["spec"]["containers"]
    assert {
        "name": "DYNRUNNER_NATS_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "rel-dynrunner", "key": "nats-password"}},
    } in container["env"]


def test_a_new_bundled_nats_password_restarts_the_server_and_the_controllers(chart: Chart) -> None:
    """nats-server reads its password once, the controllers at their start: both Pods carry the
    password's checksum, so a password that changes (a render without a cluster, as GitOps
    does without existingSecret) restarts both together, and one that stays does not."""

    def checksums(objects: list[dict[str, Any]]) -> tuple[str, str]:
        server = one(objects, "StatefulSet", "-nats")["spec"]["template"]["metadata"]["annotations"]
        controller = one(objects, "Deployment", "-controller")["spec"]["template"]["metadata"]["annotations"]
        return server["checksum/password"], controller["checksum/nats-password"]

    first, second = chart.render(["ci/minimal-values.yaml"]), chart.render(["ci/minimal-values.yaml"])
    for objects in (first, second):
        password = one(objects, "Secret", "rel-dynrunner")["data"]["nats-password"]
        assert checksums(objects) == (hashlib.sha256(password.encode()).hexdigest(),) * 2
    assert checksums(first) != checksums(second)
    existing = {"nats": {"bundled": {"password": {"existingSecret": "nats-bundled", "key": "pw"}}}}
    named = checksums(chart.render(["ci/minimal-values.yaml"], overlay=existing))
    assert named == checksums(chart.render(["ci/minimal-values.yaml"], overlay=existing))
    assert named[0] == named[1] == hashlib.sha256(b"nats-bundled/pw").hexdigest()


def test_external_nats_gets_its_credentials_and_ca_from_the_named_secrets(chart: Chart, tmp_path: Path) -> None:
    objects = rendered(chart, "ci/production-values.yaml")
    files = container_files(objects, "-controller", "controller", tmp_path)
    cfg = load_config(files.config, files.env)
    assert cfg.nats.url == "tls://nats.nats.svc:4222"
    assert cfg.nats.password() == "(nats-dynrunner/password)"
    assert cfg.nats.tls.ca_file is not None and cfg.nats.tls.ca_file.name == "nats-ca.crt"
    assert cfg.nats.tls.cert_file is not None and cfg.nats.tls.key_file is not None
    assert [p.name for p in cfg.sealing.retired_key_files] == ["retired-sealing-0.key"]
    external = rendered(chart, "ci/external-nats-values.yaml")
    creds = container_files(external, "-controller", "controller", tmp_path / "external")
    assert load_config(creds.config, creds.env).nats.creds_file is not None


def test_the_cache_server_loads_the_same_configuration_and_shares_the_grant_key(chart: Chart, tmp_path: Path) -> None:
    objects = rendered(chart, "ci/production-values.yaml")
    controller = load_config(
        *_files(container_files(objects, "-controller", "controller", tmp_path / "controller"))
    ).cache
    files = container_files(objects, "-cache", "cache", tmp_path / "cache")
    server = load_cache_server_config(files.config, files.env).cache
    assert controller.url == "http://rel-dynrunner-cache.ci.svc:8089" == server.url
    assert controller.serve is False
    assert server.listen == "0.0.0.0:8089"
    assert server.storage.driver == "S3"
    assert controller.key_file is not None and server.key_file is not None
    assert controller.key_file.read_bytes() == server.key_file.read_bytes()  # both mount the same Secret key
    service = one(objects, "Service", "-cache")
    assert service["spec"]["ports"][0]["port"] == 8089


def _files(files: Any) -> tuple[Path, dict[str, str]]:
    return files.config, files.env


def _metrics_port(objects: list[dict[str, Any]]) -> int:
    return int(one(objects, "Service", "-metrics")["spec"]["ports"][0]["port"])


# -- secrets --------------------------------------------------------------------------------


@pytest.mark.parametrize("values", VALUES_FILES)
def test_no_secret_is_written_anywhere_but_a_secret(chart: Chart, values: str) -> None:
    objects = rendered(chart, values)
    secrets = [
        base64.b64decode(v).decode()
        for s in find(objects, "Secret")
        for k, v in (s.get("data") or {}).items()
        if k != "nats.conf"
    ]
    assert secrets
    others = yaml.safe_dump([o for o in objects if o["kind"] != "Secret"])
    for value in secrets:
        assert value.strip() not in others


def test_inline_secrets_are_kept_in_the_charts_secret_and_mounted_as_files(chart: Chart) -> None:
    objects = rendered(chart, "ci/external-nats-values.yaml")
    data = one(objects, "Secret", "rel-dynrunner")["data"]
    assert base64.b64decode(data["registration-token"]).decode() == TOKEN
    assert base64.b64decode(data["sealing.key"]).decode() == "8Xh5m7l0Ewx0bJ2n8cC1x3Qe9o7N0qYy2fJ4c9k1ZsA="
    config = one(objects, "ConfigMap", "-controller")["data"]["config.yaml"]
    assert "registrationTokenFile: /etc/dynrunner/registration-token" in config
    assert TOKEN not in config


def test_existing_secrets_are_only_named(chart: Chart) -> None:
    objects = rendered(chart, "ci/production-values.yaml")
    data = one(objects, "Secret", "rel-dynrunner").get("data") or {}
    assert "registration-token" not in data and "sealing.key" not in data and "nats-password" not in data
    sources = _projected(objects)
    assert {"name": "gitea-runner-token", "items": [{"key": "token", "path": "registration-token"}]} in sources
    assert {"name": "dynrunner-sealing", "items": [{"key": "sealing.key", "path": "sealing.key"}]} in sources


def test_every_replica_mounts_the_one_sealing_key(chart: Chart) -> None:
    """Replicas share what they seal in NATS: the key comes from one Secret, never from a
    per-Pod volume, and the chart generates it once (kept across upgrades)."""
    objects = rendered(chart, "ci/minimal-values.yaml")
    deployment = one(objects, "Deployment", "-controller")
    assert deployment["spec"]["replicas"] >= 2
    (sealing,) = [s for s in _projected(objects) if any(i["path"] == "sealing.key" for i in s["items"])]
    assert sealing["name"] == "rel-dynrunner"
    key = base64.b64decode(base64.b64decode(one(objects, "Secret", "rel-dynrunner")["data"]["sealing.key"]))
    assert len(key) == 32


def test_the_mounted_sealing_key_is_not_warned_about(
    chart: Chart, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubelet writes a Secret's files owned by root, in the Pod's fsGroup, with the
    volume's defaultMode (read-only volumes get 0440 added with an fsGroup): the controller, a
    non-root user of that group, reads them through the group and cannot chmod them. The mode
    the chart asks for is what the controller accepts without "make it 0600"."""
    require_root("laying files out as the kubelet does (owned by root)")
    objects = rendered(chart, "ci/minimal-values.yaml")
    pod = one(objects, "Deployment", "-controller")["spec"]["template"]["spec"]
    context = pod["securityContext"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "config"]
    mode = volume["projected"]["defaultMode"] | (0o440 if context.get("fsGroup") is not None else 0)
    assert mode == 0o440 and context["runAsUser"] != 0 and context["runAsNonRoot"] is True
    files = container_files(objects, "-controller", "controller", tmp_path)
    key_file = load_config(files.config, files.env).sealing.key_file
    assert key_file is not None
    os.chown(key_file, 0, context["fsGroup"])
    key_file.chmod(mode)
    monkeypatch.setattr(os, "geteuid", lambda: context["runAsUser"])
    with caplog.at_level(logging.WARNING):
        Sealer.from_key_file(key_file)
    assert "make it 0600" not in caplog.text
    key_file.chmod(mode | 0o004)  # a mode that would expose it is still reported
    with caplog.at_level(logging.WARNING):
        Sealer.from_key_file(key_file)
    assert "readable by other users" in caplog.text


def test_generated_keys_differ_per_render_without_a_cluster(chart: Chart) -> None:
    """Without a cluster to read the installed Secret from, each render makes new keys: that is
    why GitOps renders need existingSecret (README), and why an upgrade reads them back."""
    first = one(chart.render(["ci/minimal-values.yaml"]), "Secret", "rel-dynrunner")["data"]
    second = one(chart.render(["ci/minimal-values.yaml"]), "Secret", "rel-dynrunner")["data"]
    assert first["sealing.key"] != second["sealing.key"]
    assert first["registration-token"] == second["registration-token"]


def _projected(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    deployment = one(objects, "Deployment", "-controller")
    (config,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
    return [s["secret"] for s in config["projected"]["sources"] if "secret" in s]


def test_an_upgrade_reads_the_generated_keys_back_from_the_cluster(
    chart: Chart, kube_api: Any, kube_client: Any, tmp_path: Path
) -> None:
    """The sealing key and the bundled NATS password are made once: a later render (an upgrade)
    finds them in the installed Secret (`lookup`) and keeps them, so running replicas, queued
    assignments and the NATS server keep working. Against the Kubernetes API double, with
    `--dry-run=server`, on the chart's own Secret template alone (the double serves Secrets,
    not the other kinds the whole chart renders)."""
    from kubernetes import client

    partial = tmp_path / "dynrunner"
    for name in ("Chart.yaml", "values.yaml", "values.schema.json", "templates/_helpers.tpl", "templates/secret.yaml"):
        (partial / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(chart.path / name, partial / name)
    shutil.copytree(chart.path / "ci", partial / "ci")
    # What the NATS StatefulSet's and the controllers' checksum annotations hold, as a Secret.
    (partial / "templates" / "checksum.yaml").write_text(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: checksum, namespace: ci}\n"
        'stringData: {password: {{ include "dynrunner.natsPasswordChecksum" . | quote }}}\n'
    )
    alone = dataclasses.replace(chart, path=partial)
    installed = one(alone.render(["ci/minimal-values.yaml"]), "Secret", "rel-dynrunner")
    core = client.CoreV1Api(kube_client)
    core.create_namespace({"metadata": {"name": "ci"}})
    owner = {"meta.helm.sh/release-name": "rel", "meta.helm.sh/release-namespace": "ci"}  # as `helm install` marks it
    installed["metadata"]["annotations"] = owner
    core.create_namespaced_secret("ci", {k: installed[k] for k in ("metadata", "type", "data")})

    upgrade = ("--dry-run=server", "--disable-openapi-validation", "--kube-apiserver", kube_api.url)
    upgraded = alone.render(["ci/minimal-values.yaml"], extra=upgrade)
    again = one(upgraded, "Secret", "rel-dynrunner")["data"]
    fresh = one(alone.render(["ci/minimal-values.yaml"]), "Secret", "rel-dynrunner")["data"]
    for key in ("sealing.key", "nats-password"):
        assert again[key] == installed["data"][key] != fresh[key]
    # The Pods' checksum is the kept password's: an upgrade restarts neither server nor controllers.
    checksum = one(upgraded, "Secret", "checksum")["stringData"]["password"]
    assert checksum == hashlib.sha256(installed["data"]["nats-password"].encode()).hexdigest()
