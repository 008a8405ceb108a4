"""Analytic roofline cost model: FLOPs and bytes per step over measured ceilings.

Step time of a group on ``n`` GPUs (the group's tokens split evenly across them, frozen base
weights replicated per GPU unless they do not fit, then sharded) is the sum of

* base linear layers + LM head: ``max(FLOPs / rate(t), weight bytes / HBM bandwidth)`` with
  FLOPs = 4 x params x tokens (forward + dX; W is frozen so there is no dW) and ``rate(t)``
  the measured bf16 GEMM rate at ``t`` tokens per GPU (docs/costmodel.md: 128 tok 192 TFLOP/s, 512 tok
  539, 1024 tok 721, 2048-8192 tok 726-741 on an H100), scaled by the GPU's ``matmul_flops``;
* causal attention: 6 x s^2 x (heads x head_dim) FLOPs per sequence per layer at
  ``ATTN_EFFICIENCY`` of the matmul rate (FlashAttention-2 reaches roughly half the GEMM rate);
* element-wise work (norms, SwiGLU, residuals, rotary): ``ELEMENTWISE_BYTES_PER_TOKEN`` per
  layer over HBM bandwidth;
* LoRA, by plan, as ``passes`` bf16 passes over the layer's activations (T x (d_in + d_out) x 2
  bytes) plus a per-adapter launch cost per layer, both least-squares fits to this project's
  H100 kernel benchmark (``profiler/data/kernel_bench_h100.csv``, 31 mixes, GPU time; reproduced
  by ``python bench/calibrate_roofline.py``): ``alone``/``loop`` (torch loop over adapters)
  ``LOOP_PASSES`` = 10 and ``LOOP_LAUNCH_S`` = 31 us; ``fused`` (our kernel) ``FUSED_PASSES`` =
  4.75 and ``FUSED_ADAPTER_S`` = 10 us, plus the LoRA FLOPs at ``LORA_EFFICIENCY`` of the matmul
  rate; ``grouped`` (ALTO) one pass more than ``fused``;
  ``lorafusion`` pays ``LF_PASSES_BASE + LF_PASSES_PER_RANK x max rank`` passes, its tiles being
  sized for the largest rank (fitted to docs/costmodel.md's LoRAFusion column: +0.32 ms at 4 x r16,
  +1.0 ms at ranks 8-64, +2.2 ms at ranks up to 128, 8192 tokens on 4096x4096), and LoRA FLOPs
  at the largest rank;
* micro-batches (B): each re-reads the frozen weights and pays the per-layer launch overhead;
  nano-batches (N, fused-kernel plans only): base GEMMs run at t/(B N) tokens, N times per
  micro-batch, while all but 1/N of the LoRA and communication time hides behind them;
* Adam on the adapters (28 bytes moved per parameter), the ring all-reduce of adapter gradients
  over NVLink (one node) or the network, and a fixed launch/framework overhead per step
  (``STEP_OVERHEAD_S`` + ``LAYER_OVERHEAD_S`` x layers), paid once per group step.

Memory per GPU: bf16 base weights (2 bytes/param; sharded when they exceed half the GPU), fp32
adapter weights + grads + Adam moments (16 bytes/param), activations with per-layer
checkpointing (layer inputs kept, one layer's working set live, fp32 logits), and a workspace.
The constants are assumptions stated here; the profiled model replaces them with measurements.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from tlora_sim.sim.costmodel.hardware import GPUS, GpuSpec
from tlora_sim.sim.costmodel.interface import Member, check_plan
from tlora_sim.sim.costmodel.models import ModelSpec, get_model

# docs/costmodel.md, reference measurements (H100 80GB, cuBLAS bf16, 4096x4096): tokens -> TFLOP/s.
GEMM_TOKENS = np.array([128.0, 512.0, 1024.0, 2048.0, 8192.0])
GEMM_TFLOPS = np.array([192.0, 539.0, 721.0, 733.0, 741.0])
H100_MATMUL_FLOPS = 740e12

ATTN_EFFICIENCY = 0.5
LORA_EFFICIENCY = 0.3
ELEMENTWISE_BYTES_PER_TOKEN = lambda m: (12 * m.hidden + 4 * m.ffn) * 2 * 3  # noqa: E731 fwd+bwd, bf16
LOOP_PASSES = 10
LOOP_LAUNCH_S = 31e-6
FUSED_PASSES = 4.75
FUSED_ADAPTER_S = 10e-6
LF_PASSES_BASE = 2.33
LF_PASSES_PER_RANK = 0.354
OVERLAP_PLANS = ("fused", "lorafusion", "grouped")
FUSED_LAUNCH_S = 4e-6
GROUPED_PASSES = FUSED_PASSES + 1
STEP_OVERHEAD_S = 5e-3
LAYER_OVERHEAD_S = 0.5e-3
ALLREDUCE_LATENCY_S = 20e-6
WORKSPACE_BYTES = 2 * 1024**3
ADAM_BYTES_PER_PARAM = 28
ADAPTER_STATE_BYTES_PER_PARAM = 16


def gemm_rate(tokens_per_gpu: float, gpu: GpuSpec) -> float:
    """Achievable bf16 GEMM rate at ``tokens_per_gpu`` rows (FLOP/s).

    Log-linear interpolation of docs/costmodel.md's H100 measurements, scaled by ``gpu.matmul_flops``;
    below 128 tokens the rate falls in proportion to tokens (weight-read bound).
    """
    scale = gpu.matmul_flops / H100_MATMUL_FLOPS
    t = max(float(tokens_per_gpu), 1e-9)
    if t < GEMM_TOKENS[0]:
        return GEMM_TFLOPS[0] * 1e12 * scale * t / GEMM_TOKENS[0]
    return float(np.interp(np.log(t), np.log(GEMM_TOKENS), GEMM_TFLOPS)) * 1e12 * scale


class RooflineCostModel:
    """Analytic cost model (see module docstring for every term and its source).

    Raises:
        InputError: unknown model, GPU or plan names.
    """

    name = "roofline"

    def batch(self, model: str, gpu: str, n_gpus: int) -> None:
        """No vectorised form: the roofline answers through ``step_time_s`` alone."""
        return None

    def describe(self) -> dict:
        """Identity recorded in ``config.json``."""
        return {"name": self.name, "kind": "analytic", "source": "sim/costmodel/roofline.py",
                "gemm_curve_tokens": GEMM_TOKENS.tolist(), "gemm_curve_tflops_h100": GEMM_TFLOPS.tolist()}

    def step_time_s(self, model: str, gpu: str, members: Sequence[Member], n_gpus: int, plan: str,
                    nano_batches: int = 1, micro_batches: int = 1) -> float:
        """Time of one group step (s); see the module docstring.

        Raises:
            InputError: unknown model, GPU or plan.
            ValueError: nano_batches or micro_batches below 1, or no members.
        """
        if nano_batches < 1 or micro_batches < 1 or not members:
            raise ValueError(f"need members, nano_batches >= 1, micro_batches >= 1; got {len(members)}, "
                             f"{nano_batches}, {micro_batches}")
        return step_time_s_of(model, gpu, tuple(sorted(members)), int(n_gpus), check_plan(plan),
                          int(nano_batches), int(micro_batches))

    def memory_bytes(self, model: str, gpu: str, members: Sequence[Member], n_gpus: int, plan: str,
                     micro_batches: int = 1) -> float:
        """Peak memory per GPU (bytes); see the module docstring."""
        return memory_bytes_of(model, gpu, tuple(sorted(members)), int(n_gpus), int(micro_batches))

    def parallelism(self, model: str, gpu: str, members: Sequence[Member], n_gpus: int, plan: str,
                    nano_batches: int = 1, micro_batches: int = 1) -> str:
        """``dp<n>`` or ``fsdp<n>`` (``parallelism_of``): the roofline weighs no other plan."""
        return parallelism_of(model, gpu, n_gpus)

    def step_flops(self, model: str, members: Sequence[Member]) -> float:
        """Model FLOPs of one group step (FLOP)."""
        return _flops(model, tuple(sorted(members)))

    def isolated_step_time_s(self, model: str, gpu: str, member: Member, n_gpus: int) -> float:
        """One job alone on its ``n_gpus`` GPUs with eager LoRA (plan ``alone``) (s)."""
        return self.step_time_s(model, gpu, (member,), n_gpus, "alone")


def base_sharded(m: ModelSpec, gpu: GpuSpec, n: int) -> bool:
    return n > 1 and 2 * m.params > 0.5 * gpu.memory_bytes


def parallelism_of(model: str, gpu_name: str, n: int) -> str:
    """The roofline's parallelism plan on ``n`` GPUs (``sim/costmodel/parallelism.py`` names):
    ``fsdp<n>`` where the base is sharded (``base_sharded``), else ``dp<n>``."""
    return f"{'fsdp' if base_sharded(get_model(model), GPUS[gpu_name], n) else 'dp'}{n}"


@lru_cache(maxsize=1 << 16)
def _flops(model: str, members: tuple[Member, ...]) -> float:
    m = get_model(model)
    tokens = sum(x.tokens for x in members)
    base = 4.0 * (m.layers * m.block_linear_params + m.vocab * m.hidden) * tokens
    attn = sum(6.0 * x.batch_size * x.seq_len**2 * m.heads * m.head_dim * m.layers for x in members)
    lora = sum(6.0 * x.tokens * m.lora_params(x.rank) for x in members)
    return base + attn + lora


@lru_cache(maxsize=1 << 18)
def step_time_s_of(model: str, gpu_name: str, members: tuple[Member, ...], n: int, plan: str,
               nano: int = 1, micro: int = 1) -> float:
    m, gpu = get_model(model), GPUS[gpu_name]
    bw = gpu.mem_bw_bytes_s
    if plan not in OVERLAP_PLANS:
        nano = 1
    t = sum(x.tokens for x in members) / n  # tokens per GPU per step
    chunks = micro * nano  # base GEMM launches per layer per step
    tc = t / chunks
    lin_params = m.layers * m.block_linear_params + m.vocab * m.hidden
    weight_bytes = 2 * 2 * lin_params / (n if base_sharded(m, gpu, n) else 1)  # read in fwd and bwd
    base = chunks * max(4.0 * lin_params * tc / gemm_rate(tc, gpu), weight_bytes / bw)
    attn = sum(6.0 * x.batch_size * x.seq_len**2 * m.heads * m.head_dim * m.layers for x in members)
    attn /= n * ATTN_EFFICIENCY * gpu.matmul_flops
    elementwise = t * m.layers * ELEMENTWISE_BYTES_PER_TOKEN(m) / bw
    dims = m.lora_dims_per_rank  # Σ (d_in + d_out) over all targeted layers
    launches = m.layers * len(m.linear_shapes)
    lora_flops = sum(6.0 * x.tokens * m.lora_params(x.rank) for x in members)
    if plan in ("fused", "grouped"):
        passes = FUSED_PASSES if plan == "fused" else GROUPED_PASSES
        lora = passes * t * dims / bw + lora_flops / (n * LORA_EFFICIENCY * gpu.matmul_flops)
        lora_launch = FUSED_ADAPTER_S * len(members) * launches * chunks
    elif plan == "lorafusion":
        r_max = max(x.rank for x in members)
        lora = (LF_PASSES_BASE + LF_PASSES_PER_RANK * r_max) * t * dims / bw
        lora += sum(6.0 * x.tokens * m.lora_params(r_max) for x in members) / (n * LORA_EFFICIENCY * gpu.matmul_flops)
        lora_launch = FUSED_LAUNCH_S * 2 * launches * chunks
    else:  # alone / loop: unfused per-adapter passes and launches
        lora = sum(LOOP_PASSES * 2.0 * (x.tokens / n) * dims / bw for x in members)
        lora_launch = LOOP_LAUNCH_S * len(members) * launches * micro
    adapter_params = sum(m.lora_params(x.rank) for x in members)
    optimizer = ADAM_BYTES_PER_PARAM * adapter_params / bw
    comm = 0.0
    if n > 1:
        link = gpu.link_bw_bytes_s if n <= 8 else gpu.net_bw_bytes_s
        comm = 2.0 * (n - 1) / n * 2 * adapter_params / link + ALLREDUCE_LATENCY_S * m.layers
        if base_sharded(m, gpu, n):  # all-gather the frozen weights in forward and backward
            comm += micro * 2.0 * (n - 1) / n * 2 * lin_params / link
    hidden = (lora + comm) / nano  # nano-batching hides all but one nano-batch's share
    overhead = STEP_OVERHEAD_S + LAYER_OVERHEAD_S * m.layers * micro
    return base + attn + elementwise + hidden + lora_launch + optimizer + overhead


@lru_cache(maxsize=1 << 18)
def memory_bytes_of(model: str, gpu_name: str, members: tuple[Member, ...], n: int, micro: int = 1) -> float:
    m, gpu = get_model(model), GPUS[gpu_name]
    weights = 2.0 * m.params / (n if base_sharded(m, gpu, n) else 1)
    adapters = ADAPTER_STATE_BYTES_PER_PARAM * sum(m.lora_params(x.rank) for x in members)
    t = sum(x.tokens for x in members) / n / micro  # one micro-batch's activations are live
    t_max = max((x.tokens for x in members), default=0) / n / micro
    activations = 2.0 * t * m.hidden * m.layers  # checkpointed layer inputs, bf16
    activations += 2.0 * t_max * (10 * m.hidden + 4 * m.ffn)  # one layer live (members run in one step)
    activations += 4.0 * t_max * m.vocab  # fp32 logits of the largest micro-batch
    return weights + adapters + activations + WORKSPACE_BYTES
