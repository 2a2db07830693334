"""RegionFailover without an API server: its stamp (what it covers, what breaks it), what the
admission webhook stamps and registers for it, its status's bounded lists, its CRD, and how
``kubectl agentrun region failover`` reports a finished failover (the real API server: e2e)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from durable_agents.api import crdgen
from durable_agents.api.v1alpha1 import (
    FAILOVER_LIST_LIMIT,
    REGION_MAX_LENGTH,
    AdoptedRun,
    CancelRequest,
    FailoverPhase,
    Identity,
    NotAdoptedRun,
    RegionFailover,
    RegionFailoverSpec,
    RegionFailoverStatus,
    UnknownOutcome,
)
from durable_agents.core.authority import (
    failover_proof,
    failover_unproven,
    failover_verifies,
    stamp_cancellation,
    stamp_failover,
)
from durable_agents.core.regions import MAX_REGION_LENGTH
from durable_agents.core.sealing import Keyring
from durable_agents.kubectl import region as kubectl_region
from durable_agents.shell.admission.failover import failover_denied, failover_stamps
from durable_agents.shell.admission.registration import webhook_configurations

pytestmark = pytest.mark.unit

KEYS = Keyring(keys={"k1": bytes(range(32))}, active_key_id="k1")
OTHER_KEYS = Keyring(keys={"k1": bytes(range(1, 33))}, active_key_id="k1")
ROTATED = Keyring(keys={"k1": bytes(range(32)), "k2": bytes(range(2, 34))}, active_key_id="k2")
FIONA = Identity(username="fiona", groups=["sre", "system:authenticated"], uid="u-7")
WHEN = datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
NAME = "failover-eu-to-us-x7k2p"


def asked(**changes: Any) -> RegionFailoverSpec:
    spec = RegionFailoverSpec(
        from_region="eu", to="us", reason="eu is down", requested_by=FIONA, requested_at=WHEN
    )
    return spec.model_copy(update=changes)


def stamped(keyring: Keyring = KEYS, name: str = NAME, **changes: Any) -> RegionFailoverSpec:
    spec = asked()
    return spec.model_copy(update={"stamp": stamp_failover(keyring, name, spec), **changes})


def stored(spec: RegionFailoverSpec) -> RegionFailoverSpec:
    """What the operator reads back: the JSON the API server stored, parsed again."""
    return RegionFailoverSpec.model_validate(json.loads(json.dumps(spec.wire())))


# --- the stamp -------------------------------------------------------------------------------


def test_a_stamped_failover_verifies_after_the_api_server_stored_it() -> None:
    spec = stored(stamped())
    assert spec.wire()["from"] == "eu"  # the wire name of from_region
    assert failover_verifies(KEYS, NAME, spec)
    assert failover_unproven(KEYS, NAME, spec) is None


@pytest.mark.parametrize(
    "changes",
    [
        {"from_region": "ap"},
        {"to": "ap"},
        {"reason": "another reason"},
        {"reason": None},
        {"requested_by": Identity(username="mallory", groups=FIONA.groups, uid=FIONA.uid)},
        {"requested_by": FIONA.model_copy(update={"groups": ["system:masters"]})},
        {"requested_at": WHEN + timedelta(microseconds=1)},
    ],
    ids=lambda c: next(iter(c)),
)
def test_a_change_to_any_covered_field_breaks_the_stamp(changes: dict[str, Any]) -> None:
    spec = stored(stamped(**changes))
    assert not failover_verifies(KEYS, NAME, spec)
    problem = failover_unproven(KEYS, NAME, spec)
    assert problem is not None
    assert problem.reason == "StampInvalid"


def test_a_stamp_made_for_another_name_does_not_verify() -> None:
    spec = stored(stamped(name="failover-eu-to-us-aaaaa"))
    assert failover_verifies(KEYS, "failover-eu-to-us-aaaaa", spec)
    assert not failover_verifies(KEYS, NAME, spec)


def test_no_keyring_no_stamp_or_another_keyring_never_verifies() -> None:
    spec = stored(stamped())
    assert not failover_verifies(None, NAME, spec)
    no_keyring = failover_unproven(None, NAME, spec)
    assert no_keyring is not None
    assert no_keyring.reason == "NoKeyring"
    assert not failover_verifies(OTHER_KEYS, NAME, spec)
    unstamped = failover_unproven(KEYS, NAME, spec.model_copy(update={"stamp": None}))
    assert unstamped is not None
    assert unstamped.reason == "Unstamped"
    assert not failover_verifies(KEYS, NAME, asked(requested_by=None, stamp=spec.stamp))


def test_the_stamp_rotates_with_the_keyring() -> None:
    old = stored(stamped())
    assert failover_verifies(ROTATED, NAME, old)  # an old key still in the keyring verifies
    assert stamped(ROTATED).stamp is not None
    assert str(stamped(ROTATED).stamp).startswith("k2:")


def test_a_runs_control_stamp_is_never_a_failover_stamp() -> None:
    """Cancellations share the purpose (CONTROL): the payloads differ by construction."""
    request = CancelRequest(reason="eu is down", requested_by=FIONA, requested_at=WHEN)
    cancel_stamp = stamp_cancellation(KEYS, NAME, "eu", request)
    assert not failover_verifies(KEYS, NAME, asked(stamp=cancel_stamp))
    proof = failover_proof(NAME, asked())
    assert proof is not None
    assert proof["kind"] == "RegionFailover"


def test_nothing_is_stamped_without_who_asked_and_when() -> None:
    with pytest.raises(ValueError, match="names nobody"):
        stamp_failover(KEYS, NAME, asked(requested_by=None))
    with pytest.raises(ValueError, match="names nobody"):
        stamp_failover(KEYS, NAME, asked(requested_at=None))


# --- what the admission webhook stamps and registers -------------------------------------------------


def merged(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """What kopf makes of the webhook's patch of ``spec``: a merge (None removes a key)."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def request(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": NAME}, "spec": {"from": "eu", "to": "us", **spec}}


