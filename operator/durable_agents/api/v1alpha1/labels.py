"""Labels and annotations that are API: people, scripts and the operator read and write them."""

from __future__ import annotations

from typing import Final

RUN_LABEL: Final = "durable-agents.io/run"
"""On a run's Leases and ActionRecords: the run's name, or a hashed form when it does not fit a label."""
REVEAL_ANNOTATION: Final = "durable-agents.io/reveal"
"""Set by ``kubectl agentrun status NAME --reveal`` in a server-side dry run: the reader's public key."""
REVEALED_ANNOTATION: Final = "durable-agents.io/revealed"
"""Returned by the webhook in that dry run: the run's values sealed for the reader."""
