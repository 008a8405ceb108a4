"""The launches of one fused multi-LoRA training step, prepared once per plan (profiler/KERNELS.md,
"Host overhead").

A ``ForwardProgram`` / ``BackwardProgram`` holds, for one ``LoRAPlan`` and one input layout (dtype,
device, strides, dropout on or off, int or counter seed, which gradients are needed, bias), every
Triton launch of that pass as a ``fastlaunch.BoundLaunch`` (grid, sizes, splits, the plan's device
tables and the constexprs bound once), the choice between cuBLAS and ``lora_gemm``'s GEMM, and the
sizes of the step's buffers. A step then allocates its outputs, launches with only the step's
tensors and seed as arguments, and recomputes nothing the plan already knows. Programs are cached
on the plan (``plan.extra``). The forward's fp32 sums of P over ``_f1``'s K splits (``pacc``) and
its per-tile counters (``cnt``), and the backward's fp32 sums of dA/dB over token chunks (``gacc``,
zeroed again by ``_gfin``), all left at zero by every step, are workspaces kept by the programs
and reused by every step: programs assume the steps of one plan
run on one CUDA stream (or on the CPU), in order.

Programs hold no reference to their plan (the plan holds them: a cycle would keep the weight
tensors their bound launches reference alive until the cyclic garbage collector runs); ``run``
takes the plan. Math and buffers: ``multilora`` (``_gbuf_numel``, the kernels' docstrings in ``lora_kernels``).
"""
from __future__ import annotations

import torch

from . import lora_kernels as K_
from .tiny import bind_backward, bind_forward
from .config import cdiv
from .fastlaunch import BoundLaunch
from .lora_gemm import bound_gemm, choose_gemm, gemm_lora_backward, gemm_lora_forward, tma_desc

__all__ = ["ForwardProgram", "BackwardProgram", "forward_program", "backward_program",
           "gbuf_numel", "prec_of"]


def prec_of(dtype: torch.dtype) -> str:
    """Dot mode: fp32 inputs exact ("ieee"); under the CPU interpreter, bf16/fp16 dots in fp32."""
    import os
    if dtype == torch.float32:
        return "ieee"
    return "interp" if os.environ.get("TRITON_INTERPRET") == "1" else "tf32"


def gbuf_numel(plan) -> int:
    """fp32 elements of the per-step workspace that ``_f2`` zeroes for the backward: Q's N-split
    partial sums (compact, p_size) when ``_b1`` splits Q over N, else none (dA and dB go straight
    to the gradients or through the backward program's own zero-kept ``gacc``)."""
    return plan.p_size if plan.nsplit > 1 else 0


def _wdesc_of(prog, weight, bwd: bool):
    """The weight's TMA descriptor, cached by the program while the weight stays where it is."""
    wd = prog._wd
    if wd is None or wd[0] != weight.data_ptr():
        wd = prog._wd = (weight.data_ptr(), tma_desc(weight, prog.gc, bwd, False))
    return wd[1]


