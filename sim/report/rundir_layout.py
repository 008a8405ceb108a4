"""The names of a run directory's files, in one place.

Every writer (``sim/experiments``) and every reader (``sim/report``, ``bench/``) takes a file's
name from :class:`RunDir` instead of spelling it, so a renamed or added file changes here only.
Layout of a run directory (docs/outputs.md describes the columns):

- ``config.json``: every input, versions, the cost model's identity.
- ``jobs.csv``: one row per job.
- ``timeline.csv``: piecewise-constant cluster series.
- ``summary.json``: the run's metrics (deterministic bytes).
- ``perf.json``: wall time, events/s, decision time (not deterministic).
- ``steps.csv``, ``workload.csv`` (``tlora-sim execute``), and ``probes.csv`` where its host-speed
  probes ran (optional: one device on the wall clock with ``--probe-every`` > 0).
- ``figures/``: ``*.png`` and ``*.pdf`` drawn from the files above.

A comparison directory holds one run directory per policy and ``summary.csv``; with several seeds,
one comparison per seed, ``summary.csv`` (means and CIs) and ``summary_by_seed.csv``. A sweep
directory holds ``sweep.csv`` and, once reported, ``report.csv``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunDir:
    """A run (or comparison) directory and the paths of its files.

    Args:
        root: the directory (need not exist yet).
    """

    root: Path

    CONFIG = "config.json"
    JOBS = "jobs.csv"
    TIMELINE = "timeline.csv"
    SUMMARY = "summary.json"
    PERF = "perf.json"
    FIGURES = "figures"
    COMPARE_SUMMARY = "summary.csv"
    SEEDS_TABLE = "summary_by_seed.csv"  # compare --seeds: every seed's row
    SWEEP_TABLE = "sweep.csv"  # a sweep: one row per finished cell
    SWEEP_REPORT = "report.csv"  # sweep report: cells aggregated over seeds
    STEPS = "steps.csv"  # tlora-sim execute: every measured step and regroup pause
    WORKLOAD = "workload.csv"  # tlora-sim execute: the exact jobs run (validate-run replays them)
    PROBES = "probes.csv"  # tlora-sim execute: the host-speed probes (optional: one device, wall clock)
    VALIDATION = "validation.csv"  # tlora-sim validate-run: real against simulated, one row per run

    #: the files every complete run directory has (``perf.json`` aside: it is timing, not results).
    RESULT_FILES = (CONFIG, JOBS, TIMELINE, SUMMARY)

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        """``config.json``."""
        return self.root / self.CONFIG

    @property
    def jobs(self) -> Path:
        """``jobs.csv``."""
        return self.root / self.JOBS

    @property
    def timeline(self) -> Path:
        """``timeline.csv``."""
        return self.root / self.TIMELINE

    @property
    def summary(self) -> Path:
        """``summary.json``."""
        return self.root / self.SUMMARY

    @property
    def perf(self) -> Path:
        """``perf.json``."""
        return self.root / self.PERF

    @property
    def figures(self) -> Path:
        """``figures/``."""
        return self.root / self.FIGURES

    @property
    def compare_summary(self) -> Path:
        """``summary.csv`` of a comparison directory."""
        return self.root / self.COMPARE_SUMMARY

    @property
    def steps(self) -> Path:
        """``steps.csv`` of an executed run."""
        return self.root / self.STEPS

    @property
    def workload(self) -> Path:
        """``workload.csv`` of an executed run."""
        return self.root / self.WORKLOAD

    @property
    def probes(self) -> Path:
        """``probes.csv`` of an executed run (optional: absent where no probe ran)."""
        return self.root / self.PROBES

    @property
    def validation(self) -> Path:
        """``validation.csv`` of a validation directory."""
        return self.root / self.VALIDATION

    def is_run(self) -> bool:
        """True where ``root`` holds a run directory's ``summary.json`` and ``config.json``."""
        return self.summary.is_file() and self.config.is_file()
