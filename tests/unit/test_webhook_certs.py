"""The shared webhook certificate's rules, without a cluster: when stored material must be renewed,
and what renewing keeps (the CA while it is good, the previous CA in the bundle)."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509

from durable_agents.shell.admission.certs import (
    CA_RENEW_BEFORE,
    LEAF_RENEW_BEFORE,
    ServingMaterial,
    material_of,
    renewal_reason,
    renewed,
    service_names,
)
from durable_agents.shell.ground.certs import generate_ca, issue_serving_cert

pytestmark = pytest.mark.unit
NAMES = service_names("durable-agents-webhook", "ops")


def test_the_names_include_the_one_the_api_server_calls() -> None:
    assert "durable-agents-webhook.ops.svc" in NAMES


def test_new_material_serves_the_names_and_round_trips_through_a_secret() -> None:
    material = renewed(None, NAMES)
    assert renewal_reason(material, NAMES) is None
    stored = material_of(material.as_secret_data())
    assert stored == material
    san = material.serving.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert set(san.value.get_values_for_type(x509.DNSName)) == set(NAMES)
    material.serving.certificate.verify_directly_issued_by(material.ca.certificate)


def test_missing_or_broken_material_is_renewed() -> None:
    assert renewal_reason(None, NAMES) == "no complete serving certificate yet"
    data = renewed(None, NAMES).as_secret_data()
    assert material_of({k: v for k, v in data.items() if k != "tls.key"}) is None
    assert material_of({**data, "tls.crt": "bm90IGEgY2VydA=="}) is None


def test_a_certificate_for_other_names_is_renewed() -> None:
    other = renewed(None, service_names("old-name", "ops"))
    assert "does not name durable-agents-webhook" in str(renewal_reason(other, NAMES))


def test_a_certificate_near_expiry_is_renewed_and_the_ca_kept() -> None:
    material = renewed(None, NAMES)
    leaf_end = material.serving.certificate.not_valid_after_utc
    later = leaf_end - LEAF_RENEW_BEFORE + dt.timedelta(days=1)
    assert "serving certificate expires" in str(renewal_reason(material, NAMES, later))
    fresh = renewed(material, NAMES, later)
    assert fresh.ca == material.ca
    assert fresh.serving != material.serving
    assert fresh.bundle_pem == material.ca.cert_pem


def test_a_ca_near_expiry_is_replaced_and_the_old_one_stays_trusted() -> None:
    material = renewed(None, NAMES)
    later = material.ca.certificate.not_valid_after_utc - CA_RENEW_BEFORE + dt.timedelta(days=1)
    assert "the CA expires" in str(renewal_reason(material, NAMES, later))
    fresh = renewed(material, NAMES, later)
    assert fresh.ca != material.ca
    bundle = x509.load_pem_x509_certificates(fresh.bundle_pem)
    assert [c.subject for c in bundle] == [fresh.ca.certificate.subject, material.ca.certificate.subject]
    assert material.ca.cert_pem in fresh.bundle_pem  # a replica still serving the old leaf is trusted


def test_a_leaf_from_another_ca_or_with_another_key_is_renewed() -> None:
    material = renewed(None, NAMES)
    foreign = issue_serving_cert(generate_ca("other"), NAMES[0], NAMES, [])
    swapped = ServingMaterial(serving=foreign, ca=material.ca, bundle_pem=material.bundle_pem)
    assert renewal_reason(swapped, NAMES) == "the serving certificate was not issued by the stored CA"
    other_key = renewed(material, NAMES).serving.key_pem
    mixed = ServingMaterial(
        serving=type(material.serving)(material.serving.cert_pem, other_key),
        ca=material.ca,
        bundle_pem=material.bundle_pem,
    )
    assert renewal_reason(mixed, NAMES) == "the serving key does not match its certificate"
