"""One decoder layer of a real model shape, trained with many LoRA adapters at once, and a timer.

The layer is a Llama/Qwen decoder block as Hugging Face runs it in eager mode: RMSNorm (fp32
inside), q/k/v projections, rotary embeddings, causal attention through PyTorch SDPA (grouped-query,
one call per distinct sequence length in the mix), o projection, residual, RMSNorm, SwiGLU MLP
(gate, up, down), residual. Every one of the seven linear layers carries LoRA adapters; the frozen
base weights are shared by all adapters. Adapters own contiguous token segments of the layer
input (one segment per member of the mix, members ordered by sequence length).

LoRA implementations (``impl``):

* ``none``   no adapters (the frozen base layer; forward + dX).
* ``loop``   mLoRA style: one base GEMM over all tokens, then a per-adapter torch loop
             (``dropout -> A -> B -> scale``), concatenated and added. With one adapter this is
             exactly a job alone as PEFT runs it (plan ``alone``).
* ``fused``  this project's fused multi-LoRA Triton kernels (``tlora_sim.profiler.kernels.multi_lora_linear``).
* ``padded`` every adapter padded to the largest rank, two ``bmm`` per linear (a torch fallback,
             used and labelled as such only when the fused kernel does not run).
* ``lorafusion`` LoRAFusion's own Triton kernels (``profiler/kernels/lorafusion_ext.py``; their
             source from ``.ext/lorafusion`` or env ``TLORA_LORAFUSION``): lora_A packed, lora_B per
             adapter in their (out, r) layout. Mixes their kernels cannot run raise
             ``LoRAFusionUnsupported`` (a NotImplementedError) at construction.
* ``grouped`` ALTO style: the LoRA path as grouped GEMMs over the adapters
             (``profiler/kernels/grouped.py``; ``torch._grouped_mm``, or its labelled per-adapter
             fallback), adapters zero-padded to the largest rank (rounded up to 8).

``LoRASet.implementation`` names what ran (recorded in every profile row).

``attn`` selects the attention block: ``sdpa`` (real), ``skip`` (the attention block replaced by
its query input: the layer minus attention, for the cost model's base curve).

Adapter parameters are bf16 (the dtype the kernels compute in); dropout p = 0.1 on the adapter
input only (standard LoRA); scale alpha/r with alpha = 2r.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

LINEARS = ("q", "k", "v", "o", "gate", "up", "down")
DROPOUT = 0.1
ALPHA_OVER_R = 2.0


@dataclass(frozen=True)
class Shape:
    """The shape fields of ``tlora_sim.sim.costmodel.models.ModelSpec`` that a layer needs (elements)."""

    name: str
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layers: int = 1

    def linear_shapes(self):
        d, q, kv, f = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.ffn
        return (("q", d, q), ("k", d, kv), ("v", d, kv), ("o", q, d), ("gate", d, f), ("up", d, f), ("down", f, d))


def shape_of(spec) -> Shape:
    """A ``Shape`` from a ``tlora_sim.sim.costmodel.models.ModelSpec`` (or anything with the same fields)."""
    return Shape(spec.name, spec.hidden, spec.ffn, spec.heads, spec.kv_heads, spec.head_dim, spec.vocab,
                 getattr(spec, "layers", 1))


TINY = Shape("tiny", hidden=64, ffn=128, heads=4, kv_heads=2, head_dim=16, vocab=256, layers=2)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Hugging Face LlamaRMSNorm: normalise in fp32, cast back, scale."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


_GQA_OK: dict = {}


def choose_gqa(device) -> str:
    """On a GPU, use SDPA's ``enable_gqa`` only if a fused backend (flash / memory-efficient)
    takes it, else expand k/v first (``repeat_kv``, as older Hugging Face code does) so that
    attention never silently falls to the math backend. Returns the choice."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return "enable_gqa"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 8, 256, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 2, 256, 128, device=dev, dtype=torch.bfloat16)
    try:
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
        _GQA_OK[dev.type] = True
        return "enable_gqa (flash/efficient)"
    except Exception:  # noqa: BLE001
        _GQA_OK[dev.type] = False
        return "repeat_kv"


