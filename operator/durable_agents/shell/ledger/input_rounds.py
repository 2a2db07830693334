"""The dispatcher's side of a system's request for input (``input_required``): whether the run
holds every answer of the round, checked again here, and what the retry carries.

The run asks each question (``mcp-<step>-<round>-<key>``) and records, once the admission
webhook's seal proves an answer, a reference to it (``answer-<name>``, naming the
``spec.answers`` key it took). Once every question of the round has one, the answers are read
from the run, their seals verified, unsealed and parsed against the requested schema again (the
second line: a bad answer written with the webhook off, on a run without a data key, is not
sent: the action fails, nothing applied). Then the same action is sent again, with the same key,
the answers and the echoed state (:class:`~durable_agents.shell.effects.mcp.McpInputAnswers`).

A run that ended (its question expired, it was canceled) or is gone leaves its action failed
(``McpInputNotAnswered``): nothing was applied, and the server is not told (the round trip is
stateless: no call is open to cancel). Survives a restart: everything is in the ActionRecord and
the run's checkpoint; a run's watch event wakes the records waiting on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from durable_agents.api.v1alpha1 import ActionInput, ActionRecordSpec, ActionRecordStatus, ActionState
from durable_agents.api.v1alpha1.states import RunState
from durable_agents.core.agent.mcp_elicitation import ElicitationAnswer, parse_answer
from durable_agents.core.agent.mcp_questions import (
    answer_ref_id,
    question_label,
    question_name,
    question_schema,
)
from durable_agents.core.deliveries import delivery_label, delivery_unproven
from durable_agents.core.sealed_values import DataKey, ValueSealingError, unseal_value
from durable_agents.core.sealing import Keyring
from durable_agents.shell.effects.mcp import McpInputAnswers
from durable_agents.shell.ground.kube import ObjectKey
from durable_agents.shell.ground.store import Gone, RunStore
from durable_agents.shell.ledger.record_writes import RecordWrites
from durable_agents.shell.ledger.unsealing import CannotUnseal, data_key_of

NOT_ANSWERED = "McpInputNotAnswered"
ANSWER_REFUSED = "McpAnswerRefused"
INPUT_RECHECK = timedelta(seconds=60)
"""How soon a record waiting for answers is looked at again without a run event."""
_ANSWERS_MARKER = "/spec.answers/"


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def answer_refs(run: Mapping[str, Any]) -> dict[str, str]:
    """The run's recorded answers: each reference's id and the ``spec.answers`` URI it took."""
    return {
        str(ref.get("id")): str(ref.get("uri") or "")
        for ref in _dict(_dict(run.get("status")).get("checkpoint")).get("inputRefs") or []
        if isinstance(ref, Mapping)
    }


class AnswerRefused(Exception):
    """An answer the run recorded cannot be sent (the message says which and why)."""


class InputRounds:
    """The records waiting for their run's answers, and the answers once all are given."""

    def __init__(self, runs: RunStore, writes: RecordWrites, keyring: Keyring | None) -> None:
        self.runs, self.writes, self.keyring = runs, writes, keyring
        self._waiting: dict[ObjectKey, set[ObjectKey]] = {}  # run -> its records waiting for answers

    def answered(self, run: Mapping[str, Any]) -> list[ObjectKey]:
        """The records waiting on ``run`` (a watch event of it): looked at again now."""
        meta = _dict(run.get("metadata"))
        return sorted(self._waiting.pop((str(meta.get("namespace", "")), str(meta.get("name", ""))), ()))

    async def answers(
        self, body: dict[str, Any], status: ActionRecordStatus, spec: ActionRecordSpec
    ) -> McpInputAnswers | dict[str, Any] | datetime:
        """What the retry carries; or the record as it settled (failed: not answered, or an
        answer refused); or when to look again (not every question is answered yet)."""
        namespace = body["metadata"]["namespace"]
        asked = status.input
        if asked is None:  # forged away meanwhile? an input_required without its round
            return await self._fail(body, status, NOT_ANSWERED, "no round of input is recorded")
        try:
            run = await self.runs.get(namespace, spec.run_ref.name)
        except Gone:
            return await self._fail(body, status, NOT_ANSWERED, f"its run {spec.run_ref.name!r} is gone")
        state = str(_dict(run.get("status")).get("state") or "")
        if state in {s.value for s in RunState if s.terminal} or state == RunState.CANCEL_REQUESTED.value:
            why = f"its run is {state} before every question was answered (expired or canceled)"
            return await self._fail(body, status, NOT_ANSWERED, why)
        refs = answer_refs(run)
        if any(answer_ref_id(question_name(spec.step_index, asked.round, k)) not in refs for k in asked.keys):
            self._waiting.setdefault((namespace, spec.run_ref.name), set()).add(self._key(body))
            return datetime.now(UTC) + INPUT_RECHECK
        try:
            data_key = data_key_of(run, self.keyring)
            given = {key: self.answer_of(run, spec, asked, key, refs, data_key) for key in asked.keys}
        except (CannotUnseal, AnswerRefused) as err:
            return await self._fail(body, status, ANSWER_REFUSED, str(err))
        return McpInputAnswers(given, list(asked.refused), asked.request_state)

    def answer_of(
        self,
        run: Mapping[str, Any],
        spec: ActionRecordSpec,
        asked: ActionInput,
        key: str,
        refs: Mapping[str, str],
        data_key: DataKey | None,
    ) -> ElicitationAnswer:
        """The answer to ``key`` the run recorded, its seal verified, parsed against the schema."""
        name = question_name(spec.step_index, asked.round, key)
        uri = refs[answer_ref_id(name)]
        answer_key = uri.rsplit(_ANSWERS_MARKER, 1)[1] if _ANSWERS_MARKER in uri else name
        value = _dict(_dict(run.get("spec")).get("answers")).get(answer_key)
        if not isinstance(value, str):
            raise AnswerRefused(f"spec.answers[{answer_key}] is missing")
        unproven = delivery_unproven(data_key, "answers", answer_key, value)
        if unproven is not None:
            raise AnswerRefused(f"spec.answers[{answer_key}]: {unproven.message}")
        try:
            text = unseal_value(data_key, value, delivery_label("answers", answer_key)) if data_key else value
            question = asked.questions.get(key)
            said = unseal_value(data_key, question, question_label(name)) if data_key else question
            schema = question_schema(str(said))
        except (ValueSealingError, ValueError) as err:
            raise AnswerRefused(
                f"spec.answers[{answer_key}]: cannot be read with its question: {err}"
            ) from None
        parsed = parse_answer(schema, str(text))
        if isinstance(parsed, str):
            raise AnswerRefused(f"spec.answers[{answer_key}]: {parsed}")
        return parsed

    async def _fail(
        self, body: dict[str, Any], status: ActionRecordStatus, reason: str, why: str
    ) -> dict[str, Any]:
        message = f"{why}; not sent again, nothing was applied"[:4096]
        out = await self.writes.write(body, status, ActionState.FAILED, reason=reason, message=message)
        await self.writes.event(out, reason, message, warning=True)
        return out

    @staticmethod
    def _key(body: Mapping[str, Any]) -> ObjectKey:
        return (body["metadata"]["namespace"], body["metadata"]["name"])
