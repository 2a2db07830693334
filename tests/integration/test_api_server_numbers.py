"""A number past int64 as the API server sends it back: it decodes it as a float64 and writes that
float without an exponent below 1e21 (``18446744073709552000``), a literal ``json`` reads as an int
and orjson alone as a float. The operator's fast JSON path (``shell/ground/fast_json.py``) reads
watch events, reads and admission reviews; it must read these exactly as ``json`` does."""

from __future__ import annotations

import json
import re

import yaml
from tests.integration.test_crds_api import REPO
from tests.unit.test_fast_json import typed

from durable_agents.api.v1alpha1 import GROUP, VERSION
from durable_agents.shell.ground import fast_json
from durable_agents_testkit.cluster import KubeEnv

BIG = {"u64": 18446744073709551615, "past": 10**29 + 7, "negative": -(2**63) - 1, "fits": 2**63 - 1}


def test_a_number_past_int64_is_read_as_json_reads_it(kube: KubeEnv, namespace: str) -> None:
    body = yaml.safe_load((REPO / "config/samples/agentrun-read-ask-complete.yaml").read_text())
    name = body["metadata"]["name"]
    custom = kube.custom()
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentruns", body)
    created["status"] = {"state": "ready", "stateVersion": 1, "checkpoint": {"schemaVersion": 99, **BIG}}
    custom.replace_namespaced_custom_object_status(GROUP, VERSION, namespace, "agentruns", name, created)
    raw = custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, "agentruns", name, _preload_content=False
    ).data
    literals = dict(re.findall(r'"(u64|past|negative|fits)":([-0-9.e+E]+)', raw.decode()))
    assert literals["fits"] == str(2**63 - 1), "an int64 stays an integer"
    assert literals["u64"] == "18446744073709552000", "a float64, written as digits"
    assert literals["negative"] == "-9223372036854776000"
    assert typed(fast_json.loads(raw)) == typed(json.loads(raw))
    assert type(fast_json.loads(raw)["status"]["checkpoint"]["u64"]) is int
