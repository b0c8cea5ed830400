"""`dynrunner-identity`: the job's workload identity for tools that are not actions.

    dynrunner-identity jwt --audience sts.amazonaws.com   # a JWT-SVID on stdout
    dynrunner-identity x509 --out DIR                     # DIR/svid.pem, key.pem, bundle.pem (0600)
    dynrunner-identity bundle                             # the trust domain's JWKS (--x509: PEM CAs)

It asks the SPIFFE Workload API (`--socket`, else SPIFFE_ENDPOINT_SOCKET) with py-spiffe,
directly, as any SPIFFE-aware tool would: it needs no `permissions:` (the Workload API answers
every process of the job's environment; docs/identity.md says why that is the boundary). Inside
a job (GITHUB_ACTIONS=true) `jwt` also writes `::add-mask::<token>` to stderr, so the token is
masked in the job log even if a later command prints it.

Exit status: 0 done; 1 the Workload API gave no identity (the reason on stderr); 2 usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynrunner.executor.identity import workload_api_endpoint

EXIT_NO_IDENTITY = 1


class _Failure(Exception):
    pass


def _client(args: argparse.Namespace) -> Any:
    endpoint = workload_api_endpoint(args.socket or "")
    if not endpoint:
        raise _Failure("no Workload API socket: pass --socket or set SPIFFE_ENDPOINT_SOCKET")
    from spiffe import WorkloadApiClient

    try:
        return WorkloadApiClient(socket_path=endpoint, default_timeout=args.timeout)
    except Exception as err:
        raise _Failure(f"cannot use the Workload API at {endpoint}: {err}") from None


def _jwt(args: argparse.Namespace) -> None:
    from spiffe import SpiffeId

    subject = SpiffeId(args.spiffe_id) if args.spiffe_id else None
    with _client(args) as client:
        svid = client.fetch_jwt_svid(set(args.audience), subject=subject)
    token = str(svid.token)
    if os.environ.get("GITHUB_ACTIONS") == "true" and not args.no_mask:
        print(f"::add-mask::{token}", file=sys.stderr, flush=True)
    print(token)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fp:
        fp.write(data)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT


def _x509(args: argparse.Namespace) -> None:
    from cryptography.hazmat.primitives import serialization

    with _client(args) as client:
        context = client.fetch_x509_context()
    svids = context.x509_svids
    if args.spiffe_id:
        svids = [s for s in svids if str(s.spiffe_id) == args.spiffe_id]
        if not svids:
            raise _Failure(f"the Workload API issued no X.509 SVID for {args.spiffe_id}")
    svid = svids[0]
    bundle = context.x509_bundle_set.get_bundle_for_trust_domain(svid.spiffe_id.trust_domain)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    _write_private(out / "svid.pem", b"".join(cert.public_bytes(pem) for cert in svid.cert_chain))
    _write_private(
        out / "key.pem",
        svid.private_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    authorities = sorted(bundle.x509_authorities, key=lambda c: c.serial_number) if bundle else []
    _write_private(out / "bundle.pem", b"".join(cert.public_bytes(pem) for cert in authorities))
    print(
        f"{svid.spiffe_id} valid until {svid.leaf.not_valid_after_utc.isoformat()}: {out}/svid.pem, key.pem, bundle.pem"
    )


def _bundle(args: argparse.Namespace) -> None:
    with _client(args) as client:
        if args.x509:
            from cryptography.hazmat.primitives import serialization

            sets = client.fetch_x509_context().x509_bundle_set  # the bundles that come with the SVIDs
            for bundle in sorted(sets.bundles, key=lambda b: str(b.trust_domain)):
                for cert in sorted(bundle.x509_authorities, key=lambda c: c.serial_number):
                    sys.stdout.write(cert.public_bytes(serialization.Encoding.PEM).decode())
            return
        jwt_sets = client.fetch_jwt_bundles()
    print(json.dumps({"keys": [key for bundle in jwt_sets.bundles for key in _jwks(bundle.jwt_authorities)]}))


def _jwks(authorities: dict[str, Any]) -> list[dict[str, Any]]:
    """The public keys as JWKs (RFC 7517), each under its key id, as SPIRE publishes them."""
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from jwt.algorithms import ECAlgorithm, RSAAlgorithm

    keys = []
    for key_id, key in sorted(authorities.items()):
        if isinstance(key, ec.EllipticCurvePublicKey):
            jwk = json.loads(ECAlgorithm.to_jwk(key))
        elif isinstance(key, rsa.RSAPublicKey):
            jwk = json.loads(RSAAlgorithm.to_jwk(key))
        else:
            continue
        keys.append({**jwk, "kid": key_id, "use": "jwt-svid"})
    return keys


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dynrunner-identity", description=__doc__.splitlines()[0])
    p.add_argument("--socket", help="the Workload API socket (default: SPIFFE_ENDPOINT_SOCKET)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the Workload API")
    sub = p.add_subparsers(dest="command", required=True)
    jwt_p = sub.add_parser("jwt", help="print a JWT-SVID for the given audience(s)")
    jwt_p.add_argument("--audience", action="append", required=True, help="repeat for several audiences")
    jwt_p.add_argument("--spiffe-id", help="which of the workload's identities (default: the first)")
    jwt_p.add_argument("--no-mask", action="store_true", help="do not ask the job log to mask the token")
    x509_p = sub.add_parser("x509", help="write svid.pem, key.pem and bundle.pem (mode 0600) to --out")
    x509_p.add_argument("--out", required=True, metavar="DIR")
    x509_p.add_argument("--spiffe-id", help="which of the workload's identities (default: the first)")
    bundle_p = sub.add_parser("bundle", help="print the trust domain's JWT bundle (JWKS), or --x509 CAs")
    bundle_p.add_argument("--x509", action="store_true", help="the X.509 authorities as PEM instead")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    run = {"jwt": _jwt, "x509": _x509, "bundle": _bundle}[args.command]
    try:
        run(args)
    except _Failure as err:
        print(f"dynrunner-identity: {err}", file=sys.stderr)
        return EXIT_NO_IDENTITY
    except Exception as err:  # py-spiffe's errors carry the Workload API's reason
        print(f"dynrunner-identity: {args.command}: {err}", file=sys.stderr)
        return EXIT_NO_IDENTITY
    return 0


if __name__ == "__main__":
    sys.exit(main())
