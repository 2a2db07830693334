"""Reveal for who may answer a run: the question it waits on, nothing else.

A question is sealed like the run's other values, and answering it needs verb ``answer`` (the
webhook's verb for ``spec.answers``), not the approver verb that reveals everything. So a reveal
(:mod:`durable_agents.shell.runs.reveal`) by someone who holds ``answer`` on the run but not its
approver verb is answered with this document only: the run, the question it waits on now (its
request ID, the key to answer under, its expiry, who asked it: a model's question is marked as the
model's words), and the answers already given to that question (refused ones, under its earlier
keys). Nothing else the run holds sealed is opened: no effect's arguments, no approval request,
no model turn, no action's arguments or outcome; ``withheld`` names what exists and the verb
that shows it. A run that waits on no question reveals nothing to them (:class:`NoQuestion`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from durable_agents.api.v1alpha1 import ApproverRule
from durable_agents.core.agent_facts import WRITTEN_BY_MODEL
from durable_agents.core.deliveries import base_key, delivery_label
from durable_agents.core.request_stamps import REQUEST_VERBS
from durable_agents.core.sealed_values import (
    DataKey,
    ValueSealingError,
    is_sealed,
    spec_slots,
    step_label,
    unseal_value,
)

ANSWER_VERB: Final = REQUEST_VERBS["answers"]
"""The verb whose holders see the question a run waits on (the verb that answers it)."""
SCOPE_QUESTION: Final = "question"
"""``scope`` of a reveal document that holds the waiting question only."""
SCOPE_ALL: Final = "all"
"""``scope`` of a reveal document that holds every sealed value (the approver's)."""


class NoQuestion(Exception):
    """The run waits on no question: a responder's reveal has nothing to show (the message says so)."""


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _opened(data_key: DataKey | None, value: Any, label: str, unreadable: dict[str, str]) -> Any:
    if not is_sealed(value):
        return value
    if data_key is None:
        unreadable[label] = "the run's data key does not open"
        return None
    try:
        return unseal_value(data_key, value, label)
    except ValueSealingError as err:
        unreadable[label] = str(err)
        return None


def withheld(run: Mapping[str, Any], shown: set[str]) -> list[str]:
    """What the run holds sealed beyond ``shown`` (labels), named without its values."""
    spec, status = _dict(run.get("spec")), _dict(run.get("status"))
    labels = sorted(
        label for holder, key, label in spec_slots(_dict(spec)) if label not in shown and holder.get(key)
    )
    found = [f"spec value {label}" for label in labels]
    if status.get("approvalRequest"):
        found.append("the approval request's arguments and proposal")
    turns = _dict(_dict(status.get("checkpoint")).get("agent")).get("turns")
    if isinstance(turns, list) and turns:
        many = f"{len(turns)} turns" if len(turns) > 1 else "turn"
        found.append(f"the model's {many} (arguments, reasons, results)")
    if isinstance(status.get("outcome"), Mapping) and is_sealed(status["outcome"].get("result")):
        found.append("the model's final answer")
    found.append("its actions' arguments and outcomes (ActionRecords), if any")
    return found


def question_document(
    run: Mapping[str, Any], data_key: DataKey | None, approvers: ApproverRule
) -> dict[str, Any]:
    """The reveal answer for who may answer ``run`` but not approve it (see the module)."""
    meta, status = _dict(run.get("metadata")), _dict(run.get("status"))
    where = f"{meta.get('namespace')}/{meta.get('name')}"
    checkpoint = _dict(status.get("checkpoint"))
    pending = _dict(checkpoint.get("pendingInput"))
    request_id = str(pending.get("requestId") or "")
    if not request_id:
        raise NoQuestion(
            f"agentrun {where} waits on no question (state {status.get('state', 'pending')!r}, "
            f"waiting for {status.get('waitingFor') or '-'}): verb {ANSWER_VERB!r} reveals only the "
            f"question a run waits on; its other sealed values need verb {approvers.verb!r} on "
            f"{approvers.resource}"
        )
    unreadable: dict[str, str] = {}
    key = str(pending.get("key") or request_id)
    question_label = step_label(request_id, "question")
    asked = {
        "requestId": request_id,
        "key": key,
        "question": _opened(data_key, pending.get("question"), question_label, unreadable),
        "expiresAt": pending.get("expiresAt"),
        "askedBy": WRITTEN_BY_MODEL if isinstance(checkpoint.get("agent"), Mapping) else "the run's spec",
    }
    given = _dict(_dict(run.get("spec")).get("answers"))
    answers = {
        k: _opened(data_key, v, delivery_label("answers", k), unreadable)
        for k, v in sorted(given.items())
        if k == key or base_key(k) == base_key(request_id)
    }
    document: dict[str, Any] = {
        "scope": SCOPE_QUESTION,
        "pendingInput": asked,
        "answers": answers,
        "withheld": {
            "what": withheld(run, {question_label, *(delivery_label("answers", k) for k in answers)}),
            "verb": approvers.verb,
            "resource": approvers.resource,
        },
    }
    if unreadable:
        document["unreadable"] = unreadable
    return document
