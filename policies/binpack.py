"""Micro-batch bin packing for LoRAFusion (arXiv 2510.00206, "multi-LoRA micro-batch scheduling").

A group step trains every member's sequences; LoRAFusion packs the sequences of all adapters in a
group into micro-batches of at most ``capacity`` tokens, using as few micro-batches as possible
(fewer micro-batches: fewer re-reads of the frozen weights, larger and more efficient GEMMs).
Solved as an integer program with HiGHS (``scipy.optimize.milp``) under a time limit, with a
greedy first-fit-decreasing fallback; the better of the two is kept.

MILP (bins b, items i of size s_i): minimise Σ_b y_b subject to Σ_b x_ib = 1, Σ_i s_i x_ib <=
C y_b, y_b >= y_{b+1} (symmetry breaking), x, y binary; the number of bins is bounded by the FFD
solution.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def first_fit_decreasing(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """Greedy FFD: item indices per bin. Raises ValueError if an item exceeds ``capacity``."""
    if any(s > capacity for s in sizes):
        raise ValueError(f"an item of {max(sizes)} tokens exceeds the micro-batch capacity {capacity}")
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        for b, load in enumerate(loads):
            if load + sizes[i] <= capacity:
                bins[b].append(i)
                loads[b] += sizes[i]
                break
        else:
            bins.append([i])
            loads.append(sizes[i])
    return bins


def milp_pack(sizes: Sequence[int], capacity: int, max_bins: int, time_limit_s: float = 1.0) -> list[list[int]] | None:
    """Optimal packing into at most ``max_bins`` bins by HiGHS, or None (no solution in time)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    n, m = len(sizes), max_bins
    nv = n * m + m  # x_ib row-major, then y_b
    c = np.zeros(nv)
    c[n * m:] = 1.0
    rows, lo, hi = [], [], []
    for i in range(n):  # each item in exactly one bin
        r = np.zeros(nv)
        r[i * m:(i + 1) * m] = 1.0
        rows.append(r), lo.append(1.0), hi.append(1.0)
    for b in range(m):  # capacity of an open bin
        r = np.zeros(nv)
        r[[i * m + b for i in range(n)]] = sizes
        r[n * m + b] = -capacity
        rows.append(r), lo.append(-np.inf), hi.append(0.0)
    for b in range(m - 1):  # open bins first
        r = np.zeros(nv)
        r[n * m + b], r[n * m + b + 1] = -1.0, 1.0
        rows.append(r), lo.append(-np.inf), hi.append(0.0)
    res = milp(c, constraints=LinearConstraint(np.array(rows), lo, hi), integrality=np.ones(nv),
               bounds=Bounds(0, 1), options={"time_limit": time_limit_s, "disp": False})
    if res.x is None:
        return None
    x = np.round(res.x[: n * m]).reshape(n, m)
    bins = [[i for i in range(n) if x[i, b] > 0.5] for b in range(m)]
    return [b for b in bins if b]


def pack_micro_batches(sizes: Sequence[int], capacity: int, time_limit_s: float = 1.0,
                       milp_max_items: int = 64) -> tuple[list[list[int]], str]:
    """Pack items (sequence token counts) into micro-batches of at most ``capacity`` tokens.

    Returns:
        (bins of item indices, ``"milp"`` or ``"greedy"``: which solution was kept).

    Raises:
        ValueError: an item larger than ``capacity``.
    """
    greedy = first_fit_decreasing(sizes, capacity)
    lower = math.ceil(sum(sizes) / capacity)
    if len(greedy) == lower or len(sizes) > milp_max_items:
        return greedy, "greedy"
    exact = milp_pack(sizes, capacity, len(greedy), time_limit_s)
    if exact is not None and len(exact) < len(greedy):
        return exact, "milp"
    return greedy, "greedy"
