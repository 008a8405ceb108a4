"""The profiled model's step on several GPUs: one parallelism plan's time and memory, and the
planner that picks the plan (``sim/costmodel/parallelism.py`` says what the plans are).

Per plan, with the per-GPU mixes of ``parallelism.per_gpu_mixes`` (``B`` micro-batches, ``N``
nano-batches, ``L`` layers per GPU: all of them, or a pipeline stage's share)::

    step = max over GPUs of  B x (L x layer(mix; gpu x 1/tp, host x host_scale) + head(tokens))
                             + AdamW(its adapters) + communication
    communication = N x (all_reduce(4 B x adapter params, replicas) + per_tensor_ms x tensors)
                  + B x L x all_gather(a layer's weight matrices, n)        (fsdp)
                  + B x 4 L x all_reduce(2 B x tokens x hidden, tp)          (tp)
                  + sync_ms                                                  (plans that communicate)

``layer``, ``head`` and AdamW are the single-GPU profile's (``profiled.py``); the collective curves
and ``host_scale``, ``per_tensor_ms``, ``sync_ms`` are fitted to the two-GPU profile
(``profiler/fit_multigpu.py``). The gradient bucket is fp32 (4 bytes per adapter parameter), as in
the profiler. ``N`` is capped at the GPU's sequences per micro-batch (a nano-batch holds whole
sequences). Pipeline plans: GPipe, ``(B + p - 1)`` stage times plus the head per micro-batch.

Plans ``lorafusion`` and ``grouped`` (where the artifact measured them on one GPU) use their own
layer fit per GPU and the optimizer's tensor count of their adapter layout; the two-GPU profile
measured ``loop`` and ``fused`` only, so their ``host_scale`` is the ``fused`` plan's (reason
``multigpu:host_scale_of_fused:<plan>``).

Memory per GPU: ``profiled.memory_breakdown`` of the GPU's mix, with the frozen weights divided by
the plan's sharding (fsdp: n, tp: t, pp: p), checkpointed inputs by the stages, and for pipelines
``min(B, p)`` micro-batches in flight.
"""

from __future__ import annotations

import math
from functools import lru_cache

from tlora_sim.sim.costmodel.hardware import GPUS
from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.costmodel.models import get_model
from tlora_sim.sim.costmodel.parallelism import GPUS_PER_NODE, Collectives, Parallelism, candidates, load_multigpu, \
    per_gpu_mixes
from tlora_sim.sim.costmodel.profiled_tables import LINEARS_PER_LAYER, PLAN_FAMILY, adapter_tensors_per_linear, layer_ms

#: used where no two-GPU profile exists at all: no host contention, no per-tensor cost
_NO_TERMS = {"host_scale": 1.0, "per_tensor_ms": 0.0, "sync_ms": 0.0}


def _terms(gpu_name: str) -> tuple[dict, Collectives, tuple[str, ...]]:
    terms, own = load_multigpu(gpu_name)
    if terms is None:  # analytic curves from the datasheet link bandwidth (flagged)
        bw = GPUS[gpu_name].link_bw_bytes_s / 1e3
        lat = 0.02
        curves = {op: [[4096, lat + 4096 / bw], [1 << 30, lat + (1 << 30) / bw]] for op in ("all_reduce", "all_gather")}
        return {**_NO_TERMS, "curves": curves}, Collectives({"curves": curves}), ("multigpu:unmeasured",)
    return terms, _collectives(gpu_name), (() if own else ("multigpu:gpu",))


_PES: dict[int, dict] = {}
"""id -> plan-family entry whose layer times ``Tables.layer_memo`` holds (kept alive so an id is
never reused while its answers are kept)."""


@lru_cache(maxsize=8)
def _collectives(gpu_name: str) -> Collectives:
    return Collectives(load_multigpu(gpu_name)[0])


