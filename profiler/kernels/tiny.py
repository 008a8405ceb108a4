"""Two LoRA launches per training step instead of four at few tokens (profiler/KERNELS.md,
session 19): ``_tf_kernel`` does ``_f1`` + ``_f2``, ``_tb_kernel`` does ``_b1`` + ``_b2``.

Why: at a few hundred tokens the four launches are latency-bound, not bandwidth-bound (4096x4096,
512 tokens, H100: 23 us of LoRA launches whose data floor is ~5 us; session 18). Each pair has a
grid-wide dependency (P complete before P B; Q complete before Q A^T and X^T Q), which the four
launches resolve with a kernel boundary. Here it is a counter in device memory: the producers
of a row tile (its K splits of P) or of an adapter (its row tiles' N splits of Q) add their fp32
partial sums with relaxed atomics and then arrive on the counter with a release; the consumers
spin on it with acquire loads and then read the sums. Every program produces first and consumes
afterwards, and the grid is at most as many programs as the SMs hold at once (``_tf_kernel``: one
per SM; ``_tb_kernel``: ``TinyPlan.ctas`` per SM, checked against the compiled kernel's registers
and shared memory before the grid is chosen, ``resident_ctas``), so all programs are resident at
once and no spin can wait on a program that has not started.

Nothing is reset between steps. Each program keeps its own step count ``Ep[pid]`` (it alone reads
and writes it; all programs of a launch have run the same number of steps, e); the arrival
counters (int32) grow by their producers per step, so step e's consumers wait for counter >=
(e + 1) x producers (compared as a wrapping int32 difference: they may overflow). The fp32 sums
alternate between two halves of the workspace by the step's parity: step e adds into half e & 1
and zeroes the rows it owns in the other half, which step e - 1 used (its launch has finished:
steps of one plan run in order on one stream) and step e + 1 will add into.

Where each runs (``tiny_plan``, ``KernelConfig.tiny_tokens``): by default ``_tf_kernel`` at most
512 tokens on CUDA with ranks up to 64, the range measured (H100, small4: 8.4 us where ``_f1`` +
``_f2`` took 10.8, one launch gap less).
``_tb_kernel`` (``KernelConfig.tiny_ctas`` 2: two programs per SM, registers capped at 128 by
``maxnreg`` at 8 warps, where the compiled kernel fits two without spilling; session 20) where the
four-launch ``_b1`` leaves Q unsplit over N (``plan.nsplit`` == 1: n_tiles programs each reduce
all of dY's columns) or where every program takes at most one dX / dA block (H100, small4, us:
4096x4096 ``_tb`` 11.7 against ``_b1`` + ``_b2`` 5.5 + 6.9; 4096x14336 18.4-18.7 against ``_tb``
at one program per SM 24.3-24.9 (session 19: 153 registers); 8192x8192 20.7-20.8 against 27.9-28.8).
Elsewhere the four-launch backward runs (14336x4096 small4, 896 dX / dA blocks: ``_tb`` at two per
SM 28.3 against 5.5 + 21.1; the ``tiny`` mix's rank-64 ``_tb`` spills at 128 registers: 11.4
against 4.3 + 6.3), and ``_tf_kernel`` zeroes its fp32 Q workspace as ``_f2`` did. A variant
with one item per program and any grid (items taken in ticket order from an atomic counter, so
that a consumer waits only on programs already running) measured slower in both kernels
(profiler/KERNELS.md, session 19).

Under the Triton interpreter (CPU: programs run one after another, so a spin would never end) each
kernel is launched twice, PHASE 1 (the producers' work) then PHASE 2 (the consumers'), which
finds every counter complete; on the GPU once with PHASE 3.

Math and rounding as the four-launch path (``lora_kernels``'s docstring): P = mask(X) A^T / (1-p) as
fp32 sums of K-split partials, stored once in bf16 (psave, for the backward); Y's LoRA term from
that bf16 P times the scale, rounded to Y's dtype, times B; Q = the fp32 sum of s dY B^T N-split
partials, rounded to X's dtype where it is used; dB and dA/dX's LoRA term by the same bodies as
``_b1``/``_b2`` (``b1b_body``, ``b2_body``), each adapter's tokens in one chunk (dA and dB stored
straight into the gradients: no fp32 workspace, no ``_gfin``).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .lora_kernels import b1b_body, b2_body, dot_prec, p_part, pq_offset, q_part, seed_value
from .config import cdiv

__all__ = ["TinyPlan", "tiny_plan", "bind_forward", "bind_backward", "TINY_TOKENS_CUDA",
           "TINY_MAX_RANK"]

TINY_TOKENS_CUDA = 512
"""``KernelConfig.tiny_tokens`` = -1 on a CUDA device: the most tokens of the two-launch path."""
TINY_MAX_RANK = 64
"""... and the highest rank of an adapter with tokens (ranks 65-256 were not measured)."""
TM = tl.constexpr(10)
"""int32 columns of a ``TinyPlan.tmeta`` row."""


@triton.jit
def _arrive(Cnt, i):
    """Every thread's atomics of this program issued (barrier), then Cnt[i] += 1 with release."""
    tl.debug_barrier()
    tl.atomic_add(Cnt + i, 1, sem="release", scope="gpu")


