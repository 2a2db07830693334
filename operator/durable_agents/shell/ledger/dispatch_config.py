"""What the dispatcher is configured with, and a record ready to be sent (the dispatcher's own
values, apart from its code)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from durable_agents.api.v1alpha1 import ResolvedReference
from durable_agents.core.regions import DEFAULT_REGION
from durable_agents.core.sealed_values import DataKey
from durable_agents.core.sealing import Keyring
from durable_agents.shell.effects import Action, Effect, EffectContext
from durable_agents.shell.ledger.actions import FirstClaims


@dataclass(frozen=True)
class DispatcherConfig:
    identity: str
    timeout: float = 5.0  # a dispatch answer later than this is an unknown outcome
    concurrency: int = 8
    # Verifies run checkpoints' integrity stamps; the operator always has one (None: tests only).
    keyring: Keyring | None = field(default=None, repr=False)
    all_events: bool = False  # also the routine Dispatched / Succeeded Events (each an API write)
    region: str = DEFAULT_REGION  # only the intents of runs this region owns are sent from here
    # Shared with this process's worker: the intents it created under a first claim for us.
    first_claims: FirstClaims | None = field(default=None, repr=False)

    @property
    def claim_ttl(self) -> timedelta:
        # Long enough for one dispatch to answer, so a live dispatcher is never second-guessed.
        return timedelta(seconds=self.timeout * 2 + 1)


@dataclass(frozen=True)
class Send:
    """A record ready to be sent: its effect, the context it acts in (as the run's
    ServiceAccount), the action unsealed with its references resolved, and what was read."""

    effect: Effect
    ctx: EffectContext
    action: Action
    data_key: DataKey | None
    references: list[ResolvedReference]
