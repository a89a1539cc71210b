"""Shared fixtures: where the recorded real-world data lives, a fresh embedded store."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The folder of recorded third-party inputs (``../shared/data`` beside the repository)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"recorded data folder {SHARED_DATA} is not present")
    return SHARED_DATA


@pytest.fixture()
def store_url(tmp_path: Path) -> str:
    """An embedded chDB store in a fresh temporary folder."""
    return f"chdb://{tmp_path / 'store'}"
