"""The per-minute gauge rollup (``otel_metrics_gauge_1m``, schema 011): backfill and readiness.

A materialized view folds every gauge insert into the rollup, so it never lags and needs no
refresher. What it cannot see are the samples stored before the view was created (a store
upgraded in place): :func:`backfill` folds those in once, then records itself in
``inferpath_rollup_state`` under :data:`STATE_NAME`. Readers (:func:`is_ready`) use the
rollup only once that record exists, and read the samples themselves before. Folding a
sample in twice changes nothing (the rollup keeps max, argMax and min), so a backfill
racing with inserts, or run twice by two server replicas, is harmless.
"""

from __future__ import annotations

import logging
import weakref
from datetime import datetime, timezone
from typing import Any

logger = logging.getLogger(__name__)

GAUGE_ROLLUP_TABLE = "otel_metrics_gauge_1m"
STATE_TABLE = "inferpath_rollup_state"
STATE_NAME = "otel_metrics_gauge_1m_backfill"
"""The backfill's row in the state table (its watermark: when the backfill ran)."""
MINUTE_NS = 60_000_000_000

_ready: weakref.WeakSet[Any] = weakref.WeakSet()
"""Stores seen ready: once backfilled, a store stays so (the view keeps the rollup whole)."""

_FOLD = (
    f"INSERT INTO {GAUGE_ROLLUP_TABLE} (MetricName, Minute, ServiceName, ResourceAttributes, Attributes,"
    " LastTimeNs, LastValue, MinValue, MaxValue)"
    " SELECT MetricName, toDateTime(intDiv(toUnixTimestamp64Nano(TimeUnix), 60000000000) * 60, 'UTC') AS Minute,"
    " ServiceName, ResourceAttributes, Attributes, max(toUnixTimestamp64Nano(TimeUnix)),"
    " argMaxState(Value, toUnixTimestamp64Nano(TimeUnix)), min(Value), max(Value)"
    " FROM otel_metrics_gauge GROUP BY MetricName, Minute, ServiceName, ResourceAttributes, Attributes"
)


def is_ready(store: Any) -> bool:
    """Whether ``store``'s gauge rollup holds every stored sample (the backfill has run).
    One query until the answer is yes, none after. Raises what the store raises."""
    if store in _ready:
        return True
    rows = store.query(f"SELECT count() FROM {STATE_TABLE} WHERE name = {{name:String}}", {"name": STATE_NAME})
    if rows and rows[0][0]:
        _ready.add(store)
        return True
    return False


def backfill(store: Any) -> bool:
    """Fold every gauge sample already stored into the rollup, once per store; returns True
    when it ran, False when it had run before. Raises what the store raises (then nothing
    is recorded, and the next call tries again)."""
    if is_ready(store):
        return False
    store.command(_FOLD)
    now = datetime.now(timezone.utc)
    store.command(
        f"INSERT INTO {STATE_TABLE} (name, watermark, updated_at)"
        " VALUES ({name:String}, {now:DateTime64(9, 'UTC')}, {now:DateTime64(9, 'UTC')})",
        {"name": STATE_NAME, "now": now},
    )
    _ready.add(store)
    return True


def backfill_quietly(store: Any) -> None:
    """:func:`backfill`, logging instead of raising: the server calls it at start, where a
    failure must only leave the readers on the samples (they check :func:`is_ready`)."""
    try:
        if backfill(store):
            logger.info("gauge rollup: folded the stored samples in")
    except Exception as exc:  # noqa: BLE001 - readers fall back to the samples
        logger.warning("gauge rollup backfill failed (reads use the samples): %s", exc)


__all__ = ["GAUGE_ROLLUP_TABLE", "MINUTE_NS", "STATE_NAME", "backfill", "backfill_quietly", "is_ready"]
