"""Process concerns of writing a run directory: one owner per output directory, and write errors
as one line.

**One owner.** A run (``replay``, ``compare``, ``sweep``, ``execute``, ``validate-run``) takes an
exclusive lock on its output directory from the moment it checks that the directory may receive a
run until the finished directory has been swapped in (``rundir.check_out_dir`` acquires it,
``rundir.staged_dir`` releases it after the swap). The lock is a ``filelock.FileLock`` (an
``flock(2)`` on ``PARENT/.NAME.lock``, a sibling, so the lock survives the swap of the directory
itself; it is unlinked while still held, then released, and ``filelock`` makes a peer that
opened the unlinked file meanwhile retry on a fresh one). A second run into
the same ``--out`` fails at once (no waiting) with one line naming the directory. The kernel drops
the lock when the process ends, SIGKILL included, so a stale lock file never blocks a later run.
Within one process the lock is re-entrant (a comparison's nested seed directories, a retry in the
same interpreter).

**Write errors.** :func:`write_error` turns an ``OSError`` raised while writing (no space left,
read-only file system, permission denied, quota, ...) into an ``InputError`` naming the path, so
every command prints one line and exits with status 2; the staging directory is removed by
``staged_dir`` and the previous run at ``--out`` stays as it was.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from tlora_sim.traces.errors import InputError

_HELD: dict[str, object] = {}  # resolved out path -> its held filelock.FileLock (this process)

WRITE_ERRNOS = frozenset(getattr(errno, n) for n in ("ENOSPC", "EROFS", "EACCES", "EPERM", "EDQUOT", "EFBIG")
                         if hasattr(errno, n))
"""``errno`` values of a failed write that are the disk's or the file system's, not the simulator's
(no space, read-only, permissions, quota, file too large): the CLI reports an ``OSError`` with one
of them, raised outside a staged directory, as one line."""


class WriteError(InputError, OSError):
    """An output that cannot be written: an ``InputError`` (one line naming the path, exit status
    2) that is also an ``OSError`` (callers catching ``OSError`` around a write still catch it).

    Attributes:
        errno, strerror: those of the ``OSError`` that caused it (``errno`` may be None).
    """


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


def is_write_error(e: BaseException) -> bool:
    """True for an ``OSError`` whose ``errno`` is one of :data:`WRITE_ERRNOS`."""
    return isinstance(e, OSError) and getattr(e, "errno", None) in WRITE_ERRNOS


def write_error(e: OSError, path: str | Path | None = None) -> WriteError:
    """The one-line ``InputError`` for a failed write: the path (``path`` when given: the file
    being written, not its temp file; else ``e.filename``) and the OS's reason, e.g.
    ``/data/out/jobs.csv, field '--out': cannot write (No space left on device); ...``."""
    where = path if path is not None else getattr(e, "filename", None)
    reason = e.strerror or (os.strerror(e.errno) if getattr(e, "errno", None) else str(e)) or type(e).__name__
    err = WriteError(f"cannot write ({reason}); the previous contents of --out are unchanged",
                     file=str(where) if where is not None else None, field="--out")
    err.errno, err.strerror = getattr(e, "errno", None), getattr(e, "strerror", None)
    return err
