"""Triton kernel of the frozen layer's GEMM with the LoRA term in its epilogue (docs/kernel.md,
"Fused multi-LoRA kernel"; LoRA: Hu et al. 2021, eq. 3).

One kernel, two passes (constexpr ``BWD``), over output tiles (BM rows x BN columns):

    forward   Y[rows, cols]  = X[rows] W^T[:, cols] (+ bias)  + s_i Psave_i[rows] B_i[:, cols]
    backward  dX[rows, cols] = dY[rows] W[:, cols]  + (Q_i[rows] A_i^T[:, cols]) * mask_i / (1 - p_i)

Row tiles follow the adapters' token segments (a tile never holds two adapters: it is clipped at
its segment's end), so the epilogue adds one adapter's low-rank product, with tiles of that
adapter's rank bucket R (16..256) taken in chunks of at most 64 ranks (the chunk bounds the
epilogue's shared memory; chunks past the adapter's rank are skipped at run time). Rows past a
tile's end are computed from the next segment's rows and never stored. Psave (P_i, already
divided by 1 - p_i) and Q_i are the compact per-adapter buffers of ``lora_kernels`` (row-major
(len_i, R_i) at offset poff_i, rows padded to the bucket with zeros); B_i and A_i^T are rows
roff_i .. roff_i + r_i of lora_B / lora_A.

The main loop reads its operands through TMA tensor descriptors where the tensors allow it
(16-byte aligned base and row strides), else through plain pointers.

This replaces, per pass, one write of the LoRA term by ``_f2`` / ``_b2`` and one read of it by
cuBLAS's ``addmm_`` (beta = 1): 2 x M x N x 2 bytes forward and 2 x M x K x 2 bytes backward.
``LORA=False`` gives the plain GEMM (for the comparison with cuBLAS).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .lora_kernels import dot_prec, keep_tile, pq_offset, seed_value


@triton.jit
def _lowrank(acc, LO, RI, sri, lo_scale, rows, rmask, cols, cmask, start, rank, roff, poff,
             R: tl.constexpr, RC: tl.constexpr, PREC: tl.constexpr):
    """acc (BM, BN) += (lo_scale * LO_i[rows, :rank]) @ RI[roff + (0..rank), cols], in chunks of
    RC ranks of the bucket's R (bf16 operands, fp32 accumulation)."""
    for r0 in tl.static_range(0, R, RC):
        if r0 < rank:
            rr = r0 + tl.arange(0, RC)
            rkm = rr < rank
            lo = tl.load(LO + pq_offset(poff) + (rows - start)[:, None] * R + rr[None, :],
                         mask=rmask[:, None], other=0.0)   # rows padded to R (zeros)
            ri = tl.load(RI + (roff + rr).to(tl.int64)[:, None] * sri + cols[None, :],
                         mask=rkm[:, None] & cmask[None, :], other=0.0)
            lo = (lo.to(tl.float32) * lo_scale).to(ri.dtype)
            acc = dot_prec(lo, ri, acc, PREC)
    return acc


@triton.jit
def _epilogue(acc, LO, RI, sri, lo_scale, rows, rmask, cols, cmask, start, rank, roff, poff,
              bucket, BUCKETS: tl.constexpr, PREC: tl.constexpr):
    """The bucket's ``_lowrank`` (only the buckets in the BUCKETS bit mask are compiled)."""
    if BUCKETS & 1:
        if bucket == 0:
            acc = _lowrank(acc, LO, RI, sri, lo_scale, rows, rmask, cols, cmask, start, rank,
                           roff, poff, 16, 16, PREC)
    if BUCKETS & 2:
        if bucket == 1:
            acc = _lowrank(acc, LO, RI, sri, lo_scale, rows, rmask, cols, cmask, start, rank,
                           roff, poff, 32, 32, PREC)
    if BUCKETS & 4:
        if bucket == 2:
            acc = _lowrank(acc, LO, RI, sri, lo_scale, rows, rmask, cols, cmask, start, rank,
                           roff, poff, 64, 64, PREC)
    if BUCKETS & 8:
        if bucket == 3:
            acc = _lowrank(acc, LO, RI, sri, lo_scale, rows, rmask, cols, cmask, start, rank,
                           roff, poff, 128, 64, PREC)
    if BUCKETS & 16:
        if bucket == 4:
            acc = _lowrank(acc, LO, RI, sri, lo_scale, rows, rmask, cols, cmask, start, rank,
                           roff, poff, 256, 64, PREC)
    return acc


