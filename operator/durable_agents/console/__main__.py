"""``kubectl agentrun console`` (local) and ``python -m durable_agents.console --in-cluster``.

Local: binds 127.0.0.1 (a free port unless ``--port``), calls the API server with the caller's
kubeconfig, and prints the URL to open: it carries a one-time token, spent on first use for a
session cookie. In-cluster: binds ``--address`` (0.0.0.0 in the chart's Pod) and calls the API
server (the in-cluster address, or ``--api-server``) with each request's bearer token.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import sys
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from durable_agents.console.app import make_app
from durable_agents.console.authority import IN_CLUSTER_CA, Authority, BearerAuthority, LocalAuthority
from durable_agents.console.security import AccessLogger


def parser() -> argparse.ArgumentParser:
    out = argparse.ArgumentParser(prog="kubectl agentrun console", description=__doc__.split("\n\n")[0])
    out.add_argument("--port", type=int, default=0, help="the port (default: a free one)")
    out.add_argument("--address", default="127.0.0.1", help="the address to bind (default 127.0.0.1)")
    out.add_argument("-n", "--namespace", help="the namespace the list opens on")
    out.add_argument("--kubeconfig")
    out.add_argument("--context")
    out.add_argument("--in-cluster", action="store_true", help="take each request's bearer token")
    out.add_argument("--api-server", help="in-cluster: the API server's URL (default: the Pod's)")
    out.add_argument("--ca-file", help="in-cluster: the API server's CA (default: the Pod's)")
    out.add_argument(
        "--insecure-cookies",
        action="store_true",
        help="in-cluster: cookies without Secure (only behind a proxy that speaks plain HTTP to the browser)",
    )
    return out


def authority(args: argparse.Namespace) -> Authority:
    if not args.in_cluster:
        try:
            loopback = ipaddress.ip_address(args.address).is_loopback
        except ValueError:
            raise SystemExit(f"error: --address {args.address}: an IP address, e.g. 127.0.0.1") from None
        if not loopback:
            # It acts with your kubeconfig: nobody else's browser should even reach it.
            raise SystemExit(f"error: --address {args.address}: the local console listens on loopback only")
        return LocalAuthority(args.kubeconfig, args.context, args.namespace)
    host = args.api_server
    if not host:
        address = os.environ.get("KUBERNETES_SERVICE_HOST")
        if not address:
            raise SystemExit("error: --in-cluster needs --api-server outside a Pod")
        host = f"https://{address}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
    ca = args.ca_file or (str(IN_CLUSTER_CA) if IN_CLUSTER_CA.exists() else None)
    return BearerAuthority(host, ca, args.namespace, args.insecure_cookies)


async def serve(args: argparse.Namespace) -> None:
    chosen = authority(args)
    # The pages' API calls block (the Kubernetes client): run in threads, enough for a team's tabs.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=32))
    runner = web.AppRunner(make_app(chosen), access_log_class=AccessLogger, shutdown_timeout=2.0)
    await runner.setup()
    sock = socket.socket(socket.AF_INET6 if ":" in args.address else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.address, args.port))
    await web.SockSite(runner, sock).start()
    port = sock.getsockname()[1]
    if isinstance(chosen, LocalAuthority):
        # The token is printed once, on the caller's terminal only (never logged).
        print(
            f"Console (acting as you, with your kubeconfig): http://127.0.0.1:{port}/sign-in?token={chosen.sign_in_token}",
            flush=True,
        )
        print("The link works once; press Ctrl-C to stop.", flush=True)
    else:
        logging.getLogger(__name__).info(
            "console serving on %s:%d (in-cluster: each request's token)", args.address, port
        )
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
