"""Real LoRA training on one device for the real-time executor (needs torch).

Each base model lives once on the device (``profiler/layer.py``'s decoder layers with random
weights, an embedding, a final norm and an LM head: the model's full shape, or the tiny shape with
``tiny``). A *group* is one super-model over that base: a ``LoRASet`` per layer for its members
under the plan's implementation (``fused``: our Triton kernel; ``alone`` and ``loop``: the eager
per-adapter loop, as the profiler runs them; other plans run the fused kernel), one AdamW over its
adapters, random tokens of each member's sequences, and fp32 cross-entropy.

Every job's adapter weights and AdamW moments live on the host between groups (``AdapterState``:
per layer and projection, ``A`` (r, d_in) and ``B`` (r, d_out)); building a group copies its
members' states in, ``save`` copies them out: the checkpoint/restore of a regroup, done for real.
Each times itself (``GroupTrainer.build_ms``; ``save`` returns its ms): on the virtual clock
(``sim/executor/clock.py``) those are what the executor charges a rebuild, as a step's own
returned time is what it charges the step.
``step(nano, micro)`` runs one optimizer step (``nano`` x ``micro`` > 1: tLoRA's nano-batches or
LoRAFusion's micro-batches, the sequences cut into that many whole-sequence parts run one after
another, gradients accumulated) and returns its wall time (ms, synchronised).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from tlora_sim.profiler.layer import TINY, BaseWeights, LoRASet, layer_forward, rmsnorm, shape_of, sync
from tlora_sim.profiler.multigpu import nano_slices

#: ``tiny`` runs divide every sequence length by this (the policies still see the job's own)
TINY_SEQ_DIV = 64
#: the implementation that runs each execution plan
IMPL = {"alone": "loop", "loop": "loop", "fused": "fused", "lorafusion": "fused", "grouped": "fused"}


@dataclass
class AdapterState:
    """One job's adapter on the host: weights and AdamW moments by (layer, projection)."""

    A: dict = field(default_factory=dict)
    B: dict = field(default_factory=dict)
    mA: dict = field(default_factory=dict)
    vA: dict = field(default_factory=dict)
    mB: dict = field(default_factory=dict)
    vB: dict = field(default_factory=dict)
    steps: int = 0