@triton.jit
def tma_mainloop(acc, XIN, W, m0, nt, k0, k1, BN: tl.constexpr, BK: tl.constexpr,
                  BWD: tl.constexpr, PREC: tl.constexpr):
    """``acc`` plus the row tile at ``m0`` of X times column tile ``nt`` of op(W) over the K
    blocks ``k0 .. k1 - 1``, both operands loaded through their TMA descriptors (XIN blocks
    [BM, BK]; W blocks [BK, BN] backward, [BN, BK] forward, transposed on load)."""
    for kb in range(k0, k1):
        x = XIN.load([m0, kb * BK])
        if BWD:
            w = W.load([kb * BK, nt * BN])
        else:
            w = W.load([nt * BN, kb * BK]).T
        acc = dot_prec(x, w, acc, PREC)
    return acc

@triton.jit
def adapter_term(acc, LO, RI, meta_i, meta_f, ad, sri, rows, rmask, cols, cmask, c0, NOUT,
                  seed, BUCKETS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                  BWD: tl.constexpr, DROPOUT: tl.constexpr, SEED_PTR: tl.constexpr,
                  PREC: tl.constexpr):
    """``acc`` plus adapter ``ad``'s LoRA term on the (BM, BN) tile of ``rows`` x columns c0 ..
    c0 + BN (``cols``): forward ``s P B`` (s from ``meta_f``), backward ``Q A^T`` with, under
    DROPOUT, the mask of ``keep_tile`` applied to the sum and kept values scaled by 1 / (1 - p).
    The adapter's fields come from ``meta_i`` / ``meta_f`` (``lora_kernels``'s META_I / META_F
    columns). Callers add the row-mask select that keeps their main loop's wgmma asynchronous."""
    start = tl.load(meta_i + ad * 8)
    rank = tl.load(meta_i + ad * 8 + 2)
    roff = tl.load(meta_i + ad * 8 + 3)
    poff = tl.load(meta_i + ad * 8 + 4)
    bucket = tl.load(meta_i + ad * 8 + 5)
    if BWD:  # dX_lora = mask(Q A^T) / (1 - p)
        acc = _epilogue(acc, LO, RI, sri, 1.0, rows, rmask, cols, cmask, start, rank, roff,
                        poff, bucket, BUCKETS, PREC)
        if DROPOUT:
            thresh = tl.load(meta_i + ad * 8 + 6)
            inv_keep = tl.load(meta_f + ad * 2 + 1)
            keep = keep_tile(rows, c0, NOUT, seed_value(seed, SEED_PTR), thresh, BM, BN)
            acc = tl.where(keep, acc * inv_keep, 0.0)
    else:  # Y_lora = s P B
        scale = tl.load(meta_f + ad * 2)
        acc = _epilogue(acc, LO, RI, sri, scale, rows, rmask, cols, cmask, start, rank, roff,
                        poff, bucket, BUCKETS, PREC)
    return acc


