"""The ``model`` planner: the next step is the model's pending call, as the checkpoint records it.

A model call is not a transition. The planner reads the checkpoint's agent facts: while a proposed
call is pending at the run's current step, that call IS the next step (a read, an effect, a
question, an event to await), rebuilt from the sealed arguments the checkpoint holds, so every
place that recomputes a step (intents, approvals, the dispatcher's check) sees the same one. With
no call pending, it raises :class:`ModelTurnNeeded` carrying the request to send; the engine asks
the shell to make the call (:class:`~durable_agents.core.engine.decisions.NeedModelTurn`) and
records what the model proposed (:mod:`durable_agents.core.engine.model_turns`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from durable_agents.api.v1alpha1 import ActionTier, AgentRunSpec, McpServer
from durable_agents.core.agent.context import ContextMismatch, build_request
from durable_agents.core.agent.exchange import ModelRequest
from durable_agents.core.agent.interpret import CallMcpTool, step_for
from durable_agents.core.agent.limits import AgentLimits
from durable_agents.core.agent.mcp_trust import McpTrust, mcp_call_tier, trusts
from durable_agents.core.agent.tools import ToolDeclaration, by_name, tool_set_digest
from durable_agents.core.agent_facts import AgentFacts, ModelTurn, sealed_text, turn_arguments
from durable_agents.core.entropy import Entropy
from durable_agents.core.planner import (
    AskHuman,
    PerformEffect,
    PlannedStep,
    PlannerError,
    PlanningContext,
    ReadTool,
)
from durable_agents.core.sealed_values import DataKey, step_label


@dataclass(frozen=True)
class AgentInputs:
    """What the shell resolved for one run: the prompt's text, the tools, the run's data key."""

    model: str
    system_prompt: str
    tools: tuple[ToolDeclaration, ...]
    data_key: DataKey
    entropy: Entropy
    """Where the random bytes of what the planner seals come from (the shell: ``os.urandom``)."""
    limits: AgentLimits = field(default_factory=AgentLimits)
    agent_limits: Mapping[str, int] = field(default_factory=dict)
    """A run of an Agent: the limits its Agent set (AgentLimits field names); the policy caps each."""
    mcp_tiers: Mapping[str, ActionTier] = field(default_factory=dict)
    """The policy's tiers of MCP tools, by :func:`mcp_tier_key`: they override the server's hints."""
    mcp_trust: McpTrust = field(default_factory=dict)
    """The servers (by URL) whose hints the policy believes; any other's tools are consequential."""
    accepts_images: bool = False
    """The model endpoint takes images: the small images of tool results are given as images."""


MCP_EFFECT = "mcp.call"
"""The effect a consequential MCP call is dispatched as, through the action ledger."""


def mcp_tier_key(server: str, tool: str) -> str:
    """How an AgentPolicy's ``tiers`` names an MCP tool: ``mcp:<server>/<tool>``."""
    return f"mcp:{server}/{tool}"


class ModelTurnNeeded(PlannerError):
    """No call is pending at the run's step: the model must be asked ``request``. A PlannerError,
    so a caller that only recomputes a committed step treats it as "no such step"."""

    def __init__(self, request: ModelRequest) -> None:
        super().__init__("no model call is pending at this step: the model must be asked")
        self.request = request


class ToolSetChanged(PlannerError):
    """The tools listed now are not the tool set the run's facts (and its pending call) were
    recorded under: the call is not made on the strength of a listing nobody proposed it under."""

    reason = "ToolSetChanged"


