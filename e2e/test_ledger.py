"""The action ledger end to end: intent, dispatch, reconcile; faults, crashes, RBAC, metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.ledger import action_record_name, idempotency_key
from durable_agents.core.sealed_values import outcome_label
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import unsealed
from durable_agents_testkit.localcluster.controlplane import LocalControlPlane
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule, service_account
from durable_agents_testkit.refsystem import ReferenceSystemThread
from durable_agents_testkit.runs import Runs, assert_history_is_gapless
from durable_agents_testkit.scrape import free_port, metric, scrape

LEASE = 2
EFFECT_EVENTS = ["accepted", "external_awaited", "external_received", "revalidated", "succeeded"]


def http_effect_run(url: str, amount: int = 10) -> dict[str, Any]:
    return {
        "taskType": "payment",
        "objective": "pay once, whatever happens",
        "steps": [
            {
                "name": "pay",
                "effect": {
                    "effect": "http.post",
                    "target": {"url": f"{url}/effects", "queryUrl": f"{url}/effects"},
                    "arguments": {"amount": amount},
                },
            },
            {"name": "done", "complete": {"result": "paid"}},
        ],
    }


def key_of(run: dict[str, Any], step: int = 0, name: str = "pay") -> str:
    return idempotency_key(run["metadata"]["uid"], step, name)


def record_of(runs: Runs, key: str) -> dict[str, Any]:
    out: dict[str, Any] = runs.custom.get_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "actionrecords", action_record_name(key)
    )
    return out


def test_effect_is_applied_once_and_its_outcome_becomes_evidence(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    from datetime import UTC, datetime

    from durable_agents_testkit.audit import AuditEntry, audit_offset, count_by, read_audit

    offset = audit_offset(kube.plane.audit_log_path) if kube.plane is not None else 0
    start_operator("ledger", LEASE)
    started = datetime.now(UTC)
    name = runs.create(http_effect_run(refsystem.url))
    done = runs.wait_state(name, "completed", timeout=60)
    if kube.plane is not None:
        log = kube.plane.audit_log_path
        # Let the last Events and the Lease deletion land, then count the operator's writes.
        eventually(lambda: runs.leases() == [], Within.COMMIT, "the run's Lease to be released")

        found: list[AuditEntry] = []

        def operator_writes() -> list[AuditEntry] | None:
            # A write is logged as its request ends: a moment after a reader can see its effect.
            found[:] = read_audit(log, user="durable-agents-operator", since=started, offset=offset)
            writes = [e for e in found if e.is_write and e.namespace == runs.namespace]
            return writes if count_by(writes)["update agentruns/status"] >= 2 else None

        writes = eventually(operator_writes, Within.COMMIT, "the run's status writes in the audit log")
        finished = datetime.fromisoformat(done["status"]["stateSince"])
        reads = [e for e in found if e.verb == "get" and e.resource == "agentruns" and e.name == name]
        # A finished run under no retention policy is not read to learn that nothing is to be done
        # (retention reads a finished run only when its policy deletes it some time after).
        assert [e.at for e in reads if e.at >= finished] == [], (
            f"the run was read after it finished at {finished}"
        )
        print(f"\nwrites for one run with one effect (5 transitions): {len(writes)} {dict(count_by(writes))}")
        by_kind = count_by(writes)
        # Writes at semantic boundaries: accepted + the intent; the outcome + revalidated + succeeded.
        assert by_kind["update agentruns/status"] == 2, "two status writes for the 5 transitions"
        assert by_kind["create events"] == 0, "nothing a person acts on: no Event"
        assert by_kind["create actionrecords"] == 1
        # Sent under the creating process's first claim: no claim write, only the outcome's.
        assert by_kind["update actionrecords/status"] == 1, "the outcome only"
    history = assert_history_is_gapless(done)
    assert [h["event"] for h in history] == EFFECT_EVENTS
    key = key_of(done)
    assert refsystem.counts() == {key: 1}
    record = record_of(runs, key)
    assert record["status"]["state"] == "succeeded"
    assert record["status"]["attempts"] == 1
    outcome = unsealed(done, record["status"]["outcome"], outcome_label(record["metadata"]["name"]))
    assert outcome["receipt"].startswith("rcpt-")  # sealed in the record, the response as it came
    assert record["spec"]["idempotencyKey"] == key
    cp = done["status"]["checkpoint"]
    assert cp["pendingActions"] == [] if "pendingActions" in cp else True
    evidence = [e for e in cp["evidence"] if e["uri"].startswith("actionrecord://")]
    assert len(evidence) == 1
    assert evidence[0]["contentDigest"].startswith("sha256:")
    assert [c["outcome"] for c in cp["toolCalls"]] == ["succeeded"]


def dispatch_answers(text: str, answer: str) -> int:
    """The operator's dispatches that ended with ``answer``, every effect together."""
    return sum(
        int(float(line.rsplit(" ", 1)[1]))
        for line in text.splitlines()
        if line.startswith("durable_agents_action_dispatches_total{") and f'answer="{answer}"' in line
    )


