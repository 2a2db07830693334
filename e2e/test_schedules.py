"""AgentSchedules: each schedule time started exactly once, with the creator's authority.

Real API server, operators as separate processes with the chart's RBAC, a faster schedule clock
(DURABLE_AGENTS_TEST_SCHEDULE_MINUTE: one schedule minute lasts MINUTE real seconds, the same for
every replica; the product's semantics stay minute-based). The schedule is
config/samples/agentschedule-nightly.yaml's, its cron and policy changed per test. The creator,
carol, holds what starting the run by hand needs; the template's ServiceAccount may create runs
(each run is created as it). Without the webhook the test kit stamps the schedule as the webhook
would (the session's keys); with it, the webhook does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from durable_agents.api.v1alpha1 import (
    GROUP,
    SCHEDULE_NAME_MAX,
    SCHEDULED_AT_ANNOTATION,
    VERSION,
    AgentRunSpec,
    Identity,
)
from durable_agents.core.schedule_authority import stamp_schedule
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.eventually import Within, eventually
from durable_agents_testkit.keys import session_keyring
from durable_agents_testkit.operator_process import OperatorProcess
from durable_agents_testkit.rbac import grant, rule, service_account
from durable_agents_testkit.runs import Runs
from durable_agents_testkit.scrape import free_port

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "config/samples/agentschedule-nightly.yaml"
MINUTE = 12  # real seconds per schedule minute: longer than a takeover (lease 3 s) on a loaded machine
CAROL = Identity(username="carol", groups=["team-reports"])
ASKING = {
    "taskType": "nightly-report",
    "objective": "ask, then finish",
    "steps": [{"name": "confirm", "ask": {"question": "go on?"}}, {"name": "done", "complete": {}}],
}


def sample(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    body["spec"] = {**body["spec"], **spec}
    return body


@pytest.fixture
def creator(kube: KubeEnv, namespace: str, readable_configmap: str) -> client.ApiClient:
    """carol may create runs and schedules and use the ServiceAccount default; default may create
    runs (each scheduled run is created as it) and read the sample's ConfigMap."""
    rules = [
        rule(GROUP, ["agentruns", "agentschedules"], "get", "list", "create", "patch"),
        rule("", "serviceaccounts", "use", names=["default"]),
    ]
    grant(kube, namespace, "carol", rules)
    grant(
        kube,
        namespace,
        service_account("default", namespace),
        rule(GROUP, "agentruns", "create"),
        name="sa-runs",
    )
    del readable_configmap  # the sample's read step reads it as default
    return kube.user_client("carol", list(CAROL.groups))


def create_stamped(runs: Runs, body: dict[str, Any], name: str, who: Identity = CAROL) -> None:
    """Create the schedule with createdBy stamped for ``who``, as the webhook would."""
    body = {**body, "metadata": {"name": name, "namespace": runs.namespace}}
    template = AgentRunSpec.model_validate(body["spec"]["runTemplate"])
    created_by = stamp_schedule(session_keyring(), runs.namespace, name, who, datetime.now(UTC), template)
    body["spec"] = {**body["spec"], "createdBy": created_by}
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentschedules", body)


def schedule(runs: Runs, name: str) -> dict[str, Any]:
    found: dict[str, Any] = runs.custom.get_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentschedules", name
    )
    return found


