"""The profiled model on several GPUs: one parallelism plan's time and memory (``plan_step``), the
planner that picks the plan (``best_plan``), and its vectorised lower bound for the policies'
merge tests (``PlannerBatch``). ``sim/costmodel/parallelism.py`` says what the plans are.

Per plan, with the per-GPU mixes of ``parallelism.per_gpu_mixes`` (``B`` micro-batches, ``N``
nano-batches, ``L`` layers per GPU: all of them, or a pipeline stage's share)::

    step = max over GPUs of  B x (L x layer(mix; gpu x 1/tp, host x host_scale) + head(tokens))
                             + AdamW(its adapters) + communication
    communication = N x (all_reduce(4 B x adapter params, replicas) + per_tensor_ms x tensors)
                  + B x L x all_gather(a layer's weight matrices, n)        (fsdp)
                  + B x 4 L x all_reduce(2 B x tokens x hidden, tp)          (tp)
                  + sync_ms                                                  (plans that communicate)

``layer``, ``head`` and AdamW are the single-GPU profile's (``formula.py``); the collective curves
and ``host_scale``, ``per_tensor_ms``, ``sync_ms`` are fitted to the two-GPU profile
(``profiler/fit_multigpu.py``). The gradient bucket is fp32 (4 bytes per adapter parameter), as in
the profiler. ``N`` is capped at the GPU's sequences per micro-batch (a nano-batch holds whole
sequences). Pipeline plans: GPipe, ``(B + p - 1)`` stage times plus the head per micro-batch.

Plans ``lorafusion`` and ``grouped`` (where the artifact measured them on one GPU) use their own
layer fit per GPU and the optimizer's tensor count of their adapter layout; the two-GPU profile
measured ``loop`` and ``fused`` only, so their ``host_scale`` is the ``fused`` plan's (reason
``multigpu:host_scale_of_fused:<plan>``).

Memory per GPU: ``formula.memory_breakdown`` of the GPU's mix, with the frozen weights divided by
the plan's sharding (fsdp: n, tp: t, pp: p), checkpointed inputs by the stages, and for pipelines
``min(B, p)`` micro-batches in flight.

The lower bound (``PlannerBatch``), for groups of several GPUs (``formula.FusedBatch`` does
one-GPU groups). On ``n > 1`` GPUs the profiled model's step is the planner ``best_plan``: it
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
``FusedBatch`` row (``formula.WIDTH`` columns: additive features, largest rank, sequences per length)
for each distinct ``d`` among the plans (dp/fsdp: n; tp t: n / t; pp p: n / p), laid end to end.
Every feature is a sum of per-member integers (whole sequences), so rows add exactly and a merged
row equals the union's row bit for bit. The ``local`` plan places whole members on GPUs
(longest first), which is not additive; ``local_step_times`` places each member list in Python
(``per_gpu_mixes``'s placement, ``lpt_gpus``), adds the members' rows per GPU and evaluates every
GPU's mix in one vectorised call.

Exactness: each plan's time is ``plan_step``'s formula on the same inputs, in the same order
(``formula.FusedBatch``'s layer and head, which are ``formula.layer_formula`` and the tables'
lookups on arrays; ``formula.opt_ms``; ``collective_ms_rows`` is ``Collectives.time_ms`` on arrays
with the C library's log and exp; the communication terms added as ``plan_step`` adds them), so
each plan's time equals ``plan_step``'s bit for bit and the bound is the minimum of those values
(``tests/costmodel/test_batch_multigpu.py``). ``REL_MARGIN`` (1e-9) is kept by the callers as a spare.

What is not reproduced: ``plan_step``'s memory and its extrapolation reasons (not needed for a
time bound); ``micro`` > 1 (one micro-batch only); a ``terms`` override or explicit ``mixes``.
"""

from __future__ import annotations

import heapq
import math
from functools import lru_cache
from typing import Sequence

import numpy as np

from tlora_sim.sim.costmodel.hardware import GPUS
from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.costmodel.models import get_model
from tlora_sim.sim.costmodel.parallelism import GPUS_PER_NODE, Collectives, Parallelism, candidates, load_multigpu, \
    per_gpu_mixes
