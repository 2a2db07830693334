"""Disclosure to one reader: only the reader's private key, for the same binding, opens a document."""

from __future__ import annotations

import base64
import os

import pytest

from durable_agents.core.disclosure import (
    DisclosureError,
    new_reader_key,
    open_as_reader,
    seal_for_reader,
)

pytestmark = pytest.mark.unit

BINDING = "payments/pay-invoice-42"
DOCUMENT = {"spec": {"steps/pay/arguments": {"iban": "DE89 3704 0044 0532 0130 00", "amount": 120}}}


def test_the_reader_opens_what_was_sealed_for_it() -> None:
    private, public = new_reader_key(entropy=os.urandom)
    sealed = seal_for_reader(public, DOCUMENT, BINDING, entropy=os.urandom)
    assert "DE89" not in sealed
    assert "DE89" not in base64.b64decode(sealed.split(".")[1]).decode("latin-1")
    assert open_as_reader(private, sealed, BINDING) == DOCUMENT


def test_every_disclosure_uses_a_fresh_ephemeral_key() -> None:
    _, public = new_reader_key(entropy=os.urandom)
    first, second = (
        seal_for_reader(public, DOCUMENT, BINDING, entropy=os.urandom),
        seal_for_reader(public, DOCUMENT, BINDING, entropy=os.urandom),
    )
    assert first.split(".")[0] != second.split(".")[0]
    assert first != second


def test_another_readers_key_does_not_open_it() -> None:
    _, public = new_reader_key(entropy=os.urandom)
    other, _ = new_reader_key(entropy=os.urandom)
    sealed = seal_for_reader(public, DOCUMENT, BINDING, entropy=os.urandom)
    with pytest.raises(DisclosureError, match="does not open"):
        open_as_reader(other, sealed, BINDING)


def test_a_disclosure_for_another_run_does_not_open_as_this_one() -> None:
    private, public = new_reader_key(entropy=os.urandom)
    sealed = seal_for_reader(public, DOCUMENT, BINDING, entropy=os.urandom)
    with pytest.raises(DisclosureError, match="does not open"):
        open_as_reader(private, sealed, "payments/another-run")


def _flip(text: str, index: int) -> str:
    raw = bytearray(base64.b64decode(text))
    raw[index] ^= 0x01
    return base64.b64encode(bytes(raw)).decode()


@pytest.mark.parametrize("where", ["nonce", "ciphertext", "tag", "ephemeral"])
def test_tampering_is_detected(where: str) -> None:
    private, public = new_reader_key(entropy=os.urandom)
    ephemeral, body = seal_for_reader(public, DOCUMENT, BINDING, entropy=os.urandom).split(".")
    if where == "ephemeral":
        ephemeral = _flip(ephemeral, 0)
    else:
        body = _flip(body, {"nonce": 0, "ciphertext": 12, "tag": -1}[where])
    with pytest.raises(DisclosureError):
        open_as_reader(private, f"{ephemeral}.{body}", BINDING)


@pytest.mark.parametrize(
    "value",
    ["", "no-dot", "!!.AAAA", f"{base64.b64encode(b'short').decode()}.AAAA", "AAAA.%%%"],
)
def test_malformed_values_are_refused_clearly(value: str) -> None:
    private, _ = new_reader_key(entropy=os.urandom)
    with pytest.raises(DisclosureError):
        open_as_reader(private, value, BINDING)


@pytest.mark.parametrize("public", ["not base64!", base64.b64encode(b"x" * 31).decode(), ""])
def test_a_malformed_reader_key_is_refused_clearly(public: str) -> None:
    with pytest.raises(DisclosureError, match="public key"):
        seal_for_reader(public, DOCUMENT, BINDING, entropy=os.urandom)


def test_an_empty_binding_is_refused() -> None:
    _, public = new_reader_key(entropy=os.urandom)
    with pytest.raises(DisclosureError, match="binding"):
        seal_for_reader(public, DOCUMENT, "", entropy=os.urandom)
