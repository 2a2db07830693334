"""What a model's reply means: a proposed tool call, a bad call, or a final answer.

A reply is a proposal, never authority. It can name only a declared tool; its arguments must be a
JSON object valid under that tool's schema; and everything that decides where a call lands (a
read's apiVersion and kind, an effect's name and target, an MCP server and tool) comes from the
declaration a person wrote, whatever the arguments say. The step a call becomes still goes through
the engine (policy tier, approval, intent, ledger) like any planner's step.

A bad call is not an error of the run: it becomes a :class:`ToolError`, whose ``message`` is the
tool result the model is shown next, so it can correct itself (within the limits' bound on
consecutive tool errors).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn, TypeVar

# No stubs for jsonschema in the dev dependencies (types-jsonschema would remove these ignores).
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from referencing.exceptions import Unresolvable

from durable_agents.api.v1alpha1 import ObjectReference
from durable_agents.core.agent.exchange import ModelReply, ToolCall
from durable_agents.core.agent.tools import NAME_PATTERN, ToolDeclaration, ToolDeclarationError, by_name
from durable_agents.core.agent_facts import (
    ARGUMENTS_DIGEST_LABEL,
    ARGUMENTS_MAX_BYTES,
    CALL_ID_PATTERN,
    DROPPED_MAX,
)
from durable_agents.core.checkpoint import ActionTier
from durable_agents.core.digest import canonical_json
from durable_agents.core.planner import (
    AskHuman,
    AwaitEvent,
    PerformEffect,
    PlannedStep,
    ReadObject,
    StartSubAgent,
)
from durable_agents.core.sealed_values import DataKey, keyed_digest

MESSAGE_MAX: Final = 1024
"""The longest ToolError message, in characters (it is shown to the model and sealed)."""
FINAL_ANSWER_MAX: Final = 4096
"""The longest final answer kept (a run's ``outcome.result`` holds 4096 characters)."""
INVALID_TOOL_NAME: Final = "invalid-tool-name"
"""Recorded (and replayed) instead of a called name that is not a function name at all."""

T = TypeVar("T")
_CALL_ID = re.compile(CALL_ID_PATTERN)


@dataclass(frozen=True)
class CallMcpTool:
    """A step that calls a tool on an MCP server (the shell's MCP client performs it)."""

    name: str
    server: str
    tool: str
    arguments: dict[str, Any]
    read_only: bool
    tier: ActionTier


AgentStep = PlannedStep | CallMcpTool


@dataclass(frozen=True)
class ProposedCall:
    """A well-formed call of a declared tool, and the step it becomes."""

    call_id: str
    tool: ToolDeclaration
    arguments: dict[str, Any]
    reason: str | None
    """What the model said alongside the call: its own account, advisory only."""
    step: AgentStep
    dropped: tuple[str, ...] = ()
    """The names of the reply's further calls, not executed (see :func:`dropped_calls`)."""

    def arguments_digest(self, data_key: DataKey) -> str:
        """As the turn records it: keyed, so the status says nothing about guessable arguments."""
        return keyed_digest(data_key, ARGUMENTS_DIGEST_LABEL, self.arguments)


@dataclass(frozen=True)
class ToolError:
    """A call that cannot be made; ``message`` goes back to the model as the call's result."""

    call_id: str
    tool: str
    """The called name, or :data:`INVALID_TOOL_NAME` when it is not a function name."""
    arguments: dict[str, Any] | str
    """The arguments object, or the model's raw text when it was not a JSON object."""
    reason: str | None
    message: str
    dropped: tuple[str, ...] = ()
    """The names of the reply's further calls, not executed (see :func:`dropped_calls`)."""


@dataclass(frozen=True)
class FinalAnswer:
    """The model called no tool: its text is the run's answer."""

    text: str
    truncated: bool = False


Proposal = ProposedCall | ToolError | FinalAnswer


class _Refused(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _bounded(message: str) -> str:
    return message if len(message) <= MESSAGE_MAX else message[: MESSAGE_MAX - 1] + "…"


def _call_id(call: ToolCall, step_index: int) -> str:
    # The model's ID when it is usable (the history replays it); else one derived from the step:
    # nine alphanumerics, which every server accepts (some insist on exactly that).
    return call.id if _CALL_ID.match(call.id) else f"call{step_index % 100_000:05d}"


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            # Parsers disagree on which duplicate wins; what the model meant is ambiguous.
            raise ValueError(f"the key {key!r} appears twice")
        out[key] = value
    return out


def _parse(text: str) -> dict[str, Any]:
    """The arguments object; :class:`_Refused` says why there is none."""
    if len(text) > 4 * ARGUMENTS_MAX_BYTES:  # not even parsed: no object that long fits once compacted
        raise _Refused(
            f"the arguments are {len(text)} characters; at most {ARGUMENTS_MAX_BYTES} bytes are accepted"
        )
    try:
        value = json.loads(text or "{}", parse_constant=_no_constants, object_pairs_hook=_unique_keys)
        size = len(canonical_json(value))  # refuses what canonical JSON cannot hold (huge integers)
    except (ValueError, RecursionError) as exc:
        raise _Refused(f"the arguments are not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise _Refused(f"the arguments must be a JSON object, not {type(value).__name__}")
    if size > ARGUMENTS_MAX_BYTES:
        raise _Refused(f"the arguments are {size} bytes; at most {ARGUMENTS_MAX_BYTES} are accepted")
    return value


def _recorded(text: str) -> dict[str, Any] | str:
    """What a refused call's arguments are recorded as: the object when there is one, else the text."""
    try:
        return _parse(text)
    except _Refused:
        return text


def _check(declaration: ToolDeclaration, arguments: dict[str, Any]) -> None:
    try:
        error = best_match(Draft202012Validator(declaration.parameters).iter_errors(arguments))
    except Unresolvable as exc:  # a broken "#…" reference in the person's schema: no call can pass
        raise _Refused(f"the schema of {declaration.name!r} cannot be checked: {exc}") from exc
    if error is not None:
        where = error.json_path if error.path else "the arguments"
        raise _Refused(f"invalid arguments for {declaration.name!r} at {where}: {error.message}")


def _fixed(value: T | None) -> T:
    if value is None:  # ToolDeclaration.__post_init__ sees to it that a kind's fields are set
        raise ToolDeclarationError("a declaration lacks a field its kind needs")
    return value


def step_for(declaration: ToolDeclaration, arguments: dict[str, Any], *, step_index: int) -> AgentStep:
    """The step a valid call becomes. Where it lands comes from ``declaration`` only."""
    name = f"agent-{step_index}"  # also the request ID of a wait: unique per step, stable on retry
    if declaration.kind == "read":
        api_version, kind = _fixed(declaration.api_version), _fixed(declaration.object_kind)
        return ReadObject(name, ObjectReference(api_version=api_version, kind=kind, name=arguments["name"]))
    if declaration.kind == "effect":
        # A deep copy of the person's target: nothing the model wrote reaches it.
        target = copy.deepcopy(dict(_fixed(declaration.target)))
        return PerformEffect(name, _fixed(declaration.effect), target, arguments, tool=declaration.name)
    if declaration.kind == "ask_human":
        return AskHuman(name, name, arguments["question"], declaration.expires_in)
    if declaration.kind == "await_event":
        return AwaitEvent(name, name, arguments["event"], declaration.expires_in)
    if declaration.kind == "agent":
        return StartSubAgent(name, _fixed(declaration.agent_ref), arguments["objective"])
    tier: ActionTier = _fixed(declaration.tier)
    server, tool = _fixed(declaration.server), _fixed(declaration.tool)
    return CallMcpTool(name, server, tool, arguments, declaration.read_only, tier)


def _offered(tools: Sequence[ToolDeclaration]) -> str:
    names = ", ".join(sorted(declaration.name for declaration in tools))
    return names or "(none)"


def _shown_name(name: str) -> str:
    return name if NAME_PATTERN.match(name) else INVALID_TOOL_NAME


def dropped_calls(reply: ModelReply) -> tuple[str, ...]:
    """The names of the calls after the first (at most DROPPED_MAX): not executed, and told so."""
    return tuple(_shown_name(call.name) for call in reply.tool_calls[1 : 1 + DROPPED_MAX])


def interpret(reply: ModelReply, tools: Sequence[ToolDeclaration], *, step_index: int) -> Proposal:
    """What ``reply`` proposes. Pure; never raises for anything the model wrote.

    Only the first tool call is taken: a turn is one call (the request sets
    ``parallel_tool_calls`` false), because each call is its own step, committed and possibly
    approved before the next is even asked for. A server that returns several anyway is told, in
    the next request, that the others were not executed (``dropped``: a tool result each), never
    left to believe they ran.
    """
    if not reply.tool_calls:
        text = reply.content or ""
        if len(text) > FINAL_ANSWER_MAX:
            return FinalAnswer(text[: FINAL_ANSWER_MAX - 1] + "…", truncated=True)
        return FinalAnswer(text)
    call = reply.tool_calls[0]
    call_id = _call_id(call, step_index)
    declarations = by_name(tools)
    declaration = declarations.get(call.name)
    dropped = dropped_calls(reply)
    if declaration is None:
        message = f"unknown tool {call.name[:64]!r}; the tools offered are: {_offered(tools)}"
        recorded = _recorded(call.arguments_text)
        return ToolError(call_id, _shown_name(call.name), recorded, reply.content, _bounded(message), dropped)
    try:
        arguments = _parse(call.arguments_text)
        _check(declaration, arguments)
    except _Refused as refused:
        recorded = _recorded(call.arguments_text)
        return ToolError(call_id, call.name, recorded, reply.content, _bounded(refused.message), dropped)
    step = step_for(declaration, arguments, step_index=step_index)
    return ProposedCall(call_id, declaration, arguments, reply.content, step, dropped)
