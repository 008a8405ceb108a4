"""Speed-ups against the reference baseline and the number formats every printed table uses.

``speedups(table, reference)`` adds :data:`SPEEDUP_COLUMNS` to a comparison table (one row per
policy), each against the ``reference`` row:

* ``avg_jct_speedup`` = reference avg JCT / policy avg JCT (above 1: the policy finishes jobs
  sooner; the papers' "JCT x times better");
* ``p90_jct_speedup`` = reference p90 JCT / policy p90 JCT;
* ``throughput_x`` = policy tokens/s / reference tokens/s;
* ``makespan_speedup`` = reference makespan / policy makespan.

All dimensionless, exactly 1.0 for the reference, NaN where a value is missing or a denominator
is 0. ``format_table`` prints a comparison in hours and plain decimals (no e-notation).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError

#: (column, summary column, kind): "speedup" = reference / policy, "x" = policy / reference.
SPEEDUPS = (
    ("avg_jct_speedup", "avg_jct_s", "speedup"),
    ("p90_jct_speedup", "p90_jct_s", "speedup"),
    ("throughput_x", "throughput_tokens_per_s", "x"),
    ("makespan_speedup", "makespan_s", "speedup"),
)
SPEEDUP_COLUMNS = tuple(s[0] for s in SPEEDUPS)


def ratio_to(values: np.ndarray, base: float, kind: str) -> np.ndarray:
    """Each of ``values`` against ``base``: ``kind`` ``"x"`` gives value / base (throughput,
    utilization: above 1 is better), any other kind base / value (JCT, makespan: above 1 is
    better). Dimensionless; NaN where a value is missing or a denominator is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = values / base if kind == "x" else base / values
    return np.where(np.isfinite(ratio), ratio, np.nan)


def policies_holding(table: pd.DataFrame, name: str, role: str, where: str, hint: str = "") -> list[str]:
    """``table``'s ``policy`` column as strings (one per row), checked to hold ``name``.

    Raises:
        InputError: no ``policy`` column, or ``name`` is not one of the policies ("``role`` 'name' is
            not in the ``where``; available policies: ...", then ``hint``).
    """
    if "policy" not in table.columns:
        raise InputError("missing column", field="policy")
    pols = [str(p) for p in table["policy"]]
    if name not in pols:
        raise InputError(f"{role} {name!r} is not in the {where}; available policies: {', '.join(pols)}{hint}",
                         field="policy")
    return pols


def speedups(table: pd.DataFrame, reference: str) -> pd.DataFrame:
    """``table`` with :data:`SPEEDUP_COLUMNS` against the ``reference`` row and a ``reference``
    column (the reference's name); the columns whose summary column is absent are left out.

    Raises:
        InputError: no ``policy`` column, or ``reference`` is not one of the policies (the message
            lists them).
    """
    pols = policies_holding(table, reference, "reference policy", "table")
    out = table.copy()
    ref = out.loc[[p == reference for p in pols]].iloc[0]
    for name, col, kind in SPEEDUPS:
        if col not in out.columns:
            continue
        vals = pd.to_numeric(out[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        base = pd.to_numeric(pd.Series([ref[col]]), errors="coerce").to_numpy(dtype=float, na_value=np.nan)[0]
        ratio = ratio_to(vals, base, kind)
        ratio[[p == reference for p in pols]] = 1.0 if math.isfinite(base) and base != 0 else np.nan
        out[name] = ratio
    out["reference"] = reference
    return out


def fmt_number(value, digits: int = 3) -> str:
    """One number as every table and figure label prints it: ``digits`` significant digits in plain
    decimal notation (no e-notation; thousands grouped with commas), ``n/a`` for NaN/None."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if not math.isfinite(v):
        return "n/a"
    if v == 0:
        return "0"
    mag = math.floor(math.log10(abs(v)))
    decimals = max(0, digits - 1 - mag)
    return f"{v:,.{decimals}f}"


#: The printed columns of a comparison: (column, header, scale) -- JCTs and queueing in hours.
PRINTED = (
    ("policy", "policy", None),
    ("jobs", "jobs", None),
    ("avg_jct_s", "avg JCT h", 3600.0),
    ("p90_jct_s", "p90 JCT h", 3600.0),
    ("avg_queue_s", "avg queue h", 3600.0),
    ("makespan_s", "makespan h", 3600.0),
    ("throughput_tokens_per_s", "tokens/s", 1.0),
    ("gpu_alloc_util", "alloc util", "%"),
    ("gpu_compute_util", "compute util", "%"),
    ("avg_jct_speedup", "avg JCT x", 1.0),
    ("p90_jct_speedup", "p90 JCT x", 1.0),
    ("throughput_x", "tput x", 1.0),
    ("makespan_speedup", "makespan x", 1.0),
)


def format_table(table: pd.DataFrame) -> str:
    """The comparison as printed: hours for times, % for utilizations, speed-ups with two decimals,
    ``+- h`` for a column's ``_ci95`` when present (``compare --seeds``). Plain decimals only."""
    cols, heads = [], []
    for col, head, scale in PRINTED:
        if col not in table.columns:
            continue
        vals = []
        for i, v in enumerate(table[col]):
            if scale is None:
                text = str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
            elif scale == "%":
                text = "n/a" if not _finite(v) else f"{100 * float(v):.1f}%"
            elif col.endswith(("_speedup", "_x")):
                text = "n/a" if not _finite(v) else f"{float(v):.2f}"
            else:
                text = fmt_number(float(v) / scale) if _finite(v) else "n/a"
            ci = f"{col}_ci95"
            if ci in table.columns and _finite(table[ci].iloc[i]) and scale not in (None, "%"):
                c = float(table[ci].iloc[i]) / scale
                text += f" ±{c:.2f}" if col.endswith(("_speedup", "_x")) else f" ±{fmt_number(c, 2)}"
            vals.append(text)
        cols.append(vals)
        heads.append(head)
    widths = [max(len(h), *(len(v) for v in c)) for h, c in zip(heads, cols)]
    lines = ["  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, w) in enumerate(zip(heads, widths)))]
    for r in range(len(table)):
        lines.append("  ".join(c[r].rjust(w) if i else c[r].ljust(w) for i, (c, w) in enumerate(zip(cols, widths))))
    return "\n".join(lines)


def _finite(v) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False
