"""Where effects, MCP calls and model calls may go: URL normalisation and allowlist matching.

A policy's ``spec.destinations`` lists URL prefixes (scheme, host, optional port, path prefix)
per effect kind, for MCP servers and for model endpoints. A URL is allowed iff EVERY applicable
allowlist allows it (a run's policy, and a cluster baseline that narrows it): :func:`refusal`
takes a list of allowlists so that a merge can add one. An allowlist that is ``None`` does not
restrict (a policy without ``destinations``, or without that category); an empty one allows
nothing.

Both a URL and an entry are normalised the same way before they are compared, so a URL that
differs only by case, a default port, IDN spelling or a trailing dot is the same destination,
and nothing that could land elsewhere slips through a string prefix:

- scheme and host lowercased; an internationalised host in punycode (the stdlib ``idna`` codec),
  refused when IDNA 2003 maps it (``straße`` to ``strasse``): IDNA 2008 would connect elsewhere;
  one trailing dot of the host dropped; the port made explicit (80, 443);
- userinfo (``user:pass@``) refused: it hides the host from a reader (``https://ok@evil``);
- the path with dot segments removed, and refused when it carries an encoded dot, slash or
  backslash (a server may decode them into a path the prefix did not allow);
- matched on path segment boundaries (``/v1`` allows ``/v1`` and ``/v1/x``, never ``/v1x``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
_ENCODED_SEPARATOR = re.compile(r"%(2e|2f|5c)", re.IGNORECASE)
_HOST_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
# Effect target keys that name where the effect lands (http.post: url, queryUrl).
URL_TARGET_KEYS = ("url", "queryUrl")
MCP_EFFECT = "mcp.call"  # its target URL is an MCP server's: the mcpServers list governs it


class DestinationError(ValueError):
    """A URL or an allowlist entry that cannot be normalised (the message says why)."""


@dataclass(frozen=True, order=True)
class Destination:
    """A normalised URL: what is compared."""

    scheme: str
    host: str
    port: int
    path: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.path}"

    def within(self, prefix: Destination) -> bool:
        """Whether this URL falls under ``prefix`` (same origin, path prefix on segment boundary)."""
        if (self.scheme, self.host, self.port) != (prefix.scheme, prefix.host, prefix.port):
            return False
        base = prefix.path.rstrip("/")
        return base == "" or self.path == base or self.path.startswith(base + "/")


def _host(raw: str) -> str:
    if raw.startswith("["):  # an IPv6 literal: urlsplit has lowercased it already
        return raw
    host = raw[:-1] if raw.endswith(".") else raw
    if not host or host.endswith("."):
        raise DestinationError("names no host")
    try:
        ascii_host = host.encode("idna").decode("ascii").lower()
    except UnicodeError as err:
        raise DestinationError(f"host {host!r} is not a valid (internationalised) name: {err}") from None
    if not host.isascii() and ascii_host.encode("ascii").decode("idna") != host.lower():
        # IDNA 2003 (the stdlib's) maps some names (ß to ss, final sigma, full-width forms) where
        # IDNA 2008 (what a client may use) does not: the name compared is not surely the name
        # connected to, so it is refused.
        raise DestinationError(f"host {host!r} is an ambiguous internationalised name: spell it in punycode")
    if not all(_HOST_LABEL.match(label) for label in ascii_host.split(".")):
        raise DestinationError(f"host {host!r} is not a DNS name or IP address")
    return ascii_host


def _path(raw: str) -> str:
    if "\\" in raw or _ENCODED_SEPARATOR.search(raw):
        raise DestinationError("its path carries a backslash or an encoded '.', '/' or '\\'")
    out: list[str] = []
    for segment in raw.split("/")[1:] if raw.startswith("/") else raw.split("/"):
        if segment == ".":
            continue
        if segment == "..":
            if out:
                out.pop()
            continue
        out.append(segment)
    return "/" + "/".join(out)


def normalise(url: str) -> Destination:
    """The destination ``url`` names; :class:`DestinationError` when it names none clearly."""
    if not isinstance(url, str) or not url or url != url.strip() or any(c.isspace() for c in url):
        raise DestinationError("is not a URL (empty, or with white space)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise DestinationError(f"is not a URL: {err}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise DestinationError("is not an http(s) URL")
    if "@" in parts.netloc:
        raise DestinationError("carries userinfo (user@host): name the host alone")
    hostname = parts.hostname
    if not hostname:
        raise DestinationError("names no host")
    bracketed = f"[{hostname}]" if ":" in hostname else hostname
    return Destination(scheme, _host(bracketed), port or DEFAULT_PORTS[scheme], _path(parts.path))


def parse_entry(entry: str) -> Destination:
    """An allowlist entry: a URL prefix with no query or fragment."""
    destination = normalise(entry)
    if "?" in entry or "#" in entry:
        raise DestinationError("is a prefix: it may not carry a query or a fragment")
    return destination


@dataclass(frozen=True)
class Allowlist:
    """One list a URL must match, and where it comes from (said in a refusal)."""

    source: str  # e.g. "AgentPolicy strict spec.destinations.mcpServers"
    entries: tuple[str, ...]


def refusal(url: object, allowlists: Sequence[Allowlist], field: str) -> str | None:
    """Why ``url`` (the value of ``field``) may not be sent to, or None when every list allows it.

    No list: allowed (nothing restricts). A URL or entry that does not parse refuses (never a send
    to something that cannot be compared)."""
    if not allowlists:
        return None
    try:
        destination = normalise(url)  # type: ignore[arg-type]
    except DestinationError as err:
        return f"{field} {str(url)[:200]!r} {err}"
    for allowlist in allowlists:
        allowed = False
        for index, entry in enumerate(allowlist.entries):
            try:
                allowed = destination.within(parse_entry(entry))
            except DestinationError as err:
                return f"{allowlist.source}[{index}] {entry[:200]!r} {err}: {field} cannot be checked"
            if allowed:
                break
        if not allowed:
            return (
                f"{field} {str(url)[:200]!r} ({destination}) is not in {allowlist.source} "
                f"({len(allowlist.entries)} entries): the destination is not allowed"
            )
    return None


def entry_problems(destinations: Mapping[str, Any] | None, prefix: str) -> list[str]:
    """Each entry of a ``spec.destinations`` (wire form) that does not parse, with its field."""
    if not destinations:
        return []
    problems: list[str] = []
    lists: list[tuple[str, Any]] = [
        (f"{prefix}.{key}", destinations.get(key))
        for key in ("mcpServers", "modelEndpoints", "notifications")
    ]
    lists += [(f"{prefix}.effects[{kind!r}]", v) for kind, v in (destinations.get("effects") or {}).items()]
    for field, entries in lists:
        for index, entry in enumerate(entries or []):
            try:
                parse_entry(entry)
            except DestinationError as err:
                problems.append(f"{field}[{index}] {str(entry)[:200]!r} {err}")
    return problems


# --- what a run names -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Named:
    """One destination a run's spec names: its field, its category and the URL."""

    field: str
    category: str  # "effects", "mcpServers", "modelEndpoints" (or "notifications": a policy's own)
    kind: str  # the effect kind (effects), else the category
    url: object


