"""Scratch folders of the benchmarks: a store and span log per run take 1-10 GB."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["scratch_folder"]


@contextmanager
def scratch_folder(workdir: str | None, prefix: str) -> Iterator[Path]:
    """``workdir`` as it is (kept, so a filled store can be measured again), or a new
    temporary folder named ``prefix…``, removed afterwards."""
    if workdir is not None:
        yield Path(workdir)
        return
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
