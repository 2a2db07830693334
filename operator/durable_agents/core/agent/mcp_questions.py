"""A server's request for input during a ledger call, as questions of the run (issue 36, item 1).

An MCP server that answers a consequential call with an ``InputRequiredResult`` leaves its
ActionRecord ``input_required`` (``status.input``: the round, the keys, the opaque state and each
question sealed with the run's data key). The run asks a question per key, one at a time, named
:func:`question_name` (``mcp-<step>-<round>-<key>``), and a person answers it with
``spec.answers[<name>]``: JSON checked against the requested schema by
:func:`~durable_agents.core.agent.mcp_elicitation.parse_answer`, at admission (:func:`answer_refusal`,
the webhook) and again by the dispatcher before the retry. Once every question of the round is
answered the dispatcher sends the same action again (same key) with the answers. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from durable_agents.core.agent.mcp_elicitation import parse_answer
from durable_agents.core.sealed_values import (
    DATA_KEY_ANNOTATION,
    DataKey,
    ValueSealingError,
    is_sealed,
    open_data_key,
    step_label,
    unseal_value,
)
from durable_agents.core.sealing import Keyring, UndecryptableError

__all__ = [
    "QUESTION_PREFIX",
    "admission_refusal",
    "answer_ref_id",
    "answer_refusal",
    "is_server_question",
    "question_label",
    "question_name",
    "question_schema",
]

QUESTION_PREFIX: Final = "mcp-"
_SLUG: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")


def question_name(step_index: int, round_: int, key: str) -> str:
    """The run's name of the question for the server's request ``key`` (deterministic: the engine
    and the dispatcher compute it alike; a key that is no request ID is replaced by its digest)."""
    slug = key if _SLUG.match(key) else "k" + hashlib.sha256(key.encode()).hexdigest()[:12]
    return f"{QUESTION_PREFIX}{step_index}-{round_}-{slug}"


def is_server_question(request_id: str) -> bool:
    return request_id.startswith(QUESTION_PREFIX)


def answer_ref_id(name: str) -> str:
    """The id of the evidence reference the run records once question ``name`` is answered (the
    one every answered wait records: ``answer-<request ID>``)."""
    return f"answer-{name}"


def question_label(name: str) -> str:
    """The label question ``name`` is sealed under (a run's question's, so a reveal opens it)."""
    return step_label(name, "question")


def question_schema(text: str) -> Mapping[str, Any] | None:
    """The requested schema of a question as a person reads it (``for_person``); None for a URL."""
    said = json.loads(text)
    schema = said.get("requestedSchema") if isinstance(said, Mapping) else None
    return schema if isinstance(schema, Mapping) else None


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def answer_refusal(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, data_key: DataKey | None
) -> str | None:
    """Why a person's new answer to the server's question the run waits on does not answer it
    (``spec.answers[<key>]: content.nights: …``), or None. Only an answer given now in clear (the
    webhook seals it after this check) to a server's question is looked at."""
    pending = _dict(_dict(_dict(_dict(old).get("status")).get("checkpoint")).get("pendingInput"))
    request_id = str(pending.get("requestId") or "")
    if not is_server_question(request_id):
        return None
    key = str(pending.get("key") or request_id)
    given = _dict(_dict(new.get("spec")).get("answers")).get(key)
    before = _dict(_dict(_dict(old).get("spec")).get("answers")).get(key)
    if not isinstance(given, str) or given == before or is_sealed(given):
        return None
    question = pending.get("question")
    try:
        text = unseal_value(data_key, question, question_label(request_id)) if data_key else question
        schema = question_schema(str(text))
    except (ValueSealingError, ValueError) as err:
        return f"spec.answers[{key}]: the question it answers cannot be read ({err})"
    parsed = parse_answer(schema, given)
    return f"spec.answers[{key}]: {parsed}" if isinstance(parsed, str) else None


def admission_refusal(new: Mapping[str, Any], old: Mapping[str, Any] | None, keyring: Keyring) -> str | None:
    """:func:`answer_refusal` with the run's data key opened from ``old``'s annotation (the webhook)."""
    meta = _dict(_dict(old).get("metadata"))
    annotation = _dict(meta.get("annotations")).get(DATA_KEY_ANNOTATION)
    data_key = None
    if isinstance(annotation, str):
        try:
            data_key = open_data_key(keyring, annotation, str(meta.get("namespace")), str(meta.get("name")))
        except UndecryptableError as err:
            return f"spec.answers: the run's data key does not open here ({err})"
    return answer_refusal(new, old, data_key)
