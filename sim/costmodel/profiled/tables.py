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


# ----------------------------------------------------------------- one arithmetic, floats or rows
# The profiled formula is written once over "values": a Python float (the scalar model, one mix)
# or a float64 numpy array (the vectorised ``formula.FusedBatch``, many rows). +, -, *, / and
# comparisons are IEEE-identical on both in the same order; the transcendental functions are
# not (numpy's SIMD log, exp and power differ from the C library's in the last place for ~0.03%,
# ~5% and ~5% of inputs on AVX-512 machines), so the helpers below take the C library's function
# element by element on arrays, and numpy's ``np.exp`` where the scalar model has always used it
# (``loglog_interp``: ``np.exp`` of a numpy scalar runs numpy's array loop, the same numbers).
def is_rows(x) -> bool:
    """Whether ``x`` is an array of values (else one float)."""
    return isinstance(x, np.ndarray)


def libm(fn, x, *args):
    """``fn`` (a C-library function: ``math.log``, ``math.exp``, ``pow``) of a float, or of every
    element of an array (same shape), the C library's result bit for bit either way."""
    if not isinstance(x, np.ndarray):
        return fn(x, *args)
    if args:
        return np.fromiter(map(fn, x.ravel().tolist(), *([a] * x.size for a in args)), float,
                           x.size).reshape(x.shape)
    return np.fromiter(map(fn, x.ravel().tolist()), float, x.size).reshape(x.shape)


def maximum(a, b):
    """``max(a, b)`` of floats, ``np.maximum`` of arrays (the same value: no NaNs here)."""
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def where(cond, a, b):
    """``a if cond else b`` for a bool, ``np.where`` for an array of them (the same values)."""
    return np.where(cond, a, b) if isinstance(cond, np.ndarray) else (a if cond else b)


def piecewise(x, cases, default):
    """``fn(x)`` of the first case ``(side, bound, fn)`` that holds (``side`` "<": x < bound;
    ">": x > bound), else ``default(x)``: on a float, by ``if``; on an array, element by element
    (each element gets the value its first true case gives: ``default`` and every case's
    function evaluated on the elements they may serve, the cases written last to first, so the
    first true one is written last), so both give the same numbers. The functions must accept
    any element of their input (``default`` every element)."""
    if not isinstance(x, np.ndarray):
        for side, bound, fn in cases:
            if (x < bound) if side == "<" else (x > bound):
                return fn(x)
        return default(x)
    if not x.size:
        return default(x)
    lo, hi = x.min(), x.max()
    live = [(side, bound, fn) for side, bound, fn in cases if (lo < bound if side == "<" else hi > bound)]
    if not live:
        return default(x)
    side, bound, fn = live[0]
    if (hi < bound) if side == "<" else (lo > bound):
        return fn(x)  # the first case that holds anywhere holds everywhere
    out = np.array(default(x), dtype=float)
    for side, bound, fn in reversed(live):
        m = (x < bound) if side == "<" else (x > bound)
        out[m] = fn(x[m])
    return out


# ------------------------------------------------------------------------------ interpolation
def loglog_interp(x, xs: Sequence[float], ys: Sequence[float], logs: tuple | None = None):
    """Piecewise-linear interpolation in log-log space (xs sorted ascending, inside the range) of
    a float (a float back) or an array (an array of its shape). ``logs``: (log xs, log ys) if the
    caller holds them (``Tables``), else looked up."""
    if len(xs) == 1:
        return np.full(x.shape, float(ys[0])) if isinstance(x, np.ndarray) else float(ys[0])
    lx, ly = logs if logs is not None else log_table(tuple(xs), tuple(ys))
    if isinstance(x, np.ndarray):
        return np.exp(np.interp(libm(math.log, x), lx, ly))
    return float(np.exp(np.interp(math.log(x), lx, ly)))


@lru_cache(maxsize=1024)
def log_table(xs: tuple, ys: tuple) -> tuple[np.ndarray, np.ndarray]:
    """log(xs), log(ys) of a measured table (computed once per table)."""
    return np.log(xs), np.log(ys)


def gemm_rate(t, gpu):
    """``roofline.gemm_rate`` (FLOP/s) of a float or an array of tokens per GPU, the same
    arithmetic (its ``np.log``: numpy's on both)."""
    scale = gpu.matmul_flops / rf.H100_MATMUL_FLOPS
    t = maximum(t, 1e-9)
    lo = rf.GEMM_TOKENS[0]
    return piecewise(t, [("<", lo, lambda t: rf.GEMM_TFLOPS[0] * 1e12 * scale * t / lo)],
                     lambda t: _as_value(np.interp(np.log(t), np.log(rf.GEMM_TOKENS), rf.GEMM_TFLOPS)) * 1e12 * scale)


def _as_value(v):
    """A numpy scalar as a float (arrays unchanged)."""
    return v if isinstance(v, np.ndarray) else float(v)


