"""The inferpath dashboard: a Streamlit app reading the server's read API.

Run it with ``streamlit run dashboard/app.py -- --server-url http://127.0.0.1:4318`` or
through :func:`inferpath.dashboard.launch.launch_dashboard`. The server URL and token come
from ``--server-url``/``--token``, else ``INFERPATH_SERVER_URL``/``INFERPATH_TOKEN``.

Query parameters preselect the sidebar, so a view can be linked or bookmarked:
``?range=15m|1h|6h`` or ``?start=<ISO or unix s>&end=<...>`` (a custom range, shown in
the sidebar to the second and editable there);
``?endpoint_class=interactive``, ``?service=``, ``?model=``, ``?replica=`` (filters);
``?refresh=0`` (off) or seconds (fractions allowed from
the URL, for tests and benchmarks); ``?tz=Europe/Berlin`` (default: the browser's zone);
``?points=600`` (most points per plotted series, at most 10,000); ``?trace_id=...`` on
the Trace page.

The choices follow the user from page to page and are written back into the URL
(:mod:`inferpath.dashboard.session`); a box dragged across a time chart sets the window.

Live panels are Streamlit fragments with ``run_every``: only the panel reruns on each tick,
never the whole script, and no loop runs inside one script run. Queries are cached with a
TTL and a bound (:mod:`inferpath.dashboard.queries`).
"""

from __future__ import annotations

import argparse
import functools
import sys
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

import streamlit as st

from inferpath.config import Settings
from inferpath.dashboard import pages, session
from inferpath.dashboard.filters import Filters
from inferpath.dashboard.timerange import (
    CUSTOM,
    RANGE_KEYS,
    RANGE_LABELS,
    TimeWindow,
    parse_instant,
    resolve_window,
    step_seconds_for,
)
from inferpath.vocabulary import ENDPOINT_CLASSES as VOCABULARY_CLASSES

REFRESH_CHOICES_SECONDS = [0, 5, 15, 60]
MIN_REFRESH_SECONDS = 0.25  # from the URL only: for tests and benchmarks
ENDPOINT_CLASSES = ["all", *VOCABULARY_CLASSES]
# Filters typed in the sidebar: (query parameter, label, help). Empty means all.
FILTER_INPUTS = [
    ("service", "Service", "The service that received the requests (its service.name), e.g. gateway."),
    ("model", "Model", "The model the requests asked for (gen_ai.request.model)."),
    (
        "replica",
        "Replica",
        "The engine replica that served them (inferpath.replica, service.instance.id or host.name of the engine).",
    ),
]
# Most points per plotted series; the server downsamples to it (10,000 at most). (A bare
# string here would be drawn on the page: Streamlit's "magic" writes the main script's.)
POINTS_CHOICES = [120, 600, 2000, 5000, 10_000]


def connection_settings(argv: list[str]) -> tuple[str, str | None]:
    """Server URL and token from ``--server-url``/``--token`` in ``argv``, else the env."""
    parser = argparse.ArgumentParser(prog="inferpath-dashboard", add_help=False)
    parser.add_argument("--server-url")
    parser.add_argument("--token")
    args, _ = parser.parse_known_args(argv)
    settings = Settings.from_env(server_url=args.server_url, token=args.token)
    return settings.server_url, settings.token


@functools.cache
def known_zones() -> tuple[str, ...]:
    """Every IANA zone name this machine knows, sorted; read once per process, because
    ``available_timezones()`` walks the zoneinfo folders (5-25 ms) on every call."""
    return tuple(sorted(available_timezones()))


def valid_zone(name: str | None) -> str | None:
    """``name`` if it is an IANA time zone this machine knows, else ``None``."""
    if not name:
        return None
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None
    return name


def parse_refresh(text: str | None) -> float | None:
    """Refresh interval from the URL: 0 (off) or seconds ≥ :data:`MIN_REFRESH_SECONDS`
    and ≤ 3600; ``None`` for anything else."""
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    if value is None or not (value == 0 or MIN_REFRESH_SECONDS <= value <= 3600):
        return None
    return int(value) if value == int(value) else value


TIME_INPUT_FORMAT = "%Y-%m-%d %H:%M:%S"
# Exact times, to the second, in the chosen zone (a date-time picker holds whole minutes,
# which cannot name a 9-second incident).


