"""The webhook's serving certificate when the operator runs in a cluster: one Secret that every
replica shares (a CA, the CA bundle the API server trusts, and a serving certificate for the
webhook's Service), made by whichever replica comes first and renewed before it expires.

Replicas agree through the API server: a create that meets 409 reads what the other replica made,
and a renewal is a replace with the read resourceVersion (a 409 reads again). A renewed CA keeps
the previous one in the bundle until that one expires, so a replica still serving a certificate
from the previous CA is trusted while it picks up the new one.

With cert-manager issuing instead (:class:`IssuedCertificates`), the same Secret is only read.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from kubernetes.client.rest import ApiException

from durable_agents.shell.ground.certs import KeyPair, generate_ca, issue_serving_cert
from durable_agents.shell.ground.kube import Kube

log = logging.getLogger(__name__)

CA_CERT, CA_KEY, CA_BUNDLE, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "ca-bundle.crt", "tls.crt", "tls.key"
# Renewed this long before expiry: a serving certificate lives a year, a CA ten.
LEAF_RENEW_BEFORE = dt.timedelta(days=30)
CA_RENEW_BEFORE = dt.timedelta(days=365)
_ATTEMPTS = 5  # conflicts with other replicas in a row before giving up (each one means progress)


def service_names(service: str, namespace: str) -> list[str]:
    """The names the API server may use for a Service: it calls ``<name>.<namespace>.svc``."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


@dataclass(frozen=True)
class ServingMaterial:
    """What a replica serves with, and what the webhook configurations trust."""

    serving: KeyPair
    ca: KeyPair
    bundle_pem: bytes  # the current CA, then the previous one while it is still valid

    def as_secret_data(self) -> dict[str, str]:
        return {
            name: base64.b64encode(value).decode()
            for name, value in (
                (CA_CERT, self.ca.cert_pem),
                (CA_KEY, self.ca.key_pem),
                (CA_BUNDLE, self.bundle_pem),
                (TLS_CERT, self.serving.cert_pem),
                (TLS_KEY, self.serving.key_pem),
            )
        }


def material_of(data: dict[str, str] | None) -> ServingMaterial | None:
    """The material stored in a Secret's data, or None when any part is missing or unreadable."""
    try:
        raw = {
            name: base64.b64decode((data or {})[name])
            for name in (CA_CERT, CA_KEY, CA_BUNDLE, TLS_CERT, TLS_KEY)
        }
        material = ServingMaterial(
            serving=KeyPair(raw[TLS_CERT], raw[TLS_KEY]),
            ca=KeyPair(raw[CA_CERT], raw[CA_KEY]),
            bundle_pem=raw[CA_BUNDLE],
        )
        material.serving.certificate, material.serving.private_key(), material.ca.private_key()
        x509.load_pem_x509_certificates(material.bundle_pem)
    except (KeyError, ValueError, TypeError):
        return None
    return material


