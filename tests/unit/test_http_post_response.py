"""What an ``http.post`` keeps of its answer for the ActionRecord (issue 36, item 5): the status and
the body, JSON when it is, else text, read no further than BODY_MAX_BYTES and cut there with
``bodyTruncated`` (a 50 MiB answer is neither read whole nor recorded whole)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from durable_agents.core.digest import canonical_json
from durable_agents.core.sealed_values import new_data_key, outcome_label, unseal_value
from durable_agents.shell.effects.base import Action, Applied, EffectContext
from durable_agents.shell.effects.http import BODY_MAX_BYTES, HttpPost
from durable_agents.shell.ledger.unsealing import sealed_outcome

pytestmark = pytest.mark.unit

BIG = 50 * 1024 * 1024
CTX = EffectContext(kube=None, namespace="ns", service_account="default")  # type: ignore[arg-type]


def _answers() -> dict[str, Callable[[], web.StreamResponse]]:
    return {
        "/json": lambda: web.json_response({"receipt": "tx-7731", "total": "42.00"}, status=201),
        "/text": lambda: web.Response(text="accepted as tx-7731", status=200),
        "/empty": lambda: web.Response(status=204),
        "/huge": lambda: web.Response(body=b'{"x":"' + b"y" * BIG + b'"}', status=200),
        "/bignum": lambda: web.Response(text='{"id": 1152921504606846976}', status=201),
    }


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    app = web.Application()
    for path, answer in _answers().items():

        async def handler(
            request: web.Request, answer: Callable[[], web.StreamResponse] = answer
        ) -> web.StreamResponse:
            await request.read()
            return answer()

        app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def _post(url: str) -> dict[str, object]:
    result = await HttpPost().dispatch(CTX, Action(key="run/0/pay", target={"url": url}, arguments={"n": 1}))
    assert isinstance(result, Applied), result
    return result.outcome


async def test_a_json_body_is_kept_whole_with_its_receipt_at_the_top(base_url: str) -> None:
    outcome = await _post(f"{base_url}/json")
    assert outcome == {
        "status": 201,
        "receipt": "tx-7731",
        "body": {"receipt": "tx-7731", "total": "42.00"},
    }


async def test_a_text_or_empty_body_is_kept_as_it_came(base_url: str) -> None:
    assert await _post(f"{base_url}/text") == {"status": 200, "body": "accepted as tx-7731"}
    assert await _post(f"{base_url}/empty") == {"status": 204}


async def test_a_50_mib_body_is_cut_to_the_bound_and_says_so_and_the_record_stays_small(
    base_url: str,
) -> None:
    outcome = await _post(f"{base_url}/huge")
    assert outcome["bodyTruncated"] is True
    body = outcome["body"]
    assert isinstance(body, str)
    assert body.startswith('{"x":"yyy')
    assert len(body.encode()) == BODY_MAX_BYTES
    # As the ActionRecord stores it (sealed): within the room docs/reference/limits.md gives it.
    key = new_data_key(entropy=os.urandom)
    sealed = sealed_outcome(outcome, key, "ar-x")
    assert sealed is not None
    assert len(canonical_json(sealed)) < 24 * 1024
    assert unseal_value(key, sealed, outcome_label("ar-x")) == outcome


async def test_a_body_canonical_json_cannot_hold_is_kept_as_text_so_it_still_seals(base_url: str) -> None:
    outcome = await _post(f"{base_url}/bignum")
    assert outcome == {"status": 201, "body": '{"id": 1152921504606846976}'}
    assert sealed_outcome(outcome, new_data_key(entropy=os.urandom), "ar-x") is not None
