"""A policy's identity: (kind, name, version, content digest).

The content digest covers everything an AgentPolicy's ``spec`` says except its ``version`` label,
so that the same rules under two versions have one digest, and a change of rules under one
version is seen. Admission refuses such a change; the operator checks the digest when it loads a
policy; a run records the identity it was accepted under.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from durable_agents.core.digest import canonical_digest


def content_digest(spec: Mapping[str, Any]) -> str:
    """The digest of a policy's rules: its ``spec`` as written (wire names), without ``version``."""
    return canonical_digest({key: value for key, value in spec.items() if key != "version"})
