"""The admission webhook's rules for AgentSchedules (:mod:`durable_agents.core.schedule_authority`).

- Stamp (mutating, CREATE): ``spec.createdBy`` is the request's user, stamped over the namespace,
  name, time and the run template's digest; whatever the client wrote there is overwritten.
- Validate (CREATE, UPDATE): the schedule must be one the operator can run: the cron expression
  parses (5 fields), the time zone exists, the name leaves room for the time in its runs' names
  (else they would all collide on one name); each refusal names its field (422). On CREATE the
  creator must be allowed what creating its runs by hand needs: create AgentRuns in the
  namespace, ``use`` the template's ServiceAccount and the policy it names (403), and the
  template carries no requests and no createdBy of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from durable_agents.api.v1alpha1 import AgentScheduleSpec, Identity
from durable_agents.core import schedules as slots
from durable_agents.core.engine.snapshot import creation_time
from durable_agents.core.request_stamps import spec_of
from durable_agents.core.schedule_authority import (
    CREATE_RUN_VERB,
    schedule_unproven,
    stamp_schedule,
    template_problem,
)
from durable_agents.core.sealing import Keyring
from durable_agents.shell.admission.authority import USE_VERB, check_policy_choice, refused_verb
from durable_agents.shell.ground.kube import Kube, service_account_user

SCHEDULE_STAMP_PATH = "stamp-schedule"
SCHEDULE_PATH = "validate-schedule"


def schedule_stamps(
    operation: str, new: Mapping[str, Any], user: Identity, now: datetime, keyring: Keyring
) -> dict[str, Any]:
    """The spec fields a new schedule gets from the webhook: its stamped ``createdBy``."""
    if operation != "CREATE":
        return {}
    meta = new.get("metadata") or {}
    try:
        spec = AgentScheduleSpec.model_validate({**spec_of(new), "createdBy": None})
    except ValueError:
        return {}  # refused by validation, naming the field
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    creator = stamp_schedule(keyring, namespace, name, user, now, spec.run_template)
    return {"createdBy": {**creator, "uid": user.uid}}


def invalid(new: Mapping[str, Any]) -> str | None:
    """Why this schedule cannot run (its field named), or None."""
    meta = new.get("metadata") or {}
    spec = spec_of(new)
    found = slots.problems(
        str(meta.get("name") or ""), str(spec.get("schedule") or ""), str(spec.get("timeZone") or "UTC")
    )
    if found:
        return "; ".join(found)
    return template_problem(spec.get("runTemplate") or {})


async def check_schedule(
    kube: Kube, operation: str, new: Mapping[str, Any], user: Identity, keyring: Keyring
) -> tuple[int, str] | None:
    """(HTTP code, why) this AgentSchedule create or update must be refused, or None."""
    problem = invalid(new)
    if problem is not None:
        return 422, problem
    if operation != "CREATE":
        return None  # the template and createdBy are immutable (the CRD's rules)
    meta = new.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    if not name:
        return (
            422,
            "metadata.name: name the schedule (with generateName its name is not known when it is stamped)",
        )
    spec = AgentScheduleSpec.model_validate(spec_of(new))
    template = spec.run_template
    refused = await refused_verb(kube, user, CREATE_RUN_VERB, "agentruns", namespace, "")
    sa = template.service_account_name
    if refused is None and user.username != service_account_user(namespace, sa):
        refused = await refused_verb(kube, user, USE_VERB, "serviceaccounts", namespace, sa, group="")
    if refused is not None:
        return 403, f"spec.runTemplate: {refused}: a schedule starts runs as its creator's"
    refused = await check_policy_choice(kube, template, namespace, user)
    if refused is not None:
        return 403, f"spec.runTemplate.{refused}"
    created = creation_time(meta) or datetime.now(UTC)
    unproven = schedule_unproven(keyring, namespace, name, spec, created)
    if unproven is not None:
        return (
            403,
            f"spec.createdBy is not the admission webhook's stamp for this schedule ({unproven.message})",
        )
    return None
