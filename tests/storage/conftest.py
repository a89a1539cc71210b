"""Fixtures for the storage tests: a real embedded chDB store in a temporary folder.

``store_url`` and ``shared_data`` come from the repository's ``tests/conftest.py``.
"""

from __future__ import annotations

import pytest

from inferpath.storage.store import Store

# Tests store fixed historical times; a TTL shorter than their age would drop the rows on
# insert (ClickHouse applies TTL while writing parts).
TEST_TTL_DAYS = 3650


@pytest.fixture
def ttl_days() -> int:
    return TEST_TTL_DAYS


@pytest.fixture
def store(store_url: str):
    """An open, migrated store; closed after the test (chDB: one data folder per process)."""
    opened = Store.open(store_url, ttl_days=TEST_TTL_DAYS)
    try:
        yield opened
    finally:
        opened.close()