def plan_step(art: dict, key: str, model: str, gpu_name: str, members: tuple[Member, ...], par: Parallelism,
              plan: str, nano: int, micro: int, ckpt: bool, terms: dict | None = None,
              mixes: list | None = None, *, memory: bool = True, cache: dict | None = None,
              above: float | None = None) -> tuple[float, tuple[str, ...], float] | None:
    """(step time s, reasons it is extrapolated, peak memory per GPU bytes) of ``members`` under
    ``par``; ``art``/``key`` the profiled artifact and its key (``profiled.ProfiledCostModel.key``).

    ``terms``: fitted multi-GPU terms to use instead of the shipped file (the fit's trial values);
    ``mixes``: per-GPU mixes instead of ``per_gpu_mixes`` (the profiler's own placement of
    rank-local adapters, when predicting its rows). ``memory=False`` leaves the memory out
    (returned as NaN; ``plan_memory`` gives it). ``cache``: a dict shared by the calls of one
    planner question (same artifact, model, GPU type, members, plan, counts): the question's
    context (model, terms, tables), per-GPU mixes, each mix's sequences, tokens, head and adapter
    parameters, and optimizer times, computed once for the parallelism plans that share them
    (pure functions of their keys). ``above``: return None, without the layer times, where one
    GPU's step without them, ``(B x head + AdamW) + communication`` in s, already exceeds ``above``
    (the step adds ``B x L x layer >= 0`` to the first sum, the same floating-point operations
    otherwise, and rounding is monotone: the plan's step exceeds ``above`` too)."""
    cache = {} if cache is None else cache
    # what every plan of one question reads (the cache is one question's: same model, GPU type,
    # members, plan and counts); the fitted terms given as ``terms`` are not kept
    ctx = cache.get("ctx") if terms is None else None
    if ctx is None:
        ctx = _context(art, key, model, gpu_name, plan, terms)
        if terms is None:
            cache["ctx"] = ctx
    m, net_bw, terms, coll, why, tab, pe, pid, lmemo, opt_ms, breakdown = ctx
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
        mk = ("mixes", par.kind == "local", par.n_gpus if par.kind == "local" else par.dp, micro)
        mixes = cache.get(mk)
        if mixes is None:
            mixes = cache[mk] = per_gpu_mixes(members, par, micro)
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
        per = cache.get(mkey)
        if per is None:
            tokens = sum(b * s for _, b, s in mix)
            per = cache[mkey] = (sum(b for _, b, _ in mix), tokens, tab.head(tokens),
                                 sum(m.lora_params(r) for r, _, _ in mix))
        seqs, tokens, (head, e_head), params = per
        n_nano = max(1, min(nano, int(seqs))) if plan == "fused" else 1
        tensors = LINEARS_PER_LAYER * L * adapter_tensors_per_linear(plan, len(mix))
        okey = ("opt", params, L, tensors)
        opt = cache.get(okey)
        if opt is None:
            opt = cache[okey] = opt_ms(art, params * L / m.layers, tensors)
        comm = 0.0
        replicas = n if par.kind in ("dp", "fsdp", "tp") else (par.dp if par.kind == "pp" else 1)
        if replicas > 1:
            c, _ = coll.time_ms("all_reduce", 4.0 * params * L / m.layers, replicas, net)
            comm += n_nano * (c + float(terms["per_tensor_ms"]) * tensors)
        if par.kind == "fsdp":
            c = sum(coll.time_ms("all_gather", 2.0 * i * o, n, net)[0] for _, i, o in m.linear_shapes)
            comm += micro * L * c
        if par.kind == "tp":
            c, _ = coll.time_ms("all_reduce", 2.0 * tokens * m.hidden, par.tp)
            comm += micro * 4 * L * c
        if replicas > 1 or par.kind == "tp":
            comm += float(terms["sync_ms"])
        if above is not None and ((micro * head + opt) + comm) / 1e3 > above:
            return None
        lkey = (pid, plan, mkey, n_nano, par.tp, hs)
        got = lmemo.get(lkey)
        if got is None:
            if len(lmemo) >= 1 << 17:
                lmemo.clear()
            got = lmemo[lkey] = layer_ms(tab, pe, mix, n_nano, plan=plan, gpu_scale=1.0 / par.tp, host_scale=hs)
        lay, e_layer = got
        if e_layer:
            reasons.add("layer")
        if e_head:
            reasons.add("head")
        if par.kind == "pp":
            compute = (micro + par.pp - 1) * L * lay + micro * head
        else:
            compute = micro * (L * lay + head)
        worst_ms = max(worst_ms, compute + opt + comm)
        if memory:
            mem = max(mem, _memory(art, model, gpu_name, mix, par, micro, ckpt, L, breakdown, tab))
    return worst_ms / 1e3, tuple(sorted(reasons)), mem


