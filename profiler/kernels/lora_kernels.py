"""Triton kernels of the fused multi-LoRA linear layer (forward and backward).

Math (docs/kernel.md, "Fused multi-LoRA kernel"; LoRA: Hu et al. 2021, eq. 3, h = W0 x + (alpha/r) B A x):
adapters i own contiguous token segments X_i of X (M x K); with P_i = drop(X_i) A_i (M_i x r_i),

    forward   Y_i   = X_i W + s_i P_i B_i
    backward  Q_i   = s_i dY_i B_i^T                           (M_i x r_i)
              dX_i  = dY_i W^T + (Q_i A_i^T) * mask_i / (1-p_i)
              dA_i  = drop(X_i)^T Q_i                          (K x r_i)
              dB_i  = s_i P_i^T dY_i                           (r_i x N)

The base GEMMs (X W and dY W^T) go to cuBLAS; these kernels do the low-rank work.
Storage: the adapters are packed, A_i = lora_A[o_i:o_i+r_i] as an (r_i, K) block (A_i transposed,
PEFT's lora_A.weight layout) and B_i = lora_B[o_i:o_i+r_i] as an (r_i, N) block. P_i and Q_i are
compact per adapter, (len_i, R_i) row-major at offset poff_i (a multiple of 16), rows padded to
the rank bucket R_i (columns r_i..R_i-1 hold zeros), so their loads and stores need no mask on the
run-time rank and are 16-byte vectors (element-wise before: b1 and b2 waited on them every
iteration, profiler/KERNELS.md, session 14).

Tiles follow each adapter's own rank: every tile carries its adapter, and the adapter's rank
bucket R (the next power of two >= max(r_i, 16): 16, 32, 64, 128, 256) selects, at run time,
a body compiled for that R, with the bucket's own token rows per tile (BM0..BM4) and column
width (BK or BN times CM0..CM4). Only the buckets present in a launch are compiled in (the
BUCKETS bit mask), so a rank-8 adapter never runs the tiles or does the FLOPs of a rank-128 one.

Launches per training step (besides the two cuBLAS GEMMs):
  _f1  P           = mask(X) A / (1-p)  grid: row tiles x K splits      reads X once; writes P
                                                                        (bf16, kept for backward)
  _f2  Ylora       = s P B (+bias)      grid: row tiles x N groups      writes Y once; cuBLAS then
                                                                        does Y += X W (beta=1)
  _b1  Q           = s dY B^T           grid: row tiles x N splits      reads dY
       dB          = s P^T dY           + chunks x N blocks             reads dY (same launch)
  _b2  dXlora      = mask(Q A^T)/(1-p)  grid: chunks x K blocks         writes dX once, reads X;
       dA          = mask(X)^T Q/(1-p)                                  cuBLAS then dX += dY W
Splits of the reductions (over K, over N, over tokens) keep the grid at >= 2 waves on short
inputs: K-split partial sums of P are added with fp32 atomics into a buffer that stays zeroed
between steps, and the last program of each row tile to finish (an int32 counter per tile)
writes P once from it and zeroes it and the counter again, so _f2 reads P once per tile instead
of every split per N group (that re-read cost _f2 up to 2x its Y write at rank >= 64; a
fixed-order sum of stored partials by the last program measured slower in _f1 than the atomics;
profiler/KERNELS.md, session 12; the atomics make P's fp32 summation order vary between runs, as
dA's and dB's already did). N-split partial sums of Q (only when needed) are added with fp32
atomics into a buffer that _f2 zeroes (so no memset launch is needed). dA/dB blocks of an adapter
with one token chunk are stored straight into the gradients (adapters' dtype); with several
chunks, the chunks add into an fp32 workspace that stays zeroed between steps, and ``_gfin`` (only
launched when such an adapter exists) converts those rows and zeroes them again (no memset). Every fp32 partial sum uses relaxed atomics (``red``): tl.atomic_add's
default acq_rel put a GPU-scope fence around each one (b1 84 -> 56 us, b2 71 -> 45 us at rank
128, profiler/KERNELS.md, session 13).

Dropout: a counter-based hash of (seed, token, column pair) gives the keep mask (``keep_tile``;
``reference.keep_mask`` is the same function in torch), so _f1 and _b2 regenerate the same mask
and nothing is stored (a bitmask written by _f1 and read by _b2 measured slower on the H100:
packing bits in _f1 cost more than the hash saved in _b2).
"""
from __future__ import annotations

import triton
import triton.language as tl

