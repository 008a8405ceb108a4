"""Signals as exceptions: SIGINT, SIGTERM and SIGHUP unwind the main thread, held during commits.

Within :func:`signals_raise_interrupt` (the CLI runs inside it) SIGINT, SIGTERM and SIGHUP raise
:class:`Interrupted` (a ``KeyboardInterrupt``) in the main thread, so the ``finally`` clauses that
delete temp files run; a signal that arrives inside :func:`signals_held` (a temp file being
created or renamed: ``runtime.atomic``) is held until that step is done (Python-level, so it works
whatever thread the OS delivers the signal to). An :class:`Interrupted` that lands inside a
finalizer (a weakref callback or ``__del__``, where Python can only print and drop an exception)
is raised again at the next line of ordinary code instead (:func:`redeliver_interrupts`, through
``sys.settrace``), so it unwinds that code. Exit status convention: 128 + the signal number.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Any, Callable, Iterator

_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in ("SIGINT", "SIGTERM", "SIGHUP")) if s is not None)
_hold = {"depth": 0, "pending": None}  # main thread only


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread when SIGINT, SIGTERM or SIGHUP arrives (inside :func:`signals_raise_interrupt`).

    Attributes:
        signum: the signal number (exit status convention: 128 + signum).
    """

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(f"interrupted by {signal.Signals(signum).name}")


def interrupt_handler(signum: int, _frame: Any = None) -> None:
    """Signal handler: raise :class:`Interrupted`, or remember the signal while a write is being
    committed (it is raised when the commit is done)."""
    if _hold["depth"]:
        if _hold["pending"] is None:
            _hold["pending"] = signum
        return
    raise Interrupted(signum)


_redelivery: dict[str, Any] = {"signum": None, "frames": []}  # main thread only


def _redeliver_unraisable(hook_args) -> None:
    """``sys.unraisablehook`` installed by :func:`redeliver_interrupts`: an :class:`Interrupted`
    raised where Python cannot propagate it (a finalizer) is raised again by a trace function at
    the next line of ordinary code (the frames below this hook, or any frame entered later), in
    the same thread and with no timing involved; anything else goes to the hook that was there
    before. (Session 2 signalled again from a thread a millisecond later; under load that signal
    could land inside this hook, where it was dropped too.)"""
    if not isinstance(hook_args.exc_value, Interrupted):
        _redeliver_unraisable.previous(hook_args)
        return
    _redelivery["signum"] = hook_args.exc_value.signum
    frame = sys._getframe(1)
    while frame is not None:
        frame.f_trace = _raise_pending
        _redelivery["frames"].append(frame)
        frame = frame.f_back
    sys.settrace(_raise_pending)


_redeliver_unraisable.previous = sys.unraisablehook


def _raise_pending(frame: Any, _event: str, _arg: Any) -> Any:
    """Trace function armed by :func:`_redeliver_unraisable`: raises the dropped
    :class:`Interrupted` in ``frame``, or holds it like a signal while a write is being committed.
    Python unsets the trace function when one raises, so a tracer installed before (a debugger,
    coverage) is off from then on; the process is being interrupted anyway."""
    signum = _redelivery["signum"]
    if signum is None:
        return None
    if frame.f_code is _redeliver_unraisable.__code__:
        return _raise_pending  # still inside the hook: the next frame is ordinary code
    for armed in _redelivery["frames"]:
        armed.f_trace = None
    _redelivery.update(signum=None, frames=[])
    sys.settrace(None)  # also when the interrupt is held (nothing raises here then)
    interrupt_handler(signum)  # raises, or is held until the commit is done
    return None


def redeliver_interrupts() -> Callable[[], None]:
    """Install :func:`_redeliver_unraisable` as ``sys.unraisablehook``; returns a function that
    puts the previous hook back. Without it, a signal handled while a weakref callback or
    ``__del__`` runs prints "Exception ignored ... Interrupted" and the interrupt is lost."""
    previous = sys.unraisablehook
    if previous is not _redeliver_unraisable:
        _redeliver_unraisable.previous = previous
        sys.unraisablehook = _redeliver_unraisable

    def restore() -> None:
        sys.unraisablehook = previous

    return restore


@contextlib.contextmanager
def signals_raise_interrupt() -> Iterator[None]:
    """Within the block, SIGINT/SIGTERM/SIGHUP raise :class:`Interrupted` in the main thread (so cleanup
    code runs) and are held during atomic commits; the previous handlers are restored afterwards.
    No-op off the main thread (Python runs signal handlers only there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, interrupt_handler) for s in _SIGNALS}
    restore_hook = redeliver_interrupts()
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        restore_hook()


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Defer :func:`interrupt_handler` to the end of the block (main thread; a no-op elsewhere): an
    atomic commit (a temp file created and recorded, a rename and its bookkeeping) is not cut in
    the middle; a signal that arrived meanwhile raises :class:`Interrupted` when the block ends.
    Re-entrant (a depth count)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _hold["depth"] += 1
    try:
        yield
    finally:
        _hold["depth"] -= 1
        if not _hold["depth"] and _hold["pending"] is not None:
            signum, _hold["pending"] = _hold["pending"], None
            raise Interrupted(signum)
