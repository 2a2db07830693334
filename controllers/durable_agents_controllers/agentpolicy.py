"""AgentPolicies: their watch events keep the manager's one policy cache current (read by the run
worker, the dispatcher, retention, the stuck check and the admission webhook), and the runs that
waited for a policy go to the worker once it is known. With the admission webhook on, every
create, update and delete of a policy is reviewed (:mod:`durable_agents.shell.admission.policies`).
"""

from __future__ import annotations

from typing import Any

import kopf

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.core.request_stamps import identity_of
from durable_agents.shell.admission.policies import (
    CLUSTER_POLICY_PATH,
    CLUSTER_POLICY_PLURAL,
    POLICY_PATH,
    PolicyReview,
    check_policy,
)
from durable_agents.shell.intake.policies import CLUSTER
from durable_agents_controllers.manager import Manager


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    @kopf.on.event(GROUP, VERSION, "agentpolicies", registry=registry)
    async def agentpolicy_event(event: kopf.RawEvent, **_: Any) -> None:
        for run in manager.policies.observe(event.get("type"), dict(event["object"])):
            manager.worker.enqueue(run)

    # ClusterAgentPolicies: the same cache, keyed ("", name) (a cluster baseline, or named).
    @kopf.on.event(GROUP, VERSION, CLUSTER_POLICY_PLURAL, registry=registry)
    async def clusteragentpolicy_event(event: kopf.RawEvent, **_: Any) -> None:
        body: dict[str, Any] = dict(event["object"])
        body["metadata"] = {**dict(body.get("metadata") or {}), "namespace": CLUSTER}
        for run in manager.policies.observe(event.get("type"), body):
            manager.worker.enqueue(run)

    if manager.config.webhook_port is None:
        return

    async def review_policy(
        body: kopf.Body, userinfo: kopf.UserInfo, warnings: list[str], **kwargs: Any
    ) -> None:
        # On DELETE the body is the old object (kopf); old and new say what changes.
        old, new = kwargs.get("old"), kwargs.get("new")
        review = PolicyReview(
            operation=str(kwargs.get("operation")),
            new=dict(new) if new is not None else None,
            old=dict(old) if old is not None else None,
            user=identity_of(dict(userinfo)),
            dry_run=bool(kwargs.get("dryrun")),
        )
        verdict = await check_policy(manager.kube, review, manager.policies, manager.keyring)
        warnings.extend(verdict.warnings)
        if verdict.refused is not None:
            raise kopf.AdmissionError(verdict.refused, code=403)

    kopf.on.validate(
        GROUP,
        VERSION,
        "agentpolicies",
        id=POLICY_PATH,
        operations=["CREATE", "UPDATE", "DELETE"],
        registry=registry,
    )(review_policy)
    kopf.on.validate(
        GROUP,
        VERSION,
        CLUSTER_POLICY_PLURAL,
        id=CLUSTER_POLICY_PATH,
        operations=["CREATE", "UPDATE"],
        registry=registry,
    )(review_policy)