# rank buckets: tile rank R of each bucket (token rows and column widths come from the config)
BUCKET_R = (16, 32, 64, 128, 256)
# adapter meta columns (int32): start, len, rank, rank offset, P offset, bucket, keep threshold,
# token chunks of the adapter (> 1: its dA/dB add into the workspace that _gfin converts)
META_I = 8
META_F = 2  # fp32: scale, 1/(1-p)


@triton.jit
def _hash(idx, seed):
    """lowbias32 finaliser of idx xor seed (uint32)."""
    h = idx ^ seed.to(tl.uint32)
    h ^= h >> 16
    h *= 0x7FEB352D
    h ^= h >> 15
    h *= 0x846CA68B
    h ^= h >> 16
    return h


@triton.jit
def seed_value(seed, SEED_PTR: tl.constexpr):
    """The kernels' dropout seed: ``seed`` itself (already mixed on the host by
    ``config.mix_seed``), or, with SEED_PTR, mix_seed of the int counter ``seed`` points to (the
    same hash in uint32 arithmetic), so that a captured CUDA graph draws a new mask each replay
    when the counter is advanced inside the graph."""
    if SEED_PTR:
        h = tl.load(seed).to(tl.uint32) * 0x9E3779B1 + 0x632BE5AB
        h ^= h >> 16
        h *= 0x85EBCA6B
        h ^= h >> 13
        return (h & 0x7FFFFFFF).to(tl.int32)
    else:
        return seed


@triton.jit
def keep_tile(rows, c0, K, seed, thresh, BM: tl.constexpr, BK: tl.constexpr):
    """(BM, BK) keep mask of rows x columns c0 .. c0+BK-1 (c0 even): one 32-bit hash per pair of
    columns, (row, k) kept iff 16-bit half (k & 1) of hash(row * ceil(K/2) + k // 2) >= thresh."""
    kh = (K + 1) // 2
    c2 = c0 // 2 + tl.arange(0, BK // 2)
    idx = rows.to(tl.uint32)[:, None] * kh.to(tl.uint32) + c2.to(tl.uint32)[None, :]
    h = _hash(idx, seed)
    v = tl.reshape(tl.join(h & 0xFFFF, h >> 16), (BM, BK))
    return v.to(tl.int32) >= thresh


@triton.jit
def dot_prec(a, b, acc, PREC: tl.constexpr):
    """tl.dot; PREC "interp" (CPU interpreter, whose dot mishandles bf16) computes it in fp32."""
    if PREC == "interp":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    else:
        return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def pq_offset(poff):
    """P's / Q's offset ``poff`` of an adapter, a multiple of 16 (rows padded to R), written so
    that the compiler knows it (tl.multiple_of is dropped on a scalar): the accesses to P and Q
    become 16-byte vectors and cp.async copies instead of element-wise loads and stores."""
    return poff // 16 * 16


# ----------------------------------------------------------------------------------------- f1
@triton.jit
def p_part(X, A, sxm, sam, K, m0, m1, rank, roff, kb0, kb1, seed, thresh,
            R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, DROPOUT: tl.constexpr,
            PREC: tl.constexpr):
    """fp32 (BM, R): X A^T over rows m0..m1-1 (BM) and K blocks kb0..kb1-1 (BK columns), X's
    elements dropped as the dropout mask says (unscaled: 1 / keep is applied where P is stored).
    Shared by ``_f1_body`` and ``tiny._tf_body``, as ``q_part`` is for Q."""
    rows = m0 + tl.arange(0, BM)
    rmask = rows < m1
    rr = tl.arange(0, R)
    rkm = rr < rank
    xrow = X + rows.to(tl.int64)[:, None] * sxm
    arow = A + (roff + rr).to(tl.int64)[:, None] * sam
    acc = tl.zeros((BM, R), dtype=tl.float32)
    for kb in range(kb0, kb1):
        cols = kb * BK + tl.arange(0, BK)
        cm = cols < K
        x = tl.load(xrow + cols[None, :], mask=rmask[:, None] & cm[None, :], other=0.0)
        if DROPOUT:
            keep = keep_tile(rows, kb * BK, K, seed, thresh, BM, BK)
            x = tl.where(keep, x, tl.zeros_like(x))
        a = tl.load(arow + cols[None, :], mask=rkm[:, None] & cm[None, :], other=0.0)
        acc = dot_prec(x, tl.trans(a.to(x.dtype)), acc, PREC)
    return acc