FAULTS = ["slow", "drop_after_apply", "error_after_apply", "error_before_apply"]


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_matrix_never_applies_twice(
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
    fault: str,
) -> None:
    many = 6
    names = [
        runs.create(http_effect_run(refsystem.url, i), name=f"{fault.replace('_', '-')}-{i}")
        for i in range(many)
    ]
    # One fault per run, bound to its key: the first send of each run meets exactly one, whichever
    # order the dispatches happen in (a shared pool could let one run's resend take another's).
    for name in names:
        refsystem.inject(fault, times=1, delay=2.0, match=key_of(runs.get(name)))
    # A dispatch answer later than 1 s is an unknown outcome (the slow fault answers after 2 s).
    port = free_port()
    start_operator(
        "faults", LEASE, DURABLE_AGENTS_DISPATCH_TIMEOUT="1", DURABLE_AGENTS_METRICS_PORT=str(port)
    )
    done = [runs.wait_state(n, "completed", timeout=90) for n in names]
    counts = refsystem.counts()
    keys = [key_of(run) for run in done]
    assert {k: counts.get(k) for k in keys} == dict.fromkeys(keys, 1), f"{fault}: {counts}"
    duplicates = sum(n - 1 for n in counts.values())
    print(f"\nfault {fault}: {many} runs, {sum(counts.values())} applications, {duplicates} duplicates")
    attempts: list[int] = []
    for run in done:
        record = record_of(runs, key_of(run))
        status = record["status"]
        assert status["state"] == "succeeded"
        assert status["queries"] >= 1, "an ambiguous answer must be reconciled by a query"
        attempts.append(status["attempts"])
        assert "outcomeUnknownSince" in status
    # An ambiguous answer is reconciled by a query, never by a second send: the only attempts beyond
    # the expected are claims given up once expired (a loaded machine can pause the dispatcher past
    # its 3 s claim: it then sends nothing, the claim is given up as "may have been sent", which
    # counts an attempt, the query finds nothing applied, and it claims again), counted by the
    # operator; a claim that lapsed in a paused dispatcher is always given up after. A claim given
    # up while its answer was being written adds no attempt: hence at most one more per give-up.
    text = scrape(port)
    given_up, lapsed = dispatch_answers(text, "ClaimExpired"), dispatch_answers(text, "ClaimLapsed")
    expected = 2 if fault == "error_before_apply" else 1
    assert expected * many <= sum(attempts) <= expected * many + given_up, (attempts, given_up)
    assert lapsed <= given_up, (lapsed, given_up)
    assert refsystem.pending_faults() == [], "every run's first send met its fault"


