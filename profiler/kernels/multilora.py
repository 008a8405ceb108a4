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

import dataclasses
import json
import math
import os
from typing import Optional, Sequence

import torch

from . import _triton as K_

__all__ = ["KernelConfig", "LoRAPlan", "build_plan", "multi_lora_linear", "MultiLoRALinear",
           "keep_threshold", "mix_seed", "dropout_keep_mask_triton", "MAX_RANK"]

MAX_RANK = 256


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Tile and launch knobs; the defaults are the configuration that ``bench/kernels.py --tune``
    picked on an H100 (see profiler/KERNELS.md). ``TLORA_KCFG`` (env, JSON) overrides fields.

    bms: token rows per tile of each rank bucket (R = 16, 32, 64, 128, 256; powers of two >= 16);
    bk / bn: columns of X / of Y per tile (powers of two >= 32); cms: column-width multiplier of
    each bucket in the kernels that re-read a rank-wide operand per column block (dA, dB: wider
    tiles for high ranks cut those re-reads); waves: target programs per SM
    used to choose the K/N splits and token chunks; num_warps / num_stages: Triton launch
    options per kernel (f1, f2, b1, b2)."""
    bms: tuple = (64, 64, 128, 64, 64)
    cms: tuple = (1, 1, 1, 1, 1)
    bk: int = 128
    bn: int = 128
    waves: float = 2.0
    max_split: int = 16
    warps_f1: int = 8
    warps_f2: int = 8
    warps_b1: int = 8
    warps_b2: int = 8
    stages_f1: int = 3
    stages_f2: int = 3
    stages_b1: int = 3
    stages_b2: int = 3

    @classmethod
    def from_env(cls) -> "KernelConfig":
        """Defaults overridden by the JSON object in ``TLORA_KCFG`` (if set)."""
        raw = os.environ.get("TLORA_KCFG")
        if not raw:
            return cls()
        d = json.loads(raw)
        for k in ("bms", "cms"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)

    def bm_kwargs(self) -> dict:
        """Token rows per tile of each bucket, as the kernels' BM0..BM4 constexprs."""
        return {f"BM{i}": int(b) for i, b in enumerate(self.bms)}

    def cm_kwargs(self) -> dict:
        """Column multipliers of each bucket, as the kernels' CM0..CM4 constexprs."""
        return {f"CM{i}": int(c) for i, c in enumerate(self.cms)}


SMEM_LIMIT_BYTES = 232_448
"""Largest shared memory one block may use on the H100 and H200 (sm_90: 227 KiB opt-in)."""
_RANKS_OF_BUCKET = (16, 32, 64, 128, 256)


def smem_bytes(kernel: str, bucket: int, cfg: "KernelConfig", stages: int) -> int:
    """Shared memory (bytes) kernel ``kernel`` (f1, f2, b1, b2) needs for rank bucket ``bucket`` at
    ``stages`` pipeline stages: Triton's software pipelining keeps ``stages`` copies of the tiles a
    loop loads, so the need is stages x the bytes one iteration loads (bf16 tiles 2 B, the fp32
    partial sums of f2 4 B), taking the largest loop of the kernel (loops in exclusive branches or
    in sequence do not hold their buffers at once), plus b2's rank-wide A tile loaded once. Fitted
    to the two requirements Triton 3.6 reported on an H100 at rank 256 and 3 stages (BM 64, BK = BN
    = 128): f1 245,760 B = 3 x (BM x BK + R x BK) x 2, and f2 245,760 B = 3 x (R x BN x 2 + BM x R),
    the BM x R term being the converted P operand; b1 and b2 carry the same BM x R term as a
    margin. ``launch`` still falls back to fewer stages if a GPU reports more than this.
    """
    R, BM, CM = _RANKS_OF_BUCKET[bucket], int(cfg.bms[bucket]), int(cfg.cms[bucket])
    BK, BN = cfg.bk, cfg.bn
    per_stage = {"f1": (BM * BK + R * BK) * 2,
                 "f2": R * BN * 2 + BM * R,
                 "b1": max((BM * BN + R * BN) * 2, (BM * R + BM * BN * CM) * 2) + BM * R,
                 "b2": (BM * R + BM * BK * CM) * 2 + BM * R}[kernel]
    once = R * BK * CM * 2 if kernel == "b2" else 0
    return stages * per_stage + once


