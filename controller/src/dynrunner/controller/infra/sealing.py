"""Sealing at rest: AES-256-GCM with the controller's key.

Assignments and armed registrations sit in JetStream; only the controller holds the key.
An assignment is sealed whole — its workflow, URLs and options as well as its secrets — in
a `SealedAssignment` envelope whose readable header is the associated data, so a launcher
runs nothing that was not written, byte for byte, by a holder of the key. An armed
registration is bound to its pool through the associated data, so a sealed value copied
onto another record does not open.

Keys rotate without downtime: the current key seals, retired keys (listed in
`sealing.retiredKeyFiles`) still unseal, and each `Sealed` names its key by `key_id`, a
short hash of the key.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import logging
import os
import secrets
import stat
from collections.abc import Iterable
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from dynrunner.proto.assignment import (
    Assignment,
    AssignmentError,
    EnvelopeHeader,
    Sealed,
    SealedAssignment,
    decode,
    encode,
)

__all__ = [
    "KEY_BYTES",
    "NONCE_BYTES",
    "ForgedAssignment",
    "Sealer",
    "SealingError",
    "dump_sealed",
    "ensure_key_file",
    "key_id",
    "load_sealed",
    "read_key_file",
]

log = logging.getLogger(__name__)

KEY_BYTES = 32
NONCE_BYTES = 12
_STORED_FORMAT = 1
_KEY_ID_DOMAIN = b"dynrunner sealing key id v1\0"
_ENVELOPE_DOMAIN = b"dynrunner assignment envelope\0"


class SealingError(Exception):
    """A key cannot be used, or a sealed value cannot be opened (wrong key, tampered, wrong record)."""


def dump_sealed(sealed: Sealed) -> bytes:
    """The stored form of a sealed value (a registration, a finalize record): small JSON."""
    return json.dumps(
        {
            "format": _STORED_FORMAT,
            "key_id": sealed.key_id,
            "nonce": base64.b64encode(sealed.nonce).decode(),
            "ciphertext": base64.b64encode(sealed.ciphertext).decode(),
        },
        separators=(",", ":"),
    ).encode()


def load_sealed(data: bytes, what: str) -> Sealed:
    """A sealed value from its stored form; SealingError naming `what` if it is none."""
    try:
        envelope = json.loads(data)
        if envelope.get("format") != _STORED_FORMAT:
            raise SealingError(f"unknown record format {envelope.get('format')!r}")
        return Sealed(
            key_id=str(envelope["key_id"]),
            nonce=base64.b64decode(envelope["nonce"]),
            ciphertext=base64.b64decode(envelope["ciphertext"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise SealingError(f"{what} is not a sealed record: {err}") from None


class ForgedAssignment(SealingError):
    """A sealed assignment that does not authenticate under the key it names, or whose header
    does not match what it seals: written or altered by someone without the key."""


def key_id(key: bytes) -> str:
    """A short, stable, non-secret name for `key` (16 hex digits of a domain-separated SHA-256)."""
    return hashlib.sha256(_KEY_ID_DOMAIN + key).hexdigest()[:16]


def key_file_exposure(info: os.stat_result, euid: int) -> str:
    """Who besides its owner may use a key file with `info`, read by a process of `euid`; ""
    when no one. A file owned by root, not by the reader, that its group may only read is how
    the kubelet mounts a Secret into a non-root container (owner root, group the Pod's fsGroup,
    mode 0440: the reader's access is that group's, and it cannot chmod what is not its own),
    so it is accepted; group access to a file the reader owns (or when root reads) is not."""
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o007:
        return "readable by other users"
    if mode & 0o030:
        return "writable by its group"
    if mode & 0o040 and (info.st_uid != 0 or euid == 0):
        return "readable by its group"
    return ""


def read_key_file(path: Path) -> bytes:
    """A 256-bit key from `path`: 32 raw bytes, or the key as base64 or hex text."""
    try:
        data = path.read_bytes()
        info = path.stat()
    except OSError as err:
        raise SealingError(f"sealing key file {path} cannot be read: {err.strerror or err}") from None
    exposure = key_file_exposure(info, os.geteuid())
    if exposure:
        log.warning("sealing key file %s is %s (mode %o); make it 0600", path, exposure, stat.S_IMODE(info.st_mode))
    if len(data) == KEY_BYTES:
        return data
    text = data.strip()
    if len(text) == 2 * KEY_BYTES:
        with contextlib.suppress(ValueError):
            return bytes.fromhex(text.decode("ascii"))
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) == KEY_BYTES:
        return key
    raise SealingError(
        f"sealing key file {path} must hold a 256-bit key: 32 raw bytes, 64 hex digits or base64 of 32 bytes "
        f"(it holds {len(data)} bytes that are none of these)"
    )


def ensure_key_file(path: Path) -> Path:
    """Create `path` with a fresh random key (base64, mode 0600) unless it exists; return `path`."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = base64.b64encode(secrets.token_bytes(KEY_BYTES)) + b"\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path  # another process created it first; use theirs
    with os.fdopen(fd, "wb") as out:
        out.write(text)
    return path


