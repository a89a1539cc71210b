"""Fixtures of the alert tests: a real embedded chDB store, rule files, a capturing receiver."""

from __future__ import annotations

import pytest
from alert_receiver import Captured, receiver_app

from inferpath.storage.store import Store


@pytest.fixture
def store(store_url: str):
    """An open, migrated store (long TTL: simulated times lie in the past); closed after."""
    opened = Store.open(store_url, ttl_days=3650)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def receiver(serve_app):
    """A running receiver on 127.0.0.1: yields ``(base_url, Captured)``."""
    captured = Captured()
    with serve_app(receiver_app(captured)) as url:
        yield url, captured
