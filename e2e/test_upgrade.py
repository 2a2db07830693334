"""Upgrade and downgrade across the checkpoint schema change (version 1 -> 2).

The previous release (commit ``OLD_RELEASE``, checkpoint schemaVersion 1) runs from a ``git archive``
of its sources. Old -> new: it is SIGKILLed with runs in several states (waiting for an answer,
for an event, for an effect whose dispatch is in flight, in the middle of its steps, and not yet
accepted); the new operator migrates and finishes every one, and applies no effect twice.
New -> old: the old operator meets version-2 checkpoints and quarantines the runs without
changing a byte of them; back on the new operator, a quarantined run is released by
``spec.retryQuarantine`` and another canceled by ``spec.cancellations``. The same for a run whose
effect was in flight when the new operator was replaced by the old one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import durable_agents
from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.checkpoint import CURRENT_SCHEMA_VERSION
from durable_agents.core.ledger import action_record_name, idempotency_key
from durable_agents.shell.ownership.leases import LeaseRecord
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.releases import Release, ReleaseUnavailable, materialize_release
from durable_agents_testkit.runs import (
    EXPECTED_EVENTS,
    Runs,
    assert_history_is_gapless,
    read_ask_await_complete,
)

REPO = Path(__file__).resolve().parents[1]
OLD_RELEASE = "3e2c704bade3f44b048fdb45691ee03082502f96"  # checkpoint schemaVersion 1 only
NEW_VERSION: str = durable_agents.__version__
LEASE = 2  # seconds; short so that takeovers are quick
# What the commit that ends a canceled run writes into a checkpoint it can read: where the run
# stands, who committed it, and when. Everything else stays as the quarantined checkpoint had it.
CANCEL_BOOKKEEPING = {
    "position.state",
    "position.stateVersion",
    "fencing.holder",
    "fencing.leaseTransitions",
    "timestamps.updatedAt",
    "timestamps.enteredStateAt",
    "integrity",  # the checkpoint's stamp changes with every commit
}
EFFECT_EVENTS = ["accepted", "external_awaited", "external_received", "revalidated", "succeeded"]


@pytest.fixture(scope="session")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The previous release's sources, and proof that a process given its env imports them."""
    try:
        release = materialize_release(REPO, OLD_RELEASE, tmp_path_factory.mktemp("release-3e2c704"))
    except ReleaseUnavailable as err:
        pytest.fail(str(err), pytrace=False)
    found = release.probe()
    for module in ("durable_agents", "durable_agents_controllers"):
        assert Path(found[module]).is_relative_to(release.root), (
            f"{module} was imported from {found[module]}, not from the release in {release.root}"
        )
    assert found["version"] is None, "the previous release has no durable_agents.__version__"
    assert found["schemaVersion"] == 1
    return release


