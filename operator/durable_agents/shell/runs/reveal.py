"""Reveal: an approver sees what they approve, who may answer sees the question, nobody else does,
and nothing is stored.

``kubectl agentrun status --reveal`` sends a server-side DRY-RUN patch adding the annotation
:data:`REVEAL_ANNOTATION` (the base64 of an X25519 public key it made for this one request). The
operator's mutating admission webhook, on such an update, asks a SubjectAccessReview whether the
requesting user holds the run's approver verb (the policy's, default ``approve``) and answers with
a patch that removes the request and sets :data:`REVEALED_ANNOTATION`: the run's sealed values
(spec, the approval request's arguments, the pending question, its ActionRecords' arguments and
outcomes) in plaintext, encrypted to that public key (:mod:`durable_agents.core.disclosure`).
Someone who holds the verb that answers the run (``answer``) but not its approver verb gets the
question the run waits on and nothing else (:mod:`durable_agents.shell.runs.reveal_question`).
Being a dry run, nothing is stored; the caller's response carries it, and an audit log of the
response holds ciphertext only. A reveal request that is not a dry run is refused, and a
``revealed`` annotation written by anyone is removed, so neither annotation is ever stored.

A run of the model planner seals what the model wrote and what its tools returned per turn
(label ``agent/turns/<index>/<field>``, :mod:`durable_agents.core.agent_facts`). For it the answer
also holds the proposal the approval request is for: the call's arguments, and the model's stated
reason, always as ``{"writtenBy": "model", "text": …}`` (the model's words, never authority); the
evidence it rests on (the checkpoint's references, IDs and content digests, with the turn whose read
produced each); and every turn's arguments, reason and result, the approval's turn and the
evidence's reads first, then the newest, up to :data:`TURNS_MAX_BYTES` (the answer is an
annotation, and the API server allows 256 KiB of them in all); a turn left out says so.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from pydantic import ValidationError

from durable_agents.api.v1alpha1 import (
    GROUP,
    VERSION,
    ActionRecordSpec,
    AgentPolicySpec,
    ApproverRule,
    Identity,
)
from durable_agents.api.v1alpha1.labels import REVEAL_ANNOTATION, REVEALED_ANNOTATION, RUN_LABEL
from durable_agents.core.agent_facts import (
    ANSWER_LABEL,
    TRUNCATED_KEY,
    VALUE_KEY,
    WRITTEN_BY_MODEL,
    TurnField,
    turn_label,
)
from durable_agents.core.digest import canonical_json
from durable_agents.core.disclosure import DisclosureError, seal_for_reader
from durable_agents.core.engine.loading import unverified_record
from durable_agents.core.outcome_stamps import believed_status
from durable_agents.core.sealed_values import (
    DATA_KEY_ANNOTATION,
    DataKey,
    ValueSealingError,
    is_sealed,
    open_data_key,
    outcome_label,
    spec_slots,
    step_label,
    unseal_value,
)
from durable_agents.core.sealing import Keyring, UndecryptableError
from durable_agents.shell.admission import authority as admission
from durable_agents.shell.ground.kube import Kube
from durable_agents.shell.ledger.actions import PLURAL as ACTION_RECORDS
from durable_agents.shell.ledger.unsealing import _arguments_label
from durable_agents.shell.ownership.leases import run_label
from durable_agents.shell.runs.reveal_question import ANSWER_VERB, SCOPE_ALL, NoQuestion, question_document

HOW: Final = "use `kubectl agentrun status NAME --reveal` (a server-side dry run)"
TURNS_MAX_BYTES: Final = 96 * 1024
"""The most of the model turns' revealed values (arguments, reason, result) one answer holds, in
bytes of canonical JSON; sealed for the reader and base64-encoded, a third more."""
OVER_BUDGET: Final = f"over the {TURNS_MAX_BYTES // 1024} KiB one reveal holds of turns' values"


class RevealRefused(Exception):
    """A reveal request the webhook refuses; the message says why, ``code`` is the HTTP status."""

    def __init__(self, message: str, code: int = 403) -> None:
        super().__init__(message)
        self.code = code


def _annotations(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    found = ((obj or {}).get("metadata") or {}).get("annotations")
    return found if isinstance(found, Mapping) else {}


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


@dataclass
class _Opener:
    """Unseals values of one run tree; a value that does not open is noted, never fatal."""

    data_key: DataKey | None
    unreadable: dict[str, str] = field(default_factory=dict)

    def open(self, value: Any, label: str) -> Any:
        if not is_sealed(value):
            return value
        if self.data_key is None:
            self.unreadable[label] = f"the run's data key ({DATA_KEY_ANNOTATION}) does not open"
            return None
        try:
            return unseal_value(self.data_key, value, label)
        except ValueSealingError as err:
            self.unreadable[label] = str(err)
            return None

    def first(self, value: Any, labels: Iterable[str]) -> Any:
        """``value`` opened under the first of ``labels`` it was sealed for (records name a step
        by index, and a compensation's step is not the one it compensates)."""
        if not is_sealed(value) or self.data_key is None:
            return self.open(value, next(iter(labels), "arguments"))
        for label in labels:
            try:
                return unseal_value(self.data_key, value, label)
            except ValueSealingError:
                continue
        self.unreadable["arguments"] = "an action's arguments are not sealed for any step of this run"
        return None


def _argument_labels(steps: list[Any], index: Any) -> list[str]:
    names = [str(s.get("name")) for s in steps if isinstance(s, Mapping) and s.get("name")]
    first = [names[index]] if isinstance(index, int) and 0 <= index < len(names) else []
    return [step_label(name, "arguments") for name in [*first, *names]]


def revealed_document(
    run: Mapping[str, Any], records: Sequence[Mapping[str, Any]], data_key: DataKey | None
) -> dict[str, Any]:
    """Everything sealed about ``run`` (and its ActionRecords ``records``), in plaintext."""
    opener = _Opener(data_key)
    spec = _dict(run.get("spec"))
    values = {label: opener.open(holder[key], label) for holder, key, label in spec_slots(_dict(spec))}
    status = _dict(run.get("status"))
    checkpoint = _dict(status.get("checkpoint"))
    document: dict[str, Any] = {"values": values}
    request = _dict(status.get("approvalRequest"))
    if request:
        document["approvalRequest"] = _approval_request(request, opener)
    pending = _dict(checkpoint.get("pendingInput"))
    if pending:
        request_id = str(pending.get("requestId") or "")  # a scripted ask's request ID is its step
        document["pendingInput"] = {
            "requestId": request_id,
            "question": opener.open(pending.get("question"), step_label(request_id or "-", "question")),
        }
    turns = _turns_of(checkpoint)
    if isinstance(checkpoint.get("agent"), Mapping):
        document["evidence"] = _evidence(checkpoint, turns)
        document["turns"] = _turns(turns, _first_turns(request, document["evidence"]), opener)
        answer = _dict(status.get("outcome")).get("result")
        if isinstance(answer, str) and is_sealed(answer):  # the model's final answer: its words
            document["answer"] = {"writtenBy": WRITTEN_BY_MODEL, "text": opener.open(answer, ANSWER_LABEL)}
    steps: list[Any] = spec["steps"] if isinstance(spec.get("steps"), list) else []
    document["actions"] = [_action(record, run, steps, opener) for record in records]
    if opener.unreadable:
        document["unreadable"] = opener.unreadable
    return document


def _approval_request(request: Mapping[str, Any], opener: _Opener) -> dict[str, Any]:
    """The request as approved: for a model's call, its arguments (sealed for its turn) and what
    the model said, marked as the model's."""
    step = str(request.get("step") or "")
    proposal = _dict(request.get("proposal"))
    turn = _index(proposal.get("turn"))
    label = step_label(step, "arguments") if step else None
    if proposal:
        label = turn_label(turn, "arguments") if turn is not None else None
    shown: dict[str, Any] = {
        "requestId": request.get("requestId"),
        "step": step,
        "effect": request.get("effect"),
        "arguments": opener.open(request.get("arguments"), label) if label else None,
    }
    if proposal:
        reason = opener.open(proposal.get("reason"), turn_label(turn, "reason")) if turn is not None else None
        shown["proposal"] = {
            "tool": proposal.get("tool"),
            "callId": proposal.get("callId"),
            "turn": turn,
            "reason": _model_words(reason),
        }
    if isinstance(request.get("evidence"), list):
        shown["evidence"] = [str(ref) for ref in request["evidence"]]
    return shown


def _index(value: Any) -> int | None:
    """``value`` if it is a turn's index (an int, not negative), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _model_words(plain: Any) -> dict[str, Any] | None:
    """What the model said, marked as written by the model (whatever the sealed form held)."""
    if plain is None:
        return None
    text = plain.get("text") if isinstance(plain, Mapping) else plain
    return {
        "writtenBy": WRITTEN_BY_MODEL,
        "text": text if isinstance(text, str) else canonical_json(text).decode(),
    }


def _turns_of(checkpoint: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    turns = _dict(checkpoint.get("agent")).get("turns")
    listed = turns if isinstance(turns, list) else []
    return [t for t in listed if isinstance(t, Mapping) and _index(t.get("index")) is not None]


def _evidence(checkpoint: Mapping[str, Any], turns: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The checkpoint's evidence references (in clear: IDs, versions, content digests), each with
    the turn whose read produced it (the last turn at its step), if a turn did."""
    refs = checkpoint.get("evidence")
    shown = []
    for ref in refs if isinstance(refs, list) else []:
        if not isinstance(ref, Mapping):
            continue
        by = [t["index"] for t in turns if t.get("stepIndex") == ref.get("stepIndex")]
        shown.append({**dict(ref), "turn": by[-1] if by else None})
    return shown


def _first_turns(request: Mapping[str, Any], evidence: Sequence[Mapping[str, Any]]) -> list[int]:
    """The turns an approver needs first: the proposal's, then the reads of its evidence."""
    turn = _index(_dict(request.get("proposal")).get("turn"))
    listed = request.get("evidence")
    wanted = {str(ref) for ref in listed} if isinstance(listed, list) else set()
    reads = [ref["turn"] for ref in evidence if ref.get("id") in wanted and ref.get("turn") is not None]
    return [turn, *reads] if turn is not None else reads


def _turns(turns: Sequence[Mapping[str, Any]], first: Sequence[int], opener: _Opener) -> list[dict[str, Any]]:
    """Each turn (clear fields) with its revealed values, ``first`` then the newest first, while
    they fit :data:`TURNS_MAX_BYTES`; a turn whose values do not fit says so instead."""
    by_index = {int(t["index"]): t for t in turns}
    order = [*first, *sorted(by_index, reverse=True)]
    budget, revealed = TURNS_MAX_BYTES, dict[int, dict[str, Any]]()
    for index in dict.fromkeys(i for i in order if i in by_index):
        values = _turn_values(by_index[index], opener)
        size = len(canonical_json(values))
        if size <= budget:
            budget -= size
            revealed[index] = values
    shown = []
    for index, turn in sorted(by_index.items()):
        clear = {
            key: turn.get(key)
            for key in ("index", "callId", "tool", "stepIndex", "outcome", "usage", "resultTruncated")
        }
        shown.append({**clear, **revealed.get(index, {"omitted": OVER_BUDGET})})
    return shown


def _turn_values(turn: Mapping[str, Any], opener: _Opener) -> dict[str, Any]:
    index = int(turn["index"])

    def opened(field: TurnField) -> Any:
        return opener.open(turn.get(field), turn_label(index, field))

    values = {"arguments": opened("arguments"), "reason": _model_words(opened("reason"))}
    result = opened("result")
    if isinstance(result, Mapping):  # {"value": …} or, cut, {"truncated": "<JSON text>"}
        result = result.get(VALUE_KEY, result.get(TRUNCATED_KEY))
    return {**values, "result": result}


def _action(
    record: Mapping[str, Any], run: Mapping[str, Any], steps: list[Any], opener: _Opener
) -> dict[str, Any]:
    name = str(_dict(record.get("metadata")).get("name") or "")
    spec, status = _dict(record.get("spec")), _dict(record.get("status"))
    labels = _argument_labels(steps, spec.get("stepIndex"))
    with contextlib.suppress(ValidationError):  # as the dispatcher opens it: a model's call, for its turn
        labels = list(dict.fromkeys([_arguments_label(ActionRecordSpec.model_validate(spec), run), *labels]))
    return {
        "name": name,
        "effect": spec.get("effect"),
        "state": status.get("state", "intent"),
        "arguments": opener.first(spec.get("arguments"), labels),
        "outcome": opener.open(status.get("outcome"), outcome_label(name)),
    }


async def run_records(kube: Kube, namespace: str, run_name: str) -> list[dict[str, Any]]:
    """The run's ActionRecords (by the run's label, and naming the run in ``spec.runRef``)."""
    listed = await kube.call(
        kube.custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        ACTION_RECORDS,
        label_selector=f"{RUN_LABEL}={run_label(run_name)}",
    )
    items = [dict(i) for i in listed.get("items") or []]
    mine = [i for i in items if _dict(_dict(i.get("spec")).get("runRef")).get("name") == run_name]
    return sorted(mine, key=lambda i: str(_dict(i.get("metadata")).get("creationTimestamp") or ""))


def _data_key(keyring: Keyring, run: Mapping[str, Any], namespace: str, name: str) -> DataKey | None:
    annotation = _annotations(run).get(DATA_KEY_ANNOTATION)
    if annotation is None:
        return None  # a run from before sealing: its values are plaintext
    try:
        return open_data_key(keyring, str(annotation), namespace, name)
    except UndecryptableError:
        return None


async def revealed_patch(
    kube: Kube,
    old_run: Mapping[str, Any],
    user: Identity,
    policy: AgentPolicySpec | None,
    keyring: Keyring,
    public_key_b64: str,
    dry_run: bool,
) -> dict[str, str | None]:
    """The annotation changes that answer a reveal request on ``old_run`` (None: remove)."""
    meta = _dict(old_run.get("metadata"))
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    if not dry_run:
        raise RevealRefused(f"annotation {REVEAL_ANNOTATION} is a request, never stored: {HOW}", code=400)
    rule = policy.approvers if policy is not None else ApproverRule()
    refusal = await admission.refused_verb(kube, user, rule.verb, rule.resource, namespace, name)
    if refusal is not None:  # who may answer the run sees the question it waits on, nothing else
        not_answerer = await admission.refused_verb(kube, user, ANSWER_VERB, "agentruns", namespace, name)
        if not_answerer is not None:
            raise RevealRefused(
                f"{refusal}: only who may approve a run sees its sealed values (and who may "
                f"{ANSWER_VERB} it, verb {ANSWER_VERB!r}, the question it waits on)"
            )
    unverified = unverified_record(old_run, keyring)
    if unverified is not None:  # never show an approver what the operator did not write
        raise RevealRefused(f"run {namespace}/{name} does not verify, nothing revealed: {unverified}")
    data_key = _data_key(keyring, old_run, namespace, name)
    if refusal is not None:
        try:
            document = question_document(old_run, data_key, rule)
        except NoQuestion as err:
            raise RevealRefused(str(err), code=409) from err
    else:
        now = datetime.now(UTC)  # each action as the operator wrote it: a forged outcome is not shown
        records = [
            {**r, "status": believed_status(r, keyring, now).wire()}
            for r in await run_records(kube, namespace, name)
        ]
        document = {**revealed_document(old_run, records, data_key), "scope": SCOPE_ALL}
    document["run"] = f"{namespace}/{name}"
    try:
        sealed = seal_for_reader(public_key_b64, document, f"{namespace}/{name}", entropy=os.urandom)
    except DisclosureError as err:
        raise RevealRefused(f"annotation {REVEAL_ANNOTATION}: {err}", code=400) from err
    return {REVEAL_ANNOTATION: None, REVEALED_ANNOTATION: sealed}


async def reveal_changes(
    kube: Kube,
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Identity,
    policy: AgentPolicySpec | None,
    keyring: Keyring,
    dry_run: bool,
) -> dict[str, str | None]:
    """What the mutating webhook changes for reveal on any AgentRun write (usually nothing)."""
    requested = _annotations(new).get(REVEAL_ANNOTATION)
    if requested is None:
        # Never stored: a revealed annotation written by hand is removed.
        return {REVEALED_ANNOTATION: None} if REVEALED_ANNOTATION in _annotations(new) else {}
    if old is None:
        raise RevealRefused(f"annotation {REVEAL_ANNOTATION} reveals an existing run: {HOW}", code=400)
    return await revealed_patch(kube, old, user, policy, keyring, str(requested), dry_run)
