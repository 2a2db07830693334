"""The tools a model may call, as declared by a person, and how the model is shown them.

A declaration fixes everything that decides WHERE a call lands (a read's apiVersion and kind, an
effect's name and target, an MCP server and tool); the model only fills in the arguments its JSON
schema admits. The schema is checked once, here (Draft 2020-12), so a bad one fails when the run
is set up, not at the model's first call.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Literal

# No stubs for jsonschema in the dev dependencies (types-jsonschema would remove these ignores).
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from durable_agents.core.checkpoint import ActionTier
from durable_agents.core.digest import canonical_digest

ToolKind = Literal["read", "effect", "ask_human", "await_event", "mcp", "agent"]

NAME_PATTERN: Final = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""What chat-completions APIs accept as a function name."""
DESCRIPTION_MAX: Final = 1024
QUESTION_MAX: Final = 2048
"""A model's question to a human, in characters (it is sealed, and a sealed string holds 4096)."""

# Builtin argument schemas: the model supplies exactly one field, nothing else.
READ_PARAMETERS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "description": "The name of the object to read, in the run's namespace.",
            "minLength": 1,
            "maxLength": 253,
            "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        }
    },
    "required": ["name"],
    "additionalProperties": False,
}
ASK_HUMAN_PARAMETERS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "question": {
            "type": "string",
            "description": "The question for a person; the run waits for the answer.",
            "minLength": 1,
            "maxLength": QUESTION_MAX,
        }
    },
    "required": ["question"],
    "additionalProperties": False,
}
AWAIT_EVENT_PARAMETERS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "event": {
            "type": "string",
            "description": "The name of the external event to wait for.",
            "minLength": 1,
            "maxLength": 63,
            "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        }
    },
    "required": ["event"],
    "additionalProperties": False,
}

OBJECTIVE_MAX: Final = 4096
"""A sub-agent's objective, in characters (an AgentRun's spec.objective holds 4096)."""
SUB_AGENT_PARAMETERS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "objective": {
            "type": "string",
            "description": "What the sub-agent is to achieve; the run waits for its answer.",
            "minLength": 1,
            "maxLength": OBJECTIVE_MAX,
        }
    },
    "required": ["objective"],
    "additionalProperties": False,
}

# The fields each kind must set (and only that kind may set).
_KIND_FIELDS: Final[Mapping[str, frozenset[str]]] = {
    "read": frozenset({"api_version", "object_kind"}),
    "effect": frozenset({"effect", "target"}),
    "ask_human": frozenset(),
    "await_event": frozenset(),
    "mcp": frozenset({"server", "tool", "tier"}),
    "agent": frozenset({"agent_ref"}),
}
_OPTIONAL: Final = ("api_version", "object_kind", "effect", "target", "server", "tool", "tier", "agent_ref")


class ToolDeclarationError(ValueError):
    """A declaration that cannot be offered to a model (bad name, schema or kind fields)."""


