"""Atomic file writes: a temp file in the target's directory, renamed onto the target.

Every file is written to a temp file in the same directory (``.NAME.XXXX.tmp``) and renamed onto
its target with :func:`os.replace`, so a run interrupted at any point leaves each file either
complete (the previous or the new version) or absent, never half-written. The temp file's
creation and the rename are done inside ``signals.signals_held``, so an interrupt
(``signals.Interrupted``) cannot land between making the temp file and recording its name, nor
between the rename and forgetting it. Only SIGKILL, which no process can catch, can leave a stray
``.tmp`` file; complete files stay complete even then.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from tlora_sim.sim.runtime.signals import signals_held
from tlora_sim.sim.runtime.write_errors import write_error

UMASK = os.umask(0)
os.umask(UMASK)
"""The process's umask (read once at import): ``tempfile`` makes files 0600 and directories 0700;
outputs get the usual ``0o666 & ~UMASK`` / ``0o777 & ~UMASK`` instead."""


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_path)`` then rename the temp file onto ``path``; returns ``path``.

    On any exception or interrupt the temp file is removed and ``path`` is left as it was.

    Raises:
        InputError: the file cannot be written (an ``OSError``: no space left, read-only file
            system, permission denied, ...): one line naming ``path`` (``write_errors.write_error``).
    """
    path = Path(path)
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with signals_held():  # the temp file's name is recorded before any signal can interrupt
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.close(fd)
            os.chmod(tmp, 0o666 & ~UMASK)  # mkstemp makes 0600; outputs get the usual permissions
        write(Path(tmp))
        with signals_held():  # renamed and forgotten together
            os.replace(tmp, path)
            tmp = None
    except OSError as e:
        raise write_error(e, path) from None
    finally:
        if tmp is not None:
            with signals_held():
                Path(tmp).unlink(missing_ok=True)
    return path
