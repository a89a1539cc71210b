"""Run the emulated engine: ``python -m inferpath.demo.engine --port 8000 --otlp-endpoint URL``.

uvicorn handles SIGTERM and SIGINT by finishing in-flight responses and running the app's
shutdown, which stops the engine and flushes spans (bounded to 2 s).
"""

from __future__ import annotations

import argparse
import logging
import sys

from inferpath.demo.engine.scheduler import EngineConfig


def build_parser() -> argparse.ArgumentParser:
    """The command-line flags (names follow vLLM's where vLLM has one)."""
    parser = argparse.ArgumentParser(
        prog="python -m inferpath.demo.engine", description="Emulated GPU inference engine with a vLLM-compatible API."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="llama2-70b", help="profile model: llama2-70b or bloom-176b")
    parser.add_argument("--hardware", default="h100-80gb", help="profile GPU: h100-80gb, a100-80gb, h100-80gb-pcap")
    parser.add_argument("--tensor-parallel-size", type=int, default=4, help="2, 4 or 8 (as profiled)")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--kv-blocks", type=int, default=4096, help="KV-cache blocks of the whole group")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=EngineConfig.max_num_batched_tokens)
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiplies every step time")
    parser.add_argument("--prefill-slowdown", type=float, default=1.0)
    parser.add_argument("--decode-slowdown", type=float, default=1.0)
    parser.add_argument(
        "--batch-window-seconds",
        type=float,
        default=0.0,
        help="hold the queue head this long so more requests join its prefill",
    )
    parser.add_argument(
        "--startup-seconds",
        type=float,
        default=0.0,
        help="emulated model loading before serving, recorded as start-up spans",
    )
    parser.add_argument(
        "--cold-seconds",
        type=float,
        default=0.0,
        help="from the first request on, steps run --cold-slowdown times slower for this long",
    )
    parser.add_argument("--cold-slowdown", type=float, default=1.0)
    parser.add_argument("--service-name", default="demo-engine")
    parser.add_argument("--otlp-endpoint", default=None, help="OTLP/HTTP base URL, e.g. http://127.0.0.1:4318")
    parser.add_argument("--log-level", default="info")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse flags, build the app and serve it until a signal; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = EngineConfig(
            model=args.model,
            hardware=args.hardware,
            tensor_parallel=args.tensor_parallel_size,
            served_model_name=args.served_model_name,
            num_kv_blocks=args.kv_blocks,
            block_size_tokens=args.block_size,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            time_scale=args.time_scale,
            prefill_slowdown=args.prefill_slowdown,
            decode_slowdown=args.decode_slowdown,
            batch_window_seconds=args.batch_window_seconds,
            cold_seconds=args.cold_seconds,
            cold_slowdown=args.cold_slowdown,
        )
        from inferpath.demo.engine.server import create_app

        app = create_app(
            config,
            service_name=args.service_name,
            otlp_endpoint=args.otlp_endpoint,
            startup_seconds=args.startup_seconds,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower(), timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
