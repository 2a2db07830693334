"""The operator's configuration: read once, typed, and refused with the variable's name."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from durable_agents_controllers.config import VARIABLES, ConfigError, OperatorConfig, Reader

pytestmark = pytest.mark.unit

DOCS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "operate" / "configuration.md"


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, str]:
    """The two variables every operator needs: its sealing and stamping keys."""
    (tmp_path / "k1").write_bytes(bytes(range(32)))
    return {"DURABLE_AGENTS_SEALING_KEYS_DIR": str(tmp_path), "DURABLE_AGENTS_SEALING_ACTIVE_KEY": "k1"}


def test_defaults_with_only_the_keys(keys: dict[str, str]) -> None:
    config = OperatorConfig.from_env(keys)
    assert config.namespace is None
    assert (config.lease_duration, config.workers, config.dispatch_timeout) == (15, 8, 5.0)
    assert config.dispatcher
    assert not config.all_events
    assert config.metrics_port is None
    assert config.webhook_port is None
    assert config.keyring.active_key_id == "k1"
    assert config.faults.triggers == []
    assert config.faults.delay == 0.0
    assert config.identity  # a fresh one per process


def test_values_are_typed(keys: dict[str, str]) -> None:
    config = OperatorConfig.from_env(
        {
            **keys,
            "DURABLE_AGENTS_NAMESPACE": "team-a",
            "DURABLE_AGENTS_LEASE_DURATION": "3",
            "DURABLE_AGENTS_DISPATCHER": "off",
            "DURABLE_AGENTS_EVENTS": "all",
            "DURABLE_AGENTS_WEBHOOK_PORT": "9443",
            "DURABLE_AGENTS_TEST_KILL_AT": "after:4",
            "DURABLE_AGENTS_TEST_COMMIT_DELAY": "0.3",
        }
    )
    assert config.namespace == "team-a"
    assert config.lease_duration == 3
    assert not config.dispatcher
    assert config.all_events
    assert config.webhook_port == 9443
    (trigger,) = config.faults.triggers
    assert (trigger.phase, trigger.nth, trigger.sig) == ("after", 4, signal.SIGKILL)
    assert config.faults.delay == 0.3


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("LEASE_DURATION", "abc", "a whole number >= 1"),
        ("LEASE_DURATION", "0", "a whole number >= 1"),
        ("WORKERS", "-2", "a whole number >= 0"),
        ("DISPATCH_TIMEOUT", "soon", "a number >= 0.1"),
        ("METRICS_PORT", "70000", "a port number"),
        ("WEBHOOK_PORT", "https", "a port number"),
        ("DISPATCHER", "maybe", "'on' or 'off'"),
        ("EVENTS", "some", "'notable' or 'all'"),
        ("LOG_LEVEL", "chatty", "'DEBUG' or 'INFO' or 'WARNING' or 'ERROR'"),
        ("TEST_KILL_AT", "during:3", "before:N or after:N"),
        ("TEST_STOP_BEFORE_SEND", "yes", "'0' or '1'"),
    ],
)
def test_a_malformed_value_is_refused_naming_the_variable(
    keys: dict[str, str], variable: str, value: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as err:
        OperatorConfig.from_env({**keys, f"DURABLE_AGENTS_{variable}": value})
    assert str(err.value).startswith(f"DURABLE_AGENTS_{variable}={value!r}: expected")
    assert expected in str(err.value)


def test_an_unknown_variable_is_refused_so_a_typo_is_never_silently_ignored(keys: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="DURABLE_AGENTS_LEASE_DURATON: unknown variable"):
        OperatorConfig.from_env({**keys, "DURABLE_AGENTS_LEASE_DURATON": "3"})


def test_the_test_kits_variables_are_known_and_ignored(keys: dict[str, str]) -> None:
    test_kit = {v.name: "x" for v in VARIABLES if v.reader is Reader.TEST_KIT}
    assert "DURABLE_AGENTS_CHAOS_SIZE" in test_kit
    assert OperatorConfig.from_env({**keys, **test_kit}).lease_duration == 15


def test_the_operator_does_not_start_without_its_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SEALING_KEYS_DIR and DURABLE_AGENTS_SEALING_ACTIVE_KEY required"):
        OperatorConfig.from_env({})
    with pytest.raises(ConfigError, match=r"^DURABLE_AGENTS_SEALING_ACTIVE_KEY required"):
        OperatorConfig.from_env({"DURABLE_AGENTS_SEALING_KEYS_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"^DURABLE_AGENTS_SEALING_KEYS_DIR required"):
        OperatorConfig.from_env({"DURABLE_AGENTS_SEALING_ACTIVE_KEY": "k1"})
    with pytest.raises(ConfigError, match=r"DURABLE_AGENTS_SEALING_KEYS_DIR=.*not a directory"):
        OperatorConfig.from_env(
            {
                "DURABLE_AGENTS_SEALING_KEYS_DIR": str(tmp_path / "absent"),
                "DURABLE_AGENTS_SEALING_ACTIVE_KEY": "k1",
            }
        )
    with pytest.raises(ConfigError, match="active key ID 'k2' is not in the keyring"):
        OperatorConfig.from_env(
            {"DURABLE_AGENTS_SEALING_KEYS_DIR": str(tmp_path), "DURABLE_AGENTS_SEALING_ACTIVE_KEY": "k2"}
        )


def test_the_readme_table_documents_every_variable_as_the_code_reads_it() -> None:
    rows = re.findall(
        r"^\| `(DURABLE_AGENTS_[A-Z_]+)` \| (.*?) \| (.*?) \| (.*?) \|$", DOCS_PAGE.read_text(), re.M
    )
    documented = {name: (default, meaning, reader) for name, default, meaning, reader in rows}
    expected = {v.name: (v.default, v.meaning, v.reader.value) for v in VARIABLES}
    assert documented == expected, (
        "docs/operate/configuration.md's configuration table differs from config.VARIABLES"
    )
