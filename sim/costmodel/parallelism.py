"""Parallelism plans of a job or super-model group on several GPUs, their collective times, and
the planner that picks one (issue 17; docs/costmodel.md, "Multi-GPU jobs").

A *parallelism plan* says how a group's GPUs share the work (its name is what ``jobs.csv`` and
``costmodel predict`` print):

* ``dp<n>``: data parallel. A base replica per GPU; every adapter's sequences are spread over the
  ``n`` GPUs in whole sequences (the slowest GPU trains ``ceil(b / n)`` of an adapter's ``b``);
  adapter gradients all-reduced in one flat fp32 bucket after the backward.
* ``fsdp<n>``: FSDP / ZeRO-3 over the frozen base: each GPU keeps ``1 / n`` of every weight matrix
  and all-gathers a layer's matrices before its forward (kept for its backward: the frozen base
  needs no gradient reduce-scatter); adapters as in ``dp``.
* ``tp<t>[-dp<d>]``: Megatron tensor parallel inside a node (q, k, v, gate, up column-parallel;
  o, down row-parallel; LoRA on the shards): every GEMM and attention head split ``t`` ways, two
  all-reduces of activations per layer in the forward and two in the backward; ``d`` replicas.
* ``pp<p>[-dp<d>]``: pipeline stages of ``ceil(layers / p)`` layers, a GPipe schedule over the
  step's micro-batches (bubble ``p - 1`` stage times). Not measured: analytic, flagged, and
  offered only where no other plan fits memory.
* ``local<n>``: rank-local adapters (ALTO, arXiv 2604.05426): each adapter with all its sequences
  and its optimizer state on one GPU (longest-processing-time first by tokens), a base replica per
  GPU, no adapter all-reduce; the step is the slowest GPU's. Groups of >= 2 adapters only.

Collective times come from the two-GPU profile (``profiler/data/multigpu/``): its measured
all-reduce / all-gather curves by message size, fitted together with three host terms
(``profiler/fit_multigpu.py``: ``host_scale``, the eager step's host time with one training
process per GPU on a host, over the one-process profile; ``per_tensor_ms``, flattening and
unflattening one gradient tensor into the bucket; ``sync_ms``, a step's fixed synchronisation).
Beyond what was measured the curves are extrapolated and the prediction flagged:

* more than 2 GPUs in a node (``multigpu:gpus>2``): ring collectives, the bus bandwidth measured at
  that message size, the latency floor times ``n - 1`` ring steps;
* across nodes (``multigpu:inter-node``, more than ``GPUS_PER_NODE`` GPUs): the bus bandwidth capped
  at the GPU's network bandwidth (``sim/costmodel/hardware.py``: 400 Gb/s InfiniBand per GPU);
* a GPU type without its own two-GPU profile (``multigpu:gpu``; the H100 and H200 have one, the
  A100 not): the H200's (the H100 and H200 are both NVLink 4, 450 GB/s per GPU per direction,
  datasheets; the A100 NVLink 3);
* pipeline plans (``multigpu:pp``).
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

from tlora_sim.sim.costmodel.models import ModelSpec
from tlora_sim.sim.costmodel.profiled.artifact import data_dir
from tlora_sim.traces.errors import InputError

SCHEMA = "tlora-sim/multigpu/1"
GPUS_PER_NODE = 8
KINDS = ("dp", "fsdp", "tp", "pp", "local")


@dataclass(frozen=True, order=True)
class Parallelism:
    """One parallelism plan on ``n_gpus`` GPUs.

    Attributes:
        kind: one of ``KINDS``.
        n_gpus: GPUs of the job or group.
        tp: tensor-parallel degree (``kind == "tp"``), else 1.
        pp: pipeline stages (``kind == "pp"``), else 1.
    """

    kind: str
    n_gpus: int
    tp: int = 1
    pp: int = 1

    @property
    def dp(self) -> int:
        """Data-parallel degree: replicas of the (sharded) model (``local``: 1, each adapter on one GPU)."""
        return 1 if self.kind == "local" else self.n_gpus // (self.tp * self.pp)

    @property
    def name(self) -> str:
        """``dp8``, ``fsdp16``, ``tp2-dp4``, ``pp2``, ``local4``..."""
        if self.kind in ("tp", "pp"):
            deg = self.tp if self.kind == "tp" else self.pp
            return f"{self.kind}{deg}" + (f"-dp{self.dp}" if self.dp > 1 else "")
        return f"{self.kind}{self.n_gpus}"


def parse_parallelism(text: str, n_gpus: int) -> Parallelism:
    """A plan from its name (``dp8``, ``tp2-dp4``) or its kind alone (``dp``, ``fsdp``, ``tp``
    (tp = min(n, 8)), ``pp`` (pp = n), ``local``) on ``n_gpus`` GPUs.

    Raises:
        InputError: unknown kind, or degrees that do not multiply to ``n_gpus``.
    """
    t = text.strip().lower()
    parts = t.split("-")
    kind = parts[0].rstrip("0123456789")
    if kind not in KINDS:
        raise InputError(f"unknown parallelism {text!r}; kinds: {', '.join(KINDS)} (e.g. dp8, fsdp16, tp2-dp4)",
                         field="parallelism")
    deg = parts[0][len(kind):]
    dp = None
    if len(parts) == 2 and parts[1].startswith("dp") and parts[1][2:].isdigit():
        dp = int(parts[1][2:])
    elif len(parts) > 1:
        raise InputError(f"cannot read parallelism {text!r} (e.g. dp8, fsdp16, tp2-dp4)", field="parallelism")
    if kind in ("tp", "pp"):
        d = int(deg) if deg else (min(n_gpus, GPUS_PER_NODE) if kind == "tp" else n_gpus)
        p = Parallelism(kind, n_gpus, tp=d if kind == "tp" else 1, pp=d if kind == "pp" else 1)
        if d < 1 or n_gpus % d or (dp is not None and dp * d != n_gpus):
            raise InputError(f"parallelism {text!r} does not fit {n_gpus} GPUs", field="parallelism")
        return p
    if dp is not None or (deg and int(deg) != n_gpus):
        raise InputError(f"parallelism {text!r} does not fit {n_gpus} GPUs", field="parallelism")
    return Parallelism(kind, n_gpus)


def candidates(m: ModelSpec, n_gpus: int, n_members: int = 1, pipeline: bool = False) -> tuple[Parallelism, ...]:
    """The plans the planner weighs for ``n_gpus`` GPUs, in tie-break order: dp, fsdp, tp (2, 4, 8:
    inside a node, dividing the heads, KV heads and MLP width), local (groups of >= 2 adapters),
    and with ``pipeline`` the pipeline plans (2, 4, 8, ... stages dividing ``n_gpus``)."""
    n = int(n_gpus)
    if n <= 1:
        return (Parallelism("dp", 1),)
    out = [Parallelism("dp", n), Parallelism("fsdp", n)]
    for t in (2, 4, 8):
        if t <= min(n, GPUS_PER_NODE) and n % t == 0 and not (m.heads % t or m.kv_heads % t or m.ffn % t):
            out.append(Parallelism("tp", n, tp=t))
    if n_members >= 2:
        out.append(Parallelism("local", n))
    if pipeline:
        p = 2
        while p <= min(n, m.layers):
            if n % p == 0:
                out.append(Parallelism("pp", n, pp=p))
            p *= 2
    return tuple(out)


def per_gpu_mixes(members: Sequence[tuple[int, int, int]], par: Parallelism, micro: int = 1
                  ) -> list[list[tuple[int, float, int]]]:
    """Each GPU's (rank, sequences per micro-batch, seq_len) mix that sets the step: one mix (the
    slowest replica: ``ceil(b / dp)`` of each adapter's ``b`` sequences, whole sequences, then
    divided over ``micro`` micro-batches) for dp/fsdp/tp/pp; one per GPU for ``local``
    (adapters placed longest first on the least-loaded GPU by tokens)."""
    if par.kind != "local":
        return [[(r, math.ceil(b / par.dp) / micro, s) for r, b, s in members]]
    loads = [0.0] * par.n_gpus
    mixes: list[list] = [[] for _ in range(par.n_gpus)]
    for r, b, s in sorted(members, key=lambda x: (-x[1] * x[2], x[0], x[2])):
        i = min(range(par.n_gpus), key=lambda k: (loads[k], k))
        loads[i] += b * s
        mixes[i].append((r, b / micro, s))
    return [x for x in mixes if x]


# ------------------------------------------------------------------------------------ collectives
def multigpu_path(gpu: str, directory: str | Path | None = None) -> Path:
    """Where the fitted two-GPU terms of ``gpu`` live: ``profiler/data/multigpu_<gpu>.json``."""
    return Path(directory or data_dir()) / f"multigpu_{gpu.lower()}.json"


@lru_cache(maxsize=8)
def load_multigpu(gpu: str) -> tuple[dict | None, bool]:
    """(fitted multi-GPU terms for ``gpu``, measured on that GPU type?). Falls back to the H200's
    file (flagged) where ``gpu`` has none; (None, False) where no file exists.

    Raises:
        InputError: a file that is not JSON or has another schema.
    """
    for name, own in ((gpu, True), ("H200", False)):
        p = multigpu_path(name)
        if p.is_file():
            try:
                d = json.loads(p.read_text())
            except json.JSONDecodeError as e:
                raise InputError(f"not JSON ({e.msg})", file=str(p), row=e.lineno) from None
            if d.get("schema") != SCHEMA:
                raise InputError(f"schema {d.get('schema')!r}, expected {SCHEMA!r}", file=str(p))
            return d, own
    return None, False


class Collectives:
    """Collective times from measured two-GPU curves (``terms["curves"]``: op -> [[bytes, ms], ...]).

    ``time_ms(op, nbytes, n, inter_node_bw)`` for ``op`` in all_reduce, all_gather (``nbytes`` is the
    full tensor: the all-reduced buffer, the gathered output); returns (ms, extrapolated).
    """

    def __init__(self, terms: dict):
        self.curves = {}
        self._memo: dict[tuple, tuple[float, bool]] = {}  # time_ms answers (a pure function of its arguments)
        for op, pts in terms["curves"].items():
            pts = sorted((float(b), float(t)) for b, t in pts)
            self.curves[op] = ([b for b, _ in pts], [t for _, t in pts])

    @staticmethod
    def factor(op: str, n: int) -> float:
        """Bytes moved per byte of payload by a ring ``op`` on ``n`` GPUs: 2(n-1)/n for an
        all-reduce, (n-1)/n for an all-gather (the standard ring algorithms)."""
        return 2.0 * (n - 1) / n if op == "all_reduce" else (n - 1) / n

    def busbw(self, op: str, nbytes: float) -> tuple[float, float]:
        """(bus bandwidth in bytes/ms at ``nbytes``, latency floor ms) of the two-GPU curve: the
        measured time minus the floor, interpolated log-log; constant beyond the largest size."""
        xs, ys = self.curves[op]
        floor = ys[0]
        x = min(max(nbytes, xs[0]), xs[-1])
        i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
        w = (math.log(x) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
        t = math.exp(math.log(ys[i - 1]) + w * (math.log(ys[i]) - math.log(ys[i - 1])))
        f2 = self.factor(op, 2)
        return f2 * x / max(t - floor, 1e-6 * t) if t > floor else f2 * x / t, floor

    def time_ms(self, op: str, nbytes: float, n: int, net_bytes_ms: float | None = None) -> tuple[float, bool]:
        key = (op, nbytes, n, net_bytes_ms)
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) > 1 << 16:
                self._memo.clear()
            hit = self._memo[key] = self._time_ms(op, nbytes, n, net_bytes_ms)
        return hit

    def _time_ms(self, op: str, nbytes: float, n: int, net_bytes_ms: float | None) -> tuple[float, bool]:
        if n <= 1 or nbytes <= 0:
            return 0.0, False
        xs, ys = self.curves[op]
        if n == 2 and net_bytes_ms is None and nbytes <= xs[-1]:
            x = max(nbytes, xs[0])
            i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
            w = (math.log(x) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
            return math.exp(math.log(ys[i - 1]) + w * (math.log(ys[i]) - math.log(ys[i - 1]))), False
        bw, floor = self.busbw(op, nbytes)
        if net_bytes_ms is not None:
            bw = min(bw, net_bytes_ms)
        return floor * (n - 1) + self.factor(op, n) * nbytes / bw, True
