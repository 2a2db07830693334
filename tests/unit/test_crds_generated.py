"""The committed CRDs are exactly what the API types generate, and the samples parse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from durable_agents.api import crdgen, spec_policy
from durable_agents.api import v1alpha1 as api

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("directory", ["crds", "charts/durable-agents/crds"])
def test_committed_crds_match_the_api_types(directory: str) -> None:
    generated = crdgen.generate()
    committed = {p.name: p.read_text() for p in (REPO / directory).glob("*.yaml")}
    assert set(committed) == set(generated), f"run `make crds`: the set of files in {directory} drifted"
    for name, text in generated.items():
        assert committed[name] == text, f"{directory}/{name} drifted from the API types: run `make crds`"


def _walk(node: Any, path: str = "") -> list[str]:
    """Paths of every schema node that would make a CRD non-structural."""
    bad: list[str] = []
    if isinstance(node, dict):
        for key in ("$ref", "anyOf", "oneOf", "allOf", "title", "const"):
            if key in node and not path.endswith(".properties"):
                bad.append(f"{path}.{key}")
        if node.get("additionalProperties") is True:
            bad.append(f"{path}.additionalProperties")
        for k, v in node.items():
            bad += _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            bad += _walk(v, f"{path}[{i}]")
    return bad


@pytest.mark.parametrize("kind", crdgen.KINDS, ids=lambda k: k.kind)
def test_schemas_are_structural(kind: crdgen.Kind) -> None:
    crd = kind.crd()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _walk(schema) == []
    # Every string carries a bound, so CEL cost estimation stays within the API server's budget.
    unbounded = [
        p
        for p in _string_paths(schema)
        if p[1].get("maxLength") is None and "enum" not in p[1] and p[1].get("format") != "date-time"
    ]
    assert [p[0] for p in unbounded if "metadata" not in p[0] and p[0].count("kind") == 0] == []


def _string_paths(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if node.get("type") == "string" and path.split(".")[-1] not in ("apiVersion", "kind"):
            out.append((path, node))
        for k, v in node.items():
            out += _string_paths(v, f"{path}.{k}")
    return out


def test_agentrun_has_status_subresource_and_useful_columns() -> None:
    crd = crdgen.KINDS[0].crd()
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["State"] == ".status.state"
    assert columns["Version"] == ".status.stateVersion"
    assert columns["Waiting For"] == ".status.waitingFor"
    assert "ar" in crd["spec"]["names"]["shortNames"]


def test_checkpoint_is_open_but_needs_a_schema_version() -> None:
    status = api.AgentRunStatus.model_json_schema(by_alias=True)
    schema = crdgen.openapi_schema(api.AgentRunStatus)["properties"]["checkpoint"]
    assert "checkpoint" in status["properties"]
    assert schema["x-kubernetes-preserve-unknown-fields"] is True
    assert schema["required"] == ["schemaVersion"]


SAMPLES = sorted((REPO / "config" / "samples").glob("*.yaml"))
MODELS: dict[str, type[api.ApiModel]] = {
    "AgentRun": api.AgentRun,
    "ActionRecord": api.ActionRecord,
    "AgentPolicy": api.AgentPolicy,
    "AgentSchedule": api.AgentSchedule,
}


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_samples_parse_as_api_types(path: Path) -> None:
    # A sample may carry what its run needs (ConfigMaps, RBAC): each of our kinds in it is checked.
    ours = [doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc.get("kind") in MODELS]
    assert ours, f"{path.name} holds none of {sorted(MODELS)}"
    for body in ours:
        wire = MODELS[body["kind"]].model_validate(body).wire()
        # Nothing the sample sets is silently dropped (a typo in a sample would be).
        assert _missing(body["spec"], wire["spec"]) == []


def _missing(given: Any, kept: Any, path: str = "spec") -> list[str]:
    if isinstance(given, dict):
        if not isinstance(kept, dict):
            return [path]
        return [m for k, v in given.items() for m in _missing(v, kept.get(k), f"{path}.{k}")]
    if isinstance(given, list):
        if not isinstance(kept, list) or len(kept) != len(given):
            return [path]
        return [m for i, v in enumerate(given) for m in _missing(v, kept[i], f"{path}[{i}]")]
    return [] if kept == given or str(kept) == str(given) else [path]


def test_committed_spec_policy_matches_the_api_types() -> None:
    committed = (REPO / "charts/durable-agents/files" / spec_policy.POLICY_FILE).read_text()
    assert committed == crdgen.render_policy(), "the AgentRun spec policy drifted: run `make crds`"


def test_every_spec_rule_moved_to_the_policy_and_none_is_lost() -> None:
    """The CRD's spec keeps the rules of ``region`` only; the policy has one validation per other
    rule the API types declare, on CREATE and UPDATE of agentruns (never agentruns/status)."""
    (kind,) = [k for k in crdgen.KINDS if k.spec_rules_in_policy]
    declared = _rules_of(crdgen.openapi_schema(kind.spec))
    stored = _rules_of(kind.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"])
    assert sorted(stored) == ["!has(oldSelf.region) || has(self.region)", "self == oldSelf"]
    policy = yaml.safe_load((REPO / "charts/durable-agents/files" / spec_policy.POLICY_FILE).read_text())
    assert len(policy["validations"]) == len(declared) - len(stored) > 40
    assert policy["matchConstraints"]["resourceRules"][0]["resources"] == ["agentruns"]
    assert policy["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE", "UPDATE"]


def _rules_of(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [r["rule"] for r in node.get("x-kubernetes-validations", [])]
        return own + [
            rule
            for key, child in node.items()
            if key != "x-kubernetes-validations"
            for rule in _rules_of(child)
        ]
    if isinstance(node, list):
        return [rule for child in node for rule in _rules_of(child)]
    return []


def test_creation_rules_read_only_fields_that_cannot_change() -> None:
    """A rule the policy checks on CREATE only is sound only if no update can make it false: every
    spec field it reads can be neither changed nor added nor removed after creation (the CRD's
    transition rules, which stay in the CRD, say so)."""
    (kind,) = [k for k in crdgen.KINDS if k.spec_rules_in_policy]
    schema = crdgen.openapi_schema(kind.spec)
    transition = [
        spec_policy.Located(((("field", name),) if name else ()), rule)
        for name, node in [("", schema), *schema["properties"].items()]
        for rule in node.get("x-kubernetes-validations", [])
        if "oldSelf" in rule["rule"]
    ]
    unchanged = {r.path[0][1] for r in transition if r.path and r.rule["rule"] == "self == oldSelf"}
    present = {
        r.rule["fieldPath"].lstrip(".")
        for r in transition
        if not r.path and "cannot be added or removed" in r.rule["message"]
    }
    assert {"steps", "agent", "agentRef"} <= unchanged & present
    assert list(spec_policy.unguarded_reads(kind.spec_rules(), unchanged & present)) == []


def test_a_creation_rule_becomes_a_guarded_expression_on_the_object() -> None:
    exactly_one = {"rule": "(has(self.a) ? 1 : 0) + (has(self.b) ? 1 : 0) == 1", "message": "m"}
    located = spec_policy.Located((("field", "steps"), ("item", "")), exactly_one)
    assert spec_policy.expression(located) == (
        "request.operation != 'CREATE' || (!has(object.spec.steps) || object.spec.steps.all(x0, "
        "(has(x0.a) ? 1 : 0) + (has(x0.b) ? 1 : 0) == 1))"
    )


def test_a_transition_rule_is_checked_only_when_both_objects_have_the_field() -> None:
    located = spec_policy.Located((("field", "steps"),), {"rule": "self == oldSelf", "message": "m"})
    assert spec_policy.expression(located) == (
        "request.operation != 'UPDATE' || !(has(object.spec) && has(oldObject.spec) && "
        "has(object.spec.steps) && has(oldObject.spec.steps)) || object.spec.steps == oldObject.spec.steps"
    )
    nested = spec_policy.Located(
        (("field", "steps"), ("item", "")), {"rule": "self == oldSelf", "message": "m"}
    )
    with pytest.raises(ValueError, match="under a list"):
        spec_policy.expression(nested)
