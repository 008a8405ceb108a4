"""Fit a cost-model artifact from profile CSVs, and measure its held-out error (no torch).

``fit_artifact(rows, gpu)`` builds the artifact that ``tlora_sim.sim.costmodel.profiled`` (``artifact.load_artifact``) reads (its docstring says
what each table and coefficient means). ``validate(rows, gpu, k)`` splits the measured *mixes*
(not repeats) of each model deterministically: mixes sorted by their canonical key
(``r:b:s|...``), every k-th held out with every plan measured on it; the component grids
(base curve, attention, head, optimizer) stay in the training part. It fits on the rest and
reports the absolute percentage error of the predicted layer step (forward + backward) on the
held-out rows, by model, plan and mix size.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, nnls

from tlora_sim.traces.errors import InputError
from tlora_sim.sim.costmodel.profiled.artifact import PLAN_FAMILY, SCHEMA, SEED_PLANS_MULTI_GPU, TERMS
from tlora_sim.sim.costmodel.profiled.tables import Tables
from tlora_sim.sim.costmodel.profiled.formula import attention_ms, correction_point, layer_ms, mix_features, seq_groups, \
    smoothmax

# LoRAFusion and the grouped GEMM size their LoRA work for the mix's largest rank (tiles of MAX_R;
# adapters zero-padded to it): their extra term is max rank x tokens
PLAN_FEATURES = {"loop": ("const", "adapters", "tokens", "rank_tokens", "ranks"),
                 "fused": ("const", "adapters", "tokens", "rank_tokens", "ranks", "bucket_rank_tokens"),
                 "lorafusion": ("const", "adapters", "tokens", "rank_tokens", "ranks", "max_rank_tokens"),
                 "grouped": ("const", "adapters", "tokens", "rank_tokens", "ranks", "max_rank_tokens")}
REQUIRED_FAMILIES = ("loop", "fused")
OPTIONAL_FAMILIES = ("lorafusion", "grouped")  # fitted (and then measured) where their rows exist
MEM_FEATURES = ("const", "adapters", "tokens", "rank_tokens", "ranks")
SIZE_BINS = ((1, 1, "1"), (2, 3, "2-3"), (4, 7, "4-7"), (8, 16, "8-16"), (17, 10**9, ">16"))


# ------------------------------------------------------------------------------------- reading
def read_rows(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Concatenate profile CSVs (files, or directories holding ``profile_*.csv``); rows that
    recorded an error or no time are dropped. Raises InputError when nothing is readable."""
    frames = []
    for p in paths:
        p = Path(p)
        files = sorted(p.glob("profile_*.csv")) if p.is_dir() else [p]
        for f in files:
            try:
                frames.append(pd.read_csv(f, dtype={"ranks": str, "batch_sizes": str, "seq_lens": str,
                                                    "git_commit": str, "error": str}, keep_default_na=False))
            except (OSError, pd.errors.ParserError) as e:
                raise InputError(f"cannot read profile CSV: {e}", file=str(f)) from None
    if not frames:
        raise InputError(f"no profile CSVs under {', '.join(str(p) for p in paths)}")
    df = pd.concat(frames, ignore_index=True)
    if "layers" not in df:
        df["layers"] = ""
    if "host_ms" not in df:
        df["host_ms"] = ""
    for c in ("tokens", "params", "tensors", "layers", "host_ms", "fwd_ms", "bwd_ms", "opt_ms", "step_ms", "p10_ms", "p90_ms",
              "saved_bytes", "peak_bytes", "static_bytes", "n_adapters"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    ok = (df["error"].astype(str).str.len() == 0) & df["step_ms"].notna() & (df["step_ms"] > 0)
    return df[ok].reset_index(drop=True)


def members_of(row) -> list[tuple[int, int, int]]:
    """(rank, sequences, seq_len) per adapter of a mix row."""
    rs = [int(v) for v in str(row["ranks"]).split(";")]
    bs = [int(v) for v in str(row["batch_sizes"]).split(";")]
    ss = [int(v) for v in str(row["seq_lens"]).split(";")]
    return list(zip(rs, bs, ss))


def mix_key(members) -> str:
    return "|".join(f"{r}:{b}:{s}" for r, b, s in sorted(members))


# ------------------------------------------------------------------------------------- fitting
def _median_by(df: pd.DataFrame, key: str, val: str) -> tuple[list, list]:
    g = df.groupby(key)[val].median().sort_index()
    return [float(v) for v in g.index], [float(v) for v in g.values]


def gpu_bound_from(xs: list, ys: list, shape, tol: float = 0.15) -> float:
    """The smallest grid point from which every measurement is within ``tol`` of the GPU-bound
    trend ``y / shape(x)`` of the largest points (smaller ones were bound by host launch time)."""
    r = [y / shape(x) for x, y in zip(xs, ys)]
    ref = float(np.median(r[-max(1, len(r) // 3):]))
    start = len(xs) - 1
    for i in range(len(xs) - 1, -1, -1):
        if abs(r[i] / ref - 1) > tol:
            break
        start = i
    return float(xs[start])


def build_tables(dm: pd.DataFrame, model: str, gpu: str) -> dict:
    """The measured tables of one model (its rows of kinds noattn, head, attn), with the first
    GPU-bound point of the base curve (against the roofline shape) and of each attention row
    (against time proportional to sequences)."""
    from tlora_sim.sim.costmodel.hardware import GPUS
    from tlora_sim.sim.costmodel.models import get_model
    from tlora_sim.sim.costmodel.profiled.tables import roofline_l0_ms

    l0 = dm[dm.kind == "noattn"]
    head = dm[dm.kind == "head"]
    attn = dm[dm.kind == "attn"]
    if l0.empty or head.empty or attn.empty:
        raise InputError(f"model {model!r}: the profile lacks noattn, head or attn rows")
    m, g = get_model(model), GPUS.get(gpu.upper(), GPUS["H100"])
    t, ms = _median_by(l0, "tokens", "step_ms")
    ht, hms = _median_by(head, "tokens", "step_ms")
    _, hpk = _median_by(head, "tokens", "peak_bytes")
    a = {}
    for sq, gg in attn.assign(b=pd.to_numeric(attn.batch_sizes), s=pd.to_numeric(attn.seq_lens)).groupby("s"):
        bs, v = _median_by(gg, "b", "step_ms")
        a[str(int(sq))] = {"seqs": bs, "ms": v, "gpu_from": gpu_bound_from(bs, v, lambda b: b)}
    _, lpk = _median_by(l0, "tokens", "peak_bytes")
    return {"l0": {"tokens": t, "ms": ms, "peak_bytes": lpk,
                   "gpu_from": gpu_bound_from(t, ms, lambda x: roofline_l0_ms(m, g, x))},
            "head": {"tokens": ht, "ms": hms, "peak_bytes": hpk}, "attn": a}


def _design(mixes: list, feats: tuple) -> np.ndarray:
    return np.array([[mix_features(m)[k] for k in feats] for m in mixes], dtype=float)


P_GRID = (2.0, 4.0, 8.0, 16.0, 64.0)


def fit_plan(tab: Tables, rows: pd.DataFrame, family: str) -> dict:
    """Coefficients of one plan family from its mix rows.

    layer = smoothmax(gpu, host; p): gpu = l0g(T) + attention (GPU parts of the tables) +
    ``coef . features`` (non-negative), host = cpu0 + cpu_n x adapters + cpu_g x length groups
    (non-negative). Where the rows carry their measured host (launch) time, the host model is
    fitted to it first (robust least squares on log ratios) and the GPU term and p are fitted to
    the step times with each row's measured host time; otherwise all jointly. The p in ``P_GRID``
    with the smallest training loss is kept."""
    feats = PLAN_FEATURES[family]
    mixes = [members_of(r) for _, r in rows.iterrows()]
    y = rows["step_ms"].to_numpy(float)
    hm = pd.to_numeric(rows.get("host_ms", pd.Series(np.nan, index=rows.index)), errors="coerce").to_numpy(float)
    have_host = np.isfinite(hm) & (hm > 0)
    base = np.array([tab.l0g(sum(b * s for _, b, s in m))[0] + attention_ms(tab, m)[0] for m in mixes])
    X = _design(mixes, feats)
    xs = np.maximum(X.max(axis=0), 1e-12)
    Xn = X / xs
    Z = np.array([[1.0, len(m), len(seq_groups(m))] for m in mixes])
    zs = np.array([float(np.median(y)), float(np.median(y)) / 4, float(np.median(y)) / 4])
    c0, _ = nnls(Xn / y[:, None], np.maximum(y - base, 0) / y)
    host_fixed = None
    # host times are clean where the host did not wait on the GPU: it finished well before the
    # step did, or the GPU work (base curve + attention) is far below it
    clean = have_host & ((hm < 0.85 * y) | (base < 0.6 * np.where(have_host, hm, np.inf)))
    if have_host.mean() >= 0.8 and clean.sum() >= 6:
        Zh, h = Z[clean] * zs, hm[clean]  # host = Z @ (k * zs)
        k0, _ = nnls(Zh / h[:, None], np.ones(len(h)))
        sol = least_squares(lambda k: np.log(np.maximum(Zh @ k, 1e-9)) - np.log(h), np.maximum(k0, 1e-6),
                            bounds=(0, np.inf), loss="soft_l1", f_scale=0.05)
        cpu_k = sol.x
        host_fixed = np.where(have_host, hm, Z @ (cpu_k * zs))
    best = None
    for p in P_GRID:
        def resid(th, p=p):
            gpu = base + Xn @ th[:len(feats)]
            host = host_fixed if host_fixed is not None else Z @ (th[len(feats):] * zs)
            pred = np.array([smoothmax(a, b, p) for a, b in zip(gpu, host)])
            return np.log(np.maximum(pred, 1e-9)) - np.log(y)

        th0 = np.concatenate([c0, [0.5 * float(np.min(y)) / zs[0], 0.0, 0.0]])
        try:
            sol = least_squares(resid, th0, bounds=(0, np.inf), loss="soft_l1", f_scale=0.05)
        except (ValueError, np.linalg.LinAlgError):
            continue
        if best is None or sol.cost < best[0]:
            best = (sol.cost, p, sol.x)
    _, p, th = best
    cpu = (cpu_k if host_fixed is not None else th[len(feats):]) * zs
    pe = {"features": list(feats), "coef": {k: float(v) for k, v in zip(feats, th[:len(feats)] / xs)},
          "cpu0": float(cpu[0]), "cpu_n": float(cpu[1]), "cpu_g": float(cpu[2]), "p": float(p),
          "host_fit": "measured host times" if host_fixed is not None else "joint with step times",
          "form": "smoothmax(l0g + attention + coef.features, cpu0 + cpu_n*adapters + cpu_g*groups; p)"}
    T = np.array([sum(b * s for _, b, s in m) for m in mixes])
    ranks = [r for m in mixes for r, _, _ in m]
    pe["coverage"] = {"adapters_min": int(min(len(m) for m in mixes)),
                      "adapters_max": int(max(len(m) for m in mixes)), "tokens_min": float(T.min()),
                      "tokens_max": float(T.max()), "rank_min": int(min(ranks)), "rank_max": int(max(ranks)),
                      "mixes": len({mix_key(m) for m in mixes}), "rows": len(rows)}
    pe["memory"] = {}
    for col in ("peak", "saved"):
        v = rows[f"{col}_bytes"].to_numpy(float)
        good = np.isfinite(v) & (v > 0)
        if good.sum() >= len(MEM_FEATURES):
            Xm = _design([m for m, g in zip(mixes, good) if g], MEM_FEATURES)
            sc = np.maximum(Xm.max(axis=0), 1e-12)
            cm, _ = nnls((Xm / sc) / v[good][:, None], np.ones(good.sum()))
            pe["memory"][col] = {k: float(x) for k, x in zip(MEM_FEATURES, cm / sc)}
        else:
            pe["memory"][col] = {k: 0.0 for k in MEM_FEATURES}
    return pe


def call_overhead(d: pd.DataFrame, family: str, max_tokens: int = 4096) -> tuple[float, int]:
    """The profiling harness's per-call overhead of one layer step (ms), from launch-bound mixes
    (at most ``max_tokens``) timed both as one layer (kind ``mix`` or ``stack`` with one layer,
    ``autograd.grad`` per call) and inside a model (kind ``model``: ``layers`` layers with their
    own weights and adapters, ``loss.backward()``): one-layer time - model time / layers, the
    median over mixes; failing those, from layers stacked three times (kind ``stack``):
    t1 - (t3 - t1) / 2. Each pair comes from one profile run (same host). 0 without such rows."""
    st = d[d.kind.isin(["mix", "stack", "model"]) & (d.plan.map(PLAN_FAMILY) == family) & (d.tokens <= max_tokens)]
    if st.empty:
        return 0.0, 0
    layers = pd.to_numeric(st.layers, errors="coerce").fillna(1)
    key = st.apply(lambda r: f"{r['profile_id']}|{r['plan']}|{mix_key(members_of(r))}", axis=1)
    one = (st.kind != "model") & (layers == 1)
    for kind, many in (("model", st.kind == "model"), ("stack", (st.kind == "stack") & (layers == 3))):
        vals = []
        for k in sorted(set(key[many])):
            t1, tn = st.step_ms[(key == k) & one], st[(key == k) & many]
            if len(t1) and len(tn):
                a, b, L = float(t1.median()), float(tn.step_ms.median()), float(layers[tn.index].median())
                vals.append(a - b / L if kind == "model" else a - (b - a) / 2)
        if vals:
            return max(0.0, float(np.median(vals))), len(vals)
    return 0.0, 0


def add_correction(tab: Tables, pe: dict, rows: pd.DataFrame, prior: float = 1.0,
                   scale=(0.35, 0.5, 0.7)) -> dict:
    """Attach the residual correction: log(measured / fitted) of every training mix, smoothed
    by a Gaussian kernel over (log tokens, log adapters, log mean rank) at predict time."""
    pts, lr = [], []
    pe = {**pe, "correction": None}
    for _, r in rows.iterrows():
        m = members_of(r)
        pred, _ = layer_ms(tab, pe, m, in_model=False)
        pts.append(correction_point(m).tolist())
        lr.append(math.log(r["step_ms"] / pred))
    pe["correction"] = {"points": pts, "log_ratio": lr, "scale": list(scale), "prior": prior}
    return pe


def fit_optimizer(df: pd.DataFrame) -> dict:
    o = df[df.kind == "opt"]
    if len(o) < 3:
        raise InputError("the profile lacks optimizer (opt) rows")
    X = np.column_stack([np.ones(len(o)), o.params.to_numpy(float) / 1e6, o.tensors.to_numpy(float)])
    y = o.step_ms.to_numpy(float)
    c, _ = nnls(X / y[:, None], np.ones(len(o)))
    return {"coef": {"const": float(c[0]), "per_mparam": float(c[1]), "per_tensor": float(c[2])},
            "form": "ms = const + per_mparam x params/1e6 + per_tensor x tensors (fused AdamW, bf16)"}


def _uniq(df: pd.DataFrame, col: str) -> list:
    return sorted({str(v) for v in df[col] if str(v)})


def _terms(measured: list) -> dict:
    """TERMS with the analytic plans narrowed to those this artifact did not measure."""
    rest = [p for p in OPTIONAL_FAMILIES if p not in measured]
    out = {}
    for k, v in TERMS.items():
        out[k] = [t for t in v if not t.startswith("plans lorafusion")]
        if k == "analytic" and rest:
            out[k].insert(2, f"plans {'/'.join(rest)} (fused x roofline ratio)")
        if k == "measured" and len(rest) < len(OPTIONAL_FAMILIES):
            out[k].append(f"plans {'/'.join(p for p in OPTIONAL_FAMILIES if p in measured)} on one GPU "
                          f"(their own kernels; {SEED_PLANS_MULTI_GPU})")
    return out


def fit_artifact(df: pd.DataFrame, gpu: str, correction: bool = False, heldout: dict | None = None) -> dict:
    """Fit every model present in ``df`` (rows of one GPU type). Raises InputError."""
    d = df[df.gpu.astype(str).str.upper() == gpu.upper()]
    if d.empty:
        raise InputError(f"no profile rows for GPU {gpu!r} (found: {', '.join(_uniq(df, 'gpu'))})")
    models = {}
    # the harness's per-call overhead does not depend on the model: measured on any of them
    call_ms = {fam: call_overhead(d, fam) for fam in REQUIRED_FAMILIES + OPTIONAL_FAMILIES}
    # a job alone (one adapter, eager LoRA) has its own harness overhead: on the H100 profile the
    # loop family's pooled value (0.64 ms) left `alone` full-model steps 14% slow (issue 17)
    alone_ms = call_overhead(d[d.plan == "alone"], "loop")
    for model, dm in d[d.model.astype(str).str.len() > 0].groupby("model"):
        from tlora_sim.sim.costmodel.models import MODELS

        if model not in MODELS:
            continue
        entry = build_tables(dm, model, gpu)
        tab = Tables(model, gpu, entry)
        entry["plans"] = {}
        mix = dm[dm.kind == "mix"]
        for fam in REQUIRED_FAMILIES + OPTIONAL_FAMILIES:
            rows = mix[mix.plan.map(PLAN_FAMILY) == fam]
            if len(rows) < len(PLAN_FEATURES[fam]) + 1:
                continue
            pe = fit_plan(tab, rows, fam)
            pe["call_ms"], pe["call_ms_mixes"] = call_ms[fam]
            if fam == "loop" and alone_ms[1]:
                pe["call_ms_alone"], pe["call_ms_alone_mixes"] = alone_ms
            if correction:
                pe = add_correction(tab, pe, rows)
            entry["plans"][fam] = pe
        if not set(REQUIRED_FAMILIES) <= set(entry["plans"]):
            raise InputError(f"model {model!r}: too few mix rows to fit both plan families "
                             f"(have {sorted(entry['plans'])})")
        entry["rows"] = {k: int(v) for k, v in dm.kind.value_counts().items()}
        entry["variants"] = {p: _uniq(mix[mix.plan == p], "kernel_variant") for p in sorted(set(mix.plan))}
        base = dm[dm.kind == "base"]
        entry["base_check"] = [{"tokens": float(r.tokens), "seq_len": int(r.seq_lens), "measured_ms": float(r.step_ms),
                                "l0_plus_attn_ms": float(tab.l0(r.tokens)[0]
                                                         + tab.attn_ms(int(r.seq_lens), r.tokens / int(r.seq_lens))[0])}
                               for r in base.itertuples()]
        models[model] = entry
    if not models:
        raise InputError(f"no catalog model in the profile rows of {gpu!r}")
    ceil = {str(r.plan): float(r.step_ms) for r in d[d.kind == "ceiling"].itertuples()}
    src = {c: _uniq(d, c) for c in ("gpu_name", "driver", "cuda", "torch", "triton", "git_commit", "git_dirty",
                                    "profile_id", "mode")}
    src["kernel_variants"] = _uniq(d[d.kind == "mix"], "kernel_variant")
    src["rows"] = int(len(d))
    src["measured"] = [min(_uniq(d, "timestamp") or [""]), max(_uniq(d, "timestamp") or [""])]
    fams = {f for e in models.values() for f in e["plans"]}
    # plans measured (each of its own family, fitted for at least one model; the cost model
    # checks the model's entry too): the rest stay fused x roofline ratio (flagged)
    measured = [p for p, f in PLAN_FAMILY.items() if f in fams]
    art = {"schema": SCHEMA, "version": 1, "gpu": gpu.upper(), "measured_plans": measured,
           "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "source": src, "ceilings": ceil, "heldout": heldout or {}, "terms": _terms(measured),
           "conventions": {"layer_ms": "one decoder layer, forward + backward (dX, adapter grads), eager, median",
                           "dtype": "bf16 weights, activations and adapters; fp32 cross-entropy",
                           "dropout": 0.1, "lora_targets": "q,k,v,o,gate,up,down", "correction": bool(correction)},
           "optimizer": fit_optimizer(d), "models": models}
    h = hashlib.sha256(json.dumps({k: v for k, v in art.items() if k != "created"}, sort_keys=True).encode())
    art["id"] = f"{gpu.lower()}-{art['created'][:10]}-{h.hexdigest()[:8]}"
    return art


# ---------------------------------------------------------------------------------- validation
def heldout_mask(df: pd.DataFrame, k: int = 4) -> pd.Series:
    """True for mix rows held out: per model, mixes sorted by key, every k-th (index % k == k-1)."""
    mask = pd.Series(False, index=df.index)
    mix = df[df.kind == "mix"]
    keys = mix.apply(lambda r: mix_key(members_of(r)), axis=1)
    for model in sorted(set(mix.model)):
        ks = sorted(set(keys[mix.model == model]))
        out = {key for i, key in enumerate(ks) if i % k == k - 1}
        mask.loc[mix.index[(mix.model == model) & keys.isin(out)]] = True
    return mask


def predict_rows(art: dict, rows: pd.DataFrame) -> pd.DataFrame:
    """Predicted layer step (ms) and extrapolation flag for mix rows."""
    out = []
    tabs = {m: Tables(m, art["gpu"], e) for m, e in art["models"].items()}
    for _, r in rows.iterrows():
        m = members_of(r)
        e = art["models"].get(r["model"])
        if e is None or PLAN_FAMILY.get(r["plan"]) not in e["plans"]:
            continue
        pred, ext = layer_ms(tabs[r["model"]], e["plans"][PLAN_FAMILY[r["plan"]]], m, in_model=False, plan=r["plan"])
        out.append({"model": r["model"], "plan": r["plan"], "adapters": len(m), "mix": mix_key(m),
                    "tokens": sum(b * s for _, b, s in m), "measured_ms": float(r["step_ms"]), "predicted_ms": pred,
                    "ape": abs(pred - r["step_ms"]) / r["step_ms"], "extrapolated": ext})
    return pd.DataFrame(out)


def _size_bin(n: int) -> str:
    for lo, hi, name in SIZE_BINS:
        if lo <= n <= hi:
            return name
    return "?"


def summarize(pred: pd.DataFrame) -> dict:
    a = pred["ape"].to_numpy()
    return {"rows": int(len(a)), "mixes": int(pred.groupby(["model", "mix"]).ngroups),
            "median_ape": float(np.median(a)), "p90_ape": float(np.quantile(a, 0.9)), "mape": float(a.mean()),
            "max_ape": float(a.max())}


def validate(df: pd.DataFrame, gpu: str, k: int = 4, correction: bool = False) -> tuple[pd.DataFrame, dict]:
    """Fit on all but every k-th mix, predict those; returns (per-row predictions, summary)."""
    d = df[df.gpu.astype(str).str.upper() == gpu.upper()]
    ho = heldout_mask(d, k)
    art = fit_artifact(d[~ho], gpu, correction=correction)
    pred = predict_rows(art, d[ho])
    if pred.empty:
        raise InputError("no held-out mixes to validate on")
    s = summarize(pred)
    s["split"] = f"per model, mixes sorted by key, every {k}th held out (all plans of that mix)"
    s["k"] = k
    return pred, s


def error_table(pred: pd.DataFrame) -> pd.DataFrame:
    """Median / p90 APE and counts by model and mix size, then by plan."""
    p = pred.assign(size=pred.adapters.map(_size_bin))
    rows = []
    for keys, g in [(("all", "all"), p)] + list(p.groupby(["model", "size"])) + \
            [((f"plan:{pl}", "all"), g) for pl, g in p.groupby("plan")]:
        rows.append({"model": keys[0], "adapters": keys[1], "rows": len(g), "median_ape": g.ape.median(),
                     "p90_ape": g.ape.quantile(0.9), "max_ape": g.ape.max()})
    return pd.DataFrame(rows)


def e2e_table(cm, e2e: pd.DataFrame) -> pd.DataFrame:
    """Predicted vs measured full-model steps (one GPU) for the rows of an e2e CSV."""
    from tlora_sim.sim.costmodel.interface import Member

    out = []
    for _, r in e2e.iterrows():
        if str(r.get("error", "")).startswith(("OutOfMemory", "RuntimeError")) or not r["step_ms"] > 0:
            continue
        mem = [Member(a, b, s) for a, b, s in members_of(r)]
        p = cm.predict(r["model"], cm.gpu, mem, 1, r["plan"])
        out.append({"model": r["model"], "plan": r["plan"], "adapters": len(mem), "tokens": int(r["tokens"]),
                    "measured_ms": float(r["step_ms"]), "predicted_ms": p.step_time_s * 1e3,
                    "error": p.step_time_s * 1e3 / float(r["step_ms"]) - 1.0, "extrapolated": p.extrapolated,
                    "peak_gib": float(r["peak_bytes"]) / 2**30 if r["peak_bytes"] > 0 else float("nan")})
    return pd.DataFrame(out)


def build(paths: list, gpu: str, out_dir: str | Path, k: int = 4, correction: bool = False) -> tuple[Path, dict]:
    """Validate (held-out error), fit on every row, write ``costmodel_<gpu>.json`` and the merged
    measurements ``profile_<gpu>.csv`` to ``out_dir``. Returns (artifact path, held-out summary)."""
    df = read_rows(paths)
    _, s = validate(df, gpu, k, correction)
    art = fit_artifact(df, gpu, correction=correction, heldout=s)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    p = out / f"costmodel_{gpu.lower()}.json"
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(art, indent=1, sort_keys=False) + "\n")
    tmp.replace(p)
    csvp = out / f"profile_{gpu.lower()}.csv"
    merged = df[df.gpu.astype(str).str.upper() == gpu.upper()]
    if Path(csvp).resolve() not in {Path(x).resolve() for x in paths}:
        tmpc = csvp.with_suffix(".csv.tmp")
        merged.to_csv(tmpc, index=False)
        tmpc.replace(csvp)
    return p, s


# ------------------------------------------------------------------------------------- fold-in
ROW_ID = ("profile_id", "kind", "model", "plan", "ranks", "batch_sizes", "seq_lens", "timestamp")
GPU_BOUND_MS = 10.0  # layer steps at or above this are GPU-bound (the H100/H200 checks of COSTMODEL.md)


def _raw_rows(paths) -> list[dict]:
    """The rows of profile CSVs (files, or directories holding ``profile_*.csv``) as written (strings)."""
    import csv

    out = []
    for p in paths:
        p = Path(p)
        files = sorted(p.glob("profile_*.csv")) if p.is_dir() else [p]
        if not files:
            raise InputError("no profile_*.csv in this directory", file=str(p))
        for f in files:
            try:
                with open(f, newline="") as fh:
                    out += [dict(r, _file=str(f)) for r in csv.DictReader(fh)]
            except OSError as e:
                raise InputError(f"cannot read profile CSV: {e.strerror}", file=str(f)) from None
    return out


def drift_table(art: dict, rows: pd.DataFrame) -> pd.DataFrame:
    """Measured / predicted layer step of ``rows`` (mix rows) under ``art`` by model, plan and bound
    (``gpu``: measured >= GPU_BOUND_MS, else ``host``): rows, median and p10/p90 of the ratio, and how
    many predictions were extrapolated. Empty where ``art`` fits none of their plans."""
    pred = predict_rows(art, rows)
    if pred.empty:
        return pd.DataFrame(columns=["model", "plan", "bound", "rows", "median_ratio", "p10_ratio", "p90_ratio",
                                     "extrapolated"])
    pred = pred.assign(ratio=pred.measured_ms / pred.predicted_ms,
                       bound=np.where(pred.measured_ms >= GPU_BOUND_MS, "gpu", "host"))
    out = []
    for (m, pl, b), g in pred.groupby(["model", "plan", "bound"]):
        out.append({"model": m, "plan": pl, "bound": b, "rows": len(g), "median_ratio": float(g.ratio.median()),
                    "p10_ratio": float(g.ratio.quantile(0.1)), "p90_ratio": float(g.ratio.quantile(0.9)),
                    "extrapolated": int(g.extrapolated.sum())})
    return pd.DataFrame(out)


def fold_in(into: str | Path, new: list, gpu: str, plans=("lorafusion",), adapters: int | None = 1,
            dry_run: bool = False) -> dict:
    """Append the successful ``kind == mix`` rows of ``plans`` with ``adapters`` adapters (None: any)
    and GPU type ``gpu`` from the profile CSVs ``new`` to the profile CSV ``into`` (the measurements
    an artifact is fitted on, e.g. ``profiler/data/profile_h200.csv``), as written by the profiler
    (same header required; rows already there, by ``ROW_ID``, are not added twice). The file is
    replaced atomically (its earlier bytes kept, the new lines appended); ``dry_run`` writes nothing.
    Then ``tlora-sim costmodel fit --gpu GPU --data INTO --out DIR`` refits (issue 43 item 5).
    Returns {"added", "already", "skipped": {reason: rows}, "plans", "models"}. Raises InputError
    (file, row, field) for an unreadable file, another header, or when no row qualifies."""
    import csv
    import io

    into = Path(into)
    try:
        text = into.read_text()
    except OSError as e:
        raise InputError(f"cannot read profile CSV: {e.strerror}", file=str(into)) from None
    header = next(csv.reader(io.StringIO(text)), None)
    if not header:
        raise InputError("empty profile CSV", file=str(into))
    have = {tuple(r.get(k, "") for k in ROW_ID) for r in csv.DictReader(io.StringIO(text))}
    added, skipped, already, files = [], {}, 0, {}
    for i, r in enumerate(_raw_rows(new)):
        f = r.pop("_file")
        files[f] = files.get(f, 0) + 1
        if list(r) != header:
            raise InputError(f"its header differs from {into}'s ({len(r)} vs {len(header)} columns)", file=f, row=1)
        why = None
        if r["kind"] != "mix":
            why = "kind"
        elif r["plan"] not in plans:
            why = "plan"
        elif str(r["gpu"]).upper() != gpu.upper():
            why = "gpu"
        elif adapters is not None and r["n_adapters"] != str(adapters):
            why = "adapters"
        elif r["error"]:
            why = "error"
        else:
            try:
                if not float(r["step_ms"]) > 0:
                    why = "step_ms"
            except ValueError:
                raise InputError(f"not a number: {r['step_ms']!r}", file=f, row=files[f], field="step_ms") from None
        if why:
            skipped[why] = skipped.get(why, 0) + 1
            continue
        key = tuple(r.get(k, "") for k in ROW_ID)
        if key in have:
            already += 1
            continue
        have.add(key)
        added.append(r)
    if not added and not already:
        raise InputError(f"no successful {gpu} mix rows of plan(s) {', '.join(plans)}"
                         + (f" with {adapters} adapter(s)" if adapters is not None else "")
                         + f" in {', '.join(map(str, new))} (skipped: {skipped})")
    if added and not dry_run:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
        w.writerows(added)
        tmp = into.with_name(into.name + ".tmp")
        tmp.write_text(text + ("" if text.endswith("\n") else "\n") + buf.getvalue())
        tmp.replace(into)
    return {"added": len(added), "already": already, "skipped": skipped, "plans": sorted({r["plan"] for r in added}),
            "models": sorted({r["model"] for r in added})}


def main(argv=None) -> int:
    """``python -m tlora_sim.profiler.fit fold-in ...`` (see ``fold_in``); prints what was added and,
    against ``--artifact``, the measured/predicted drift of the new rows (reference plans too).
    Exit status 2 on bad input."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m tlora_sim.profiler.fit",
                                 description="Fold new profile rows into the measurements an artifact is fitted on.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fold-in", help="append one plan's rows of a new profile to a profile CSV (then refit)")
    f.add_argument("--into", type=Path, required=True, metavar="CSV", help="e.g. profiler/data/profile_h200.csv")
    f.add_argument("--rows", action="append", type=Path, required=True, metavar="CSV_OR_DIR",
                   help="the new profile's CSV (or its directory)")
    f.add_argument("--gpu", default="H200", help="GPU type of the rows (default %(default)s)")
    f.add_argument("--plans", default="lorafusion", help="plans whose rows are added (default %(default)s)")
    f.add_argument("--adapters", default="1", help="adapters per mix of the rows added ('any': all; default 1)")
    f.add_argument("--reference", default="alone,fused",
                   help="plans measured beside, only compared with --artifact (default %(default)s)")
    f.add_argument("--artifact", type=Path, default=None,
                   help="artifact to compare the new rows with (default: the shipped one of --gpu)")
    f.add_argument("--dry-run", action="store_true", help="report only; write nothing")
    args = ap.parse_args(argv)
    try:
        from tlora_sim.sim.costmodel.profiled.artifact import artifact_path, load_artifact

        plans = tuple(p.strip() for p in args.plans.split(",") if p.strip())
        adapters = None if args.adapters == "any" else int(args.adapters)
        res = fold_in(args.into, args.rows, args.gpu, plans, adapters, args.dry_run)
        print(f"{'would add' if args.dry_run else 'added'} {res['added']} rows ({', '.join(res['plans']) or '-'}; "
              f"models {', '.join(res['models']) or '-'}) to {args.into}; {res['already']} already there; "
              f"skipped {res['skipped']}")
        art = load_artifact(args.artifact or artifact_path(args.gpu))
        ref = tuple(p.strip() for p in args.reference.split(",") if p.strip())
        df = read_rows(args.rows)
        df = df[(df.kind == "mix") & df.plan.isin(plans + ref) & (df.gpu.astype(str).str.upper() == args.gpu.upper())]
        if adapters is not None:
            df = df[df.n_adapters == adapters]
        tab = drift_table(art, df)
        print(f"measured / predicted by {art['id']} (before the refit; gpu-bound: >= {GPU_BOUND_MS:g} ms):")
        print(tab.to_string(index=False, float_format=lambda v: f"{v:.3f}") if not tab.empty else "  (no rows)")
        print(f"then: tlora-sim costmodel fit --gpu {args.gpu} --data {args.into} --out {args.into.parent}")
    except (InputError, ValueError) as e:
        print(f"fold-in: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
