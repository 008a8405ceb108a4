"""The ways people train many LoRA adapters on one frozen linear layer today, next to ours, with
one interface so that ``bench/kernels.py`` times them side by side.

Every implementation computes, for adapters i with contiguous token segments of x (M, K),
``y = x W^T + s_i drop(x_i) A_i B_i`` (docs/kernel.md "Fused multi-LoRA kernel"; Hu et al. 2021 eq. 3)
and one training step's gradients (dX, dA_i, dB_i; W frozen), through ``torch.autograd.grad``
(nothing accumulates into ``.grad``, so graph-captured replays repeat the same work):

* ``base``   the frozen base layer alone (forward + dX): the floor every other one pays.
* ``alone``  each job alone: its own base GEMM plus eager LoRA, jobs one after another.
* ``loop``   mLoRA style: one base GEMM over all tokens, a torch loop over the adapters.
* ``padded`` every adapter padded to the largest rank (and token segments to the longest), two
             batched GEMMs (the LoRAFusion / vLLM style of sizing work for the largest rank).
* ``peft``   Hugging Face PEFT's LoRA layer, each job alone (only where ``peft`` is installed).
* ``fused``  ours: ``MultiLoRALinear`` (Triton kernels + cuBLAS base GEMMs).
* ``lorafusion`` LoRAFusion's own Triton kernels (``lorafusion_ext.py``; only where their source
             is present: ``lorafusion_available()``); mixes they cannot run raise
             NotImplementedError at construction.
* ``grouped`` ALTO style: grouped GEMMs over the adapters (``grouped.py``; torch._grouped_mm or
             the labelled per-adapter fallback, ``GroupedImpl.implementation``).

Adapters are given packed as in ``multi_lora_linear``: lora_A (sum r, K), lora_B (sum r, N);
each implementation copies them into its own layout at construction, so all compute the same
function (up to dropout masks and rounding). Dropout: standard LoRA, on the adapter input only.
"""
from __future__ import annotations

from typing import List, Sequence

import torch
import torch.nn.functional as F

from .multilora import MultiLoRALinear

__all__ = ["IMPLS", "make_impl", "peft_available", "Impl"]


def peft_available() -> bool:
    """True if Hugging Face PEFT imports here (the ``peft`` baseline needs it)."""
    try:
        import peft  # noqa: F401
        return True
    except Exception:
        return False


class Impl:
    """One implementation. ``inputs(x, dy)`` turns a shared (x, dy) pair into the arguments of
    ``step`` (outside any timed region); ``step(*args)`` runs forward + backward and returns the
    gradients. Shapes: x (M, K), dy (M, N); weight (N, K); lora_A (sum r, K); lora_B (sum r, N)."""

    name = "?"

    def __init__(self, weight, lora_A, lora_B, seg_lens: Sequence[int], ranks: Sequence[int],
                 scales: Sequence[float], dropout: float):
        self.W = weight
        self.seg_lens = [int(v) for v in seg_lens]
        self.ranks = [int(r) for r in ranks]
        self.scales = [float(s) for s in scales]
        self.p = float(dropout)
        self.K = weight.shape[1]
        self.N = weight.shape[0]
        offs, o = [], 0
        for r in self.ranks:
            offs.append(o)
            o += r
        self.roffs = offs

    def inputs(self, x, dy):
        return (x.detach().clone().requires_grad_(True), dy.detach().clone())

    def params(self) -> List[torch.Tensor]:
        return []

    def step(self, x, dy):
        raise NotImplementedError


class BaseImpl(Impl):
    """The frozen base layer alone: y = x W^T, gradient dX only."""
    name = "base"

    def step(self, x, dy):
        y = F.linear(x, self.W)
        return torch.autograd.grad(y, [x], dy)


class _PerAdapter(Impl):
    def __init__(self, weight, lora_A, lora_B, *a, **k):
        super().__init__(weight, lora_A, lora_B, *a, **k)
        self.A = [lora_A[o:o + r].detach().clone().requires_grad_(True)
                  for o, r in zip(self.roffs, self.ranks)]              # (r, K)
        self.B = [lora_B[o:o + r].detach().t().contiguous().requires_grad_(True)
                  for o, r in zip(self.roffs, self.ranks)]              # (N, r), PEFT layout

    def params(self):
        return self.A + self.B

    def _lora(self, i, xi):
        h = F.linear(F.dropout(xi, self.p, training=self.p > 0), self.A[i]) * self.scales[i]
        return F.linear(h, self.B[i])


class LoopImpl(_PerAdapter):
    """mLoRA style: one base GEMM over the concatenated batch, then a loop over adapters."""
    name = "loop"

    def step(self, x, dy):
        y = F.linear(x, self.W)
        parts = [self._lora(i, xi) for i, xi in enumerate(x.split(self.seg_lens))
                 if self.seg_lens[i]]
        y = y + torch.cat(parts)
        live = [p for i, p in enumerate(self.A) if self.seg_lens[i]] + \
               [p for i, p in enumerate(self.B) if self.seg_lens[i]]
        return torch.autograd.grad(y, [x] + live, dy)


