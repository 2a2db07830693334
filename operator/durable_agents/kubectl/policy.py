"""``kubectl agentrun policy diff -f FILE [-n NS] [-o json]``: what a new AgentPolicy version would do
to the runs under the policy now, run by run, before it is applied.

It sends the file as a server-side dry run (``dryRun=All``: nothing is stored) of the update of the
policy (its create when there is none yet) and prints the operator admission webhook's preview
back: the counts (how many waiting approvals stay valid, need re-approval, need refreshed evidence
or expire; pending actions that newly need approval or no longer do; runs refused), then one line
per affected run (at most 10 are named; the others are counted). The same answer as the warnings
of ``kubectl apply --dry-run=server -f FILE``, computed by the operator from the engine's own rules.

What it needs is what applying the policy needs (``get`` and ``update`` on agentpolicies, or
``create``): no read of runs, and nothing sealed is shown (no question, argument or outcome).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from typing import Any, Final

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.kubectl.errors import api_message

RUN_PREFIX: Final = "policy preview run "
SUMMARY_PREFIX: Final = "policy preview "
_WARNING = re.compile(r'\d{3} \S+ "((?:[^"\\]|\\.)*)"')
_RUN_LINE = re.compile(r"^(?P<name>[^:]+): (?P<prediction>\w+) \((?P<about>[^)]*)\): (?P<detail>.*)$")


class PolicyDiffError(Exception):
    pass


def warnings_of(headers: Mapping[str, str] | None) -> list[str]:
    """The admission warnings of a response (RFC 7234 ``Warning: 299 - "text"`` headers, which
    the HTTP client joins with commas)."""
    raw = (headers or {}).get("Warning") or (headers or {}).get("warning") or ""
    return [re.sub(r"\\(.)", r"\1", text) for text in _WARNING.findall(raw)]


def parse(warnings: list[str]) -> dict[str, Any]:
    """The preview as data: its summary line, one entry per named run, and the rest counted."""
    summary = next(
        (w for w in warnings if w.startswith(SUMMARY_PREFIX) and not w.startswith(RUN_PREFIX)), None
    )
    runs = []
    for warning in warnings:
        found = _RUN_LINE.match(warning[len(RUN_PREFIX) :]) if warning.startswith(RUN_PREFIX) else None
        if found is None:
            continue
        state, _, request = found["about"].partition(", ")
        runs.append(
            {
                "name": found["name"],
                "prediction": found["prediction"],
                "state": state,
                "requestId": request or None,
                "detail": found["detail"],
            }
        )
    more = next((int(w.split()[2]) for w in warnings if w.startswith("policy preview: ")), 0)
    return {"summary": summary, "runs": runs, "unnamed": more}


def diff(api: client.CustomObjectsApi, namespace: str, document: Mapping[str, Any]) -> dict[str, Any]:
    """Send ``document`` (an AgentPolicy) as a server-side dry run; the webhook's preview, parsed."""
    if document.get("kind") != "AgentPolicy":
        raise PolicyDiffError(f"the file holds a {document.get('kind')!r}, not an AgentPolicy")
    meta = dict(document.get("metadata") or {})
    name = meta.get("name")
    if not name:
        raise PolicyDiffError("the AgentPolicy in the file has no metadata.name")
    namespace = meta.get("namespace") or namespace
    body = {**document, "metadata": {**meta, "namespace": namespace}}
    try:
        stored = api.get_namespaced_custom_object(GROUP, VERSION, namespace, "agentpolicies", name)
    except ApiException as err:
        if err.status != 404:
            raise PolicyDiffError(f"reading agentpolicy {namespace}/{name}: {api_message(err)}") from None
        stored = None
    try:
        if stored is None:
            answer = api.create_namespaced_custom_object_with_http_info(
                GROUP, VERSION, namespace, "agentpolicies", body, dry_run="All"
            )
        else:
            body["metadata"]["resourceVersion"] = stored["metadata"]["resourceVersion"]
            answer = api.replace_namespaced_custom_object_with_http_info(
                GROUP, VERSION, namespace, "agentpolicies", name, body, dry_run="All"
            )
    except ApiException as err:
        raise PolicyDiffError(
            f"the API server refused agentpolicy {namespace}/{name}: {api_message(err)}"
        ) from None
    _, _, headers = answer
    preview = parse(warnings_of(headers))
    if preview["summary"] is None:
        raise PolicyDiffError("no preview in the answer: is the operator's admission webhook enabled?")
    return {"policy": f"{namespace}/{name}", **preview}


def text(preview: Mapping[str, Any]) -> str:
    lines = [str(preview["summary"])]
    rows = [("RUN", "PREDICTION", "STATE", "REQUEST", "DETAIL")]
    rows += [
        (r["name"], r["prediction"], r["state"], r["requestId"] or "-", r["detail"]) for r in preview["runs"]
    ]
    if len(rows) > 1:
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines += ["  ".join([*map(str.ljust, row[:4], widths), row[4]]) for row in rows]
    if preview["unnamed"]:
        lines.append(f"and {preview['unnamed']} more affected run(s), not named")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kubectl agentrun policy", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["diff"])
    parser.add_argument("-f", "--filename", required=True)
    parser.add_argument("-n", "--namespace")
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    args = parser.parse_args(argv)
    try:
        with open(args.filename, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
        if not isinstance(document, dict):
            raise PolicyDiffError(f"{args.filename}: not one YAML object")
        config.load_kube_config(config_file=args.kubeconfig, context=args.context)
        _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
        ns = args.namespace or (active or {}).get("context", {}).get("namespace", "default")
        preview = diff(client.CustomObjectsApi(), ns, document)
    except (PolicyDiffError, OSError, yaml.YAMLError, config.ConfigException) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(preview, indent=2) if args.output == "json" else text(preview))
    return 0
