"""Shared by the unit and integration tests."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _thawed_heap() -> Iterator[None]:
    """A worker run in the test process freezes its heap after bursts (``gc.freeze``, see
    ``durable_agents.shell.ground.memory``); thawed after each test, the test process's garbage
    stays collectable for the tests after it."""
    yield
    gc.unfreeze()  # a list splice; gc.get_freeze_count() would walk every frozen object instead
