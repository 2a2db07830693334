"""What a test needs from the local control plane the test kit starts, and why another cluster
(kind, ``make test-kind``) cannot give it.

A test that needs the local plane carries ``@pytest.mark.local_plane("<need>", ...)`` naming its
needs from :data:`NEEDS` (the top-level ``conftest.py`` refuses unknown names, a mark without a
need, and a test that asks for the ``plane`` fixture without the mark). Against another cluster
(``DURABLE_AGENTS_TEST_KUBECONFIG``) such a test is skipped naming its needs, and ``make test-kind``
deselects it; the table in ``docs/operate/kind-suites.md`` is generated from the same marks
(:mod:`durable_agents_testkit.kind_suites`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

MARK = "local_plane"


@dataclass(frozen=True)
class Need:
    what: str  # what the test uses of the local plane
    why_not_on_kind: str


NEEDS: dict[str, Need] = {
    "users": Need(
        "users with chosen names and groups (client certificates minted from the plane's CA)",
        "the test kit mints client certificates with the local plane's CA only; kind's CA is in the"
        " node container",
    ),
    "webhook": Need(
        "the operator's admission webhook on `127.0.0.1`, reachable by the API server",
        "kind's API server runs in a container: `127.0.0.1` is its own loopback, so the webhook"
        " (failurePolicy Fail) refuses every AgentRun write",
    ),
    "audit": Need(
        "the API server's audit log as a local file",
        "kind has no audit log unless created with an audit policy, and it would be inside the node"
        " container",
    ),
    "etcd": Need("etcd's client certificate and gRPC gateway", "kind's etcd is inside the node container"),
    "restarts": Need(
        "API server and etcd restarts, a second plane",
        "kind cannot be restarted or duplicated from the test",
    ),
    "itself": Need("the plane itself (binaries, restarts, the detached CLI)", "it tests the local plane"),
}


def checked(needs: Iterable[object], where: str) -> tuple[str, ...]:
    """The needs of one mark, in :data:`NEEDS` order; a clear error for none or an unknown one."""
    given = list(needs)
    unknown = [n for n in given if n not in NEEDS]
    if not given or unknown:
        raise ValueError(
            f"{where}: @pytest.mark.{MARK}(...) must name what the test needs from the local plane,"
            f" among {sorted(NEEDS)}; got {given!r}"
        )
    return tuple(n for n in NEEDS if n in given)


def declared(item: Any) -> frozenset[str]:
    """The needs a test's marks declare (on the test, its class or its module)."""
    return frozenset(n for mark in item.iter_markers(MARK) for n in mark.args)


def skip_reason(needs: Iterable[str]) -> str:
    return "needs the local control plane: " + "; ".join(NEEDS[n].what for n in needs)
