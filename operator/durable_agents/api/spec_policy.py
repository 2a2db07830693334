"""The AgentRun spec's CEL rules as a ValidatingAdmissionPolicy instead of in the CRD.

Why: the API server evaluates a CRD's CEL rules on every write of the object, and a status write is
one (the status subresource validates the whole object, its spec copied unchanged from the stored
one, so every spec rule is evaluated only to pass). Measured on this machine (issue 38: a
throw-away control plane, 20 writers, 1,200 status writes a sample, the API server's CPU per
write): a minimal status write 4.6-5.5 ms with the spec's rules in the CRD, 2.7-2.9 ms without;
a finished 8-step run's status 12.1-12.2 ms, 9.1-10.4 ms without. A ValidatingAdmissionPolicy
matching ``agentruns`` (not ``agentruns/status``) evaluates the same rules, in the API server, on
writes of the spec only.

The API types keep declaring the rules where they apply (``x-kubernetes-validations`` on the
field, :mod:`durable_agents.api.v1alpha1`); :func:`split_rules` takes them out of the CRD's spec
schema and :func:`policy_spec` writes each as one validation of the policy, the rule's ``self``
(and ``oldSelf``) replaced by the path of its field in ``object`` (and ``oldObject``), each
optional field on the way guarded by ``has``, each list or map on the way by ``all``:

- a transition rule (it reads ``oldSelf``; only on spec-level fields) is checked on UPDATE when
  both the old and the new object have the field, as the API server checks one in a CRD;
- any other rule is checked on CREATE only: every field those rules read is immutable (a
  transition rule says so, :func:`unguarded_reads` proves it), so an update cannot make them false,
  and a run stored under older rules is never refused a request for it (the CRD's ratcheting).

The rules of ``region`` stay in the CRD (two cheap ones; a run's region decides which deployment
serves it, and nothing else records it). The policy is the first line, and a cluster can lack it
(CRDs applied without the chart): the operator records what it accepted (the checkpoint's
``plan``, :mod:`durable_agents.core.plan_guard`) and quarantines a run whose spec changed since.
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


IN_CRD: Final = frozenset({"region"})
"""Spec fields whose rules stay in the CRD (see the module docstring)."""


def _stays(path: tuple[Segment, ...], rule: dict[str, Any]) -> bool:
    if path:
        return path[0][1] in IN_CRD
    return any(re.search(rf"\b(self|oldSelf)\.{name}\b", rule["rule"]) for name in IN_CRD)


def split_rules(schema: JsonSchema) -> tuple[JsonSchema, list[Located]]:
    """The spec ``schema`` without its rules (a copy; those of :data:`IN_CRD` stay), and those
    rules with where each was."""
    bare = copy.deepcopy(schema)
    found: list[Located] = []

    def walk(node: Any, path: tuple[Segment, ...]) -> None:
        if not isinstance(node, dict):
            return
        rules = node.pop("x-kubernetes-validations", [])
        kept = [rule for rule in rules if _stays(path, rule)]
        found.extend(Located(path, rule) for rule in rules if not _stays(path, rule))
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


def _bound(rule: str, names: dict[str, str]) -> str:
    """``rule`` with ``self`` / ``oldSelf`` replaced by the paths they stand for (paths need no
    parentheses: ``has()`` takes a field selection, not a parenthesised one)."""
    if "'self'" in rule or '"self"' in rule:
        raise ValueError(f"rule {rule!r} quotes self")
    return re.sub(r"\b(oldSelf|self)\b", lambda m: names[m.group(1)], rule)


def _navigate(var: str, path: tuple[Segment, ...], rule: str, depth: int = 0) -> str:
    if not path:
        return _bound(rule, {"self": var})
    (kind, name), rest = path[0], path[1:]
    if kind == "field":
        reached = f"{var}.{_field(name)}"
        return f"(!has({reached}) || {_navigate(reached, rest, rule, depth)})"
    each = f"x{depth}"
    if kind == "item":
        return f"{var}.all({each}, {_navigate(each, rest, rule, depth + 1)})"
    return f"{var}.all({each}, {_navigate(f'{var}[{each}]', rest, rule, depth + 1)})"


def expression(located: Located) -> str:
    """The policy's expression for one rule of the spec (see the module docstring)."""
    rule = located.rule["rule"]
    if not located.transition:
        return f"request.operation != 'CREATE' || {_navigate('object.spec', located.path, rule)}"
    if any(kind != "field" for kind, _ in located.path):
        raise ValueError(f"transition rule under a list or map ({located.where}): not expressible here")
    names = [_field(name) for _, name in located.path]
    prefixes = ["spec", *("spec." + ".".join(names[: i + 1]) for i in range(len(names)))]
    guards = " && ".join(f"has(object.{p}) && has(oldObject.{p})" for p in prefixes)
    at = ".".join(["spec", *names])
    bound = _bound(rule, {"self": f"object.{at}", "oldSelf": f"oldObject.{at}"})
    return f"request.operation != 'UPDATE' || !({guards}) || {bound}"


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
    """The ValidatingAdmissionPolicy's spec: the rules, on CREATE and UPDATE of the object itself."""
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [group],
                    "apiVersions": ["*"],
                    "resources": [plural],  # not plural/status: the point of the policy
                    "operations": ["CREATE", "UPDATE"],
                }
            ]
        },
        "validations": validations(rules),
    }


def unguarded_reads(rules: list[Located], immutable: set[str]) -> Iterator[str]:
    """The spec fields a CREATE-only rule reads that are not in ``immutable`` (none, or the policy
    would let an update make such a rule false)."""
    for located in rules:
        if located.transition:
            continue
        if located.path:
            top = {located.path[0][1]}
        else:  # a spec-level rule: the fields it names
            top = set(re.findall(r"\bself\.([A-Za-z_][A-Za-z0-9_]*)", located.rule["rule"]))
        yield from sorted(top - immutable)
