"""Shared unit-test builders live in ``tests.unit.builders``: their asserts report like a test's."""

import pytest

pytest.register_assert_rewrite("tests.unit.builders")
