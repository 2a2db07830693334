"""The mutating webhook's JSON patch, diffed only where the handlers' merge patch reaches
(``durable_agents_controllers/admission_patch.py``): the object it makes is the one kopf's own
patch makes, and the parts the merge patch does not reach are not diffed."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
from kopf._cogs.structs import bodies, patches

from durable_agents_controllers.admission_patch import narrow_json_patch

LIBRARY = patches.Patch.as_json_patch

RUN: dict[str, Any] = {
    "apiVersion": "durable-agents.io/v1alpha1",
    "kind": "AgentRun",
    "metadata": {
        "name": "r1",
        "namespace": "ns",
        "annotations": {"a/b": "1", "keep": "x"},
        "labels": {"l": "v"},
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {"f:steps": {}}}}],
    },
    "spec": {
        "objective": "o",
        "steps": [{"name": "s1", "effect": {"arguments": {"amount": 1}}}, {"name": "s2"}],
        "approvals": [{"requestId": "q1", "decision": "approve"}],
    },
    "status": {"state": "waiting_approval", "history": [{"event": "accepted"}] * 20},
}

MERGES: list[dict[str, Any]] = [
    {"metadata": {"annotations": {"durable-agents.io/created-by": "alice"}}},  # add beside others
    {"metadata": {"annotations": {"a/b": "2"}}},  # replace, a key with a slash
    {"metadata": {"annotations": {"keep": None, "gone": None}}},  # remove, and remove nothing
    {"metadata": {"finalizers": ["durable-agents.io/ledger"]}},  # a new list
    {"spec": {"approvals": [{"requestId": "q1", "decision": "approve", "approver": "bob"}]}},
    {"spec": {"steps": [{"name": "s1", "effect": {"arguments": {"amount": "sealed:..."}}}, {"name": "s2"}]}},
    {"spec": {"newField": {"nested": {"x": 1, "y": None}}}},  # a new object, its nulls dropped
    {"metadata": {"labels": {"l": None, "absent": None}}},  # a map left empty goes too (kopf's way)
    {"metadata": {"annotations": {"a/b": None, "keep": None}, "labels": {"n": "1"}}},
    {"spec": {"approvals": [], "steps": None}, "metadata": {"gone": {"x": None}}},
    {"metadata": {"labels": {"l": None}}, "spec": {"approvals": None}},  # two places at once
    {"status": {"state": "x"}, "metadata": {"annotations": {"~tilde": "t"}}},
]


def applied(ops: list[Any]) -> dict[str, Any]:
    result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(RUN), ops)
    return result


@pytest.mark.parametrize("merge", MERGES, ids=[str(i) for i in range(len(MERGES))])
def test_the_narrow_patch_makes_the_object_kopfs_patch_makes(merge: dict[str, Any]) -> None:
    body = bodies.Body(copy.deepcopy(RUN))
    library = LIBRARY(patches.Patch(copy.deepcopy(merge), body=body))
    narrow = narrow_json_patch(patches.Patch(copy.deepcopy(merge), body=body))
    assert library, "every case changes the object"
    assert applied(narrow) == applied(library)
    assert body == RUN, "the reviewed object is not changed"


def test_a_merge_patch_kopf_cannot_apply_is_refused_the_same_way() -> None:
    """A scalar the merge patch descends into: kopf's merge raises, and so does the narrow one."""
    merge = {"spec": {"objective": {"now": "an object"}}}
    body = bodies.Body(copy.deepcopy(RUN))
    with pytest.raises(TypeError):
        LIBRARY(patches.Patch(copy.deepcopy(merge), body=body))
    with pytest.raises(TypeError):
        narrow_json_patch(patches.Patch(copy.deepcopy(merge), body=body))


def test_only_what_the_merge_patch_reaches_is_diffed() -> None:
    """An annotation added to a run with a long status: one operation, at the annotation. The
    status holds a value jsonpatch cannot compare (a set): diffing it would raise."""
    run = {**copy.deepcopy(RUN), "status": {"unreachable": {1, 2}}}
    merge = {"metadata": {"annotations": {"durable-agents.io/created-by": "alice"}}}
    ops = narrow_json_patch(patches.Patch(merge, body=bodies.Body(run)))
    assert ops == [
        {"op": "add", "path": "/metadata/annotations/durable-agents.io~1created-by", "value": "alice"}
    ]


def test_an_empty_patch_and_a_patch_with_functions_are_the_librarys() -> None:
    body = bodies.Body(copy.deepcopy(RUN))
    assert narrow_json_patch(patches.Patch(body=body)) == []

    def touch(raw: Any) -> None:
        raw["status"]["state"] = "moved"

    with_fn = patches.Patch({"metadata": {"labels": {"n": "1"}}}, body=body, fns=[touch])
    ops = narrow_json_patch(with_fn)
    assert applied(ops)["status"]["state"] == "moved"
    assert applied(ops)["metadata"]["labels"] == {"l": "v", "n": "1"}