from tlora_sim.sim.costmodel.profiled.artifact import PLAN_FAMILY, profiled_source, registered
from tlora_sim.sim.costmodel.profiled.formula import LINEARS_PER_LAYER, LORA_PARAMS, MAX_RANK, N_FIXED, REL_MARGIN, \
    TOKENS, FusedBatch, adapter_tensors_per_linear, layer_ms, memory_breakdown, opt_ms, rows_memoised
from tlora_sim.sim.costmodel.profiled.formula import WIDTH as SUB
from tlora_sim.sim.costmodel.profiled.tables import libm, remember, tables_of, where

_NO_TERMS = {"host_scale": 1.0, "per_tensor_ms": 0.0, "sync_ms": 0.0}


def _terms(gpu_name: str) -> tuple[dict, Collectives, tuple[str, ...]]:
    terms, own = load_multigpu(gpu_name)
    if terms is None:  # analytic curves from the datasheet link bandwidth (flagged)
        bw = GPUS[gpu_name].link_bw_bytes_s / 1e3
        lat = 0.02
        curves = {op: [[4096, lat + 4096 / bw], [1 << 30, lat + (1 << 30) / bw]] for op in ("all_reduce", "all_gather")}
        return {**_NO_TERMS, "curves": curves}, Collectives({"curves": curves}), ("multigpu:unmeasured",)
    return terms, _collectives(gpu_name), (() if own else ("multigpu:gpu",))


@lru_cache(maxsize=8)
def _collectives(gpu_name: str) -> Collectives:
    return Collectives(load_multigpu(gpu_name)[0])


