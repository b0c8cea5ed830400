"""A job's sandbox as pure functions: metadata, the create request, its expiry and renewals,
what the executor in the VM is told, the delivery, the agent's alias."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from dynrunner.controller import contract
from dynrunner.controller.backends.opensandbox import builders
from dynrunner.controller.backends.opensandbox.builders import VmSettings
from dynrunner.controller.backends.opensandbox.config import OpenSandboxBackendConfig
from dynrunner.controller.config.model import IdentityConfig
from tests.fixtures.opensandbox_backend import vm_assignment

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
AID = "0b6d7d6e-5a8e-4f0e-9a55-3d7c9a6f0c11"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def settings(**options: Any) -> VmSettings:
    backend = OpenSandboxBackendConfig(url="https://osb", image="reg/vm:1", **options)
    return VmSettings(pool="vm", backend=backend, trust_domain="example.org")


def test_metadata_is_the_contract_labels_as_plain_dns_label_keys_with_label_safe_values() -> None:
    a = vm_assignment(AID, deadline=NOW + timedelta(hours=1))
    metadata = builders.sandbox_metadata(a, stream_seq=42)
    assert metadata == {
        "dynrunner-assignment-id": AID,
        "dynrunner-task-id": "7",
        "dynrunner-pool": "vm",
        "dynrunner-repository": "owner.repo",
        "dynrunner-job-key": "build",
        "dynrunner-stream-seq": "42",
        "dynrunner-stage": "created",
        "dynrunner-deadline": str(int((NOW + timedelta(hours=1)).timestamp())),
    }
    assert all(DNS_LABEL.match(k) and LABEL_VALUE.match(v) for k, v in metadata.items())
    assert builders.labels_of(metadata) == contract.environment_labels(a, 42)
    assert builders.deadline_of(metadata) == NOW + timedelta(hours=1)
    assert builders.stage_of({**metadata, "dynrunner-stage": "bogus"}) == "created"


def test_the_request_boots_the_vm_image_with_non_secret_env_only() -> None:
    a = vm_assignment(AID, deadline=NOW + timedelta(hours=6))
    request = builders.sandbox_request(a, settings(env={"SPIRE_SERVER_ADDRESS": "spire.example"}), now=NOW)
    assert request.image == "reg/vm:1" and request.template_id == ""
    assert request.entrypoint == ("/usr/local/bin/dynrunner-vm-entrypoint",)
    assert request.env == {
        "SPIRE_SERVER_ADDRESS": "spire.example",
        "SPIFFE_AGENT_SOCKET": "/run/spire/agent/public/api.sock",
        "DYNRUNNER_DELIVERY_TIMEOUT_SECONDS": "1200",
    }
    assert request.resources == {"cpu": "2", "memory": "4Gi"}
    assert request.timeout_s == 1200  # one lease: renewed while the job runs
    flat = repr(request)
    assert "runner-token" not in flat and "s3cr3t" not in flat


def test_a_template_request_carries_only_what_a_template_takes() -> None:
    cfg = OpenSandboxBackendConfig(url="https://osb", template_id="tpl-1")
    request = builders.sandbox_request(vm_assignment(AID), VmSettings("vm", cfg, "example.org"), now=NOW)
    assert (request.template_id, request.image, request.entrypoint, dict(request.env)) == ("tpl-1", "", (), {})
    assert dict(request.resources) == {} and request.timeout_s == 1200


def test_the_expiry_is_a_lease_away_never_past_the_deadline_plus_grace_never_under_a_minute() -> None:
    cfg = settings(lease_s=1200, timeout_s=600).backend
    assert builders.expires_at(None, cfg, NOW) == NOW + timedelta(seconds=1200)
    assert builders.expires_at(NOW + timedelta(hours=5), cfg, NOW) == NOW + timedelta(seconds=1200)
    assert builders.expires_at(NOW + timedelta(seconds=100), cfg, NOW) == NOW + timedelta(seconds=700)
    assert builders.expires_at(NOW - timedelta(hours=1), cfg, NOW) == NOW + timedelta(seconds=60)
    assert not builders.renewal_due(NOW + timedelta(seconds=601), cfg, NOW)
    assert builders.renewal_due(NOW + timedelta(seconds=599), cfg, NOW)
    assert not builders.renewal_due(None, cfg, NOW)


def test_the_executor_in_the_vm_waits_for_its_identity_on_the_agents_socket() -> None:
    needs = settings(identity=True).backend.executor_needs(IdentityConfig(svid_timeout_s=90))
    assert needs.identity.enabled
    assert needs.identity.workload_api_socket == "/run/spire/agent/public/api.sock"
    assert needs.identity.timeout_seconds == 90
    assert needs.workspace == "/home/runner/work"
    plain = settings(identity=False).backend.executor_needs(IdentityConfig())
    assert not plain.identity.enabled and plain.identity.workload_api_socket == ""


def test_the_delivery_has_the_token_and_bundle_only_with_identity() -> None:
    assert builders.delivery_files(b"pb") == {"assignment.pb": b"pb"}
    assert builders.delivery_files(b"pb", join_token="t", bundle_pem=b"B") == {
        "assignment.pb": b"pb",
        "join-token": b"t",
        "bundle.pem": b"B",
    }
    assert builders.PARTIAL_DIR == "/run/dynrunner/delivery.partial"
    assert builders.agent_alias("example.org", "vm", AID) == f"spiffe://example.org/dynrunner/agent/vm/{AID}"


def test_metadata_no_job_of_ours_has_is_skipped_not_raised_on() -> None:
    """Whoever may patch a sandbox's metadata could write `²` (a digit to `str.isdigit`, not to
    `int`) or a number no date holds: such a sandbox is not one of our jobs, and reading it must
    not raise (issue 19 item 6: it broke the pool's listing)."""
    good = builders.sandbox_metadata(vm_assignment(deadline=datetime(2030, 1, 1, tzinfo=UTC)), stream_seq=5)
    assert builders.is_job_sandbox(good, "vm") and builders.malformed(good) == ""
    assert builders.deadline_of(good) == datetime(2030, 1, 1, tzinfo=UTC)
    for key, value in [
        ("dynrunner-deadline", "²"),
        ("dynrunner-deadline", "9" * 400),
        ("dynrunner-deadline", "99999999999999999"),
        ("dynrunner-task-id", "²"),
        ("dynrunner-task-id", "7" * 400),
        ("dynrunner-stream-seq", "٣"),
        ("dynrunner-assignment-id", ""),
    ]:
        bad = {**good, key: value}
        assert not builders.is_job_sandbox(bad, "vm"), (key, value)
        assert builders.malformed(bad), (key, value)
        builders.deadline_of(bad)  # never raises: None or a time
    assert builders.deadline_of({"dynrunner-deadline": "²"}) is None
    assert builders.deadline_of({"dynrunner-deadline": "9" * 400}) is None
