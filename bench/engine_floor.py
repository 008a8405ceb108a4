#!/usr/bin/env python3
"""Engine floor: how long a replay takes when the policy's decisions cost nothing.

For each (case, policy) two child processes run ``tlora_sim.sim.experiments.replay.replay`` on the same inputs:

1. **record**: the registered policy decides as usual, wrapped so that every decision's time and
   actions are kept (one list append per decision); its CPU time is the replay's (``cpu_s``);
2. **script**: a fresh process replays the recorded actions, decision by decision, with a policy
   that only reads them back (``ScriptedPolicy``): the engine, SimPy, the cost model's re-times of
   the groups the actions change, the trace reading and the run-directory files all run as
   before, the policy's own work does not. Its CPU time is the **floor** (``floor_cpu_s``): no
   implementation of that policy, however fast, replays the case faster in this engine, because
   its decisions (above all the number of group re-times they cause) are part of the simulated
   behaviour.

The script must reproduce the recorded run exactly: every decision at the same simulated time
(else ``ScriptedPolicy`` raises) and the same ``out_sha`` (``same_out``), so the floor is the
floor of *that* simulation.

Columns: ``case``, ``policy``, ``cost_model``, ``jobs``; ``cpu_s`` / ``wall_s`` (record child,
whole ``replay()`` call), ``floor_cpu_s`` / ``floor_wall_s`` (script child), ``policy_cpu_s`` =
cpu_s - floor_cpu_s, ``floor_share`` = floor_cpu_s / cpu_s; ``decisions`` and the actions by type
(``start_group``, ``add_members``, ``remove_members``, ``stop_members``, ``set_execution``;
``actions`` their sum); ``retimes`` (group re-times the engine ran: each one a cost-model step-time
prediction, a timer and a SimPy event); ``same_out``, ``out_sha`` (as in ``bench/replay.py``),
``status`` and the provenance columns of ``bench/replay.py`` (tag, host, cpu_model, cpus, python,
commit, dirty, src_sha, date). Rows of the same (case, policy, cost_model) are replaced.

Usage (from the repository root)::

    .venv/bin/python bench/engine_floor.py --cases itp02,itp04,itp-all     # every policy
    .venv/bin/python bench/engine_floor.py --cases itp-all --policies tlora
    .venv/bin/python bench/engine_floor.py --quick                          # CI smoke test
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_replay", Path(__file__).with_name("replay.py"))
bench_replay = sys.modules["bench_replay"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_replay)

COLUMNS = ["case", "policy", "cost_model", "jobs", "cpu_s", "wall_s", "floor_cpu_s", "floor_wall_s", "policy_cpu_s",
           "floor_share", "decisions", "actions", "start_group", "add_members", "remove_members", "stop_members",
           "set_execution", "retimes", "same_out", "out_sha", "status", "trace", "cluster", "tag", "host",
           "cpu_model", "cpus", "python", "commit", "dirty", "src_sha", "date"]
DEFAULT_CASES = ("itp02", "itp04", "itp-all")
ACTION_COLUMNS = {"StartGroup": "start_group", "AddMembers": "add_members", "RemoveMembers": "remove_members",
                  "StopMembers": "stop_members", "SetExecution": "set_execution"}


class RecordingPolicy:
    """Wraps a policy and keeps ``(now_s, actions)`` of every decision in ``log`` (behaviour unchanged)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name, self.plan = inner.name, inner.plan
        self.timer_s = getattr(inner, "timer_s", None)
        self.config = getattr(inner, "config", None)
        self.log: list[tuple[float, tuple]] = []

    def decide(self, snap):
        actions = tuple(self.inner.decide(snap))
        self.log.append((snap.now_s, actions))
        return actions


class ScriptedPolicy:
    """Replays a ``RecordingPolicy.log``: decision k returns the k-th recorded actions.

    Attributes ``name``, ``plan``, ``timer_s`` and ``config`` are taken from ``like`` (the policy
    that was recorded), so the engine schedules the same policy timers.

    Raises:
        RuntimeError: the engine asks for a decision at another simulated time than the
            recording's, or for more decisions than were recorded (the replay diverged).
    """

    def __init__(self, log: list[tuple[float, tuple]], like) -> None:
        self.log, self.k = log, 0
        self.name, self.plan = like.name, like.plan
        self.timer_s = getattr(like, "timer_s", None)
        self.config = getattr(like, "config", None)

    def decide(self, snap):
        if self.k >= len(self.log):
            raise RuntimeError(f"decision {self.k} at t={snap.now_s!r}: the recording has only {len(self.log)}")
        now, actions = self.log[self.k]
        if now != snap.now_s:
            raise RuntimeError(f"decision {self.k} at t={snap.now_s!r}, recorded at t={now!r}: the replay diverged")
        self.k += 1
        return actions


