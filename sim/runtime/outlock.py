"""One owner per output directory: an exclusive ``filelock`` lock, and the sweep's own lock.

A run (``replay``, ``compare``, ``sweep``, ``execute``, ``validate-run``) takes an exclusive lock
on its output directory from the moment it checks that the directory may receive a run until the
finished directory has been swapped in (``report.rundir.check_out_dir`` acquires it,
``report.rundir.staged_dir`` releases it after the swap). The lock is a ``filelock.FileLock`` (an
``flock(2)`` on ``PARENT/.NAME.lock``, a sibling, so the lock survives the swap of the directory
itself; it is unlinked while still held, then released, and ``filelock`` makes a peer that
opened the unlinked file meanwhile retry on a fresh one). A second run into
the same ``--out`` fails at once (no waiting) with one line naming the directory. The kernel drops
the lock when the process ends, SIGKILL included, so a stale lock file never blocks a later run.
Within one process the lock is re-entrant (a comparison's nested seed directories, a retry in the
same interpreter).

A sweep also holds :class:`SweepLock` (``DIR/.sweep.lock``, another ``filelock.FileLock``) while
it runs, which no second sweep in the same process can take either.
"""

from __future__ import annotations

import os
from pathlib import Path

from tlora_sim.traces.errors import InputError

_HELD: dict[str, object] = {}  # resolved out path -> its held filelock.FileLock (this process)


def lock_path(out: str | Path) -> Path:
    """The lock file of output directory ``out``: ``PARENT/.NAME.lock`` (a hidden sibling)."""
    out = Path(out).resolve()
    return out.parent / f".{out.name}.lock"


def acquire_out_lock(out: str | Path) -> None:
    """Take the exclusive lock of ``out`` for this process (no-op when this process holds it).

    Raises:
        InputError: another process holds it ("another run is writing"), or the lock file cannot
            be created in the parent directory (the parent is not writable: read-only file system,
            permissions, a directory like ``/proc``), both naming the path.
    """
    from filelock import FileLock, Timeout

    key = str(Path(out).resolve())
    if key in _HELD:
        return
    path = lock_path(out)
    try:  # a real write probe of the parent (os.access says yes to root on /proc and read-only mounts)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o666))
    except OSError as e:
        raise InputError(f"cannot write in the parent directory ({e.strerror or type(e).__name__})",
                         file=str(path.parent), field="--out") from None
    lock = FileLock(str(path), timeout=0, thread_local=False)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        raise InputError("another run is writing this directory now (it holds the lock "
                         f"{path}); wait for it to finish or choose another --out", file=str(out),
                         field="--out") from None
    except OSError as e:
        raise InputError(f"cannot write in the parent directory ({e.strerror or type(e).__name__})",
                         file=str(path.parent), field="--out") from None
    _HELD[key] = lock


def release_out_lock(out: str | Path) -> None:
    """Release the lock of ``out`` if this process holds it, removing the lock file first (while
    still held, so a peer that opened it meanwhile retries on a fresh file: ``filelock`` checks)."""
    lock = _HELD.pop(str(Path(out).resolve()), None)
    if lock is not None:
        try:  # unlinked while still held: a peer that opened it meanwhile sees it gone and retries
            os.unlink(lock.lock_file)
        except OSError:
            pass
        try:
            lock.release(force=True)
        except OSError:  # the parent vanished or went read-only: the kernel drops the lock with the fd
            pass


def release_all_out_locks() -> None:
    """Release every output-directory lock this process holds (the CLI's last step, so a run that
    failed between its check and its swap leaves no lock file behind)."""
    for key in list(_HELD):
        release_out_lock(key)


def holds_out_lock(out: str | Path) -> bool:
    """True while this process holds the lock of ``out``."""
    return str(Path(out).resolve()) in _HELD


def held_out_locks() -> tuple[str, ...]:
    """The output directories (resolved paths, in the order taken) whose lock this process holds
    now; empty once every run has swapped its directory in or failed (``release_all_out_locks``)."""
    return tuple(_HELD)


class SweepLock:
    """Context manager: the lock of a sweep's directory ``out`` for the duration of a sweep: the
    output-directory lock (:func:`acquire_out_lock`, so no ``replay --force`` swaps ``out`` while
    the sweep runs; kept when this process held it already) and an exclusive ``filelock.FileLock``
    on ``out/.sweep.lock`` (taken without waiting; a second ``SweepLock`` on ``out`` fails even in
    the same process).

    Args:
        out: the sweep's directory (created when missing).

    Raises:
        InputError: (on entry) another run or sweep holds ``out``, or the lock file cannot be
            written, naming the path.
    """

    def __init__(self, out: str | Path) -> None:
        self.path = Path(out) / ".sweep.lock"
        self.lock = None
        self.took = False

    def __enter__(self) -> "SweepLock":
        from filelock import FileLock, Timeout

        out = self.path.parent
        self.took = not holds_out_lock(out)
        acquire_out_lock(out)
        lock = FileLock(str(self.path), timeout=0, thread_local=False)
        try:
            out.mkdir(parents=True, exist_ok=True)
            lock.acquire(blocking=False)
        except Timeout:
            self._release_out()
            raise InputError("another sweep is running in this directory", file=str(out)) from None
        except OSError as e:
            self._release_out()
            raise InputError(f"cannot write the sweep's lock file ({e.strerror or type(e).__name__})",
                             file=str(self.path), field="--out") from None
        self.lock = lock
        return self

    def __exit__(self, *exc) -> None:
        if self.lock is not None:
            try:
                self.lock.release(force=True)
            except OSError:  # the directory vanished: the kernel drops the lock with the fd
                pass
            self.lock = None
        self._release_out()

    def _release_out(self) -> None:
        if self.took:
            release_out_lock(self.path.parent)
            self.took = False
