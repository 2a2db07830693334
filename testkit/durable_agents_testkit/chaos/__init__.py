"""Machinery of the chaos suite (``e2e/test_chaos.py``): every recovery scenario
(crash points, zombies, stale backups, upgrades) with many runs.

Each scenario runs many AgentRuns against operators in separate processes, hurts them (SIGKILL by
the commit hooks or from the test, SIGSTOP, ambiguous answers of the reference system, restarts of
the API server and etcd, a stale backup restored into a fresh control plane, bad input), and ends
with the two global assertions of the table:

1. every run is terminal or in an owned recovery state: ``quarantined``, a wait with an expiry,
   or in progress (``ready`` and friends) under a live Lease;
2. the reference authoritative system applied no idempotency key twice.

The scenarios themselves live in the test module; what they share is here, one concern a module:

- :mod:`.sizes`: the size knob (``ci``, ``full``), the report's path, the seed;
- :mod:`.report`: each scenario's result, the session's table and JSON;
- :mod:`.lab`: a :class:`Lab` (namespaces, operator processes, kill counting), RBAC, retries;
- :mod:`.warm`: operators forked from :mod:`durable_agents_testkit.forkserver` (warm starts);
- :mod:`.workloads`: run specs and AgentPolicies;
- :mod:`.responder`: a thread that answers what runs wait for;
- :mod:`.settle`: run classification and the global assertions;
- :mod:`.checks`: waiting for runs to end, effects applied once, a scenario's verdict;
- :mod:`.backup`: backup export and restore.

Nothing here is used at run time.
"""

from __future__ import annotations

from durable_agents_testkit.chaos.backup import export_objects, restore_objects
from durable_agents_testkit.chaos.checks import (
    all_ended,
    assert_paid_once,
    conclude,
    key_of,
    measure,
    pay_key,
    record,
    record_state,
    runs_in,
    wait_ended,
    wait_no_leases,
)
from durable_agents_testkit.chaos.lab import (
    OPERATOR_USER,
    Lab,
    grant_operator_rules,
    prepare_namespace,
    retrying,
)
from durable_agents_testkit.chaos.report import ChaosReport, DuplicateEffects, ScenarioResult
from durable_agents_testkit.chaos.responder import Responder
from durable_agents_testkit.chaos.settle import (
    EXPIRY_GRACE,
    IN_PROGRESS,
    TERMINAL,
    WAITING,
    action_states,
    assert_history_consistent,
    business_duplicates,
    describe,
    events_of,
    live_leases,
    ownership,
    settle,
    settled,
    wait_expiry,
)
from durable_agents_testkit.chaos.sizes import (
    OUT_ENV,
    SIZE_ENV,
    SIZES,
    TUNE_ENV,
    Size,
    chaos_seed,
    chaos_size,
    output_path,
)
from durable_agents_testkit.chaos.warm import ForkServer, WarmOperator
from durable_agents_testkit.chaos.workloads import (
    DONE,
    READ,
    SETTINGS_CONFIGMAP,
    apply_policy,
    ask,
    await_event,
    pay,
    policy_body,
    run_spec,
)

__all__ = [
    "DONE",
    "EXPIRY_GRACE",
    "IN_PROGRESS",
    "OPERATOR_USER",
    "OUT_ENV",
    "READ",
    "SETTINGS_CONFIGMAP",
    "SIZES",
    "SIZE_ENV",
    "TERMINAL",
    "TUNE_ENV",
    "WAITING",
    "ChaosReport",
    "DuplicateEffects",
    "ForkServer",
    "Lab",
    "Responder",
    "ScenarioResult",
    "Size",
    "WarmOperator",
    "action_states",
    "all_ended",
    "apply_policy",
    "ask",
    "assert_history_consistent",
    "assert_paid_once",
    "await_event",
    "business_duplicates",
    "chaos_seed",
    "chaos_size",
    "conclude",
    "describe",
    "events_of",
    "export_objects",
    "grant_operator_rules",
    "key_of",
    "live_leases",
    "measure",
    "output_path",
    "ownership",
    "pay",
    "pay_key",
    "policy_body",
    "prepare_namespace",
    "record",
    "record_state",
    "restore_objects",
    "retrying",
    "run_spec",
    "runs_in",
    "settle",
    "settled",
    "wait_ended",
    "wait_expiry",
    "wait_no_leases",
]