def canonical(checkpoint: dict[str, Any]) -> bytes:
    return json.dumps(checkpoint, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def changed_paths(before: Any, after: Any, path: str = "") -> list[str]:
    """Where two JSON values differ, as dotted paths (for assertion messages)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [
            p
            for k in sorted(before.keys() | after.keys())
            for p in changed_paths(before.get(k), after.get(k), f"{path}.{k}" if path else k)
        ]
    return [] if before == after else [f"{path}: {before!r} -> {after!r}"[:300]]


def checkpoint_of(runs: Runs, name: str) -> dict[str, Any]:
    cp: dict[str, Any] = runs.get(name)["status"]["checkpoint"]
    return cp


def events_of(run: dict[str, Any]) -> list[str]:
    return [h["event"] for h in (run.get("status") or {}).get("history", [])]


def http_effect_run(url: str) -> dict[str, Any]:
    return {
        "taskType": "payment",
        "objective": "pay once, across an operator upgrade",
        "steps": [
            {
                "name": "pay",
                "effect": {
                    "effect": "http.post",
                    "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
                    "arguments": {"amount": 10},
                },
            },
            {"name": "done", "complete": {"result": "paid"}},
        ],
    }


def many_reads_run(configmap: str, reads: int) -> dict[str, Any]:
    """A run that stays in ``ready`` for a while: one read after another, then complete."""
    read = {"read": {"object": {"apiVersion": "v1", "kind": "ConfigMap", "name": configmap}}}
    return {
        "taskType": "e2e",
        "objective": "read the same settings many times",
        "steps": [
            *({"name": f"read-{i}", **read} for i in range(reads)),
            {"name": "done", "complete": {"result": "ok"}},
        ],
    }


def record_of(runs: Runs, key: str) -> dict[str, Any]:
    out: dict[str, Any] = runs.custom.get_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "actionrecords", action_record_name(key)
    )
    return out


def assert_migrated(run: dict[str, Any]) -> None:
    cp = run["status"]["checkpoint"]
    name = run["metadata"]["name"]
    assert cp["schemaVersion"] == CURRENT_SCHEMA_VERSION, (
        f"{name}: still at schemaVersion {cp['schemaVersion']}"
    )
    assert "attempt" not in cp, f"{name}: attempt not migrated: {cp}"
    assert "attempts" in cp["retry"], f"{name}: attempt not migrated: {cp}"
    assert cp["runtimeConfig"].get("operator") == NEW_VERSION, f"{name}: {cp['runtimeConfig']}"


def passes_resume_validation_by(run: dict[str, Any], holder: str) -> bool:
    return any(h["to"] == "resume_validation" and h["holder"] == holder for h in run["status"]["history"])


def test_old_operator_killed_mid_flight_new_operator_migrates_and_finishes_every_run(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
    readable_configmap: str,
    old_release: Release,
) -> None:
    # Each run commit of the old operator takes a while (like a model call), so that a run with
    # many steps is still mid-flight when the operator dies. Its dispatch timeout bounds how long
    # the effect's claim outlives it.
    old = start_operator(
        "old",
        LEASE,
        **old_release.env(),
        DURABLE_AGENTS_TEST_COMMIT_DELAY="0.3",
        DURABLE_AGENTS_DISPATCH_TIMEOUT="3",
    )
    asking = runs.create(read_ask_await_complete(readable_configmap), name="asking")
    preanswered = read_ask_await_complete(readable_configmap)
    preanswered["answers"] = {"confirm": "yes"}
    awaiting = runs.create(preanswered, name="awaiting")
    runs.wait_state(asking, "waiting_input", timeout=30)
    runs.wait_state(awaiting, "waiting_external", timeout=30)

    busy = runs.create(many_reads_run(readable_configmap, 40), name="busy")
    eventually(
        lambda: "step_completed" in events_of(runs.get(busy)),
        Within.COMMIT,
        "the old operator to be reading for busy",
    )
    # The effect is applied, then its answer is held back: the old dispatcher waits for it.
    refsystem.inject("slow", delay=60)
    paying = runs.create(http_effect_run(refsystem.url), name="paying")
    key = idempotency_key(runs.get(paying)["metadata"]["uid"], 0, "pay")

    def dispatch_in_flight() -> bool:
        if refsystem.applied(key) != 1:
            return False
        try:
            return bool(record_of(runs, key).get("status", {}).get("state") == "dispatching")
        except Exception:  # the record may not exist yet
            return False

    eventually(
        dispatch_in_flight, Within.COMMIT, "the old operator to be dispatching the effect", interval=0.02
    )
    old.kill()
    assert not old.alive

    # Mid-flight, and every checkpoint written by the old schema.
    assert record_of(runs, key)["status"]["state"] == "dispatching", "the kill must catch the dispatch"
    expected = {
        asking: "waiting_input",
        awaiting: "waiting_external",
        paying: "waiting_external",
        busy: "ready",
    }
    for name, state in expected.items():
        run = runs.get(name)
        assert run["status"]["state"] == state, f"{name}: {run['status']['state']}, expected {state}"
        cp = run["status"]["checkpoint"]
        assert cp["schemaVersion"] == 1, f"{name}: the old operator wrote schemaVersion {cp['schemaVersion']}"
        assert "attempt" in cp, f"{name}: not a version-1 checkpoint: {cp}"
        assert "retry" not in cp, f"{name}: not a version-1 checkpoint: {cp}"
        assert {h["holder"] for h in run["status"]["history"]} == {old.identity}
    assert any(lease.spec.holder_identity == old.identity for lease in runs.leases()), (
        "busy's Lease is left behind by the killed operator"
    )
    # Created while no operator runs: pending, no checkpoint at all.
    fresh = runs.create(read_ask_await_complete(readable_configmap, answered=True), name="fresh")
    assert not (runs.get(fresh).get("status") or {}).get("checkpoint")

    new = start_operator("new", LEASE)
    runs.patch_spec(asking, {"answers": {"confirm": "yes"}, "events": {"window-open": "now"}})
    runs.patch_spec(awaiting, {"events": {"window-open": "now"}})
    done = {name: runs.wait_state(name, "completed", timeout=60) for name in [*expected, fresh]}

    for run in done.values():
        assert_history_is_gapless(run)
        assert_migrated(run)
        holders = [h["holder"] for h in run["status"]["history"]]
        assert set(holders) <= {old.identity, new.identity}, holders
        assert holders[-1] == new.identity
    for name in expected:
        assert passes_resume_validation_by(done[name], new.identity), (
            f"{name} must pass resume validation under the new operator: {events_of(done[name])}"
        )
    assert events_of(done[asking]) == EXPECTED_EVENTS
    assert events_of(done[awaiting]) == EXPECTED_EVENTS
    assert events_of(done[paying]) == EFFECT_EVENTS
    assert events_of(done[fresh]) == EXPECTED_EVENTS
    assert {h["holder"] for h in done[fresh]["status"]["history"]} == {new.identity}
    # The run caught between steps resumes by a deployment-change revalidation, then goes on.
    busy_events = events_of(done[busy])
    revalidation = busy_events.index("revalidation_required")
    print(f"\nbusy, killed between steps, resumes: {busy_events[revalidation - 1 : revalidation + 3]}")
    assert busy_events[revalidation + 1] == "revalidated", busy_events
    assert done[busy]["status"]["history"][revalidation]["holder"] == new.identity
    assert busy_events.count("step_completed") == 40, "every read exactly once, none repeated or skipped"
    assert len(done[busy]["status"]["checkpoint"]["evidence"]) == 40

    # The effect in flight at the kill was applied once, and recognised by a query, not re-sent.
    assert refsystem.duplicates() == []
    assert refsystem.counts() == {key: 1}
    record = record_of(runs, key)["status"]
    assert (record["state"], record["attempts"]) == ("succeeded", 1)
    assert record["queries"] >= 1
    assert [c["outcome"] for c in done[paying]["status"]["checkpoint"]["toolCalls"]] == ["succeeded"]
    assert new.alive


def old_release_let_go(runs: Runs) -> bool:
    """No Lease is held any more: each is deleted or, if left behind, expired (no longer renewed).

    The previous release can leave a Lease behind when its renewer races the release of the run
    (fixed since: tests/integration/test_run_leases.py). Its code is frozen, so for it the test
    accepts a Lease that has stopped being renewed; the new operator's Leases must be deleted.
    """
    now = datetime.now(UTC)
    return all(LeaseRecord.parse(lease).expired(now) for lease in runs.leases())


def test_old_operator_quarantines_new_checkpoints_untouched_and_new_operator_releases_or_cancels(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    readable_configmap: str,
    old_release: Release,
) -> None:
    new = start_operator("new", LEASE)
    retried = runs.create(read_ask_await_complete(readable_configmap), name="retried")
    canceled = runs.create(read_ask_await_complete(readable_configmap), name="canceled")
    for name in (retried, canceled):
        runs.wait_state(name, "waiting_input", timeout=30)
        cp = checkpoint_of(runs, name)
        assert cp["schemaVersion"] == CURRENT_SCHEMA_VERSION
        assert cp["runtimeConfig"]["operator"] == NEW_VERSION
    # A wait commit is followed by the Lease's release: stop only after it, or a Lease stays behind.
    eventually(
        lambda: runs.leases() == [], Within.COMMIT, "the new operator to release the waiting runs' Leases"
    )
    new.stop()
    originals = {name: checkpoint_of(runs, name) for name in (retried, canceled)}
    stored = {name: canonical(cp) for name, cp in originals.items()}

    old = start_operator("old", LEASE, **old_release.env())
    for name in (retried, canceled):
        runs.patch_spec(name, {"answers": {"confirm": "yes"}})
    for name in (retried, canceled):
        run = runs.wait_state(name, "quarantined", "completed", "failed", timeout=30)
        status = run["status"]
        assert status["state"] == "quarantined", f"{name}: the old operator acted on a v2 checkpoint"
        assert status["outcome"]["reason"] == "UnknownSchemaVersion", status["outcome"]
        assert f"schemaVersion {CURRENT_SCHEMA_VERSION}" in status["outcome"]["message"]
        quarantined = {c["type"]: c for c in status["conditions"]}["Quarantined"]
        assert (quarantined["status"], quarantined["reason"]) == ("True", "UnknownSchemaVersion")
        last = status["history"][-1]
        assert (last["event"], last["from"], last["holder"]) == (
            "quarantine",
            "waiting_input",
            old.identity,
        )
        assert canonical(status["checkpoint"]) == stored[name], (
            f"{name}: the old operator changed the checkpoint"
        )
    eventually(
        lambda: old_release_let_go(runs), Within.COMMIT, "the old operator to let go of the runs' Leases"
    )
    old.stop()

    newer = start_operator("new-again", LEASE)
    # The new operator is at work (a fresh run completes), yet the quarantined runs stay put.
    probe = runs.create(read_ask_await_complete(readable_configmap, answered=True), name="probe")
    runs.wait_state(probe, "completed", timeout=60)
    for name in (retried, canceled):
        run = runs.get(name)
        assert run["status"]["state"] == "quarantined", f"{name} left quarantine with no control set"
        assert run["status"]["history"][-1]["holder"] == old.identity
        assert canonical(run["status"]["checkpoint"]) == stored[name]

    # Retry: the new operator reads the checkpoint, releases the run, and it completes.
    runs.patch_spec(retried, {"retryQuarantine": "after-upgrade", "events": {"window-open": "now"}})
    eventually(lambda: runs.state(retried) != "quarantined", Within.COMMIT, f"{retried} to leave quarantine")
    done = runs.wait_state(retried, "completed", "failed", "canceled", "quarantined", timeout=60)
    assert done["status"]["state"] == "completed", done["status"]
    assert done["status"]["quarantineRetried"] == "after-upgrade"
    history = assert_history_is_gapless(done)
    release = next(h for h in history if h["event"] == "release_quarantine")
    assert (release["from"], release["to"], release["holder"]) == (
        "quarantined",
        "resume_validation",
        newer.identity,
    )
    after_release = [h["event"] for h in history[history.index(release) :]]
    print(f"\nreleased from quarantine by the new operator: {after_release}")
    assert "input_received" in after_release, after_release
    assert after_release[-1] == "succeeded", after_release
    assert_migrated(done)

    # Cancel: quarantined -> cancel_requested leaves the checkpoint as stored; the new operator reads
    # it, so cancel_finished records the terminal position in it (nothing else: no step ran).
    runs.patch_spec(canceled, {"cancellations": {"after-upgrade": {"scope": "task", "reason": "downgraded"}}})
    ended = runs.wait_state(canceled, "canceled", "completed", "failed", timeout=60)
    status = ended["status"]
    assert status["state"] == "canceled", status
    assert status["outcome"]["reason"] == "Canceled"
    assert status["cancellation"]["requestId"] == "after-upgrade"
    tail = [(h["event"], h["from"], h["to"]) for h in status["history"][-2:]]
    assert tail == [
        ("cancel_requested", "quarantined", "cancel_requested"),
        ("cancel_finished", "cancel_requested", "canceled"),
    ], tail
    assert all(h["holder"] == newer.identity for h in status["history"][-2:])
    changed = changed_paths(originals[canceled], status["checkpoint"])
    assert {c.split(":")[0] for c in changed} <= CANCEL_BOOKKEEPING, (
        f"canceling rewrote the checkpoint: {changed}"
    )
    assert status["checkpoint"]["position"]["state"] == "canceled"
    assert status["checkpoint"]["pendingInput"] == originals[canceled]["pendingInput"], "no step ran"


def test_a_run_quarantined_with_its_effect_in_flight_is_released_and_applies_it_once(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
    old_release: Release,
) -> None:
    """Downgrade while the new operator waits on a dispatched effect, then upgrade again and retry."""
    refsystem.inject("slow", delay=60)
    # Claimed, not first-claimed: the old release knows claims only (with a first claim in flight
    # it could neither claim nor give it up: the record would wait for the upgrade back).
    new = start_operator("new", LEASE, DURABLE_AGENTS_DISPATCH_TIMEOUT="3", DURABLE_AGENTS_FIRST_CLAIM="off")
    paying = runs.create(http_effect_run(refsystem.url), name="paying")
    key = idempotency_key(runs.get(paying)["metadata"]["uid"], 0, "pay")

    def dispatch_in_flight() -> bool:
        if refsystem.applied(key) != 1:
            return False
        try:
            return bool(record_of(runs, key).get("status", {}).get("state") == "dispatching")
        except Exception:  # the record may not exist yet
            return False

    eventually(
        dispatch_in_flight, Within.COMMIT, "the new operator to be dispatching the effect", interval=0.02
    )
    eventually(
        lambda: runs.leases() == [], Within.COMMIT, "the new operator to release the waiting run's Lease"
    )
    new.kill()
    waiting = runs.get(paying)
    assert waiting["status"]["state"] == "waiting_external"
    assert [p["idempotencyKey"] for p in waiting["status"]["checkpoint"]["pendingActions"]] == [key]
    stored = canonical(waiting["status"]["checkpoint"])

    old = start_operator("old", LEASE, **old_release.env())
    quarantined = runs.wait_state(paying, "quarantined", "completed", "failed", timeout=30)
    assert quarantined["status"]["outcome"]["reason"] == "UnknownSchemaVersion"
    assert canonical(quarantined["status"]["checkpoint"]) == stored
    eventually(
        lambda: old_release_let_go(runs), Within.COMMIT, "the old operator to let go of the run's Lease"
    )
    old.stop()

    start_operator("new-again", LEASE)
    runs.patch_spec(paying, {"retryQuarantine": "after-upgrade"})

    def settled() -> dict[str, Any] | None:
        run = runs.get(paying)
        status = run["status"]
        if status.get("quarantineRetried") != "after-upgrade":
            return None
        if status["state"] in ("completed", "failed", "canceled", "expired"):
            return run
        if status["state"] == "quarantined" and status["outcome"]["reason"] != "UnknownSchemaVersion":
            return run  # quarantined again, by the new operator
        return None

    done = eventually(settled, Within.TAKEOVER, f"{paying} to settle after the retry", interval=0.1)
    status = done["status"]
    assert status["state"] == "completed", (status["state"], status.get("outcome"), events_of(done))
    assert refsystem.duplicates() == []
    assert refsystem.counts() == {key: 1}
