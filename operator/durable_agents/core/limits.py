"""Limits on what an AgentRun may hold, checked by the admission webhook before anything recursive
runs on the object (sealing, kopf's diff, pydantic): a run that passes fits in etcd together with
the largest status the operator will write for it, and a run that does not is refused with a
message naming the field.

The walk over the raw admission object is iterative (an explicit stack), with a depth counter and
a byte budget, so a document nested 10 000 levels deep or megabytes large costs a bounded amount of
work and never a RecursionError. Only once it has passed do the field checks (canonical JSON of the
arguments, the durations) run, on values whose depth is then known to be small.

The numbers, and why they fit (tests/unit/test_limits.py computes the status's worst case):
etcd refuses a request over 1.5 MiB (``--max-request-bytes``, default 1 572 864). An AgentRun is
metadata + spec + status. The webhook keeps metadata + spec (as stored: sealed values are about
4/3 of their plaintext) at most :data:`CREATE_BUDGET` when the run is created and at most
:data:`UPDATE_BUDGET` afterwards (the difference is the room for answers, events, decisions and
cancellations given to a live run), and the status's worst case is at most :data:`STATUS_ROOM`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from durable_agents.api.v1alpha1.meta import MAX_DURATION
from durable_agents.core.digest import canonical_json
from durable_agents.core.sealed_values import PLAINTEXT_LIMIT, SEALED_KEY, TOKEN_PREFIX, is_sealed, spec_slots

ETCD_REQUEST_LIMIT: Final = 1_572_864
"""etcd's default ``--max-request-bytes`` (the local plane and kind keep the default)."""
MAX_NESTING: Final = 32
"""Levels of nesting in one step's ``arguments`` or ``target`` (the object itself is level 1)."""
MAX_VALUE_BYTES: Final = 64 * 1024
"""One step's ``arguments`` or ``target``, in canonical JSON, before sealing."""
MAX_OBJECTIVE: Final = 4096
MAX_REQUESTS_BYTES: Final = 64 * 1024
"""All answers and events of a run together, in clear (each is at most 4096 characters)."""
CREATE_BUDGET: Final = 448 * 1024
"""metadata + spec of a new run, as stored (sealed values counted sealed)."""
UPDATE_BUDGET: Final = 576 * 1024
"""metadata + spec of a live run: the room above CREATE_BUDGET takes answers, events, decisions."""
STATUS_ROOM: Final = ETCD_REQUEST_LIMIT - UPDATE_BUDGET - 64 * 1024
"""What the status may take at most (64 KiB stay free for etcd's and the encryption's overhead)."""
MAX_DURATION_SECONDS: Final = 365 * 24 * 3600
_MAX_WALK_DEPTH: Final = 64
"""Anywhere in the object: the schema's own nesting plus MAX_NESTING fits well under this."""
_WALK_BYTES: Final = 8 * 1024 * 1024
"""The walk stops counting here (the API server takes at most 3 MiB per request)."""
_DURATION = re.compile(r"^([0-9]{1,6}(\.[0-9]{1,6})?(ms|s|m|h))+$")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
BY_REFERENCE: Final = (
    "put a large value in a Secret and pass a Secret reference in its place: "
    '{"valueFrom": {"secretKeyRef": {"name": ..., "key": ...}}} (read as the run\'s '
    "ServiceAccount right before the effect runs)"
)

ANSWER_BY_REFERENCE: Final = (
    "put a large value in a Secret and answer with its name: an effect reads it with a Secret "
    'reference in its arguments, {"valueFrom": {"secretKeyRef": {"name": ..., "key": ...}}}'
)

Path = tuple[str | int, ...]


class LimitExceeded(ValueError):
    """A run beyond a limit: ``field`` is the path (``spec.steps[0].effect.arguments``)."""

    def __init__(self, field: str, message: str, at: Path = ()) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.at = field, message, at


