"""Launch plan of one multi-LoRA configuration (segments, ranks, layer): token tiles, token
chunks, the reduction splits and the per-adapter metadata, built once and uploaded to the device
(docs/kernel.md, "Fused multi-LoRA kernel")."""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import torch

from . import lora_kernels as K_
from .config import MAX_RANK, KernelConfig, bucket_of, cdiv, keep_threshold

@dataclasses.dataclass
class LoRAPlan:
    """Launch plan of one (segments, ranks, layer) configuration, built once and reused.

    Host fields are plain Python; ``meta_i`` (per adapter: start, len, rank, rank offset, P offset,
    bucket, keep threshold, token chunks), ``meta_f`` (scale, 1/(1-p)), ``tiles`` and ``chunks``
    ((adapter, m0, m1) rows) live on the device
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
    extra: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    """Derived launch data cached per plan (row tiles and GEMM choices of ``lora_gemm``)."""
    nch: tuple = ()
    """Token chunks of each adapter (as meta_i's last column): dA/dB of adapters with more than
    one go through the backward's fp32 workspace and ``_gfin``."""

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
    buckets = [bucket_of(r) for r in ranks]
    # P and Q: (len_i, R_i) per adapter, rows padded to the rank bucket, so every offset is a
    # multiple of 16 elements (the kernels' 16-byte accesses to them rely on it)
    starts, roffs, poffs = [], [], []
    s = ro = po = 0
    for L, r, b in zip(seg_lens, ranks, buckets):
        starts.append(s); roffs.append(ro); poffs.append(po)
        s += L; ro += r; po += L * K_.BUCKET_R[b]
    mask = 0
    tiles, chunks = [], []
    M = s
    nkb, nnb = cdiv(Kf, cfg.bk), cdiv(Nf, cfg.bn)
    # token chunks for the reductions over tokens (dA, dB): ~target programs over min(nkb, nnb)
    n_chunk_target = max(1, cdiv(target, min(nkb, nnb)))
    gran = max(max(cfg.bms), int(cfg.chunk_gran))
    chunk_rows = max(gran, cdiv(cdiv(max(M, 1), n_chunk_target), gran) * gran)
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
    # programs per row tile: rounded down to whole waves when every tile is of rank >= 33 (one
    # program per SM at the default tiles), else up (profiler/KERNELS.md, session 13)
    floor = cfg.split_floor and not mask & 0b11
    per_tile = (lambda a, b: a // b) if floor else cdiv
    ksplit = max(1, min(cfg.max_split, nkb, per_tile(target, max(n_tiles, 1))))
    kb_per = cdiv(nkb, ksplit)
    ksplit = cdiv(nkb, kb_per)
    # Q = dY B^T needs no N split (and no atomics) when the dB programs of the same launch
    # already fill the GPU
    short = target - n_chunks * nnb
    nsplit = 1 if short <= 0 else max(1, min(cfg.max_split, nnb, cdiv(short, max(n_tiles, 1))))
    nb_per = cdiv(nnb, nsplit)
    nsplit = cdiv(nnb, nb_per)
    ngroups = max(1, min(nnb, per_tile(target, max(n_tiles, 1))))
    ng_per = cdiv(nnb, ngroups)
    ngroups = cdiv(nnb, ng_per)
    nch = [0] * n   # token chunks per adapter (> 1: dA/dB through the workspace and _gfin)
    for c in chunks:
        nch[c[1]] += 1
    meta_i = torch.tensor([[starts[i], seg_lens[i], ranks[i], roffs[i], poffs[i], buckets[i],
                            keep_threshold(dropout[i]), nch[i]] for i in range(n)],
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
                    meta_f_nodrop.to(device), nch=tuple(nch))

