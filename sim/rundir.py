"""Atomic writers for run-directory files, and signal handling that lets them clean up.

Every file is written to a temp file in the same directory (``.NAME.XXXX.tmp``) and renamed onto
its target with :func:`os.replace`, so a run interrupted at any point leaves each file either
complete (the previous or the new version) or absent, never half-written. Signals (SIGINT, SIGTERM,
SIGHUP) are held back for the few instructions that create the temp file and rename it, and
:func:`signals_raise_interrupt` turns SIGTERM/SIGHUP into :class:`Interrupted` (a
``KeyboardInterrupt``) so the ``finally`` clauses that delete temp files run. Only SIGKILL (which no
process can catch) can leave a stray ``.tmp`` file; the complete files stay complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd

_HELD = {s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")) if s is not None}


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread when SIGTERM or SIGHUP arrives (SIGINT raises plain KeyboardInterrupt).

    Attributes:
        signum: the signal number (exit status convention: 128 + signum).
    """

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


def _raise_interrupted(signum: int, _frame: Any) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def signals_raise_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Interrupted` in the main thread (so cleanup
    code runs as for Ctrl-C); the previous handlers are restored afterwards. No-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for name in ("SIGTERM", "SIGHUP"):
        s = getattr(signal, name, None)
        if s is not None:
            previous[s] = signal.signal(s, _raise_interrupted)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back (delivered at the end of the block) in the main thread."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_path)`` then rename the temp file onto ``path``; returns ``path``.

    On any exception or interrupt the temp file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp: str | None = None
    try:
        with _signals_held():  # the temp file's name is recorded before any signal can interrupt
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.close(fd)
        write(Path(tmp))
        with _signals_held():  # renamed and forgotten together
            os.replace(tmp, path)
            tmp = None
    finally:
        if tmp is not None:
            with _signals_held():
                Path(tmp).unlink(missing_ok=True)
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
