"""Keeping CPython's cyclic garbage collector off the simulation's long-lived objects (issue 20).

A replay of a million jobs holds millions of objects for its whole length (jobs, their records),
none in a reference cycle. Each full collection walks all of them, and making them in a row
triggers several (about 5% of a 1M-job replay's CPU). Objects freed by reference counting are
unaffected: both scopes below only skip cycle searches.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def no_collections() -> Iterator[None]:
    """No collection inside the block (for making many objects that hold no cycles); the
    collector's previous on/off state comes back after it."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


FULL_EVERY = 100
"""Inside ``frozen_before``, a full collection waits for at least this many collections of the
middle generation (CPython's third threshold, default 10). After ``gc.freeze`` the survivors of
the next full collection are few, and CPython runs a full collection once the objects promoted
since exceed a quarter of them, so without this full collections came every 10 middle ones: on
the merged ITP trace (142x8xH100) ``mlora``'s decisions that placed no job took 0.108 ms at
1,000-9,999 waiting against 0.020 at 10-99 (wall; 0.025 / 0.024 without the freeze, 0.019 /
0.022 with this), the pauses landing in whichever decision allocated (session 19)."""


@contextlib.contextmanager
def frozen_before() -> Iterator[None]:
    """Every object that exists when the block starts is left out of collections inside it
    (``gc.freeze``; they are collected as usual again after it), and full collections are
    rarer inside it (``FULL_EVERY``). Objects made inside the block are collected as usual. A
    no-op where something else already froze objects (``gc.freeze`` before a fork): that set
    is left as it is."""
    if gc.get_freeze_count():
        yield
        return
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], max(thresholds[2], FULL_EVERY))
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
