"""The profiled cost model: predictions from measurements of real GPUs (no torch needed).

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
  ``profiled_multigpu.py``). No fixed per-step framework overhead is added: the
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

import hashlib
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence


from tlora_sim.sim.costmodel import roofline as rf
from tlora_sim.sim.costmodel.hardware import GPUS
from tlora_sim.sim.costmodel.interface import Member, check_plan
from tlora_sim.traces.errors import InputError
from tlora_sim.sim.costmodel.models import get_model
from tlora_sim.sim.costmodel.profiled_tables import adapter_tensors_per_linear, measured_plans, plan_measured  # noqa: F401
from tlora_sim.sim.costmodel.profiled_tables import BUCKETS, FEATURES, LINEARS_PER_LAYER, MEASURED_PLANS, PLAN_FAMILY, SCHEMA, Tables, rank_bucket, correction_point, residual_correction, loglog_interp, log_table, roofline_head_ms, roofline_l0_ms, attention_ms, host_ms, layer_ms, mix_features, plan_term_ms, seq_groups, smoothmax  # noqa: F401

LORAFUSION_MIN_RANK = 16
"""LoRAFusion's kernels size their tiles for the mix's largest rank, which must be a power of two
>= 16 (profiler/kernels/lorafusion_ext.py); a measured ``lorafusion`` prediction for a mix whose
largest rank is below this is flagged (reason ``lorafusion:max_rank<16``): no such mix was run."""

# ------------------------------------------------------------------------------------ artifacts
def data_dir() -> Path:
    """``profiler/data`` (package data; torch-free)."""
    try:
        from importlib.resources import files

        p = Path(str(files("tlora_sim.profiler") / "data"))
        if p.is_dir():
            return p
    except Exception:  # noqa: BLE001
        pass
    return Path(__file__).resolve().parent.parent / "profiler" / "data"


def artifact_path(gpu: str, directory: str | Path | None = None) -> Path:
    """Where the artifact of GPU type ``gpu`` lives: ``costmodel_<gpu lower>.json``."""
    return Path(directory or data_dir()) / f"costmodel_{gpu.lower()}.json"


def load_artifact(path: str | Path) -> dict:
    """Read and check an artifact. Raises InputError on a missing file or wrong schema."""
    p = Path(path)
    try:
        if not p.is_file():
            raise InputError("cost-model artifact is not a regular file" if p.exists()
                             else "cost-model artifact: no such file", file=str(p))
        if p.stat().st_size > MAX_ARTIFACT_BYTES:
            raise InputError(f"cost-model artifact is larger than {MAX_ARTIFACT_BYTES >> 20} MiB: not an artifact",
                             file=str(p))
        with p.open("rb") as f:
            raw = f.read(MAX_ARTIFACT_BYTES + 1)
    except OSError as e:
        raise InputError(f"cannot read cost-model artifact: {e.strerror}", file=str(p)) from None
    if len(raw) > MAX_ARTIFACT_BYTES:
        raise InputError(f"cost-model artifact is larger than {MAX_ARTIFACT_BYTES >> 20} MiB: not an artifact",
                         file=str(p))
    try:
        art = json.loads(raw)
    except UnicodeDecodeError:
        raise InputError("cost-model artifact is not JSON (not UTF-8 text)", file=str(p)) from None
    except json.JSONDecodeError as e:
        raise InputError(f"cost-model artifact is not JSON ({e.msg})", file=str(p), row=e.lineno) from None
    if not isinstance(art, dict) or art.get("schema") != SCHEMA:
        got = art.get("schema") if isinstance(art, dict) else type(art).__name__
        raise InputError(f"cost-model artifact has schema {got!r}, expected {SCHEMA!r}", file=str(p))
    check_artifact(art, str(p))
    art["_path"], art["_sha256"] = str(p), hashlib.sha256(raw).hexdigest()
    return art


#: artifacts are small (the shipped ones 40-60 kB; a calibrated one adds its points): a file
#: larger than this is refused before it is read (e.g. ``--artifact /dev/zero``)
MAX_ARTIFACT_BYTES = 32 << 20

#: (path, type) pairs every artifact must have; ``*`` stands for every model / plan key.
_SHAPE = ((("id",), str), (("gpu",), str), (("models",), dict), (("optimizer", "coef"), dict),
          (("models", "*", "l0"), dict), (("models", "*", "head"), dict), (("models", "*", "attn"), dict),
          (("models", "*", "plans"), dict), (("models", "*", "plans", "*", "coef"), dict),
          (("models", "*", "plans", "*", "features"), list), (("models", "*", "plans", "*", "memory"), dict))


def check_artifact(art: dict, file: str) -> None:
    """Check that a loaded artifact has the fields the model reads, with the right types.

    Raises:
        InputError: naming the file and the first missing or mistyped field (a dotted path).
    """
    def walk(node, path, done):
        if not path:
            return [(done, node)]
        key, rest = path[0], path[1:]
        if key == "*":
            if not isinstance(node, dict) or not node:
                raise InputError("expected a non-empty object", file=file, field=".".join(done) or "<root>")
            return [x for k, v in node.items() for x in walk(v, rest, done + [str(k)])]
        if not isinstance(node, dict) or key not in node:
            raise InputError("missing", file=file, field=".".join(done + [key]))
        return walk(node[key], rest, done + [key])

    for path, typ in _SHAPE:
        for where, value in walk(art, list(path), []):
            if not isinstance(value, typ):
                raise InputError(f"expected {typ.__name__}, got {type(value).__name__}", file=file,
                                 field=".".join(where))
    _check_numbers(art, file)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _curve(node, field: str, file: str, x: str, need_positive: bool = True) -> None:
    """``node`` holds lists ``x`` and ``ms`` of one length >= 1, finite, x ascending, > 0."""
    if not isinstance(node, dict):
        raise InputError(f"expected an object, got {type(node).__name__}", file=file, field=field)
    for key in (x, "ms"):
        v = node.get(key)
        if not isinstance(v, list) or not v:
            raise InputError("missing or not a non-empty list", file=file, field=f"{field}.{key}")
        for k, e in enumerate(v):
            if not _finite(e) or (need_positive and e <= 0):
                raise InputError(f"expected a finite number > 0, got {e!r}", file=file, field=f"{field}.{key}[{k}]")
    if len(node[x]) != len(node["ms"]):
        raise InputError(f"{x} and ms differ in length", file=file, field=f"{field}.ms")
    if any(b <= a for a, b in zip(node[x], node[x][1:])):
        raise InputError("not strictly ascending", file=file, field=f"{field}.{x}")


def _check_numbers(art: dict, file: str) -> None:
    """The artifact's numbers the model computes with: finite (no NaN or infinity), the measured
    curves well formed (``_curve``). Raises InputError naming the field (a dotted path)."""
    for k, v in art["optimizer"]["coef"].items():
        if not _finite(v):
            raise InputError(f"expected a finite number, got {v!r}", file=file, field=f"optimizer.coef.{k}")
    for m, e in art["models"].items():
        _curve(e["l0"], f"models.{m}.l0", file, "tokens")
        _curve(e["head"], f"models.{m}.head", file, "tokens")
        if not e["attn"]:
            raise InputError("expected a non-empty object", file=file, field=f"models.{m}.attn")
        for s, v in e["attn"].items():
            if not str(s).isdigit() or int(s) < 1:
                raise InputError(f"expected a sequence length, got {s!r}", file=file, field=f"models.{m}.attn")
            _curve(v, f"models.{m}.attn.{s}", file, "seqs")
        for fam, pe in e["plans"].items():
            where = f"models.{m}.plans.{fam}"
            for k, v in pe["coef"].items():
                if not _finite(v):
                    raise InputError(f"expected a finite number, got {v!r}", file=file, field=f"{where}.coef.{k}")
            for k in ("cpu0", "cpu_n", "cpu_g", "call_ms", "call_ms_alone", "p", "nano_host"):
                if k in pe and (not _finite(pe[k]) or pe[k] < 0):
                    raise InputError(f"expected a finite number >= 0, got {pe[k]!r}", file=file, field=f"{where}.{k}")
            for part in ("peak", "saved"):
                mem = pe["memory"].get(part, {})
                if not isinstance(mem, dict):
                    raise InputError("expected an object", file=file, field=f"{where}.memory.{part}")
                for k, v in mem.items():
                    if not _finite(v):
                        raise InputError(f"expected a finite number, got {v!r}", file=file,
                                         field=f"{where}.memory.{part}.{k}")



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


_ARTS: dict[str, dict] = {}
_MEMO_MAX = 1 << 18  # entries of each per-instance answer memo


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
        self.key = f"{art['id']}:{art.get('_sha256', id(art))}"
        _ARTS[self.key] = art
        # this instance's counters (config.json): one count per distinct question asked of it
        self.stats = {"predictions": 0, "extrapolated": 0, "roofline_fallback": 0, "analytic_plan": 0,
                      "reasons": {}}
        self._counted: set = set()
        self.artifact = art
        self.gpu = art["gpu"]
        self.roofline = rf.RooflineCostModel()
        # answers by the arguments as given (no validation, no sort): policies ask the same
        # questions many times; bounded, and pure, so it never changes an answer
        self._step_memo: dict = {}
        self._mem_memo: dict = {}

    def __getstate__(self):
        return {"artifact": self.artifact, "checkpointing": self.checkpointing}

    def __setstate__(self, st):
        self.__init__(st["artifact"], st.get("checkpointing", True))

    # -- protocol
    def batch(self, model: str, gpu: str, n_gpus: int):
        """The vectorised ``fused`` step time for this kind of group, or None where it does not
        apply: one GPU, ``FusedBatch`` (``sim/costmodel/batch.py``); several, ``PlannerBatch``
        (``sim/costmodel/batch_multigpu.py``: a lower bound of the planner's step, for refusals)."""
        from tlora_sim.sim.costmodel.batch import FusedBatch  # batch imports this module
        from tlora_sim.sim.costmodel.batch_multigpu import PlannerBatch

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
                "terms": _terms_now(a.get("terms", TERMS)), "fallback": "roofline (sim/costmodel/roofline.py) for other GPU types and "
                                                           "models missing from the artifact",
                **{k: (dict(sorted(v.items())) if isinstance(v, dict) else v) for k, v in self.stats.items()}}

    def step_time_s(self, model: str, gpu: str, members: Sequence[Member], n_gpus: int, plan: str,
                    nano_batches: int = 1, micro_batches: int = 1) -> float:
        """Time of one group step (s); see the module docstring.

        Raises:
            InputError: unknown model, GPU or plan.
            ValueError: nano_batches or micro_batches below 1, or no members.
        """
        key = (model, gpu, tuple(members), n_gpus, plan, nano_batches, micro_batches)
        t = self._step_memo.get(key)
        if t is None:
            t = self.predict(model, gpu, members, n_gpus, plan, nano_batches, micro_batches).step_time_s
            if len(self._step_memo) >= _MEMO_MAX:
                self._step_memo.clear()
            self._step_memo[key] = t
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
            from tlora_sim.sim.costmodel.parallelism import parse_parallelism

            forced = parse_parallelism(parallelism, int(n_gpus))
        args = (model, gpu, tuple(sorted(members)), int(n_gpus), check_plan(plan), int(nano_batches),
                int(micro_batches))
        pred = predict_cached(self.key, *args, self.checkpointing, forced)
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
        key = (model, gpu, tuple(members), n_gpus, plan, micro_batches)
        b = self._mem_memo.get(key)
        if b is not None:
            return b
        if micro_batches < 1 or not members or n_gpus < 1:
            raise ValueError("need members, n_gpus >= 1 and micro_batches >= 1")
        get_model(model)
        b = memory_bytes_of(self.key, model, gpu, tuple(sorted(members)), int(n_gpus), check_plan(plan),
                    int(micro_batches), self.checkpointing)
        if len(self._mem_memo) >= _MEMO_MAX:
            self._mem_memo.clear()
        self._mem_memo[key] = b
        return b

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


