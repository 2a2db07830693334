"""The checkpoint contract: ``status.checkpoint`` of an AgentRun.

This module owns the typed, versioned record a run resumes from: state-machine position, the
lease epoch that committed it (fencing token), evidence references, completed tool-call records,
pending actions, approval records, policy version, runtime configuration IDs, trace link, attempt
count, timestamps, what a wait is waiting on, and sealed sensitive values. It also owns the way a
stored checkpoint is read back: migrated from an older schema version, or quarantined.

It is an application contract, not a memory dump: plain JSON with camelCase keys, compact, and
large data (transcripts, tool results, documents) is referenced, never copied. It must not do I/O
and must not import Kubernetes; which state names exist is the state machine's business.

Schema history (each older version is migrated on read by ``MIGRATIONS``; recorded fixtures of every
version stay under test in ``tests/unit/fixtures/checkpoints``):

- 1: the first contract.
- 2: ``attempt`` became ``retry`` (attempts, retryAt, last failure) because retry windows need
  more than a counter; tool calls record the attempt they belong to; ``runtimeConfig.operator``
  records the operator version that committed (a different one means a deployment change:
  resume validation); ``children`` and ``cancellations`` record child runs and handled
  cancellation requests.
- 3: ``integrity``, the operator's stamp over the checkpoint (see "Integrity" below). Nothing else
  changed: a version-2 checkpoint migrates by its version number alone, and carries no stamp.

Integrity: anyone who may write ``agentruns/status`` could otherwise write what the run does next
(an approval, an intent, a finished child, a skipped step). Every commit therefore stamps the
checkpoint with :func:`durable_agents.core.stamps.stamp` (purpose ``CHECKPOINT``, keys derived
from the operator's sealing keyring) over :func:`integrity_payload`: the run ID and every field
of the checkpoint except these, which decide nothing about what happens next:

- ``fencing``: the lease epoch, rewritten by a takeover's fencing write without a transition and
  checked against the Lease itself (a forged epoch can only make a worker drop the run);
- ``timestamps``: wall-clock bookkeeping, deliberately never acted on;
- ``traceLink``: observability only;
- ``integrity`` itself.

So the stamp covers the position (state, step, state version), pending intents (``pendingActions``)
and completed tool calls, approval requests and recorded decisions (``approvals``), evidence, what
a wait waits on (``pendingInput``, ``pendingExternal``), retry attempts and windows, child runs,
handled cancellations, the policy and runtime configuration recorded, and the sealed values. A
field added later is covered unless it is added to :data:`UNSTAMPED_FIELDS`, which needs a new
schema version (the recorded version-3 fixtures verify against this definition). The stamp is
bound to the run ID (``status.runId``), so a checkpoint copied into another run does not verify.
A checkpoint whose stamp does not verify is quarantined (``IntegrityFailed``), never rewritten.

Checkpoints of versions 1 and 2 (written before stamps) are adopted on upgrade by the engine
(``core/engine/loading.py``): stamped at once, provided what they claim can be corroborated (each
recorded approval decision is in ``spec.approvals`` as the webhook stamped it; each pending intent
whose tier needs approval names an approved request; the status names the same position). The
residual risk, accepted so that runs cross the upgrade: whoever can write ``agentruns/status`` can
store a version-2 checkpoint instead of forging a stamp, and so move a run within its own spec
(skip a step, a wait, a retry) without an approval or an effect the run did not intend.

Adding version N+1: bump ``Checkpoint.schema_version`` and ``CURRENT_SCHEMA_VERSION``, register
``MIGRATIONS[N]`` and record version-N+1 fixtures beside the older ones (stamped, for N+1 >= 3).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from durable_agents.api.v1alpha1.meta import SEALED_STRING_MAX
from durable_agents.core.agent_facts import AgentFacts
from durable_agents.core.sealing import Keyring, SealedField, UndecryptableError, seal, sealing_aad, unseal
from durable_agents.core.stamps import Purpose, stamp, stamp_key_id, verify

CURRENT_SCHEMA_VERSION: Final = 3
FIRST_STAMPED_SCHEMA_VERSION: Final = 3
"""Checkpoints of older schema versions were written before checkpoints were stamped (legacy)."""


def _to_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError as exc:  # 0001-01-01T00:00+05:00 has no UTC instant; must not escape validation
        raise ValueError("instant is out of range in UTC") from exc


UtcDatetime = Annotated[AwareDatetime, AfterValidator(_to_utc)]
"""A timezone-aware instant, normalised to UTC; naive datetimes are rejected."""
Digest = Annotated[str, StringConstraints(pattern=r"^sha256:[0-9a-f]{64}$")]
"""A SHA-256 content or approval digest: ``sha256:`` and 64 lowercase hex digits."""
Identifier = Annotated[str, StringConstraints(min_length=1, max_length=253)]
KubernetesName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")]
Namespace = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
FieldName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")]
Stamp = Annotated[str, StringConstraints(min_length=3, max_length=512, pattern=r"^[^:]+:[A-Za-z0-9+/=]+$")]
"""An operator stamp, ``<key ID>:<base64 MAC>`` (:mod:`durable_agents.core.stamps`)."""
Traceparent = Annotated[
    str, StringConstraints(pattern=r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
]
Count = Annotated[int, Field(ge=0, le=2**53 - 1)]
"""A non-negative integer JSON carries exactly (RFC 8785, which stamps are computed over)."""
StepIndex = Count

ActionTier = Literal["read-only", "reversible", "consequential"]
ApprovalDecision = Literal["approved", "rejected"]
ToolCallOutcome = Literal["succeeded", "failed"]
QuarantineReason = Literal[
    "MissingCheckpoint",
    "UnknownSchemaVersion",
    "InvalidCheckpoint",
    "MigrationFailed",
    "Undecryptable",
    "IntegrityFailed",
]


class _Contract(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class Position(_Contract):
    """Where the run stands in its state machine; selects the permitted transitions."""

    state: Annotated[str, StringConstraints(min_length=1, max_length=63)]
    step: StepIndex
    """Index of the next scripted step."""
    state_version: Count


class Fencing(_Contract):
    """The lease epoch of the worker that committed this checkpoint: a stale holder's commit fails."""

    holder: Identifier
    lease_transitions: Count


