"""Randomness handed in: what the core seals, wraps and discloses is drawn from the entropy source
its caller passes. With a seeded source the bytes are the same on every call; with os.urandom
(what the shell passes) they differ, and everything still opens."""

from __future__ import annotations

import ast
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.unit.builders import EPOCH, SETTINGS, T0, apply, at, commit_of, new_run, snap

from durable_agents.core.agent.exchange import ModelReply, Usage
from durable_agents.core.agent.planner import AgentInputs, ModelPlanner
from durable_agents.core.agent_facts import ANSWER_LABEL, new_turn
from durable_agents.core.disclosure import new_reader_key, open_as_reader, seal_for_reader
from durable_agents.core.engine import Commit, ModelAnswer, NeedModelTurn, Observations, decide
from durable_agents.core.entropy import Entropy, draw
from durable_agents.core.sealed_values import (
    DataKey,
    new_data_key,
    open_data_key,
    seal_spec,
    seal_value,
    unseal_value,
    wrap_data_key,
)
from durable_agents.core.sealing import Keyring, generate_key, seal, sealing_aad, unseal
from durable_agents.core.sealing_admission import sealing_changes

pytestmark = pytest.mark.unit

CORE = Path(__file__).resolve().parents[2] / "operator" / "durable_agents" / "core"
KEYRING = Keyring({"k1": bytes(range(32))}, "k1")
DATA_KEY = DataKey(bytes(range(32, 64)))
AAD = sealing_aad("run-uid-1", "actionArguments")
SPEC = {
    "steps": [{"name": "confirm", "ask": {"question": "Pay 42 EUR to ACME?"}}],
    "answers": {"confirm": "yes"},
}
RUN = {"metadata": {"namespace": "ns", "name": "run-1"}, "spec": SPEC}
BINDING = "payments/pay-42"
DOCUMENT = {"spec": {"steps/pay/arguments": {"amount": 42}}}


def seeded(seed: int = 7) -> Entropy:
    """A fresh deterministic source: the same seed gives the same bytes, call after call."""
    return random.Random(seed).randbytes


Sealing = Callable[[Entropy], object]

SEALINGS: dict[str, Sealing] = {
    "seal (a checkpoint field)": lambda e: seal(KEYRING, b"secret", AAD, entropy=e),
    "seal_value": lambda e: seal_value(DATA_KEY, {"iban": "DE89"}, "steps/pay/arguments", entropy=e),
    "wrap_data_key": lambda e: wrap_data_key(KEYRING, DATA_KEY, "ns", "run-1", entropy=e),
    "seal_spec": lambda e: seal_spec(SPEC, DATA_KEY, entropy=e),
    "new_turn": lambda e: new_turn(
        DATA_KEY,
        entropy=e,
        index=0,
        call_id="c0",
        tool="pay",
        arguments={"amount": 42},
        reason="why",
        step_index=0,
    ),
    "new_data_key": lambda e: new_data_key(entropy=e).key,
    "generate_key": lambda e: generate_key(entropy=e),
    "sealing_changes (admission)": lambda e: sealing_changes("CREATE", RUN, None, KEYRING, entropy=e),
}


@pytest.mark.parametrize("make", SEALINGS.values(), ids=SEALINGS.keys())
def test_a_seeded_source_seals_the_same_bytes_twice_and_os_urandom_does_not(make: Sealing) -> None:
    first, second = make(seeded()), make(seeded())
    assert first == second, "the same seed must give byte-identical output"
    assert make(os.urandom) != make(os.urandom), "os.urandom must give fresh bytes each call"
    assert make(seeded(1)) != first, "another seed, other bytes"


def test_what_a_seeded_source_sealed_opens_like_anything_else() -> None:
    sealed = seal(KEYRING, b"secret", AAD, entropy=seeded())
    assert unseal(KEYRING, sealed, AAD) == b"secret"
    token = seal_value(DATA_KEY, "yes", "answers/confirm", entropy=seeded())
    assert unseal_value(DATA_KEY, token, "answers/confirm") == "yes"
    annotation = wrap_data_key(KEYRING, DATA_KEY, "ns", "run-1", entropy=seeded())
    assert open_data_key(KEYRING, annotation, "ns", "run-1") == DATA_KEY


