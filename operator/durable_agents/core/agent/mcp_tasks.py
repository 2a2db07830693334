"""Which form of MCP tasks a call uses, and whether the client asks for a task at all. Pure.

Two forms of tasks exist:

* the tasks extension ``io.modelcontextprotocol/tasks`` of the 2026-07-28 protocol (SEP-2663):
  the client declares the extension and the server decides to answer a ``tools/call`` with a
  task handle (``resultType: "task"``); polled with ``tasks/get``, which carries the result;
* the 2025-11-25 protocol's tasks: a tool declares ``execution.taskSupport`` (``forbidden``,
  ``optional``, ``required``) in its ``tools/list`` entry, the server declares
  ``tasks.requests.tools.call``, and the client asks for a task by a ``task`` field in the
  ``tools/call`` params; the server answers a ``CreateTaskResult``; ``tasks/get`` tells the
  status, ``tasks/result`` fetches the payload once terminal. A 2025-11-25 task lives in the MCP
  session that created it (the reference server keeps its tasks per session), so the session is
  part of the handle.

:func:`ask_for_task` decides, for one call, from what the server listed and negotiated, whether
the ``tools/call`` carries a ``task`` field.
"""

from __future__ import annotations

from typing import Final, Literal

TASK_FORM_EXTENSION: Final = "2026-07-28"
"""``status.task.protocol`` of a task of the tasks extension (absent on records written before)."""
TASK_FORM_2025: Final = "2025-11-25"
"""``status.task.protocol`` of a task of the 2025-11-25 protocol (a session is part of it)."""
TASK_FORMS: Final = frozenset({TASK_FORM_EXTENSION, TASK_FORM_2025})
TASK_TTL_MS: Final = 24 * 3600 * 1000
"""The retention asked of the server for a task (``task.ttl``): the default bound of an external
wait (``waitExpiries.external``); the server decides what it keeps."""

TaskSupport = Literal["forbidden", "optional", "required"]


def task_form(protocol: str | None) -> str:
    """The form of a recorded task: records written before the 2025-11-25 form have none."""
    return protocol if protocol in TASK_FORMS else TASK_FORM_EXTENSION


def ask_for_task(
    *, can_hold: bool, negotiated: str | None, server_tasks_tools_call: bool, task_support: str | None
) -> bool:
    """Whether the ``tools/call`` asks for a task (a ``task`` field, 2025-11-25).

    ``can_hold``: the caller keeps a task as a durable handle (a ledger dispatch; a read-only call
    of the worker cannot, it has no record to poll from). ``negotiated``: the protocol version of
    the connection. ``server_tasks_tools_call``: the server declares ``tasks.requests.tools.call``
    (without it a client must not ask, whatever the tool says). ``task_support``: the tool's
    ``execution.taskSupport`` (absent: ``forbidden``).

    A tool that says ``optional`` is asked for a task by a client that can hold one: a long call
    then never holds a connection open for its whole length. A ``required`` tool called by a
    caller that cannot hold a task is sent without one: the server refuses it, and that refusal is
    the caller's answer.
    """
    return (
        can_hold
        and negotiated == TASK_FORM_2025
        and server_tasks_tools_call
        and task_support in ("optional", "required")
    )