def dotted(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def _short(path: Path, keep: int = 8) -> str:
    """A path for a message: a deeply nested one is cut after ``keep`` parts."""
    return dotted(path) if len(path) <= keep else f"{dotted(path[:keep])}..."


@dataclass(frozen=True)
class Walked:
    depth: int
    """Deepest level below the walked value (a scalar is 0, ``{}`` is 1)."""
    size: int
    """Its JSON size in bytes (compact; strings as UTF-8 with escapes)."""


def _scalar_size(value: Any) -> int:
    if isinstance(value, str):
        if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
            return len(value) + 2  # nothing to escape (the common case, and a 64 KiB blob's)
        return len(json.dumps(value, ensure_ascii=False).encode())
    return len(json.dumps(value)) if isinstance(value, bool | int | float) or value is None else 4


MAX_SAFE_INTEGER = 2**53 - 1


def walk(value: Any, path: Path = (), max_depth: int = _MAX_WALK_DEPTH, budget: int = _WALK_BYTES) -> Walked:
    """Depth and size of ``value`` without recursion; :class:`LimitExceeded` (naming the path)
    past ``max_depth`` levels or ``budget`` bytes."""
    stack: list[tuple[Any, int, Path]] = [(value, 0, path)]
    size = deepest = 0
    while stack:
        node, depth, where = stack.pop()
        if isinstance(node, Mapping):
            depth += 1
            size += 2 * len(node) + 1 if node else 2  # braces, colons and commas
            for key, child in node.items():
                size += _scalar_size(str(key))
                stack.append((child, depth, (*where, str(key))))
        elif isinstance(node, list):
            depth += 1
            size += len(node) + 1 if node else 2
            stack.extend((child, depth, (*where, i)) for i, child in enumerate(node))
        else:
            if isinstance(node, int) and not isinstance(node, bool) and abs(node) > MAX_SAFE_INTEGER:
                raise LimitExceeded(
                    dotted(where) or "object",
                    f"the integer {str(node)[:24]} is beyond ±2^53 (JSON numbers are exact only up to "
                    "there; canonical JSON refuses it): give it as a string",
                    where,
                )
            if isinstance(node, float) and (not math.isfinite(node) or abs(node) > MAX_SAFE_INTEGER):
                raise LimitExceeded(
                    dotted(where) or "object",
                    f"the number {node!r} is beyond ±2^53: give it as a string",
                    where,
                )
            size += _scalar_size(node)
        deepest = max(deepest, depth)
        if depth > max_depth:
            raise LimitExceeded(
                dotted(path) or "object",
                f"nested more than {max_depth} levels deep (at {_short(where)})",
                where,
            )
        if size > budget:
            raise LimitExceeded(dotted(path) or "object", f"larger than {budget} bytes")
    return Walked(deepest, size)


def sealed_size(plaintext_bytes: int, is_string: bool) -> int:
    """Bytes of a sealed value in the stored JSON: ``"sealed:v1:" + base64(nonce + ct + tag)``."""
    token = len(TOKEN_PREFIX) + 4 * math.ceil((plaintext_bytes + 12 + 16) / 3) + 2
    return token if is_string else token + len(json.dumps(SEALED_KEY)) + 3


# --- the checks ----------------------------------------------------------------------------------


def _steps(spec: Mapping[str, Any]) -> Iterator[tuple[Path, Mapping[str, Any]]]:
    steps = spec.get("steps")
    for i, step in enumerate(steps if isinstance(steps, list) else []):
        if not isinstance(step, Mapping):
            continue
        yield ("spec", "steps", i), step
        child = step.get("child")
        inner = child.get("steps") if isinstance(child, Mapping) else None
        for j, leaf in enumerate(inner if isinstance(inner, list) else []):
            if isinstance(leaf, Mapping):
                yield ("spec", "steps", i, "child", "steps", j), leaf


def check_duration(field: str, value: Any) -> None:
    """A Go-style duration of at most 6 digits a number, and at most :data:`MAX_DURATION`."""
    if value is None:
        return
    if not isinstance(value, str) or len(value) > 32 or not _DURATION.match(value):
        shown = (
            repr(value[:40] + ("..." if len(value) > 40 else ""))
            if isinstance(value, str)
            else "a non-string"
        )
        raise LimitExceeded(
            field, f"{shown} is not a duration (e.g. 90s, 15m, 1h30m; at most 6 digits a number)"
        )
    seconds = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(value))
    if seconds > MAX_DURATION_SECONDS:
        raise LimitExceeded(field, f"{value!r} is longer than {MAX_DURATION} (one year)")


def _check_value(field: str, value: Any) -> None:
    """One step's arguments or target: depth, then size in canonical JSON (before sealing)."""
    if is_sealed(value):
        token = value if isinstance(value, str) else value[SEALED_KEY]
        if len(token) > sealed_size(MAX_VALUE_BYTES, True):
            raise LimitExceeded(
                field, f"a sealed value larger than {MAX_VALUE_BYTES} bytes in clear; {BY_REFERENCE}"
            )
        return
    walk(value, (), MAX_NESTING)
    size = len(canonical_json(value))
    if size > MAX_VALUE_BYTES:
        raise LimitExceeded(
            field, f"{size} bytes in canonical JSON, at most {MAX_VALUE_BYTES}; {BY_REFERENCE}"
        )


def _relabel(err: LimitExceeded, field: str, levels: int = MAX_NESTING) -> LimitExceeded:
    message = f"larger than {MAX_VALUE_BYTES} bytes in canonical JSON; {BY_REFERENCE}"
    if err.at:
        message = f"nested more than {levels} levels deep (at {_short((field, *err.at))})"
        message = f"{message}; a deeply nested value can go as a JSON string, or {BY_REFERENCE}"
    return LimitExceeded(field, message, err.at)


def _field_of(at: Path) -> str:
    """The field a path deep inside the object belongs to: up to ``arguments`` or ``target``."""
    for i, part in enumerate(at):
        if part in ("arguments", "target") and i >= 3:
            return dotted(at[: i + 1])
    return dotted(at[:4])


