"""Read-API failures as sentences a person can act on.

A page never shows an HTTP status, a stack trace or a JSON body: each failure of
:class:`~inferpath.dashboard.client.ReadApiError` becomes one sentence saying what went
wrong in the reader's terms and what to do about it. Pure functions, so they are tested
without Streamlit.
"""

from __future__ import annotations

from inferpath.dashboard.client import ReadApiError

WIDEN = "Widen or move the window in the sidebar."


def explain(error: ReadApiError, *, what: str, server_url: str) -> str:
    """One sentence for ``error`` met while loading ``what`` (e.g. "the latency view").

    Unreachable server → start it; 401/403 → the token; 404 → the server lacks the route
    (an older version); 422 → the server's own reason and how to change the window; 5xx →
    the server failed, its log says why; anything else → the reason and a reload.
    """
    reason = error.detail.rstrip(". ")
    status = error.status_code
    if status is None and "unreachable" in str(error):
        return (
            f"Could not load {what}: the inferpath server at {server_url} does not answer. "
            f"Start it with `inferpath up` (or point the dashboard at it with --server-url), "
            f"then reload this page."
        )
    if status in (401, 403):
        return (
            f"Could not load {what}: the server refused the dashboard's token. Set "
            f"INFERPATH_TOKEN to the token the server was started with, then restart the "
            f"dashboard."
        )
    if status == 404:
        return (
            f"Could not load {what}: the server at {server_url} does not offer it "
            f"({reason}). Upgrade the inferpath server to the dashboard's version."
        )
    if status == 422:
        return f"Could not load {what}: {reason}. {WIDEN}"
    if status is not None and status >= 500:
        return (
            f"Could not load {what}: the server failed while answering ({reason}). Its log "
            f"says why; reload this page to try again."
        )
    return f"Could not load {what}: {reason}. Reload this page to try again."


def no_verdict(reason: str) -> str:
    """The sentence for a window the diagnosis cannot judge (HTTP 422 of ``/diagnosis``):
    the server's reason, then what to do."""
    return f"No verdict for this window: {reason.rstrip('. ')}. {WIDEN}"
