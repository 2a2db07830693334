"""Notifications: what a run's policy has the operator tell people, derived from the run as observed.

A run that waits for an approval or an answer, that ended, or that is stuck is *due* a notice to
each of its policy's ``spec.notifications`` targets that asked for that event. Pure: from the run's
wire form (what the AgentRun watch delivers) and the time, the notices, their IDs and bodies, the
keys that record a delivery, and the backoff between attempts. The shell
(:mod:`durable_agents.shell.observability.notifications`) delivers them off the commit path.

Event IDs are deterministic from what happened, so a re-delivery (a retry, an operator that crashed
before it recorded the delivery) carries the same ID and the receiver deduplicates by it:

* ``approvalRequested``: ``<run UID>.approval.<request ID>`` (a new request has a new ID);
* ``inputRequested``: ``<run UID>.input.<key answered under>``;
* ``runEnded``: ``<run UID>.ended.<terminal state>``;
* ``runStuck``: ``<run UID>.stuck.<reason>.<the condition's transition time>`` (stuck again later:
  a new ID).

A notice never carries a sealed value: the run, its namespace, the request ID, the digest, the
action's kind and name (an effect or a model's tool), its tier, the expiry and the command to
decide. Never the arguments, the question, the model's words or the run's result.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from durable_agents.api.v1alpha1 import NotificationEvent, NotificationTarget
from durable_agents.api.v1alpha1.states import TERMINAL_STATES, RunState
from durable_agents.core.entropy import Entropy, draw
from durable_agents.core.inbox import answer_command, decide_command
from durable_agents.core.sealing import Keyring
from durable_agents.core.stamps import Purpose, stamp, verify

NOTIFIED_ANNOTATION: Final = "durable-agents.io/notified"
"""On a run: the keys of the deliveries done (delivered, refused or given up) of its due notices,
then ``;`` and the operator's stamp over them and the run's UID."""
STAMP_SEPARATOR: Final = ";"
KEY_LENGTH: Final = 16  # hex characters of a delivery key (64 bits: no collision among a run's few)
SOURCE_PREFIX: Final = "/apis/durable-agents.io/v1alpha1/namespaces"
EVENT_TYPES: Final[Mapping[NotificationEvent, str]] = {
    NotificationEvent.APPROVAL_REQUESTED: "io.durable-agents.approval.requested",
    NotificationEvent.INPUT_REQUESTED: "io.durable-agents.input.requested",
    NotificationEvent.RUN_ENDED: "io.durable-agents.run.ended",
    NotificationEvent.RUN_STUCK: "io.durable-agents.run.stuck",
}
ENDED_STATES: Final = frozenset(state.value for state in TERMINAL_STATES)
ENDED_WINDOW: Final = timedelta(hours=24)
"""A run that ended longer ago than this is due no runEnded notice (a target added to a policy
later is not flooded with every run still kept)."""


@dataclass(frozen=True)
class Notice:
    """One thing that happened to a run that people may be told about."""

    id: str
    event: NotificationEvent
    namespace: str
    run: str
    time: datetime
    data: Mapping[str, Any]

    @property
    def type(self) -> str:
        return EVENT_TYPES[self.event]

    @property
    def source(self) -> str:
        return f"{SOURCE_PREFIX}/{self.namespace}/agentruns/{self.run}"

    def attributes(self) -> dict[str, Any]:
        """The CloudEvent's context attributes (the shell's SDK event is made from these)."""
        return {
            "id": self.id,
            "type": self.type,
            "source": self.source,
            "subject": f"{self.namespace}/{self.run}",
            "time": self.time,
            "datacontenttype": "application/json",
        }


@dataclass(frozen=True)
class Delivery:
    """One notice to one target, and the key its delivery is recorded under."""

    target: NotificationTarget
    notice: Notice
    key: str = field(default="")

    @property
    def endpoint(self) -> str:
        return f"{self.target.name} ({self.target.url})"


def _time(raw: object) -> datetime | None:
    if not isinstance(raw, str):
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


def _state(status: Mapping[str, Any]) -> RunState | None:
    try:
        return RunState(str(status.get("state") or "pending"))
    except ValueError:
        return None


def decide_commands(
    namespace: str, run: str, request_id: str, digest: str, allowed: Sequence[str]
) -> dict[str, str]:
    """The exact commands that decide this request, pinned to what was reviewed (its ID, digest)."""
    request = {"requestId": request_id, "digest": digest}
    return {
        decision: decide_command(run, namespace, request, decision)
        for decision in ("approve", "reject")
        if decision in allowed
    }


def _approval(namespace: str, run: str, uid: str, status: Mapping[str, Any], now: datetime) -> Notice | None:
    request = status.get("approvalRequest")
    if not isinstance(request, Mapping):
        return None
    request_id, digest = str(request.get("requestId") or ""), str(request.get("digest") or "")
    expires = _time(request.get("expiresAt"))
    if not request_id or not digest or (expires is not None and expires <= now):
        return None  # nothing to decide any more: it expired
    proposal = request.get("proposal")
    tool = proposal.get("tool") if isinstance(proposal, Mapping) else None
    allowed = [str(d) for d in request.get("allowedDecisions") or ("approve", "reject")]
    data = {
        "run": run,
        "namespace": namespace,
        "requestId": request_id,
        "digest": digest,
        "step": request.get("step"),
        "action": {"kind": "tool", "name": tool}
        if tool
        else {"kind": "effect", "name": request.get("effect")},
        "tier": request.get("tier"),
        "expiresAt": request.get("expiresAt"),
        "commands": decide_commands(namespace, run, request_id, digest, allowed),
    }
    return Notice(
        f"{uid}.approval.{request_id}",
        NotificationEvent.APPROVAL_REQUESTED,
        namespace,
        run,
        _time(status.get("stateSince")) or now,
        data,
    )


def _input(namespace: str, run: str, uid: str, status: Mapping[str, Any], now: datetime) -> Notice | None:
    checkpoint = status.get("checkpoint")
    pending = checkpoint.get("pendingInput") if isinstance(checkpoint, Mapping) else None
    if not isinstance(pending, Mapping):
        return None
    request_id = str(pending.get("requestId") or "")
    key = str(pending.get("key") or request_id)
    expires = _time(pending.get("expiresAt"))
    if not key or (expires is not None and expires <= now):
        return None
    data = {
        "run": run,
        "namespace": namespace,
        "requestId": request_id,
        "key": key,
        "expiresAt": pending.get("expiresAt"),
        "commands": {
            "read": f"kubectl agentrun status {run} -n {namespace} --reveal",
            "answer": answer_command(run, namespace, key),
        },
    }
    time = _time(status.get("stateSince")) or now
    return Notice(f"{uid}.input.{key}", NotificationEvent.INPUT_REQUESTED, namespace, run, time, data)


def _ended(
    namespace: str, run: str, uid: str, status: Mapping[str, Any], state: RunState, now: datetime
) -> Notice | None:
    since = _time(status.get("stateSince"))
    if since is None or now - since > ENDED_WINDOW:
        return None
    outcome = status.get("outcome")
    reason = outcome.get("reason") if isinstance(outcome, Mapping) else None  # the word, never the result
    data = {
        "run": run,
        "namespace": namespace,
        "state": state.value,
        "reason": reason,
        "commands": {"history": f"kubectl agentrun history {run} -n {namespace}"},
    }
    return Notice(f"{uid}.ended.{state.value}", NotificationEvent.RUN_ENDED, namespace, run, since, data)


def _stuck(namespace: str, run: str, uid: str, status: Mapping[str, Any]) -> Notice | None:
    for condition in status.get("conditions") or []:
        if not isinstance(condition, Mapping) or condition.get("type") != "Stuck":
            continue
        since = _time(condition.get("lastTransitionTime"))
        if condition.get("status") != "True" or since is None:
            return None
        reason = str(condition.get("reason") or "")
        data = {
            "run": run,
            "namespace": namespace,
            "reason": reason,
            "message": str(condition.get("message") or "")[:1024],  # the check's words: no run data
            "commands": {"why": f"kubectl agentrun why {run} -n {namespace}"},
        }
        stamp = since.strftime("%Y%m%dT%H%M%SZ")
        return Notice(
            f"{uid}.stuck.{reason}.{stamp}", NotificationEvent.RUN_STUCK, namespace, run, since, data
        )
    return None


def notices_for(body: Mapping[str, Any], now: datetime) -> list[Notice]:
    """What the run (wire form) is due now: its open request or question, its end, its being stuck."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    namespace, run, uid = (
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
        str(meta.get("uid") or ""),
    )
    state = _state(status)
    if not (namespace and run and uid) or state is None:
        return []
    found: list[Notice | None] = [_stuck(namespace, run, uid, status)]
    if state is RunState.WAITING_APPROVAL:
        found.append(_approval(namespace, run, uid, status, now))
    elif state is RunState.WAITING_INPUT:
        found.append(_input(namespace, run, uid, status, now))
    elif state in TERMINAL_STATES:
        found.append(_ended(namespace, run, uid, status, state, now))
    return [notice for notice in found if notice is not None]


