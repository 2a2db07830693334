"""What ``status --reveal`` prints of a reveal that holds the waiting question only.

The operator answers someone who may answer a run (verb ``answer``) but not approve it with the
question it waits on and the answers given to it, nothing else
(:mod:`durable_agents.shell.runs.reveal_question`); these lines say so, with what was withheld and
the verb that would show it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

SCOPE_QUESTION: Final = "question"
ASKED_BY_MODEL: Final = "model"


def question_only(document: Mapping[str, Any] | None) -> bool:
    return document is not None and document.get("scope") == SCOPE_QUESTION


def question_lines(document: Mapping[str, Any]) -> list[str]:
    """The answers given to the question, and what was withheld (names only, no values)."""
    lines = ["  only the question this run waits on (you may answer it, not approve it)"]
    for key, value in sorted((document.get("answers") or {}).items()):
        shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        lines.append(f"  answers/{key}: {json.dumps(shown, ensure_ascii=False)}")
    withheld = document.get("withheld") or {}
    verb, resource = withheld.get("verb", "approve"), withheld.get("resource", "agentruns")
    for what in withheld.get("what") or []:
        lines.append(f"  withheld: {what} (verb {verb!r} on {resource} shows it)")
    return lines
