"""Certificates and keys for the local control plane, made with ``cryptography`` (no openssl CLI).

This module owns the cluster's PKI: a serving CA and the API server's serving certificate, a
separate client CA from which users are minted (``CN`` = user name, ``O`` = groups, which is how
kube-apiserver's x509 authenticator reads identity), and the service-account signing key pair.
There is deliberately no front proxy / request-header CA: nothing here aggregates API servers.

Everything is plain data (PEM bytes) so the PKI can be written to disk, reloaded by another
process (the detached CLI) and used to mint more users later.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from durable_agents.shell.ground.certs import KeyPair, generate_ca, issue_leaf, issue_serving_cert, key_pem

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


@dataclass(frozen=True)
class ServiceAccountKeys:
    """The key pair that signs (private) and verifies (public) service-account tokens."""

    private_pem: bytes
    public_pem: bytes


def mint_client_cert(client_ca: KeyPair, name: str, groups: Sequence[str] = ()) -> KeyPair:
    """A TLS client certificate the apiserver authenticates as user ``name`` in ``groups``.

    kube-apiserver maps the subject's CN to the user name and each O attribute to one group.
    """
    if not name:
        raise ValueError("a user name is required")
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
    attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    return issue_leaf(client_ca, x509.Name(attributes), ExtendedKeyUsageOID.CLIENT_AUTH, None)


def generate_service_account_keys() -> ServiceAccountKeys:
    """The service-account token signing key pair.

    RSA rather than EC: RS256 is what every token consumer supports, and it is made once per
    cluster, so the slower key generation does not matter.
    """
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return ServiceAccountKeys(key_pem(key), public)


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
