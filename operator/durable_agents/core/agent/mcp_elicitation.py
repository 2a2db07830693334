"""A server's request for input (MCP elicitation), the pure rules: which requested schemas the
operator accepts, how a person's answer is checked against one, and how many rounds of input a
call may ask for (issue 36, item 1).

The specification restricts a form's ``requestedSchema`` to a flat object whose properties are
primitives: a string (optionally ``format`` email, uri, date or date-time, ``minLength``,
``maxLength``, ``enum``), a number or integer (``minimum``, ``maximum``), a boolean, or an array of
enumerated strings (a multi-select). Anything else is refused, as the specification allows, and
the refusal is told to the server (:func:`schema_problem` says why).

A person answers with JSON: ``{"action": "accept", "content": {...}}``, ``{"action": "decline"}``
or ``{"action": "cancel"}`` (decline and cancel are answers too). :func:`answer_problem` names the
first field that does not match, in the words of the other bad answers: ``content.<field>: …``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = [
    "ACTIONS",
    "MAX_INPUT_ROUNDS",
    "MAX_PROPERTIES",
    "ElicitationAnswer",
    "ElicitationQuestion",
    "answer_problem",
    "parse_answer",
    "schema_problem",
]

MAX_INPUT_ROUNDS: Final = 8
"""Rounds of input one call may ask for: a server that asks for more fails the call clearly."""
MAX_PROPERTIES: Final = 32
"""Fields of one form: a person answers it, a schema of hundreds is not a question."""
ACTIONS: Final = ("accept", "decline", "cancel")
ANSWER_FORMS: Final = '{"action": "accept", "content": {...}} | {"action": "decline"} | {"action": "cancel"}'
_STRING_FORMATS: Final = frozenset({"email", "uri", "date", "date-time"})
_STRING_KEYS: Final = frozenset(
    {
        "type",
        "title",
        "description",
        "minLength",
        "maxLength",
        "format",
        "default",
        "enum",
        "enumNames",
        "oneOf",
    }
)
_NUMBER_KEYS: Final = frozenset({"type", "title", "description", "minimum", "maximum", "default"})
_BOOLEAN_KEYS: Final = frozenset({"type", "title", "description", "default"})
_ARRAY_KEYS: Final = frozenset({"type", "title", "description", "minItems", "maxItems", "items", "default"})
_FIELD: Final = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

Action = Literal["accept", "decline", "cancel"]


@dataclass(frozen=True)
class ElicitationQuestion:
    """One request for input, as the run records it (sealed: the message and schema are the
    server's words, possibly about the person's data). ``key`` is the server's identifier of the
    request (the ``inputRequests`` key; the JSON-RPC id on the 2025-11-25 protocol); ``url`` is
    set for URL mode: shown to the person as a link, never opened by the operator."""

    server: str
    tool: str
    key: str
    message: str
    schema: Mapping[str, Any] | None
    url: str | None = None

    def for_person(self) -> str:
        """The question as a person reads it (kubectl agentrun answer, the inbox, the console)."""
        said: dict[str, Any] = {
            "mcpServer": self.server,
            "tool": self.tool,
            "message": self.message,
            "answerWith": ANSWER_FORMS,
        }
        if self.url is not None:
            said["url"] = self.url
            said["note"] = "open this link yourself; the operator never opens it. Then answer accept."
        else:
            said["requestedSchema"] = dict(self.schema or {})
        return json.dumps(said, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class ElicitationAnswer:
    """A person's answer, checked against the requested schema."""

    action: Action
    content: dict[str, Any] | None = None


def _property_problem(name: str, prop: object) -> str | None:
    if not isinstance(prop, Mapping):
        return f"properties.{name}: not an object"
    kind = prop.get("type")
    allowed = {
        "string": _STRING_KEYS,
        "number": _NUMBER_KEYS,
        "integer": _NUMBER_KEYS,
        "boolean": _BOOLEAN_KEYS,
        "array": _ARRAY_KEYS,
    }.get(kind if isinstance(kind, str) else "")
    if allowed is None:
        return f"properties.{name}.type: {kind!r} is not a primitive (string, number, integer, boolean)"
    extra = sorted(set(prop) - allowed)
    if extra:
        return f"properties.{name}: {', '.join(extra)} not allowed in a flat form"
    if kind == "string" and prop.get("format") is not None and prop.get("format") not in _STRING_FORMATS:
        return f"properties.{name}.format: {prop.get('format')!r} is not one of {sorted(_STRING_FORMATS)}"
    if kind == "array":
        items = prop.get("items")
        if (
            not isinstance(items, Mapping)
            # untitled: {type: string, enum}; titled: {anyOf: [{const, title}]} (type optional)
            or items.get("type", "string") != "string"
            or not (items.get("enum") or items.get("anyOf"))
        ):
            return f"properties.{name}.items: only an array of enumerated strings (a multi-select) is allowed"
    return None