def plan_step(art: dict, key: str, model: str, gpu_name: str, members: tuple[Member, ...], par: Parallelism,
              plan: str, nano: int, micro: int, ckpt: bool, terms: dict | None = None,
              mixes: list | None = None, *, memory: bool = True, memo: dict | None = None,
              above: float | None = None) -> tuple[float, tuple[str, ...], float] | None:
    """(step time s, reasons it is extrapolated, peak memory per GPU bytes) of ``members`` under
    ``par``; ``art``/``key`` the profiled artifact and its key (``model.ProfiledCostModel.key``, ``artifact.register``).

    ``terms``: fitted multi-GPU terms to use instead of the shipped file (the fit's trial values);
    ``mixes``: per-GPU mixes instead of ``per_gpu_mixes`` (the profiler's own placement of
    rank-local adapters, when predicting its rows). ``memory=False`` leaves the memory out
    (returned as NaN; ``plan_memory`` gives it). ``memo``: the profiled model's one answer memo
    for this artifact (``model.memo_of``; None: a fresh one), where the question's context (model,
    terms, tables), per-GPU mixes, each mix's sequences, tokens, head and adapter parameters,
    optimizer times and layer times are kept under keys that name what they depend on (pure
    functions of their keys: shared by the plans of one question and by later questions). ``above``: return None, without the layer times, where one
    GPU's step without them, ``(B x head + AdamW) + communication`` in s, already exceeds ``above``
    (the step adds ``B x L x layer >= 0`` to the first sum, the same floating-point operations
    otherwise, and rounding is monotone: the plan's step exceeds ``above`` too)."""
    memo = {} if memo is None else memo
    # what every plan of one question reads; the fitted terms given as ``terms`` are not kept
    ckey = ("ctx", model, gpu_name, plan)
    ctx = memo.get(ckey) if terms is None else None
    if ctx is None:
        ctx = _context(art, key, model, gpu_name, plan, terms)
        if terms is None:
            remember(memo, ckey, ctx)
    m, net_bw, terms, coll, why, tab, pe, opt_ms, breakdown = ctx
    n = par.n_gpus
    reasons = set(why) if n > 1 else set()
    if n > 2:
        reasons.add("multigpu:gpus>2")
    net = net_bw if n > GPUS_PER_NODE else None
    if net is not None:
        reasons.add("multigpu:inter-node")
    if par.kind == "pp":
        reasons.add("multigpu:pp")
    if mixes is None:  # the same mixes for every plan of one data-parallel degree (not local)
        mk = ("mixes", members, par.kind == "local", par.n_gpus if par.kind == "local" else par.dp, micro)
        mixes = memo.get(mk)
        if mixes is None:
            mixes = remember(memo, mk, per_gpu_mixes(members, par, micro))
    hs = terms["host_scale"]  # one training process per busy GPU of a host: they share its CPU
    busy = min(len(mixes) if par.kind == "local" else n, GPUS_PER_NODE)
    fam = PLAN_FAMILY[plan]
    if busy > 1 and isinstance(hs, dict) and fam not in hs:
        # lorafusion/grouped: their own one-GPU layer fit, the CPU sharing of the fused plan (the
        # two-GPU profile measured loop and fused only)
        fam = "fused"
        reasons.add(f"multigpu:host_scale_of_fused:{plan}")
    hs = float(hs[fam] if isinstance(hs, dict) else hs) if busy > 1 else 1.0
    L = math.ceil(m.layers / par.pp)
    worst_ms, mem = 0.0, (0.0 if memory else math.nan)
    for mix in mixes:
        mkey = tuple(mix)
        # a mix's sequences, tokens, head and adapter parameters: pure functions of the mix
        per = memo.get(("mix", model, mkey))
        if per is None:
            tokens = sum(b * s for _, b, s in mix)
            per = remember(memo, ("mix", model, mkey), (sum(b for _, b, _ in mix), tokens, tab.head(tokens),
                                                         sum(m.lora_params(r) for r, _, _ in mix)))
        seqs, tokens, (head, e_head), params = per
        n_nano = max(1, min(nano, int(seqs))) if plan == "fused" else 1
        tensors = LINEARS_PER_LAYER * L * adapter_tensors_per_linear(plan, len(mix))
        okey = ("opt", params, L, m.layers, tensors)
        opt = memo.get(okey)
        if opt is None:
            opt = remember(memo, okey, opt_ms(art, params * L / m.layers, tensors))
        replicas = n if par.kind in ("dp", "fsdp", "tp") else (par.dp if par.kind == "pp" else 1)
        ar = coll.time_ms("all_reduce", 4.0 * params * L / m.layers, replicas, net)[0] if replicas > 1 else 0.0
        gather = sum(coll.time_ms("all_gather", 2.0 * i * o, n, net)[0] for _, i, o in m.linear_shapes) \
            if par.kind == "fsdp" else 0.0
        tp = coll.time_ms("all_reduce", 2.0 * tokens * m.hidden, par.tp)[0] if par.kind == "tp" else 0.0
        comm = communication_ms(replicas > 1, n_nano, ar, float(terms["per_tensor_ms"]), tensors, gather, tp,
                                replicas > 1 or par.kind == "tp", float(terms["sync_ms"]), micro, L)
        if above is not None and ((micro * head + opt) + comm) / 1e3 > above:
            return None
        lkey = ("layer", model, plan, mkey, n_nano, par.tp, hs)
        got = memo.get(lkey)
        if got is None:
            got = remember(memo, lkey, layer_ms(tab, pe, mix, n_nano, plan=plan, gpu_scale=1.0 / par.tp, host_scale=hs))
        lay, e_layer = got
        if e_layer:
            reasons.add("layer")
        if e_head:
            reasons.add("head")
        worst_ms = max(worst_ms, gpu_step_ms(lay, head, opt, comm, L, micro, par.pp, par.kind == "pp"))
        if memory:
            mem = max(mem, _memory(art, model, gpu_name, mix, par, micro, ckpt, L, breakdown, tab))
    return worst_ms / 1e3, tuple(sorted(reasons)), mem


def communication_ms(replicated, nano, all_reduce_ms, per_tensor_ms: float, tensors, gather_ms, tp_ms, synced,
                     sync_ms: float, micro, L):
    """One GPU's communication per step (ms) under a plan, written once over floats (``plan_step``)
    and arrays (``PlannerBatch``, per plan and row), absent collectives given as 0.0 ms::

        N x (all_reduce + per_tensor_ms x tensors)   where the adapters are replicated
        + B x L x all_gather                         (fsdp: a layer's weight matrices)
        + B x 4 L x all_reduce of activations        (tp)
        + sync_ms                                    where the plan communicates (``synced``)
    """
    comm = 0.0 + where(replicated, nano * (all_reduce_ms + per_tensor_ms * tensors), 0.0)
    comm = comm + micro * L * gather_ms
    comm = comm + micro * 4 * L * tp_ms
    return comm + where(synced, sync_ms, 0.0)