class ForwardProgram:
    """The forward of ``plan`` for x's layout: ``run`` returns (y (M, N), psave (P, compact),
    gbuf (the backward's zeroed fp32 workspace, or a 1-element dummy without ``need_grads``))."""

    def __init__(self, plan, x, lora_A, lora_B, bias, seed_is_tensor: bool, dropout: bool,
                 need_grads: bool):
        cfg = plan.cfg
        M, Kf = x.shape
        Nf = plan.out_features
        self.dtype, self.device = x.dtype, x.device   # no reference to the plan: it caches us
        self.y_shape = (M, Nf)
        self.bwd: dict = {}   # the matching BackwardPrograms, by (need_x, dy's row stride)
        self.p_numel = max(plan.p_size, 1)
        self.g_numel = gbuf_numel(plan) if need_grads else 0
        self.gc = choose_gemm(plan, "fwd", x.device)
        self.write_y = self.gc is None
        self.dropout, self.seed_is_tensor = dropout, seed_is_tensor
        self.has_bias = bias is not None
        self.prec = prec = prec_of(x.dtype)
        self.empty = plan.n_tiles == 0
        self.gemm = self._wd = self._wt = self.tiny = None
        if self.empty:
            return
        # few tokens: one launch for f1 + f2 (``tiny``; it zeroes gbuf as f2 does)
        self.tiny = bind_forward(plan, x, lora_A, lora_B, self.has_bias, seed_is_tensor,
                                 dropout, prec, self.g_numel)
        if self.tiny is not None:
            return
        # the K splits' fp32 sums of P and one int32 counter per row tile (the splits that
        # finished): zero between steps (the last split of each tile zeroes its rows again)
        self.pacc = torch.zeros(max(plan.p_size, 1) if plan.ksplit > 1 else 1,
                                dtype=torch.float32, device=x.device)
        self.cnt = torch.zeros(max(plan.n_tiles, 1), dtype=torch.int32, device=x.device)
        meta_f = plan.meta_f if dropout else plan.meta_f_nodrop
        self.f1 = BoundLaunch(
            K_.f1_kernel, (plan.n_tiles * plan.ksplit,), "f1", plan.buckets, cfg,
            ("X", "A", "Psave", "seed"),
            dict(Pacc=self.pacc, Cnt=self.cnt, tiles=plan.tiles, meta_i=plan.meta_i,
                 meta_f=meta_f, K=Kf, sxm=x.stride(0), sam=lora_A.stride(0), ksplit=plan.ksplit, kb_per=plan.kb_per, BUCKETS=plan.buckets,
                 **cfg.bm_kwargs(), BK=cfg.bk, DROPOUT=dropout, PREC=prec,
                 SEED_PTR=seed_is_tensor),
            dict(num_warps=cfg.warps_f1), checked=(0,))
        ngroups = plan.ngroups if self.write_y else 1
        self.f2 = None
        if self.write_y or self.g_numel > 0:
            self.f2 = BoundLaunch(
                K_.f2_kernel, (plan.n_tiles * ngroups,), "f2", plan.buckets, cfg,
                ("Psave", "B", "Y", "bias", "G"),
                dict(g_numel=self.g_numel, tiles=plan.tiles, meta_i=plan.meta_i, meta_f=meta_f,
                     N=Nf, syn=Nf, sbm=lora_B.stride(0), ngroups=ngroups, nb_per=plan.ng_per,
                     BUCKETS=plan.buckets, **cfg.bm_kwargs(), BN=cfg.bn,
                     HAS_BIAS=self.has_bias and self.write_y, ZERO_G=self.g_numel > 0,
                     PREC=prec, WRITE_Y=self.write_y),
                dict(num_warps=cfg.warps_f2), checked=())

    def run(self, plan, x, weight, bias, lora_A, lora_B, seed):
        """One forward of ``plan`` (the plan this program was built for): (y, psave, gbuf).
        Shapes as in ``multi_lora_linear``."""
        y = torch.empty(self.y_shape, dtype=self.dtype, device=self.device)
        psave = torch.empty(self.p_numel, dtype=self.dtype, device=self.device)
        gbuf = torch.empty(max(self.g_numel, 1), dtype=torch.float32, device=self.device)
        if self.empty:  # every segment empty (then M == 0)
            if self.g_numel:
                gbuf.zero_()
            return y, psave, gbuf
        if self.tiny is not None:
            for bl in self.tiny:
                bl(x, lora_A, lora_B, y, bias if self.has_bias else y, psave, seed, gbuf)
        else:
            self.f1(x, lora_A, psave, seed)
        if self.tiny is None and self.f2 is not None:
            self.f2(psave, lora_B, y, bias if self.has_bias and self.write_y else y, gbuf)
        if self.gc is None:  # cuBLAS, beta = 1: the base GEMM adds onto the LoRA term
            wt = self._wt
            if wt is None or wt[0] is not weight or wt[1] != weight.data_ptr():
                wt = self._wt = (weight, weight.data_ptr(), weight.t())  # W^T view, kept
            y.addmm_(x, wt[2])
        else:
            self._gemm(plan, x, weight, psave, lora_B, bias, y)
        return y, psave, gbuf

    def _wdesc(self, weight):
        return _wdesc_of(self, weight, False)

    def _gemm(self, plan, x, weight, psave, lora_B, bias, y):
        """Our GEMM with s P B (+ bias) in its epilogue, bound at the first step."""
        if self.gemm is None:
            self.gemm = bound_gemm(plan, self.gc, False, self.prec, x, weight, lora_B,
                                   has_bias=self.has_bias)
        bl, tma = self.gemm
        if not tma:
            bl(x, weight, y, psave, lora_B, bias if self.has_bias else y, 0)
        elif x.data_ptr() & 15:  # TMA needs a 16-byte aligned base: the generic launch
            gemm_lora_forward(x, weight, psave, lora_B, bias, plan, self.gc, y, self.prec)
        else:
            bl(tma_desc(x, self.gc, False, True), self._wdesc(weight), y,
               psave, lora_B, bias if self.has_bias else y, 0)