def parse_wall_time(text: str, zone: ZoneInfo) -> datetime:
    """``2026-12-03 04:49:01`` (wall time in ``zone``; ``T`` separator, fractions and an
    explicit offset or ``Z`` also accepted) as an aware datetime; ``ValueError`` with a
    sentence saying how to write it."""
    cleaned = text.strip().replace("Z", "+00:00")
    try:
        value = datetime.fromisoformat(cleaned)
    except ValueError:
        raise ValueError(
            f"{text.strip()!r} is not a time: write it as YYYY-MM-DD HH:MM:SS, "
            f"e.g. {datetime.now(zone):{TIME_INPUT_FORMAT}}"
        ) from None
    return value if value.tzinfo is not None else value.replace(tzinfo=zone)


def _time_input(label: str, default: datetime, zone: ZoneInfo, *, key: str) -> datetime:
    # The default (the chosen time, or now) shown in the zone; a bad entry is named and the
    # default kept, so the page still draws.
    shown = default.astimezone(zone)
    text = st.sidebar.text_input(
        label,
        value=shown.strftime(TIME_INPUT_FORMAT)
        + (f".{shown.microsecond:06d}".rstrip("0") if shown.microsecond else ""),
        key=key,
        help="Exact to the second, in the chosen time zone.",
    )
    try:
        return parse_wall_time(text, zone)
    except ValueError as error:
        st.sidebar.warning(f"{label}: {error}")
        return default


def _choice(options: list, wanted: object, fallback: object) -> int:
    return options.index(wanted if wanted in options else fallback)


def sidebar_controls() -> dict:
    """Draw the sidebar from the session's choices (:mod:`.session`: the URL's on a first
    visit or a link, else those of the page shown before); remember what it shows. Returns
    range key, custom bounds, zone, filters, refresh and points."""
    params = session.current()
    version = session.version()  # new choices from a link or a brush: fresh widgets
    browser_zone = valid_zone(getattr(st.context, "timezone", None)) or "UTC"
    zones = list(dict.fromkeys([browser_zone, "UTC", *known_zones()]))
    requested_zone = valid_zone(params.get("tz")) or browser_zone
    st.sidebar.header("Time")
    tz = st.sidebar.selectbox("Time zone", zones, index=zones.index(requested_zone), key=f"tz_{version}")
    custom_start = custom_end = None
    default_key = params.get("range", "1h")
    try:
        if params.get("start") and params.get("end"):
            custom_start = parse_instant(params["start"], field="start")
            custom_end = parse_instant(params["end"], field="end")
            default_key = CUSTOM
    except ValueError as error:
        st.sidebar.warning(f"Ignoring the URL's time range: {error}")
    if default_key not in RANGE_KEYS:
        default_key = "1h"
    range_key = st.sidebar.radio(
        "Window",
        RANGE_KEYS,
        index=RANGE_KEYS.index(default_key),
        format_func=RANGE_LABELS.get,
        key=f"range_key_{version}",
    )
    if range_key == CUSTOM:
        zone = ZoneInfo(tz)
        now = datetime.now(timezone.utc).replace(microsecond=0)
        custom_start = _time_input(
            f"Start ({tz})", custom_start or now - timedelta(hours=1), zone, key=f"custom_start_{version}"
        )
        custom_end = _time_input(f"End ({tz})", custom_end or now, zone, key=f"custom_end_{version}")
    st.sidebar.caption("Drag across a time chart to make that span the window.")
    st.sidebar.header("Filters")
    endpoint_class = st.sidebar.selectbox(
        "Endpoint class",
        ENDPOINT_CLASSES,
        index=_choice(ENDPOINT_CLASSES, params.get("endpoint_class"), "all"),
        key=f"endpoint_class_{version}",
    )
    named = {
        name: st.sidebar.text_input(
            label, value=params.get(name, ""), placeholder="all", key=f"{name}_{version}", help=help_text
        ).strip()
        or None
        for name, label, help_text in FILTER_INPUTS
    }
    st.sidebar.header("Display")
    url_refresh = parse_refresh(params.get("refresh"))
    refresh_choices = sorted({*REFRESH_CHOICES_SECONDS, *([url_refresh] if url_refresh is not None else [])})
    refresh_seconds = st.sidebar.selectbox(
        "Live refresh",
        refresh_choices,
        index=refresh_choices.index(url_refresh if url_refresh is not None else 15),
        format_func=lambda s: "off" if s == 0 else f"every {s} s",
        key=f"refresh_seconds_{version}",
    )
    try:
        url_points = int(params.get("points", 600))
    except ValueError:
        url_points = 600
    points_choices = sorted({*POINTS_CHOICES, min(max(url_points, 10), POINTS_CHOICES[-1])})
    max_points = st.sidebar.selectbox(
        "Points per series",
        points_choices,
        index=points_choices.index(min(max(url_points, 10), POINTS_CHOICES[-1])),
        key=f"points_{version}",
    )
    filters = Filters(endpoint_class=None if endpoint_class == "all" else endpoint_class, **named)
    custom = range_key == CUSTOM
    session.remember(
        {
            "range": None if custom else range_key,
            "start": session.iso_utc(custom_start) if custom and custom_start else None,
            "end": session.iso_utc(custom_end) if custom and custom_end else None,
            "tz": tz,
            "refresh": str(refresh_seconds),
            "points": str(max_points),
            **filters.as_params(),
        }
    )
    return {
        "range_key": range_key,
        "custom_start": custom_start,
        "custom_end": custom_end,
        "filters": filters,
        "refresh_seconds": refresh_seconds,
        "tz": tz,
        "max_points": max_points,
    }


