"""The progress of an action in flight as people see it (issue 36, item 4): ``kubectl agentrun
status`` and the console show the ActionRecord's ``status.progress``, the server's message quoted
and escaped (it is the server's text, not the operator's); a settled record shows none."""

from __future__ import annotations

import re
from typing import Any

import pytest

from durable_agents.console.app import templates
from durable_agents.kubectl.progress import record_lines

pytestmark = pytest.mark.unit

AT = "2026-12-03T16:00:00Z"


def record(state: str, progress: dict[str, Any] | None) -> dict[str, Any]:
    status: dict[str, Any] = {"state": state, "attempts": 1}
    if progress is not None:
        status["progress"] = progress
    spec = {"stepIndex": 2, "effect": "mcp.call", "tier": "consequential"}
    return {"metadata": {"name": "ar-1"}, "spec": spec, "status": status}


SAID = {"progress": 7.0, "total": 10.0, "notifications": 40, "at": AT, "message": "<b>step</b> 7\x1b[2J"}


def test_the_plugin_shows_progress_in_flight_with_the_servers_words_escaped() -> None:
    lines = record_lines(record("dispatching", SAID))
    assert lines[0] == "In flight:   mcp.call at step 2 (ar-1), attempt 1"
    assert lines[1] == (
        f'  progress:  7/10 at {AT} (40 notifications), server says "<b>step</b> 7\\u001b[2J"'
    )
    assert "\x1b" not in "".join(lines), "no control character of the server reaches the terminal"


def test_nothing_is_shown_for_a_settled_record_or_an_intent_not_sent() -> None:
    assert record_lines(record("succeeded", None)) == []
    assert record_lines(record("intent", None)) == []
    assert record_lines(record("dispatching", None)) == ["In flight:   mcp.call at step 2 (ar-1), attempt 1"]


def test_the_console_shows_progress_in_the_ledger_escaped() -> None:
    page = templates().get_template("run_story.html")
    html = page.render(
        actions=[record("dispatching", SAID)],
        why={},
        possible=set(),
        conditions=[],
        shown=lambda value: "" if value is None else str(value),
        page_url="/runs/ns/r",
        csrf="c",
    )
    [shown] = re.findall(r'<span class="progress">(.*?)</span>', html)
    assert shown.startswith(f"progress 7.0/10.0 at {AT}, server says ")
    assert "<b>" not in shown, "the server's markup is escaped"


TASK = {"id": "t-1", "server": "http://s/mcp", "status": "working", "polls": 3, "createdAt": AT}


def with_task(state: str, **task: Any) -> dict[str, Any]:
    shown = record(state, None)
    shown["status"]["task"] = {**TASK, **task}
    return shown


def test_the_plugin_shows_the_task_waited_on_with_the_servers_words_escaped() -> None:
    """Also for a record sent under its first claim (still ``intent``) that waits on its task."""
    for state in ("dispatching", "intent"):
        lines = record_lines(with_task(state, statusMessage="half \x1b[2J done"))
        assert lines[1] == '  task:      "t-1" working, polled 3 times, server says "half \\u001b[2J done"'
    canceled = record_lines(with_task("dispatching", cancelRequestedAt=AT, cancelAnswer="cancelled"))
    assert canceled[1].endswith(', cancel asked: "cancelled"')


def test_the_console_shows_the_task_escaped() -> None:
    page = templates().get_template("run_story.html")
    html = page.render(
        actions=[with_task("dispatching", statusMessage="<i>half</i>")],
        why={},
        possible=set(),
        conditions=[],
        shown=lambda value: "" if value is None else str(value),
        page_url="/runs/ns/r",
        csrf="c",
    )
    [shown] = re.findall(r'<span class="task">(.*?)</span>', html)
    assert shown.startswith('task "t-1" working, polled 3 times, server says ')
    assert "<i>" not in shown, "the server's markup is escaped"