class BackwardProgram:
    """The backward of ``plan`` for the forward's layout: ``run`` returns (dX or None, dA, dB)."""

    def __init__(self, plan, x, dy, lora_A, lora_B, seed_is_tensor: bool, dropout: bool,
                 need_x: bool):
        cfg = plan.cfg
        M, Kf = x.shape
        Nf = plan.out_features
        self.dtype, self.device = x.dtype, x.device   # no reference to the plan: it caches us
        self.need_x = need_x
        self.gc = choose_gemm(plan, "bwd", x.device) if need_x else None
        self.write_dx = need_x and self.gc is None
        self.dropout = dropout
        self.prec = prec = prec_of(x.dtype)
        self.x_shape = (M, Kf)
        self.ga_end = plan.sum_r * Kf
        self.a_shape, self.b_shape = (plan.sum_r, Kf), (plan.sum_r, Nf)
        # gradients of adapters without tokens are never written by a kernel: zero-filled
        self.empty = plan.n_tiles == 0
        self.zero_grads = self.empty or any(L == 0 for L in plan.seg_lens)
        self.q_atomic = plan.nsplit > 1
        self.p_numel = max(plan.p_size, 1)
        self.gemm = self._wd = self.tiny = None
        meta_f = plan.meta_f if dropout else plan.meta_f_nodrop
        if not self.empty:   # few tokens: one launch for b1 + b2 (``tiny``)
            self.tiny = bind_backward(plan, x, dy, lora_A, lora_B, seed_is_tensor, dropout,
                                      self.write_dx, prec)
        if not self.empty and self.tiny is None:
            n_nb = cdiv(Nf, cfg.bn)
            n_kb = cdiv(Kf, cfg.bk)
            n_q = plan.n_tiles * plan.nsplit
            # dA/dB of adapters with several token chunks: fp32 sums in a workspace that is
            # zero between steps (_gfin converts their rows and zeroes them again)
            multi = any(c > 1 for c in plan.nch)
            self.gacc = torch.zeros(plan.sum_r * (Kf + Nf) if multi else 1,
                                    dtype=torch.float32, device=x.device)
            self.b1 = BoundLaunch(
                K_.b1_kernel, (n_q + plan.n_chunks * n_nb,), "b1", plan.buckets, cfg,
                ("DY", "B", "Psave", "Q", "DB"),
                dict(GB=self.gacc[self.ga_end:] if multi else self.gacc, tiles=plan.tiles, chunks=plan.chunks, meta_i=plan.meta_i, meta_f=meta_f,
                     N=Nf, sdm=dy.stride(0), sbm=lora_B.stride(0), nsplit=plan.nsplit,
                     nb_per=plan.nb_per, n_q=n_q, n_nb=n_nb, BUCKETS=plan.buckets,
                     **cfg.bm_kwargs(), **cfg.cm_kwargs(), BN=cfg.bn, Q_ATOMIC=self.q_atomic,
                     PREC=prec),
                dict(num_warps=cfg.warps_b1), checked=(0,))
            self.b2 = BoundLaunch(
                K_.b2_kernel, (plan.n_chunks * n_kb,), "b2", plan.buckets, cfg,
                ("X", "A", "Q", "DXL", "DA", "seed"),
                dict(GA=self.gacc, chunks=plan.chunks, meta_i=plan.meta_i,
                     meta_f=meta_f, K=Kf, sxm=x.stride(0), sam=lora_A.stride(0), sdxm=Kf if self.write_dx else 0,
                     n_kb=n_kb, BUCKETS=plan.buckets, **cfg.bm_kwargs(), **cfg.cm_kwargs(),
                     BK=cfg.bk, DROPOUT=dropout, WRITE_DX=self.write_dx, PREC=prec,
                     SEED_PTR=seed_is_tensor),
                dict(num_warps=cfg.warps_b2), checked=(0,))
            self.gfin = None
            if multi:
                rows = [int(c > 1) for c, r in zip(plan.nch, plan.ranks) for _ in range(r)]
                self.gfin = BoundLaunch(
                    K_.gfin_kernel, (2 * plan.sum_r,), "gfin", 0, cfg, ("DA", "DB"),
                    dict(G=self.gacc, multi=torch.tensor(rows, dtype=torch.int32).to(x.device),
                         sum_r=plan.sum_r, K=Kf, N=Nf, BLOCK=1024),
                    dict(num_warps=4), start_stages=1, checked=())

    def run(self, plan, dy, x, weight, lora_A, lora_B, psave, gbuf, seed, need_A: bool,
            need_B: bool):
        """One backward of ``plan``: (dX (M, K) or None, dA (sum_r, K) or None, dB (sum_r, N) or
        None)."""
        dx = None
        new = torch.zeros if self.zero_grads else torch.empty
        dA = new(self.a_shape, dtype=lora_A.dtype, device=self.device)
        dB = new(self.b_shape, dtype=lora_B.dtype, device=self.device)
        if not self.empty:
            dxl = (torch.empty(self.x_shape, dtype=self.dtype, device=self.device)
                   if self.write_dx else x)
            # Q: fp32 sums of N-split partials in the zeroed workspace, else one bf16/fp16 store
            if self.tiny is not None:   # (cuBLAS then runs dX: self.gc is None)
                for bl in self.tiny:
                    bl(dy, x, lora_A, lora_B, psave, dxl, dA, dB, seed)
                if self.write_dx:
                    dx = dxl.addmm_(dy, weight)
                return dx, (dA if need_A else None), (dB if need_B else None)
            q = (gbuf if self.q_atomic
                 else torch.empty(self.p_numel, dtype=self.dtype, device=self.device))
            self.b1(dy, lora_B, psave, q, dB)
            self.b2(x, lora_A, q, dxl, dA, seed)
            # _gfin's pass: its own launch, or inside our persistent GEMM's programs that have
            # no tile in the last round (lora_gemm._bound_persist, GFIN)
            fold = self.gfin is not None and self.gc is not None and self.gc.persistent
            if self.gfin is not None and not fold:
                self.gfin(dA, dB)
            if self.write_dx:
                dx = dxl.addmm_(dy, weight)  # cuBLAS, beta = 1
            elif self.need_x:   # (self.gc is None only without need_x or with write_dx)
                dx = torch.empty(self.x_shape, dtype=self.dtype, device=self.device)
                done = self._gemm(plan, dy, weight, q, lora_A, seed, dx,
                                  *((dA, dB) if fold else ()))
                if fold and not done:
                    self.gfin(dA, dB)   # the GEMM did not take it
        elif self.need_x:
            dx = torch.zeros(self.x_shape, dtype=self.dtype, device=self.device)
        return dx, (dA if need_A else None), (dB if need_B else None)

    def _wdesc(self, weight):
        return _wdesc_of(self, weight, True)

    def _gemm(self, plan, dy, weight, q, lora_A, seed, dx, *grads) -> bool:
        """Our GEMM with mask(Q A^T) / (1 - p) in its epilogue, bound at the first step; with
        ``grads`` (dA, dB) a persistent GEMM may do ``_gfin``'s pass too: returns whether it
        did."""
        if self.gemm is None:
            self.gemm = bound_gemm(plan, self.gc, True, self.prec, dy, weight, lora_A,
                                   dropout=self.dropout,
                                   seed_is_tensor=isinstance(seed, torch.Tensor),
                                   gacc=self.gacc if self.gfin is not None else None)
        bl, tma = self.gemm
        if not tma:
            if getattr(bl, "folds", False) and grads:
                return bl(dy, weight, dx, q, lora_A, dx, seed, *grads)
            bl(dy, weight, dx, q, lora_A, dx, seed)
        elif dy.data_ptr() & 15:  # TMA needs a 16-byte aligned base: the generic launch
            gemm_lora_backward(dy, weight, q, lora_A, plan, self.gc, seed, self.dropout, dx,
                               self.prec)
        else:
            bl(tma_desc(dy, self.gc, True, True), self._wdesc(weight), dx, q,
               lora_A, dx, seed)
        return False


