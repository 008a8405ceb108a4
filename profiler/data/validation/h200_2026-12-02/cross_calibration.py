"""Each calibration of 2026-12-02 (start, and 15 minutes later: end) predicting both calibrations' points, with and
without the probe factor (quantised to 0.5% as validate-run does), and the shipped artifact beside.
Run from the repository root: python profiler/data/validation/h200_2026-12-02/cross_calibration.py
Writes cross_calibration.txt beside it."""
import json, numpy as np, pandas as pd
from tlora_sim.profiler import calibrate as cb
D = "profiler/data/validation/h200_2026-12-02/"
arts = {n: json.load(open(D + f"calibrated_h200{n}.json")) for n in ("", "_end")}
pts = {n: pd.read_csv(D + f"calibrated_h200{n}_points.csv") for n in ("", "_end")}
ship = json.load(open("profiler/data/costmodel_h200.json"))
rows = []
for a in arts:
    for b in pts:
        p = pts[b]; ref = arts[a]["calibration"]["probe"]["ref_ms"]
        f = p.probe_ms.to_numpy() / ref
        for mode, pred in (("probes", cb.predict_at_speed(arts[a], p, np.round(f / 0.005) * 0.005)),
                           ("no probe", cb.predict_ms(arts[a], p))):
            e = np.abs(pred / p.measured_ms - 1)
            hb = (p.tokens <= 2048).to_numpy()
            rows.append(dict(artifact="start" if a == "" else "end", points="start" if b == "" else "end", mode=mode,
                             median=np.median(e), p90=np.quantile(e, 0.9), host_bound_median=np.median(e[hb]),
                             gpu_bound_median=np.median(e[~hb])))
for b in pts:
    p = pts[b]; e = np.abs(cb.predict_ms(ship, p) / p.measured_ms - 1); hb = (p.tokens <= 2048).to_numpy()
    rows.append(dict(artifact="shipped", points="start" if b == "" else "end", mode="-", median=np.median(e),
                     p90=np.quantile(e, 0.9), host_bound_median=np.median(e[hb]), gpu_bound_median=np.median(e[~hb])))
text = pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.2%}")
print(text)
open(D + "cross_calibration.txt", "w").write(text + "\n")