@dataclass(frozen=True)
class ToolDeclaration:
    """One tool, as a person declared it. Build with :func:`read_tool`, :func:`effect_tool`,
    :func:`ask_human_tool`, :func:`await_event_tool` or :func:`mcp_tool`."""

    name: str
    """The function name the model sees (``^[a-zA-Z0-9_-]{1,64}$``)."""
    description: str
    parameters: Mapping[str, Any]
    """JSON schema (Draft 2020-12) of the arguments object the model supplies."""
    kind: ToolKind
    api_version: str | None = None
    """read: the apiVersion of the objects it reads."""
    object_kind: str | None = None
    """read: the Kubernetes kind (``kind`` names the tool's kind)."""
    effect: str | None = None
    """effect: the effect to perform (``http.post``, ``kubernetes.apply``, a plugin)."""
    target: Mapping[str, Any] | None = None
    """effect: where it lands, fixed by a person; the model never chooses it."""
    expires_in: timedelta | None = None
    """ask_human / await_event: how long the run waits."""
    server: str | None = None
    """mcp: the MCP server's name."""
    tool: str | None = None
    """mcp: the tool's name on that server."""
    read_only: bool = False
    """mcp: the server says the tool changes nothing (readOnlyHint); advisory, the tier decides."""
    tier: ActionTier | None = None
    """mcp: the tier the server's hints claim; a claim, believed only for a server the policy
    trusts (see :mod:`.mcp_trust`)."""
    agent_ref: str | None = None
    """agent: the Agent a call starts a child run of (a sub-agent)."""

    def __post_init__(self) -> None:
        if not NAME_PATTERN.match(self.name):
            raise ToolDeclarationError(f"tool name {self.name!r} must match {NAME_PATTERN.pattern}")
        if len(self.description) > DESCRIPTION_MAX:
            raise ToolDeclarationError(f"tool {self.name!r}: description over {DESCRIPTION_MAX} characters")
        if self.kind not in _KIND_FIELDS:
            raise ToolDeclarationError(f"tool {self.name!r}: unknown kind {self.kind!r}")
        required = _KIND_FIELDS[self.kind]
        for name in _OPTIONAL:
            present = getattr(self, name) is not None
            if present != (name in required):
                verb = "needs" if name in required else "must not set"
                raise ToolDeclarationError(f"tool {self.name!r} of kind {self.kind!r} {verb} {name!r}")
        if self.parameters.get("type") != "object":
            raise ToolDeclarationError(f"tool {self.name!r}: parameters must be a schema of type object")
        remote = _remote_ref(self.parameters)
        if remote is not None:
            # A schema is checked with no I/O: only references within itself resolve.
            raise ToolDeclarationError(
                f"tool {self.name!r}: parameters refer outside themselves ({remote!r})"
            )
        problem = _schema_problem(self.parameters)
        if problem is not None:
            raise ToolDeclarationError(f"tool {self.name!r}: invalid parameters schema: {problem}")


