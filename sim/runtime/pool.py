"""The one worker pool of ``compare`` and ``sweep``: processes that can be stopped cleanly.

Workers ignore Ctrl-C (the parent handles it) and turn SIGTERM into an interrupt that unwinds the
task they are running (its temp files and staging directories are removed; a signal that lands
while a file is being committed is held until the commit is done: ``runtime/signals.py``); an idle
worker just exits. On any error or interrupt in the parent, ``stop_pool`` cancels queued tasks,
SIGTERMs the running ones and waits ``STOP_GRACE_S`` for them in all before SIGKILL. A parent that
dies without that (SIGKILL, a crash) still takes its workers with it on Linux: each asks the kernel
for a SIGTERM when its parent exits (``prctl(PR_SET_PDEATHSIG)``), so no worker waits forever on a
task queue that its siblings keep open.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Sequence

from tlora_sim.sim.runtime.signals import interrupt_handler, redeliver_interrupts

STOP_GRACE_S = 30.0
"""How long ``stop_pool`` lets SIGTERM'd workers clean up, all of them together (s): a worker
inside a long native call (a HiGHS solve) handles the signal when the call returns."""

BROKEN = {"ok": False, "error": "BrokenProcessPool", "message": "a worker process died (killed, or out of memory)"}

_IN_TASK = False  # this worker is inside a task (signals then unwind it instead of exiting)
_PARENT = 0  # the pid of this worker's parent (0 in the parent itself)


def _worker_signal(signum: int, frame) -> None:
    if _IN_TASK:
        interrupt_handler(signum, frame)  # unwinds the task (held while a file is committed)
        return
    os._exit(128 + signum)  # idle worker: nothing to clean up, no traceback noise


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> bool:
    """Ask Linux to send this process SIGTERM when its parent exits (``prctl(2)``,
    ``PR_SET_PDEATHSIG``); a parent already gone by then is handled at once the same way.

    Args:
        parent_pid: the pid of the process that started this one.

    Returns:
        True where the request was made (Linux with a C library), False elsewhere (nothing done).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent_pid:  # the parent died before the request: nobody will signal us
        os.kill(os.getpid(), signal.SIGTERM)
    return True


def _worker_init(parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _worker_signal)
    redeliver_interrupts()  # a SIGTERM that lands in a finalizer unwinds the task, not prints
    global _PARENT
    _PARENT = parent_pid
    die_with_parent(parent_pid)


def _call(fn: Callable, args: tuple) -> Any:
    global _IN_TASK
    _IN_TASK = True
    try:
        return fn(*args)
    finally:
        _IN_TASK = False
        if _PARENT and os.getppid() != _PARENT:  # orphaned: the task has unwound, nobody reads on
            os._exit(128 + signal.SIGTERM)


def stop_pool(ex: ProcessPoolExecutor) -> None:
    """Cancel queued tasks, stop running ones with SIGTERM (they remove their temp files), wait for
    the workers: ``STOP_GRACE_S`` in all, then SIGKILL the survivors."""
    procs = list((getattr(ex, "_processes", None) or {}).values())
    ex.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()


def run_tasks(fn: Callable, tasks: Sequence[tuple], workers: int,
              on_done: Callable[[int, Any], None] | None = None, *,
              order: Callable[[int], Any] = lambda i: i) -> list:
    """Run ``fn(*task)`` for every task, in ``workers`` processes (in this process when
    ``workers <= 1`` or there is one task). ``on_done(i, result)`` is called as tasks finish (in
    ``order`` among those finishing together); a task whose worker died yields ``BROKEN``. An
    exception raised by a task, or an interrupt, stops the pool (``stop_pool``) and is raised.

    Returns:
        The results, in task order.
    """
    results: list = [None] * len(tasks)
    if workers <= 1 or len(tasks) <= 1:
        for i, t in enumerate(tasks):
            results[i] = _call(fn, t)
            if on_done:
                on_done(i, results[i])
        return results
    ex = ProcessPoolExecutor(max_workers=min(workers, len(tasks)), initializer=_worker_init,
                             initargs=(os.getpid(),))
    try:
        pending = {ex.submit(_call, fn, t): i for i, t in enumerate(tasks)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: order(pending[f])):
                i = pending.pop(fut)
                try:
                    results[i] = fut.result()
                except BrokenProcessPool:
                    results[i] = dict(BROKEN)
                if on_done:
                    on_done(i, results[i])
    except BaseException:
        stop_pool(ex)
        raise
    ex.shutdown()
    return results
