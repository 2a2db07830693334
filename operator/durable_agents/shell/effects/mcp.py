"""``mcp.call``: a consequential call of a tool on an MCP server, through the action ledger.

target: ``{"server": <name in spec.agent>, "url": <streamable HTTP endpoint>, "tool": <name>}``,
written by the model planner from the run's spec (the model only supplies the arguments). The
idempotency key travels in the call's ``_meta`` (``durable-agents.io/idempotency-key``).

A result is applied (a tool error is the tool's definite answer: failed); a call that was never
sent (server unreachable, tool not listed) is a definite failure; a call sent without an answer
is unknown. MCP has no standard query by idempotency key: a server may declare one per tool
(``spec.agent.mcpServers[].queryTools``, carried as ``target.queryTool``); without it the query
answers unknown and the action stays ``outcome_unknown`` until a person reconciles it
(``kubectl agentrun reconcile``).

The server's credentials (``spec.agent.mcpServers[]``: bearer token, headers, CA bundle; the
dispatcher hands the run's entries in ``ctx.extra[MCP_SERVERS_EXTRA]``) are read as the run's
ServiceAccount before every dispatch and query: a rotated Secret is used by the next one; one
that cannot be read fails the call before anything is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from durable_agents.api.v1alpha1 import ActionTier, McpServer
from durable_agents.core.agent.mcp_elicitation import ElicitationAnswer
from durable_agents.shell.agent.credentials import Unresolvable, mcp_access
from durable_agents.shell.agent.mcp_elicitation import HoldOpen, input_responses
from durable_agents.shell.agent.mcp_tasks import McpTask, McpTaskUnknown, cancel_task, poll_task
from durable_agents.shell.agent.mcp_tools import (
    NO_ACCESS,
    McpAccess,
    McpCallUnknown,
    McpError,
    McpInputRequired,
    bounded_content,
    call_tool,
)
from durable_agents.shell.effects.base import (
    Action,
    Applied,
    DispatchResult,
    EffectContext,
    Failed,
    InputRequired,
    NotApplied,
    QueryResult,
    Tasked,
    TaskPollResult,
    Unknown,
)

NO_QUERY = "NoQueryByKey"
MCP_SERVERS_EXTRA = "mcpServers"
PROGRESS_EXTRA = "progress"
"""``ctx.extra`` entry: a callable given the call's progress notifications (the dispatcher's)."""
CREDENTIALS_UNREADABLE = "McpCredentialsUnreadable"
HOLD_EXTRA = "holdOpen"
"""``ctx.extra`` entry: what asks a person while the call is held open (2025-11-25 elicitation):
an object with ``ask`` (:data:`~durable_agents.shell.agent.mcp_elicitation.AskPerson`) and
``hold`` (seconds). Absent: the client does not declare elicitation."""
INPUT_EXTRA = "inputAnswers"
"""``ctx.extra`` entry: the :class:`McpInputAnswers` a retry after a request for input carries."""


@dataclass(frozen=True)
class McpInputAnswers:
    """What the retry of a call whose server asked for input carries: the person's answers by the
    server's keys, the keys refused before any person saw them (declined), the echoed state."""

    answers: Mapping[str, ElicitationAnswer]
    refused: list[str] = field(default_factory=list)
    request_state: str | None = None

    def responses(self) -> Any:
        return input_responses(self.answers, {key: "refused" for key in self.refused})


def _asked(err: McpInputRequired) -> InputRequired:
    asked = err.asked
    questions = {question.key: question.for_person() for question in asked.questions}
    return InputRequired(questions, dict(asked.refused), asked.request_state)


def run_mcp_servers(run: dict[str, Any] | None) -> list[Any]:
    """The run's MCP servers as read (None: the run is gone), for the context: its inline
    ``spec.agent.mcpServers``, or, for a run of an Agent, those its checkpoint pinned. Only the
    credential references are taken from here: they are read as the run's ServiceAccount, for the
    server the verified intent names, so an entry written by someone else reaches no more than the
    run itself may read."""
    inline = (((run or {}).get("spec") or {}).get("agent") or {}).get("mcpServers")
    if inline:
        return list(inline)
    pinned = (((run or {}).get("status") or {}).get("checkpoint") or {}).get("definition") or {}
    return list((pinned.get("agent") or {}).get("mcpServers") or [])


async def _access(ctx: EffectContext, name: object) -> McpAccess:
    """The credentials of the run's MCP server ``name``, read now as the run's ServiceAccount."""
    for entry in ctx.extra.get(MCP_SERVERS_EXTRA) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            try:
                server = McpServer.model_validate(entry)
            except ValidationError as err:
                raise Unresolvable(f"spec.agent.mcpServers[{name!r}] is invalid: {err}") from None
            return await mcp_access(ctx.kube, ctx.namespace, ctx.service_account, server)
    return NO_ACCESS