def gpu_step_ms(lay, head, opt, comm, L, micro, pp, piped):
    """One GPU's step (ms) under a plan from its layer, head, AdamW and communication (floats or
    arrays): ``B x (L x layer + head)``, or for a pipeline (``piped``, GPipe) ``(B + pp - 1) x L x
    layer + B x head``, plus AdamW and communication."""
    compute = where(piped, (micro + pp - 1) * L * lay + micro * head, micro * (L * lay + head))
    return compute + opt + comm


def _context(art: dict, key: str, model: str, gpu_name: str, plan: str, terms: dict | None) -> tuple:
    """What ``plan_step`` reads for every plan of one question: the model, the inter-node bandwidth,
    the multi-GPU terms, collectives and their reasons, the model's tables, the plan family's entry,
    and ``formula``'s optimizer time and memory breakdown."""
    if terms is not None:
        coll, why = Collectives(terms), ()
    else:
        terms, coll, why = _terms(gpu_name)
    tab = tables_of(key, model)
    pe = art["models"][model]["plans"][PLAN_FAMILY[plan]]
    return (get_model(model), GPUS[gpu_name].net_bw_bytes_s / 1e3, terms, coll, why, tab, pe, opt_ms, memory_breakdown)


def plan_memory(art: dict, key: str, model: str, gpu_name: str, members: tuple[Member, ...], par: Parallelism,
                micro: int, ckpt: bool) -> float:
    """Peak memory per GPU (bytes) of ``members`` under ``par``: ``plan_step``'s third value."""
    m = get_model(model)
    L = math.ceil(m.layers / par.pp)
    tab = tables_of(key, model)
    return max(_memory(art, model, gpu_name, mix, par, micro, ckpt, L, memory_breakdown, tab)
               for mix in per_gpu_mixes(members, par, micro))


def _memory(art, model, gpu_name, mix, par: Parallelism, micro: int, ckpt: bool, L: int, breakdown, tab) -> float:
    m = get_model(model)
    members = [Member(r, b * micro, s) for r, b, s in mix]
    parts = breakdown(art, model, gpu_name, members, 1, "fused" if len(mix) > 1 else "alone", micro, ckpt, tab)
    shard = {"fsdp": par.n_gpus, "tp": par.tp, "pp": par.pp}.get(par.kind, 1)
    parts["weights"] = 2.0 * m.params / shard
    frac = L / m.layers
    if par.kind == "pp":
        inflight = min(micro, par.pp)
        for k in ("checkpoints", "activations"):
            if k in parts:
                parts[k] *= frac * inflight
    if par.kind == "tp":
        parts["layer_live"] = parts.get("layer_live", 0.0) / par.tp
    return float(sum(parts.values()))


def best_plan(key: str, model: str, gpu_name: str, members: tuple[Member, ...], n: int, plan: str, nano: int,
              micro: int, ckpt: bool, forced: Parallelism | None = None, memo: dict | None = None
              ) -> tuple[Parallelism, float, tuple[str, ...], float]:
    """The planner: (plan, step s, reasons, memory bytes) of the fastest plan that fits the GPU's
    memory; where none fits, pipeline plans are added, and failing those the plan that needs the
    least memory is returned (the caller's memory check then rejects it). ``forced``: evaluate that
    plan only. ``memo``: the model's answer memo (``plan_step``'s; None: a fresh one); the
    answer itself is kept by the caller (``model.predict_of``)."""
    memo = {} if memo is None else memo
    art = registered(key)
    cap = GPUS[gpu_name].memory_bytes
    m = get_model(model)
    if forced is not None:
        s, r, mem = plan_step(art, key, model, gpu_name, members, forced, plan, nano, micro, ckpt, memo=memo)
        return forced, s, r, mem
    # Step times first; memory only in order of step time until a plan fits (the fastest plan
    # that fits, ties in candidate order, as taking the minimum over every fitting plan would).
    tried: list[list] = []  # [plan, step s, reasons, memory bytes or None until asked]

    def mem_of(t: list) -> float:
        if t[3] is None:
            t[3] = plan_memory(art, key, model, gpu_name, members, t[0], micro, ckpt)
        return t[3]

    # Plans that cannot come before a fitting ``dp`` in that order are not timed (``fits``: its
    # step, once it fits): ``fsdp`` (the same mix, layer, AdamW and all-reduce terms as ``dp``, plus
    # an all-gather >= 0, so a step >= dp's, and dp first among equals), and plans whose step
    # without the layer times already exceeds it (``plan_step``'s ``above``).
    for pipeline in (False, True):
        pool = [p for p in candidates(m, n, len(members), pipeline) if pipeline == (p.kind == "pp")]
        fits = None
        for par in pool:
            if fits is not None and par.kind == "fsdp":
                continue
            got = plan_step(art, key, model, gpu_name, members, par, plan, nano, micro, ckpt,
                            memory=False, memo=memo, above=fits)
            if got is None:
                continue
            tried.append([par, got[0], got[1], None])
            if par.kind == "dp" and math.isfinite(got[0]) and mem_of(tried[-1]) <= cap:
                fits = got[0]
        for t in sorted(tried, key=lambda t: t[1]):  # stable: candidate order among equal steps
            if mem_of(t) <= cap:
                return tuple(t)
    return tuple(min(tried, key=mem_of))