def test_disclosure_to_a_reader_is_byte_identical_under_a_seed_and_fresh_under_os_urandom() -> None:
    private, public = new_reader_key(entropy=seeded(3))
    assert new_reader_key(entropy=seeded(3))[1] == public, "the reader's key pair too"
    first = seal_for_reader(public, DOCUMENT, BINDING, entropy=seeded())
    second = seal_for_reader(public, DOCUMENT, BINDING, entropy=seeded())
    assert first == second
    assert open_as_reader(private, first, BINDING) == DOCUMENT
    fresh = seal_for_reader(public, DOCUMENT, BINDING, entropy=os.urandom)
    again = seal_for_reader(public, DOCUMENT, BINDING, entropy=os.urandom)
    assert fresh.split(".")[0] != again.split(".")[0], "a fresh ephemeral key each time"
    assert fresh != again
    assert open_as_reader(private, fresh, BINDING) == DOCUMENT


def _final_answer(entropy: Entropy) -> Commit:
    """A model run's last commit, its answer sealed by the engine with ``entropy``."""
    inputs = AgentInputs(
        model="reference-model", system_prompt="p", tools=(), data_key=DATA_KEY, entropy=entropy
    )
    plan = ModelPlanner(inputs)
    obj = new_run(objective="say done")
    obj = apply(obj, commit_of(decide(snap(obj), now=T0, epoch=EPOCH, planner=plan, settings=SETTINGS)))
    need = decide(snap(obj), now=at(1), epoch=EPOCH, planner=plan, settings=SETTINGS)
    assert isinstance(need, NeedModelTurn), need
    reply = ModelReply(model="reference-model", content="done", tool_calls=(), usage=Usage(10, 1))
    observed = Observations(model=ModelAnswer(need.request.digest(), reply=reply))
    return commit_of(
        decide(snap(obj), now=at(1), epoch=EPOCH, planner=plan, settings=SETTINGS, observed=observed)
    )


def test_the_engine_seals_with_the_source_the_shell_hands_it() -> None:
    first, second = _final_answer(seeded()), _final_answer(seeded())
    assert first.wire_status() == second.wire_status(), "a seeded source: the same commit, byte for byte"
    result = first.status.outcome.result if first.status.outcome else None
    assert unseal_value(DATA_KEY, result, ANSWER_LABEL) == "done"
    fresh, again = _final_answer(os.urandom), _final_answer(os.urandom)
    assert fresh.status.outcome is not None
    assert again.status.outcome is not None
    assert fresh.status.outcome.result != again.status.outcome.result


def test_a_source_that_answers_the_wrong_number_of_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="answered 11 bytes when asked for 12"):
        seal(KEYRING, b"secret", AAD, entropy=lambda n: bytes(n - 1))
    with pytest.raises(ValueError, match="answered str when asked for 32"):
        draw(lambda n: "x" * n, 32)  # type: ignore[arg-type,return-value]


def test_no_module_of_the_core_draws_random_bytes_of_its_own() -> None:
    """Every random byte of the core comes from a source passed in: no os.urandom, secrets,
    random, nor a cryptography key generator (which reads the OS's randomness itself)."""
    found = []
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(CORE)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                found += [f"{where}: import {a.name}" for a in node.names if a.name in ("secrets", "random")]
            elif isinstance(node, ast.ImportFrom) and node.module in ("os", "secrets", "random"):
                if node.module != "os" or any(a.name == "urandom" for a in node.names):
                    found.append(f"{where}: from {node.module} import ...")
            elif isinstance(node, ast.Attribute) and node.attr in ("urandom", "generate", "generate_key"):
                found.append(f"{where}: .{node.attr}")
    assert found == []
