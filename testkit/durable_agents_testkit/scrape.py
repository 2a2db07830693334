"""Test helpers for an operator's endpoints: a free loopback port, its Prometheus metrics."""

from __future__ import annotations

import socket
import urllib.request


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
