"""A vectorised lower bound of the profiled model's multi-GPU step time (the planner's), for the
policies' merge tests on groups of several GPUs (``batch.py`` does one-GPU groups).

On ``n > 1`` GPUs the profiled model's step is the planner ``profiled_multigpu.best_plan``: it
evaluates ``plan_step`` for every plan of ``parallelism.candidates`` (dp, fsdp, tp2/4/8, local;
the pipeline plans pp2/4/8... only when none of those fits memory) and returns the fastest plan
that fits, or the least-memory plan when none does. ``PlannerBatch`` evaluates, for many candidate
groups at once, the time of *every* plan the planner can return (memory is not looked at) and
takes the minimum::

    lower_bound_s = min(step_times(rows), local_step_times(member_lists))
                  = min over dp, fsdp, tp*, pp*, local of plan_step(...)[0]      (fused, micro = 1)

Why it bounds the planner from below: ``best_plan`` (without ``forced``) always returns one of
the plans it timed, with that plan's ``plan_step`` time, and the plans it times are a subset of
``candidates(m, n, k, False) + candidates(m, n, k, True)``; the minimum over that whole set is
therefore <= its answer, whichever plan memory makes it pick. So a caller may refuse a candidate
whose bound exceeds a threshold by more than ``REL_MARGIN`` without changing a decision.

Rows: the mix of a non-local plan with data-parallel degree ``d`` (``per_gpu_mixes``) holds
``ceil(b / d)`` of each member's ``b`` sequences, which is not linear in ``d``; so a row is one
``FusedBatch`` row (``batch.WIDTH`` columns: additive features, largest rank, sequences per length)
for each distinct ``d`` among the plans (dp/fsdp: n; tp t: n / t; pp p: n / p), laid end to end.
Every feature is a sum of per-member integers (whole sequences), so rows add exactly and a merged
row equals the union's row bit for bit. The ``local`` plan places whole members on GPUs
(longest first), which is not additive; ``local_step_times`` places each member list in Python
(``per_gpu_mixes``'s placement, ``lpt_gpus``), adds the members' rows per GPU and evaluates every
GPU's mix in one vectorised call.

Exactness: each plan's time is ``plan_step``'s formula on the same inputs (``batch.FusedBatch``'s
vectorised layer, head and tables; ``_collective_ms`` is ``Collectives._time_ms`` vectorised;
AdamW and communication terms associated as in ``plan_step``). The sums over sequence lengths
are associated differently and numpy's log/exp may differ from the C library's in the last place,
so each plan agrees with the scalar ``plan_step`` to a few 1e-16 relative per operation (measured
worst 1.4e-15 over 22,585 plan evaluations: the shipped H100 and H200 artifacts, all four models,
2-32 GPUs, 1-16 members, nano 1-29; the bound exceeded ``best_plan``'s step by at most 6.7e-16
relative; ``tests/test_batch_multigpu.py`` requires < 1e-12); the minimum of values each within a
relative error keeps that error. ``REL_MARGIN`` (1e-9) is three orders above it.

What is not reproduced: ``plan_step``'s memory and its extrapolation reasons (not needed for a
time bound); ``micro`` > 1 (one micro-batch only); a ``terms`` override or explicit ``mixes``.
"""

from __future__ import annotations

import heapq
import math
from typing import Sequence

import numpy as np

from tlora_sim.sim.costmodel.batch import LORA_PARAMS, MAX_RANK, N_FIXED, REL_MARGIN, TOKENS, FusedBatch, rows_memoised
from tlora_sim.sim.costmodel.batch import WIDTH as SUB
from tlora_sim.sim.costmodel.hardware import GPUS
from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.costmodel.parallelism import GPUS_PER_NODE, Collectives, Parallelism, candidates
from tlora_sim.sim.costmodel.profiled import LINEARS_PER_LAYER, ProfiledCostModel
from tlora_sim.sim.costmodel.profiled_multigpu import _terms, plan_step