def test_sigkill_around_every_ledger_write(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    """Writes in order: accepted + the intent (one write, a semantic boundary), record created
    (under the creating process's first claim: no claim write), outcome, received + revalidated +
    succeeded (one write). Kill right before and right after each; a fresh process finishes the
    run (after the first claim expires, by asking the authoritative system first)."""
    writes = 4
    for phase in ("before", "after"):
        for nth in range(1, writes + 1):
            victim = start_operator(
                f"v-{phase}{nth}",
                LEASE,
                DURABLE_AGENTS_TEST_KILL_AT=f"{phase}:{nth}",
                DURABLE_AGENTS_DISPATCH_TIMEOUT="1",
            )
            name = runs.create(http_effect_run(refsystem.url, nth), name=f"crash-{phase}-{nth}")
            victim.wait_killed(120)
            rescuer = start_operator(f"r-{phase}{nth}", LEASE, DURABLE_AGENTS_DISPATCH_TIMEOUT="1")
            done = runs.wait_state(name, "completed", timeout=60)
            rescuer.stop()
            key = key_of(done)
            assert refsystem.counts().get(key) == 1, (
                f"{phase}:{nth}: applied {refsystem.counts().get(key)} times"
            )
            history = assert_history_is_gapless(done)
            assert [h["event"] for h in history] == EFFECT_EVENTS, f"{phase}:{nth}"
    assert refsystem.duplicates() == []


def test_an_intent_already_in_the_ledger_is_a_suppressed_duplicate_and_not_dispatched(
    kube: KubeEnv,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    refsystem: ReferenceSystemThread,
) -> None:
    """The ledger already holds this step's intent, reconciled (say, restored from a backup after
    the effect happened): the run's intent is refused by name, counted, and never dispatched."""
    name = runs.create(http_effect_run(refsystem.url), name="restored")
    run = runs.get(name)  # no operator yet: the run is still pending
    key = key_of(run)
    record = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ActionRecord",
        "metadata": {"name": action_record_name(key)},
        "spec": {
            "idempotencyKey": key,
            "runRef": {"name": name, "uid": run["metadata"]["uid"]},
            "serviceAccountName": "default",
            "stepIndex": 0,
            "effect": "http.post",
            "tier": "consequential",
            "target": run["spec"]["steps"][0]["effect"]["target"],
            "arguments": run["spec"]["steps"][0]["effect"]["arguments"],
        },
    }
    created = runs.custom.create_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "actionrecords", record
    )
    created["status"] = {
        "state": "succeeded",
        "attempts": 1,
        "outcome": {"status": 201, "receipt": "rcpt-restored"},
    }
    runs.custom.replace_namespaced_custom_object_status(
        GROUP, VERSION, runs.namespace, "actionrecords", created["metadata"]["name"], created
    )

    port = free_port()
    start_operator("dup", LEASE, DURABLE_AGENTS_METRICS_PORT=str(port))
    done = runs.wait_state(name, "completed", timeout=60)
    assert refsystem.counts() == {}, "the effect was already done: it must not be dispatched"
    assert metric(scrape(port), "durable_agents_duplicate_suppressions_total") == 1
    evidence = [e for e in done["status"]["checkpoint"]["evidence"] if e["uri"].startswith("actionrecord://")]
    assert len(evidence) == 1


def test_compensation_is_a_new_action_referencing_the_original(
    kube: KubeEnv, start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    writes = rule("", "configmaps", "get", "create", "patch")
    grant(kube, runs.namespace, service_account("default", runs.namespace), writes, name="configmap-writer")
    spec = configmap_apply_run("flag")
    undo = {
        "name": "undo",
        "effect": {
            "effect": "kubernetes.apply",
            "compensates": "apply",
            "arguments": {
                "object": {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "flag"},
                    "data": {"feature": "off"},
                }
            },
        },
    }
    spec["steps"].insert(1, undo)
    start_operator("comp", LEASE)
    done = runs.wait_state(runs.create(spec), "completed", timeout=60)
    uid = done["metadata"]["uid"]
    original = record_of(runs, idempotency_key(uid, 0, "apply"))
    compensation = record_of(runs, idempotency_key(uid, 1, "undo"))
    assert compensation["spec"]["compensates"] == original["metadata"]["name"]
    assert compensation["spec"]["idempotencyKey"] != original["spec"]["idempotencyKey"]
    assert [original["status"]["state"], compensation["status"]["state"]] == ["succeeded", "succeeded"]
    configmap = client.CoreV1Api(kube.api).read_namespaced_config_map("flag", runs.namespace)
    assert configmap.data == {"feature": "off"}


def test_unknown_outcome_duration_is_observable(
    start_operator: Callable[..., OperatorProcess], runs: Runs, refsystem: ReferenceSystemThread
) -> None:
    port = free_port()
    refsystem.inject("error_after_apply", times=1)
    start_operator("metrics", LEASE, DURABLE_AGENTS_METRICS_PORT=str(port))
    done = runs.wait_state(runs.create(http_effect_run(refsystem.url)), "completed", timeout=60)
    status = record_of(runs, key_of(done))["status"]
    assert status["outcomeUnknownSince"] <= status["finishedAt"]
    text = eventually(lambda: scrape(port), Within.MOMENT, "metrics")
    assert metric(text, "durable_agents_unknown_outcome_seconds_count") == 1
    assert metric(text, 'durable_agents_action_dispatches_total{answer="Unknown",effect="http.post"}') == 1
    assert metric(text, 'durable_agents_action_queries_total{answer="Applied",effect="http.post"}') == 1


def configmap_apply_run(cm: str, sa: str = "default") -> dict[str, Any]:
    return {
        "taskType": "config-change",
        "objective": "turn the feature on, once",
        "serviceAccountName": sa,
        "steps": [
            {
                "name": "apply",
                "effect": {
                    "effect": "kubernetes.apply",
                    "arguments": {
                        "object": {
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "metadata": {"name": cm},
                            "data": {"feature": "on"},
                        }
                    },
                },
            },
            {"name": "done", "complete": {"result": "applied"}},
        ],
    }


