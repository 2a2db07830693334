"""Shared pieces of the v1alpha1 API: group, patterns, schema helpers, references, conditions."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "durable-agents.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# Go-style durations ("90s", "15m", "1h30m"), as in metav1.Duration. At most 6 digits per number
# (and 32 characters in all), so that no duration overflows a timedelta or Go's int64 nanoseconds.
DURATION_PATTERN = r"^([0-9]{1,6}(\.[0-9]{1,6})?(ms|s|m|h))+$"
MAX_DURATION = "8760h"
"""The longest wait a run may ask for (one year): checked by the API server (CEL) and the webhook."""
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
REQUEST_ID_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"

# A field the admission webhook may seal holds at most 4096 characters in clear, and the sealed
# form of that (durable_agents.core.sealed_values) in storage.
SEALED_STRING_MAX = 5632
Answer = Annotated[str, Field(max_length=SEALED_STRING_MAX)]


def cel(rule: str, message: str, **extra: str) -> dict[str, Any]:
    """One ``x-kubernetes-validations`` entry."""
    return {"rule": rule, "message": message, **extra}


def bounded_duration(field: str) -> dict[str, Any]:
    """Schema extra for a duration field: at most :data:`MAX_DURATION` (CEL parses Go durations)."""
    return {
        "x-kubernetes-validations": [
            cel(
                f"duration(self) <= duration('{MAX_DURATION}')",
                f"{field} must be at most {MAX_DURATION} (one year)",
            )
        ]
    }


def append_only(message: str) -> dict[str, Any]:
    """Schema extra for a map of requests: entries may be added, never changed or withdrawn."""
    return {"x-kubernetes-validations": [cel("oldSelf.all(k, k in self && self[k] == oldSelf[k])", message)]}


def immutable(field: str) -> dict[str, Any]:
    """Schema extra that makes a field immutable once set (CEL transition rule)."""
    return {"x-kubernetes-validations": [cel("self == oldSelf", f"{field} is immutable")]}


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields from newer servers ignored."""

    # A field's docstring is its description in the CRD (``kubectl explain``) and the reference.
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", use_attribute_docstrings=True
    )

    def wire(self) -> dict[str, Any]:
        """The JSON-ready dict as the API server stores it."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# --- shared pieces ---------------------------------------------------------------------------


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """metav1.Condition, so that ``kubectl wait --for=condition=...`` works."""

    type: str = Field(max_length=316, pattern=r"^([a-zA-Z0-9]([-a-zA-Z0-9.]*[a-zA-Z0-9])?/)?[A-Za-z]+$")
    """The condition's type, in CamelCase (for example RequestRefused)."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: str = Field(max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    """Why the condition last changed: a CamelCase word, for machines."""
    message: str = Field(default="", max_length=32768)
    """Why the condition last changed, for people."""
    last_transition_time: datetime
    """When the status last changed."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The object's metadata.generation the condition was set from."""


CONDITIONS_SCHEMA_EXTRA: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


class ObjectReference(ApiModel):
    """A Kubernetes object a step reads or targets. Namespace defaults to the run's."""

    api_version: str = Field(max_length=253)
    """The object's API version (for example apps/v1, or v1 for the core group)."""
    kind: str = Field(max_length=63)
    """The object's kind (for example ConfigMap)."""
    name: str = Field(max_length=253)
    """The object's name."""
    namespace: str | None = Field(default=None, max_length=63)
    """The object's namespace; unset: the run's namespace."""


class RunReference(ApiModel):
    """An AgentRun in the same namespace, by name and UID."""

    name: str = Field(max_length=253)
    """The AgentRun's name."""
    uid: str = Field(max_length=64)
    """The AgentRun's metadata.uid (a run re-created under the same name is another run)."""


class LocalReference(ApiModel):
    """An object of the expected kind in the same namespace, by name."""

    name: str = Field(max_length=253, pattern=NAME_PATTERN)
    """The object's name."""


class ActionTier(StrEnum):
    """How consequential an action is: read-only, reversible or consequential."""

    READ_ONLY = "read-only"
    REVERSIBLE = "reversible"
    CONSEQUENTIAL = "consequential"