class PlannerBatch:
    """Vectorised lower bound of the ``fused`` planner step on ``n_gpus`` > 1 GPUs of one (base
    model, GPU type) under a profiled artifact. Build with ``PlannerBatch.of``.

    Attributes:
        WIDTH: columns of a row (an instance's: ``batch.WIDTH`` x the distinct data-parallel
            degrees ``ds`` of its plans).
        ds: the data-parallel degrees, in sub-row order.
        plans: the non-local plans ``step_times`` minimises over.
    """

    #: relative margin a bound must clear a threshold by before a caller acts on it (``batch.REL_MARGIN``).
    REL_MARGIN = REL_MARGIN
    WIDTH: int

    def __init__(self, cost_model: ProfiledCostModel, model: str, gpu_name: str, n_gpus: int):
        self.cm, self.model, self.gpu_name, self.n = cost_model, model, gpu_name, int(n_gpus)
        self.fb = fb = FusedBatch(cost_model, model, gpu_name, 1)  # tables, layer, head, seq columns
        self._one: dict[tuple, np.ndarray] = {}  # member -> its row alone (``_member_row``)
        self._sub: dict[tuple, np.ndarray] = {}  # member -> its ``row`` alone (``_member_sub_rows``)
        # answers kept by their inputs (``step_times``: (row, nano) bytes; ``local_step_times``:
        # (members, nano)): pure functions of them, asked again and again by the policies
        self._step_memo: dict[bytes, float] = {}
        self._local_memo: dict[tuple, float] = {}
        m, n = fb.m, self.n
        self.art = cost_model.artifact
        terms, coll, _ = _terms(gpu_name)  # the curves and host terms plan_step uses
        self._coll = coll
        hs = terms["host_scale"]
        self._hs = float(hs["fused"] if isinstance(hs, dict) else hs)  # busy GPUs > 1 on every plan here
        self._per_tensor_ms, self._sync_ms = float(terms["per_tensor_ms"]), float(terms["sync_ms"])
        self._net = GPUS[gpu_name].net_bw_bytes_s / 1e3 if n > GPUS_PER_NODE else None
        c = self.art["optimizer"]["coef"]
        self._optc = (c["const"], c["per_mparam"], c["per_tensor"])
        self.plans = tuple(p for p in candidates(m, n, 1, pipeline=True) if p.kind != "local")
        self.ds = tuple(sorted({p.dp for p in self.plans}, reverse=True))
        self.WIDTH = SUB * len(self.ds)
        shapes = sorted({(self.ds.index(p.dp), p.tp) for p in self.plans})  # distinct layer evaluations
        self._shape_k = np.array([k for k, _ in shapes])
        self._shape_g = np.array([1.0 / t for _, t in shapes])
        # per plan (J of them): its layer shape, degree, layers L, compute multiplier, tensors,
        # replicas of the adapter all-reduce, fsdp all-gather ms, tp degree, sync ms
        J = []
        for p in self.plans:
            L = math.ceil(m.layers / p.pp)
            replicas = n if p.kind in ("dp", "fsdp", "tp") else p.dp
            fsdp = 0.0
            if p.kind == "fsdp":
                cg = sum(coll.time_ms("all_gather", 2.0 * i * o, n, self._net)[0] for _, i, o in m.linear_shapes)
                fsdp = L * cg  # one micro-batch
            sync = self._sync_ms if (replicas > 1 or p.kind == "tp") else 0.0
            J.append((shapes.index((self.ds.index(p.dp), p.tp)), self.ds.index(p.dp), L,
                      p.pp * L if p.kind == "pp" else L,  # GPipe: (micro + pp - 1) stage times, micro = 1
                      2 * LINEARS_PER_LAYER * L, replicas, fsdp,
                      p.tp if p.kind == "tp" else 1, sync))
        cols = list(zip(*J))
        self._j_shape, self._j_k = np.array(cols[0]), np.array(cols[1])
        self._j_L, self._j_mult, self._j_tensors = (np.array(cols[i], float)[:, None] for i in (2, 3, 4))
        self._j_fsdp, self._j_sync = np.array(cols[6])[:, None], np.array(cols[8])[:, None]
        # adapter all-reduces: one per distinct (L, replicas > 1); tp activation all-reduces
        self._ar = sorted({(L, r) for _, _, L, _, _, r, _, _, _ in J if r > 1})
        self._j_ar = [self._ar.index((L, r)) if r > 1 else -1 for _, _, L, _, _, r, _, _, _ in J]
        self._tp = [(j, t, J[j][1], J[j][2]) for j, x in enumerate(J) if (t := x[7]) > 1]
        xs, ys = coll.curves["all_reduce"]
        self._curve = (np.array(xs), np.array([math.log(v) for v in xs]), np.array([math.log(v) for v in ys]),
                       ys[0], Collectives._factor("all_reduce", 2))

    @classmethod
    def of(cls, cost_model, model: str, gpu_name: str, n_gpus: int) -> "PlannerBatch | None":
        """The batch for groups of ``model`` on ``n_gpus`` GPUs of type ``gpu_name``; None where the
        scalar model must answer alone: another cost model, a GPU type or model the artifact does
        not measure, a ``fused`` plan with a residual correction, or one GPU (``FusedBatch``)."""
        if not isinstance(cost_model, ProfiledCostModel) or int(n_gpus) <= 1:
            return None
        art = cost_model.artifact
        if gpu_name != art["gpu"] or gpu_name not in GPUS or model not in art["models"]:
            return None
        pe = art["models"][model]["plans"].get("fused")
        if pe is None or pe.get("correction"):
            return None
        return cls(cost_model, model, gpu_name, n_gpus)

    # ---- features ------------------------------------------------------------------------------
    def row(self, members: Sequence[Member]) -> np.ndarray | None:
        """Feature row of a group for the non-local plans, shape (``WIDTH``,): for each degree d of
        ``ds`` a ``FusedBatch`` row of the mix with ``ceil(batch_size / d)`` sequences per member
        (``per_gpu_mixes``, one micro-batch). None if the group brings more than
        ``batch.MAX_SEQ_LENS`` distinct sequence lengths into this instance."""
        got = [self._member_sub_rows(x) for x in members]
        if any(r is None for r in got):
            return None
        if len(got) == 1:
            return got[0].copy()
        R = np.array(got)
        out = R.sum(axis=0)  # whole sequences, integer features: exact in any order
        out[MAX_RANK::SUB] = R[:, MAX_RANK::SUB].max(axis=0)
        return out

    def _member_sub_rows(self, x: Member) -> np.ndarray | None:
        """``row`` of ``x`` alone (shape (``WIDTH``,)), memoised; None as ``row``."""
        got = self._sub.get(x)
        if got is None:
            got = np.zeros(self.WIDTH)
            for k, d in enumerate(self.ds):
                if not self.fb.fill_row(got[k * SUB:(k + 1) * SUB], [(x.rank, math.ceil(x.batch_size / d),
                                                                      x.seq_len)]):
                    return None
            if len(self._sub) >= 1 << 16:
                self._sub.clear()
            self._sub[x] = got
        return got

    @staticmethod
    def merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Rows of the groups ``a`` and ``b`` merged: sums, the largest rank of each sub-row their
        maximum (broadcasting: shapes (W,) or (P, W))."""
        out = a + b
        k = slice(MAX_RANK, None, SUB)
        out[..., k] = np.maximum(a[..., k], b[..., k])
        return out

    # ---- the model -----------------------------------------------------------------------------
    def step_times(self, rows: np.ndarray, nano: np.ndarray | int) -> np.ndarray:
        """Shape (P,), seconds: for each row of ``rows`` (shape (P, ``WIDTH``) or (``WIDTH``,)) the
        minimum over ``plans`` (dp, fsdp, tp*, pp*) of ``plan_step(...)[0]`` (``fused``, one
        micro-batch) at ``nano`` nano-batches (shape (P,) or one int >= 1). Kept by (row, nano);
        only rows not asked before are evaluated (``plan_times``, element by element the same)."""
        rows = rows[None, :] if rows.ndim == 1 else rows
        P = len(rows)
        if not P:
            return np.zeros(0)
        return rows_memoised(self._step_memo, rows, nano, lambda r, n: self.plan_times(r, n).min(axis=0),
                             1 << 15)  # keys of ~750 bytes: ~30 MB at most

    def plan_times(self, rows: np.ndarray, nano: np.ndarray | int) -> np.ndarray:
        """Shape (J, P), seconds: ``plan_step(...)[0]`` of each plan of ``plans`` (J of them) for
        each row of ``rows`` (shape (P, ``WIDTH``), P >= 1), as ``step_times``."""
        P = len(rows)
        fb, m = self.fb, self.fb.m
        N = np.broadcast_to(np.asarray(nano, dtype=float), (P,))
        sub = rows.reshape(P, len(self.ds), SUB).transpose(1, 0, 2)  # (D, P, SUB)
        seqs = sub[:, :, N_FIXED:N_FIXED + len(fb.seqs)].sum(axis=2)  # whole sequences: exact sums
        nn = np.maximum(1.0, np.minimum(N, seqs))  # (D, P): plan_step's cap at the mix's sequences
        tokens = sub[:, :, TOKENS]
        S = len(self._shape_k)
        lay = fb.layer_rows(sub[self._shape_k].reshape(S * P, SUB), nn[self._shape_k].reshape(-1),
                            np.repeat(self._shape_g, P), self._hs).reshape(S, P)
        head = fb._head_ms(tokens.reshape(-1)).reshape(-1, P)
        params = rows[:, LORA_PARAMS]
        L, tensors = self._j_L, self._j_tensors
        compute = self._j_mult * lay[self._j_shape] + head[self._j_k]
        oc, opm, opt_t = self._optc
        opt = oc + opm * (params * L / m.layers) / 1e6 + opt_t * tensors
        # communication: adapter all-reduces, then the fsdp gathers, tp activations, sync
        q_bytes = [4.0 * params * La / m.layers for La, _ in self._ar]
        q_n = [np.full(P, float(r)) for _, r in self._ar]
        q_net = [self._net] * len(self._ar)
        for _, t, k, _ in self._tp:
            q_bytes.append(2.0 * tokens[k] * m.hidden)
            q_n.append(np.full(P, float(t)))
            q_net.append(None)
        if q_bytes:
            net = np.concatenate([np.full(P, np.inf if x is None else x) for x in q_net])
            cms = _collective_ms(self._curve, np.concatenate(q_bytes), np.concatenate(q_n), net).reshape(-1, P)
        comm = np.zeros_like(compute)
        for j, a in enumerate(self._j_ar):
            if a >= 0:
                comm[j] = nn[self._j_k[j]] * (cms[a] + self._per_tensor_ms * tensors[j])
        comm += self._j_fsdp
        for q, (j, _, _, Lj) in enumerate(self._tp, start=len(self._ar)):
            comm[j] += 4 * Lj * cms[q]  # one micro-batch
        comm += self._j_sync
        return (compute + opt + comm) / 1e3

    def local_step_times(self, member_lists: Sequence[Sequence[Member]], nano: np.ndarray | int) -> np.ndarray:
        """Shape (P,), seconds: ``plan_step(...)[0]`` of ``Parallelism("local", n_gpus)`` for each
        member list (``fused``, one micro-batch) at ``nano`` nano-batches (shape (P,) or one int);
        ``np.inf`` where a list has fewer than 2 members (the planner offers no local plan).
        Kept by (members, nano); the lists not asked before are evaluated (``_local_step_times``)."""
        P = len(member_lists)
        out = np.full(P, np.inf)
        if not P:
            return out
        N = np.broadcast_to(np.asarray(nano, dtype=float), (P,)).tolist()
        memo = self._local_memo
        miss, keys = [], []
        for p, mem in enumerate(member_lists):
            if len(mem) < 2:
                continue
            k = (tuple(mem), N[p])
            v = memo.get(k)
            if v is None:
                miss.append(p)
                keys.append(k)
            else:
                out[p] = v
        if miss:
            t = self._local_step_times([member_lists[p] for p in miss], np.array([N[p] for p in miss]))
            if len(memo) + len(miss) > 1 << 16:
                memo.clear()
            for k, v in zip(keys, t.tolist()):
                memo[k] = v
            out[miss] = t
        return out

    def _local_step_times(self, member_lists: Sequence[Sequence[Member]], nano: np.ndarray) -> np.ndarray:
        """``local_step_times`` evaluated (every list of >= 2 members; ``nano`` shape (P,)).
        ``per_gpu_mixes``'s placement (``lpt_gpus``) runs in Python per list; every GPU's mix of
        every list is evaluated in one vectorised call and the slowest GPU of each list taken. A list with too
        many sequence lengths for the row columns is answered by the scalar ``plan_step``."""
        P = len(member_lists)
        out = np.full(P, np.inf)
        if not P:
            return out
        fb, m = self.fb, self.fb.m
        N = np.broadcast_to(np.asarray(nano, dtype=float), (P,))
        par, n, one = Parallelism("local", self.n), self.n, self._member_row
        member_rows: list[np.ndarray] = []  # every member's row alone, mix after mix, list after list
        seg: list[int] = []  # where each GPU's mix starts in member_rows
        starts, owners, hs = [], [], []  # per list: its first mix (in seg), index, host scale
        for p, mem in enumerate(member_lists):
            if len(mem) < 2:
                continue
            got = [one(x) for x in mem]
            if any(r is None for r in got):  # too many sequence lengths for the columns: the scalar model
                out[p] = plan_step(self.art, self.cm.key, self.model, self.gpu_name, tuple(sorted(mem)), par,
                                   "fused", int(N[p]), 1, True, memory=False)[0]
                continue
            starts.append(len(seg))
            owners.append(p)
            if len(mem) <= n and all(x.batch_size * x.seq_len > 0 for x in mem):
                # lpt_gpus would put each member on its own empty GPU: one mix per member
                seg.extend(range(len(member_rows), len(member_rows) + len(mem)))
                member_rows.extend(got)
                busy = len(mem)
            else:
                gpus = lpt_gpus(mem, n)
                busy, last = 0, -1
                for i in sorted(range(len(mem)), key=gpus.__getitem__):
                    if gpus[i] != last:
                        seg.append(len(member_rows))
                        busy, last = busy + 1, gpus[i]
                    member_rows.append(got[i])
            hs.append(self._hs if min(busy, GPUS_PER_NODE) > 1 else 1.0)  # busy GPUs: the non-empty mixes
        if not seg:
            return out
        R = np.array(member_rows)
        # a mix's features: its members' summed (whole sequences: exact in any order), the largest rank
        X = np.add.reduceat(R, seg)
        X[:, MAX_RANK] = np.maximum.reduceat(R[:, MAX_RANK], seg)
        counts = np.diff(starts + [len(seg)])
        seqs = X[:, N_FIXED:N_FIXED + len(fb.seqs)].sum(axis=1)
        nn = np.maximum(1.0, np.minimum(np.repeat(N[owners], counts), seqs))
        L = m.layers
        lay = fb.layer_rows(X, nn, 1.0, np.repeat(np.array(hs), counts))
        compute = L * lay + fb._head_ms(X[:, TOKENS])
        oc, opm, opt_t = self._optc
        total = compute + (oc + opm * (X[:, LORA_PARAMS] * L / L) / 1e6 + opt_t * (2 * LINEARS_PER_LAYER * L))
        out[owners] = np.maximum.reduceat(total, starts) / 1e3
        return out

    def _member_row(self, x: Member) -> np.ndarray | None:
        """Row of ``x`` alone on a GPU (the local plan's mix of one member), memoised."""
        got = self._one.get(x)
        if got is None:
            got = np.zeros(SUB)
            if not self.fb.fill_row(got, [(x.rank, x.batch_size, x.seq_len)]):
                return None
            if len(self._one) >= 1 << 16:
                self._one.clear()
            self._one[x] = got
        return got

    def lower_bound_s(self, rows: np.ndarray, member_lists: Sequence[Sequence[Member]],
                      nano: np.ndarray | int) -> np.ndarray:
        """Shape (P,), seconds: a lower bound of the planner's step (``best_plan(...)[1]``, to
        within the relative error in the module docstring) of each candidate group, given as its
        ``row`` (``rows``, shape (P, ``WIDTH``)) and its members (``member_lists``, P lists):
        ``np.minimum(step_times, local_step_times)``."""
        return np.minimum(self.step_times(rows, nano), self.local_step_times(member_lists, nano))


def lpt_gpus(members: Sequence[Member], n_gpus: int) -> list[int]:
    """The GPU of each member (in ``members``' order) under ``parallelism.per_gpu_mixes``'s
    placement for the ``local`` plan: members longest first (tokens; then rank, seq_len) on the
    least-loaded GPU (lowest index among equals). A heap instead of its scan over the GPUs (the same
    choice: the least (load, index)); ``tests/test_batch_multigpu.py`` checks they agree."""
    heap = [(0.0, k) for k in range(n_gpus)]  # sorted: a heap
    out = [0] * len(members)
    for i in sorted(range(len(members)), key=lambda i: (-members[i][1] * members[i][2], members[i][0], members[i][2])):
        load, k = heap[0]
        heapq.heapreplace(heap, (load + members[i][1] * members[i][2], k))
        out[i] = k
    return out


def _collective_ms(curve: tuple, nbytes: np.ndarray, n: np.ndarray, net: np.ndarray) -> np.ndarray:
    """``Collectives._time_ms`` of the all-reduce, vectorised (ms): ``nbytes`` the buffer (bytes),
    ``n`` the GPUs, ``net`` the inter-node bandwidth cap (bytes/ms; ``np.inf`` for none), all
    shape (Q,). ``curve``: (sizes, their logs, log times, latency floor, two-GPU bus factor) of a
    curve of >= 2 points (as the scalar needs)."""
    xs, lxs, lys, floor, f2 = curve
    x = np.clip(nbytes, xs[0], xs[-1])
    i = np.clip(np.searchsorted(xs, x, side="left"), 1, len(xs) - 1)
    w = (np.log(x) - lxs[i - 1]) / (lxs[i] - lxs[i - 1])
    t = np.exp(lys[i - 1] + w * (lys[i] - lys[i - 1]))  # the measured two-GPU time at x
    bw = np.where(t > floor, f2 * x / np.maximum(t - floor, 1e-6 * t), f2 * x / t)
    bw = np.minimum(bw, net)
    ring = floor * (n - 1) + (2.0 * (n - 1) / n) * nbytes / bw
    direct = (n == 2) & np.isinf(net) & (nbytes <= xs[-1])
    return np.where((n <= 1) | (nbytes <= 0), 0.0, np.where(direct, t, ring))


__all__ = ["PlannerBatch"]