@triton.jit
def _f1_body(X, A, Pacc, Psave, Cnt, sxm, sam, K, m0, m1, start, rank, roff,
             poff, kb0, kb1, seed, thresh, t, ksplit, inv_keep,
             R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
             DROPOUT: tl.constexpr, PREC: tl.constexpr):
    rows = m0 + tl.arange(0, BM)
    rmask = rows < m1
    rr = tl.arange(0, R)
    acc = p_part(X, A, sxm, sam, K, m0, m1, rank, roff, kb0, kb1, seed, thresh, R, BM, BK, DROPOUT, PREC)
    # P's rows are padded to R: columns rank..R-1 are stored too (zeros: A's rows past rank load
    # as 0), so P and Q need only the row mask and their accesses stay 16-byte vectors
    pm = rmask[:, None]
    poffs = pq_offset(poff) + (rows - start)[:, None] * R + rr[None, :]
    if ksplit == 1:
        tl.store(Psave + poffs, (acc * inv_keep).to(Psave.dtype.element_ty), mask=pm)
    else:  # K split: fp32 adds into Pacc; the tile's last program to finish writes P once
        tl.atomic_add(Pacc + poffs, acc, mask=pm, sem="relaxed")
        tl.debug_barrier()  # every thread's adds issued before the release below
        done = tl.atomic_add(Cnt + t, 1, sem="acq_rel", scope="gpu")
        if done == ksplit - 1:
            p = tl.load(Pacc + poffs, mask=pm, other=0.0, cache_modifier=".cg")
            tl.store(Psave + poffs, (p * inv_keep).to(Psave.dtype.element_ty), mask=pm)
            tl.store(Pacc + poffs, tl.zeros((BM, R), dtype=tl.float32), mask=pm)  # for the
            tl.atomic_xchg(Cnt + t, 0)                                            # next step


@triton.jit(do_not_specialize=["ksplit", "kb_per", "seed"])
def f1_kernel(X, A, Pacc, Psave, Cnt, tiles, meta_i, meta_f, K, sxm, sam, ksplit, kb_per, seed,
               BUCKETS: tl.constexpr, BM0: tl.constexpr, BM1: tl.constexpr,
               BM2: tl.constexpr, BM3: tl.constexpr, BM4: tl.constexpr,
               BK: tl.constexpr, DROPOUT: tl.constexpr, PREC: tl.constexpr,
               SEED_PTR: tl.constexpr = False):
    pid = tl.program_id(0)
    seed = seed_value(seed, SEED_PTR)
    t = pid // ksplit
    s = pid % ksplit
    ad = tl.load(tiles + t * 3)
    m0 = tl.load(tiles + t * 3 + 1)
    m1 = tl.load(tiles + t * 3 + 2)
    start = tl.load(meta_i + ad * 8)
    rank = tl.load(meta_i + ad * 8 + 2)
    roff = tl.load(meta_i + ad * 8 + 3)
    poff = tl.load(meta_i + ad * 8 + 4)
    bucket = tl.load(meta_i + ad * 8 + 5)
    thresh = tl.load(meta_i + ad * 8 + 6)
    inv_keep = tl.load(meta_f + ad * 2 + 1)
    kb0 = s * kb_per
    kb1 = tl.minimum(kb0 + kb_per, tl.cdiv(K, BK))
    if BUCKETS & 1:
        if bucket == 0:
            _f1_body(X, A, Pacc, Psave, Cnt, sxm, sam, K, m0, m1, start, rank,
                     roff, poff, kb0, kb1, seed, thresh, t, ksplit, inv_keep, 16, BM0, BK, DROPOUT, PREC)
    if BUCKETS & 2:
        if bucket == 1:
            _f1_body(X, A, Pacc, Psave, Cnt, sxm, sam, K, m0, m1, start, rank,
                     roff, poff, kb0, kb1, seed, thresh, t, ksplit, inv_keep, 32, BM1, BK, DROPOUT, PREC)
    if BUCKETS & 4:
        if bucket == 2:
            _f1_body(X, A, Pacc, Psave, Cnt, sxm, sam, K, m0, m1, start, rank,
                     roff, poff, kb0, kb1, seed, thresh, t, ksplit, inv_keep, 64, BM2, BK, DROPOUT, PREC)
    if BUCKETS & 8:
        if bucket == 3:
            _f1_body(X, A, Pacc, Psave, Cnt, sxm, sam, K, m0, m1, start, rank,
                     roff, poff, kb0, kb1, seed, thresh, t, ksplit, inv_keep, 128, BM3, BK, DROPOUT, PREC)
    if BUCKETS & 16:
        if bucket == 4:
            _f1_body(X, A, Pacc, Psave, Cnt, sxm, sam, K, m0, m1, start, rank,
                     roff, poff, kb0, kb1, seed, thresh, t, ksplit, inv_keep, 256, BM4, BK, DROPOUT, PREC)


