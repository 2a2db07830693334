"""ActionRecord: the dispatcher (made here, when this process runs one) takes every record's
change and, from the manager's AgentRun reflector, the runs a person answered a reconciliation
for; the stuck check learns of unknown outcomes; a run waits on its records' outcomes (and
their systems' questions)."""

from __future__ import annotations

from typing import Any

import kopf

from durable_agents.api.v1alpha1 import GROUP, VERSION, ActionState
from durable_agents.core.ledger import TERMINAL_ACTION_STATES
from durable_agents.shell.ledger.dispatcher import Dispatcher
from durable_agents_controllers.manager import Manager

# What a run acts on: a settled outcome, or its system asking a person for input (a question).
TERMINAL = frozenset(s.value for s in TERMINAL_ACTION_STATES) | {ActionState.INPUT_REQUIRED.value}


def build(manager: Manager) -> None:
    # Dispatchers may run as a separate deployment: "off" leaves intents to another process.
    if not manager.config.dispatcher:
        return
    dispatcher = Dispatcher(manager.kube, manager.dispatch, policies=manager.policies)
    manager.dispatcher = dispatcher
    manager.runs.subscribe(dispatcher.observe_run)  # a person's reconciliation: asked at once
    manager.runnables.add(dispatcher)


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    manager.builds.append(build)

    @kopf.on.event(GROUP, VERSION, "actionrecords", registry=registry)
    async def actionrecord_event(event: kopf.RawEvent, **_: Any) -> None:
        body: dict[str, Any] = dict(event["object"])
        ledger = manager.dispatcher
        if ledger is not None:
            ledger.observe(event.get("type"), body)
        if manager.stuck is not None:  # an unknown outcome nobody can query makes its run stuck
            manager.stuck.observe_action(event.get("type"), body)
        status: dict[str, Any] = body.get("status") or {}
        # A call held open that went on or was lost: its run's question closes.
        held = bool((status.get("input") or {}).get("heldOpen"))
        if status.get("state") in TERMINAL or held:
            spec: dict[str, Any] = body.get("spec") or {}
            run = (spec.get("runRef") or {}).get("name")
            if run:
                manager.worker.enqueue((body["metadata"]["namespace"], run))
