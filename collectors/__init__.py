"""inferpath.collectors: GPU and engine metrics mapped to canonical signals.

- :mod:`.catalog`: source metric names -> canonical signals, with unit conversions.
- :mod:`.prometheus`: ``scrape_samples`` turns Prometheus text into :class:`Sample` rows.
- :mod:`.scraper`: :class:`Scraper` fetches an endpoint and never raises into its caller.

``prometheus_client`` and ``httpx`` are needed (the ``collectors`` extra); importing this
package alone pulls in neither.
"""
