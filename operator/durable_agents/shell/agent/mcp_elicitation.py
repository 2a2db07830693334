"""A server's request for input, the SDK side (issue 36, item 1).

On the 2026-07-28 protocol a server that needs input answers ``tools/call`` with an
``InputRequiredResult``: requests for input keyed by the server, and opaque ``request_state``. No
tool ran to completion: the call is retried, with the same idempotency key, carrying the answers
(``input_responses``) and the state echoed byte for byte. :func:`input_required` turns the result
into :class:`InputAsked` (carried by ``McpInputRequired``, raised by
:func:`durable_agents.shell.agent.mcp_tools.call_tool`): the questions a person is asked, and the
requests refused before any person sees them (a form whose schema is not a flat object of
primitives, a request kind this client does not serve), which :func:`input_responses` tells the
server as declined. Pure rules: :mod:`durable_agents.core.agent.mcp_elicitation`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from durable_agents.core.agent.mcp_elicitation import (
    MAX_INPUT_ROUNDS,
    ElicitationAnswer,
    ElicitationQuestion,
    schema_problem,
)

if TYPE_CHECKING:
    from mcp_types import InputRequiredResult, InputResponses

__all__ = [
    "AskPerson",
    "HoldOpen",
    "InputAsked",
    "call_result_adapter",
    "input_required",
    "input_responses",
    "may_be_task",
    "refuse_elicitation",
    "retried_while_state_only",
]

_MESSAGE_MAX = 4096


@dataclass(frozen=True)
class InputAsked:
    """What an ``InputRequiredResult`` asks: the questions for a person, the requests refused
    before any person sees them (key: why; told to the server as declined), and the opaque
    ``request_state`` echoed verbatim on the retry."""

    questions: list[ElicitationQuestion]
    refused: dict[str, str]
    request_state: str | None


def input_required(server: str, tool: str, result: InputRequiredResult) -> InputAsked:
    """The questions of ``result``, form and URL elicitations, each form's schema checked."""
    from mcp_types import ElicitRequest, ElicitRequestURLParams

    questions: list[ElicitationQuestion] = []
    refused: dict[str, str] = {}
    for key, request in sorted((result.input_requests or {}).items()):
        if not isinstance(request, ElicitRequest):
            # Sampling and roots are not questions for a person (sampling is under policy elsewhere).
            refused[key] = f"{request.method} is not served by this client as a question"
            continue
        params = request.params
        message = params.message[:_MESSAGE_MAX]
        if isinstance(params, ElicitRequestURLParams):
            questions.append(ElicitationQuestion(server, tool, key, message, None, url=params.url))
            continue
        problem = schema_problem(params.requested_schema)
        if problem is not None:
            refused[key] = f"refused: {problem}"
            continue
        questions.append(ElicitationQuestion(server, tool, key, message, dict(params.requested_schema)))
    return InputAsked(questions, refused, result.request_state)


async def retried_while_state_only(first: Any, resend: Callable[[str | None], Awaitable[Any]]) -> Any:
    """``first``, or, while it is an ``InputRequiredResult`` that asks nothing (only its
    ``request_state``: "not yet, come back with this"), what ``resend(state)`` answers, with a short
    backoff, at most :data:`MAX_INPUT_ROUNDS` times (then the last such result: a clear failure)."""
    from mcp_types import InputRequiredResult

    current = first
    for round_ in range(MAX_INPUT_ROUNDS):
        if not isinstance(current, InputRequiredResult) or current.input_requests:
            return current
        await asyncio.sleep(min(0.05 * 2**round_, 0.25))
        current = await resend(current.request_state)
    return current


def input_responses(answers: Mapping[str, ElicitationAnswer], refused: Mapping[str, str]) -> InputResponses:
    """What the retry carries: each answer as an ``ElicitResult``, each refused request declined
    (an input response cannot carry an error; the server learns the request was not served)."""
    from mcp_types import ElicitResult

    responses: dict[str, Any] = {
        key: ElicitResult(action=answer.action, content=answer.content) for key, answer in answers.items()
    }
    for key in refused:
        responses[key] = ElicitResult(action="decline")
    return responses