class ModelPlanner:
    name = "model"

    def __init__(self, inputs: AgentInputs) -> None:
        self.inputs = inputs
        self._tools = by_name(inputs.tools)

    def next_step(self, context: PlanningContext) -> PlannedStep:
        cp = context.checkpoint
        pending = cp.agent.pending if cp.agent is not None else None
        if pending is not None and pending.step_index == cp.position.step:
            # Before the call is made, approved or recomputed (resume validation, the dispatcher):
            # a server that changed its tools since the proposal fails the attempt, here, before
            # any call, not at the next model request after the effect.
            self._same_tool_set(cp.agent, f"call {pending.call_id} was proposed: not called")
            return self.step_of(pending, context.spec)
        raise ModelTurnNeeded(self.request(context))

    def _same_tool_set(self, facts: AgentFacts | None, since: str) -> None:
        """:class:`ToolSetChanged` unless the tools listed now are those ``facts`` recorded."""
        listed = tool_set_digest(self.inputs.tools)
        if facts is not None and listed != facts.tool_set_digest:
            raise ToolSetChanged(
                f"the tool set changed since {since} (recorded {facts.tool_set_digest}, listed now {listed})"
            )

    def request(self, context: PlanningContext) -> ModelRequest:
        """The next model call, from the checkpoint's facts only (the same facts, the same bytes).
        Facts recorded under another model, prompt or tool set are not fed to this one: the
        attempt fails saying what changed."""
        self._same_tool_set(context.checkpoint.agent, "the run's facts were recorded: not asked")
        try:
            return self._request(context)
        except ContextMismatch as err:
            raise PlannerError(str(err)) from err

    def _request(self, context: PlanningContext) -> ModelRequest:
        return build_request(
            model=self.inputs.model,
            system_prompt=self.inputs.system_prompt,
            objective=context.spec.objective,
            tools=self.inputs.tools,
            facts=context.checkpoint.agent,
            data_key=self.inputs.data_key,
            accepts_images=self.inputs.accepts_images,
        )

    def step_of(self, turn: ModelTurn, spec: AgentRunSpec) -> PlannedStep:
        """The step a recorded call stands for. An effect keeps its arguments SEALED as the
        checkpoint holds them: the intent (and the approval digest over it) binds exactly that
        ciphertext, which only the dispatcher opens."""
        declaration = self._tools.get(turn.tool)
        if declaration is None:
            raise PlannerError(f"tool {turn.tool!r} of call {turn.call_id} is no longer declared")
        arguments: Any = turn_arguments(turn, self.inputs.data_key)
        if not isinstance(arguments, dict):
            raise PlannerError(f"call {turn.call_id} has no arguments object")
        step = step_for(declaration, arguments, step_index=turn.step_index)
        if isinstance(step, CallMcpTool):
            return self._mcp_step(step, turn, spec)
        if isinstance(step, PerformEffect):
            return replace(step, arguments=dict(turn.arguments) if isinstance(turn.arguments, dict) else {})
        if isinstance(step, AskHuman):  # the model's question is its output: sealed, as a person's is
            label = step_label(step.request_id, "question")
            return replace(
                step,
                question=sealed_text(self.inputs.data_key, step.question, label, entropy=self.inputs.entropy),
            )
        return step

    def _mcp_step(self, step: CallMcpTool, turn: ModelTurn, spec: AgentRunSpec) -> PlannedStep:
        """A read-only MCP call is performed by the shell like a read; any other goes through the
        action ledger as an ``mcp.call`` effect (intent, approval if the policy says so, the
        idempotency key in the call's ``_meta``), its arguments kept sealed."""
        server = _server_of(spec, step, turn.call_id)
        tier = self.mcp_tier(step, server.url, recorded=turn.tier)
        if tier == ActionTier.READ_ONLY:
            return ReadTool(step.name, step.server, server.url, step.tool, step.arguments)
        target = {"server": step.server, "url": server.url, "tool": step.tool}
        if step.tool in server.query_tools:
            target["queryTool"] = server.query_tools[step.tool]
        arguments = dict(turn.arguments) if isinstance(turn.arguments, dict) else {}
        return PerformEffect(step.name, MCP_EFFECT, target, arguments, tool=turn.tool, tier=tier)

    def mcp_tier(self, step: CallMcpTool, url: str, *, recorded: ActionTier | None = None) -> ActionTier:
        """The call's tier: the policy's, else the hint of a server the policy trusts, else
        consequential; never below ``recorded`` (fixed when the proposal was recorded)."""
        configured = self.inputs.mcp_tiers.get(mcp_tier_key(step.server, step.tool))
        return mcp_call_tier(
            policy_tier=ActionTier(configured) if configured is not None else None,
            hinted=ActionTier(step.tier),
            trusted=trusts(self.inputs.mcp_trust, url, step.tool),
            recorded=recorded,
        )

    def proposed_tier(self, step: CallMcpTool, spec: AgentRunSpec) -> ActionTier | None:
        """The tier a proposed MCP call is recorded with (None: its server is not in the spec; the
        call then fails when it is planned)."""
        try:
            server = _server_of(spec, step, "proposed")
        except PlannerError:
            return None
        return self.mcp_tier(step, server.url)


def _server_of(spec: AgentRunSpec, step: CallMcpTool, call_id: str) -> McpServer:
    servers = {server.name: server for server in (spec.agent.mcp_servers if spec.agent else [])}
    server = servers.get(step.server)
    if server is None:
        raise PlannerError(f"MCP server {step.server!r} of call {call_id} is not in spec.agent")
    return server