def _schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why ``schema`` is not a JSON Schema (draft 2020-12), or None. A model run declares its tools
    at every turn, each time from the same few schemas: the check is remembered by their JSON
    text (it was 4 % of the operator's CPU in the model row's profile, issue 38). Only a schema of
    at most :data:`REMEMBERED_SCHEMA_BYTES` is remembered: an MCP server chooses its tools'
    schemas, and one listing large new ones every time must not grow the memory."""
    try:
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return _checked_schema(schema)  # not plain JSON: checked, not remembered
    if len(text) > REMEMBERED_SCHEMA_BYTES:
        return _checked_schema(schema)
    return _checked_text(text)


REMEMBERED_SCHEMA_BYTES: Final = 16 * 1024
"""At most 1,024 schemas of at most this size are remembered (16 MiB)."""


@functools.lru_cache(maxsize=1024)
def _checked_text(text: str) -> str | None:
    return _checked_schema(json.loads(text))


def _checked_schema(schema: Any) -> str | None:
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        return str(exc.message)
    return None


def _remote_ref(schema: Any) -> str | None:
    """The first ``$ref``/``$dynamicRef`` in ``schema`` that is not a local (``#…``) one, or None."""
    if isinstance(schema, Mapping):
        for key, value in schema.items():
            if key in ("$ref", "$dynamicRef") and isinstance(value, str) and not value.startswith("#"):
                return value
            found = _remote_ref(value)
            if found is not None:
                return found
    elif isinstance(schema, list):
        for item in schema:
            found = _remote_ref(item)
            if found is not None:
                return found
    return None


def read_tool(name: str, description: str, *, api_version: str, kind: str) -> ToolDeclaration:
    return ToolDeclaration(
        name, description, READ_PARAMETERS, "read", api_version=api_version, object_kind=kind
    )


def effect_tool(
    name: str,
    description: str,
    *,
    effect: str,
    target: Mapping[str, Any],
    parameters: Mapping[str, Any] | None = None,
) -> ToolDeclaration:
    return ToolDeclaration(
        name,
        description,
        dict(parameters) if parameters is not None else {"type": "object"},
        "effect",
        effect=effect,
        target=copy.deepcopy(dict(target)),
    )


def ask_human_tool(name: str, description: str, *, expires_in: timedelta | None = None) -> ToolDeclaration:
    return ToolDeclaration(name, description, ASK_HUMAN_PARAMETERS, "ask_human", expires_in=expires_in)


def await_event_tool(name: str, description: str, *, expires_in: timedelta | None = None) -> ToolDeclaration:
    return ToolDeclaration(name, description, AWAIT_EVENT_PARAMETERS, "await_event", expires_in=expires_in)


def sub_agent_tool(name: str, description: str, *, agent_ref: str) -> ToolDeclaration:
    return ToolDeclaration(name, description, SUB_AGENT_PARAMETERS, "agent", agent_ref=agent_ref)


def mcp_tool(
    name: str,
    description: str,
    *,
    server: str,
    tool: str,
    parameters: Mapping[str, Any],
    read_only: bool,
    tier: ActionTier,
) -> ToolDeclaration:
    return ToolDeclaration(
        name,
        description,
        dict(parameters),
        "mcp",
        server=server,
        tool=tool,
        read_only=read_only,
        tier=tier,
    )


def declaration_json(declaration: ToolDeclaration) -> dict[str, Any]:
    """Everything a declaration fixes, as plain JSON (camelCase, absent fields left out)."""
    out: dict[str, Any] = {
        "name": declaration.name,
        "description": declaration.description,
        "parameters": copy.deepcopy(dict(declaration.parameters)),
        "kind": declaration.kind,
    }
    optional: dict[str, Any] = {
        "apiVersion": declaration.api_version,
        "objectKind": declaration.object_kind,
        "effect": declaration.effect,
        "target": copy.deepcopy(dict(declaration.target)) if declaration.target is not None else None,
        "server": declaration.server,
        "tool": declaration.tool,
        "tier": declaration.tier,
        "agentRef": declaration.agent_ref,
    }
    out.update({key: value for key, value in optional.items() if value is not None})
    if declaration.expires_in is not None:
        # Whole microseconds: an int is exact in canonical JSON, a float's text is not Python's.
        out["expiresInMicroseconds"] = declaration.expires_in // timedelta(microseconds=1)
    if declaration.kind == "mcp":
        out["readOnly"] = declaration.read_only
    return out


def sorted_tools(declarations: Iterable[ToolDeclaration]) -> tuple[ToolDeclaration, ...]:
    """The declarations by name; :class:`ToolDeclarationError` if two share a name (the model
    could not tell them apart)."""
    ordered = tuple(sorted(declarations, key=lambda declaration: declaration.name))
    for before, after in itertools.pairwise(ordered):
        if before.name == after.name:
            raise ToolDeclarationError(f"two tools are named {before.name!r}")
    return ordered


def tool_set_digest(declarations: Iterable[ToolDeclaration]) -> str:
    """The digest of a tool set: equal for the same declarations in any order, different when
    anything a declaration fixes (a target, a schema, a tier) differs."""
    return canonical_digest([declaration_json(declaration) for declaration in sorted_tools(declarations)])


def openai_tool(declaration: ToolDeclaration) -> dict[str, Any]:
    """A chat-completions ``tools`` entry: what the model sees (never the target or the server)."""
    return {
        "type": "function",
        "function": {
            "name": declaration.name,
            "description": declaration.description,
            "parameters": copy.deepcopy(dict(declaration.parameters)),
        },
    }


def openai_tools(declarations: Iterable[ToolDeclaration]) -> tuple[dict[str, Any], ...]:
    """The ``tools`` of a request, sorted by name, so that declaration order changes no byte."""
    return tuple(openai_tool(declaration) for declaration in sorted_tools(declarations))


def by_name(declarations: Sequence[ToolDeclaration]) -> dict[str, ToolDeclaration]:
    return {declaration.name: declaration for declaration in sorted_tools(declarations)}
