"""``import inferpath`` stays light: no storage engine, dashboard or demo dependency is imported."""

from __future__ import annotations

import subprocess
import sys


def test_import_inferpath_pulls_in_no_heavy_dependency() -> None:
    code = (
        "import sys, inferpath; heavy = {'chdb', 'clickhouse_connect', 'streamlit', 'plotly', 'pandas', "
        "'tokenizers', 'bm25s', 'fastapi', 'uvicorn'}; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    # The public API resolves lazily.
    api = subprocess.run(
        [sys.executable, "-c", "import inferpath; print(callable(inferpath.instrument), callable(inferpath.stage))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert api.strip() == "True True"
