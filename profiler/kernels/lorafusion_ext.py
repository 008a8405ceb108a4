"""Adapter for LoRAFusion's own multi-LoRA Triton kernels (github.com/CentML/lorafusion), the
``lorafusion`` plan of the profiler and of ``bench/kernels.py``.

Their code is never part of this repository: ``profiler/fetch_lorafusion.sh`` copies it from a git
mirror into ``.ext/lorafusion`` (or the directory named by env ``TLORA_LORAFUSION``), which goes on
``sys.path`` here. What is used of it (``lorafusion/ops/triton_ops``):

* ``seeded_dropout`` / ``blocked_seeded_dropout``: dropout of the adapter input, storing the mask;
* ``fused_multi_lora_xw_sb``: y = x W^T + alpha_i S_i B_i^T + bias in one GEMM kernel (the LoRA
  term is the accumulator's initial value), one 128-token block per program row, a per-block
  lookup table (rank, valid rows, first block of the adapter) and per-block S/B pointer lists;
* ``fused_multi_lora_dys_dyb``: dB_i = alpha_i dY_i^T S_i and dS_i = alpha_i dY_i B_i (split-k,
  fp32 atomics), one kernel for all adapters;
* ``fused_multi_lora_dyw_dsa``: dX = dY W + mask (dS_i A_i) / (1 - p_i), one kernel;
* dA_i = dS_i^T drop(x_i) by one torch GEMM per adapter, as their ``multi_lora.py`` does.

Their Python wrapper (``lorafusion/ops/multi_lora.py``: ``FusedLinearMultiLoRA``) imports Megatron
and takes at most 4 adapters, so the orchestration above is re-done here with the same kernel
calls and the same per-step work. One deliberate difference: their multi-adapter forward feeds the
*dropped* x to the base GEMM and the undropped x to S (a swap; their single-adapter ``lora_v1.py``
does it the standard way); here S = drop(x) A^T and the base GEMM sees x, as standard LoRA and
``reference.py`` do. The kernel work is identical either way.

Their constraints, found in the source, and how they are handled:

* Tile shapes are sized for the largest rank of the mix: ``MAX_R = max(ranks)`` is a ``tl.arange``
  length and a ``tl.dot`` dimension, so it must be a power of two and at least 16 (``tl.dot``'s
  minimum). A mix whose largest rank is below 16 or not a power of two raises
  ``LoRAFusionUnsupported`` (a ``NotImplementedError``), which the profiler records as a "not
  runnable" row.
* Their shipped H100 config (``config.py``: xw_sb and dyw_dsa BLOCK 128x256x64, 4 stages, 8 warps;
  dys_dyb 128 x (K 128), 5 stages) overflows the H100's 232,448 B of shared memory at large
  ranks: the estimate 2 B x (stages x (BM BK + BK BN) + BM R + R BN) is 245,760 B at R = 64
  with 4 stages. ``stage_count`` picks the largest stage count <= theirs whose estimate fits
  (R <= 32: 4, R = 64: 3, R = 128: 2); should Triton still report OutOfResources, the launch is
  retried with one stage fewer (down to 1), and the config used is kept on the plan.
  Where no stage count fits (R = 256), ``LoRAFusionUnsupported`` is raised.
* Their per-GPU config table knows ``h100-80gb-hbm3`` and A100/3090 names only; other GPUs (H200:
  the same SM90 shared memory) and the CPU interpreter use the H100 config.
* Token segments are padded to multiples of 128 (their data loader pads each adapter's tokens);
  where a segment is not a multiple, x is copied into a padded buffer each call (labelled
  ``+pad`` in ``implementation``). The per-block pointer buffers hold 192 blocks (24,576 tokens);
  the capacity is raised to the mix's block count (module constant, read at call time).
* Their modules import ``loguru`` (and ``dropout.py`` two test helpers that need tabulate/tqdm);
  where these are absent, minimal stand-ins are registered in ``sys.modules`` (logging only).

Layouts (converted once, at construction, by ``lorafusion_b_layout``): lora_A packed (sum r, K)
as ours (their A_i (r_i, K) are its row slices); B per adapter (N, r_i) contiguous (PEFT's
``lora_B.weight``), as their kernels index it with stride r_i.
"""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import List, Optional, Sequence

import torch

__all__ = ["LoRAFusionUnsupported", "LoRAFusionPlan", "lorafusion_available", "lorafusion_multi_lora_linear",
           "lorafusion_b_layout", "packed_b_grad", "lorafusion_keep_mask", "source_dir", "source_sha",
           "stage_count", "SMEM_BYTES"]