AskPerson = Callable[[ElicitationQuestion], Awaitable[ElicitationAnswer]]
"""Records a question on the run and waits for a person's checked answer (the run's wiring)."""


class HoldOpen:
    """The 2025-11-25 path: the server sends ``elicitation/create`` while the call is open, and
    this callback (the SDK's ``elicitation_callback``) holds it open while a person answers.

    A form whose schema is not a flat object of primitives is refused with a JSON-RPC error
    (``INVALID_PARAMS``, the field named): told to the server, no person asked. An answer that
    takes longer than ``hold`` seconds (the policy's bound) is ``cancel``; past
    :data:`MAX_INPUT_ROUNDS` questions in one call every further one is refused. The request's
    JSON-RPC id is the question's key. Given to the client of a ledger call
    (:mod:`durable_agents.shell.ledger.held_calls` wires ``ask`` to the run's questions).
    """

    def __init__(self, server: str, tool: str, ask: AskPerson, *, hold: float) -> None:
        self.server, self.tool, self.ask, self.hold = server, tool, ask, hold
        self.rounds = 0

    async def __call__(self, context: Any, params: Any) -> Any:
        from mcp_types import INVALID_PARAMS, ElicitRequestURLParams, ElicitResult, ErrorData

        self.rounds += 1
        if self.rounds > MAX_INPUT_ROUNDS:
            said = f"refused: more than {MAX_INPUT_ROUNDS} requests for input in one call"
            return ErrorData(code=INVALID_PARAMS, message=said)
        key, message = str(context.request_id), params.message[:_MESSAGE_MAX]
        if isinstance(params, ElicitRequestURLParams):
            question = ElicitationQuestion(self.server, self.tool, key, message, None, url=params.url)
        else:
            problem = schema_problem(params.requested_schema)
            if problem is not None:
                return ErrorData(code=INVALID_PARAMS, message=f"refused: {problem}")
            schema = dict(params.requested_schema)
            question = ElicitationQuestion(self.server, self.tool, key, message, schema)
        try:
            async with asyncio.timeout(self.hold):
                answer = await self.ask(question)
        except TimeoutError:  # held as long as the policy allows: the person did not answer
            return ElicitResult(action="cancel")
        return ElicitResult(action=answer.action, content=answer.content)


async def refuse_elicitation(context: Any, params: Any) -> Any:
    """A listing's connection declares elicitation (a server may list the tools that ask only to
    such a client) but holds no call a person could answer for: any request is refused."""
    from mcp_types import INVALID_PARAMS, ErrorData

    return ErrorData(code=INVALID_PARAMS, message="refused: no call is open on a listing's connection")


def may_be_task(tool: Any) -> bool:
    """Whether ``tool`` (an SDK ``Tool``, None: not listed) may run as a task: its questions then
    go through the task (``tasks/get`` input_required, then ``tasks/result``), never a call held
    open: a caller that cannot hold its task calls it on a connection without elicitation."""
    execution = getattr(tool, "execution", None)
    return execution is not None and execution.task_support in ("optional", "required")


@cache  # building the adapter costs CPU: once per process
def call_result_adapter() -> Any:
    """A ``TypeAdapter`` for a ``tools/call`` answer: a ``CallToolResult`` or an
    ``InputRequiredResult`` (told apart by ``resultType``)."""
    from typing import Annotated

    from mcp_types import CallToolResult, InputRequiredResult
    from pydantic import Discriminator, Tag, TypeAdapter

    def kind(value: Any) -> str:
        tag = value.get("resultType") if isinstance(value, dict) else getattr(value, "result_type", None)
        return "input_required" if tag == "input_required" else "complete"

    return TypeAdapter(
        Annotated[
            Annotated[CallToolResult, Tag("complete")]
            | Annotated[InputRequiredResult, Tag("input_required")],
            Discriminator(kind),
        ]
    )