@triton.jit(do_not_specialize=["seed", "n_mt"])
def gemm_lora_kernel(XIN, W, OUT, LO, RI, BIAS, mtiles, meta_i, meta_f,
                     M, NOUT, KRED, sxm, sw, som, sri, n_mt, seed,
                     BUCKETS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                     BK: tl.constexpr, GROUP_M: tl.constexpr, BWD: tl.constexpr,
                     LORA: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr,
                     SEED_PTR: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                     USE_TMA: tl.constexpr, PREC: tl.constexpr):
    """OUT (M, NOUT) = XIN (M, KRED) @ op(W) + LoRA term; op(W) = W^T (W: NOUT x KRED) forward,
    W (KRED x NOUT) backward. Grid: n_mt row tiles (``mtiles``: adapter, m0, m1) x
    cdiv(NOUT, BN) column tiles, in groups of GROUP_M row tiles (L2 reuse of W). With USE_TMA,
    XIN and W are tensor descriptors (Hopper's bulk tensor copies; blocks [BM, BK] and [BN, BK]
    forward or [BK, BN] backward, out-of-range elements read as zero); else plain pointers.
    The low-rank term is computed first and the main loop accumulates onto it, so only one
    (BM, BN) fp32 accumulator is live at a time."""
    pid = tl.program_id(0)
    n_nt = tl.cdiv(NOUT, BN)
    width = GROUP_M * n_nt
    first = (pid // width) * GROUP_M
    gsize = tl.minimum(n_mt - first, GROUP_M)
    mt = first + (pid % width) % gsize
    nt = (pid % width) // gsize
    ad = tl.load(mtiles + mt * 3)
    m0 = tl.load(mtiles + mt * 3 + 1)
    m1 = tl.load(mtiles + mt * 3 + 2)
    rows = m0 + tl.arange(0, BM)
    cols = nt * BN + tl.arange(0, BN)
    rmask = rows < m1
    cmask = cols < NOUT
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if LORA:
        acc = adapter_term(acc, LO, RI, meta_i, meta_f, ad, sri, rows, rmask, cols, cmask,
                            nt * BN, NOUT, seed, BUCKETS, BM, BN, BWD, DROPOUT, SEED_PTR, PREC)
        if BWD:
            if not DROPOUT:
                # Without this select the main loop's accumulator starts as the bucket branches'
                # result itself, and Triton 3.6 then leaves the loop's wgmma synchronous (sm_90
                # SASS: WARPGROUP.DEPBAR.LE gsb0, 0x0 after every HGMMA instead of one group in
                # flight, as with dropout or in the forward): 41-66 us more on 4096x4096 at
                # ranks 16-128 (profiler/KERNELS.md, session 15). Rows past m1 are never stored.
                acc = tl.where(rmask[:, None], acc, 0.0)
    if USE_TMA:
        acc = tma_mainloop(acc, XIN, W, m0, nt, 0, tl.cdiv(KRED, BK), BN, BK, BWD, PREC)
    else:
        # clamped rows: loads need no row mask (rows past m1 are not stored); columns are
        # clamped only when NOUT is not a multiple of BN (a clamp hides their contiguity)
        rl = tl.minimum(rows, M - 1).to(tl.int64)
        if EVEN_N:
            cl = cols.to(tl.int64)
        else:
            cl = tl.minimum(cols, NOUT - 1).to(tl.int64)
        for kb in range(0, tl.cdiv(KRED, BK)):
            ks = kb * BK + tl.arange(0, BK)
            if EVEN_K:
                x = tl.load(XIN + rl[:, None] * sxm + ks[None, :])
                if BWD:
                    w = tl.load(W + ks.to(tl.int64)[:, None] * sw + cl[None, :])
                else:
                    w = tl.trans(tl.load(W + cl[:, None] * sw + ks[None, :]))
            else:
                km = ks < KRED
                x = tl.load(XIN + rl[:, None] * sxm + ks[None, :], mask=km[None, :], other=0.0)
                if BWD:
                    w = tl.load(W + ks.to(tl.int64)[:, None] * sw + cl[None, :],
                                mask=km[:, None], other=0.0)
                else:
                    w = tl.trans(tl.load(W + cl[:, None] * sw + ks[None, :], mask=km[None, :],
                                         other=0.0))
            acc = dot_prec(x, w, acc, PREC)
    if HAS_BIAS:
        acc += tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    tl.store(OUT + rows.to(tl.int64)[:, None] * som + cols[None, :],
             acc.to(OUT.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])