def roofline_l0_ms(m, gpu, t):
    """Roofline shape of the attention-free layer at t tokens (ms, float or array like t):
    linear layers + elementwise."""
    t = maximum(t, 1e-6)
    p = m.block_linear_params
    base = maximum(4.0 * p * t / gemm_rate(t, gpu), 2 * 2 * p / gpu.mem_bw_bytes_s)
    return 1e3 * (base + t * rf.ELEMENTWISE_BYTES_PER_TOKEN(m) / gpu.mem_bw_bytes_s)


def roofline_head_ms(m, gpu, t):
    """Roofline shape of the LM head at t tokens (ms, float or array like t)."""
    t = maximum(t, 1e-6)
    p = m.vocab * m.hidden
    return 1e3 * (maximum(4.0 * p * t / gemm_rate(t, gpu), 2 * 2 * p / gpu.mem_bw_bytes_s)
                  + 3 * 4 * t * m.vocab / gpu.mem_bw_bytes_s)


def remember(memo: dict, key, value, cap: int = 1 << 20):
    """Store ``value`` under ``key`` in the answer memo ``memo`` (emptied first when it holds
    ``cap`` answers: the answers are pure functions of their keys, so forgetting them changes no
    answer) and return it."""
    if len(memo) >= cap:
        memo.clear()
    memo[key] = value
    return value


def _keep(memo: dict, key, value):
    """``remember`` in one of ``Tables``' lookup memos (2^16 answers at most)."""
    return remember(memo, key, value, 1 << 16)


