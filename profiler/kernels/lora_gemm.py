"""The frozen layer's two GEMMs with the LoRA term carried in their epilogue (``lora_gemm_kernel``),
and the choice, per GEMM shape and GPU, between them and cuBLAS.

Forward ``Y = X W^T (+ bias) + s_i Psave_i B_i`` and backward ``dX = dY W + mask(Q_i A_i^T)/(1-p_i)``
(docs/kernel.md, "Fused multi-LoRA kernel"). The choice (``KernelConfig.base_gemm``):

* ``"cublas"``: torch's ``addmm_`` (cuBLAS) adds the base product onto the LoRA term that
  ``_f2`` / ``_b2`` wrote (one more write and read of Y / dX).
* ``"triton"``: always this module's GEMM (tiles from ``gemm_fwd`` / ``gemm_bwd`` or
  ``GemmConfig()``).
* ``"auto"`` (default): this module's GEMM only for the (pass, in_features, out_features) shapes
  that ``profiler/data/base_gemm.json`` records as measured faster than cuBLAS's two-pass path on
  this GPU model (by ``bench/base_gemm.py``), from its ``min_tokens`` on; cuBLAS everywhere else,
  including every GPU and shape that was never measured.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from .config import GemmConfig, KernelConfig, cdiv, launch, seed_args
from .fastlaunch import BoundLaunch
from .lora_gemm_kernel import gemm_lora_kernel
from .lora_gemm_persist import gemm_persist_kernel

__all__ = ["TABLE_PATH", "gemm_table", "choose_gemm", "row_tiles", "gemm_lora_forward",
           "gemm_lora_backward", "base_gemm", "bound_gemm", "tma_desc", "gfin_first",
           "gfin_items"]

TABLE_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                          "base_gemm.json")
_TABLE: dict = {}
_BASE_TILES: dict = {}


def gemm_table(path: str = TABLE_PATH) -> dict:
    """The measured choice table: {gpu name: {"fwd|K|N" or "bwd|K|N": {"impl": "triton" or
    "cublas", "min_tokens": int, "config": GemmConfig fields, ...}}}; {} if the file is absent.
    Raises ValueError naming the file if it is not valid JSON."""
    if path not in _TABLE:
        if not os.path.exists(path):
            _TABLE[path] = {}
        else:
            try:
                with open(path) as f:
                    _TABLE[path] = json.load(f).get("gpus", {})
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
    return _TABLE[path]


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def choose_gemm(plan, pass_: str, device, cfg: Optional[KernelConfig] = None,
                table: Optional[dict] = None) -> Optional[GemmConfig]:
    """Tiles of this module's GEMM for pass ``pass_`` ("fwd" or "bwd") of ``plan`` on ``device``,
    or None where cuBLAS runs it (see the module docstring); ``table`` defaults to
    ``gemm_table()``. Cached on the plan."""
    cfg = cfg or plan.cfg
    device = torch.device(device)
    key = ("gemm", pass_, str(device))
    if key in plan.extra:
        return plan.extra[key]
    own = cfg.gemm_fwd if pass_ == "fwd" else cfg.gemm_bwd
    choice = None
    if cfg.base_gemm == "triton":
        choice = own or GemmConfig()
    elif cfg.base_gemm == "auto":
        ent = (gemm_table() if table is None else table).get(_device_name(device), {}).get(
            f"{pass_}|{plan.in_features}|{plan.out_features}")
        if ent and ent.get("impl") == "triton" and plan.n_tokens >= int(ent.get("min_tokens", 0)):
            choice = own or GemmConfig(**ent.get("config", {}))
    if choice is not None and pass_ == "bwd" and cfg.base_gemm == "auto" \
            and cfg.bwd_cublas != "table":   # KernelConfig.bwd_cublas (not under "triton")
        n_tiles = sum(cdiv(L, choice.bm) for L in plan.seg_lens) * cdiv(plan.in_features,
                                                                         choice.bn)
        if cfg.bwd_cublas == "always" or (choice.persistent and tail_split_tiles(
                choice, n_tiles, num_sms(device)) > 0):
            choice = None
    plan.extra[key] = choice
    return choice


def row_tiles(plan, bm: int, device) -> torch.Tensor:
    """(n, 3) int32 row tiles (adapter, m0, m1) of at most ``bm`` rows, clipped at each
    segment's end (empty segments have none), in token order; cached on the plan."""
    key = ("rows", int(bm), str(device))
    t = plan.extra.get(key)
    if t is None:
        out = []
        for i, (s, L) in enumerate(zip(plan.starts, plan.seg_lens)):
            out += [(i, m0, min(m0 + bm, s + L)) for m0 in range(s, s + L, bm)]
        t = torch.tensor(out or [[0, 0, 0]], dtype=torch.int32).reshape(-1, 3).to(device)
        plan.extra[key] = t
    return t


