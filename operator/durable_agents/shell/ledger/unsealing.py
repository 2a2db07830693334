"""Where the dispatcher meets sealed values: arguments unsealed right before an effect is called,
and the effect's response sealed before it is written to the ActionRecord.

The data key is the run's (its ``durable-agents.io/data-key`` annotation, opened with the
operator's keyring). A run created before sealing has none: its values are in clear already, and
its responses are stored as they come (the only case where one is).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from durable_agents.api.v1alpha1 import ActionRecordSpec
from durable_agents.core.agent_facts import turn_label
from durable_agents.core.sealed_values import (
    DATA_KEY_ANNOTATION,
    DataKey,
    ValueSealingError,
    is_sealed,
    open_data_key,
    outcome_label,
    seal_value,
    step_label,
    unseal_value,
)
from durable_agents.core.sealing import Keyring, UndecryptableError
from durable_agents.shell.effects.base import Action

UNDECRYPTABLE = "Undecryptable"


class CannotUnseal(Exception):
    """An action's sealed arguments cannot be opened here: nothing is sent (a definite failure)."""


def data_key_of(run_body: Mapping[str, Any] | None, keyring: Keyring | None) -> DataKey | None:
    """The run's data key; None for a run without one. :class:`CannotUnseal` when it has one
    that this keyring cannot open."""
    meta = (run_body or {}).get("metadata") or {}
    annotation = (meta.get("annotations") or {}).get(DATA_KEY_ANNOTATION)
    if annotation is None:
        return None
    if keyring is None:
        raise CannotUnseal("this operator has no sealing keyring")
    try:
        return open_data_key(keyring, annotation, str(meta.get("namespace", "")), str(meta.get("name", "")))
    except UndecryptableError as err:
        raise CannotUnseal(str(err)) from err


def _step_name(run_body: Mapping[str, Any] | None, index: int) -> str:
    steps = ((run_body or {}).get("spec") or {}).get("steps") or []
    step = steps[index] if 0 <= index < len(steps) else None
    return str(step.get("name", "")) if isinstance(step, Mapping) else ""


def _arguments_label(spec: ActionRecordSpec, run_body: Mapping[str, Any] | None) -> str:
    """The label the arguments were sealed under: a scripted step's, or (a model planner's call)
    the label of the checkpoint's turn at that step holding exactly these sealed arguments."""
    checkpoint = ((run_body or {}).get("status") or {}).get("checkpoint") or {}
    turns = (checkpoint.get("agent") or {}).get("turns") or []
    for turn in reversed(turns if isinstance(turns, list) else []):
        if (
            isinstance(turn, Mapping)
            and turn.get("stepIndex") == spec.step_index
            and turn.get("arguments") == spec.arguments
            and isinstance(turn.get("index"), int)
        ):
            return turn_label(turn["index"], "arguments")
    return step_label(_step_name(run_body, spec.step_index), "arguments")


def action_of(spec: ActionRecordSpec, run_body: Mapping[str, Any] | None, keyring: Keyring | None) -> Action:
    """What the effect is called with: the record's arguments, unsealed."""
    arguments: Any = spec.arguments or {}
    if is_sealed(arguments):
        data_key = data_key_of(run_body, keyring)
        if data_key is None:
            raise CannotUnseal("the arguments are sealed and the run has no data key")
        try:
            arguments = unseal_value(data_key, arguments, _arguments_label(spec, run_body))
        except ValueSealingError as err:
            raise CannotUnseal(str(err)) from err
        if not isinstance(arguments, dict):
            raise CannotUnseal("the sealed arguments are not an object")
    return Action(spec.idempotency_key, spec.target or {}, arguments)


def sealed_outcome(
    outcome: Mapping[str, Any] | None, data_key: DataKey | None, record_name: str
) -> dict[str, Any] | None:
    """The response as the ActionRecord stores it: sealed whenever the run has a data key."""
    if outcome is None:
        return None
    if data_key is None:
        return dict(outcome)
    sealed: dict[str, Any] = seal_value(
        data_key, dict(outcome), outcome_label(record_name), entropy=os.urandom
    )
    return sealed
