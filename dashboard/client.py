"""A small typed client of the inferpath server's read API (``GET /api/v1/...``).

The dashboard reads only through this client: in embedded mode the server process owns the
chDB data folder, so nothing else may open it (DESIGN.md section 1). Every query method
returns a :class:`pandas.DataFrame` whose time columns are timezone-aware UTC timestamps and
whose durations stay in seconds as the API sends them (``*_seconds`` columns); conversion to
milliseconds for display happens once, in :mod:`inferpath.dashboard.figures`.

Failures (server down, HTTP error, a body that is not the expected JSON) raise
:class:`ReadApiError` with a message that names the URL and what went wrong, so the UI can
show it as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any, Literal

import httpx
import pandas as pd

from inferpath.config import Settings

SUMMARY_COLUMNS = ["measure", "count", "avg_seconds", "p50_seconds", "p95_seconds", "p99_seconds"]
TTFT_SERIES_COLUMNS = ["bucket", "endpoint_class", "count", "avg_seconds", "p50_seconds", "p99_seconds"]
GAUGE_SERIES_COLUMNS = ["bucket", "service_name", "attributes", "value"]

# Keys under which a server may wrap a list of rows ({"rows": [...]}); checked in order.
# The server answers {"measures": [...]}, {"points": [...]} or {"requests": [...]}.
_ROW_KEYS = ("measures", "points", "requests", "rows", "data", "items")
# Columns that hold wall-clock instants in any read-API answer.
_TIME_COLUMNS = ("bucket", "timestamp", "start", "end", "time", "last_time")

TimeLike = datetime | float | int | str


class ReadApiError(RuntimeError):
    """The read API could not answer: unreachable, HTTP error status, or an unexpected body.

    ``url`` is the request URL, ``status_code`` the HTTP status (``None`` when no answer came).
    """

    def __init__(self, message: str, *, url: str, status_code: int | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status_code = status_code
        self.detail = detail or message
        """The server's own words (its ``detail``), without the request line and status."""


def format_time(value: TimeLike) -> str:
    """Render an instant as the API expects it: ISO-8601 with offset, or unix seconds.

    ``datetime`` values must be timezone-aware (a naive one is ambiguous and raises
    ``ValueError``); numbers are unix seconds; strings pass through unchanged.
    """
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("time value must be timezone-aware, got a naive datetime")
        return value.astimezone(timezone.utc).isoformat()
    if isinstance(value, (int, float)):
        return repr(float(value))
    if isinstance(value, str) and value:
        return value
    raise ValueError(f"time value must be a datetime, unix seconds or ISO string, got {value!r}")


def rows_of(body: Any, *, url: str) -> list[dict[str, Any]]:
    """Extract the list of row objects from a read-API body.

    Accepts a bare JSON list or an object wrapping one under a key of ``_ROW_KEYS``.
    Raises :class:`ReadApiError` for any other shape.
    """
    if isinstance(body, list):
        rows = body
    elif isinstance(body, dict):
        found: list[Any] | None = next((body[key] for key in _ROW_KEYS if isinstance(body.get(key), list)), None)
        if found is None:
            raise ReadApiError(
                f"unexpected answer from {url}: an object without a list of rows (keys: {sorted(body)})", url=url
            )
        rows = found
    else:
        raise ReadApiError(f"unexpected answer from {url}: {type(body).__name__}", url=url)
    if not all(isinstance(row, dict) for row in rows):
        raise ReadApiError(f"unexpected answer from {url}: rows are not JSON objects", url=url)
    return rows