def _sdpa(q, k, v):
    """Causal SDPA with grouped-query attention (``enable_gqa`` where supported, else repeat_kv)."""
    key = q.device.type
    if _GQA_OK.get(key, True):
        try:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        except (TypeError, RuntimeError):
            _GQA_OK[key] = False
    rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)


class BaseWeights:
    """The frozen weights of one decoder layer (bf16), shared by every mix measured on it.

    Random (no download): N(0, 1/d_in) linears, norms near 1."""

    def __init__(self, shape: Shape, device, dtype=torch.bfloat16, seed: int = 0):
        self.shape, self.device, self.dtype = shape, torch.device(device), dtype
        g = torch.Generator(device=self.device).manual_seed(seed)
        self.W = {}
        for name, din, dout in shape.linear_shapes():
            w = torch.randn(dout, din, device=self.device, dtype=torch.float32, generator=g)
            self.W[name] = w.mul_(1.0 / math.sqrt(din)).to(dtype)
            del w
        self.norm_in = (1 + 0.02 * torch.randn(shape.hidden, device=self.device, generator=g)).to(dtype)
        self.norm_post = (1 + 0.02 * torch.randn(shape.hidden, device=self.device, generator=g)).to(dtype)
        self._rope: dict = {}

    def nbytes(self) -> int:
        return sum(w.numel() * w.element_size() for w in self.W.values())

    def rope(self, s: int):
        if s not in self._rope:
            hd = self.shape.head_dim
            inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device=self.device, dtype=torch.float32) / hd))
            f = torch.outer(torch.arange(s, device=self.device, dtype=torch.float32), inv)
            emb = torch.cat((f, f), dim=-1)
            self._rope[s] = (emb.cos().to(self.dtype), emb.sin().to(self.dtype))
        return self._rope[s]


