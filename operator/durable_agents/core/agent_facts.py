"""The model planner's facts: what the checkpoint records about a run's model turns.

The model's context is rebuilt from these facts (:mod:`.context`), never from a transcript kept
elsewhere. Each turn records one tool call the model proposed, how it ended, and what it cost.
What the model wrote (its arguments, its stated reason) and what a tool returned are sealed under
the run tree's data key, each bound to its turn and field (label ``agent/turns/<index>/<field>``),
so the checkpoint holds no plaintext of them and a sealed value moved to another turn or field
does not open. Everything is bounded, because the checkpoint lives in the AgentRun's status:

- :data:`MAX_TURNS` turns per run (in the type: a longer list does not validate);
- a result: :data:`RESULT_MAX_BYTES` of canonical JSON, longer ones truncated (``resultTruncated``);
- a reason: :data:`REASON_MAX_CHARS` characters; arguments: :data:`ARGUMENTS_MAX_BYTES`
  (:mod:`.interpret` refuses larger ones); arguments that were not JSON: :data:`RAW_ARGUMENTS_MAX_CHARS`;
- every sealed value: :data:`SEALED_TOKEN_MAX` characters.

This module does not import :mod:`durable_agents.core.checkpoint`, which imports it (the
``agent`` field); so its base model repeats the checkpoint contract's configuration. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.alias_generators import to_camel

from durable_agents.api.v1alpha1.meta import ActionTier
from durable_agents.core.digest import canonical_digest, canonical_json
from durable_agents.core.entropy import Entropy
from durable_agents.core.sealed_values import (
    SEALED_KEY,
    TOKEN_PREFIX,
    DataKey,
    is_sealed,
    keyed_digest,
    seal_value,
    unseal_value,
)

MAX_TURNS: Final = 256
RESULT_MAX_BYTES: Final = 16 * 1024
"""The most of a tool result kept, in bytes of the sealed plaintext (canonical JSON)."""
REASON_MAX_CHARS: Final = 2048
ARGUMENTS_MAX_BYTES: Final = 8 * 1024
RAW_ARGUMENTS_MAX_CHARS: Final = 2048
SEALED_TOKEN_MAX: Final = 24 * 1024
"""A sealed token of RESULT_MAX_BYTES of plaintext is 21,894 characters (base64 of nonce,
ciphertext and tag, plus its prefix); the rest is margin."""
MODEL_CALLS_MAX: Final = 1024
DROPPED_MAX: Final = 4
"""The most further tool calls of one reply a turn records (each is told to the model as not
executed); a reply with more has the rest neither recorded nor replayed."""
TRUNCATED_KEY: Final = "truncated"
VALUE_KEY: Final = "value"
WRITTEN_BY_MODEL: Final = "model"

TurnOutcome = Literal["succeeded", "failed", "refused", "pending"]
SettledOutcome = Literal["succeeded", "failed", "refused"]
TurnField = Literal["arguments", "reason", "result"]

Count = Annotated[int, Field(ge=0, le=2**53 - 1)]
Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
KeyedDigest = Annotated[str, StringConstraints(pattern=r"^hmac-sha256:[0-9a-f]{64}$")]
ARGUMENTS_DIGEST_LABEL = "agent/arguments"
Identifier = Annotated[str, StringConstraints(min_length=1, max_length=253)]
CALL_ID_PATTERN: Final = r"^[A-Za-z0-9_.:-]{1,64}$"
CallId = Annotated[str, StringConstraints(pattern=CALL_ID_PATTERN)]
ToolName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


def _sealed(value: str | dict[str, str]) -> str | dict[str, str]:
    token = value if isinstance(value, str) else value.get(SEALED_KEY, "")
    if not is_sealed(value) or not token.startswith(TOKEN_PREFIX):
        raise ValueError(f"must be a sealed value ('sealed:v1:…' or {{{SEALED_KEY!r}: …}}), never plaintext")
    if len(token) > SEALED_TOKEN_MAX:
        raise ValueError(f"sealed value over {SEALED_TOKEN_MAX} characters")
    return value


SealedValue = Annotated[str | dict[str, str], AfterValidator(_sealed)]
"""A value sealed by :func:`durable_agents.core.sealed_values.seal_value` (a token for a string,
``{"durable-agents.io/sealed": token}`` for anything else); plaintext does not validate."""


class _Facts(BaseModel):
    # The checkpoint contract's configuration (checkpoint.record._Contract), repeated: see the module doc.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class TokenUsage(_Facts):
    input_tokens: Count = 0
    output_tokens: Count = 0

    def plus(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


class ModelTurn(_Facts):
    """One tool call the model proposed, and how it ended."""

    index: Count
    """The turn's place in ``turns`` (0, 1, …); part of every sealed value's label."""
    call_id: CallId
    """The tool call's ID, as the model gave it (or one derived from the step, see interpret)."""
    tool: ToolName
    """The tool's name as the model called it (a placeholder when the name was not one)."""
    arguments: SealedValue
    """Sealed: the arguments object; for a call refused because they were not a JSON object,
    the model's raw text (a string)."""
    arguments_digest: KeyedDigest
    """keyed_digest of the plaintext arguments under the run's data key (what an approval binds
    to): equal arguments compare equal, and a reader of the status cannot test a guess at them."""
    reason: SealedValue | None = None
    """Sealed ``{"writtenBy": "model", "text": …}``: what the model said alongside the call.
    Written by the model: advisory, never authority. None when it said nothing."""
    result: SealedValue | None = None
    """Sealed ``{"value": <JSON>}``, or ``{"truncated": <canonical JSON text, cut>}`` when the
    result was over RESULT_MAX_BYTES. None while pending."""
    result_truncated: bool = False
    outcome: TurnOutcome
    step_index: Count
    """The run's step this turn is."""
    usage: TokenUsage = Field(default_factory=TokenUsage)
    """Tokens of the model call(s) that produced this turn."""
    model_calls: Annotated[int, Field(ge=1, le=MODEL_CALLS_MAX)] = 1
    """Model calls since the last boundary that led to this turn."""
    dropped_tools: Annotated[list[ToolName], Field(min_length=1, max_length=DROPPED_MAX)] | None = None
    """The names of the further tool calls in the reply, in order: a turn is one call, so these
    were not executed, and the model is told so (a tool result each) when its context is rebuilt.
    None (absent) when the reply had one call, so older checkpoints keep their digest."""
    tier: ActionTier | None = None
    """An MCP call's tier, fixed when the proposal was recorded (see :mod:`.agent.mcp_trust`): no
    later listing or policy lowers it. None for other tools (and turns recorded before it was)."""

    @model_validator(mode="after")
    def _result_matches_outcome(self) -> Self:
        if self.outcome == "pending" and self.result is not None:
            raise ValueError("a pending turn has no result yet")
        if self.result_truncated and self.result is None:
            raise ValueError("resultTruncated without a result")
        return self


