"""Exploratory, NOT in PLAN.md (decided after this validation's data): the executor trains a job
alone with the eager loop's code (``sim/executor/trainer.py`` ``IMPL["alone"] == "loop"``), but the
shipped H200 artifact removes a smaller harness overhead from ``alone`` layers than from ``loop``
ones (``call_ms_alone`` 0.68 ms against ``call_ms`` 1.26 ms per layer, from 2 and 5 profile pairs;
``sim/costmodel/profiled/formula.py`` ``layer_formula``). So it predicts a 1-member loop at 0.84 of
the same-size job alone, where the four calibrations of design v2 measured 0.98-1.79 (8 of 8
pairs above 0.84), and every calibration's shared host scale must split the difference: loops
under, jobs alone over. Hypothesis, with no new parameter: calibrate over the shipped artifact
with ``call_ms_alone`` set to ``call_ms`` ("alone is a 1-member loop"). This refits every committed
calibration with probes that way (the same points, probes and fit) and validates the runs of
2026-12-02b and 2026-12-02c with the refits, as their validations of record do (``--host-speed
probes``). The artifacts go to a temporary directory, not the repository. CPU only, from the
repository root:

    python profiler/data/validation/h200_2026-12-02c/alone_as_loop.py   (writes alone_as_loop.txt)
"""
import copy
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
from tlora_sim.profiler import calibrate as cb
from tlora_sim.sim.costmodel.profiled.artifact import load_artifact

V = Path("profiler/data/validation")
SHIPPED = load_artifact(Path("profiler/data/costmodel_h200.json"))
BASE = copy.deepcopy(SHIPPED)
for e in BASE["models"].values():
    pe = e["plans"]["loop"]
    pe["call_ms_alone"] = pe["call_ms"]
BASE["_sha256"] = str(SHIPPED.get("_sha256")) + "-alone-as-loop"
TMP = Path(tempfile.mkdtemp(prefix="alone_as_loop_"))
CALS = ["h200_2026-12-02/calibrated_h200", "h200_2026-12-02/calibrated_h200_end", "h200_2026-12-02b/calibrated_h200",
        "h200_2026-12-02b/machine2/calibrated_h200_m2", "h200_2026-12-02c/calibrated_h200",
        "h200_2026-12-02c/machine2/calibrated_h200_m2"]
lines = ["calibration: held-out median (host-bound / GPU-bound) of record -> refit alone-as-loop; "
         "median residual by plan (fit points, refit)"]
refit = {}
for name in CALS:
    art = load_artifact(V / f"{name}.json")
    c = art["calibration"]
    pts = pd.DataFrame(c["points"]).reindex(columns=cb.POINT_COLUMNS)
    probes = pd.DataFrame(c["probe"]["probes"], columns=cb.PROBE_COLUMNS)
    cal, out = cb.build(BASE, pts, {**c["machine"], "refit_of": name, "form": "alone as a 1-member loop"},
                        c.get("measured_s"), created=art.get("created"), probes=probes, probe_what=c["probe"]["what"])
    path = TMP / (name.replace("/", "_") + "_alone_as_loop.json")
    cb.write_artifact(cal, path)
    refit[name] = path
    old = pd.DataFrame(c["points"])
    old["host_share"] = cb.host_share(art, old)
    so, sn = cb.summarize(old, "calibrated_ms"), cal["calibration"]["error"]["calibrated"]
    by_plan = out[out.role == "fit"].groupby("plan").calibrated_error.median()
    lines.append(f"  {name:45s} {so['heldout']['median_ape']:.2%} ({so['heldout_host_bound']['median_ape']:.2%} / "
                 f"{so['heldout_gpu_bound']['median_ape']:.2%}) -> {sn['heldout']['median_ape']:.2%} "
                 f"({sn['heldout_host_bound']['median_ape']:.2%} / {sn['heldout_gpu_bound']['median_ape']:.2%}); "
                 + ", ".join(f"{p} {v:+.1%}" for p, v in by_plan.items())
                 + "; host_loop " + " / ".join(f"{v:.3f}" for k, v in cal["calibration"]["params"].items()
                                               if k.startswith("host_loop")))

lines.append("validations (--host-speed probes): avg JCT error of record -> alone-as-loop (ratio error), ranking kept")
for d, cal in (("h200_2026-12-02b/A", "h200_2026-12-02b/calibrated_h200"), ("h200_2026-12-02b/B", "h200_2026-12-02b/calibrated_h200"),
               ("h200_2026-12-02b/machine2/B", "h200_2026-12-02b/machine2/calibrated_h200_m2"),
               ("h200_2026-12-02c/A", "h200_2026-12-02c/calibrated_h200"), ("h200_2026-12-02c/B", "h200_2026-12-02c/calibrated_h200"),
               ("h200_2026-12-02c/machine2/A", "h200_2026-12-02c/machine2/calibrated_h200_m2")):
    runs = [str(V / d / p) for p in ("independent", "mlora", "tlora") if (V / d / p).is_dir()]
    out_dir = TMP / d.replace("/", "_")
    subprocess.run([sys.executable, "-m", "tlora_sim.sim.cli.main", "validate-run", *runs, "--artifact", str(refit[cal]),
                    "--host-speed", "probes", "--out", str(out_dir), "--force", "--no-progress"], check=True,
                   stdout=subprocess.DEVNULL)
    new = pd.read_csv(out_dir / "validation.csv").set_index("policy")
    rec = pd.read_csv(V / d / "validation_calibrated" / "validation.csv").set_index("policy")
    cells = [f"{p} {rec.avg_jct_error[p]:+.1%} -> {new.avg_jct_error[p]:+.1%} ({new.ratio_error[p]:+.1%})" for p in new.index]
    lines.append(f"  {d:30s} " + "; ".join(cells) + f"; ranking kept {bool(rec.ranking_kept.iloc[0])} -> "
                 f"{bool(new.ranking_kept.iloc[0])}")
text = "\n".join(lines)
print(text)
(Path(__file__).parent / "alone_as_loop.txt").write_text(text + "\n")