class DeviceTrainer:
    """Base models and adapter states on one device.

    Args:
        device: ``"cuda"`` / ``"cuda:1"`` or ``"cpu"``.
        tiny: train the tiny shape (``profiler.layer.TINY``) whatever the job's model says, on
            sequences ``TINY_SEQ_DIV`` times shorter.
    """

    def __init__(self, device: str, tiny: bool = False):
        self.device = torch.device(device)
        self.tiny = tiny
        self._bases: dict[str, tuple] = {}
        self.states: dict[int, AdapterState] = {}

    def base(self, model: str):
        """(layers, embedding, head, final norm, shape) of ``model`` on the device, built once."""
        if model not in self._bases:
            from tlora_sim.sim.costmodel.models import get_model

            sh = TINY if self.tiny else shape_of(get_model(model))
            dev = self.device
            layers = [BaseWeights(sh, dev, seed=100 + i) for i in range(sh.layers)]
            g = torch.Generator(device=dev).manual_seed(11)
            emb = (torch.randn(sh.vocab, sh.hidden, device=dev, generator=g) * 0.02).to(torch.bfloat16)
            head = (torch.randn(sh.vocab, sh.hidden, device=dev, generator=g) / math.sqrt(sh.hidden)).to(torch.bfloat16)
            nf = torch.ones(sh.hidden, device=dev, dtype=torch.bfloat16)
            self._bases[model] = (layers, emb, head, nf, sh)
            sync(dev)
        return self._bases[model]

    def release(self) -> None:
        """Return the freed blocks of a dismantled group to the device (CUDA allocator cache)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def group(self, model: str, plan: str, members: list[tuple[int, int, int, int]]) -> "GroupTrainer":
        """A group of ``members`` (job index, rank, sequences, seq_len) with their saved states."""
        return GroupTrainer(self, model, plan, members)


class GroupTrainer:
    """One running super-model on the device (see the module docstring)."""

    #: wall ms this group's construction took (members' states restored, optimizer and tokens
    #: made; host time, not device-synchronised): what a rebuild costs on the virtual clock
    build_ms = 0.0

    def __init__(self, trainer: DeviceTrainer, model: str, plan: str, members: list[tuple[int, int, int, int]]):
        w0 = time.perf_counter()
        self.trainer, self.plan, self.impl = trainer, plan, IMPL[plan]
        self.jobs = [m[0] for m in members]
        # tiny: 1/64 of each sequence (at least 4 tokens), so the Triton interpreter runs in seconds
        self.mix = [(r, b, max(4, s // TINY_SEQ_DIV) if trainer.tiny else s) for _, r, b, s in members]
        layers, self.emb, self.head, self.nf, self.shape = trainer.base(model)
        self.layers = layers
        dev = trainer.device
        self.loras = [LoRASet(b, self.mix, self.impl, seed=1 + i) for i, b in enumerate(layers)]
        self._offs = [sum(self.loras[0].ranks[:k]) for k in range(len(self.mix))]
        for j in self.jobs:  # a job met for the first time keeps the adapter LoRASet drew for it
            if j not in trainer.states:
                trainer.states[j] = None
        self._restore()
        params = [p for lo in self.loras for p in lo.params]
        kw = {"fused": True} if dev.type == "cuda" else {"foreach": True}
        self.opt = torch.optim.AdamW(params, lr=1e-4, **kw)
        self._restore_moments()
        T = sum(b * s for _, b, s in self.mix)
        g = torch.Generator(device=dev).manual_seed(7 + len(self.jobs))
        vocab = self.emb.shape[0]
        self.idx = torch.randint(0, vocab, (T,), device=dev, generator=g)
        self.lab = torch.randint(0, vocab, (T,), device=dev, generator=g)
        self.build_ms = (time.perf_counter() - w0) * 1e3

    # -- adapter state in and out
    def _pieces(self, lo: LoRASet, name: str, k: int):
        """(A view (r, d_in), B view (r, d_out)) of member k in ``lo``'s parameters."""
        if self.impl == "fused":
            o, r = self._offs[k], self.mix[k][0]
            return lo.A[name][o:o + r], lo.B[name][o:o + r]
        return lo.A[name][k], lo.B[name][k].t()

    def _restore(self) -> None:
        st = self.trainer.states
        with torch.no_grad():
            for k, j in enumerate(self.jobs):
                s = st[j]
                for li, lo in enumerate(self.loras):
                    for name, _i, _o in self.shape.linear_shapes():
                        a, b = self._pieces(lo, name, k)
                        if s is None:
                            continue
                        a.copy_(s.A[(li, name)], non_blocking=True)
                        b.copy_(s.B[(li, name)], non_blocking=True)

    def _restore_moments(self) -> None:
        st = self.trainer.states
        if not any(st[j] is not None and st[j].steps for j in self.jobs):
            return
        dev = self.trainer.device
        for li, lo in enumerate(self.loras):
            for name, _i, _o in self.shape.linear_shapes():
                for which, params in (("A", lo.A[name]), ("B", lo.B[name])):
                    ps = [params] if self.impl == "fused" else params
                    for k0, p in enumerate(ps):
                        ks = range(len(self.jobs)) if self.impl == "fused" else [k0]
                        m, v = torch.zeros_like(p), torch.zeros_like(p)
                        steps = 0
                        for k in ks:
                            s = st[self.jobs[k]]
                            if s is None or not s.steps:
                                continue
                            steps = max(steps, s.steps)
                            key = (li, name)
                            mk, vk = (s.mA, s.vA) if which == "A" else (s.mB, s.vB)
                            if self.impl == "fused":
                                o, r = self._offs[k], self.mix[k][0]
                                m[o:o + r].copy_(mk[key]), v[o:o + r].copy_(vk[key])
                            else:
                                m.copy_(mk[key] if which == "A" else mk[key].t())
                                v.copy_(vk[key] if which == "A" else vk[key].t())
                        if steps:
                            self.opt.state[p] = {"step": torch.tensor(float(steps), device=dev if dev.type == "cuda"
                                                                      else "cpu"), "exp_avg": m, "exp_avg_sq": v}

    def save(self) -> float:
        """Copy every member's adapter and AdamW moments to the host; the wall ms it took (host
        time: the copies to the host are synchronous), what a save costs on the virtual clock."""
        w0 = time.perf_counter()
        for k, j in enumerate(self.jobs):
            self.trainer.states[j] = self._state_of(k, self.trainer.states.get(j))
        return (time.perf_counter() - w0) * 1e3

    def _state_of(self, k: int, prev: AdapterState | None) -> AdapterState:
        s = AdapterState(steps=(prev.steps if prev else 0) + self._steps)
        host = "cpu"
        for li, lo in enumerate(self.loras):
            for name, _i, _o in self.shape.linear_shapes():
                a, b = self._pieces(lo, name, k)
                s.A[(li, name)], s.B[(li, name)] = a.detach().to(host, copy=True), b.detach().to(host, copy=True)
                pa = lo.A[name] if self.impl == "fused" else lo.A[name][k]
                pb = lo.B[name] if self.impl == "fused" else lo.B[name][k]
                for p, mm, vv, is_b in ((pa, s.mA, s.vA, False), (pb, s.mB, s.vB, True)):
                    state = self.opt.state.get(p)
                    if not state:
                        continue
                    m, v = state["exp_avg"], state["exp_avg_sq"]
                    if self.impl == "fused":
                        o, r = self._offs[k], self.mix[k][0]
                        m, v = m[o:o + r], v[o:o + r]
                    elif is_b:
                        m, v = m.t(), v.t()
                    mm[(li, name)], vv[(li, name)] = m.detach().to(host, copy=True), v.detach().to(host, copy=True)
        return s

    _steps = 0
    #: called with every adapter parameter after the backward, before the optimizer step (a
    #: data-parallel worker all-reduces the gradients there: ``sim/executor/workers.py``)
    grad_hook = None

    # -- one optimizer step
    def step(self, nano: int = 1, micro: int = 1) -> float:
        """One optimizer step over every member's sequences, run as ``micro`` x ``nano`` sequential
        whole-sequence parts with gradients accumulated (``micro`` micro-batches of ``nano``
        nano-batches: on one device both are parts run one after another); its wall time (ms,
        device synchronised). A member with 0 sequences here (a data-parallel replica's share)
        keeps its adapter and trains no tokens; ``grad_hook`` runs before the optimizer step."""
        dev = self.trainer.device
        t0 = time.perf_counter()
        slices = nano_slices(self.mix, max(1, nano) * max(1, micro), self.loras[0], self.impl, dev)
        for members, segs, plans, tok0, tok1 in slices:
            if tok1 == tok0:  # a data-parallel replica holding none of these sequences
                continue
            members = [m for m in members if m[1]]  # attention over the sequences present
            for lo in self.loras:
                lo.members, lo.segs = members, segs
                if plans is not None:
                    lo.plan = plans
            x = self.emb[self.idx[tok0:tok1]]
            for b, lo in zip(self.layers, self.loras):
                x = layer_forward(b, lo, x)
            loss = F.cross_entropy(F.linear(rmsnorm(x, self.nf), self.head).float(), self.lab[tok0:tok1])
            loss.backward()
        if self.grad_hook is not None:
            self.grad_hook([p for lo in self.loras for p in lo.params])
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        sync(dev)
        self._steps += 1
        return (time.perf_counter() - t0) * 1e3


def warm_up(trainer: DeviceTrainer, model: str, plan: str, shapes, ranks) -> None:
    """Steps of ``plan`` on ``model`` before an executed run's clock starts, so that the kernels' JIT
    compilation and autotuning do not land in its first jobs' steps: one step of every job shape
    in ``shapes`` ((rank, sequences, seq_len)) alone, then one of a group over all ``ranks`` at 64
    tokens. A 64-token group alone was not enough: the fused kernels take another path above a few
    hundred tokens and the frozen GEMM another above 2,048, so on a machine with a cold Triton cache
    the first real step compiled them (H200, 2026-12-02: a 4.4-s first step of workload B's first
    job; 0.1-0.4 s on a warm machine). Saved states are cleared afterwards."""
    shapes = sorted(set(map(tuple, shapes)))
    for k, (r, b, s) in enumerate(shapes):
        trainer.group(model, plan, [(-1 - k, int(r), int(b), int(s))]).step()
    trainer.group(model, plan, [(-1 - k, int(r), 1, 64) for k, r in enumerate(sorted(set(ranks)))]).step()
    trainer.states.clear()
