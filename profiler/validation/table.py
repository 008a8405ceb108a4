"""Every validation of a validation directory as one markdown table (``table.md`` beside it).

    python profiler/validation/table.py DIR "LABEL=SUBDIR" ["LABEL=SUBDIR" ...]

Each ``SUBDIR`` (of ``DIR``) holds ``validate-run`` outputs named ``validation_<name>/``; they are
read in ``ORDER`` (the one of record first, marked), then any other name in sorted order. One row
per policy and validation: real and simulated avg JCT, the avg JCT error, the per-job p90, the
ratio error and whether the ranking is kept. Prints the table too. CPU only; pandas (``tabulate``
for the markdown).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

#: the validations a session's ``validate.sh`` writes, in the table's order (``calibrated``: of record)
ORDER = ["calibrated", "calibrated_no_probe", "calibrated_probe_cost_ignored", "split_host", "machine1_calibration",
         "shipped", "measured"]


def table(root: Path, parts: list[tuple[str, str]]) -> str:
    """The markdown table of ``root``'s validations: ``parts`` = (label, subdirectory) pairs."""
    rows = []
    for label, sub in parts:
        d = root / sub
        found = sorted(p.name[len("validation_"):] for p in d.glob("validation_*") if (p / "validation.csv").is_file())
        for v in [x for x in ORDER if x in found] + [x for x in found if x not in ORDER]:
            t = pd.read_csv(d / f"validation_{v}" / "validation.csv")
            for r in t.itertuples():
                rows.append({"workload, machine": label, "validation": v + (" (of record)" if v == "calibrated" else ""),
                             "policy": r.policy, "real avg JCT s": f"{r.real_avg_jct_s:.1f}",
                             "sim": f"{r.sim_avg_jct_s:.1f}", "avg JCT error": f"{r.avg_jct_error:+.1%}",
                             "per-job p90": f"{r.jct_abs_error_p90:.1%}", "ratio error": f"{r.ratio_error:+.1%}",
                             "ranking kept": "yes" if r.ranking_kept else "no"})
    return pd.DataFrame(rows).to_markdown(index=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path, help="the validation directory (profiler/data/validation/<session>)")
    ap.add_argument("parts", nargs="+", metavar="LABEL=SUBDIR", help="a row label and the subdirectory of its runs")
    args = ap.parse_args(argv)
    parts = []
    for p in args.parts:
        label, sep, sub = p.rpartition("=")
        if not sep or not label or not (args.dir / sub).is_dir():
            ap.error(f"not LABEL=SUBDIR of an existing subdirectory of {args.dir}: {p!r}")
        parts.append((label, sub))
    text = table(args.dir, parts)
    (args.dir / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
