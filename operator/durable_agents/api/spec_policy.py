"""The AgentRun spec's creation rules as a ValidatingAdmissionPolicy instead of in the CRD.

Why: the API server evaluates a CRD's CEL rules on every write of the object, and a status write is
one (the status subresource validates the whole object, its spec copied unchanged from the stored
one, so every spec rule is evaluated only to pass). Measured on this machine (issue 38, a
throw-away control plane, 20 writers, 1,200 status writes a sample): taking the spec's rules that
do not read ``oldSelf`` out of the CRD cuts the API server's CPU per status write by about 1.5 ms
of a 4.6-5.5 ms minimal write, and by about 2 ms of a 12 ms write of a finished 8-step run's status
(per-step "exactly one kind" rules, the unique-name rule, duration bounds: evaluated per step on
every status write). A ValidatingAdmissionPolicy matching ``agentruns`` (not
``agentruns/status``) evaluates the same rules, in the API server, on CREATE only.

Only those rules move: each reads fields that are immutable once the run exists (the transition
rules that say so stay in the CRD, :func:`unguarded_reads` proves it), so checking them at
creation is checking them for good, and a run stored under older rules is never refused a request
for it (the CRD's ratcheting). The immutability and append-only rules (``oldSelf``) stay in the
CRD: they guard who may change what a run does, and the CRD is always installed (a policy is a
configuration a cluster can lack). Without the policy (CRDs applied without the chart), a step
naming two kinds runs as the first of them (read, ask, await, effect, complete, child), a duration
over a year fails the run's attempt (``InvalidDuration``), and the rest (one name for two steps,
both ``agent`` and ``agentRef``) the operator reads as it reads any spec: no check of who may do
what depends on these rules, and the admission webhook, where installed, checks durations too.

The API types keep declaring the rules where they apply (``x-kubernetes-validations`` on the
field, :mod:`durable_agents.api.v1alpha1`); :func:`split_rules` takes them out of the CRD's spec
schema and :func:`policy_spec` writes each as one validation of the policy, the rule's ``self``
replaced by the path of its field in ``object``, each optional field on the way guarded by
``has``, each list or map on the way by ``all``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

JsonSchema = dict[str, Any]
Segment = tuple[str, str]  # ("field", name) | ("item", "") | ("value", "")

POLICY_FILE: Final = "agentrun-spec-policy.yaml"
"""The policy's spec (without its name), under the chart's ``files/``: the chart and the test
harness make the policy from it."""

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# CEL reserved words, which the API server escapes in property names; no spec field on a rule's path is one.
_RESERVED = frozenset(
    [
        "as",
        "break",
        "const",
        "continue",
        "else",
        "false",
        "for",
        "function",
        "if",
        "import",
        "in",
        "let",
        "loop",
        "package",
        "namespace",
        "null",
        "return",
        "true",
        "var",
        "void",
        "while",
    ]
)


@dataclass(frozen=True)
class Located:
    """One ``x-kubernetes-validations`` rule and the path of the node that declared it."""

    path: tuple[Segment, ...]
    rule: dict[str, Any]

    @property
    def transition(self) -> bool:
        return "oldSelf" in self.rule["rule"]

    @property
    def where(self) -> str:
        """The node, for people: ``spec.steps[].ask.expiresIn``."""
        out = "spec"
        for kind, name in self.path:
            out += f".{name}" if kind == "field" else "[]" if kind == "item" else "{}"
        return out


def split_rules(schema: JsonSchema) -> tuple[JsonSchema, list[Located]]:
    """The spec ``schema`` without its creation rules (a copy; transition rules stay), and those
    rules with where each was."""
    bare = copy.deepcopy(schema)
    found: list[Located] = []

    def walk(node: Any, path: tuple[Segment, ...]) -> None:
        if not isinstance(node, dict):
            return
        rules = node.pop("x-kubernetes-validations", [])
        kept = [rule for rule in rules if "oldSelf" in rule["rule"]]
        found.extend(Located(path, rule) for rule in rules if "oldSelf" not in rule["rule"])
        if kept:
            node["x-kubernetes-validations"] = kept
        for name, child in (node.get("properties") or {}).items():
            walk(child, (*path, ("field", name)))
        if isinstance(node.get("items"), dict):
            walk(node["items"], (*path, ("item", "")))
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], (*path, ("value", "")))

    walk(bare, ())
    return bare, found


def _field(name: str) -> str:
    if not _IDENT.match(name) or name in _RESERVED:
        raise ValueError(f"field {name!r} on a rule's path would need CEL escaping")
    return name


def _bound(rule: str, path: str) -> str:
    """``rule`` with ``self`` replaced by the path it stands for (a path needs no parentheses:
    ``has()`` takes a field selection, not a parenthesised one)."""
    if "'self'" in rule or '"self"' in rule:
        raise ValueError(f"rule {rule!r} quotes self")
    return re.sub(r"\bself\b", path, rule)


def _navigate(var: str, path: tuple[Segment, ...], rule: str, depth: int = 0) -> str:
    if not path:
        return _bound(rule, var)
    (kind, name), rest = path[0], path[1:]
    if kind == "field":
        reached = f"{var}.{_field(name)}"
        return f"(!has({reached}) || {_navigate(reached, rest, rule, depth)})"
    each = f"x{depth}"
    if kind == "item":
        return f"{var}.all({each}, {_navigate(each, rest, rule, depth + 1)})"
    return f"{var}.all({each}, {_navigate(f'{var}[{each}]', rest, rule, depth + 1)})"


def expression(located: Located) -> str:
    """The policy's expression for one creation rule of the spec (see the module docstring)."""
    if located.transition:
        raise ValueError(f"a transition rule ({located.where}) stays in the CRD")
    return _navigate("object.spec", located.path, located.rule["rule"])


def validations(rules: list[Located]) -> list[dict[str, Any]]:
    """One policy validation per rule; the message names the field (a policy has no fieldPath)."""
    out = []
    for located in rules:
        field_path = located.rule.get("fieldPath", "")
        where = located.where + field_path if field_path.startswith(".") else located.where
        out.append(
            {
                "expression": expression(located),
                "message": f"{where}: {located.rule['message']}",
                "reason": "Invalid",
            }
        )
    return out


def policy_spec(rules: list[Located], *, group: str, plural: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy's spec: the rules, on CREATE of the object."""
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [group],
                    "apiVersions": ["*"],
                    "resources": [plural],  # not plural/status: the point of the policy
                    "operations": ["CREATE"],
                }
            ]
        },
        "validations": validations(rules),
    }


def unguarded_reads(rules: list[Located], immutable: set[str]) -> Iterator[str]:
    """The spec fields a creation rule reads that are not in ``immutable`` (none, or the policy
    would let an update make such a rule false)."""
    for located in rules:
        if located.path:
            top = {located.path[0][1]}
        else:  # a spec-level rule: the fields it names
            top = set(re.findall(r"\bself\.([A-Za-z_][A-Za-z0-9_]*)", located.rule["rule"]))
        yield from sorted(top - immutable)
