"""What an ActionRecord keeps of a system's request for input (``input_required``, ``status.input``).

The round, the keys a person answers, the keys refused before any person saw them, the opaque
``requestState`` (bounded: :data:`~durable_agents.api.v1alpha1.REQUEST_STATE_MAX`) and each
question as a person reads it, sealed with the run's data key under the label of the run's
question of that name (so a responder's reveal opens it, and nothing else). Past
:data:`~durable_agents.core.agent.mcp_elicitation.MAX_INPUT_ROUNDS` rounds, or with a state or a
question over its bound, the action fails clearly: nothing was applied.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

from durable_agents.api.v1alpha1 import REQUEST_STATE_MAX, ActionInput, ActionRecordSpec, ActionRecordStatus
from durable_agents.core.agent.mcp_elicitation import MAX_INPUT_ROUNDS
from durable_agents.core.agent.mcp_questions import question_label, question_name
from durable_agents.core.sealed_values import DataKey, ValueSealingError, seal_value
from durable_agents.shell.effects import Failed, InputRequired

INPUT_ROUNDS_EXCEEDED = "McpInputRoundsExceeded"
REQUEST_STATE_TOO_LARGE = "McpRequestStateTooLarge"
QUESTION_UNUSABLE = "McpQuestionUnusable"
_MAX_KEYS = 32


def asked_input(
    status: ActionRecordStatus, spec: ActionRecordSpec, asked: InputRequired, data_key: DataKey | None
) -> ActionInput | Failed:
    """The next round of input ``asked`` makes of the action, or why it fails instead."""
    round_ = (status.input.round if status.input is not None else 0) + 1
    nothing = "; nothing was applied"
    if round_ > MAX_INPUT_ROUNDS:
        said = f"the server asked for input {round_} times, at most {MAX_INPUT_ROUNDS} rounds are answered"
        return Failed(INPUT_ROUNDS_EXCEEDED, said + nothing)
    state = asked.request_state
    if state is not None and len(state) > REQUEST_STATE_MAX:
        said = f"the server's requestState has {len(state)} characters, at most {REQUEST_STATE_MAX} are kept"
        return Failed(REQUEST_STATE_TOO_LARGE, said + nothing)
    if len(asked.questions) + len(asked.refused) > _MAX_KEYS:
        said = f"the server asked {len(asked.questions) + len(asked.refused)} things, at most {_MAX_KEYS}"
        return Failed(QUESTION_UNUSABLE, said + nothing)
    if any(len(key) > 256 for key in (*asked.questions, *asked.refused)):
        return Failed(QUESTION_UNUSABLE, "the server keyed a request with more than 256 characters" + nothing)
    questions: dict[str, object] = {}
    for key, text in sorted(asked.questions.items()):
        name = question_name(spec.step_index, round_, key)
        try:
            questions[key] = (
                text
                if data_key is None
                else seal_value(data_key, text, question_label(name), entropy=os.urandom)
            )
        except ValueSealingError as err:
            return Failed(QUESTION_UNUSABLE, f"the question {key!r} cannot be kept: {err}{nothing}"[:4096])
    return ActionInput(
        round=round_,
        keys=sorted(asked.questions),
        refused=sorted(asked.refused),
        questions=questions,
        request_state=state,
        asked_at=datetime.now(UTC),
    )