def test_the_webhook_overwrites_who_asked_and_when_and_stamps_it() -> None:
    forged = {"username": "mallory", "groups": ["system:masters"], "uid": "forged-uid"}
    new = request(
        reason="eu is down", requestedBy=forged, requestedAt="2020-01-01T00:00:00Z", stamp="k1:AAAA"
    )
    spec = RegionFailoverSpec.model_validate(
        merged(new["spec"], failover_stamps("CREATE", new, FIONA, WHEN, KEYS))
    )
    assert spec.requested_by == FIONA  # the client's uid and groups did not survive the merge
    assert spec.requested_at == WHEN
    assert failover_verifies(KEYS, NAME, stored(spec))

    anonymous = Identity(username="system:anonymous")  # no uid: a client's uid is removed
    spec = RegionFailoverSpec.model_validate(
        merged(new["spec"], failover_stamps("CREATE", new, anonymous, WHEN, KEYS))
    )
    assert spec.requested_by == anonymous
    assert spec.requested_by is not None
    assert spec.requested_by.uid is None


def test_the_webhook_stamps_nothing_on_update_and_removes_a_stamp_it_cannot_make() -> None:
    assert failover_stamps("UPDATE", request(), FIONA, WHEN, KEYS) == {}
    invalid = request(to="US_EAST", stamp="k1:AAAA")  # the schema refuses it after the webhook
    patch = failover_stamps("CREATE", invalid, FIONA, WHEN, KEYS)
    assert "stamp" not in merged(invalid["spec"], patch)


def test_the_refusal_names_the_verb_the_resource_and_how_to_grant_it() -> None:
    message = failover_denied(FIONA, "eu")
    for part in ("'fiona'", "'failover'", "'regions'", "'durable-agents.io'", "resourceNames: [eu]"):
        assert part in message
    assert "ClusterRoleBinding" in message


@pytest.mark.parametrize(("namespace", "policy"), [(None, "Fail"), ("team-a", "Ignore")])
def test_the_webhook_configurations_cover_region_failovers(namespace: str | None, policy: str) -> None:
    mutating, validating = webhook_configurations(
        name="durable-agents", url="https://127.0.0.1:9443", ca_pem=b"ca", namespace=namespace
    )
    for configuration, path in ((mutating, "stamp-failover"), (validating, "check-failover")):
        hooks = [h for h in configuration["webhooks"] if h["rules"][0]["resources"] == ["regionfailovers"]]
        assert len(hooks) == 1
        hook = hooks[0]
        assert hook["clientConfig"]["url"] == f"https://127.0.0.1:9443/{path}"
        assert hook["rules"][0]["scope"] == "Cluster"
        assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
        # Only a cluster-wide operator fails closed: a namespaced one's leftover configuration
        # would otherwise refuse every failover of the cluster once it is gone.
        assert hook["failurePolicy"] == policy
        names = [h["name"] for h in configuration["webhooks"]]
        assert len(set(names)) == len(names)
        agentruns = [h for h in configuration["webhooks"] if h["rules"][0]["resources"] == ["agentruns"]]
        assert [h["failurePolicy"] for h in agentruns] == ["Fail"]


# --- the API type and its CRD ------------------------------------------------------------------------


def test_region_names_are_bounded_as_the_core_bounds_them() -> None:
    assert REGION_MAX_LENGTH == MAX_REGION_LENGTH
    RegionFailoverSpec(from_region="a" * MAX_REGION_LENGTH, to="b")
    with pytest.raises(ValueError, match="at most 63"):
        RegionFailoverSpec(from_region="a" * (MAX_REGION_LENGTH + 1), to="b")
    with pytest.raises(ValueError, match="pattern"):
        RegionFailoverSpec(from_region="EU", to="us")