class McpCall:
    name = "mcp.call"
    tier = ActionTier.CONSEQUENTIAL
    reversible = False
    compensation: str | None = None

    async def dispatch(self, ctx: EffectContext, action: Action) -> DispatchResult:
        url, tool = action.target.get("url"), action.target.get("tool")
        if not isinstance(url, str) or not isinstance(tool, str):
            return Failed("InvalidTarget", "mcp.call needs target.url and target.tool")
        try:
            access = await _access(ctx, action.target.get("server"))
        except Unresolvable as err:  # nothing sent: a definite failure that names the Secret
            return Failed(CREDENTIALS_UNREADABLE, f"MCP server {action.target.get('server')!r}: {err}")
        given = ctx.extra.get(INPUT_EXTRA)
        answers = given if isinstance(given, McpInputAnswers) else None
        held = ctx.extra.get(HOLD_EXTRA)
        server = str(action.target.get("server") or url)
        # A call held open may last the hold besides the dispatch timeout.
        hold = HoldOpen(server, tool, held.ask, hold=held.hold + 5.0) if held is not None else None
        try:
            result = await call_tool(
                url,
                tool,
                action.arguments,
                idempotency_key=action.key,
                timeout=ctx.timeout + (held.hold + 5.0 if held is not None else 0.0),
                access=access,
                server=server,
                on_progress=ctx.extra.get(PROGRESS_EXTRA),
                elicitation=hold,
                tasks=True,
                input_responses=answers.responses() if answers is not None else None,
                request_state=answers.request_state if answers is not None else None,
            )
        except McpCallUnknown as err:
            return Unknown("McpCallUnknown", str(err))
        except McpInputRequired as err:  # a person answers first: nothing was applied
            if not err.asked.questions and not err.asked.refused:  # only "not yet", past the bound
                return Failed(type(err).__name__, str(err))
            return _asked(err)
        except McpError as err:  # not sent: unreachable, or the tool is not listed
            return Failed(type(err).__name__, str(err))
        if isinstance(result, McpTask):  # a durable handle: the dispatcher records it, then polls
            return Tasked(
                result.id,
                result.status,
                result.status_message,
                result.poll_interval_ms,
                protocol=result.protocol,
                session=result.session,
            )
        if result.is_error:
            return Failed("McpToolError", f"{tool} answered an error: {str(result.content)[:512]}")
        return Applied({"tool": tool, "content": bounded_content(result.content)})

    async def poll(
        self,
        ctx: EffectContext,
        action: Action,
        task_id: str,
        *,
        protocol: str | None = None,
        session: str | None = None,
    ) -> TaskPollResult:
        """``tasks/get`` once (``protocol``: the task's form, ``session``: its MCP session): the
        task's result once terminal, unknown when the server no longer knows the task, else the
        task as it stands (also when the server did not answer)."""
        url, tool = action.target.get("url"), str(action.target.get("tool"))
        if not isinstance(url, str):
            return Unknown("InvalidTarget", "mcp.call needs target.url")
        held = ctx.extra.get(HOLD_EXTRA)  # a 2025-11-25 task's questions: held_calls asks them
        server = str(action.target.get("server") or url)
        hold = HoldOpen(server, tool, held.ask, hold=held.hold + 5.0) if held is not None else None
        try:
            access = await _access(ctx, action.target.get("server"))
            polled = await poll_task(
                url,
                task_id,
                timeout=ctx.timeout + (held.hold + 5.0 if held is not None else 0.0),
                access=access,
                server=url,
                tool=tool,
                protocol=protocol,
                session=session,
                hold=hold,
            )
        except Unresolvable as err:  # asked again later: the Secret may come back
            return Tasked(task_id, "working", f"not polled: {err}"[:512])
        except McpTaskUnknown as err:
            return Unknown("McpTaskUnknown", str(err))
        except McpError as err:  # no answer: poll again later
            return Tasked(task_id, "working", f"not polled: {err}"[:512])
        task = polled.task
        if polled.result is not None:
            if polled.result.is_error:
                return Failed("McpToolError", f"{tool} answered an error: {str(polled.result.content)[:512]}")
            return Applied({"tool": tool, "task": task_id, "content": bounded_content(polled.result.content)})
        if task.status in ("failed", "cancelled"):
            return Failed(
                "McpTaskFailed" if task.status == "failed" else "McpTaskCancelled",
                f"task {task_id} {task.status}: {polled.error}",
            )
        return Tasked(task.id, task.status, task.status_message, task.poll_interval_ms)

    async def cancel(
        self,
        ctx: EffectContext,
        action: Action,
        task_id: str,
        *,
        protocol: str | None = None,
        session: str | None = None,
    ) -> str:
        """``tasks/cancel``: the server's answer in words."""
        url = action.target.get("url")
        if not isinstance(url, str):
            return "not sent: no target.url"
        try:
            access = await _access(ctx, action.target.get("server"))
        except Unresolvable as err:
            return f"not sent: {err}"[:512]
        return await cancel_task(
            url, task_id, timeout=ctx.timeout, access=access, server=url, protocol=protocol, session=session
        )

    async def query(self, ctx: EffectContext, action: Action) -> QueryResult:
        url, query = action.target.get("url"), action.target.get("queryTool")
        if isinstance(url, str) and isinstance(query, str):
            try:
                access = await _access(ctx, action.target.get("server"))
            except Unresolvable as err:
                return Unknown(CREDENTIALS_UNREADABLE, str(err))
            return await self._ask(ctx, url, query, action.key, access)
        return Unknown(
            NO_QUERY,
            f"MCP has no query by idempotency key: ask the server's owner whether "
            f"{action.target.get('tool')!r} applied key {action.key}, then "
            "`kubectl agentrun reconcile RUN --action NAME --applied|--not-applied`",
        )

    async def _ask(
        self, ctx: EffectContext, url: str, query: str, key: str, access: McpAccess
    ) -> QueryResult:
        """The server's own query tool: ``{"idempotencyKey": key}`` -> ``{"applied": bool}``."""
        try:
            result = await call_tool(
                url,
                query,
                {"idempotencyKey": key},
                idempotency_key=None,
                timeout=ctx.timeout,
                access=access,
                server=url,
            )
        except McpError as err:
            return Unknown(type(err).__name__, str(err))
        applied = result.content.get("applied") if isinstance(result.content, dict) else None
        if result.is_error or not isinstance(applied, bool):
            return Unknown("QueryUnanswered", f"{query} gave no applied: true|false for key {key}")
        return (
            Applied({"tool": query, "content": bounded_content(result.content)}) if applied else NotApplied()
        )