# ----------------------------------------------------------------------------------------- f2
@triton.jit
def _f2_body(Psave, B, Y, bias, syn, sbm, N, m0, m1, start, rank, roff, poff, nb0, nb1, scale,
             R: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
             HAS_BIAS: tl.constexpr, PREC: tl.constexpr):
    rows = m0 + tl.arange(0, BM)
    rmask = rows < m1
    rr = tl.arange(0, R)
    rkm = rr < rank
    poffs = pq_offset(poff) + (rows - start)[:, None] * R + rr[None, :]
    p = tl.load(Psave + poffs, mask=rmask[:, None], other=0.0).to(tl.float32)  # P / (1-p)
    ps = (p * scale).to(Y.dtype.element_ty)
    yrow = Y + rows.to(tl.int64)[:, None] * syn
    brow = B + (roff + rr).to(tl.int64)[:, None] * sbm
    for nb in range(nb0, nb1):
        cols = nb * BN + tl.arange(0, BN)
        cm = cols < N
        b = tl.load(brow + cols[None, :], mask=rkm[:, None] & cm[None, :], other=0.0)
        y = dot_prec(ps, b.to(ps.dtype), None, PREC)
        if HAS_BIAS:
            y += tl.load(bias + cols, mask=cm, other=0.0).to(tl.float32)[None, :]
        tl.store(yrow + cols[None, :], y.to(Y.dtype.element_ty),
                 mask=rmask[:, None] & cm[None, :])


@triton.jit(do_not_specialize=["g_numel", "ngroups", "nb_per"])
def f2_kernel(Psave, B, Y, bias, G, g_numel, tiles, meta_i, meta_f, N, syn, sbm, ngroups, nb_per,
               BUCKETS: tl.constexpr, BM0: tl.constexpr, BM1: tl.constexpr,
               BM2: tl.constexpr, BM3: tl.constexpr, BM4: tl.constexpr,
               BN: tl.constexpr, HAS_BIAS: tl.constexpr, ZERO_G: tl.constexpr,
               PREC: tl.constexpr, WRITE_Y: tl.constexpr = True):
    pid = tl.program_id(0)
    if ZERO_G:  # zero the fp32 workspace (dA, dB, Q) that the backward adds into
        nprog = tl.num_programs(0)
        per = tl.cdiv(tl.cdiv(g_numel, nprog), 1024) * 1024
        for z in range(pid * per, tl.minimum(pid * per + per, g_numel), 1024):
            zo = z + tl.arange(0, 1024)
            tl.store(G + zo, tl.zeros((1024,), dtype=tl.float32), mask=zo < g_numel)
    if WRITE_Y:  # else the base GEMM's epilogue adds s P B (lora_gemm): only G is zeroed here
        t = pid // ngroups
        g = pid % ngroups
        ad = tl.load(tiles + t * 3)
        m0 = tl.load(tiles + t * 3 + 1)
        m1 = tl.load(tiles + t * 3 + 2)
        start = tl.load(meta_i + ad * 8)
        rank = tl.load(meta_i + ad * 8 + 2)
        roff = tl.load(meta_i + ad * 8 + 3)
        poff = tl.load(meta_i + ad * 8 + 4)
        bucket = tl.load(meta_i + ad * 8 + 5)
        scale = tl.load(meta_f + ad * 2)
        nb0 = g * nb_per
        nb1 = tl.minimum(nb0 + nb_per, tl.cdiv(N, BN))
        if BUCKETS & 1:
            if bucket == 0:
                _f2_body(Psave, B, Y, bias, syn, sbm, N, m0, m1, start, rank, roff, poff, nb0,
                         nb1, scale, 16, BM0, BN, HAS_BIAS, PREC)
        if BUCKETS & 2:
            if bucket == 1:
                _f2_body(Psave, B, Y, bias, syn, sbm, N, m0, m1, start, rank, roff, poff, nb0,
                         nb1, scale, 32, BM1, BN, HAS_BIAS, PREC)
        if BUCKETS & 4:
            if bucket == 2:
                _f2_body(Psave, B, Y, bias, syn, sbm, N, m0, m1, start, rank, roff, poff, nb0,
                         nb1, scale, 64, BM2, BN, HAS_BIAS, PREC)
        if BUCKETS & 8:
            if bucket == 3:
                _f2_body(Psave, B, Y, bias, syn, sbm, N, m0, m1, start, rank, roff, poff, nb0,
                         nb1, scale, 128, BM3, BN, HAS_BIAS, PREC)
        if BUCKETS & 16:
            if bucket == 4:
                _f2_body(Psave, B, Y, bias, syn, sbm, N, m0, m1, start, rank, roff, poff, nb0,
                         nb1, scale, 256, BM4, BN, HAS_BIAS, PREC)


