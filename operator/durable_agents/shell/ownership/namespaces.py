"""Whether this operator may act in a namespace: impersonate its ServiceAccounts, which every
read and effect of a run is made with. A namespace opts in with a RoleBinding
(docs/security/operator-rbac.md); the operator asks the API server once per namespace (a
SelfSubjectAccessReview) and remembers the answer, so a run in a namespace that has not opted
in costs no request that would be refused, however often it is looked at.

A refusal is remembered for a short while (a namespace that opts in is seen soon), an allowance
longer (a namespace that opts out meanwhile is seen at once anyway: the API server refuses the
impersonated request, :class:`~durable_agents.shell.ground.kube.ImpersonationRefused`, and
:meth:`ManagedNamespaces.refused` takes that as the answer).
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta

from kubernetes import client

from durable_agents.shell.ground.kube import Kube

log = logging.getLogger("durable_agents.shell.ownership.namespaces")

ALLOWED_FOR = 300.0  # seconds an allowance is remembered
REFUSED_FOR = 10.0  # seconds a refusal is remembered: a namespace that opts in is seen this soon


class ManagedNamespaces:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._answers: dict[str, tuple[bool, float]] = {}  # namespace: (allowed, until, monotonic)
        self._lock = asyncio.Lock()  # one review per namespace at a time, not one per run

    async def allowed(self, namespace: str) -> bool:
        answer = self._answers.get(namespace)
        if answer is not None and answer[1] > time.monotonic():
            return answer[0]
        async with self._lock:
            answer = self._answers.get(namespace)
            if answer is not None and answer[1] > time.monotonic():
                return answer[0]
            allowed = await self._review(namespace)
            if answer is None or answer[0] != allowed:
                log.log(
                    logging.INFO if allowed else logging.WARNING,
                    "namespace %s %s",
                    namespace,
                    "is managed: the operator may act as its ServiceAccounts"
                    if allowed
                    else "is not managed (no RoleBinding lets the operator impersonate its"
                    " ServiceAccounts): its runs are left alone (NamespaceNotManaged)",
                )
            self._remember(namespace, allowed)
            return allowed

    async def refused_before(self, namespace: str) -> bool:
        """Whether the namespace was refused and still is. Asked again (a review) only for a
        namespace refused before: a caller on a hot path (the dispatcher: its records were made
        while the namespace was managed) makes no review, and no request waits for one."""
        answer = self._answers.get(namespace)
        if answer is None or answer[0]:
            return False
        return not await self.allowed(namespace)

    def refused(self, namespace: str) -> None:
        """The API server refused an impersonated request there: take that as the answer."""
        log.warning("namespace %s: impersonation refused; its runs wait until it opts in again", namespace)
        self._remember(namespace, False)

    def due(self, namespace: str) -> datetime:
        """When the namespace's answer is asked again (a moment after it lapses)."""
        answer = self._answers.get(namespace)
        left = max(0.0, answer[1] - time.monotonic()) if answer is not None else 0.0
        return datetime.now(UTC) + timedelta(seconds=left + 0.1)

    def _remember(self, namespace: str, allowed: bool) -> None:
        self._answers[namespace] = (allowed, time.monotonic() + (ALLOWED_FOR if allowed else REFUSED_FOR))

    async def _review(self, namespace: str) -> bool:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": "impersonate",
                    "group": "",
                    "resource": "serviceaccounts",
                }
            },
        }
        api = client.AuthorizationV1Api(self.kube.api)
        answer = await self.kube.call(api.create_self_subject_access_review, review)
        return bool(answer.status and answer.status.allowed)
