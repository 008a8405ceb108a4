"""Summary statistics of a trace table, for ``tlora-sim traces describe SPEC``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from tlora_sim.traces.lora import LORA_COLUMNS

_QUANTILES = (50, 90, 99)
LOADS = (0.7, 0.9, 1.1)
"""Offered loads for which ``describe_trace`` gives the cluster size."""


def _stats(x: np.ndarray) -> dict[str, float]:
    out = {f"p{q}": float(np.percentile(x, q)) for q in _QUANTILES}
    out["max"] = float(x.max())
    out["mean"] = float(x.mean())
    return out


def describe_trace(df: pd.DataFrame) -> dict[str, Any]:
    """Summarise a trace table (the common schema, optionally with LoRA columns).

    Returns (plain Python types, JSON-ready except int dict keys):
        ``source``, ``format``: from attrs; ``jobs``; ``span_s`` / ``span_days``: last minus first submit time;
        ``end_s``: latest submit + duration (the replay length without queueing); ``arrival_rate_per_h``:
        jobs per hour over the span; ``gpus``: p50/p90/p99/max/mean of GPUs per job and ``counts``
        {GPUs: jobs}; ``duration_s``: p50/p90/p99/max/mean in seconds; ``gpu_hours``: sum of
        num_gpus x duration / 3600; ``tenants``: {tenant: jobs} (only non-empty names); ``skipped``: attrs'
        skipped counts; ``gpu_demand_mean``: mean GPUs busy if every job ran its traced duration on arrival,
        ``sum(num_gpus x duration) / (end_s - first submit)`` (GPUs; NaN for a zero-length trace), and
        ``cluster_gpus_for_load``: {load: GPUs} the cluster size at which that demand is the offered load
        ``demand / GPUs`` = 0.7, 0.9, 1.1 (``ceil(demand / load)``; :data:`LOADS`); ``starts``: the calendar
        time of the first job where the trace has one (ISO 8601, in the trace's time zone), else ``""``;
        and, when present, ``lora`` ({column: {value: jobs}}) and ``lora_distribution`` (name).

    Percentiles are numpy's linear interpolation (pandas' default).
    """
    submit = df["submit_time_s"].to_numpy(dtype=float)
    duration = df["duration_s"].to_numpy(dtype=float)
    gpus = df["num_gpus"].to_numpy()
    n = len(df)
    span = float(submit.max() - submit.min()) if n else 0.0
    sizes, counts = np.unique(gpus, return_counts=True)
    tenants = df["tenant"][df["tenant"] != ""].value_counts()
    d: dict[str, Any] = {
        "source": df.attrs.get("source", ""),
        "format": df.attrs.get("format", ""),
        "jobs": n,
        "span_s": span,
        "span_days": span / 86400.0,
        "end_s": float((submit + duration).max()) if n else 0.0,
        "arrival_rate_per_h": n / span * 3600.0 if span > 0 else float("nan"),
        "gpus": {**_stats(gpus.astype(float)), "counts": {int(s): int(c) for s, c in zip(sizes, counts)}},
        "duration_s": _stats(duration),
        "gpu_hours": float((gpus * duration).sum() / 3600.0),
        "tenants": {str(k): int(v) for k, v in tenants.items()},
        "skipped": dict(df.attrs.get("skipped", {})),
    }
    horizon = d["end_s"] - (float(submit.min()) if n else 0.0)
    demand = float((gpus * duration).sum()) / horizon if horizon > 0 else float("nan")
    d["gpu_demand_mean"] = demand
    d["cluster_gpus_for_load"] = {load: (int(np.ceil(demand / load)) if demand == demand else 0) for load in LOADS}
    d["starts"] = ""
    if df.attrs.get("epoch_s") is not None:
        t = pd.Timestamp(float(df.attrs["epoch_s"]), unit="s", tz="UTC").tz_convert(df.attrs.get("time_zone") or "UTC")
        d["starts"] = t.isoformat()
    if all(c in df.columns for c in LORA_COLUMNS):
        d["lora"] = {c: {(v.item() if hasattr(v, "item") else v): int(count)
                         for v, count in df[c].value_counts().sort_index().items()} for c in LORA_COLUMNS}
        d["lora_distribution"] = df.attrs.get("lora_distribution", {}).get("name", "")
    return d


def _fmt(x: float) -> str:
    if x != x:  # NaN
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.2f}"


def format_description(d: dict[str, Any]) -> str:
    """Render :func:`describe_trace`'s dict as a readable multi-line text table."""
    lines = [f"trace      {d.get('source', '')}  (format {d.get('format', '')})",
             f"jobs       {d['jobs']:,}",
             f"span       {_fmt(d['span_s'])} s = {d['span_days']:.2f} days (arrivals); "
             f"last job ends at {d['end_s'] / 86400:.2f} days without queueing",
             f"arrivals   {_fmt(d['arrival_rate_per_h'])} jobs/h",
             f"GPU-hours  {_fmt(d['gpu_hours'])}",
             *([f"starts     {d['starts']}"] if d.get("starts") else []),
             *([f"GPU demand {_fmt(d['gpu_demand_mean'])} GPUs busy on average (traced durations, no queueing); "
                "load " + ", ".join(f"{load:g} on {g:,} GPUs ({-(-g // 8):,}x8)"
                                    for load, g in d["cluster_gpus_for_load"].items())]
               if "gpu_demand_mean" in d else []),
             "",
             f"{'':12}{'p50':>12}{'p90':>12}{'p99':>12}{'max':>12}{'mean':>12}"]
    for label, key in (("GPUs/job", "gpus"), ("duration s", "duration_s")):
        s = d[key]
        lines.append(f"{label:12}" + "".join(f"{_fmt(s[k]):>12}" for k in ("p50", "p90", "p99", "max", "mean")))
    total = max(d["jobs"], 1)
    lines += ["", "GPUs/job   jobs      share"]
    lines += [f"{g:>8} {c:>7,} {100 * c / total:>9.1f} %" for g, c in d["gpus"]["counts"].items()]
    if d.get("tenants"):
        shown = list(d["tenants"].items())[:10]
        more = len(d["tenants"]) - len(shown)
        lines += ["", f"tenants    {len(d['tenants'])}" + (f" (top {len(shown)})" if more else "")]
        lines += [f"  {t:<24} {c:>7,}" for t, c in shown]
    skipped = d.get("skipped") or {}
    lines += ["", "skipped    " + (", ".join(f"{k} {v:,}" for k, v in skipped.items()) if skipped else "none")]
    if "lora" in d:
        lines += ["", f"LoRA attributes (distribution {d.get('lora_distribution') or '?'})"]
        for col, counts in d["lora"].items():
            lines.append(f"  {col:<13}" + ", ".join(f"{v}: {c:,}" for v, c in counts.items()))
    return "\n".join(lines)
