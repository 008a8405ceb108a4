"""Fused multi-LoRA linear layer: launch plan, autograd Function and ``MultiLoRALinear`` module.

See ``lora_kernels.py`` for the kernels and docs/kernel.md ("Fused multi-LoRA kernel") for the math.
Shapes and units used throughout:

* ``x``: (M, K) tokens x in-features, bf16/fp16/fp32; adapter i owns rows
  ``[start_i, start_i + seg_lens[i])``, segments contiguous, in adapter order, covering x.
* ``weight``: (N, K), the frozen base weight in ``torch.nn.Linear`` layout (Y = x weight^T).
* ``lora_A``: (sum r_i, K), A_i^T stacked (PEFT's ``lora_A.weight`` of every adapter).
* ``lora_B``: (sum r_i, N), B_i stacked (the transpose of PEFT's ``lora_B.weight``).
* scale s_i = alpha_i / r_i (Hu et al. 2021, sec. 4.1), dropout p_i on the adapter input only.
"""
from __future__ import annotations

import math
import random
from collections import OrderedDict
from types import MappingProxyType
from typing import Mapping, Optional, Sequence

import torch

from . import lora_kernels as K_
from .config import MAX_RANK, KernelConfig, cdiv, keep_threshold, mix_seed
from .plan import LoRAPlan, build_plan
from .program import backward_program, forward_program, gbuf_numel, prec_of

__all__ = ["multi_lora_linear", "MultiLoRALinear", "dropout_keep_mask_triton"]


_prec = prec_of
_gbuf_numel = gbuf_numel


class _MultiLoRAFunction(torch.autograd.Function):
    """y = x W^T + bias + s_i drop(x_i) A_i B_i per segment; gradients dX, dA_i, dB_i (and dW,
    dbias only if asked: the base is meant to be frozen). The launches are the plan's cached
    ``program`` (bound once per input layout)."""

    @staticmethod
    def forward(ctx, x, weight, bias, lora_A, lora_B, plan, seed, dropout_on):
        nig = ctx.needs_input_grad
        need_grads = nig[0] or nig[3] or nig[4]
        dropout = dropout_on and plan.has_dropout
        prog = forward_program(plan, x, lora_A, lora_B, bias, seed, dropout, need_grads)
        y, psave, gbuf = prog.run(plan, x, weight, bias, lora_A, lora_B, seed)
        ctx.plan, ctx.seed, ctx.dropout, ctx.fprog = plan, seed, dropout, prog
        ctx.save_for_backward(x, weight, lora_A, lora_B, psave, gbuf)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, lora_A, lora_B, psave, gbuf = ctx.saved_tensors
        if not dy.is_contiguous():
            dy = dy.contiguous()
        need_x, need_w, need_b, need_A, need_B = ctx.needs_input_grad[:5]
        dx = dA = dB = None
        if need_A or need_B or need_x:
            prog = backward_program(ctx.plan, x, dy, lora_A, lora_B, ctx.seed, ctx.dropout,
                                    need_x, ctx.fprog)
            dx, dA, dB = prog.run(ctx.plan, dy, x, weight, lora_A, lora_B, psave, gbuf, ctx.seed,
                                  need_A, need_B)
        dW = dy.t() @ x if need_w else None
        db = dy.sum(0) if (need_b and ctx.has_bias) else None
        return dx, dW, db, dA, dB, None, None, None


def _check(x, weight, bias, lora_A, lora_B, plan: LoRAPlan):
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (tokens, in_features), got shape {tuple(x.shape)}")
    M, Kf = x.shape
    if M != plan.n_tokens:
        raise ValueError(f"x has {M} tokens but the segments cover {plan.n_tokens}")
    if Kf != plan.in_features or tuple(weight.shape) != (plan.out_features, Kf):
        raise ValueError(f"weight must be ({plan.out_features}, {Kf}), got {tuple(weight.shape)}")
    if tuple(lora_A.shape) != (plan.sum_r, Kf) or tuple(lora_B.shape) != (plan.sum_r,
                                                                           plan.out_features):
        raise ValueError(f"lora_A must be ({plan.sum_r}, {Kf}) and lora_B "
                         f"({plan.sum_r}, {plan.out_features}); got {tuple(lora_A.shape)}, "
                         f"{tuple(lora_B.shape)}")
    if bias is not None and tuple(bias.shape) != (plan.out_features,):
        raise ValueError(f"bias must be ({plan.out_features},)")
    for t in (weight, lora_A, lora_B):
        if t.device != x.device:
            raise ValueError("all tensors must be on x's device")
    if lora_A.stride(1) != 1 or lora_B.stride(1) != 1:
        raise ValueError("lora_A and lora_B must be row-contiguous")


