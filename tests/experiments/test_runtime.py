"""sim/runtime: the sweep's lock (``filelock``, with the output-directory lock under it) and atomic
writes with their one-line write errors."""

from __future__ import annotations

import os

import pytest

from tlora_sim.sim.runtime.atomic import atomic_write
from tlora_sim.sim.runtime.outlock import SweepLock, acquire_out_lock, holds_out_lock, release_out_lock
from tlora_sim.sim.runtime.write_errors import WriteError
from tlora_sim.traces.errors import InputError


def test_a_sweep_lock_excludes_a_second_sweep_and_holds_the_directory(tmp_path):
    out = tmp_path / "sweep"
    with SweepLock(out):
        assert holds_out_lock(out) and (out / ".sweep.lock").exists()
        with pytest.raises(InputError, match="another sweep is running") as info:
            SweepLock(out).__enter__()
        assert info.value.file == str(out)
        assert holds_out_lock(out)  # the refused one did not release what the first holds
    assert not holds_out_lock(out)
    with SweepLock(out):  # free again
        pass


def test_a_sweep_lock_keeps_a_directory_lock_taken_before_it(tmp_path):
    out = tmp_path / "sweep"
    acquire_out_lock(out)
    try:
        with SweepLock(out):
            pass
        assert holds_out_lock(out)  # the caller's, released by the caller
    finally:
        release_out_lock(out)
    assert not holds_out_lock(out)


def test_atomic_write_leaves_the_old_file_or_the_new_one(tmp_path):
    p = tmp_path / "a" / "x.txt"
    atomic_write(p, lambda t: t.write_text("one"))
    with pytest.raises(ZeroDivisionError):
        atomic_write(p, lambda t: (t.write_text("half"), 1 / 0))
    assert p.read_text() == "one" and sorted(os.listdir(p.parent)) == ["x.txt"]


def test_a_failed_write_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "f").write_text("a file, not a directory")
    target = tmp_path / "f" / "x.txt"
    with pytest.raises(WriteError, match="cannot write") as info:
        atomic_write(target, lambda t: t.write_text("x"))
    assert info.value.file == str(target) and info.value.field == "--out" and isinstance(info.value, OSError)
    assert "\n" not in str(info.value)