class _EvidenceRefBase(_Contract):
    id: Identifier
    """Stable reference ID, unique within the checkpoint; tool-call records point at it."""
    step_index: StepIndex
    """The step that recorded the reference."""
    recorded_at: UtcDatetime


class KubernetesEvidenceRef(_EvidenceRefBase):
    """A Kubernetes object, pinned to the version and content the run saw."""

    source: Literal["kubernetes"] = "kubernetes"
    api_version: Identifier
    kind: Annotated[str, StringConstraints(min_length=1, max_length=63)]
    namespace: Namespace | None = None
    """None for cluster-scoped objects."""
    name: Identifier
    uid: Identifier | None = None
    resource_version: Identifier
    content_digest: Digest


class ExternalEvidenceRef(_EvidenceRefBase):
    """A record in an authoritative system outside Kubernetes."""

    source: Literal["external"] = "external"
    uri: Annotated[str, StringConstraints(min_length=1, max_length=2048)]
    content_digest: Digest | None = None


EvidenceRef = Annotated[KubernetesEvidenceRef | ExternalEvidenceRef, Field(discriminator="source")]
"""An evidence reference; ``source`` says which kind."""


class ToolCallRecord(_Contract):
    """A completed tool call. Its result is an evidence reference, never the raw body."""

    id: Identifier
    tool: Identifier
    step_index: StepIndex
    started_at: UtcDatetime
    finished_at: UtcDatetime
    outcome: ToolCallOutcome
    result_ref: Identifier | None = None
    """ID of an evidence reference in this checkpoint."""
    error: Annotated[str, StringConstraints(max_length=1024)] | None = None
    """Why a failed call failed (reason: message); never a raw response body."""
    attempt: Count = 0
    """The retry attempt (``retry.attempts`` when the call was made) it belongs to."""


class PendingAction(_Contract):
    """A side effect whose intent is committed in the action ledger and not yet reconciled here."""

    idempotency_key: Identifier
    action_record_name: KubernetesName
    effect: Identifier
    tier: ActionTier
    step_index: StepIndex
    approval_request_id: Identifier | None = None
    """ID of the approval record that authorises this action, when its tier needs one."""


class ApprovalRecord(_Contract):
    """An approval request, bound by digest to the consequential fields it covers."""

    request_id: Identifier
    digest: Digest
    """SHA-256 over the canonical JSON of the consequential fields."""
    step_index: StepIndex | None = None
    """The step whose action this request covers."""
    expires_at: UtcDatetime
    policy_version: Identifier
    decision: ApprovalDecision | None = None
    decided_by: Identifier | None = None
    decided_at: UtcDatetime | None = None

    @model_validator(mode="after")
    def _decided_together(self) -> Self:
        decided = (self.decision is not None, self.decided_by is not None, self.decided_at is not None)
        if any(decided) and not all(decided):
            raise ValueError("decision, decidedBy and decidedAt are set together or not at all")
        return self


class PolicyRef(_Contract):
    """The AgentPolicy the run was evaluated under."""

    name: Identifier
    version: Identifier | None = None


class RuntimeConfig(_Contract):
    """Identifiers of the behavioural dependencies: model, prompt and tool set."""

    model: Identifier | None = None
    prompt: Identifier | None = None
    tool_set: Identifier | None = None
    operator: Identifier | None = None
    """The operator version that committed the checkpoint; another version means a deployment change."""