ENV = "TLORA_LORAFUSION"
SMEM_BYTES = 232_448  # H100 / H200: the most shared memory one block may use (bytes)
_ROOT = Path(__file__).resolve().parents[2]
_MODS: dict = {}


class LoRAFusionUnsupported(NotImplementedError):
    """A mix (or device) LoRAFusion's kernels cannot run; the profiler counts it as not runnable."""


def source_dir() -> Path:
    """Where LoRAFusion's source lies: env ``TLORA_LORAFUSION``, else ``<repo>/.ext/lorafusion``."""
    return Path(os.environ.get(ENV) or (_ROOT / ".ext" / "lorafusion")).resolve()


def source_sha() -> str:
    """The commit of the copied source (``SOURCE_SHA`` written by fetch_lorafusion.sh), or 'unknown'."""
    try:
        return (source_dir() / "SOURCE_SHA").read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def _stub_missing() -> None:
    try:
        import loguru  # noqa: F401
    except ImportError:
        import logging

        m = types.ModuleType("loguru")
        m.logger = logging.getLogger("lorafusion")
        sys.modules["loguru"] = m
    for name, attrs in (("lorafusion.utils.benchmark", ("benchmark", "set_warmup_and_number")),
                        ("lorafusion.utils.testing", ("assert_verbose_allclose_two_rounds",))):
        if name not in sys.modules and not (source_dir() / (name.replace(".", "/") + ".py")).exists():
            m = types.ModuleType(name)
            for a in attrs:
                setattr(m, a, lambda *a_, **k_: (_ for _ in ()).throw(NotImplementedError("stub")))
            sys.modules[name] = m


def load_lorafusion() -> dict:
    """Import LoRAFusion's kernel modules once: {"config", "dropout", "blocked_dropout",
    "fused_multi_lora_xw_sb", ...: module} (``lorafusion.ops.triton_ops.<name>``). Raises
    ImportError/OSError where their source is absent (``source_dir``)."""
    if _MODS:
        return _MODS
    d = source_dir()
    if not (d / "lorafusion" / "ops" / "triton_ops" / "fused_multi_lora_xw_sb.py").exists():
        raise ImportError(f"LoRAFusion source not found under {d} (run profiler/fetch_lorafusion.sh)")
    if str(d) not in sys.path:
        sys.path.insert(0, str(d))
    _stub_missing()
    import importlib

    base = "lorafusion.ops.triton_ops."
    mods = {k: importlib.import_module(base + k) for k in
            ("config", "dropout", "blocked_dropout", "fused_multi_lora_xw_sb", "fused_multi_lora_dys_dyb",
             "fused_multi_lora_dyw_dsa")}
    _MODS.update(mods)
    return _MODS


def lorafusion_available() -> bool:
    """True if LoRAFusion's source is present and its kernel modules import here."""
    try:
        load_lorafusion()
        return True
    except Exception:  # noqa: BLE001
        return False


def smem_estimate(cfg, max_r: int, stages: int, elem: int = 2) -> int:
    """Shared memory (bytes) of the xw_sb / dyw_dsa kernels: ``stages`` buffers of the x and W
    tiles (BM x BK, BK x BN) plus the S and B tiles (BM x R, R x BN), loaded once."""
    bm, bn, bk = cfg.block_size_m, cfg.block_size_n, cfg.block_size_k
    return elem * (stages * (bm * bk + bk * bn) + bm * max_r + max_r * bn)


def stage_count(cfg, max_r: int, limit: int = SMEM_BYTES) -> int:
    """The largest stage count <= ``cfg.num_stages`` whose ``smem_estimate`` fits ``limit``.
    Raises LoRAFusionUnsupported if even one stage does not fit."""
    for s in range(cfg.num_stages, 0, -1):
        if smem_estimate(cfg, max_r, s) <= limit:
            return s
    raise LoRAFusionUnsupported(f"LoRAFusion's {cfg.block_size_m}x{cfg.block_size_n}x{cfg.block_size_k} tiles "
                                f"need more than {limit} B of shared memory at max rank {max_r}")


