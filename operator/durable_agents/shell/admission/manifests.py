"""The chart's webhook configurations, generated from the ones the operator installs
(:func:`durable_agents.shell.admission.registration.webhook_configurations`), so that the two never differ.

The chart owns them (``helm uninstall`` removes them, so a cluster without the operator is not left
refusing every AgentRun write); the operator keeps their caBundle current and writes nothing when
they already match. ``make crds`` writes them; ``tests/unit/test_chart_files.py`` fails on drift.
The chart fills the placeholders below and the caBundle (from the serving Secret, when it exists).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from durable_agents.shell.admission.registration import webhook_configurations

NAME, SERVICE_NAMESPACE, SERVICE, PORT, WATCHED = (
    "__NAME__",
    "__SERVICE_NAMESPACE__",
    "__SERVICE__",
    443,
    "__WATCH_NAMESPACE__",
)
FILES = {"webhooks-cluster.json": None, "webhooks-namespaced.json": WATCHED}


def _without_ca_bundle(configuration: dict[str, Any]) -> dict[str, Any]:
    hooks = []
    for hook in configuration["webhooks"]:
        config = {k: v for k, v in hook["clientConfig"].items() if k != "caBundle"}
        hooks.append({**hook, "clientConfig": config})
    return {**configuration, "webhooks": hooks}


def generate() -> dict[str, str]:
    """File name -> JSON text: a list of the Mutating and the Validating configuration."""
    out = {}
    for name, watched in FILES.items():
        both = webhook_configurations(
            name=NAME, service=(SERVICE_NAMESPACE, SERVICE, PORT), ca_pem=b"", namespace=watched
        )
        out[name] = json.dumps([_without_ca_bundle(c) for c in both], indent=2, sort_keys=True) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m durable_agents.shell.admission.manifests CHART_FILES_DIR", file=sys.stderr)
        return 2
    for name, text in generate().items():
        (Path(args[0]) / name).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
