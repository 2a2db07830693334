"""A person reconciles an action whose outcome is unknown: what the webhook stamps and refuses,
which answer the dispatcher may act on (the second line), and what ``kubectl agentrun reconcile``
sends. SubjectAccessReviews against a real API server: e2e/test_reconcile.py."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import ActionRecordSpec, ActionRecordStatus, AgentRunSpec, Identity
from durable_agents.core.authority import NO_KEYRING, STAMP_INVALID, UNSTAMPED
from durable_agents.core.key_use import keys_in_use
from durable_agents.core.outcome_stamps import stamp_outcome
from durable_agents.core.reconciliations import (
    is_key_of,
    key_for,
    person_answer,
    reconciliation_to_refuse,
    reconciliation_unproven,
    record_of,
    record_refusal,
)
from durable_agents.core.request_stamps import rewritten, stamps
from durable_agents.core.sealing import Keyring
from durable_agents.kubectl import main as kubectl_plugin
from durable_agents.kubectl import reconcile as kubectl_reconcile
from durable_agents.shell.admission import reconciliations as reconcile_admission
from durable_agents.shell.admission.authority import check_create, check_update
from durable_agents.shell.effects import Applied, NotApplied, Unknown
from durable_agents.shell.ground.store import Gone
from durable_agents.shell.ledger.reconciling import PersonAnswers, system_said

pytestmark = pytest.mark.unit

KEYS = Keyring(keys={"k1": bytes(range(32))}, active_key_id="k1")
OTHER_KEYS = Keyring(keys={"k9": bytes(range(1, 33))}, active_key_id="k9")
ALICE = Identity(username="alice", groups=["approvers", "system:authenticated"])
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
ACT = "act-" + "a" * 40
FORGED_STAMP = "k1:" + "A" * 43 + "="


def run(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "pay", "namespace": "team-a", "uid": "uid-1"},
        "spec": {"taskType": "t", "objective": "o", **spec},
        "status": {"runId": "run-id-1"},
    }


def record(state: str = "outcome_unknown", attempts: int = 1, owner: str = "pay") -> dict[str, Any]:
    return {
        "metadata": {"name": ACT, "namespace": "team-a", "uid": "rec-uid"},
        "spec": {
            "idempotencyKey": "run-id-1/0/pay",
            "runRef": {"name": owner, "uid": "uid-1"},
            "stepIndex": 0,
            "effect": "http.post",
            "tier": "consequential",
        },
        "status": {"state": state, "attempts": attempts},
    }


def asked(
    key: str = ACT, applied: bool = True, attempt: int = 1, **extra: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run whose spec carries one new reconciliation (as a client writes it), and the run before."""
    old = run()
    new = copy.deepcopy(old)
    new["spec"]["reconciliations"] = {key: {"applied": applied, "attempt": attempt, **extra}}
    return new, old


def stamped(new: dict[str, Any], old: dict[str, Any], user: Identity = ALICE) -> dict[str, Any]:
    """``new`` as the API server stores it after the mutating webhook."""
    out = copy.deepcopy(new)
    for field, value in stamps("UPDATE", new, old, user, NOW, KEYS).items():
        if isinstance(value, dict) and isinstance(out["spec"].get(field), dict):
            out["spec"][field] = {**out["spec"][field], **value}
        else:
            out["spec"][field] = value
    return out


# --- the webhook: stamps and append-only --------------------------------------------------------


def test_a_new_reconciliation_is_stamped_as_the_user_whatever_the_client_claims() -> None:
    new, old = asked(reconciler={"username": "mallory", "uid": "forged"}, stamp=FORGED_STAMP, reason="seen")
    entry = AgentRunSpec.model_validate(stamped(new, old)["spec"]).reconciliations[ACT]
    assert entry.reconciler == ALICE
    assert entry.reconciled_at == NOW
    assert entry.stamp != FORGED_STAMP
    assert reconciliation_unproven(KEYS, "run-id-1", ACT, entry) is None, "bound to status.runId"
    assert reconciliation_unproven(KEYS, "uid-1", ACT, entry) is not None
    assert reconciliation_unproven(KEYS, "run-id-1", f"{ACT}.1", entry) is not None, "bound to the key"


