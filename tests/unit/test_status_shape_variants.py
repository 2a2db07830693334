"""The schema variants bench/status_shapes.py installs: derived from crds/ in memory, as intended."""

from __future__ import annotations

import json
from typing import Any

from bench.status_shapes import MARKER, OPAQUE, Variant, load_base_crd, shapes_of, variant_crd


def status_schema(crd: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    return props["status"]["properties"]  # type: ignore[no-any-return]


def test_opaque_variant_changes_only_what_it_names() -> None:
    base = load_base_crd()
    before = json.dumps(base, sort_keys=True)
    crd = variant_crd(base, Variant("v", opaque_history=True, opaque_approval=True))
    assert json.dumps(base, sort_keys=True) == before  # the loaded CRD is not modified
    status = status_schema(crd)
    assert status["history"]["items"] == OPAQUE
    assert status["history"]["maxItems"] == status_schema(base)["history"]["maxItems"]
    assert status["approvalRequest"] == OPAQUE
    assert status["conditions"] == status_schema(base)["conditions"]
    assert status[MARKER]["enum"] == ["v"]


def test_no_cel_variant_removes_every_rule() -> None:
    base = load_base_crd()
    assert "x-kubernetes-validations" in json.dumps(base)
    crd = variant_crd(base, Variant("n", no_cel=True))
    assert "x-kubernetes-validations" not in json.dumps(crd)
    assert status_schema(crd)["history"] == status_schema(base)["history"]


def test_shapes_keep_the_current_status_apart() -> None:
    history = [{"stateVersion": i} for i in range(26)]
    current: dict[str, Any] = {"state": "completed", "stateVersion": 26, "history": history}
    shapes = shapes_of(current, {"requestId": "r"})
    assert shapes["minimal"] == {"state": "completed", "stateVersion": 1}
    assert "history" not in shapes["no_history"]
    assert [h["stateVersion"] for h in shapes["history_8"]["history"]] == list(range(18, 26))
    assert shapes["with_approval"]["approvalRequest"] == {"requestId": "r"}
    assert len(history) == 26  # the input is not modified


def test_the_checkpoint_as_one_string_holds_the_same_checkpoint() -> None:
    checkpoint = {"schemaVersion": 3, "position": {"state": "completed", "stateVersion": 26}}
    history = [{"stateVersion": i} for i in range(26)]
    current: dict[str, Any] = {"state": "completed", "history": history, "checkpoint": checkpoint}
    shapes = shapes_of(current, {"requestId": "r"})
    stored = shapes["checkpoint_string"]["checkpoint"]
    assert stored["schemaVersion"] == 3
    assert json.loads(stored["document"]) == checkpoint
    assert shapes["checkpoint_string"]["history"] == history
    assert len(shapes["checkpoint_string_8"]["history"]) == 8
    assert "history" not in shapes["checkpoint_string_no_history"]
    assert shapes["no_checkpoint_no_history"] == {"state": "completed"}


def test_atomic_checkpoint_variant_marks_only_the_checkpoint_atomic() -> None:
    base = load_base_crd()
    crd = variant_crd(base, Variant("v", atomic_checkpoint=True))
    status, before = status_schema(crd), status_schema(base)
    assert status["checkpoint"]["x-kubernetes-map-type"] == "atomic"
    assert "x-kubernetes-map-type" not in before["checkpoint"], "the loaded CRD is not modified"
    rest = {k: v for k, v in status["checkpoint"].items() if k != "x-kubernetes-map-type"}
    assert rest == before["checkpoint"]
    assert status["history"] == before["history"]


def test_atomic_status_variant_marks_the_status_atomic_and_nothing_below() -> None:
    base = load_base_crd()
    crd = variant_crd(base, Variant("v", atomic_status=True))
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    assert props["status"]["x-kubernetes-map-type"] == "atomic"
    assert "x-kubernetes-map-type" not in status_schema(crd)["checkpoint"]