def check_steps(spec: Mapping[str, Any]) -> None:
    for path, step in _steps(spec):
        for kind in ("ask", "await", "child"):
            part = step.get(kind)
            if isinstance(part, Mapping):
                check_duration(dotted((*path, kind, "expiresIn")), part.get("expiresIn"))
        effect = step.get("effect")
        for name in ("arguments", "target"):
            value = effect.get(name) if isinstance(effect, Mapping) else None
            if value is None:
                continue
            field = dotted((*path, "effect", name))
            try:
                _check_value(field, value)
            except LimitExceeded as err:
                raise (err if err.field == field else _relabel(err, field)) from None
        ask = step.get("ask")
        question = ask.get("question") if isinstance(ask, Mapping) else None
        if isinstance(question, str) and not is_sealed(question) and len(question) > PLAINTEXT_LIMIT:
            raise LimitExceeded(
                dotted((*path, "ask", "question")), f"{len(question)} characters, at most {PLAINTEXT_LIMIT}"
            )


def check_requests(spec: Mapping[str, Any]) -> None:
    """Answers and events: each at most PLAINTEXT_LIMIT characters, all at most MAX_REQUESTS_BYTES."""
    total = 0
    for field in ("answers", "events"):
        entries = spec.get(field)
        for key, value in entries.items() if isinstance(entries, Mapping) else []:
            if not isinstance(key, str) or not key or "\0" in key:
                raise LimitExceeded(f"spec.{field}", "a key must be non-empty and free of NUL characters")
            where = f"spec.{field}[{key[:63]!r}]"
            if is_sealed(value):
                total += max(0, (len(str(value)) - 40) * 3 // 4)
                continue
            if not isinstance(value, str):
                raise LimitExceeded(where, "must be a string")
            if len(value) > PLAINTEXT_LIMIT:
                raise LimitExceeded(
                    where, f"{len(value)} characters, at most {PLAINTEXT_LIMIT}; {ANSWER_BY_REFERENCE}"
                )
            total += len(value.encode())
    if total > MAX_REQUESTS_BYTES:
        raise LimitExceeded(
            "spec.answers", f"answers and events hold {total} bytes together, at most {MAX_REQUESTS_BYTES}"
        )


def stored_size(obj: Mapping[str, Any]) -> int:
    """metadata + spec as the API server will store them: every value the webhook seals counted
    at its sealed size (the object must already have passed :func:`walk`)."""
    spec = obj.get("spec")
    size = walk({k: v for k, v in obj.items() if k != "status"}).size
    if not isinstance(spec, dict):
        return size
    for holder, key, _label in spec_slots(spec):
        value = holder[key]
        if is_sealed(value):
            continue
        plain = len(canonical_json(value))
        size += sealed_size(plain, isinstance(value, str)) - walk(value).size
    return size


def _largest_fields(spec: Mapping[str, Any]) -> str:
    sizes = sorted(((walk(v).size, f"spec.{k}") for k, v in spec.items()), reverse=True)[:3]
    return ", ".join(f"{name} {size} bytes" for size, name in sizes if size >= 1024) or "metadata"


def check_run(obj: Mapping[str, Any], operation: str) -> None:
    """Every limit, cheapest and most fundamental first; :class:`LimitExceeded` names the field.
    Nothing recursive runs before the iterative walk has bounded the depth and the size."""
    unstored = {k: v for k, v in obj.items() if k != "status"}  # the operator writes the status
    try:
        walk(unstored)
    except LimitExceeded as err:
        if not err.at:
            raise
        field = _field_of(err.at)
        if not field.endswith(("arguments", "target")) or not err.message.startswith("nested"):
            raise LimitExceeded(field, err.message, err.at) from None
        raise LimitExceeded(
            field,
            f"nested more than {MAX_NESTING} levels deep (at {_short(err.at)}); "
            f"a deeply nested value can go as a JSON string, or {BY_REFERENCE}",
            err.at,
        ) from None
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise LimitExceeded("spec", "must be an object")
    objective = spec.get("objective")
    if isinstance(objective, str) and len(objective) > MAX_OBJECTIVE:
        raise LimitExceeded("spec.objective", f"{len(objective)} characters, at most {MAX_OBJECTIVE}")
    check_steps(spec)
    check_requests(spec)
    budget = CREATE_BUDGET if operation == "CREATE" else UPDATE_BUDGET
    size = stored_size(obj)
    if size > budget:
        raise LimitExceeded(
            "spec",
            f"the run takes {size} bytes as stored (sealed values count sealed), at most {budget} "
            f"(largest: {_largest_fields(spec)}); {BY_REFERENCE}",
        )


def refusal(obj: Any, operation: str) -> LimitExceeded | None:
    """The first limit ``obj`` exceeds, or None (never raises on any JSON value)."""
    if not isinstance(obj, Mapping):
        return None
    try:
        check_run(obj, operation)
    except LimitExceeded as err:
        return err
    return None
