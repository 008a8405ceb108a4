"""``tlora-sim validate-run``: replay executed runs in the simulator and compare, job by job.

For each executed run directory (``tlora-sim execute``) the identical workload (``workload.csv``:
the same jobs, total steps and arrivals), cluster (``config.json``: devices, GPU type and the
memory the policies planned with), policy and policy options are simulated by the SimPy engine.
Step times (``--step-times``):

* ``profiled`` (default for a CUDA run): the profiled model of the run's GPU type, the model the
  policy planned with; this is the validation of the simulator.
* ``measured`` (default for a CPU run, which has no profiled model of its device): a table-driven
  model of this run's own measured steps (``sim/executor/steptable.py``: mean steady step time
  per group composition; compositions the run never trained fall back to the profiled model times
  the run's measured / predicted ratio, ``cpu_scale``). On a GPU run it separates the step
  model's error from the schedule's. On a CPU run it is the only meaningful comparison, and it
  validates the machinery (the executor, the engine and their agreement), nothing about GPUs.

Host speed (``--host-speed``: ``auto``, ``probes``, ``off``; ``--probe-window``): with ``probes``
the engine's profiled step times follow the machine's host speed through each run
(``sim/executor/host_speed.py``): the artifact's host terms times probe(t) / ref, probe(t) the
median of the run's ``probes.csv`` (written by ``execute``; ``t_s, probe_ms, python_ms``) within
``--probe-window`` s (default 10) of each probe, ref the artifact's ``calibration.probe.ref_ms``
(``costmodel calibrate``: the probe's median during calibration), quantised to 0.5% (so derived
models repeat), piecewise constant from each probe's ``t_s``; the engine re-times every running
group at each probe's instant (``Engine(retime_at=...)``). It reads the run's probes, not its
steps. A validation with ``probes`` compares the run with the model at the host speed the machine
had during the run; with ``off``, with the model at the host speed of a calibration taken minutes
before (on the lent H200 hosts the executed host-bound steps ran 9-17% slower than the calibration's
of the same shapes: ``profiler/data/validation/README.md``). ``auto`` is ``probes``
when every run has a ``probes.csv`` with a row, the artifact in use has the reference and step
times are profiled, else ``off``; explicit ``probes`` with an input missing is an InputError naming
the file or field; measured step times ignore host speed. Only step times follow it: the policy
plans with the planning model and the pauses below are measured against the artifact's speed.

Whenever the engine's step times are not the planning model's, the policy still plans with the
planning model (``sim/executor/planning.py``), as it did in the executed run, and the invariant
checker's isolation floor is off (it compares JCTs with the planning model's isolated runtimes).

What a step-time table does not see is measured from the run's ``steps.csv`` and given to the
engine: the regroup pause (mean save/rebuild/restore time plus the mean excess of a rebuilt
group's first step over the engine's step), the same for a new group's start (``start_pause_s``),
and a pause whenever a member finishes and the others go on (the executor rebuilds the
super-model then; ``PauseOptions(pause_on_finish=True)``). Pauses are charged as the executor pays
them (``PauseOptions(serial_pauses=True, pause_by_size=...)``): a change during a rebuild from an
earlier instant pays its own pause after it (the executor decides between steps), and a change's
pause is the run's mean rebuild for the group's new size (``steptable.pauses_by_size``). The
run's own host-speed probes (``execute --probe-every``) pause the running groups too: the engine's
step times are stretched by the busy probes' share (``host_speed.probe_pause``; ~1% on an H200
run probed every 2 s; ``validation.csv``'s ``probe_stretch`` and ``busy_probes``;
``--ignore-probe-cost`` leaves it out).

Inputs are checked first (``load_run``, ``check_inputs``): execute run directories whose files
are whole and agree, of one workload, one cluster and device kind, no policy twice. The replay's
profiled step times come from the shipped artifact of the run's GPU type or from ``artifact``
(``--artifact``, e.g. ``tlora-sim costmodel calibrate``'s); its policy plans with the model the
run's policy planned with (``config.json``'s ``cost_model.artifact``: ``run_planning_model``), so
that a calibrated artifact changes what the steps take, not what the policy decides on
(``validation.csv``'s ``cost_model`` and ``planning_cost_model``).

Writes ``validation.csv`` (one row per run: ``policy, jobs, real_avg_jct_s, sim_avg_jct_s,
real_makespan_s, sim_makespan_s, jct_abs_error_p50, jct_abs_error_p90``, the errors being per-job
|sim - real| / real, ``avg_jct_error``, ``real_ratio``, ``sim_ratio``, ``ratio_error``,
``ranking_kept`` (``add_ratios``), then context columns, among them ``host_speed`` (``probes`` /
``off``) and ``host_factor_p10``, ``host_factor_median``, ``host_factor_p90`` (of the run's probe
factors; NaN when off)), ``validation_jobs.csv`` (per job) and
``validation.png``/``.pdf`` (``sim/executor/figure.py``), ``divergence.csv`` (per job: real against
simulated placements, the first point where the schedules part; ``sim/executor/divergence.py``),
and each simulated run's ``jobs.csv`` and ``groups.csv`` (membership changes) under ``sim/<policy>/``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from tlora_sim.sim.report.rundir import check_out_dir, staged_dir, write_csv
from tlora_sim.sim.report.rundir_layout import RunDir
from tlora_sim.sim.report.runcsv import check_finite, read_run_csv
from tlora_sim.traces.errors import InputError

COLUMNS = ["policy", "jobs", "real_avg_jct_s", "sim_avg_jct_s", "real_makespan_s", "sim_makespan_s",
           "jct_abs_error_p50", "jct_abs_error_p90", "avg_jct_error", "real_ratio", "sim_ratio", "ratio_error",
           "ranking_kept"]
STEP_TIMES = ("auto", "profiled", "measured")
HOST_SPEED = ("auto", "probes", "off")
#: validation.csv's host-speed context columns (the factors NaN when ``host_speed`` is ``off``)
HOST_COLUMNS = ["host_speed", "host_factor_p10", "host_factor_median", "host_factor_p90"]
GROUPS = "groups.csv"  # sim/<policy>/: the replay's membership changes (time_s, group_id, jobs)
DIVERGENCE = "divergence.csv"  # per job: real against simulated placements (sim/executor/divergence.py)


#: the workload.csv columns that make two runs' workloads the same (steps and isolated times
#: depend on the cost model the run planned with; these do not)
SAME_WORKLOAD = ["job_id", "submit_time_s", "num_gpus", "model", "rank", "batch_size", "seq_len"]


def load_run(real: Path) -> tuple[dict, list, pd.DataFrame, pd.DataFrame]:
    """(config, workload jobs, steps.csv, jobs.csv) of an executed run directory, checked: every
    file present and readable, ``config.json`` an execute run's, ``jobs.csv`` the jobs of
    ``workload.csv`` (the same job ids), every job finished.

    Raises:
        InputError: naming the file (and row and field where one is wrong).
    """
    from tlora_sim.sim.executor.runtime import STEP_COLUMNS
    from tlora_sim.sim.executor.workload import WORKLOAD_COLUMNS, read_workload

    files = RunDir(real)
    if not real.is_dir():
        raise InputError("no such directory; give run directories written by tlora-sim execute", file=str(real))
    for p in (files.config, files.workload, files.steps, files.jobs):
        if not p.is_file():
            raise InputError(f"not an executed run directory (missing {p.name}); make one with tlora-sim execute",
                             file=str(real))
    try:
        cfg = json.loads(files.config.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read config.json ({e})", file=str(files.config)) from None
    except json.JSONDecodeError as e:
        raise InputError(f"config.json is not JSON ({e.msg})", file=str(files.config), row=e.lineno) from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("executor"), dict):
        raise InputError("config.json has no 'executor' section: not a tlora-sim execute run", file=str(files.config))
    for key in ("cluster", "gpu", "policy", "inputs"):
        if key not in cfg:
            raise InputError("missing in config.json", file=str(files.config), field=key)
    if not isinstance(cfg["gpu"], dict) or "memory_bytes" not in cfg["gpu"]:
        raise InputError("missing in config.json", file=str(files.config), field="gpu.memory_bytes")
    wl = read_run_csv(files.workload, "workload.csv", WORKLOAD_COLUMNS)
    if wl.empty:
        raise InputError("workload.csv has no jobs", file=str(files.workload))
    check_finite(wl, ["index", "submit_time_s", "num_gpus", "rank", "batch_size", "seq_len", "total_steps",
                  "trace_duration_s", "isolated_step_time_s", "max_slowdown"], files.workload)
    jobs = read_workload(files.workload)
    real_jobs = read_run_csv(files.jobs, "jobs.csv", ["job_id", "jct_s", "submit_time_s", "finish_time_s"])
    if real_jobs.empty:
        raise InputError("jobs.csv has no jobs", file=str(files.jobs))
    if sorted(map(str, real_jobs.job_id)) != sorted(str(j.job_id) for j in jobs):
        raise InputError("jobs.csv does not hold the jobs of workload.csv (another run's file?)", file=str(files.jobs))
    if real_jobs.finish_time_s.isna().any():
        raise InputError("jobs.csv has unfinished jobs: the run did not complete", file=str(files.jobs))
    check_finite(real_jobs, ["jct_s", "submit_time_s", "finish_time_s"], files.jobs)
    steps = read_run_csv(files.steps, "steps.csv", [c for c in STEP_COLUMNS if c not in ("micro_batches", "n_gpus")])
    check_finite(steps, ["start_s", "end_s", "ms", "nano_batches"], files.steps)
    bad = ~steps.jobs.astype(str).str.fullmatch(r"\d+(;\d+)*")
    if bad.any() or (len(steps) and steps.jobs.astype(str).str.split(";").explode().astype(int).max() >= len(jobs)):
        k = int(np.flatnonzero(bad.to_numpy())[0]) if bad.any() else 0
        raise InputError("not job indices of workload.csv", file=str(files.steps), row=k + 2, field="jobs")
    return cfg, jobs, steps, real_jobs


def _workload_key(real: Path) -> pd.DataFrame:
    """The ``SAME_WORKLOAD`` columns of a run's workload.csv (compared across validate-run's inputs)."""
    return pd.read_csv(RunDir(real).workload)[SAME_WORKLOAD].astype(str).reset_index(drop=True)


def check_inputs(dirs: list[Path]) -> None:
    """Refuse inputs that cannot be compared as one validation: a policy given twice, runs of
    different workloads (``SAME_WORKLOAD``), GPU types or devices (cuda and cpu).

    Raises:
        InputError: naming the directory that differs from the first.
    """
    first, seen = None, {}
    for d in dirs:
        cfg, _jobs, _steps, _real = load_run(d)
        pol = str(cfg["policy"])
        if pol in seen:
            raise InputError(f"policy {pol} is given twice ({seen[pol]} and {d}): its replays would overwrite each "
                             f"other; validate them separately", file=str(d))
        seen[pol] = d
        ident = (_workload_key(d), str(cfg["cluster"]), str(cfg["executor"].get("device", "cuda")).split(":")[0])
        if first is None:
            first = (d, ident)
            continue
        d0, (w0, c0, dev0) = first
        if not ident[0].equals(w0):
            raise InputError(f"not the workload of {d0} (workload.csv differs in jobs, arrivals or LoRA attributes): "
                             f"validate runs of one workload together", file=str(d))
        if ident[1] != c0 or ident[2] != dev0:
            raise InputError(f"cluster/device {ident[1]}/{ident[2]} differs from {d0}'s {c0}/{dev0}", file=str(d))


PREDATING_FIELDS = {"slowdown_reference": "eager", "regroup_pause_s": 0.0}
"""Options a run's recorded ``policy_config`` may predate (issue 40 added them), with the values that
run the code of that time: the slowdown promise against the eager isolated step, the regroup pause
not priced in the join test."""


def recorded_policy_options(cfg: dict) -> dict:
    """The policy's options as the run recorded them (``config.json`` ``policy_config``), so that a
    replay runs the policy as it was executed even after its defaults changed; a field the record
    predates (:data:`PREDATING_FIELDS`, where the policy's config has it) takes its older value.
    A record without ``policy_config`` gives the run's ``--option`` values."""
    from tlora_sim.policies.registry import config_of, make_policy

    recorded = cfg.get("policy_config")
    if not isinstance(recorded, dict):
        return dict(cfg["inputs"].get("policy_options") or {})
    fields = config_of(make_policy(cfg["policy"]))
    opts = {k: v for k, v in recorded.items() if k in fields}
    for key, old in PREDATING_FIELDS.items():
        if key in fields and key not in recorded:
            opts[key] = old
    return opts


def step_mode(cfg: dict, step_times: str) -> str:
    """The engine's step times of a run (``config.json`` ``cfg``) under ``--step-times``:
    ``profiled`` or ``measured`` (``auto``: profiled for a cuda run, measured for a cpu run).

    Raises:
        InputError: an unknown ``step_times``.
    """
    if step_times not in STEP_TIMES:
        raise InputError(f"--step-times must be one of {', '.join(STEP_TIMES)}, got {step_times!r}",
                         field="--step-times")
    on_gpu = str(cfg["executor"].get("device", "cuda")).startswith("cuda")
    return step_times if step_times != "auto" else ("profiled" if on_gpu else "measured")


def host_speed_mode(dirs: list[Path], host_speed: str = "auto", step_times: str = "auto",
                    artifact: str | Path | None = None) -> str:
    """What ``--host-speed`` means for one validation of the runs ``dirs``: ``probes`` or ``off``.

    ``auto`` is ``probes`` when the step times are profiled, the artifact in use (``artifact``, or
    the shipped one of the runs' GPU type) has ``calibration.probe.ref_ms``, and every run
    directory has a ``probes.csv`` with at least one row; else ``off``. Measured step times are
    the run's own steps: host speed is off for them whatever ``host_speed`` says.

    Raises:
        InputError: an unknown ``host_speed``; with ``probes``, an artifact without the reference
            (naming the file and field ``calibration.probe.ref_ms``), a run directory without
            ``probes.csv`` or with no row in it (naming the file); in either mode a ``probes.csv``
            that cannot be read (``host_speed.read_probes``), and a run whose ``config.json``
            ``executor.probe`` is another probe than the artifact's ``calibration.probe.what``
            (``probe.describe``; e.g. another ``REPS``), naming the run's config.json.
    """
    from tlora_sim.sim.core.cluster import parse_cluster
    from tlora_sim.sim.costmodel.profiled.artifact import artifact_path, load_artifact
    from tlora_sim.sim.executor.host_speed import PROBES, REF_FIELD, calibration_probe, read_probes, reference_ms
    from tlora_sim.sim.executor.probe import describe

    if host_speed not in HOST_SPEED:
        raise InputError(f"--host-speed must be one of {', '.join(HOST_SPEED)}, got {host_speed!r}",
                         field="--host-speed")
    if host_speed == "off" or not dirs:
        return "off"
    cfgs = [load_run(Path(d))[0] for d in dirs]
    if any(step_mode(c, step_times) != "profiled" for c in cfgs):
        return "off"
    art_file = Path(artifact) if artifact else artifact_path(parse_cluster(cfgs[0]["cluster"]).gpu.name)
    art = load_artifact(art_file)
    if reference_ms(art) is None:
        if host_speed == "auto":
            return "off"
        raise InputError("the artifact has no host-speed reference (calibrate with a probe: tlora-sim costmodel "
                         "calibrate), so --host-speed probes cannot be used", file=str(art_file), field=REF_FIELD)
    cal_what = str(calibration_probe(art).get("what") or "")
    for d, cfg in zip(dirs, cfgs):
        run_probe = (cfg.get("executor") or {}).get("probe")  # None: a run without probes (checked below)
        if ":" in cal_what and run_probe and describe(run_probe) != cal_what:  # ":": the probe is described
            raise InputError(f"the run timed another host-speed probe ({describe(run_probe)}) than the calibration's "
                             f"({cal_what}): their ms are not comparable; calibrate and execute with one "
                             "probe, or pass --host-speed off", file=str(Path(d) / "config.json"),
                             field="executor.probe")
    for d in dirs:
        p = Path(d) / PROBES
        if not p.is_file():
            if host_speed == "auto":
                return "off"
            raise InputError("no probes.csv in the run directory (a run of an execute that timed the host probe "
                             "is needed for --host-speed probes)", file=str(p))
        if read_probes(p).empty:
            if host_speed == "auto":
                return "off"
            raise InputError("probes.csv has no probe row", file=str(p))
    return "probes"


def simulate(real: str | Path, out: Path | None = None, step_times: str = "auto",
             artifact: str | Path | None = None, host_speed: str = "auto",
             probe_window_s: float | None = None, step_model=None,
             probe_cost: bool = True) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """Replay one executed run; (row of ``validation.csv``, per-job table, its ``divergence.csv``
    rows). With ``out``, writes the replay's ``jobs.csv`` and ``groups.csv`` under ``out/sim/<policy>/``.
    ``artifact``: the cost-model artifact file of the replay's profiled step times (default: the
    shipped one of the run's GPU type); the policy plans with the run's own
    (``run_planning_model``). ``host_speed``: ``auto``, ``probes`` or ``off``
    (``host_speed_mode`` of this run alone); with ``probes`` the engine's profiled step
    times follow the run's ``probes.csv`` (``sim/executor/host_speed.py``; ``probe_window_s``: the
    median window's half-width, s, default ``host_speed.WINDOW_S``). ``step_model``: a cost model
    the engine's step times come from instead of ``step_times``' and ``host_speed``'s (a what-if;
    the policy still plans with the planning model; the pauses are measured against
    ``step_times``' model, as with ``host_speed``). ``probe_cost``: the engine's step times (any
    of the above) are stretched by what the run's own probes paused its steps
    (``host_speed.probe_pause``: ``perf.json``'s seconds per probe, the probes of ``probes.csv``
    that fell while a group ran; ~1% on an H200 run probed every 2 s; 1 without probes);
    ``False``: not (``validate-run --ignore-probe-cost``).

    Raises:
        InputError: not an executed run directory, an unknown ``step_times`` or ``host_speed``,
            measured step times from a run with no measured step, or host-speed inputs missing
            (``host_speed_mode``).
        InvariantError: the replay broke an invariant.
    """
    from tlora_sim.policies.registry import make_policy
    from tlora_sim.sim.core import metrics
    from tlora_sim.sim.core.cluster import parse_cluster
    from tlora_sim.sim.core.invariants import InvariantChecker
    from tlora_sim.sim.executor.divergence import MembershipLog, divergence, real_changes
    from tlora_sim.sim.executor.planning import PlanningPolicy
    from tlora_sim.sim.core.engine import Engine, PauseOptions
    from tlora_sim.sim.executor.steptable import (MeasuredStepTable, ScaledCostModel, first_step_excess_s,
                                                  pace, pauses_by_size)
    from tlora_sim.sim.executor.workload import executor_cost_model

    from tlora_sim.sim.executor import host_speed as hs

    real = Path(real)
    cfg, jobs, steps, real_jobs = load_run(real)
    mode = step_mode(cfg, step_times)
    host = host_speed_mode([real], host_speed, step_times, artifact)
    cluster = parse_cluster(cfg["cluster"])
    cluster = replace(cluster, gpu=replace(cluster.gpu, memory_bytes=float(cfg["gpu"]["memory_bytes"])))
    gpu = cluster.gpu.name
    base = executor_cost_model(gpu, str(artifact) if artifact else None)  # the replay's step times
    planning, as_run = run_planning_model(cfg, gpu, base)  # what the run's policy planned with
    on_gpu = str(cfg["executor"].get("device", "cuda")).startswith("cuda")
    scale = 1.0 if on_gpu else pace(steps, jobs, base, gpu)
    if mode == "measured" and not (steps.event == "step").any():
        raise InputError("steps.csv has no measured step: a measured-steps validation has nothing to use",
                         file=str(RunDir(real).steps))
    if mode == "measured":
        cm = MeasuredStepTable.from_run(steps, jobs, base, gpu)
    elif on_gpu:
        cm = base
    else:  # a CPU run against a GPU profile: the profile at the CPU's pace
        cm = ScaledCostModel(base, scale)
    # the pauses are measured against these step times; a step model of its own or the host speed
    # changes the engine's step times only
    first_s = first_step_excess_s(steps, jobs, cm, gpu)
    speed = None
    probes_csv = real / hs.PROBES  # read once, for the host speed and the probes' cost
    probes = hs.read_probes(probes_csv) if (host == "probes" or probe_cost) and probes_csv.is_file() else None
    if step_model is not None:
        cm, host = step_model, "off"
    elif host == "probes":  # the profiled model at the machine's host speed through the run
        from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel

        art = base.artifact
        speed = hs.factor_series(probes, hs.reference_ms(art),
                                 hs.WINDOW_S if probe_window_s is None else probe_window_s)

        def build(f: float, art=art, on_gpu=on_gpu, scale=scale):
            m = ProfiledCostModel(hs.speed_artifact(art, f), checkpointing=False)  # as executor_cost_model
            return m if on_gpu else ScaledCostModel(m, scale)

        cm = hs.HostSpeedCostModel(build, speed, base=cm)
    follow = cm  # the model whose clock is bound to the engine's (host speed) and whose table hits count
    stretch, busy_probes = probe_stretch(real, steps, probes) if probe_cost else (1.0, 0)
    if stretch != 1.0:
        cm = ScaledCostModel(cm, stretch)
    pauses, starts = steps[steps.event == "regroup"].ms, steps[steps.event == "start"].ms
    pause_s = (float(pauses.mean() / 1e3) if len(pauses) else 0.0) + first_s
    start_s = (float(starts.mean() / 1e3) if len(starts) else 0.0) + first_s
    if hasattr(follow, "hits"):
        follow.hits = follow.misses = 0  # count the replay's lookups only
    policy = make_policy(cfg["policy"], recorded_policy_options(cfg))
    checker = InvariantChecker(jobs, cluster, cm)
    if cm is not planning:
        policy = PlanningPolicy(policy, planning, gpu)
        checker.solo = bytearray(len(jobs))  # isolated runtimes are the planning model's, not these step times
    log = MembershipLog()
    by_size = pauses_by_size(steps, first_s)
    engine = Engine(jobs, cluster, cm, policy, regroup_pause_s=pause_s, check_invariants=False,
                    listeners=[checker, log], pauses=PauseOptions(start_pause_s=start_s, pause_on_finish=True,
                                                                  serial_pauses=True, pause_by_size=by_size),
                    retime_at=speed.instants() if speed is not None else ())
    log.bind(engine)
    if speed is not None:
        follow.clock = lambda: engine.env.now
    res = engine.run()
    sim_jobs = metrics.jobs_table(res)
    div = divergence(cfg["policy"], real_jobs, real_changes(steps), sim_jobs, log.table())
    if out is not None:
        d = out / "sim" / cfg["policy"]
        d.mkdir(parents=True, exist_ok=True)
        write_csv(RunDir(d).jobs, sim_jobs)
        write_csv(d / GROUPS, log.table())
    both = real_jobs[["job_id", "jct_s", "submit_time_s", "finish_time_s"]].merge(
        sim_jobs[["job_id", "jct_s", "finish_time_s"]], on="job_id", suffixes=("_real", "_sim"))
    both["abs_error"] = (both.jct_s_sim - both.jct_s_real).abs() / both.jct_s_real
    both.insert(0, "policy", cfg["policy"])
    row = {"policy": cfg["policy"], "jobs": int(len(both)), "real_avg_jct_s": float(both.jct_s_real.mean()),
           "sim_avg_jct_s": float(both.jct_s_sim.mean()), "real_makespan_s": float(real_jobs.finish_time_s.max()),
           "sim_makespan_s": float(sim_jobs.finish_time_s.max()),
           "jct_abs_error_p50": float(both.abs_error.quantile(0.5)),
           "jct_abs_error_p90": float(both.abs_error.quantile(0.9)),
           "avg_jct_error": float(both.jct_s_sim.mean() / both.jct_s_real.mean() - 1),
           "device": cfg["executor"].get("device_name"), "gpu_type": gpu, "devices": cluster.total_gpus,
           "clock": cfg["executor"].get("clock", "wall"), "step_times": mode, "cpu_scale": scale,
           "table_hit_share": follow.hit_share() if hasattr(follow, "hit_share") else float("nan"),
           "probe_stretch": stretch, "busy_probes": busy_probes,
           "regroup_pause_s": pause_s, "start_pause_s": start_s, "first_step_excess_s": first_s,
           "regroup_pause_by_size_s": ";".join(f"{k}:{v:.3f}" for k, v in sorted(by_size.items())),
           "serial_pauses": engine.serial_pause_count, "first_divergence_s": float(div.diverged_at_s.min()),
           "same_groups_share": float(div.same_groups.mean()),
           "cost_model": base.artifact["id"], "cost_model_sha256": base.artifact.get("_sha256"),
           "planning_cost_model": planning.artifact["id"], "planning_as_run": as_run,
           "real_dir": str(real)}
    q = speed.quantiles() if speed is not None else (float("nan"),) * 3
    row.update(zip(HOST_COLUMNS, (host, *q)))
    return row, both, div


def run_planning_model(cfg: dict, gpu: str, base) -> tuple[object, bool]:
    """The cost model the executed run's policy planned with (``config.json``'s
    ``cost_model.artifact``, the id of the artifact ``execute`` loaded), and whether it was found:
    ``base`` (the replay's step-time model, ``--artifact`` or the shipped one) when it is that
    artifact, else the shipped artifact of ``gpu`` when it is that one, else the file the run
    recorded (``inputs.artifact``) when it is still there and is that one. A replay whose policy
    plans with another model than the run's takes other decisions (tLoRA's grouping compares
    predicted step times with its jobs' bounds): ``--artifact`` changes the replay's step times,
    not what the policy was told. Where the run's artifact is none of those (a run planned with an
    older shipped artifact), the replay plans with ``base`` and the second value is False
    (``validation.csv``'s ``planning_as_run``; ``validate-run`` says so). Runs whose ``config.json``
    names no artifact: (``base``, True).
    """
    from tlora_sim.sim.executor.workload import executor_cost_model

    rec = cfg.get("cost_model") if isinstance(cfg.get("cost_model"), dict) else {}
    want = rec.get("artifact")
    if not want or base.artifact.get("id") == want:
        return base, True
    shipped = executor_cost_model(gpu)
    if shipped.artifact.get("id") == want:
        return shipped, True
    path = (cfg.get("inputs") or {}).get("artifact")
    if path and Path(path).is_file():
        m = executor_cost_model(gpu, str(path))
        if m.artifact.get("id") == want:
            return m, True
    return base, False


def probe_stretch(real: Path, steps: pd.DataFrame, probes: pd.DataFrame | None) -> tuple[float, int]:
    """``host_speed.probe_pause`` of the executed run ``real``: (stretch, busy probes) from its
    ``steps`` (``load_run``'s ``steps.csv``), ``probes`` (its ``probes.csv``, ``read_probes``;
    None: the run has none) and ``perf.json`` (``probe_s / probes`` s per probe); (1.0, 0) where
    the run has no probes (no ``probes.csv`` row, or ``perf.json`` without them).

    Raises:
        InputError: ``perf.json`` present but unreadable or malformed.
    """
    from tlora_sim.sim.executor import host_speed as hs

    files = RunDir(real)
    if probes is None or not files.perf.is_file():
        return 1.0, 0
    try:
        perf = json.loads(files.perf.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"cannot read perf.json ({e})", file=str(files.perf)) from None
    perf = perf if isinstance(perf, dict) else {}
    n, total = perf.get("probes", 0), perf.get("probe_s", 0.0)
    try:
        n, total = int(n), float(total)
    except (TypeError, ValueError):
        raise InputError("probes / probe_s are not numbers", file=str(files.perf), field="probe_s") from None
    if n <= 0 or probes.empty or not (total >= 0 and total == total):
        return 1.0, 0
    return hs.probe_pause(steps, probes.t_s.to_numpy(), total / n)


def add_ratios(table: pd.DataFrame, reference: str | None = None) -> pd.DataFrame:
    """Add what a user takes away from a comparison: per policy its avg JCT over the reference
    policy's, real (``real_ratio``) and simulated (``sim_ratio``), ``ratio_error`` = sim_ratio /
    real_ratio - 1, the ``reference``, and whether the policies' order by avg JCT is the same
    real and simulated (``ranking_kept``, with ``real_rank_order`` / ``sim_rank_order``:
    policies fastest first, ``<``-separated).

    Args:
        table: ``validation.csv`` rows (``policy``, ``real_avg_jct_s``, ``sim_avg_jct_s``).
        reference: the reference policy (default: ``independent`` if present, else the first row's).

    Raises:
        InputError: a reference that is not one of the table's policies.
    """
    pols = list(table.policy)
    ref = reference or ("independent" if "independent" in pols else pols[0])
    if ref not in pols:
        raise InputError(f"reference policy {ref!r} is not among the runs ({', '.join(pols)})", field="--reference")
    r = table[table.policy == ref].iloc[0]
    t = table.copy()
    t["reference"] = ref
    t["real_ratio"] = t.real_avg_jct_s / float(r.real_avg_jct_s)
    t["sim_ratio"] = t.sim_avg_jct_s / float(r.sim_avg_jct_s)
    t["ratio_error"] = t.sim_ratio / t.real_ratio - 1
    real_order = "<".join(t.sort_values(["real_avg_jct_s", "policy"], kind="stable").policy)
    sim_order = "<".join(t.sort_values(["sim_avg_jct_s", "policy"], kind="stable").policy)
    t["real_rank_order"], t["sim_rank_order"] = real_order, sim_order
    t["ranking_kept"] = real_order == sim_order
    return t


def validate_runs(real_dirs: list[str | Path], out_dir: str | Path, *, force: bool = False,
                  step_times: str = "auto", progress: bool = False, artifact: str | Path | None = None,
                  reference: str | None = None, host_speed: str = "auto",
                  probe_window_s: float | None = None, probe_cost: bool = True) -> pd.DataFrame:
    """Validate every run in ``real_dirs``; write the validation directory (as a unit); return its
    table (``add_ratios``' columns included). ``artifact``, ``probe_window_s``, ``probe_cost``: see
    ``simulate``;
    ``host_speed`` is decided once for all the runs (``host_speed_mode``: ``auto`` is ``probes``
    only when every run has probes).

    Raises:
        InputError: a directory that is not an executed run, inputs of different workloads or a
            policy given twice (``check_inputs``), an unknown ``reference``, host-speed inputs
            missing (``host_speed_mode``), or an ``out_dir`` that may not be written (nothing is
            written then).
    """
    from tlora_sim.sim.executor.figure import plot_validation

    if not real_dirs:
        raise InputError("validate-run needs at least one executed run directory")
    dirs = [Path(d) for d in real_dirs]
    check_inputs(dirs)
    if reference is not None and reference not in {load_run(d)[0]["policy"] for d in dirs}:
        raise InputError(f"reference policy {reference!r} is not among the runs", field="--reference")
    if artifact is not None:
        from tlora_sim.sim.costmodel.profiled.artifact import load_artifact

        load_artifact(artifact)
    if probe_window_s is not None:
        from tlora_sim.sim.executor.host_speed import check_window

        check_window(probe_window_s)  # refused before anything is written
    host = host_speed_mode(dirs, host_speed, step_times, artifact)
    out = check_out_dir(out_dir, force=force, what="validation")
    with staged_dir(out) as stage:
        rows, per_job, divs = [], [], []
        it = dirs
        if progress:
            from tqdm import tqdm

            it = tqdm(dirs, desc="validate-run", unit="run")
        for d in it:
            row, both, div = simulate(d, stage, step_times, artifact, host, probe_window_s, probe_cost=probe_cost)
            rows.append(row)
            per_job.append(both)
            divs.append(div)
        table = add_ratios(pd.DataFrame(rows), reference)
        table = table[COLUMNS + [c for c in table.columns if c not in COLUMNS]]
        write_csv(RunDir(stage).validation, table)
        jobs = pd.concat(per_job, ignore_index=True)
        write_csv(stage / "validation_jobs.csv", jobs)
        write_csv(stage / DIVERGENCE, pd.concat(divs, ignore_index=True))
        plot_validation(jobs, stage)
    return table
