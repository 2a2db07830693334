"""What every scenario checks about its runs: waiting for them to end, their effects applied once,
and the verdict (:func:`measure` the global assertions, then :func:`conclude`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.ledger import action_record_name, idempotency_key
from durable_agents.shell.ownership.leases import LeaseRecord
from durable_agents_testkit.chaos.lab import Lab
from durable_agents_testkit.chaos.report import DuplicateEffects
from durable_agents_testkit.chaos.settle import TERMINAL, business_duplicates, events_of, settle
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually


def measure(
    lab: Lab, where: list[tuple[KubeEnv, list[str]]] | None = None, within: Within | float = Within.RUN
) -> None:
    """The two global assertions, measured (not yet asserted) over every run of the scenario."""
    assert lab.refsystem is not None
    where = where if where is not None else [(lab.kube, lab.namespaces)]
    lab.result.stuck = [s for kube, namespaces in where for s in settle(kube, namespaces, within)]
    lab.result.duplicates = lab.refsystem.duplicates()
    lab.result.business_duplicates = business_duplicates(lab.refsystem)


def conclude(lab: Lab) -> None:
    """Assert the global assertions measured by :func:`measure`; the scenario passed."""
    assert lab.refsystem is not None
    result = lab.result
    assert not result.stuck, "runs neither terminal nor in an owned recovery state:\n" + "\n".join(
        result.stuck
    )
    if result.duplicates or result.business_duplicates:
        counts = lab.refsystem.counts()
        raise DuplicateEffects(
            f"idempotency keys applied twice: { {k: counts[k] for k in result.duplicates} }; "
            f"invoices paid twice: {result.business_duplicates}\n{lab.crash_report()}"
        )
    result.passed = True


def runs_in(lab: Lab, namespace: str, names: list[str]) -> list[dict[str, Any]]:
    return [lab.runs(namespace).get(n) for n in names]


def all_ended(lab: Lab, namespace: str, names: list[str], states: frozenset[str] = TERMINAL) -> bool:
    by_name = {r["metadata"]["name"]: r for r in lab.runs(namespace).all()}
    return all((by_name[n].get("status") or {}).get("state") in states for n in names)


def wait_ended(
    lab: Lab,
    namespace: str,
    names: list[str],
    within: Within | float = Within.RUN,
    states: frozenset[str] = TERMINAL,
) -> list[dict[str, Any]]:
    """Wait until every run of ``names`` is in one of ``states``; the runs then."""
    try:
        eventually(
            lambda: all_ended(lab, namespace, names, states),
            within,
            f"{len(names)} runs to end",
            interval=0.25,
        )
    except TimeoutError as err:
        pending = [
            r for r in runs_in(lab, namespace, names) if (r.get("status") or {}).get("state") not in states
        ]
        summary = "\n".join(
            f"{r['metadata']['name']}: {(r.get('status') or {}).get('state')} {events_of(r)[-3:]}"
            for r in pending
        )
        raise AssertionError(f"{err}:\n{summary}\n{lab.crash_report()}") from None
    return runs_in(lab, namespace, names)


def wait_no_leases(lab: Lab, namespace: str, within: Within | float = Within.COMMIT) -> None:
    """Wait until no live per-run Lease is left in ``namespace``: this release makes none, and an
    earlier release's must be released or stop being renewed (that release may leave an expired
    one behind when its reaping races its own renewal; it goes with its run, and nothing heeds it)."""

    def none_live() -> bool:
        now = datetime.now(UTC)
        return all(LeaseRecord.parse(x).expired(now) for x in lab.runs(namespace).leases())

    try:
        eventually(none_live, within, "the run Leases to be released or to expire")
    except TimeoutError as err:
        leases = [
            (x.metadata.name, x.spec.holder_identity, str(x.spec.renew_time), x.spec.lease_transitions)
            for x in lab.runs(namespace).leases()
        ]
        states = {r["metadata"]["name"]: r["status"].get("state") for r in lab.runs(namespace).all()}
        raise AssertionError(f"{err}: {leases}; runs: {states}\n{lab.crash_report()}") from None


def key_of(run: dict[str, Any], step: int, name: str = "pay") -> str:
    """The idempotency key of the run's effect at ``step`` (attempt 0)."""
    return idempotency_key(run["metadata"]["uid"], step, name)


def pay_key(run: dict[str, Any], name: str = "pay") -> str:
    """The idempotency key of the run's payment step (attempt 0)."""
    return key_of(run, [s["name"] for s in run["spec"]["steps"]].index(name), name)


def record(kube: KubeEnv, namespace: str, key: str) -> dict[str, Any]:
    """The ActionRecord of an idempotency key."""
    out: dict[str, Any] = kube.custom().get_namespaced_custom_object(
        GROUP, VERSION, namespace, "actionrecords", action_record_name(key)
    )
    return out


def record_state(kube: KubeEnv, namespace: str, key: str) -> str | None:
    """The ledger state of an idempotency key (None: no record yet)."""
    try:
        return str((record(kube, namespace, key).get("status") or {}).get("state", "intent"))
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def assert_paid_once(lab: Lab, runs: list[dict[str, Any]]) -> None:
    assert lab.refsystem is not None
    counts = lab.refsystem.counts()
    applied = {r["metadata"]["name"]: counts.get(pay_key(r), 0) for r in runs}
    assert set(applied.values()) == {1}, (
        f"each completed run's effect must be applied exactly once: {applied}"
    )