def test_an_old_reconciliation_is_left_alone_and_what_the_schema_refuses_is_not_stamped() -> None:
    new, old = asked()
    before = stamped(new, old)
    again = copy.deepcopy(before)
    assert stamps("UPDATE", again, before, Identity(username="bob"), NOW, KEYS) == {}
    bad = copy.deepcopy(old)
    bad["spec"]["reconciliations"] = {ACT: {"applied": "perhaps"}, f"{ACT}.2": "yes"}
    assert stamps("UPDATE", bad, old, ALICE, NOW, KEYS) == {}


def test_reconciliations_are_append_only() -> None:
    new, old = asked()
    given = stamped(new, old)
    changed = copy.deepcopy(given)
    changed["spec"]["reconciliations"][ACT]["applied"] = False
    assert "cannot be changed once given" in (rewritten(changed, given) or "")
    withdrawn = copy.deepcopy(given)
    withdrawn["spec"]["reconciliations"] = {}
    assert "cannot be withdrawn" in (rewritten(withdrawn, given) or "")
    added = copy.deepcopy(given)
    added["spec"]["reconciliations"][f"{ACT}.2"] = {"applied": True, "attempt": 2}
    assert rewritten(added, given) is None


async def test_a_new_run_cannot_carry_a_reconciliation() -> None:
    new = run(reconciliations={ACT: {"applied": True, "attempt": 1}})
    assert "spec.reconciliations" in (await check_create(None, new, ALICE, KEYS) or "")  # type: ignore[arg-type]


class Verbs:
    """A stand-in for the SubjectAccessReview: who holds which verb."""

    def __init__(self, allowed: set[tuple[str, str]]) -> None:
        self.allowed = allowed
        self.asked: list[tuple[str, str, str]] = []

    async def __call__(
        self, kube: Any, user: Identity, verb: str, resource: str, namespace: str, name: str
    ) -> str | None:
        self.asked.append((user.username, verb, resource))
        if (user.username, verb) in self.allowed:
            return None
        return f"user {user.username!r} ... (missing RBAC permission verb {verb!r} on resource {resource!r})"


