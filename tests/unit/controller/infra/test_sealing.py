"""Sealing: round trip, nothing but the header readable in a sealed assignment, any change
refused (tamper, splice, forged header, another key under our key id), wrong key, wrong
record (AAD), the previous format told apart, key rotation, and key files in every form."""

from __future__ import annotations

import base64
import dataclasses
import os
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st

from dynrunner.controller.infra.sealing import (
    ForgedAssignment,
    Sealer,
    SealingError,
    ensure_key_file,
    key_file_exposure,
    key_id,
    read_key_file,
)
from dynrunner.proto.assignment import (
    Assignment,
    AssignmentError,
    ClaimingRunner,
    EnvelopeHeader,
    NewerEnvelope,
    NotAnEnvelope,
    Sealed,
    SealedAssignment,
    decode_sealed,
    encode,
    encode_sealed,
)
from dynrunner.proto.gitea import Task

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))
SECRETS = {
    "DEPLOY_KEY": "s3cr3t-deploy-Q9",
    "GITHUB_TOKEN": "task-token-XA7",
    "MULTI": "line-one-7\nline-two-8",
}
TASK_TOKEN, RUNTIME_TOKEN, RUNNER_TOKEN = "task-token-XA7", "eyJ.runtime.jwt-K2", "runner-token-P5"


def assignment(assignment_id: str = "a-1") -> Assignment:
    return Assignment(
        assignment_id=assignment_id,
        pool="pod",
        backend="local",
        claimed_at=datetime(2026, 11, 29, 10, 0, tzinfo=UTC),
        task=Task(
            id=42,
            workflow_payload=b"jobs: {build: {runs-on: [self-hosted, pod]}}",
            context={"token": TASK_TOKEN, "gitea_runtime_token": RUNTIME_TOKEN, "repository": "o/r"},
            secrets=SECRETS,
            vars={"REGION": "eu"},
        ),
        runner=ClaimingRunner(id=3, uuid="uuid-3", token=RUNNER_TOKEN, name="dynrunner-pod-x"),
        gitea_url="http://gitea:3000",
        job_key="build",
    )


def test_seal_and_unseal_round_trip() -> None:
    sealer = Sealer(KEY)
    sealed = sealer.seal("aad-1", b"payload")
    assert sealed.key_id == key_id(KEY) == sealer.key_id
    assert len(sealed.nonce) == 12
    assert b"payload" not in sealed.ciphertext
    assert sealer.unseal("aad-1", sealed) == b"payload"


def test_every_seal_uses_a_fresh_nonce() -> None:
    sealer = Sealer(KEY)
    nonces = {sealer.seal("a", b"same").nonce for _ in range(100)}
    assert len(nonces) == 100


@given(aad=st.text(max_size=50), data=st.binary(max_size=2048))
def test_round_trip_any_data(aad: str, data: bytes) -> None:
    sealer = Sealer(KEY)
    assert sealer.unseal(aad, sealer.seal(aad, data)) == data


def test_sealed_assignment_keeps_nothing_readable_but_its_header() -> None:
    original = assignment()
    sealed = Sealer(KEY).seal_assignment(original)
    wire = encode_sealed(sealed)
    for secret in [*SECRETS.values(), TASK_TOKEN, RUNTIME_TOKEN, RUNNER_TOKEN, "line-one-7", "line-two-8"]:
        assert secret.encode() not in wire, secret
    for public in [b"runs-on", b"http://gitea:3000", b"o/r", b"build"]:
        assert public not in wire, public  # the workflow and settings are sealed too
    assert decode_sealed(wire).header == EnvelopeHeader(assignment_id="a-1", pool="pod", task_id=42, key_id=key_id(KEY))


def test_unseal_assignment_restores_it_exactly() -> None:
    sealer = Sealer(KEY)
    original = assignment()
    assert sealer.unseal_assignment(decode_sealed(encode_sealed(sealer.seal_assignment(original)))) == original


@settings(max_examples=300)
@given(data=st.data())
def test_any_changed_byte_is_refused(data: st.DataObject) -> None:
    """Whatever byte of the message an attacker changes — header, nonce, ciphertext, framing —
    the message either is no envelope any more or does not authenticate."""
    sealer = Sealer(KEY)
    wire = bytearray(encode_sealed(sealer.seal_assignment(assignment())))
    at = data.draw(st.integers(0, len(wire) - 1))
    wire[at] ^= data.draw(st.integers(1, 255))
    try:
        changed = decode_sealed(bytes(wire))
    except AssignmentError:
        return
    with pytest.raises(SealingError):
        sealer.unseal_assignment(changed)


