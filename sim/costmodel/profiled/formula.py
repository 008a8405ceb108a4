"""The profiled step formula, in one module: its scalar form over one mix and its vectorised form
over numpy rows of mixes (``FusedBatch``, issue 6: cost-model lookups vectorised).

Scalar: ``mix_features`` turns a per-GPU mix of (rank, sequences, sequence length) into the
features the fitted plan terms multiply; ``layer_ms`` is one decoder layer's forward + backward of
a mix under a plan (``profiler/COSTMODEL.md`` derives it); ``opt_ms`` the AdamW step;
``memory_breakdown`` the memory terms. ``model.py`` and the multi-GPU planner (``multigpu.py``)
price groups with these.

Vectorised: the profiled model sees a group's mix, for the ``fused`` plan, only through sums over
its members (tokens, rank x tokens, ranks, bucketed rank x tokens, adapters, adapter parameters,
sequences per sequence length) and its largest rank. So the features of a merged group are its
parts' features added (the largest rank: their maximum), and ``FusedBatch.step_times`` evaluates
the same formula on many rows of features at once: the same tables, the same interpolation and
extrapolation rules, the same terms (layer = smoothmax(GPU part, host part), head, AdamW,
nano-batching), with one micro-batch. ``multigpu.PlannerBatch`` builds its lower bound of the
planner on this class's rows (``fill_row``) and layer (``layer_rows``).

Why two forms and not one (issue 42 asked for the scalar path as a one-row call): the scalar form
uses the C library's ``math.log``/``exp`` and adds the features in member order; the vectorised
one uses numpy's and associates sums per column. Those differ in the last place (measured worst
2e-15 relative over the shipped H100 and H200 artifacts; ``tests/test_fused_batch.py`` requires
< 1e-12), and simulation outputs must stay byte-identical, so the scalar answers (which the
engine's step times come from) keep their arithmetic. Callers use the batch only to *refuse*
candidates that miss a threshold by more than ``REL_MARGIN`` (1e-9, three orders above that
bound) and ask the scalar model about everything else, so no decision depends on the difference.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tlora_sim.sim.costmodel import roofline as rf
from tlora_sim.sim.costmodel.hardware import GPUS
from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.costmodel.models import get_model
from tlora_sim.sim.costmodel.profiled.artifact import ADAPTERS_MIN_DEFAULT, PLAN_FAMILY, profiled_source
from tlora_sim.sim.costmodel.profiled.tables import Tables, tables_of

FEATURES = ("const", "adapters", "tokens", "rank_tokens", "ranks", "bucket_rank_tokens", "max_rank_tokens")
BUCKETS = (16, 32, 64, 128, 256)  # the fused kernel's rank buckets (profiler/kernels: tiles per bucket)
LINEARS_PER_LAYER = 7


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


def adapter_tensors_per_linear(plan: str, n_adapters: int) -> int:
    """Adapter parameter tensors per linear layer under a plan (the optimizer's tensor count):
    fused and grouped hold A and B packed (2), LoRAFusion A packed and one B per adapter (1 + n),
    loop and alone two per adapter (2n)."""
    if plan in ("fused", "grouped"):
        return 2
    if plan == "lorafusion":
        return 1 + n_adapters
    return 2 * n_adapters


def opt_ms(art: dict, params: float, tensors: float) -> float:
    """Fused AdamW step (ms) over ``params`` adapter parameters in ``tensors`` tensors (the artifact's fit)."""
    c = art["optimizer"]["coef"]
    return c["const"] + c["per_mparam"] * params / 1e6 + c["per_tensor"] * tensors


def per_gpu_mix(members: tuple[Member, ...], div: float) -> list[tuple[int, float, int]]:
    """The mix of (rank, sequences / ``div``, seq_len) per member (``div`` = GPUs x micro-batches)."""
    return [(x.rank, x.batch_size / div, x.seq_len) for x in members]


def memory_breakdown(art: dict, model: str, gpu_name: str, members: Sequence[Member], n: int, plan: str,
                     micro: int = 1, checkpointing: bool = True, tables: Tables | None = None) -> dict:
    """Memory terms per GPU (bytes). ``checkpointing=False``: every layer keeps its measured saved
    activations instead (the end-to-end check's configuration), adapter state as measured there
    (bf16 weights, grads and AdamW moments: 8 B/param). ``tables``: the model's ``Tables`` of
    ``art`` if the caller holds them (else built from ``art``)."""
    m, gpu = get_model(model), GPUS[gpu_name]
    entry = art["models"][model]
    fam = PLAN_FAMILY.get(plan, "fused")
    pe = entry["plans"][fam if fam in entry["plans"] else "fused"]
    mix = per_gpu_mix(tuple(members), n * micro)
    t_gpu = sum(b * s for _, b, s in mix)
    f = mix_features(mix)
    live = max(0.0, sum(pe["memory"]["peak"].get(k, 0.0) * f[k] for k in FEATURES))
    saved = max(0.0, sum(pe["memory"]["saved"].get(k, 0.0) * f[k] for k in FEATURES))
    tab = tables if tables is not None else Tables(model, art["gpu"], entry)
    weights = 2.0 * m.params / (n if rf.base_sharded(m, gpu, n) else 1)
    params = sum(m.lora_params(x.rank) for x in members)
    if checkpointing:
        return {"weights": weights, "adapters": rf.ADAPTER_STATE_BYTES_PER_PARAM * params,
                "checkpoints": 2.0 * t_gpu * m.hidden * m.layers, "layer_live": live,
                "head": tab.head_peak(t_gpu), "workspace": float(rf.WORKSPACE_BYTES)}
    return {"weights": weights, "adapters": 8.0 * params, "activations": m.layers * saved,
            "layer_live": max(0.0, live - saved), "head": tab.head_peak(t_gpu)}


# ------------------------------------------------------------------------------ vectorised
_OFFSET = 32.0
"""Shift in log(sequences) between columns' attention tables laid end to end (``_attention``):
above any table's log range (e^32 sequences)."""
REL_MARGIN = 1e-9
"""Relative margin a batch answer must clear a threshold by before a caller may act on it."""

# feature columns of a row; then one column of sequences per known sequence length
ADAPTERS, TOKENS, RANK_TOKENS, RANKS, BUCKET_RANK_TOKENS, LORA_PARAMS, MAX_RANK = range(7)
N_FIXED = 7
MAX_SEQ_LENS = 16
WIDTH = N_FIXED + MAX_SEQ_LENS


class FusedBatch:
    """Vectorised ``fused`` step times of one (base model, GPU type, GPU count) under a profiled
    artifact. Build with ``FusedBatch.of``; ``None`` where the batch does not apply (another cost
    model, a GPU or model without measured tables, an artifact with a residual correction).

    Rows (``row``) are float64 arrays of shape (``WIDTH``,): per-GPU sums over the members
    (micro-batch of ``batch_size / n_gpus`` sequences each) in the columns ``ADAPTERS`` ...
    ``LORA_PARAMS``, the largest rank in ``MAX_RANK``, and sequences per sequence length in the
    columns after ``N_FIXED`` (the instance numbers sequence lengths as it meets them, at most
    ``MAX_SEQ_LENS``).
    """

    #: relative margin within which the batch and the scalar model may disagree (module constant).
    REL_MARGIN = REL_MARGIN
    #: columns of a row.
    WIDTH = WIDTH

    def __init__(self, cost_model, model: str, gpu_name: str, n_gpus: int):
        art = cost_model.artifact
        self.m, self.gpu, self.n = get_model(model), GPUS[gpu_name], int(n_gpus)
        self.tab = tables_of(cost_model.key, model)
        entry = art["models"][model]
        self.pe = entry["plans"]["fused"]
        self.opt = art["optimizer"]["coef"]
        self._att = None  # attention tables per column (``_attention_tables``), for len(self.seqs) columns
        self.seq_col: dict[int, int] = {}
        self.seqs: list[int] = []
        t = self.tab
        coef = self.pe["coef"]
        cols = (("adapters", ADAPTERS), ("tokens", TOKENS), ("rank_tokens", RANK_TOKENS), ("ranks", RANKS),
                ("bucket_rank_tokens", BUCKET_RANK_TOKENS))
        self._coef = (coef.get("const", 0.0), [(col, coef[name]) for name, col in cols if coef.get(name)])
        self._c_max = coef.get("max_rank_tokens", 0.0)
        pe, c = self.pe, self.opt
        self._host = (pe.get("cpu0", 0.0), pe.get("cpu_n", 0.0), pe.get("cpu_g", 0.0), pe.get("call_ms", 0.0))
        self._nano_host = float(pe.get("nano_host", 1.0))  # host time of one nano-batch / a step's
        self._p = pe.get("p", 64.0)
        self._opt = (c["const"] + c["per_tensor"] * (2 * LINEARS_PER_LAYER * self.m.layers), c["per_mparam"])
        # inputs inside every table edge take the plain log-log path (``_l0g``, ``head_rows``)
        self._l0_in = (max(t.l0_from, t.l0_t[0]), t.l0_t[-1])
        self._head_in = (t.h_t[0], t.h_t[-1])
        # the roofline at the table edges that extrapolations scale from
        self._l0_edge = {x: float(self._roof(np.float64(x))) for x in (t.l0_t[0], t.l0_t[-1], t.l0_from)}
        self._head_edge = {x: float(self._roof_head(np.float64(x))) for x in (t.h_t[0], t.h_t[-1])}
        # step times by (row, nano) bytes (``step_times``): a row's columns keep their meaning
        # (sequence lengths are numbered once), so an answer is a pure function of the key
        self._step_memo: dict[bytes, float] = {}

    @classmethod
    def of(cls, cost_model, model: str, gpu_name: str, n_gpus: int) -> "FusedBatch | None":
        """The batch for this kind of group, or None where the scalar model must answer alone."""
        src = profiled_source(cost_model)
        if src is None:
            return None
        art = src[0]
        if gpu_name != art["gpu"] or gpu_name not in GPUS or model not in art["models"]:
            return None
        pe = art["models"][model]["plans"].get("fused")
        if pe is None or pe.get("correction") or n_gpus != 1:
            return None  # several GPUs: the planner weighs parallelism plans (multigpu.py)
        return cls(cost_model, model, gpu_name, n_gpus)

    # ---- features ------------------------------------------------------------------------------
    def row(self, members: Sequence[Member]) -> np.ndarray | None:
        """Feature row of a group (shape (``WIDTH``,)); None if it brings more than
        ``MAX_SEQ_LENS`` distinct sequence lengths into this instance."""
        out = np.zeros(WIDTH)
        n = self.n
        return out if self.fill_row(out, [(x.rank, x.batch_size / n, x.seq_len) for x in members]) else None

    def seq_column(self, seq_len: int) -> int | None:
        """The row column of sequences of ``seq_len`` tokens (numbered as this instance meets
        lengths); None when ``MAX_SEQ_LENS`` other lengths already have columns."""
        c = self.seq_col.get(seq_len)
        if c is None:
            if len(self.seqs) >= MAX_SEQ_LENS:
                return None
            c = self.seq_col[seq_len] = N_FIXED + len(self.seqs)
            self.seqs.append(int(seq_len))
        return c

    def fill_row(self, out: np.ndarray, mix) -> bool:
        """Add the features of a per-GPU ``mix`` of (rank, sequences, seq_len) into ``out`` (a
        zeroed row of shape (``WIDTH``,), e.g. a view into a wider array): ``row`` with the
        sequences given. False (``out`` then partly written) if a sequence length has no column."""
        lp = self.m.lora_dims_per_rank
        a = t_sum = rt = r_sum = brt = p_sum = 0.0
        max_r = 0
        for r, b, s in mix:
            t = b * s
            a += 1.0
            t_sum += t
            rt += r * t
            r_sum += r
            brt += rank_bucket(r) * t
            p_sum += r * lp
            max_r = max(max_r, r)
            c = self.seq_column(s)
            if c is None:
                return False
            out[c] += b
        out[:N_FIXED] = (a, t_sum, rt, r_sum, brt, p_sum, max_r)
        return True

    @staticmethod
    def merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Rows of the groups ``a`` and ``b`` merged (broadcasting: shapes (W,) or (P, W))."""
        out = a + b
        out[..., MAX_RANK] = np.maximum(a[..., MAX_RANK], b[..., MAX_RANK])
        return out

    # ---- the model -----------------------------------------------------------------------------
    def step_times(self, rows: np.ndarray, nano: np.ndarray | int) -> np.ndarray:
        """Step times (s), shape (P,), of ``rows`` (shape (P, WIDTH)) at nano-batch counts
        ``nano`` (shape (P,) or one int), one micro-batch: ``model.predict_cached`` for the
        ``fused`` plan, row by row. (Written for few numpy calls: the policies call it ~10^5
        times per replay with P mostly under 100, where each call's fixed cost dominates.)
        Answers are kept by (row, nano): the policies ask about the same merged rows again and
        again (~90% of rows on the replay benchmarks); only rows not asked before are evaluated
        (``_step_times``, element by element the same arithmetic)."""
        if rows.ndim == 1:
            rows = rows[None, :]
        P = len(rows)
        if not P:
            return np.zeros(0)
        N = nano if isinstance(nano, np.ndarray) and nano.ndim else float(nano)
        return rows_memoised(self._step_memo, rows, N, self._step_times, 1 << 16)

    def _step_times(self, rows: np.ndarray, N: np.ndarray | float) -> np.ndarray:
        """``step_times`` evaluated (rows shape (P, WIDTH), P >= 1; ``N`` shape (P,) or a float)."""
        lay = self.layer_rows(rows, N)
        opt_const, per_mparam = self._opt
        return (self.m.layers * lay + self.head_rows(rows[:, TOKENS])) / 1e3 \
            + (opt_const + per_mparam * rows[:, LORA_PARAMS] / 1e6) / 1e3

    def layer_rows(self, rows: np.ndarray, N: np.ndarray | float, gpu_scale: np.ndarray | float = 1.0,
                   host_scale: np.ndarray | float = 1.0) -> np.ndarray:
        """One decoder layer, forward + backward (ms), shape (P,), of each row of ``rows`` (shape
        (P, ``WIDTH``)) at ``N`` nano-batches (shape (P,) or a float): ``layer_ms``
        of the ``fused`` plan inside a model, vectorised, with its ``gpu_scale`` (GPU part, e.g.
        1 / tp) and ``host_scale`` (host part), each shape (P,) or a float."""
        k, T = rows[:, ADAPTERS], rows[:, TOKENS]
        # layer: GPU part (base curve, attention, adapter term) and host part (``layer_ms``)
        gpu_ms = self._l0g(T / N) * N
        if self.seqs:
            B = rows[:, N_FIXED:N_FIXED + len(self.seqs)]
            groups = np.count_nonzero(B, axis=1)
            gpu_ms = gpu_ms + self._attention(B)
        else:
            groups = 0.0
        c0, coefs = self._coef
        term = c0 * 1.0
        for col, c in coefs:
            term = term + c * rows[:, col]
        if self._c_max:
            term = term + self._c_max * (rows[:, MAX_RANK] * T)
        if isinstance(N, np.ndarray):
            term = np.where(N > 1, c0 * N + (term - c0) / N, term)
        elif N > 1:
            term = c0 * N + (term - c0) / N
        cpu0, cpu_n, cpu_g, call_ms = self._host
        host = cpu0 + cpu_n * k + cpu_g * groups
        host = np.maximum(host - call_ms, 0.5 * host)
        gpu = gpu_ms + term
        if not (isinstance(gpu_scale, float) and gpu_scale == 1.0):
            gpu = gpu_scale * gpu
        if self._nano_host != 1.0:
            N = np.where(N > 1, N * self._nano_host, N) if isinstance(N, np.ndarray) else (
                N * self._nano_host if N > 1 else N)
        return smoothmax_rows(gpu, host_scale * N * host, self._p)

    def _gemm_rate(self, t: np.ndarray) -> np.ndarray:
        scale = self.gpu.matmul_flops / rf.H100_MATMUL_FLOPS
        t = np.maximum(t, 1e-9)
        lo = rf.GEMM_TOKENS[0]
        low = rf.GEMM_TFLOPS[0] * 1e12 * scale * t / lo
        high = np.interp(np.log(t), np.log(rf.GEMM_TOKENS), rf.GEMM_TFLOPS) * 1e12 * scale
        return np.where(t < lo, low, high)

    def _roof(self, t: np.ndarray) -> np.ndarray:
        """``tables.roofline_l0_ms``, vectorised."""
        m, gpu = self.m, self.gpu
        t = np.maximum(t, 1e-6)
        p = m.block_linear_params
        base = np.maximum(4.0 * p * t / self._gemm_rate(t), 2 * 2 * p / gpu.mem_bw_bytes_s)
        return 1e3 * (base + t * rf.ELEMENTWISE_BYTES_PER_TOKEN(m) / gpu.mem_bw_bytes_s)

    def _roof_head(self, t: np.ndarray) -> np.ndarray:
        m, gpu = self.m, self.gpu
        t = np.maximum(t, 1e-6)
        p = m.vocab * m.hidden
        return 1e3 * (np.maximum(4.0 * p * t / self._gemm_rate(t), 2 * 2 * p / gpu.mem_bw_bytes_s)
                      + 3 * 4 * t * m.vocab / gpu.mem_bw_bytes_s)

    def _l0g(self, t: np.ndarray) -> np.ndarray:
        """``Tables.l0g``, vectorised: log-log inside the table, roofline-shaped beyond it and
        below the first GPU-bound point."""
        tab = self.tab
        xs, ys = tab.l0_t, tab.l0_ms
        out = loglog_interp_rows(t, *tab.l0_logs, len(xs), ys[0])
        if self._l0_in[0] <= t.min() and t.max() <= self._l0_in[1]:
            return out
        hi = t > xs[-1]
        if hi.any():
            out[hi] = ys[-1] * self._roof(t[hi]) / self._l0_edge[xs[-1]]
        lo = t < tab.l0_from
        if lo.any():
            out[lo] = tab.l0_from_ms * self._roof(t[lo]) / self._l0_edge[tab.l0_from]
            # below the first measured point: only where the first GPU-bound point is not that one
            below = (t >= tab.l0_from) & (t < xs[0])
            if below.any():
                out[below] = ys[0] * self._roof(t[below]) / self._l0_edge[xs[0]]
        return out

    def head_rows(self, t: np.ndarray) -> np.ndarray:
        """``Tables.head``, vectorised."""
        xs, ys = self.tab.h_t, self.tab.h_ms
        out = loglog_interp_rows(t, *self.tab.h_logs, len(xs), ys[0])
        if self._head_in[0] <= t.min() and t.max() <= self._head_in[1]:
            return out
        for edge, v, side in ((xs[-1], ys[-1], t > xs[-1]), (xs[0], ys[0], t < xs[0])):
            if side.any():
                out[side] = v * self._roof_head(t[side]) / self._head_edge[edge]
        return out

    def _attention(self, B: np.ndarray) -> np.ndarray:
        """Attention of each row (ms): Σ over sequence lengths of ``Tables.attg(s, b)``, for the
        sequences per length ``B`` (shape (P, K), columns as ``self.seqs``, 0 = none)."""
        if self._att is None or self._att[0] != len(self.seqs):
            self._att = (len(self.seqs), self._attention_tables())
        _, (measured, b0, last, c_lin, c_hi, lx, ly) = self._att
        out = np.zeros(len(B))
        if measured.any():
            Bm = B[:, measured]
            at = np.where(Bm < b0, Bm * c_lin, Bm * c_hi)  # below the first GPU-bound count, beyond the grid
            mid = (Bm >= b0) & (Bm <= last)
            if mid.any():
                r, c = np.nonzero(mid)
                at[r, c] = np.exp(np.interp(np.log(Bm[r, c]) + c * _OFFSET, lx, ly))
            out += at.sum(axis=1)
        for j in np.flatnonzero(~measured).tolist():
            b = B[:, j]
            has = b > 0
            if has.any():
                out[has] += self._attg(self.seqs[j], b[has])
        return out

    def _attention_tables(self) -> tuple:
        """Per column: whether its length was measured (then: first GPU-bound count, last count,
        ms per sequence below and beyond the grid, and the log-log tables laid end to end, column
        c shifted by c x ``_OFFSET`` in log count, so one ``np.interp`` serves every column)."""
        tab = self.tab
        measured = np.array([s in tab.attn and tab.attn[s][2] >= tab.attn[s][0][0] >= 1
                             and math.log(tab.attn[s][0][-1]) < _OFFSET for s in self.seqs], bool)
        b0, last, c_lin, c_hi, lx, ly = [], [], [], [], [], []
        for c, s in enumerate(x for x, ok in zip(self.seqs, measured) if ok):
            bs, ms, g0 = tab.attn[s]
            llx, lly = tab.attn_logs[s]
            b0.append(g0)
            last.append(bs[-1])
            c_lin.append(float(loglog_interp_rows(np.float64(g0), llx, lly, len(bs), ms[0])) / g0)
            c_hi.append(ms[-1] / bs[-1])
            lx.append(llx + c * _OFFSET)
            ly.append(lly)
        cat = (lambda v: np.concatenate(v)) if lx else (lambda v: np.zeros(0))
        return measured, np.array(b0), np.array(last), np.array(c_lin), np.array(c_hi), cat(lx), cat(ly)

    def _attn_at(self, s: int, b: np.ndarray) -> np.ndarray:
        """``Tables._attn_at(s, b, gpu=True)`` for a measured sequence length, vectorised."""
        bs, ms, b0 = self.tab.attn[s]
        lx, ly = self.tab.attn_logs[s]
        out = loglog_interp_rows(b, lx, ly, len(bs), ms[0])
        hi = b > bs[-1]
        if hi.any():
            out[hi] = ms[-1] * b[hi] / bs[-1]
        lo = b < b0
        if lo.any():
            at_b0 = float(loglog_interp_rows(np.float64(b0), lx, ly, len(bs), ms[0]))
            out[lo] = at_b0 * b[lo] / b0
            below = (b >= b0) & (b < bs[0])
            if below.any():
                out[below] = ms[0] * b[below] / bs[0]
        return out

    def _attg(self, s: int, b: np.ndarray) -> np.ndarray:
        """``Tables.attg``, vectorised over sequence counts ``b`` (> 0)."""
        ss = self.tab.attn_s
        if s in self.tab.attn:
            return self._attn_at(s, b)
        if s < ss[0] or s > ss[-1]:
            edge = ss[0] if s < ss[0] else ss[-1]
            return self._attn_at(edge, b) * (s / edge) ** 2
        j = int(np.searchsorted(ss, s))
        s0, s1 = ss[j - 1], ss[j]
        v0, v1 = self._attn_at(s0, b), self._attn_at(s1, b)
        w = (math.log(s) - math.log(s0)) / (math.log(s1) - math.log(s0))
        return np.exp((1 - w) * np.log(v0) + w * np.log(v1))


def rows_memoised(memo: dict, rows: np.ndarray, nano, evaluate, cap: int) -> np.ndarray:
    """Shape (P,): ``evaluate(rows, nano)`` (a per-row function of each row of ``rows``, shape
    (P, W), at its nano-batch count ``nano``, shape (P,) or a scalar) with the answers kept in
    ``memo`` by (row, nano) as one bytes key per row; only rows not asked before are evaluated,
    and ``memo`` is emptied when it would pass ``cap`` entries. The same floats as evaluating every
    row: ``evaluate`` works element by element."""
    P, W = rows.shape
    key = np.empty((P, W + 1))
    key[:, :W] = rows
    key[:, W] = nano
    keys = key.view(f"V{8 * (W + 1)}").ravel().tolist()  # one bytes object per row
    got = list(map(memo.get, keys))
    if None not in got:
        return np.fromiter(got, float, P)
    miss = [i for i, v in enumerate(got) if v is None]
    if len(miss) == P:
        t = evaluate(rows, nano)
    else:
        t = evaluate(rows[miss], np.asarray(nano)[miss] if np.ndim(nano) else nano)
    if len(memo) + len(miss) > cap:
        memo.clear()
    for i, v in zip(miss, t.tolist()):
        got[i] = memo[keys[i]] = v
    return np.fromiter(got, float, P)


def loglog_interp_rows(x, lx: np.ndarray, ly: np.ndarray, n: int, y0: float):
    """``tables.loglog_interp`` on an array (values outside the table are the edge values;
    callers replace them)."""
    if n == 1:
        return np.full(np.shape(x), float(y0))
    return np.exp(np.interp(np.log(x), lx, ly))


def smoothmax_rows(a: np.ndarray, b: np.ndarray, p: float) -> np.ndarray:
    """``smoothmax``, vectorised (a, b > 0)."""
    if p >= 64:
        return np.maximum(a, b)
    hi = np.maximum(a, b)
    return hi * ((a / hi) ** p + (b / hi) ** p) ** (1.0 / p)


__all__ = ["FusedBatch", "REL_MARGIN", "layer_ms", "memory_breakdown", "mix_features", "opt_ms"]