def stages_for(kernel: str, buckets: int, cfg: "KernelConfig") -> int:
    """The configured ``num_stages`` of ``kernel``, lowered (down to 1) until every rank bucket in the
    ``buckets`` bit mask fits ``SMEM_LIMIT_BYTES`` (``smem_bytes``); mixes of low ranks keep the
    tuned stages."""
    stages = int(getattr(cfg, f"stages_{kernel}"))
    included = [b for b in range(len(_RANKS_OF_BUCKET)) if buckets >> b & 1]
    while stages > 1 and any(smem_bytes(kernel, b, cfg, stages) > SMEM_LIMIT_BYTES for b in included):
        stages -= 1
    return stages


_STAGES_SEEN: dict = {}  # (kernel name, constexpr args) -> stages that launched


def launch(kernel, grid, name: str, buckets: int, cfg: "KernelConfig", *args, **kwargs) -> None:
    """Launch ``kernel[grid](*args, **kwargs)`` with ``stages_for(name, buckets, cfg)`` pipeline stages;
    if the GPU still reports too little shared memory (Triton's ``OutOfResources``), retry with one
    stage fewer (down to 1) and remember what launched for this kernel and configuration."""
    key = (name, buckets, cfg, kwargs.get("PREC"))  # what decides the tiles' shared memory
    stages = _STAGES_SEEN.get(key, stages_for(name, buckets, cfg))
    while True:
        try:
            kernel[grid](*args, num_stages=stages, **kwargs)
            _STAGES_SEEN[key] = stages
            return
        except Exception as e:  # noqa: BLE001 - only Triton's resource error is retried
            if type(e).__name__ != "OutOfResources" or stages <= 1:
                raise
            stages -= 1


def mix_seed(seed: int) -> int:
    """Seed as passed to the kernels: a hash of ``seed`` folded into [0, 2**31)."""
    h = (int(seed) * 0x9E3779B1 + 0x632BE5AB) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    return h & 0x7FFFFFFF


def keep_threshold(p: float) -> int:
    """Element kept iff its 16-bit hash half >= round(p * 2**16): keep probability 1 - p to
    within 2**-17 (see ``reference.keep_mask``)."""
    return int(round(float(p) * (1 << 16)))


def _bucket(r: int) -> int:
    for i, R in enumerate(K_.BUCKET_R):
        if r <= R:
            return i
    raise ValueError(f"rank {r} > {MAX_RANK}")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass
class LoRAPlan:
    """Launch plan of one (segments, ranks, layer) configuration, built once and reused.

    Host fields are plain Python; ``meta_i``/``meta_f``/``tiles``/``chunks`` live on the device
    (uploaded once, so the step itself makes no host-to-device copy and can be graph-captured)."""
    seg_lens: tuple
    ranks: tuple
    scales: tuple
    dropout: tuple
    in_features: int
    out_features: int
    starts: tuple
    roffs: tuple
    sum_r: int
    p_size: int
    buckets: int
    n_tiles: int
    n_chunks: int
    ksplit: int
    kb_per: int
    nsplit: int
    nb_per: int
    ngroups: int
    ng_per: int
    cfg: KernelConfig
    meta_i: torch.Tensor
    meta_f: torch.Tensor
    tiles: torch.Tensor
    chunks: torch.Tensor
    meta_f_nodrop: torch.Tensor  # meta_f with 1/(1-p) = 1 (dropout off)

    @property
    def n_tokens(self) -> int:
        return sum(self.seg_lens)

    @property
    def has_dropout(self) -> bool:
        return any(p > 0 for p in self.dropout)


