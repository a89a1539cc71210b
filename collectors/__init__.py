"""inferpath.collectors: GPU and engine metrics mapped to canonical signals.

- :mod:`.catalog`: source metric names -> canonical signals, units and combination rules.
- :mod:`.prometheus` / :mod:`.combine` / :mod:`.pipeline`: one scrape -> combined samples.
- :mod:`.scraper`: :class:`Scraper` fetches an endpoint and never raises into its caller.
- :mod:`.nvml`: the NVML poller (nvidia-ml-py imported lazily).
- :mod:`.agent` / :mod:`.cli`: the ``inferpath collect`` agent pushing OTLP metrics.
- :mod:`.recording`: a recorded incident posted to a server (``inferpath import``).

``prometheus_client`` and ``nvidia-ml-py`` come with the ``collectors`` extra; importing this
package alone pulls in neither.
"""