def applies_of(plane: LocalControlPlane, namespace: str, name: str) -> int:
    """Successful writes to one ConfigMap, from the API server's audit log."""
    from durable_agents_testkit.audit import read_audit

    return sum(
        1
        for e in read_audit(plane.audit_log_path, mentions=namespace)
        if e.namespace == namespace
        and e.resource == "configmaps"
        and e.name == name
        and e.verb in ("patch", "create", "update")
        and e.code in (200, 201)
    )


@pytest.mark.local_plane("audit")
@pytest.mark.parametrize(("phase", "nth"), [("after", 1), ("after", 2), ("before", 3), ("after", 3)])
def test_kubernetes_apply_changes_a_configmap_once_across_crashes(
    kube: KubeEnv,
    plane: LocalControlPlane,
    start_operator: Callable[..., OperatorProcess],
    runs: Runs,
    phase: str,
    nth: int,
) -> None:
    """after:1 intent committed (with accepted, one write); after:2 record created under the
    victim's first claim (its send may be in flight); before:3 applied but the outcome not
    written: recovery must query, not apply again; after:3 the outcome written."""
    writes = rule("", "configmaps", "get", "create", "patch")
    grant(kube, runs.namespace, service_account("default", runs.namespace), writes, name="configmap-writer")
    cm = f"feature-{phase}-{nth}"
    victim = start_operator(
        "v", LEASE, DURABLE_AGENTS_TEST_KILL_AT=f"{phase}:{nth}", DURABLE_AGENTS_DISPATCH_TIMEOUT="1"
    )
    name = runs.create(configmap_apply_run(cm))
    victim.wait_killed(60)
    start_operator("r", LEASE, DURABLE_AGENTS_DISPATCH_TIMEOUT="1")
    done = runs.wait_state(name, "completed", timeout=60)
    record = record_of(runs, idempotency_key(done["metadata"]["uid"], 0, "apply"))
    assert record["status"]["state"] == "succeeded"
    if (phase, nth) == ("before", 3):
        assert record["status"]["queries"] >= 1, "the apply that happened before the crash was recognised"
        assert record["status"]["attempts"] == 1
    configmap = client.CoreV1Api(kube.api).read_namespaced_config_map(cm, runs.namespace)
    assert configmap.data == {"feature": "on"}
    assert (
        configmap.metadata.annotations["durable-agents.io/idempotency-key"]
        == record["spec"]["idempotencyKey"]
    )
    assert applies_of(plane, runs.namespace, cm) == 1


def test_effect_acts_as_the_run_service_account_never_the_operator(
    kube: KubeEnv, start_operator: Callable[..., OperatorProcess], runs: Runs
) -> None:
    # Give the operator's own user write access here: it must still not leak into the effect.
    could_write = rule("", "configmaps", "get", "create", "patch", "update")
    grant(kube, runs.namespace, "durable-agents-operator", could_write, name="operator-could-write")
    writer = service_account("writer", runs.namespace)
    grant(kube, runs.namespace, writer, rule("", "configmaps", "get", "create", "patch"), name="writer")
    start_operator("rbac", LEASE)

    denied = runs.wait_state(runs.create(configmap_apply_run("denied-cm", sa="reader")), "failed", timeout=60)
    assert denied["status"]["outcome"]["reason"] == "ActionFailed"
    message = denied["status"]["outcome"]["message"]
    assert "Forbidden" in message
    assert f"ServiceAccount {runs.namespace}/reader may not apply ConfigMap" in message
    record = record_of(runs, idempotency_key(denied["metadata"]["uid"], 0, "apply"))
    assert (record["status"]["state"], record["status"]["reason"]) == ("failed", "Forbidden")
    assert record["status"]["attempts"] == 1, "a 403 is a definite failure, not retried"
    with pytest.raises(client.ApiException) as err:
        client.CoreV1Api(kube.api).read_namespaced_config_map("denied-cm", runs.namespace)
    assert err.value.status == 404

    allowed = runs.wait_state(
        runs.create(configmap_apply_run("allowed-cm", sa="writer")), "completed", timeout=60
    )
    assert allowed["status"]["outcome"]["result"] == "applied"
    assert client.CoreV1Api(kube.api).read_namespaced_config_map("allowed-cm", runs.namespace).data == {
        "feature": "on"
    }
