"""Scaling a region 1 -> 2 -> 3 -> 2 -> 1 replicas while its runs advance (issue 14, item 2).

Each step adds or removes one replica (a graceful stop hands its shards over; a SIGKILL leaves
them to expire) with runs in flight on the shards that move. After each step:

- every shard is held by the replica rendezvous hashing names over the live members, and each
  shard that had to move changed hands exactly once (its ``leaseTransitions``, the fencing epoch,
  grew by one) while no other shard changed hands: no storm;
- the Lease writes of the step (API server audit log) are printed, by shard moves and the rest.

At the end every run completed with a gapless history, each epoch of a run names one holder and
epochs never go back (no run advanced by two holders), and runs were handed over mid-flight.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from durable_agents.shell.ownership.shards import assignment, desired_owner, shard_of
from durable_agents.shell.runs.worker import WorkerConfig
from durable_agents_testkit.audit import audit_offset, read_audit
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.runs import (
    EXPECTED_EVENTS,
    Runs,
    assert_history_is_gapless,
    assert_one_holder_at_a_time,
    read_ask_await_complete,
)

OPERATOR_USER = "durable-agents-operator"  # the e2e operators' user (e2e/conftest.py)
LEASE = 3
SHARDS = WorkerConfig().shards
# Each transition its own write, each write a little slow: a run is in flight for seconds, so the
# shards that move carry runs being advanced.
SLOW = {"DURABLE_AGENTS_TEST_COMMIT_DELAY": "0.15", "DURABLE_AGENTS_TRANSITIONS_PER_WRITE": "1"}
RUNS_PER_MEMBER = 2  # runs started before each step on the shards of each member to be


def _identities() -> dict[str, str]:
    """Fresh identities under which every member of every step's member set holds a shard.

    Rendezvous hashing over 16 shards leaves a member with none now and then (about 1 in 700 draws
    for the third): such a step would have no runs to hand over, and no name would ever land on it.
    """
    while True:
        ids = {role: f"{role}-{uuid.uuid4().hex[:6]}" for role in ("a", "b", "c")}
        steps = ([ids["a"], ids["b"]], [ids["a"], ids["b"], ids["c"]], [ids["a"], ids["c"]])
        if all(set(assignment(SHARDS, members).values()) == set(members) for members in steps):
            return ids


@pytest.mark.local_plane("audit")
def test_scaling_one_to_three_to_one_under_load(
    plane: LocalControlPlane,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    readable_configmap: str,
) -> None:
    audit = plane.audit_log_path
    offset = audit_offset(audit)
    ids = _identities()
    spec = read_ask_await_complete(readable_configmap, answered=True)
    names: list[str] = []
    serial = iter(range(100_000))

    def shards() -> dict[int, tuple[str, int]]:
        """Shard -> (holder, epoch) as the Leases say now."""
        return {
            int(lease.metadata.labels["durable-agents.io/shard"]): (
                lease.spec.holder_identity or "",
                lease.spec.lease_transitions or 0,
            )
            for lease in runs.shard_leases()
        }

    def load(members: list[str]) -> None:
        """Start runs on the shards each of ``members`` will hold (rendezvous over ``members``)."""
        for member in members:
            made = 0
            while made < RUNS_PER_MEMBER:
                name = f"load-{next(serial)}"
                if desired_owner(shard_of(runs.namespace, name, SHARDS), members) == member:
                    names.append(runs.create(spec, name=name))
                    made += 1

    def step(label: str, members: list[str], change: Callable[[], None]) -> None:
        before = shards()
        load(members)
        eventually(lambda: any(runs.get(n).get("status") for n in names[-2:]), Within.COMMIT, "load to start")
        want = assignment(SHARDS, members)
        started = datetime.now(UTC)
        change()

        def settled() -> dict[int, tuple[str, int]] | None:
            now = shards()
            held = {shard: holder for shard, (holder, _) in now.items()}
            return now if held == want else None

        after = eventually(settled, Within.TAKEOVER, f"{label}: each shard at its owner over {members}")
        ended = datetime.now(UTC)
        moved = sorted(s for s in want if before[s][0] != want[s])
        grew = {s: after[s][1] - before[s][1] for s in want if after[s][1] != before[s][1]}
        assert grew == dict.fromkeys(moved, 1), (
            f"{label}: the shards that had to move {moved} must change hands once and no other: "
            f"epochs grew by {grew}"
        )
        writes = [
            e
            for e in read_audit(audit, offset=offset, user=OPERATOR_USER, since=started, until=ended)
            if e.is_write and e.resource == "leases" and e.namespace == runs.namespace
        ]
        on_shards = sum(e.name.startswith("durable-agents-shard") for e in writes)
        print(
            f"\n{label}: {len(moved)} of {SHARDS} shards moved in {(ended - started).total_seconds():.2f}s"
            f" with {len(writes)} Lease writes ({on_shards} on shard Leases, the rest on member"
            " Leases; renewals included)"
        )

    a = start_operator("a", LEASE, identity=ids["a"], **SLOW)
    eventually(
        lambda: {h for h, _ in shards().values()} == {ids["a"]} and len(shards()) == SHARDS,
        Within.COMMIT,
        "A to hold every shard",
    )
    ops: dict[str, OperatorProcess] = {"a": a}

    def join(role: str) -> Callable[[], None]:
        def start() -> None:
            ops[role] = start_operator(role, LEASE, identity=ids[role], **SLOW)

        return start

    step("scale 1 -> 2", [ids["a"], ids["b"]], join("b"))
    step("scale 2 -> 3", [ids["a"], ids["b"], ids["c"]], join("c"))
    step("scale 3 -> 2 (B stops)", [ids["a"], ids["c"]], lambda: ops["b"].stop())
    step("scale 2 -> 1 (C killed)", [ids["a"]], lambda: ops["c"].kill())

    done = {name: runs.wait_state(name, "completed", timeout=Within.RUN) for name in names}
    handed_over = 0
    seen: set[str] = set()
    for name, run in done.items():
        history = assert_history_is_gapless(run)
        assert [h["event"] for h in history] == EXPECTED_EVENTS, f"{name}: a step repeated"
        holders = assert_one_holder_at_a_time(run)
        handed_over += len(holders) > 1
        seen |= holders
    print(f"{len(names)} runs, {handed_over} handed over mid-flight, advanced by {sorted(seen)}")
    assert seen == set(ids.values()), f"every replica must have advanced runs: {sorted(seen)}"
    assert handed_over, "no run was handed over mid-flight: the steps did not happen under load"
