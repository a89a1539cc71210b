"""Built plotly figures kept across reruns, keyed by the exact data they draw.

A cached rerun (every loader of :mod:`inferpath.dashboard.queries` hitting its cache) spent
most of its time rebuilding the same plotly figures: plotly validates every property in
Python, about 5-10 ms per figure on a 2-core machine, so a page with five charts could not
rerun in 150 ms (``bench/dashboard_rerun.py``). :func:`memo_figure` builds a figure once per
distinct input and hands the same object to later runs.

The key is a digest of the builder's name and the pickled arguments (the data frames and
view bodies themselves, not their source), so a figure is reused only for byte-identical
input: new data or another time zone builds a new one. ``st.plotly_chart`` copies a figure
(``Figure.to_dict()``) before sending it and never changes it; callers must not change a
returned figure either, because other sessions may hold the same object.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable
from typing import Any, TypeVar

import streamlit as st

FIGURE_CACHE_TTL_SECONDS = 10
"""Twice the data cache's 5 s TTL: every rerun that finds its data cached finds its
figures too, and an unchanged answer fetched again after the data TTL (a window in the
past) is not rebuilt; a figure of 10k points is not held much longer than its data."""
FIGURE_CACHE_MAX_ENTRIES = 32
"""Bound on kept results (one result may hold several figures): a page holds at most five
charts, so this covers six open views; the oldest go first."""

Figure = TypeVar("Figure")


def input_digest(build: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> str:
    """Hex digest (BLAKE2b, 20 bytes) of ``build``'s module and name and its pickled
    arguments. Equal digests mean byte-identical pickles, i.e. the same input; the same
    input pickled differently only costs a rebuild."""
    payload = pickle.dumps(
        (build.__module__, build.__qualname__, args, sorted(kwargs.items())), protocol=pickle.HIGHEST_PROTOCOL
    )
    return hashlib.blake2b(payload, digest_size=20).hexdigest()


@st.cache_resource(ttl=FIGURE_CACHE_TTL_SECONDS, max_entries=FIGURE_CACHE_MAX_ENTRIES, show_spinner=False)
def _built(digest: str, _build: Callable[..., Any], _args: tuple, _kwargs: dict) -> Any:
    # Arguments with a leading underscore are not hashed by Streamlit: the digest is the key.
    return _build(*_args, **_kwargs)


def memo_figure(build: Callable[..., Figure], *args: Any, **kwargs: Any) -> Figure:
    """``build(*args, **kwargs)``, built once per distinct input and shared afterwards.

    ``build`` must be a module-level function that depends only on its arguments (it is
    identified by module and qualified name); its result must be treated as read-only.
    Exceptions from ``build`` propagate and are not cached.
    """
    return _built(input_digest(build, args, kwargs), build, args, kwargs)