# ---- child: one replay, recorded or scripted -----------------------------------------------------
def _child(spec: dict) -> dict:
    from tlora_sim.sim.core.listeners import EventCounter
    from tlora_sim.policies.registry import make_policy
    from tlora_sim.sim.experiments.replay import ReplayConfig, replay

    src = bench_replay.src_sha()
    cfg = ReplayConfig(trace=spec["trace"], policy=spec["policy"], cluster=spec["cluster"], seed=0)
    real = make_policy(cfg.policy, cfg.policy_options)
    if spec["mode"] == "record":
        policy = RecordingPolicy(real)
    else:
        with open(spec["script"], "rb") as f:
            policy = ScriptedPolicy(pickle.load(f), like=real)
    counter = EventCounter()
    with tempfile.TemporaryDirectory(prefix="tlora-floor-") as tmp:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        replay(cfg, tmp, progress=False, plots=False, check_invariants=False, policy=policy, listeners=[counter])
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        out_sha = bench_replay.output_sha(Path(tmp))
        perf = json.loads((Path(tmp) / "perf.json").read_text())
        cm = json.loads((Path(tmp) / "config.json").read_text()).get("cost_model", {})
    res = {"jobs": perf["jobs"], "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), "wall_s": wall,
           "out_sha": out_sha, "src_sha": src, "retimes": counter.counts["retimes"],
           "cost_model": cm.get("name", "?") if isinstance(cm, dict) else str(cm)}
    if spec["mode"] == "record":
        with open(spec["script"], "wb") as f:
            pickle.dump(policy.log, f, protocol=pickle.HIGHEST_PROTOCOL)
        kinds = Counter(type(a).__name__ for _, acts in policy.log for a in acts)
        res.update(decisions=len(policy.log), **{col: kinds.get(k, 0) for k, col in ACTION_COLUMNS.items()})
    return res


def _run_child(spec: dict, timeout: float) -> dict:
    try:
        return bench_replay.run_child(Path(__file__), spec, timeout)
    except RuntimeError as e:
        raise RuntimeError(f"{spec['mode']} child failed: {e}") from None


def run_one(case: str, c, policy: str, *, itp_dir: Path, timeout: float) -> dict:
    """Record then script one (case, policy); returns its row (without provenance)."""
    row = {"case": case, "policy": policy, "trace": c.trace.replace("{itp}", "ITP"), "cluster": c.cluster}
    with tempfile.TemporaryDirectory(prefix="tlora-floor-") as tmp:
        spec = {"trace": c.trace.format(itp=itp_dir), "cluster": c.cluster, "policy": policy,
                "script": str(Path(tmp) / "decisions.pickle")}
        try:
            rec = _run_child({**spec, "mode": "record"}, timeout)
            flo = _run_child({**spec, "mode": "script"}, timeout)
        except subprocess.TimeoutExpired:
            return {**row, "status": f"timeout after {timeout:g} s"}
        except RuntimeError as e:
            return {**row, "status": f"error: {e}"}
    actions = sum(rec[col] for col in ACTION_COLUMNS.values())
    return {**row, **rec, "floor_cpu_s": flo["cpu_s"], "floor_wall_s": flo["wall_s"],
            "policy_cpu_s": rec["cpu_s"] - flo["cpu_s"], "floor_share": flo["cpu_s"] / rec["cpu_s"],
            "actions": actions, "same_out": rec["out_sha"] == flo["out_sha"] and rec["retimes"] == flo["retimes"],
            "status": "ok"}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (1 if any run failed, timed out or diverged)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="cases: " + ", ".join(f"{k} ({v.note}, {v.cluster})"
                                                              for k, v in bench_replay.CASES.items()))
    ap.add_argument("--cases", default=None, help=f"comma-separated cases (default: {','.join(DEFAULT_CASES)})")
    ap.add_argument("--policies", default=",".join(bench_replay.POLICIES),
                    help="comma-separated policies (default: %(default)s)")
    ap.add_argument("--quick", action="store_true", help="one tiny synthetic case (CI smoke test)")
    ap.add_argument("--tag", default=None, help="results file suffix (default: ARCH-Ncpu, or 'quick')")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="results directory (default: bench/results, or runs/bench with --quick)")
    ap.add_argument("--itp-dir", type=Path, default=bench_replay.ITP_DIR,
                    help="directory of the ITP clusterNN.csv.gz files")
    ap.add_argument("--timeout", type=float, default=1800.0, help="limit per child run, s (default: %(default)s)")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args._child:
        print(json.dumps(_child(json.loads(args._child))))
        return 0

    table, names, policies, machine, tag, path = bench_replay.plan_runs(ap, args, "engine_floor", DEFAULT_CASES)
    print(f"{'case':>9} {'policy':>12} {'cpu_s':>8} {'floor_s':>8} {'share':>6} {'decisions':>9} {'set_exec':>9} "
          f"{'retimes':>9} same_out", flush=True)
    failed = 0
    for name in names:
        for pol in policies:
            row = run_one(name, table[name], pol, itp_dir=args.itp_dir, timeout=args.timeout)
            row.update(tag=tag, date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                       **machine)
            if row["status"] == "ok":
                print(f"{name:>9} {pol:>12} {row['cpu_s']:8.2f} {row['floor_cpu_s']:8.2f} {row['floor_share']:6.2f} "
                      f"{row['decisions']:9d} {row['set_execution']:9d} {row['retimes']:9d} {row['same_out']}",
                      flush=True)
            else:
                print(f"{name:>9} {pol:>12}  {row['status']}", flush=True)
            failed += row["status"] != "ok" or not row["same_out"]
            bench_replay.save(path, [row], list(table), columns=COLUMNS)
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
