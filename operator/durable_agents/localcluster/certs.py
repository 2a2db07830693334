"""Certificates and keys for the local control plane, made with ``cryptography`` (no openssl CLI).

This module owns the cluster's PKI: a serving CA and the API server's serving certificate, a
separate client CA from which users are minted (``CN`` = user name, ``O`` = groups, which is how
kube-apiserver's x509 authenticator reads identity), and the service-account signing key pair.
There is deliberately no front proxy / request-header CA: nothing here aggregates API servers.

Everything is plain data (PEM bytes) so the PKI can be written to disk, reloaded by another
process (the detached CLI) and used to mint more users later.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The DNS names the in-cluster "kubernetes" Service is reachable by; clients that follow the
# in-cluster convention verify the serving cert against one of these.
KUBERNETES_SERVICE_NAMES: tuple[str, ...] = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
# The first address of the service range (10.0.0.0/24), which the apiserver gives the
# "kubernetes" Service.
KUBERNETES_SERVICE_IP = "10.0.0.1"

_CA_VALIDITY = dt.timedelta(days=3650)
_LEAF_VALIDITY = dt.timedelta(days=365)
# Backdate notBefore so a slightly skewed clock between processes never sees a "future" cert.
_BACKDATE = dt.timedelta(hours=1)

PrivateKey: TypeAlias = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM (PKCS#8, unencrypted) private key."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def private_key(self) -> PrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise TypeError(f"unsupported key type {type(key).__name__}")
        return key


@dataclass(frozen=True)
class ServiceAccountKeys:
    """The key pair that signs (private) and verifies (public) service-account tokens."""

    private_pem: bytes
    public_pem: bytes


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256: fast to generate (no multi-second RSA keygen on a busy 2-core box) and accepted by
    # Go's TLS stack and by Python's ssl module alike.
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def generate_ca(common_name: str) -> KeyPair:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + _CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _issue_leaf(
    ca: KeyPair,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    san: x509.SubjectAlternativeName | None,
) -> KeyPair:
    ca_cert = ca.certificate
    ca_key = ca.private_key()
    key = _new_key()
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(min(now + _LEAF_VALIDITY, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            # Strict verifiers (webpki, OpenSSL's X509_STRICT) require the AKI on leaves.
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
            ),
            critical=False,
        )
    )
    if san is not None:
        builder = builder.add_extension(san, critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue_serving_cert(
    ca: KeyPair, common_name: str, dns_names: Sequence[str], ip_addresses: Sequence[str]
) -> KeyPair:
    """A TLS server certificate for the given DNS names and IP addresses."""
    san = x509.SubjectAlternativeName(
        [x509.DNSName(n) for n in dns_names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    )
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    return _issue_leaf(ca, subject, ExtendedKeyUsageOID.SERVER_AUTH, san)


def mint_client_cert(client_ca: KeyPair, name: str, groups: Sequence[str] = ()) -> KeyPair:
    """A TLS client certificate the apiserver authenticates as user ``name`` in ``groups``.

    kube-apiserver maps the subject's CN to the user name and each O attribute to one group.
    """
    if not name:
        raise ValueError("a user name is required")
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
    attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    return _issue_leaf(client_ca, x509.Name(attributes), ExtendedKeyUsageOID.CLIENT_AUTH, None)


def generate_service_account_keys() -> ServiceAccountKeys:
    """The service-account token signing key pair.

    RSA rather than EC: RS256 is what every token consumer supports, and it is made once per
    cluster, so the slower key generation does not matter.
    """
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return ServiceAccountKeys(_key_pem(key), public)


@dataclass(frozen=True)
class PKIPaths:
    """Where :meth:`ClusterPKI.write` put each file (the flags the binaries are given)."""

    ca_cert: Path
    client_ca_cert: Path
    client_ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_private_key: Path
    sa_public_key: Path


@dataclass(frozen=True)
class ClusterPKI:
    """Everything the control plane's TLS and token signing needs."""

    ca: KeyPair
    client_ca: KeyPair
    serving: KeyPair
    service_account: ServiceAccountKeys

    @classmethod
    def create(
        cls,
        extra_dns_names: Sequence[str] = (),
        extra_ip_addresses: Sequence[str] = (),
    ) -> ClusterPKI:
        """A fresh PKI whose serving cert covers localhost, 127.0.0.1 and the in-cluster names."""
        ca = generate_ca("durable-agents-local-ca")
        client_ca = generate_ca("durable-agents-local-client-ca")
        serving = issue_serving_cert(
            ca,
            "kube-apiserver",
            ["localhost", *KUBERNETES_SERVICE_NAMES, *extra_dns_names],
            # ::1 is left out on purpose: the apiserver binds 127.0.0.1 only.
            ["127.0.0.1", KUBERNETES_SERVICE_IP, *extra_ip_addresses],
        )
        return cls(ca, client_ca, serving, generate_service_account_keys())

    def mint_user(self, name: str, groups: Sequence[str] = ()) -> tuple[bytes, bytes]:
        """``(cert_pem, key_pem)`` of a client certificate for user ``name`` in ``groups``."""
        pair = mint_client_cert(self.client_ca, name, groups)
        return pair.cert_pem, pair.key_pem

    def issue_serving(self, common_name: str) -> KeyPair:
        """Another loopback serving certificate from the same CA (e.g. for the controller manager)."""
        return issue_serving_cert(self.ca, common_name, ["localhost"], ["127.0.0.1"])

    @staticmethod
    def paths(directory: Path) -> PKIPaths:
        return PKIPaths(
            ca_cert=directory / "ca.crt",
            client_ca_cert=directory / "client-ca.crt",
            client_ca_key=directory / "client-ca.key",
            serving_cert=directory / "apiserver.crt",
            serving_key=directory / "apiserver.key",
            sa_private_key=directory / "sa.key",
            sa_public_key=directory / "sa.pub",
        )

    def write(self, directory: Path) -> PKIPaths:
        """Write every file into ``directory`` (keys mode 0600) and return their paths."""
        directory.mkdir(parents=True, exist_ok=True)
        p = self.paths(directory)
        files: list[tuple[Path, bytes, bool]] = [
            (p.ca_cert, self.ca.cert_pem, False),
            (directory / "ca.key", self.ca.key_pem, True),
            (p.client_ca_cert, self.client_ca.cert_pem, False),
            (p.client_ca_key, self.client_ca.key_pem, True),
            (p.serving_cert, self.serving.cert_pem, False),
            (p.serving_key, self.serving.key_pem, True),
            (p.sa_private_key, self.service_account.private_pem, True),
            (p.sa_public_key, self.service_account.public_pem, False),
        ]
        for path, data, secret in files:
            write_file(path, data, secret=secret)
        return p

    @classmethod
    def load(cls, directory: Path) -> ClusterPKI:
        """Read back what :meth:`write` wrote (the detached CLI mints users this way)."""
        p = cls.paths(directory)
        return cls(
            ca=KeyPair(p.ca_cert.read_bytes(), (directory / "ca.key").read_bytes()),
            client_ca=KeyPair(p.client_ca_cert.read_bytes(), p.client_ca_key.read_bytes()),
            serving=KeyPair(p.serving_cert.read_bytes(), p.serving_key.read_bytes()),
            service_account=ServiceAccountKeys(p.sa_private_key.read_bytes(), p.sa_public_key.read_bytes()),
        )


def write_file(path: Path, data: bytes, *, secret: bool = False) -> None:
    """Write ``data`` atomically; a secret is created 0600 so it is never briefly world-readable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    mode = 0o600 if secret else 0o644
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with open(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)
