"""The demo's emulated GPU engine: a vLLM-like server whose step times are measured ones.

A continuous-batching scheduler with a paged KV-cache block pool and recompute preemption
(:mod:`.scheduler`), timed by SplitwiseSim's measured prefill/decode profile (:mod:`.profile`),
served over an OpenAI-compatible API with vLLM's ``/metrics``, dcgm-exporter-style GPU metrics
and vLLM's ``llm_request`` spans (:mod:`.server`). See README.md in this folder.
"""

from inferpath.demo.engine.profile import PerfProfile
from inferpath.demo.engine.scheduler import (
    Engine,
    EngineConfig,
    EngineStats,
    RequestAborted,
    RequestMetrics,
    RequestStream,
    TokenEvent,
)

__all__ = [
    "Engine",
    "EngineConfig",
    "EngineStats",
    "PerfProfile",
    "RequestAborted",
    "RequestMetrics",
    "RequestStream",
    "TokenEvent",
]