class Timestamps(_Contract):
    """Wall-clock instants. Deliberately not cross-checked: workers' clocks skew, runs must not die of it."""

    created_at: UtcDatetime
    updated_at: UtcDatetime
    entered_state_at: UtcDatetime


class PendingInput(_Contract):
    """The question a run in ``waiting_input`` waits to have answered."""

    request_id: Identifier
    question: Annotated[str, StringConstraints(min_length=1, max_length=SEALED_STRING_MAX)]
    """The step's question as the spec holds it: sealed, when the admission webhook sealed it."""
    expires_at: UtcDatetime
    key: Identifier | None = None
    """The ``spec.answers`` key awaited, once one was refused (core/deliveries.py); None: ``request_id``."""


class PendingExternal(_Contract):
    """The external event a run in ``waiting_external`` waits for."""

    request_id: Identifier
    event: Identifier
    expires_at: UtcDatetime
    key: Identifier | None = None
    """The ``spec.events`` key awaited, once one was refused (core/deliveries.py); None: ``event``."""


class RetryState(_Contract):
    """Failed attempts so far and, in ``waiting_retry``, when the next one is due."""

    attempts: Count = 0
    """Failed attempts so far; the current attempt has this number."""
    retry_at: UtcDatetime | None = None
    last_failure: Annotated[str, StringConstraints(max_length=1024)] | None = None


ChildOutcome = Literal["completed", "failed", "canceled", "expired"]


class ChildRecord(_Contract):
    """A child run this run started (intent committed before the child is created)."""

    name: KubernetesName
    step_index: StepIndex
    outcome: ChildOutcome | None = None
    """The child's terminal state, once reconciled; None while it runs."""
    reason: Annotated[str, StringConstraints(max_length=128)] | None = None


CancelScope = Literal["turn", "toolCall", "children", "task"]


class CancellationRecord(_Contract):
    """A cancellation request this run has acted on (spec.cancellations[requestId])."""

    request_id: Identifier
    scope: CancelScope
    step_index: StepIndex
    """The step that was current when the request was handled."""
    handled_at: UtcDatetime
    effective: bool = True
    """False when nothing in its scope existed when it was handled: recorded, never acted on later."""


class Checkpoint(_Contract):
    """The authoritative, resumable record of one run, schema version 3."""

    schema_version: Literal[3] = 3
    position: Position
    fencing: Fencing | None = None
    """None only before any worker has committed under a lease."""
    input_refs: list[EvidenceRef] = Field(default_factory=list)
    output_refs: list[EvidenceRef] = Field(default_factory=list)
    evidence: list[EvidenceRef] = Field(default_factory=list)
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    pending_actions: list[PendingAction] = Field(default_factory=list)
    approvals: list[ApprovalRecord] = Field(default_factory=list)
    policy: PolicyRef | None = None
    runtime_config: RuntimeConfig = Field(default_factory=RuntimeConfig)
    trace_link: Traceparent | None = None
    """W3C ``traceparent`` of the run's trace."""
    retry: RetryState = Field(default_factory=RetryState)
    timestamps: Timestamps
    pending_input: PendingInput | None = None
    pending_external: PendingExternal | None = None
    sealed: dict[FieldName, SealedField] | None = None
    """Sensitive values, sealed, by field name; see :func:`seal_field`."""
    children: list[ChildRecord] = Field(default_factory=list)
    cancellations: list[CancellationRecord] = Field(default_factory=list)
    agent: AgentFacts | None = None
    """The model planner's turns (sealed, bounded); None for other planners. Added within version 3:
    absent in older checkpoints, and omitted when None, so their stamps are unchanged."""
    position_stamped: Literal[True] | None = None
    """True: its committer stamps every position in ``status.positionStamp``
    (:mod:`durable_agents.core.positions`). Added within version 3, omitted when None."""
    data_key_digest: Annotated[str, StringConstraints(max_length=80)] | None = None
    """The run's data key's fingerprint once it had one: answers must be sealed with it (deliveries.py)."""
    integrity: Stamp | None = None
    """The operator's stamp over :func:`integrity_payload`; None only where no keyring stamps."""

    def evidence_refs(self) -> list[KubernetesEvidenceRef | ExternalEvidenceRef]:
        """All evidence references: inputs, outputs and evidence, in that order."""
        return [*self.input_refs, *self.output_refs, *self.evidence]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        ref_ids = _unique("evidence reference id", (ref.id for ref in self.evidence_refs()))
        _unique("tool call id", (call.id for call in self.tool_calls))
        _unique("child run name", (child.name for child in self.children))
        _unique("cancellation requestId", (cancellation.request_id for cancellation in self.cancellations))
        _unique("pending action idempotencyKey", (action.idempotency_key for action in self.pending_actions))
        request_ids = _unique("approval requestId", (approval.request_id for approval in self.approvals))
        for call in self.tool_calls:
            if call.result_ref is not None and call.result_ref not in ref_ids:
                raise ValueError(
                    f"tool call {call.id!r} names unknown evidence reference {call.result_ref!r}"
                )
        for action in self.pending_actions:
            if action.approval_request_id is not None and action.approval_request_id not in request_ids:
                raise ValueError(
                    f"pending action {action.idempotency_key!r} names unknown approval request "
                    f"{action.approval_request_id!r}"
                )
        if self.pending_input is not None and self.pending_external is not None:
            raise ValueError("a run waits on pendingInput or pendingExternal, not both")
        return self


