"""The choices that follow a user from page to page: window, time zone, filters, refresh.

Streamlit drops the URL's query parameters when the sidebar switches pages, and a widget's
state belongs to the page that drew it, so a window picked on the Overview was gone on
Correlate. The choices therefore live in ``st.session_state`` as the query parameters that
would select them (``{"start": ..., "end": ..., "endpoint_class": "bulk"}``): the sidebar
reads its defaults from :func:`current`, and :func:`remember` stores what it shows and
writes it into the URL, so a reload or a copied link opens the same view. A URL that
differs from the one last written (a link opened, an address typed) replaces the choices.

When the choices change from outside the sidebar (a link, or a box selected on a time
chart: :func:`choose_window`), :func:`version` changes; the sidebar's widget keys carry it,
so fresh widgets start from the new choices instead of keeping their old values.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone

import streamlit as st

URL_NAMES = ("range", "start", "end", "tz", "endpoint_class", "service", "model", "replica", "refresh", "points")
"""Query parameters that hold a choice of the sidebar (``trace_id`` is the Trace page's own)."""
_CHOICES = "inferpath_choices"
_WRITTEN = "inferpath_url_written"
_VERSION = "inferpath_choices_version"


def _url() -> dict[str, str]:
    return {name: st.query_params[name] for name in URL_NAMES if st.query_params.get(name)}


def current() -> dict[str, str]:
    """The choices as query parameters: the URL's when it names any and differs from what
    this session last wrote (or on a first run), else those remembered from the last run."""
    url, stored = _url(), st.session_state.get(_CHOICES)
    if stored is None or (url and url != st.session_state.get(_WRITTEN)):
        _replace(url)
        return url
    return dict(stored)


def version() -> int:
    """Changes whenever the choices are replaced from outside the sidebar's widgets."""
    return st.session_state.get(_VERSION, 0)


def remember(choices: Mapping[str, str | None]) -> None:
    """Store ``choices`` (query parameters; ``None`` or empty: not set) as what the sidebar
    shows and write them into the URL."""
    kept = {name: str(value) for name, value in choices.items() if name in URL_NAMES and value}
    st.session_state[_CHOICES] = kept
    for name in URL_NAMES:
        if name in kept and st.query_params.get(name) != kept[name]:
            st.query_params[name] = kept[name]
        elif name not in kept and name in st.query_params:
            del st.query_params[name]
    st.session_state[_WRITTEN] = kept


def choose_window(start: datetime, end: datetime) -> None:
    """Make ``[start, end)`` (aware) the window of every page, as a custom range."""
    choices = {name: value for name, value in current().items() if name not in ("range", "start", "end")}
    _replace({**choices, "start": iso_utc(start), "end": iso_utc(end)})


def iso_utc(instant: datetime) -> str:
    """``2026-12-03T06:50:00Z``: an aware instant as the URL carries it (fractions kept)."""
    return instant.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _replace(choices: dict[str, str]) -> None:
    st.session_state[_CHOICES] = choices
    st.session_state[_VERSION] = version() + 1


__all__ = ["URL_NAMES", "choose_window", "current", "iso_utc", "remember", "version"]
