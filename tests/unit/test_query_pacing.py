"""An unknown answer paces the next question; a person's answer for the record cuts the wait."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from durable_agents.shell.ledger.query_pacing import QueryPacing

pytestmark = pytest.mark.unit

KEY = ("team-a", "act-1")


def test_after_an_unknown_answer_the_record_waits_its_backoff_whatever_wakes_it() -> None:
    pacing = QueryPacing()
    assert pacing.later(KEY) is None, "the first question is asked at once"
    at = pacing.asked(KEY, queries=3)
    assert timedelta(seconds=7) < at - datetime.now(UTC) <= timedelta(seconds=8)
    assert pacing.later(KEY) == at, "our own status write wakes the record: it still waits"
    assert pacing.asked(KEY, queries=20) - datetime.now(UTC) <= timedelta(seconds=60), "capped"


def test_a_person_answering_for_a_waiting_record_has_it_asked_again_at_once() -> None:
    pacing = QueryPacing()
    pacing.asked(KEY, queries=5)
    pacing.asked(("team-a", "act-2"), queries=5)
    run = {"metadata": {"namespace": "team-a"}, "spec": {"reconciliations": {"act-1.2": {}, "act-9": {}}}}
    assert pacing.answered(run) == [KEY], "only records that wait, by record name (NAME or NAME.ATTEMPT)"
    assert pacing.later(KEY) is None
    assert pacing.later(("team-a", "act-2")) is not None
    other = {"metadata": {"namespace": "team-b"}, "spec": {"reconciliations": {"act-2": {}}}}
    assert pacing.answered(other) == [], "another namespace's record of the same name is not it"
