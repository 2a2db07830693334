"""Writes the CRD reference, ``docs/reference/crds.md``, from the same schemas as ``crds/``.

It reads each kind's structural schema (:meth:`durable_agents.api.crdgen.Kind.crd`), so the
reference says exactly what the API server enforces and ``kubectl explain`` shows: per kind its
group, version, scope and names, then one table per object (field, type, description, and what
the API server checks: required, default, bounds, patterns, rules).

Run ``make crds`` (it writes this file with the CRDs); a test fails on drift.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from durable_agents.api import crdgen
from durable_agents.api import v1alpha1 as api

JsonSchema = dict[str, Any]

DEFAULT_PATH = Path("docs/reference/crds.md")


def slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading of plain text."""
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def cell(text: str) -> str:
    """Text that stays in its table cell and renders as written: no line break, no HTML, no pipe
    that ends the cell (a code span is rendered as written already, so it is left alone)."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(
        part if part.startswith("`") and part.endswith("`") and len(part) > 1 else _escape(part)
        for part in parts
    )


def _escape(text: str) -> str:
    for raw, escaped in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("*", "\\*")):
        text = text.replace(raw, escaped)
    return text


def _objects(node: JsonSchema, path: str) -> Iterator[tuple[str, JsonSchema]]:
    """Every object with properties under ``node`` (itself first), by its path."""
    if node.get("properties"):
        yield path, node
        for name, child in node["properties"].items():
            yield from _objects(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), dict):
        yield from _objects(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _objects(node["additionalProperties"], path + "{}")


def _heading(kind: crdgen.Kind, path: str) -> str:
    return f"{kind.kind} {path}"


def _type(node: JsonSchema, kind: crdgen.Kind, path: str) -> str:
    if node.get("properties"):
        return f"[object](#{slug(_heading(kind, path))})"
    if isinstance(node.get("items"), dict):
        return "array of " + _type(node["items"], kind, f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        return "map of " + _type(node["additionalProperties"], kind, path + "{}")
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return "object (free-form)"
    kind_of = str(node.get("type", "any"))
    return f"{kind_of} ({node['format']})" if "format" in node else kind_of


def _value(value: Any) -> str:
    return "`" + json.dumps(value, separators=(", ", ": ")) + "`"


_LIMITS = (
    ("minLength", "min length {}"),
    ("maxLength", "max length {}"),
    ("minimum", "min {}"),
    ("maximum", "max {}"),
    ("minItems", "min items {}"),
    ("maxItems", "max items {}"),
    ("maxProperties", "max entries {}"),
)


def _checks(node: JsonSchema, required: bool) -> str:
    """What the API server checks of one field."""
    out = ["required"] if required else []
    if "default" in node:
        out.append("default " + _value(node["default"]))
    if "enum" in node:
        out.append("one of " + ", ".join(_value(v) for v in node["enum"]))
    out += [text.format(node[key]) for key, text in _LIMITS if key in node]
    if "pattern" in node:
        out.append(f"pattern `{node['pattern']}`")
    if node.get("x-kubernetes-list-type") == "set":
        out.append("no duplicates")
    if not node.get("properties"):  # an object's own rules are listed with its table
        out += [rule["message"] for rule in node.get("x-kubernetes-validations", [])]
    return "; ".join(cell(text) for text in out)


def _rules(node: JsonSchema) -> list[str]:
    messages = [rule["message"] for rule in node.get("x-kubernetes-validations", [])]
    return (
        ["Rules the API server checks on this object:", "", *(f"- {cell(m)}" for m in messages), ""]
        if messages
        else []
    )


# The CRD may not describe an object's own metadata (the API server refuses it): said here.
_METADATA = "Standard object metadata (name, namespace, labels, annotations, ...): see `kubectl explain`."


def _table(kind: crdgen.Kind, path: str, node: JsonSchema) -> list[str]:
    required = set(node.get("required", []))
    rows = ["| Field | Type | Description | Checks |", "|---|---|---|---|"]
    for name, child in node["properties"].items():
        child_path = f"{path}.{name}" if path else name
        description = _METADATA if child_path == "metadata" else child.get("description", "")
        rows.append(
            f"| `{name}` | {_type(child, kind, child_path)} | {cell(description)} "
            f"| {_checks(child, name in required)} |"
        )
    return rows


def _kind_section(kind: crdgen.Kind) -> list[str]:
    crd = kind.crd(documented=True)
    names, version = crd["spec"]["names"], crd["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    lines = [
        f"## {kind.kind}",
        "",
        cell(root.get("description", "")),
        "",
        f"- Group and version: `{api.API_VERSION}`",
        f"- Scope: {crd['spec']['scope']}",
        f"- Plural: `{names['plural']}`; short names: "
        + ", ".join(f"`{n}`" for n in names.get("shortNames", [])),
        "- Categories: " + ", ".join(f"`{c}`" for c in names.get("categories", [])),
        "- Status subresource: " + ("yes" if "subresources" in version else "no"),
        "",
    ]
    lines += [*_table(kind, "", root), "", *_rules(root)]
    for path, node in _objects(root, ""):
        if not path:
            continue
        lines += [f"### {_heading(kind, path)}", ""]
        if node.get("description"):
            lines += [cell(node["description"]), ""]
        lines += [*_table(kind, path, node), "", *_rules(node)]
    return lines


def render() -> str:
    """The whole reference page."""
    lines = [
        "# CRD reference",
        "",
        "Generated by `make crds` from the API types in `operator/durable_agents/api/v1alpha1/`, "
        "like the CRDs themselves: do not edit. `kubectl explain` shows the same descriptions "
        "(for example `kubectl explain agentpolicy.spec`).",
        "",
        f"Every kind is in group `{api.GROUP}`, version `{api.VERSION}`, and in the category "
        "`durable-agents`: `kubectl get durable-agents` lists the objects of all of them.",
        "",
        "| Kind | Short names | Scope | What it is |",
        "|---|---|---|---|",
    ]
    for kind in crdgen.KINDS:
        summary = (kind.model.__doc__ or "").strip().split("\n\n")[0]
        lines.append(
            f"| [{kind.kind}](#{slug(kind.kind)}) | "
            + ", ".join(f"`{n}`" for n in kind.short_names)
            + f" | {kind.scope} | {cell(summary)} |"
        )
    lines.append("")
    for kind in crdgen.KINDS:
        lines += _kind_section(kind)
    headings = [line.lstrip("#").strip() for line in lines if line.startswith("#")]
    duplicated = {slug(h) for h in headings if [slug(x) for x in headings].count(slug(h)) > 1}
    if duplicated:
        raise ValueError(f"headings with the same anchor: {sorted(duplicated)}")
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the reference to each path given (default: docs/reference/crds.md)."""
    args = sys.argv[1:] if argv is None else argv
    for target in [Path(a) for a in args] or [DEFAULT_PATH]:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render())
        print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
