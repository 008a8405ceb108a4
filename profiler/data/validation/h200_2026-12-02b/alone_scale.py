"""Exploratory, NOT in PLAN.md (decided after this validation's data): is A/mLoRA's miss the one host
scale that jobs alone and loops share? Refit each calibration of 2026-12-02 and 2026-12-02b with a
separate host scale for jobs alone (``host_alone:<model>``) beside ``host_loop:<model>`` (loops
only, then), by setting each model's loop-family ``call_ms_alone`` so that a job alone's host time is
``host_alone`` times the shipped one (alone has one adapter and one sequence group, so its host time
is one number per model: cpu0 + cpu_n + cpu_g - call_ms_alone). No library change: the artifacts
written (``$TMPDIR/<calibration>_alone.json``, not kept in the repository) are ordinary calibrated
artifacts. Result: no better held-out error, and on workload A (machine 1) it moves the miss from
mLoRA to independent (-11.3 / -6.7 / +1.3%): not the fix. Prints each calibration's residuals by
plan and held-out error, of record and refitted. CPU only, from the repository root:

    python profiler/data/validation/h200_2026-12-02b/alone_scale.py
"""
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from tlora_sim.profiler import calibrate as cb
from tlora_sim.sim.costmodel.profiled.artifact import load_artifact

BASE = load_artifact(Path("profiler/data/costmodel_h200.json"))
CALS = [Path("profiler/data/validation/h200_2026-12-02/calibrated_h200.json"),
        Path("profiler/data/validation/h200_2026-12-02/calibrated_h200_end.json"),
        Path("profiler/data/validation/h200_2026-12-02b/calibrated_h200.json"),
        Path("profiler/data/validation/h200_2026-12-02b/machine2/calibrated_h200_m2.json")]


def derive_alone(params: dict) -> dict:
    """``cb.derive`` of the loop/fused/GPU parameters, then each model's alone host time at
    ``host_alone:<model>`` x the shipped one."""
    out = cb.derive(BASE, {k: v for k, v in params.items() if not k.startswith("host_alone")})
    for m, e in out["models"].items():
        a = params.get(f"host_alone:{m}")
        if a is None:
            continue
        pe, pe0 = e["plans"]["loop"], BASE["models"][m]["plans"]["loop"]
        base0 = pe0["cpu0"] + pe0["cpu_n"] + pe0["cpu_g"]
        base = pe["cpu0"] + pe["cpu_n"] + pe["cpu_g"]
        pe["call_ms_alone"] = base - a * (base0 - pe0["call_ms_alone"])
    out["_sha256"] = out["_sha256"] + "-alone-" + json.dumps(params, sort_keys=True)
    return out


def fit(pts: pd.DataFrame) -> dict:
    fp = pts[pts.role == "fit"]
    _, f = cb.probe_factors(pts)
    f = f[(pts.role == "fit").to_numpy()]
    meas = fp.measured_ms.to_numpy(float)
    free = [f"host_{g}:{m}" for m in sorted(set(fp.model)) for g in ("alone", "loop", "fused")] + \
        ["nano_host", "gpu_scale", "step_ms"]

    def unpack(x):
        return {k: (float(v) if k == "step_ms" else math.exp(v)) for k, v in zip(free, x)}

    def resid(x):
        return np.log(cb.predict_at_speed(derive_alone(unpack(x)), fp, f) / meas)

    lo = [0.0 if k == "step_ms" else math.log(0.25 if k != "nano_host" else 0.1) for k in free]
    hi = [100.0 if k == "step_ms" else math.log(4.0 if k.startswith("host") else 2.0) for k in free]
    r = least_squares(resid, [1.0 if k == "step_ms" else 0.0 for k in free], bounds=(lo, hi),
                      x_scale=[5.0 if k == "step_ms" else 0.1 for k in free], diff_step=1e-2, max_nfev=400,
                      loss="soft_l1", f_scale=0.05)
    return unpack(r.x)


lines = []
for src in CALS:
    art = json.loads(src.read_text())
    c = art["calibration"]
    pts = pd.DataFrame(c["points"])
    ref, f = cb.probe_factors(pts)
    params = fit(pts)
    alone = derive_alone(params)
    alone["id"] = art["id"] + "-alone"
    alone["calibration"] = {**c, "params": params, "form": "exploratory: a host scale of its own for jobs alone "
                            "(alone_scale.py)", "probe": c["probe"]}
    dst = Path(tempfile.gettempdir()) / f"{src.parent.name}_{src.stem}_alone.json"
    cb.write_artifact(alone, dst)
    for name, a in (("of record", art), ("alone scale", alone)):
        e = cb.predict_at_speed(a, pts, f) / pts.measured_ms - 1
        by = pts.assign(e=e).groupby(["plan", "role"]).e.median().unstack()
        ho = e[pts.role == "heldout"].abs()
        lines.append(f"{src.parent.name}/{src.name} {name}: held-out median {ho.median():.2%} p90 {ho.quantile(.9):.2%}; "
                     "median residual by plan (fit/heldout): " + "; ".join(
                         f"{p} {r.fit:+.1%}/{r.heldout:+.1%}" for p, r in by.iterrows()))
    lines.append("   alone-scale params: " + " ".join(f"{k}={v:.3f}" for k, v in params.items()))
text = "\n".join(lines)
print(text)
Path("profiler/data/validation/h200_2026-12-02b/alone_scale.txt").write_text(text + "\n")