class Tables:
    """The measured tables of one model in an artifact, with roofline-shaped continuation.

    Two readings of each table: the raw one (``l0``, ``attn_ms``: exact at the measured points),
    and its GPU-time part (``l0g``, ``attg``), which the layer model adds up: where a small
    measurement was bound by host launch overhead (below ``gpu_from``, found at fit time), the
    GPU time is continued from the first GPU-bound point with the roofline's shape (GEMM
    efficiency curve for the base layer, time proportional to sequences for attention). The
    memoised lookups on one value (``l0g``, ``head``, ``attn_ms``) return ``(value, extrapolated)``;
    extrapolated means outside the measured range. Their values are ``l0g_ms``, ``head_ms`` and
    ``attn_values``, one implementation each over a float or an array (the vectorised model's).
    ``l0_logs``, ``h_logs`` and ``attn_logs[s]`` hold (log x, log y) of each measured table, for
    the log-log interpolation (``loglog_interp``, on floats and arrays alike)."""

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
        # answers of ``head`` by tokens: pure functions of their arguments, asked again and again
        self._head_memo: dict[float, tuple[float, bool]] = {}
        self._peak_memo: dict[float, float] = {}  # head_peak by tokens (few distinct token counts)
        # answers of ``l0g`` by tokens and of ``attn_ms`` by (length, sequences, gpu): pure
        # functions of their arguments, asked for every mix the scalar model prices
        self._l0g_memo: dict[float, tuple[float, bool]] = {}
        self._attn_memo: dict[tuple, tuple[float, bool]] = {}
        self._edges()

    def _roof(self, t):
        return roofline_l0_ms(self.m, self.gpu, t)

    def _edges(self) -> None:
        """The roofline at the table edges that the continuations scale from (floats, once)."""
        m, g = self.m, self.gpu
        self._roof_at = {x: roofline_l0_ms(m, g, x) for x in (self.l0_t[0], self.l0_t[-1], self.l0_from)}
        self._roof_head_at = {x: roofline_head_ms(m, g, x) for x in (self.h_t[0], self.h_t[-1])}
        self._attn_b0 = {s: loglog_interp(b0, bs, ms, self.attn_logs[s]) for s, (bs, ms, b0) in self.attn.items()}

    def l0(self, t: float) -> tuple[float, bool]:
        """Measured attention-free layer (ms) at t tokens, raw."""
        lo, hi = self.l0_t[0], self.l0_t[-1]
        if lo <= t <= hi:
            return loglog_interp(t, self.l0_t, self.l0_ms, self.l0_logs), False
        edge, v = (lo, self.l0_ms[0]) if t < lo else (hi, self.l0_ms[-1])
        return v * self._roof(t) / self._roof_at[edge], True

    def l0g(self, t: float) -> tuple[float, bool]:
        """GPU time of the attention-free layer (ms) at t tokens, and whether t is outside the
        table (memoised by t): ``l0g_ms``."""
        got = self._l0g_memo.get(t)
        if got is None:
            flag = (t < self.l0_t[0]) if t < self.l0_from else not (self.l0_t[0] <= t <= self.l0_t[-1])
            got = _keep(self._l0g_memo, t, (self.l0g_ms(t), bool(flag)))
        return got

    def l0g_ms(self, t):
        """GPU time of the attention-free layer (ms) at t tokens (a float, or an array: the same
        numbers element by element): log-log inside the table, roofline-shaped beyond it and
        below the first GPU-bound point ``gpu_from``."""
        lo, hi, ms, at = self.l0_t[0], self.l0_t[-1], self.l0_ms, self._roof_at
        return piecewise(t, [("<", self.l0_from, lambda t: self.l0_from_ms * self._roof(t) / at[self.l0_from]),
                             ("<", lo, lambda t: ms[0] * self._roof(t) / at[lo]),
                             (">", hi, lambda t: ms[-1] * self._roof(t) / at[hi])],
                         lambda t: loglog_interp(t, self.l0_t, ms, self.l0_logs))

    def head(self, t: float) -> tuple[float, bool]:
        """LM head, embedding and loss (ms) at t tokens, and whether t is outside the table
        (memoised by t: a pure function of it): ``head_ms``."""
        got = self._head_memo.get(t)
        if got is None:
            got = _keep(self._head_memo, t, (self.head_ms(t), not (self.h_t[0] <= t <= self.h_t[-1])))
        return got

    def head_ms(self, t):
        """LM head, embedding and loss (ms) at t tokens (a float or an array, as ``l0g_ms``)."""
        lo, hi, ms, at = self.h_t[0], self.h_t[-1], self.h_ms, self._roof_head_at
        m, g = self.m, self.gpu
        return piecewise(t, [("<", lo, lambda t: ms[0] * roofline_head_ms(m, g, t) / at[lo]),
                             (">", hi, lambda t: ms[-1] * roofline_head_ms(m, g, t) / at[hi])],
                         lambda t: loglog_interp(t, self.h_t, ms, self.h_logs))

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

    def _attn_at(self, s: int, b, gpu: bool):
        """Attention of b sequences (a float or an array) at a measured length ``s`` (ms)."""
        bs, ms, b0 = self.attn[s]
        lx = self.attn_logs[s]
        cases = [("<", b0, lambda b: self._attn_b0[s] * b / b0)] if gpu else []
        # time per sequence constant beyond the grid
        cases += [("<", bs[0], lambda b: ms[0] * b / bs[0]), (">", bs[-1], lambda b: ms[-1] * b / bs[-1])]
        return piecewise(b, cases, lambda b: loglog_interp(b, bs, ms, lx))

    def _attn_flag(self, s: float, b: float, gpu: bool) -> bool:
        """Whether ``attn_ms(s, b, gpu)`` left the measured grid."""
        if b <= 0:
            return False
        ss = self.attn_s
        if s in self.attn:
            bs, _, b0 = self.attn[int(s)]
            return b < bs[0] if (gpu and b < b0) else not (bs[0] <= b <= bs[-1])
        if s < ss[0] or s > ss[-1]:
            return True
        j = int(np.searchsorted(ss, s))
        return self._attn_flag(ss[j - 1], b, gpu) or self._attn_flag(ss[j], b, gpu)

    def attn_ms(self, s: float, b: float, gpu: bool = False) -> tuple[float, bool]:
        """Attention block of b sequences of s tokens (one SDPA call), ms (``gpu``: GPU part), and
        whether it left the measured grid; memoised by (s, b, gpu): ``attn_values``."""
        key = (s, b, gpu)
        got = self._attn_memo.get(key)
        if got is None:
            got = _keep(self._attn_memo, key, (self.attn_values(s, b, gpu), self._attn_flag(s, b, gpu)))
        return got

    def attn_values(self, s: float, b, gpu: bool = True):
        """Attention block (ms) of ``b`` sequences (a float, or an array of counts > 0: the same
        numbers element by element) of ``s`` tokens: measured lengths interpolated log-log in
        sequences, other lengths between two measured ones log-log in length, beyond the
        measured lengths scaled by (s / edge)^2."""
        if not isinstance(b, np.ndarray) and b <= 0:
            return 0.0
        ss = self.attn_s
        if s in self.attn:
            return self._attn_at(int(s), b, gpu)
        if s < ss[0] or s > ss[-1]:
            edge = ss[0] if s < ss[0] else ss[-1]
            return self._attn_at(edge, b, gpu) * (s / edge) ** 2
        j = int(np.searchsorted(ss, s))
        s0, s1 = ss[j - 1], ss[j]
        v0, v1 = self._attn_at(s0, b, gpu), self._attn_at(s1, b, gpu)
        w = (math.log(s) - math.log(s0)) / (math.log(s1) - math.log(s0))
        return libm(math.exp, (1 - w) * libm(math.log, v0) + w * libm(math.log, v1))

    def attg(self, s: float, b: float) -> tuple[float, bool]:
        """GPU time of the attention block (ms)."""
        return self.attn_ms(s, b, gpu=True)


@lru_cache(maxsize=64)
def tables_of(key: str, model: str) -> Tables:
    """The ``Tables`` of ``model`` in the artifact registered under ``key`` (built once)."""
    art = registered(key)
    return Tables(model, art["gpu"], art["models"][model])