class AgentFacts(_Facts):
    """The model planner's part of the checkpoint (``agent``)."""

    model: Identifier
    """The model the turns were asked of."""
    prompt_digest: Digest
    tool_set_digest: Digest
    turns: Annotated[list[ModelTurn], Field(max_length=MAX_TURNS)] = Field(default_factory=list)
    usage_total: TokenUsage = Field(default_factory=TokenUsage)
    model_calls_total: Count = 0
    tool_errors: Count = 0
    """Consecutive turns refused as bad calls (unknown tool, invalid arguments); 0 after a good one."""

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        for position, turn in enumerate(self.turns):
            if turn.index != position:
                raise ValueError(f"turn {position} has index {turn.index}: turns are numbered 0, 1, …")
            if turn.outcome == "pending" and position != len(self.turns) - 1:
                raise ValueError(f"turn {position} is pending but is not the last turn")
            if position and turn.step_index < self.turns[position - 1].step_index:
                raise ValueError(f"turn {position} goes back to step {turn.step_index}")
        if sum(turn.model_calls for turn in self.turns) > self.model_calls_total:
            raise ValueError("the turns count more model calls than modelCallsTotal")
        return self

    @property
    def pending(self) -> ModelTurn | None:
        """The last turn, while its call is not settled."""
        return self.turns[-1] if self.turns and self.turns[-1].outcome == "pending" else None


def prompt_digest(system_prompt: str) -> str:
    return canonical_digest({"systemPrompt": system_prompt})


