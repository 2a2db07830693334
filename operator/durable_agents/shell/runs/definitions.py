"""Runs of an Agent (``spec.agentRef``): the definition a run pins at acceptance, and the Agent
as it is now for a run that pinned it (the policy's ``freshness.definitionChanged``).

The Agent and its ModelConfig are read with the operator's rights (get on agents, modelconfigs);
the prompt's ConfigMap AS THE RUN'S ServiceAccount, like the inline agent's
(:mod:`durable_agents.shell.agent.resolver`). A run whose Agent or ModelConfig is missing does not
start: it says so once (a Warning Event, ``status.waitingFor`` agent:NAME or modelconfig:NAME)
and is looked at again every few seconds. A definition that cannot be pinned for good (its prompt
unreadable by the run's ServiceAccount, too large, a protocol this operator does not speak) fails
the run at acceptance (``DefinitionUnusable``), saying why. Once pinned the run never reads the
definition for its own work again; the Agent is read only to see whether it changed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import (
    AGENT_PLURAL,
    GROUP,
    MODEL_CONFIG_PLURAL,
    VERSION,
    AgentSpec,
    ModelConfigSpec,
)
from durable_agents.core.definitions import DefinitionNow, DefinitionUnusable, PinnedDefinition, pin
from durable_agents.core.engine import RunSnapshot, Settings
from durable_agents.shell.agent.credentials import Unresolvable
from durable_agents.shell.agent.resolver import AgentResolver
from durable_agents.shell.ground.kube import Kube, ObjectKey
from durable_agents.shell.ground.store import RunStore
from durable_agents.shell.observability.events import EventRecorder

log = logging.getLogger("durable_agents.shell.runs.worker")

MISSING_RECHECK = 5.0  # seconds between looks for a missing Agent or ModelConfig
NOW_TTL = 3.0  # seconds a pinned run's look at its Agent is reused


class Missing(Exception):
    """The Agent or its ModelConfig is not there (yet)."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"{kind} {name!r} not found")
        self.kind, self.name = kind, name