def to_frame(rows: list[dict[str, Any]], columns: list[str] | None = None) -> pd.DataFrame:
    """Build a DataFrame from row objects with UTC-aware time columns.

    ``columns`` lists the columns the caller relies on; any that the rows lack are added
    (empty), so an empty answer still has the expected shape. Time columns (``bucket``,
    ``timestamp``, ...) accept ISO strings or unix seconds and come out as
    ``datetime64[ns, UTC]``. Numeric ``*_seconds``/``*_ns``/``count``/``value`` columns are
    coerced to numbers, with ``NaN`` where the API sent null (never 0).
    """
    frame = pd.DataFrame.from_records(rows) if rows else pd.DataFrame()
    for column in columns or []:
        if column not in frame.columns:
            frame[column] = pd.Series(dtype="object")
    for column in frame.columns:
        if column in _TIME_COLUMNS:
            frame[column] = _to_utc(frame[column])
        elif column in ("count", "value") or column.endswith(("_seconds", "_ns", "_ratio", "_bytes", "_total")):
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return frame


def _to_utc(series: pd.Series) -> pd.Series:
    if series.empty:
        return pd.Series(pd.DatetimeIndex([], tz="UTC"), index=series.index)
    if pd.api.types.is_numeric_dtype(series):
        return pd.to_datetime(series, unit="s", utc=True)
    return pd.to_datetime(series, utc=True, format="ISO8601")


