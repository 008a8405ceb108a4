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
    from tlora_sim.sim.costmodel.profiled import ProfiledCostModel, artifact_path, data_dir, load_artifact

    cmd = args.costmodel_command
    if cmd == "show":
        art = load_artifact(args.artifact or artifact_path(args.gpu))
        print(json.dumps(_meta(art), indent=1) if args.json else _show(art))
        return 0
    if cmd == "fit":
        from tlora_sim.profiler.fit import build

        path, s = build([str(p) for p in args.data], args.gpu, args.out or data_dir(), args.holdout_every,
                        args.correction)
        print(f"wrote {path}: held-out median APE {s['median_ape']:.2%}, p90 {s['p90_ape']:.2%} "
              f"({s['rows']} rows, {s['mixes']} mixes)")
        print(f"heldout_mape={s['mape']:.4f}")
        return 0
    # validate
    import pandas as pd

    from tlora_sim.profiler.fit import e2e_table, error_table, predict_rows, read_rows, summarize, validate

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
    return 0


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
            "heldout": art.get("heldout"), "ceilings": art.get("ceilings"), "coverage": cov}


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
