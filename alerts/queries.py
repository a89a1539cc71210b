"""What each rule kind asks the store: parameterized SQL, one evaluation at one instant.

Every query covers ``[at - window, at)`` and binds its values server-side (``{name:Type}``);
the only text placed into SQL is a column name chosen from the whitelists of
:mod:`inferpath.alerts.rules`. Percentiles are computed over the raw request rows of the
window (``quantileExactInclusive``, numpy's default interpolation), never by averaging
per-interval percentiles: a quiet minute with a few slow requests cannot inflate the p99
of a busy window.

Engine and GPU signals are read from the canonical gauges the collectors write
(``otel_metrics_gauge``: ``queue_depth``, ``kv_cache_usage_ratio``,
``gpu_utilization_ratio``, ``gpu_up``; ``otel_metrics_sum``: ``preemptions_total``). Non-finite samples
(a device that cannot report a value) are ignored, so a missing value never reads as 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from inferpath.alerts.rules import (
    ErrorRateRule,
    GpuLostRule,
    IdleGpuLatencyRule,
    KvPressureRule,
    QuantileOverSloRule,
    QueueGrowingRule,
    TailDivergenceRule,
)
from inferpath.vocabulary import (
    CLIENT_FIRST_SQL,
    DEFAULT_ENDPOINT_CLASS,
    GPU_UP,
    GPU_UTILIZATION_RATIO,
    KV_CACHE_USAGE_RATIO,
    NS_PER_SECOND,
    PREEMPTIONS_TOTAL,
    QUEUE_DEPTH,
)

__all__ = ["Sample", "evaluate_rule"]

Confidence = Literal["ok", "low", "unknown"]

_RANGE = "timestamp >= {start:DateTime64(9, 'UTC')} AND timestamp < {end:DateTime64(9, 'UTC')}"
_METRIC_RANGE = (
    "MetricName = {metric:String} AND TimeUnix >= {start:DateTime64(9, 'UTC')}"
    " AND TimeUnix < {end:DateTime64(9, 'UTC')} AND isFinite(Value)"
)


@dataclass
class Sample:
    """One alert candidate of one evaluation.

    ``labels``: the split-by labels (``{}`` for an unsplit rule). ``value``: the number the
    condition compares (ratio, seconds, …; ``None`` without data). ``active``: the condition
    holds. ``confidence``: ``ok``; ``low`` (fewer samples than ``min_samples``: never active);
    ``unknown`` (a needed signal is not reported: never active). ``evidence``: the numbers
    behind the value, keyed as the rule kind's ``evidence_keys``. ``reason``: one line for people.
    """

    labels: dict[str, str]
    value: float | None
    active: bool
    confidence: Confidence = "ok"
    evidence: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _window(rule: Any, at: datetime) -> dict[str, Any]:
    return {"start": at - timedelta(seconds=rule.window), "end": at}


def _request_rows(store: Any, rule: Any, at: datetime, select: str, extra: dict[str, Any]) -> list[tuple]:
    params = _window(rule, at) | extra
    where = _RANGE
    if rule.endpoint_class == DEFAULT_ENDPOINT_CLASS:  # and the rows without a class, judged as it
        where += " AND endpoint_class IN ({endpoint_class:String}, '')"
        params["endpoint_class"] = rule.endpoint_class
    elif rule.endpoint_class is not None:
        where += " AND endpoint_class = {endpoint_class:String}"
        params["endpoint_class"] = rule.endpoint_class
    by = list(rule.by)
    head = "".join(f"{column}, " for column in by)
    sql = f"SELECT {head}{select} FROM inferpath_requests FINAL WHERE {where}"
    if by:
        sql += " GROUP BY " + ", ".join(by) + " ORDER BY " + ", ".join(by)
    rows = store.query(sql, params)
    return [(dict(zip(by, (str(v) for v in row[: len(by)]))), row[len(by) :]) for row in rows]


def _quantile_rows(store: Any, rule: Any, at: datetime) -> list[tuple[dict[str, str], int, float | None, float | None]]:
    # TTFT and E2E as the diagnosis judges and the dashboard shows them: the client's own
    # measure where the caller is instrumented, else the server's.
    column = CLIENT_FIRST_SQL.get(rule.measure, f"{rule.measure}_ns")
    select = f"count({column}), avg({column}), quantileExactInclusive({{q:Float64}})({column})"
    out = []
    for labels, (count, mean_ns, quantile_ns) in _request_rows(store, rule, at, select, {"q": rule.quantile}):
        mean = _finite(mean_ns)
        quantile = _finite(quantile_ns)
        out.append(
            (
                labels,
                int(count),
                None if mean is None else mean / NS_PER_SECOND,
                None if quantile is None else quantile / NS_PER_SECOND,
            )
        )
    return out


def _low(rule: Any, labels: dict[str, str], count: int, evidence: dict[str, Any]) -> Sample:
    return Sample(
        labels,
        None,
        False,
        "low",
        evidence,
        f"{count} samples < min_samples {rule.min_samples}: low confidence, not evaluated",
    )


def _tail_divergence(store: Any, rule: TailDivergenceRule, at: datetime) -> list[Sample]:
    samples = []
    for labels, count, mean_s, quantile_s in _quantile_rows(store, rule, at):
        evidence = {
            "samples": count,
            "mean_seconds": mean_s,
            "quantile_seconds": quantile_s,
            "quantile": rule.quantile,
            "ratio": None,
            "window_seconds": rule.window,
        }
        if count < rule.min_samples or mean_s is None or quantile_s is None or mean_s <= 0:
            samples.append(_low(rule, labels, count, evidence))
            continue
        ratio = quantile_s / mean_s
        evidence["ratio"] = ratio
        active = ratio >= rule.ratio_threshold and quantile_s >= rule.min_tail_seconds
        samples.append(
            Sample(
                labels,
                ratio,
                active,
                "ok",
                evidence,
                f"{rule.measure} p{rule.quantile * 100:g} {quantile_s * 1e3:.1f} ms is {ratio:.2f}x "
                f"the mean {mean_s * 1e3:.1f} ms over {count} requests",
            )
        )
    return samples


def _quantile_over_slo(store: Any, rule: QuantileOverSloRule, at: datetime) -> list[Sample]:
    samples = []
    for labels, count, _, quantile_s in _quantile_rows(store, rule, at):
        evidence = {
            "samples": count,
            "quantile_seconds": quantile_s,
            "quantile": rule.quantile,
            "slo_seconds": rule.slo_seconds,
            "window_seconds": rule.window,
        }
        if count < rule.min_samples or quantile_s is None:
            samples.append(_low(rule, labels, count, evidence))
            continue
        samples.append(
            Sample(
                labels,
                quantile_s,
                quantile_s > rule.slo_seconds,
                "ok",
                evidence,
                f"{rule.measure} p{rule.quantile * 100:g} {quantile_s * 1e3:.1f} ms "
                f"(SLO {rule.slo_seconds * 1e3:.0f} ms) over {count} requests",
            )
        )
    return samples


def _error_rate(store: Any, rule: ErrorRateRule, at: datetime) -> list[Sample]:
    select = "count(), countIf(has({statuses:Array(String)}, status))"
    samples = []
    for labels, (count, errors) in _request_rows(store, rule, at, select, {"statuses": list(rule.statuses)}):
        count, errors = int(count), int(errors)
        evidence = {"samples": count, "errors": errors, "error_ratio": None, "window_seconds": rule.window}
        if count < rule.min_samples:
            samples.append(_low(rule, labels, count, evidence))
            continue
        ratio = errors / count
        evidence["error_ratio"] = ratio
        samples.append(
            Sample(
                labels,
                ratio,
                ratio >= rule.threshold_ratio,
                "ok",
                evidence,
                f"{errors} of {count} requests failed ({ratio * 100:.1f}%)",
            )
        )
    return samples


def _queue_growing(store: Any, rule: QueueGrowingRule, at: datetime) -> list[Sample]:
    # Per series (engine): least-squares slope over the window, latest value, sample count;
    # series are then summed, because requests waiting anywhere add up.
    sql = (
        "SELECT sum(slope), sum(last), sum(n) FROM ("
        " SELECT tupleElement(simpleLinearRegression("
        "   (toUnixTimestamp64Nano(TimeUnix) - toUnixTimestamp64Nano({start:DateTime64(9, 'UTC')})) / 1e9, Value), 1)"
        "   AS slope, argMax(Value, TimeUnix) AS last, count() AS n"
        f" FROM otel_metrics_gauge WHERE {_METRIC_RANGE}"
        " GROUP BY ServiceName, ResourceAttributes, Attributes HAVING n >= 2)"
    )
    params = _window(rule, at) | {"metric": QUEUE_DEPTH}
    slope, last, count = store.query(sql, params)[0]
    count = int(count or 0)
    slope_s, depth = _finite(slope), _finite(last)
    evidence = {
        "samples": count,
        QUEUE_DEPTH: depth,
        "increase": None,
        "slope_per_second": slope_s,
        "window_seconds": rule.window,
    }
    if count == 0 or slope_s is None or depth is None:
        return [Sample({}, None, False, "unknown", evidence, "queue depth not reported in the window")]
    if count < rule.min_samples:
        return [_low(rule, {}, count, evidence)]
    increase = slope_s * rule.window
    evidence["increase"] = increase
    return [
        Sample(
            {},
            increase,
            increase >= rule.min_increase and depth >= rule.min_depth,
            "ok",
            evidence,
            f"queue depth {depth:.0f}, trend {increase:+.1f} per {rule.window:.0f} s (least-squares slope)",
        )
    ]


def _preemptions_increase(store: Any, params: dict[str, Any]) -> float | None:
    # PromQL increase() without extrapolation: per series, positive steps between samples in
    # the window, a drop counted as a restart from zero.
    sql = (
        "SELECT sum(inc), count() FROM ("
        " SELECT arrayMap(x -> x.2, arraySort(groupArray((TimeUnix, Value)))) AS v,"
        "  arraySum(arrayMap((a, b) -> if(b >= a, b - a, b), arrayPopBack(v), arrayPopFront(v))) AS inc"
        f" FROM otel_metrics_sum WHERE {_METRIC_RANGE}"
        " GROUP BY ServiceName, ResourceAttributes, Attributes)"
    )
    increase, series = store.query(sql, params | {"metric": PREEMPTIONS_TOTAL})[0]
    return _finite(increase) if int(series or 0) > 0 else None


KV_USAGE_QUANTILE = 0.9
"""A KV pool is under pressure over a window when its usage stays high for a tenth of it at
least: the p90 of its samples, not their mean (a real vLLM whose 48-block pool ran 0.85-1.0
with 282 preemptions for two of four minutes averaged under 0.9 over five, with idle scrapes
before and after), nor a single scrape's spike."""


