"""GPU types: the hardware figures every cost model reads.

Figures are datasheet values (NVIDIA H100 SXM5, H200 SXM and A100 SXM4 80GB datasheets): memory,
dense bf16 peak and HBM bandwidth. ``matmul_flops`` is the *achievable* large-GEMM rate: measured
on an H100 80GB (docs/costmodel.md, reference measurements: "cuBLAS runs the base GEMMs at
700-785 TFLOP/s"; we take 740) and, for the other types, the H100's achieved/peak ratio applied to
their datasheet peak. Link bandwidths are per GPU, one direction (NVLink 4: 450 GB/s; 400 Gb/s
InfiniBand per GPU: 50 GB/s); the two-GPU profile measured 313 GB/s all-reduce bus bandwidth
between two H200s (profiler/MULTIGPU.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """One GPU type.

    Attributes:
        name: ``"H100"``, ``"H200"`` or ``"A100"``.
        memory_bytes: device memory (bytes).
        peak_flops: dense bf16 tensor-core peak (FLOP/s); the denominator of compute utilization.
        matmul_flops: achievable large bf16 GEMM rate (FLOP/s).
        mem_bw_bytes_s: HBM bandwidth (bytes/s).
        link_bw_bytes_s: per-GPU intra-node interconnect bandwidth (bytes/s, NVLink, one direction).
        net_bw_bytes_s: per-GPU inter-node bandwidth (bytes/s).
    """

    name: str
    memory_bytes: float
    peak_flops: float
    matmul_flops: float
    mem_bw_bytes_s: float
    link_bw_bytes_s: float
    net_bw_bytes_s: float


_GIB = 1024**3
_H100_ACHIEVED = 740e12 / 989e12  # docs/costmodel.md measured cuBLAS rate over the datasheet peak

GPUS: dict[str, GpuSpec] = {
    "H100": GpuSpec("H100", 80 * _GIB, 989e12, 740e12, 3.35e12, 450e9, 50e9),
    "H200": GpuSpec("H200", 141 * _GIB, 989e12, 989e12 * _H100_ACHIEVED, 4.8e12, 450e9, 50e9),
    "A100": GpuSpec("A100", 80 * _GIB, 312e12, 312e12 * _H100_ACHIEVED, 2.04e12, 300e9, 25e9),
}


