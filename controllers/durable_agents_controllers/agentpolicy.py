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
from durable_agents.shell.admission.policies import POLICY_PATH, PolicyReview, check_policy
from durable_agents.shell.admission.policy_preview import PolicyPreviewer, RunIndex
from durable_agents.shell.runs.evidence import EvidenceReader
from durable_agents_controllers.manager import Manager


def register(registry: kopf.OperatorRegistry, manager: Manager) -> None:
    @kopf.on.event(GROUP, VERSION, "agentpolicies", registry=registry)
    async def agentpolicy_event(event: kopf.RawEvent, **_: Any) -> None:
        for run in manager.policies.observe(event.get("type"), dict(event["object"])):
            manager.worker.enqueue(run)

    if manager.config.webhook_port is None:
        return
    # The preview reads the runs' evidence again as the worker does (as each run's ServiceAccount),
    # and takes the runs from the manager's one AgentRun watch (no LIST per review).
    index = RunIndex()
    previewer = PolicyPreviewer(manager.kube, manager.keyring, EvidenceReader(manager.kube), index)

    def build(manager: Manager) -> None:
        index.follow(manager.runs.synced)
        manager.runs.subscribe(index.observe)

    manager.builds.append(build)

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
        verdict = await check_policy(manager.kube, review, manager.policies, manager.keyring, previewer)
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
