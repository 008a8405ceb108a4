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


@contextlib.contextmanager
def frozen_before() -> Iterator[None]:
    """Every object that exists when the block starts is left out of collections inside it
    (``gc.freeze``; they are collected as usual again after it). Objects made inside the block
    are collected as usual. A no-op where something else already froze objects (``gc.freeze``
    before a fork): that set is left as it is."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