def _run(a, w, out, mtiles, gc: GemmConfig, bwd: bool, prec: str, plan=None, lo=None, ri=None,
         bias=None, seed=0, dropout: bool = False) -> None:
    """One launch of ``gemm_lora_kernel`` over the row tiles ``mtiles``; with ``plan`` the LoRA
    term of its adapters (``lo`` the compact P or Q, ``ri`` lora_B or lora_A) is added, without
    it the plain GEMM runs."""
    if gc.persistent:
        return _run_persist(a, w, out, mtiles, gc, bwd, prec, plan, lo, ri, bias, seed, dropout)
    M, kred = a.shape
    nout = out.shape[1]
    cfg = plan.cfg if plan is not None else KernelConfig()
    sarg, sptr = seed_args(seed)
    ri_stride = ri.stride(0) if ri is not None else 0
    tma = cfg.gemm_tma and _tma_ok(a) and _tma_ok(w)
    if tma:
        a_op = TensorDescriptor.from_tensor(a, [gc.bm, gc.bk])
        w_op = TensorDescriptor.from_tensor(w, [gc.bk, gc.bn] if bwd else [gc.bn, gc.bk])
    else:
        a_op, w_op = a, w
    buckets = plan.buckets if plan is not None else 0
    meta = (plan.meta_i, plan.meta_f) if plan is not None else (mtiles, mtiles)  # unused without
    # the launch wrapper remembers the stages that fit per name: the tiles decide them, so they
    # are part of the name
    launch(gemm_lora_kernel, (mtiles.shape[0] * cdiv(nout, gc.bn),),
           f"gemm_{'bwd' if bwd else 'fwd'}{dataclasses.astuple(gc)}", buckets, cfg,
           a_op, w_op, out, out if lo is None else lo, out if ri is None else ri,
           out if bias is None else bias, mtiles, *meta,
           M, nout, kred, a.stride(0), w.stride(0), out.stride(0), ri_stride, mtiles.shape[0], sarg,
           start_stages=gc.fitted_stages(),
           BUCKETS=buckets, BM=gc.bm, BN=gc.bn, BK=gc.bk, GROUP_M=gc.group_m,
           BWD=bwd, LORA=plan is not None, HAS_BIAS=bias is not None, DROPOUT=dropout,
           SEED_PTR=sptr, EVEN_K=kred % gc.bk == 0, EVEN_N=nout % gc.bn == 0, USE_TMA=tma,
           PREC=prec, num_warps=gc.warps)


_NUM_SMS: dict = {}


def num_sms(device) -> int:
    """Multiprocessors of ``device`` (the persistent grid); 4 off CUDA (the interpreter)."""
    key = str(device)
    if key not in _NUM_SMS:
        dev = torch.device(device)
        _NUM_SMS[key] = (torch.cuda.get_device_properties(dev).multi_processor_count
                         if dev.type == "cuda" else 4)
    return _NUM_SMS[key]