@triton.jit
def _wait(Cnt, i, target):
    """Spin until Cnt[i] has reached ``target`` (int32; a wrapping difference, so the counters
    may overflow), with acquire loads: the producers' sums are visible after it."""
    v = tl.atomic_add(Cnt + i, 0, sem="acquire", scope="gpu")
    while v - target < 0:
        v = tl.atomic_add(Cnt + i, 0, sem="acquire", scope="gpu")


@triton.jit
def _trow(tmeta, t):
    """Row t of ``TinyPlan.tmeta`` (TM int32 a row): m0, m1, start, rank, roff, poff, bucket,
    thresh (the columns of the adapter's ``meta_i`` row with the tile's rows m0..m1)."""
    r = tmeta + t * TM
    return (tl.load(r + 1), tl.load(r + 2), tl.load(r + 3), tl.load(r + 5), tl.load(r + 6),
            tl.load(r + 7), tl.load(r + 8), tl.load(r + 9))


@triton.jit
def _arow(ameta, j):
    """Row j of ``TinyPlan.ameta`` (the ``meta_i`` row of the j-th adapter with tokens): start,
    tokens, rank, roff, poff, bucket, keep threshold."""
    a = ameta + j * 8
    return (tl.load(a), tl.load(a + 1), tl.load(a + 2), tl.load(a + 3), tl.load(a + 4),
            tl.load(a + 5), tl.load(a + 6))


# ----------------------------------------------------------------------------------- forward
@triton.jit
def _tf_body(X, A, B, Y, bias, Psave, Pcur, Pnxt, Cnt, t, s, target, sxm, sam, sbm, syn, K,
             N, m0, m1, start, rank, roff, poff, kb0, kb1, nb0, nb1, seed, thresh, inv_keep,
             scale, R: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
             DROPOUT: tl.constexpr, HAS_BIAS: tl.constexpr, PREC: tl.constexpr,
             PHASE: tl.constexpr):
    rows = m0 + tl.arange(0, BM)
    rmask = rows < m1
    rr = tl.arange(0, R)
    rkm = rr < rank
    pm = rmask[:, None]
    poffs = pq_offset(poff) + (rows - start)[:, None] * R + rr[None, :]
    if PHASE & 1:   # K split s of P (``p_part``, as _f1_body), added into this step's half; arrive
        acc = p_part(X, A, sxm, sam, K, m0, m1, rank, roff, kb0, kb1, seed, thresh, R, BM, BK, DROPOUT, PREC)
        tl.atomic_add(Pcur + poffs, acc, mask=pm, sem="relaxed")
        if s == 0:   # the other half, for the next step
            tl.store(Pnxt + poffs, tl.zeros((BM, R), dtype=tl.float32), mask=pm)
        _arrive(Cnt, t)
    if PHASE & 2:   # the tile's P complete: N blocks nb0..nb1 of s P B (as _f2_body)
        _wait(Cnt, t, target)
        p = tl.load(Pcur + poffs, mask=pm, other=0.0, cache_modifier=".cg")
        pb = (p * inv_keep).to(Psave.dtype.element_ty)   # P / (1-p) as the backward reads it
        if s == 0:
            tl.store(Psave + poffs, pb, mask=pm)
        ps = (pb.to(tl.float32) * scale).to(Y.dtype.element_ty)
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