# ----------------------------------------------------------------------------------------- b1
@triton.jit
def _grad_out(acc, G, D, offs, gm, nch):
    """One token chunk's fp32 share ``acc`` of a dA or dB block (elements ``offs``, mask ``gm``):
    stored into the gradient D (the adapters' dtype) when the adapter has one chunk (nch == 1),
    else added with relaxed fp32 atomics into the workspace G (zero between steps), which
    ``gfin_kernel`` then converts into D and zeroes again. (The block's last chunk writing D
    itself, behind a per-block counter as _f1 does for P, measured slower: the acq_rel counter
    waits for every chunk's atomics, profiler/KERNELS.md, session 13.)"""
    if nch == 1:
        tl.store(D + offs, acc.to(D.dtype.element_ty), mask=gm)
    else:
        tl.atomic_add(G + offs, acc, mask=gm, sem="relaxed")


@triton.jit
def q_part(DY, B, sdm, sbm, N, m0, m1, start, rank, roff, poff, nb0, nb1, scale,
            R: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr):
    """(acc, offs, rmask): acc = s dY B^T over rows m0..m1-1 (BM, fp32 (BM, R)) and N blocks
    nb0..nb1-1 (BN columns), offs its elements in the compact, R-padded Q (as P's), rmask the
    rows < m1. Shared by ``_b1q_body`` and ``tiny._tbq_body``."""
    rows = m0 + tl.arange(0, BM)
    rmask = rows < m1
    rr = tl.arange(0, R)
    rkm = rr < rank
    drow = DY + rows.to(tl.int64)[:, None] * sdm
    brow = B + (roff + rr).to(tl.int64)[:, None] * sbm
    acc = tl.zeros((BM, R), dtype=tl.float32)
    for nb in range(nb0, nb1):
        cols = nb * BN + tl.arange(0, BN)
        cm = cols < N
        dy = tl.load(drow + cols[None, :], mask=rmask[:, None] & cm[None, :], other=0.0)
        b = tl.load(brow + cols[None, :], mask=rkm[:, None] & cm[None, :], other=0.0)
        acc = dot_prec(dy, tl.trans(b.to(dy.dtype)), acc, PREC)
    acc = acc * scale
    offs = pq_offset(poff) + (rows - start)[:, None] * R + rr[None, :]   # padded rows, as P's
    return acc, offs, rmask


@triton.jit
def _b1q_body(DY, B, Q, sdm, sbm, N, m0, m1, start, rank, roff, poff, nb0, nb1, scale,
              R: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, Q_ATOMIC: tl.constexpr,
              PREC: tl.constexpr):
    acc, offs, rmask = q_part(DY, B, sdm, sbm, N, m0, m1, start, rank, roff, poff, nb0, nb1,
                               scale, R, BM, BN, PREC)
    if Q_ATOMIC:   # N split: partial sums into the zeroed fp32 Q
        tl.atomic_add(Q + offs, acc, mask=rmask[:, None], sem="relaxed")
    else:
        tl.store(Q + offs, acc.to(Q.dtype.element_ty), mask=rmask[:, None])


@triton.jit
def b1b_body(DY, Psave, GB, DB, sdm, N, m0, m1, start, rank, roff, poff, nb, scale,
              nch, R: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              PREC: tl.constexpr):
    rr = tl.arange(0, R)
    rkm = rr < rank
    cols = nb * BN + tl.arange(0, BN)
    cm = cols < N
    acc = tl.zeros((R, BN), dtype=tl.float32)
    for m in range(m0, m1, BM):
        rows = m + tl.arange(0, BM)
        rmask = rows < m1
        p = tl.load(Psave + pq_offset(poff) + (rows - start)[:, None] * R + rr[None, :],
                    mask=rmask[:, None], other=0.0)
        dy = tl.load(DY + rows.to(tl.int64)[:, None] * sdm + cols[None, :],
                     mask=rmask[:, None] & cm[None, :], other=0.0)
        acc = dot_prec(tl.trans(p.to(dy.dtype)), dy, acc, PREC)
    acc = acc * scale
    _grad_out(acc, GB, DB, (roff + rr).to(tl.int64)[:, None] * N + cols[None, :],
              rkm[:, None] & cm[None, :], nch)


