"""``kubectl agentrun status``: the run's actions in flight, with the progress the called system
reported (an MCP server's progress notifications, written by the dispatcher at most once per few
seconds: ``status.progress`` of the ActionRecord), and the task it waits on (an MCP server's task:
``status.task``, its status and the server's status message, written at each poll).

The progress and task messages are the server's text, not the operator's: shown quoted with every character
outside printable ASCII escaped, so it cannot move the cursor or pass for the operator's words.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.api.v1alpha1.labels import RUN_LABEL
from durable_agents.core.retention import label_value


def _amount(progress: dict[str, Any]) -> str:
    done, total = progress.get("progress"), progress.get("total")
    shown = f"{done:g}" if isinstance(done, int | float) else "?"
    return f"{shown}/{total:g}" if isinstance(total, int | float) else shown


def record_lines(record: dict[str, Any]) -> list[str]:
    """One in-flight ActionRecord as printed: dispatching, or sent under its first claim (its
    state still ``intent``) with progress reported; nothing for any other record."""
    status, spec = record.get("status") or {}, record.get("spec") or {}
    if status.get("state") not in ("intent", "dispatching") or (
        status.get("state") == "intent" and not status.get("progress") and not status.get("task")
    ):
        return []  # settled, unknown, or an intent not sent yet
    name = record["metadata"]["name"]
    lines = [
        f"In flight:   {spec.get('effect')} at step {spec.get('stepIndex')} ({name}), "
        f"attempt {status.get('attempts', 0)}"
    ]
    progress = status.get("progress")
    if isinstance(progress, dict):
        said = progress.get("message")
        words = f", server says {json.dumps(said, ensure_ascii=True)}" if isinstance(said, str) else ""
        lines.append(
            f"  progress:  {_amount(progress)} at {progress.get('at')} "
            f"({progress.get('notifications', 0)} notifications){words}"
        )
    task = status.get("task")
    if isinstance(task, dict):
        said = task.get("statusMessage")
        words = f", server says {json.dumps(said, ensure_ascii=True)}" if isinstance(said, str) else ""
        canceled = (
            f", cancel asked: {json.dumps(task.get('cancelAnswer'))}" if task.get("cancelRequestedAt") else ""
        )
        lines.append(
            f"  task:      {json.dumps(task.get('id'), ensure_ascii=True)} {task.get('status')}, "
            f"polled {task.get('polls', 0)} times{words}{canceled}"
        )
    return lines


def in_flight_lines(api: client.CustomObjectsApi, ns: str, run: dict[str, Any]) -> list[str]:
    """The lines of the run's actions in flight (a record list refused: one line that says so)."""
    selector = f"{RUN_LABEL}={label_value(run['metadata']['name'])}"
    try:
        records = api.list_namespaced_custom_object(
            GROUP, VERSION, ns, "actionrecords", label_selector=selector
        )
    except ApiException as err:
        return [f"In flight:   (the run's ActionRecords could not be listed: {err.status} {err.reason})"]
    items = sorted(records.get("items") or [], key=lambda r: r["metadata"]["name"])
    return [line for record in items for line in record_lines(record)]