def _context(art: dict, key: str, model: str, gpu_name: str, plan: str, terms: dict | None) -> tuple:
    """What ``plan_step`` reads for every plan of one question: the model, the inter-node bandwidth,
    the multi-GPU terms, collectives and their reasons, the model's tables, the plan family's entry
    and its id, the layer memo, and ``profiled``'s optimizer time and memory breakdown."""
    from tlora_sim.sim.costmodel.profiled import _opt_ms, memory_breakdown, tables_of  # profiled imports us

    if terms is not None:
        coll, why = Collectives(terms), ()
    else:
        terms, coll, why = _terms(gpu_name)
    tab = tables_of(key, model)
    # layer times kept across questions on the model's tables (a pure function of the key; the
    # plan family's entry ``pe`` by identity, kept alive by the artifact and by ``_PES``)
    pe = art["models"][model]["plans"][PLAN_FAMILY[plan]]
    pid = id(pe)
    _PES.setdefault(pid, pe)
    return (get_model(model), GPUS[gpu_name].net_bw_bytes_s / 1e3, terms, coll, why, tab, pe, pid, tab.layer_memo,
            _opt_ms, memory_breakdown)


def plan_memory(art: dict, key: str, model: str, gpu_name: str, members: tuple[Member, ...], par: Parallelism,
                micro: int, ckpt: bool) -> float:
    """Peak memory per GPU (bytes) of ``members`` under ``par``: ``plan_step``'s third value."""
    from tlora_sim.sim.costmodel.profiled import memory_breakdown, tables_of  # profiled imports us

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


@lru_cache(maxsize=1 << 16)
def best_plan(key: str, model: str, gpu_name: str, members: tuple[Member, ...], n: int, plan: str, nano: int,
              micro: int, ckpt: bool, forced: Parallelism | None = None
              ) -> tuple[Parallelism, float, tuple[str, ...], float]:
    """The planner: (plan, step s, reasons, memory bytes) of the fastest plan that fits the GPU's
    memory; where none fits, pipeline plans are added, and failing those the plan that needs the
    least memory is returned (the caller's memory check then rejects it). ``forced``: evaluate that
    plan only."""
    from tlora_sim.sim.costmodel.profiled import _ARTS

    art = _ARTS[key]
    cap = GPUS[gpu_name].memory_bytes
    m = get_model(model)
    if forced is not None:
        s, r, mem = plan_step(art, key, model, gpu_name, members, forced, plan, nano, micro, ckpt)
        return forced, s, r, mem
    # Step times first; memory only in order of step time until a plan fits (the fastest plan
    # that fits, ties in candidate order, as taking the minimum over every fitting plan would).
    tried: list[list] = []  # [plan, step s, reasons, memory bytes or None until asked]
    cache: dict = {}

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
                            memory=False, cache=cache, above=fits)
            if got is None:
                continue
            tried.append([par, got[0], got[1], None])
            if par.kind == "dp" and math.isfinite(got[0]) and mem_of(tried[-1]) <= cap:
                fits = got[0]
        for t in sorted(tried, key=lambda t: t[1]):  # stable: candidate order among equal steps
            if mem_of(t) <= cap:
                return tuple(t)
    return tuple(min(tried, key=mem_of))
