"""Old artifact vs refitted candidates on the 2026-11-26 fused profile (no torch; here, on the CPU).

    .venv/bin/python profiler/data/fused_profile_h100_2026-11-26/compare.py [--write-candidate DIR]

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
from tlora_sim.sim.costmodel.profiled import load_artifact

HERE = Path(__file__).resolve().parent
DATA = HERE.parent
SMALL_MS = 10.0
BEFORE = "65631eb"  # the commit whose profile_h100.csv / costmodel_h100.json this refit replaced


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
                    help="fit the replace+ candidate on ALL new rows and write costmodel_h100.json + profile_h100.csv there")
    a = ap.parse_args()
    import io
    import subprocess
    import tempfile

    def at_before(path: str) -> str:  # the pre-refit file, from git (commit BEFORE)
        return subprocess.run(["git", "show", f"{BEFORE}:{path}"], capture_output=True, text=True, check=True,
                              cwd=DATA.parent.parent).stdout

    tmp = Path(tempfile.mkdtemp())
    (tmp / "profile_h100.csv").write_text(at_before("profiler/data/profile_h100.csv"))
    (tmp / "costmodel_h100.json").write_text(at_before("profiler/data/costmodel_h100.json"))
    old = fit.read_rows([tmp / "profile_h100.csv"])
    chk = {s: fit.read_rows([DATA / f"fused_recheck_h100_{s}" / "profile_h100.csv"]) for s in ("d", "e")}
    new = pd.concat([fit.read_rows([HERE / "profile_h100.csv"]), chk["e"]], ignore_index=True)
    new = new[new.kind == "mix"].reset_index(drop=True)
    ho = heldout_keys(new)
    key = new.apply(lambda r: (r["model"], fit.mix_key(fit.members_of(r))) if r["kind"] == "mix" else None, axis=1)
    is_ho = key.isin(ho)
    train_new, test_new = new[~is_ho], new[is_ho]
    arts = {"old": load_artifact(tmp / "costmodel_h100.json"),
            "replace": fit.fit_artifact(pd.concat([old[~superseded(old)], train_new], ignore_index=True), "H100"),
            "pooled": fit.fit_artifact(pd.concat([old, train_new], ignore_index=True), "H100"),
            "replace+": fit.fit_artifact(pd.concat([old[~superseded(old) | beyond_new(old, new)], train_new],
                                                   ignore_index=True), "H100")}
    print("replace+ keeps", int(beyond_new(old, new).sum()), "old fused rows beyond the new token range:",
          old[beyond_new(old, new)].groupby("model").tokens.agg(["count", "min", "max"]).to_dict("index"))
    print(f"new rows {len(new)} (mix {int((new.kind == 'mix').sum())}); held out {int(is_ho.sum())} rows of {len(ho)} mixes")
    host_terms(arts)
    fm = lambda d: d[(d.kind == "mix") & (d.plan == "fused")]  # noqa: E731
    table("(a) new fused rows held out (2026-11-26, commit 69c5240)", arts, fm(test_new))
    for m in ("llama3-8b", "qwen3-8b", "qwen2.5-32b", "llama3-70b"):
        table(f"(a) held out, {m}", {k: arts[k] for k in ("old", "replace", "replace+")}, fm(test_new[test_new.model == m]))
    table("(b) old fused rows (profile_h100.csv; old artifact in-sample, candidates fitted without them for 'replace')",
          arts, fm(old))
    table("(c) fused_recheck_h100_d (kernel @61d430451deb, before session 13; never fitted)", arts, fm(chk["d"]))
    table("(c) fused_recheck_h100_e (fitted where not held out)", arts, fm(chk["e"]))
    ob = fm(old).reset_index(drop=True)
    gb = ob[(ob.step_ms >= SMALL_MS) & (ob.host_ms < 0.7 * ob.step_ms)]
    table(f"(b') old fused rows >= {SMALL_MS:g} ms that were GPU-bound (host_ms < 0.7 step)", arts, gb)
    from tlora_sim.sim.costmodel.profiled import Tables, layer_ms
    mm = fit.read_rows([HERE / "profile_h100.csv"])
    mm = mm[mm.kind == "model"]
    print("\n== in-model layer (8-layer model, kind model, 2026-11-26; not fitted): measured vs predicted ms/layer")
    for an, art in arts.items():
        e = art["models"]["llama3-8b"]
        tab = Tables("llama3-8b", "H100", e)
        out = []
        for _, r in mm.iterrows():
            m = fit.members_of(r)
            pr, _ = layer_ms(tab, e["plans"]["fused"], m, in_model=True)
            out.append(f"{fit.mix_key(m)[:24]} {r.step_ms / r.layers:.2f}->{pr:.2f}")
        print(f"  {an:8s} " + "; ".join(out))
    e2e = pd.read_csv(DATA / "costmodel_h100_e2e.csv", keep_default_na=False)
    from tlora_sim.sim.costmodel.profiled import ProfiledCostModel
    print("\n== e2e (costmodel_h100_e2e.csv, measured 2026-11-22 with the old kernel and host): median |error| by plan")
    for an, art in arts.items():
        t = fit.e2e_table(ProfiledCostModel(art), e2e)
        t = t.assign(ae=t.error.abs())
        print(f"  {an:8s} " + "  ".join(f"{p}/{n}: {g.error.median() * 100:+.1f}%"
                                          for (p, n), g in t.groupby(["plan", "adapters"])))
    if a.write_candidate:
        full = pd.concat([old[~superseded(old) | beyond_new(old, new)], new], ignore_index=True)
        out = a.write_candidate
        out.mkdir(parents=True, exist_ok=True)
        full.to_csv(out / "fit_input_h100.csv", index=False)
        p, s = fit.build([out / "fit_input_h100.csv"], "H100", out)
        print(f"\nwrote {p}: held-out (every 4th mix) {json.dumps(s)}")


if __name__ == "__main__":
    main()