ANSWER_LABEL: Final = "agent/answer"
ANSWER_MAX_BYTES: Final = 2800
"""The model's final answer kept in ``outcome.result`` (4096 characters), sealed: its plaintext
cut to this many bytes of UTF-8 fits once sealed."""


def sealed_text(data_key: DataKey, text: str, label: str, *, entropy: Entropy) -> str:
    """Model output kept in a 4096-character status field (its final answer, its question to a
    person): cut to ANSWER_MAX_BYTES, then sealed."""
    token = seal_value(data_key, _cut_utf8(text, ANSWER_MAX_BYTES), label, entropy=entropy)
    assert isinstance(token, str)  # a string seals to a token string
    return token


def sealed_answer(data_key: DataKey, text: str, *, entropy: Entropy) -> str:
    """The model's final answer as the run's outcome keeps it: model output, so sealed."""
    return sealed_text(data_key, text, ANSWER_LABEL, entropy=entropy)


def turn_label(index: int, field: TurnField) -> str:
    return f"agent/turns/{index}/{field}"


# --- bounding ----------------------------------------------------------------------------------


def _cut_utf8(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` whose UTF-8 form fits ``max_bytes`` (never half a character)."""
    return text.encode("utf-8")[:max_bytes].decode("utf-8", errors="ignore")


def bound_result(value: Any) -> tuple[dict[str, Any], bool]:
    """The plaintext to seal for a tool result, and whether it was truncated.

    ``{"value": value}`` when that fits RESULT_MAX_BYTES of canonical JSON; otherwise
    ``{"truncated": text}``, the longest prefix of the result's canonical JSON text that fits
    (measured as sealed: a string's quotes and backslashes are escaped again).
    """
    whole = {VALUE_KEY: value}
    if len(canonical_json(whole)) <= RESULT_MAX_BYTES:
        return whole, False
    text = _cut_utf8(canonical_json(value).decode("utf-8"), RESULT_MAX_BYTES)
    low, high = 0, len(text)  # the longest prefix that fits once escaped: a binary search
    while low < high:
        middle = (low + high + 1) // 2
        if len(canonical_json({TRUNCATED_KEY: text[:middle]})) <= RESULT_MAX_BYTES:
            low = middle
        else:
            high = middle - 1
    return {TRUNCATED_KEY: text[:low]}, True


def bound_reason(text: str) -> str:
    return text if len(text) <= REASON_MAX_CHARS else text[: REASON_MAX_CHARS - 1] + "…"


def bound_raw_arguments(text: str) -> str:
    return text if len(text) <= RAW_ARGUMENTS_MAX_CHARS else text[: RAW_ARGUMENTS_MAX_CHARS - 1] + "…"


# --- turns -------------------------------------------------------------------------------------


def new_turn(
    data_key: DataKey,
    *,
    entropy: Entropy,
    index: int,
    call_id: str,
    tool: str,
    arguments: Mapping[str, Any] | str,
    reason: str | None,
    step_index: int,
    usage: TokenUsage | None = None,
    model_calls: int = 1,
    refusal: str | None = None,
    dropped_tools: Sequence[str] = (),
    tier: ActionTier | None = None,
) -> ModelTurn:
    """A turn for a call the model just proposed: ``pending``, or ``refused`` (with the refusal
    sealed as its result) when ``refusal`` says why the call was not accepted."""
    plain_arguments: Any = (
        dict(arguments) if isinstance(arguments, Mapping) else bound_raw_arguments(arguments)
    )
    sealed_reason = None
    if reason:
        model_text = {"writtenBy": WRITTEN_BY_MODEL, "text": bound_reason(reason)}
        sealed_reason = seal_value(data_key, model_text, turn_label(index, "reason"), entropy=entropy)
    turn = ModelTurn(
        index=index,
        call_id=call_id,
        tool=tool,
        arguments=seal_value(data_key, plain_arguments, turn_label(index, "arguments"), entropy=entropy),
        arguments_digest=keyed_digest(data_key, ARGUMENTS_DIGEST_LABEL, plain_arguments),
        reason=sealed_reason,
        outcome="pending",
        step_index=step_index,
        usage=usage or TokenUsage(),
        model_calls=model_calls,
        dropped_tools=list(dropped_tools[:DROPPED_MAX]) or None,
        tier=tier,
    )
    if refusal is None:
        return turn
    refused = {"status": "refused", "reason": refusal}
    return settle_turn(turn, data_key, entropy=entropy, outcome="refused", result=refused)


def settle_turn(
    turn: ModelTurn, data_key: DataKey, *, entropy: Entropy, outcome: SettledOutcome, result: Any
) -> ModelTurn:
    """``turn`` ended: its outcome and its result, sealed and bounded."""
    plain, truncated = bound_result(result)
    sealed = seal_value(data_key, plain, turn_label(turn.index, "result"), entropy=entropy)
    # model_validate, not model_copy: the bounds and the outcome rules are checked again.
    return ModelTurn.model_validate(
        {**turn.model_dump(), "outcome": outcome, "result": sealed, "result_truncated": truncated}
    )


# --- facts -------------------------------------------------------------------------------------


def new_facts(*, model: str, prompt_digest: str, tool_set_digest: str) -> AgentFacts:
    return AgentFacts(model=model, prompt_digest=prompt_digest, tool_set_digest=tool_set_digest)


def with_model_call(facts: AgentFacts, usage: TokenUsage, *, calls: int = 1) -> AgentFacts:
    """``facts`` after model calls that recorded no turn (a final answer)."""
    return AgentFacts.model_validate(
        {
            **facts.model_dump(),
            "usage_total": facts.usage_total.plus(usage),
            "model_calls_total": facts.model_calls_total + calls,
        }
    )


def with_turn(facts: AgentFacts, turn: ModelTurn) -> AgentFacts:
    """``facts`` with ``turn`` appended, its usage and model calls counted.

    A turn appended already ``refused`` is a bad call (:mod:`.interpret` refused it) and counts
    towards ``toolErrors``; any other resets the count. A refusal that comes later (the policy, an
    approver) settles a pending turn with :func:`settle_last` and is not a bad call.
    """
    if facts.pending is not None:
        raise ValueError(f"turn {facts.pending.index} is still pending")
    if turn.index != len(facts.turns):
        raise ValueError(f"the next turn is number {len(facts.turns)}, not {turn.index}")
    counted = with_model_call(facts, turn.usage, calls=turn.model_calls)
    return AgentFacts.model_validate(
        {
            **counted.model_dump(),
            "turns": [*counted.turns, turn],
            "tool_errors": facts.tool_errors + 1 if turn.outcome == "refused" else 0,
        }
    )


def settle_last(
    facts: AgentFacts, data_key: DataKey, *, entropy: Entropy, outcome: SettledOutcome, result: Any
) -> AgentFacts:
    """``facts`` with the pending turn settled."""
    pending = facts.pending
    if pending is None:
        raise ValueError("no turn is pending")
    settled = settle_turn(pending, data_key, entropy=entropy, outcome=outcome, result=result)
    return AgentFacts.model_validate({**facts.model_dump(), "turns": [*facts.turns[:-1], settled]})


# --- reading sealed values back (data-key holders only) -------------------------------------------


def turn_arguments(turn: ModelTurn, data_key: DataKey) -> Any:
    """The arguments object (or, for a call refused as not JSON, the raw text)."""
    return unseal_value(data_key, turn.arguments, turn_label(turn.index, "arguments"))


def turn_reason(turn: ModelTurn, data_key: DataKey) -> str | None:
    if turn.reason is None:
        return None
    plain = unseal_value(data_key, turn.reason, turn_label(turn.index, "reason"))
    return str(plain["text"])


def turn_result_value(turn: ModelTurn, data_key: DataKey) -> Any:
    """The recorded result's value (None: no result, or a truncated one: see turn_result_text)."""
    if turn.result is None:
        return None
    plain = unseal_value(data_key, turn.result, turn_label(turn.index, "result"))
    return plain.get(VALUE_KEY)


def turn_result_text(turn: ModelTurn, data_key: DataKey) -> str | None:
    """The result as the model is shown it: canonical JSON text (cut when it was truncated)."""
    if turn.result is None:
        return None
    plain = unseal_value(data_key, turn.result, turn_label(turn.index, "result"))
    if TRUNCATED_KEY in plain:
        return str(plain[TRUNCATED_KEY])
    return canonical_json(plain[VALUE_KEY]).decode("utf-8")