@pytest.fixture
def records(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """The ActionRecords the webhook reads (by name)."""
    stored: dict[str, dict[str, Any]] = {}

    class Store:
        def __init__(self, kube: Any, keyring: Any = None) -> None:
            pass

        async def get(self, namespace: str, name: str) -> dict[str, Any]:
            if name not in stored:
                raise Gone(name)
            return stored[name]

    monkeypatch.setattr(reconcile_admission, "ActionStore", Store)
    return stored


async def checked(new: dict[str, Any], old: dict[str, Any], user: Identity, verbs: Verbs) -> str | None:
    return await reconcile_admission.check_reconciliations(None, new, old, user, None, KEYS, verbs)  # type: ignore[arg-type]


async def test_only_a_holder_of_the_policy_verb_may_reconcile(records: dict[str, dict[str, Any]]) -> None:
    records[ACT] = record()
    verbs = Verbs({("alice", "approve")})
    new, old = asked()
    bob = Identity(username="bob")
    refused = await checked(stamped(new, old, bob), old, bob, verbs)
    assert "missing RBAC permission verb 'approve' on resource 'agentruns'" in (refused or "")
    assert await checked(stamped(new, old), old, ALICE, verbs) is None
    assert verbs.asked == [("bob", "approve", "agentruns"), ("alice", "approve", "agentruns")]


async def test_an_entry_not_stamped_for_the_user_is_refused(records: dict[str, dict[str, Any]]) -> None:
    records[ACT] = record()
    verbs = Verbs({("alice", "approve")})
    new, old = asked()
    as_bob = stamped(new, old, Identity(username="bob"))
    assert "must be the requesting user's" in (await checked(as_bob, old, ALICE, verbs) or "")
    unstamped = copy.deepcopy(new)
    unstamped["spec"]["reconciliations"][ACT]["reconciler"] = ALICE.wire()
    unstamped["spec"]["reconciliations"][ACT]["reconciledAt"] = "2030-01-01T12:00:00.000000Z"
    assert "is not stamped" in (await checked(unstamped, old, ALICE, verbs) or "")


@pytest.mark.parametrize(
    ("stored", "key", "attempt", "expected"),
    [
        (None, ACT, 1, f"there is no ActionRecord {ACT!r}"),
        (record(owner="other"), ACT, 1, "is an action of run 'other', not of 'pay'"),
        (record(state="succeeded"), ACT, 1, "is 'succeeded': only an action whose outcome is unknown"),
        (record(attempts=2), ACT, 1, "answers for attempt 1, but ActionRecord"),
        (record(), f"{ACT}.7", 1, "the key must be the ActionRecord's name"),
    ],
)
async def test_an_entry_for_a_record_it_cannot_reconcile_is_refused(
    records: dict[str, dict[str, Any]], stored: dict[str, Any] | None, key: str, attempt: int, expected: str
) -> None:
    if stored is not None:
        records[ACT] = stored
    new, old = asked(key=key, attempt=attempt)
    refused = await checked(stamped(new, old), old, ALICE, Verbs({("alice", "approve")}))
    assert expected in (refused or ""), refused


async def test_a_settled_state_the_operator_did_not_write_counts_as_unknown(
    records: dict[str, dict[str, Any]],
) -> None:
    """A record created by the operator (``statusStamped``) forged ``succeeded`` without its outcome
    stamp: believed ``outcome_unknown``, so a person's answer is accepted (and a stamped one refused)."""
    forged = record(state="succeeded")
    forged["spec"]["statusStamped"] = True
    records[ACT] = forged
    new, old = asked()
    assert await checked(stamped(new, old), old, ALICE, Verbs({("alice", "approve")})) is None
    genuine = copy.deepcopy(forged)
    genuine["status"]["stamp"] = stamp_outcome(
        KEYS, ACT, "run-id-1/0/pay", ActionRecordStatus.model_validate(genuine["status"])
    )
    records[ACT] = genuine
    refused = await checked(stamped(new, old), old, ALICE, Verbs({("alice", "approve")}))
    assert "is 'succeeded': only an action whose outcome is unknown" in (refused or "")


async def test_an_attempt_is_reconciled_once(records: dict[str, dict[str, Any]]) -> None:
    records[ACT] = record(attempts=2)
    verbs = Verbs({("alice", "approve")})
    first, old = asked(attempt=1)
    given = stamped(first, old)  # attempt 1, answered before the record was sent again
    later = copy.deepcopy(given)
    later["spec"]["reconciliations"][f"{ACT}.2"] = {"applied": False, "attempt": 2}
    assert await checked(stamped(later, given), given, ALICE, verbs) is None, "a new attempt, a new key"

    answered, old = asked(attempt=2)
    given = stamped(answered, old)
    again = copy.deepcopy(given)
    again["spec"]["reconciliations"][f"{ACT}.2"] = {"applied": True, "attempt": 2}
    refused = await checked(stamped(again, given), given, ALICE, verbs)
    assert f"attempt 2 of ActionRecord {ACT!r} was already reconciled by 'alice'" in (refused or "")
    twice = copy.deepcopy(old)
    twice["spec"]["reconciliations"] = {k: {"applied": True, "attempt": 2} for k in (ACT, f"{ACT}.2")}
    assert "already reconciled" in (await checked(stamped(twice, old), old, ALICE, verbs) or "")


async def test_check_update_runs_the_reconciliation_rules(
    records: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    records[ACT] = record(state="failed")
    from durable_agents.shell.admission import authority as admission

    monkeypatch.setattr(admission, "refused_verb", Verbs({("alice", "approve")}))
    new, old = asked()
    refused = await check_update(None, stamped(new, old), old, ALICE, None, KEYS, NOW)  # type: ignore[arg-type]
    assert "only an action whose outcome is unknown" in (refused or "")


def test_keys_and_records() -> None:
    assert record_of(ACT) == ACT
    assert record_of(f"{ACT}.3") == ACT
    assert key_for(ACT, 1, {}) == ACT
    assert key_for(ACT, 3, {ACT: {}}) == f"{ACT}.3"
    assert key_for(ACT, 1, {ACT: {}, f"{ACT}.1": {}}) == f"{ACT}.1.2"
    assert key_for(ACT, 1, {ACT: {}, f"{ACT}.1": {}, f"{ACT}.1.2": {}}) == f"{ACT}.1.3"
    assert record_of(f"{ACT}.1.2") == ACT
    for key in (ACT, f"{ACT}.1", f"{ACT}.1.2", f"{ACT}.1.31"):
        assert is_key_of(key, ACT, 1), key
    for key in (
        f"{ACT}.2",
        f"{ACT}.1.1",
        f"{ACT}.1.0",
        f"{ACT}.1.02",
        f"{ACT}.1.x",
        f"{ACT}.1.",
        f"{ACT}.2.2",
    ):
        assert not is_key_of(key, ACT, 1), key
    entry = AgentRunSpec.model_validate(stamped(*asked())["spec"]).reconciliations[ACT]
    claimed = {"applied": True, "attempt": 1, "reconciler": {"username": "carol"}}
    # Whether an entry answered for the attempt is its stamp's to say, never its fields'.
    assert record_refusal(f"{ACT}.1", entry, record(), "pay", {ACT: claimed}, lambda _k, _v: False) is None
    refused = record_refusal(f"{ACT}.1", entry, record(), "pay", {ACT: claimed}, lambda _k, _v: True)
    assert "already reconciled by 'carol'" in (refused or "")


async def test_an_entry_written_with_the_webhook_off_blocks_nobody(
    records: dict[str, dict[str, Any]],
) -> None:
    """Issue 30, item 2: with the webhook off, someone with ``patch`` writes an answer (or two, to
    take both keys); once the webhook is back, a person with the verb answers for that attempt."""
    records[ACT] = record()
    verbs = Verbs({("alice", "approve")})
    claimed = {"applied": False, "attempt": 1, "reconciler": {"username": "mallory"}}
    forged = {**claimed, "reconciledAt": "2030-01-01T12:00:00.000000Z", "stamp": FORGED_STAMP}
    old = run(reconciliations={ACT: claimed, f"{ACT}.1": forged})
    key = key_for(ACT, 1, old["spec"]["reconciliations"])
    assert key == f"{ACT}.1.2"
    new = copy.deepcopy(old)
    new["spec"]["reconciliations"][key] = {"applied": True, "attempt": 1, "reason": "in the ledger"}
    given = stamped(new, old)
    assert await checked(given, old, ALICE, verbs) is None
    # The dispatcher acts on the stamped one, and says why not on the others.
    found, ignored = person_answer(given, ACT, 1, KEYS)
    assert found is not None
    assert (found.key, found.applied, found.by) == (key, True, "alice")
    assert sorted((i.key, i.problem.reason) for i in ignored) == [
        (ACT, UNSTAMPED),
        (f"{ACT}.1", STAMP_INVALID),
    ]
    # A stamped answer does block a second one for the same attempt.
    again = copy.deepcopy(given)
    again["spec"]["reconciliations"][f"{ACT}.1.3"] = {"applied": False, "attempt": 1}
    refused = await checked(stamped(again, given), given, ALICE, verbs)
    assert f"attempt 1 of ActionRecord {ACT!r} was already reconciled by 'alice'" in (refused or "")


def test_the_worker_refuses_each_unverified_entry_once() -> None:
    forged = {"applied": True, "attempt": 1, "reconciler": {"username": "mallory"}}
    body = stored_run((f"{ACT}.1", {"applied": True, "attempt": 1}))
    body["spec"]["reconciliations"][ACT] = forged
    entries = AgentRunSpec.model_validate(body["spec"]).reconciliations
    first = reconciliation_to_refuse("run-id-1", entries, lambda _key: False, KEYS)
    assert first is not None
    assert first[0] == ACT
    assert first[1].reason == UNSTAMPED
    assert reconciliation_to_refuse("run-id-1", entries, lambda key: key == ACT, KEYS) is None, (
        "the stamped one is never refused"
    )
    copied = reconciliation_to_refuse("another-run", entries, lambda key: key == ACT, KEYS)
    assert copied is not None
    assert copied[0] == f"{ACT}.1"
    assert copied[1].reason == STAMP_INVALID


# --- the operator: which answer it acts on (the second line) ------------------------------------


def stored_run(*entries: tuple[str, dict[str, Any]], user: Identity = ALICE) -> dict[str, Any]:
    """A run with these reconciliations, each stamped as the webhook stamps it."""
    body = run()
    for key, entry in entries:
        new = copy.deepcopy(body)
        new["spec"].setdefault("reconciliations", {})[key] = entry
        body = stamped(new, body, user)
    return body


def test_a_stamped_answer_for_the_attempt_now_is_acted_on() -> None:
    body = stored_run((ACT, {"applied": True, "attempt": 1, "reason": "in the ledger"}))
    found, ignored = person_answer(body, ACT, 1, KEYS)
    assert found is not None
    assert ignored == []
    assert (found.applied, found.by, found.reason, found.key) == (True, "alice", "in the ledger", ACT)
    assert "reconciled as applied by 'alice'" in found.said()


def test_an_answer_for_another_attempt_or_record_is_not_looked_at() -> None:
    body = stored_run((ACT, {"applied": False, "attempt": 1}))
    assert person_answer(body, ACT, 2, KEYS) == (None, []), "used once: the resend made attempt 2"
    assert person_answer(body, "act-" + "b" * 40, 1, KEYS) == (None, [])
    later = stored_run((ACT, {"applied": False, "attempt": 1}), (f"{ACT}.2", {"applied": True, "attempt": 2}))
    found, _ = person_answer(later, ACT, 2, KEYS)
    assert found is not None
    assert (found.key, found.applied) == (f"{ACT}.2", True)


def test_an_unstamped_forged_tampered_or_copied_answer_is_never_acted_on() -> None:
    unstamped = run(
        reconciliations={ACT: {"applied": True, "attempt": 1, "reconciler": {"username": "alice"}}}
    )
    found, ignored = person_answer(unstamped, ACT, 1, KEYS)
    assert found is None
    assert [i.problem.reason for i in ignored] == [UNSTAMPED]

    forged = copy.deepcopy(unstamped)
    forged["spec"]["reconciliations"][ACT] |= {"reconciledAt": "2030-01-01T12:00:00Z", "stamp": FORGED_STAMP}
    found, ignored = person_answer(forged, ACT, 1, KEYS)
    assert found is None
    assert [i.problem.reason for i in ignored] == [STAMP_INVALID]

    tampered = stored_run((ACT, {"applied": False, "attempt": 1}))
    tampered["spec"]["reconciliations"][ACT]["applied"] = True
    found, ignored = person_answer(tampered, ACT, 1, KEYS)
    assert found is None
    assert [i.problem.reason for i in ignored] == [STAMP_INVALID]

    copied = stored_run((ACT, {"applied": True, "attempt": 1}))
    copied["status"]["runId"] = "another-run"
    assert person_answer(copied, ACT, 1, KEYS)[0] is None

    assert person_answer(stored_run((ACT, {"applied": True, "attempt": 1})), ACT, 1, OTHER_KEYS)[0] is None
    found, ignored = person_answer(stored_run((ACT, {"applied": True, "attempt": 1})), ACT, 1, None)
    assert found is None
    assert [i.problem.reason for i in ignored] == [NO_KEYRING]


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str, bool]] = []

    async def record(self, obj: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        self.posted.append((obj["metadata"]["name"], reason, message, warning))


def unknown(attempts: int = 1) -> ActionRecordStatus:
    return ActionRecordStatus.model_validate({"state": "outcome_unknown", "attempts": attempts})


async def test_the_dispatcher_hears_a_verified_answer_as_a_query_answer() -> None:
    events = Events()
    people = PersonAnswers(events, KEYS)  # type: ignore[arg-type]
    applied = await people.said(record(), unknown(), stored_run((ACT, {"applied": True, "attempt": 1})))
    assert applied is not None
    assert isinstance(applied.result, Applied)
    assert applied.result.outcome == {"reconciledBy": "alice", "reason": ""}
    assert applied.reason == "ReconciledApplied"
    assert "by 'alice'" in (applied.message or "")
    not_applied = await people.said(record(), unknown(), stored_run((ACT, {"applied": False, "attempt": 1})))
    assert not_applied is not None
    assert isinstance(not_applied.result, NotApplied)
    assert "dispatching again with the same key=run-id-1/0/pay" in not_applied.event
    assert await people.said(record(state="succeeded"), ActionRecordStatus(), stored_run()) is None
    assert await people.said(record(), unknown(), None) is None
    assert events.posted == []


async def test_an_answer_not_acted_on_is_said_once_in_warning_events() -> None:
    events = Events()
    people = PersonAnswers(events, KEYS)  # type: ignore[arg-type]
    body = run(reconciliations={ACT: {"applied": True, "attempt": 1}})
    for _ in range(3):
        assert await people.said(record(), unknown(), body) is None
    assert [(name, reason, warning) for name, reason, _, warning in events.posted] == [
        ("pay", "ReconciliationNotActedOn", True),
        (ACT, "ReconciliationNotActedOn", True),
    ]
    assert "carries no stamp of the operator's admission webhook" in events.posted[0][2]


def test_the_query_answers_keep_their_records() -> None:
    spec = ActionRecordSpec.model_validate(record()["spec"])
    applied = system_said(Applied({"receipt": "r"}), spec)
    assert (applied.reason, applied.message) == (None, None)
    assert applied.event == "the authoritative system applied key=run-id-1/0/pay"
    not_applied = system_said(NotApplied(), spec)
    assert (not_applied.reason, not_applied.message) == (
        "NotApplied",
        "the authoritative system has no record of this key",
    )
    still = system_said(Unknown("Timeout", "no answer"), spec)
    assert (still.reason, still.message, still.event) == ("Timeout", "no answer", "query: Timeout: no answer")


def test_a_pending_reconciliation_keeps_its_key_in_use() -> None:
    body = stored_run((ACT, {"applied": True, "attempt": 1}))
    assert f"spec.reconciliations[{ACT!r}] stamp" in keys_in_use(body)["k1"]


# --- kubectl agentrun reconcile ---------------------------------------------------------------------


class Api:
    """A stand-in for CustomObjectsApi: one run, its records, the patches sent."""

    def __init__(self, records: dict[str, dict[str, Any]], refuse: str | None = None) -> None:
        self.run = run()
        self.records = records
        self.refuse = refuse
        self.patches: list[dict[str, Any]] = []

    def get_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str, name: str) -> Any:
        if plural == "agentruns":
            return self.run
        if name not in self.records:
            raise ApiException(status=404, reason="Not Found")
        return self.records[name]

    def list_namespaced_custom_object(self, *args: Any, label_selector: str) -> Any:
        return {"items": list(self.records.values())}

    def patch_namespaced_custom_object(self, *args: Any) -> Any:
        if self.refuse is not None:
            err = ApiException(status=403, reason="Forbidden")
            err.body = json.dumps({"message": self.refuse})
            raise err
        self.patches.append(args[-1])
        return self.run


