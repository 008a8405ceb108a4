"""The ``grouped`` plan (ALTO style): the LoRA path of many adapters as grouped GEMMs, one launch
per LoRA stage covering every adapter, next to one cuBLAS GEMM for the frozen base layer.

Per adapter i (rows [o_i, o_i + L_i) of x, rank r_i, scale s_i; Hu et al. 2021 eq. 3)::

    forward   S = drop(x) A^T           grouped over token segments  (M, R)
              Y = x W^T + (s S) B       grouped over token segments  (M, N)
    backward  dS' = dY B^T              grouped over token segments  (M, R)
              dB  = (s S)^T dY          grouped over the token dimension -> (G, R, N)
              dS  = s dS'
              dA  = dS^T drop(x)        grouped over the token dimension -> (G, R, K)
              dx  = dY W + drop'(dS A)  (the dropout's backward by autograd)

A grouped GEMM has one inner size per call, so every adapter is padded with zero rows to the
mix's largest rank rounded up to 8 (``R``; 16-byte strides for bf16). Zero rows of A and B get
zero gradients, so they stay zero under SGD/AdamW: the padded step computes the same function.

Backend: ``torch._grouped_mm`` (CUTLASS grouped GEMM on SM90 for bf16; a reference loop on the
CPU), used where ``grouped_mm_supported(device, dtype)`` finds it working; otherwise a labelled
per-adapter fallback (one ``torch.mm`` per adapter and stage), so a profile row never claims a
grouped GEMM that did not run. ``GroupedPlan.implementation()`` names the one used.

Layouts (converted once by ``grouped_layout``): A (G, R, K) and B (G, R, N), zero-padded copies
of the packed lora_A (sum r, K) / lora_B (sum r, N) of ``multi_lora_linear``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

__all__ = ["GroupedPlan", "grouped_layout", "grouped_multi_lora_linear", "packed_grads", "grouped_mm_supported"]

_SUPPORT: dict = {}


def grouped_mm_supported(device, dtype: torch.dtype) -> bool:
    """True if ``torch._grouped_mm`` exists and runs the three layouts used here on ``device``
    in ``dtype`` (probed once per pair on tiny shapes, compared with per-group torch.mm)."""
    key = (torch.device(device).type, dtype)
    if key in _SUPPORT:
        return _SUPPORT[key]
    ok = False
    if hasattr(torch, "_grouped_mm"):
        try:
            g = torch.Generator(device="cpu").manual_seed(0)
            x = torch.randn(40, 16, generator=g).to(device=device, dtype=dtype)
            b = torch.randn(2, 8, 16, generator=g).to(device=device, dtype=dtype)
            offs = torch.tensor([24, 40], dtype=torch.int32, device=device)
            s = torch._grouped_mm(x, b.transpose(1, 2), offs=offs)
            d = torch._grouped_mm(s.t(), x, offs=offs)
            ref = torch.cat([x[:24] @ b[0].t(), x[24:] @ b[1].t()])
            tol = 1e-2 * float(ref.abs().max())
            ok = bool((s - ref).abs().max() <= tol) and tuple(d.shape) == (2, 8, 16) and bool(
                (d[1] - s[24:].t() @ x[24:]).abs().max() <= 1e-2 * float(d.abs().max()) + 1e-3)
        except Exception:  # noqa: BLE001 (no kernel for this device/dtype)
            ok = False
    _SUPPORT[key] = ok
    return ok


class GroupedPlan:
    """Segment layout and constants of one mix, built once.

    Args: seg_lens (tokens per adapter, contiguous, in adapter order), ranks, scales s_i, dropout
    p (one value or per adapter), in_features K, out_features N, device, dtype; ``backend``
    'auto' (grouped GEMM if supported, else the per-adapter fallback), 'grouped_mm' or 'loop'.
    Raises ValueError on inconsistent lengths."""

    def __init__(self, seg_lens: Sequence[int], ranks: Sequence[int], scales: Sequence[float],
                 dropout: float | Sequence[float], in_features: int, out_features: int, device,
                 dtype: torch.dtype = torch.bfloat16, backend: str = "auto"):
        self.seg_lens = [int(v) for v in seg_lens]
        self.ranks = [int(r) for r in ranks]
        n = len(self.ranks)
        if n == 0 or len(self.seg_lens) != n or len(scales) != n or min(self.ranks) < 1:
            raise ValueError("one segment, rank >= 1 and scale per adapter")
        self.scales = [float(s) for s in scales]
        self.dropout = [float(dropout)] * n if isinstance(dropout, (int, float)) else [float(p) for p in dropout]
        self.K, self.N, self.device, self.dtype = int(in_features), int(out_features), torch.device(device), dtype
        self.R = -(-max(self.ranks) // 8) * 8
        self.M = sum(self.seg_lens)
        ends, o = [], 0
        for L in self.seg_lens:
            o += L
            ends.append(o)
        self.offs = torch.tensor(ends, dtype=torch.int32, device=self.device)
        self.starts = [e - L for e, L in zip(ends, self.seg_lens)]
        self.rowscale = torch.cat([torch.full((L, 1), s, dtype=dtype, device=self.device)
                                   for L, s in zip(self.seg_lens, self.scales)])
        if backend == "auto":
            backend = "grouped_mm" if grouped_mm_supported(self.device, dtype) else "loop"
        if backend not in ("grouped_mm", "loop"):
            raise ValueError(f"unknown grouped backend {backend!r}")
        self.backend = backend

    def implementation(self) -> str:
        """What runs: ``grouped[torch._grouped_mm,R=<padded rank>]`` or the labelled fallback."""
        if self.backend == "grouped_mm":
            return f"grouped[torch._grouped_mm,R={self.R}]"
        return f"grouped[per-adapter-fallback,R={self.R}]"

    # grouped products: over token segments (2-D x 3-D) and over the token dimension (2-D x 2-D)
    def seg_mm(self, a: torch.Tensor, b3: torch.Tensor) -> torch.Tensor:
        """(M, k) x (G, k, n) -> (M, n): rows of segment i times b3[i]."""
        if self.backend == "grouped_mm":
            return torch._grouped_mm(a, b3, offs=self.offs)
        out = a.new_empty(a.shape[0], b3.shape[2])
        for i, (o, L) in enumerate(zip(self.starts, self.seg_lens)):
            torch.mm(a[o:o + L], b3[i], out=out[o:o + L])
        return out

    def tok_mm(self, at: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """(k, M) x (M, n) -> (G, k, n): per segment i, at[:, seg] @ b[seg]."""
        if self.backend == "grouped_mm":
            return torch._grouped_mm(at, b, offs=self.offs)
        out = b.new_empty(len(self.seg_lens), at.shape[0], b.shape[1])
        for i, (o, L) in enumerate(zip(self.starts, self.seg_lens)):
            torch.mm(at[:, o:o + L], b[o:o + L], out=out[i])
        return out


class _GroupedLoRA(torch.autograd.Function):
    """The LoRA term s_i (xd_i A_i^T) B_i of every segment (no base GEMM, no dropout)."""

    @staticmethod
    def forward(ctx, xd, A3, B3, plan: GroupedPlan):
        S = plan.seg_mm(xd, A3.transpose(1, 2)) * plan.rowscale   # (M, R), scaled
        ctx.plan = plan
        ctx.save_for_backward(xd, A3, B3, S)
        return plan.seg_mm(S, B3)                                  # (M, N)

    @staticmethod
    def backward(ctx, dy):
        xd, A3, B3, S = ctx.saved_tensors
        plan = ctx.plan
        dy = dy.contiguous()
        dS = plan.seg_mm(dy, B3.transpose(1, 2)) * plan.rowscale  # (M, R)
        dB = plan.tok_mm(S.t(), dy) if ctx.needs_input_grad[2] else None
        dA = plan.tok_mm(dS.t(), xd) if ctx.needs_input_grad[1] else None
        dxd = plan.seg_mm(dS, A3) if ctx.needs_input_grad[0] else None
        return dxd, dA, dB, None


def grouped_multi_lora_linear(x: torch.Tensor, weight: torch.Tensor, A3: torch.Tensor, B3: torch.Tensor,
                              plan: GroupedPlan, bias: Optional[torch.Tensor] = None, training: bool = True,
                              keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Multi-LoRA linear with grouped GEMMs: (M, K) -> (M, N), differentiable in x, A3 and B3.

    y = x weight^T + bias + s_i (drop_i(x_i) A_i^T) B_i per segment (the ``multi_lora_linear``
    contract, Hu et al. 2021 eq. 3) with adapters in the grouped layout: A3 (G, R, K), B3 (G, R, N)
    (``grouped_layout`` converts the packed ones once). Dropout (``training``): torch's dropout
    with the plan's p, or the explicit bool ``keep`` mask (M, K) scaled by 1 / (1 - p_i).
    Raises ValueError on shape mismatch."""
    G = len(plan.ranks)
    if x.dim() != 2 or tuple(x.shape) != (plan.M, plan.K) or tuple(weight.shape) != (plan.N, plan.K):
        raise ValueError(f"x must be ({plan.M}, {plan.K}) and weight ({plan.N}, {plan.K})")
    if tuple(A3.shape) != (G, plan.R, plan.K) or tuple(B3.shape) != (G, plan.R, plan.N):
        raise ValueError(f"A3 must be ({G}, {plan.R}, {plan.K}) and B3 ({G}, {plan.R}, {plan.N})")
    y = F.linear(x, weight, bias)
    ps = set(plan.dropout)
    if not training or ps == {0.0}:
        xd = x
    elif keep is not None:
        f = torch.cat([torch.full((L, 1), 1.0 / (1.0 - p), dtype=x.dtype, device=x.device)
                       for L, p in zip(plan.seg_lens, plan.dropout)])
        xd = x * keep.to(x.dtype) * f
    elif len(ps) == 1:
        xd = F.dropout(x, plan.dropout[0], training=True)
    else:
        xd = torch.cat([F.dropout(xi, p, training=True) for xi, p in zip(x.split(plan.seg_lens), plan.dropout)])
    return y + _GroupedLoRA.apply(xd, A3, B3, plan)


def grouped_layout(lora_A: torch.Tensor, lora_B: torch.Tensor, ranks: Sequence[int], R: int):
    """Packed lora_A (sum r, K), lora_B (sum r, N) -> zero-padded (G, R, K), (G, R, N) copies."""
    G = len(ranks)
    A3 = lora_A.new_zeros(G, R, lora_A.shape[1])
    B3 = lora_B.new_zeros(G, R, lora_B.shape[1])
    o = 0
    with torch.no_grad():
        for i, r in enumerate(ranks):
            A3[i, :r] = lora_A[o:o + r]
            B3[i, :r] = lora_B[o:o + r]
            o += r
    return A3, B3


def packed_grads(dA3: torch.Tensor, dB3: torch.Tensor, ranks: Sequence[int]):
    """Gradients in the grouped layout -> packed (sum r, K), (sum r, N) (padding rows dropped)."""
    return (torch.cat([dA3[i, :r] for i, r in enumerate(ranks)]),
            torch.cat([dB3[i, :r] for i, r in enumerate(ranks)]))
