"""Fit the cost model's multi-GPU terms to the two-GPU profile (``profiler/multigpu.py``'s CSV).

What is fitted (``sim/costmodel/profiled/multigpu.py`` uses it):

* ``curves``: the measured collective times by message size (op -> [[bytes, ms], ...], the rows of
  ``kind=collective``; all_reduce and all_gather; two GPUs);
* ``host_scale``: the eager step's host (launch) time with one training process per GPU on one host,
  over the single-process profile's (grid 1.00-2.50, step 0.05);
* ``per_tensor_ms``: flattening one gradient tensor into the fp32 bucket and copying it back;
* ``sync_ms``: a multi-GPU step's fixed synchronisation.

``per_tensor_ms`` and ``sync_ms`` are linear given ``host_scale``: non-negative least squares on
the relative residuals of every measured step row (``kind=step`` without an error), for each
``host_scale`` on the grid; the grid point with the smallest squared relative error wins.

Held-out error: leave one row out, refit (all four terms) on the rest, predict it; the median and
90th percentile of |predicted - measured| / measured over all rows (``heldout``). Repeatability:
configurations measured in more than one CSV (runs on different machine leases), the median and
90th percentile of max/min - 1 of their step times (``repeatability``): a floor under any model's
error on these rows.

``build(csv_paths, gpu, out_dir)`` writes ``OUT/multigpu_<gpu>.json``; ``validate(csv_paths, gpu)``
returns the held-out table. Both need pandas and scipy, not torch.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.costmodel.parallelism import SCHEMA, Parallelism
from tlora_sim.traces.errors import InputError

HOST_GRID = np.round(np.arange(1.0, 2.5001, 0.05), 2)
_MEASURED_PLANS = ("alone", "loop", "fused")


def read_rows(paths: list) -> pd.DataFrame:
    """The rows of the multi-GPU CSVs (files or directories of ``multigpu_*.csv``).

    Raises:
        InputError: no file, an unreadable file, or a file without the profiler's columns.
    """
    files = []
    for p in map(Path, paths):
        files += sorted(p.glob("multigpu_*.csv")) if p.is_dir() else [p]
    files = [f for f in files if f.is_file() or not f.exists()]
    if not files:
        raise InputError("no multigpu_*.csv found", file=", ".join(map(str, paths)))
    frames = []
    for f in files:
        try:
            d = pd.read_csv(f, dtype={"ranks": str, "batch_sizes": str, "seq_lens": str, "micro_batch_per_gpu": str},
                            keep_default_na=False, na_values={"step_ms": [""], "time_ms": [""], "bytes": [""]})
        except (OSError, pd.errors.ParserError, UnicodeDecodeError) as e:
            raise InputError(f"cannot read multi-GPU profile ({e})", file=str(f)) from None
        missing = {"kind", "op", "bytes", "time_ms", "n_gpus", "parallelism", "plan", "step_ms", "gpu"} - set(d.columns)
        if missing:
            raise InputError(f"not a multi-GPU profile: lacks {sorted(missing)}", file=str(f))
        d["_file"] = str(f)
        frames.append(d)
    return pd.concat(frames, ignore_index=True)


def curves_of(d: pd.DataFrame) -> dict:
    """op -> [[bytes, median ms], ...] of the two-GPU collective rows."""
    c = d[(d.kind == "collective") & (pd.to_numeric(d.n_gpus) == 2)]
    out = {}
    for op in ("all_reduce", "all_gather"):
        r = c[c.op == op]
        if len(r) < 2:
            raise InputError(f"the profile has {len(r)} two-GPU {op} rows (need >= 2)", field="op")
        g = r.groupby(pd.to_numeric(r.bytes))["time_ms"].median()
        out[op] = [[float(b), float(t)] for b, t in g.items()]
    return out


def step_rows(d: pd.DataFrame) -> pd.DataFrame:
    """The measured two-GPU step rows (no error, a measured plan)."""
    s = d[(d.kind == "step") & (d.error.astype(str) == "") & d.step_ms.notna()]
    return s[s.plan.isin(_MEASURED_PLANS) & (pd.to_numeric(s.n_gpus) == 2)].reset_index(drop=True)


def _members(r) -> list[tuple[int, int, int]]:
    ranks, bs, sl = (str(r[c]).split(";") for c in ("ranks", "batch_sizes", "seq_lens"))
    return [(int(a), int(b), int(c)) for a, b, c in zip(ranks, bs, sl)]


def _row_terms(cm, r, curves: dict, host_scale) -> tuple[float, float, float]:
    """(prediction with per_tensor_ms = sync_ms = 0 (ms), the row's per-tensor count, its sync count)."""
    from tlora_sim.sim.costmodel.profiled.multigpu import plan_step
    from tlora_sim.sim.costmodel.models import get_model
    from tlora_sim.sim.costmodel.profiled.formula import LINEARS_PER_LAYER

    n = int(r["n_gpus"])
    mem = _members(r)
    kind = str(r["parallelism"])
    par = Parallelism("tp", n, tp=n) if kind == "tp" else Parallelism(kind, n)
    mixes = None
    if kind == "local":  # the profiler's placement: sorted by (seq_len, rank), adapter i on GPU i mod n
        order = sorted(mem, key=lambda x: (x[2], x[0]))
        mixes = [[x for i, x in enumerate(order) if i % n == g] for g in range(n)]
        mixes = [x for x in mixes if x]
    terms = {"host_scale": host_scale, "per_tensor_ms": 0.0, "sync_ms": 0.0, "curves": curves}
    nano = int(float(r["nano_batches"] or 1))
    members = tuple(sorted(Member(*x) for x in mem))
    s, _, _ = plan_step(cm.artifact, cm.key, str(r["model"]), cm.gpu, members, par, str(r["plan"]), nano, 1, True,
                        terms=terms, mixes=mixes)
    layers = get_model(str(r["model"])).layers
    per_gpu = max(len(x) for x in (mixes or [mem]))
    seqs = sum(b for _, b, _ in mem) / (n if kind in ("dp", "fsdp") else 1)
    n_nano = max(1, min(nano, int(seqs))) if r["plan"] == "fused" else 1
    tensors = 2 * LINEARS_PER_LAYER * layers * (1 if r["plan"] == "fused" else per_gpu)
    x = n_nano * tensors if kind != "local" else 0.0
    return s * 1e3, float(x), float(kind != "local")


def _design(cm, rows: pd.DataFrame, curves: dict) -> dict:
    """(loop host_scale, fused host_scale) -> (pred0 ms, per-tensor counts, sync counts) arrays over
    ``rows``. A row depends on one family's scale, so each is evaluated once per grid value."""
    fam = rows.plan.map(lambda p: "fused" if p == "fused" else "loop").to_numpy()
    per = {}
    for h in HOST_GRID:
        hs = {"loop": float(h), "fused": float(h)}
        per[float(h)] = np.array([_row_terms(cm, r, curves, hs) for _, r in rows.iterrows()])
    out = {}
    for hl in HOST_GRID:
        for hf in HOST_GRID:
            t = np.where((fam == "fused")[:, None], per[float(hf)], per[float(hl)])
            out[(float(hl), float(hf))] = (t[:, 0], t[:, 1], t[:, 2])
    return out


def _fit(design: dict, y: np.ndarray, mask: np.ndarray) -> tuple[float, float, float, float]:
    """(host_scale, per_tensor_ms, sync_ms, sum of squared relative errors) on rows ``mask``."""
    best = None
    for h, (p0, x, c) in design.items():
        A = np.column_stack([x, c])[mask] / y[mask, None]
        b = (y[mask] - p0[mask]) / y[mask]
        coef, _ = nnls(A, b)
        err = float(np.sum((A @ coef - b) ** 2))
        if best is None or err < best[3] - 1e-15:
            best = (h, float(coef[0]), float(coef[1]), err)
    return best


def _predict(design: dict, fit: tuple, i) -> np.ndarray:
    p0, x, c = design[fit[0]]
    return p0[i] + fit[1] * x[i] + fit[2] * c[i]


def validate(paths: list, gpu: str) -> tuple[pd.DataFrame, dict]:
    """Leave-one-row-out: (per-row table, summary with ``median_ape``, ``p90_ape``, ``rows``).

    Raises:
        InputError: unreadable CSVs, no two-GPU rows for ``gpu``, no single-GPU artifact for it.
    """
    from tlora_sim.sim.costmodel.factory import make_cost_model

    d = read_rows(paths)
    d = d[d.gpu.astype(str).str.upper() == gpu.upper()]
    rows = step_rows(d)
    if len(rows) < 4:
        raise InputError(f"{len(rows)} measured two-GPU step rows for {gpu} (need >= 4)", field="gpu")
    cm = make_cost_model("profiled", gpu)
    curves = curves_of(d)
    design = _design(cm, rows, curves)
    y = rows.step_ms.to_numpy(float)
    pred = np.empty(len(rows))
    for i in range(len(rows)):
        mask = np.ones(len(rows), bool)
        mask[i] = False
        pred[i] = _predict(design, _fit(design, y, mask), i)
    ape = np.abs(pred - y) / y
    table = rows[["model", "parallelism", "plan", "n_adapters", "nano_batches", "step_ms"]].copy()
    table["heldout_pred_ms"], table["ape"] = pred, ape
    full = _fit(design, y, np.ones(len(rows), bool))
    # repeatability: configurations measured in more than one file (runs on different leases)
    key = rows[["model", "parallelism", "plan", "ranks", "batch_sizes", "seq_lens", "nano_batches"]].astype(str) \
        .agg("|".join, axis=1)
    diffs = [float(np.exp(np.abs(np.log(g.step_ms.max() / g.step_ms.min()))) - 1)
             for _, g in rows.groupby(key) if g._file.nunique() > 1]
    summary = {"rows": int(len(rows)), "median_ape": float(np.median(ape)), "p90_ape": float(np.quantile(ape, 0.9)),
               "max_ape": float(ape.max()), "split": "leave one row out, all four terms refitted",
               "host_scale": {"loop": full[0][0], "fused": full[0][1]}, "per_tensor_ms": full[1], "sync_ms": full[2],
               "repeat_configs": len(diffs), "repeat_median_diff": float(np.median(diffs)) if diffs else float("nan"),
               "repeat_p90_diff": float(np.quantile(diffs, 0.9)) if diffs else float("nan")}
    return table, summary


def _rel(f) -> str:
    p = Path(f).resolve()
    try:
        return str(p.relative_to(Path(__file__).resolve().parent.parent))
    except ValueError:
        return p.name


def build(paths: list, gpu: str, out_dir: str | Path) -> tuple[Path, dict]:
    """Fit on every row, record the held-out error, write ``OUT/multigpu_<gpu>.json``."""
    d = read_rows(paths)
    d = d[d.gpu.astype(str).str.upper() == gpu.upper()]
    table, s = validate(paths, gpu)
    src = {c: sorted({str(v) for v in d[c] if str(v)}) for c in ("gpu_name", "torch", "triton", "git_commit")
           if c in d}
    raw = b"".join(Path(f).read_bytes() for f in sorted(set(d._file)))
    art = {"schema": SCHEMA, "gpu": gpu.upper(), "n_gpus_measured": [2],
           "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "data": sorted(_rel(f) for f in set(d._file)), "data_sha256": hashlib.sha256(raw).hexdigest(),
           "source": src, "curves": curves_of(d), "host_scale": s["host_scale"], "per_tensor_ms": s["per_tensor_ms"],
           "sync_ms": s["sync_ms"],
           "heldout": {k: s[k] for k in ("rows", "median_ape", "p90_ape", "max_ape", "split")},
           "repeatability": {k: s[k] for k in ("repeat_configs", "repeat_median_diff", "repeat_p90_diff")},
           "heldout_by_parallelism": {k: float(v) for k, v in table.groupby("parallelism").ape.median().items()}}
    out = Path(out_dir) / f"multigpu_{gpu.lower()}.json"
    out.write_text(json.dumps(art, indent=1) + "\n")
    return out, s
