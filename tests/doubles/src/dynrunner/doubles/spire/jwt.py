"""A trust domain's JWT signing key and the JWT-SVIDs it signs, shaped as SPIRE's server makes
them (pkg/server/credtemplate, pkg/common/jwtsvid): ES256 over P-256, header `kid` and
`typ: JWT`, claims `sub` (the SPIFFE ID), `aud` (a string for one audience, a list for more, as
go-jose marshals it), `iat` and `exp` (default TTL 5 minutes, SPIRE's default_jwt_svid_ttl), and
`iss` when an issuer is set (the server's `jwt_issuer`).
The bundle is the JWKS the Workload API's FetchJWTBundles and SPIRE's OIDC discovery provider
publish (`use: jwt-svid`)."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

DEFAULT_JWT_SVID_TTL_S = 300.0


class JwtValidationError(Exception):
    """A token that this authority did not sign, or not for that audience, or expired."""


class JwtAuthority:
    def __init__(self, trust_domain: str, ttl_s: float = DEFAULT_JWT_SVID_TTL_S, issuer: str = "") -> None:
        self.trust_domain = trust_domain
        self.ttl_s = ttl_s
        self.issuer = issuer
        """SPIRE server's `jwt_issuer`: the `iss` claim, none when empty (SPIRE's default)."""
        self.key_id = secrets.token_hex(16)
        self._key = ec.generate_private_key(ec.SECP256R1())

    def sign(self, spiffe_id: str, audience: Sequence[str], ttl_s: float | None = None) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "sub": spiffe_id,
            "aud": audience[0] if len(audience) == 1 else list(audience),
            "iat": now,
            "exp": now + int(self.ttl_s if ttl_s is None else ttl_s),
        }
        if self.issuer:
            claims["iss"] = self.issuer
        return jwt.encode(claims, self._key, algorithm="ES256", headers={"kid": self.key_id, "typ": "JWT"})

    def jwks(self) -> dict[str, Any]:
        key = json.loads(ECAlgorithm.to_jwk(self._key.public_key()))
        key.update(kid=self.key_id, use="jwt-svid")
        return {"keys": [key]}

    def jwks_bytes(self) -> bytes:
        return json.dumps(self.jwks()).encode()

    def validate(self, token: str, audience: str) -> dict[str, Any]:
        """The claims of a token this authority signed for `audience` that has not expired."""
        try:
            header = jwt.get_unverified_header(token)
            if header.get("kid") != self.key_id:
                raise JwtValidationError(f"key {header.get('kid')!r} is not an authority of {self.trust_domain}")
            key = self._key.public_key()
            require: Any = {"require": ["exp", "sub"]}
            claims: dict[str, Any] = jwt.decode(token, key, algorithms=["ES256"], audience=audience, options=require)
        except jwt.PyJWTError as err:
            raise JwtValidationError(str(err)) from None
        return claims