def multi_lora_linear(x: torch.Tensor, weight: torch.Tensor, lora_A: torch.Tensor,
                      lora_B: torch.Tensor, plan: LoRAPlan, bias: Optional[torch.Tensor] = None,
                      seed: "int | torch.Tensor" = 0, dropout_on: bool = True) -> torch.Tensor:
    """Fused multi-LoRA linear: (M, K) -> (M, N), differentiable in x, lora_A, lora_B (and in
    weight/bias if they require grad, through plain torch).

    Per adapter i (rows of segment i): y = x weight^T + bias + s_i (drop_i(x) A_i) B_i with
    A_i = lora_A[o_i:o_i+r_i]^T, B_i = lora_B[o_i:o_i+r_i] (docs/kernel.md "Fused multi-LoRA
    kernel"; Hu et al. 2021 eq. 3). ``seed`` (int) picks the dropout mask
    (``reference.keep_mask(M, K, seed, p)`` rebuilds it), or is a one-element int32/int64 device
    tensor holding that int, read by the kernels when they run (the CUDA-graph path advances it
    inside the graph); ``dropout_on=False`` disables dropout. The frozen layer's GEMMs run on
    cuBLAS or on ``lora_gemm``'s GEMM with the LoRA term in the epilogue (``plan.cfg.base_gemm``).
    Raises ValueError on shape, device or segment mismatch."""
    _check(x, weight, bias, lora_A, lora_B, plan)
    x = x.contiguous()
    if not isinstance(seed, torch.Tensor):
        seed = mix_seed(seed)
    return _MultiLoRAFunction.apply(x, weight, bias, lora_A, lora_B, plan, seed,
                                    bool(dropout_on))


try:  # autograd.Function.apply minus its Python wrapper (used while no functorch transform runs)
    _C_APPLY = torch._C._FunctionBase.__dict__["apply"].__get__(None, _MultiLoRAFunction)
except Exception:  # noqa: BLE001 - another torch: the public apply
    _C_APPLY = None


def _module_step(mod, x, plan: LoRAPlan, seed, dropout_on: bool) -> torch.Tensor:
    """``multi_lora_linear`` for ``MultiLoRALinear.forward``: the full argument check runs once
    per (plan, input shape, dtype, device, parameter tensors), later steps skip it."""
    key = (id(plan), x.shape, x.dtype, x.device, id(mod.weight), id(mod.lora_A), id(mod.lora_B),
           id(mod.bias))
    if key != mod._checked:
        _check(x, mod.weight, mod.bias, mod.lora_A, mod.lora_B, plan)
        mod._checked = key
    if not x.is_contiguous():
        x = x.contiguous()
    if not isinstance(seed, torch.Tensor):
        seed = mix_seed(seed)
    if _C_APPLY is not None and not torch._C._are_functorch_transforms_active():
        # what Function.apply does then, minus unwrapping tensors left by finished functorch
        # transforms (the module's parameters never are; x is checked)
        if not torch._C._functorch.is_functorch_wrapped_tensor(x):
            return _C_APPLY(x, mod.weight, mod.bias, mod.lora_A, mod.lora_B, plan, seed,
                            dropout_on)
    return _MultiLoRAFunction.apply(x, mod.weight, mod.bias, mod.lora_A, mod.lora_B, plan, seed,
                                    dropout_on)


