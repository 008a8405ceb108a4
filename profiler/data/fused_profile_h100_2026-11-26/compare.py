"""Old artifact vs refitted candidates on the 2026-11-26 fused profile (no torch; here, on the CPU).

    .venv/bin/python profiler/data/fused_profile_h100_2026-11-26/compare.py [--write-candidate DIR]
    .venv/bin/python profiler/data/fused_profile_h100_2026-11-26/compare.py --gpu H200 --profile DIR [...]

--gpu H200 runs the same comparison for the H200 (CONFIG below: the pre-refit files from commit
16751cd, ../fused_recheck_h200_d as never-fitted rows, no same-kernel recheck to add) on the
fused profile in DIR (profile_h200.csv written by run_fused.py on one H200). Without --gpu it is
the H100 comparison of 2026-11-26, output unchanged (compare_output.txt).

New rows: the fused mix rows of this folder's profile_h100.csv (2026-11-26, kernel
tlora-triton@1176b682906b) and of ../fused_recheck_h100_e (same kernel, same day, llama3-8b).
The new mini-model pairs (kind model/stack) are not fitted: three of the four are GPU-bound inside
the model now that the host path is faster, so they carry no harness overhead and would drag
call_overhead's median to 0.3 ms; the host-bound pair (16:1:512) gives 1.25 ms, as the old 5
pairs (median 1.31 ms) did, so the old pairs stay.
Candidates (fit.py's fit_artifact, unchanged):
  replace: profile_h100.csv without its fused mix rows, plus the new mix rows;
  pooled:  profile_h100.csv plus the new mix rows.
Held out: per model, a seeded random 30% of the new fused mixes (all their rows), left out of
both candidates' fits; the old artifact never saw these measurements (but was fitted on rows of
the same quick mixes measured on 2026-11-22/25).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from tlora_sim.profiler import fit
from tlora_sim.sim.costmodel.profiled.artifact import load_artifact

HERE = Path(__file__).resolve().parent
DATA = HERE.parent
SMALL_MS = 10.0
BEFORE = "65631eb"  # the commit whose profile_h100.csv / costmodel_h100.json this refit replaced
# per GPU: the commit of the pre-refit profile/artifact, same-kernel rechecks added to the new rows,
# never-fitted rechecks (folder suffix, title), the default profile folder and its label
CONFIG = {
    "H100": dict(before=BEFORE, add=("e",), unfitted=(("d", "kernel @61d430451deb, before session 13; never fitted"),),
                 profile=HERE, label="2026-11-26, commit 69c5240"),
    "H200": dict(before="16751cd", add=(), unfitted=(("d", "kernel @61d430451deb, 2026-11-25; never fitted"),),
                 profile=None, label=None),
}


def superseded(df: pd.DataFrame) -> pd.Series:
    return (df.plan == "fused") & (df.kind == "mix")


def beyond_new(old: pd.DataFrame, new: pd.DataFrame) -> pd.Series:
    """Old fused mix rows of more tokens than any new fused row of their model (kept by 'replace+',
    so that the fit's token coverage stays; GPU-bound steps, host << step)."""
    tmax = new[new.kind == "mix"].groupby("model").tokens.max()
    return (old.plan == "fused") & (old.kind == "mix") & (old.tokens > old.model.map(tmax).fillna(np.inf))


def heldout_keys(new: pd.DataFrame, frac: float = 0.3, seed: int = 0) -> set:
    mix = new[new.kind == "mix"]
    out = set()
    for model in sorted(set(mix.model)):
        ks = sorted({fit.mix_key(fit.members_of(r)) for _, r in mix[mix.model == model].iterrows()})
        rng = random.Random(f"{seed}-{model}")
        out |= {(model, k) for k in rng.sample(ks, round(frac * len(ks)))}
    return out


def stats(p: pd.DataFrame) -> str:
    if p.empty:
        return "-"
    a = p.ape.to_numpy() * 100
    return f"{len(a):3d} rows  median {np.median(a):5.1f}%  p90 {np.quantile(a, .9):5.1f}%  worst {a.max():5.1f}%"


def table(name: str, arts: dict, rows: pd.DataFrame):
    print(f"\n== {name}")
    for an, art in arts.items():
        p = fit.predict_rows(art, rows)
        bias = np.median(p.predicted_ms / p.measured_ms - 1) * 100 if len(p) else float("nan")
        print(f"  {an:8s} small (<{SMALL_MS:g} ms): {stats(p[p.measured_ms < SMALL_MS])}")
        print(f"  {an:8s} large (>={SMALL_MS:g} ms): {stats(p[p.measured_ms >= SMALL_MS])}")
        print(f"  {an:8s} all:               {stats(p)}   median signed error {bias:+.1f}%")


def host_terms(arts: dict):
    print("\n== fused host terms (cpu0 + cpu_n x adapters + cpu_g x groups; p; call_ms)")
    for model in ("llama3-8b", "qwen3-8b", "qwen2.5-32b", "llama3-70b"):
        for an, art in arts.items():
            f = art["models"][model]["plans"]["fused"]
            print(f"  {model:12s} {an:8s} cpu0 {f['cpu0']:5.2f}  cpu_n {f['cpu_n']:5.3f}  cpu_g {f['cpu_g']:5.2f}  "
                  f"p {f['p']:4.0f}  call_ms {f['call_ms']:.2f} ({f['call_ms_mixes']})  rows {f['coverage']['rows']}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write-candidate", type=Path, default=None,
                    help="fit the replace+ candidate on ALL new rows and write costmodel_<gpu>.json + fit_input_<gpu>.csv there")
    ap.add_argument("--gpu", default="H100", choices=sorted(CONFIG))
    ap.add_argument("--profile", type=Path, default=None, help="folder of the new profile_<gpu>.csv (H100: this one)")
    a = ap.parse_args()
    cfg, G, g = CONFIG[a.gpu], a.gpu, a.gpu.lower()
    prof_dir = a.profile or cfg["profile"]
    if prof_dir is None:
        ap.error(f"--profile is required for {G}")
    label = cfg["label"] if a.profile is None else prof_dir.name
    import io
    import subprocess
    import tempfile

    def at_before(path: str) -> str:  # the pre-refit file, from git (commit BEFORE)
        return subprocess.run(["git", "show", f"{cfg['before']}:{path}"], capture_output=True, text=True, check=True,
                              cwd=DATA.parent.parent).stdout

    tmp = Path(tempfile.mkdtemp())
    (tmp / f"profile_{g}.csv").write_text(at_before(f"profiler/data/profile_{g}.csv"))
    (tmp / f"costmodel_{g}.json").write_text(at_before(f"profiler/data/costmodel_{g}.json"))
    old = fit.read_rows([tmp / f"profile_{g}.csv"])
    chk = {s: fit.read_rows([DATA / f"fused_recheck_{g}_{s}" / f"profile_{g}.csv"])
           for s in sorted({u for u, _ in cfg["unfitted"]} | set(cfg["add"]))}
    new = pd.concat([fit.read_rows([prof_dir / f"profile_{g}.csv"])] + [chk[s] for s in cfg["add"]], ignore_index=True)
    new = new[new.kind == "mix"].reset_index(drop=True)
    ho = heldout_keys(new)
    key = new.apply(lambda r: (r["model"], fit.mix_key(fit.members_of(r))) if r["kind"] == "mix" else None, axis=1)
    is_ho = key.isin(ho)
    train_new, test_new = new[~is_ho], new[is_ho]
    arts = {"old": load_artifact(tmp / f"costmodel_{g}.json"),
            "replace": fit.fit_artifact(pd.concat([old[~superseded(old)], train_new], ignore_index=True), G),
            "pooled": fit.fit_artifact(pd.concat([old, train_new], ignore_index=True), G),
            "replace+": fit.fit_artifact(pd.concat([old[~superseded(old) | beyond_new(old, new)], train_new],
                                                   ignore_index=True), G)}
    print("replace+ keeps", int(beyond_new(old, new).sum()), "old fused rows beyond the new token range:",
          old[beyond_new(old, new)].groupby("model").tokens.agg(["count", "min", "max"]).to_dict("index"))
    print(f"new rows {len(new)} (mix {int((new.kind == 'mix').sum())}); held out {int(is_ho.sum())} rows of {len(ho)} mixes")
    host_terms(arts)
    fm = lambda d: d[(d.kind == "mix") & (d.plan == "fused")]  # noqa: E731
    table(f"(a) new fused rows held out ({label})", arts, fm(test_new))
    for m in ("llama3-8b", "qwen3-8b", "qwen2.5-32b", "llama3-70b"):
        table(f"(a) held out, {m}", {k: arts[k] for k in ("old", "replace", "replace+")}, fm(test_new[test_new.model == m]))
    table(f"(b) old fused rows (profile_{g}.csv; old artifact in-sample, candidates fitted without them for 'replace')",
          arts, fm(old))
    for s, title in cfg["unfitted"]:
        table(f"(c) fused_recheck_{g}_{s} ({title})", arts, fm(chk[s]))
    for s in cfg["add"]:
        table(f"(c) fused_recheck_{g}_{s} (fitted where not held out)", arts, fm(chk[s]))
    ob = fm(old).reset_index(drop=True)
    gb = ob[(ob.step_ms >= SMALL_MS) & (ob.host_ms < 0.7 * ob.step_ms)]
    table(f"(b') old fused rows >= {SMALL_MS:g} ms that were GPU-bound (host_ms < 0.7 step)", arts, gb)
    from tlora_sim.sim.costmodel.profiled.tables import Tables
    from tlora_sim.sim.costmodel.profiled.formula import layer_ms
    mm = fit.read_rows([prof_dir / f"profile_{g}.csv"])
    mm = mm[mm.kind == "model"]
    print(f"\n== in-model layer (8-layer model, kind model, {label.split(',')[0]}; not fitted): measured vs predicted ms/layer")
    for an, art in arts.items():
        e = art["models"]["llama3-8b"]
        tab = Tables("llama3-8b", G, e)
        out = []
        for _, r in mm.iterrows():
            m = fit.members_of(r)
            pr, _ = layer_ms(tab, e["plans"]["fused"], m, in_model=True)
            out.append(f"{fit.mix_key(m)[:24]} {r.step_ms / r.layers:.2f}->{pr:.2f}")
        print(f"  {an:8s} " + "; ".join(out))
    e2e = pd.read_csv(DATA / f"costmodel_{g}_e2e.csv", keep_default_na=False)
    from tlora_sim.sim.costmodel.profiled.model import ProfiledCostModel
    print(f"\n== e2e (costmodel_{g}_e2e.csv, measured 2026-11-22 with the old kernel and host): median |error| by plan")
    for an, art in arts.items():
        t = fit.e2e_table(ProfiledCostModel(art), e2e)
        t = t.assign(ae=t.error.abs())
        print(f"  {an:8s} " + "  ".join(f"{p}/{n}: {g.error.median() * 100:+.1f}%"
                                          for (p, n), g in t.groupby(["plan", "adapters"])))
    if a.write_candidate:
        full = pd.concat([old[~superseded(old) | beyond_new(old, new)], new], ignore_index=True)
        out = a.write_candidate
        out.mkdir(parents=True, exist_ok=True)
        full.to_csv(out / f"fit_input_{g}.csv", index=False)
        p, s = fit.build([out / f"fit_input_{g}.csv"], G, out)
        print(f"\nwrote {p}: held-out (every 4th mix) {json.dumps(s)}")


if __name__ == "__main__":
    main()
