"""Knobs and launch helpers shared by the fused multi-LoRA kernels: the tile configuration
(``KernelConfig``), the shared-memory model that picks pipeline stages per rank bucket, the
launch wrapper, and the dropout seed/threshold conventions (docs/kernel.md, "Fused multi-LoRA
kernel")."""
from __future__ import annotations

import dataclasses
import json
import os

import torch

MAX_RANK = 256


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """Tiles of the base GEMM with the LoRA epilogue (``lora_gemm``): bm x bn output tiles, bk of
    the reduced dimension per step, ``group_m`` row tiles per L2 group (the grouped ordering of
    Triton's matmul tutorial), ``warps`` and ``stages`` (Triton launch options); ``persistent``
    runs ``lora_gemm_persist``'s kernel (one program per SM over all tiles, its epilogue in ``split``
    column parts, 1, 2 or 4; ``flatten``: tile and reduction loops pipelined as one;
    ``lora_first``: the LoRA term before the main loop, as the per-tile kernel does, instead of
    after it) instead of one program per tile; ``tail_split``: the persistent kernel's last,
    partial round of tiles, when it holds at most half the SMs' worth, is reduced by two
    programs per tile (half of K each, ``lora_gemm.tail_split_tiles``; H100, 4096x4096 8+128:
    576 tiles on 132 SMs, each GEMM 9-10 us faster, step / base 1.405 -> 1.374)."""
    bm: int = 128
    bn: int = 128
    bk: int = 64
    group_m: int = 8
    warps: int = 8
    stages: int = 3
    persistent: bool = False
    split: int = 2
    flatten: bool = False
    lora_first: bool = False
    tail_split: bool = True

    def smem_bytes(self, stages: "int | None" = None) -> int:
        """Shared memory (bytes) at ``stages`` (default: ``self.stages``) pipeline stages: the
        larger of the main loop's buffers, stages copies of the bf16 operand tiles of one step
        ((bm + bn) x bk x 2 B), and the epilogue's low-rank operands of one rank chunk (at most
        64 ranks: (bm + bn) x 64 x 2 B), which Triton places in the same bytes (they are dead
        before the main loop's prologue loads), plus 64 B for the loop's barriers (8 B a stage).
        Triton 3.6 for sm_90 compiled stages x 49,152 + 8 x stages B for 128 x 256 x 64 and
        256 x 128 x 64 (147,480 B at 3 stages, 196,640 B at 4) and stages x 32,768 + 8 x stages
        B for 128 x 128 x 64, every rank bucket, both passes, also with 128-rank chunks
        (``bench/kernel_profile.py --smem``; profiler/KERNELS.md, session 15; the former model,
        the sum of both, kept 128 x 256 x 64 from 4 stages). ``launch`` still falls back to
        fewer stages if a GPU reports more.

        ``persistent`` (``lora_gemm_persist``, one program per SM; session 16): the stages plus the
        larger of one rank chunk's low-rank operands ((bm + w) x 64 x 2 B, w = bn with
        ``lora_first``, else bn / split) and the store's staging tile (bm x bn / split x 2 B);
        with ``flatten`` (the next tile's stages live while the epilogue runs) their sum.
        Triton 3.6 for sm_90 compiled 128 x 256 x 64 at 3 stages, split 2, LoRA first: 180,248 B
        (model 196,672); split 2 flattened 213,016 B (model 213,056); split 1 flattened 262,168 B
        (model 262,208); ``bench/kernel_profile.py --smem``, 90 variants pinned in
        profiler/data/kernel_profile_h100_2026-11-26_8_smem.json."""
        st = self.stages if stages is None else int(stages)
        if self.persistent:
            part = self.bn // max(1, int(self.split))
            lo = (self.bm + (self.bn if self.lora_first else part)) * 64 * 2
            store = self.bm * part * 2
            return st * (self.bm + self.bn) * self.bk * 2 \
                + (lo + store if self.flatten else max(lo, store)) + 64
        return max(st * (self.bm + self.bn) * self.bk * 2, (self.bm + self.bn) * 64 * 2) + 64

    def fitted_stages(self) -> int:
        """``stages`` lowered (down to 1) until ``smem_bytes`` fits ``SMEM_LIMIT_BYTES``."""
        st = int(self.stages)
        while st > 1 and self.smem_bytes(st) > SMEM_LIMIT_BYTES:
            st -= 1
        return st


