"""Plain-torch references of the multi-LoRA layer: the dropout mask and a float64 forward/backward.

Used by the tests (CPU, ``TRITON_INTERPRET=1``) and by the benchmark's GPU correctness check.
Formulas: docs/kernel.md "Fused multi-LoRA kernel"; LoRA update of Hu et al. 2021, eq. 3.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .config import keep_threshold, mix_seed

__all__ = ["keep_mask", "reference_forward_backward"]


def keep_mask(M: int, K: int, seed: int, p: float, device="cpu") -> torch.Tensor:
    """(M, K) bool keep mask of the fused kernels, rebuilt in torch (int64 arithmetic mod 2**32).

    One 32-bit hash per pair of columns: h = lowbias32((m * ceil(K/2) + k // 2) xor
    mix_seed(seed)); element (m, k) is kept iff 16-bit half (k & 1) of h (low half for even k)
    is >= round(p * 2**16), as in ``lora_kernels.keep_tile``. P(kept) = 1 - p to within 2**-17."""
    m32 = 0xFFFFFFFF
    kh = (K + 1) // 2
    k = torch.arange(K, dtype=torch.int64, device=device)
    idx = (torch.arange(M, dtype=torch.int64, device=device)[:, None] * kh
           + (k >> 1)[None, :]) & m32
    h = idx ^ mix_seed(seed)
    h ^= h >> 16
    h = (h * 0x7FEB352D) & m32
    h ^= h >> 15
    h = (h * 0x846CA68B) & m32
    h ^= h >> 16
    half = (h >> (16 * (k & 1))[None, :]) & 0xFFFF
    return half >= keep_threshold(p)


def reference_forward_backward(x: torch.Tensor, weight: torch.Tensor, lora_A: torch.Tensor,
                               lora_B: torch.Tensor, seg_lens: Sequence[int],
                               ranks: Sequence[int], scales: Sequence[float], dy: torch.Tensor,
                               dropout: Sequence[float] | float = 0.0, seed: int = 0,
                               bias: Optional[torch.Tensor] = None,
                               dtype: torch.dtype = torch.float64):
    """Float64 (by default) forward and gradients of the multi-LoRA layer, by explicit formulas.

    Shapes as in ``multi_lora_linear``: x (M, K), weight (N, K), lora_A (sum r, K),
    lora_B (sum r, N), dy (M, N). Returns dict y (M, N), dx (M, K), dA (sum r, K) and
    dB (sum r, N), all in ``dtype``. Dropout masks come from ``keep_mask`` with ``seed``."""
    n = len(ranks)
    if isinstance(dropout, (int, float)):
        dropout = [float(dropout)] * n
    X, W, A, B, DY = (t.detach().to(dtype) for t in (x, weight, lora_A, lora_B, dy))
    M, K = X.shape
    y = X @ W.t()
    if bias is not None:
        y = y + bias.detach().to(dtype)
    dx = DY @ W
    dA = torch.zeros_like(A)
    dB = torch.zeros_like(B)
    s0 = ro = 0
    for L, r, s, p in zip(seg_lens, ranks, scales, dropout):
        if L:
            Xi = X[s0:s0 + L]
            if p > 0:
                keep = keep_mask(M, K, seed, p, device=X.device)[s0:s0 + L].to(dtype)
                f = keep / (1.0 - p)
            else:
                f = torch.ones_like(Xi)
            Ai = A[ro:ro + r].t()          # (K, r)
            Bi = B[ro:ro + r]              # (r, N)
            Xd = Xi * f
            P = Xd @ Ai                    # (L, r)
            y[s0:s0 + L] += s * (P @ Bi)
            Q = s * (DY[s0:s0 + L] @ Bi.t())   # (L, r)
            dx[s0:s0 + L] += (Q @ Ai.t()) * f
            dA[ro:ro + r] = (Xd.t() @ Q).t()   # (r, K)
            dB[ro:ro + r] = s * (P.t() @ DY[s0:s0 + L])
        s0 += L
        ro += r
    return {"y": y, "dx": dx, "dA": dA, "dB": dB}