@triton.jit(do_not_specialize=["nsplit", "nb_per", "n_q", "n_nb"])
def b1_kernel(DY, B, Psave, Q, GB, DB, tiles, chunks, meta_i, meta_f, N, sdm, sbm,
               nsplit, nb_per, n_q, n_nb,
               BUCKETS: tl.constexpr, BM0: tl.constexpr, BM1: tl.constexpr,
               BM2: tl.constexpr, BM3: tl.constexpr, BM4: tl.constexpr,
               CM0: tl.constexpr, CM1: tl.constexpr, CM2: tl.constexpr, CM3: tl.constexpr,
               CM4: tl.constexpr, BN: tl.constexpr, Q_ATOMIC: tl.constexpr,
               PREC: tl.constexpr):
    pid = tl.program_id(0)
    if pid < n_q:  # Q over a row tile (and an N split)
        t = pid // nsplit
        s = pid % nsplit
        ad = tl.load(tiles + t * 3)
        m0 = tl.load(tiles + t * 3 + 1)
        m1 = tl.load(tiles + t * 3 + 2)
        start = tl.load(meta_i + ad * 8)
        rank = tl.load(meta_i + ad * 8 + 2)
        roff = tl.load(meta_i + ad * 8 + 3)
        poff = tl.load(meta_i + ad * 8 + 4)
        bucket = tl.load(meta_i + ad * 8 + 5)
        scale = tl.load(meta_f + ad * 2)
        nb0 = s * nb_per
        nb1 = tl.minimum(nb0 + nb_per, tl.cdiv(N, BN))
        if BUCKETS & 1:
            if bucket == 0:
                _b1q_body(DY, B, Q, sdm, sbm, N, m0, m1, start, rank, roff, poff, nb0, nb1,
                          scale, 16, BM0, BN, Q_ATOMIC, PREC)
        if BUCKETS & 2:
            if bucket == 1:
                _b1q_body(DY, B, Q, sdm, sbm, N, m0, m1, start, rank, roff, poff, nb0, nb1,
                          scale, 32, BM1, BN, Q_ATOMIC, PREC)
        if BUCKETS & 4:
            if bucket == 2:
                _b1q_body(DY, B, Q, sdm, sbm, N, m0, m1, start, rank, roff, poff, nb0, nb1,
                          scale, 64, BM2, BN, Q_ATOMIC, PREC)
        if BUCKETS & 8:
            if bucket == 3:
                _b1q_body(DY, B, Q, sdm, sbm, N, m0, m1, start, rank, roff, poff, nb0, nb1,
                          scale, 128, BM3, BN, Q_ATOMIC, PREC)
        if BUCKETS & 16:
            if bucket == 4:
                _b1q_body(DY, B, Q, sdm, sbm, N, m0, m1, start, rank, roff, poff, nb0, nb1,
                          scale, 256, BM4, BN, Q_ATOMIC, PREC)
    else:  # dB over a token chunk and a column block (BN * CM_bucket wide)
        q = pid - n_q
        c = q // n_nb
        nb = q % n_nb
        ad = tl.load(chunks + c * 3)
        m0 = tl.load(chunks + c * 3 + 1)
        m1 = tl.load(chunks + c * 3 + 2)
        start = tl.load(meta_i + ad * 8)
        rank = tl.load(meta_i + ad * 8 + 2)
        roff = tl.load(meta_i + ad * 8 + 3)
        poff = tl.load(meta_i + ad * 8 + 4)
        bucket = tl.load(meta_i + ad * 8 + 5)
        nch = tl.load(meta_i + ad * 8 + 7)
        scale = tl.load(meta_f + ad * 2)
        if BUCKETS & 1:
            if (bucket == 0) & (nb * BN * CM0 < N):
                b1b_body(DY, Psave, GB, DB, sdm, N, m0, m1, start, rank, roff, poff, nb,
                          scale, nch, 16, BM0, BN * CM0, PREC)
        if BUCKETS & 2:
            if (bucket == 1) & (nb * BN * CM1 < N):
                b1b_body(DY, Psave, GB, DB, sdm, N, m0, m1, start, rank, roff, poff, nb,
                          scale, nch, 32, BM1, BN * CM1, PREC)
        if BUCKETS & 4:
            if (bucket == 2) & (nb * BN * CM2 < N):
                b1b_body(DY, Psave, GB, DB, sdm, N, m0, m1, start, rank, roff, poff, nb,
                          scale, nch, 64, BM2, BN * CM2, PREC)
        if BUCKETS & 8:
            if (bucket == 3) & (nb * BN * CM3 < N):
                b1b_body(DY, Psave, GB, DB, sdm, N, m0, m1, start, rank, roff, poff, nb,
                          scale, nch, 128, BM3, BN * CM3, PREC)
        if BUCKETS & 16:
            if (bucket == 4) & (nb * BN * CM4 < N):
                b1b_body(DY, Psave, GB, DB, sdm, N, m0, m1, start, rank, roff, poff, nb,
                          scale, nch, 256, BM4, BN * CM4, PREC)


