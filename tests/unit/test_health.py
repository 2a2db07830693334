"""The operator's probes: /readyz says what it still waits for (503) until the webhook serves and
the AgentRun cache has synced; /healthz answers on the event loop."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from durable_agents_controllers.config import ConfigError, OperatorConfig
from durable_agents_controllers.health import app_for
from durable_agents_controllers.manager import Manager

pytestmark = pytest.mark.unit


def config(tmp_path: Path, **env: str) -> OperatorConfig:
    (tmp_path / "key-1").write_bytes(b"k" * 32)
    keys = {"DURABLE_AGENTS_SEALING_KEYS_DIR": str(tmp_path), "DURABLE_AGENTS_SEALING_ACTIVE_KEY": "key-1"}
    return OperatorConfig.from_env({**keys, **env})


async def test_ready_only_once_started_and_the_webhook_serves(tmp_path: Path) -> None:
    manager = Manager(config(tmp_path, DURABLE_AGENTS_WEBHOOK_PORT="9443", DURABLE_AGENTS_HEALTH_PORT="8081"))
    async with TestClient(TestServer(app_for(manager))) as http:
        assert (await http.get("/healthz")).status == 200
        waiting = await http.get("/readyz")
        assert waiting.status == 503
        assert "the admission webhook is not serving yet" in await waiting.text()
        manager.started.set()
        assert (await http.get("/readyz")).status == 503
        manager.webhook_serving.set()
        ready = await http.get("/readyz")
        assert ready.status == 200, await ready.text()


async def test_without_a_webhook_ready_once_started(tmp_path: Path) -> None:
    manager = Manager(config(tmp_path))
    manager.started.set()
    async with TestClient(TestServer(app_for(manager))) as http:
        assert (await http.get("/readyz")).status == 200


def test_a_webhook_service_needs_the_webhook_port(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="WEBHOOK_SERVICE needs DURABLE_AGENTS_WEBHOOK_PORT"):
        config(tmp_path, DURABLE_AGENTS_WEBHOOK_SERVICE="durable-agents-webhook")
