"""--version, --quiet and progress bars only on a terminal."""

from __future__ import annotations

import subprocess
import sys

EXE = [sys.executable, "-m", "tlora_sim.sim.cli.main"]


def test_version():
    r = subprocess.run([*EXE, "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("tlora-sim ")


def test_quiet_and_no_progress_bars_in_logs(tmp_path):
    args = ["replay", "--trace", "synthetic:jobs=20", "--cluster", "1x8xH100", "--policy", "independent",
            "--no-plots"]
    loud = subprocess.run([*EXE, *args, "--out", str(tmp_path / "a")], capture_output=True, text=True, timeout=120)
    quiet = subprocess.run([*EXE, "-q", *args, "--out", str(tmp_path / "b")], capture_output=True, text=True,
                           timeout=120)
    assert loud.returncode == quiet.returncode == 0
    assert "kept" in loud.stdout and "kept" in quiet.stdout  # -q never hides the kept/skipped line (issue 41)
    assert "\r" not in loud.stderr and "\x1b[" not in loud.stderr  # stderr is not a terminal: no bar
