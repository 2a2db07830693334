"""RegionFailover: a person's explicit, authorised request to move one region's runs to another.

Cluster-scoped, like the regions it names. ``kubectl agentrun region failover FROM --to TO``
creates one; the operator's admission webhook overwrites ``requestedBy``, ``requestedAt`` and
``stamp`` (whatever a client wrote there is discarded) after a SubjectAccessReview for verb
``failover`` on ``regions/FROM``; the operator serving ``TO`` acts only on a request whose stamp
verifies (:func:`durable_agents.core.authority.failover_verifies`) and reports in the status. The
spec is immutable: a different failover is a new object.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import ConfigDict, Field

from durable_agents.api.v1alpha1.identity import Identity
from durable_agents.api.v1alpha1.meta import API_VERSION, NAME_PATTERN, ApiModel, cel

# --- RegionFailover ----------------------------------------------------------------------------

FAILOVER_PLURAL = "regionfailovers"
FAILOVER_KIND: Final = "RegionFailover"
# A region name is a DNS label (durable_agents.core.regions.MAX_REGION_LENGTH; the API types sit
# below the core, so the number is repeated here and a unit test keeps the two equal).
REGION_MAX_LENGTH = 63
FAILOVER_LIST_LIMIT = 1000
"""Entries per status list; more are counted in ``status.truncated``, never listed."""
FAILOVER_REASON_MAX = 1024


def _region(description: str, alias: str) -> Any:
    return Field(alias=alias, max_length=REGION_MAX_LENGTH, pattern=NAME_PATTERN, description=description)


# An operator stamp, as on AgentRun's requests (agentrun.py keeps its helper private).
_STAMP_PATTERN = r"^[^:]+:[A-Za-z0-9+/=]+$"


class RegionFailoverSpec(ApiModel):
    """Move the runs of region `from` to region `to`. The webhook writes requestedBy, requestedAt, stamp."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.from != self.to",
                    "a failover moves runs to another region: from and to must differ",
                ),
                cel(
                    "self == oldSelf",
                    "a region failover request is immutable once made: create a new one to ask again",
                ),
            ]
        }
    )

    from_region: str = _region("The region whose runs are to move (its operator is gone).", "from")
    to: str = _region("The region whose operator adopts them.", "to")
    reason: str | None = Field(
        default=None, max_length=FAILOVER_REASON_MAX, description="Why, for the record."
    )
    requested_by: Identity | None = Field(
        default=None, description="Who asked: stamped by the admission webhook from the request's user."
    )
    requested_at: datetime | None = Field(default=None, description="When: stamped by the admission webhook.")
    stamp: str | None = Field(
        default=None,
        max_length=512,
        pattern=_STAMP_PATTERN,
        description="The operator's stamp over the object's name and this spec (admission webhook).",
    )


class FailoverPhase(StrEnum):
    """Where a RegionFailover is: Pending, Verifying, Completed or Refused."""

    PENDING = "Pending"  # not yet taken up by the operator serving ``to``
    VERIFYING = "Verifying"  # checking each run's checkpoint and ledger before adopting it
    COMPLETED = "Completed"  # every run was adopted or is listed as not adopted, with why
    REFUSED = "Refused"  # nothing moved: the request is not authorised, or cannot be done (message)


FINISHED_PHASES = frozenset({FailoverPhase.COMPLETED, FailoverPhase.REFUSED})

_Namespace = Annotated[str, Field(max_length=63)]
_Name = Annotated[str, Field(max_length=253)]


class AdoptedRun(ApiModel):
    """A run the target region took on, and the region epoch it took it on under."""

    namespace: _Namespace
    """The run's namespace."""
    name: _Name
    """The run's name."""
    epoch: int = Field(ge=0)
    """The target region's epoch at the adoption."""


class NotAdoptedRun(ApiModel):
    """A run left where it was, and why (for a person to decide)."""

    namespace: _Namespace
    """The run's namespace."""
    name: _Name
    """The run's name."""
    reason: str = Field(max_length=256)
    """Why it was not adopted."""


class UnknownOutcome(ApiModel):
    """An action of an adopted run whose outcome is unknown: to reconcile, never to send again blindly."""

    namespace: _Namespace
    """The run's namespace."""
    run: _Name
    """The run's name."""
    action: _Name = Field(description="The ActionRecord's name.")
    since: datetime | None = None
    """Since when its outcome is unknown."""


class RegionFailoverStatus(ApiModel):
    """What the operator did: written by the operator only (the status subresource)."""

    phase: FailoverPhase = FailoverPhase.PENDING
    """Pending, Verifying, Completed or Refused."""
    message: str = Field(default="", max_length=4096)
    """What was adopted, left or refused, for people."""
    started_at: datetime | None = None
    """When the operator serving `to` began verifying the runs."""
    finished_at: datetime | None = None
    """When it completed (a refused request has none)."""
    epoch: int | None = Field(default=None, ge=0, description="The region epoch the runs were adopted under.")
    adopted: list[AdoptedRun] = Field(default_factory=list, max_length=FAILOVER_LIST_LIMIT)
    """The runs adopted into region `to`."""
    not_adopted: list[NotAdoptedRun] = Field(default_factory=list, max_length=FAILOVER_LIST_LIMIT)
    """The runs left where they were, with why."""
    unknown_outcomes: list[UnknownOutcome] = Field(default_factory=list, max_length=FAILOVER_LIST_LIMIT)
    """Actions of adopted runs whose outcome is unknown: to reconcile."""
    truncated: int = Field(
        default=0, ge=0, description="Entries beyond the lists' limits: counted, not listed."
    )

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    @classmethod
    def fitted(
        cls,
        *,
        adopted: Sequence[AdoptedRun] = (),
        not_adopted: Sequence[NotAdoptedRun] = (),
        unknown_outcomes: Sequence[UnknownOutcome] = (),
        **fields: Any,
    ) -> RegionFailoverStatus:
        """A status with lists of any length: each is cut to :data:`FAILOVER_LIST_LIMIT` and what
        was cut is counted in ``truncated``. ``fields`` are the other fields (python names)."""
        lists = {"adopted": adopted, "not_adopted": not_adopted, "unknown_outcomes": unknown_outcomes}
        dropped = sum(max(0, len(entries) - FAILOVER_LIST_LIMIT) for entries in lists.values())
        truncated = int(fields.pop("truncated", 0)) + dropped
        kept = {name: list(entries[:FAILOVER_LIST_LIMIT]) for name, entries in lists.items()}
        return cls(**kept, truncated=truncated, **fields)


class RegionFailover(ApiModel):
    """A person's authorised request to move one region's runs to another, and what was moved."""

    api_version: Literal["durable-agents.io/v1alpha1"] = API_VERSION  # type: ignore[assignment]
    kind: Literal["RegionFailover"] = "RegionFailover"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: RegionFailoverSpec
    status: RegionFailoverStatus | None = None
