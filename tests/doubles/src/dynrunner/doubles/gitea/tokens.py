"""Tokens as Gitea makes and checks them.

* Registration tokens: 40 random alphanumerics (`util.CryptoRandomString(40)`).
* Runner and task tokens: 20 random bytes as 40 lowercase hex, stored only as a salted
  PBKDF2-HMAC-SHA256 hash (`models/actions/utils.go` `generateSaltedToken`,
  `models/auth/twofactor.go` `HashToken`: 10 000 iterations, 50-byte key, hex) and
  compared in constant time (`routers/api/actions/runner/interceptor.go`).
* `gitea_runtime_token`: an HS256 JWT with Gitea's claims (`services/actions/auth.go`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import string
from dataclasses import dataclass

DEFAULT_PBKDF2_ITERATIONS = 10_000
_ALNUM = string.ascii_letters + string.digits
ENDLESS_TASK_TIMEOUT_S = 3 * 3600


def random_alnum(length: int) -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(length))


def hash_token(token: str, salt: str, iterations: int) -> str:
    return hashlib.pbkdf2_hmac("sha256", token.encode(), salt.encode(), iterations, dklen=50).hex()


@dataclass(frozen=True, slots=True)
class SaltedToken:
    token: str
    salt: str
    hash: str

    @property
    def last_eight(self) -> str:
        return self.token[-8:]


def new_salted_token(iterations: int) -> SaltedToken:
    salt = random_alnum(10)
    token = secrets.token_bytes(20).hex()
    return SaltedToken(token=token, salt=salt, hash=hash_token(token, salt, iterations))


def token_matches(token: str, salt: str, stored_hash: str, iterations: int) -> bool:
    return hmac.compare_digest(stored_hash.encode(), hash_token(token, salt, iterations).encode())


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def runtime_token(
    secret: bytes, *, task_id: int, run_id: int, job_id: int, now: int, ttl_s: int = 3600 + ENDLESS_TASK_TIMEOUT_S
) -> str:
    """`CreateAuthorizationToken`: claims in Go's field order (registered claims first); it
    expires `ttl_s` after `now` (1 h + ENDLESS_TASK_TIMEOUT since v1.24.6, 24 h before)."""
    header = {"alg": "HS256", "typ": "JWT"}
    cache_scope = json.dumps([{"Scope": "", "Permission": 2}], separators=(",", ":"))
    claims = {
        "exp": now + ttl_s,
        "nbf": now,
        "scp": f"Actions.Results:{run_id}:{job_id}",
        "TaskID": task_id,
        "RunID": run_id,
        "JobID": job_id,
        "ac": cache_scope,
    }
    signing_input = ".".join(_b64url(json.dumps(p, separators=(",", ":")).encode()) for p in (header, claims))
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64url(signature)}"


def decode_runtime_token(token: str, secret: bytes) -> dict[str, object]:
    """Verify and decode a runtime token (for tests and the admin API)."""
    signing_input, _, signature = token.rpartition(".")
    expected = _b64url(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())
    if not hmac.compare_digest(expected, signature):
        raise ValueError("bad runtime token signature")
    payload = signing_input.split(".")[1]
    decoded: dict[str, object] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return decoded