# ----------------------------------------------------------------------------------------- b2
@triton.jit
def b2_body(X, A, Q, DXL, GA, DA, sxm, sam, sdxm, K, m0, m1, start, rank, roff, poff,
             kb, seed, thresh, inv_keep, nch,
             R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, DROPOUT: tl.constexpr,
             WRITE_DX: tl.constexpr, PREC: tl.constexpr):
    rr = tl.arange(0, R)
    rkm = rr < rank
    cols = kb * BK + tl.arange(0, BK)
    cm = cols < K
    a = tl.load(A + (roff + rr).to(tl.int64)[:, None] * sam + cols[None, :],
                mask=rkm[:, None] & cm[None, :], other=0.0)
    a = a.to(X.dtype.element_ty)
    acc = tl.zeros((R, BK), dtype=tl.float32)
    for m in range(m0, m1, BM):
        rows = m + tl.arange(0, BM)
        rmask = rows < m1
        qm = rmask[:, None]
        qoffs = pq_offset(poff) + (rows - start)[:, None] * R + rr[None, :]
        qb = tl.load(Q + qoffs, mask=qm, other=0.0).to(X.dtype.element_ty)
        xm = rmask[:, None] & cm[None, :]
        x = tl.load(X + rows.to(tl.int64)[:, None] * sxm + cols[None, :], mask=xm, other=0.0)
        if DROPOUT:
            keep = keep_tile(rows, kb * BK, K, seed, thresh, BM, BK)
            x = tl.where(keep, x, tl.zeros_like(x))
        if WRITE_DX:
            d = dot_prec(qb, a, None, PREC)
            if DROPOUT:
                d = tl.where(keep, d * inv_keep, 0.0)
            tl.store(DXL + rows.to(tl.int64)[:, None] * sdxm + cols[None, :],
                     d.to(DXL.dtype.element_ty), mask=xm)
        acc = dot_prec(tl.trans(qb), x, acc, PREC)
    acc = acc * inv_keep
    _grad_out(acc, GA, DA, (roff + rr).to(tl.int64)[:, None] * K + cols[None, :],
              rkm[:, None] & cm[None, :], nch)


