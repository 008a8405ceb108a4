"""Persistent TMA variant of the frozen layer's GEMM with the LoRA term (``lora_gemm_kernel``'s
math, same operands and row tiles; profiler/KERNELS.md, session 16).

One program per SM walks the output tiles ``start_pid, start_pid + NUM_SMS, ...`` (the grouped
order of ``gemm_lora_kernel``; Triton's tutorial 09-persistent-matmul). The LoRA term

    forward   acc += (s_i Psave_i[rows]) B_i[:, cols]
    backward  acc += mask_i(Q_i[rows] A_i^T[:, cols]) / (1 - p_i)

is added either before the main loop at the tile's full width (LORA_FIRST, as the per-tile
kernel does: one accumulator, the main loop adds onto it) or after it, per column part (BN /
SPLIT columns, SPLIT 1, 2 or 4), in a second accumulator of the part's size. With FLATTEN the
tile loop and the reduction loop are pipelined as one (``tl.range(..., flatten=True)``), so the
next tile's TMA loads are in flight while this tile's epilogue runs. Measured on an H100 with
Triton 3.6 (session 16): the plain GEMM (no LoRA) flattened is within 2% of cuBLAS; but any
further dot in the flattened loop (the LoRA term before or after) makes every main-loop wgmma
synchronous (sm_90 SASS: ``WARPGROUP.DEPBAR.LE gsb0, 0x0`` after each ``HGMMA``): 22-34%
slower than the per-tile kernel, so the shipped configuration is LORA_FIRST without FLATTEN
(base_gemm.json). WS (Triton's
warp-specialised loop) compiles for sm_90 to the same code as without it (no partitions).

Row tiles come from ``mtiles`` (adapter, m0, m1) as in ``gemm_lora_kernel``, or, with UNIFORM,
are m0 = mt * BM (the plain GEMM of the comparison with cuBLAS). With TMA_STORE (only when every
row tile is full: a TMA block of a tile clipped at its segment's end would overwrite the next
segment's rows) tiles are stored through a TMA descriptor of OUT (blocks [BM, BN // SPLIT]),
else through masked pointer stores.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .lora_gemm_kernel import adapter_term, tma_mainloop


@triton.jit
def _tile(t, n_nt, n_mt, GROUP_M: tl.constexpr):
    """(row tile, column tile) of linear tile ``t`` in the grouped order (GROUP_M row tiles per
    group, for W's reuse in L2)."""
    width = GROUP_M * n_nt
    first = (t // width) * GROUP_M
    gsize = tl.minimum(n_mt - first, GROUP_M)
    return first + (t % width) % gsize, (t % width) // gsize


@triton.jit
def _halves(a, BM: tl.constexpr, W: tl.constexpr):
    """The two column halves (BM, W // 2) of ``a`` (BM, W) (tutorial 09's epilogue subtiling)."""
    return tl.split(tl.permute(tl.reshape(a, (BM, 2, W // 2)), (0, 2, 1)))


@triton.jit
def _lora_first(acc, LO, RI, mtiles, meta_i, meta_f, sri, mt, nt, m0, NOUT, seed,
                BUCKETS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BWD: tl.constexpr,
                DROPOUT: tl.constexpr, SEED_PTR: tl.constexpr, PREC: tl.constexpr):
    """The LoRA term of row tile ``mt``, column tile ``nt`` at the tile's full width, before the
    main loop (``gemm_lora_kernel``'s order: one accumulator, the main loop adds onto it)."""
    ad = tl.load(mtiles + mt * 3)
    m1 = tl.load(mtiles + mt * 3 + 2)
    rows = m0 + tl.arange(0, BM)
    cols = nt * BN + tl.arange(0, BN)
    rmask = rows < m1
    cmask = cols < NOUT
    acc = adapter_term(acc, LO, RI, meta_i, meta_f, ad, sri, rows, rmask, cols, cmask, nt * BN,
                        NOUT, seed, BUCKETS, BM, BN, BWD, DROPOUT, SEED_PTR, PREC)
    if not (BWD and DROPOUT):
        # keeps the main loop's wgmma asynchronous (gemm_lora_kernel, session 15)
        acc = tl.where(rmask[:, None], acc, 0.0)
    return acc


@triton.jit
def _part(acc, OUT, ODESC, LO, RI, BIAS, meta_i, meta_f, ad, m0, m1, c0, NOUT, som, sri, seed,
          BUCKETS: tl.constexpr, BM: tl.constexpr, PW: tl.constexpr, BWD: tl.constexpr,
          LORA: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr,
          SEED_PTR: tl.constexpr, TMA_STORE: tl.constexpr, PREC: tl.constexpr):
    """Adds the LoRA term (and bias) to the column part c0 .. c0 + PW of a tile's accumulator and
    stores it. The term has its own accumulator: used as the main loop's accumulator's, it left
    the main loop's wgmma synchronous (local sm_90 compile: DEPBAR.LE gsb0, 0x0 after each)."""
    rows = m0 + tl.arange(0, BM)
    cols = c0 + tl.arange(0, PW)
    rmask = rows < m1
    cmask = cols < NOUT
    if LORA:
        acc += adapter_term(tl.zeros((BM, PW), dtype=tl.float32), LO, RI, meta_i, meta_f, ad,
                             sri, rows, rmask, cols, cmask, c0, NOUT, seed, BUCKETS, BM, PW, BWD,
                             DROPOUT, SEED_PTR, PREC)
    if HAS_BIAS:
        acc += tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    _store(OUT, ODESC, acc, rows, cols, rmask, cmask, som, m0, c0, TMA_STORE)


@triton.jit
def _store(OUT, ODESC, val, rows, cols, rmask, cmask, som, m0, c0,
           TMA_STORE: tl.constexpr):
    if TMA_STORE:   # every tile full (the host checks): Triton 3.6's loop flattening fails on
        # an scf.if that holds a descriptor store in the epilogue
        ODESC.store([m0, c0], val.to(ODESC.dtype))
    else:
        tl.store(OUT + rows.to(tl.int64)[:, None] * som + cols[None, :],
                 val.to(OUT.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


@triton.jit
def _tail_half(XIN, W, OUT, LO, RI, BIAS, mtiles, meta_i, meta_f, WSP, TCNT, NOUT, som, sri,
               seed, u, n_full, n_nt, n_mt, k_tiles,
               BUCKETS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               GROUP_M: tl.constexpr, BWD: tl.constexpr, LORA: tl.constexpr,
               HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr, SEED_PTR: tl.constexpr,
               PREC: tl.constexpr):
    """Half ``u % 2`` of the reduction of tail tile ``n_full + u // 2`` (TAIL_SPLIT): half 0
    adds the LoRA term (LORA_FIRST order) and K steps [0, k_tiles / 2), half 1 the rest; each
    stores its fp32 sum into its own slot of the workspace WSP (2 x BM x BN per tail tile), and
    the second to finish (the tile's int32 counter in TCNT, zero between launches) adds the two
    slots, stores the tile and zeroes the counter again. (fp32 atomics of both halves into one
    zeroed slot, as ``_f1``'s K splits do, made the GEMM 34 us slower on 4096x4096 8+128, H100;
    profiler/KERNELS.md, "Session 16, second helper".)"""
    j = u // 2
    half = u % 2
    mt, nt = _tile(n_full + j, n_nt, n_mt, GROUP_M)
    m0 = tl.load(mtiles + mt * 3 + 1)
    m1 = tl.load(mtiles + mt * 3 + 2)
    rows = m0 + tl.arange(0, BM)
    rmask = rows < m1
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if LORA:
        if half == 0:
            acc = _lora_first(acc, LO, RI, mtiles, meta_i, meta_f, sri, mt, nt, m0, NOUT, seed,
                              BUCKETS, BM, BN, BWD, DROPOUT, SEED_PTR, PREC)
        # a select after the branch keeps the loop's wgmma asynchronous (session 15: with the
        # accumulator a branch result every HGMMA was followed by DEPBAR.LE gsb0, 0x0)
        acc = tl.where(rmask[:, None], acc, 0.0)
    kh = k_tiles // 2
    k0 = half * kh
    k1 = kh + half * (k_tiles - kh)
    acc = tma_mainloop(acc, XIN, W, m0, nt, k0, k1, BN, BK, BWD, PREC)
    tile = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    tl.store(WSP + (2 * j + half).to(tl.int64) * (BM * BN) + tile, acc)   # this half's sum
    tl.debug_barrier()   # every thread's stores issued before the release below
    done = tl.atomic_add(TCNT + j, 1, sem="acq_rel", scope="gpu")
    if done == 1:   # both sums are in their slots: add them and store the tile, by column
        # halves re-read from L2 (holding acc and a whole slot took 255 registers: the low-rank
        # kernels' main loop went from 174 and slowed, H100, 4096x14336 16x4)
        slot = WSP + (2 * j).to(tl.int64) * (BM * BN)
        for c in tl.static_range(2):
            cols = nt * BN + c * (BN // 2) + tl.arange(0, BN // 2)
            cmask = cols < NOUT
            part = tl.arange(0, BM)[:, None] * BN + c * (BN // 2) + tl.arange(0, BN // 2)[None, :]
            v = tl.load(slot + part, cache_modifier=".cg") + tl.load(slot + BM * BN + part,
                                                                     cache_modifier=".cg")
            if HAS_BIAS:
                v += tl.load(BIAS + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
            tl.store(OUT + rows.to(tl.int64)[:, None] * som + cols[None, :],
                     v.to(OUT.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])
        tl.atomic_xchg(TCNT + j, 0)   # for the next launch


@triton.jit
def _gfin_idle(G, chunks, DA, DB, gf_items, gf_first, pid, NUM_SMS: tl.constexpr,
               GF_BLOCK: tl.constexpr):
    """``lora_kernels.gfin_kernel``'s work done by the programs ``gf_first .. NUM_SMS - 1``, which
    have no tile in the last round (GFIN): work item i of ``chunks`` (g_off, d_off, n, is_b: n <=
    GF_BLOCK elements of G from g_off, contiguous in DA or, with is_b, DB from d_off) is
    converted to the gradient's dtype and zeroed in G, two items per iteration (more bytes in
    flight per SM). Offsets and lengths are multiples of 8 (K and N are: TMA rows), so the
    accesses are 16 bytes wide."""
    nid = NUM_SMS - gf_first
    offs = tl.arange(0, GF_BLOCK)
    for i in range(pid - gf_first, gf_items, 2 * nid):
        j = tl.minimum(i + nid, gf_items - 1)
        g0 = tl.multiple_of(tl.load(chunks + i * 4), 8)
        d0 = tl.multiple_of(tl.load(chunks + i * 4 + 1), 8)
        n0 = tl.multiple_of(tl.load(chunks + i * 4 + 2), 8)
        b0 = tl.load(chunks + i * 4 + 3)
        g1 = tl.multiple_of(tl.load(chunks + j * 4), 8)
        d1 = tl.multiple_of(tl.load(chunks + j * 4 + 1), 8)
        n1 = tl.multiple_of(tl.where(i + nid < gf_items, tl.load(chunks + j * 4 + 2), 0), 8)
        b1 = tl.load(chunks + j * 4 + 3)
        m0 = offs < n0
        m1 = offs < n1
        v0 = tl.load(G + g0 + offs, mask=m0, other=0.0)
        v1 = tl.load(G + g1 + offs, mask=m1, other=0.0)
        if b0 != 0:
            tl.store(DB + d0 + offs, v0.to(DB.dtype.element_ty), mask=m0)
        else:
            tl.store(DA + d0 + offs, v0.to(DA.dtype.element_ty), mask=m0)
        if b1 != 0:
            tl.store(DB + d1 + offs, v1.to(DB.dtype.element_ty), mask=m1)
        else:
            tl.store(DA + d1 + offs, v1.to(DA.dtype.element_ty), mask=m1)
        # the zero stores below may take another thread-to-element layout than the loads
        # (Triton 3.6, sm_90: loads 8 elements a thread, the fp32 stores 4): without a barrier a
        # thread zeroed elements another had not yet read (H100: dA/dB errors of 0.03-0.17)
        tl.debug_barrier()
        z = tl.zeros((GF_BLOCK,), dtype=tl.float32)
        tl.store(G + g0 + offs, z, mask=m0)
        tl.store(G + g1 + offs, z, mask=m1)


@triton.jit(do_not_specialize=["seed", "n_mt", "gf_items", "gf_first"])
def gemm_persist_kernel(XIN, W, OUT, ODESC, LO, RI, BIAS, mtiles, meta_i, meta_f, WSP, TCNT,
                        G, chunks, DA, DB,
                        M, NOUT, KRED, som, sri, n_mt, seed, gf_items, gf_first,
                        BUCKETS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                        BK: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                        BWD: tl.constexpr, LORA: tl.constexpr, HAS_BIAS: tl.constexpr,
                        DROPOUT: tl.constexpr, SEED_PTR: tl.constexpr, UNIFORM: tl.constexpr,
                        TMA_STORE: tl.constexpr, SPLIT: tl.constexpr, FLATTEN: tl.constexpr,
                        LORA_FIRST: tl.constexpr, WS: tl.constexpr,
                        PREC: tl.constexpr, TAIL_SPLIT: tl.constexpr = False,
                        GFIN: tl.constexpr = False, GF_BLOCK: tl.constexpr = 8192):
    """OUT (M, NOUT) = XIN (M, KRED) @ op(W) + LoRA term (see the module docstring); XIN and W
    are TMA descriptors (blocks [BM, BK] and [BN, BK] forward (W: NOUT x KRED) or [BK, BN]
    backward (W: KRED x NOUT)); ODESC a descriptor of OUT (blocks [BM, BN // SPLIT]) used only
    with TMA_STORE. Grid: min(NUM_SMS, tiles) programs. SPLIT (1, 2 or 4) column parts of the
    epilogue; WS: Triton's warp-specialised loop. TAIL_SPLIT (the host sets it only when the
    last, partial round of tiles has at most NUM_SMS / 2 tiles, LORA_FIRST, not UNIFORM): the
    tiles of that round are each reduced by two programs, half of K each, through the fp32
    workspace WSP (tail tiles x 2 x BM x BN) and zeroed counters TCNT (``_tail_half``), so that the
    round takes about half a tile's time instead of a whole one (e.g. 576 tiles on 132 SMs:
    4.36 rounds of work took 5). GFIN (the host sets it only when programs ``gf_first`` ..
    NUM_SMS - 1 have no tile in the last round, grid = NUM_SMS): those programs then do the
    backward's ``_gfin`` pass over the work items ``chunks`` (``_gfin_idle``; G the dA/dB
    workspace, DA / DB the gradients), so that it costs no launch of its own."""
    start_pid = tl.program_id(0)
    n_nt = tl.cdiv(NOUT, BN)
    n_tiles = n_mt * n_nt
    k_tiles = tl.cdiv(KRED, BK)
    tile_c = start_pid - NUM_SMS   # the epilogue's own counter (tutorial 09)
    if TAIL_SPLIT:
        n_full = n_tiles - n_tiles % NUM_SMS
    else:
        n_full = n_tiles
    for t in tl.range(start_pid, n_full, NUM_SMS, flatten=FLATTEN, warp_specialize=WS):
        mt, nt = _tile(t, n_nt, n_mt, GROUP_M)
        if UNIFORM:
            m0 = mt * BM
        else:
            m0 = tl.load(mtiles + mt * 3 + 1)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        if LORA and LORA_FIRST:
            acc = _lora_first(acc, LO, RI, mtiles, meta_i, meta_f, sri, mt, nt, m0, NOUT, seed,
                              BUCKETS, BM, BN, BWD, DROPOUT, SEED_PTR, PREC)
        acc = tma_mainloop(acc, XIN, W, m0, nt, 0, k_tiles, BN, BK, BWD, PREC)
        tile_c += NUM_SMS
        mt, nt = _tile(tile_c, n_nt, n_mt, GROUP_M)
        if UNIFORM:
            ad = 0
            m0 = mt * BM
            m1 = tl.minimum(m0 + BM, M)
        else:
            ad = tl.load(mtiles + mt * 3)
            m0 = tl.load(mtiles + mt * 3 + 1)
            m1 = tl.load(mtiles + mt * 3 + 2)
        PW: tl.constexpr = BN // SPLIT
        EPI_LORA: tl.constexpr = LORA and not LORA_FIRST   # the term after the main loop
        if SPLIT == 1:
            _part(acc, OUT, ODESC, LO, RI, BIAS, meta_i, meta_f, ad, m0, m1, nt * BN, NOUT, som,
                  sri, seed, BUCKETS, BM, PW, BWD, EPI_LORA, HAS_BIAS, DROPOUT, SEED_PTR, TMA_STORE,
                  PREC)
        else:
            h0, h1 = _halves(acc, BM, BN)
            if SPLIT == 2:
                _part(h0, OUT, ODESC, LO, RI, BIAS, meta_i, meta_f, ad, m0, m1, nt * BN, NOUT,
                      som, sri, seed, BUCKETS, BM, PW, BWD, EPI_LORA, HAS_BIAS, DROPOUT, SEED_PTR,
                      TMA_STORE, PREC)
                _part(h1, OUT, ODESC, LO, RI, BIAS, meta_i, meta_f, ad, m0, m1, nt * BN + PW,
                      NOUT, som, sri, seed, BUCKETS, BM, PW, BWD, EPI_LORA, HAS_BIAS, DROPOUT,
                      SEED_PTR, TMA_STORE, PREC)
            else:   # 4 quarters
                q0, q1 = _halves(h0, BM, BN // 2)
                q2, q3 = _halves(h1, BM, BN // 2)
                _part(q0, OUT, ODESC, LO, RI, BIAS, meta_i, meta_f, ad, m0, m1, nt * BN, NOUT,
                      som, sri, seed, BUCKETS, BM, PW, BWD, EPI_LORA, HAS_BIAS, DROPOUT, SEED_PTR,
                      TMA_STORE, PREC)
                _part(q1, OUT, ODESC, LO, RI, BIAS, meta_i, meta_f, ad, m0, m1, nt * BN + PW,
                      NOUT, som, sri, seed, BUCKETS, BM, PW, BWD, EPI_LORA, HAS_BIAS, DROPOUT,
                      SEED_PTR, TMA_STORE, PREC)
                _part(q2, OUT, ODESC, LO, RI, BIAS, meta_i, meta_f, ad, m0, m1, nt * BN + 2 * PW,
                      NOUT, som, sri, seed, BUCKETS, BM, PW, BWD, EPI_LORA, HAS_BIAS, DROPOUT,
                      SEED_PTR, TMA_STORE, PREC)
                _part(q3, OUT, ODESC, LO, RI, BIAS, meta_i, meta_f, ad, m0, m1, nt * BN + 3 * PW,
                      NOUT, som, sri, seed, BUCKETS, BM, PW, BWD, EPI_LORA, HAS_BIAS, DROPOUT,
                      SEED_PTR, TMA_STORE, PREC)
    if TAIL_SPLIT:
        if start_pid < 2 * (n_tiles - n_full):
            _tail_half(XIN, W, OUT, LO, RI, BIAS, mtiles, meta_i, meta_f, WSP, TCNT, NOUT, som,
                       sri, seed, start_pid, n_full, n_nt, n_mt, k_tiles, BUCKETS, BM, BN, BK,
                       GROUP_M, BWD, LORA, HAS_BIAS, DROPOUT, SEED_PTR, PREC)
    if GFIN:
        if start_pid >= gf_first:
            _gfin_idle(G, chunks, DA, DB, gf_items, gf_first, start_pid, NUM_SMS, GF_BLOCK)
