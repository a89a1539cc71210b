"""An extra network hop for the demo's ``network-hop`` scenario: a streaming HTTP proxy.

It stands for what an added hop costs in production (a sidecar, an API gateway in another
zone, a cross-region load balancer): every request waits ``delay_seconds`` before it is
forwarded to the upstream, and the response streams back chunk by chunk. It is deliberately
not traced, as such hops often are not; headers (``traceparent`` included) pass through, so
the model server's span stays the child of the caller's client span and the hop shows up as
the difference between the two (``network_ns``, docs/telemetry-contract.md).

``python -m inferpath.demo.proxy --port N --upstream URL --delay-seconds 0.1``
"""

from __future__ import annotations

import argparse
import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

# Hop-by-hop headers (RFC 9110 §7.6.1) and those httpx recomputes are not forwarded.
_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)

# Below uvicorn's 5 s keep-alive timeout on the other side: an idle pooled connection is
# dropped here before the server closes it, so a request never goes out on a connection the
# server is closing at that moment (an httpx.ReadError on the response headers).
_KEEPALIVE_EXPIRY_SECONDS = 2.0


def create_proxy_app(upstream_url: str, delay_seconds: float) -> Starlette:
    """A proxy forwarding every path and method to ``upstream_url`` after ``delay_seconds``.

    ``GET /health`` is answered by the proxy itself. Raises ``ValueError`` naming the field for
    a negative or non-finite delay or an upstream that is not an http(s) URL.
    """
    if not math.isfinite(delay_seconds) or delay_seconds < 0:
        raise ValueError(f"delay_seconds: must be a finite number >= 0, got {delay_seconds!r}")
    if not upstream_url.startswith(("http://", "https://")):
        raise ValueError(f"upstream_url: must be an http(s) URL, got {upstream_url!r}")
    upstream = upstream_url.rstrip("/")
    state: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        state["client"] = httpx.AsyncClient(
            timeout=httpx.Timeout(600.0, connect=5.0),
            limits=httpx.Limits(max_connections=512, keepalive_expiry=_KEEPALIVE_EXPIRY_SECONDS),
        )
        yield
        await state["client"].aclose()

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def forward(request: Request) -> Response:
        if delay_seconds:
            await asyncio.sleep(delay_seconds)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS]
        url = f"{upstream}{request.url.path}" + (f"?{request.url.query}" if request.url.query else "")
        outgoing = state["client"].build_request(request.method, url, headers=headers, content=await request.body())
        try:
            reply = await state["client"].send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            return Response(f"upstream unreachable: {type(exc).__name__}", status_code=502)
        # Raw bytes are forwarded, so Content-Encoding stays as the upstream set it.
        reply_headers = {k: v for k, v in reply.headers.items() if k.lower() not in _HOP_HEADERS}
        return StreamingResponse(
            reply.aiter_raw(),
            status_code=reply.status_code,
            headers=reply_headers,
            background=BackgroundTask(reply.aclose),
        )

    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return Starlette(
        routes=[Route("/health", health), Route("/{path:path}", forward, methods=methods)], lifespan=lifespan
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m inferpath.demo.proxy --port N --upstream URL [--delay-seconds S]``."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="inferpath-demo-proxy")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--delay-seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    app = create_proxy_app(args.upstream, args.delay_seconds)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False, timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