def _kv_pressure(store: Any, rule: KvPressureRule, at: datetime) -> list[Sample]:
    params = _window(rule, at)
    sql = (
        "SELECT max(usage), sum(n) FROM ("
        f" SELECT quantileExactInclusive({KV_USAGE_QUANTILE})(Value) AS usage, count() AS n"
        f" FROM otel_metrics_gauge WHERE {_METRIC_RANGE}"
        " GROUP BY ServiceName, ResourceAttributes, Attributes)"
    )
    usage, count = store.query(sql, params | {"metric": KV_CACHE_USAGE_RATIO})[0]
    count = int(count or 0)
    usage_ratio = _finite(usage) if count else None
    preemptions = _preemptions_increase(store, params)
    evidence = {
        "samples": count,
        KV_CACHE_USAGE_RATIO: usage_ratio,
        "preemptions": preemptions,
        "window_seconds": rule.window,
    }
    if usage_ratio is None:
        return [Sample({}, None, False, "unknown", evidence, "KV-cache usage not reported in the window")]
    if count < rule.min_samples:
        return [_low(rule, {}, count, evidence)]
    active = usage_ratio >= rule.usage_threshold and preemptions is not None and preemptions >= rule.min_preemptions
    shown = "not reported" if preemptions is None else f"{preemptions:.0f}"
    return [
        Sample(
            {},
            usage_ratio,
            active,
            "ok",
            evidence,
            f"KV-cache usage p90 {usage_ratio * 100:.0f}% with {shown} preemptions in {rule.window:.0f} s",
        )
    ]