def _key(x, lora_A, lora_B, seed, dropout: bool, extra) -> tuple:
    return (x.dtype, x.device, x.stride(0), lora_A.stride(0), lora_B.stride(0),
            lora_A.dtype, lora_B.dtype,   # the gradients' dtypes are bound into b1 and b2
            isinstance(seed, torch.Tensor), dropout) + extra


def forward_program(plan, x, lora_A, lora_B, bias, seed, dropout: bool,
                    need_grads: bool) -> ForwardProgram:
    """The cached ``ForwardProgram`` of ``plan`` for these inputs (built on first use)."""
    key = ("fwdprog",) + _key(x, lora_A, lora_B, seed, dropout, (need_grads, bias is not None))
    p = plan.extra.get(key)
    if p is None:
        p = plan.extra[key] = ForwardProgram(plan, x, lora_A, lora_B, bias,
                                             isinstance(seed, torch.Tensor), dropout, need_grads)
    return p


def backward_program(plan, x, dy, lora_A, lora_B, seed, dropout: bool, need_x: bool,
                     fprog: "ForwardProgram | None" = None) -> BackwardProgram:
    """The cached ``BackwardProgram`` of ``plan`` for these inputs (built on first use); with
    ``fprog`` (the forward's program) looked up first in its small cache."""
    if fprog is not None:
        p = fprog.bwd.get((need_x, dy.stride(0)))
        if p is None:
            p = fprog.bwd[(need_x, dy.stride(0))] = backward_program(
                plan, x, dy, lora_A, lora_B, seed, dropout, need_x)
        return p
    key = ("bwdprog",) + _key(x, lora_A, lora_B, seed, dropout, (need_x, dy.stride(0)))
    p = plan.extra.get(key)
    if p is None:
        p = plan.extra[key] = BackwardProgram(plan, x, dy, lora_A, lora_B,
                                              isinstance(seed, torch.Tensor), dropout, need_x)
    return p