class Definitions:
    def __init__(
        self,
        kube: Kube,
        resolver: AgentResolver,
        events: EventRecorder,
        store: RunStore,
        wake_at: Callable[[ObjectKey, datetime], None],
    ) -> None:
        self.kube, self.resolver, self.events, self.store = kube, resolver, events, store
        self.wake_at = wake_at  # a run whose Agent or ModelConfig is missing is looked at again
        self._pins: dict[ObjectKey, PinnedDefinition | str] = {}  # unpinned runs: the pin, or why not
        self._now: dict[ObjectKey, tuple[float, DefinitionNow]] = {}
        self._told: dict[ObjectKey, str] = {}  # the last change or wait an Event said, per run
        self._runs_of: dict[ObjectKey, set[ObjectKey]] = {}  # (namespace, Agent) -> runs naming it

    def forget(self, key: ObjectKey) -> None:
        for held in (self._pins, self._now, self._told):
            held.pop(key, None)
        for runs in self._runs_of.values():
            runs.discard(key)

    def changed(self, namespace: str, kind: str, name: str) -> set[ObjectKey]:
        """The runs seen naming the Agent (``kind`` Agent) or any Agent of the namespace (a
        ModelConfig), to be looked at again now: their look at the definition is dropped."""
        users = {
            key
            for (ns, agent), keys in self._runs_of.items()
            if ns == namespace and (kind != "Agent" or agent == name)
            for key in keys
        }
        for key in users:
            self._now.pop(key, None)
        return users

    async def ready(self, key: ObjectKey, body: dict[str, Any], run: RunSnapshot) -> bool:
        """True when the run may be decided now (its definition looked at); False while its Agent
        or ModelConfig is missing (said once, by an Event and status.waitingFor; looked at again)."""
        if run.spec.agent_ref is None or run.state.terminal:
            return True
        self._runs_of.setdefault((run.namespace, run.spec.agent_ref), set()).add(key)
        if run.raw_checkpoint is not None and run.definition is not None:
            await self._look_now(key, body, run)
            return True
        if run.raw_checkpoint is not None:
            return True  # accepted without a pin (an unreadable checkpoint): the engine says why
        try:
            self._pins[key] = await self._pin(run)
        except Missing as err:
            message = f"{err}: the run of Agent {run.spec.agent_ref!r} waits for it; nothing runs"
            if self._told.get(key) != message:
                self._told[key] = message
                log.warning("run %s/%s waits: %s", *key, message)
                await self.events.record(body, f"{err.kind}NotFound", message, warning=True)
                await self.store.note_waiting(body, f"{err.kind.lower()}:{err.name}")
            self.wake_at(key, datetime.now(UTC) + timedelta(seconds=MISSING_RECHECK))
            return False
        except (Unresolvable, DefinitionUnusable) as err:
            self._pins[key] = f"the definition of Agent {run.spec.agent_ref!r} cannot be pinned: {err}"
        return True

    def snapshot(self, run: RunSnapshot) -> RunSnapshot:
        """A run of an Agent not yet accepted, as it will act once it pinned its definition."""
        held = self._pins.get((run.namespace, run.name))
        if run.raw_checkpoint is None and isinstance(held, PinnedDefinition):
            return run.with_definition(held)
        return run

    def settings(self, run: RunSnapshot, settings: Settings) -> Settings:
        """``settings`` with what the engine needs of the run's Agent (to pin; as it is now)."""
        if run.spec.agent_ref is None:
            return settings
        key = (run.namespace, run.name)
        held, now = self._pins.get(key), self._now.get(key)
        return replace(
            settings,
            definition=held if isinstance(held, PinnedDefinition) else None,
            definition_refused=held if isinstance(held, str) else None,
            definition_now=now[1] if now is not None else None,
        )

    # --- reads ------------------------------------------------------------------------------

    async def _pin(self, run: RunSnapshot) -> PinnedDefinition:
        assert run.spec.agent_ref is not None
        agent, model = await self._specs(run.namespace, run.spec.agent_ref)
        return pin(run.spec.agent_ref, agent, model, await self._prompt(run, agent))

    async def _look_now(self, key: ObjectKey, body: dict[str, Any], run: RunSnapshot) -> None:
        held = self._now.get(key)
        if held is not None and time.monotonic() - held[0] < NOW_TTL:
            return
        assert run.spec.agent_ref is not None
        assert run.definition is not None
        try:
            now = DefinitionNow((await self._pin(run)).digest)
        except Missing:
            now = DefinitionNow(None)
        except (Unresolvable, DefinitionUnusable, ApiException) as err:  # e.g. its prompt ConfigMap is gone
            # Nothing is concluded: the run goes on with what it pinned, and looks again later.
            now = DefinitionNow(run.definition.current(), why=str(err))
        self._now[key] = (time.monotonic(), now)
        if now.digest != run.definition.current() and self._told.get(key) != now.digest:
            self._told[key] = str(now.digest)
            message = (
                f"Agent {run.spec.agent_ref!r} "
                + ("or its ModelConfig was deleted" if now.digest is None else f"changed to {now.digest}")
                + f" under the run (pinned {run.definition.current()}): see kubectl agentrun why"
            )
            await self.events.record(body, "DefinitionChanged", message, warning=True)

    async def _specs(self, namespace: str, name: str) -> tuple[AgentSpec, ModelConfigSpec]:
        agent = AgentSpec.model_validate((await self._get(namespace, AGENT_PLURAL, "Agent", name))["spec"])
        raw = await self._get(namespace, MODEL_CONFIG_PLURAL, "ModelConfig", agent.model_ref)
        return agent, ModelConfigSpec.model_validate(raw["spec"])

    async def _get(self, namespace: str, plural: str, kind: str, name: str) -> dict[str, Any]:
        try:
            got: dict[str, Any] = await self.kube.call(
                self.kube.get_namespaced_object, GROUP, VERSION, namespace, plural, name
            )
        except ApiException as err:
            if err.status == 404:
                raise Missing(kind, name) from None
            if err.status == 403:  # the operator's RBAC lacks get on it: a configuration error
                raise Unresolvable(
                    f"the operator may not read {kind} {namespace}/{name} (get on {plural})"
                ) from None
            raise
        return got

    async def _prompt(self, run: RunSnapshot, agent: AgentSpec) -> str:
        prompt = agent.system_prompt
        if prompt.inline is not None:
            return prompt.inline
        assert prompt.config_map_key_ref is not None
        ref = prompt.config_map_key_ref
        return await self.resolver.key_of(run, "ConfigMap", ref)
