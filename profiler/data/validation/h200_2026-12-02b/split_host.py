"""The plan's one alternative fit, "split host" (PLAN.md): each calibration's own points and probes
refitted with ``profiler/calibrate.py``'s ``fit(split_host=True)`` (the per-adapter host term
``cpu_n`` gets its own scale per family and model). Writes ``calibrated_h200_split.json`` and
``machine2/calibrated_h200_m2_split.json`` beside the calibrations and prints their held-out errors
beside those of the calibrations of record. CPU only; run from the repository root:

    python profiler/data/validation/h200_2026-12-02b/split_host.py
"""
import json
from pathlib import Path

import pandas as pd
from tlora_sim.profiler import calibrate as cb
from tlora_sim.sim.costmodel.profiled.artifact import load_artifact

D = Path("profiler/data/validation/h200_2026-12-02b")
BASE = load_artifact(Path("profiler/data/costmodel_h200.json"))
lines = []
for src, dst in ((D / "calibrated_h200.json", D / "calibrated_h200_split.json"),
                 (D / "machine2/calibrated_h200_m2.json", D / "machine2/calibrated_h200_m2_split.json")):
    art = json.loads(src.read_text())
    c = art["calibration"]
    pts = pd.DataFrame(c["points"]).reindex(columns=cb.POINT_COLUMNS)
    probes = pd.DataFrame(c["probe"]["probes"], columns=cb.PROBE_COLUMNS)
    cal, out = cb.build(BASE, pts, {**c["machine"], "refit_of": str(src), "form": "split host (PLAN.md)"},
                        c.get("measured_s"), created=art.get("created"), probes=probes, probe_what=c["probe"]["what"],
                        split_host=True)
    cb.write_artifact(cal, dst)
    for name, a in (("of record", art), ("split host", cal)):
        e = a["calibration"]["error"]
        lines.append(f"{src.name:24s} {name:10s} held-out median {e['calibrated']['heldout']['median_ape']:.2%} "
                     f"p90 {e['calibrated']['heldout']['p90_ape']:.2%}; no probe "
                     f"{e['calibrated_no_probe']['heldout']['median_ape']:.2%}; params "
                     + " ".join(f"{k}={v:.3f}" for k, v in a["calibration"]["params"].items()))
text = "\n".join(lines)
print(text)
(D / "split_host.txt").write_text(text + "\n")
