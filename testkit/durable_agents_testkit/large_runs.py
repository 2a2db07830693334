"""A run of the largest admitted size that keeps the operator working: for the admission-latency
benchmark (``bench.admission``) and its e2e test (``e2e/test_admission_latency.py``).

Its spec is filled to the creation budget (``core/limits.py``: 448 KiB as stored, sealed values
counted sealed) with effects whose arguments are 64 KiB each, interleaved with await steps whose
events are given up front: every step commits at once, so the operator keeps loading, verifying,
deciding and writing a run of that size, step after step, for as long as it lasts.
"""

from __future__ import annotations

from typing import Any

from durable_agents.core.digest import canonical_json
from durable_agents.core.limits import CREATE_BUDGET, MAX_VALUE_BYTES, stored_size

EFFECTS = 5
"""Effects with 64 KiB arguments; the last one's target is padded to fill the budget."""
MARGIN = 2048
"""Left free under the budget for what the webhook adds (createdBy and its stamp, the data key)."""


def _effect(name: str, url: str, blob: str, pad: str = "") -> dict[str, Any]:
    target = {"url": f"{url}/effects", "queryUrl": f"{url}/effects", **({"pad": pad} if pad else {})}
    return {
        "name": name,
        "effect": {"effect": "http.post", "target": target, "arguments": {"blob": blob, "step": name}},
    }


def _spec(url: str, awaits: int, last_pad: int, hold: bool) -> dict[str, Any]:
    full = "x" * (MAX_VALUE_BYTES - len(canonical_json({"blob": "", "step": "pay-0"})))
    effects = [_effect(f"pay-{i}", url, full) for i in range(EFFECTS - 1)]
    effects.append(_effect(f"pay-{EFFECTS - 1}", url, full, "t" * last_pad))
    waits = [{"name": f"wait-{i}", "await": {"event": f"e{i}"}} for i in range(awaits)]
    steps: list[dict[str, Any]] = []
    per_effect = max(1, awaits // EFFECTS)
    for i, effect in enumerate(effects):  # awaits spread between the effects
        steps += waits[i * per_effect : (i + 1) * per_effect] if i < EFFECTS - 1 else waits[i * per_effect :]
        steps.append(effect)
    if hold:  # then it waits for an event nobody gives: a live run until cancelled
        steps.append({"name": "hold", "await": {"event": "hold"}})
    steps.append({"name": "done", "complete": {"result": "ok"}})
    return {
        "taskType": "largest",
        "objective": "o" * 4096,
        "steps": steps,
        "events": {f"e{i}": "now" for i in range(awaits)},
    }


def largest_run(url: str, name: str, awaits: int = 40, hold: bool = False) -> dict[str, Any]:
    """The spec of a run named ``name`` whose effects post to the reference system at ``url``,
    as large as the webhook admits at creation (within :data:`MARGIN`); ``awaits`` + 5 effects +
    1 steps (the schema allows 64), and with ``hold`` a last await that is never given."""
    low, high = 0, MAX_VALUE_BYTES - 256
    while low < high:  # the largest padding that fits
        pad = (low + high + 1) // 2
        if size_of(name, _spec(url, awaits, pad, hold)) <= CREATE_BUDGET - MARGIN:
            low = pad
        else:
            high = pad - 1
    return _spec(url, awaits, low, hold)


def size_of(name: str, spec: dict[str, Any]) -> int:
    """Bytes as stored (what the webhook's creation budget counts), with a data key annotation."""
    probe = {
        "metadata": {"name": name, "annotations": {"durable-agents.io/data-key": "k" * 80}},
        "spec": spec,
    }
    return stored_size(probe)
