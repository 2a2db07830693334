"""A thread that answers what parked runs wait for, as people and other systems would."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents_testkit.cluster import KubeEnv
from durable_agents_testkit.keys import sealed


def _never(run: dict[str, Any]) -> bool:
    return False


def as_admitted(run: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """An answer or event patch with its values sealed for ``run`` as the admission webhook seals
    them (a person answering through it): the operator acts on no value written without it."""
    spec = run.get("spec") or {}
    new = {**run, "spec": {**spec, **{k: {**(spec.get(k) or {}), **v} for k, v in patch["spec"].items()}}}
    admitted = sealed("UPDATE", new, run)["spec"]
    return {"spec": {k: {key: admitted[k][key] for key in v} for k, v in patch["spec"].items()}}


class Responder:
    """A thread that delivers what parked runs wait for: answers, events and (with an approver's
    client) approvals. ``copies`` > 1 delivers each one that many times, concurrently."""

    def __init__(
        self,
        kube: KubeEnv,
        namespaces: list[str],
        *,
        approver: client.ApiClient | None = None,
        copies: int = 1,
        interval: float = 0.2,
        skip: Callable[[dict[str, Any]], bool] = _never,
    ) -> None:
        self.kube = kube
        self.namespaces = namespaces
        self.approver = approver
        self.copies = copies
        self.interval = interval
        self.skip = skip
        self.delivered = 0
        self.refused = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="responder", daemon=True)

    def __enter__(self) -> Responder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            for ns in self.namespaces:
                try:
                    items = self.kube.custom().list_namespaced_custom_object(GROUP, VERSION, ns, "agentruns")[
                        "items"
                    ]
                except Exception as err:  # the API server may be restarting: try again later
                    self.errors.append(f"list: {type(err).__name__}")
                    continue
                for run in items:
                    if self.skip(run):
                        continue
                    patch = self.response_to(run)
                    if patch is not None:
                        self._deliver(ns, run, patch)

    def response_to(self, run: dict[str, Any]) -> tuple[dict[str, Any], bool] | None:
        """The spec patch a run waits for, and whether an approver must send it."""
        status = run.get("status") or {}
        spec = run.get("spec") or {}
        kind, _, what = str(status.get("waitingFor") or "").partition(":")
        state = status.get("state")
        if state == "waiting_input" and kind == "input" and what not in (spec.get("answers") or {}):
            return {"spec": {"answers": {what: "yes"}}}, False
        if state == "waiting_external" and kind == "event" and what not in (spec.get("events") or {}):
            return {"spec": {"events": {what: "now"}}}, False
        if state == "waiting_approval" and self.approver is not None:
            request = status.get("approvalRequest") or {}
            rid = request.get("requestId")
            if rid and rid not in (spec.get("approvals") or {}):
                decision = {"digest": request["digest"], "decision": "approve"}
                return {"spec": {"approvals": {rid: decision}}}, True
        return None

    def _deliver(self, namespace: str, run: dict[str, Any], patch: tuple[dict[str, Any], bool]) -> None:
        body, by_approver = patch
        api = self.approver if by_approver else None
        if not by_approver:
            body = as_admitted(run, body)
        name = run["metadata"]["name"]

        def send() -> None:
            try:
                self.kube.custom(api).patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, "agentruns", name, body
                )
                self.delivered += 1
            except ApiException as err:
                self.refused += 1
                if err.status not in (403, 409, 422, 500):
                    self.errors.append(f"{name}: {err.status} {err.reason}")
            except Exception as err:  # connection refused during a restart
                self.errors.append(f"{name}: {type(err).__name__}")

        if self.copies == 1:
            send()
            return
        threads = [threading.Thread(target=send) for _ in range(self.copies)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
