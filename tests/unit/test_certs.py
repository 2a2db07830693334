"""The local control plane's PKI: who a minted certificate says the user is, and who trusts it."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from durable_agents_testkit.localcluster.certs import (
    KUBERNETES_SERVICE_IP,
    KUBERNETES_SERVICE_NAMES,
    ClusterPKI,
    mint_client_cert,
)

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def pki() -> ClusterPKI:
    return ClusterPKI.create()


def _subject(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> list[str]:
    return [str(a.value) for a in cert.subject.get_attributes_for_oid(oid)]


def test_minted_user_has_name_as_cn_and_groups_as_o(pki: ClusterPKI) -> None:
    cert_pem, key_pem = pki.mint_user("alice", ["team-a", "system:authenticated-extra"])
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert _subject(cert, NameOID.COMMON_NAME) == ["alice"]
    assert _subject(cert, NameOID.ORGANIZATION_NAME) == ["team-a", "system:authenticated-extra"]
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def test_user_without_groups_has_no_o(pki: ClusterPKI) -> None:
    cert = x509.load_pem_x509_certificate(pki.mint_user("bob")[0])
    assert _subject(cert, NameOID.ORGANIZATION_NAME) == []


def test_empty_user_name_is_refused(pki: ClusterPKI) -> None:
    with pytest.raises(ValueError, match="user name"):
        mint_client_cert(pki.client_ca, "")


def test_client_cert_chains_to_the_client_ca_only(pki: ClusterPKI) -> None:
    cert = x509.load_pem_x509_certificate(pki.mint_user("carol", ["g"])[0])
    cert.verify_directly_issued_by(pki.client_ca.certificate)  # raises if the signature is wrong
    with pytest.raises(ValueError, match="does not match certificate issuer"):
        # The apiserver's --client-ca-file is the client CA; the serving CA must not vouch for users.
        cert.verify_directly_issued_by(pki.ca.certificate)
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


def _server_verifier(pki: ClusterPKI, name: x509.DNSName | x509.IPAddress) -> None:
    builder = PolicyBuilder().store(Store([pki.ca.certificate]))
    builder.build_server_verifier(name).verify(pki.serving.certificate, [])


@pytest.mark.parametrize("dns", ["localhost", *KUBERNETES_SERVICE_NAMES])
def test_serving_cert_verifies_for_each_dns_name(pki: ClusterPKI, dns: str) -> None:
    _server_verifier(pki, x509.DNSName(dns))


@pytest.mark.parametrize("ip", ["127.0.0.1", KUBERNETES_SERVICE_IP])
def test_serving_cert_verifies_for_each_ip(pki: ClusterPKI, ip: str) -> None:
    _server_verifier(pki, x509.IPAddress(ipaddress.ip_address(ip)))


def test_serving_cert_does_not_verify_for_other_names(pki: ClusterPKI) -> None:
    with pytest.raises(VerificationError):
        _server_verifier(pki, x509.DNSName("example.com"))


def test_serving_cert_san_is_exactly_the_expected_set(pki: ClusterPKI) -> None:
    san = pki.serving.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", *KUBERNETES_SERVICE_NAMES}
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", KUBERNETES_SERVICE_IP}
    eku = pki.serving.certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]


def test_service_account_keys_are_a_pair(pki: ClusterPKI) -> None:
    private = serialization.load_pem_private_key(pki.service_account.private_pem, password=None)
    assert isinstance(private, rsa.RSAPrivateKey)
    public = serialization.load_pem_public_key(pki.service_account.public_pem)
    assert isinstance(public, rsa.RSAPublicKey)
    assert public.public_numbers() == private.public_key().public_numbers()


def test_write_and_load_round_trip_with_private_keys_0600(pki: ClusterPKI, tmp_path: Path) -> None:
    paths = pki.write(tmp_path)
    assert ClusterPKI.load(tmp_path) == pki
    for key in (paths.serving_key, paths.client_ca_key, paths.sa_private_key, tmp_path / "ca.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert stat.S_IMODE(paths.ca_cert.stat().st_mode) == 0o644