TERMS = {"measured": ["decoder layer forward+backward per mix and plan (l0 + attention + adapter term)",
                      "embedding + LM head + loss", "AdamW step", "layer and head peak working memory"],
         "analytic": ["gradient all-reduce and sharded-weight all-gather (sim/costmodel/roofline.py formulas)",
                      "nano-batch overlap", "plans lorafusion/grouped (fused x roofline ratio)",
                      "frozen weights, adapter state (16 B/param), checkpointed layer inputs, 2 GiB workspace"]}


_OLD_MULTI = "several GPUs: fused x roofline ratio"
SEED_PLANS_MULTI_GPU = "several GPUs: their one-GPU fit inside the planner, with the fused plan's CPU sharing"
"""How measured ``lorafusion``/``grouped`` are priced on several GPUs (the artifact's term text,
``profiler/fit.py``)."""


def _terms_now(terms: dict) -> dict:
    """An artifact's term list as this code uses it: artifacts fitted before the multi-GPU planner
    priced ``lorafusion``/``grouped`` with their own fits say those plans are a roofline ratio on
    several GPUs; that text is replaced by what is done now (the measurements are the same)."""
    return {k: [t.replace(_OLD_MULTI, SEED_PLANS_MULTI_GPU) for t in v] for k, v in terms.items()}


