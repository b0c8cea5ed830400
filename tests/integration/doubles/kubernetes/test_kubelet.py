"""The scheduler and kubelet doubles: a Pod spec runs as a real local process with its
Secret volume, env and working directory; each failure state reads as a kubelet's."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dynrunner.doubles.kubernetes.cluster import Cluster, NodeSpec
from dynrunner.doubles.kubernetes.images import Image
from tests.fixtures.kubernetes import api_client, wait_for

SH = "busybox:1.36"
PY = "python:3.11"
IMAGES = {SH: Image(entrypoint=("/bin/sh", "-c")), PY: Image(entrypoint=(sys.executable,))}


@pytest.fixture
def cluster(kube_cluster_factory) -> Iterator[Cluster]:
    with kube_cluster_factory(images=IMAGES) as running:
        yield running


@pytest.fixture
def v1(cluster) -> Iterator[client.CoreV1Api]:
    with api_client(cluster.api) as api:
        yield client.CoreV1Api(api)


def pod(name: str, script: str, image: str = SH, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": image, "args": [script], **spec.pop("container", {})}
    return {"metadata": {"name": name}, "spec": {"restartPolicy": "Never", "containers": [container], **spec}}


def phase(v1: client.CoreV1Api, name: str, *phases: str) -> client.V1Pod:
    return wait_for(lambda: (p := v1.read_namespaced_pod(name, "default")).status.phase in phases and p)


def state(v1: client.CoreV1Api, name: str, waiting_reason: str) -> client.V1ContainerState:
    def check() -> Any:
        statuses = v1.read_namespaced_pod(name, "default").status.container_statuses or []
        return (
            statuses
            and statuses[0].state.waiting
            and statuses[0].state.waiting.reason == waiting_reason
            and statuses[0].state
        )

    return wait_for(check)


def events(v1: client.CoreV1Api, name: str) -> list[tuple[str, str, str]]:
    items = v1.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    return [(e.type, e.reason, e.message) for e in items]


def test_a_pod_runs_as_a_process_with_its_secret_volume_env_and_working_directory(cluster, v1, tmp_path):
    v1.create_namespaced_secret(
        "default", {"metadata": {"name": "creds"}, "stringData": {"token": "t0k", "user": "ci", "extra": "x"}}
    )
    script = (
        "import json, os, stat, sys\n"
        "files = {n: open('/etc/creds/' + n).read() for n in sorted(os.listdir('/etc/creds'))}\n"
        "mode = oct(stat.S_IMODE(os.stat('/etc/creds/token-file').st_mode))\n"
        "names = ('GREETING', 'LITERAL', 'USER_NAME', 'POD_UID', 'NODE', 'CRED_user', 'DATA_DIR')\n"
        "env = {k: os.environ.get(k) for k in names}\n"
        "here = os.getcwd() == os.environ['DATA_DIR']\n"
        "out = {'files': files, 'mode': mode, 'env': env, 'cwd_is_workspace': here, 'argv': sys.argv[1:]}\n"
        "json.dump(out, open('/workspace/out.json', 'w'))\n"
    )
    body = pod(
        "runner",
        "",
        image=PY,
        container={
            "args": ["-c", script, "$(GREETING)", "/workspace/x"],
            "workingDir": "/workspace",
            "env": [
                {"name": "GREETING", "value": "hello"},
                {"name": "LITERAL", "value": "$$(GREETING) $(UNDEFINED) $(GREETING)!"},
                {"name": "USER_NAME", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "user"}}},
                {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "DATA_DIR", "value": "/workspace"},
            ],
            "envFrom": [{"secretRef": {"name": "creds"}, "prefix": "CRED_"}],
            "volumeMounts": [
                {"name": "creds", "mountPath": "/etc/creds", "readOnly": True},
                {"name": "ws", "mountPath": "/workspace"},
            ],
        },
        volumes=[
            {
                "name": "creds",
                "secret": {
                    "secretName": "creds",
                    "defaultMode": 0o440,
                    "items": [{"key": "token", "path": "token-file"}, {"key": "user", "path": "user"}],
                },
            },
            {"name": "ws", "emptyDir": {}},
        ],
    )
    created = v1.create_namespaced_pod("default", body)
    done = phase(v1, "runner", "Succeeded", "Failed")
    assert done.status.phase == "Succeeded", done.status
    terminated = done.status.container_statuses[0].state.terminated
    assert (
        (terminated.exit_code, terminated.reason) == (0, "Completed")
        and terminated.started_at
        and terminated.container_id.startswith("containerd://")
    )
    out = json.loads((next(cluster.root.rglob("volumes/ws")) / "out.json").read_text())
    assert out["files"] == {"token-file": "t0k", "user": "ci"} and out["mode"] == "0o440"
    assert out["env"] == {
        "GREETING": "hello",
        "LITERAL": "$(GREETING) $(UNDEFINED) hello!",
        "USER_NAME": "ci",
        "POD_UID": created.metadata.uid,
        "NODE": "node-a",
        "CRED_user": "ci",
        "DATA_DIR": out["env"]["DATA_DIR"],
    }
    assert out["env"]["DATA_DIR"] != "/workspace" and out["cwd_is_workspace"], (
        "container paths map to the Pod's host directory"
    )
    assert out["argv"] == ["hello", f"{out['env']['DATA_DIR']}/x"]
    reasons = [r for _, r, _ in events(v1, "runner")]
    assert reasons == ["Scheduled", "Pulling", "Pulled", "Created", "Started"]
    conditions = {c.type: (c.status, c.reason) for c in done.status.conditions}
    assert conditions["Ready"] == ("False", "PodCompleted") and conditions["PodScheduled"] == ("True", None)


def test_a_failing_container_fails_the_pod(v1):
    v1.create_namespaced_pod(
        "default", pod("fails", "echo no; exit 3", container={"terminationMessagePolicy": "FallbackToLogsOnError"})
    )
    done = phase(v1, "fails", "Failed")
    terminated = done.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason, terminated.message) == (3, "Error", "no")


def test_the_termination_message_file_becomes_the_terminated_message(v1):
    """The file at terminationMessagePath (the kubelet bind-mounts one per container) is the
    message on success and failure alike; FallbackToLogsOnError reads the log only when the
    file is empty and the container failed."""
    fallback = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    v1.create_namespaced_pod("default", pod("writes", "echo log; printf done > /dev/termination-log"))
    custom = {"terminationMessagePath": "/tmp/msg", **fallback}
    v1.create_namespaced_pod("default", pod("custom", "echo log; printf bad > /tmp/msg; exit 2", container=custom))
    v1.create_namespaced_pod("default", pod("quiet", "echo log; exit 0", container=fallback))
    messages = {}
    for name, wanted in (("writes", "Succeeded"), ("custom", "Failed"), ("quiet", "Succeeded")):
        terminated = phase(v1, name, wanted).status.container_statuses[0].state.terminated
        messages[name] = (terminated.exit_code, terminated.message)
    assert messages == {"writes": (0, "done"), "custom": (2, "bad"), "quiet": (0, None)}


def test_the_termination_message_is_the_files_last_4096_bytes_when_the_container_ends(cluster, v1):
    """As the kubelet's getTerminationMessage (tail.ReadAtMost): read when the container ends —
    killed too, so what it wrote last counts — and a longer file gives its end. A file that is
    not empty is the message even with FallbackToLogsOnError."""
    fallback = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    script = "printf first > /dev/termination-log; printf second > /dev/termination-log; echo written; sleep 30"
    v1.create_namespaced_pod("default", pod("killed", script, container=fallback))
    long = "head -c 5000 /dev/zero | tr '\\0' a > /dev/termination-log; printf end >> /dev/termination-log; exit 1"
    v1.create_namespaced_pod("default", pod("long", long, container=fallback))
    phase(v1, "killed", "Running")
    wait_for(lambda: "written" in v1.read_namespaced_pod_log("killed", "default"))
    cluster.oom_kill("default", "killed")
    killed = phase(v1, "killed", "Failed").status.container_statuses[0].state.terminated
    assert (killed.reason, killed.message) == ("OOMKilled", "second")
    ended = phase(v1, "long", "Failed").status.container_statuses[0].state.terminated
    assert len(ended.message) == 4096 and ended.message.endswith("aaaend")


def test_running_reports_started_at_and_ready(v1):
    v1.create_namespaced_pod("default", pod("long", "sleep 30"))
    running = phase(v1, "long", "Running")
    status = wait_for(lambda: (s := v1.read_namespaced_pod("long", "default").status.container_statuses[0]).ready and s)
    assert status.state.running.started_at is not None and status.started
    assert running.status.pod_ip and running.status.host_ip == "127.0.0.1" and running.status.start_time


def test_unschedulable_pods_carry_the_schedulers_message(kube_cluster_factory):
    nodes = [
        NodeSpec("small", cpu="1"),
        NodeSpec("gpu", labels={"gpu": "yes"}, taints=({"key": "gpu", "value": "true", "effect": "NoSchedule"},)),
    ]
    with kube_cluster_factory(images=IMAGES, nodes=nodes) as cluster, api_client(cluster.api) as api:
        v1 = client.CoreV1Api(api)
        big = pod("big", "true", container={"resources": {"requests": {"cpu": "2"}}})
        v1.create_namespaced_pod("default", big)

        def scheduled_condition(name: str) -> Any:
            conditions = v1.read_namespaced_pod(name, "default").status.conditions or []
            return next((c for c in conditions if c.type == "PodScheduled"), None)

        cond = wait_for(lambda: scheduled_condition("big"))
        assert (cond.status, cond.reason) == ("False", "Unschedulable")
        assert cond.message == (
            "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint {gpu: true}. "
            "preemption: 0/2 nodes "
            "are available: 1 No preemption victims found for incoming pod, 1 Preemption is not helpful for scheduling."
        )
        assert ("Warning", "FailedScheduling", cond.message) in events(v1, "big")
        selective = pod("selective", "true", nodeSelector={"gpu": "yes"})
        v1.create_namespaced_pod("default", selective)
        wait_for(lambda: (c := scheduled_condition("selective")) and c.status == "False")
        tolerant = pod(
            "tolerant",
            "true",
            nodeSelector={"gpu": "yes"},
            tolerations=[{"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
        )
        v1.create_namespaced_pod("default", tolerant)
        assert phase(v1, "tolerant", "Succeeded").spec.node_name == "gpu"


def test_image_pull_errors_then_back_off(kube_cluster_factory):
    images = {**IMAGES, "registry.example/private/app:2": Image(pull_error="unauthorized")}
    with kube_cluster_factory(images=images) as cluster, api_client(cluster.api) as api:
        v1 = client.CoreV1Api(api)
        v1.create_namespaced_pod("default", pod("missing", "true", image="registry.example/nope:1"))
        err = state(v1, "missing", "ErrImagePull")
        assert err.waiting.message == (
            'rpc error: code = NotFound desc = failed to pull and unpack image "registry.example/nope:1": '
            'failed to resolve reference "registry.example/nope:1": registry.example/nope:1: not found'
        )
        back = state(v1, "missing", "ImagePullBackOff")
        assert (
            back.waiting.message
            == f'Back-off pulling image "registry.example/nope:1": ErrImagePull: {err.waiting.message}'
        )
        assert v1.read_namespaced_pod("missing", "default").status.phase == "Pending"
        v1.create_namespaced_pod("default", pod("denied", "true", image="registry.example/private/app:2"))
        assert "pull access denied" in state(v1, "denied", "ErrImagePull").waiting.message
        reasons = {r for _, r, _ in events(v1, "missing")}
        assert {"Pulling", "Failed", "BackOff"} <= reasons


def test_a_slow_pull_keeps_the_pod_container_creating(kube_cluster_factory):
    with (
        kube_cluster_factory(images={"slow:1": Image(entrypoint=("/bin/sh", "-c"), pull_seconds=0.6)}) as cluster,
        api_client(cluster.api) as api,
    ):
        v1 = client.CoreV1Api(api)
        v1.create_namespaced_pod("default", pod("slow", "true", image="slow:1"))
        state(v1, "slow", "ContainerCreating")
        assert phase(v1, "slow", "Succeeded")
        pulled = next(m for _, r, m in events(v1, "slow") if r == "Pulled")
        assert pulled.startswith('Successfully pulled image "slow:1" in 0.6')


def test_a_missing_secret_key_is_create_container_config_error_until_it_appears(v1):
    v1.create_namespaced_secret("default", {"metadata": {"name": "s"}, "stringData": {"a": "1"}})
    env = [{"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "b"}}}]
    v1.create_namespaced_pod("default", pod("cfg", 'test "$B" = 2', container={"env": env}))
    waiting = state(v1, "cfg", "CreateContainerConfigError").waiting
    assert waiting.message == "couldn't find key b in Secret default/s"
    assert ("Warning", "Failed", "Error: couldn't find key b in Secret default/s") in events(v1, "cfg")
    v1.patch_namespaced_secret("s", "default", {"stringData": {"b": "2"}})
    assert phase(v1, "cfg", "Succeeded")


def test_a_missing_secret_volume_is_failed_mount(v1):
    body = pod(
        "mount",
        "true",
        container={"volumeMounts": [{"name": "v", "mountPath": "/etc/v"}]},
        volumes=[{"name": "v", "secret": {"secretName": "absent"}}],
    )
    v1.create_namespaced_pod("default", body)
    wait_for(lambda: any(r == "FailedMount" for _, r, _ in events(v1, "mount")))
    message = next(m for _, r, m in events(v1, "mount") if r == "FailedMount")
    assert message == 'MountVolume.SetUp failed for volume "v" : secret "absent" not found'
    assert state(v1, "mount", "ContainerCreating")


def test_oom_killed(cluster, v1):
    v1.create_namespaced_pod("default", pod("oom", "sleep 30"))
    phase(v1, "oom", "Running")
    cluster.oom_kill("default", "oom")
    done = phase(v1, "oom", "Failed")
    terminated = done.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (137, "OOMKilled")


def test_one_container_oom_killed_leaves_the_others_and_the_pod_running(cluster, v1):
    body = with_inits("half", [], [shared("executor", "sleep 30"), shared("job", "sleep 30")])
    del body["spec"]["initContainers"]
    v1.create_namespaced_pod("default", body)
    phase(v1, "half", "Running")
    cluster.oom_kill("default", "half", "executor")

    def executor_ended() -> Any:
        p = v1.read_namespaced_pod("half", "default")
        states = {s.name: s.state for s in p.status.container_statuses}
        return states["executor"].terminated and (p, states)

    p, states = wait_for(executor_ended)
    assert (states["executor"].terminated.exit_code, states["executor"].terminated.reason) == (137, "OOMKilled")
    assert p.status.phase == "Running" and states["job"].running


def test_evicted(cluster, v1):
    v1.create_namespaced_pod("default", pod("ev", "sleep 30"))
    phase(v1, "ev", "Running")
    cluster.evict("default", "ev")
    done = wait_for(  # Failed at once, the container's end follows
        lambda: (p := v1.read_namespaced_pod("ev", "default")).status.container_statuses[0].state.terminated and p
    )
    assert done.status.reason == "Evicted" and done.status.message.startswith("The node was low on resource: memory.")
    assert any(c.type == "DisruptionTarget" and c.reason == "TerminationByKubelet" for c in done.status.conditions)
    assert done.status.container_statuses[0].state.terminated.exit_code == 137


def test_active_deadline_exceeded(v1):
    v1.create_namespaced_pod(
        "default", pod("slow", "sleep 30", activeDeadlineSeconds=1, terminationGracePeriodSeconds=1)
    )
    done = phase(v1, "slow", "Failed")
    assert (done.status.reason, done.status.message) == (
        "DeadlineExceeded",
        "Pod was active on the node longer than the specified deadline",
    )
    assert ("Warning", "DeadlineExceeded", "Pod was active on the node longer than the specified deadline") in events(
        v1, "slow"
    )


def test_a_pod_deleted_by_someone_else_gets_sigterm_then_goes(v1, cluster):
    script = "trap 'echo got-term; exit 143' TERM; echo started; while true; do sleep 0.05; done"
    v1.create_namespaced_pod("default", pod("victim", script, terminationGracePeriodSeconds=5))
    phase(v1, "victim", "Running")
    wait_for(lambda: "started" in next(cluster.root.rglob("main.log")).read_text())
    deleted = v1.delete_namespaced_pod("victim", "default")
    assert deleted.metadata.deletion_timestamp is not None
    wait_for(lambda: not v1.list_namespaced_pod("default", field_selector="metadata.name=victim").items)
    assert "got-term" in next(cluster.root.rglob("main.log")).read_text()
    assert ("Normal", "Killing", "Stopping container main") in events(v1, "victim")


def test_a_lost_node(kube_cluster_factory):
    with (
        kube_cluster_factory(images=IMAGES, node_monitor_grace=0.2, eviction_seconds=0.3) as cluster,
        api_client(cluster.api) as api,
    ):
        v1 = client.CoreV1Api(api)
        v1.create_namespaced_pod("default", pod("stranded", "sleep 30"))
        phase(v1, "stranded", "Running")
        cluster.lose_node("node-a")
        node = wait_for(
            lambda: (
                (n := v1.read_node("node-a"))
                and any(c.type == "Ready" and c.status == "Unknown" for c in n.status.conditions)
                and n
            )
        )
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert (ready.reason, ready.message) == ("NodeStatusUnknown", "Kubelet stopped posting node status.")
        assert {(t.key, t.effect) for t in node.spec.taints} == {
            ("node.kubernetes.io/unreachable", "NoSchedule"),
            ("node.kubernetes.io/unreachable", "NoExecute"),
        }
        terminating = wait_for(
            lambda: (p := v1.read_namespaced_pod("stranded", "default")).metadata.deletion_timestamp and p
        )
        assert terminating.status.phase == "Running", "no kubelet reports the end"
        assert any(
            c.type == "DisruptionTarget" and c.reason == "DeletionByTaintManager" for c in terminating.status.conditions
        )
        assert any(c.type == "Ready" and c.status == "False" for c in terminating.status.conditions)


def test_pod_logs(v1):
    v1.create_namespaced_pod("default", pod("talks", "for i in 1 2 3 4 5; do echo line$i; done"))
    phase(v1, "talks", "Succeeded")
    assert v1.read_namespaced_pod_log("talks", "default") == "line1\nline2\nline3\nline4\nline5\n"
    assert v1.read_namespaced_pod_log("talks", "default", tail_lines=2) == "line4\nline5\n"
    assert v1.read_namespaced_pod_log("talks", "default", container="main", limit_bytes=6) == "line1\n"
    with pytest.raises(client.ApiException) as other:
        v1.read_namespaced_pod_log("talks", "default", container="sidecar")
    assert other.value.status == 400 and "container sidecar is not valid for pod talks" in other.value.body
    v1.create_namespaced_pod("default", pod("pulling", "true", image="registry.example/absent:1"))
    state(v1, "pulling", "ErrImagePull")
    with pytest.raises(client.ApiException) as waiting:
        v1.read_namespaced_pod_log("pulling", "default")
    assert waiting.value.status == 400
    assert (
        'container \\"main\\" in pod \\"pulling\\" is waiting to start: trying and failing to pull image'
        in waiting.value.body
    )


def test_an_unschedulable_pod_is_scheduled_once_room_is_made(kube_cluster_factory):
    with (
        kube_cluster_factory(images=IMAGES, nodes=[NodeSpec("one", pods=1)]) as cluster,
        api_client(cluster.api) as api,
    ):
        v1 = client.CoreV1Api(api)
        v1.create_namespaced_pod("default", pod("first", "sleep 30"))
        phase(v1, "first", "Running")
        v1.create_namespaced_pod("default", pod("second", "true"))
        wait_for(lambda: any(r == "FailedScheduling" for _, r, _ in events(v1, "second")))
        assert "1 Too many pods" in next(m for _, r, m in events(v1, "second") if r == "FailedScheduling")
        v1.delete_namespaced_pod("first", "default", grace_period_seconds=0)
        assert phase(v1, "second", "Succeeded").spec.node_name == "one"
        assert not cluster.api.call(
            lambda: [w for w in cluster.kubelets["one"].workers.values() if w[0].name == "first"]
        )
        assert not any(ref.pod_name == "first" for ref in cluster.registry.values()), (
            "a force-deleted Pod's process is killed"
        )


def test_a_pod_is_failed_with_its_reason_before_its_containers_end(v1, cluster):
    """Past its deadline (or evicted), the Pod reads Failed with the reason from the kubelet's
    first status about it on: no version shows the container ended without the Pod's reason
    (a watcher would take the container's SIGTERM for the cause)."""
    from kubernetes import watch

    start = v1.list_namespaced_pod("default").metadata.resource_version
    v1.create_namespaced_pod(
        "default", pod("late", "trap 'sleep 0.3; exit 143' TERM; sleep 30 & wait", activeDeadlineSeconds=1)
    )
    seen = []
    for event in watch.Watch().stream(v1.list_namespaced_pod, "default", resource_version=start, timeout_seconds=10):
        status = event["object"].status
        ended = any(c.state.terminated for c in status.container_statuses or [])
        seen.append((ended, status.reason))
        if ended and status.phase == "Failed":
            break
    assert [reason for ended, reason in seen if ended] and all(r == "DeadlineExceeded" for e, r in seen if e), seen


def test_stopping_the_cluster_ends_and_reaps_every_container(kube_cluster_factory):
    """Containers still running when the double stops are killed and waited for: none is left
    for the garbage collector to find running (a ResourceWarning in whichever test came next)."""
    import gc

    with kube_cluster_factory(images=IMAGES) as cluster, api_client(cluster.api) as api:
        v1 = client.CoreV1Api(api)
        for name in ("a", "b"):
            v1.create_namespaced_pod("default", pod(name, "trap '' TERM; sleep 30"))
        for name in ("a", "b"):
            phase(v1, name, "Running")
    gc.collect()


def shared(name: str, script: str, **container: Any) -> dict[str, Any]:
    """A busybox container mounting the Pod's emptyDir `tools` at /tools."""
    return {"name": name, "image": SH, "args": [script], "volumeMounts": [{"name": "tools", "mountPath": "/tools"}]} | (
        container
    )


def with_inits(name: str, inits: list[dict[str, Any]], containers: list[dict[str, Any]]) -> dict[str, Any]:
    spec = {"restartPolicy": "Never", "initContainers": inits, "containers": containers}
    return {"metadata": {"name": name}, "spec": {**spec, "volumes": [{"name": "tools", "emptyDir": {}}]}}


def condition_of(p: client.V1Pod, type_: str) -> tuple[str, str | None, str | None]:
    found = next(c for c in p.status.conditions if c.type == type_)
    return found.status, found.reason, found.message


def test_init_containers_run_in_order_each_to_completion_before_the_next_and_the_main_containers(v1, cluster):
    """The second init container stages a program into the shared emptyDir; the sidecar after
    it starts only then; the main container runs the staged program by its container path."""
    stage = "echo second >> /tools/order; printf '#!/bin/sh\\necho staged \"$@\"\\n' > /tools/run; chmod 755 /tools/run"
    body = with_inits(
        "inits",
        [
            shared("first", "sleep 1; echo first >> /tools/order"),
            shared("second", stage),
            shared("side", "echo side >> /tools/order; exec sleep 30", restartPolicy="Always"),
        ],
        [shared("main", "", command=["/tools/run", "hello"], args=[])],
    )
    v1.create_namespaced_pod("default", body)

    def first_running() -> Any:
        p = v1.read_namespaced_pod("inits", "default")
        return any(s.name == "first" and s.state.running for s in p.status.init_container_statuses or []) and p

    during = wait_for(first_running)
    assert during.status.phase == "Pending"
    assert [s.state.waiting.reason for s in during.status.container_statuses] == ["PodInitializing"]
    assert [s.state.waiting.reason for s in during.status.init_container_statuses[1:]] == ["PodInitializing"] * 2
    assert condition_of(during, "Initialized") == (
        "False",
        "ContainersNotInitialized",
        "containers with incomplete status: [first second side]",
    )

    done = phase(v1, "inits", "Succeeded", "Failed")
    assert done.status.phase == "Succeeded", done.status
    assert v1.read_namespaced_pod_log("inits", "default", container="main") == "staged hello\n"
    assert (next(cluster.root.rglob("volumes/tools")) / "order").read_text().split() == ["first", "second", "side"]
    statuses = {s.name: s for s in done.status.init_container_statuses}
    for name in ("first", "second"):
        terminated = statuses[name].state.terminated
        assert (terminated.exit_code, terminated.reason, statuses[name].ready) == (0, "Completed", True)
    assert condition_of(done, "Initialized")[0] == "True"
    side = wait_for(
        lambda: (
            (
                s := next(
                    s
                    for s in v1.read_namespaced_pod("inits", "default").status.init_container_statuses
                    if s.name == "side"
                )
            ).state.terminated
            and s
        )
    )
    assert (side.state.terminated.exit_code, side.ready, side.started) == (143, False, False), "stopped by SIGTERM"
    started = [m.removeprefix("Started container ") for _, r, m in events(v1, "inits") if r == "Started"]
    assert started == ["first", "second", "side", "main"]


def test_a_failing_init_container_fails_the_pod_and_nothing_after_it_runs(v1, cluster):
    body = with_inits(
        "broken",
        [
            shared("ok", "true"),
            shared("bad", "echo no agent here >&2; exit 3", terminationMessagePolicy="FallbackToLogsOnError"),
            shared("never", "touch /tools/never"),
        ],
        [shared("main", "touch /tools/main")],
    )
    v1.create_namespaced_pod("default", body)
    done = phase(v1, "broken", "Failed")
    statuses = {s.name: s for s in done.status.init_container_statuses}
    bad = statuses["bad"].state.terminated
    assert (bad.exit_code, bad.reason, bad.message, statuses["bad"].ready) == (3, "Error", "no agent here", False)
    assert statuses["ok"].state.terminated.reason == "Completed" and statuses["ok"].ready
    assert statuses["never"].state.waiting.reason == "PodInitializing"
    assert done.status.container_statuses[0].state.waiting.reason == "PodInitializing"
    assert condition_of(done, "Initialized") == (
        "False",
        "ContainersNotInitialized",
        "containers with incomplete status: [bad never]",
    )
    assert condition_of(done, "Ready")[:2] == ("False", "PodFailed")
    tools = next(cluster.root.rglob("volumes/tools"))
    assert not (tools / "never").exists() and not (tools / "main").exists()
    started = [m for _, r, m in events(v1, "broken") if r == "Started"]
    assert started == ["Started container ok", "Started container bad"]


def test_a_pod_keeps_running_while_any_container_runs(v1, cluster):
    """restartPolicy Never: `executor` exiting does not end the Pod while `job` still runs; the
    phase comes when both have ended (Failed: the executor's exit 2, though `job` exited 0)."""
    body = with_inits(
        "pair",
        [],
        [shared("executor", "exit 2"), shared("job", "while [ ! -e /tools/stop ]; do sleep 0.05; done")],
    )
    del body["spec"]["initContainers"]
    v1.create_namespaced_pod("default", body)

    def executor_ended() -> Any:
        p = v1.read_namespaced_pod("pair", "default")
        states = {s.name: s.state for s in p.status.container_statuses or []}
        return states.get("executor") and states["executor"].terminated and p

    ended = wait_for(executor_ended)
    for _ in range(10):
        now_ = v1.read_namespaced_pod("pair", "default")
        job = next(s for s in now_.status.container_statuses if s.name == "job")
        assert now_.status.phase == "Running" and job.state.running, now_.status
    (next(cluster.root.rglob("volumes/tools")) / "stop").touch()
    done = phase(v1, "pair", "Succeeded", "Failed")
    states = {s.name: s.state.terminated for s in done.status.container_statuses}
    assert done.status.phase == "Failed" and (states["executor"].exit_code, states["job"].exit_code) == (2, 0)
    assert ended.status.container_statuses[0].state.terminated.exit_code == 2


def test_a_pod_deleted_while_an_init_container_runs_stops_it(v1, cluster):
    script = "trap 'echo got-term; exit 143' TERM; echo started; while true; do sleep 0.05; done"
    body = with_inits("stuck", [shared("wait", script)], [shared("main", "touch /tools/main")])
    body["spec"]["terminationGracePeriodSeconds"] = 5
    v1.create_namespaced_pod("default", body)
    wait_for(lambda: (log := next(cluster.root.rglob("wait.log"), None)) and "started" in log.read_text())
    v1.delete_namespaced_pod("stuck", "default")
    wait_for(lambda: not v1.list_namespaced_pod("default", field_selector="metadata.name=stuck").items)
    assert "got-term" in next(cluster.root.rglob("wait.log")).read_text()
    assert "Started container main" not in [m for _, _, m in events(v1, "stuck")]
    assert not any(ref.pod_name == "stuck" for ref in cluster.registry.values())


def test_a_job_container_runs_the_agent_an_init_container_staged(v1, cluster):
    """The shape of a Pod job with `container:` (docs/containers.md): an init container copies
    the agent into the `emptyDir` at /__dynrunner, the `job` container's command is that copy
    (its path rewritten to the emptyDir's host directory) with its socket there; the Pod stays
    Running after `executor` exits while the agent runs, and a delete stops the agent."""
    from tests.fixtures.agent import agent_binary
    from tests.fixtures.pod_job_containers import agent_processes

    agent = agent_binary()
    mount = [{"name": "agent", "mountPath": "/__dynrunner"}]
    stage = f"cp {agent} /__dynrunner/dynrunner-agent && chmod 0755 /__dynrunner/dynrunner-agent"
    body = {
        "metadata": {"name": "job-pod"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "volumes": [{"name": "agent", "emptyDir": {}}],
            "initContainers": [
                {"name": "dynrunner-agent-install", "image": SH, "args": [stage], "volumeMounts": mount}
            ],
            "containers": [
                {"name": "executor", "image": SH, "args": ["test -S /__dynrunner/agent.sock || sleep 1"]}
                | {"volumeMounts": mount},
                {
                    "name": "job",
                    "image": SH,
                    "command": ["/__dynrunner/dynrunner-agent", "/__dynrunner/agent.sock"],
                    "volumeMounts": mount,
                },
            ],
        },
    }
    v1.create_namespaced_pod("default", body)
    staged = wait_for(
        lambda: (
            (volume := next(cluster.root.rglob("volumes/agent"), None))
            and (volume / "agent.sock").exists()
            and (volume / "agent.sock")
        )
    )
    assert staged.is_socket() and (staged.parent / "dynrunner-agent").stat().st_mode & 0o777 == 0o755
    wait_for(
        lambda: any(
            s.name == "executor" and s.state.terminated
            for s in v1.read_namespaced_pod("job-pod", "default").status.container_statuses
        )
    )
    p = v1.read_namespaced_pod("job-pod", "default")
    assert p.status.phase == "Running" and next(s for s in p.status.container_statuses if s.name == "job").state.running
    assert agent_processes(cluster), "the staged agent runs"
    v1.delete_namespaced_pod("job-pod", "default")
    wait_for(lambda: not v1.list_namespaced_pod("default", field_selector="metadata.name=job-pod").items)
    wait_for(lambda: not agent_processes(cluster))


def test_a_containers_processes_end_with_it_even_in_process_groups_of_their_own(v1, cluster):
    """As the kernel ends a PID namespace with its init: a background job of the container's
    shell in its own process group (`set -m`; an agent's steps are the same) does not outlive it."""
    body = with_inits("bg", [], [shared("main", "set -m; sleep 614 & echo $! > /tools/bg; sleep 0.2")])
    del body["spec"]["initContainers"]
    v1.create_namespaced_pod("default", body)
    assert phase(v1, "bg", "Succeeded", "Failed").status.phase == "Succeeded"
    pid = int((next(cluster.root.rglob("volumes/tools")) / "bg").read_text())
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text())
