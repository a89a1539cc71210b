"""inferpath.alerts: alert rules in YAML, an evaluator with Prometheus semantics, notifiers.

- :mod:`~inferpath.alerts.rules`: rule-file models and the loader (errors name file, line, field).
- :mod:`~inferpath.alerts.queries`: the parameterized SQL behind each rule kind.
- :mod:`~inferpath.alerts.state`: pending → firing → resolved, ``for``, ``keep_firing_for``.
- :mod:`~inferpath.alerts.evaluator`: the evaluation loop, notifications, back-tests.
- :mod:`~inferpath.alerts.history`: state changes in ``inferpath_alerts``; restore after restart.
- :mod:`~inferpath.alerts.notifiers`: Alertmanager API v2, generic webhook, log.
- :mod:`~inferpath.alerts.service`: the evaluator as a service the server runs (handed in by
  ``inferpath/serve.py``); :mod:`~inferpath.alerts.cli`: ``inferpath alerts`` (through the read API).
"""