@triton.jit(do_not_specialize=["nsplit", "kb_per", "nb_per", "seed", "p_numel", "g_numel"])
def _tf_kernel(X, A, B, Y, bias, Psave, seed, G, Pacc, Cnt, Ep, tiles, meta_i, meta_f, K, N,
               sxm, sam, sbm, syn, p_numel, g_numel, nsplit, kb_per, nb_per,
               BUCKETS: tl.constexpr, BM0: tl.constexpr, BM1: tl.constexpr,
               BM2: tl.constexpr, BM3: tl.constexpr, BM4: tl.constexpr, BK: tl.constexpr,
               BN: tl.constexpr, DROPOUT: tl.constexpr, HAS_BIAS: tl.constexpr,
               ZERO_G: tl.constexpr, PREC: tl.constexpr, PHASE: tl.constexpr,
               SEED_PTR: tl.constexpr = False):
    """Forward LoRA term of row tile t = pid // nsplit: K split s = pid % nsplit of P (kb_per
    blocks of BK columns), then N blocks [s nb_per, (s + 1) nb_per) of BN columns of Y = s P B
    (+ bias); cuBLAS then adds X W (beta 1). Pacc: 2 x p_numel fp32 (the two halves), Cnt: int32
    per row tile, Ep: int32 per program. ZERO_G: G (g_numel fp32, the four-launch backward's Q
    sums) is zeroed, as ``_f2`` does."""
    pid = tl.program_id(0)
    if ZERO_G:
        if PHASE & 1:
            nprog = tl.num_programs(0)
            per = tl.cdiv(tl.cdiv(g_numel, nprog), 1024) * 1024
            for z in range(pid * per, tl.minimum(pid * per + per, g_numel), 1024):
                zo = z + tl.arange(0, 1024)
                tl.store(G + zo, tl.zeros((1024,), dtype=tl.float32), mask=zo < g_numel)
    seed = seed_value(seed, SEED_PTR)
    e = tl.load(Ep + pid)
    par = (e & 1).to(tl.int64)
    Pcur = Pacc + par * p_numel
    Pnxt = Pacc + (1 - par) * p_numel
    t = pid // nsplit
    s = pid % nsplit
    target = (e + 1) * nsplit
    ad = tl.load(tiles + t * 3)
    m0 = tl.load(tiles + t * 3 + 1)
    m1 = tl.load(tiles + t * 3 + 2)
    start = tl.load(meta_i + ad * 8)
    rank = tl.load(meta_i + ad * 8 + 2)
    roff = tl.load(meta_i + ad * 8 + 3)
    poff = tl.load(meta_i + ad * 8 + 4)
    bucket = tl.load(meta_i + ad * 8 + 5)
    thresh = tl.load(meta_i + ad * 8 + 6)
    scale = tl.load(meta_f + ad * 2)
    inv_keep = tl.load(meta_f + ad * 2 + 1)
    kb0 = s * kb_per
    kb1 = tl.minimum(kb0 + kb_per, tl.cdiv(K, BK))
    nb0 = s * nb_per
    nb1 = tl.minimum(nb0 + nb_per, tl.cdiv(N, BN))
    if BUCKETS & 1:
        if bucket == 0:
            _tf_body(X, A, B, Y, bias, Psave, Pcur, Pnxt, Cnt, t, s, target, sxm, sam, sbm, syn,
                     K, N, m0, m1, start, rank, roff, poff, kb0, kb1, nb0, nb1, seed, thresh,
                     inv_keep, scale, 16, BM0, BK, BN, DROPOUT, HAS_BIAS, PREC, PHASE)
    if BUCKETS & 2:
        if bucket == 1:
            _tf_body(X, A, B, Y, bias, Psave, Pcur, Pnxt, Cnt, t, s, target, sxm, sam, sbm, syn,
                     K, N, m0, m1, start, rank, roff, poff, kb0, kb1, nb0, nb1, seed, thresh,
                     inv_keep, scale, 32, BM1, BK, BN, DROPOUT, HAS_BIAS, PREC, PHASE)
    if BUCKETS & 4:
        if bucket == 2:
            _tf_body(X, A, B, Y, bias, Psave, Pcur, Pnxt, Cnt, t, s, target, sxm, sam, sbm, syn,
                     K, N, m0, m1, start, rank, roff, poff, kb0, kb1, nb0, nb1, seed, thresh,
                     inv_keep, scale, 64, BM2, BK, BN, DROPOUT, HAS_BIAS, PREC, PHASE)
    if BUCKETS & 8:
        if bucket == 3:
            _tf_body(X, A, B, Y, bias, Psave, Pcur, Pnxt, Cnt, t, s, target, sxm, sam, sbm, syn,
                     K, N, m0, m1, start, rank, roff, poff, kb0, kb1, nb0, nb1, seed, thresh,
                     inv_keep, scale, 128, BM3, BK, BN, DROPOUT, HAS_BIAS, PREC, PHASE)
    if BUCKETS & 16:
        if bucket == 4:
            _tf_body(X, A, B, Y, bias, Psave, Pcur, Pnxt, Cnt, t, s, target, sxm, sam, sbm, syn,
                     K, N, m0, m1, start, rank, roff, poff, kb0, kb1, nb0, nb1, seed, thresh,
                     inv_keep, scale, 256, BM4, BK, BN, DROPOUT, HAS_BIAS, PREC, PHASE)
    if PHASE & 2:
        tl.store(Ep + pid, e + 1)