def build_plan(seg_lens: Sequence[int], ranks: Sequence[int], scales: Sequence[float],
               dropout: Sequence[float] | float, in_features: int, out_features: int,
               device: torch.device | str, cfg: Optional[KernelConfig] = None,
               n_sm: Optional[int] = None) -> LoRAPlan:
    """Build the tiles and metadata of one multi-LoRA configuration.

    seg_lens[i] >= 0 tokens (0 allowed) and ranks[i] in [1, 256] of adapter i; scales s_i
    (alpha_i / r_i); dropout p_i in [0, 1) (one float for all). Raises ValueError on any
    inconsistency. Token tiles hold BM rows of one adapter (BM of its rank bucket); the K/N
    splits and token chunks are chosen for ``cfg.waves`` programs per SM (``n_sm`` defaults to
    the device's SM count, 8 on CPU)."""
    cfg = cfg or KernelConfig.from_env()
    n = len(ranks)
    if n == 0:
        raise ValueError("at least one adapter is required")
    if isinstance(dropout, (int, float)):
        dropout = [float(dropout)] * n
    seg_lens = [int(v) for v in seg_lens]
    ranks = [int(r) for r in ranks]
    scales = [float(s) for s in scales]
    dropout = [float(p) for p in dropout]
    if not (len(seg_lens) == len(scales) == len(dropout) == n):
        raise ValueError(f"seg_lens ({len(seg_lens)}), ranks ({n}), scales ({len(scales)}) and "
                         f"dropout ({len(dropout)}) must have one entry per adapter")
    if any(v < 0 for v in seg_lens):
        raise ValueError(f"segment lengths must be >= 0, got {seg_lens}")
    if any(r < 1 or r > MAX_RANK for r in ranks):
        raise ValueError(f"ranks must be in [1, {MAX_RANK}], got {ranks}")
    if any(not (0.0 <= p < 1.0) for p in dropout):
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if any(not math.isfinite(s) for s in scales):
        raise ValueError(f"scales must be finite, got {scales}")
    if in_features < 1 or out_features < 1:
        raise ValueError("in_features and out_features must be >= 1")
    device = torch.device(device)
    if n_sm is None:
        n_sm = (torch.cuda.get_device_properties(device).multi_processor_count
                if device.type == "cuda" else 8)
    target = max(1, int(cfg.waves * n_sm))
    Kf, Nf = in_features, out_features
    starts, roffs, poffs = [], [], []
    s = ro = po = 0
    for L, r in zip(seg_lens, ranks):
        starts.append(s); roffs.append(ro); poffs.append(po)
        s += L; ro += r; po += L * r
    buckets = [_bucket(r) for r in ranks]
    mask = 0
    tiles, chunks = [], []
    M = s
    nkb, nnb = _cdiv(Kf, cfg.bk), _cdiv(Nf, cfg.bn)
    # token chunks for the reductions over tokens (dA, dB): ~target programs over min(nkb, nnb)
    n_chunk_target = max(1, _cdiv(target, min(nkb, nnb)))
    gran = max(cfg.bms)
    chunk_rows = max(gran, _cdiv(_cdiv(max(M, 1), n_chunk_target), gran) * gran)
    for i, (L, r, b) in enumerate(zip(seg_lens, ranks, buckets)):
        if L == 0:
            continue
        mask |= 1 << b
        bm = cfg.bms[b]
        for m0 in range(starts[i], starts[i] + L, bm):
            tiles.append((bm, i, m0, min(m0 + bm, starts[i] + L)))
        for m0 in range(starts[i], starts[i] + L, chunk_rows):
            chunks.append((r, i, m0, min(m0 + chunk_rows, starts[i] + L)))
    # heaviest first (longest-processing-time order): bigger tiles, higher ranks
    tiles.sort(key=lambda t: (-t[0], t[2]))
    chunks.sort(key=lambda c: (-(c[3] - c[2]) * (c[0] + 16), c[2]))
    n_tiles, n_chunks = len(tiles), len(chunks)
    ksplit = max(1, min(cfg.max_split, nkb, _cdiv(target, max(n_tiles, 1))))
    kb_per = _cdiv(nkb, ksplit)
    ksplit = _cdiv(nkb, kb_per)
    # Q = dY B^T needs no N split (and no atomics) when the dB programs of the same launch
    # already fill the GPU
    short = target - n_chunks * nnb
    nsplit = 1 if short <= 0 else max(1, min(cfg.max_split, nnb, _cdiv(short, max(n_tiles, 1))))
    nb_per = _cdiv(nnb, nsplit)
    nsplit = _cdiv(nnb, nb_per)
    ngroups = max(1, min(nnb, _cdiv(target, max(n_tiles, 1))))
    ng_per = _cdiv(nnb, ngroups)
    ngroups = _cdiv(nnb, ng_per)
    meta_i = torch.tensor([[starts[i], seg_lens[i], ranks[i], roffs[i], poffs[i], buckets[i],
                            keep_threshold(dropout[i]), 0] for i in range(n)],
                          dtype=torch.int32).reshape(n, K_.META_I)
    meta_f = torch.tensor([[scales[i], 1.0 / (1.0 - dropout[i])] for i in range(n)],
                          dtype=torch.float32).reshape(n, K_.META_F)
    meta_f_nodrop = meta_f.clone()
    meta_f_nodrop[:, 1] = 1.0
    t_t = torch.tensor([t[1:] for t in tiles] or [[0, 0, 0]], dtype=torch.int32)
    c_t = torch.tensor([c[1:] for c in chunks] or [[0, 0, 0]], dtype=torch.int32)
    return LoRAPlan(tuple(seg_lens), tuple(ranks), tuple(scales), tuple(dropout), Kf, Nf,
                    tuple(starts), tuple(roffs), ro, po, mask, n_tiles, n_chunks,
                    ksplit, kb_per, nsplit, nb_per, ngroups, ng_per, cfg,
                    meta_i.to(device), meta_f.to(device), t_t.to(device), c_t.to(device),
                    meta_f_nodrop.to(device))