# ------------------------------------------------------------------ the vectorised lower bound
class PlannerBatch:
    """Vectorised lower bound of the ``fused`` planner step on ``n_gpus`` > 1 GPUs of one (base
    model, GPU type) under a profiled artifact. Build with ``PlannerBatch.of``.

    Attributes:
        WIDTH: columns of a row (an instance's: ``formula.WIDTH`` x the distinct data-parallel
            degrees ``ds`` of its plans).
        ds: the data-parallel degrees, in sub-row order.
        plans: the non-local plans ``step_times`` minimises over.
    """

    #: relative margin a bound must clear a threshold by before a caller acts on it (``formula.REL_MARGIN``).
    REL_MARGIN = REL_MARGIN
    WIDTH: int

    def __init__(self, cost_model, model: str, gpu_name: str, n_gpus: int):
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
        self.plans = tuple(p for p in candidates(m, n, 1, pipeline=True) if p.kind != "local")
        self.ds = tuple(sorted({p.dp for p in self.plans}, reverse=True))
        self.WIDTH = SUB * len(self.ds)
        shapes = sorted({(self.ds.index(p.dp), p.tp) for p in self.plans})  # distinct layer evaluations
        self._shape_k = np.array([k for k, _ in shapes])
        self._shape_g = np.array([1.0 / t for _, t in shapes])
        # per plan (J of them): its layer shape, degree, layers L, pipeline stages and whether it
        # is a pipeline, AdamW tensors, replicas of the adapter all-reduce, fsdp all-gather ms, tp
        # degree, whether it synchronises (``plan_step``'s terms, one micro-batch)
        J = []
        for p in self.plans:
            L = math.ceil(m.layers / p.pp)
            replicas = n if p.kind in ("dp", "fsdp", "tp") else p.dp
            gather = 0.0
            if p.kind == "fsdp":
                gather = sum(coll.time_ms("all_gather", 2.0 * i * o, n, self._net)[0] for _, i, o in m.linear_shapes)
            J.append((shapes.index((self.ds.index(p.dp), p.tp)), self.ds.index(p.dp), L, p.pp, p.kind == "pp",
                      LINEARS_PER_LAYER * L * adapter_tensors_per_linear("fused", 2), replicas, gather,
                      p.tp if p.kind == "tp" else 1, replicas > 1 or p.kind == "tp"))
        cols = list(zip(*J))
        self._j_shape, self._j_k = np.array(cols[0]), np.array(cols[1])
        self._j_L, self._j_pp, self._j_tensors, self._j_gather = (np.array(cols[i], float)[:, None] for i in (2, 3, 5, 7))
        self._j_piped, self._j_synced = np.array(cols[4], bool)[:, None], np.array(cols[9], bool)[:, None]
        self._j_replicated = np.array(cols[6])[:, None] > 1
        # adapter all-reduces: one per distinct (L, replicas > 1); tp activation all-reduces
        self._ar = sorted({(x[2], x[6]) for x in J if x[6] > 1})
        self._j_ar = [self._ar.index((x[2], x[6])) if x[6] > 1 else -1 for x in J]
        self._tp = [(j, t, x[1], x[2]) for j, x in enumerate(J) if (t := x[8]) > 1]
        xs, ys = coll.curves["all_reduce"]
        self._curve = (np.array(xs), np.array([math.log(v) for v in xs]), np.array([math.log(v) for v in ys]),
                       ys[0], Collectives.factor("all_reduce", 2))

    @classmethod
    def of(cls, cost_model, model: str, gpu_name: str, n_gpus: int) -> "PlannerBatch | None":
        """The batch for groups of ``model`` on ``n_gpus`` GPUs of type ``gpu_name``; None where the
        scalar model must answer alone: another cost model, a GPU type or model the artifact does
        not measure, a ``fused`` plan with a residual correction, or one GPU (``FusedBatch``)."""
        src = profiled_source(cost_model)
        if src is None or int(n_gpus) <= 1:
            return None
        art = src[0]
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
        ``formula.MAX_SEQ_LENS`` distinct sequence lengths into this instance."""
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
        head = fb.head_rows(tokens.reshape(-1)).reshape(-1, P)
        params = rows[:, LORA_PARAMS]
        L, tensors = self._j_L, self._j_tensors
        opt = opt_ms(self.art, params * L / m.layers, tensors)
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
            cms = collective_ms_rows(self._curve, np.concatenate(q_bytes), np.concatenate(q_n), net).reshape(-1, P)
        ar, tp = np.zeros((len(self.plans), P)), np.zeros((len(self.plans), P))
        for j, a in enumerate(self._j_ar):
            if a >= 0:
                ar[j] = cms[a]
        for q, (j, _, _, _) in enumerate(self._tp, start=len(self._ar)):
            tp[j] = cms[q]
        comm = communication_ms(self._j_replicated, nn[self._j_k], ar, self._per_tensor_ms, tensors, self._j_gather, tp,
                                self._j_synced, self._sync_ms, 1, L)
        return gpu_step_ms(lay[self._j_shape], head[self._j_k], opt, comm, L, 1, self._j_pp, self._j_piped) / 1e3

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
        opt = opt_ms(self.art, X[:, LORA_PARAMS] * L / L, LINEARS_PER_LAYER * L * adapter_tensors_per_linear("fused", 2))
        comm = communication_ms(False, nn, 0.0, self._per_tensor_ms, 0.0, 0.0, 0.0, False, self._sync_ms, 1, L)
        total = gpu_step_ms(lay, fb.head_rows(X[:, TOKENS]), opt, comm, L, 1, 1, False)
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
    choice: the least (load, index)); ``tests/costmodel/test_batch_multigpu.py`` checks they agree."""
    heap = [(0.0, k) for k in range(n_gpus)]  # sorted: a heap
    out = [0] * len(members)
    for i in sorted(range(len(members)), key=lambda i: (-members[i][1] * members[i][2], members[i][0], members[i][2])):
        load, k = heap[0]
        heapq.heapreplace(heap, (load + members[i][1] * members[i][2], k))
        out[i] = k
    return out