def test_every_truncation_and_extension_is_refused() -> None:
    """A message cut short at any byte, or with bytes appended, never opens: it is no envelope
    any more, or it does not authenticate (GCM's tag covers the whole ciphertext)."""
    sealer = Sealer(KEY)
    wire = encode_sealed(sealer.seal_assignment(assignment()))
    for changed in [wire[:cut] for cut in range(len(wire))] + [wire + b"\0", wire + wire[-16:]]:
        try:
            sealed = decode_sealed(changed)
        except AssignmentError:
            continue
        with pytest.raises(SealingError):
            sealer.unseal_assignment(sealed)


def test_a_ciphertext_moved_under_another_assignments_header_is_refused() -> None:
    """The sealed body of one assignment put under the header of another (its id, pool and
    task), with or without that one's nonce: nothing opens, so no id can be swapped."""
    sealer = Sealer(KEY)
    first, second = sealer.seal_assignment(assignment("a-1")), sealer.seal_assignment(assignment("a-2"))
    for nonce in (first.nonce, second.nonce):
        moved = dataclasses.replace(first, nonce=nonce, ciphertext=second.ciphertext)
        with pytest.raises(ForgedAssignment):
            sealer.unseal_assignment(decode_sealed(encode_sealed(moved)))


def test_a_header_changed_or_moved_onto_another_message_is_refused() -> None:
    sealer = Sealer(KEY)
    first, second = sealer.seal_assignment(assignment("a-1")), sealer.seal_assignment(assignment("a-2"))
    spliced = dataclasses.replace(second, header=first.header, header_bytes=first.header_bytes)
    with pytest.raises(ForgedAssignment, match="a-1 does not authenticate"):
        sealer.unseal_assignment(spliced)
    other_pool = dataclasses.replace(first.header, pool="gpu")
    moved = dataclasses.replace(first, header=other_pool, header_bytes=other_pool.to_bytes())
    with pytest.raises(ForgedAssignment, match="does not authenticate"):
        sealer.unseal_assignment(moved)


def test_an_assignment_sealed_by_someone_else_is_refused_even_under_our_key_id() -> None:
    """An attacker's own key, with our key id in the header: forged, not merely unknown."""
    attacker = Sealer(OTHER_KEY).seal_assignment(assignment())
    header = dataclasses.replace(attacker.header, key_id=key_id(KEY))
    claimed = dataclasses.replace(attacker, header=header, header_bytes=header.to_bytes())
    with pytest.raises(ForgedAssignment):
        Sealer(KEY).unseal_assignment(claimed)


def test_a_header_that_does_not_match_the_sealed_assignment_is_refused() -> None:
    """Only a holder of the key can make this; the check keeps header and content one thing."""
    sealer = Sealer(KEY)
    header = EnvelopeHeader(assignment_id="a-1", pool="pod", task_id=7, key_id=sealer.key_id)
    nonce = bytes(12)
    ciphertext = AESGCM(KEY).encrypt(
        nonce, encode(assignment()), b"dynrunner assignment envelope\0" + header.to_bytes()
    )
    lying = SealedAssignment(header=header, header_bytes=header.to_bytes(), nonce=nonce, ciphertext=ciphertext)
    with pytest.raises(ForgedAssignment, match="does not match the sealed assignment"):
        sealer.unseal_assignment(lying)


def test_the_previous_format_is_told_apart() -> None:
    """An Assignment written straight onto the stream, its secrets sealed, as before envelopes."""
    public = assignment().replace(sealed=Sealed(key_id=key_id(KEY), nonce=bytes(12), ciphertext=b"x"))
    with pytest.raises(NotAnEnvelope) as caught:
        decode_sealed(encode(public))
    assert caught.value.previous_format
    with pytest.raises(NotAnEnvelope) as garbage:
        decode_sealed(b"\x00garbage")
    assert not garbage.value.previous_format


def test_a_newer_envelope_format_is_told_apart() -> None:
    sealed = Sealer(KEY).seal_assignment(assignment())
    newer = dataclasses.replace(sealed.header, format=2)
    with pytest.raises(NewerEnvelope):
        decode_sealed(encode_sealed(dataclasses.replace(sealed, header=newer, header_bytes=newer.to_bytes())))


def test_wrong_key_is_refused_naming_the_key_id() -> None:
    sealed = Sealer(KEY).seal_assignment(assignment())
    with pytest.raises(SealingError, match=f"sealed with key '{key_id(KEY)}'.*retiredKeyFiles") as caught:
        Sealer(OTHER_KEY).unseal_assignment(sealed)
    assert not isinstance(caught.value, ForgedAssignment)  # retried: another replica may hold the key