def delivery_key(target: NotificationTarget, notice_id: str) -> str:
    """The key a delivery is recorded under: the target (name, URL, format) and the event ID."""
    raw = "\n".join((target.name, target.url, target.format.value, notice_id))
    return hashlib.sha256(raw.encode()).hexdigest()[:KEY_LENGTH]


def deliveries(notices: Iterable[Notice], targets: Sequence[NotificationTarget]) -> list[Delivery]:
    """Each notice to each target that asked for its event."""
    return [
        Delivery(target, notice, delivery_key(target, notice.id))
        for notice in notices
        for target in targets
        if notice.event in target.events
    ]


def _payload(run_uid: str, keys: Iterable[str]) -> dict[str, Any]:
    return {"run": run_uid, "keys": sorted(keys)}


def recorded(annotations: Mapping[str, Any] | None, keyring: Keyring | None, run_uid: str) -> frozenset[str]:
    """The delivery keys a run's annotation records as done, if the operator's stamp over them (and
    the run's UID) verifies; else none: a record written by someone else (to silence the
    notifications of a run) or copied from another run is ignored, and what is due is sent again
    (with the same event IDs: receivers deduplicate)."""
    raw = (annotations or {}).get(NOTIFIED_ANNOTATION)
    if not isinstance(raw, str):
        return frozenset()
    listed, _, tag = raw.rpartition(STAMP_SEPARATOR)
    keys = frozenset(listed.split())
    return keys if verify(keyring, Purpose.NOTIFIED, _payload(run_uid, keys), tag) else frozenset()


