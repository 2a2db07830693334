"""Where the admission webhook is reached and with which certificate.

Two ways. A local process (tests, the demo) makes a throw-away CA and serves ``https://HOST:PORT``.
In a cluster (``WEBHOOK_SERVICE``), every replica serves behind one Service with the certificate
kept in one shared Secret (:mod:`durable_agents.shell.admission.certs`), made by the operator or, with
``WEBHOOK_CERT_ISSUER=cert-manager``, issued by cert-manager and only read; a background pass renews
it (the operator's own) before it expires, reloads what this replica serves (the webhook process
restarts its server when the files change) and keeps the webhook configurations' caBundle (the Secret's CA,
cert-manager's too: no cainjector needed) and Service current, so an edit that breaks them is undone
within a pass.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from durable_agents.shell.admission import registration
from durable_agents.shell.admission.certs import IssuedCertificates, WebhookCertificates
from durable_agents.shell.ground.certs import generate_ca, issue_serving_cert
from durable_agents.shell.ground.lifecycle import Background
from durable_agents_controllers.config import OperatorConfig
from durable_agents_controllers.manager import Manager

log = logging.getLogger(__name__)
KEEP_CURRENT_INTERVAL = 60.0  # seconds between passes of the in-cluster certificate keeper
Configurations = tuple[dict[str, Any], dict[str, Any]]


def configuration_name(config: OperatorConfig) -> str:
    if config.webhook_configuration:
        return config.webhook_configuration
    return f"durable-agents-{config.namespace}" if config.namespace else "durable-agents"


def _write(directory: Path, files: dict[str, bytes]) -> None:
    # Each file replaced whole, with no await in between: kopf's check of the files (a digest, on
    # the same event loop) never sees a certificate beside the wrong key.
    for name, content in files.items():
        fd, tmp = tempfile.mkstemp(dir=directory)
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        os.replace(tmp, directory / name)


class WebhookServing(Background):
    """The serving files and configurations; in a cluster, also the keeper (``run``) of both."""

    def __init__(self, manager: Manager) -> None:
        config = manager.config
        assert config.webhook_port is not None
        self.manager, self.config, self.port = manager, config, config.webhook_port
        self.directory = Path(tempfile.mkdtemp(prefix="durable-agents-webhook-"))
        self.service = config.webhook_service
        self.namespace = config.lease_namespace  # the operator's own namespace in a cluster
        self.certificates: WebhookCertificates | IssuedCertificates | None = None
        if self.service is not None:
            secret = config.webhook_cert_secret or f"{self.service}-tls"
            issuer = (
                IssuedCertificates if config.webhook_cert_issuer == "cert-manager" else WebhookCertificates
            )
            self.certificates = issuer(manager.kube, self.namespace, secret, self.service)
        self._served: bytes = b""

    def configurations(self, ca_pem: bytes) -> Configurations:
        name, scope = configuration_name(self.config), self.config.namespace
        if self.service is None:
            url = f"https://{self.config.webhook_host}:{self.port}"
            return registration.webhook_configurations(name=name, url=url, ca_pem=ca_pem, namespace=scope)
        target = (self.namespace, self.service, self.config.webhook_service_port)
        return registration.webhook_configurations(name=name, service=target, ca_pem=ca_pem, namespace=scope)

    async def configure(self) -> Configurations:
        """Write the serving files (:data:`SERVING_FILES` in :attr:`directory`, read by the webhook
        process) and return the configurations to install."""
        if self.certificates is None:
            ca = generate_ca("durable-agents-webhook-ca")
            host = self.config.webhook_host
            serving = issue_serving_cert(ca, host, ["localhost"], ["127.0.0.1"])
            cert, key, bundle = serving.cert_pem, serving.key_pem, ca.cert_pem
        else:
            material = await self.certificates.wait()  # not ready until there is one to serve
            cert, key, bundle = material.serving.cert_pem, material.serving.key_pem, material.bundle_pem
        _write(self.directory, {"tls.key": key, "tls.crt": cert, "ca.crt": bundle})
        self._served = cert
        return self.configurations(bundle)

    async def keep_current_once(self) -> None:
        """One pass: renew the shared certificate when due, serve the stored one, and put the
        configurations back as they should be."""
        assert self.certificates is not None
        material = await self.certificates.current()
        if material.serving.cert_pem != self._served:
            _write(
                self.directory,
                {
                    "tls.key": material.serving.key_pem,
                    "tls.crt": material.serving.cert_pem,
                    "ca.crt": material.bundle_pem,
                },
            )
            self._served = material.serving.cert_pem
            log.info("webhook: serving the renewed certificate from Secret %s", self.certificates.secret)
        await registration.install_webhooks(self.manager.kube, *self.configurations(material.bundle_pem))

    async def run(self) -> None:
        """Keep the shared certificate and the configurations current (in a cluster only: the
        manager runs this part only when there are shared certificates to keep)."""
        while True:
            await asyncio.sleep(KEEP_CURRENT_INTERVAL)
            try:
                await self.keep_current_once()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the API server away: the next pass tries again
                log.warning(
                    "webhook: keeping the certificate current failed (%s: %s)", type(err).__name__, err
                )
