"""GPUs and engines: one row per GPU (host, UUID) and per engine (service, engine, model),
a cell per canonical signal, and every signal that is missing said to be missing, with why.

Input: ``/api/v1/views/fleet`` — ``series`` (one row per signal series with samples in the
window: ``signal``, ``kind``, ``service_name``, ``attributes``, ``last_value``, ``avg_value``,
``max_value``, ``increase`` for counters) and ``sources`` (the signal catalog: source ->
signal -> source metric names). A series' source is the catalog source whose metric its
``inferpath.source_metric`` attribute names.

Why a signal is missing, in the order checked:

1. *not exported by <source>*: the catalog has no metric of that source for it (vLLM has
   no batch-size gauge; dcgm-exporter no queue);
2. *no samples from <source> in this window*: the source can report it, but sent nothing
   here (a profiling field not enabled, a scrape that failed, an engine restarted);
3. the whole kind absent: no GPU (or engine) series at all, and which sources would report one.

A missing value is the text ``missing: ...``, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from inferpath.vocabulary import ENGINE_STATE_SIGNALS as ENGINE_SIGNALS

GPU_SIGNALS = (
    "gpu_utilization_ratio",
    "gpu_sm_active_ratio",
    "gpu_memory_used_bytes",
    "gpu_memory_total_bytes",
    "gpu_power_watts",
)
GPU_KEYS = ("host", "UUID", "gpu", "modelName")
ENGINE_KEYS = ("service_name", "host", "engine", "model_name")
# The same identity under OpenTelemetry semantic-convention names, read when the
# dcgm-exporter/vLLM label is absent.
KEY_ALIASES = {
    "host": ("host.name",),
    "UUID": ("gpu.uuid",),
    "gpu": ("gpu.index",),
    "modelName": ("gpu.model",),
    "model_name": ("gen_ai.request.model",),
}
SOURCE_METRIC = "inferpath.source_metric"
MISSING = "missing"


def format_signal(signal: str, row: Mapping[str, Any]) -> str:
    """A series' value for a table cell, in display units: last value, and mean/max or the
    counter's increase over the window (``'72.0 % (mean 55.1, max 90.0)'``)."""
    if signal == "preemptions_total":
        return f"{row['last_value']:.0f} total (+{row.get('increase') or 0:.0f} in window)"
    if signal.endswith("_ratio"):
        scale, unit = 100.0, "%"
    elif signal.endswith("_bytes"):
        scale, unit = 1.0 / 2**30, "GiB"
    elif signal.endswith("_watts"):
        scale, unit = 1.0, "W"
    else:
        scale, unit = 1.0, ""
    unit_text = f" {unit}" if unit else ""
    return (
        f"{row['last_value'] * scale:.1f}{unit_text} (mean {row['avg_value'] * scale:.1f},"
        f" max {row['max_value'] * scale:.1f})"
    )


def source_of(row: Mapping[str, Any], sources: Mapping[str, Mapping[str, Sequence[str]]]) -> str:
    """The catalog source (``dcgm``, ``vllm``, ...) that produced a series, from its
    ``inferpath.source_metric`` attribute; its service name when the attribute is absent."""
    metric = (row.get("attributes") or {}).get(SOURCE_METRIC)
    if metric:
        for source, signals in sources.items():
            if any(metric in names for names in signals.values()):
                return source
    return str(row.get("service_name") or "unknown")


def _key(attributes: Mapping[str, str], name: str) -> str:
    for candidate in (name, *KEY_ALIASES.get(name, ())):
        if attributes.get(candidate):
            return str(attributes[candidate])
    return ""


def _entity_tables(
    series: Sequence[Mapping[str, Any]],
    sources: Mapping[str, Mapping[str, Sequence[str]]],
    *,
    signals: Sequence[str],
    keys: Sequence[str],
    kind: str,
) -> tuple[pd.DataFrame, list[dict[str, str]]]:
    entities: dict[tuple, dict[str, Any]] = {}
    for row in series:
        if row["signal"] not in signals:
            continue
        attributes = row.get("attributes") or {}
        key = tuple(row.get("service_name", "") if k == "service_name" else _key(attributes, k) for k in keys)
        entity = entities.setdefault(key, {"values": {}, "sources": set()})
        entity["values"][row["signal"]] = format_signal(row["signal"], row)
        entity["sources"].add(source_of(row, sources))
    table_rows, missing = [], []
    for key, entity in sorted(entities.items()):
        record = {k: v for k, v in zip(keys, key)}
        record["source"] = ", ".join(sorted(entity["sources"]))
        for signal in signals:
            if signal in entity["values"]:
                record[signal] = entity["values"][signal]
                continue
            able = [s for s in entity["sources"] if signal in sources.get(s, {})]
            why = f"no samples from {', '.join(able)} in this window" if able else f"not exported by {record['source']}"
            record[signal] = f"{MISSING}: {why}"
            missing.append({"kind": kind, "which": " ".join(str(v) for v in key if v), "signal": signal, "why": why})
        table_rows.append(record)
    if not entities:
        able = sorted(s for s, table in sources.items() if any(sig in table for sig in signals))
        missing.append(
            {
                "kind": kind,
                "which": f"all {kind}s",
                "signal": ", ".join(signals),
                "why": f"no {kind} series in this window; sources that report them: {', '.join(able) or 'none'}",
            }
        )
    return pd.DataFrame(table_rows, columns=[*keys, "source", *signals]), missing


def fleet_tables(view: Mapping[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``(gpus, engines, missing)`` tables from ``/views/fleet`` (module docstring).

    ``gpus``: one row per (host, UUID, gpu, modelName); ``engines``: one row per (service,
    host, engine, model_name); signal cells are display strings, ``missing: <why>`` where
    absent. ``missing``: columns ``kind``, ``which``, ``signal``, ``why``.
    """
    series, sources = view.get("series", []), view.get("sources", {})
    gpus, gpu_missing = _entity_tables(series, sources, signals=GPU_SIGNALS, keys=GPU_KEYS, kind="GPU")
    engines, engine_missing = _entity_tables(series, sources, signals=ENGINE_SIGNALS, keys=ENGINE_KEYS, kind="engine")
    missing = pd.DataFrame(gpu_missing + engine_missing, columns=["kind", "which", "signal", "why"])
    return gpus, engines, missing


__all__ = ["ENGINE_SIGNALS", "GPU_SIGNALS", "MISSING", "fleet_tables", "format_signal", "source_of"]
