"""The measured tables of a profiled artifact and the per-layer formula built on them.

``Tables`` interpolates one model's measured curves (frozen base layer, attention, LM head) in
log-log space; ``mix_features`` turns a per-GPU mix of (rank, sequences, sequence length) into the
features the fitted plan terms multiply; ``layer_ms`` is one decoder layer's forward + backward
of a mix under a plan (``profiler/COSTMODEL.md`` derives it). ``profiled.py`` wraps these in the
cost-model interface; ``batch.py`` evaluates the same formula on arrays of mixes.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import numpy as np

from tlora_sim.sim.costmodel import roofline as rf
from tlora_sim.sim.costmodel.hardware import GPUS
from tlora_sim.sim.costmodel.models import get_model



SCHEMA = "tlora-sim/costmodel/1"
FEATURES = ("const", "adapters", "tokens", "rank_tokens", "ranks", "bucket_rank_tokens", "max_rank_tokens")
BUCKETS = (16, 32, 64, 128, 256)  # the fused kernel's rank buckets (profiler/kernels: tiles per bucket)
PLAN_FAMILY = {"alone": "loop", "loop": "loop", "fused": "fused", "lorafusion": "lorafusion", "grouped": "grouped"}
#: plans measured by an artifact that does not say (``measured_plans`` absent: the artifacts fitted
#: before LoRAFusion's kernels and the grouped GEMM were profiled)
MEASURED_PLANS = ("alone", "loop", "fused")
LINEARS_PER_LAYER = 7
#: fewest adapters per mix a plan family was measured with, for artifacts whose coverage does not
#: say (``adapters_min``): the profiler runs LoRAFusion's kernels and the grouped GEMM on
#: multi-adapter mixes only (``profiler/profile.py --plans``)
ADAPTERS_MIN_DEFAULT = {"lorafusion": 2, "grouped": 2}



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


# ---------------------------------------------------------------------------------- features
def mix_features(members: Sequence[tuple[int, float, int]]) -> dict:
    """Features of a per-GPU mix, members (rank, sequences, tokens per sequence): one pass, sums
    in member order (the order ``tlora_sim.sim.costmodel.batch`` adds them in)."""
    tokens = rank_tokens = bucket_rank_tokens = 0.0
    ranks = max_rank = 0
    for r, b, s in members:
        t = b * s
        tokens += t
        rank_tokens += r * t
        bucket_rank_tokens += rank_bucket(r) * t
        ranks += r
        if r > max_rank:
            max_rank = r
    return {"const": 1.0, "adapters": float(len(members)), "tokens": tokens, "rank_tokens": rank_tokens,
            "ranks": float(ranks), "bucket_rank_tokens": bucket_rank_tokens,
            "max_rank_tokens": float(max_rank * tokens)}


def rank_bucket(r: int) -> int:
    for b in BUCKETS:
        if r <= b:
            return b
    return r


def seq_groups(members) -> dict[int, float]:
    """Sequences per distinct sequence length (one SDPA call each)."""
    groups: dict[int, float] = {}
    for _, b, s in members:
        groups[int(s)] = groups.get(int(s), 0.0) + b
    return groups


def attention_ms(tab: Tables, members, gpu: bool = True) -> tuple[float, bool]:
    """Attention of a mix: one SDPA call per distinct sequence length (GPU part by default)."""
    tot, ext = 0.0, False
    for s, b in sorted(seq_groups(members).items()):
        v, e = tab.attn_ms(s, b, gpu=gpu)
        tot, ext = tot + v, ext or e
    return tot, ext


def plan_term_ms(pe: dict, members) -> float:
    """The fitted GPU time of the adapters of a plan family (ms)."""
    f = mix_features(members)
    return float(sum(pe["coef"].get(k, 0.0) * f[k] for k in FEATURES))


def host_ms(pe: dict, members) -> float:
    """The fitted host (launch) time of one layer step (ms): cpu0 + cpu_n x adapters + cpu_g x
    sequence-length groups."""
    return pe.get("cpu0", 0.0) + pe.get("cpu_n", 0.0) * len(members) + pe.get("cpu_g", 0.0) * len(seq_groups(members))


def smoothmax(a: float, b: float, p: float) -> float:
    """(a^p + b^p)^(1/p): max(a, b) for large p, a bit above it where the two are close."""
    if p >= 64:
        return max(a, b)
    hi = max(a, b)
    if hi <= 0:
        return 0.0
    return hi * ((a / hi) ** p + (b / hi) ** p) ** (1.0 / p)


def layer_ms(tab: Tables, pe: dict, members, nano: int = 1, in_model: bool = True, plan: str = "",
             gpu_scale: float = 1.0, host_scale: float = 1.0) -> tuple[float, bool]:
    """One decoder layer (forward + backward) of a per-GPU mix under a fitted plan family (ms):
    ``smoothmax(gpu, host)`` with gpu = base curve + attention + adapter term (GPU parts) and host
    the launch time of the eager step. ``in_model``: the layer inside a model, whose host time
    lacks the profiling harness's per-call overhead (``call_ms``, measured with stacked layers);
    ``in_model=False`` predicts what the profiler measures for one layer alone. ``plan="alone"``
    removes the overhead measured for jobs alone (``call_ms_alone``, where the artifact has it:
    a one-adapter layer's harness overhead differs from the loop's; issue 17's ``alone`` bias).

    ``gpu_scale`` multiplies the GPU part (tensor parallelism: 1 / tp of every GEMM and of the
    attention heads) and ``host_scale`` the host part (several training processes sharing one
    host's CPU, fitted to the two-GPU profile: ``sim/costmodel/parallelism.py``).

    ``nano`` > 1: the base curve runs ``nano`` times at tokens / nano, the adapter term (all but
    its constant) shrinks by ``nano`` (tLoRA's overlap, as in the roofline) and the host time is
    paid ``nano`` times (eager launches), each nano-batch's times ``pe["nano_host"]`` where the
    artifact has it (``tlora-sim costmodel calibrate``: a nano-batch launches for fewer members and
    sequence lengths than the whole step; 1 otherwise)."""
    T = sum(b * s for _, b, s in members)
    if nano > 1:
        l0, e0 = tab.l0g(T / nano)
        l0 *= nano
    else:
        l0, e0 = tab.l0g(T)
    at, e1 = attention_ms(tab, members)
    term = plan_term_ms(pe, members)
    if nano > 1:
        c = pe["coef"].get("const", 0.0)
        term = c * nano + (term - c) / nano
    host = host_ms(pe, members)
    if in_model:
        call = pe.get("call_ms_alone", pe.get("call_ms", 0.0)) if plan == "alone" else pe.get("call_ms", 0.0)
        host = max(host - call, 0.5 * host)
    if nano > 1:  # the host time of one nano-batch, relative to a whole step's (calibrated; default 1)
        host *= pe.get("nano_host", 1.0)
    val = smoothmax(gpu_scale * (l0 + at + term), host_scale * nano * host, pe.get("p", 64.0))
    cov = pe.get("coverage", {})
    fewest = cov.get("adapters_min", ADAPTERS_MIN_DEFAULT.get(PLAN_FAMILY.get(plan, ""), 1))
    e2 = bool(cov) and (len(members) > cov["adapters_max"] or len(members) < fewest
                        or T < cov["tokens_min"] or T > cov["tokens_max"]
                        or min(r for r, _, _ in members) < cov["rank_min"]
                        or max(r for r, _, _ in members) > cov["rank_max"])
    corr = pe.get("correction")
    if corr:
        val *= residual_correction(corr, members)
    return val, e0 or e1 or e2


def correction_point(members) -> np.ndarray:
    f = mix_features(members)
    n, T = f["adapters"], f["tokens"]
    return np.array([math.log(T), math.log(n), math.log(f["rank_tokens"] / T)])


def residual_correction(corr: dict, members) -> float:
    """Multiplicative residual correction: a Gaussian-kernel average of the measured/fitted
    log-ratios of nearby training mixes (``corr``: points, log ratios, bandwidth, prior weight)."""
    pts = np.asarray(corr["points"], dtype=float)
    if not len(pts):
        return 1.0
    x = correction_point(members)
    d2 = (((pts - x) / np.asarray(corr["scale"])) ** 2).sum(axis=1)
    w = np.exp(-0.5 * d2)
    return float(math.exp((w * np.asarray(corr["log_ratio"])).sum() / (w.sum() + corr["prior"])))


# ------------------------------------------------------------------------------ measured plans
def measured_plans(art: dict) -> tuple:
    """The plans an artifact measured: its ``measured_plans`` (written by ``profiler/fit.py``),
    else ``MEASURED_PLANS`` (alone, loop, fused)."""
    got = art.get("measured_plans")
    return tuple(got) if isinstance(got, (list, tuple)) else MEASURED_PLANS


def plan_measured(art: dict, model: str, plan: str) -> bool:
    """True if ``plan`` is measured for ``model``: listed by the artifact and its family fitted in
    the model's entry. Otherwise the cost model predicts it as fused x the roofline's ratio."""
    fam = PLAN_FAMILY.get(plan)
    entry = art.get("models", {}).get(model)
    return plan in measured_plans(art) and fam is not None and entry is not None and fam in entry.get("plans", {})


def adapter_tensors_per_linear(plan: str, n_adapters: int) -> int:
    """Adapter parameter tensors per linear layer under a plan (the optimizer's tensor count):
    fused and grouped hold A and B packed (2), LoRAFusion A packed and one B per adapter (1 + n),
    loop and alone two per adapter (2n)."""
    if plan in ("fused", "grouped"):
        return 2
    if plan == "lorafusion":
        return 1 + n_adapters
    return 2 * n_adapters
