"""A reference MCP server whose consequential tool answers with a task (the tasks extension
``io.modelcontextprotocol/tasks`` of the 2026-07-28 protocol; issue 36, item 2).

The MCP SDK keeps tasks as types only, so the server is the SDK's low-level ``Server`` with the
extension's methods added by hand:

``compile_report`` ``{"topic": str}``
    Consequential (``readOnlyHint=false``). With the client's tasks extension declared (its
    ``_meta`` client capabilities), it answers ``{"resultType": "task", "taskId", "status":
    "working", "pollIntervalMs"}`` at once and counts one *call* under the request's idempotency
    key; without it, a tool error ("task augmentation required"), nothing counted. A task works
    until the test releases it (:meth:`TaskServerThread.finish`): no clock decides anything.
``tasks/get`` ``{"taskId"}``
    The task (its ``statusMessage`` says how many times it was polled); once completed, its
    result inline (``result``: the ``CallToolResult``), counted as one *fetch*. An unknown ID is
    a JSON-RPC error (``INVALID_PARAMS``), as after a server restart (:meth:`forget`).
``tasks/cancel`` ``{"taskId"}``
    Cancels a working task (counted) and answers it, ``status: "cancelled"``.

:meth:`TaskServerThread.reuse` makes the next task reuse an existing task ID (a server that mixes
its tasks up).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    RequestParams,
    TextContent,
    Tool,
    ToolAnnotations,
)
from pydantic import Field

from durable_agents_testkit.mcpserver import IDEMPOTENCY_META_KEY, McpServerThread

__all__ = ["TASKS_EXTENSION", "TOOL", "TaskServerThread", "Tasks", "make_task_server"]

TASKS_EXTENSION: Final = "io.modelcontextprotocol/tasks"
TOOL: Final = "compile_report"
_CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"


@dataclass
class Task:
    id: str
    key: str
    topic: str
    status: str = "working"
    polls: int = 0


@dataclass
class Tasks:
    """The server's state; used from its event loop only."""

    tasks: dict[str, Task] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    """compile_report calls per idempotency key (each one started a task)."""
    fetches: dict[str, int] = field(default_factory=dict)
    """Completed results handed out per task ID."""
    cancels: list[str] = field(default_factory=list)
    """Task IDs canceled by tasks/cancel."""
    reuse_next: str | None = None
    on_poll: Callable[[str], Any] | None = None
    """Called with the task ID at each tasks/get, before it is answered; what it returns is kept
    in ``seen_at_polls`` (a test reads the ActionRecord there: was the ID in it before the poll?)."""
    seen_at_polls: list[Any] = field(default_factory=list)
    broken: bool = False
    """Completed tasks answer a result that is not a ``CallToolResult``."""

    def answer(self, task: Task) -> dict[str, Any]:
        return {
            "resultType": "task",
            "taskId": task.id,
            "status": task.status,
            "statusMessage": f"compiling {task.topic}: polled {task.polls} times",
            "pollIntervalMs": 200,
        }


class _TaskId(RequestParams):
    task_id: str = Field(alias="taskId")


def _declared_tasks(params: CallToolRequestParams) -> bool:
    capabilities = (params.meta or {}).get(_CAPABILITIES_META) or {}
    return TASKS_EXTENSION in (
        (capabilities.get("extensions") or {}) if isinstance(capabilities, dict) else {}
    )


def make_task_server(state: Tasks) -> Server[Any]:
    tool = Tool(
        name=TOOL,
        description="Compile a report on a topic. Long: answered with a task.",
        input_schema={
            "type": "object",
            "properties": {"topic": {"type": "string"}},
            "required": ["topic"],
            "additionalProperties": False,
        },
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
    )

    async def list_tools(
        ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return ListToolsResult(tools=[tool])

    async def call_tool(ctx: ServerRequestContext[Any], params: CallToolRequestParams) -> Any:
        if params.name != TOOL:
            return CallToolResult(content=[TextContent(text=f"unknown tool {params.name!r}")], is_error=True)
        if not _declared_tasks(params):
            return CallToolResult(content=[TextContent(text="task augmentation required")], is_error=True)
        key = str((params.meta or {}).get(IDEMPOTENCY_META_KEY) or "")
        state.calls[key] = state.calls.get(key, 0) + 1
        task_id, state.reuse_next = state.reuse_next or secrets.token_hex(12), None
        task = Task(task_id, key, str((params.arguments or {}).get("topic")))
        state.tasks.setdefault(task_id, task)  # a reused ID keeps its first task
        return state.answer(task)

    def known(task_id: str) -> Task:
        if task_id not in state.tasks:
            raise MCPError(INVALID_PARAMS, f"unknown task {task_id!r}")
        return state.tasks[task_id]

    async def get(ctx: ServerRequestContext[Any], params: _TaskId) -> dict[str, Any]:
        task = known(params.task_id)
        if state.on_poll is not None:
            state.seen_at_polls.append(state.on_poll(task.id))
        task.polls += 1
        answer = state.answer(task) | {"resultType": "complete"}
        if task.status == "completed":
            state.fetches[task.id] = state.fetches.get(task.id, 0) + 1
            report = {"report": f"{task.topic}: 3 findings", "idempotencyKey": task.key}
            content = [{"type": "text", "text": json.dumps(report)}]
            answer["result"] = {"content": "not a list"} if state.broken else {"content": content}
        return answer

    async def cancel(ctx: ServerRequestContext[Any], params: _TaskId) -> dict[str, Any]:
        task = known(params.task_id)
        if task.status == "working":
            task.status = "cancelled"
            state.cancels.append(task.id)
        return state.answer(task) | {"resultType": "complete", "statusMessage": "cancelled on request"}

    server: Server[Any] = Server(
        "durable-agents-tasks", version="1", on_list_tools=list_tools, on_call_tool=call_tool
    )
    server.add_request_handler("tasks/get", _TaskId, get)
    server.add_request_handler("tasks/cancel", _TaskId, cancel)
    return server


class TaskServerThread(McpServerThread):
    """:class:`McpServerThread` serving :func:`make_task_server` (the ticket system unused)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.state = Tasks()
        self._server = make_task_server(self.state)

    def calls(self) -> dict[str, int]:
        return self.call(lambda: dict(self.state.calls))

    def fetches(self) -> dict[str, int]:
        return self.call(lambda: dict(self.state.fetches))

    def cancels(self) -> list[str]:
        return self.call(lambda: list(self.state.cancels))

    def polls(self, task_id: str) -> int:
        return self.call(lambda: self.state.tasks[task_id].polls)

    def task_ids(self) -> list[str]:
        return self.call(lambda: list(self.state.tasks))

    def on_poll(self, check: Callable[[str], Any]) -> None:
        """Call ``check`` (blocking the server, briefly) at every poll; see ``seen_at_polls``."""

        def hook() -> None:
            self.state.on_poll = check

        self.call(hook)

    def seen_at_polls(self) -> list[Any]:
        return self.call(lambda: list(self.state.seen_at_polls))

    def finish(self) -> None:
        """Every working task completes."""

        def done() -> None:
            for task in self.state.tasks.values():
                if task.status == "working":
                    task.status = "completed"

        self.call(done)

    def break_results(self) -> None:
        """Completed tasks answer an unreadable result from now on."""

        def broken() -> None:
            self.state.broken = True

        self.call(broken)

    def forget(self) -> None:
        """Forget every task (a server restart)."""
        self.call(self.state.tasks.clear)

    def reuse(self, task_id: str) -> None:
        def reuse() -> None:
            self.state.reuse_next = task_id

        self.call(reuse)