class LoRAFusionPlan:
    """Everything LoRAFusion's kernels need for one segment layout, built once (their
    ``prepare_multi_lora_batch_info``): per-128-token-block lookup table (rank, valid rows, first
    block of the adapter), per-block dropout p and alpha (= our scale s_i), the kernel configs.

    Args: seg_lens (tokens per adapter, contiguous, in adapter order), ranks, scales s_i (the
    LoRA-path multiplier alpha_i / r_i), dropout p (one or per adapter), in_features K,
    out_features N, device, dtype of x / weights. Raises LoRAFusionUnsupported (a
    NotImplementedError) for mixes their kernels cannot run (largest rank below 16, not a power
    of two, or too large for shared memory), ImportError if the source is absent."""

    def __init__(self, seg_lens: Sequence[int], ranks: Sequence[int], scales: Sequence[float],
                 dropout: float | Sequence[float], in_features: int, out_features: int, device,
                 dtype: torch.dtype = torch.bfloat16):
        self.seg_lens = [int(v) for v in seg_lens]
        self.ranks = [int(r) for r in ranks]
        n = len(self.ranks)
        if n == 0 or len(self.seg_lens) != n or len(scales) != n or min(self.ranks) < 1:
            raise ValueError("one segment, rank >= 1 and scale per adapter")
        self.max_r = max(self.ranks)
        if self.max_r < 16 or self.max_r & (self.max_r - 1):
            raise LoRAFusionUnsupported(f"LoRAFusion sizes its tiles for the largest rank (MAX_R = {self.max_r}), "
                                        "which must be a power of two >= 16")
        self.scales = [float(s) for s in scales]
        self.dropout = [float(dropout)] * n if isinstance(dropout, (int, float)) else [float(p) for p in dropout]
        self.K, self.N, self.device, self.dtype = int(in_features), int(out_features), torch.device(device), dtype
        m = load_lorafusion()
        cfgmod = m["config"]
        hw = cfgmod.H100_CONFIG
        if self.device.type == "cuda":
            from lorafusion.utils.common import get_device_short_name  # their table key

            hw = cfgmod.HARDWARE_CONFIGS.get(get_device_short_name(), hw)
        self.bm = int(hw.fused_multi_lora_block_size_m)
        rep = __import__("dataclasses").replace
        self.cfg = {"xw_sb": rep(hw.fused_multi_lora_xw_sb,
                                 num_stages=stage_count(hw.fused_multi_lora_xw_sb, self.max_r)),
                    "dyw_dsa": rep(hw.fused_multi_lora_dyw_dsa,
                                   num_stages=stage_count(hw.fused_multi_lora_dyw_dsa, self.max_r)),
                    "dys_dyb": hw.fused_multi_lora_dys_dyb}
        self.padded = [-(-L // self.bm) * self.bm for L in self.seg_lens]
        self.n_blocks = sum(self.padded) // self.bm
        self.M, self.M_pad = sum(self.seg_lens), sum(self.padded)
        lut, dp, al = [], [], []
        blk = 0
        for L, P, r, p, s in zip(self.seg_lens, self.padded, self.ranks, self.dropout, self.scales):
            start = blk
            for i in range(P // self.bm):
                lut.append((r, min(self.bm, L - i * self.bm), start))
                dp.append(p)
                al.append(s)
                blk += 1
        self.lookup = torch.tensor(lut, dtype=torch.int32, device=self.device).reshape(-1, 3)
        self.block_p = torch.tensor(dp, dtype=dtype, device=self.device)
        self.block_alpha = torch.tensor(al, dtype=dtype, device=self.device)
        self.enable_dropout = any(p > 0 for p in self.dropout)
        self.same_p = self.dropout[0] if len(set(self.dropout)) == 1 else None
        self.r_offs = [sum(self.ranks[:i]) for i in range(n)]
        self.m_offs = [sum(self.padded[:i]) for i in range(n)]
        self.needs_pad = self.M_pad != self.M
        self.rows = None
        if self.needs_pad:  # row of each token in the padded layout
            self.rows = torch.cat([torch.arange(o, o + L, device=self.device)
                                   for o, L in zip(self.m_offs, self.seg_lens)])
        self._capacity(m)

    def _capacity(self, m) -> None:
        """Their per-block pointer buffers hold MAX_NUM_BLOCK_M_SIZE (192) blocks; raise it to
        this plan's block count and (re)allocate the cached global buffers on this device."""
        for k in ("fused_multi_lora_xw_sb", "fused_multi_lora_dys_dyb", "fused_multi_lora_dyw_dsa"):
            mod = m[k]
            mod.MAX_NUM_BLOCK_M_SIZE = max(mod.MAX_NUM_BLOCK_M_SIZE, self.n_blocks)
            if k == "fused_multi_lora_xw_sb":  # allocates its lists per call (no cached globals)
                continue
            for g in ("GLOBAL_S_PTR_LIST", "GLOBAL_B_PTR_LIST", "GLOBAL_DS_PTR_LIST", "GLOBAL_A_PTR_LIST"):
                t = getattr(mod, g, None)
                if hasattr(mod, g) and (t is None or t.device != self.device or t.numel() < mod.MAX_NUM_BLOCK_M_SIZE):
                    setattr(mod, g, torch.zeros(mod.MAX_NUM_BLOCK_M_SIZE, device=self.device, dtype=torch.int64))

    def implementation(self) -> str:
        """``lorafusion@<sha12>`` (+ ``+pad`` where tokens are re-padded each call, + stages used)."""
        st = f"stages{self.cfg['xw_sb'].num_stages}/{self.cfg['dyw_dsa'].num_stages}"
        return f"lorafusion@{source_sha()[:12]}[{st}{'+pad' if self.needs_pad else ''}]"

    # -- launches with a stage fallback
    def launch(self, name: str, fn, **kw):
        """Call their wrapper ``fn`` with this plan's config ``name``; on Triton OutOfResources
        retry with one pipeline stage fewer (kept for later calls)."""
        from triton.runtime.errors import OutOfResources

        while True:
            try:
                return fn(config=self.cfg[name], **kw)
            except OutOfResources:
                c = self.cfg[name]
                if c.num_stages <= 1:
                    raise LoRAFusionUnsupported(f"{name}: out of shared memory at max rank {self.max_r}") from None
                self.cfg[name] = __import__("dataclasses").replace(c, num_stages=c.num_stages - 1)

    def ptr_lists(self, s_list, b_list):
        """Per-block S and B pointer lists (their ``construct_s_and_b_ptrs_list`` on CUDA)."""
        if self.device.type == "cuda":
            s, b, _, _ = _MODS["fused_multi_lora_xw_sb"].construct_s_and_b_ptrs_list(s_list, b_list, self.bm)
            return s, b
        sp = [t.data_ptr() for t, P in zip(s_list, self.padded) for _ in range(P // self.bm)]
        bp = [t.data_ptr() for t, P in zip(b_list, self.padded) for _ in range(P // self.bm)]
        return (torch.tensor(sp, dtype=torch.int64, device=self.device),
                torch.tensor(bp, dtype=torch.int64, device=self.device))

    def dropout_x(self, xp: torch.Tensor, seed: int):
        """(dropped and rescaled x, keep mask) by their dropout kernels (mask None without dropout)."""
        if not self.enable_dropout:
            return xp, None
        if self.same_p is not None:
            return _MODS["dropout"].seeded_dropout(xp, p=self.same_p, seed=seed, store_mask=True)
        return _MODS["blocked_dropout"].blocked_seeded_dropout(xp, block_to_dropout_p=self.block_p,
                                                                block_size_m=self.bm, seed=seed, store_mask=True)


class _LoRAFusionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, lora_A, plan: LoRAFusionPlan, seed: int, *lora_B):
        m = _MODS
        xp = x
        if plan.needs_pad:
            xp = x.new_zeros(plan.M_pad, x.shape[1])
            xp[plan.rows] = x
        xd, mask = plan.dropout_x(xp, seed)
        full_s = xd @ lora_A.t()                              # (M_pad, sum r), one GEMM as theirs
        s_list = [full_s[o:o + P, ro:ro + r] for o, P, ro, r in zip(plan.m_offs, plan.padded, plan.r_offs, plan.ranks)]
        sp, bp = plan.ptr_lists(s_list, list(lora_B))
        y = plan.launch("xw_sb", m["fused_multi_lora_xw_sb"].fused_multi_lora_xw_sb, x=xp, w=weight,
                        block_to_lookup_table=plan.lookup, block_to_alpha=plan.block_alpha, max_r=plan.max_r,
                        total_r=full_s.shape[1], s_ptrs_list=sp, b_ptrs_list=bp, bias=bias)
        ctx.plan = plan
        ctx.s_list = s_list
        ctx.save_for_backward(xd, weight, lora_A, mask if mask is not None else x.new_empty(0), full_s, sp, bp,
                              *lora_B)
        return y[plan.rows] if plan.needs_pad else y

    @staticmethod
    def backward(ctx, dy):
        plan = ctx.plan
        m = _MODS
        xd, weight, lora_A, mask, full_s, sp, bp, *lora_B = ctx.saved_tensors
        dy = dy.contiguous()
        if plan.needs_pad:
            dyp = dy.new_zeros(plan.M_pad, dy.shape[1])
            dyp[plan.rows] = dy
            dy = dyp
        db_list, ds_list = plan.launch(
            "dys_dyb", m["fused_multi_lora_dys_dyb"].fused_multi_lora_dys_dyb, dy=dy, s_ptrs_list=sp, b_ptrs_list=bp,
            raw_s_list=ctx.s_list, raw_b_list=list(lora_B), block_to_lookup_table=plan.lookup,
            block_to_alpha=plan.block_alpha, max_r=plan.max_r, total_r=full_s.shape[1], block_size_m=plan.bm)
        dA = None
        if ctx.needs_input_grad[3]:
            dA = torch.empty_like(lora_A)
            for o, P, ro, r, ds in zip(plan.m_offs, plan.padded, plan.r_offs, plan.ranks, ds_list):
                torch.mm(ds.t(), xd[o:o + P], out=dA[ro:ro + r])
        dx = None
        if ctx.needs_input_grad[0]:
            a_list = [lora_A[ro:ro + r] for ro, r in zip(plan.r_offs, plan.ranks)]
            dx = plan.launch("dyw_dsa", m["fused_multi_lora_dyw_dsa"].fused_multi_lora_dyw_dsa, dy=dy, w=weight,
                             raw_ds_list=ds_list, raw_a_list=a_list, block_to_dropout_p=plan.block_p,
                             block_to_lookup_table=plan.lookup, max_r=plan.max_r,
                             enable_dropout=plan.enable_dropout,
                             dropout_mask=mask if plan.enable_dropout else None)
            if plan.needs_pad:
                dx = dx[plan.rows]
        return (dx, None, None, dA, None, None, *db_list)


def lorafusion_multi_lora_linear(x: torch.Tensor, weight: torch.Tensor, lora_A: torch.Tensor,
                                 lora_B: Sequence[torch.Tensor], plan: LoRAFusionPlan, seed: int = 0,
                                 bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Multi-LoRA linear by LoRAFusion's kernels: (M, K) -> (M, N), differentiable in x, lora_A
    and every lora_B[i] (not in weight/bias: the base is frozen).

    Per adapter i (rows of segment i): y = x weight^T + bias + s_i (drop_i(x_i) A_i^T) B_i^T,
    the contract of ``multi_lora_linear`` (Hu et al. 2021 eq. 3), with lora_A packed (sum r, K)
    as there and lora_B in LoRAFusion's layout: a list of (N, r_i) tensors
    (``lorafusion_b_layout(packed)`` converts once; ``packed_b_grad`` maps gradients back).
    ``seed`` picks their dropout mask (``lorafusion_keep_mask`` rebuilds it).
    Raises ValueError on shape/dtype mismatch; LoRAFusionUnsupported from the plan."""
    if x.dim() != 2 or x.shape[0] != plan.M or x.shape[1] != plan.K or tuple(weight.shape) != (plan.N, plan.K):
        raise ValueError(f"x must be ({plan.M}, {plan.K}) and weight ({plan.N}, {plan.K}); got "
                         f"{tuple(x.shape)}, {tuple(weight.shape)}")
    if tuple(lora_A.shape) != (sum(plan.ranks), plan.K) or len(lora_B) != len(plan.ranks) or any(
            tuple(b.shape) != (plan.N, r) for b, r in zip(lora_B, plan.ranks)):
        raise ValueError("lora_A must be (sum r, K) and lora_B one (N, r_i) tensor per adapter")
    if any(t.dtype != x.dtype for t in (weight, lora_A, *lora_B)):
        raise ValueError("LoRAFusion's kernels need x, weight and adapters in one dtype")
    x = x.contiguous()
    lora_B = [b if b.is_contiguous() else b.contiguous() for b in lora_B]
    return _LoRAFusionFunction.apply(x, weight, bias, lora_A, plan, int(seed), *lora_B)


def lorafusion_b_layout(lora_B: torch.Tensor, ranks: Sequence[int]) -> List[torch.Tensor]:
    """Packed lora_B (sum r, N) -> per-adapter (N, r_i) contiguous copies (leaf tensors)."""
    out, o = [], 0
    for r in ranks:
        out.append(lora_B[o:o + r].detach().t().contiguous())
        o += r
    return out


def packed_b_grad(db_list: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-adapter (N, r_i) gradients -> packed (sum r, N), to compare with ``multi_lora_linear``."""
    return torch.cat([g.t() for g in db_list])


def lorafusion_keep_mask(plan: LoRAFusionPlan, seed: int) -> torch.Tensor:
    """(M, K) bool keep mask their dropout kernels draw for ``seed`` (all True without dropout)."""
    ones = torch.ones(plan.M_pad, plan.K, device=plan.device, dtype=plan.dtype)
    _, mask = plan.dropout_x(ones, seed)
    if mask is None:
        return torch.ones(plan.M, plan.K, dtype=torch.bool, device=plan.device)
    return mask[plan.rows] if plan.needs_pad else mask
