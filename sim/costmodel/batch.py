"""Profiled fused-plan step times of many candidate groups in one numpy call (issue 6: cost-model
lookups vectorised), for the policies' merge tests.

The profiled model (``sim/costmodel/profiled.py``) sees a group's mix, for the ``fused`` plan, only through
sums over its members (tokens, rank x tokens, ranks, bucketed rank x tokens, adapters, adapter
parameters, sequences per sequence length) and its largest rank. So the features of a merged group
are its parts' features added (the largest rank: their maximum), and ``FusedBatch.step_times``
evaluates the model's formula on many rows of features at once: the same tables, the same
interpolation and extrapolation rules, the same terms (layer = smoothmax(GPU part, host part),
head, AdamW, communication, nano-batching), with one micro-batch.

Exactness: the batch's sums are associated differently from the scalar model's and numpy's
log/exp/power may differ from the C library's in the last place, so its answers agree with
``ProfiledCostModel.step_time_s`` to a relative error of a few 1e-16 per operation (measured
worst 2e-15 over the shipped H100 and H200 artifacts; ``tests/test_fused_batch.py`` requires
< 1e-12). Callers use the
batch only to *refuse* candidates that miss a threshold by more than ``REL_MARGIN`` (1e-9, three
orders above that bound) and ask the scalar model about everything else, so no decision changes.

Groups on several GPUs: ``batch_multigpu.PlannerBatch``, a lower bound of the planner's step built
on this class's rows (``fill_row``) and layer (``layer_rows``).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tlora_sim.sim.costmodel import roofline as rf
from tlora_sim.sim.costmodel.hardware import GPUS
from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.costmodel.profiled import LINEARS_PER_LAYER, ProfiledCostModel, rank_bucket, tables_of
from tlora_sim.sim.costmodel.models import get_model

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

    def __init__(self, cost_model: ProfiledCostModel, model: str, gpu_name: str, n_gpus: int):
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
        # inputs inside every table edge take the plain log-log path (``_l0g``, ``_head_ms``)
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
        if not isinstance(cost_model, ProfiledCostModel):
            return None
        art = cost_model.artifact
        if gpu_name != art["gpu"] or gpu_name not in GPUS or model not in art["models"]:
            return None
        pe = art["models"][model]["plans"].get("fused")
        if pe is None or pe.get("correction") or n_gpus != 1:
            return None  # several GPUs: the planner weighs parallelism plans (profiled_multigpu.py)
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
        ``nano`` (shape (P,) or one int), one micro-batch: ``tlora_sim.sim.costmodel.profiled.predict_cached`` for the
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
        return (self.m.layers * lay + self._head_ms(rows[:, TOKENS])) / 1e3 \
            + (opt_const + per_mparam * rows[:, LORA_PARAMS] / 1e6) / 1e3

    def layer_rows(self, rows: np.ndarray, N: np.ndarray | float, gpu_scale: np.ndarray | float = 1.0,
                   host_scale: np.ndarray | float = 1.0) -> np.ndarray:
        """One decoder layer, forward + backward (ms), shape (P,), of each row of ``rows`` (shape
        (P, ``WIDTH``)) at ``N`` nano-batches (shape (P,) or a float): ``profiled_tables.layer_ms``
        of the ``fused`` plan inside a model, vectorised, with its ``gpu_scale`` (GPU part, e.g.
        1 / tp) and ``host_scale`` (host part), each shape (P,) or a float."""
        k, T = rows[:, ADAPTERS], rows[:, TOKENS]
        # layer: GPU part (base curve, attention, adapter term) and host part (sim.profiled.layer_ms)
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
        return _smoothmax(gpu, host_scale * N * host, self._p)

    def _gemm_rate(self, t: np.ndarray) -> np.ndarray:
        scale = self.gpu.matmul_flops / rf.H100_MATMUL_FLOPS
        t = np.maximum(t, 1e-9)
        lo = rf.GEMM_TOKENS[0]
        low = rf.GEMM_TFLOPS[0] * 1e12 * scale * t / lo
        high = np.interp(np.log(t), np.log(rf.GEMM_TOKENS), rf.GEMM_TFLOPS) * 1e12 * scale
        return np.where(t < lo, low, high)

    def _roof(self, t: np.ndarray) -> np.ndarray:
        """``tlora_sim.sim.costmodel.profiled.roofline_l0_ms``, vectorised."""
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
        out = loglog_interp(t, *tab.l0_logs, len(xs), ys[0])
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

    def _head_ms(self, t: np.ndarray) -> np.ndarray:
        """``Tables.head``, vectorised."""
        xs, ys = self.tab.h_t, self.tab.h_ms
        out = loglog_interp(t, *self.tab.h_logs, len(xs), ys[0])
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
            c_lin.append(float(loglog_interp(np.float64(g0), llx, lly, len(bs), ms[0])) / g0)
            c_hi.append(ms[-1] / bs[-1])
            lx.append(llx + c * _OFFSET)
            ly.append(lly)
        cat = (lambda v: np.concatenate(v)) if lx else (lambda v: np.zeros(0))
        return measured, np.array(b0), np.array(last), np.array(c_lin), np.array(c_hi), cat(lx), cat(ly)

    def _attn_at(self, s: int, b: np.ndarray) -> np.ndarray:
        """``Tables._attn_at(s, b, gpu=True)`` for a measured sequence length, vectorised."""
        bs, ms, b0 = self.tab.attn[s]
        lx, ly = self.tab.attn_logs[s]
        out = loglog_interp(b, lx, ly, len(bs), ms[0])
        hi = b > bs[-1]
        if hi.any():
            out[hi] = ms[-1] * b[hi] / bs[-1]
        lo = b < b0
        if lo.any():
            at_b0 = float(loglog_interp(np.float64(b0), lx, ly, len(bs), ms[0]))
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


def loglog_interp(x, lx: np.ndarray, ly: np.ndarray, n: int, y0: float):
    """``tlora_sim.sim.costmodel.profiled.loglog_interp`` on an array (values outside the table are the edge values;
    callers replace them)."""
    if n == 1:
        return np.full(np.shape(x), float(y0))
    return np.exp(np.interp(np.log(x), lx, ly))


def _smoothmax(a: np.ndarray, b: np.ndarray, p: float) -> np.ndarray:
    """``tlora_sim.sim.costmodel.profiled.smoothmax``, vectorised (a, b > 0)."""
    if p >= 64:
        return np.maximum(a, b)
    hi = np.maximum(a, b)
    return hi * ((a / hi) ** p + (b / hi) ** p) ** (1.0 / p)


__all__ = ["FusedBatch", "REL_MARGIN"]
