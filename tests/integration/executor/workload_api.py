"""A SPIFFE Workload API on a unix socket, serving X.509 SVIDs the way a SPIRE agent does:
"no identity issued" (PermissionDenied) until `issue_after_s`, then real SVIDs (an EC key, a
leaf certificate with the SPIFFE ID as its URI SAN, signed by a throwaway CA)."""

from __future__ import annotations

import contextlib
import datetime
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from spiffe._proto import workload_pb2, workload_pb2_grpc


def _svid(spiffe_id: str, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate) -> workload_pb2.X509SVID:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "SPIRE")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(spiffe_id)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, True, False, False, False, False, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return workload_pb2.X509SVID(
        spiffe_id=spiffe_id,
        x509_svid=leaf.public_bytes(serialization.Encoding.DER),
        x509_svid_key=key.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        bundle=ca.public_bytes(serialization.Encoding.DER),
    )


class WorkloadApi(workload_pb2_grpc.SpiffeWorkloadAPIServicer):  # type: ignore[misc]
    def __init__(self, spiffe_ids: list[str], issue_after_s: float) -> None:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
        now = datetime.datetime.now(datetime.UTC)
        ca = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        self.svids = [_svid(spiffe_id, ca_key, ca) for spiffe_id in spiffe_ids]
        self.issue_at = time.monotonic() + issue_after_s
        self.requests = 0

    def FetchX509SVID(self, request: object, context: grpc.ServicerContext) -> Iterator[object]:
        self.requests += 1
        metadata = dict(context.invocation_metadata())
        if metadata.get("workload.spiffe.io") != "true":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "security header missing from request")
        if time.monotonic() < self.issue_at or not self.svids:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "no identity issued")
        yield workload_pb2.X509SVIDResponse(svids=self.svids)
        while context.is_active():
            time.sleep(0.05)


@contextlib.contextmanager
def workload_api(socket: Path, spiffe_ids: list[str], issue_after_s: float = 0.0) -> Iterator[WorkloadApi]:
    service = WorkloadApi(spiffe_ids, issue_after_s)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    workload_pb2_grpc.add_SpiffeWorkloadAPIServicer_to_server(service, server)
    server.add_insecure_port(f"unix:{socket}")
    server.start()
    try:
        yield service
    finally:
        server.stop(grace=None).wait()