class ReadApiClient:
    """Client of one inferpath server's read API.

    ``server_url``: base URL such as ``http://127.0.0.1:4318`` (no ``/api/v1`` suffix);
    ``token``: optional bearer token (``INFERPATH_TOKEN``); ``timeout_seconds``: per request.
    Use as a context manager or call :meth:`close`.
    """

    def __init__(self, server_url: str, *, token: str | None = None, timeout_seconds: float = 10.0) -> None:
        if not server_url.startswith(("http://", "https://")):
            raise ValueError(f"server_url must start with http:// or https://, got {server_url!r}")
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.server_url = server_url.rstrip("/")
        self._http = httpx.Client(base_url=self.server_url, headers=headers, timeout=timeout_seconds)

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> ReadApiClient:
        """Client for ``settings.server_url`` with ``settings.token``."""
        return cls(settings.server_url, token=settings.token, **kwargs)

    def __enter__(self) -> ReadApiClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the underlying connection pool."""
        self._http.close()

    def get_json(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        """``GET path`` with ``params`` (``None`` values dropped), the JSON body as is.

        Raises :class:`ReadApiError` as every query method does.
        """
        return self._get(path, params or {})

    def _get(self, path: str, params: Mapping[str, Any]) -> Any:
        query = {key: value for key, value in params.items() if value not in (None, "")}
        url = f"{self.server_url}{path}"
        try:
            response = self._http.get(path, params=query)
        except httpx.HTTPError as error:
            raise ReadApiError(
                f"inferpath server at {self.server_url} is unreachable: {type(error).__name__}: {error}", url=url
            ) from error
        if response.status_code >= 400:
            detail = _detail(response)
            raise ReadApiError(
                f"GET {path} answered HTTP {response.status_code}: {detail}",
                url=str(response.url),
                status_code=response.status_code,
                detail=detail,
            )
        try:
            return response.json()
        except ValueError as error:
            raise ReadApiError(
                f"GET {path} did not answer JSON: {response.text[:200]!r}",
                url=str(response.url),
                status_code=response.status_code,
            ) from error

    def health(self) -> dict[str, Any]:
        """``GET /healthz`` as a dict; raises :class:`ReadApiError` when not healthy."""
        body = self._get("/healthz", {})
        return body if isinstance(body, dict) else {"status": body}

    def summary(
        self,
        start: TimeLike,
        end: TimeLike,
        *,
        endpoint: str | None = None,
        endpoint_class: str | None = None,
        filters: Mapping[str, str] | None = None,
    ) -> pd.DataFrame:
        """Per-measure latency summary over ``[start, end)``.

        Returns one row per measure (``client_ttft``, ``ttft``, ``queue``, ``prefill``, ...)
        with columns :data:`SUMMARY_COLUMNS`; durations in seconds, ``NaN`` where a measure
        has no samples. ``frame.attrs["request_count"]`` holds the number of requests in the
        window and ``frame.attrs["percentiles"]`` how they were computed (``exact`` or
        ``ddsketch``) when the server reports them. ``filters``: more query parameters the
        route takes (see :mod:`inferpath.dashboard.filters`).
        """
        body = self._get(
            "/api/v1/summary",
            {
                "start": format_time(start),
                "end": format_time(end),
                "endpoint": endpoint,
                "endpoint_class": endpoint_class,
                **(filters or {}),
            },
        )
        frame = to_frame(rows_of(body, url="/api/v1/summary"), SUMMARY_COLUMNS)
        if isinstance(body, dict) and isinstance(body.get("request_count"), int):
            frame.attrs["request_count"] = body["request_count"]
        if isinstance(body, dict) and body.get("percentiles") in ("exact", "ddsketch"):
            frame.attrs["percentiles"] = body["percentiles"]
        return frame

    def ttft_timeseries(
        self, start: TimeLike, end: TimeLike, *, step_seconds: float, endpoint_class: str | None = None
    ) -> pd.DataFrame:
        """TTFT per time bucket and endpoint class: columns :data:`TTFT_SERIES_COLUMNS`.

        ``bucket`` is the bucket's start (UTC); buckets without requests are absent.
        """
        body = self._get(
            "/api/v1/timeseries/ttft",
            {
                "start": format_time(start),
                "end": format_time(end),
                "step_seconds": step_seconds,
                "endpoint_class": endpoint_class,
            },
        )
        return to_frame(rows_of(body, url="/api/v1/timeseries/ttft"), TTFT_SERIES_COLUMNS)

    def gauge_timeseries(self, metric: str, start: TimeLike, end: TimeLike, *, step_seconds: float) -> pd.DataFrame:
        """A canonical gauge (``queue_depth``, ``kv_cache_usage_ratio``, ...) per time bucket.

        Columns :data:`GAUGE_SERIES_COLUMNS`: one row per bucket and series, where a series
        is a ``service_name`` plus its ``attributes`` (e.g. vLLM's ``engine``).
        """
        body = self._get(
            "/api/v1/timeseries/gauge",
            {"metric": metric, "start": format_time(start), "end": format_time(end), "step_seconds": step_seconds},
        )
        return to_frame(rows_of(body, url="/api/v1/timeseries/gauge"), GAUGE_SERIES_COLUMNS)

    def requests(
        self,
        start: TimeLike,
        end: TimeLike,
        *,
        limit: int = 50,
        order: Literal["slowest", "timestamp"] = "slowest",
        filters: Mapping[str, str] | None = None,
    ) -> pd.DataFrame:
        """Request rows (``inferpath_requests``) in ``[start, end)``, ``limit`` at most,
        slowest end-to-end first (``order="slowest"``) or newest first (``"timestamp"``).

        Columns as the telemetry contract's request row: ``timestamp`` (UTC), ``*_ns``
        durations, endpoint, class, model, status, ... ``filters``: query parameters the
        route takes (``endpoint_class``, ``endpoint``).
        """
        body = self._get(
            "/api/v1/requests",
            {"start": format_time(start), "end": format_time(end), "limit": limit, "order": order, **(filters or {})},
        )
        return to_frame(rows_of(body, url="/api/v1/requests"))

    def view(
        self,
        name: Literal["latency", "correlate", "breakdown", "fleet", "signals"],
        start: TimeLike,
        end: TimeLike,
        **params: Any,
    ) -> dict[str, Any]:
        """One dashboard view, ``GET /api/v1/views/{name}``, as the server's JSON object.

        ``params``: the view's filters (``endpoint_class``, ``step_seconds``, ``max_points``).
        Time series come back downsampled by the server to at most ``max_points`` buckets.
        """
        body = self._get(f"/api/v1/views/{name}", {"start": format_time(start), "end": format_time(end), **params})
        if not isinstance(body, dict):
            raise ReadApiError(
                f"unexpected answer from /api/v1/views/{name}: {type(body).__name__}", url=f"/api/v1/views/{name}"
            )
        return body

    def trace(self, trace_id: str) -> pd.DataFrame:
        """Spans of one trace (``GET /api/v1/traces/{id}``), ordered by start.

        Columns as :class:`inferpath.storage.rows.SpanRow` plus ``start_ns``/``end_ns`` (Unix
        ns). Raises :class:`ReadApiError` with ``status_code`` 404 for an unknown trace and
        ``ValueError`` for an id that is not 32 hex digits (checked before any request).
        """
        if len(trace_id) != 32 or any(c not in "0123456789abcdefABCDEF" for c in trace_id):
            raise ValueError(f"trace_id must be 32 hex digits, got {trace_id!r}")
        body = self._get(f"/api/v1/traces/{trace_id.lower()}", {})
        return to_frame(rows_of(body.get("spans") if isinstance(body, dict) else body, url="/api/v1/traces"))

    def diagnosis(
        self,
        start: TimeLike,
        end: TimeLike,
        *,
        endpoint: str | None = None,
        baseline_start: TimeLike | None = None,
        baseline_end: TimeLike | None = None,
        filters: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """The verdict for ``[start, end)`` against the latency objectives, and against the
        baseline window when both its bounds are given (``GET /api/v1/diagnosis``); 422
        (too few requests) raises :class:`ReadApiError` whose ``detail`` is the server's
        sentence. ``filters``: endpoint_class / service / model / replica query parameters."""
        return self._get(
            "/api/v1/diagnosis",
            {
                "start": format_time(start),
                "end": format_time(end),
                "endpoint": endpoint,
                "baseline_start": None if baseline_start is None else format_time(baseline_start),
                "baseline_end": None if baseline_end is None else format_time(baseline_end),
                **(filters or {}),
            },
        )

    def whatif(self, start: TimeLike, end: TimeLike, **change: Any) -> dict[str, Any]:
        """``GET /api/v1/whatif``: TTFT, queue time and ITL per endpoint class observed,
        replayed and predicted under ``change`` (``replicas``, ``max_num_seqs``,
        ``kv_blocks``, ``batch_window_ms``, ``rate``); a window that cannot be calibrated
        raises :class:`ReadApiError` (422) whose ``detail`` is the server's reason."""
        body = self._get("/api/v1/whatif", {"start": format_time(start), "end": format_time(end), **change})
        if not isinstance(body, dict):
            raise ReadApiError(f"unexpected answer from /api/v1/whatif: {type(body).__name__}", url="/api/v1/whatif")
        return body

    def objectives(self) -> dict[str, Any] | None:
        """The server's latency objectives per endpoint class (``GET /api/v1/objectives``:
        ``{"by_class": {class: [{measure, quantile, limit_seconds}]}, "default_class"}``), or
        ``None`` from a server without the route (404)."""
        try:
            return self._get("/api/v1/objectives", {})
        except ReadApiError as error:
            if error.status_code == 404:
                return None
            raise

    def alerts(self, start: TimeLike | None = None, end: TimeLike | None = None) -> Any | None:
        """``GET /api/v1/alerts`` for the window (firing now, state changes of the window)
        as sent, or ``None`` when the server has no alerts route (404): alerting is not
        configured there."""
        try:
            return self._get(
                "/api/v1/alerts",
                {
                    "start": None if start is None else format_time(start),
                    "end": None if end is None else format_time(end),
                },
            )
        except ReadApiError as error:
            if error.status_code == 404:
                return None
            raise


def _detail(response: httpx.Response) -> str:
    # FastAPI puts the reason under "detail"; fall back to the raw text, shortened.
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        return detail_text(body["detail"])
    return str(body)[:300]


def detail_text(detail: Any) -> str:
    """The server's reason as a sentence: FastAPI's ``[{"loc": [...], "msg": ...}]`` becomes
    its messages joined by "; " (never the JSON), a string stays as it is."""
    if isinstance(detail, list) and detail and all(isinstance(d, dict) and "msg" in d for d in detail):
        return "; ".join(str(d["msg"]) for d in detail)[:600]
    if isinstance(detail, dict) and "msg" in detail:
        return str(detail["msg"])[:600]
    return str(detail)[:600]
