"""`inferpath demo` keeps its requests in a demo store of its own, says where it is and how
to open it again; the user's default store (what `inferpath up` serves) and the store named
by INFERPATH_STORE stay untouched; `--store` still chooses."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferpath.cli import app

pytestmark = pytest.mark.e2e


def test_demo_writes_its_own_store_and_says_how_to_open_it(tmp_path: Path) -> None:
    real_store = tmp_path / "production"
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "INFERPATH_STORE": f"chdb://{real_store}", "COLUMNS": "300"}
    result = CliRunner().invoke(app, ["demo", "--exit", "--requests", "3", "--speed", "100", "--port", "0"], env=env)
    assert result.exit_code == 0, result.output
    demo_store = tmp_path / "data" / "inferpath" / "demo-store"
    assert demo_store.is_dir()
    assert not (tmp_path / "data" / "inferpath" / "store").exists() and not real_store.exists()
    flat = " ".join(result.output.split())
    assert (
        f"store: chdb://{demo_store} (the demo's own; open it again with `inferpath up --store chdb://{demo_store}`)"
        in flat
    ), result.output
    # The what-if of the window names the engine's token budget, which a server opened on the
    # store later does not know (its replay would assume vLLM's 2048 and be refused).
    assert "--replicas 2 --max-num-batched-tokens 8192 --store" in flat, result.output
