"""GPU types and cluster shapes: ``NODESxGPUSxTYPE`` specs such as ``16x8xH100``.

GPU figures are datasheet values (NVIDIA H100 SXM5, H200 SXM and A100 SXM4 80GB datasheets):
memory, dense bf16 peak and HBM bandwidth. ``matmul_flops`` is the *achievable* large-GEMM rate:
measured on an H100 80GB in docs/costmodel.md ("cuBLAS runs the base GEMMs at 700-785 TFLOP/s"; we take
740) and, for the other types, the H100's achieved/peak ratio applied to their datasheet peak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tlora_sim.traces.errors import InputError


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


@dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous cluster: ``nodes`` x ``gpus_per_node`` GPUs of one type, in racks.

    Attributes:
        nodes: number of nodes.
        gpus_per_node: GPUs in each node.
        gpu: the GPU type.
        nodes_per_rack: nodes sharing a rack (placement tiers: node, rack, cluster).
    """

    nodes: int
    gpus_per_node: int
    gpu: GpuSpec
    nodes_per_rack: int = 4

    @property
    def total_gpus(self) -> int:
        """GPUs in the cluster."""
        return self.nodes * self.gpus_per_node

    @property
    def spec(self) -> str:
        """The canonical ``NODESxGPUSxTYPE`` string."""
        return f"{self.nodes}x{self.gpus_per_node}x{self.gpu.name}"

    def rack_of(self, node: int) -> int:
        """Rack index of ``node``."""
        return node // self.nodes_per_rack


_SPEC = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*x\s*([A-Za-z0-9]+)\s*$")


def parse_cluster(spec: str) -> ClusterSpec:
    """Parse ``NODESxGPUSxTYPE`` (e.g. ``16x8xH100``).

    Raises:
        InputError: malformed spec, zero sizes or an unknown GPU type.
    """
    m = _SPEC.match(spec)
    if not m:
        raise InputError(f"cluster spec {spec!r} is not NODESxGPUSxTYPE (e.g. 16x8xH100)", field="--cluster")
    nodes, gpn, gpu = int(m.group(1)), int(m.group(2)), m.group(3).upper()
    if nodes < 1 or gpn < 1:
        raise InputError(f"cluster spec {spec!r} needs at least one node and one GPU per node", field="--cluster")
    if gpu not in GPUS:
        raise InputError(f"unknown GPU type {m.group(3)!r} in {spec!r}; known: {', '.join(GPUS)}", field="--cluster")
    return ClusterSpec(nodes, gpn, GPUS[gpu])
