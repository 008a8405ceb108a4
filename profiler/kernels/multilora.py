"""Fused multi-LoRA linear layer: launch plan, autograd Function and ``MultiLoRALinear`` module.

See ``_triton.py`` for the kernels and docs/kernel.md ("Fused multi-LoRA kernel") for the math.
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
import os
from typing import Optional, Sequence

import torch

from . import _triton as K_
from .config import (MAX_RANK, SMEM_LIMIT_BYTES, KernelConfig, cdiv, keep_threshold,  # noqa: F401
                     launch, mix_seed, seed_args, smem_bytes, stages_for)
from .lora_gemm import choose_gemm, gemm_lora_backward, gemm_lora_forward
from .plan import LoRAPlan, build_plan

__all__ = ["KernelConfig", "LoRAPlan", "build_plan", "multi_lora_linear", "MultiLoRALinear",
           "keep_threshold", "mix_seed", "dropout_keep_mask_triton", "MAX_RANK"]


def _prec(dtype: torch.dtype) -> str:
    """Dot mode: fp32 inputs exact ("ieee"); under the CPU interpreter, bf16/fp16 dots in fp32."""
    if dtype == torch.float32:
        return "ieee"
    return "interp" if os.environ.get("TRITON_INTERPRET") == "1" else "tf32"


def _gbuf_numel(plan: LoRAPlan) -> int:
    """fp32 workspace of the backward: dA (sum_r x K), dB (sum_r x N), Q (compact, p_size)."""
    return plan.sum_r * (plan.in_features + plan.out_features) + plan.p_size


def _lora_forward(x, lora_A, lora_B, bias, plan: LoRAPlan, seed, dropout_on: bool,
                  need_grads: bool, write_y: bool = True):
    """Run _f1 and _f2: returns (y, psave, gbuf). With ``write_y`` y holds the LoRA term (+ bias)
    and then receives x W^T (cuBLAS); without, _f2 only saves P and the caller's GEMM writes y.
    With ``need_grads`` _f2 also zeroes gbuf, which the backward accumulates into."""
    M, Kf = x.shape
    Nf = plan.out_features
    cfg = plan.cfg
    dev = x.device
    y = torch.empty(M, Nf, dtype=x.dtype, device=dev)
    psave = torch.empty(max(plan.p_size, 1), dtype=x.dtype, device=dev)
    g_numel = _gbuf_numel(plan) if need_grads else 0
    gbuf = torch.empty(max(g_numel, 1), dtype=torch.float32, device=dev)
    if plan.n_tiles == 0:  # every segment empty (then M == 0)
        if g_numel:
            gbuf.zero_()
        return y, psave, gbuf
    ppart = torch.empty(max(plan.ksplit * plan.p_size, 1), dtype=torch.float32, device=dev)
    dropout = dropout_on and plan.has_dropout
    prec = _prec(x.dtype)
    sarg, sptr = seed_args(seed)
    launch(K_._f1_kernel, (plan.n_tiles * plan.ksplit,), "f1", plan.buckets, cfg,
        x, lora_A, ppart, plan.tiles, plan.meta_i, Kf, x.stride(0), lora_A.stride(0),
        plan.p_size, plan.ksplit, plan.kb_per, sarg,
        BUCKETS=plan.buckets, **cfg.bm_kwargs(), BK=cfg.bk, DROPOUT=dropout, PREC=prec,
        SEED_PTR=sptr, num_warps=cfg.warps_f1)
    has_bias = bias is not None and write_y
    ngroups = plan.ngroups if write_y else 1
    launch(K_._f2_kernel, (plan.n_tiles * ngroups,), "f2", plan.buckets, cfg,
        ppart, psave, lora_B, y, bias if has_bias else y, gbuf, g_numel, plan.tiles,
        plan.meta_i, plan.meta_f if dropout else _nodrop_meta_f(plan), Nf, y.stride(0),
        lora_B.stride(0), plan.p_size, plan.ksplit, ngroups, plan.ng_per,
        BUCKETS=plan.buckets, **cfg.bm_kwargs(), BN=cfg.bn, HAS_BIAS=has_bias, ZERO_G=g_numel > 0, PREC=prec,
        WRITE_Y=write_y, num_warps=cfg.warps_f2)
    return y, psave, gbuf


def _nodrop_meta_f(plan: LoRAPlan) -> torch.Tensor:
    return plan.meta_f_nodrop


def _lora_backward(dy, x, lora_A, lora_B, psave, gbuf, plan: LoRAPlan, seed,
                   dropout_on: bool, write_dx: bool):
    """Run _b1 and _b2: returns (dX_lora (M, K) or None, Q); gbuf (zeroed) receives dA^T
    (sum_r x K), dB (sum_r x N) and, on the way, Q = s dY B^T (compact, fp32 in gbuf when
    N-split, else in dy's dtype)."""
    M, Kf = x.shape
    Nf = plan.out_features
    cfg = plan.cfg
    dev = x.device
    dxl = torch.empty(M, Kf, dtype=x.dtype, device=dev) if write_dx else None
    if plan.n_tiles == 0:
        return dxl, gbuf
    dropout = dropout_on and plan.has_dropout
    meta_f = plan.meta_f if dropout else _nodrop_meta_f(plan)
    gA = gbuf[: plan.sum_r * Kf]
    gB = gbuf[plan.sum_r * Kf: plan.sum_r * (Kf + Nf)]
    q_atomic = plan.nsplit > 1
    # Q: fp32 sums of N-split partials in the zeroed workspace, else one bf16/fp16 store
    q = gbuf[plan.sum_r * (Kf + Nf):] if q_atomic else torch.empty(
        max(plan.p_size, 1), dtype=x.dtype, device=dev)
    prec = _prec(x.dtype)
    n_nb = cdiv(Nf, cfg.bn)
    n_q = plan.n_tiles * plan.nsplit
    launch(K_._b1_kernel, (n_q + plan.n_chunks * n_nb,), "b1", plan.buckets, cfg,
        dy, lora_B, psave, q, gB, plan.tiles, plan.chunks, plan.meta_i, meta_f, Nf,
        dy.stride(0), lora_B.stride(0), plan.nsplit, plan.nb_per, n_q, n_nb,
        BUCKETS=plan.buckets, **cfg.bm_kwargs(), **cfg.cm_kwargs(), BN=cfg.bn,
        Q_ATOMIC=q_atomic, PREC=prec, num_warps=cfg.warps_b1)
    n_kb = cdiv(Kf, cfg.bk)
    sarg, sptr = seed_args(seed)
    launch(K_._b2_kernel, (plan.n_chunks * n_kb,), "b2", plan.buckets, cfg,
        x, lora_A, q, dxl if write_dx else x, gA, plan.chunks,
        plan.meta_i, meta_f, Kf, x.stride(0), lora_A.stride(0),
        dxl.stride(0) if write_dx else 0, n_kb, sarg,
        BUCKETS=plan.buckets, **cfg.bm_kwargs(), **cfg.cm_kwargs(), BK=cfg.bk,
        DROPOUT=dropout, WRITE_DX=write_dx, PREC=prec, SEED_PTR=sptr,
        num_warps=cfg.warps_b2)
    return dxl, q


class _MultiLoRAFunction(torch.autograd.Function):
    """y = x W^T + bias + s_i drop(x_i) A_i B_i per segment; gradients dX, dA_i, dB_i (and dW,
    dbias only if asked: the base is meant to be frozen)."""

    @staticmethod
    def forward(ctx, x, weight, bias, lora_A, lora_B, plan, seed, dropout_on):
        need_grads = any(ctx.needs_input_grad[i] for i in (0, 3, 4))
        gc = choose_gemm(plan, "fwd", x.device)
        y, psave, gbuf = _lora_forward(x, lora_A, lora_B, bias, plan, seed, dropout_on,
                                       need_grads, write_y=gc is None)
        if gc is None:
            y.addmm_(x, weight.t())  # cuBLAS, beta = 1: the base GEMM adds onto the LoRA term
        else:  # our GEMM, with s P B (+ bias) in its epilogue
            gemm_lora_forward(x, weight, psave, lora_B, bias, plan, gc, y, _prec(x.dtype))
        ctx.plan, ctx.seed, ctx.dropout_on = plan, seed, dropout_on
        ctx.save_for_backward(x, weight, lora_A, lora_B, psave, gbuf)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, lora_A, lora_B, psave, gbuf = ctx.saved_tensors
        plan = ctx.plan
        dy = dy.contiguous()
        need_x, need_w, need_b, need_A, need_B = ctx.needs_input_grad[:5]
        gc = choose_gemm(plan, "bwd", x.device) if need_x else None
        dx = None
        if need_A or need_B or need_x:
            dxl, q = _lora_backward(dy, x, lora_A, lora_B, psave, gbuf, plan, ctx.seed,
                                    ctx.dropout_on, need_x and gc is None)
            if need_x and gc is None:
                dx = dxl.addmm_(dy, weight)  # cuBLAS, beta = 1
            elif need_x:  # our GEMM, with mask(Q A^T) / (1 - p) in its epilogue
                dx = torch.empty_like(x)
                gemm_lora_backward(dy, weight, q, lora_A, plan, gc, ctx.seed,
                                   ctx.dropout_on and plan.has_dropout, dx, _prec(x.dtype))
        dA = dB = None
        if need_A or need_B:
            Kf = x.shape[1]
            ng = plan.sum_r * (Kf + plan.out_features)
            gA = gbuf[: plan.sum_r * Kf].view(plan.sum_r, Kf)
            gB = gbuf[plan.sum_r * Kf: ng].view(plan.sum_r, plan.out_features)
            if lora_A.dtype != torch.float32:  # one cast launch for both
                g = gbuf[:ng].to(lora_A.dtype)
                gA = g[: plan.sum_r * Kf].view(plan.sum_r, Kf)
                gB = g[plan.sum_r * Kf:].view(plan.sum_r, plan.out_features)
            dA = gA if need_A else None
            dB = gB if need_B else None
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


def dropout_keep_mask_triton(M: int, K: int, seed: int, p: float, device) -> torch.Tensor:
    """The (M, K) int8 keep mask (1 = kept) the kernels use for ``seed`` and probability p."""
    out = torch.empty(M, K, dtype=torch.int8, device=device)
    if M and K:
        K_._mask_kernel[(cdiv(M, 32), cdiv(K, 32))](out, M, K, mix_seed(seed),
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
    by the next step. Raises ValueError on bad ranks/segments/shapes."""

    def __init__(self, in_features: int, out_features: int, ranks: Sequence[int],
                 alphas: Optional[Sequence[float]] = None, dropout: float | Sequence[float] = 0.0,
                 bias: bool = False, scales: Optional[Sequence[float]] = None,
                 dtype: torch.dtype = torch.bfloat16, device=None,
                 adapter_dtype: Optional[torch.dtype] = None,
                 kernel_config: Optional[KernelConfig] = None, cuda_graph: bool = False):
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
        self._gen = torch.Generator().manual_seed(0)
        self.cuda_graph = bool(cuda_graph)
        self.graph_cache: dict = {}   # graphed.graphed_forward's graphs, by input key
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

    def plan_for(self, seg_lens: Sequence[int], device) -> LoRAPlan:
        """The cached launch plan of this segment layout on ``device`` (built on first use)."""
        key = (tuple(int(v) for v in seg_lens), str(device))
        plan = self._plans.get(key)
        if plan is None:
            plan = build_plan(key[0], self.ranks, self.scales, self.dropout, self.in_features,
                              self.out_features, device, self.kernel_config)
            self._plans[key] = plan
        return plan

    def forward(self, x: torch.Tensor, seg_lens: Optional[Sequence[int]] = None,
                seed: Optional[int] = None) -> torch.Tensor:
        seg_lens = seg_lens if seg_lens is not None else self.seg_lens
        if seg_lens is None:
            raise ValueError("no segments: pass seg_lens or call set_segments()")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        plan = self.plan_for(seg_lens, x.device)
        if (self.cuda_graph and seed is None and x2.is_cuda and self.training
                and torch.is_grad_enabled()):
            from .graphed import graphed_forward
            y = graphed_forward(self, x2, plan, multi_lora_linear)
            return y.reshape(*lead, self.out_features)
        if seed is None:
            seed = int(torch.randint(0, 2 ** 31 - 1, (), generator=self._gen))
        y = multi_lora_linear(x2, self.weight, self.lora_A, self.lora_B, plan, self.bias,
                              seed=seed, dropout_on=self.training)
        self.last_seed = seed
        return y.reshape(*lead, self.out_features)

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