def dropout_keep_mask_triton(M: int, K: int, seed: int, p: float, device) -> torch.Tensor:
    """The (M, K) int8 keep mask (1 = kept) the kernels use for ``seed`` and probability p."""
    out = torch.empty(M, K, dtype=torch.int8, device=device)
    if M and K:
        K_.mask_kernel[(cdiv(M, 32), cdiv(K, 32))](out, M, K, mix_seed(seed),
                                                       keep_threshold(p), BM=32, BK=32)
    return out


class MultiLoRALinear(torch.nn.Module):
    """A frozen Linear(in_features, out_features) with many LoRA adapters of their own ranks,
    trained together in one fused step (drop-in for ``nn.Linear`` on 2-D or batched input).

    Args: ranks r_i in [1, 256]; alphas (scale s_i = alpha_i / r_i, default alpha_i = r_i, i.e.
    s_i = 1) or ``scales`` directly; dropout p in [0, 1) (one or per adapter); bias; dtype,
    device of the base weight; ``adapter_dtype`` of lora_A / lora_B (default: dtype).
    ``forward(x, seg_lens=None)``: x (..., in_features), flattened to (M, K) tokens; seg_lens
    (tokens per adapter, summing to M; default: ``self.seg_lens`` set by ``set_segments``).
    Returns (..., out_features). Init follows PEFT: A Kaiming-uniform, B zero.
    ``cuda_graph=True``: in training mode on CUDA, forward and backward replay CUDA graphs
    captured on the first step of each input shape and segment layout (``graphed``), which removes
    the Python launch path from an eager loop; the output is then the graph's buffer, overwritten
    by the next step of that shape. ``cuda_graph="auto"``: the same only for steps small enough
    that the plain path is host-bound (``graphed.use_graphs``: under ``graphed.AUTO_MAX_FLOPS``,
    a layout met twice), the plain path otherwise; the recommended setting for an eager training
    loop. Default False: the plain path, whose outputs are never overwritten. Raises ValueError
    on bad ranks/segments/shapes or a ``cuda_graph`` other than False, True or "auto"."""

    def __init__(self, in_features: int, out_features: int, ranks: Sequence[int],
                 alphas: Optional[Sequence[float]] = None, dropout: float | Sequence[float] = 0.0,
                 bias: bool = False, scales: Optional[Sequence[float]] = None,
                 dtype: torch.dtype = torch.bfloat16, device=None,
                 adapter_dtype: Optional[torch.dtype] = None,
                 kernel_config: Optional[KernelConfig] = None, cuda_graph: "bool | str" = False):
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.ranks = tuple(int(r) for r in ranks)
        if any(r < 1 or r > MAX_RANK for r in self.ranks) or not self.ranks:
            raise ValueError(f"ranks must be a non-empty list of ints in [1, {MAX_RANK}]")
        n = len(self.ranks)
        if scales is None:
            alphas = list(self.ranks) if alphas is None else list(alphas)
            if len(alphas) != n:
                raise ValueError("one alpha per adapter")
            scales = [a / r for a, r in zip(alphas, self.ranks)]
        self.scales = tuple(float(s) for s in scales)
        if len(self.scales) != n:
            raise ValueError("one scale per adapter")
        self.dropout = tuple([float(dropout)] * n if isinstance(dropout, (int, float))
                             else [float(p) for p in dropout])
        adapter_dtype = adapter_dtype or dtype
        sum_r = sum(self.ranks)
        self.weight = torch.nn.Parameter(
            torch.empty(out_features, in_features, dtype=dtype, device=device),
            requires_grad=False)
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.bias = (torch.nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device),
                                        requires_grad=False) if bias else None)
        self.lora_A = torch.nn.Parameter(torch.empty(sum_r, in_features, dtype=adapter_dtype,
                                                     device=device))
        self.lora_B = torch.nn.Parameter(torch.zeros(sum_r, out_features, dtype=adapter_dtype,
                                                     device=device))
        with torch.no_grad():
            o = 0
            for r in self.ranks:
                torch.nn.init.kaiming_uniform_(self.lora_A[o:o + r], a=math.sqrt(5))
                o += r
        self.kernel_config = kernel_config
        self.seg_lens: Optional[tuple] = None
        self._plans: dict = {}
        self._last_plan: tuple = (None, None, None)   # (seg_lens object, device, plan)
        self._checked: tuple = ()
        self._gen = torch.Generator().manual_seed(0)
        self._rng = random.Random(0)  # the plain path's per-step dropout seeds
        if cuda_graph not in (False, True, "auto"):
            raise ValueError(f"cuda_graph must be False, True or 'auto', not {cuda_graph!r}")
        self.cuda_graph = cuda_graph if cuda_graph == "auto" else bool(cuda_graph)
        self.graph_cache: OrderedDict = OrderedDict()  # graphed.graphed_forward's graphs, by input key
        self.graph_uses: dict = {}     # steps met per key not yet captured ("auto")
        self.graph_pending: dict = {}  # per captured key: its last replay awaits its backward
        self._counters: dict = {}

    def set_segments(self, seg_lens: Sequence[int]) -> None:
        """Default tokens per adapter for ``forward`` (contiguous, in adapter order)."""
        self.seg_lens = tuple(int(v) for v in seg_lens)

    def adapter_offsets(self) -> list:
        """Row offset o_i of adapter i in lora_A / lora_B."""
        out, o = [], 0
        for r in self.ranks:
            out.append(o)
            o += r
        return out

    def plans(self) -> Mapping[tuple, LoRAPlan]:
        """The launch plans cached so far (``plan_for``), as a read-only live view: key
        (segment lengths as a tuple of ints, ``str(device)``) -> its ``LoRAPlan``, in the order
        they were built. For inspection (e.g. ``bench/kernel_host.py`` counts the launches of
        their programs); ``plan_for`` is the way to get or build one."""
        return MappingProxyType(self._plans)

    def plan_for(self, seg_lens: Sequence[int], device) -> LoRAPlan:
        """The cached launch plan of this segment layout on ``device`` (built on first use)."""
        last = self._last_plan
        if seg_lens is last[0] and device == last[1] and isinstance(seg_lens, tuple):
            return last[2]  # the same (immutable) segments object as the last step
        key = (tuple(int(v) for v in seg_lens), str(device))
        plan = self._plans.get(key)
        if plan is None:
            plan = build_plan(key[0], self.ranks, self.scales, self.dropout, self.in_features,
                              self.out_features, device, self.kernel_config)
            self._plans[key] = plan
        self._last_plan = (seg_lens, device, plan)
        return plan

    def forward(self, x: torch.Tensor, seg_lens: Optional[Sequence[int]] = None,
                seed: Optional[int] = None) -> torch.Tensor:
        seg_lens = seg_lens if seg_lens is not None else self.seg_lens
        if seg_lens is None:
            raise ValueError("no segments: pass seg_lens or call set_segments()")
        flat = x.dim() == 2  # 2-D input: no reshape (and no view nodes in the backward)
        lead = x.shape[:-1]
        x2 = x if flat else x.reshape(-1, self.in_features)
        plan = self.plan_for(seg_lens, x.device)
        if (self.cuda_graph and seed is None and x2.is_cuda and self.training
                and torch.is_grad_enabled()):
            from .graphed import graphed_forward
            y = graphed_forward(self, x2, plan, multi_lora_linear)
            if y is not None:
                return y if flat else y.reshape(*lead, self.out_features)
        if seed is None:
            seed = self._rng.randrange(2 ** 31 - 1)
        y = _module_step(self, x2, plan, seed, self.training)
        self.last_seed = seed
        return y if flat else y.reshape(*lead, self.out_features)

    def seed_counter(self, device) -> torch.Tensor:
        """The graph path's dropout-seed counter on ``device``: a 0-d int64 tensor, started at a
        draw of this module's generator and advanced by one inside every replayed forward."""
        key = str(device)
        if key not in self._counters:
            start = int(torch.randint(0, 2 ** 31 - 1, (), generator=self._gen))
            self._counters[key] = torch.tensor(start, dtype=torch.int64, device=device)
        return self._counters[key]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"ranks={list(self.ranks)}, dropout={list(self.dropout)}")

