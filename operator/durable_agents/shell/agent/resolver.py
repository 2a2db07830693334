"""The model planner's inputs for one run, resolved by the shell before the core decides.

The system prompt (a ConfigMap key) and the endpoint's API key (a Secret key) are read AS THE
RUN'S ServiceAccount, by impersonation, like its evidence: a run can only use a prompt or a
credential its own account may read, never one only the operator may. The tools come from the
spec; the data key (which seals every tool result and model output the checkpoint holds) from the
run's annotation, opened with the operator's keyring.

What cannot be resolved for good (a ConfigMap or Secret that is missing or forbidden, a key not
in it, a tool the planner refuses, no data key) gives the run a planner that refuses to plan with
that reason, so the run fails saying why. An API server that does not answer is an exception: the
unit of work is retried with backoff, the run is untouched.

MCP servers' tools are listed here too (their schemas and hints live on the server), as
declarations the planner offers the model; the tool-set digest the run's facts record covers
them, so a server that changes its tools mid-run is seen. A listing that fails once the run has
been resolved keeps the last good one (a server blip does not fail a run waiting for approval).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from durable_agents.api.v1alpha1 import ActionTier, AgentConfig, KeyReference
from durable_agents.core.agent.declared import declared_tools
from durable_agents.core.agent.limits import AgentLimits
from durable_agents.core.agent.mcp_trust import McpTrust, hinted_tier, mcp_trust
from durable_agents.core.agent.planner import AgentInputs, ModelPlanner
from durable_agents.core.agent.tools import DESCRIPTION_MAX, ToolDeclaration, ToolDeclarationError, mcp_tool
from durable_agents.core.checkpoint import ActionTier as TierName
from durable_agents.core.destinations import of_policy, run_refusal
from durable_agents.core.durations import parse_duration
from durable_agents.core.engine import RunSnapshot, Settings
from durable_agents.core.planner import PlannedStep, Planner, PlannerError, PlanningContext
from durable_agents.core.sealed_values import DataKey, open_data_key
from durable_agents.core.sealing import Keyring, UndecryptableError
from durable_agents.shell.agent.credentials import Unresolvable, mcp_access, read_key
from durable_agents.shell.agent.mcp_tools import McpError, McpTool, list_tools
from durable_agents.shell.agent.model_client import ModelEndpoint
from durable_agents.shell.ground.kube import Kube

log = logging.getLogger(__name__)

ObjectKey = tuple[str, str]


class RefusingPlanner:
    """A model run whose inputs cannot be resolved: every plan fails with the reason."""

    name = "model"

    def __init__(self, why: str) -> None:
        self.why = why

    def next_step(self, context: PlanningContext) -> PlannedStep:
        raise PlannerError(self.why)


def destinations_refused(run: RunSnapshot, settings: Settings) -> str | None:
    """Why the model endpoint, an MCP server or an effect tool's target of this run is outside
    its policy's allowlist now (the worker's second line, before any listing or call), or None."""
    if settings.policy is None:
        return None
    source = f"AgentPolicy {run.namespace}/{settings.policy_name}"
    wire = {"agent": run.spec.agent.model_dump(mode="json", by_alias=True) if run.spec.agent else {}}
    return run_refusal(wire, [of_policy(source, settings.policy)])


@dataclass(frozen=True)
class Resolved:
    inputs: AgentInputs | None
    endpoint: ModelEndpoint | None
    why: str | None  # why inputs is None
    at: float
    mcp_tiers: Mapping[str, ActionTier] = field(default_factory=dict)
    mcp_trust: McpTrust = field(default_factory=dict)


def model_calls_per_boundary(settings: Settings) -> int:
    """Model calls a worker may make before it writes what they produced (the policy's bound)."""
    chosen = settings.policy.agent_limits.max_model_calls_per_boundary if settings.policy else None
    return chosen or AgentLimits().max_model_calls_per_boundary


def is_model_run(run: RunSnapshot) -> bool:
    return run.spec.agent is not None and run.spec.agent.planner.value == "model"


def _mcp_tiers(settings: Settings) -> dict[str, ActionTier]:
    return {name: ActionTier(tier) for name, tier in settings.tiers.items() if name.startswith("mcp:")}


def _tier_of(tool: McpTool) -> TierName:
    """What the server's hints claim (a claim: only a policy that trusts the server believes it,
    see :mod:`durable_agents.core.agent.mcp_trust`)."""
    return hinted_tier(read_only=tool.read_only, destructive=tool.destructive).value


class AgentResolver:
    """Per run: its model planner's inputs and endpoint, kept ``ttl`` seconds (a changed prompt is
    seen after that; the facts' recorded prompt digest tells a resumed run that it changed)."""

    def __init__(
        self, kube: Kube, keyring: Keyring | None, planners: Mapping[str, Planner], ttl: float = 15.0
    ):
        self.kube = kube
        self.keyring = keyring
        self.planners = planners
        self.ttl = ttl
        self._resolved: dict[ObjectKey, Resolved] = {}

    def forget(self, key: ObjectKey) -> None:
        self._resolved.pop(key, None)

    async def prepare(self, run: RunSnapshot, settings: Settings) -> None:
        """Resolve a model run's inputs unless they are fresh (scripted runs need nothing)."""
        if not is_model_run(run):
            return
        key = (run.namespace, run.name)
        held, tiers = self._resolved.get(key), _mcp_tiers(settings)
        trust = mcp_trust(settings.policy)  # the policy's, at every unit of work: never stale
        refused = destinations_refused(run, settings)
        if refused is not None:  # nothing is listed, called or sent: checked at every unit of work
            log.warning("run %s/%s: %s", *key, refused)
            self._resolved[key] = Resolved(None, None, refused, time.monotonic(), tiers, trust)
            return
        if held is not None and time.monotonic() - held.at < self.ttl:
            if (held.mcp_tiers, held.mcp_trust) != (tiers, trust):
                self._resolved[key] = replace(held, mcp_tiers=tiers, mcp_trust=trust)
            return
        try:
            inputs, endpoint = await self._resolve(run)
        except Unresolvable as err:
            if held is not None and held.inputs is not None and isinstance(err.__cause__, McpError):
                log.warning("run %s/%s: %s; keeping the tools listed before", *key, err)
                self._resolved[key] = replace(held, at=time.monotonic(), mcp_tiers=tiers, mcp_trust=trust)
                return
            log.warning("run %s/%s: the model planner's inputs cannot be resolved: %s", *key, err)
            self._resolved[key] = Resolved(None, None, str(err), time.monotonic(), tiers, trust)
            return
        self._resolved[key] = Resolved(inputs, endpoint, None, time.monotonic(), tiers, trust)

    def planner_for(self, run: RunSnapshot) -> Planner:
        if not is_model_run(run):
            kind = run.spec.agent.planner.value if run.spec.agent else "scripted"
            return self.planners[kind]
        held = self._resolved.get((run.namespace, run.name))
        if held is None:  # prepare() was not awaited for this run: a bug, said as such
            return RefusingPlanner("the model planner's inputs were not resolved before planning")
        if held.inputs is None:
            return RefusingPlanner(f"the model planner cannot start: {held.why}")
        return ModelPlanner(replace(held.inputs, mcp_tiers=held.mcp_tiers, mcp_trust=held.mcp_trust))

    def endpoint(self, run: RunSnapshot) -> ModelEndpoint | None:
        held = self._resolved.get((run.namespace, run.name))
        return held.endpoint if held is not None else None

    # --- resolution ---------------------------------------------------------------------------

    async def _resolve(self, run: RunSnapshot) -> tuple[AgentInputs, ModelEndpoint]:
        agent = run.spec.agent
        assert agent is not None
        pinned = run.definition  # a run of an Agent: the prompt it pinned, never read again
        if agent.endpoint is None or agent.model is None or (agent.system_prompt is None and pinned is None):
            # The CRD's CEL rule refuses such a run; an older CRD may not have it.
            raise Unresolvable("spec.agent needs endpoint, model and systemPrompt")
        secret_ref = agent.endpoint.credentials_secret_ref
        if pinned is not None:
            prompt = pinned.system_prompt
        else:
            assert agent.system_prompt is not None
            prompt = await self.key_of(run, "ConfigMap", agent.system_prompt)
        api_key = await self.key_of(run, "Secret", secret_ref) if secret_ref else None
        try:
            tools = (*declared_tools(agent), *await self._mcp_tools(run, agent))
            inputs = AgentInputs(
                model=agent.model,
                system_prompt=prompt,
                tools=tools,
                data_key=self._data_key(run),
                entropy=os.urandom,
                agent_limits=pinned.agent_limits() if pinned is not None else {},
                accepts_images=bool(agent.endpoint.accepts_images),
            )
        except (ToolDeclarationError, ValueError) as err:
            raise Unresolvable(f"a tool is refused: {err}") from err
        names = [tool.name for tool in tools]
        if len(set(names)) != len(names):
            twice = sorted({name for name in names if names.count(name) > 1})
            raise Unresolvable(f"tool names offered twice (spec.agent.tools, MCP servers): {twice}")
        endpoint = ModelEndpoint(
            base_url=agent.endpoint.base_url,
            api_key=api_key,
            timeout_seconds=parse_duration(agent.endpoint.timeout).total_seconds(),
            protocol=str(agent.endpoint.protocol),
        )
        return inputs, endpoint

    async def _mcp_tools(self, run: RunSnapshot, agent: AgentConfig) -> list[ToolDeclaration]:
        """Each MCP server's tools (those the spec allows), as the model is offered them; its
        credentials read as the run's ServiceAccount (unreadable: the run fails saying which)."""
        out: list[ToolDeclaration] = []
        for server in agent.mcp_servers:
            timeout = parse_duration(server.timeout).total_seconds()
            try:
                access = await mcp_access(self.kube, run.namespace, run.spec.service_account_name, server)
            except Unresolvable as err:
                raise Unresolvable(f"MCP server {server.name!r}: {err}") from None
            try:
                listed = await list_tools(server.name, server.url, timeout=timeout, access=access)
            except McpError as err:
                raise Unresolvable(f"MCP server {server.name!r} cannot list its tools: {err}") from err
            by_name = {tool.name: tool for tool in listed}
            missing = sorted(set(server.tools) - set(by_name))
            if missing:
                raise Unresolvable(f"MCP server {server.name!r} lists no tool named {missing}")
            for tool in listed:
                if server.tools and tool.name not in server.tools:
                    continue
                out.append(
                    mcp_tool(
                        tool.name,
                        tool.description[:DESCRIPTION_MAX],
                        server=server.name,
                        tool=tool.name,
                        parameters=tool.input_schema,
                        read_only=tool.read_only,
                        tier=_tier_of(tool),
                    )
                )
        return out

    def _data_key(self, run: RunSnapshot) -> DataKey:
        if self.keyring is None:
            raise Unresolvable("this operator has no sealing keyring to seal the run's tool results")
        try:
            return open_data_key(self.keyring, run.data_key, run.namespace, run.name)
        except UndecryptableError as err:
            raise Unresolvable(
                f"the run's data key cannot be opened ({err}); is the sealing webhook installed?"
            ) from err

    async def key_of(self, run: RunSnapshot, kind: str, ref: KeyReference) -> str:
        """One key of a ConfigMap or Secret in the run's namespace, read as its ServiceAccount."""
        return await read_key(self.kube, run.namespace, run.spec.service_account_name, kind, ref)
