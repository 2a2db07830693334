"""A recording HTTP proxy in front of an MCP server (for a server that does not count its own
calls, such as server-everything): every JSON-RPC request POSTed through it is recorded (method,
params, the ``Mcp-Session-Id`` it carried) and forwarded; answers, SSE streams included, are
streamed back as they come. ``url`` is the proxy's MCP endpoint. :meth:`check_before` runs a
test's check as a request of a method passes, before it is forwarded (for example: is this
task's ID in the ActionRecord already?), and keeps its answers."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class RecordingProxy:
    def __init__(self, upstream_url: str) -> None:
        self.upstream = urlsplit(upstream_url)
        self._requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._checks: dict[str, Callable[[dict[str, Any]], bool]] = {}
        self._checked: list[tuple[str, bool]] = []
        self.url = ""

    def check_before(self, method: str, check: Callable[[dict[str, Any]], bool]) -> None:
        """Run ``check`` on the params of every ``method`` request before it is forwarded."""
        self._checks[method] = check

    def checked(self, method: str) -> list[bool]:
        """What the check of ``method`` answered, request by request."""
        with self._lock:
            return [answer for name, answer in self._checked if name == method]

    def requests(self, method: str | None = None) -> list[dict[str, Any]]:
        """The JSON-RPC requests seen so far (of ``method``), in order: ``{method, params, session}``."""
        with self._lock:
            return [dict(r) for r in self._requests if method is None or r["method"] == method]

    def _record(self, body: bytes, session: str | None) -> None:
        try:
            message = json.loads(body)
        except ValueError:
            return
        for one in message if isinstance(message, list) else [message]:
            if isinstance(one, dict) and "method" in one and "id" in one:
                params = one.get("params") or {}
                check = self._checks.get(one["method"])
                answer = check(params) if check is not None else None
                with self._lock:
                    self._requests.append({"method": one["method"], "params": params, "session": session})
                    if answer is not None:
                        self._checked.append((one["method"], answer))

    def __enter__(self) -> Self:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                if self.command == "POST":
                    proxy._record(body, self.headers.get("mcp-session-id"))
                upstream = http.client.HTTPConnection(
                    proxy.upstream.hostname or "127.0.0.1", proxy.upstream.port, timeout=300
                )
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                upstream.request(self.command, proxy.upstream.path or "/", body=body or None, headers=headers)
                answer = upstream.getresponse()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in _HOP:
                        self.send_header(key, value)
                self.send_header("connection", "close")
                self.end_headers()
                try:
                    while chunk := answer.read1(65536):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except (OSError, http.client.HTTPException):
                    pass  # either side went away (a killed operator, a closed stream): it ends here
                finally:
                    upstream.close()

            do_GET = do_POST = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}{self.upstream.path}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