def _idle_gpu_latency(store: Any, rule: IdleGpuLatencyRule, at: datetime) -> list[Sample]:
    sql = f"SELECT count(), avg(Value) FROM otel_metrics_gauge WHERE {_METRIC_RANGE}"
    utilization_count, utilization = store.query(sql, _window(rule, at) | {"metric": GPU_UTILIZATION_RATIO})[0]
    utilization_count = int(utilization_count or 0)
    utilization_ratio = _finite(utilization) if utilization_count else None
    samples = []
    for labels, count, _, quantile_s in _quantile_rows(store, rule, at):
        evidence = {
            "samples": count,
            "quantile_seconds": quantile_s,
            "quantile": rule.quantile,
            "slo_seconds": rule.slo_seconds,
            GPU_UTILIZATION_RATIO: utilization_ratio,
            "utilization_samples": utilization_count,
            "window_seconds": rule.window,
        }
        if count < rule.min_samples or quantile_s is None:
            samples.append(_low(rule, labels, count, evidence))
            continue
        if utilization_ratio is None or utilization_count < rule.min_utilization_samples:
            samples.append(
                Sample(
                    labels, None, False, "unknown", evidence, "GPU utilization not reported: cannot tell idle from busy"
                )
            )
            continue
        active = quantile_s > rule.slo_seconds and utilization_ratio < rule.idle_threshold
        samples.append(
            Sample(
                labels,
                quantile_s,
                active,
                "ok",
                evidence,
                f"{rule.measure} p{rule.quantile * 100:g} {quantile_s * 1e3:.1f} ms while GPUs are "
                f"{utilization_ratio * 100:.0f}% utilized",
            )
        )
    return samples


