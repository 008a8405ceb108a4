"""Cluster shapes: ``NODESxGPUSxTYPE`` specs such as ``16x8xH100``.

The GPU types themselves (``GpuSpec``, ``GPUS``) are hardware facts the cost model owns
(``sim/costmodel/hardware.py``); import them from there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tlora_sim.sim.costmodel.hardware import GPUS, GpuSpec
from tlora_sim.traces.errors import InputError


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