def _run_persist(a, w, out, mtiles, gc: GemmConfig, bwd: bool, prec: str, plan=None, lo=None,
                 ri=None, bias=None, seed=0, dropout: bool = False, uniform: bool = False) -> None:
    """One launch of ``lora_gemm_persist``'s kernel (``_run``'s arguments; ``uniform``: row tiles
    m0 = i * bm, the plain GEMM). Operands that do not allow TMA (``_tma_ok``) run the per-tile
    kernel instead. The output goes through a TMA store only when every row tile is full
    (``all_tiles_full``)."""
    if not (_tma_ok(a) and _tma_ok(w) and _tma_ok(out)):   # the per-tile kernel's pointer path
        _run(a, w, out, mtiles, dataclasses.replace(gc, persistent=False), bwd, prec, plan, lo,
             ri, bias, seed, dropout)
        return
    M, kred = a.shape
    nout = out.shape[1]
    cfg = plan.cfg if plan is not None else KernelConfig()
    sarg, sptr = seed_args(seed)
    a_op = tma_desc(a, gc, bwd, True)
    full = all_tiles_full(plan, gc.bm, M, uniform) and nout % (gc.bn // gc.split) == 0
    o_op = _out_desc(out, gc) if full else a_op
    buckets = plan.buckets if plan is not None else 0
    meta = (plan.meta_i, plan.meta_f) if plan is not None else (mtiles, mtiles)
    n_mt = cdiv(M, gc.bm) if uniform else mtiles.shape[0]
    nsm = num_sms(a.device)
    ws = None if uniform or plan is None else tail_workspace(plan, gc, bwd, n_mt, nout, nsm,
                                                             a.device)
    launch(gemm_persist_kernel, _persist_grid(gc, n_mt, nout, nsm), _persist_name(gc, bwd),
           buckets, cfg, a_op, tma_desc(w, gc, bwd, False), out, o_op,
           out if lo is None else lo, out if ri is None else ri, out if bias is None else bias,
           mtiles, *meta, *(ws or (out, mtiles)), out, mtiles, out, out,
           M, nout, kred, out.stride(0), ri.stride(0) if ri is not None else 0, n_mt, sarg, 0, 0,
           start_stages=gc.fitted_stages(), num_warps=gc.warps,
           **_persist_constexprs(gc, bwd, prec, buckets, nsm, lora=plan is not None,
                                 has_bias=bias is not None, dropout=dropout, seed_ptr=sptr,
                                 uniform=uniform, full=full, tail=ws is not None))


def _persist_constexprs(gc: GemmConfig, bwd: bool, prec: str, buckets: int, nsm: int, *,
                        lora: bool, has_bias: bool, dropout: bool, seed_ptr: bool, uniform: bool,
                        full: bool, tail: bool) -> dict:
    """``gemm_persist_kernel``'s constexpr arguments for a launch of ``gc`` (``full``: every row
    tile full, so the TMA store; ``tail``: a tail workspace is passed, TAIL_SPLIT)."""
    return dict(BUCKETS=buckets, BM=gc.bm, BN=gc.bn, BK=gc.bk, GROUP_M=gc.group_m, NUM_SMS=nsm,
                BWD=bwd, LORA=lora, HAS_BIAS=has_bias, DROPOUT=dropout, SEED_PTR=seed_ptr,
                UNIFORM=uniform, TMA_STORE=full, SPLIT=gc.split, FLATTEN=gc.flatten,
                LORA_FIRST=gc.lora_first, WS=False, PREC=prec, TAIL_SPLIT=tail)


def _persist_grid(gc: GemmConfig, n_mt: int, nout: int, nsm: int) -> tuple:
    """One program per SM, or per tile where there are fewer tiles than SMs."""
    return (max(1, min(nsm, n_mt * cdiv(nout, gc.bn))),)


def _persist_name(gc: GemmConfig, bwd: bool) -> str:
    """The name ``launch`` remembers the stages of a persistent launch of ``gc`` under."""
    return f"gemmp_{'bwd' if bwd else 'fwd'}{dataclasses.astuple(gc)}"


def _out_desc(out: torch.Tensor, gc: GemmConfig) -> TensorDescriptor:
    """The TMA descriptor of the output for the persistent kernel's store: blocks of bm rows
    by one epilogue part (bn / split columns)."""
    return TensorDescriptor.from_tensor(out, [gc.bm, gc.bn // gc.split])


def tail_split_tiles(gc: GemmConfig, n_tiles: int, nsm: int) -> int:
    """Tiles of the last, partial round that ``gemm_persist_kernel`` reduces in two K halves
    (TAIL_SPLIT), or 0: only with ``gc.tail_split``, LoRA first and no flattening, at least one
    full round (``nsm`` programs, one per SM), and a last round of at most nsm / 2 tiles (two
    programs each then fit one round: half a tile's time instead of a whole one's)."""
    tail = n_tiles % nsm
    ok = gc.tail_split and gc.lora_first and not gc.flatten and n_tiles >= nsm
    return tail if ok and 0 < 2 * tail <= nsm else 0


def tail_workspace(plan, gc: GemmConfig, bwd: bool, n_mt: int, nout: int, nsm: int, device):
    """(fp32 workspace of tail x 2 x bm x bn: each half's sum, int32 counters of tail: zero,
    the kernel leaves them zero) for ``tail_split_tiles``'s tail tiles of this GEMM, cached on
    the plan; None when no tail is split."""
    tail = tail_split_tiles(gc, n_mt * cdiv(nout, gc.bn), nsm)
    if not tail:
        return None
    key = ("gemm_ws", bwd, tail, gc.bm, gc.bn, str(device))
    ws = plan.extra.get(key)
    if ws is None:
        ws = plan.extra[key] = (torch.zeros(2 * tail * gc.bm * gc.bn, dtype=torch.float32,
                                            device=device),
                                torch.zeros(tail, dtype=torch.int32, device=device))
    return ws


def gfin_first(gc: GemmConfig, n_tiles: int, nsm: int) -> "int | None":
    """The first of the persistent programs that have no tile in the last round (they are
    ``gf_first .. nsm - 1``), or None where every program has one (or there is a single round):
    with the tail split, programs from 2 x its tiles; else from n_tiles % nsm."""
    if n_tiles <= nsm:
        return None
    tail = tail_split_tiles(gc, n_tiles, nsm)
    busy = 2 * tail if tail else n_tiles % nsm
    return busy if 0 < busy < nsm else None


GF_BLOCK = 8192


def gfin_items(plan, device) -> "tuple[torch.Tensor, int]":
    """(int32 (n, 4) work items (g_off, d_off, n, is_b), n) of ``_gfin`` for ``plan``: the dA rows
    (sum_r x K, then the dB rows, sum_r x N, in the backward's workspace) of every adapter with
    several token chunks, in runs of at most ``GF_BLOCK`` elements (contiguous in the workspace
    and in the gradient); cached on the plan."""
    key = ("gfin_items", str(device))
    hit = plan.extra.get(key)
    if hit is None:
        K, N, out = plan.in_features, plan.out_features, []
        for i, r in enumerate(plan.ranks):
            if plan.nch[i] <= 1 or plan.seg_lens[i] == 0:
                continue
            ro = plan.roffs[i]
            for g0, d0, n, isb in ((ro * K, ro * K, r * K, 0),
                                   (plan.sum_r * K + ro * N, ro * N, r * N, 1)):
                out += [(g0 + c, d0 + c, min(GF_BLOCK, n - c), isb) for c in range(0, n, GF_BLOCK)]
        t = torch.tensor(out or [[0, 0, 0, 0]], dtype=torch.int32).reshape(-1, 4).to(device)
        hit = plan.extra[key] = (t, len(out))
    return hit


def all_tiles_full(plan, bm: int, M: int, uniform: bool) -> bool:
    """Whether every row tile has bm rows: M a multiple of bm (uniform tiles), else every
    segment of ``plan`` (``row_tiles`` clips tiles at segment ends; empty segments have none)."""
    if uniform or plan is None:
        return M % bm == 0
    return all(int(L) % bm == 0 for L in plan.seg_lens)


def tma_desc(t: torch.Tensor, gc: GemmConfig, bwd: bool, is_a: bool) -> TensorDescriptor:
    """The TMA descriptor of ``gemm_lora_kernel``'s operand ``t``: the activations (``is_a``,
    blocks bm x bk) or the weight (bk x bn blocks backward, bn x bk forward)."""
    if is_a:
        return TensorDescriptor.from_tensor(t, [gc.bm, gc.bk])
    return TensorDescriptor.from_tensor(t, [gc.bk, gc.bn] if bwd else [gc.bn, gc.bk])


def bound_gemm(plan, gc: GemmConfig, bwd: bool, prec: str, a: torch.Tensor, w: torch.Tensor,
               ri: torch.Tensor, has_bias: bool = False, dropout: bool = False,
               seed_is_tensor: bool = False, gacc: "torch.Tensor | None" = None):
    """(``BoundLaunch``, uses TMA) of ``gemm_lora_kernel`` with the LoRA term over ``plan``'s row
    tiles, for a (M, KRED) and w laid out as given (``_run``'s launch with everything but the
    step's operands bound). Dynamic arguments, in order: XIN, W (TMA descriptors when it uses
    TMA, else the tensors), OUT, LO (P or Q), RI (lora_B or lora_A), BIAS, seed. ``gacc`` (the
    backward's dA/dB workspace, when ``_gfin`` has work): a persistent backward may take that
    pass into its idle programs (``_bound_persist``)."""
    M, kred = a.shape
    nout = w.shape[1] if bwd else w.shape[0]
    cfg = plan.cfg
    mtiles = row_tiles(plan, gc.bm, a.device)
    if gc.persistent:
        return _bound_persist(plan, gc, bwd, prec, a, w, ri, mtiles, has_bias, dropout,
                              seed_is_tensor, gacc), False
    tma = cfg.gemm_tma and _tma_ok(a) and _tma_ok(w)
    static = dict(mtiles=mtiles, meta_i=plan.meta_i, meta_f=plan.meta_f, M=M, NOUT=nout,
                  KRED=kred, sxm=a.stride(0), sw=w.stride(0), som=nout, sri=ri.stride(0),
                  n_mt=mtiles.shape[0], BUCKETS=plan.buckets, BM=gc.bm, BN=gc.bn, BK=gc.bk,
                  GROUP_M=gc.group_m, BWD=bwd, LORA=True, HAS_BIAS=has_bias, DROPOUT=dropout,
                  SEED_PTR=seed_is_tensor, EVEN_K=kred % gc.bk == 0, EVEN_N=nout % gc.bn == 0,
                  USE_TMA=tma, PREC=prec)
    bl = BoundLaunch(gemm_lora_kernel, (mtiles.shape[0] * cdiv(nout, gc.bn),),
                     f"gemm_{'bwd' if bwd else 'fwd'}{dataclasses.astuple(gc)}", plan.buckets, cfg,
                     ("XIN", "W", "OUT", "LO", "RI", "BIAS", "seed"), static,
                     dict(num_warps=gc.warps), start_stages=gc.fitted_stages(),
                     checked=() if tma else (0, 1))
    return bl, tma


def _bound_persist(plan, gc: GemmConfig, bwd: bool, prec: str, a, w, ri, mtiles, has_bias: bool,
                   dropout: bool, seed_is_tensor: bool, gacc=None):
    """``bound_gemm``'s launch for a persistent ``gc``: a callable with the per-tile launch's
    dynamic arguments (XIN, W, OUT, LO, RI, BIAS, seed: tensors; then DA, DB, the gradients, when
    ``run.folds``) that builds the TMA descriptors (the weight's cached while it stays where it
    is) and launches through a ``BoundLaunch``; operands that cannot back a descriptor take
    ``_run_persist``'s generic path. It returns whether it did ``_gfin``'s pass (GFIN: ``gacc``
    given, programs without a tile in the last round, and at most ``cfg.gfin_fold_bytes`` of
    that pass per such program)."""
    M, kred = a.shape
    nout = w.shape[1] if bwd else w.shape[0]
    full = all_tiles_full(plan, gc.bm, M, False) and nout % (gc.bn // gc.split) == 0
    nsm = num_sms(a.device)
    n_mt = mtiles.shape[0]
    ws = tail_workspace(plan, gc, bwd, n_mt, nout, nsm, a.device)
    wsp, tcnt = ws or (plan.meta_f, plan.meta_i)   # unused without TAIL_SPLIT
    first = gfin_first(gc, n_mt * cdiv(nout, gc.bn), nsm) if gacc is not None else None
    items, n_items = gfin_items(plan, a.device) if first is not None else (plan.meta_i, 0)
    # bytes of the pass: per element an fp32 read, an fp32 zero and a 2-byte gradient write (10)
    elems = sum(r * (plan.in_features + plan.out_features)
                for r, c, L in zip(plan.ranks, plan.nch, plan.seg_lens) if c > 1 and L)
    folds = bool(n_items) and elems * 10 <= plan.cfg.gfin_fold_bytes * (nsm - first)
    static = dict(mtiles=mtiles, meta_i=plan.meta_i, meta_f=plan.meta_f, WSP=wsp, TCNT=tcnt,
                  G=gacc if folds else plan.meta_f, chunks=items if folds else plan.meta_i,
                  M=M, NOUT=nout, KRED=kred, som=nout, sri=ri.stride(0), n_mt=n_mt,
                  gf_items=n_items if folds else 0, gf_first=first if folds else 0,
                  GFIN=folds, GF_BLOCK=GF_BLOCK,
                  **_persist_constexprs(gc, bwd, prec, plan.buckets, nsm, lora=True,
                                        has_bias=has_bias, dropout=dropout,
                                        seed_ptr=seed_is_tensor, uniform=False, full=full,
                                        tail=ws is not None))
    bl = BoundLaunch(gemm_persist_kernel, _persist_grid(gc, n_mt, nout, nsm), _persist_name(gc, bwd),
                     plan.buckets, plan.cfg,
                     ("XIN", "W", "OUT", "ODESC", "LO", "RI", "BIAS", "seed", "DA", "DB"),
                     static, dict(num_warps=gc.warps), start_stages=gc.fitted_stages(),
                     checked=(8, 9) if folds else ())
    wd: list = [None, None]

    def run(x, w_, out, lo, ri_, bias, seed, da=None, db=None):
        if (not (_tma_ok(x) and _tma_ok(w_) and _tma_ok(out)) or x.shape[0] != M
                or (folds and da is None)):
            _run_persist(x, w_, out, mtiles, gc, bwd, prec, plan, lo, ri_,
                         bias if has_bias else None, seed, dropout)
            return False
        if wd[0] != w_.data_ptr():
            wd[0], wd[1] = w_.data_ptr(), tma_desc(w_, gc, bwd, False)
        xd = tma_desc(x, gc, bwd, True)
        bl(xd, wd[1], out, _out_desc(out, gc) if full else xd, lo, ri_, bias, seed,
           da if folds else out, db if folds else out)
        return folds
    run.folds = folds
    return run


def _tma_ok(t: torch.Tensor) -> bool:
    """Whether a 2-D tensor can back a TMA descriptor: unit inner stride, 16-byte aligned base
    and row stride (CUDA driver API, cuTensorMapEncodeTiled)."""
    es = t.element_size()
    return (t.dim() == 2 and t.stride(1) == 1 and t.data_ptr() % 16 == 0
            and (t.stride(0) * es) % 16 == 0)


def gemm_lora_forward(x, weight, psave, lora_B, bias, plan, gc: GemmConfig, out, prec: str) -> None:
    """out (M, N) = x (M, K) weight^T (+ bias) + s_i psave_i lora_B_i, for every token row of
    ``plan`` (psave: the compact P of ``_f1``, already / (1 - p_i)). Raises Triton's errors."""
    if plan.n_tokens:
        _run(x, weight, out, row_tiles(plan, gc.bm, x.device), gc, False, prec, plan=plan,
             lo=psave, ri=lora_B, bias=bias)


def gemm_lora_backward(dy, weight, q, lora_A, plan, gc: GemmConfig, seed, dropout: bool, out,
                       prec: str) -> None:
    """out (M, K) = dy (M, N) weight (N, K) + mask_i(q_i lora_A_i) / (1 - p_i) (q: the compact
    Q = s dY B^T of ``_b1``; mask and 1/(1-p) only with ``dropout``; ``seed`` the mixed int seed
    or the counter tensor of the graph path)."""
    if plan.n_tokens:
        _run(dy, weight, out, row_tiles(plan, gc.bm, dy.device), gc, True, prec, plan=plan,
             lo=q, ri=lora_A, seed=seed, dropout=dropout)


def base_gemm(a: torch.Tensor, w: torch.Tensor, gc: GemmConfig, bwd: bool,
              prec: str = "tf32") -> torch.Tensor:
    """This module's GEMM without the LoRA term (for the comparison with cuBLAS): a (M, KRED) @
    w^T (w: NOUT x KRED) when not ``bwd``, a @ w (w: KRED x NOUT) when ``bwd``; uniform row tiles."""
    M = a.shape[0]
    nout = w.shape[1] if bwd else w.shape[0]
    out = torch.empty(M, nout, dtype=a.dtype, device=a.device)
    key = (M, gc.bm, str(a.device))
    if key not in _BASE_TILES:  # built once, so that later calls can be graph-captured
        _BASE_TILES[key] = torch.tensor([(0, m0, min(m0 + gc.bm, M)) for m0 in range(0, M, gc.bm)],
                                        dtype=torch.int32, device=a.device)
    if gc.persistent:
        _run_persist(a, w, out, _BASE_TILES[key], gc, bwd, prec, uniform=True)
    else:
        _run(a, w, out, _BASE_TILES[key], gc, bwd, prec)
    return out
