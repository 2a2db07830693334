"""Whose credentials a request carries: the console has none of its own.

Local (``kubectl agentrun console``): the caller's kubeconfig, for the one person who holds the
one-time sign-in token printed on their terminal; the token buys one session cookie (HttpOnly,
SameSite=Strict) and is then spent. In-cluster: the bearer token of each request (an auth proxy's
``Authorization`` or ``X-Forwarded-Access-Token`` header, or a token the user pasted, kept in
this process's memory for the session only), made into an API client for that request.
"""

from __future__ import annotations

import hmac
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from aiohttp import web
from kubernetes import client, config

SESSION_COOKIE: Final = "da_console_session"
CSRF_COOKIE: Final = "da_console_csrf"
IN_CLUSTER_CA: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")


class NotSignedIn(Exception):
    """The request carries no credentials the console can use (the sign-in page says why)."""


@dataclass
class Session:
    id: str
    token: str | None = None  # in-cluster: a pasted bearer token (memory only, never logged)


@dataclass
class Sessions:
    """The sessions of this process (memory only: a restart signs everyone out)."""

    _by_id: dict[str, Session] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def new(self, token: str | None = None) -> Session:
        session = Session(secrets.token_urlsafe(32), token)
        with self._lock:
            self._by_id[session.id] = session
        return session

    def of(self, request: web.Request) -> Session | None:
        sid = request.cookies.get(SESSION_COOKIE)
        if not sid:
            return None
        with self._lock:
            return self._by_id.get(sid)

    def end(self, request: web.Request) -> None:
        with self._lock:
            self._by_id.pop(request.cookies.get(SESSION_COOKIE, ""), None)


def set_session_cookie(response: web.StreamResponse, session: Session, *, secure: bool) -> None:
    response.set_cookie(SESSION_COOKIE, session.id, httponly=True, samesite="Strict", path="/", secure=secure)


class Authority:
    """How a request's API client is made; see :class:`LocalAuthority`, :class:`BearerAuthority`."""

    mode: str = ""
    secure_cookies: bool = False

    def __init__(self, default_namespace: str) -> None:
        self.default_namespace = default_namespace
        self.sessions = Sessions()

    def api_client(self, request: web.Request) -> client.ApiClient:
        raise NotImplementedError

    def release(self, api: client.ApiClient) -> None:
        """Done with a request's client (a bearer client is closed; the local one is kept)."""


class LocalAuthority(Authority):
    """The caller's kubeconfig, for whoever holds the one-time token."""

    mode = "local"

    def __init__(self, kubeconfig: str | None, context: str | None, namespace: str | None) -> None:
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        if context:
            contexts, _ = config.list_kube_config_contexts(config_file=kubeconfig)
            active = next((c for c in contexts if c.get("name") == context), active)
        super().__init__(namespace or (active or {}).get("context", {}).get("namespace") or "default")
        self._client = config.new_client_from_config(config_file=kubeconfig, context=context)
        self.sign_in_token = secrets.token_urlsafe(32)
        self._spent = False
        self._lock = threading.Lock()

    def spend(self, offered: str) -> Session | None:
        """A session for the one-time token, once; None for a wrong or spent token."""
        with self._lock:
            if self._spent or not hmac.compare_digest(offered.encode(), self.sign_in_token.encode()):
                return None
            self._spent = True
        return self.sessions.new()

    def api_client(self, request: web.Request) -> client.ApiClient:
        if self.sessions.of(request) is None:
            raise NotSignedIn("no session: open the URL that kubectl agentrun console printed")
        return self._client


class BearerAuthority(Authority):
    """In-cluster: each request's own bearer token makes its API client."""

    mode = "in-cluster"
    secure_cookies = True

    def __init__(self, host: str, ca_file: str | None, namespace: str | None, insecure_cookies: bool) -> None:
        super().__init__(namespace or "default")
        self.host = host
        self.ca_file = ca_file
        self.secure_cookies = not insecure_cookies

    def token_of(self, request: web.Request) -> str | None:
        said = request.headers.get("Authorization", "")
        if said[:7].lower() == "bearer " and said[7:].strip():
            return said[7:].strip()
        forwarded = request.headers.get("X-Forwarded-Access-Token", "").strip()
        if forwarded:
            return forwarded
        session = self.sessions.of(request)
        return session.token if session is not None else None

    def client_for_token(self, token: str) -> client.ApiClient:
        configuration = client.Configuration()
        configuration.host = self.host
        configuration.ssl_ca_cert = self.ca_file
        configuration.api_key = {"authorization": token}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(configuration)

    def api_client(self, request: web.Request) -> client.ApiClient:
        token = self.token_of(request)
        if not token:
            raise NotSignedIn("no token: sign in through your cluster's sign-in, or paste a token")
        return self.client_for_token(token)

    def release(self, api: client.ApiClient) -> None:
        api.close()