def collective_ms_rows(curve: tuple, nbytes: np.ndarray, n: np.ndarray, net: np.ndarray) -> np.ndarray:
    """``Collectives._time_ms`` of the all-reduce, vectorised (ms): ``nbytes`` the buffer (bytes),
    ``n`` the GPUs, ``net`` the inter-node bandwidth cap (bytes/ms; ``np.inf`` for none), all
    shape (Q,). ``curve``: (sizes, their logs, log times, latency floor, two-GPU bus factor) of a
    curve of >= 2 points (as the scalar needs)."""
    xs, lxs, lys, floor, f2 = curve
    x = np.clip(nbytes, xs[0], xs[-1])
    i = np.clip(np.searchsorted(xs, x, side="left"), 1, len(xs) - 1)
    w = (libm(math.log, x) - lxs[i - 1]) / (lxs[i] - lxs[i - 1])
    t = libm(math.exp, lys[i - 1] + w * (lys[i] - lys[i - 1]))  # the measured two-GPU time at x
    bw = np.where(t > floor, f2 * x / np.maximum(t - floor, 1e-6 * t), f2 * x / t)
    bw = np.minimum(bw, net)
    ring = floor * (n - 1) + (2.0 * (n - 1) / n) * nbytes / bw
    direct = (n == 2) & np.isinf(net) & (nbytes <= xs[-1])
    return np.where((n <= 1) | (nbytes <= 0), 0.0, np.where(direct, t, ring))


__all__ = ["PlannerBatch", "best_plan", "plan_memory", "plan_step"]