def _gpu_lost(store: Any, rule: GpuLostRule, at: datetime) -> list[Sample]:
    # One group per GPU (device key of collectors/identity.py); its latest gpu_up decides.
    sql = (
        "SELECT Attributes['host'] AS host, Attributes['UUID'] AS uuid, Attributes['GPU_I_ID'] AS instance,"
        " argMax(Attributes['gpu'], TimeUnix), argMax(Attributes['modelName'], TimeUnix),"
        " argMax(Value, TimeUnix), count()"
        f" FROM otel_metrics_gauge WHERE {_METRIC_RANGE}"
        " GROUP BY host, uuid, instance ORDER BY host, uuid, instance"
    )
    rows = store.query(sql, _window(rule, at) | {"metric": GPU_UP})
    if not rows:
        return [
            Sample(
                {},
                None,
                False,
                "unknown",
                {"samples": 0, GPU_UP: None, "gpu": None, "model": None, "window_seconds": rule.window},
                "gpu_up not reported in the window (no NVML collector?)",
            )
        ]
    samples = []
    for host, uuid, instance, index, model, up, count in rows:
        labels = {"host": str(host), "UUID": str(uuid), "gpu": str(index)}
        if instance:
            labels["GPU_I_ID"] = str(instance)
        value = _finite(up)
        evidence = {
            "samples": int(count),
            GPU_UP: value,
            "gpu": str(index),
            "model": str(model),
            "window_seconds": rule.window,
        }
        lost = value is not None and value < 0.5
        where = f"GPU {index} ({uuid}) on {host}"
        samples.append(
            Sample(
                labels,
                value,
                lost,
                "ok",
                evidence,
                f"{where} no longer answers its collector (gpu_up 0)" if lost else f"{where} answers",
            )
        )
    return samples


_BY_KIND: dict[str, Callable[..., list[Sample]]] = {
    "tail_divergence": _tail_divergence,
    "quantile_over_slo": _quantile_over_slo,
    "error_rate": _error_rate,
    "queue_growing": _queue_growing,
    "kv_pressure": _kv_pressure,
    "idle_gpu_latency": _idle_gpu_latency,
    "gpu_lost": _gpu_lost,
}


def evaluate_rule(store: Any, rule: Any, at: datetime) -> list[Sample]:
    """Run ``rule``'s query over ``[at - rule.window, at)`` on ``store`` (anything with
    ``query(sql, parameters)``, e.g. :class:`~inferpath.storage.store.Store`).

    ``at`` must be timezone-aware (``ValueError`` otherwise, from the store). Returns one
    :class:`Sample` per label set (request rules with ``by``: one per group present in the
    window; otherwise exactly one). Driver errors propagate.
    """
    return _BY_KIND[rule.kind](store, rule, at)
