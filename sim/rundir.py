"""Atomic writers for run-directory files: a temp file in the same directory, then rename.

A run interrupted at any point leaves each file either complete (old or new) or absent.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import pandas as pd


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_path)`` then rename the temp file onto ``path``; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented, key-sorted JSON (deterministic bytes)."""
    text = json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n"
    return atomic_write(path, lambda p: p.write_text(text))


def write_csv(path: str | Path, df: pd.DataFrame) -> Path:
    """Write ``df`` as CSV without the index."""
    return atomic_write(path, lambda p: df.to_csv(p, index=False))


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
