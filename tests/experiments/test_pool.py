"""The worker pool of ``compare`` and ``sweep``: workers never outlive their parent."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tlora_sim.sim.runtime.pool import run_tasks

ROOT = Path(__file__).resolve().parents[2]

PARENT = textwrap.dedent("""
    import sys, time
    from tlora_sim.sim.runtime.pool import run_tasks
    def task(path):
        open(path, "w").close()      # tells the test this worker runs
        time.sleep(600)
    run_tasks(task, [(sys.argv[1] + "/a",), (sys.argv[1] + "/b",)], workers=2)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of someone else still answers kill(0)
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir()
            for c in (t / "children").read_text().split()]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_workers_exit_when_their_parent_is_killed(tmp_path):
    """SIGKILL gives the parent no chance to stop its pool; its workers must still exit (before
    the parent-death signal they waited forever on the task queue, which siblings keep open)."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], cwd=ROOT)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not ((tmp_path / "a").exists() and (tmp_path / "b").exists()):
            time.sleep(0.1)
        assert (tmp_path / "a").exists() and (tmp_path / "b").exists(), "the workers never started"
        workers = _children(parent.pid)
        assert len(workers) >= 2
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.time() + 30
        while time.time() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.1)
        assert not [w for w in workers if _alive(w)], "workers outlived their SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_run_tasks_returns_results_in_task_order():
    assert run_tasks(pow, [(2, 3), (3, 2), (5, 1)], workers=2) == [8, 9, 5]
    assert run_tasks(pow, [(2, 3)], workers=2) == [8]