class AloneImpl(_PerAdapter):
    """Each job alone: its own base GEMM and eager LoRA, one job after another."""
    name = "alone"

    def inputs(self, x, dy):
        return ([xi.detach().clone().requires_grad_(True) for xi in x.split(self.seg_lens)],
                [d.detach().clone() for d in dy.split(self.seg_lens)])

    def step(self, xs, dys):
        out = []
        for i, (xi, di) in enumerate(zip(xs, dys)):
            if not self.seg_lens[i]:
                continue
            y = F.linear(xi, self.W) + self._lora(i, xi)
            out += torch.autograd.grad(y, [xi, self.A[i], self.B[i]], di)
        return out


class PaddedImpl(Impl):
    """Every adapter padded to the largest rank R (zeros), token segments padded to the longest
    segment, two batched GEMMs (bmm) for the low-rank path."""
    name = "padded"

    def __init__(self, weight, lora_A, lora_B, *a, **k):
        super().__init__(weight, lora_A, lora_B, *a, **k)
        n, R = len(self.ranks), max(self.ranks)
        Ap = lora_A.new_zeros(n, R, self.K)
        Bp = lora_B.new_zeros(n, self.N, R)
        for i, (o, r) in enumerate(zip(self.roffs, self.ranks)):
            Ap[i, :r] = lora_A[o:o + r]
            Bp[i, :, :r] = lora_B[o:o + r].t()
        self.Ap = Ap.requires_grad_(True)
        self.Bp = Bp.requires_grad_(True)
        self.scale_t = torch.tensor(self.scales, dtype=lora_A.dtype,
                                    device=lora_A.device)[:, None, None]
        self.equal = len(set(self.seg_lens)) == 1

    def params(self):
        return [self.Ap, self.Bp]

    def step(self, x, dy):
        n, M = len(self.ranks), x.shape[0]
        y = F.linear(x, self.W)
        if self.equal:
            xs = x.view(n, M // n, self.K)
        else:
            xs = torch.nn.utils.rnn.pad_sequence(list(x.split(self.seg_lens)), batch_first=True)
        d = F.dropout(xs, self.p, training=self.p > 0)
        h = torch.bmm(d, self.Ap.transpose(1, 2)) * self.scale_t
        lo = torch.bmm(h, self.Bp.transpose(1, 2))
        if self.equal:
            lo = lo.view(M, self.N)
        else:
            lo = torch.cat([lo[i, :L] for i, L in enumerate(self.seg_lens) if L])
        y = y + lo
        return torch.autograd.grad(y, [x, self.Ap, self.Bp], dy)


class PeftImpl(Impl):
    """Hugging Face PEFT LoRA on a bias-free nn.Linear, each job alone (adapters kept in the
    base dtype, i.e. PEFT's autocast of adapters to fp32 off: its fastest setting)."""
    name = "peft"

    def __init__(self, weight, lora_A, lora_B, *a, **k):
        super().__init__(weight, lora_A, lora_B, *a, **k)
        from peft import LoraConfig, inject_adapter_in_model
        self.models, self.lparams = [], []
        for i, (o, r) in enumerate(zip(self.roffs, self.ranks)):
            m = torch.nn.Sequential()
            lin = torch.nn.Linear(self.K, self.N, bias=False, device=weight.device,
                                  dtype=weight.dtype)
            lin.weight = torch.nn.Parameter(weight, requires_grad=False)
            m.add_module("lin", lin)
            cfg = LoraConfig(r=r, lora_alpha=self.scales[i] * r, lora_dropout=self.p,
                             target_modules=["lin"], bias="none")
            m = inject_adapter_in_model(cfg, m)
            layer = m.lin
            with torch.no_grad():
                layer.lora_A["default"].weight.data = lora_A[o:o + r].detach().clone()
                layer.lora_B["default"].weight.data = lora_B[o:o + r].detach().t().contiguous()
            ps = [layer.lora_A["default"].weight, layer.lora_B["default"].weight]
            for p_ in ps:
                p_.requires_grad_(True)
            m.train()
            self.models.append(m)
            self.lparams.append(ps)

    def params(self):
        return [p for ps in self.lparams for p in ps]

    inputs = AloneImpl.inputs

    def step(self, xs, dys):
        out = []
        for i, (xi, di) in enumerate(zip(xs, dys)):
            if not self.seg_lens[i]:
                continue
            y = self.models[i](xi)
            out += torch.autograd.grad(y, [xi] + self.lparams[i], di)
        return out


class FusedImpl(Impl):
    """Ours: ``MultiLoRALinear`` (one Triton launch per LoRA stage covering all adapters)."""
    name = "fused"

    def __init__(self, weight, lora_A, lora_B, *a, kernel_config=None, **k):
        super().__init__(weight, lora_A, lora_B, *a, **k)
        mod = MultiLoRALinear(self.K, self.N, self.ranks, scales=self.scales, dropout=self.p,
                              dtype=weight.dtype, device=weight.device,
                              adapter_dtype=lora_A.dtype, kernel_config=kernel_config)
        with torch.no_grad():
            mod.weight.data = weight
            mod.lora_A.copy_(lora_A)
            mod.lora_B.copy_(lora_B)
        mod.set_segments(self.seg_lens)
        mod.train(self.p > 0)
        self.mod = mod
        # the same layer on its CUDA-graph path and on "auto" (same Parameter objects), for the eager loop
        self.gmod, self.amod = (self._twin(mod, kernel_config, g) for g in (True, "auto"))

    def _twin(self, mod, kernel_config, cuda_graph):
        twin = MultiLoRALinear(self.K, self.N, self.ranks, scales=self.scales, dropout=self.p,
                               dtype=mod.weight.dtype, device=mod.weight.device,
                               adapter_dtype=mod.lora_A.dtype, kernel_config=kernel_config,
                               cuda_graph=cuda_graph)
        twin.weight, twin.lora_A, twin.lora_B = mod.weight, mod.lora_A, mod.lora_B
        twin.set_segments(self.seg_lens)
        return twin.train(True)

    def params(self):
        return [self.mod.lora_A, self.mod.lora_B]

    def step(self, x, dy):
        y = self.mod(x)
        return torch.autograd.grad(y, [x, self.mod.lora_A, self.mod.lora_B], dy)

    def eager_step(self, x, dy):
        """``step`` through the CUDA-graph path (what an eager training loop runs; on the CPU
        the same as ``step``)."""
        y = self.gmod(x)
        return torch.autograd.grad(y, [x, self.gmod.lora_A, self.gmod.lora_B], dy)

    def auto_step(self, x, dy):
        """``step`` through ``cuda_graph="auto"`` (graphs for small steps, ``graphed.use_graphs``)."""
        y = self.amod(x)
        return torch.autograd.grad(y, [x, self.amod.lora_A, self.amod.lora_B], dy)


class LoRAFusionImpl(Impl):
    """LoRAFusion's kernels (``lorafusion_ext.lorafusion_multi_lora_linear``): lora_A packed, lora_B
    per adapter in their (N, r) layout, converted once here. Raises NotImplementedError (their
    constraint) or ImportError (no source)."""
    name = "lorafusion"

    def __init__(self, weight, lora_A, lora_B, *a, **k):
        super().__init__(weight, lora_A, lora_B, *a, **k)
        from .lorafusion_ext import LoRAFusionPlan, lorafusion_b_layout

        self.plan = LoRAFusionPlan(self.seg_lens, self.ranks, self.scales, self.p, self.K, self.N,
                                   weight.device, weight.dtype)
        self.A = lora_A.detach().clone().requires_grad_(True)
        self.B = [b.requires_grad_(True) for b in lorafusion_b_layout(lora_B, self.ranks)]
        self.implementation = self.plan.implementation()
        self._seed = 0

    def params(self):
        return [self.A] + self.B

    def step(self, x, dy):
        from .lorafusion_ext import lorafusion_multi_lora_linear

        self._seed += 1
        y = lorafusion_multi_lora_linear(x, self.W, self.A, self.B, self.plan, seed=self._seed)
        return torch.autograd.grad(y, [x, self.A] + self.B, dy)


class GroupedImpl(Impl):
    """ALTO style: the LoRA path as grouped GEMMs over the adapters (``grouped.py``), adapters
    zero-padded to the largest rank (rounded up to 8) once here."""
    name = "grouped"

    def __init__(self, weight, lora_A, lora_B, *a, **k):
        super().__init__(weight, lora_A, lora_B, *a, **k)
        from .grouped import GroupedPlan, grouped_layout

        self.plan = GroupedPlan(self.seg_lens, self.ranks, self.scales, self.p, self.K, self.N,
                                weight.device, weight.dtype)
        A3, B3 = grouped_layout(lora_A.detach(), lora_B.detach(), self.ranks, self.plan.R)
        self.A3, self.B3 = A3.requires_grad_(True), B3.requires_grad_(True)
        self.implementation = self.plan.implementation()

    def params(self):
        return [self.A3, self.B3]

    def step(self, x, dy):
        from .grouped import grouped_multi_lora_linear

        y = grouped_multi_lora_linear(x, self.W, self.A3, self.B3, self.plan, training=self.p > 0)
        return torch.autograd.grad(y, [x, self.A3, self.B3], dy)


IMPLS = {c.name: c for c in (BaseImpl, AloneImpl, LoopImpl, PaddedImpl, PeftImpl, FusedImpl,
                             LoRAFusionImpl, GroupedImpl)}


def make_impl(name: str, weight, lora_A, lora_B, seg_lens, ranks, scales, dropout, **kw) -> Impl:
    """Build implementation ``name`` (one of IMPLS) over shared weights. Raises KeyError."""
    return IMPLS[name](weight, lora_A, lora_B, seg_lens, ranks, scales, dropout, **kw)