def current_window(controls: dict) -> TimeWindow | None:
    """The window to query now at the chosen resolution, or ``None`` after showing why the
    custom range is invalid."""
    try:
        window = resolve_window(
            controls["range_key"],
            now=datetime.now(timezone.utc),
            custom_start=controls["custom_start"],
            custom_end=controls["custom_end"],
        )
    except ValueError as error:
        st.warning(f"Invalid time range: {error}")
        return None
    step = step_seconds_for(window.duration_seconds, target_buckets=controls["max_points"])
    return TimeWindow(window.start, window.end, step)


def run_live(panel, server_url: str, token: str | None, controls: dict) -> None:
    """Run ``panel`` as a fragment that reruns alone every ``refresh_seconds`` (0 = once).

    The window is resolved inside the fragment, so a relative range moves with the clock.
    """

    def body() -> None:
        window = current_window(controls)
        if window is None:
            return
        panel(pages.Context(server_url, token, window, controls["tz"], controls["filters"], controls["max_points"]))

    st.fragment(body, run_every=controls["refresh_seconds"] or None)()


def main() -> None:
    """Configure the page, resolve the server, and run the selected page."""
    st.set_page_config(page_title="inferpath", layout="wide")
    server_url, token = connection_settings(sys.argv[1:])

    def live_page(title: str, panel):
        def page() -> None:
            st.title(title)
            run_live(panel, server_url, token, sidebar_controls())

        return page

    def trace_page() -> None:
        st.title("Trace")
        controls = sidebar_controls()
        pages.trace_page(server_url, token, controls["tz"])

    page = st.navigation(
        [
            st.Page(live_page("Overview", pages.overview_panels), title="Overview", default=True),
            st.Page(live_page("Correlate", pages.correlate_panels), title="Correlate", url_path="correlate"),
            st.Page(live_page("Breakdown", pages.breakdown_panels), title="Breakdown", url_path="breakdown"),
            st.Page(
                live_page("Slowest requests", pages.requests_panels), title="Slowest requests", url_path="requests"
            ),
            st.Page(trace_page, title="Trace", url_path="trace"),
            st.Page(live_page("GPUs and engines", pages.fleet_panels), title="GPUs and engines", url_path="gpus"),
            st.Page(live_page("Diagnosis", pages.diagnosis_panels), title="Diagnosis", url_path="diagnosis"),
            st.Page(live_page("Alerts", pages.alerts_panels), title="Alerts", url_path="alerts"),
            st.Page(live_page("What-if", pages.whatif_panels), title="What-if", url_path="whatif"),
        ]
    )
    st.sidebar.caption(f"server: {server_url}")
    page.run()


# Streamlit runs the script as __main__; importing the module draws nothing.
if __name__ == "__main__":
    main()
