"""Command-line wiring of ``tlora-sim profile`` and ``tlora-sim costmodel show|validate|fit``.

``add_parsers(subparsers)`` adds both sub-commands to the ``tlora-sim`` parser; ``run(args)``
runs them (returns the exit status; raises ``InputError`` for bad input, which ``tlora_sim.sim.cli.main`` turns
into a one-line error). ``profile`` needs torch (the ``[profiler]`` extra) and a GPU, or
``--device cpu --tiny`` for a dry run; ``costmodel`` needs neither.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tlora_sim.traces.errors import InputError

COMMANDS = ("profile", "costmodel")


def add_parsers(sub) -> None:
    """Add ``profile`` and ``costmodel`` to an ``add_subparsers()`` object."""
    from tlora_sim.profiler.profile import add_arguments  # stdlib-only at import time

    p = sub.add_parser("profile", help="measure co-located LoRA training steps on this GPU (needs torch)",
                       description="Time forward + backward + optimizer of a full decoder layer for mixes of "
                                   "LoRA adapters (plans alone, loop, fused), the base curve, attention, LM head and "
                                   "AdamW; write DIR/profile_<gpu>.csv (and DIR/e2e_<gpu>.csv with --e2e).")
    add_arguments(p)
    c = sub.add_parser("costmodel", help="inspect, validate or fit the profiled cost model")
    cs = c.add_subparsers(dest="costmodel_command", required=True, metavar="ACTION")
    s = cs.add_parser("show", help="artifact metadata, provenance, coverage and held-out error")
    s.add_argument("--gpu", default="H100", help="GPU type of the shipped artifact (default: %(default)s)")
    s.add_argument("--artifact", type=Path, help="an artifact file instead of the shipped one")
    s.add_argument("--json", action="store_true", help="print the metadata as JSON")
    v = cs.add_parser("validate", help="fit on part of the measured mixes, predict the held-out rest",
                      description="Hold out every k-th measured mix of each model, fit on the rest, print the "
                                  "absolute percentage error of the predicted layer step by model and mix size; the "
                                  "last line is heldout_mape=<fraction> (mean APE). With --against-artifact: "
                                  "predict every mix row of --data with the shipped artifact instead (no refit).")
    v.add_argument("--gpu", default="H100", help="GPU type (default: %(default)s)")
    v.add_argument("--data", action="append", type=Path, metavar="CSV_OR_DIR",
                   help="profile CSV(s) or directories (default: profiler/data/profile_<gpu>.csv); repeatable")
    v.add_argument("--holdout-every", type=int, default=4, metavar="K", help="hold out every K-th mix (default: 4)")
    v.add_argument("--against-artifact", action="store_true",
                   help="no refit: predict the rows of --data with the shipped artifact (reproducibility check)")
    v.add_argument("--artifact", type=Path, help="artifact for --against-artifact / --e2e (default: shipped)")
    v.add_argument("--e2e", type=Path, metavar="CSV", help="also compare full-model steps of an e2e CSV")
    v.add_argument("--out", type=Path, metavar="CSV", help="write the per-row predictions here")
    v.add_argument("--multigpu", action="append", type=Path, metavar="CSV_OR_DIR",
                   help="two-GPU profile CSV(s) or directories for the multi-GPU held-out error (default: "
                        "profiler/data/multigpu/ where it has multigpu_<gpu>*.csv); the last line is then "
                        "multigpu_heldout_median_ape=<fraction>")
    pr = cs.add_parser("predict", help="ask the cost model for one step: time, memory and parallelism plan",
                       description="Predict one training step of a job or super-model group. MEMBERS is a comma-"
                                   "separated list of rank:sequences:seq_len, one per adapter, where sequences are the "
                                   "whole job's per step (split over the data-parallel ranks, whole sequences). The "
                                   "last line is step_time_s=X memory_bytes=Y parallelism=Z measured=yes|no "
                                   "(measured=no: some term was extrapolated beyond the profiles; the reasons are "
                                   "printed above it).")
    pr.add_argument("--gpu", default="H100", help="GPU type (default: %(default)s)")
    pr.add_argument("--model", required=True, help="base model, e.g. llama3-8b")
    pr.add_argument("--members", required=True, metavar="R:B:S[,R:B:S...]",
                    help="adapters as rank:sequences per step:tokens per sequence, e.g. 16:8:1024,8:4:512")
    pr.add_argument("--gpus", type=int, default=1, metavar="N", help="GPUs of the job or group (default: 1)")
    pr.add_argument("--plan", default=None, help="execution plan: alone, loop, fused, lorafusion, grouped "
                                                 "(default: alone for one member, fused for several)")
    pr.add_argument("--parallelism", default=None, metavar="KIND",
                    help="force a parallelism plan (dp, fsdp, tp, pp, local, or a full name like tp2-dp4); "
                         "default: the planner's fastest plan that fits memory")
    pr.add_argument("--nano-batches", type=int, default=1, metavar="N")
    pr.add_argument("--micro-batches", type=int, default=1, metavar="B")
    pr.add_argument("--cost-model", default="auto", help="auto, profiled or roofline (default: %(default)s)")
    pr.add_argument("--artifact", type=Path, metavar="FILE",
                    help="a profiled artifact instead of the shipped one, e.g. one written by `costmodel calibrate` "
                         "(its GPU type must be --gpu's; not with --cost-model roofline)")
    fm = cs.add_parser("fit-multigpu", help="fit the multi-GPU terms to a two-GPU profile",
                       description="Fit host_scale, per_tensor_ms and sync_ms and take the collective curves from "
                                   "the CSV(s) of `python -m tlora_sim.profiler.multigpu`; write "
                                   "OUT/multigpu_<gpu>.json with the leave-one-row-out held-out error.")
    fm.add_argument("--gpu", default="H200")
    fm.add_argument("--data", action="append", type=Path, required=True, metavar="CSV_OR_DIR")
    fm.add_argument("--out", type=Path, default=None, help="directory (default: profiler/data)")
    cal = cs.add_parser("calibrate", help="fit this machine's host and GPU terms over the shipped artifact (GPU, minutes)",
                        description="Measure a designed set of full-model training steps (plans alone, loop, fused, "
                                    "nano-batches; both 8B base-model families) through the executor's training step, "
                                    "fit host scales per plan family, a GPU scale and a per-step constant over the "
                                    "shipped artifact, print the held-out points' error (all, host-bound, GPU-bound) under the shipped and the "
                                    "calibrated artifact, and write the calibrated artifact (with its provenance and "
                                    "every measured point) to --out (profiler/calibrate.py). 44 points (22 per model, "
                                    "14 of them of 512-3,072 tokens, host-bound or near the crossover: 1-4 member loops "
                                    "and fused mixes of "
                                    "512-2,048-token jobs; ~150 s on one H200), each 2 warm-up and 3-16 timed steps (1.5 s), with "
                                    "3-5 readings of a host-speed probe before, between and after them "
                                    "(sim/executor/probe.py, ~25 ms each); "
                                    "the host terms are fitted relative to the probe's median (calibration.probe."
                                    "ref_ms), so validate-run can follow a run's own probes (probes.csv).")
    cal.add_argument("--gpu-name", default="auto",
                     help="GPU type whose shipped artifact is calibrated (auto: this CUDA device's; default: %(default)s)")
    cal.add_argument("--out", type=Path, required=True, metavar="FILE", help="the calibrated artifact (JSON) to write")
    cal.add_argument("--budget-s", type=float, default=150.0, metavar="S",
                     help="wall-clock seconds of measurement, model builds included (default: %(default)s)")
    cal.add_argument("--artifact", type=Path, help="the artifact to calibrate (default: the shipped one of the GPU)")
    cal.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where to measure (default: cuda)")
    cal.add_argument("--tiny", action="store_true", help="train the tiny shape (a dry run of the machinery, on the CPU)")
    cal.add_argument("--models", default=",".join(("llama3-8b", "qwen3-8b")), metavar="M[,M...]",
                     help="base models to measure (default: %(default)s)")
    cal.add_argument("--points", type=Path, metavar="CSV|JSON",
                     help="fit these measured points instead of measuring (no GPU): a previous run's --points-out "
                          "CSV, or a calibrated artifact (its points and machine provenance)")
    cal.add_argument("--machine-note", default=None, metavar="TEXT",
                     help="with --points CSV: what is known of the machine that measured them (provenance)")
    cal.add_argument("--points-out", type=Path, metavar="CSV",
                     help="also write the measured points here (and their probe measurements beside it, "
                          "CSV_probes.csv, which --points CSV reads back where it exists)")
    cal.add_argument("--force", action="store_true", help="replace an existing --out")
    f = cs.add_parser("fit", help="fit an artifact from profile CSVs (validates first)")
    f.add_argument("--gpu", default="H100")
    f.add_argument("--data", action="append", type=Path, required=True, metavar="CSV_OR_DIR")
    f.add_argument("--out", type=Path, default=None, help="directory (default: profiler/data)")
    f.add_argument("--holdout-every", type=int, default=4, metavar="K")
    f.add_argument("--correction", action="store_true", help="add the kernel-smoothed residual correction")


def run(args) -> int:
    """Run ``profile`` or ``costmodel``; returns the exit status."""
    if args.command == "profile":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise InputError("`tlora-sim profile` needs torch: pip install 'tlora-sim[profiler]'") from None
        from tlora_sim.profiler.profile import run as run_profile

        return run_profile(args)
    if args.command != "costmodel":
        raise InputError(f"not a cost-model command: {args.command}")
    from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel
    from tlora_sim.sim.costmodel.profiled.artifact import artifact_path, data_dir, load_artifact

    cmd = args.costmodel_command
    if cmd == "show":
        art = load_artifact(args.artifact or artifact_path(args.gpu))
        print(json.dumps(_meta(art), indent=1) if args.json else _show(art))
        return 0
    if cmd == "calibrate":
        return _calibrate(args)
    if cmd == "fit":
        from tlora_sim.profiler.fit import build

        path, s = build([str(p) for p in args.data], args.gpu, args.out or data_dir(), args.holdout_every,
                        args.correction)
        print(f"wrote {path}: held-out median APE {s['median_ape']:.2%}, p90 {s['p90_ape']:.2%} "
              f"({s['rows']} rows, {s['mixes']} mixes)")
        print(f"heldout_mape={s['mape']:.4f}")
        return 0
    if cmd == "fit-multigpu":
        from tlora_sim.profiler.fit_multigpu import build as build_multigpu

        path, s = build_multigpu([str(p) for p in args.data], args.gpu, args.out or data_dir())
        print(f"wrote {path}: host_scale {s['host_scale']}, per_tensor_ms {s['per_tensor_ms']:.4f}, "
              f"sync_ms {s['sync_ms']:.2f}; held-out median APE {s['median_ape']:.2%}, p90 {s['p90_ape']:.2%} "
              f"({s['rows']} rows)")
        print(f"multigpu_heldout_median_ape={s['median_ape']:.4f}")
        return 0
    if cmd == "predict":
        from tlora_sim.sim.cli.predict import predict_command

        return predict_command(args)
    # validate
    import pandas as pd
    from tlora_sim.profiler.fit import (
        e2e_table,
        error_table,
        predict_rows,
        read_rows,
        summarize,
        validate,
    )

    data = args.data or [data_dir() / f"profile_{args.gpu.lower()}.csv"]
    df = read_rows([str(p) for p in data])
    pd.set_option("display.width", 160)
    if args.e2e:
        cm = ProfiledCostModel(load_artifact(args.artifact or artifact_path(args.gpu)))
        e2e = pd.read_csv(args.e2e, dtype={"ranks": str, "batch_sizes": str, "seq_lens": str}, keep_default_na=False)
        for c in ("step_ms", "tokens", "peak_bytes"):
            e2e[c] = pd.to_numeric(e2e[c], errors="coerce")
        t = e2e_table(cm, e2e)
        print("full-model step (1 GPU): predicted vs measured")
        print(t.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    if args.artifact and not args.against_artifact and not args.e2e:
        raise InputError("--artifact needs --against-artifact or --e2e (a refit validation does not read an "
                         "artifact); without them the shipped data would be validated instead", field="--artifact")
    if args.against_artifact:
        art = load_artifact(args.artifact or artifact_path(args.gpu))
        mix = df[(df.kind == "mix") & (df.gpu.astype(str).str.upper() == args.gpu.upper())]
        pred = predict_rows(art, mix)
        if pred.empty:
            raise InputError("no mix rows of that GPU in --data")
        s = summarize(pred)
        print(f"artifact {art['id']} against {len(pred)} measured mix rows (no refit)")
    else:
        pred, s = validate(df, args.gpu, args.holdout_every)
        print(f"held-out validation ({s['split']}): {s['rows']} rows, {s['mixes']} mixes")
    print(error_table(pred).to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    if args.out:
        pred.to_csv(args.out, index=False)
    print(f"median_ape={s['median_ape']:.4f} p90_ape={s['p90_ape']:.4f} max_ape={s['max_ape']:.4f} "
          f"extrapolated_rows={int(pred.extrapolated.sum())}")
    print(f"heldout_mape={s['mape']:.4f}")
    mg = args.multigpu or ([data_dir() / "multigpu"] if sorted((data_dir() / "multigpu").glob(
        f"multigpu_{args.gpu.lower()}*.csv")) else [])
    if mg:
        from tlora_sim.profiler.fit_multigpu import validate as validate_multigpu

        t, ms = validate_multigpu([str(p) for p in mg], args.gpu)
        print(f"multi-GPU steps ({ms['split']}; {ms['rows']} rows of {', '.join(map(str, mg))}):")
        t.to_csv(args.out.with_name(args.out.stem + "_multigpu.csv"), index=False) if args.out else None
        g = t.groupby(["parallelism", "plan"]).ape.agg(["count", "median", "max"]).reset_index()
        print(g.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
        if ms["repeat_configs"]:
            print(f"repeatability: {ms['repeat_configs']} configurations measured in two runs differ by median "
                  f"{ms['repeat_median_diff']:.1%}, p90 {ms['repeat_p90_diff']:.1%} (max/min - 1)")
        print(f"multigpu_heldout_p90_ape={ms['p90_ape']:.4f}")
        print(f"multigpu_heldout_median_ape={ms['median_ape']:.4f}")
    else:
        print(f"(no two-GPU profile for {args.gpu}: no multi-GPU held-out error)")
    return 0


def _calibrate(args) -> int:
    """``costmodel calibrate`` (``profiler/calibrate.py``)."""
    import math
    import time

    import pandas as pd
    from tlora_sim.profiler import calibrate as cb
    from tlora_sim.sim.costmodel.profiled.artifact import artifact_path, load_artifact

    if args.out.exists() and not args.force:
        raise InputError("exists; pass --force to replace it", file=str(args.out))
    if not (math.isfinite(args.budget_s) and 0 < args.budget_s <= 3600):
        raise InputError(f"--budget-s must be in (0, 3600], got {args.budget_s}", field="--budget-s")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.points is None:
        try:
            import torch
        except ImportError:
            raise InputError("`costmodel calibrate` measures with torch: pip install 'tlora-sim[profiler]' "
                             "(or fit earlier points with --points)") from None
        if args.device == "cuda" and not torch.cuda.is_available():
            raise InputError("--device cuda but torch sees no GPU; use --device cpu --tiny for a dry run",
                             field="--device")
        if args.device == "cpu" and not args.tiny:
            raise InputError("--device cpu measures the CPU: add --tiny (a dry run of the machinery)", field="--tiny")
    gpu = args.gpu_name
    if gpu == "auto":
        if args.device == "cuda" and args.points is None:
            from tlora_sim.profiler.provenance import short_gpu_name

            gpu = short_gpu_name(torch.cuda.get_device_name(0))
        elif args.artifact is None:
            raise InputError("--gpu-name auto needs a CUDA device; name the GPU type (e.g. H200)", field="--gpu-name")
    art = load_artifact(args.artifact or artifact_path(gpu))
    missing = [m for m in models if m not in art["models"]]
    if missing:
        raise InputError(f"models {missing} are not in artifact {art['id']} ({', '.join(art['models'])})",
                         field="--models")
    created, probes, what = None, None, None
    if args.points is not None and args.points.suffix == ".json":  # a calibrated artifact: its points and machine
        prev = load_artifact(args.points).get("calibration")
        if not isinstance(prev, dict) or not isinstance(prev.get("points"), list):
            raise InputError("not a calibrated artifact (no calibration.points)", file=str(args.points))
        pts = pd.DataFrame(prev["points"])
        lacking = [c for c in cb.POINT_COLUMNS if c not in pts.columns and c not in cb.OPTIONAL_COLUMNS]
        if lacking:
            raise InputError(f"calibration.points lacks {lacking}", file=str(args.points))
        pts = pts.reindex(columns=cb.POINT_COLUMNS)
        if isinstance(prev.get("probe"), dict):
            probes, what = pd.DataFrame(prev["probe"].get("probes", []), columns=cb.PROBE_COLUMNS), prev["probe"].get("what")
        machine = {**prev.get("machine", {}), "refit_of": str(args.points)}
        measured_s = prev.get("measured_s")
        created = load_artifact(args.points).get("created")  # a refit of the same points is byte-identical
    elif args.points is not None:
        try:
            pts = pd.read_csv(args.points, dtype={"members": str})
        except (OSError, ValueError) as e:
            raise InputError(f"cannot read calibration points ({e})", file=str(args.points)) from None
        lacking = [c for c in cb.POINT_COLUMNS if c not in pts.columns and c not in cb.OPTIONAL_COLUMNS]
        if lacking:
            raise InputError(f"lacks column(s) {lacking}", file=str(args.points))
        pts = pts.reindex(columns=cb.POINT_COLUMNS)
        side = _probes_path(args.points)
        if side.exists():
            from tlora_sim.sim.report.runcsv import read_run_csv

            probes = read_run_csv(side, side.name, cb.PROBE_COLUMNS)[cb.PROBE_COLUMNS]
            try:  # the probe of this tree (the one --points-out's measurement ran)
                from tlora_sim.sim.executor.probe import what as probe_what

                what = probe_what()
            except ImportError:  # no torch here
                what = None
        measured_s = None
        machine = {"points": str(args.points), "machine": args.machine_note or "not recorded"}
    else:
        t0 = time.perf_counter()
        from tlora_sim.sim.executor.calibration import measure
        from tlora_sim.sim.executor.probe import what as probe_what

        pts, probes = measure(cb.design(models), args.device, args.tiny, args.budget_s)
        measured_s = time.perf_counter() - t0
        machine, what = cb.machine_info(args.device), probe_what()
        print(f"measured {len(pts)} points in {measured_s:.1f} s ({len(probes)} probes)")
        if args.points_out:
            pts.to_csv(args.points_out, index=False)
            probes.to_csv(_probes_path(args.points_out), index=False)
    if (pts.measured_ms <= 0).any() or pts.measured_ms.isna().any():
        raise InputError("measured step times must be > 0", file=str(args.points or "measurement"),
                         field="measured_ms")
    probe = pd.to_numeric(pts.probe_ms, errors="coerce")
    bad = (pts.probe_ms.notna() & ~((probe > 0) & (probe < float("inf")))).to_numpy()
    if bad.any():  # empty is allowed (points measured before the probe: fitted without it)
        raise InputError(f"probe_ms must be empty or a finite number > 0, got {pts.probe_ms.iloc[bad.argmax()]!r}",
                         file=str(args.points or "measurement"), row=int(bad.argmax()) + 1, field="probe_ms")
    cal, pts = cb.build(art, pts, machine, measured_s, created=created, probes=probes, probe_what=what)
    cb.write_artifact(cal, args.out)
    p = cal["calibration"]["params"]
    print(cb.error_table(pts))
    pr = cal["calibration"]["probe"]
    print(f"probe: reference {pr['ref_ms']:.2f} ms (median of {pr['points']} points; factors "
          f"{pts.probe_factor.min():.3f}-{pts.probe_factor.max():.3f}); {pr['what']}" if pr else
          "probe: none (points without probe_ms: fitted at factor 1, as before the probe)")
    print("params: " + ", ".join(f"{k} {v:.3f}" for k, v in p.items()))
    print(f"wrote {args.out} ({cal['id']}, over {art['id']})")
    e = cal["calibration"]["error"]
    print(f"heldout_median_ape_shipped={e['shipped']['heldout']['median_ape']:.4f} "
          f"heldout_median_ape_calibrated={e['calibrated']['heldout']['median_ape']:.4f} "
          f"heldout_median_ape_calibrated_no_probe={e['calibrated_no_probe']['heldout']['median_ape']:.4f}")
    c = e["calibrated"]
    print(f"heldout_median_ape_calibrated_host_bound={c['heldout_host_bound']['median_ape']:.4f} "
          f"({c['heldout_host_bound']['points']} points, host share >= {cb.HOST_BOUND_SHARE}) "
          f"heldout_median_ape_calibrated_gpu_bound={c['heldout_gpu_bound']['median_ape']:.4f} "
          f"({c['heldout_gpu_bound']['points']} points)")
    return 0


def _probes_path(points: Path) -> Path:
    """Where ``--points-out CSV`` writes the probe measurements: ``CSV_probes.csv`` beside it."""
    return points.with_name(points.stem + "_probes.csv")


def calibration_error_line(art: dict) -> str:
    """One ``costmodel show`` line: a calibrated artifact's held-out median |error| (calibrated, at
    each point's probe factor), split into host-bound and GPU-bound points
    (``profiler/calibrate.py`` ``host_share``, computed from the stored points where the artifact
    predates the split); a line saying why where the points do not allow it."""
    import pandas as pd
    from tlora_sim.profiler import calibrate as cb

    pts = pd.DataFrame(art["calibration"].get("points") or [])
    if pts.empty or "calibrated_ms" not in pts or not (pts.get("role") == "heldout").any():
        return "  calibration held-out: no held-out points stored"
    try:
        pts["host_share"] = cb.host_share(art, pts)
    except Exception as e:  # noqa: BLE001 - a display line; the artifact itself was checked on load
        return f"  calibration held-out: not computed ({type(e).__name__}: {e})"
    s = cb.summarize(pts, "calibrated_ms")
    h, hb, gb = s["heldout"], s["heldout_host_bound"], s["heldout_gpu_bound"]
    fmt = lambda d: f"{d['median_ape']:.2%} ({d['points']})" if d["points"] else "- (0)"  # noqa: E731
    return (f"  calibration held-out median |error| {fmt(h)}: host-bound {fmt(hb)}, GPU-bound {fmt(gb)} "
            f"(host share >= {cb.HOST_BOUND_SHARE}; on the lent H200 hosts two measurements of a host-bound point "
            "differed by a median 10.5%: profiler/data/validation/README.md)")


def host_floor(art: dict) -> list[tuple]:
    """Per model: (model, the smallest job's tokens, its ``alone`` step ms, the host-bound part ms:
    layers x the loop family's in-model host time of one adapter and one sequence length).
    The smallest job: the lowest rank, one sequence of the shortest measured attention length."""
    from tlora_sim.sim.costmodel.interface import Member
    from tlora_sim.sim.costmodel.models import get_model
    from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel

    cm = ProfiledCostModel(art, checkpointing=False)
    out = []
    for name, e in sorted(art["models"].items()):
        pe = e["plans"].get("loop")
        if pe is None:
            continue
        s = min(int(x) for x in e["attn"])
        r = int(pe.get("coverage", {}).get("rank_min", 2))
        step = 1e3 * cm.step_time_s(name, art["gpu"], (Member(r, 1, s),), 1, "alone")
        host = pe.get("cpu0", 0.0) + pe.get("cpu_n", 0.0) + pe.get("cpu_g", 0.0)
        call = pe.get("call_ms_alone", pe.get("call_ms", 0.0))
        out.append((name, s, step, get_model(name).layers * max(host - call, 0.5 * host)))
    return out


def _meta(art: dict) -> dict:
    cov = {}
    for m, e in art["models"].items():
        cov[m] = {"tokens_l0": [e["l0"]["tokens"][0], e["l0"]["tokens"][-1]],
                  "attn_seq_lens": sorted(int(s) for s in e["attn"]),
                  "head_tokens": [e["head"]["tokens"][0], e["head"]["tokens"][-1]],
                  "plans": {p: pe["coverage"] for p, pe in e["plans"].items()}, "rows": e.get("rows", {}),
                  "variants": e.get("variants", {})}
    return {"id": art["id"], "version": art.get("version"), "gpu": art["gpu"], "created": art.get("created"),
            "path": art.get("_path"), "sha256": art.get("_sha256"), "source": art.get("source"),
            "heldout": art.get("heldout"), "ceilings": art.get("ceilings"),
            "calibration": ({k: v for k, v in art["calibration"].items() if k != "points"}
                            if isinstance(art.get("calibration"), dict) else None), "coverage": cov}


def _show(art: dict) -> str:
    m = _meta(art)
    s, h = m["source"] or {}, m["heldout"] or {}
    out = [f"cost model {m['id']} (version {m['version']}, {m['gpu']}) created {m['created']}",
           f"  file     {m['path']}  sha256 {str(m['sha256'])[:16]}",
           f"  device   {', '.join(s.get('gpu_name', []))}; driver {', '.join(s.get('driver', []))}; "
           f"CUDA {', '.join(s.get('cuda', []))}",
           f"  software torch {', '.join(s.get('torch', []))}, triton {', '.join(s.get('triton', []))}",
           f"  commit   {', '.join(c[:12] for c in s.get('git_commit', []))} (dirty: {', '.join(s.get('git_dirty', []))})",
           f"  kernels  {', '.join(s.get('kernel_variants', []))}",
           f"  measured {' .. '.join(s.get('measured', []))}; {s.get('rows')} rows; profiles "
           f"{', '.join(s.get('profile_id', []))} ({', '.join(s.get('mode', []))})"]
    if m.get("ceilings"):
        out.append("  ceilings " + ", ".join(f"{k} {v:.0f}" for k, v in m["ceilings"].items())
                   + " (TFLOP/s, GB/s)")
    cal = art.get("calibration")
    if isinstance(cal, dict):
        p, mach = cal.get("params", {}), cal.get("machine", {})
        out.append(f"  calibrated over {cal.get('base_artifact')} on {mach.get('gpu_name', '?')} / {mach.get('cpu', '?')}: "
                   + ", ".join(f"{k} {v:.3f}" for k, v in p.items()))
        out.append(calibration_error_line(art))
    probe = cal.get("probe") if isinstance(cal, dict) else None
    try:
        floor = host_floor(art)
    except Exception as e:  # noqa: BLE001 - a display line; the artifact itself was checked on load
        floor, out = [], out + [f"  host floor: not computed ({type(e).__name__}: {e})"]
    for name, s_len, step, host in floor:
        out.append(f"  host floor {name:12s} smallest job (1 x {s_len} tokens, alone): step {step:.1f} ms, of which "
                   f"host-bound launches {host:.1f} ms (calibrate on another host or software stack)")
    if isinstance(probe, dict) and "ref_ms" in probe:
        out.append(f"  host floor at probe reference {probe['ref_ms']:.2f} ms ({probe.get('what', 'sim/executor/probe.py')}); "
                   f"on a host whose probe takes p ms its host terms are x p / {probe['ref_ms']:.2f}")
    elif isinstance(cal, dict):
        out.append("  host floor without a probe reference (calibrated without the host-speed probe)")
    if h:
        out.append(f"  held-out {h.get('rows')} rows / {h.get('mixes')} mixes: median APE {h['median_ape']:.2%}, "
                   f"p90 {h['p90_ape']:.2%}, mean {h['mape']:.2%}, max {h['max_ape']:.2%}")
    out.append("  coverage (per model: base-curve tokens, attention seq lens, head tokens; per plan family: "
               "mixes, adapters, tokens/GPU, ranks):")
    for name, c in m["coverage"].items():
        out.append(f"    {name:12s} l0 {c['tokens_l0'][0]:.0f}-{c['tokens_l0'][1]:.0f} tok, attn s {c['attn_seq_lens']}, "
                   f"head {c['head_tokens'][0]:.0f}-{c['head_tokens'][1]:.0f} tok")
        for p, cv in c["plans"].items():
            out.append(f"      {p:6s} {cv['mixes']:3d} mixes ({cv.get('rows', cv['mixes'])} rows), <= {cv['adapters_max']} adapters, "
                       f"{cv['tokens_min']:.0f}-{cv['tokens_max']:.0f} tok, ranks {cv['rank_min']}-{cv['rank_max']}")
    return "\n".join(out)


def main(argv=None) -> int:
    """Stand-alone entry (``python -m tlora_sim.sim.cli.costmodel``) until ``tlora_sim.sim.cli.main`` wires these in."""
    import sys

    ap = argparse.ArgumentParser(prog="tlora-sim")
    add_parsers(ap.add_subparsers(dest="command", required=True))
    args = ap.parse_args(argv)
    try:
        return run(args)
    except InputError as e:
        print(f"tlora-sim: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    import sys

    sys.exit(main())
