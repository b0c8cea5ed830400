"""The pure builders of the kubernetes backend: the Secret, the Pod and the ClusterStaticEntry
of one job, compared as dictionaries."""

from __future__ import annotations

import base64
import dataclasses

import pytest

from dynrunner.controller import contract
from dynrunner.controller.backends.kubernetes import builders
from dynrunner.controller.backends.kubernetes.merge import merge
from dynrunner.proto.assignment import decode, encode
from tests.fixtures.kubernetes_backend import ASSIGNMENT_ID, IMAGE, claimed, settings

NAME = f"dr-{ASSIGNMENT_ID}"
LABELS = {
    "dynrunner.io/assignment-id": ASSIGNMENT_ID,
    "dynrunner.io/task-id": "1234",
    "dynrunner.io/pool": "pod",
    "dynrunner.io/repository": "acme.widgets",
    "dynrunner.io/job-key": "build",
    "dynrunner.io/stream-seq": "17",
    "dynrunner.io/run-id": "4711",
    "dynrunner.io/run-number": "42",
    "app.kubernetes.io/managed-by": "dynrunner",
}


def test_the_default_pod() -> None:
    pod = builders.pod(claimed(), settings(), stream_seq=17)
    assert pod == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": NAME,
            "namespace": "ci-jobs",
            "labels": LABELS,
            "annotations": {
                "dynrunner.io/repository": "Acme/Widgets",
                "dynrunner.io/workflow": "ci.yml",
                "dynrunner.io/job-name": "Build and test",
                "dynrunner.io/spiffe-id": "spiffe://example.org/ci/acme/widgets/build",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": 65 * 60 + 60,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True, "fsGroup": 1001, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "executor",
                    "image": IMAGE,
                    "command": ["dynrunner-executor"],
                    "args": ["run", "--assignment", "/var/run/dynrunner/assignment.pb"],
                    "workingDir": "/workspace",
                    "env": [
                        {"name": "SPIFFE_ENDPOINT_SOCKET", "value": "unix:///spiffe-workload-api/spire-agent.sock"},
                        {"name": "DYNRUNNER_TERMINATION_MESSAGE_PATH", "value": "/dev/termination-log"},
                    ],
                    "volumeMounts": [
                        {"name": "assignment", "mountPath": "/var/run/dynrunner", "readOnly": True},
                        {"name": "workspace", "mountPath": "/workspace"},
                        {"name": "spiffe-workload-api", "mountPath": "/spiffe-workload-api", "readOnly": True},
                    ],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "runAsNonRoot": True,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ],
            "volumes": [
                {
                    "name": "assignment",
                    "secret": {
                        "secretName": NAME,
                        "defaultMode": 0o440,
                        "items": [{"key": "assignment.pb", "path": "assignment.pb"}],
                    },
                },
                {"name": "workspace", "emptyDir": {}},
                {"name": "spiffe-workload-api", "csi": {"driver": "csi.spiffe.io", "readOnly": True}},
            ],
        },
    }


def test_pool_options_reach_the_pod() -> None:
    options = {
        "executorCommand": ["tini", "--", "dynrunner-executor"],
        "imagePullPolicy": "Always",
        "workspace": {"emptyDir": {"sizeLimit": "10Gi"}},
        "workloadApiSocket": "/run/spire/sockets/agent.sock",
        "workloadApiVolume": {"hostPath": {"path": "/run/spire/sockets", "type": "Directory"}},
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
        "nodeSelector": {"pool": "ci"},
        "tolerations": [{"key": "ci", "operator": "Exists", "effect": "NoSchedule"}],
        "serviceAccountName": "ci-job",
    }
    pod = builders.pod(claimed(), settings(**options))
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert container["command"] == ["tini", "--", "dynrunner-executor"]
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == options["resources"]
    assert container["env"][0] == {"name": "SPIFFE_ENDPOINT_SOCKET", "value": "unix:///run/spire/sockets/agent.sock"}
    assert container["volumeMounts"][2] == {
        "name": "spiffe-workload-api",
        "mountPath": "/run/spire/sockets",
        "readOnly": True,
    }
    assert spec["volumes"][1:] == [
        {"name": "workspace", "emptyDir": {"sizeLimit": "10Gi"}},
        {"name": "spiffe-workload-api", "hostPath": {"path": "/run/spire/sockets", "type": "Directory"}},
    ]
    assert spec["nodeSelector"] == {"pool": "ci"}
    assert spec["tolerations"] == options["tolerations"]
    assert spec["serviceAccountName"] == "ci-job"
    assert "dynrunner.io/stream-seq" not in pod["metadata"]["labels"]