# ---------------------------------------------------------------------------------- backward
@triton.jit
def _tbq_body(DY, B, Qcur, Qnxt, Cnt, ad, s, sdm, sbm, N, m0, m1, start, rank, roff, poff, nb0,
              nb1, scale, R: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              PREC: tl.constexpr):
    """N split s of Q = s dY B^T over one row tile (``q_part``, as _b1q_body), added into this
    step's half; arrive on the adapter's counter."""
    acc, offs, rmask = q_part(DY, B, sdm, sbm, N, m0, m1, start, rank, roff, poff, nb0, nb1,
                               scale, R, BM, BN, PREC)
    tl.atomic_add(Qcur + offs, acc, mask=rmask[:, None], sem="relaxed")
    if s == 0:
        tl.store(Qnxt + offs, tl.zeros((BM, R), dtype=tl.float32), mask=rmask[:, None])
    _arrive(Cnt, ad)


@triton.jit(do_not_specialize=["nsplit", "nb_per", "n_q", "n_db", "n_xa", "n_nb", "n_kb",
                               "seed", "p_numel"])
def _tb_kernel(DY, X, A, B, Psave, DXL, DA, DB, seed, Qacc, Cnt, Ep, tmeta, tmf, ameta, amf,
               K, N, sdm, sxm, sam, sbm, sdxm, p_numel, nsplit, nb_per, n_q, n_db, n_xa, n_nb,
               n_kb, BUCKETS: tl.constexpr, BM0: tl.constexpr, BM1: tl.constexpr,
               BM2: tl.constexpr, BM3: tl.constexpr, BM4: tl.constexpr,
               CM0: tl.constexpr, CM1: tl.constexpr, CM2: tl.constexpr, CM3: tl.constexpr,
               CM4: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr, DROPOUT: tl.constexpr,
               WRITE_DX: tl.constexpr, PREC: tl.constexpr, PHASE: tl.constexpr,
               SEED_PTR: tl.constexpr = False):
    """Backward LoRA work of one step over G programs (G = the grid; ``TinyPlan.ctas`` per SM,
    all resident). Items: n_q = n_tiles x nsplit Q partials, on programs 0..n_q-1 (n_q <= G; tile
    pid // nsplit, N split pid % nsplit, nb_per blocks of BN columns); n_db = n_ad x n_nb dB
    blocks (adapter j = i // n_nb of those with tokens, column block i % n_nb), item i on program
    (n_q + i) % G, so that the Q programs take none while the grid has room; n_xa = n_ad x n_kb
    dX-LoRA / dA blocks (adapter i // n_kb, column block i % n_kb, after adapter j's Q is
    complete), item i on program i % G; producing items first. tmeta / tmf: ``TinyPlan``'s row
    per tile (column 0: j), ameta / amf: ``meta_i`` / ``meta_f`` rows of the adapters with tokens.
    Qacc: 2 x p_numel fp32, Cnt: int32 per adapter with tokens, Ep: int32 per program."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    e = tl.load(Ep + pid)
    seed = seed_value(seed, SEED_PTR)
    par = (e & 1).to(tl.int64)
    Qcur = Qacc + par * p_numel
    if pid < (n_q if PHASE & 1 else 0):
        t = pid // nsplit
        s = pid % nsplit
        j = tl.load(tmeta + t * TM)
        m0, m1, start, rank, roff, poff, bucket, thresh = _trow(tmeta, t)
        scale = tl.load(tmf + t * 2)
        nb0 = s * nb_per
        nb1 = tl.minimum(nb0 + nb_per, tl.cdiv(N, BN))
        Qnxt = Qacc + (1 - par) * p_numel
        if BUCKETS & 1:
            if bucket == 0:
                _tbq_body(DY, B, Qcur, Qnxt, Cnt, j, s, sdm, sbm, N, m0, m1, start, rank,
                          roff, poff, nb0, nb1, scale, 16, BM0, BN, PREC)
        if BUCKETS & 2:
            if bucket == 1:
                _tbq_body(DY, B, Qcur, Qnxt, Cnt, j, s, sdm, sbm, N, m0, m1, start, rank,
                          roff, poff, nb0, nb1, scale, 32, BM1, BN, PREC)
        if BUCKETS & 4:
            if bucket == 2:
                _tbq_body(DY, B, Qcur, Qnxt, Cnt, j, s, sdm, sbm, N, m0, m1, start, rank,
                          roff, poff, nb0, nb1, scale, 64, BM2, BN, PREC)
        if BUCKETS & 8:
            if bucket == 3:
                _tbq_body(DY, B, Qcur, Qnxt, Cnt, j, s, sdm, sbm, N, m0, m1, start, rank,
                          roff, poff, nb0, nb1, scale, 128, BM3, BN, PREC)
        if BUCKETS & 16:
            if bucket == 4:
                _tbq_body(DY, B, Qcur, Qnxt, Cnt, j, s, sdm, sbm, N, m0, m1, start, rank,
                          roff, poff, nb0, nb1, scale, 256, BM4, BN, PREC)
    for i in range((pid + G - n_q) % G, n_db if PHASE & 1 else 0, G):   # dB = s P^T dY
        nb = i % n_nb
        start, L, rank, roff, poff, bucket, thresh = _arow(ameta, i // n_nb)
        m1 = start + L
        scale = tl.load(amf + (i // n_nb) * 2)
        if BUCKETS & 1:
            if (bucket == 0) & (nb * BN * CM0 < N):
                b1b_body(DY, Psave, DB, DB, sdm, N, start, m1, start, rank, roff, poff, nb,
                          scale, 1, 16, BM0, BN * CM0, PREC)
        if BUCKETS & 2:
            if (bucket == 1) & (nb * BN * CM1 < N):
                b1b_body(DY, Psave, DB, DB, sdm, N, start, m1, start, rank, roff, poff, nb,
                          scale, 1, 32, BM1, BN * CM1, PREC)
        if BUCKETS & 4:
            if (bucket == 2) & (nb * BN * CM2 < N):
                b1b_body(DY, Psave, DB, DB, sdm, N, start, m1, start, rank, roff, poff, nb,
                          scale, 1, 64, BM2, BN * CM2, PREC)
        if BUCKETS & 8:
            if (bucket == 3) & (nb * BN * CM3 < N):
                b1b_body(DY, Psave, DB, DB, sdm, N, start, m1, start, rank, roff, poff, nb,
                          scale, 1, 128, BM3, BN * CM3, PREC)
        if BUCKETS & 16:
            if (bucket == 4) & (nb * BN * CM4 < N):
                b1b_body(DY, Psave, DB, DB, sdm, N, start, m1, start, rank, roff, poff, nb,
                          scale, 1, 256, BM4, BN * CM4, PREC)
    for i in range(pid, n_xa if PHASE & 2 else 0, G):   # dX's LoRA term and dA, one block
        j = i // n_kb
        kb = i % n_kb
        start, L, rank, roff, poff, bucket, thresh = _arow(ameta, j)
        inv_keep = tl.load(amf + j * 2 + 1)
        if BUCKETS & 1:
            if (bucket == 0) & (kb * BK * CM0 < K):
                _wait(Cnt, j, ((e + 1) * (tl.cdiv(L, BM0) * nsplit)).to(tl.int32))
                b2_body(X, A, Qcur, DXL, DA, DA, sxm, sam, sdxm, K, start, start + L,
                         start, rank, roff, poff, kb, seed, thresh, inv_keep, 1, 16, BM0,
                         BK * CM0, DROPOUT, WRITE_DX, PREC)
        if BUCKETS & 2:
            if (bucket == 1) & (kb * BK * CM1 < K):
                _wait(Cnt, j, ((e + 1) * (tl.cdiv(L, BM1) * nsplit)).to(tl.int32))
                b2_body(X, A, Qcur, DXL, DA, DA, sxm, sam, sdxm, K, start, start + L,
                         start, rank, roff, poff, kb, seed, thresh, inv_keep, 1, 32, BM1,
                         BK * CM1, DROPOUT, WRITE_DX, PREC)
        if BUCKETS & 4:
            if (bucket == 2) & (kb * BK * CM2 < K):
                _wait(Cnt, j, ((e + 1) * (tl.cdiv(L, BM2) * nsplit)).to(tl.int32))
                b2_body(X, A, Qcur, DXL, DA, DA, sxm, sam, sdxm, K, start, start + L,
                         start, rank, roff, poff, kb, seed, thresh, inv_keep, 1, 64, BM2,
                         BK * CM2, DROPOUT, WRITE_DX, PREC)
        if BUCKETS & 8:
            if (bucket == 3) & (kb * BK * CM3 < K):
                _wait(Cnt, j, ((e + 1) * (tl.cdiv(L, BM3) * nsplit)).to(tl.int32))
                b2_body(X, A, Qcur, DXL, DA, DA, sxm, sam, sdxm, K, start, start + L,
                         start, rank, roff, poff, kb, seed, thresh, inv_keep, 1, 128, BM3,
                         BK * CM3, DROPOUT, WRITE_DX, PREC)
        if BUCKETS & 16:
            if (bucket == 4) & (kb * BK * CM4 < K):
                _wait(Cnt, j, ((e + 1) * (tl.cdiv(L, BM4) * nsplit)).to(tl.int32))
                b2_body(X, A, Qcur, DXL, DA, DA, sxm, sam, sdxm, K, start, start + L,
                         start, rank, roff, poff, kb, seed, thresh, inv_keep, 1, 256, BM4,
                         BK * CM4, DROPOUT, WRITE_DX, PREC)
    if PHASE & 2:
        tl.store(Ep + pid, e + 1)


# -------------------------------------------------------------------------------------- host
class TinyPlan:
    """Launch data of the two-launch path for one plan on one device (``tiny_plan``).

    Forward: fsplit programs per row tile (K splits of P = N groups of Y), kb_per / nbf_per K / N
    blocks (BK / BN columns) per program; grid_f = n_tiles x fsplit (<= n_sm). ``ctas``:
    ``_tb_kernel``'s programs per SM (``KernelConfig.tiny_ctas``; ``bind_backward`` takes a
    TinyPlan of fewer where the compiled kernel does not fit that many without spilling).
    ``backward``: whether ``_tb_kernel`` runs
    the backward: where the plan's ``nsplit`` is 1 (the four-launch ``_b1`` would leave Q unsplit,
    session 19's rule) and, at ctas >= 2, also where every program takes at most one dX / dA
    item (n_xa <= grid_b; H100: more items per program lost to ``_b1`` + ``_b2``, session 20); then
    bsplit N splits of Q per row tile, nbb_per N blocks each; n_q = n_tiles x bsplit Q items,
    n_db = n_ad x n_nb dB blocks, n_xa = n_ad x n_kb dX / dA blocks (n_ad adapters with tokens);
    grid_b = min(ctas x n_sm, max(n_q + n_db, n_xa)): every program is resident while any spins.
    Device tables (int32 / fp32): ``tmeta`` (n_tiles, TM): j (the tile's adapter among those with
    tokens), m0, m1, then its adapter's ``meta_i`` columns start .. keep threshold; ``ameta``
    (n_ad, 8): ``meta_i`` of the adapters with tokens; ``tmf(dropout)`` / ``amf(dropout)``: their
    ``meta_f`` (or ``meta_f_nodrop``) rows."""

    def __init__(self, plan, n_sm: int, device, ctas: int = 1):
        cfg = plan.cfg
        nkb, nnb = cdiv(plan.in_features, cfg.bk), cdiv(plan.out_features, cfg.bn)
        self.n_sm, self.ctas = n_sm, ctas
        fs = max(1, min(cfg.max_split, nkb, n_sm // plan.n_tiles))
        self.kb_per = cdiv(nkb, fs)
        self.fsplit = cdiv(nkb, self.kb_per)
        self.nbf_per = cdiv(nnb, self.fsplit)
        self.grid_f = plan.n_tiles * self.fsplit
        bs = max(1, min(cfg.max_split, nnb, max(1, ctas) * n_sm // plan.n_tiles))
        self.nbb_per = cdiv(nnb, bs)
        self.bsplit = cdiv(nnb, self.nbb_per)
        ads = [i for i, L in enumerate(plan.seg_lens) if L > 0]
        self.n_nb, self.n_kb = nnb, nkb
        self.n_q = plan.n_tiles * self.bsplit
        self.n_db, self.n_xa = len(ads) * nnb, len(ads) * nkb
        self.grid_b = min(max(1, ctas) * n_sm, max(self.n_q + self.n_db, self.n_xa))
        self.backward = (ctas >= 1 and plan.nsplit == 1) \
            or (ctas >= 2 and self.n_xa <= self.grid_b)
        self.n_ad = len(ads)
        idx = torch.tensor(ads, dtype=torch.long).to(plan.meta_i.device)
        tad = plan.tiles[:, 0].long()
        pos = torch.zeros(len(plan.seg_lens), dtype=torch.int32, device=idx.device)
        pos[idx] = torch.arange(len(ads), dtype=torch.int32, device=idx.device)
        self.tmeta = torch.cat([pos[tad][:, None], plan.tiles[:, 1:3], plan.meta_i[tad, :7]],
                               1).contiguous().to(device)
        self.ameta = plan.meta_i[idx].contiguous().to(device)
        self._mf = {d: (m[tad].contiguous().to(device), m[idx].contiguous().to(device))
                    for d, m in ((True, plan.meta_f), (False, plan.meta_f_nodrop))}

    def tmf(self, dropout: bool):
        return self._mf[bool(dropout)][0]

    def amf(self, dropout: bool):
        return self._mf[bool(dropout)][1]


def phases() -> tuple:
    """The launches of each kernel per step: (3,) on the GPU, (1, 2) under the interpreter."""
    return (1, 2) if os.environ.get("TRITON_INTERPRET") == "1" else (3,)


def tiny_plan(plan, device, n_sm: "int | None" = None,
              ctas: "int | None" = None) -> "TinyPlan | None":
    """The two-launch path's launch data for ``plan`` on ``device``, or None where the four-launch
    path runs: it runs when 0 < tokens <= ``cfg.tiny_tokens`` (-1: 512 on CUDA where every
    adapter with tokens has rank <= 64, else never), cuBLAS runs both base GEMMs
    (``lora_gemm.choose_gemm``: our GEMM's epilogue takes the LoRA term otherwise) and the row
    tiles fit one program per SM (``n_sm``: the device's SM count, 8 off CUDA). ``ctas``:
    ``_tb_kernel``'s programs per SM (default ``cfg.tiny_ctas``). Cached on the plan."""
    from .lora_gemm import num_sms, choose_gemm
    device = torch.device(device)
    ctas = int(plan.cfg.tiny_ctas if ctas is None else ctas)
    key = ("tiny", str(device), n_sm, ctas)
    if key in plan.extra:
        return plan.extra[key]
    tp = None
    limit = int(plan.cfg.tiny_tokens)
    if limit < 0:
        hi = max((r for r, L in zip(plan.ranks, plan.seg_lens) if L > 0), default=0)
        limit = TINY_TOKENS_CUDA if device.type == "cuda" and hi <= TINY_MAX_RANK else 0
    if 0 < plan.n_tokens <= limit and plan.n_tiles > 0 \
            and choose_gemm(plan, "fwd", device) is None \
            and choose_gemm(plan, "bwd", device) is None:
        n = int(n_sm or (num_sms(device) if device.type == "cuda" else 8))
        if plan.n_tiles <= n:
            tp = TinyPlan(plan, n, device, ctas)
    plan.extra[key] = tp
    return tp


def bind_forward(plan, x, lora_A, lora_B, has_bias: bool, seed_is_tensor: bool, dropout: bool,
                 prec: str, g_numel: int) -> "list | None":
    """The forward's bound ``_tf_kernel`` launches (one per phase, called with (X, A, B, Y, bias,
    Psave, seed, G)), or None where ``tiny_plan`` says the four-launch path runs. The workspaces
    (two halves of P's fp32 sums, a counter per row tile, a step count per program) start at zero
    and are never reset (module docstring). ``g_numel`` > 0: G, the four-launch backward's fp32
    Q workspace, is zeroed (as ``_f2`` does)."""
    from .fastlaunch import BoundLaunch
    tp = tiny_plan(plan, x.device)
    if tp is None:
        return None
    cfg = plan.cfg
    p_numel = max(plan.p_size, 1)
    ws = dict(Pacc=torch.zeros(2 * p_numel, dtype=torch.float32, device=x.device),
              Cnt=torch.zeros(plan.n_tiles, dtype=torch.int32, device=x.device),
              Ep=torch.zeros(tp.grid_f, dtype=torch.int32, device=x.device))
    meta_f = plan.meta_f if dropout else plan.meta_f_nodrop
    return [BoundLaunch(
        _tf_kernel, (tp.grid_f,), "tf", plan.buckets, cfg,
        ("X", "A", "B", "Y", "bias", "Psave", "seed", "G"),
        dict(ws, tiles=plan.tiles, meta_i=plan.meta_i, meta_f=meta_f, K=plan.in_features,
             N=plan.out_features, sxm=x.stride(0), sam=lora_A.stride(0), sbm=lora_B.stride(0),
             syn=plan.out_features, p_numel=p_numel, g_numel=g_numel, nsplit=tp.fsplit,
             kb_per=tp.kb_per, nb_per=tp.nbf_per, BUCKETS=plan.buckets, **cfg.bm_kwargs(),
             BK=cfg.bk, BN=cfg.bn, DROPOUT=dropout, HAS_BIAS=has_bias, ZERO_G=g_numel > 0,
             PREC=prec, PHASE=ph, SEED_PTR=seed_is_tensor),
        dict(num_warps=cfg.warps_f1), start_stages=cfg.stages_f1, checked=(0, 1, 2, 4))
        for ph in phases()]


def resident_ctas(compiled, warps: int, device) -> int:
    """CTAs of ``compiled`` (a Triton ``CompiledKernel`` of ``warps`` warps) that one SM of
    ``device`` holds at once: by registers (``n_regs`` x 32 x warps of the SM's register file),
    shared memory (``metadata.shared`` + 1,024 B the CUDA runtime reserves per CTA, of the SM's)
    and threads (CUDA occupancy rules, sm_90: 65,536 registers, 233,472 B, 2,048 threads)."""
    pr = torch.cuda.get_device_properties(device)
    regs = getattr(pr, "regs_per_multiprocessor", 65536)
    smem = getattr(pr, "shared_memory_per_multiprocessor", 233472)
    thr = getattr(pr, "max_threads_per_multi_processor", 2048)
    compiled._init_handles()   # (loads the module: Triton sets n_regs there)
    nr = -(-int(compiled.n_regs) // 8) * 8   # allocated per warp in units of 256 registers
    sh = int(getattr(compiled.metadata, "shared", 0)) + 1024
    return min(regs // (nr * 32 * warps), smem // sh, thr // (32 * warps))


def _fit(kernel, kw: dict, warps: int, stages: int, ctas: int,
         device) -> "tuple[int, dict]":
    """(ctas, launch options) for ``kernel`` with arguments ``kw``: from ``ctas`` down, the
    first count that the compiled kernel (registers capped at the SM's file / (ctas x threads)
    by ``maxnreg``) fits on one SM (``resident_ctas``) without spilling registers (H100, the
    4096x4096 ``tiny`` mix, ranks 2 and 64: 128 registers, ``_tb`` 11.4 us against ``_b1`` +
    ``_b2`` 4.3 + 6.3, session 20); 1 (no cap) where none does."""
    pr = torch.cuda.get_device_properties(device)
    regs = getattr(pr, "regs_per_multiprocessor", 65536)
    for c in range(ctas, 1, -1):
        opt = dict(num_warps=warps, maxnreg=min(255, regs // (c * 32 * warps) // 8 * 8))
        try:
            k = kernel.warmup(grid=(1,), num_stages=stages, **kw, **opt)
        except Exception:  # noqa: BLE001 - no such cap or no fit: fewer programs per SM
            continue
        if resident_ctas(k, warps, device) >= c and not getattr(k, "n_spills", 0):
            return c, opt
    return 1, dict(num_warps=warps)


def bind_backward(plan, x, dy, lora_A, lora_B, seed_is_tensor: bool, dropout: bool,
                  write_dx: bool, prec: str) -> "list | None":
    """The backward's bound ``_tb_kernel`` launches (one per phase, called with (DY, X, A, B,
    Psave, DXL, DA, DB, seed)), or None where the four-launch backward runs (``tiny_plan`` None
    or not ``backward``). ``write_dx``: store dX's LoRA term into DXL (cuBLAS then adds dY W,
    beta 1). On CUDA the kernel is compiled first and the grid sized for the programs per SM it
    fits (``_fit``: all must be resident, as the consumers spin)."""
    from .fastlaunch import BoundLaunch
    tp = tiny_plan(plan, x.device)
    if tp is None or not tp.backward:
        return None
    cfg = plan.cfg
    p_numel = max(plan.p_size, 1)

    def static(tp, ph, ws):
        return dict(
            ws, tmeta=tp.tmeta, tmf=tp.tmf(dropout), ameta=tp.ameta, amf=tp.amf(dropout),
            K=plan.in_features, N=plan.out_features, sdm=dy.stride(0), sxm=x.stride(0),
            sam=lora_A.stride(0), sbm=lora_B.stride(0),
            sdxm=plan.in_features if write_dx else 0, p_numel=p_numel, nsplit=tp.bsplit,
            nb_per=tp.nbb_per, n_q=tp.n_q, n_db=tp.n_db, n_xa=tp.n_xa, n_nb=tp.n_nb,
            n_kb=tp.n_kb, BUCKETS=plan.buckets, **cfg.bm_kwargs(), **cfg.cm_kwargs(),
            BK=cfg.bk, BN=cfg.bn, DROPOUT=dropout, WRITE_DX=write_dx, PREC=prec, PHASE=ph,
            SEED_PTR=seed_is_tensor)

    opt = dict(num_warps=cfg.warps_b2)
    if phases() == (3,) and tp.ctas >= 2:
        seed = torch.zeros(1, dtype=torch.int64, device=x.device) if seed_is_tensor else 1
        z = torch.zeros(1, dtype=torch.int32, device=x.device)   # (compiled only, never run)
        kw = dict(static(tp, 3, dict(Qacc=z.float(), Cnt=z, Ep=z)), DY=dy, X=x, A=lora_A,
                  B=lora_B, Psave=x, DXL=x, DA=lora_A, DB=lora_B, seed=seed)
        ctas, opt = _fit(_tb_kernel, kw, cfg.warps_b2, cfg.stages_b2, tp.ctas, x.device)
        if ctas != tp.ctas:
            tp = tiny_plan(plan, x.device, ctas=ctas)
            if tp is None or not tp.backward:
                return None
    ws = dict(Qacc=torch.zeros(2 * p_numel, dtype=torch.float32, device=x.device),
              Cnt=torch.zeros(tp.n_ad, dtype=torch.int32, device=x.device),
              Ep=torch.zeros(tp.grid_b, dtype=torch.int32, device=x.device))
    return [BoundLaunch(
        _tb_kernel, (tp.grid_b,), "tb", plan.buckets, cfg,
        ("DY", "X", "A", "B", "Psave", "DXL", "DA", "DB", "seed"), static(tp, ph, ws), opt,
        start_stages=cfg.stages_b2, checked=(0, 1, 2, 3)) for ph in phases()]

