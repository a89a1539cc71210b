"""Gateway overhead: inferpath's FastAPI integration vs the stock ``FastAPIInstrumentor``.

Three copies of one FastAPI app (a JSON route) are called in-process through ASGI (no
sockets, so only the middleware work is measured): uninstrumented (the reference),
``inferpath.instrument(app)``, and ``FastAPIInstrumentor.instrument_app(app)`` with its
defaults. All three share one SDK provider exporting to a discarding sink; FastAPI's own
native tracing is off in all three (inferpath turns it off; the others get the same).
Overhead = instrumented − reference, per request; interleaved rounds, best of each.

Two more figures per side, same rounds: the request thread's CPU time per request
(``time.thread_time``, which other processes' load on the machine distorts less than wall
time, and which leaves out the export worker thread), and, for reference, one bare SDK
server span with the same eight attributes (five at start, three at end), made current and
ended in a tight loop without any ASGI work. (An SDK span costs more inside a request than
in that loop: about 30 us here, most likely because the request's own work evicts it from
the CPU caches.) The load average is printed at the start and the end: other work on the machine inflates every absolute figure.

    python bench/bench_gateway.py [--requests N] [--rounds R] [--traceparent]
``--traceparent`` sends a W3C ``traceparent`` header with every request (a gateway behind
a traced caller), so the parent extraction is measured too.
Target: inferpath overhead <= 0.5 x stock in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from bench_stage_span import DiscardingExporter
from fastapi import FastAPI
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind

import inferpath
from inferpath.instrumentation import provider


def build_app() -> FastAPI:
    app = FastAPI()
    telemetry = getattr(app, "_telemetry", None)
    if isinstance(telemetry, dict):
        telemetry["tracing"] = False

    @app.get("/v1/models/{name}")
    async def model(name: str) -> dict:
        return {"id": name, "object": "model"}

    return app


TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def call(app: FastAPI, requests: int, traceparent: bool = False) -> tuple[float, float]:
    """Serve ``requests`` GET requests in process; (wall seconds, request-thread CPU
    seconds) per request."""
    headers = [(b"host", b"bench")]
    if traceparent:
        headers.append((b"traceparent", TRACEPARENT))
    scope_template = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/models/m1",
        "raw_path": b"/v1/models/m1",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        pass

    cpu_started = time.thread_time()
    started = time.perf_counter()
    for _ in range(requests):
        await app(dict(scope_template), receive, send)
    wall = time.perf_counter() - started
    return wall / requests, (time.thread_time() - cpu_started) / requests


def bare_span_seconds(spans: int) -> tuple[float, float]:
    """One SDK SERVER span with the gateway span's eight attributes, made current and
    ended, in a tight loop. (wall, CPU) seconds per span."""
    tracer = provider.current_provider().get_tracer("bench-bare")
    start_attributes = {
        "inferpath.stage": "gateway",
        "inferpath.endpoint_class": "interactive",
        "http.request.method": "GET",
        "url.path": "/v1/models/m1",
        "url.scheme": "http",
    }
    end_attributes = {
        "http.response.status_code": 200,
        "http.route": "/v1/models/{name}",
        "inferpath.endpoint": "/v1/models/{name}",
    }
    cpu_started = time.thread_time()
    started = time.perf_counter()
    for _ in range(spans):
        span = tracer.start_span("GET", kind=SpanKind.SERVER, attributes=start_attributes)
        token = otel_context.attach(trace.set_span_in_context(span))
        span.set_attributes(end_attributes)
        span.update_name("GET /v1/models/{name}")
        span.end()
        otel_context.detach(token)
    wall = time.perf_counter() - started
    return wall / spans, (time.thread_time() - cpu_started) / spans


def run(requests: int, rounds: int, traceparent: bool = False) -> dict[str, float]:
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    provider.configure(
        "bench-gateway", span_exporter=DiscardingExporter(), max_queue_size=1 << 20, schedule_delay_seconds=0.2
    )
    apps = {"bare": build_app(), "inferpath": build_app(), "stock": build_app()}
    inferpath.instrument(apps["inferpath"], service_name="bench-gateway")
    FastAPIInstrumentor.instrument_app(apps["stock"], tracer_provider=provider.current_provider())
    sides = (*apps, "span")
    best = {name: float("inf") for name in sides}
    best_cpu = {name: float("inf") for name in sides}

    async def measure() -> None:
        for app in apps.values():
            await call(app, 50, traceparent)  # warm-up: middleware stacks built, caches filled
        for _ in range(rounds):
            for name in sides:
                if name == "span":
                    wall, cpu = bare_span_seconds(requests)
                else:
                    wall, cpu = await call(apps[name], requests, traceparent)
                best[name] = min(best[name], wall)
                best_cpu[name] = min(best_cpu[name], cpu)
                provider.force_flush(5.0)

    load_before = os.getloadavg()[0]
    asyncio.run(measure())
    load_after = os.getloadavg()[0]
    provider.shutdown(5.0)
    ours = best["inferpath"] - best["bare"]
    stock = best["stock"] - best["bare"]
    return {
        "bare_us": best["bare"] * 1e6,
        "ours_overhead_us": ours * 1e6,
        "stock_overhead_us": stock * 1e6,
        "ratio": ours / stock,
        "bare_cpu_us": best_cpu["bare"] * 1e6,
        "ours_overhead_cpu_us": (best_cpu["inferpath"] - best_cpu["bare"]) * 1e6,
        "stock_overhead_cpu_us": (best_cpu["stock"] - best_cpu["bare"]) * 1e6,
        "bare_span_us": best["span"] * 1e6,
        "bare_span_cpu_us": best_cpu["span"] * 1e6,
        "load_before": load_before,
        "load_after": load_after,
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--traceparent", action="store_true", help="send a W3C traceparent header with every request")
    args = parser.parse_args(argv)
    result = run(args.requests, args.rounds, args.traceparent)
    print(f"load average: {result['load_before']:.2f} -> {result['load_after']:.2f}")
    print("best round of each side: wall / request-thread CPU")
    print(f"uninstrumented request (reference): {result['bare_us']:.1f} / {result['bare_cpu_us']:.1f} us")
    print(
        f"stock FastAPIInstrumentor adds:     {result['stock_overhead_us']:.1f} / "
        f"{result['stock_overhead_cpu_us']:.1f} us/request"
    )
    print(
        f"inferpath adds:                     {result['ours_overhead_us']:.1f} / "
        f"{result['ours_overhead_cpu_us']:.1f} us/request"
    )
    print(f"bare SDK server span, tight loop:   {result['bare_span_us']:.1f} / {result['bare_span_cpu_us']:.1f} us")
    print(f"ratio inferpath/stock: {result['ratio']:.2f} (target <= 0.5)")
    return result


if __name__ == "__main__":
    main()
