"""The generated RBAC rules are enough, and `check` says what is missing: the API double
authorizes every request against exactly the rules docs/kubernetes.md lists."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import yaml

from dynrunner.controller.backends.base import Phase
from dynrunner.controller.backends.kubernetes.backend import KubernetesBackend
from dynrunner.controller.backends.kubernetes.rbac import rules
from dynrunner.controller.checks import run_checks
from dynrunner.doubles.gitea import GiteaDouble
from dynrunner.doubles.spire.double import SpireOptions
from tests.fixtures.kubernetes_backend import (
    IMAGE,
    controller_config,
    fake_executor_image,
    job,
)

NS = "ci-jobs"


def granted(namespace: str = NS, drop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The generated rules in the double's form (a Role's rules carry their namespace)."""
    generated = rules(namespace)
    out = [{**rule, "namespaces": [namespace]} for rule in generated.role] + list(generated.cluster_role)
    return [{**r, "verbs": [v for v in r["verbs"] if f"{v} {r['resources'][0]}" not in drop]} for r in out]


async def test_a_job_and_orphan_collection_need_no_more_than_the_generated_rules(
    kube_cluster_factory: Any, tmp_path: Path
) -> None:
    options = {
        "api": {"namespaces": ["default", NS], "rbac": granted()},
        "images": {IMAGE: fake_executor_image(tmp_path)},
        "spire": SpireOptions(),
    }
    with kube_cluster_factory(**options) as cluster:
        cfg = controller_config(cluster.api.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path / "s")
        backend = KubernetesBackend.from_config(cfg.pools[0], cfg)
        try:
            env = await backend.create(job("svid"))
            deadline = asyncio.get_running_loop().time() + 20
            while (observation := await backend.observe(env)).phase is not Phase.SUCCEEDED:
                assert not observation.phase.finished, observation
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            assert backend.entries.made_for(env.assignment_id)
            await backend.delete(env)
            assert await backend.collect_orphans(set()) == []
            assert all(f.ok for f in await backend.check()), await backend.check()
        finally:
            await backend.aclose()


async def test_check_names_each_missing_permission_and_the_missing_crd(
    kube_api_factory: Any, gitea: GiteaDouble, tmp_path: Path
) -> None:
    drop = ("delete pods", "create clusterstaticentries")
    with kube_api_factory(namespaces=["default", NS], rbac=granted(drop=drop), crds=[]) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        config = controller_config(kubeconfig, tmp_path / "s", gitea_url=gitea.url, token=gitea.registration_token)
        path = tmp_path / "controller.yaml"
        path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True, exclude={"state_dir"})))
        out = io.StringIO()
        assert await run_checks(path, out) == 1
    lines = {line.split(":")[0]: line for line in out.getvalue().splitlines() if line.startswith(("OK", "FAIL"))}
    assert (
        lines["OK   pool pod kubernetes API"].endswith("Kubernetes v1.32.0")
        or "Kubernetes" in lines["OK   pool pod kubernetes API"]
    )
    assert "OK   pool pod namespace" in lines
    assert "not allowed: delete pods" in lines["FAIL pool pod RBAC"]
    assert "create clusterstaticentries.spire.spiffe.io" in lines["FAIL pool pod RBAC"]
    assert "not installed" in lines["FAIL pool pod ClusterStaticEntry CRD"]
    assert lines["FAIL pool pod"].endswith("backend kubernetes: 2 problem(s), below")