def schema_problem(schema: object) -> str | None:
    """Why ``schema`` is not a requested schema the operator asks a person (None: it is one)."""
    if not isinstance(schema, Mapping):
        return "requestedSchema: not an object"
    if schema.get("type") != "object":
        return f"requestedSchema.type: {schema.get('type')!r}, not 'object'"
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return "requestedSchema.properties: missing or not an object"
    if len(properties) > MAX_PROPERTIES:
        return f"requestedSchema.properties: {len(properties)} fields, at most {MAX_PROPERTIES}"
    for name, prop in properties.items():
        if not isinstance(name, str) or not _FIELD.match(name):
            return f"requestedSchema.properties: field name {name!r} is not allowed"
        problem = _property_problem(name, prop)
        if problem is not None:
            return f"requestedSchema.{problem}"
    required = schema.get("required", [])
    if not isinstance(required, list) or any(name not in properties for name in required):
        return "requestedSchema.required: names a field that is not among the properties"
    return None


def _enum_of(prop: Mapping[str, Any]) -> list[Any] | None:
    if isinstance(prop.get("enum"), list):
        return list(prop["enum"])
    if isinstance(prop.get("oneOf"), list):
        return [option.get("const") for option in prop["oneOf"] if isinstance(option, Mapping)]
    return None


def _string_problem(value: object, prop: Mapping[str, Any]) -> str | None:
    if not isinstance(value, str):
        return f"{value!r} is not a string"
    enum = _enum_of(prop)
    if enum is not None and value not in enum:
        return f"{value!r} is not one of {enum}"
    if isinstance(prop.get("minLength"), int) and len(value) < prop["minLength"]:
        return f"shorter than {prop['minLength']} characters"
    if isinstance(prop.get("maxLength"), int) and len(value) > prop["maxLength"]:
        return f"longer than {prop['maxLength']} characters"
    if prop.get("format") == "email" and not re.fullmatch(r"[^@\s]+@[^@\s]+", value):
        return f"{value!r} is not an email address"
    return None


def _number_problem(value: object, prop: Mapping[str, Any]) -> str | None:
    integer = prop.get("type") == "integer"
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (integer and not isinstance(value, int))
    ):
        return f"{value!r} is not {'an integer' if integer else 'a number'}"
    if isinstance(prop.get("minimum"), int | float) and value < prop["minimum"]:
        return f"{value} is below the minimum {prop['minimum']}"
    if isinstance(prop.get("maximum"), int | float) and value > prop["maximum"]:
        return f"{value} is above the maximum {prop['maximum']}"
    return None


def _value_problem(value: object, prop: Mapping[str, Any]) -> str | None:
    kind = prop.get("type")
    if kind == "string":
        return _string_problem(value, prop)
    if kind in ("number", "integer"):
        return _number_problem(value, prop)
    if kind == "boolean":
        return None if isinstance(value, bool) else f"{value!r} is not a boolean"
    items = prop.get("items") or {}
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return f"{value!r} is not a list of strings"
    enum = _enum_of(items) or [option.get("const") for option in items.get("anyOf", [])]
    outside = [item for item in value if item not in enum]
    return f"{outside} not among {enum}" if outside else None


def answer_problem(schema: Mapping[str, Any] | None, answer: object) -> str | None:
    """Why ``answer`` (the parsed JSON of ``spec.answers[key]``) does not answer a question with
    ``schema`` (None: it does). The problem starts with the field: ``action: …``, ``content.x: …``."""
    if not isinstance(answer, Mapping):
        return 'the answer is not a JSON object like {"action": "accept", "content": {...}}'
    extra = sorted(set(answer) - {"action", "content"})
    if extra:
        return f"{extra[0]}: not a field of an answer (action, content)"
    action = answer.get("action")
    if action not in ACTIONS:
        return f"action: {action!r} is not one of accept, decline, cancel"
    content = answer.get("content")
    if action != "accept" or schema is None:  # decline, cancel, a URL-mode consent carry no content
        return (
            None if content is None else f"content: only an accepted form answer carries content ({action})"
        )
    if not isinstance(content, Mapping):
        return "content: an accepted answer carries the form's fields as an object"
    properties = schema.get("properties") or {}
    for name in sorted(content):
        if name not in properties:
            return f"content.{name}: not a field of the requested schema ({', '.join(sorted(properties))})"
        problem = _value_problem(content[name], properties[name])
        if problem is not None:
            return f"content.{name}: {problem}"
    for name in schema.get("required") or []:
        if name not in content:
            return f"content.{name}: required by the requested schema"
    return None


def parse_answer(schema: Mapping[str, Any] | None, text: str) -> ElicitationAnswer | str:
    """The answer in ``text`` (JSON), or the problem with it (:func:`answer_problem`)."""
    try:
        answer = json.loads(text)
    except json.JSONDecodeError as err:
        return f"the answer is not JSON ({err.msg} at {err.pos})"
    problem = answer_problem(schema, answer)
    if problem is not None:
        return problem
    content = answer.get("content")
    return ElicitationAnswer(action=answer["action"], content=dict(content) if content is not None else None)
