"""The seed's metrics from a committed transition (waits, approval latency, resume failures,
migration errors, a model run's calls and tokens), and the census of waiting runs and unknown
outcomes: each measured as the difference it makes in the process's Prometheus registry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import REGISTRY
from tests.unit.builders import new_run, snap

from durable_agents.api.v1alpha1 import AgentRunStatus, HistoryEntry, Outcome
from durable_agents.api.v1alpha1.states import WAITING_STATES, RunState
from durable_agents.core.agent.exchange import ModelRequest
from durable_agents.core.engine import Commit, NeedModelTurn
from durable_agents.core.statemachine import RunEvent
from durable_agents.shell.agent.model_client import ModelEndpoint
from durable_agents.shell.agent.model_turns import ModelTurns
from durable_agents.shell.observability.census import RunCensus, UnknownOutcomes
from durable_agents.shell.observability.commit_metrics import entered_at, initialise, observe_commit
from durable_agents_testkit.modelserver import ModelServerThread

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def entry(version: int, event: str, src: RunState, dst: RunState, seconds: float) -> HistoryEntry:
    return HistoryEntry(
        state_version=version, event=event, from_state=src, to_state=dst, at=T0 + timedelta(seconds=seconds)
    )


def commit(
    event: RunEvent,
    state: RunState,
    history: list[HistoryEntry],
    outcome: Outcome | None = None,
    checkpoint: dict[str, Any] | None = None,
) -> Commit:
    status = AgentRunStatus(state=state, state_version=len(history), history=history, outcome=outcome)
    return Commit(event, status, checkpoint)


APPROVAL_WAIT = [
    entry(1, "accepted", RunState.PENDING, RunState.READY, 0),
    entry(2, "approval_requested", RunState.READY, RunState.WAITING_APPROVAL, 10),
    entry(3, "cancel_recorded", RunState.WAITING_APPROVAL, RunState.WAITING_APPROVAL, 20),
    entry(4, "approval_decided", RunState.WAITING_APPROVAL, RunState.RESUME_VALIDATION, 100),
]


def test_entered_at_skips_self_transitions_and_knows_when_the_history_is_cut() -> None:
    assert entered_at(APPROVAL_WAIT, RunState.WAITING_APPROVAL) == T0 + timedelta(seconds=10)
    # The history no longer holds the entry into the wait (the newest 64 only): unknown.
    assert entered_at(APPROVAL_WAIT[2:], RunState.WAITING_APPROVAL) is None
    assert entered_at(APPROVAL_WAIT[:1], RunState.WAITING_APPROVAL) is None


def test_an_approval_decision_observes_the_wait_and_the_approval_latency() -> None:
    waits = sample("durable_agents_waiting_seconds_sum", state="waiting_approval")
    latency = sample("durable_agents_approval_latency_seconds_sum")
    count = sample("durable_agents_approval_latency_seconds_count")
    observe_commit(
        RunState.WAITING_APPROVAL,
        commit(RunEvent.APPROVAL_DECIDED, RunState.RESUME_VALIDATION, APPROVAL_WAIT),
    )
    assert sample("durable_agents_waiting_seconds_sum", state="waiting_approval") - waits == 90
    assert sample("durable_agents_approval_latency_seconds_sum") - latency == 90
    assert sample("durable_agents_approval_latency_seconds_count") - count == 1


def test_an_expired_input_wait_is_a_wait_but_not_an_approval() -> None:
    history = [
        entry(1, "input_requested", RunState.READY, RunState.WAITING_INPUT, 0),
        entry(2, "wait_expired", RunState.WAITING_INPUT, RunState.EXPIRED, 30),
    ]
    waits = sample("durable_agents_waiting_seconds_count", state="waiting_input")
    latency = sample("durable_agents_approval_latency_seconds_count")
    observe_commit(RunState.WAITING_INPUT, commit(RunEvent.WAIT_EXPIRED, RunState.EXPIRED, history))
    assert sample("durable_agents_waiting_seconds_count", state="waiting_input") - waits == 1
    assert sample("durable_agents_approval_latency_seconds_count") == latency
    # A self-transition (a cancellation noted) ends no wait.
    observe_commit(
        RunState.WAITING_INPUT, commit(RunEvent.CANCEL_RECORDED, RunState.WAITING_INPUT, history[:1])
    )
    assert sample("durable_agents_waiting_seconds_count", state="waiting_input") - waits == 1


def test_resume_failures_are_counted_by_reason_and_a_resume_is_not() -> None:
    history = [entry(5, "x", RunState.RESUME_VALIDATION, RunState.READY, 0)]

    def failures(reason: str) -> float:
        return sample("durable_agents_resume_failures_total", reason=reason)

    before = {r: failures(r) for r in ("ReapprovalRequired", "RuntimeConfigUnavailable", "Revalidated")}
    observe_commit(
        RunState.RESUME_VALIDATION,
        commit(RunEvent.REAPPROVAL_REQUIRED, RunState.WAITING_APPROVAL, history),
    )
    observe_commit(
        RunState.RESUME_VALIDATION,
        commit(
            RunEvent.ATTEMPT_FAILED,
            RunState.FAILED,
            history,
            outcome=Outcome(reason="RuntimeConfigUnavailable"),
        ),
    )
    observe_commit(RunState.RESUME_VALIDATION, commit(RunEvent.REVALIDATED, RunState.READY, history))
    # A cancellation noted (or requested) during the validation is no failure of it.
    for event, state in (
        (RunEvent.CANCEL_RECORDED, RunState.RESUME_VALIDATION),
        (RunEvent.CANCEL_REQUESTED, RunState.CANCEL_REQUESTED),
    ):
        observe_commit(RunState.RESUME_VALIDATION, commit(event, state, history))
    assert sample("durable_agents_resume_failures_total", reason="CancelRecorded") == 0
    assert sample("durable_agents_resume_failures_total", reason="CancelRequested") == 0
    assert failures("ReapprovalRequired") - before["ReapprovalRequired"] == 1
    assert failures("RuntimeConfigUnavailable") - before["RuntimeConfigUnavailable"] == 1
    assert failures("Revalidated") == before["Revalidated"] == 0


def test_a_checkpoint_that_cannot_be_migrated_counts_its_stored_version() -> None:
    history = [entry(3, "quarantine", RunState.READY, RunState.QUARANTINED, 0)]
    errors = sample("durable_agents_checkpoint_migration_errors_total", from_version="1")
    other = sample("durable_agents_checkpoint_migration_errors_total", from_version="other")
    for version in (1, "one"):
        observe_commit(
            RunState.READY,
            commit(
                RunEvent.QUARANTINE,
                RunState.QUARANTINED,
                history,
                outcome=Outcome(reason="MigrationFailed"),
                checkpoint={"schemaVersion": version},
            ),
        )
    # An unreadable checkpoint of the current schema is a quarantine, not a migration error.
    observe_commit(
        RunState.READY,
        commit(
            RunEvent.QUARANTINE,
            RunState.QUARANTINED,
            history,
            outcome=Outcome(reason="InvalidCheckpoint"),
            checkpoint={"schemaVersion": 1},
        ),
    )
    assert sample("durable_agents_checkpoint_migration_errors_total", from_version="1") - errors == 1
    assert sample("durable_agents_checkpoint_migration_errors_total", from_version="other") - other == 1


def test_a_model_run_that_ends_observes_its_calls_and_tokens() -> None:
    history = [entry(9, "succeeded", RunState.READY, RunState.COMPLETED, 0)]
    calls = sample("durable_agents_model_calls_per_run_sum")
    tokens = sample("durable_agents_model_tokens_per_run_sum")
    agent = {"modelCallsTotal": 3, "usageTotal": {"inputTokens": 1200, "outputTokens": 34}}
    observe_commit(
        RunState.READY, commit(RunEvent.SUCCEEDED, RunState.COMPLETED, history, checkpoint={"agent": agent})
    )
    observe_commit(  # a run without a model planner observes nothing
        RunState.READY, commit(RunEvent.SUCCEEDED, RunState.COMPLETED, history, checkpoint={})
    )
    assert sample("durable_agents_model_calls_per_run_sum") - calls == 3
    assert sample("durable_agents_model_tokens_per_run_sum") - tokens == 1234


def test_known_label_values_exist_at_start_up() -> None:
    initialise()
    series = [
        *(("durable_agents_oldest_waiting_seconds", {"state": s.value}) for s in WAITING_STATES),
        *(("durable_agents_waiting_seconds_count", {"state": s.value}) for s in WAITING_STATES),
        *(("durable_agents_ownership_changes_total", {"kind": k}) for k in ("shard", "region")),
        *(("durable_agents_model_tokens_total", {"kind": k}) for k in ("input", "output")),
        ("durable_agents_resume_failures_total", {"reason": "ReapprovalRequired"}),
        ("durable_agents_checkpoint_migration_errors_total", {"from_version": "2"}),
    ]
    missing = [(name, labels) for name, labels in series if REGISTRY.get_sample_value(name, labels) is None]
    assert not missing


def run_body(
    name: str, state: str, since: datetime | None, namespace: str = "ns", region: str | None = None
) -> dict[str, Any]:
    status: dict[str, Any] = {"state": state}
    if since is not None:
        status["stateSince"] = since.isoformat().replace("+00:00", "Z")
    spec = {"region": region} if region else {}
    return {"metadata": {"namespace": namespace, "name": name}, "spec": spec, "status": status}


def test_the_census_counts_only_waiting_runs_of_held_shards_of_its_region() -> None:
    census = RunCensus(held=lambda namespace, name: namespace == "ours", region="default")
    now = T0 + timedelta(hours=1)
    census.observe(None, run_body("a", "waiting_approval", T0 + timedelta(minutes=50), "ours"))
    census.observe(None, run_body("b", "waiting_approval", T0 + timedelta(minutes=20), "ours"))
    census.observe(None, run_body("c", "waiting_approval", T0, "theirs"))  # another replica's shard
    census.observe(None, run_body("d", "waiting_input", T0, "ours"))
    census.observe(None, run_body("e", "ready", T0, "ours"))
    census.observe(None, run_body("f", "waiting_approval", T0, "ours", region="eu-west-1"))  # not ours
    census.observe("MODIFIED", run_body("d", "resume_validation", now, "ours"))  # its wait ended
    out = census.refresh(now)
    assert out[RunState.WAITING_APPROVAL] == (2, 40 * 60)
    assert out[RunState.WAITING_INPUT] == (0, 0.0)
    assert sample("durable_agents_oldest_waiting_seconds", state="waiting_approval") == 40 * 60
    assert sample("durable_agents_waiting_runs", state="waiting_approval") == 2
    census.observe("DELETED", run_body("b", "waiting_approval", T0 + timedelta(minutes=20), "ours"))
    assert census.refresh(now)[RunState.WAITING_APPROVAL] == (1, 10 * 60)


def test_unknown_outcomes_report_the_oldest_until_settled() -> None:
    unknown = UnknownOutcomes()
    now = datetime.now(UTC)
    unknown.track(("ns", "r1"), True, now - timedelta(seconds=300))
    unknown.track(("ns", "r2"), True, now - timedelta(seconds=30))
    assert len(unknown) == 2
    assert 300 <= unknown.oldest_seconds() < 310
    assert 300 <= (REGISTRY.get_sample_value("durable_agents_oldest_unknown_outcome_seconds") or 0) < 310
    unknown.track(("ns", "r1"), False, None)  # settled
    assert 30 <= unknown.oldest_seconds() < 40
    assert sample("durable_agents_unknown_outcomes") == 1
    unknown.track(("ns", "r2"), False, None)
    assert unknown.oldest_seconds() == 0.0


async def test_a_model_call_counts_the_tokens_the_model_reported_by_kind() -> None:
    script = {"model": "m", "rules": [{"content": "done"}]}
    request = ModelRequest(model="m", messages=({"role": "user", "content": "say done"},), tools=())
    before = {kind: sample("durable_agents_model_tokens_total", kind=kind) for kind in ("input", "output")}
    with ModelServerThread(script) as server:
        turns = ModelTurns(lambda _run: ModelEndpoint(base_url=server.base_url, timeout_seconds=5.0))
        try:
            answered = await turns.answer(snap(new_run()), NeedModelTurn(request, step_index=0))
        finally:
            await turns.client.close()
    assert answered.reply is not None
    usage = answered.reply.usage
    assert (
        sample("durable_agents_model_tokens_total", kind="input") - before["input"] == usage.input_tokens > 0
    )
    assert (
        sample("durable_agents_model_tokens_total", kind="output") - before["output"]
        == usage.output_tokens
        > 0
    )
