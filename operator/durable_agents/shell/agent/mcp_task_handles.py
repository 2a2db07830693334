"""The task handle an MCP server may answer a ``tools/call`` with (the tasks extension
``io.modelcontextprotocol/tasks``, 2026-07-28), as the client declares, parses and keeps it: what
:mod:`.mcp_tools` needs of tasks (its calls declare the extension and return a handle) and
:mod:`.mcp_tasks` builds on (polling, cancelling), kept apart so neither imports the other's way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from durable_agents.shell.agent.mcp_answers import McpError, McpResult

__all__ = [
    "TASKS_EXTENSION",
    "McpTask",
    "McpTaskUnknown",
    "TaskPoll",
    "raw_answer",
    "task_of",
    "tasks_extension",
]

TASKS_EXTENSION: Final = "io.modelcontextprotocol/tasks"
_MESSAGE_MAX: Final = 512


@dataclass(frozen=True)
class McpTask:
    """A task the server answered a call with, or its state as ``tasks/get`` told it.
    ``protocol``: its form (:mod:`durable_agents.core.agent.mcp_tasks`; None: the extension);
    ``session``: the MCP session a 2025-11-25 task lives in."""

    id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None
    protocol: str | None = None
    session: str | None = None


class McpTaskUnknown(McpError):
    """The server answered that it does not know the task (or named another one)."""


@dataclass(frozen=True)
class TaskPoll:
    """What ``tasks/get`` said: the task's status, and for a completed task its result."""

    task: McpTask
    result: McpResult | None = None
    error: str | None = None


def tasks_extension() -> Any:
    """The client's declaration of the tasks extension, with the claim that lets a ``tools/call``
    answer be a task handle (``resultType: "task"``) instead of a result. The handle is only
    parsed here, never resolved by the SDK (which would poll within the call)."""
    from mcp.client.extension import ClientExtension, ResultClaim
    from mcp_types import CallToolResult, Result

    class TaskHandle(Result):
        result_type: Literal["task"] = "task"

    async def never(handle: TaskHandle, ctx: Any) -> CallToolResult:
        raise RuntimeError("a task handle is the ledger's to poll, not the SDK's")

    class Tasks(ClientExtension):
        identifier = TASKS_EXTENSION

        def claims(self) -> list[ResultClaim[Any]]:
            return [ResultClaim(result_type="task", model=TaskHandle, resolve=never)]

    return Tasks()


def task_of(raw: dict[str, Any]) -> McpTask:
    """A task handle or ``tasks/get`` answer as the operator keeps it (bounded strings)."""
    task_id, status = raw.get("taskId"), raw.get("status")
    if not isinstance(task_id, str) or not task_id or not isinstance(status, str):
        raise ValueError("a task without a taskId or a status")
    message = raw.get("statusMessage")
    interval = raw.get("pollIntervalMs", raw.get("pollInterval"))
    return McpTask(
        id=task_id[:256],
        status=status[:32],
        status_message=message[:_MESSAGE_MAX] if isinstance(message, str) else None,
        poll_interval_ms=interval if isinstance(interval, int) and interval >= 0 else None,
    )


def raw_answer() -> Any:
    """The SDK's result type for an answer taken as the JSON object it is (the SDK's type bound
    wants a model; a ``TypeAdapter`` of a dict is what it validates with all the same)."""
    from pydantic import TypeAdapter

    return TypeAdapter(dict[str, Any])
