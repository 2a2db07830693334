"""``kubectl agentrun policy force-delete NAME --reason TEXT``: delete an AgentPolicy live runs use.

    kubectl agentrun policy force-delete NAME --reason TEXT [-n NS]

A policy that runs which have not ended use cannot be deleted: the operator's admission webhook
refuses, naming them. On call, this marks the policy with the annotation
``durable-agents.io/force-delete: <reason>`` (the webhook asks a SubjectAccessReview for the verb
``force-delete`` on ``agentpolicies/NAME``; the patch itself needs ``patch`` on it), then deletes
it. Its runs are then quarantined (``PolicyDeleted``, the reason in their outcome): none acts
without its policy. Re-create the policy and retry a run (``kubectl agentrun retry``) to resume it.

The same for an Agent or a ModelConfig that runs use (``--kind Agent|ModelConfig``, verb
``force-delete`` on ``agents``/``modelconfigs``): runs that pinned it keep their pinned copy, and
their policy's ``freshness.definitionChanged`` says what the deletion means for them.

Exit codes: 0 deleted; 1 refused or any error.
"""

from __future__ import annotations

import argparse
import sys

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import AGENT_PLURAL, GROUP, MODEL_CONFIG_PLURAL, VERSION
from durable_agents.core.policy_integrity import FORCE_DELETE
from durable_agents.kubectl.errors import api_message

KINDS = {"AgentPolicy": "agentpolicies", "Agent": AGENT_PLURAL, "ModelConfig": MODEL_CONFIG_PLURAL}


def force_delete(
    api: client.CustomObjectsApi, ns: str, name: str, reason: str, kind: str = "AgentPolicy"
) -> str:
    """Mark the policy (or Agent, ModelConfig) with the on-call's reason, then delete it; what was done."""
    mark = {"metadata": {"annotations": {FORCE_DELETE: reason}}}
    plural = KINDS[kind]
    api.patch_namespaced_custom_object(GROUP, VERSION, ns, plural, name, mark)
    api.delete_namespaced_custom_object(GROUP, VERSION, ns, plural, name)
    if kind != "AgentPolicy":
        return (
            f"{kind.lower()} {ns}/{name} force-deleted ({reason}): the runs that pinned it go on as "
            "their policy's freshness.definitionChanged says (kubectl agentrun why RUN)"
        )
    return (
        f"agentpolicy {ns}/{name} force-deleted ({reason}): the runs that used it are quarantined "
        "(PolicyDeleted); re-create it and retry them to resume"
    )


def main(argv: list[str] | None = None) -> int:
    """``kubectl agentrun policy force-delete ...`` (``argv`` without ``policy force-delete``)."""
    parser = argparse.ArgumentParser(
        prog="kubectl agentrun policy force-delete", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("name", metavar="NAME")
    parser.add_argument("--reason", required=True, help="why (recorded in each quarantined run's outcome)")
    parser.add_argument("--kind", choices=sorted(KINDS), default="AgentPolicy", help="what NAME is")
    parser.add_argument("-n", "--namespace")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--context")
    args = parser.parse_args(argv)
    if not args.reason.strip():
        print("error: --reason must say why", file=sys.stderr)
        return 1
    try:
        config.load_kube_config(config_file=args.kubeconfig, context=args.context)
        _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
        ns = args.namespace or (active or {}).get("context", {}).get("namespace", "default")
        print(force_delete(client.CustomObjectsApi(), ns, args.name, args.reason, args.kind))
    except ApiException as err:
        print(f"error: {err.status} {err.reason}: {api_message(err)}", file=sys.stderr)
        return 1
    return 0
