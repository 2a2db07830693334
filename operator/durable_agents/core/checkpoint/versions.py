"""Schema versions: how a stored checkpoint is read back, migrated from an older version, or
quarantined.

Schema history (each older version is migrated on read by ``MIGRATIONS``; recorded fixtures of every
version stay under test in ``tests/unit/fixtures/checkpoints``):

- 1: the first contract.
- 2: ``attempt`` became ``retry`` (attempts, retryAt, last failure) because retry windows need
  more than a counter; tool calls record the attempt they belong to; ``runtimeConfig.operator``
  records the operator version that committed (a different one means a deployment change:
  resume validation); ``children`` and ``cancellations`` record child runs and handled
  cancellation requests.
- 3: ``integrity``, the operator's stamp over the checkpoint (:mod:`.integrity`). Nothing else
  changed: a version-2 checkpoint migrates by its version number alone, and carries no stamp.

Adding version N+1: bump ``Checkpoint.schema_version`` and ``CURRENT_SCHEMA_VERSION``, register
``MIGRATIONS[N]`` and record version-N+1 fixtures beside the older ones (stamped, for N+1 >= 3).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import ValidationError

from durable_agents.core.checkpoint.record import Checkpoint

CURRENT_SCHEMA_VERSION: Final = 3
FIRST_STAMPED_SCHEMA_VERSION: Final = 3
"""Checkpoints of older schema versions were written before checkpoints were stamped (legacy)."""


QuarantineReason = Literal[
    "MissingCheckpoint",
    "UnknownSchemaVersion",
    "InvalidCheckpoint",
    "MigrationFailed",
    "Undecryptable",
    "IntegrityFailed",
    "SpecChanged",
]


Migration = Callable[[dict[str, Any]], dict[str, Any]]
"""Turns a checkpoint dict of schema version N into one of version N+1."""


def migrate_v1_to_v2(document: dict[str, Any]) -> dict[str, Any]:
    """Version 1 -> 2: ``attempt`` (a count) moves into ``retry.attempts``; the rest has defaults."""
    out = {key: value for key, value in document.items() if key != "attempt"}
    attempt = document.get("attempt", 0)
    if type(attempt) is not int or attempt < 0:
        raise ValueError(f"attempt must be a non-negative integer, got {attempt!r}")
    out["retry"] = {"attempts": attempt}
    out["schemaVersion"] = 2
    return out


def migrate_v2_to_v3(document: dict[str, Any]) -> dict[str, Any]:
    """Version 2 -> 3: the same fields; version 2 had no stamp, so a version-2 document with one is
    not what a version-2 operator wrote."""
    if "integrity" in document:
        raise ValueError("a version-2 checkpoint carries no integrity stamp")
    return {**document, "schemaVersion": 3}


MIGRATIONS: Final[Mapping[int, Migration]] = {1: migrate_v1_to_v2, 2: migrate_v2_to_v3}
"""Schema version N -> its migration to N+1."""


@dataclass(frozen=True)
class Loaded:
    """A checkpoint that validated against the current schema."""

    checkpoint: Checkpoint
    migrated_from: int | None = None
    """The stored schema version when migrations ran; None when it was already current."""


@dataclass(frozen=True)
class Quarantine:
    """A checkpoint this deployment must not resume from; the run goes to ``quarantined``."""

    reason: QuarantineReason
    """Machine-readable, suitable for a condition reason and a metric label."""
    message: str
    """Human-readable, names the offending field or version."""


def dump_checkpoint(checkpoint: Checkpoint) -> dict[str, Any]:
    """The JSON-ready, camelCase form stored in ``status.checkpoint``."""
    return checkpoint.model_dump(mode="json", by_alias=True, exclude_none=True)


def load_checkpoint(
    raw: Mapping[str, Any] | None,
    *,
    migrations: Mapping[int, Migration] = MIGRATIONS,
    current: int = CURRENT_SCHEMA_VERSION,
    model: type[Checkpoint] = Checkpoint,
) -> Loaded | Quarantine:
    """Read a stored checkpoint: validate it, migrating it first when it is older.

    Never raises and never mutates ``raw``. A checkpoint that is absent, malformed, from an unknown
    (for example newer) schema version, or whose migration fails is answered with a
    :class:`Quarantine`; a newer checkpoint is never rewritten. ``migrations``, ``current`` and
    ``model`` exist so tests can exercise other chains.
    """
    if raw is None:
        return Quarantine("MissingCheckpoint", "the run has no checkpoint")
    try:
        document = plain_copy(raw)
    except (TypeError, RecursionError) as exc:
        return Quarantine("InvalidCheckpoint", f"checkpoint is not plain JSON: {exc}")
    if not isinstance(document, dict):
        return Quarantine("InvalidCheckpoint", f"checkpoint must be an object, got {type(document).__name__}")

    stored = document.get("schemaVersion")
    if type(stored) is not int:  # bool is an int subclass, and "1" is not a version
        return Quarantine("InvalidCheckpoint", f"schemaVersion must be an integer, got {repr(stored)[:64]}")
    if stored > current:
        return Quarantine(
            "UnknownSchemaVersion",
            f"schemaVersion {stored} is newer than {current}, the newest this deployment reads",
        )

    version: int = stored
    while version < current:
        migration = migrations.get(version)
        if migration is None:
            return Quarantine("UnknownSchemaVersion", f"no migration from schemaVersion {version}")
        try:
            document = migration(document)
        except Exception as exc:  # any failure inside a migration is a quarantine, never a crash
            return Quarantine(
                "MigrationFailed",
                f"migration from schemaVersion {version} failed: {type(exc).__name__}: {exc}",
            )
        if not isinstance(document, dict) or document.get("schemaVersion") != version + 1:
            return Quarantine(
                "MigrationFailed",
                f"migration from schemaVersion {version} did not produce schemaVersion {version + 1}",
            )
        version += 1

    try:
        checkpoint = model.model_validate(document)
    except ValidationError as exc:
        return Quarantine("InvalidCheckpoint", _describe(exc))
    return Loaded(checkpoint, migrated_from=stored if stored != current else None)


_SCALARS = frozenset({str, int, float, bool, type(None)})


def plain_copy(value: Any) -> Any:
    """A deep, plain copy (dicts, lists, scalars) of a JSON-like value; the input is left untouched."""
    kind = type(value)  # the exact builtin types first: what a parsed document holds (a cold start
    if kind is dict:  # copies every run's checkpoint twice; the ABC checks below were half of it)
        if all(type(key) is str for key in value):
            return {key: plain_copy(item) for key, item in value.items()}
    elif kind is list:
        return [plain_copy(item) for item in value]
    elif kind in _SCALARS:
        return value
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise TypeError("object keys must be strings")
        return {key: plain_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain_copy(item) for item in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value  # immutable
    raise TypeError(f"unexpected {type(value).__name__} in checkpoint")


_MAX_REPORTED_ERRORS: Final = 5


def _describe(error: ValidationError) -> str:
    """A short message naming each offending field by its camelCase path, e.g. ``position.stateVersion``."""
    problems = []
    for detail in error.errors()[:_MAX_REPORTED_ERRORS]:
        path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in detail["loc"])
        problems.append(f"{path.lstrip('.') or '(checkpoint)'}: {detail['msg']}")
    more = error.error_count() - _MAX_REPORTED_ERRORS
    suffix = f" (and {more} more)" if more > 0 else ""
    return "checkpoint invalid: " + "; ".join(problems) + suffix