def test_without_identity_there_is_no_workload_api() -> None:
    pod = builders.pod(claimed(), settings(identity=False))
    container = pod["spec"]["containers"][0]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["assignment", "workspace"]
    assert [e["name"] for e in container["env"]] == ["DYNRUNNER_TERMINATION_MESSAGE_PATH"]
    handed = builders.handed(claimed(), settings(identity=False))
    assert not handed.executor.identity.enabled


def test_the_executor_waits_for_its_identity_through_spiffe_endpoint_socket() -> None:
    handed = builders.handed(claimed(), settings())
    assert handed.executor.identity.enabled
    assert handed.executor.identity.workload_api_socket == ""  # the Pod's env says where
    assert handed.executor.identity.timeout_seconds == 120


def test_a_pod_template_merges_structurally_and_cannot_break_the_contract() -> None:
    template = {
        "metadata": {"labels": {"team": "ci", "dynrunner.io/pool": "other"}, "annotations": {"cost": "ci"}},
        "spec": {
            "restartPolicy": "Always",
            "priorityClassName": "ci-low",
            "automountServiceAccountToken": True,
            "containers": [
                {
                    "name": "executor",
                    "env": [{"name": "HTTP_PROXY", "value": "http://proxy:3128"}],
                    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                    "args": ["sh", "-c", "evil"],
                },
                {"name": "docker", "image": "docker:dind"},
            ],
            "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "ci-cache"}}],
            "securityContext": {"fsGroup": 2000},
        },
    }
    pod = builders.pod(claimed(), settings(podTemplate=template), stream_seq=17)
    spec, meta = pod["spec"], pod["metadata"]
    assert meta["labels"] == {**LABELS, "team": "ci"}
    assert meta["annotations"]["cost"] == "ci"
    assert spec["restartPolicy"] == "Never"
    assert spec["priorityClassName"] == "ci-low"
    assert spec["automountServiceAccountToken"] is True  # the admin's choice
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "fsGroup": 2000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    executor, sidecar = spec["containers"]
    assert sidecar == {"name": "docker", "image": "docker:dind"}
    assert executor["args"] == ["run", "--assignment", "/var/run/dynrunner/assignment.pb"]
    assert executor["image"] == IMAGE
    assert [e["name"] for e in executor["env"]] == [
        "SPIFFE_ENDPOINT_SOCKET",
        "DYNRUNNER_TERMINATION_MESSAGE_PATH",
        "HTTP_PROXY",
    ]
    assert [m["mountPath"] for m in executor["volumeMounts"]] == [
        "/var/run/dynrunner",
        "/workspace",
        "/spiffe-workload-api",
        "/cache",
    ]
    assert [v["name"] for v in spec["volumes"]] == ["assignment", "workspace", "spiffe-workload-api", "cache"]


def test_a_template_cannot_replace_the_assignment_volume() -> None:
    template = {"spec": {"volumes": [{"name": "assignment", "emptyDir": {}}]}}
    pod = builders.pod(claimed(), settings(podTemplate=template))
    assert pod["spec"]["volumes"][0]["secret"]["secretName"] == NAME


def test_a_template_that_removes_the_executor_is_refused() -> None:
    with pytest.raises(ValueError, match="executor"):
        builders.pod(claimed(), settings(podTemplate={"spec": {"containers": None}}))