def _unique(what: str, values: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"duplicate {what} {value!r}")
        seen.add(value)
    return seen


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
        document = _plain(raw)
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


def seal_field(
    checkpoint: Checkpoint, name: str, plaintext: bytes, *, keyring: Keyring, run_uid: str
) -> Checkpoint:
    """A copy of ``checkpoint`` with ``plaintext`` sealed under ``name``, bound to the run and field."""
    sealed = {**(checkpoint.sealed or {}), name: seal(keyring, plaintext, sealing_aad(run_uid, name))}
    # Validate the whole record again: the field name must be acceptable to the contract.
    return type(checkpoint).model_validate({**checkpoint.model_dump(), "sealed": sealed})


def unseal_field(checkpoint: Checkpoint, name: str, *, keyring: Keyring, run_uid: str) -> bytes:
    """The plaintext sealed under ``name``; ``KeyError`` if absent, ``UndecryptableError`` if unreadable."""
    sealed = (checkpoint.sealed or {})[name]
    return unseal(keyring, sealed, sealing_aad(run_uid, name))


def verify_sealed(checkpoint: Checkpoint, *, keyring: Keyring, run_uid: str) -> Quarantine | None:
    """Check that every sealed value still unseals with ``keyring``; a quarantine if one does not."""
    for name in sorted(checkpoint.sealed or {}):
        try:
            unseal_field(checkpoint, name, keyring=keyring, run_uid=run_uid)
        except UndecryptableError as exc:
            return Quarantine("Undecryptable", f"sealed field {name!r}: {exc}")
    return None


UNSTAMPED_FIELDS: Final = frozenset({"integrity", "fencing", "timestamps", "traceLink"})
"""Checkpoint fields the integrity stamp leaves out (see the module docstring for why each)."""


def integrity_payload(stored: Mapping[str, Any], run_id: str) -> dict[str, Any]:
    """What the integrity stamp covers: the run ID and every decisive field of the stored form.

    Computed from the stored (camelCase JSON) form, exactly as committed, so that a later schema
    version can still verify a stamp made under this one before migrating it.
    """
    return {
        "runId": run_id,
        "checkpoint": {key: value for key, value in stored.items() if key not in UNSTAMPED_FIELDS},
    }


def stamp_checkpoint(checkpoint: Checkpoint, *, keyring: Keyring, run_id: str) -> Checkpoint:
    """A copy of ``checkpoint`` carrying this operator's stamp over its decisive fields."""
    tag = stamp(keyring, Purpose.CHECKPOINT, integrity_payload(dump_checkpoint(checkpoint), run_id))
    return checkpoint.model_copy(update={"integrity": tag})


def verify_integrity(stored: Mapping[str, Any], *, keyring: Keyring, run_id: str) -> Quarantine | None:
    """None if the ``stored`` checkpoint carries this keyring's stamp over exactly its decisive
    fields and ``run_id``; otherwise a quarantine that says what is wrong. Never raises."""
    tag = stored.get("integrity")
    if not isinstance(tag, str) or not tag:
        return Quarantine(
            "IntegrityFailed",
            f"the schemaVersion {stored.get('schemaVersion')} checkpoint carries no integrity stamp: "
            "it was not committed by this operator",
        )
    key_id = stamp_key_id(tag)
    if key_id not in keyring.keys:
        return Quarantine(
            "IntegrityFailed",
            f"the checkpoint is stamped with key {key_id!r}, which is not in this operator's keyring "
            "(put the key back, then retry)",
        )
    try:
        payload = integrity_payload(_plain(stored), run_id)
        authentic = verify(keyring, Purpose.CHECKPOINT, payload, tag)
    except (TypeError, ValueError, RecursionError):  # not plain JSON: cannot be what was stamped
        authentic = False
    if not authentic:
        return Quarantine(
            "IntegrityFailed",
            f"the checkpoint's integrity stamp does not verify for run {run_id!r}: its decisive fields "
            "were written by someone other than the operator (or belong to another run)",
        )
    return None


def _plain(value: Any) -> Any:
    """A deep, plain copy (dicts, lists, scalars) of a JSON-like value; the input is left untouched."""
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise TypeError("object keys must be strings")
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
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
