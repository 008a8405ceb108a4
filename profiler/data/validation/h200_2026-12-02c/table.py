"""Every validation of this directory (validate.sh's) as one markdown table: python
profiler/data/validation/h200_2026-12-02c/table.py (writes table.md beside it)."""
from pathlib import Path

import pandas as pd

D = Path("profiler/data/validation/h200_2026-12-02c")
ORDER = ["calibrated", "calibrated_no_probe", "calibrated_probe_cost_ignored", "machine1_calibration",
         "shipped", "measured"]
rows = []
for w, d in (("A, machine 1", D / "A"), ("B, machine 1", D / "B"), ("A, machine 2", D / "machine2/A")):
    for v in ORDER:
        f = d / f"validation_{v}" / "validation.csv"
        if not f.is_file():
            continue
        t = pd.read_csv(f)
        for r in t.itertuples():
            rows.append({"workload, machine": w, "validation": v + (" (of record)" if v == "calibrated" else ""),
                         "policy": r.policy, "real avg JCT s": f"{r.real_avg_jct_s:.1f}",
                         "sim": f"{r.sim_avg_jct_s:.1f}", "avg JCT error": f"{r.avg_jct_error:+.1%}",
                         "per-job p90": f"{r.jct_abs_error_p90:.1%}", "ratio error": f"{r.ratio_error:+.1%}",
                         "ranking kept": "yes" if r.ranking_kept else "no"})
text = pd.DataFrame(rows).to_markdown(index=False)
(D / "table.md").write_text(text + "\n")
print(text)