def test_kubectl_reconcile_sends_the_answer_for_the_attempt_the_record_is_at() -> None:
    api = Api({ACT: record(attempts=2)})
    said = kubectl_reconcile.reconcile(api, "team-a", "pay", ACT, True, "seen in the bank statement")  # type: ignore[arg-type]
    assert said == (
        f"agentrun.durable-agents.io/pay: action {ACT} attempt 2 reconciled as applied "
        "(it will not be sent again)"
    )
    assert api.patches == [
        {
            "spec": {
                "reconciliations": {
                    ACT: {"applied": True, "attempt": 2, "reason": "seen in the bank statement"}
                }
            }
        }
    ]
    api.run["spec"]["reconciliations"] = {ACT: {"applied": False, "attempt": 1}}
    kubectl_reconcile.reconcile(api, "team-a", "pay", ACT, False)  # type: ignore[arg-type]
    assert api.patches[-1] == {
        "spec": {"reconciliations": {f"{ACT}.2": {"applied": False, "attempt": 2, "reason": ""}}}
    }


def test_kubectl_reconcile_says_why_not() -> None:
    with pytest.raises(kubectl_reconcile.ReconcileError, match=f"no ActionRecord 'act-x'.*unknown: {ACT}"):
        kubectl_reconcile.reconcile(Api({ACT: record()}), "team-a", "pay", "act-x", True)  # type: ignore[arg-type]
    with pytest.raises(kubectl_reconcile.ReconcileError, match="is 'succeeded'"):
        kubectl_reconcile.reconcile(Api({ACT: record(state="succeeded")}), "team-a", "pay", ACT, True)  # type: ignore[arg-type]
    with pytest.raises(kubectl_reconcile.ReconcileError, match="of run 'other', not of 'pay'"):
        kubectl_reconcile.reconcile(Api({ACT: record(owner="other")}), "team-a", "pay", ACT, True)  # type: ignore[arg-type]
    refusing = Api({ACT: record()}, refuse="missing RBAC permission verb 'approve'")
    with pytest.raises(kubectl_reconcile.ReconcileError, match="refused the reconciliation: missing RBAC"):
        kubectl_reconcile.reconcile(refusing, "team-a", "pay", ACT, True)  # type: ignore[arg-type]


def test_kubectl_agentrun_reconcile_needs_one_answer(capsys: pytest.CaptureFixture[str]) -> None:
    # Without an answer it asks the system now (durable_agents.kubectl.controls, e2e/test_controls.py).
    for argv in (
        ["reconcile", "pay", "--action", ACT, "--applied", "--not-applied"],
        ["reconcile", "pay", "--applied"],
    ):
        with pytest.raises(SystemExit):
            kubectl_plugin.main(argv)
    err = capsys.readouterr().err
    assert "not allowed with argument --applied" in err
    assert "the following arguments are required: --action" in err
