"""Where effects may go (core/destinations.py): normalisation and allowlist matching."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from durable_agents.core.destinations import (
    Allowlist,
    DestinationError,
    PolicyDestinations,
    entry_problems,
    normalise,
    parse_entry,
    refusal,
    run_refusal,
)

ALLOWED = [
    Allowlist("AgentPolicy ns/p spec.destinations.effects['http.post']", ("https://api.example.com/v1",))
]
FIELD = "spec.steps[0].effect.target.url"

labels = st.from_regex(r"[a-z][a-z0-9]{0,10}", fullmatch=True)
hosts = st.lists(labels, min_size=1, max_size=4).map(".".join)
segments = st.lists(st.from_regex(r"[a-zA-Z0-9_~-]{1,8}", fullmatch=True), max_size=4)


def _case_mix(text: str, flips: list[bool]) -> str:
    return "".join(c.upper() if flips[i % len(flips)] else c for i, c in enumerate(text)) if flips else text


@given(hosts, segments, st.lists(st.booleans(), min_size=1, max_size=8), st.booleans(), st.booleans())
def test_spellings_of_one_url_are_one_destination(
    host: str, path: list[str], flips: list[bool], port: bool, dot: bool
) -> None:
    """Case of scheme and host, an explicit default port and a trailing dot change nothing."""
    plain = f"https://{host}/" + "/".join(path)
    spelled = (
        f"{_case_mix('https', flips)}://{_case_mix(host, flips)}{'.' if dot else ''}{':443' if port else ''}/"
    )
    assert normalise(spelled + "/".join(path)) == normalise(plain)


@given(hosts, segments, segments)
def test_a_path_prefix_matches_on_segment_boundaries_only(
    host: str, base: list[str], rest: list[str]
) -> None:
    prefix = parse_entry(f"https://{host}/" + "/".join(base))
    assert normalise(f"https://{host}/" + "/".join(base + rest)).within(prefix)
    if base:
        longer = f"https://{host}/" + "/".join([*base[:-1], base[-1] + "x"])
        assert not normalise(longer).within(prefix)


@given(hosts, hosts)
def test_another_host_or_port_or_scheme_is_outside(host: str, other: str) -> None:
    prefix = parse_entry(f"https://{host}/")
    assert not normalise(f"http://{host}/").within(prefix)
    assert not normalise(f"https://{host}:8443/").within(prefix)
    if other != host:
        assert not normalise(f"https://{other}/").within(prefix)
    # a host that merely starts with the allowed one is another host
    assert not normalise(f"https://{host}.{other}/").within(prefix)


@given(st.lists(st.sampled_from("abcdeüöäéñç"), min_size=1, max_size=12).map("".join), st.booleans())
def test_an_internationalised_host_is_its_punycode_in_any_case(label: str, upper: bool) -> None:
    host = f"{label}.example"
    spelled = host.upper() if upper else host
    assert normalise(f"https://{spelled}/x") == normalise(f"https://{host.encode('idna').decode()}/x")


@pytest.mark.parametrize(
    "host", ["stra\u00dfe.example", "\uff21\uff30\uff29.example", "\u03c3\u03bf\u03c6\u03bf\u03c2.example"]
)
def test_an_internationalised_host_idna_2003_would_map_is_refused(host: str) -> None:
    problem = refusal(f"https://{host}/v1", ALLOWED, FIELD)
    assert problem is not None
    assert "ambiguous internationalised name" in problem, problem


def test_idn_is_compared_in_punycode() -> None:
    assert normalise("https://BÜCHER.example/").host == "xn--bcher-kva.example"
    assert normalise("https://bücher.example/x") == normalise("https://xn--bcher-kva.example/x")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://api.example.com@evil.example/v1", "userinfo"),
        ("https://user:pw@api.example.com/v1", "userinfo"),
        ("ftp://api.example.com/v1", "http(s)"),
        ("https:///v1", "no host"),
        ("https://api.example.com:99999/v1", "not a URL"),
        ("https://api.example.com/v1/%2e%2e/admin", "encoded"),
        ("https://api.example.com/v1%2Fadmin", "encoded"),
        ("https://api.example.com/v1\\..\\admin", "backslash"),
        (" https://api.example.com/v1", "white space"),
        ("https://api..example.com/v1", "not a valid"),
        ("https://api_x.example.com/v1", "not a DNS name"),
    ],
)
def test_a_url_that_names_no_clear_destination_is_refused_with_the_field(url: str, why: str) -> None:
    problem = refusal(url, ALLOWED, FIELD)
    assert problem is not None
    assert problem.startswith(FIELD)
    assert why in problem


def test_dot_segments_cannot_climb_out_of_the_prefix() -> None:
    assert refusal("https://api.example.com/v1/../admin", ALLOWED, FIELD) is not None
    assert refusal("https://api.example.com/v1/./x/../y", ALLOWED, FIELD) is None
    assert refusal("https://API.example.com.:443/v1/y?q=1", ALLOWED, FIELD) is None


def test_every_list_must_allow_and_no_list_allows_all() -> None:
    baseline = Allowlist(
        "ClusterAgentPolicy base spec.destinations.effects['http.post']",
        ("https://api.example.com/v1/public",),
    )
    assert refusal("https://api.example.com/v1/x", ALLOWED, FIELD) is None
    problem = refusal("https://api.example.com/v1/x", [*ALLOWED, baseline], FIELD)
    assert problem is not None
    assert "ClusterAgentPolicy base" in problem
    assert refusal("https://api.example.com/v1/public/y", [*ALLOWED, baseline], FIELD) is None
    assert refusal("https://anywhere.example/", [], FIELD) is None
    assert refusal("https://anywhere.example/", [Allowlist("p", ())], FIELD) is not None


def test_an_entry_that_does_not_parse_is_named() -> None:
    problems = entry_problems(
        {
            "mcpServers": ["https://ok.example/mcp", "https://u@x.example/"],
            "effects": {"http.post": ["https://a.example/?q"]},
        },
        "spec.destinations",
    )
    assert problems[0].startswith("spec.destinations.mcpServers[1]")
    assert "userinfo" in problems[0]
    assert problems[1].startswith("spec.destinations.effects['http.post'][0]")
    assert "query" in problems[1]
    with pytest.raises(DestinationError):
        parse_entry("https://a.example/#frag")


def test_a_run_spec_is_checked_field_by_field() -> None:
    policy = PolicyDestinations(
        "AgentPolicy ns/p",
        {"effects": {"http.post": ["http://127.0.0.1:8080/"]}, "mcpServers": ["http://127.0.0.1:9000/mcp"]},
    )
    step = {"name": "s", "effect": {"effect": "http.post", "target": {"url": "http://127.0.0.1:8080/a"}}}
    assert run_refusal({"steps": [step]}, [policy]) is None
    bad_query = {
        **step,
        "effect": {
            **step["effect"],
            "target": {"url": "http://127.0.0.1:8080/a", "queryUrl": "http://evil/"},
        },
    }
    problem = run_refusal({"steps": [step, bad_query]}, [policy])
    assert problem is not None
    assert problem.startswith("spec.steps[1].effect.target.queryUrl")
    child = {
        "name": "c",
        "child": {
            "taskType": "t",
            "objective": "o",
            "steps": [
                {**step, "effect": {"effect": "webhook.x", "target": {"url": "http://127.0.0.1:8080/"}}}
            ],
        },
    }
    problem = run_refusal({"steps": [child]}, [policy])
    assert problem is not None
    assert "spec.steps[0].child.steps[0].effect.target.url" in problem
    assert "webhook.x" in problem
    agent = {
        "mcpServers": [{"name": "m", "url": "http://127.0.0.1:9000/other"}],
        "endpoint": {"baseUrl": "http://llm/v1"},
    }
    problem = run_refusal({"agent": agent}, [policy])
    assert problem is not None
    assert problem.startswith("spec.agent.mcpServers[0].url")
    agent["mcpServers"] = [{"name": "m", "url": "http://127.0.0.1:9000/mcp"}]
    assert run_refusal({"agent": agent}, [policy]) is None  # modelEndpoints not restricted
    problem = run_refusal({"agent": agent}, [PolicyDestinations("AgentPolicy ns/p", {"modelEndpoints": []})])
    assert problem is not None
    assert problem.startswith("spec.agent.endpoint.baseUrl")
    assert run_refusal({"agent": agent, "steps": [bad_query]}, [PolicyDestinations("p", None)]) is None
