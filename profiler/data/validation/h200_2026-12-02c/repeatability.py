"""How repeatable a calibration point is on the lent H200 hosts, and what that leaves of the
held-out target (CPU only, committed data; run from the repository root):

    python profiler/data/validation/h200_2026-12-02c/repeatability.py   (writes repeatability.txt)

1. The plan's mechanism check: the median |log ratio| of consecutive probe readings within a point
   (3-pass readings in h200_2026-12-02b, 9-pass in this directory).
2. Repeatability: the two calibrations of one machine 15 minutes apart (h200_2026-12-02/, the first
   design, the same 42 points): per point |log(measured_b / measured_a)|, split into host-bound
   and GPU-bound by ``profiler/calibrate.py``'s ``host_share`` under the first calibration. With
   independent scatter of SD s per measurement, a model exact at the mean has a median |error| of
   0.674 s and two measurements differ by a median 0.674 s sqrt(2): the floor of a point's error is
   about the median difference over sqrt(2).
3. Every calibration with probes: held-out median |error| of record (calibrated, at each point's
   probe factor), and split into host-bound and GPU-bound points (``summarize``).
"""
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
from tlora_sim.profiler import calibrate as cb
from tlora_sim.sim.costmodel.profiled.artifact import load_artifact

V = Path("profiler/data/validation")
lines = ["1. consecutive probe readings within a point: median |log ratio| (plan: <= 0.06 with 9 passes)"]
for f in ("h200_2026-12-02b/calibrated_h200", "h200_2026-12-02b/machine2/calibrated_h200_m2",
          "h200_2026-12-02c/calibrated_h200", "h200_2026-12-02c/machine2/calibrated_h200_m2"):
    p = pd.read_csv(V / f"{f}_points_probes.csv").sort_values("t_s", kind="stable")
    same = np.diff(p.point.to_numpy()) == 0
    d = np.abs(np.diff(np.log(p.probe_ms.to_numpy())))[same]
    reps = 9 if "02c" in f else 3
    lines.append(f"   {f:45s} {reps} passes: {np.median(d):.3f} over {same.sum()} pairs")

lines.append("2. one machine, two calibrations 15 min apart (h200_2026-12-02): |log(measured_b / measured_a)|")
D = V / "h200_2026-12-02"
a = pd.read_csv(D / "calibrated_h200_points.csv", dtype={"members": str})
b = pd.read_csv(D / "calibrated_h200_end_points.csv", dtype={"members": str})
m = a.merge(b, on=["model", "plan", "nano", "members"], suffixes=("", "_b"))
m["host_share"] = cb.host_share(load_artifact(D / "calibrated_h200.json"), m)
m["d"] = np.log(m.measured_ms_b / m.measured_ms).abs()
for lab, sel in (("host-bound", m.host_share >= cb.HOST_BOUND_SHARE), ("GPU-bound", m.host_share < cb.HOST_BOUND_SHARE)):
    x = m[sel].d
    lines.append(f"   {lab:10s} {len(x):2d} points: median {x.median():.3f}, p90 {x.quantile(0.9):.3f}, max {x.max():.3f}; "
                 f"floor of a point's error ~ {x.median() / math.sqrt(2):.3f}")

lines.append("3. held-out median |error| of record (calibrated), all / host-bound / GPU-bound (points); "
             "shipped artifact host-bound / GPU-bound")
for f in ("h200_2026-12-02/calibrated_h200", "h200_2026-12-02/calibrated_h200_end", "h200_2026-12-02b/calibrated_h200",
          "h200_2026-12-02b/machine2/calibrated_h200_m2", "h200_2026-12-02c/calibrated_h200",
          "h200_2026-12-02c/machine2/calibrated_h200_m2"):
    cal = load_artifact(V / f"{f}.json")
    pts = pd.DataFrame(cal["calibration"]["points"])
    pts["host_share"] = cb.host_share(cal, pts)
    s, sh = cb.summarize(pts, "calibrated_ms"), cb.summarize(pts, "shipped_ms")
    h, hb, gb = s["heldout"], s["heldout_host_bound"], s["heldout_gpu_bound"]
    lines.append(f"   {f:45s} {h['median_ape']:.2%} ({h['points']}) / {hb['median_ape']:.2%} ({hb['points']}) / "
                 f"{gb['median_ape']:.2%} ({gb['points']}); shipped {sh['heldout_host_bound']['median_ape']:.2%} / "
                 f"{sh['heldout_gpu_bound']['median_ape']:.2%}")
text = "\n".join(lines)
print(text)
(Path(__file__).parent / "repeatability.txt").write_text(text + "\n")
print(json.dumps({"written": str(Path(__file__).parent / "repeatability.txt")}))