class LoRASet:
    """The adapters of one mix on one layer, laid out for implementation ``impl``.

    members: (rank, batch_size, seq_len) per adapter, in segment order."""

    def __init__(self, base: BaseWeights, members: Sequence[tuple], impl: str, seed: int = 1):
        self.base, self.impl = base, impl
        self.members = [tuple(int(v) for v in m) for m in members]
        self.ranks = [m[0] for m in self.members]
        self.segs = [m[1] * m[2] for m in self.members]
        self.scales = [ALPHA_OVER_R for _ in self.ranks]
        dev, dt = base.device, base.dtype
        g = torch.Generator(device=dev).manual_seed(seed)
        self.params: list[torch.Tensor] = []
        self.A, self.B, self.plan = {}, {}, {}
        self.implementation = impl
        if impl == "none":
            return
        R = sum(self.ranks)
        for name, din, dout in base.shape.linear_shapes():
            A = (torch.randn(R, din, device=dev, generator=g) / math.sqrt(din)).to(dt)
            B = (torch.randn(R, dout, device=dev, generator=g) * 0.02).to(dt)  # not zero: see METHOD.md
            if impl == "fused":
                from tlora_sim.profiler.kernels import build_plan

                self.A[name] = A.requires_grad_(True)
                self.B[name] = B.requires_grad_(True)
                self.plan[name] = build_plan(self.segs, self.ranks, self.scales, DROPOUT, din, dout, dev)
                self.params += [self.A[name], self.B[name]]
            elif impl == "loop":
                offs = _offsets(self.ranks)
                self.A[name] = [A[o:o + r].clone().requires_grad_(True) for o, r in zip(offs, self.ranks)]
                self.B[name] = [B[o:o + r].t().contiguous().requires_grad_(True) for o, r in zip(offs, self.ranks)]
                self.params += self.A[name] + self.B[name]
            elif impl == "lorafusion":
                from tlora_sim.profiler.kernels.lorafusion_ext import LoRAFusionPlan, lorafusion_b_layout

                self.plan[name] = LoRAFusionPlan(self.segs, self.ranks, self.scales, DROPOUT, din, dout, dev, dt)
                self.A[name] = A.requires_grad_(True)
                self.B[name] = [b.requires_grad_(True) for b in lorafusion_b_layout(B, self.ranks)]
                self.params += [self.A[name]] + self.B[name]
                self.implementation = self.plan[name].implementation()
            elif impl == "grouped":
                from tlora_sim.profiler.kernels.grouped import GroupedPlan, grouped_layout

                self.plan[name] = GroupedPlan(self.segs, self.ranks, self.scales, DROPOUT, din, dout, dev, dt)
                A3, B3 = grouped_layout(A, B, self.ranks, self.plan[name].R)
                self.A[name], self.B[name] = A3.requires_grad_(True), B3.requires_grad_(True)
                self.params += [self.A[name], self.B[name]]
                self.implementation = self.plan[name].implementation()
            elif impl == "padded":
                n, Rm = len(self.ranks), max(self.ranks)
                Ap, Bp = A.new_zeros(n, Rm, din), B.new_zeros(n, dout, Rm)
                for i, (o, r) in enumerate(zip(_offsets(self.ranks), self.ranks)):
                    Ap[i, :r] = A[o:o + r]
                    Bp[i, :, :r] = B[o:o + r].t()
                self.A[name], self.B[name] = Ap.requires_grad_(True), Bp.requires_grad_(True)
                self.params += [self.A[name], self.B[name]]
            else:
                raise ValueError(f"unknown LoRA implementation {impl!r}")
        self._seed = 0

    def adapter_params(self) -> int:
        """Trainable elements (without padding)."""
        return sum(r * (din + dout) for r in self.ranks for _, din, dout in self.base.shape.linear_shapes())

    def linear(self, name: str, h: torch.Tensor) -> torch.Tensor:
        W = self.base.W[name]
        if self.impl == "none":
            return F.linear(h, W)
        if self.impl == "fused":
            from tlora_sim.profiler.kernels import multi_lora_linear

            self._seed += 1
            return multi_lora_linear(h, W, self.A[name], self.B[name], self.plan[name], seed=self._seed)
        if self.impl == "lorafusion":
            from tlora_sim.profiler.kernels.lorafusion_ext import lorafusion_multi_lora_linear

            self._seed += 1
            return lorafusion_multi_lora_linear(h, W, self.A[name], self.B[name], self.plan[name], seed=self._seed)
        if self.impl == "grouped":
            from tlora_sim.profiler.kernels.grouped import grouped_multi_lora_linear

            return grouped_multi_lora_linear(h, W, self.A[name], self.B[name], self.plan[name])
        y = F.linear(h, W)
        if self.impl == "loop":
            parts = [F.linear(F.linear(F.dropout(hi, DROPOUT, training=True), a) * s, b)
                     for hi, a, b, s in zip(h.split(self.segs), self.A[name], self.B[name], self.scales)]
            return y + (torch.cat(parts) if len(parts) > 1 else parts[0])
        # padded: pad token segments to the longest, two bmm
        hs = torch.nn.utils.rnn.pad_sequence(list(h.split(self.segs)), batch_first=True)
        d = F.dropout(hs, DROPOUT, training=True)
        lo = torch.bmm(torch.bmm(d, self.A[name].transpose(1, 2)) * self.scales[0], self.B[name].transpose(1, 2))
        return y + torch.cat([lo[i, :L] for i, L in enumerate(self.segs)])


def _offsets(ranks):
    out, o = [], 0
    for r in ranks:
        out.append(o)
        o += r
    return out


def seq_groups(members: Sequence[tuple]) -> list[tuple[int, int, int]]:
    """Contiguous token ranges sharing one sequence length: (seq_len, start, tokens)."""
    out: list[list[int]] = []
    start = 0
    for _, b, s in members:
        if out and out[-1][0] == s and out[-1][1] + out[-1][2] == start:
            out[-1][2] += b * s
        else:
            out.append([s, start, b * s])
        start += b * s
    return [tuple(g) for g in out]


