"""Test helpers for an operator's endpoints: a free loopback port, its Prometheus metrics."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Mapping

from durable_agents_testkit.eventually import Within, eventually


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text: str = resp.read().decode()
    return text


def metric(text: str, name: str, default: float | None = None) -> float:
    """The value of one sample, by name with its labels (as exported, labels sorted). A labelled
    sample is only exported once counted: ``default`` then, or an AssertionError without one."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    if default is not None:
        return default
    raise AssertionError(f"metric {name} not exported")


def scrape_when(port: int, counts: Mapping[str, float], within: float = Within.COMMIT) -> str:
    """The metrics text once every sample of ``counts`` has reached its count. The operator counts
    a write once it has returned, so a test that has already seen the write's effect can scrape a
    moment before it is counted. Assert the exact values on the text returned: too many still fail."""

    def counted() -> str | None:
        text = scrape(port)
        return text if all(metric(text, name, default=0) >= n for name, n in counts.items()) else None

    try:
        return eventually(counted, within, f"the operator to count {dict(counts)}")
    except TimeoutError as err:
        text = scrape(port)
        seen = {name: metric(text, name, default=0) for name in counts}
        raise TimeoutError(f"{err}; counted {seen}") from None
