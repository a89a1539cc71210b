"""Gateway overhead: inferpath's FastAPI integration vs the stock ``FastAPIInstrumentor``.

Three copies of one FastAPI app (a JSON route) are called in-process through ASGI (no
sockets, so only the middleware work is measured): uninstrumented (the reference),
``inferpath.instrument(app)``, and ``FastAPIInstrumentor.instrument_app(app)`` with its
defaults. All three share one SDK provider exporting to a discarding sink; FastAPI's own
native tracing is off in all three (inferpath turns it off; the others get the same).
Overhead = instrumented − reference, per request; interleaved rounds, best of each.

    python bench/bench_gateway.py [--requests N] [--rounds R]
Targets (issue 3): inferpath overhead <= 0.5 x stock, and <= 50 us per request.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from fastapi import FastAPI

import inferpath
from bench_stage_span import DiscardingExporter
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


async def call(app: FastAPI, requests: int) -> float:
    scope_template = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                      "method": "GET", "scheme": "http", "path": "/v1/models/m1",
                      "raw_path": b"/v1/models/m1", "root_path": "", "query_string": b"",
                      "headers": [(b"host", b"bench")], "client": ("127.0.0.1", 1),
                      "server": ("127.0.0.1", 80)}

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        pass

    started = time.perf_counter()
    for _ in range(requests):
        await app(dict(scope_template), receive, send)
    return (time.perf_counter() - started) / requests


def run(requests: int, rounds: int) -> dict[str, float]:
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    provider.configure("bench-gateway", span_exporter=DiscardingExporter(),
                       max_queue_size=1 << 20, schedule_delay_seconds=0.2)
    apps = {"bare": build_app(), "inferpath": build_app(), "stock": build_app()}
    inferpath.instrument(apps["inferpath"], service_name="bench-gateway")
    FastAPIInstrumentor.instrument_app(apps["stock"], tracer_provider=provider.current_provider())
    best = {name: float("inf") for name in apps}

    async def measure() -> None:
        for app in apps.values():
            await call(app, 50)  # warm-up: middleware stacks built, caches filled
        for _ in range(rounds):
            for name, app in apps.items():
                best[name] = min(best[name], await call(app, requests))
                provider.force_flush(5.0)

    asyncio.run(measure())
    provider.shutdown(5.0)
    ours = best["inferpath"] - best["bare"]
    stock = best["stock"] - best["bare"]
    return {"bare_us": best["bare"] * 1e6, "ours_overhead_us": ours * 1e6,
            "stock_overhead_us": stock * 1e6, "ratio": ours / stock}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    result = run(args.requests, args.rounds)
    print(f"uninstrumented request (reference): {result['bare_us']:.1f} us")
    print(f"stock FastAPIInstrumentor adds:     {result['stock_overhead_us']:.1f} us/request")
    print(f"inferpath adds:                     {result['ours_overhead_us']:.1f} us/request "
          "(target <= 50)")
    print(f"ratio inferpath/stock: {result['ratio']:.2f} (target <= 0.5)")
    return result


if __name__ == "__main__":
    main()
