"""Write errors as one line: an ``OSError`` of writing turned into an ``InputError`` naming the path.

:func:`write_error` turns an ``OSError`` raised while writing (no space left, read-only file
system, permission denied, quota, ...) into a :class:`WriteError` naming the path, so every
command prints one line and exits with status 2; ``report.rundir.staged_dir`` removes its staging
directory and the previous run at ``--out`` stays as it was.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from tlora_sim.traces.errors import InputError

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