@triton.jit(do_not_specialize=["n_kb", "seed"])
def b2_kernel(X, A, Q, DXL, GA, DA, chunks, meta_i, meta_f, K, sxm, sam, sdxm, n_kb,
               seed,
               BUCKETS: tl.constexpr, BM0: tl.constexpr, BM1: tl.constexpr,
               BM2: tl.constexpr, BM3: tl.constexpr, BM4: tl.constexpr,
               CM0: tl.constexpr, CM1: tl.constexpr, CM2: tl.constexpr, CM3: tl.constexpr,
               CM4: tl.constexpr, BK: tl.constexpr, DROPOUT: tl.constexpr,
               WRITE_DX: tl.constexpr, PREC: tl.constexpr, SEED_PTR: tl.constexpr = False):
    pid = tl.program_id(0)
    seed = seed_value(seed, SEED_PTR)
    c = pid // n_kb
    kb = pid % n_kb
    ad = tl.load(chunks + c * 3)
    m0 = tl.load(chunks + c * 3 + 1)
    m1 = tl.load(chunks + c * 3 + 2)
    start = tl.load(meta_i + ad * 8)
    rank = tl.load(meta_i + ad * 8 + 2)
    roff = tl.load(meta_i + ad * 8 + 3)
    poff = tl.load(meta_i + ad * 8 + 4)
    bucket = tl.load(meta_i + ad * 8 + 5)
    thresh = tl.load(meta_i + ad * 8 + 6)
    nch = tl.load(meta_i + ad * 8 + 7)
    inv_keep = tl.load(meta_f + ad * 2 + 1)
    if BUCKETS & 1:
        if (bucket == 0) & (kb * BK * CM0 < K):
            b2_body(X, A, Q, DXL, GA, DA, sxm, sam, sdxm, K, m0, m1, start, rank, roff,
                     poff, kb, seed, thresh, inv_keep, nch, 16, BM0, BK * CM0, DROPOUT,
                     WRITE_DX, PREC)
    if BUCKETS & 2:
        if (bucket == 1) & (kb * BK * CM1 < K):
            b2_body(X, A, Q, DXL, GA, DA, sxm, sam, sdxm, K, m0, m1, start, rank, roff,
                     poff, kb, seed, thresh, inv_keep, nch, 32, BM1, BK * CM1, DROPOUT,
                     WRITE_DX, PREC)
    if BUCKETS & 4:
        if (bucket == 2) & (kb * BK * CM2 < K):
            b2_body(X, A, Q, DXL, GA, DA, sxm, sam, sdxm, K, m0, m1, start, rank, roff,
                     poff, kb, seed, thresh, inv_keep, nch, 64, BM2, BK * CM2, DROPOUT,
                     WRITE_DX, PREC)
    if BUCKETS & 8:
        if (bucket == 3) & (kb * BK * CM3 < K):
            b2_body(X, A, Q, DXL, GA, DA, sxm, sam, sdxm, K, m0, m1, start, rank, roff,
                     poff, kb, seed, thresh, inv_keep, nch, 128, BM3, BK * CM3, DROPOUT,
                     WRITE_DX, PREC)
    if BUCKETS & 16:
        if (bucket == 4) & (kb * BK * CM4 < K):
            b2_body(X, A, Q, DXL, GA, DA, sxm, sam, sdxm, K, m0, m1, start, rank, roff,
                     poff, kb, seed, thresh, inv_keep, nch, 256, BM4, BK * CM4, DROPOUT,
                     WRITE_DX, PREC)


# ------------------------------------------------------------------------------- mask helper
@triton.jit(do_not_specialize=["seed", "thresh"])
def mask_kernel(OUT, M, K, seed, thresh, BM: tl.constexpr, BK: tl.constexpr):
    """Materialise the keep mask (1 = kept) that _f1 uses, for tests and references."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    keep = keep_tile(rows, tl.program_id(1) * BK, K, seed, thresh, BM, BK)
    tl.store(OUT + rows.to(tl.int64)[:, None] * K + cols[None, :], keep.to(tl.int8),
             mask=(rows < M)[:, None] & (cols < K)[None, :])


# --------------------------------------------------------------------- multi-chunk gradients
@triton.jit
def _gfin_row(g, d, n, BLOCK: tl.constexpr):
    """d[0:n] = g[0:n] in d's dtype, then g[0:n] = 0."""
    for c in range(0, n, BLOCK):
        offs = c + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(g + offs, mask=m, other=0.0)
        tl.store(d + offs, v.to(d.dtype.element_ty), mask=m)
        tl.store(g + offs, tl.zeros((BLOCK,), dtype=tl.float32), mask=m)


@triton.jit(do_not_specialize=["sum_r", "K", "N"])
def gfin_kernel(G, DA, DB, multi, sum_r, K, N, BLOCK: tl.constexpr):
    """dA/dB rows of the adapters with several token chunks out of the fp32 workspace G (dA^T
    rows (sum_r, K) then dB rows (sum_r, N)), converted to DA's / DB's dtype; G is zeroed again for
    the next step. Program i < sum_r: dA row i, else dB row i - sum_r; rows with multi[row] == 0
    (one-chunk adapters, already stored by _b1/_b2) are left alone. (A grid over (multi-chunk row,
    1,024-column block) with K and N specialised took 9 instead of 14 us on 4096x14336 8-64, but
    on the H100 the second step of a plan then had a 128 x 256 block of a multi-chunk adapter's
    dB wrong (bf16 check 4.8e-3 to 1.3e-2 instead of 2.35e-3); not kept, cause not found,
    profiler/KERNELS.md, session 14.)"""
    pid = tl.program_id(0)
    r = pid % sum_r
    if tl.load(multi + r) != 0:
        if pid < sum_r:
            _gfin_row(G + r.to(tl.int64) * K, DA + r.to(tl.int64) * K, K, BLOCK)
        else:
            _gfin_row(G + sum_r.to(tl.int64) * K + r.to(tl.int64) * N, DB + r.to(tl.int64) * N,
                      N, BLOCK)