def test_the_crd_is_cluster_scoped_with_its_names_columns_and_rules() -> None:
    kind = next(k for k in crdgen.KINDS if k.kind == "RegionFailover")
    crd = kind.crd()
    assert crd["metadata"]["name"] == "regionfailovers.durable-agents.io"
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["shortNames"] == ["rfo"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["From"] == ".spec.from"
    assert columns["To"] == ".spec.to"
    assert columns["Phase"] == ".status.phase"
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["from", "to"]
    assert [r["rule"] for r in spec["x-kubernetes-validations"]] == [
        "self.from != self.to",
        "self == oldSelf",
    ]


def test_fitted_lists_are_cut_at_the_limit_and_the_rest_counted() -> None:
    many = [AdoptedRun(namespace="ns", name=f"r{i}", epoch=3) for i in range(FAILOVER_LIST_LIMIT + 5)]
    left = [NotAdoptedRun(namespace="ns", name="x", reason="in flight")] * 2
    status = RegionFailoverStatus.fitted(
        adopted=many, not_adopted=left, phase=FailoverPhase.COMPLETED, epoch=3, truncated=1
    )
    assert len(status.adopted) == FAILOVER_LIST_LIMIT
    assert status.adopted[-1].name == f"r{FAILOVER_LIST_LIMIT - 1}"
    assert len(status.not_adopted) == 2
    assert status.truncated == 6
    assert status.finished
    # What fits the Python model fits the CRD: the status round-trips as the API server stores it.
    wire = RegionFailoverStatus.model_validate(json.loads(json.dumps(status.wire())))
    assert wire == status
    with pytest.raises(ValueError, match="at most 1000"):
        RegionFailoverStatus(adopted=many)
    assert not RegionFailoverStatus(phase=FailoverPhase.VERIFYING).finished


# --- the CLI's report ----------------------------------------------------------------------------------


def finished(status: RegionFailoverStatus) -> dict[str, Any]:
    body = RegionFailover(metadata={"name": NAME}, spec=asked(), status=status).wire()
    return body


def test_the_name_is_made_like_generate_name_and_always_valid() -> None:
    name = kubectl_region.failover_name("eu", "us")
    assert name.startswith("failover-eu-to-us-")
    assert len(name) == len("failover-eu-to-us-") + 5
    longest = kubectl_region.failover_name("a" * MAX_REGION_LENGTH, "b" * MAX_REGION_LENGTH)
    assert len(longest) <= 253
    body = kubectl_region.failover_body(name, "eu", "us", None)
    assert body["spec"] == {"from": "eu", "to": "us"}
    assert RegionFailover.model_validate(body).spec.from_region == "eu"


def test_a_completed_failover_with_every_run_adopted_exits_0() -> None:
    status = RegionFailoverStatus(
        phase=FailoverPhase.COMPLETED,
        message="adopted 2 runs",
        epoch=4,
        adopted=[AdoptedRun(namespace="team-a", name="rollout", epoch=4)] * 2,
        unknown_outcomes=[
            UnknownOutcome(namespace="team-a", run="rollout", action="rollout-pay-1", since=WHEN)
        ],
    )
    text, code = kubectl_region.report(finished(status))
    assert code == 0
    assert f"regionfailover.durable-agents.io/{NAME}: Completed under region epoch 4: adopted 2 runs" in text
    assert "Adopted (2):" in text
    assert "Unknown outcomes (1)" in text
    assert "rollout-pay-1" in text
    assert "Not adopted" not in text


def test_runs_left_behind_exit_2_and_a_refusal_exits_1() -> None:
    status = RegionFailoverStatus.fitted(
        phase=FailoverPhase.COMPLETED,
        adopted=[AdoptedRun(namespace="team-a", name="a", epoch=4)],
        not_adopted=[NotAdoptedRun(namespace="team-b", name="b", reason="a dispatch is in flight")],
    )
    text, code = kubectl_region.report(finished(status))
    assert code == kubectl_region.LEFT_BEHIND == 2
    lines = text.splitlines()
    header = lines.index("Not adopted (1): they stay in their region")
    assert lines[header + 1].split() == ["NAMESPACE", "NAME", "REASON"]
    assert lines[header + 2].split(maxsplit=2) == ["team-b", "b", "a dispatch is in flight"]

    refused = RegionFailoverStatus(phase=FailoverPhase.REFUSED, message="the stamp does not verify")
    text, code = kubectl_region.report(finished(refused))
    assert code == 1
    assert "Refused: the stamp does not verify" in text
