"""Generates the CustomResourceDefinitions under ``crds/`` from the pydantic API types.

pydantic emits JSON Schema; Kubernetes wants a *structural* OpenAPI v3 schema: no ``$ref``, no
``anyOf`` for optional fields, no ``additionalProperties: true`` (open objects use
``x-kubernetes-preserve-unknown-fields``), no ``title``. This module does that translation and
adds what only a CRD has: scope, names, printer columns, the status subresource.

Run ``make crds`` (it writes ``crds/`` and the Helm chart's ``crds/``); a test fails on drift.
"""

from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from durable_agents.api import spec_policy
from durable_agents.api import v1alpha1 as api

JsonSchema = dict[str, Any]

_DROP = {"title"}


def tidy(text: str) -> str:
    """A docstring as a schema description: lines of a paragraph joined, ``code`` as `code`."""
    paragraphs = re.split(r"\n\s*\n", inspect.cleandoc(text))
    joined = "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())
    return joined.replace("``", "`")


def _resolve(node: Any, defs: dict[str, JsonSchema]) -> Any:
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**_resolve(target, defs), **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    return {k: _resolve(v, defs) for k, v in node.items() if k != "$defs"}


def _structural(node: JsonSchema) -> JsonSchema:
    """Rewrite one resolved JSON-Schema node into a structural OpenAPI node."""
    node = {k: v for k, v in node.items() if k not in _DROP}
    if isinstance(node.get("description"), str):
        node["description"] = tidy(node["description"])
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        # Optional[X] is anyOf [X, null]: the field is simply optional (we never serialize None).
        non_null = [s for s in any_of if s.get("type") != "null"]
        if len(non_null) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {any_of}")
        inner = _structural(non_null[0])
        rules = inner.pop("x-kubernetes-validations", []) + node.pop("x-kubernetes-validations", [])
        node = {**inner, **node}
        if rules:
            node["x-kubernetes-validations"] = rules
        if node.get("default", 0) is None:
            del node["default"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("x-kubernetes-preserve-unknown-fields"):
        node["type"] = "object"
        node.pop("additionalProperties", None)
    if "properties" in node:
        node["properties"] = {k: _structural(v) for k, v in node["properties"].items()}
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _structural(node["additionalProperties"])
    elif node.get("additionalProperties") is True:
        del node["additionalProperties"]
        node["x-kubernetes-preserve-unknown-fields"] = True
    if "items" in node:
        node["items"] = _structural(node["items"])
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    return node


def openapi_schema(model: type[BaseModel]) -> JsonSchema:
    """Structural OpenAPI v3 schema of a pydantic model, as the API server stores it."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(_resolve(raw, raw.get("$defs", {})))


@dataclass(frozen=True)
class Column:
    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0

    def render(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            out["description"] = self.description
        if self.priority:
            out["priority"] = self.priority
        return out


# What every Kubernetes object has, worded as the built-in kinds' schemas word it.
_STANDARD = {
    "apiVersion": "The versioned schema of this representation of an object: durable-agents.io/v1alpha1.",
    "kind": "The REST resource this object represents.",
}
# The API server refuses a CRD whose schema says more of metadata than its type (a description too):
# metadata is the same in every kind, and kubectl explain describes it from the built-in types.


@dataclass(frozen=True)
class Kind:
    kind: str
    plural: str
    short_names: tuple[str, ...]
    model: type[BaseModel]
    spec: type[BaseModel]
    status: type[BaseModel] | None
    columns: tuple[Column, ...] = ()
    scope: str = "Namespaced"
    categories: tuple[str, ...] = ("durable-agents",)
    extra_rules: list[dict[str, Any]] = field(default_factory=list)
    spec_rules_in_policy: bool = False
    """The spec's CEL rules go to a ValidatingAdmissionPolicy, not the CRD (:mod:`.spec_policy`)."""

    @property
    def singular(self) -> str:
        return self.kind.lower()

    def spec_rules(self) -> list[spec_policy.Located]:
        """The spec's CEL rules the policy carries (none unless ``spec_rules_in_policy``)."""
        return spec_policy.split_rules(openapi_schema(self.spec))[1] if self.spec_rules_in_policy else []

    def crd(self, *, documented: bool = False) -> dict[str, Any]:
        """The CRD; ``documented``: with every rule where the API types declare it (the reference)."""
        spec = openapi_schema(self.spec)
        if self.spec_rules_in_policy and not documented:
            spec = spec_policy.split_rules(spec)[0]
        properties: dict[str, Any] = {
            "apiVersion": {"type": "string", "description": _STANDARD["apiVersion"]},
            "kind": {"type": "string", "description": _STANDARD["kind"]},
            "metadata": {"type": "object"},
            "spec": spec,
        }
        version: dict[str, Any] = {
            "name": api.VERSION,
            "served": True,
            "storage": True,
            "schema": {
                "openAPIV3Schema": {
                    "description": tidy(self.model.__doc__ or ""),
                    "type": "object",
                    "required": ["spec"],
                    "properties": properties,
                }
            },
        }
        if self.status is not None:
            properties["status"] = openapi_schema(self.status)
            version["subresources"] = {"status": {}}
        if self.extra_rules:  # rules that need both spec and status: on the object itself
            version["schema"]["openAPIV3Schema"]["x-kubernetes-validations"] = list(self.extra_rules)
        if self.columns:
            version["additionalPrinterColumns"] = [c.render() for c in self.columns]
        return {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{self.plural}.{api.GROUP}"},
            "spec": {
                "group": api.GROUP,
                "scope": self.scope,
                "names": {
                    "kind": self.kind,
                    "listKind": f"{self.kind}List",
                    "plural": self.plural,
                    "singular": self.singular,
                    "shortNames": list(self.short_names),
                    "categories": list(self.categories),
                },
                "versions": [version],
            },
        }


KINDS: tuple[Kind, ...] = (
    Kind(
        kind="AgentRun",
        model=api.AgentRun,
        plural="agentruns",
        short_names=("ar", "arun"),
        spec=api.AgentRunSpec,
        status=api.AgentRunStatus,
        spec_rules_in_policy=True,
        columns=(
            Column("State", ".status.state", description="Position in the run state machine"),
            Column("Version", ".status.stateVersion", "integer", "Committed transitions"),
            Column("Waiting For", ".status.waitingFor", description="What a waiting run needs"),
            Column("In State", ".status.stateSince", "date", "Time in the current state"),
            Column("Outcome", ".status.outcome.reason", description="Terminal outcome"),
            Column(
                "Policy",
                ".status.checkpoint.policy.name",
                description="The policy resolved at acceptance (none: read-only work only)",
            ),
            Column("Policy Version", ".status.checkpoint.policy.version", priority=1),
            Column("Agent", ".spec.agentRef", description="The Agent the run is a run of"),
            Column(
                "Pinned",
                ".status.checkpoint.definition.digest",
                description="The digest of the definition the run pinned at acceptance",
                priority=1,
            ),
            Column("Task", ".spec.taskType", priority=1),
            Column("Region", ".spec.region", description="Home region (the deployment serving it)"),
            Column(
                "Owner",
                ".status.ownership.region",
                description="Owning region (after a failover)",
                priority=1,
            ),
            Column("Age", ".metadata.creationTimestamp", "date"),
        ),
    ),
    Kind(
        kind="ActionRecord",
        model=api.ActionRecord,
        plural="actionrecords",
        short_names=("actrec",),
        spec=api.ActionRecordSpec,
        status=api.ActionRecordStatus,
        columns=(
            Column("State", ".status.state", description="Dispatch state"),
            Column("Effect", ".spec.effect"),
            Column("Tier", ".spec.tier"),
            Column("Attempts", ".status.attempts", "integer"),
            Column("Run", ".spec.runRef.name"),
            Column("Key", ".spec.idempotencyKey", priority=1),
            Column("Age", ".metadata.creationTimestamp", "date"),
        ),
        extra_rules=[api.FIRST_CLAIM_RULE],
    ),
    Kind(
        kind="AgentRunRecord",
        model=api.AgentRunRecord,
        plural="agentrunrecords",
        short_names=("arrec",),
        spec=api.AgentRunRecordSpec,
        status=None,
        columns=(
            Column("Run", ".spec.run.name"),
            Column("State", ".spec.state", description="The run's state when it was let go"),
            Column("Outcome", ".spec.outcome.reason"),
            Column("Why", ".spec.why", description="retention or deleted"),
            Column("Recorded", ".spec.recordedAt", "date"),
        ),
    ),
    Kind(
        kind="AgentPolicy",
        model=api.AgentPolicy,
        plural="agentpolicies",
        short_names=("apol",),
        spec=api.AgentPolicySpec,
        status=api.AgentPolicyStatus,
        columns=(
            Column("Version", ".spec.version"),
            Column("Ready", '.status.conditions[?(@.type=="Ready")].status'),
            Column(
                "Waiting",
                ".status.runs.waitingForApproval",
                "integer",
                description="Runs waiting for an approval under it",
            ),
            Column("Default", ".spec.default", "boolean", "Governs the namespace's runs that name none"),
            Column("Mandatory", ".spec.mandatory", "boolean", "Runs of the namespace may name no other", 1),
            Column("Age", ".metadata.creationTimestamp", "date"),
        ),
    ),
    Kind(
        kind="Agent",
        model=api.Agent,
        plural=api.AGENT_PLURAL,
        short_names=("agt",),
        spec=api.AgentSpec,
        status=None,
        columns=(
            Column("Model", ".spec.modelRef", description="The ModelConfig it calls"),
            Column("Prompt", ".spec.prompt", description="The prompt's version ID", priority=1),
            Column("Age", ".metadata.creationTimestamp", "date"),
        ),
    ),
    Kind(
        kind="ModelConfig",
        model=api.ModelConfig,
        plural=api.MODEL_CONFIG_PLURAL,
        short_names=("mcfg",),
        spec=api.ModelConfigSpec,
        status=None,
        columns=(
            Column("Model", ".spec.model"),
            Column("Protocol", ".spec.protocol"),
            Column("URL", ".spec.baseUrl", priority=1),
            Column("Age", ".metadata.creationTimestamp", "date"),
        ),
    ),
    Kind(
        kind="AgentSchedule",
        model=api.AgentSchedule,
        plural=api.AGENT_SCHEDULE_PLURAL,
        short_names=("asched",),
        spec=api.AgentScheduleSpec,
        status=api.AgentScheduleStatus,
        columns=(
            Column("Schedule", ".spec.schedule"),
            Column("Time Zone", ".spec.timeZone"),
            Column("Suspend", ".spec.suspend", "boolean"),
            Column("Agent", ".spec.runTemplate.agentRef", description="The Agent its runs are runs of"),
            Column("Last Schedule", ".status.lastScheduleTime", "date"),
            Column("Next", ".status.nextScheduleTime", "date", priority=1),
            Column("Age", ".metadata.creationTimestamp", "date"),
        ),
        extra_rules=[api.SCHEDULE_NAME_RULE],
    ),
    Kind(
        kind="ClusterAgentPolicy",
        model=api.ClusterAgentPolicy,
        plural="clusteragentpolicies",
        short_names=("capol",),
        spec=api.AgentPolicySpec,
        status=None,
        scope="Cluster",
        columns=(
            Column("Version", ".spec.version"),
            Column("Default", ".spec.default", "boolean", "The baseline of namespaces without a default"),
            Column("Age", ".metadata.creationTimestamp", "date"),
        ),
    ),
    Kind(
        kind=api.FAILOVER_KIND,
        model=api.RegionFailover,
        plural=api.FAILOVER_PLURAL,
        short_names=("rfo",),
        spec=api.RegionFailoverSpec,
        status=api.RegionFailoverStatus,
        scope="Cluster",
        columns=(
            Column("From", ".spec.from", description="The region whose runs move"),
            Column("To", ".spec.to", description="The region that adopts them"),
            Column("Phase", ".status.phase"),
            Column("Message", ".status.message", description="What was adopted, left or refused"),
            Column("Epoch", ".status.epoch", "integer", "The region epoch the runs were adopted under", 1),
            Column("Requested By", ".spec.requestedBy.username", priority=1),
            Column("Age", ".metadata.creationTimestamp", "date"),
        ),
    ),
)


def render(kind: Kind) -> str:
    header = "# Generated by `make crds` from operator/durable_agents/api/v1alpha1/. DO NOT EDIT.\n"
    return header + yaml.safe_dump(kind.crd(), sort_keys=False, width=100)


def generate() -> dict[str, str]:
    """File name -> content for every CRD."""
    return {f"{api.GROUP}_{k.plural}.yaml": render(k) for k in KINDS}


def render_policy() -> str:
    """The chart's ``files/agentrun-spec-policy.yaml``: the spec of the ValidatingAdmissionPolicy
    that carries the AgentRun spec's CEL rules (:mod:`.spec_policy`)."""
    (kind,) = [k for k in KINDS if k.spec_rules_in_policy]
    body = spec_policy.policy_spec(kind.spec_rules(), group=api.GROUP, plural=kind.plural)
    header = (
        "# Generated by `make crds` from operator/durable_agents/api/v1alpha1/. DO NOT EDIT.\n"
        f"# The spec of the ValidatingAdmissionPolicy that checks the {kind.kind} spec's rules on writes of\n"
        "# the spec only (not of the status, as CRD rules would): templates/agentrun-spec-policy.yaml.\n"
    )
    return header + yaml.safe_dump(body, sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> int:
    """Write every CRD into each directory given (default: crds/); ``--policy DIR``: the spec
    policy's file into DIR (the chart's files/)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--policy" in args:
        at = args.index("--policy")
        files = Path(args[at + 1])
        del args[at : at + 2]
        (files / spec_policy.POLICY_FILE).write_text(render_policy())
        print(files / spec_policy.POLICY_FILE)
    for directory in args or ["crds"]:
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for name, text in generate().items():
            (out / name).write_text(text)
            print(out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
