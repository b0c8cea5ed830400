"""A trust domain's X.509 CA and the X509-SVIDs it signs, shaped as SPIRE's server CA
(pkg/server/ca, pkg/server/credtemplate) makes them and as py-spiffe and go-spiffe validate
them: the leaf is not a CA, has digitalSignature (and keyEncipherment, keyAgreement) but
neither keyCertSign nor cRLSign, exactly one URI SAN (its SPIFFE ID), serverAuth and
clientAuth, and a notBefore backdated by 10 s."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

BACKDATE = dt.timedelta(seconds=10)
DEFAULT_X509_SVID_TTL = dt.timedelta(hours=1)  # SPIRE's default_x509_svid_ttl


@dataclass(frozen=True)
class Svid:
    spiffe_id: str
    chain_der: bytes  # leaf first
    key_der: bytes  # PKCS#8, unencrypted
    not_after: dt.datetime
    not_before: dt.datetime

    def rotate_at(self) -> dt.datetime:
        """SPIRE's agent renews an SVID once half of its lifetime has passed."""
        return self.not_before + (self.not_after - self.not_before) / 2


class TrustDomainCA:
    def __init__(self, trust_domain: str, ttl: dt.timedelta = dt.timedelta(days=1)) -> None:
        self.trust_domain = trust_domain
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        name = x509.Name(
            [x509.NameAttribute(NameOID.COUNTRY_NAME, "US"), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "SPIFFE")]
        )
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + ttl)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    False,
                    False,
                    False,
                    False,
                    False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"spiffe://{trust_domain}")]),
                critical=False,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )

    @property
    def bundle_der(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.DER)

    def sign(
        self,
        spiffe_id: str,
        ttl: dt.timedelta | None = None,
        dns_names: tuple[str, ...] = (),
        public_key: ec.EllipticCurvePublicKey | None = None,
    ) -> Svid:
        """A new key pair and its SVID; or, given the `public_key` of a CSR (as the server signs
        an agent's or a workload's), the SVID alone (`key_der` empty)."""
        key = ec.generate_private_key(ec.SECP256R1()) if public_key is None else None
        now = dt.datetime.now(dt.UTC)
        not_after = min(now + (ttl or DEFAULT_X509_SVID_TTL), self.certificate.not_valid_after_utc)
        sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(spiffe_id)]
        sans += [x509.DNSName(name) for name in dns_names]
        subject = [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "SPIRE"),
        ]
        if dns_names:
            subject.append(x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0]))
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key() if key is not None else public_key)  # type: ignore[arg-type]
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    True,
                    False,
                    True,
                    False,
                    True,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return Svid(
            spiffe_id,
            leaf.public_bytes(serialization.Encoding.DER),
            key.private_bytes(
                serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            if key is not None
            else b"",
            not_after,
            now - BACKDATE,
        )