def _rel(p: str) -> str:
    try:
        return str(Path(p).resolve().relative_to(Path(__file__).resolve().parent.parent))
    except Exception:  # noqa: BLE001
        return p


@lru_cache(maxsize=64)
def tables_of(key: str, model: str) -> Tables:
    art = _ARTS[key]
    return Tables(model, art["gpu"], art["models"][model])


def _opt_ms(art: dict, params: float, tensors: float) -> float:
    c = art["optimizer"]["coef"]
    return c["const"] + c["per_mparam"] * params / 1e6 + c["per_tensor"] * tensors


def _per_gpu(members: tuple[Member, ...], div: float) -> list[tuple[int, float, int]]:
    return [(x.rank, x.batch_size / div, x.seq_len) for x in members]


@lru_cache(maxsize=1 << 18)
def predict_cached(key: str, model: str, gpu_name: str, members: tuple[Member, ...], n: int, plan: str,
                   nano: int, micro: int, ckpt: bool = True, forced=None) -> Prediction:
    art = _ARTS[key]
    if gpu_name != art["gpu"] or model not in art["models"]:
        why = "gpu" if gpu_name != art["gpu"] else "model"
        name = rf.parallelism_of(model, gpu_name, n)
        return Prediction(rf.step_time_s_of(model, gpu_name, members, n, plan, nano, micro), True, (f"roofline:{why}",),
                          name)
    if plan == "alone" and len(members) > 1:
        parts = [predict_cached(key, model, gpu_name, (x,), n, plan, nano, micro, ckpt, forced) for x in members]
        reasons = tuple(sorted({r for p in parts for r in p.reasons}))
        return Prediction(sum(p.step_time_s for p in parts), bool(reasons), reasons, parts[0].parallelism,
                          max(p.memory_bytes for p in parts))
    if not plan_measured(art, model, plan):
        # not measured (lorafusion, grouped in the older artifacts): fused x roofline ratio
        base = predict_cached(key, model, gpu_name, members, n, "fused", nano, micro, ckpt, forced)
        ratio = (rf.step_time_s_of(model, gpu_name, members, n, plan, nano, micro)
                 / rf.step_time_s_of(model, gpu_name, members, n, "fused", nano, micro))
        reasons = tuple(sorted(set(base.reasons) | {f"analytic_plan:{plan}"}))
        return Prediction(base.step_time_s * ratio, True, reasons, base.parallelism, base.memory_bytes)
    if n > 1 or forced is not None:  # several GPUs: the planner (sim/costmodel/profiled_multigpu.py)
        from tlora_sim.sim.costmodel.profiled_multigpu import best_plan

        par, step, reasons, mem = best_plan(key, model, gpu_name, members, n, plan, nano, micro, ckpt, forced)
        return Prediction(step, bool(reasons), reasons, par.name, mem)
    m, gpu = get_model(model), GPUS[gpu_name]
    entry = art["models"][model]
    tab = tables_of(key, model)
    pe = entry["plans"][PLAN_FAMILY[plan]]
    if plan not in ("fused",):
        nano = 1
    mix = _per_gpu(members, n * micro)
    t_gpu = sum(b * s for _, b, s in mix)
    lay, e_layer = layer_ms(tab, pe, mix, nano, plan=plan)
    head, e_head = tab.head(t_gpu)
    n_tensors = LINEARS_PER_LAYER * m.layers * adapter_tensors_per_linear(plan, len(members))
    params = sum(m.lora_params(x.rank) for x in members)
    opt = _opt_ms(art, params, n_tensors)
    step = micro * (m.layers * lay + head) / 1e3 + opt / 1e3
    reasons = (["layer"] if e_layer else []) + (["head"] if e_head else [])
    if plan == "lorafusion" and max(x.rank for x in members) < LORAFUSION_MIN_RANK:
        reasons.append("lorafusion:max_rank<16")  # its kernels cannot run this mix: never measured
    return Prediction(step, bool(reasons), tuple(reasons), "dp1")


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
    mix = _per_gpu(tuple(members), n * micro)
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


@lru_cache(maxsize=1 << 18)
def memory_bytes_of(key: str, model: str, gpu_name: str, members: tuple[Member, ...], n: int, plan: str, micro: int,
            ckpt: bool = True) -> float:
    art = _ARTS[key]
    if gpu_name != art["gpu"] or model not in art["models"]:
        return rf.memory_bytes_of(model, gpu_name, members, n, micro)
    if n > 1:  # the memory of the planner's plan (chosen for one nano-batch)
        p = predict_cached(key, model, gpu_name, members, n, plan if plan in MEASURED_PLANS else "fused", 1, micro,
                           ckpt)
        if plan == "alone" or p.memory_bytes == p.memory_bytes:
            return float(p.memory_bytes)
    return float(sum(memory_breakdown(art, model, gpu_name, members, n, plan, micro, ckpt,
                                      tables_of(key, model)).values()))