def test_same_key_id_but_other_key_is_refused() -> None:
    sealed = Sealer(KEY).seal("x", b"data")
    forged = Sealed(key_id=key_id(OTHER_KEY), nonce=sealed.nonce, ciphertext=sealed.ciphertext)
    with pytest.raises(SealingError, match="does not open"):
        Sealer(OTHER_KEY).unseal("x", forged)


def test_retired_key_still_opens_and_new_key_seals() -> None:
    old = Sealer(KEY).seal_assignment(assignment())
    rotated = Sealer(OTHER_KEY, retired=[KEY])
    assert rotated.unseal_assignment(old) == assignment()
    fresh = rotated.seal_assignment(assignment())
    assert fresh.header.key_id == key_id(OTHER_KEY)
    with pytest.raises(SealingError):
        Sealer(KEY).unseal_assignment(fresh)


def test_key_must_be_32_bytes() -> None:
    with pytest.raises(SealingError, match="must be 32 bytes, not 16"):
        Sealer(bytes(16))


@pytest.mark.parametrize(
    "content",
    [KEY, KEY.hex().encode(), KEY.hex().upper().encode() + b"\n", base64.b64encode(KEY) + b"\n"],
    ids=["raw", "hex", "HEX-newline", "base64"],
)
def test_key_file_forms(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "key"
    path.write_bytes(content)
    assert read_key_file(path) == KEY
    assert Sealer.from_key_file(path).key_id == key_id(KEY)


@pytest.mark.parametrize(
    "content", [b"", b"short", bytes(31), bytes(33), base64.b64encode(bytes(16)), b"zz" * 32], ids=str
)
def test_key_file_of_wrong_size_is_refused_clearly(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "key"
    path.write_bytes(content)
    with pytest.raises(SealingError, match=r"must hold a 256-bit key: 32 raw bytes, 64 hex digits or base64"):
        read_key_file(path)


def test_key_file_readable_by_others_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "key"
    path.write_bytes(KEY)
    path.chmod(0o644)
    assert read_key_file(path) == KEY
    assert "is readable by other users (mode 644); make it 0600" in caplog.text
    caplog.clear()
    path.chmod(0o640)
    read_key_file(path)
    assert "is readable by its group (mode 640); make it 0600" in caplog.text
    caplog.clear()
    path.chmod(0o600)
    read_key_file(path)
    assert caplog.text == ""


def _stat(mode: int, uid: int) -> os.stat_result:
    return os.stat_result((stat.S_IFREG | mode, 1, 1, 1, uid, 1001, 44, 0, 0, 0))


@pytest.mark.parametrize(
    ("mode", "owner", "reader", "exposure"),
    [
        (0o600, 1001, 1001, ""),
        (0o400, 1001, 1001, ""),
        (0o440, 0, 1001, ""),  # a Secret the kubelet mounted for fsGroup 1001 (defaultMode 0440)
        (0o440, 1001, 1001, "readable by its group"),  # the reader's own file: it can chmod it
        (0o440, 0, 0, "readable by its group"),  # root reads: it can chmod it
        (0o640, 5, 1001, "readable by its group"),  # owned by another user than root
        (0o460, 0, 1001, "writable by its group"),
        (0o444, 0, 1001, "readable by other users"),
        (0o644, 1001, 1001, "readable by other users"),
    ],
)
def test_key_file_exposure(mode: int, owner: int, reader: int, exposure: str) -> None:
    """Group-readable is fine only where the reader cannot change it: the kubelet's Secret
    volumes, root-owned and readable by the Pod's fsGroup (the Helm chart mounts them 0440)."""
    assert key_file_exposure(_stat(mode, owner), reader) == exposure


def test_missing_key_file(tmp_path: Path) -> None:
    with pytest.raises(SealingError, match="cannot be read: No such file"):
        Sealer.from_key_file(tmp_path / "absent")


def test_from_key_file_with_retired_keys(tmp_path: Path) -> None:
    (tmp_path / "new").write_bytes(OTHER_KEY)
    (tmp_path / "old").write_text(KEY.hex())
    old_sealed = Sealer(KEY).seal("r", b"v")
    assert Sealer.from_key_file(tmp_path / "new", [tmp_path / "old"]).unseal("r", old_sealed) == b"v"


def test_ensure_key_file_creates_a_private_random_key_once(tmp_path: Path) -> None:
    path = tmp_path / "state" / "sealing.key"
    assert ensure_key_file(path) == path
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    key = read_key_file(path)
    assert len(key) == 32 and key != bytes(32)
    ensure_key_file(path)
    assert read_key_file(path) == key  # never overwritten
    other = tmp_path / "other.key"
    ensure_key_file(other)
    assert read_key_file(other) != key
