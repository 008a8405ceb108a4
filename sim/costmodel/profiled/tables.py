"""The measured tables of one model in a profiled artifact, interpolated in log-log space with
roofline-shaped continuation beyond the measured grid (``profiler/COSTMODEL.md``).

``Tables`` holds one model's curves (frozen base layer ``l0``, attention, LM head);
``tables_of(key, model)`` builds them once per registered artifact (``artifact.register``).
The step formula over them is ``formula.py``.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import numpy as np

from tlora_sim.sim.costmodel import roofline as rf
from tlora_sim.sim.costmodel.hardware import GPUS
from tlora_sim.sim.costmodel.models import get_model
from tlora_sim.sim.costmodel.profiled.artifact import registered


# ------------------------------------------------------------------------------ interpolation
def loglog_interp(x: float, xs: Sequence[float], ys: Sequence[float], logs: tuple | None = None) -> float:
    """Piecewise-linear interpolation in log-log space (xs sorted ascending, inside the range).
    ``logs``: (log xs, log ys) if the caller holds them (``Tables``), else looked up."""
    if len(xs) == 1:
        return float(ys[0])
    lx, ly = logs if logs is not None else log_table(tuple(xs), tuple(ys))
    return float(np.exp(np.interp(math.log(x), lx, ly)))


@lru_cache(maxsize=1024)
def log_table(xs: tuple, ys: tuple) -> tuple[np.ndarray, np.ndarray]:
    """log(xs), log(ys) of a measured table (computed once per table)."""
    return np.log(xs), np.log(ys)


def roofline_l0_ms(m, gpu, t: float) -> float:
    """Roofline shape of the attention-free layer at t tokens (ms): linear layers + elementwise."""
    t = max(t, 1e-6)
    p = m.block_linear_params
    base = max(4.0 * p * t / rf.gemm_rate(t, gpu), 2 * 2 * p / gpu.mem_bw_bytes_s)
    return 1e3 * (base + t * rf.ELEMENTWISE_BYTES_PER_TOKEN(m) / gpu.mem_bw_bytes_s)


def roofline_head_ms(m, gpu, t: float) -> float:
    t = max(t, 1e-6)
    p = m.vocab * m.hidden
    return 1e3 * (max(4.0 * p * t / rf.gemm_rate(t, gpu), 2 * 2 * p / gpu.mem_bw_bytes_s)
                  + 3 * 4 * t * m.vocab / gpu.mem_bw_bytes_s)


def _keep(memo: dict, key, value):
    """Store ``value`` under ``key`` in one of ``Tables``' answer memos (emptied first when it
    holds 2^16 answers) and return it."""
    if len(memo) >= 1 << 16:
        memo.clear()
    memo[key] = value
    return value


class Tables:
    """The measured tables of one model in an artifact, with roofline-shaped continuation.

    Two readings of each table: the raw one (``l0``, ``attn_ms``: exact at the measured points),
    and its GPU-time part (``l0g``, ``attg``), which the layer model adds up: where a small
    measurement was bound by host launch overhead (below ``gpu_from``, found at fit time), the
    GPU time is continued from the first GPU-bound point with the roofline's shape (GEMM
    efficiency curve for the base layer, time proportional to sequences for attention). Every
    lookup returns ``(value, extrapolated)``; extrapolated means outside the measured range.
    ``l0_logs``, ``h_logs`` and ``attn_logs[s]`` hold (log x, log y) of each measured table, for
    the log-log interpolation here and in ``tlora_sim.sim.costmodel.batch``."""

    def __init__(self, model: str, gpu: str, entry: dict):
        self.m, self.gpu = get_model(model), GPUS.get(gpu, GPUS["H100"])
        l0 = entry["l0"]
        self.l0_t, self.l0_ms = list(l0["tokens"]), list(l0["ms"])
        self.l0_from = float(l0.get("gpu_from", self.l0_t[0]))
        self.l0_logs = log_table(tuple(self.l0_t), tuple(self.l0_ms))
        self.l0_from_ms = loglog_interp(self.l0_from, self.l0_t, self.l0_ms, self.l0_logs)
        h = entry["head"]
        self.h_t, self.h_ms, self.h_peak = list(h["tokens"]), list(h["ms"]), list(h.get("peak_bytes") or [])
        self.attn = {int(s): (list(v["seqs"]), list(v["ms"]), float(v.get("gpu_from", v["seqs"][0])))
                     for s, v in entry["attn"].items()}
        self.attn_s = sorted(self.attn)
        self.h_logs = log_table(tuple(self.h_t), tuple(self.h_ms))
        self.attn_logs = {s: log_table(tuple(bs), tuple(ms)) for s, (bs, ms, _) in self.attn.items()}
        # answers of ``head`` by tokens, and of ``layer_ms`` for ``plan_step`` (``layer_memo``): pure
        # functions of their arguments, asked again and again by the multi-GPU planner's questions
        self._head_memo: dict[float, tuple[float, bool]] = {}
        self._peak_memo: dict[float, float] = {}  # head_peak by tokens (few distinct token counts)
        self.layer_memo: dict[tuple, tuple[float, bool]] = {}
        # answers of ``l0g`` by tokens and of ``attn_ms`` by (length, sequences, gpu): pure
        # functions of their arguments, asked for every mix the scalar model prices
        self._l0g_memo: dict[float, tuple[float, bool]] = {}
        self._attn_memo: dict[tuple, tuple[float, bool]] = {}

    def _roof(self, t: float) -> float:
        return roofline_l0_ms(self.m, self.gpu, t)

    def l0(self, t: float) -> tuple[float, bool]:
        """Measured attention-free layer (ms) at t tokens, raw."""
        lo, hi = self.l0_t[0], self.l0_t[-1]
        if lo <= t <= hi:
            return loglog_interp(t, self.l0_t, self.l0_ms, self.l0_logs), False
        edge, v = (lo, self.l0_ms[0]) if t < lo else (hi, self.l0_ms[-1])
        return v * self._roof(t) / self._roof(edge), True

    def l0g(self, t: float) -> tuple[float, bool]:
        """GPU time of the attention-free layer (ms) at t tokens (memoised by t)."""
        got = self._l0g_memo.get(t)
        return got if got is not None else _keep(self._l0g_memo, t, self._l0g(t))

    def _l0g(self, t: float) -> tuple[float, bool]:
        if t >= self.l0_from:
            return self.l0(t)
        return self.l0_from_ms * self._roof(t) / self._roof(self.l0_from), t < self.l0_t[0]

    def head(self, t: float) -> tuple[float, bool]:
        """LM head, embedding and loss (ms) at t tokens, and whether t is outside the table
        (memoised by t: a pure function of it)."""
        got = self._head_memo.get(t)
        return got if got is not None else _keep(self._head_memo, t, self._head(t))

    def _head(self, t: float) -> tuple[float, bool]:
        lo, hi = self.h_t[0], self.h_t[-1]
        if lo <= t <= hi:
            return loglog_interp(t, self.h_t, self.h_ms, self.h_logs), False
        edge, v = (lo, self.h_ms[0]) if t < lo else (hi, self.h_ms[-1])
        return v * roofline_head_ms(self.m, self.gpu, t) / roofline_head_ms(self.m, self.gpu, edge), True

    def head_peak(self, t: float) -> float:
        """Peak bytes of the head step at t tokens (proportional to tokens beyond the grid;
        memoised by t: a pure function of it)."""
        got = self._peak_memo.get(t)
        return got if got is not None else _keep(self._peak_memo, t, self._head_peak(t))

    def _head_peak(self, t: float) -> float:
        if not self.h_peak:
            return 3 * 4.0 * t * self.m.vocab
        if t < self.h_t[0]:
            return self.h_peak[0] * t / self.h_t[0]
        if t > self.h_t[-1]:
            return self.h_peak[-1] * t / self.h_t[-1]
        return float(np.interp(t, self.h_t, self.h_peak))

    def _attn_at(self, s: int, b: float, gpu: bool) -> tuple[float, bool]:
        bs, ms, b0 = self.attn[s]
        if gpu and b < b0:
            return loglog_interp(b0, bs, ms, self.attn_logs[s]) * b / b0, b < bs[0]
        if bs[0] <= b <= bs[-1]:
            return loglog_interp(b, bs, ms, self.attn_logs[s]), False
        edge, v = (bs[0], ms[0]) if b < bs[0] else (bs[-1], ms[-1])
        return v * b / edge, True  # time per sequence constant beyond the grid

    def attn_ms(self, s: float, b: float, gpu: bool = False) -> tuple[float, bool]:
        """Attention block of b sequences of s tokens (one SDPA call), ms (``gpu``: GPU part);
        memoised by (s, b, gpu)."""
        key = (s, b, gpu)
        got = self._attn_memo.get(key)
        return got if got is not None else _keep(self._attn_memo, key, self._attn_ms(s, b, gpu))

    def _attn_ms(self, s: float, b: float, gpu: bool) -> tuple[float, bool]:
        if b <= 0:
            return 0.0, False
        ss = self.attn_s
        if s in self.attn:
            return self._attn_at(int(s), b, gpu)
        if s < ss[0] or s > ss[-1]:
            edge = ss[0] if s < ss[0] else ss[-1]
            v, _ = self._attn_at(edge, b, gpu)
            return v * (s / edge) ** 2, True
        j = int(np.searchsorted(ss, s))
        s0, s1 = ss[j - 1], ss[j]
        (v0, e0), (v1, e1) = self._attn_at(s0, b, gpu), self._attn_at(s1, b, gpu)
        w = (math.log(s) - math.log(s0)) / (math.log(s1) - math.log(s0))
        return math.exp((1 - w) * math.log(v0) + w * math.log(v1)), e0 or e1

    def attg(self, s: float, b: float) -> tuple[float, bool]:
        """GPU time of the attention block (ms)."""
        return self.attn_ms(s, b, gpu=True)


@lru_cache(maxsize=64)
def tables_of(key: str, model: str) -> Tables:
    """The ``Tables`` of ``model`` in the artifact registered under ``key`` (built once)."""
    art = registered(key)
    return Tables(model, art["gpu"], art["models"][model])