def condition(runs: Runs, name: str, kind: str) -> dict[str, Any] | None:
    conditions = (schedule(runs, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def started(runs: Runs, name: str) -> dict[str, dict[str, Any]]:
    """The runs of schedule ``name``, by their schedule time."""
    return {
        r["metadata"]["annotations"][SCHEDULED_AT_ANNOTATION]: r
        for r in runs.all()
        if r["metadata"]["name"].startswith(f"{name}-")
    }


def run_names(runs: Runs, name: str) -> list[str]:
    return [r["metadata"]["name"] for r in started(runs, name).values()]


def minutes(times: list[str]) -> list[int]:
    return sorted(int(datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()) // 60 for t in times)


def real_time_of(schedule_time: str) -> float:
    """When (time.time()) a schedule time comes under the test clock."""
    return datetime.fromisoformat(schedule_time.replace("Z", "+00:00")).timestamp() * MINUTE / 60


def fast(start: Callable[..., OperatorProcess], name: str, **env: str) -> OperatorProcess:
    return start(name, 3, DURABLE_AGENTS_TEST_SCHEDULE_MINUTE=str(MINUTE), **env)


def test_two_replicas_and_one_killed_at_the_slot_time_start_each_time_exactly_once(
    start_operator: Callable[..., OperatorProcess], runs: Runs, creator: client.ApiClient
) -> None:
    del creator
    replicas = {name: fast(start_operator, name) for name in ("a", "b")}
    body = sample(
        schedule="* * * * *", timeZone="UTC", concurrencyPolicy="Allow", successfulRunsHistoryLimit=100
    )
    del body["spec"]["startingDeadlineSeconds"]  # a time started late after the kill still counts
    create_stamped(runs, body, "every-minute")
    first = eventually(lambda: started(runs, "every-minute"), Within.TAKEOVER, "the first run")
    assert len(first) == 1
    # The replica that owns the schedule is the one that said it started a run: kill it at the
    # next schedule time.
    owner = eventually(  # its log line follows the creation the test saw
        lambda: next((n for n, op in replicas.items() if op.logged("started every-minute-")), None),
        Within.MOMENT,
        "the replica that started the first run to say so",
    )
    next_time = eventually(
        lambda: (schedule(runs, "every-minute").get("status") or {}).get("nextScheduleTime"),
        Within.COMMIT,
        "the next schedule time",
    )
    time.sleep(max(0.0, real_time_of(next_time) - time.time()))  # the slot time itself, not a fixed pause
    replicas[owner].kill()
    survivor = next(op for n, op in replicas.items() if n != owner)
    wanted = len(first) + 3
    runs_by_time = eventually(
        lambda: (found := started(runs, "every-minute")) and len(found) >= wanted and found,
        Within.TAKEOVER + 3 * MINUTE,
        f"{wanted} schedule times started across the kill",
    )
    got = minutes(list(runs_by_time))
    assert got == list(range(got[0], got[0] + len(got))), f"each minute exactly once, none lost: {got}"
    assert survivor.logged("started every-minute-")
    for run in runs_by_time.values():  # each run is carol's: its stamp verified, it completed
        assert run["spec"]["createdBy"]["username"] == "carol"
        assert run["metadata"]["ownerReferences"][0]["kind"] == "AgentSchedule"
    some = sorted(runs_by_time)[0]
    assert (
        runs.wait_state(runs_by_time[some]["metadata"]["name"], "completed")["status"]["outcome"]["result"]
        == "reported"
    )
    eventually(
        lambda: (schedule(runs, "every-minute").get("status") or {}).get("lastSuccessfulTime"),
        Within.COMMIT,
        "the schedule's lastSuccessfulTime",
    )


def test_forbid_skips_while_one_runs_and_a_time_past_its_deadline_is_not_started(
    start_operator: Callable[..., OperatorProcess], runs: Runs, creator: client.ApiClient
) -> None:
    del creator
    fast(start_operator, "op")
    create_stamped(
        runs, sample(schedule="* * * * *", concurrencyPolicy="Forbid", runTemplate=ASKING), "forbid"
    )
    first = eventually(lambda: started(runs, "forbid"), Within.TAKEOVER, "the first run")
    (only,) = [r["metadata"]["name"] for r in first.values()]
    runs.wait_state(only, "waiting_input")
    skipped = eventually(
        lambda: (c := condition(runs, "forbid", "Skipped")) and c["reason"] == "Forbidden" and c,
        Within.COMMIT + MINUTE,
        "the next time skipped under Forbid",
    )
    assert only in skipped["message"]
    assert list(started(runs, "forbid")) == list(first), "nothing else started while it runs"
    # A deadline of 20 schedule seconds (4 real): a suspended schedule resumed 30 s after a time
    # misses it, and starts the next.
    body = sample(schedule="* * * * *", suspend=True, startingDeadlineSeconds=20)
    create_stamped(runs, body, "late")
    suspended = eventually(
        lambda: (c := condition(runs, "late", "Skipped")) and c["reason"] == "Suspended" and c,
        Within.COMMIT + MINUTE,
        "a time passing while suspended",
    )
    missed_time = suspended["message"].split(": ")[0]
    time.sleep(max(0.0, real_time_of(missed_time) + MINUTE / 2 - time.time()))  # 30 schedule seconds late
    runs.custom.patch_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentschedules", "late", {"spec": {"suspend": False}}
    )
    missed = eventually(
        lambda: (c := condition(runs, "late", "Skipped")) and c["reason"] == "MissedDeadline" and c,
        Within.COMMIT,
        "the time past its deadline reported missed",
    )
    assert missed["message"].startswith(missed_time)
    later = eventually(lambda: started(runs, "late"), Within.COMMIT + MINUTE, "the next time started")
    assert missed_time not in later, "the missed time was never started"


def test_an_unstamped_forged_or_no_longer_allowed_schedule_starts_nothing(
    start_operator: Callable[..., OperatorProcess], runs: Runs, creator: client.ApiClient
) -> None:
    del creator
    op = fast(start_operator, "op")
    unstamped = {**sample(schedule="* * * * *"), "metadata": {"name": "unstamped"}}
    runs.custom.create_namespaced_custom_object(GROUP, VERSION, runs.namespace, "agentschedules", unstamped)
    forged = sample(schedule="* * * * *")
    forged["spec"]["createdBy"] = {
        "username": "cluster-admin",
        "stampedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "stamp": "test-key-1:" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUE=",
    }
    runs.custom.create_namespaced_custom_object(
        GROUP, VERSION, runs.namespace, "agentschedules", {**forged, "metadata": {"name": "forged"}}
    )
    # Stamped, but for dave, who may not create runs (say, his rights were revoked since): the
    # operator asks the API server again before each start.
    create_stamped(runs, sample(schedule="* * * * *"), "daves", Identity(username="dave"))
    expected = (("unstamped", "Unstamped"), ("forged", "StampInvalid"), ("daves", "CreatorNotAllowed"))
    for name, reason in expected:
        ready = eventually(  # the rights are asked at a schedule time: within a minute
            lambda n=name: (c := condition(runs, n, "Ready")) and c["status"] == "False" and c,
            Within.COMMIT + MINUTE,
            f"{name}'s Ready condition to say why nothing starts",
        )
        assert (ready["status"], ready["reason"]) == ("False", reason), ready
        assert "starts no run" in ready["message"]
    assert op.alive
    deadline = time.time() + 1.5 * MINUTE
    while time.time() < deadline:  # a whole schedule minute passes: still no run
        assert not started(runs, "unstamped")
        assert not started(runs, "forged")
        assert not started(runs, "daves")
        time.sleep(1)


def refused(call: Callable[[], Any]) -> tuple[int, str]:
    with pytest.raises(client.ApiException) as err:
        call()
    body = err.value.body
    return int(err.value.status), str(
        json.loads(body).get("message", body) if isinstance(body, str) else body
    )


@pytest.mark.local_plane("users", "webhook")
def test_with_the_webhook_bad_schedules_are_refused_naming_the_field_and_runs_are_the_creators(
    kube: KubeEnv, start_operator: Callable[..., OperatorProcess], runs: Runs, creator: client.ApiClient
) -> None:
    op = fast(start_operator, "webhook", DURABLE_AGENTS_WEBHOOK_PORT=str(free_port()))
    eventually(lambda: op.logged("admission webhook serving"), Within.COMMIT, "the admission webhook")
    as_carol = client.CustomObjectsApi(creator)

    def create(name: str, **spec: Any) -> Any:
        body = {**sample(**spec), "metadata": {"name": name}}
        return as_carol.create_namespaced_custom_object(
            GROUP, VERSION, runs.namespace, "agentschedules", body
        )

    for name, spec, field in (
        ("bad-cron", {"schedule": "61 * * * *"}, "spec.schedule"),
        ("seconds", {"schedule": "* * * * * *"}, "spec.schedule"),
        ("bad-zone", {"timeZone": "Mars/Olympus_Mons"}, "spec.timeZone"),
        ("x" * (SCHEDULE_NAME_MAX + 1), {}, "metadata.name"),
    ):
        status, message = refused(lambda name=name, spec=spec: create(name, **spec))
        assert status == 422, (status, message)
        assert field in message, message
    template = {**sample()["spec"]["runTemplate"], "serviceAccountName": "deployer"}
    status, message = refused(lambda: create("as-deployer", runTemplate=template))
    assert status == 403, message
    assert "may not use serviceaccounts/deployer" in message, message

    made = create("nightly", schedule="* * * * *")
    assert made["spec"]["createdBy"]["username"] == "carol"
    assert made["spec"]["createdBy"]["stamp"]
    first = eventually(lambda: started(runs, "nightly"), Within.TAKEOVER, "a run of carol's schedule")
    (run,) = first.values()
    assert run["spec"]["createdBy"]["username"] == "carol", "created as default, stamped as carol's"
    runs.wait_state(run["metadata"]["name"], "completed")
    status, message = refused(
        lambda: as_carol.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            runs.namespace,
            "agentschedules",
            "nightly",
            {"spec": {"runTemplate": {"objective": "x"}}},
        )
    )
    assert status == 422, message
    assert "runTemplate is immutable" in message, message


def test_replace_cancels_the_running_run_and_the_history_limit_deletes_the_oldest(
    start_operator: Callable[..., OperatorProcess], runs: Runs, creator: client.ApiClient
) -> None:
    del creator
    fast(start_operator, "op")
    body = sample(
        schedule="* * * * *", concurrencyPolicy="Replace", runTemplate=ASKING, failedRunsHistoryLimit=1
    )
    create_stamped(runs, body, "replace")
    names: list[str] = []
    for count in (1, 2, 3):  # each time replaces the run before it
        eventually(
            lambda count=count: len(set(run_names(runs, "replace")) | set(names)) >= count,
            Within.COMMIT + MINUTE,
            f"run {count} of the schedule",
        )
        (new,) = [name for name in run_names(runs, "replace") if name not in names]
        runs.wait_state(new, "waiting_input")
        if names:
            canceled = runs.wait_state(names[-1], "canceled")
            assert "schedule-replace" in canceled["spec"]["cancellations"], (
                "through the run's own cancellation"
            )
        names.append(new)
    eventually(
        lambda: names[0] not in {r["metadata"]["name"] for r in runs.all()},
        Within.COMMIT,
        "the oldest canceled run deleted (failedRunsHistoryLimit 1)",
    )
    left = {r["metadata"]["name"] for r in runs.all()}
    assert {names[1], names[2]} <= left, "the newest canceled run is kept, the running one too"
