"""The profiled step formula, in one module and one implementation, over one mix (Python floats)
or over numpy rows of mixes (``FusedBatch``, issue 6: cost-model lookups vectorised).

``layer_formula`` is one decoder layer's forward + backward (ms) of a mix under a fitted plan
(``profiler/COSTMODEL.md`` derives it): ``smoothmax(gpu_scale x (l0 + attention + coef .
features), host_scale x nano x host; p)``; ``step_s`` the group step from the layer, the head and
AdamW (``opt_ms``). Each is written once with ``+ - * /`` in one order, over values that are
floats or arrays (the same IEEE operations element by element), with ``tables.libm`` (the C
library's log, exp and pow, element by element on arrays), ``tables.maximum`` and
``tables.piecewise`` where floats and arrays need different spellings of the same numbers.

Scalar entry points: ``mix_features`` turns a per-GPU mix of (rank, sequences, sequence length)
into the features the fitted plan terms multiply (sums in member order); ``layer_ms`` looks up
the tables (memoised per value) and calls ``layer_formula`` with floats, adding the coverage flag
and the residual correction; ``opt_ms`` the AdamW step; ``memory_breakdown`` the memory terms.
``model.py`` and the multi-GPU planner (``multigpu.py``) price groups with these.

Vectorised: the profiled model sees a group's mix, for the ``fused`` plan, only through sums over
its members (tokens, rank x tokens, ranks, bucketed rank x tokens, adapters, adapter parameters,
sequences per sequence length) and its largest rank. So the features of a merged group are its
parts' features added (the largest rank: their maximum; whole numbers, so exact in any order),
and ``FusedBatch.step_times`` calls ``layer_formula`` and ``step_s`` on many rows of features at
once, with one micro-batch: element by element the scalar model's answer, bit for bit
(``tests/costmodel/test_profiled_formula.py``). ``multigpu.PlannerBatch`` builds its lower bound of the
planner on this class's rows (``fill_row``) and layer (``layer_rows``). Callers still act on a
batch answer only beyond ``REL_MARGIN`` (1e-9), a margin they no longer need.
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
from tlora_sim.sim.costmodel.profiled.tables import Tables, is_rows, libm, maximum, tables_of

FEATURES = ("const", "adapters", "tokens", "rank_tokens", "ranks", "bucket_rank_tokens", "max_rank_tokens")
BUCKETS = (16, 32, 64, 128, 256)  # the fused kernel's rank buckets (profiler/kernels: tiles per bucket)
LINEARS_PER_LAYER = 7


# ---------------------------------------------------------------------------------- features
def mix_features(members: Sequence[tuple[int, float, int]]) -> dict:
    """Features of a per-GPU mix, members (rank, sequences, tokens per sequence): one pass, sums
    in member order (``FusedBatch.fill_row`` adds them in the same order)."""
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
    return adapter_term(pe["coef"], mix_features(members))


def adapter_term(coef: dict, feats) -> float:
    """``coef . features`` (ms): ``feats`` maps each of ``FEATURES`` but ``const`` to a float or
    to an array (one value per row; the same numbers element by element), summed in ``FEATURES``
    order (terms with a zero coefficient add nothing)."""
    term = coef.get("const", 0.0) * 1.0
    for name in FEATURES[1:]:
        c = coef.get(name, 0.0)
        if c:
            term = term + c * feats[name]
    return term


def host_ms(pe: dict, members) -> float:
    """The fitted host (launch) time of one layer step (ms): cpu0 + cpu_n x adapters + cpu_g x
    sequence-length groups."""
    return host_of(pe, len(members), len(seq_groups(members)))


def host_of(pe: dict, adapters, groups):
    """``host_ms`` from the counts (floats, or arrays of one value per row)."""
    return pe.get("cpu0", 0.0) + pe.get("cpu_n", 0.0) * adapters + pe.get("cpu_g", 0.0) * groups


def smoothmax(a, b, p: float):
    """(a^p + b^p)^(1/p): max(a, b) for large p, a bit above it where the two are close (floats,
    or arrays elementwise: the C library's ``pow`` either way)."""
    if p >= 64:
        return maximum(a, b)
    hi = maximum(a, b)
    if not is_rows(hi):
        if hi <= 0:
            return 0.0
        return hi * ((a / hi) ** p + (b / hi) ** p) ** (1.0 / p)
    # one of a / hi, b / hi is hi / hi = 1.0 exactly, and pow(1.0, p) = 1.0 (C99): the C library
    # runs on the other ratio only; the sum's order does not matter (IEEE addition commutes)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = hi * libm(pow, 1.0 + libm(pow, np.minimum(a, b) / hi, p), 1.0 / p)
    return np.where(hi <= 0, 0.0, out)


def when_split(nano, split, whole):
    """``split`` where ``nano`` > 1 (nano-batched), else ``whole`` (floats, or arrays per row)."""
    if is_rows(nano):
        return np.where(nano > 1, split, whole)
    return split if nano > 1 else whole


def layer_formula(pe: dict, feats, l0, at, groups, nano, in_model: bool = True, plan: str = "",
                  gpu_scale=1.0, host_scale=1.0):
    """The layer model (ms), the one implementation behind ``layer_ms`` (one mix, floats) and
    ``FusedBatch.layer_rows`` (many rows, arrays; the same numbers element by element):
    ``smoothmax(gpu_scale x (l0 + at + term), host_scale x nano x host; p)``.

    ``feats``: the mix's features (``mix_features``' keys but ``const``); ``l0``: the base
    layer's GPU time at tokens / nano (``Tables.l0g_ms``); ``at``: the attention's GPU time
    (``attention_ms``); ``groups``: distinct sequence lengths; ``nano``: nano-batches. The other
    arguments are ``layer_ms``'s."""
    l0 = l0 * nano
    term = adapter_term(pe["coef"], feats)
    c = pe["coef"].get("const", 0.0)
    term = when_split(nano, c * nano + (term - c) / nano, term)
    host = host_of(pe, feats["adapters"], groups)
    if in_model:
        call = pe.get("call_ms_alone", pe.get("call_ms", 0.0)) if plan == "alone" else pe.get("call_ms", 0.0)
        host = maximum(host - call, 0.5 * host)
    nh = pe.get("nano_host", 1.0)
    if nh != 1.0:  # the host time of one nano-batch, relative to a whole step's (calibrated)
        host = when_split(nano, host * nh, host)
    return smoothmax(gpu_scale * (l0 + at + term), host_scale * nano * host, pe.get("p", 64.0))


def layer_ms(tab: Tables, pe: dict, members, nano: int = 1, in_model: bool = True, plan: str = "",
             gpu_scale: float = 1.0, host_scale: float = 1.0) -> tuple[float, bool]:
    """One decoder layer (forward + backward) of a per-GPU mix under a fitted plan family (ms):
    ``smoothmax(gpu, host)`` with gpu = base curve + attention + adapter term (GPU parts) and host
    the launch time of the eager step (``layer_formula``, with the mix's features). ``in_model``: the layer inside a model, whose host time
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
    sequence lengths than the whole step; 1 otherwise). The flag: any table left its measured
    grid, or the mix is outside the plan's fitted coverage; a residual correction, where the
    artifact has one, multiplies the value (``residual_correction``)."""
    f = mix_features(members)
    T = f["tokens"]
    l0, e0 = tab.l0g(T / nano) if nano > 1 else tab.l0g(T)
    at, e1 = attention_ms(tab, members)
    val = layer_formula(pe, f, l0, at, len(seq_groups(members)), nano, in_model, plan, gpu_scale, host_scale)
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


def step_s(micro, layers: int, lay, head, opt):
    """One group step on one GPU (s) from its parts in ms (floats, or arrays per row):
    ``micro x (layers x layer + head) / 1e3 + AdamW / 1e3``."""
    return micro * (layers * lay + head) / 1e3 + opt / 1e3


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

    #: relative margin a caller keeps before acting on a batch answer (module constant; the batch is exact).
    REL_MARGIN = REL_MARGIN
    #: columns of a row.
    WIDTH = WIDTH

    def __init__(self, cost_model, model: str, gpu_name: str, n_gpus: int):
        art = cost_model.artifact
        self.m, self.gpu, self.n = get_model(model), GPUS[gpu_name], int(n_gpus)
        self.tab = tables_of(cost_model.key, model)
        entry = art["models"][model]
        self.pe = entry["plans"]["fused"]
        self.seq_col: dict[int, int] = {}
        self.seqs: list[int] = []
        self._order: list[int] = []  # the columns of ``seqs`` in increasing length (the sum's order)
        self._att_tables: dict[int, np.ndarray] = {}  # column -> attention at 0, 1, 2, ... sequences
        # the tables' base layer and head by tokens (``values_memoised``): rows asked of the batch
        # share token counts again and again
        self._l0_memo: dict[float, float] = {}
        self._head_memo: dict[float, float] = {}
        self.art = art
        self._tensors = LINEARS_PER_LAYER * self.m.layers * adapter_tensors_per_linear("fused", 2)
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
            self._order = sorted(range(len(self.seqs)), key=self.seqs.__getitem__)
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
        ``nano`` (shape (P,) or one int), one micro-batch: ``model.predict_of`` for the
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
        """``step_times`` evaluated (rows shape (P, WIDTH), P >= 1; ``N`` shape (P,) or a float):
        ``step_s`` of ``layer_rows``, the head and ``opt_ms``, as ``model.predict_of``."""
        lay = self.layer_rows(rows, N)
        opt = opt_ms(self.art, rows[:, LORA_PARAMS], self._tensors)
        return step_s(1, self.m.layers, lay, self.head_rows(rows[:, TOKENS]), opt)

    def layer_rows(self, rows: np.ndarray, N: np.ndarray | float, gpu_scale: np.ndarray | float = 1.0,
                   host_scale: np.ndarray | float = 1.0) -> np.ndarray:
        """One decoder layer, forward + backward (ms), shape (P,), of each row of ``rows`` (shape
        (P, ``WIDTH``)) at ``N`` nano-batches (shape (P,) or a float): ``layer_formula`` of the
        ``fused`` plan inside a model on the rows' features (``layer_ms`` of each row's mix, bit
        for bit), with its ``gpu_scale`` (GPU part, e.g. 1 / tp) and ``host_scale`` (host part),
        each shape (P,) or a float."""
        T = rows[:, TOKENS]
        feats = {"adapters": rows[:, ADAPTERS], "tokens": T, "rank_tokens": rows[:, RANK_TOKENS],
                 "ranks": rows[:, RANKS], "bucket_rank_tokens": rows[:, BUCKET_RANK_TOKENS],
                 "max_rank_tokens": rows[:, MAX_RANK] * T}
        if self.seqs:
            B = rows[:, N_FIXED:N_FIXED + len(self.seqs)]
            groups = np.count_nonzero(B, axis=1)
            at = self.attention_rows(B)
        else:
            groups, at = 0.0, 0.0
        l0 = values_memoised(self._l0_memo, T / N, self.tab.l0g_ms)
        return layer_formula(self.pe, feats, l0, at, groups, N, True, "fused", gpu_scale, host_scale)

    def head_rows(self, t: np.ndarray) -> np.ndarray:
        """``Tables.head_ms`` of tokens ``t`` (shape (P,)), kept by value (``values_memoised``)."""
        return values_memoised(self._head_memo, t, self.tab.head_ms)

    def attention_rows(self, B: np.ndarray) -> np.ndarray:
        """Attention of each row (ms), shape (P,): ``attention_ms`` of its mix, for the sequences
        per length ``B`` (shape (P, K), columns as ``self.seqs``, 0 = none): ``Tables.attn_values``
        per length, added in increasing length as ``attention_ms`` adds them. Whole sequence
        counts (every row of ``row``; ``fill_row``'s callers give whole sequences) are looked up
        in a table of ``attn_values`` at 0, 1, 2, ... sequences per length (``_attention_table``:
        the same numbers, computed once)."""
        out = np.zeros(len(B))
        for j in self._order:
            b = B[:, j]
            top = b.max()
            if top <= 0:
                continue
            whole = b.astype(np.int64)
            if top < 1 << 20 and (whole == b).all():
                v = self._attention_table(j, int(top))[whole]
            else:
                v = np.zeros(len(b))
                has = b > 0
                v[has] = self.tab.attn_values(self.seqs[j], b[has])
            out = out + v  # + 0.0 where a row has no sequences of this length: unchanged
        return out

    def _attention_table(self, j: int, top: int) -> np.ndarray:
        """``attn_values`` of column ``j``'s length at 0 (0.0), 1, ..., at least ``top`` sequences."""
        tbl = self._att_tables.get(j)
        if tbl is None or len(tbl) <= top:
            size = max(64, 1 << top.bit_length())
            tbl = np.zeros(size)
            tbl[1:] = self.tab.attn_values(self.seqs[j], np.arange(1.0, size))
            self._att_tables[j] = tbl
        return tbl


def values_memoised(memo: dict, x: np.ndarray, fn, cap: int = 1 << 16) -> np.ndarray:
    """``fn(x)`` (an elementwise function of a float array, shape (P,)) with its values kept in
    ``memo`` by element value: the elements not seen before are evaluated in one call of ``fn``
    (the same floats: ``fn`` works element by element); ``memo`` is emptied when it would pass
    ``cap`` entries."""
    keys = x.tolist()
    got = list(map(memo.get, keys))
    if None in got:
        miss = [i for i, v in enumerate(got) if v is None]
        vals = fn(x[miss]).tolist()
        if len(memo) + len(miss) > cap:
            memo.clear()
        for i, v in zip(miss, vals):
            got[i] = memo[keys[i]] = v
    return np.array(got)


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


__all__ = ["FusedBatch", "REL_MARGIN", "layer_ms", "memory_breakdown", "mix_features", "opt_ms"]