BASE_GEMMS = ("auto", "cublas", "triton")


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Tile and launch knobs; the defaults are the configuration that ``bench/kernels.py --tune``
    picked on an H100 (see profiler/KERNELS.md). ``TLORA_KCFG`` (env, JSON) overrides fields.

    bms: token rows per tile of each rank bucket (R = 16, 32, 64, 128, 256; powers of two >= 16;
    rank 64 at 64 rows, was 128, since session 17: ``_b2``'s rank-64 CTAs then take 49,152 B
    instead of 98,304 and ``_b1``'s rank-64 launch 131,072 B instead of 196,608; H100, same-machine
    A/B over three rounds, step / base, 4096x4096 64x8 1.302 -> 1.289, 8-64 1.297 -> 1.256, mixed16
    1.334 -> 1.326; profiler/KERNELS.md); chunk_gran: token chunks (the rows of one dA/dB
    reduction program) are multiples of max(chunk_gran, max(bms)) rows (128: the chunks that the
    rank-64 tiles of 128 rows gave before, so mixes keep one chunk per adapter where they had
    one; at 64, 8-128x8 got two per adapter and a ``_gfin`` pass, step 1.306 -> 1.315);
    bk / bn: columns of X / of Y per tile (powers of two >= 32; bk 64, was 128, since session
    16's second helper: ``_f1`` at rank 128 then fits two CTAs per SM, 73,728 B and 107
    registers instead of 147,456 B and 164, and ``_b2``'s grid doubles; H100, step / base,
    4096x4096 128x2 1.411 -> 1.393, 8+128 1.411 -> 1.387, 64x8 1.328 -> 1.285, no mix of 13
    slower beyond noise; profiler/KERNELS.md); cms: column-width multiplier of each bucket in
    the kernels that re-read a rank-wide operand per column block (dA, dB: wider tiles for high
    ranks cut those re-reads); waves: target programs per SM used to choose the K/N splits and
    token chunks; split_floor: when every adapter's rank is
    >= 33 (rank buckets 64-256: one program per SM), the K splits of ``_f1`` and N groups of
    ``_f2`` are rounded down (grid <= the target, e.g. 4 x 64 tiles = 256 programs = two waves)
    instead of up (5 x 64 = 320: a third, part-empty wave; H100, 128x2: f1 46 -> 41 us, f2 30 ->
    23 us; with low ranks in the mix it lost, 8-128x8 f1 58 -> 65 us; profiler/KERNELS.md,
    session 13); num_warps / num_stages: Triton launch
    options per kernel (f1, f2, b1, b2); stages_b1_hi: b1's stages instead when every rank is >=
    33 (H100: b1 37 -> 33 us at 128x2, 32 -> 28 at 64x8, 111 -> 104 at 4096x14336 64x8; with
    rank-16 tiles in the mix 4 stages lost, 16x4 41 -> 44; profiler/KERNELS.md, session 14).
    base_gemm: who runs the frozen layer's two GEMMs:
    "cublas" (torch ``addmm_`` onto the LoRA term), "triton" (``lora_gemm``: our GEMM with the
    LoRA term in its epilogue) or "auto" (Triton only for the (pass, in, out) shapes where
    ``profiler/data/base_gemm.json`` records it measured faster than cuBLAS on this GPU);
    gemm_fwd / gemm_bwd override that table's tiles; gemm_tma: that GEMM reads its operands
    through TMA descriptors where the tensors allow (else plain pointer loads).
    bwd_cublas (under "auto"): "table" (the backward as the table says), "tail" (cuBLAS instead
    of our persistent backward wherever that GEMM would split its last round, i.e. the last round holds
    at most half the SMs' tiles, ``lora_gemm.tail_split_tiles``: wave quantisation, e.g. 4096x4096
    at 4,608 tokens, 576 tiles on 132 SMs, where cuBLAS's 192 x 192 tiles make 4 whole rounds;
    H100, 8+128, step / base 1.365 -> 1.333; profiler/KERNELS.md, session 18) or "always".
    gfin_fold_bytes: ``_gfin``'s pass (multi-chunk dA/dB rows out of the fp32 workspace) is done
    by our persistent backward GEMM's programs that have no tile in its last round, instead of a
    launch of its own, when it moves at most this many bytes per such program (0: never;
    ``lora_gemm._bound_persist``).
    tiny_tokens: at most this many tokens, the forward's ``_f1`` + ``_f2`` run as one launch
    (``tiny._tf_kernel``: the tile's K splits of P meet on a counter in device memory, one
    program per SM), and so do the backward's ``_b1`` + ``_b2`` (``tiny._tb_kernel``) where
    ``_b1`` would leave Q unsplit over N (``plan.nsplit`` 1); only with cuBLAS for both base
    GEMMs and at most one row tile per SM. -1 (the default): 512 on CUDA devices where every
    adapter with tokens has rank <= 64 (the range measured), off elsewhere (the interpreter,
    where nothing is latency-bound and the four-launch path keeps its tests); 0: never. H100,
    small4 (512 tokens), step / base 4096x4096 1.56 -> 1.50, 4096x14336 1.45 -> 1.23,
    8192x8192 1.33 -> 1.25, 14336x4096 1.29 -> 1.27 (profiler/KERNELS.md, session 19).
    tiny_ctas: programs per SM of that path's backward launch (``_tb_kernel``): n >= 2, n per SM
    (registers capped by ``maxnreg`` at the SM's file / (n x threads)) where the compiled kernel
    fits n without spilling (``tiny.resident_ctas``: every program must be resident, as
    consumers spin; else fewer), run where ``plan.nsplit`` is 1 or every program takes at most
    one dX / dA block; 1: one per SM, only where ``plan.nsplit`` is 1 (session 19's rule); 0: the
    four-launch backward always. H100, small4, step / base, default against 1, same call:
    4096x4096 1.494-1.505 against 1.511-1.527, 4096x14336 1.21 against 1.244-1.252, 8192x8192
    1.199 against 1.245-1.255 (profiler/KERNELS.md, session 20)."""
    bms: tuple = (64, 64, 64, 64, 64)
    cms: tuple = (1, 1, 1, 1, 1)
    bk: int = 64
    bn: int = 128
    waves: float = 2.0
    max_split: int = 16
    split_floor: bool = True
    chunk_gran: int = 128
    warps_f1: int = 8
    warps_f2: int = 8
    warps_b1: int = 8
    warps_b2: int = 8
    stages_f1: int = 3
    stages_f2: int = 3
    stages_b1: int = 3
    stages_b2: int = 3
    stages_b1_hi: int = 4
    base_gemm: str = "auto"
    gemm_tma: bool = True
    gemm_fwd: "GemmConfig | None" = None
    gemm_bwd: "GemmConfig | None" = None
    bwd_cublas: str = "tail"
    gfin_fold_bytes: int = 1_600_000
    tiny_tokens: int = -1
    tiny_ctas: int = 2

    def __post_init__(self):
        if self.base_gemm not in BASE_GEMMS:
            raise ValueError(f"base_gemm must be one of {BASE_GEMMS}, got {self.base_gemm!r}")
        if self.bwd_cublas not in ("table", "tail", "always"):
            raise ValueError(f"bwd_cublas must be table, tail or always, got {self.bwd_cublas!r}")

    @classmethod
    def from_env(cls) -> "KernelConfig":
        """Defaults overridden by the JSON object in ``TLORA_KCFG`` (if set)."""
        raw = os.environ.get("TLORA_KCFG")
        if not raw:
            return cls()
        d = json.loads(raw)
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict) -> "KernelConfig":
        """A config from a JSON-like dict (lists for bms/cms, dicts for gemm_fwd/gemm_bwd).
        Raises TypeError on unknown fields, ValueError on a bad ``base_gemm``."""
        d = dict(d)
        for k in ("bms", "cms"):
            if k in d:
                d[k] = tuple(d[k])
        for k in ("gemm_fwd", "gemm_bwd"):
            if isinstance(d.get(k), dict):
                d[k] = GemmConfig(**d[k])
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
    ``stages`` pipeline stages (bf16 tiles 2 B, fp32 4 B; R the bucket's rank, BM its token rows,
    CM its column multiplier, BK / BN the config's column tiles). Triton's software pipelining
    keeps ``stages`` copies of the tiles a loop loads; loops in exclusive branches or in sequence
    do not hold their buffers at once; a tile loaded once outside the loop and the scratch of
    the epilogue's layout conversion add to them:

        f1  max(stages x (BM x BK + R x BK) x 2,  BM x R x 4)            X, A; P's fp32 store
        f2  stages x R x BN x 2 + BM x BN x 2 + BM x R x 2                 B; Y tile; P tile
        b1  max(stages x max((BM + R) x BN, BM x R + BM x BN x CM) x 2,   Q loop, dB loop
                min(R, 128) x BN x CM x 4)                                 dB's fp32 conversion
        b2  stages x (BM x R + BM x BK x CM) x 2 + (R + BM) x BK x CM x 2  Q, X; A; dX tile

    An upper bound of what Triton 3.6 compiles for sm_90 (``CompiledKernel.metadata.shared``,
    H100 image, 2026-11-26: every bucket, 1-4 stages, the four tile configurations of
    tests/gpu/test_kernel_smem.py and every flag that changes a loop's loads; 320 numbers, pinned in
    profiler/data/kernel_profile_h100_2026-11-26_7_smem.json and checked by that test; equal to
    the compiled need at, e.g., f1 and f2 rank 256 / 3 stages 245,760 B (the two requirements an
    H100 reported when rank 256 failed, session 7), b2 rank 64 / 3 stages 196,608 B, b1 rank 128
    / 4 stages 196,608 B). The former model (a BM x R margin per stage instead of the scratch
    terms) was below the compiled need for b2 at every bucket (rank 64, 3 stages: 188,416 B
    modelled) and for f2 at 2-4 stages (profiler/KERNELS.md, session 15). ``launch`` still falls
    back to fewer stages if a GPU reports more than this.
    """
    R, BM, CM = _RANKS_OF_BUCKET[bucket], int(cfg.bms[bucket]), int(cfg.cms[bucket])
    BK, BN = cfg.bk, cfg.bn
    if kernel == "f1":
        return max(stages * (BM * BK + R * BK) * 2, BM * R * 4)
    if kernel == "f2":
        return stages * R * BN * 2 + BM * BN * 2 + BM * R * 2
    if kernel == "b1":
        return max(stages * max((BM + R) * BN, BM * R + BM * BN * CM) * 2,
                   min(R, 128) * BN * CM * 4)
    if kernel == "b2":
        return stages * (BM * R + BM * BK * CM) * 2 + (R + BM) * BK * CM * 2
    raise ValueError(f"unknown kernel {kernel!r}")


def stages_for(kernel: str, buckets: int, cfg: "KernelConfig") -> int:
    """The configured ``num_stages`` of ``kernel`` (``stages_b1_hi`` for b1 when no bucket below
    rank 33 is in ``buckets``), lowered (down to 1) until every rank bucket in the ``buckets`` bit
    mask fits ``SMEM_LIMIT_BYTES`` (``smem_bytes``); mixes of low ranks keep the tuned stages."""
    stages = int(getattr(cfg, f"stages_{kernel}"))
    if kernel == "b1" and buckets and not buckets & 0b11:   # every rank >= 33
        stages = int(cfg.stages_b1_hi)
    included = [b for b in range(len(_RANKS_OF_BUCKET)) if buckets >> b & 1]
    while stages > 1 and any(smem_bytes(kernel, b, cfg, stages) > SMEM_LIMIT_BYTES for b in included):
        stages -= 1
    return stages


STAGES_SEEN: dict = {}
"""What ``launch`` remembers: (kernel name, rank buckets, ``KernelConfig``, PREC) -> the pipeline
stages that launched (after any shared-memory fallback). Its keys also say which kernels ran;
clearing it makes the next launches start again from ``stages_for``."""


def launch(kernel, grid, name: str, buckets: int, cfg: "KernelConfig", *args,
           start_stages: "int | None" = None, **kwargs):
    """Launch ``kernel[grid](*args, **kwargs)`` with ``stages_for(name, buckets, cfg)`` pipeline stages
    (or ``start_stages``, for kernels whose stages the caller sized, e.g. the base GEMM); if the GPU
    still reports too little shared memory (Triton's ``OutOfResources``), retry with one stage fewer
    (down to 1) and remember what launched for this kernel and configuration. Returns what Triton's
    launch returns: the ``CompiledKernel`` that ran (None under the interpreter)."""
    key = (name, buckets, cfg, kwargs.get("PREC"))  # what decides the tiles' shared memory
    stages = STAGES_SEEN.get(key)
    if stages is None:
        stages = start_stages if start_stages is not None else stages_for(name, buckets, cfg)
    while True:
        try:
            compiled = kernel[grid](*args, num_stages=stages, **kwargs)
            STAGES_SEEN[key] = stages
            return compiled
        except Exception as e:  # noqa: BLE001 - only Triton's resource error is retried
            if type(e).__name__ != "OutOfResources" or stages <= 1:
                raise
            stages -= 1


def seed_args(seed) -> tuple:
    """(seed argument, SEED_PTR) of the kernels: a mixed int seed (``mix_seed``), or the graph
    path's counter tensor, which the kernels read and mix themselves."""
    if isinstance(seed, torch.Tensor):
        return seed, True
    return int(seed), False


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


def bucket_of(r: int) -> int:
    """Rank bucket index of rank r: the first R in (16, 32, 64, 128, 256) with r <= R.
    Raises ValueError for r > 256."""
    for i, R in enumerate(_RANKS_OF_BUCKET):
        if r <= R:
            return i
    raise ValueError(f"rank {r} > {MAX_RANK}")


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)