def _effect_urls(field: str, effect: Mapping[str, Any]) -> Iterator[Named]:
    kind, target = str(effect.get("effect") or ""), effect.get("target") or {}
    if not isinstance(target, Mapping):
        return
    for key in URL_TARGET_KEYS:
        if key in target:
            category = "mcpServers" if kind == MCP_EFFECT else "effects"
            yield Named(f"{field}.target.{key}", category, kind, target[key])


def _steps(field: str, steps: Sequence[Any]) -> Iterator[Named]:
    for i, step in enumerate(steps or []):
        if not isinstance(step, Mapping):
            continue
        if isinstance(step.get("effect"), Mapping):
            yield from _effect_urls(f"{field}[{i}].effect", step["effect"])
        child = step.get("child")
        if isinstance(child, Mapping):
            yield from _steps(f"{field}[{i}].child.steps", child.get("steps") or [])


def named_destinations(spec: Mapping[str, Any]) -> list[Named]:
    """Every destination a run's spec (wire form) names, with its field."""
    out = list(_steps("spec.steps", spec.get("steps") or []))
    agent = spec.get("agent") or {}
    if not isinstance(agent, Mapping):
        return out
    for i, tool in enumerate(agent.get("tools") or []):
        if isinstance(tool, Mapping) and isinstance(tool.get("effect"), Mapping):
            out += _effect_urls(f"spec.agent.tools[{i}].effect", tool["effect"])
    for i, server in enumerate(agent.get("mcpServers") or []):
        if isinstance(server, Mapping):
            out.append(
                Named(f"spec.agent.mcpServers[{i}].url", "mcpServers", "mcpServers", server.get("url"))
            )
    endpoint = agent.get("endpoint")
    if isinstance(endpoint, Mapping) and "baseUrl" in endpoint:
        out.append(
            Named("spec.agent.endpoint.baseUrl", "modelEndpoints", "modelEndpoints", endpoint["baseUrl"])
        )
    return out


