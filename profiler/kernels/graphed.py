"""The CUDA-graph path of ``MultiLoRALinear``: a training step's forward and backward of the fused
layer replayed from two captured CUDA graphs (``torch.cuda.make_graphed_callables``), so that an
eager training loop pays one graph launch per pass instead of the Python launch path of every
kernel (profiler/KERNELS.md, "Host overhead").

One pair of graphs per (token count, segment layout, dtype, whether x needs a gradient); the
first call of a new key warms up and captures (a few eager steps), later calls replay. The
dropout seed is a device counter that the captured forward advances by one (the kernels read it
and hash it, ``_triton._seed_value``), so every replay draws a fresh mask; the mask of counter
value c equals ``reference.keep_mask(M, K, c, p)``. As with any graphed callable, x is copied
into the graph's input buffer, and the returned tensor is the graph's output buffer: the next
step overwrites it.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["GraphedCore", "graphed_forward"]


class GraphedCore(torch.nn.Module):
    """The parent's layer as a module over the same Parameter objects (so the graphs'
    autograd returns their gradients), for one launch ``plan``. ``fn`` is
    ``multi_lora_linear``; ``counter`` a 0-d int64 device tensor (the dropout seed counter)."""

    def __init__(self, parent: torch.nn.Module, plan, fn: Callable, counter: torch.Tensor):
        super().__init__()
        self.weight = parent.weight
        self.bias = parent.bias
        self.lora_A = parent.lora_A
        self.lora_B = parent.lora_B
        self.plan, self.fn, self.counter = plan, fn, counter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.counter.add_(1)
        return self.fn(x, self.weight, self.lora_A, self.lora_B, self.plan, self.bias,
                       seed=self.counter, dropout_on=True)


def graphed_forward(parent, x2: torch.Tensor, plan, fn: Callable) -> torch.Tensor:
    """y (M, N) of ``parent`` (a ``MultiLoRALinear`` in training mode) on x2 (M, K), through its
    graphs for this key (captured on first use). Raises RuntimeError off CUDA."""
    if not x2.is_cuda:
        raise RuntimeError("the CUDA-graph path needs CUDA tensors")
    key = (tuple(x2.shape), plan.seg_lens, x2.dtype, x2.requires_grad, str(x2.device))
    graphs = parent.graph_cache
    g = graphs.get(key)
    if g is None:
        counter = parent.seed_counter(x2.device)
        core = GraphedCore(parent, plan, fn, counter)
        sample = x2.detach().clone().requires_grad_(x2.requires_grad)
        g = torch.cuda.make_graphed_callables(core, (sample,))
        graphs[key] = g
    return g(x2)