class Sealer:
    """Seals with the current key; unseals with the current or any retired key."""

    def __init__(self, key: bytes, retired: Iterable[bytes] = ()) -> None:
        keys = [key, *retired]
        for one in keys:
            if len(one) != KEY_BYTES:
                raise SealingError(f"a sealing key must be {KEY_BYTES} bytes, not {len(one)}")
        self._key_id = key_id(key)
        self._seal_with = AESGCM(key)
        self._open_with = {key_id(one): AESGCM(one) for one in keys}

    @classmethod
    def from_key_file(cls, path: Path, retired: Iterable[Path] = ()) -> Sealer:
        return cls(read_key_file(path), [read_key_file(p) for p in retired])

    @property
    def key_id(self) -> str:
        return self._key_id

    def seal(self, aad: str, data: bytes) -> Sealed:
        nonce = secrets.token_bytes(NONCE_BYTES)
        return Sealed(key_id=self._key_id, nonce=nonce, ciphertext=self._seal_with.encrypt(nonce, data, aad.encode()))

    def _opener(self, key_id: str, what: str = "") -> AESGCM:
        aead = self._open_with.get(key_id)
        if aead is None:
            raise SealingError(
                f"{what}sealed with key {key_id!r}, which this controller does not hold "
                f"(current key {self._key_id!r}); list the old key file under sealing.retiredKeyFiles"
            )
        return aead

    def unseal(self, aad: str, sealed: Sealed) -> bytes:
        aead = self._opener(sealed.key_id)
        if len(sealed.nonce) != NONCE_BYTES:
            raise SealingError(f"sealed value has a {len(sealed.nonce)}-byte nonce, expected {NONCE_BYTES}")
        try:
            return aead.decrypt(sealed.nonce, sealed.ciphertext, aad.encode())
        except InvalidTag:
            raise SealingError(
                f"sealed value for {aad!r} does not open with key {sealed.key_id!r}: "
                "it was altered, or it belongs to another record"
            ) from None

    def seal_assignment(self, a: Assignment) -> SealedAssignment:
        """`a`, secrets included, sealed whole under a header naming it and the key."""
        header = EnvelopeHeader(assignment_id=a.assignment_id, pool=a.pool, task_id=a.task.id, key_id=self._key_id)
        header_bytes = header.to_bytes()
        nonce = secrets.token_bytes(NONCE_BYTES)
        ciphertext = self._seal_with.encrypt(nonce, encode(a.replace(sealed=None)), _ENVELOPE_DOMAIN + header_bytes)
        return SealedAssignment(header=header, header_bytes=header_bytes, nonce=nonce, ciphertext=ciphertext)

    def unseal_assignment(self, sealed: SealedAssignment) -> Assignment:
        """The assignment, once it is proven to come from a holder of the key. ForgedAssignment
        if it does not authenticate or its header does not match its content; SealingError
        if the key it names is not held here."""
        header = sealed.header
        aead = self._opener(header.key_id, f"assignment {header.assignment_id} is ")
        if len(sealed.nonce) != NONCE_BYTES:
            raise ForgedAssignment(f"assignment {header.assignment_id} has a {len(sealed.nonce)}-byte nonce")
        try:
            plain = aead.decrypt(sealed.nonce, sealed.ciphertext, _ENVELOPE_DOMAIN + sealed.header_bytes)
        except InvalidTag:
            raise ForgedAssignment(
                f"assignment {header.assignment_id} does not authenticate with key {header.key_id!r}: "
                "it was altered, or made, by someone without the sealing key"
            ) from None
        try:
            a = decode(plain)
        except AssignmentError as err:
            raise SealingError(f"assignment {header.assignment_id} is authentic but cannot be read: {err}") from None
        if (a.assignment_id, a.pool, a.task.id) != (header.assignment_id, header.pool, header.task_id):
            raise ForgedAssignment(
                f"assignment {header.assignment_id}: the header (pool {header.pool!r}, task {header.task_id}) "
                f"does not match the sealed assignment {a.assignment_id} (pool {a.pool!r}, task {a.task.id})"
            )
        return a
