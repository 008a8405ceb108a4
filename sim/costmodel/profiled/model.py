"""The profiled cost model: predictions from measurements of real GPUs (no torch needed).

This module is the ``CostModel`` (``ProfiledCostModel``) and its one answer memo (``memo_of``:
every answer a step-time or memory query computes, keyed by the query); the package's other rooms: ``artifact.py`` (files,
checks, identity), ``tables.py`` (measured curves), ``formula.py`` (the step formula, scalar and
vectorised), ``multigpu.py`` (the planner on several GPUs and its vectorised bound).

An *artifact* (``profiler/data/costmodel_<gpu>.json``, written by ``tlora-sim costmodel fit``
from the CSVs of ``tlora-sim profile``; profiler/COSTMODEL.md) holds, per base model, measured
tables and fitted coefficients of one decoder layer on one GPU:

* ``l0``: the frozen layer without its attention block (forward + dX), ms by tokens, interpolated
  piecewise-linearly in log-log space (exact at the measured points);
* ``attn``: the attention block (rotary + causal SDPA, forward + backward), ms by sequence length
  and number of sequences, interpolated the same way (one SDPA call per distinct length);
* ``head``: embedding + final norm + LM head + fp32 cross-entropy, ms and peak bytes by tokens;
* ``plans``: per plan family (``loop``, which ``alone`` shares: one adapter in a loop is a job
  alone; ``fused``; and, where the artifact lists them in ``measured_plans``, ``lorafusion``
  (LoRAFusion's own kernels) and ``grouped`` (ALTO-style grouped GEMM)) the layer model ``smoothmax(gpu, host; p)``, where ``gpu`` = GPU part of l0 +
  GPU part of attention + ``coef . features`` (adapter work: tokens, rank x tokens, ranks, ...) and
  ``host`` = ``cpu0 + cpu_n x adapters + cpu_g x sequence-length groups``, the launch time of the
  eager step (fitted to measured host times); ``call_ms`` is the profiling harness's per-call
  overhead (one layer timed alone vs inside an 8-layer model), removed from ``host`` for layers
  inside a model; and the layer's measured peak working memory and saved activations, linear in
  the mix features;
* ``optimizer``: fused AdamW ms = const + per_mparam x params / 1e6 + per_tensor x tensors.

Group step on ``n`` GPUs (data parallel; each GPU trains every member on tokens / n), with ``B``
micro-batches and ``N`` nano-batches::

    step = B x (layers x layer(mix per GPU per micro-batch) + head(tokens per GPU / B))
           + AdamW(all adapter parameters) + communication

* measured: ``layer``, ``head``, AdamW (its tensor count: 7 x layers x the plan's tensors per
  linear, ``adapter_tensors_per_linear``: 2 for ``fused``/``grouped``, 1 + n for ``lorafusion``,
  2n for ``loop``/``alone``);
* analytic (``sim/costmodel/roofline.py``'s formulas): the all-reduce of adapter gradients and the
  all-gather of sharded frozen weights between GPUs; nano-batching (fused only: the base curve
  runs N times at tokens / N, the adapter term shrinks by N, the host time is paid N times);
  plans the artifact did not measure (``measured_plans``; the committed H100 and H200 artifacts
  measure all five) are the ``fused`` prediction times the roofline's ratio of the two
  (flagged); measured ``lorafusion``/``grouped`` on several GPUs go through the multi-GPU planner
  with their own one-GPU fits and the ``fused`` plan's CPU sharing (flagged,
  ``multigpu.py``). No fixed per-step framework overhead is added: the
  measured eager steps include kernel-launch and Python time (data loading is not modelled).
* ``alone`` with several members is the members' isolated steps one after another.

Outside the measured grid (tokens, ranks, adapters, sequence lengths beyond what was profiled)
each table is continued with the roofline's shape from its nearest edge (e.g. ``l0(T) =
l0(T_max) x roofline(T) / roofline(T_max)``) and the prediction is *flagged*: counted in
``describe()["extrapolated"]`` (distinct predictions; results are memoised) and reported per call
by ``predict``. For a GPU type without an artifact (or a model missing from it)
``factory.default_cost_model`` / the model fall back to the analytic ``RooflineCostModel``, whose ceilings
are scaled from datasheets (sim/core/cluster.py).

Memory per GPU (bytes), ``checkpointing=True`` (default, the roofline's convention): frozen
weights (bf16, sharded as in the roofline) + adapter state (16 B/param) + checkpointed layer inputs
(bf16) + one layer's measured peak working set + the head's measured peak + a 2 GiB workspace.
``checkpointing=False``: weights + adapter state as profiled (bf16 weights, grads, AdamW moments:
8 B/param) + every layer's measured saved activations + one layer's transient + the head; this
is the configuration that was timed, and it matches the end-to-end runs' peak memory within 2%.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tlora_sim.sim.costmodel import roofline as rf
from tlora_sim.sim.costmodel.hardware import GPUS
from tlora_sim.sim.costmodel.interface import Member, check_plan
from tlora_sim.sim.costmodel.models import get_model
from tlora_sim.sim.costmodel.parallelism import parse_parallelism
from tlora_sim.sim.costmodel.profiled.artifact import MEASURED_PLANS, PLAN_FAMILY, SCHEMA, TERMS, load_artifact, \
    measured_plans, plan_measured, register, registered, terms_now
from tlora_sim.sim.costmodel.profiled.formula import LINEARS_PER_LAYER, FusedBatch, adapter_tensors_per_linear, \
    layer_ms, memory_breakdown, opt_ms, per_gpu_mix, step_s
from tlora_sim.sim.costmodel.profiled.multigpu import PlannerBatch, best_plan
from tlora_sim.sim.costmodel.profiled.tables import remember, tables_of
from tlora_sim.traces.errors import InputError

LORAFUSION_MIN_RANK = 16
"""LoRAFusion's kernels size their tiles for the mix's largest rank, which must be a power of two
>= 16 (profiler/kernels/lorafusion_ext.py); a measured ``lorafusion`` prediction for a mix whose
largest rank is below this is flagged (reason ``lorafusion:max_rank<16``): no such mix was run."""


# ------------------------------------------------------------------------------------ the model
@dataclass(frozen=True)
class Prediction:
    """One prediction: step time (s), whether any term left the measured grid (and why), the
    parallelism plan (``sim/costmodel/parallelism.py`` name, e.g. ``dp1``, ``fsdp8``) and the
    peak memory per GPU under that plan (bytes; NaN where not computed with the step)."""

    step_time_s: float
    extrapolated: bool
    reasons: tuple[str, ...]
    parallelism: str = "dp1"
    memory_bytes: float = float("nan")


_MEMOS: dict[tuple[str, bool], dict] = {}
"""(artifact key, checkpointing) -> the one answer memo of the profiled models of that artifact."""
_ASKERS = itertools.count()
"""Numbers of ``ProfiledCostModel`` instances, in their ``("step", ...)`` queries (``memo_of``)."""


def memo_of(key: str, ckpt: bool) -> dict:
    """The one answer memo of the profiled models of the artifact registered under ``key``
    (``artifact.register``) with memory convention ``ckpt``: query tuple -> answer, shared by
    every instance (as the answers are pure functions of the query, their artifact and convention).
    It holds the public queries (``("step", asker, ...)``, ``("memory", ...)`` with the arguments as
    given; a step query names the instance that asked it, whose counters ``describe`` counts each
    distinct question once, when first asked of it), the normalised ones (``("predict", ...)``, ``("memory_of", ...)``) and the planner's
    parts (``multigpu.plan_step``'s keys); ``tables.remember`` empties it at 2^20 answers."""
    got = _MEMOS.get((key, ckpt))
    if got is None:
        got = _MEMOS[(key, ckpt)] = {}
    return got


class ProfiledCostModel:
    """Cost model from a profiled artifact (see the module docstring).

    Args:
        artifact: a loaded artifact (``load_artifact``) or a path to one.
        checkpointing: memory convention. True (default, as the roofline): per-layer activation
            checkpointing (layer inputs kept, one layer live). False: every layer keeps its
            measured saved activations, as in the profiled (and timed) steps; validated against the
            end-to-end runs' peak memory. Step times never include recomputation.
    """

    name = "profiled"

    def __init__(self, artifact: dict | str | Path, checkpointing: bool = True):
        self.checkpointing = bool(checkpointing)
        art = load_artifact(artifact) if not isinstance(artifact, dict) else artifact
        if art.get("schema") != SCHEMA:
            raise InputError(f"not a cost-model artifact (schema {art.get('schema')!r})")
        self.key = register(art)
        # this instance's counters (config.json): one count per distinct question asked of it
        self.stats = {"predictions": 0, "extrapolated": 0, "roofline_fallback": 0, "analytic_plan": 0,
                      "reasons": {}}
        self._counted: set = set()
        self.artifact = art
        self.gpu = art["gpu"]
        self.roofline = rf.RooflineCostModel()
        # the one answer memo (``memo_of``): the public questions by their arguments as given (no
        # validation, no sort: policies ask the same questions many times), the normalised ones
        # and the planner's parts; bounded, and pure, so it never changes an answer
        self.memo = memo_of(self.key, self.checkpointing)
        self._asker = next(_ASKERS)

    def __getstate__(self):
        return {"artifact": self.artifact, "checkpointing": self.checkpointing}

    def __setstate__(self, st):
        self.__init__(st["artifact"], st.get("checkpointing", True))

    # -- protocol
    def batch(self, model: str, gpu: str, n_gpus: int):
        """The vectorised ``fused`` step time for this kind of group, or None where it does not
        apply: one GPU, ``formula.FusedBatch``; several, ``multigpu.PlannerBatch``
        ( a lower bound of the planner's step, for refusals)."""
        return (FusedBatch if n_gpus == 1 else PlannerBatch).of(self, model, gpu, n_gpus)

    def describe(self) -> dict:
        """Identity, provenance, held-out error and extrapolation counters (config.json)."""
        a = self.artifact
        return {"name": self.name, "kind": "profiled", "artifact": a["id"], "version": a.get("version"),
                "gpu": a["gpu"], "path": _rel(a.get("_path", "")), "sha256": a.get("_sha256"),
                "created": a.get("created"), "source": a.get("source", {}), "heldout": a.get("heldout", {}),
                "models": sorted(a["models"]), "measured_plans": list(measured_plans(a)),
                "memory_convention": "per-layer activation checkpointing" if self.checkpointing
                else "no checkpointing (all saved activations)",
                "terms": terms_now(a.get("terms", TERMS)), "fallback": "roofline (sim/costmodel/roofline.py) for other GPU types and "
                                                           "models missing from the artifact",
                **{k: (dict(sorted(v.items())) if isinstance(v, dict) else v) for k, v in self.stats.items()}}

    def step_time_s(self, model: str, gpu: str, members: Sequence[Member], n_gpus: int, plan: str,
                    nano_batches: int = 1, micro_batches: int = 1) -> float:
        """Time of one group step (s); see the module docstring.

        Raises:
            InputError: unknown model, GPU or plan.
            ValueError: nano_batches or micro_batches below 1, or no members.
        """
        key = ("step", self._asker, model, gpu, tuple(members), n_gpus, plan, nano_batches, micro_batches)
        t = self.memo.get(key)
        if t is None:
            t = remember(self.memo, key,
                         self.predict(model, gpu, members, n_gpus, plan, nano_batches, micro_batches).step_time_s)
        return t

    def predict(self, model: str, gpu: str, members: Sequence[Member], n_gpus: int, plan: str,
                nano_batches: int = 1, micro_batches: int = 1, parallelism: str | None = None) -> Prediction:
        """Step time with its extrapolation flag and reasons, the parallelism plan and its memory.

        ``parallelism``: a plan name or kind (``parallelism.parse_parallelism``) to evaluate
        instead of the planner's choice.

        Raises:
            InputError: unknown model, GPU, plan or parallelism.
            ValueError: nano_batches or micro_batches below 1, or no members.
        """
        if nano_batches < 1 or micro_batches < 1 or not members or n_gpus < 1:
            raise ValueError(f"need members, n_gpus >= 1, nano_batches >= 1, micro_batches >= 1; got {len(members)}, "
                             f"{n_gpus}, {nano_batches}, {micro_batches}")
        get_model(model)
        if gpu not in GPUS:
            raise InputError(f"unknown GPU type {gpu!r}; known: {', '.join(GPUS)}", field="gpu")
        forced = None
        if parallelism is not None:
            forced = parse_parallelism(parallelism, int(n_gpus))
        args = (model, gpu, tuple(sorted(members)), int(n_gpus), check_plan(plan), int(nano_batches),
                int(micro_batches))
        pred = predict_of(self.memo, self.key, *args, self.checkpointing, forced)
        if args not in self._counted:
            self._counted.add(args)
            self._count(pred)
        return pred

    def parallelism(self, model: str, gpu: str, members: Sequence[Member], n_gpus: int, plan: str,
                    nano_batches: int = 1, micro_batches: int = 1) -> str:
        """The planner's parallelism plan for this group (``sim/costmodel/parallelism.py``), e.g. ``dp8``."""
        return self.predict(model, gpu, members, n_gpus, plan, nano_batches, micro_batches).parallelism

    def _count(self, pred: "Prediction") -> None:
        st = self.stats
        st["predictions"] += 1
        if pred.reasons:
            st["extrapolated"] += 1
            for r in pred.reasons:
                st["reasons"][r] = st["reasons"].get(r, 0) + 1
        st["roofline_fallback"] += any(r.startswith("roofline:") for r in pred.reasons)
        st["analytic_plan"] += any(r.startswith("analytic_plan:") for r in pred.reasons)

    def memory_bytes(self, model: str, gpu: str, members: Sequence[Member], n_gpus: int, plan: str,
                     micro_batches: int = 1) -> float:
        """Peak memory per GPU (bytes); see the module docstring."""
        key = ("memory", model, gpu, tuple(members), n_gpus, plan, micro_batches)
        b = self.memo.get(key)
        if b is not None:
            return b
        if micro_batches < 1 or not members or n_gpus < 1:
            raise ValueError("need members, n_gpus >= 1 and micro_batches >= 1")
        get_model(model)
        return remember(self.memo, key, memory_of(self.memo, self.key, model, gpu, tuple(sorted(members)), int(n_gpus),
                                                  check_plan(plan), int(micro_batches), self.checkpointing))

    def step_flops(self, model: str, members: Sequence[Member]) -> float:
        """Model FLOPs of one group step (analytic, as the roofline) (FLOP)."""
        return self.roofline.step_flops(model, members)

    def isolated_step_time_s(self, model: str, gpu: str, member: Member, n_gpus: int) -> float:
        """One job alone on its ``n_gpus`` GPUs with eager LoRA (plan ``alone``) (s)."""
        return self.step_time_s(model, gpu, (member,), n_gpus, "alone")

    # -- extras
    def layer_ms(self, model: str, members: Sequence[tuple], plan: str, nano: int = 1) -> tuple[float, bool]:
        """One layer (forward + backward) of a one-GPU mix of (rank, sequences, seq_len) (ms, flag)."""
        entry = self.artifact["models"][model]
        return layer_ms(tables_of(self.key, model), entry["plans"][PLAN_FAMILY[plan]], members, nano)


def _rel(p: str) -> str:
    try:
        return str(Path(p).resolve().relative_to(Path(__file__).resolve().parents[2]))
    except Exception:  # noqa: BLE001
        return p



def predict_of(memo: dict, key: str, model: str, gpu_name: str, members: tuple[Member, ...], n: int, plan: str,
               nano: int, micro: int, ckpt: bool = True, forced=None) -> Prediction:
    """The ``Prediction`` of a normalised question (members sorted, plan checked) to the artifact
    registered under ``key``, kept in ``memo`` (``memo_of(key, ckpt)``) under
    ``("predict", model, gpu_name, members, n, plan, nano, micro, forced)``."""
    q = ("predict", model, gpu_name, members, n, plan, nano, micro, forced)
    got = memo.get(q)
    if got is None:
        got = remember(memo, q, _predict(memo, key, model, gpu_name, members, n, plan, nano, micro, ckpt, forced))
    return got


def _predict(memo: dict, key: str, model: str, gpu_name: str, members: tuple[Member, ...], n: int, plan: str,
             nano: int, micro: int, ckpt: bool, forced) -> Prediction:
    art = registered(key)
    if gpu_name != art["gpu"] or model not in art["models"]:
        why = "gpu" if gpu_name != art["gpu"] else "model"
        name = rf.parallelism_of(model, gpu_name, n)
        return Prediction(rf.step_time_s_of(model, gpu_name, members, n, plan, nano, micro), True, (f"roofline:{why}",),
                          name)
    if plan == "alone" and len(members) > 1:
        parts = [predict_of(memo, key, model, gpu_name, (x,), n, plan, nano, micro, ckpt, forced) for x in members]
        reasons = tuple(sorted({r for p in parts for r in p.reasons}))
        return Prediction(sum(p.step_time_s for p in parts), bool(reasons), reasons, parts[0].parallelism,
                          max(p.memory_bytes for p in parts))
    if not plan_measured(art, model, plan):
        # not measured (lorafusion, grouped in the older artifacts): fused x roofline ratio
        base = predict_of(memo, key, model, gpu_name, members, n, "fused", nano, micro, ckpt, forced)
        ratio = (rf.step_time_s_of(model, gpu_name, members, n, plan, nano, micro)
                 / rf.step_time_s_of(model, gpu_name, members, n, "fused", nano, micro))
        reasons = tuple(sorted(set(base.reasons) | {f"analytic_plan:{plan}"}))
        return Prediction(base.step_time_s * ratio, True, reasons, base.parallelism, base.memory_bytes)
    if n > 1 or forced is not None:  # several GPUs: the planner (``multigpu.best_plan``)
        par, step, reasons, mem = best_plan(key, model, gpu_name, members, n, plan, nano, micro, ckpt, forced, memo)
        return Prediction(step, bool(reasons), reasons, par.name, mem)
    m = get_model(model)
    entry = art["models"][model]
    tab = tables_of(key, model)
    pe = entry["plans"][PLAN_FAMILY[plan]]
    if plan not in ("fused",):
        nano = 1
    mix = per_gpu_mix(members, n * micro)
    t_gpu = sum(b * s for _, b, s in mix)
    lay, e_layer = layer_ms(tab, pe, mix, nano, plan=plan)
    head, e_head = tab.head(t_gpu)
    n_tensors = LINEARS_PER_LAYER * m.layers * adapter_tensors_per_linear(plan, len(members))
    params = sum(m.lora_params(x.rank) for x in members)
    opt = opt_ms(art, params, n_tensors)
    step = step_s(micro, m.layers, lay, head, opt)
    reasons = (["layer"] if e_layer else []) + (["head"] if e_head else [])
    if plan == "lorafusion" and max(x.rank for x in members) < LORAFUSION_MIN_RANK:
        reasons.append("lorafusion:max_rank<16")  # its kernels cannot run this mix: never measured
    return Prediction(step, bool(reasons), tuple(reasons), "dp1")



def memory_of(memo: dict, key: str, model: str, gpu_name: str, members: tuple[Member, ...], n: int, plan: str,
              micro: int, ckpt: bool = True) -> float:
    """Peak memory per GPU (bytes) of a normalised question, kept in ``memo`` under
    ``("memory_of", model, gpu_name, members, n, plan, micro)``."""
    q = ("memory_of", model, gpu_name, members, n, plan, micro)
    got = memo.get(q)
    if got is None:
        got = remember(memo, q, _memory_of(memo, key, model, gpu_name, members, n, plan, micro, ckpt))
    return got


def _memory_of(memo: dict, key: str, model: str, gpu_name: str, members: tuple[Member, ...], n: int, plan: str,
               micro: int, ckpt: bool) -> float:
    art = registered(key)
    if gpu_name != art["gpu"] or model not in art["models"]:
        return rf.memory_bytes_of(model, gpu_name, members, n, micro)
    if n > 1:  # the memory of the planner's plan (chosen for one nano-batch)
        p = predict_of(memo, key, model, gpu_name, members, n, plan if plan in MEASURED_PLANS else "fused", 1, micro,
                       ckpt)
        if plan == "alone" or p.memory_bytes == p.memory_bytes:
            return float(p.memory_bytes)
    return float(sum(memory_breakdown(art, model, gpu_name, members, n, plan, micro, ckpt,
                                      tables_of(key, model)).values()))