def serving_problem(
    serving: KeyPair, names: Sequence[str], now: dt.datetime, renew_before: dt.timedelta
) -> str | None:
    """What makes a serving certificate unfit for ``names``: expiring within ``renew_before``,
    naming too little, or not matching its key; None when fit."""
    leaf = serving.certificate
    if leaf.not_valid_after_utc - now < renew_before:
        return f"the serving certificate expires on {leaf.not_valid_after_utc:%Y-%m-%d}"
    try:
        san = set(
            leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
                x509.DNSName
            )
        )
    except x509.ExtensionNotFound:
        san = set()
    missing = sorted(set(names) - san)
    if missing:
        return f"the serving certificate does not name {', '.join(missing)}"
    spki = (Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    if serving.private_key().public_key().public_bytes(*spki) != leaf.public_key().public_bytes(*spki):
        return "the serving key does not match its certificate"
    return None


def renewal_reason(
    material: ServingMaterial | None, names: Sequence[str], now: dt.datetime | None = None
) -> str | None:
    """Why this material must be replaced, or None when it serves ``names`` for a while yet."""
    if material is None:
        return "no complete serving certificate yet"
    now = now or dt.datetime.now(dt.UTC)
    ca, leaf = material.ca.certificate, material.serving.certificate
    if ca.not_valid_after_utc - now < CA_RENEW_BEFORE:
        return f"the CA expires on {ca.not_valid_after_utc:%Y-%m-%d}"
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "the serving certificate was not issued by the stored CA"
    if ca.public_bytes(Encoding.PEM) not in material.bundle_pem:
        return "the CA bundle lacks the current CA"
    return serving_problem(material.serving, names, now, LEAF_RENEW_BEFORE)


def renewed(
    current: ServingMaterial | None, names: Sequence[str], now: dt.datetime | None = None
) -> ServingMaterial:
    """New material for ``names``: the current CA kept while it is good for a year more, else a new
    one, with the previous CA left in the bundle until it expires."""
    now = now or dt.datetime.now(dt.UTC)
    ca = current.ca if current is not None else None
    bundle: list[bytes] = []
    if ca is None or ca.certificate.not_valid_after_utc - now < CA_RENEW_BEFORE:
        if ca is not None and ca.certificate.not_valid_after_utc > now:
            bundle.append(ca.cert_pem)
        ca = generate_ca("durable-agents-webhook-ca")
    serving = issue_serving_cert(ca, names[0], names, [])
    return ServingMaterial(serving=serving, ca=ca, bundle_pem=b"".join([ca.cert_pem, *bundle]))


class WebhookCertificates:
    """The shared serving Secret of one webhook Service."""

    def __init__(self, kube: Kube, namespace: str, secret: str, service: str) -> None:
        self.kube, self.namespace, self.secret = kube, namespace, secret
        self.names = service_names(service, namespace)

    async def current(self) -> ServingMaterial:
        """The material to serve with: the stored one when good, else one this replica stores
        (or that another replica stored first)."""
        core = self.kube.core
        for _ in range(_ATTEMPTS):
            try:
                secret: Any = await self.kube.call(core.read_namespaced_secret, self.secret, self.namespace)
            except ApiException as err:
                if err.status != 404:
                    raise
                secret = None
            stored = material_of(secret.data if secret is not None else None)
            reason = renewal_reason(stored, self.names)
            if reason is None and stored is not None:
                return stored
            fresh = renewed(stored, self.names)
            metadata: dict[str, Any] = {
                "name": self.secret,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/managed-by": "durable-agents"},
            }
            body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": metadata}
            body["data"] = fresh.as_secret_data()
            try:
                if secret is None:
                    await self.kube.call(core.create_namespaced_secret, self.namespace, body)
                else:
                    metadata["resourceVersion"] = secret.metadata.resource_version
                    metadata["labels"] = {**(secret.metadata.labels or {}), **metadata["labels"]}
                    await self.kube.call(core.replace_namespaced_secret, self.secret, self.namespace, body)
            except ApiException as err:
                if err.status != 409:  # another replica stored its own first: read and use that
                    raise
                continue
            log.info(
                "webhook serving certificate in Secret %s/%s renewed: %s", self.namespace, self.secret, reason
            )
            return fresh
        raise RuntimeError(
            f"Secret {self.namespace}/{self.secret}: still changing after {_ATTEMPTS} attempts to agree on it"
        )

    async def wait(self) -> ServingMaterial:
        """The material to start serving with (this replica makes it if none is stored)."""
        return await self.current()


@dataclass(frozen=True)
class IssuedMaterial:
    """A serving certificate someone else issued (cert-manager), and the CA that signed it."""

    serving: KeyPair
    bundle_pem: bytes


class CertificateNotIssued(RuntimeError):
    """The Secret cert-manager keeps is not there yet, or holds nothing this webhook can serve."""


class IssuedCertificates:
    """The serving Secret cert-manager issues and renews (the chart's ``webhook.certManager``): a
    ``kubernetes.io/tls`` Secret with ``tls.crt``, ``tls.key`` and ``ca.crt``. Read, never written:
    the operator's Role has no verb to write it. Unfit material (expired, naming too little, a key
    that does not match) is never served."""

    def __init__(self, kube: Kube, namespace: str, secret: str, service: str) -> None:
        self.kube, self.namespace, self.secret = kube, namespace, secret
        self.names = service_names(service, namespace)
        self.where = f"Secret {namespace}/{secret}"

    async def current(self) -> IssuedMaterial:
        try:
            secret: Any = await self.kube.call(
                self.kube.core.read_namespaced_secret, self.secret, self.namespace
            )
        except ApiException as err:
            if err.status != 404:
                raise
            raise CertificateNotIssued(f"{self.where} not issued yet") from None
        where = self.where
        try:
            raw = {name: base64.b64decode((secret.data or {})[name]) for name in (TLS_CERT, TLS_KEY, CA_CERT)}
            material = IssuedMaterial(KeyPair(raw[TLS_CERT], raw[TLS_KEY]), raw[CA_CERT])
            x509.load_pem_x509_certificates(material.bundle_pem)
            problem = serving_problem(material.serving, self.names, dt.datetime.now(dt.UTC), dt.timedelta(0))
        except KeyError as err:
            raise CertificateNotIssued(f"{where} has no {err.args[0]}") from None
        except (ValueError, TypeError) as err:
            raise CertificateNotIssued(f"{where} holds no readable certificate and key: {err}") from None
        if problem is not None:
            raise CertificateNotIssued(f"{where}: {problem}")
        return material

    async def wait(self, interval: float = 2.0, report_every: int = 15) -> IssuedMaterial:
        """The material, once cert-manager has issued it (until then this replica is not ready)."""
        tries = 0
        while True:
            try:
                return await self.current()
            except CertificateNotIssued as err:
                if tries % report_every == 0:
                    log.warning("webhook: waiting for cert-manager: %s", err)
            tries += 1
            await asyncio.sleep(interval)
