"""Throwaway certificates for one test control plane: one CA signs every serving and client cert.

Keys are PKCS#1 RSA PEM because Kueue's certificate rotator (cert-controller) parses its CA key
that way. The CA also names itself ``kueue-ca`` (a DNS SAN): the rotator only keeps a CA that
verifies for that name, and otherwise replaces ours with one the API server would not trust.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Longer than the rotator's 90-day look-ahead, so Kueue never regenerates our certificates.
VALIDITY = datetime.timedelta(days=365)


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


class Pki:
    """A CA in ``directory`` (``ca.crt``, ``ca.key``) and the certificates it issues there."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ca_key = _key()
        now = datetime.datetime.now(datetime.UTC)
        self.ca_cert = (
            x509.CertificateBuilder()
            .subject_name(_name("iris-test-ca"))
            .issuer_name(_name("iris-test-ca"))
            .public_key(self.ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, True, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("kueue-ca")]), critical=False)
            .sign(self.ca_key, hashes.SHA256())
        )
        self.ca_path = self._write("ca.crt", self.ca_cert.public_bytes(serialization.Encoding.PEM))
        self.ca_key_path = self._write("ca.key", _key_pem(self.ca_key))

    def _write(self, name: str, data: bytes) -> Path:
        path = self.directory / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def issue(
        self,
        name: str,
        common_name: str,
        *,
        organization: str | None = None,
        dns: Sequence[str] = (),
        ips: Sequence[str] = (),
        server: bool = False,
    ) -> tuple[Path, Path]:
        """``<name>.crt`` and ``<name>.key``: a serving cert when ``server``, else a client cert."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name, organization))
            .issuer_name(self.ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self.ca_key, hashes.SHA256())
        return (
            self._write(f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            self._write(f"{name}.key", _key_pem(key)),
        )

    def key_pair(self, name: str) -> tuple[Path, Path]:
        """A bare RSA key pair (``<name>.key``, ``<name>.pub``): the service-account signing key."""
        key = _key()
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return self._write(f"{name}.key", _key_pem(key)), self._write(f"{name}.pub", public)
