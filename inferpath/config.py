"""One settings object for every inferpath process, read from ``INFERPATH_*`` variables.

Every environment variable inferpath reads is named here and nowhere else. Invalid values
raise :class:`pydantic.ValidationError` at start-up, naming the variable's field; telemetry
errors at run time are logged and counted instead (see ``docs/telemetry-contract.md``).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from inferpath.vocabulary import DEFAULT_SCRAPE_SOURCE, SOURCES

ENV_STORE = "INFERPATH_STORE"
ENV_HOST = "INFERPATH_HOST"
ENV_PORT = "INFERPATH_PORT"
ENV_TOKEN = "INFERPATH_TOKEN"
ENV_DASHBOARD_PORT = "INFERPATH_DASHBOARD_PORT"
ENV_OTLP_ENDPOINT = "INFERPATH_OTLP_ENDPOINT"
ENV_SCRAPE_TARGETS = "INFERPATH_SCRAPE_TARGETS"
ENV_SCRAPE_INTERVAL_SECONDS = "INFERPATH_SCRAPE_INTERVAL_SECONDS"
ENV_ASSEMBLY_SETTLE_SECONDS = "INFERPATH_ASSEMBLY_SETTLE_SECONDS"
ENV_MAX_BODY_BYTES = "INFERPATH_MAX_BODY_BYTES"
ENV_SERVER_URL = "INFERPATH_SERVER_URL"
ENV_ALERT_RULES = "INFERPATH_ALERT_RULES"
ENV_OBJECTIVES_FILE = "INFERPATH_OBJECTIVES_FILE"
ENV_TTL_DAYS = "INFERPATH_TTL_DAYS"
ENV_MAX_INFLIGHT_REQUESTS = "INFERPATH_MAX_INFLIGHT_REQUESTS"
ENV_MAX_INFLIGHT_BYTES = "INFERPATH_MAX_INFLIGHT_BYTES"
ENV_STORE_RETRY_AFTER_SECONDS = "INFERPATH_STORE_RETRY_AFTER_SECONDS"
ENV_ROLLUP_INTERVAL_SECONDS = "INFERPATH_ROLLUP_INTERVAL_SECONDS"
ENV_ROLLUP_MIN_WINDOW_SECONDS = "INFERPATH_ROLLUP_MIN_WINDOW_SECONDS"
ENV_SPAN_LOG = "INFERPATH_SPAN_LOG"
ENV_SPAN_LOG_DIR = "INFERPATH_SPAN_LOG_DIR"
ENV_SPAN_LOG_MAX_BACKLOG_BYTES = "INFERPATH_SPAN_LOG_MAX_BACKLOG_BYTES"
ENV_BODY_READ_TIMEOUT_SECONDS = "INFERPATH_BODY_READ_TIMEOUT_SECONDS"
ENV_ENGINE_MAX_NUM_BATCHED_TOKENS = "INFERPATH_ENGINE_MAX_NUM_BATCHED_TOKENS"

_ENV_BY_FIELD = {
    "store_url": ENV_STORE,
    "host": ENV_HOST,
    "port": ENV_PORT,
    "token": ENV_TOKEN,
    "dashboard_port": ENV_DASHBOARD_PORT,
    "otlp_endpoint": ENV_OTLP_ENDPOINT,
    "scrape_targets": ENV_SCRAPE_TARGETS,
    "scrape_interval_seconds": ENV_SCRAPE_INTERVAL_SECONDS,
    "assembly_settle_seconds": ENV_ASSEMBLY_SETTLE_SECONDS,
    "max_body_bytes": ENV_MAX_BODY_BYTES,
    "server_url": ENV_SERVER_URL,
    "alert_rules": ENV_ALERT_RULES,
    "objectives_file": ENV_OBJECTIVES_FILE,
    "ttl_days": ENV_TTL_DAYS,
    "max_inflight_requests": ENV_MAX_INFLIGHT_REQUESTS,
    "max_inflight_bytes": ENV_MAX_INFLIGHT_BYTES,
    "store_retry_after_seconds": ENV_STORE_RETRY_AFTER_SECONDS,
    "rollup_interval_seconds": ENV_ROLLUP_INTERVAL_SECONDS,
    "rollup_min_window_seconds": ENV_ROLLUP_MIN_WINDOW_SECONDS,
    "span_log": ENV_SPAN_LOG,
    "span_log_dir": ENV_SPAN_LOG_DIR,
    "span_log_max_backlog_bytes": ENV_SPAN_LOG_MAX_BACKLOG_BYTES,
    "body_read_timeout_seconds": ENV_BODY_READ_TIMEOUT_SECONDS,
    "engine_max_num_batched_tokens": ENV_ENGINE_MAX_NUM_BATCHED_TOKENS,
}


def env_var_for(field: str) -> str | None:
    """The ``INFERPATH_*`` variable that sets settings field ``field`` (``None`` if none does)."""
    return _ENV_BY_FIELD.get(field)


def describe_invalid_settings(error, options: Mapping[str, str] | None = None) -> list[str]:
    """One line per error of a :class:`pydantic.ValidationError` raised by :class:`Settings`:
    where the value came from (``options``: field → the command-line flag that set it, only
    for flags the command really has; else the ``INFERPATH_*`` variable), the value, why."""
    lines = []
    for item in error.errors():
        field = str(item["loc"][0]) if item["loc"] else "?"
        sources = [s for s in ((options or {}).get(field), env_var_for(field)) if s]
        lines.append(f"{' / '.join(sources) or field} = {item.get('input')!r}: {item['msg']}")
    return lines


class ScrapeTarget(BaseModel):
    """A Prometheus-text endpoint to scrape: ``url`` (http(s) with a host) and ``source``, the
    signal-catalog entry that maps its metric names (one of the vocabulary's ``SOURCES``).

    :meth:`parse` reads the text form, for every place a person types one (``--scrape`` of
    ``inferpath up``, ``inferpath collect`` and ``python -m inferpath.server``,
    ``INFERPATH_SCRAPE_TARGETS``).
    """

    url: str
    source: Literal[SOURCES] = DEFAULT_SCRAPE_SOURCE  # type: ignore[valid-type]

    @field_validator("source", mode="before")
    @classmethod
    def _known_source(cls, value: object) -> object:
        if value not in SOURCES:
            raise ValueError(f"unknown source {value!r}, expected one of {', '.join(SOURCES)}")
        return value

    @classmethod
    def parse(cls, text: str) -> ScrapeTarget:
        """``SOURCE=URL`` (``dcgm=http://h:9400/metrics``) or a bare ``URL`` (source
        ``vllm``) → a target. Raises ``ValueError`` naming the entry and what is wrong with it
        (an unknown source, not an http(s) URL with a host)."""
        text = str(text).strip()
        source, sep, url = text.partition("=")
        data = {"source": source.strip(), "url": url} if sep and "://" not in source else {"url": text}
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            reasons = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
            raise ValueError(f"{reasons} (scrape target {text!r})") from None

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parsed = urllib.parse.urlsplit(value.strip())
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"url must be an http(s)://host[:port]/path URL, got {value!r}")
        try:
            parsed.port  # noqa: B018 - raises for a port that is not a number in 0..65535
        except ValueError as exc:
            raise ValueError(f"url {value!r}: {exc}") from None
        return value.strip()


class Settings(BaseModel):
    """Settings of the server, the CLI and the instrumentation.

    ``store_url``: ``chdb:///path`` (embedded, default: a per-user data folder) or
    ``http(s)://user@host:port/database`` for a ClickHouse server. ``None`` means the default.
    """

    store_url: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(4318, ge=0, le=65535)  # 0: any free port
    token: str | None = None
    dashboard_port: int = Field(8501, ge=1, le=65535)
    otlp_endpoint: str = "http://127.0.0.1:4318"
    server_url: str = "http://127.0.0.1:4318"
    scrape_targets: list[ScrapeTarget] = Field(default_factory=list)
    scrape_interval_seconds: float = Field(1.0, gt=0, le=3600)
    assembly_settle_seconds: float = Field(2.0, ge=0, le=3600)
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    # An OTLP export whose body has not fully arrived this long after its headers is answered
    # 408 and its in-flight slot freed: stalled uploads cannot hold max_inflight_requests.
    body_read_timeout_seconds: float = Field(30.0, gt=0, le=3600, allow_inf_nan=False)
    # Alert rules evaluated inside the server: a YAML file path, "default" (the shipped pack)
    # or None/"off" for no evaluator.
    alert_rules: str | None = None
    # YAML file of latency objectives per endpoint class (analysis/objectives.py); None: defaults.
    objectives_file: str | None = None
    # The engines' prompt-token budget per step (vLLM's --max-num-batched-tokens, which no
    # engine exports): the what-if's when a request gives none. None: vLLM's default, 2048.
    engine_max_num_batched_tokens: int | None = Field(None, ge=1, le=1_048_576)
    # Retention of every table (days); rows older than this are rejected at ingest, with a reason.
    ttl_days: int = Field(30, ge=1, le=3650)
    # Per-minute rollups of request rows (storage/rollup.py): rebuilt every interval; read for
    # latency summaries and views whose window is at least rollup_min_window_seconds long
    # (narrower windows stay exact).
    rollup_interval_seconds: float = Field(10.0, gt=0, le=3600, allow_inf_nan=False)
    rollup_min_window_seconds: float = Field(3 * 3600.0, ge=0, allow_inf_nan=False)
    ttl_days_by_table: dict[str, int] = Field(default_factory=dict)
    # Backpressure: exports in flight before the receiver answers 503 with Retry-After.
    max_inflight_requests: int = Field(64, ge=1)
    max_inflight_bytes: int = Field(256 * 1024 * 1024, ge=1024)
    store_retry_after_seconds: float = Field(1.0, gt=0, le=30)
    # Span exports are answered 200 once appended to a write-ahead log and inserted in large
    # blocks by one thread (server/span_log.py). The log lives in the chDB folder; for a
    # ClickHouse server only when span_log_dir names a folder (else each export is inserted
    # before its 200). An export that would take the un-inserted backlog past
    # span_log_max_backlog_bytes (body bytes) is answered 503 with Retry-After.
    span_log: bool = True
    span_log_dir: str | None = None
    span_log_max_backlog_bytes: int = Field(16 * 1024 * 1024, ge=64 * 1024)

    @field_validator("scrape_targets", mode="before")
    @classmethod
    def _parse_targets(cls, value: object) -> object:
        # "vllm=http://h:8000/metrics,dcgm=http://h:9400/metrics" or bare URLs (vLLM).
        if isinstance(value, str):
            return [ScrapeTarget.parse(item) for item in filter(None, (part.strip() for part in value.split(",")))]
        return value

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Build settings from ``INFERPATH_*`` variables; ``overrides`` (e.g. CLI flags) win.

        Raises ``pydantic.ValidationError`` naming the field of any invalid value.
        """
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for field, var in _ENV_BY_FIELD.items():
            if env.get(var) not in (None, ""):
                values[field] = env[var]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
