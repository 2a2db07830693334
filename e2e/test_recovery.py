"""Fresh-process recovery: SIGKILL at every commit boundary, zombies, two operators at once.

Every scenario asserts the run's history is gapless (stateVersion +1 per transition), that no
step was committed twice, and who committed what, from the fencing epochs in the history.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from durable_agents.shell.ownership.rights import FENCED, FENCING
from durable_agents.shell.ownership.shards import shard_of
from durable_agents.shell.runs.worker import WorkerConfig
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.runs import (
    EXPECTED_EVENTS,
    Runs,
    assert_history_is_gapless,
    assert_one_holder_at_a_time,
    read_ask_await_complete,
)

LEASE = 2  # seconds; short so that takeovers are quick
# The scenario's status writes, at its semantic boundaries: the transitions committed after each
# (accepted + the read + the question; the answer + revalidated + the wait; the event + revalidated
# + succeeded).
BOUNDARIES = [3, 6, 9]
# The zombie scenarios freeze a worker between two steps: one transition per write, so that there
# is a write between every two steps (the fencing proof is per write, whatever a write carries).
PER_TRANSITION = {"DURABLE_AGENTS_TRANSITIONS_PER_WRITE": "1"}


def drive_to_completion(
    runs: Runs, name: str, within: float = Within.TAKEOVER, until: Callable[[], bool] = lambda: False
) -> dict[str, Any] | None:
    """Answer the question and deliver the event whenever the run waits for them.

    Returns the completed run, or None as soon as ``until()`` holds (e.g. the operator died).
    """

    def driven() -> tuple[dict[str, Any] | None] | None:
        if until():
            return (None,)
        run = runs.get(name)
        status = run.get("status") or {}
        state = status.get("state")
        if state == "completed":
            return (run,)
        if state in ("failed", "expired", "quarantined", "canceled"):
            raise AssertionError(f"run {name} ended {state}: {status.get('outcome')}")
        spec = run["spec"]
        if state == "waiting_input" and "confirm" not in spec.get("answers", {}):
            runs.patch_spec(name, {"answers": {"confirm": "yes"}})
        if state == "waiting_external" and "window-open" not in spec.get("events", {}):
            runs.patch_spec(name, {"events": {"window-open": "now"}})
        return None

    try:
        return eventually(driven, within, f"run {name} to complete", interval=0.1)[0]
    except TimeoutError as err:
        raise TimeoutError(f"{err}: {runs.get(name).get('status')}") from None


def holders(history: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(h["holder"], h["epoch"]) for h in history]


@pytest.mark.parametrize("phase", ["before", "after"])
def test_sigkill_at_every_commit_boundary(
    start_operator: Callable[..., OperatorProcess], runs: Runs, readable_configmap: str, phase: str
) -> None:
    assert BOUNDARIES[-1] == len(EXPECTED_EVENTS)
    for nth in range(1, len(BOUNDARIES) + 1):
        victim = start_operator(f"victim-{phase}{nth}", LEASE, DURABLE_AGENTS_TEST_KILL_AT=f"{phase}:{nth}")
        name = runs.create(read_ask_await_complete(readable_configmap), name=f"{phase}-{nth}")
        # Answer while the victim lives, so that every boundary is reached by it.
        drive_to_completion(runs, name, Within.COMMIT, until=lambda v=victim: not v.alive)  # type: ignore[misc]
        assert victim.wait_killed(60) == -signal.SIGKILL

        rescuer = start_operator(f"rescuer-{phase}{nth}", LEASE)
        done = drive_to_completion(runs, name)
        assert done is not None

        history = assert_history_is_gapless(done)
        assert [h["event"] for h in history] == EXPECTED_EVENTS, (
            f"a step repeated or went missing at {phase}:{nth}"
        )
        by_victim = [h for h in history if h["holder"] == victim.identity]
        committed_by_victim = len(by_victim)
        # A victim whose own short Lease lapsed on a loaded machine takes the run again and fences
        # it first: a write of record without a transition, which moves the boundaries. The fences
        # it made lie between those logged done and those logged begun (one killed or refused).
        log = victim.log_path.read_text()
        fences = range(log.count(FENCED), log.count(FENCING) + 1)
        writes = [(nth if phase == "after" else nth - 1) - fenced for fenced in fences]
        # Each write carries at least one transition and at most the semantic boundary's; a write
        # can carry fewer when the run is read again between two steps (a 409 when a person patched
        # the run meanwhile), which moves the later boundaries. test_runtime pins the 3 writes.
        fits = [0 <= w <= committed_by_victim <= (BOUNDARIES[w - 1] if w else 0) for w in writes]
        assert any(fits), (phase, nth, list(fences), holders(history))
        assert history[:committed_by_victim] == by_victim, "the victim's transitions come first"
        assert all(h["holder"] == rescuer.identity for h in history[committed_by_victim:])
        cp = done["status"]["checkpoint"]
        assert len(cp["evidence"]) == 1, "the evidence must be recorded exactly once"
        assert len(cp["toolCalls"]) == 1
        assert cp["fencing"]["holder"] == history[-1]["holder"]
        # A Lease the victim left behind is reaped once expired: a finished run costs no Lease.
        eventually(lambda: runs.leases() == [], Within.COMMIT, "the victim's orphaned Lease to be reaped")
        rescuer.stop()
        # The next victim must start as on a fresh namespace: a shard Lease the rescuer failed to
        # release (a race on a loaded machine) would be taken over, and the run fenced first.
        runs.drop_shard_leases_of(rescuer.identity)


def test_zombie_cannot_commit_after_takeover(
    start_operator: Callable[..., OperatorProcess], runs: Runs, readable_configmap: str
) -> None:
    """The zombie wakes right after the takeover, before the new holder committed any step.

    The new holder took the zombie's shard Lease once it expired (not released: the zombie may
    have a commit in flight), so before the run advances under the new hold it is fenced: its
    checkpoint stamped with the new epoch, without a transition. The run's resourceVersion would
    still match a commit prepared before the freeze if the new holder had not written first: the
    fencing write is what refuses the zombie.
    """
    spec = read_ask_await_complete(readable_configmap, answered=True)
    # Freeze right before the 2nd commit (the read step): the zombie holds a computed step.
    zombie = start_operator("zombie", LEASE, DURABLE_AGENTS_TEST_STOP_AT="before:2", **PER_TRANSITION)
    name = runs.create(spec)
    eventually(zombie.stopped, Within.COMMIT, "the zombie to freeze before its 2nd commit")
    stale = runs.get(name)
    # The new holder freezes right after its 1st write, which is the fencing write.
    rescuer = start_operator("rescuer", LEASE, DURABLE_AGENTS_TEST_STOP_AT="after:1", **PER_TRANSITION)
    eventually(rescuer.stopped, Within.COMMIT, "the rescuer to fence the run and freeze")
    fenced = runs.get(name)
    assert fenced["status"]["checkpoint"]["fencing"]["holder"] == rescuer.identity
    assert fenced["status"]["stateVersion"] == stale["status"]["stateVersion"] == 1, (
        "fencing is no transition"
    )
    assert fenced["metadata"]["resourceVersion"] != stale["metadata"]["resourceVersion"]

    zombie.signal(signal.SIGCONT)  # wakes with its computed step and tries to commit it
    eventually(lambda: zombie.logged("refused (409"), Within.COMMIT, "the zombie's commit to be refused")
    eventually(lambda: zombie.logged(" lost by "), Within.COMMIT, "the zombie to find its shard taken")
    rescuer.signal(signal.SIGCONT)
    done = runs.wait_state(name, "completed", timeout=60)

    history = assert_history_is_gapless(done)
    assert [h["event"] for h in history] == EXPECTED_EVENTS
    zombie_epoch = history[0]["epoch"]
    assert history[0]["holder"] == zombie.identity
    # Nothing after the takeover carries the zombie's epoch (it may later win a NEW epoch).
    assert all(h["epoch"] > zombie_epoch for h in history[1:]), holders(history)


def test_zombie_after_new_holder_committed_steps(
    start_operator: Callable[..., OperatorProcess], runs: Runs, readable_configmap: str
) -> None:
    zombie = start_operator("zombie", LEASE, DURABLE_AGENTS_TEST_STOP_AT="before:2", **PER_TRANSITION)
    name = runs.create(read_ask_await_complete(readable_configmap))
    eventually(zombie.stopped, Within.COMMIT, "the zombie to freeze")
    rescuer = start_operator("rescuer", LEASE, **PER_TRANSITION)
    parked = runs.wait_state(name, "waiting_input", timeout=30)
    zombie.signal(signal.SIGCONT)
    eventually(
        lambda: zombie.logged("moved on") or zombie.logged("refused (409"),
        Within.COMMIT,
        "the zombie to notice",
    )
    assert runs.get(name)["metadata"]["resourceVersion"] == parked["metadata"]["resourceVersion"]
    done = drive_to_completion(runs, name)
    assert done is not None
    history = assert_history_is_gapless(done)
    assert [h["event"] for h in history] == EXPECTED_EVENTS
    assert all(h["epoch"] > history[0]["epoch"] for h in history[1:]), holders(history)
    assert history[1]["holder"] == rescuer.identity


def test_two_operators_one_holder_at_a_time_and_takeover(
    start_operator: Callable[..., OperatorProcess], runs: Runs, readable_configmap: str
) -> None:
    # Each step takes a while (like a model call) and is its own write: A is caught mid-run.
    slow = {"DURABLE_AGENTS_TEST_COMMIT_DELAY": "0.2", **PER_TRANSITION}
    a = start_operator("a", LEASE, **slow)
    b = start_operator("b", LEASE, **slow)

    def split() -> bool:
        holders = [lease.spec.holder_identity for lease in runs.shard_leases()]
        return len(holders) == WorkerConfig().shards and {a.identity, b.identity} == set(holders)

    # The shards settle between A and B first: a graceful handover later would not be a takeover.
    eventually(split, Within.COMMIT, "the shards to be split between A and B")
    names = [
        runs.create(read_ask_await_complete(readable_configmap, answered=True), name=f"pair-{i}")
        for i in range(12)
    ]

    def advancing_by_a() -> list[str]:
        """Unfinished runs of a shard A holds, on which A has already committed a step."""
        shards = {
            int(lease.metadata.labels["durable-agents.io/shard"])
            for lease in runs.shard_leases()
            if lease.spec.holder_identity == a.identity
        }
        held = [n for n in names if shard_of(runs.namespace, n, WorkerConfig().shards) in shards]
        status = {n: runs.get(n).get("status") or {} for n in held}
        return [
            n
            for n in held
            if status[n].get("state") != "completed"
            and any(h["holder"] == a.identity for h in status[n].get("history", []))
        ]

    # Kill A while it holds the Lease of a run it is advancing.
    held_by_a = eventually(advancing_by_a, Within.COMMIT, "A to be advancing a run", interval=0.02)
    # Noted right before the kill: noted after it (and the wait for A's exit), a loaded machine's
    # delay would be counted against B's takeover.
    killed_at = datetime.now(UTC)
    a.kill()
    done = {name: runs.wait_state(name, "completed", timeout=90) for name in names}

    holders_seen: set[str] = set()
    for run in done.values():
        history = assert_history_is_gapless(run)
        assert [h["event"] for h in history] == EXPECTED_EVENTS
        holders_seen |= assert_one_holder_at_a_time(run)
        assert run["status"]["checkpoint"]["fencing"]["holder"] == history[-1]["holder"]
    assert holders_seen == {a.identity, b.identity}, (
        "both operators must have advanced runs",
        held_by_a,
        [holders(done[n]["status"]["history"]) for n in held_by_a],
    )

    takeovers = []
    for name in held_by_a:
        history = done[name]["status"]["history"]
        first_b = next((h for h in history if h["holder"] == b.identity), None)
        if first_b is None:  # A finished it between the look and the kill: no takeover to time
            continue
        takeovers.append((datetime.fromisoformat(first_b["at"]) - killed_at).total_seconds())
    print(f"takeover after SIGKILL with a {LEASE}s lease: {[round(t, 2) for t in sorted(takeovers)]}")
    assert takeovers, f"A finished every run it was seen advancing before the kill: {held_by_a}"
    # Correctness, not speed (that is bench/core.py's takeover figure): B never takes over a Lease
    # before it could have expired. A renews all its shard Leases together every half duration
    # (shell/ownership/shards.py), so at the kill about LEASE/2 of validity was left, less one
    # poll interval and the write's latency: LEASE/5 is a floor a takeover before expiry breaks.
    assert min(takeovers) >= LEASE / 5, f"took over {min(takeovers):.2f}s after the kill: before expiry"
