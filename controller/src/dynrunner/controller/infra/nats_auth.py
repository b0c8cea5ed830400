"""How the controller proves itself to NATS: nats-py connect options from `nats:` settings.

An external server is reached with one of user/password, token, a `.creds` file (user JWT
and nkey seed) or an nkey seed file, optionally over TLS with a CA and a client certificate
(all secrets from files, read at start). The embedded server makes its own credentials
(`EmbeddedNats.client_options`).
"""

from __future__ import annotations

import ssl
from typing import Any

from dynrunner.controller.config.model import NatsConfig, NatsTlsConfig

__all__ = ["anonymous_options", "client_options", "tls_context"]


def client_options(cfg: NatsConfig) -> dict[str, Any]:
    """Keyword arguments for `nats.connect` besides the servers."""
    options = anonymous_options(cfg)
    password, token = cfg.password(), cfg.token()
    if cfg.user is not None and password is not None:
        options.update(user=cfg.user, password=password)
    if token is not None:
        options["token"] = token
    if cfg.creds_file is not None:
        options["user_credentials"] = str(cfg.creds_file)
    if cfg.nkey_seed_file is not None:
        options["nkeys_seed"] = str(cfg.nkey_seed_file)
    return options


def anonymous_options(cfg: NatsConfig) -> dict[str, Any]:
    """The same connection without credentials (TLS only): what `check` tries, to tell whether
    the server lets anyone in."""
    return {"tls": tls_context(cfg.tls)} if cfg.tls.enabled else {}


def tls_context(tls: NatsTlsConfig) -> ssl.SSLContext:
    """Verify the server against `caFile` (else the system's CAs); present the client
    certificate if one is configured."""
    context = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file is not None else None)
    if tls.cert_file is not None and tls.key_file is not None:
        context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    return context
