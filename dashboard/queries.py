"""Cached read-API queries of the dashboard.

Every loader is ``st.cache_data`` with a TTL (:data:`CACHE_TTL_SECONDS`) and a bound on
entries (:data:`CACHE_MAX_ENTRIES`): its arguments (server, token, window, filters) are
the key, so several open tabs or a fast live refresh cost the server one query per window
and interval, and memory stays bounded however long the dashboard runs. Errors raise
:class:`~inferpath.dashboard.client.ReadApiError` and are not cached.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import pandas as pd
import streamlit as st
from streamlit.runtime.scriptrunner import add_script_run_ctx

from inferpath.dashboard.client import ReadApiClient, ReadApiError

CACHE_TTL_SECONDS = 5
CACHE_MAX_ENTRIES = 256
TRACE_CACHE_TTL_SECONDS = 60
"""A stored trace changes only while late spans arrive; a minute is fresh enough."""


def _client(server_url: str, token: str | None) -> ReadApiClient:
    return ReadApiClient(server_url, token=token)


@st.cache_data(ttl=CACHE_TTL_SECONDS, max_entries=CACHE_MAX_ENTRIES, show_spinner=False)
def load_summary(
    server_url: str, token: str | None, start: datetime, end: datetime, filters: tuple[tuple[str, str], ...] = ()
) -> pd.DataFrame:
    """``/summary`` over the window (see :meth:`ReadApiClient.summary`); ``filters`` as
    sorted pairs of query parameters the route takes."""
    with _client(server_url, token) as client:
        return client.summary(start, end, filters=dict(filters))


@st.cache_data(ttl=CACHE_TTL_SECONDS, max_entries=CACHE_MAX_ENTRIES, show_spinner=False)
def load_gauge(
    server_url: str, token: str | None, metric: str, start: datetime, end: datetime, step_seconds: int
) -> pd.DataFrame:
    """``/timeseries/gauge`` of one canonical ``metric`` over the window."""
    with _client(server_url, token) as client:
        return client.gauge_timeseries(metric, start, end, step_seconds=step_seconds)


@st.cache_data(ttl=CACHE_TTL_SECONDS, max_entries=CACHE_MAX_ENTRIES, show_spinner=False)
def load_requests(
    server_url: str,
    token: str | None,
    start: datetime,
    end: datetime,
    limit: int,
    filters: tuple[tuple[str, str], ...] = (),
) -> pd.DataFrame:
    """The ``limit`` slowest requests of the window; ``filters`` as in :func:`load_summary`."""
    with _client(server_url, token) as client:
        return client.requests(start, end, limit=limit, order="slowest", filters=dict(filters))


@st.cache_data(ttl=CACHE_TTL_SECONDS, max_entries=CACHE_MAX_ENTRIES, show_spinner=False)
def load_view(
    server_url: str,
    token: str | None,
    name: str,
    start: datetime,
    end: datetime,
    params: tuple[tuple[str, Any], ...] = (),
) -> dict[str, Any]:
    """``/views/{name}`` over the window; ``params`` as sorted pairs (hashable cache key)."""
    with _client(server_url, token) as client:
        return client.view(name, start, end, **dict(params))  # type: ignore[arg-type]


@st.cache_data(ttl=TRACE_CACHE_TTL_SECONDS, max_entries=CACHE_MAX_ENTRIES, show_spinner=False)
def load_trace(server_url: str, token: str | None, trace_id: str) -> pd.DataFrame:
    """Spans of one trace."""
    with _client(server_url, token) as client:
        return client.trace(trace_id)


NO_VERDICT_KEY = "no_verdict"
"""Key of :func:`load_diagnosis`'s answer when the server has no verdict (HTTP 422)."""


@st.cache_data(ttl=CACHE_TTL_SECONDS, max_entries=CACHE_MAX_ENTRIES, show_spinner=False)
def load_diagnosis(
    server_url: str, token: str | None, start: datetime, end: datetime, filters: tuple[tuple[str, str], ...] = ()
) -> dict[str, Any]:
    """The verdict for the window against the latency objectives (``filters``: sorted pairs
    of the query parameters the route takes).

    HTTP 422 (too few requests in a window) is an answer, not a failure: it comes back as
    ``{NO_VERDICT_KEY: reason}`` (the server's sentence, never its JSON) and is cached like
    a verdict, so a window without one does not ask the server again on every rerun. Other
    failures raise ``ReadApiError``.
    """
    with _client(server_url, token) as client:
        try:
            return client.diagnosis(start, end, filters=dict(filters))
        except ReadApiError as error:
            if error.status_code == 422:
                return {NO_VERDICT_KEY: error.detail}
            raise


OBJECTIVES_TTL_SECONDS = 60
"""The objectives change only when the server restarts with another file."""


@st.cache_data(ttl=OBJECTIVES_TTL_SECONDS, max_entries=16, show_spinner=False)
def load_objectives(server_url: str, token: str | None) -> dict[str, Any] | None:
    """The server's latency objectives per class, ``None`` from a server without the route."""
    with _client(server_url, token) as client:
        return client.objectives()


@st.cache_data(ttl=CACHE_TTL_SECONDS, max_entries=CACHE_MAX_ENTRIES, show_spinner=False)
def load_alerts(
    server_url: str, token: str | None, start: datetime | None = None, end: datetime | None = None
) -> Any | None:
    """``/alerts`` for the window as sent, ``None`` when the server has no alerts route."""
    with _client(server_url, token) as client:
        return client.alerts(start, end)


def load_all(loads: Sequence[tuple[Callable[..., Any], tuple]]) -> list[Any]:
    """Call every ``(loader, args)`` at once, one thread each, and return their results in
    order; a call that raised :class:`ReadApiError` gives that error in its place (other
    exceptions propagate).

    A page's reads are independent questions to the server; asked one after the other, a
    first visit of the Overview waited for the sum of seven round trips. Each thread
    carries this script run's context, as Streamlit asks of threads that use its caches;
    a call that hits its cache returns at once.
    """
    results: list[Any] = [None] * len(loads)
    failures: list[BaseException | None] = [None] * len(loads)

    def call(index: int, loader: Callable[..., Any], args: tuple) -> None:
        try:
            results[index] = loader(*args)
        except ReadApiError as error:
            results[index] = error
        except BaseException as error:  # noqa: BLE001 - re-raised in the script's thread
            failures[index] = error

    threads = [
        add_script_run_ctx(
            threading.Thread(target=call, args=(index, loader, args), name=f"inferpath-read-{index}", daemon=True)
        )
        for index, (loader, args) in enumerate(loads)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for failure in failures:
        if failure is not None:
            raise failure
    return results


def answer(result: Any) -> Any:
    """``result`` of :func:`load_all`, raising it when it is a :class:`ReadApiError`."""
    if isinstance(result, ReadApiError):
        raise result
    return result


WHATIF_TTL_SECONDS = 60
"""A prediction replays the whole window through the engine model (seconds of CPU): kept a
minute, as the same link is opened again."""
WHATIF_TIMEOUT_SECONDS = 120.0


@st.cache_data(ttl=WHATIF_TTL_SECONDS, max_entries=32, show_spinner=False)
def load_whatif(
    server_url: str, token: str | None, start: datetime, end: datetime, change: tuple[tuple[str, str], ...]
) -> dict[str, Any]:
    """``/whatif`` for the window under ``change`` (sorted query parameters; empty: the
    observed configuration replayed, which names the calibrated replicas)."""
    with ReadApiClient(server_url, token=token, timeout_seconds=WHATIF_TIMEOUT_SECONDS) as client:
        return client.whatif(start, end, **dict(change))