def record(due: Iterable[Delivery], done: Iterable[str], keyring: Keyring, run_uid: str) -> str:
    """The annotation's new value: the done keys of what is due now (what is no longer due is
    never derived again, so it is dropped: the value stays a few keys long), stamped."""
    keys = {d.key for d in due} & set(done)
    tag = stamp(keyring, Purpose.NOTIFIED, _payload(run_uid, keys))
    return f"{' '.join(sorted(keys))}{STAMP_SEPARATOR}{tag}"


def backoff(attempt: int, entropy: Entropy, base: float, cap: float) -> float:
    """Seconds before attempt ``attempt + 1`` (``attempt`` >= 1 failed): exponential, capped, with
    equal jitter (half fixed, half random) so that receivers recovering together are not hit at once."""
    ceiling = min(cap, base * 2.0 ** min(max(attempt - 1, 0), 32))
    fraction = int.from_bytes(draw(entropy, 8), "big") / 2**64
    return ceiling / 2 + fraction * ceiling / 2


# --- bodies -------------------------------------------------------------------------------------

_HEADLINES: Final[Mapping[NotificationEvent, str]] = {
    NotificationEvent.APPROVAL_REQUESTED: "waits for an approval",
    NotificationEvent.INPUT_REQUESTED: "waits for an answer",
    NotificationEvent.RUN_ENDED: "ended",
    NotificationEvent.RUN_STUCK: "is stuck",
}


def _details(notice: Notice) -> list[str]:
    data = notice.data
    if notice.event is NotificationEvent.APPROVAL_REQUESTED:
        action = data.get("action") or {}
        return [
            f"{action.get('kind')} `{action.get('name')}` ({data.get('tier')})",
            f"request `{data.get('requestId')}`",
            f"digest `{data.get('digest')}`, expires {data.get('expiresAt')}",
        ]
    if notice.event is NotificationEvent.INPUT_REQUESTED:
        return [f"question `{data.get('key')}`, expires {data.get('expiresAt')}"]
    if notice.event is NotificationEvent.RUN_ENDED:
        return [f"state `{data.get('state')}`" + (f" ({data['reason']})" if data.get("reason") else "")]
    return [f"{data.get('reason')}: {data.get('message')}"]


def slack_body(notice: Notice) -> dict[str, Any]:
    """A Slack-compatible incoming-webhook body: ``text`` (the fallback) and one section block."""
    headline = f"AgentRun {notice.namespace}/{notice.run} {_HEADLINES[notice.event]}"
    commands = [f"`{command}`" for command in (notice.data.get("commands") or {}).values()]
    text = "\n".join([f"*{headline}*", *_details(notice), *commands, f"event `{notice.id}`"])
    return {"text": text, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}]}