def _prec(dtype: torch.dtype) -> str:
    """Dot mode: fp32 inputs exact ("ieee"); under the CPU interpreter, bf16/fp16 dots in fp32."""
    if dtype == torch.float32:
        return "ieee"
    return "interp" if os.environ.get("TRITON_INTERPRET") == "1" else "tf32"


def _gbuf_numel(plan: LoRAPlan) -> int:
    """fp32 workspace of the backward: dA (sum_r x K), dB (sum_r x N), Q (compact, p_size)."""
    return plan.sum_r * (plan.in_features + plan.out_features) + plan.p_size


def _lora_forward(x, lora_A, lora_B, bias, plan: LoRAPlan, seed: int, dropout_on: bool,
                  need_grads: bool):
    """Run _f1 and _f2: returns (y_lora(+bias), psave, gbuf); y then receives x W^T (cuBLAS).
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
    launch(K_._f1_kernel, (plan.n_tiles * plan.ksplit,), "f1", plan.buckets, cfg,
        x, lora_A, ppart, plan.tiles, plan.meta_i, Kf, x.stride(0), lora_A.stride(0),
        plan.p_size, plan.ksplit, plan.kb_per, seed,
        BUCKETS=plan.buckets, **cfg.bm_kwargs(), BK=cfg.bk, DROPOUT=dropout, PREC=prec,
        num_warps=cfg.warps_f1)
    has_bias = bias is not None
    launch(K_._f2_kernel, (plan.n_tiles * plan.ngroups,), "f2", plan.buckets, cfg,
        ppart, psave, lora_B, y, bias if has_bias else y, gbuf, g_numel, plan.tiles,
        plan.meta_i, plan.meta_f if dropout else _nodrop_meta_f(plan), Nf, y.stride(0),
        lora_B.stride(0), plan.p_size, plan.ksplit, plan.ngroups, plan.ng_per,
        BUCKETS=plan.buckets, **cfg.bm_kwargs(), BN=cfg.bn, HAS_BIAS=has_bias, ZERO_G=g_numel > 0, PREC=prec,
        num_warps=cfg.warps_f2)
    return y, psave, gbuf


def _nodrop_meta_f(plan: LoRAPlan) -> torch.Tensor:
    return plan.meta_f_nodrop


def _lora_backward(dy, x, lora_A, lora_B, psave, gbuf, plan: LoRAPlan, seed: int,
                   dropout_on: bool, write_dx: bool):
    """Run _b1 and _b2: returns dX_lora (M, K) or None; gbuf (zeroed) receives dA^T
    (sum_r x K), dB (sum_r x N) and, on the way, Q = s dY B^T."""
    M, Kf = x.shape
    Nf = plan.out_features
    cfg = plan.cfg
    dev = x.device
    dxl = torch.empty(M, Kf, dtype=x.dtype, device=dev) if write_dx else None
    if plan.n_tiles == 0:
        return dxl
    dropout = dropout_on and plan.has_dropout
    meta_f = plan.meta_f if dropout else _nodrop_meta_f(plan)
    gA = gbuf[: plan.sum_r * Kf]
    gB = gbuf[plan.sum_r * Kf: plan.sum_r * (Kf + Nf)]
    q_atomic = plan.nsplit > 1
    # Q: fp32 sums of N-split partials in the zeroed workspace, else one bf16/fp16 store
    q = gbuf[plan.sum_r * (Kf + Nf):] if q_atomic else torch.empty(
        max(plan.p_size, 1), dtype=x.dtype, device=dev)
    prec = _prec(x.dtype)
    n_nb = _cdiv(Nf, cfg.bn)
    n_q = plan.n_tiles * plan.nsplit
    launch(K_._b1_kernel, (n_q + plan.n_chunks * n_nb,), "b1", plan.buckets, cfg,
        dy, lora_B, psave, q, gB, plan.tiles, plan.chunks, plan.meta_i, meta_f, Nf,
        dy.stride(0), lora_B.stride(0), plan.nsplit, plan.nb_per, n_q, n_nb,
        BUCKETS=plan.buckets, **cfg.bm_kwargs(), **cfg.cm_kwargs(), BN=cfg.bn,
        Q_ATOMIC=q_atomic, PREC=prec, num_warps=cfg.warps_b1)
    n_kb = _cdiv(Kf, cfg.bk)
    launch(K_._b2_kernel, (plan.n_chunks * n_kb,), "b2", plan.buckets, cfg,
        x, lora_A, q, dxl if write_dx else x, gA, plan.chunks,
        plan.meta_i, meta_f, Kf, x.stride(0), lora_A.stride(0),
        dxl.stride(0) if write_dx else 0, n_kb, seed,
        BUCKETS=plan.buckets, **cfg.bm_kwargs(), **cfg.cm_kwargs(), BK=cfg.bk,
        DROPOUT=dropout, WRITE_DX=write_dx, PREC=prec,
        num_warps=cfg.warps_b2)
    return dxl


class _MultiLoRAFunction(torch.autograd.Function):
    """y = x W^T + bias + s_i drop(x_i) A_i B_i per segment; gradients dX, dA_i, dB_i (and dW,
    dbias only if asked: the base is meant to be frozen)."""

    @staticmethod
    def forward(ctx, x, weight, bias, lora_A, lora_B, plan, seed, dropout_on):
        need_grads = any(ctx.needs_input_grad[i] for i in (0, 3, 4))
        y, psave, gbuf = _lora_forward(x, lora_A, lora_B, bias, plan, seed, dropout_on,
                                       need_grads)
        y.addmm_(x, weight.t())  # cuBLAS, beta = 1: the base GEMM adds onto the LoRA term
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
        write_dx = need_x
        if need_A or need_B or write_dx:
            dxl = _lora_backward(dy, x, lora_A, lora_B, psave, gbuf, plan, ctx.seed,
                                 ctx.dropout_on, write_dx)
        else:
            dxl = None
        dx = dxl.addmm_(dy, weight) if write_dx else None  # cuBLAS, beta = 1
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
                      seed: int = 0, dropout_on: bool = True) -> torch.Tensor:
    """Fused multi-LoRA linear: (M, K) -> (M, N), differentiable in x, lora_A, lora_B (and in
    weight/bias if they require grad, through plain torch).

    Per adapter i (rows of segment i): y = x weight^T + bias + s_i (drop_i(x) A_i) B_i with
    A_i = lora_A[o_i:o_i+r_i]^T, B_i = lora_B[o_i:o_i+r_i] (docs/kernel.md "Fused multi-LoRA
    kernel"; Hu et al. 2021 eq. 3). ``seed`` (int) picks the dropout mask
    (``reference.keep_mask(M, K, seed, p)`` rebuilds it); ``dropout_on=False`` disables dropout.
    Raises ValueError on shape, device or segment mismatch."""
    _check(x, weight, bias, lora_A, lora_B, plan)
    x = x.contiguous()
    return _MultiLoRAFunction.apply(x, weight, bias, lora_A, lora_B, plan, mix_seed(seed),
                                    bool(dropout_on))


def dropout_keep_mask_triton(M: int, K: int, seed: int, p: float, device) -> torch.Tensor:
    """The (M, K) int8 keep mask (1 = kept) the kernels use for ``seed`` and probability p."""
    out = torch.empty(M, K, dtype=torch.int8, device=device)
    if M and K:
        K_._mask_kernel[(_cdiv(M, 32), _cdiv(K, 32))](out, M, K, mix_seed(seed),
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
    Raises ValueError on bad ranks/segments/shapes."""

    def __init__(self, in_features: int, out_features: int, ranks: Sequence[int],
                 alphas: Optional[Sequence[float]] = None, dropout: float | Sequence[float] = 0.0,
                 bias: bool = False, scales: Optional[Sequence[float]] = None,
                 dtype: torch.dtype = torch.bfloat16, device=None,
                 adapter_dtype: Optional[torch.dtype] = None,
                 kernel_config: Optional[KernelConfig] = None):
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
        if seed is None:
            seed = int(torch.randint(0, 2 ** 31 - 1, (), generator=self._gen))
        y = multi_lora_linear(x2, self.weight, self.lora_A, self.lora_B, plan, self.bias,
                              seed=seed, dropout_on=self.training)
        self.last_seed = seed
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"ranks={list(self.ranks)}, dropout={list(self.dropout)}")