def test_the_secret_holds_the_handed_assignment_and_nothing_else() -> None:
    handed = builders.handed(claimed(), settings())
    secret = builders.secret(encode(handed), name=NAME, namespace="ci-jobs", labels=LABELS)
    assert secret["metadata"] == {"name": NAME, "namespace": "ci-jobs", "labels": LABELS}
    assert secret["immutable"] is True and secret["type"] == "Opaque"
    assert decode(base64.b64decode(secret["data"]["assignment.pb"])) == handed
    pod_text = str(builders.pod(claimed(), settings()))
    for credential in ("runner-token-secret", "task-token-secret", "s3cret"):
        assert credential not in pod_text  # never in env values or annotations


def test_the_cluster_static_entry() -> None:
    entry = builders.cluster_static_entry(
        claimed(), settings(), pod_uid="pod-uid-1", node_name="node-a", node_uid="node-uid-1", stream_seq=17
    )
    assert entry == {
        "apiVersion": "spire.spiffe.io/v1alpha1",
        "kind": "ClusterStaticEntry",
        "metadata": {
            "name": NAME,
            "labels": {**LABELS, "dynrunner.io/namespace": "ci-jobs", "dynrunner.io/pod-uid": "pod-uid-1"},
            "annotations": {"dynrunner.io/pod": f"ci-jobs/{NAME}"},
        },
        "spec": {
            "spiffeID": "spiffe://example.org/ci/acme/widgets/build",
            "parentID": "spiffe://example.org/spire/agent/k8s_psat/ci/node-uid-1",
            "selectors": ["k8s:ns:ci-jobs", "k8s:pod-uid:pod-uid-1", "k8s:container-name:executor"],
            "x509SVIDTTL": "900s",
        },
    }


def test_an_entry_names_the_ref_when_the_claimer_put_it_in_the_id() -> None:
    """A pool with refInSpiffeId: the ID is derived again from the task, ref included."""
    base = claimed()
    context = {**(base.task.context or {}), "ref": "refs/heads/main"}
    with_ref = dataclasses.replace(
        base,
        task=dataclasses.replace(base.task, context=context),
        spiffe_id=f"{base.spiffe_id}/refs/heads/main",
    )
    entry = builders.cluster_static_entry(with_ref, settings(), pod_uid="u", node_name="n", node_uid="nu")
    assert entry["spec"]["spiffeID"] == "spiffe://example.org/ci/acme/widgets/build/refs/heads/main"
    other_ref = dataclasses.replace(with_ref, spiffe_id=f"{base.spiffe_id}/refs/heads/release")
    with pytest.raises(contract.ContractError, match=r"is not spiffe://example\.org/ci/acme/widgets/build "):
        builders.cluster_static_entry(other_ref, settings(), pod_uid="u", node_name="n", node_uid="nu")


def test_an_entry_for_an_invalid_job_key_is_refused() -> None:
    bad = claimed(job="build.all")
    with pytest.raises(contract.ContractError, match=r"must match \[A-Za-z_\]"):
        builders.cluster_static_entry(bad, settings(), pod_uid="u", node_name="n", node_uid="nu")


def test_the_job_name_falls_back_to_its_key() -> None:
    assert builders.job_name(claimed(workflow="on: push\njobs:\n  build:\n    runs-on: x\n")) == "build"
    assert builders.job_name(claimed(workflow="{not yaml")) == "build"


def test_merge_keys_and_nulls() -> None:
    base = {"a": 1, "b": {"c": 2}, "ports": [{"containerPort": 80, "name": "http"}], "args": ["x"]}
    overlay = {"a": None, "b": {"d": 3}, "ports": [{"containerPort": 80, "protocol": "TCP"}], "args": ["y"]}
    assert merge(base, overlay) == {
        "b": {"c": 2, "d": 3},
        "ports": [{"containerPort": 80, "name": "http", "protocol": "TCP"}],
        "args": ["y"],
    }
    assert base["a"] == 1  # inputs are not changed
