"""The reference authoritative system: counts every application, never deduplicates, injects faults."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import pytest

from durable_agents_testkit import refsystem
from durable_agents_testkit.refsystem import (
    FaultMode,
    ReferenceSystem,
    ReferenceSystemThread,
    RunningReferenceSystem,
    receipt_for,
    serve,
)

pytestmark = pytest.mark.unit

SLOW = 0.3


@pytest.fixture
async def ref() -> AsyncIterator[RunningReferenceSystem]:
    async with serve() as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post_effect(
    http: aiohttp.ClientSession, ref: RunningReferenceSystem, key: str, body: Any = None, **kwargs: Any
) -> tuple[int, Any]:
    async with http.post(
        f"{ref.url}/effects", headers={"Idempotency-Key": key}, json=body, **kwargs
    ) as response:
        return response.status, await response.json()


async def lookup(http: aiohttp.ClientSession, ref: RunningReferenceSystem, key: str) -> tuple[int, Any]:
    async with http.get(f"{ref.url}/effects", params={"key": key}) as response:
        return response.status, await response.json()


async def test_every_post_is_applied_no_dedup(
    ref: RunningReferenceSystem, http: aiohttp.ClientSession
) -> None:
    assert await post_effect(http, ref, "a", {"amount": 1}) == (
        201,
        {"key": "a", "applied": 1, "receipt": receipt_for("a")},
    )
    assert await post_effect(http, ref, "a", {"amount": 2}) == (
        201,
        {"key": "a", "applied": 2, "receipt": receipt_for("a")},
    )
    await post_effect(http, ref, "b", {"amount": 3})

    async with http.get(f"{ref.url}/counts") as response:
        assert response.status == 200
        assert await response.json() == {"applications": {"a": 2, "b": 1}, "total": 3, "duplicates": ["a"]}
    async with http.get(f"{ref.url}/records") as response:
        records = (await response.json())["records"]
    assert [(r["key"], r["body"], r["seq"]) for r in records] == [
        ("a", {"amount": 1}, 1),
        ("a", {"amount": 2}, 2),
        ("b", {"amount": 3}, 3),
    ]
    assert all(r["appliedAt"].endswith("Z") for r in records)


async def test_lookup_found_and_not_found(ref: RunningReferenceSystem, http: aiohttp.ClientSession) -> None:
    assert await lookup(http, ref, "missing") == (404, {"key": "missing", "applied": 0})
    await post_effect(http, ref, "k", {"v": 1})
    await post_effect(http, ref, "k", {"v": 2})
    status, answer = await lookup(http, ref, "k")
    assert status == 200
    assert answer["key"] == "k"
    assert answer["applied"] == 2
    assert answer["receipt"] == receipt_for("k")
    assert answer["body"] == {"v": 2}  # the last body
    async with http.get(f"{ref.url}/effects") as response:
        assert response.status == 400


async def test_keys_with_slashes_and_colons_round_trip(
    ref: RunningReferenceSystem, http: aiohttp.ClientSession
) -> None:
    key = "ns/run-1:attempt/2:send email?x=%41&y"
    status, answer = await post_effect(http, ref, key, {"to": "a@example.invalid"})
    assert (status, answer["key"]) == (201, key)
    status, answer = await lookup(http, ref, key)
    assert (status, answer["key"], answer["applied"]) == (200, key, 1)
    async with http.get(f"{ref.url}/effects/{quote(key, safe='')}") as response:
        assert response.status == 200
        assert (await response.json())["key"] == key
    assert ref.system.counts() == {key: 1}


async def test_missing_idempotency_key_is_400_and_not_applied(
    ref: RunningReferenceSystem, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{ref.url}/effects", json={"x": 1}) as response:
        assert response.status == 400
    async with http.post(
        f"{ref.url}/effects", headers={"Idempotency-Key": "k"}, data=b"{not json"
    ) as response:
        assert response.status == 400
    assert ref.system.total() == 0


async def test_slow_applies_but_client_times_out(
    ref: RunningReferenceSystem, http: aiohttp.ClientSession
) -> None:
    ref.system.inject(FaultMode.SLOW, delay=SLOW)
    with pytest.raises(asyncio.TimeoutError):
        await post_effect(http, ref, "slow-1", {}, timeout=aiohttp.ClientTimeout(total=SLOW / 3))
    assert ref.system.applied("slow-1") == 1
    assert (await lookup(http, ref, "slow-1"))[0] == 200


async def test_slow_answers_after_delay_with_patient_client(
    ref: RunningReferenceSystem, http: aiohttp.ClientSession
) -> None:
    ref.system.inject("slow", delay=0.1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await post_effect(http, ref, "slow-2", {}) == (
        201,
        {"key": "slow-2", "applied": 1, "receipt": receipt_for("slow-2")},
    )
    assert loop.time() - started >= 0.1


async def test_drop_after_apply_disconnects_but_applies(
    ref: RunningReferenceSystem, http: aiohttp.ClientSession
) -> None:
    ref.system.inject("drop_after_apply")
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await post_effect(http, ref, "drop-1", {})
    assert ref.system.applied("drop-1") == 1
    # The service keeps working afterwards.
    assert (await post_effect(http, ref, "drop-2", {}))[0] == 201


async def test_error_after_apply_is_500_and_applied(
    ref: RunningReferenceSystem, http: aiohttp.ClientSession
) -> None:
    ref.system.inject("error_after_apply")
    status, _ = await post_effect(http, ref, "e-after", {})
    assert status == 500
    assert ref.system.applied("e-after") == 1


async def test_error_before_apply_is_500_and_not_applied(
    ref: RunningReferenceSystem, http: aiohttp.ClientSession
) -> None:
    ref.system.inject("error_before_apply")
    status, _ = await post_effect(http, ref, "e-before", {})
    assert status == 500
    assert ref.system.applied("e-before") == 0
    assert await lookup(http, ref, "e-before") == (404, {"key": "e-before", "applied": 0})


async def test_times_match_and_order(ref: RunningReferenceSystem, http: aiohttp.ClientSession) -> None:
    ref.system.inject("error_before_apply", times=2, match="pay")
    ref.system.inject("error_after_apply", times=1)
    ref.system.inject("error_before_apply", times=1)

    # Not matching "pay": skips the first fault, consumes the second.
    assert (await post_effect(http, ref, "mail-1", {}))[0] == 500
    assert ref.system.applied("mail-1") == 1
    # Matching "pay": consumes the first fault twice.
    assert (await post_effect(http, ref, "pay-1", {}))[0] == 500
    assert (await post_effect(http, ref, "pay-1", {}))[0] == 500
    assert ref.system.applied("pay-1") == 0
    # Then the third fault, then nothing.
    assert (await post_effect(http, ref, "pay-1", {}))[0] == 500
    assert ref.system.applied("pay-1") == 0
    assert (await post_effect(http, ref, "pay-1", {}))[0] == 201
    assert ref.system.counts() == {"mail-1": 1, "pay-1": 1}
    assert ref.system.pending_faults() == []


async def test_none_mode_lets_one_through(ref: RunningReferenceSystem, http: aiohttp.ClientSession) -> None:
    ref.system.inject("none")
    ref.system.inject("error_before_apply")
    assert (await post_effect(http, ref, "x", {}))[0] == 201
    assert (await post_effect(http, ref, "x", {}))[0] == 500
    assert ref.system.applied("x") == 1


async def test_fault_endpoints(ref: RunningReferenceSystem, http: aiohttp.ClientSession) -> None:
    async with http.post(
        f"{ref.url}/faults", json={"mode": "slow", "times": 2, "delay": 0.5, "match": "pay"}
    ) as response:
        assert response.status == 201
        assert (await response.json())["queued"] == {"mode": "slow", "times": 2, "delay": 0.5, "match": "pay"}
    async with http.post(f"{ref.url}/faults", json={"mode": "error_before_apply"}) as response:
        assert response.status == 201
    async with http.get(f"{ref.url}/faults") as response:
        pending = (await response.json())["pending"]
    assert [f["mode"] for f in pending] == ["slow", "error_before_apply"]
    assert pending[1] == {"mode": "error_before_apply", "times": 1, "delay": 5.0, "match": None}

    for bad in (
        {"mode": "explode"},
        {"times": 1},
        {"mode": "slow", "times": 0},
        {"mode": "slow", "delay": -1},
    ):
        async with http.post(f"{ref.url}/faults", json=bad) as response:
            assert response.status == 400, bad

    async with http.delete(f"{ref.url}/faults") as response:
        assert response.status == 200
    assert ref.system.pending_faults() == []


async def test_reset(ref: RunningReferenceSystem, http: aiohttp.ClientSession) -> None:
    await post_effect(http, ref, "a", {})
    ref.system.inject("slow")
    async with http.post(f"{ref.url}/reset") as response:
        assert response.status == 200
    assert ref.system.counts() == {}
    assert ref.system.total() == 0
    assert ref.system.pending_faults() == []


async def test_concurrent_posts_all_counted(ref: RunningReferenceSystem, http: aiohttp.ClientSession) -> None:
    results = await asyncio.gather(*(post_effect(http, ref, "same", {"i": i}) for i in range(20)))
    assert sorted(answer["applied"] for _, answer in results) == list(range(1, 21))
    assert ref.system.duplicates() == ["same"]


def test_non_loopback_refused() -> None:
    with pytest.raises(ValueError, match="non-loopback"):
        RunningReferenceSystem(ReferenceSystem(), host="0.0.0.0")
    with pytest.raises(ValueError, match="non-loopback"):
        ReferenceSystemThread(host="10.0.0.1")


# -- the thread runner, from synchronous code ---------------------------------------------------


@pytest.fixture
def threaded() -> Iterator[ReferenceSystemThread]:
    with ReferenceSystemThread() as running:
        yield running


def sync_post(url: str, key: str, body: Any, timeout: float = 5.0) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{url}/effects",
        data=json.dumps(body).encode(),
        headers={"Idempotency-Key": key, "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def sync_get(url: str, key: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"{url}/effects?{urlencode({'key': key})}", timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_thread_runner_from_sync_code(threaded: ReferenceSystemThread) -> None:
    assert threaded.url.startswith("http://127.0.0.1:")
    assert threaded.port > 0
    key = "a/b:c"
    assert sync_post(threaded.url, key, {"n": 1})[0] == 201
    assert sync_post(threaded.url, key, {"n": 2}) == (
        201,
        {"key": key, "applied": 2, "receipt": receipt_for(key)},
    )
    assert threaded.counts() == {key: 2}
    assert threaded.duplicates() == [key]
    assert sync_get(threaded.url, key)[1]["body"] == {"n": 2}
    assert sync_get(threaded.url, "nope") == (404, {"key": "nope", "applied": 0})

    threaded.inject("error_before_apply", match="pay")
    threaded.inject("slow", delay=SLOW)
    assert [f.mode for f in threaded.pending_faults()] == [FaultMode.ERROR_BEFORE_APPLY, FaultMode.SLOW]
    assert sync_post(threaded.url, "pay-1", {})[0] == 500
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        sync_post(threaded.url, "mail-1", {}, timeout=SLOW / 3)
    assert threaded.counts() == {key: 2, "mail-1": 1}

    threaded.reset()
    assert threaded.counts() == {}
    assert threaded.total() == 0
    assert threaded.pending_faults() == []


def test_thread_runner_stop_and_errors() -> None:
    running = ReferenceSystemThread().start()
    url = running.url
    running.stop()
    running.stop()  # idempotent
    with pytest.raises(RuntimeError):
        running.counts()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url}/counts", timeout=1)

    with ReferenceSystemThread() as first, pytest.raises(OSError, match="in use"):
        ReferenceSystemThread(port=first.port).start()


def test_standalone_main_prints_url() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "durable_agents_testkit.refsystem", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(refsystem.__file__).parents[1])},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        url = line.split()[-1]
        assert url.startswith("http://127.0.0.1:")
        assert sync_post(url, "standalone", {})[0] == 201
        assert sync_get(url, "standalone")[1]["applied"] == 1
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0
        if process.stdout is not None:
            process.stdout.close()