def attention_block(base: BaseWeights, q, k, v, groups) -> torch.Tensor:
    """Rotary + causal SDPA per sequence-length group; (T, heads x head_dim) out."""
    sh = base.shape
    H, KV, hd = sh.heads, sh.kv_heads, sh.head_dim
    outs = []
    for s, start, ntok in groups:
        b = ntok // s
        qs = q[start:start + ntok].view(b, s, H, hd).transpose(1, 2)
        ks = k[start:start + ntok].view(b, s, KV, hd).transpose(1, 2)
        vs = v[start:start + ntok].view(b, s, KV, hd).transpose(1, 2)
        cos, sin = base.rope(s)
        qs = qs * cos + _rotate_half(qs) * sin
        ks = ks * cos + _rotate_half(ks) * sin
        o = _sdpa(qs, ks, vs)
        outs.append(o.transpose(1, 2).reshape(ntok, H * hd))
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def layer_forward(base: BaseWeights, lora: LoRASet, x: torch.Tensor, attn: str = "sdpa") -> torch.Tensor:
    """One decoder layer over x (T, hidden) with the mix's adapters; returns (T, hidden)."""
    h = rmsnorm(x, base.norm_in)
    q, k, v = lora.linear("q", h), lora.linear("k", h), lora.linear("v", h)
    a = q if attn == "skip" else attention_block(base, q, k, v, seq_groups(lora.members))
    x = x + lora.linear("o", a)
    h2 = rmsnorm(x, base.norm_post)
    m = F.silu(lora.linear("gate", h2)) * lora.linear("up", h2)
    return x + lora.linear("down", m)


# --------------------------------------------------------------------------------------- timing
class Marks:
    """Timestamps inside a step: CUDA events on a GPU, host clock on the CPU."""

    def __init__(self, device, host: bool = False):
        self.cuda = torch.device(device).type == "cuda" and not host
        self.rows: list[list] = []

    def new_iter(self):
        self.rows.append([])

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.rows[-1].append(e)
        else:
            self.rows[-1].append(time.perf_counter())

    def durations_ms(self) -> list[list[float]]:
        """Per iteration, the time between consecutive marks (ms)."""
        if self.cuda:
            torch.cuda.synchronize()
            return [[a.elapsed_time(b) for a, b in zip(r, r[1:])] for r in self.rows]
        return [[(b - a) * 1e3 for a, b in zip(r, r[1:])] for r in self.rows]


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_timed(step: Callable[[int, Marks], None], device, warmup: int, reps: int) -> dict:
    """Warm up, then ``reps`` iterations without host synchronisation between them (a training
    loop's steady state); ``step(i, marks)`` calls ``marks.mark()`` at each phase boundary.
    Returns medians per phase (``phase_ms``), their sum's median (``total_ms``) and the spread
    (p10/p90 of the total, ms)."""
    for i in range(warmup):
        m = Marks(device)
        m.new_iter()
        step(i, m)
    sync(device)
    marks = Marks(device)
    for i in range(reps):
        marks.new_iter()
        step(warmup + i, marks)
    d = marks.durations_ms()
    totals = sorted(sum(r) for r in d)
    phases = [statistics.median(r[j] for r in d) for j in range(len(d[0]))]
    q = lambda p: totals[min(len(totals) - 1, max(0, int(round(p * (len(totals) - 1)))))]  # noqa: E731
    return {"phase_ms": phases, "total_ms": statistics.median(totals), "p10_ms": q(0.1), "p90_ms": q(0.9)}


def measure_memory(fn_fwd: Callable[[], torch.Tensor], fn_bwd: Callable[[torch.Tensor], object], device) -> dict:
    """One extra step: bytes held after the forward (saved activations + output) and the peak
    during forward + backward, both above what was allocated before it (CUDA only; on the CPU
    nothing runs and both are 0)."""
    if torch.device(device).type != "cuda":
        return {"saved_bytes": 0, "peak_bytes": 0}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    m0 = torch.cuda.memory_allocated()
    y = fn_fwd()
    torch.cuda.synchronize()
    saved = torch.cuda.memory_allocated() - m0 - y.numel() * y.element_size()
    g = fn_bwd(y)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - m0
    del y, g
    return {"saved_bytes": int(saved), "peak_bytes": int(peak)}