@dataclass(frozen=True)
class PolicyDestinations:
    """One policy's ``spec.destinations`` (wire form) and its name, for :func:`allowlists_for`."""

    source: str  # e.g. "AgentPolicy team-a/strict"
    destinations: Mapping[str, Any] | None


def allowlists_for(policies: Sequence[PolicyDestinations], category: str, kind: str) -> list[Allowlist]:
    """The lists that govern one destination: one per policy that restricts its category."""
    out: list[Allowlist] = []
    for policy in policies:
        destinations = policy.destinations
        if destinations is None or destinations.get(category) is None:
            continue  # this policy does not restrict this category
        if category == "effects":
            entries = (destinations.get("effects") or {}).get(kind) or []
            source = f"{policy.source} spec.destinations.effects[{kind!r}]"
        else:
            entries = destinations.get(category) or []
            source = f"{policy.source} spec.destinations.{category}"
        out.append(Allowlist(source, tuple(str(entry) for entry in entries)))
    return out


def destination_refusal(
    policies: Sequence[PolicyDestinations], field: str, category: str, kind: str, url: object
) -> str | None:
    """Why one destination may not be sent to under these policies, or None."""
    return refusal(url, allowlists_for(policies, category, kind), field)


def run_refusal(spec: Mapping[str, Any], policies: Sequence[PolicyDestinations]) -> str | None:
    """The first destination of a run's spec (wire form) that its policies do not allow, or None."""
    for named in named_destinations(spec):
        problem = destination_refusal(policies, named.field, named.category, named.kind, named.url)
        if problem is not None:
            return problem
    return None


def of_policy(source: str, policy: Any) -> PolicyDestinations:
    """A policy's destinations (an ``AgentPolicySpec`` or None) in the form the checks take."""
    destinations = getattr(policy, "destinations", None)
    if destinations is None:
        return PolicyDestinations(source, None)
    return PolicyDestinations(source, destinations.model_dump(by_alias=True, exclude_none=True))


def effect_refusal(
    source: str, policy: Any, effect: str, target: Mapping[str, Any] | None, field: str
) -> str | None:
    """Why an effect's target (``target.url``, ``target.queryUrl``; ``field`` names where the
    target is written) is outside the policy's list for its kind now, or None. ``policy``: an
    ``AgentPolicySpec`` or None (nothing restricts)."""
    governing = [of_policy(source, policy)]
    category = "mcpServers" if effect == MCP_EFFECT else "effects"
    for key in URL_TARGET_KEYS:
        if target and key in target:
            problem = destination_refusal(governing, f"{field}.{key}", category, effect, target[key])
            if problem is not None:
                return problem
    return None
