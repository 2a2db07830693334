"""A server's request for input (issue 36, item 1), the pure rules: a requested schema is a flat
object of primitives or refused; an answer is checked against it, naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from durable_agents.core.agent.mcp_elicitation import (
    MAX_PROPERTIES,
    ElicitationAnswer,
    ElicitationQuestion,
    answer_problem,
    parse_answer,
    schema_problem,
)

pytestmark = pytest.mark.unit

STAY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "date": {"type": "string", "format": "date"},
        "nights": {"type": "integer", "minimum": 1, "maximum": 14},
        "size": {"type": "string", "enum": ["single", "double"]},
        "extras": {"type": "array", "items": {"type": "string", "enum": ["breakfast", "parking"]}},
        "smoking": {"type": "boolean"},
        "email": {"type": "string", "format": "email", "maxLength": 64},
    },
    "required": ["date", "nights"],
}


def test_a_flat_object_of_primitives_is_accepted() -> None:
    assert schema_problem(STAY) is None


@pytest.mark.parametrize(
    ("schema", "said"),
    [
        ({"type": "array"}, "requestedSchema.type: 'array', not 'object'"),
        ({"type": "object"}, "requestedSchema.properties: missing"),
        (
            {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}},
            "requestedSchema.properties.a.type: 'object' is not a primitive",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string", "pattern": ".*"}}},
            "requestedSchema.properties.a: pattern not allowed",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}},
            "requestedSchema.properties.a.items: only an array of enumerated strings",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
            "requestedSchema.required: names a field",
        ),
        (
            {
                "type": "object",
                "properties": {f"f{n}": {"type": "string"} for n in range(MAX_PROPERTIES + 1)},
            },
            f"at most {MAX_PROPERTIES}",
        ),
    ],
)
def test_anything_else_is_refused_naming_the_field(schema: dict[str, Any], said: str) -> None:
    problem = schema_problem(schema)
    assert problem is not None
    assert said in problem


def test_an_answer_matching_the_schema_is_accepted() -> None:
    answer = {"action": "accept", "content": {"date": "2026-12-24", "nights": 2, "extras": ["parking"]}}
    assert parse_answer(STAY, json.dumps(answer)) == ElicitationAnswer("accept", answer["content"])


@pytest.mark.parametrize("action", ["decline", "cancel"])
def test_decline_and_cancel_are_answers_too(action: str) -> None:
    assert parse_answer(STAY, json.dumps({"action": action})) == ElicitationAnswer(action)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ({"action": "accept", "content": {"date": "2026-12-24", "nights": 0}}, "content.nights: 0 is below"),
        (
            {"action": "accept", "content": {"date": "2026-12-24", "nights": "2"}},
            "content.nights: '2' is not an integer",
        ),
        (
            {"action": "accept", "content": {"date": "2026-12-24", "nights": True}},
            "content.nights: True is not an integer",
        ),
        ({"action": "accept", "content": {"nights": 2}}, "content.date: required"),
        (
            {"action": "accept", "content": {"date": "x", "nights": 2, "size": "huge"}},
            "content.size: 'huge' is not one of",
        ),
        ({"action": "accept", "content": {"date": "x", "nights": 2, "room": 7}}, "content.room: not a field"),
        (
            {"action": "accept", "content": {"date": "x", "nights": 2, "extras": ["spa"]}},
            "content.extras: ['spa'] not among",
        ),
        (
            {"action": "accept", "content": {"date": "x", "nights": 2, "email": "nobody"}},
            "content.email: 'nobody' is not an email",
        ),
        ({"action": "accept"}, "content: an accepted answer carries"),
        ({"action": "decline", "content": {}}, "content: only an accepted form answer"),
        ({"action": "maybe"}, "action: 'maybe' is not one of"),
        ({"action": "accept", "content": {}, "note": 1}, "note: not a field of an answer"),
        (["accept"], "not a JSON object"),
    ],
)
def test_an_answer_that_does_not_match_is_refused_naming_the_field(answer: Any, said: str) -> None:
    problem = answer_problem(STAY, answer)
    assert problem is not None
    assert said in problem, problem
    assert parse_answer(STAY, json.dumps(answer)) == problem


def test_an_answer_that_is_not_json_is_refused() -> None:
    problem = parse_answer(STAY, "yes please")
    assert isinstance(problem, str)
    assert problem.startswith("the answer is not JSON")


def test_a_url_question_shows_the_link_and_takes_a_consent() -> None:
    question = ElicitationQuestion(
        "pay", "checkout", "pay", "Pay the deposit", None, url="https://pay.example/1"
    )
    said = json.loads(question.for_person())
    assert said["url"] == "https://pay.example/1"
    assert "never opens it" in said["note"]
    assert parse_answer(None, '{"action": "accept"}') == ElicitationAnswer("accept")
    form = json.loads(ElicitationQuestion("hotel", "book_room", "stay", "When?", STAY).for_person())
    assert form["requestedSchema"] == STAY
    assert form["mcpServer"] == "hotel"
    assert form["tool"] == "book_room"
