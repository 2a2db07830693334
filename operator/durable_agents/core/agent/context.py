"""The model's context, rebuilt from the checkpoint's facts at every turn.

Not a transcript: the request is a function of the system prompt, the run's objective, the tool
declarations and the recorded turns, nothing else (no clock, no random IDs, no memory of an earlier
process). The same inputs give the same bytes, so a resumed run on a fresh worker asks the model
exactly what an uninterrupted one would have, and a request can be audited by its digest.

Messages: the system prompt, the objective (as the user's message), then per turn the model's
call (its reason as ``content``, one ``tool_calls`` entry) and the call's result (a ``tool``
message); a reply that had further calls has them replayed too (arguments ``{}``, IDs derived from
the turn), each answered "not executed", so the model never believes they ran. Sealed values are
opened here, with the run's data key, and only in the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from durable_agents.core.agent.exchange import ModelRequest
from durable_agents.core.agent.mcp_content import images_taken
from durable_agents.core.agent.tools import ToolDeclaration, openai_tools, tool_set_digest
from durable_agents.core.agent_facts import (
    RESULT_MAX_BYTES,
    AgentFacts,
    ModelTurn,
    new_facts,
    prompt_digest,
    turn_arguments,
    turn_reason,
    turn_result_text,
    turn_result_value,
)
from durable_agents.core.digest import canonical_json
from durable_agents.core.sealed_values import DataKey


def _text_of(value: Any) -> str:
    return canonical_json(value).decode("utf-8")


TRUNCATION_NOTE: Final = f"\n[truncated: the result was longer than {RESULT_MAX_BYTES} bytes]"
# What a turn without a result shows the model (fixed texts: nothing from outside the facts).
_NO_RESULT: Final = {
    "pending": {"status": "pending"},
    "succeeded": {"status": "succeeded"},
    "failed": {"status": "failed"},
    "refused": {"status": "refused"},
}


NOT_EXECUTED: Final = _text_of(
    {
        "status": "not executed",
        "reason": "only the first tool call of a reply is executed (one call per turn); this one was not."
        " Call it again, on its own, if it is still needed.",
    }
)


class ContextMismatch(ValueError):
    """The facts were recorded under another model, prompt or tool set: resume validation must
    decide (re-plan, re-approve, fail), not the model."""


def start_facts(*, model: str, system_prompt: str, tools: Sequence[ToolDeclaration]) -> AgentFacts:
    """The facts of a run before its first model call."""
    return new_facts(
        model=model, prompt_digest=prompt_digest(system_prompt), tool_set_digest=tool_set_digest(tools)
    )


def configuration_change(
    facts: AgentFacts, *, model: str, system_prompt: str, tools: Sequence[ToolDeclaration]
) -> str | None:
    """What differs between the configuration the facts were recorded under and this one, or None."""
    changed = []
    if facts.model != model:
        changed.append(f"model {facts.model!r} -> {model!r}")
    if facts.prompt_digest != prompt_digest(system_prompt):
        changed.append("system prompt")
    if facts.tool_set_digest != tool_set_digest(tools):
        changed.append("tool set")
    return ", ".join(changed) or None


def _text(value: Any) -> str:
    return canonical_json(value).decode("utf-8")


def _call_arguments(turn: ModelTurn, data_key: DataKey) -> str:
    arguments = turn_arguments(turn, data_key)
    # Raw text that was not a JSON object is not replayed: some servers parse the history's
    # arguments and reject invalid JSON. The refusal (the tool message) says what was wrong.
    return _text(arguments if isinstance(arguments, dict) else {})


def _result(turn: ModelTurn, data_key: DataKey, images: bool) -> tuple[str, list[dict[str, str]]]:
    """The result's text, and its images when ``images`` (the model accepts them): a recorded
    image's data never reaches the text (:func:`~durable_agents.core.agent.mcp_content.images_taken`)."""
    if turn.result is None:
        return _text(_NO_RESULT[turn.outcome]), []
    if turn.result_truncated:  # cut text: no image's data in it (WITH_IMAGES_MAX_BYTES)
        return str(turn_result_text(turn, data_key)) + TRUNCATION_NOTE, []
    value, taken = images_taken(turn_result_value(turn, data_key), passed=images)
    return _text(value), taken


def images_message(turn: ModelTurn, images: list[dict[str, str]]) -> dict[str, Any]:
    """The images of a turn's result, as the user message that follows its results (a tool
    message carries text only in chat completions)."""
    parts: list[dict[str, Any]] = [
        {"type": "text", "text": f"The images of the result of call {turn.call_id} ({turn.tool}):"}
    ]
    for image in images:
        url = f"data:{image['mimeType']};base64,{image['data']}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"role": "user", "content": parts}


def dropped_call_id(turn: ModelTurn, position: int) -> str:
    """The ID a dropped call is replayed under: derived from the turn (the model's own may be
    unusable or repeated), nine alphanumerics like a derived call ID (see interpret)."""
    return f"drop{turn.index % 10_000:04d}{position % 10}"


def turn_messages(
    turn: ModelTurn, data_key: DataKey, *, accepts_images: bool = False
) -> tuple[dict[str, Any], ...]:
    """The model's call and the call's result, as chat-completions messages; then, for each
    further call of the same reply, a result saying it was not executed; then, for a model that
    accepts images, the result's images in a user message."""
    dropped = turn.dropped_tools or []
    calls = [
        {
            "id": turn.call_id,
            "type": "function",
            "function": {"name": turn.tool, "arguments": _call_arguments(turn, data_key)},
        },
        *(
            {
                "id": dropped_call_id(turn, n),
                "type": "function",
                "function": {"name": tool, "arguments": "{}"},
            }
            for n, tool in enumerate(dropped)
        ),
    ]
    call = {"role": "assistant", "content": turn_reason(turn, data_key), "tool_calls": calls}
    text, images = _result(turn, data_key, accepts_images)
    result = {"role": "tool", "tool_call_id": turn.call_id, "content": text}
    not_executed = [
        {"role": "tool", "tool_call_id": dropped_call_id(turn, n), "content": NOT_EXECUTED}
        for n in range(len(dropped))
    ]
    shown = [images_message(turn, images)] if images else []
    return call, result, *not_executed, *shown


def build_request(
    *,
    model: str,
    system_prompt: str,
    objective: str,
    tools: Sequence[ToolDeclaration],
    facts: AgentFacts | None,
    data_key: DataKey,
    accepts_images: bool = False,
) -> ModelRequest:
    """The next request to the model. :class:`ContextMismatch` when ``facts`` were recorded under
    another configuration (old facts are never fed silently to another model, prompt or tool set)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": objective},
    ]
    if facts is not None:
        change = configuration_change(facts, model=model, system_prompt=system_prompt, tools=tools)
        if change is not None:
            raise ContextMismatch(f"the run's facts were recorded under another configuration: {change}")
        for turn in facts.turns:  # in order: the facts validate that turn i has index i
            messages.extend(turn_messages(turn, data_key, accepts_images=accepts_images))
    return ModelRequest(model=model, messages=tuple(messages), tools=openai_tools(tools))
