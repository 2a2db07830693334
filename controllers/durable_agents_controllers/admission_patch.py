"""The mutating webhook's JSON patch, diffed where the handlers wrote and nowhere else.

kopf answers a mutating review with the JSON patch between the object and the object with the
handlers' merge patch applied: it deep-copies the whole object and has ``jsonpatch`` diff all of
it, status and ``managedFields`` included, to find the few fields a handler set (an annotation,
a sealed value, an approval's stamp). That was an eighth of the webhook process's CPU (issue 38,
the model row's profile). :func:`narrow_json_patch` applies the same merge patch the same way
(kopf's own ``_apply_patch``) and diffs with the same library, but only the values the merge patch
reaches: where it descends into an object that exists, the rest of that object is not looked at.
The patch it gives can differ in its operations (a ``move`` across two of those values is an
``add`` and a ``remove`` here), never in the object it makes (``tests/unit/test_admission_patch.py``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, cast

import jsonpatch
from kopf._cogs.structs import bodies, patches

_library_json_patch = patches.Patch.as_json_patch


def _escaped(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _has_null(merge: Any) -> bool:
    return merge is None or (isinstance(merge, Mapping) and any(_has_null(v) for v in merge.values()))


def _diff_within(
    patch: patches.Patch, base: Mapping[str, Any], merge: Mapping[str, Any], pointer: str
) -> tuple[list[Any], bool]:
    """The operations that make ``base`` (the object at ``pointer``) what ``merge`` makes it, and
    whether kopf would remove ``base`` itself: it removes an object a null of the merge patch
    passed through and left empty (``kopf._cogs.structs.dicts.remove``)."""
    ops: list[Any] = []
    keys = set(base)
    for key, value in merge.items():
        here = f"{pointer}/{_escaped(key)}"
        if isinstance(value, Mapping) and key in base and isinstance(base[key], Mapping):
            inner, emptied = _diff_within(patch, base[key], value, here)
            if emptied:
                ops.append({"op": "remove", "path": here})
                keys.discard(key)
            else:
                ops += inner
            continue
        before = {key: base[key]} if key in base else {}
        after = copy.deepcopy(before)
        # kopf's own merge: its lists, its nulls and its errors
        patch._apply_patch(cast(bodies.RawBody, after), (key,), value)
        for op in jsonpatch.JsonPatch.from_diff(before, after).patch:
            moved = {**op, "path": pointer + op["path"]}
            if "from" in op:
                moved["from"] = pointer + op["from"]
            ops.append(moved)
        if key in after:
            keys.add(key)
        else:
            keys.discard(key)
    return ops, not keys and _has_null(merge)


def narrow_json_patch(
    self: patches.Patch, body: bodies.Body | bodies.RawBody | None = None
) -> patches.JSONPatch:
    """kopf's ``Patch.as_json_patch``, diffing only what the merge patch reaches. A patch with
    transformation functions (which may touch anything), or keys that are not all strings, goes
    to the library's own."""
    base = body if body is not None else self._original
    if self.fns or base is None or not all(isinstance(key, str) for key in self):
        return _library_json_patch(self, body)
    if not self:
        return []
    ops, _ = _diff_within(self, base, dict(self), "")  # kopf never removes the object itself
    return cast(patches.JSONPatch, ops)


def install() -> None:
    """Answer every review of this process with :func:`narrow_json_patch` (the webhook process
    only: kopf builds no other JSON patch)."""
    patches.Patch.as_json_patch = narrow_json_patch  # type: ignore[method-assign]
