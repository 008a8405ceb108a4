"""The CUDA-graph path of ``MultiLoRALinear``: a training step's forward and backward of the fused
layer replayed from two captured CUDA graphs (``torch.cuda.make_graphed_callables``), so that an
eager training loop pays one graph launch per pass instead of the Python launch path of every
kernel (profiler/KERNELS.md, "Host overhead").

One pair of graphs per (token count, segment layout, dtype, whether x needs a gradient); the
first call of a new key warms up and captures (a few eager steps), later calls replay. The
dropout seed is a device counter that the captured forward advances by one (the kernels read it
and hash it, ``lora_kernels.seed_value``), so every replay draws a fresh mask; the mask of counter
value c equals ``reference.keep_mask(M, K, c, p)``. As with any graphed callable, x is copied
into the graph's input buffer, and the returned tensor is the graph's output buffer: the next
replay of the same key overwrites it.

Two modes (``MultiLoRALinear(cuda_graph=...)``):

- ``True``: graphs for every step of a CUDA training loop.
- ``"auto"``: graphs only where they pay (``use_graphs``): steps whose frozen layer does fewer than
  ``AUTO_MAX_FLOPS`` (there the plain path's host time, ~0.4-0.8 ms a step on the H100 machines,
  is as long as the GPU work), for a key met ``AUTO_AFTER`` times (a layout that changes every
  step is never captured), with at most ``AUTO_MAX_GRAPHS`` keys kept (least recently used
  dropped, with their graphs' memory). Larger steps take the plain path, which is GPU-bound there
  and pays no input copy (profiler/KERNELS.md, "Session 19 (lead)": on every 4096x4096 mix
  from 6,125 tokens up and on every wider layer, the plain eager loop was 1.01-1.09x of GPU time
  against 1.04-1.16x through graphs).

In both modes a forward whose previous replay of the same key still awaits its backward (its
output alive, its gradient not yet computed) runs on the plain path instead: a second replay would
overwrite the saved tensors that backward reads (make_graphed_callables' partial-network
capture rule: each replay's backward before the next replay).
"""
from __future__ import annotations

import weakref
from typing import Callable

import torch

__all__ = ["GraphedCore", "graphed_forward", "graph_for", "use_graphs", "AUTO_MAX_FLOPS", "AUTO_AFTER",
           "AUTO_MAX_GRAPHS"]

AUTO_MAX_FLOPS = 3.5e11
"""``"auto"`` graphs a step whose frozen layer does fewer FLOPs than this: 4 x M x K x N (its
forward and the backward's dX; the weight gets no gradient). 3.5e11 is 4096x4096 at ~5,200
tokens. On the four full H100 kernel benchmarks of 2026-11-26
(profiler/data/kernel_bench_h100_2026-11-26-{h,i,j,k}.csv), choosing graphs below any threshold
from 3.1e11 to 4e11 gives a worst eager/GPU ratio at >= 2,048 tokens of 1.118-1.140 per run, and
the plain path was host-bound (up to 1.49x) only below that range. Calibrated on the H100 (the
H200 has the same bf16 peak; a slower GPU is GPU-bound at fewer FLOPs, where graphs cost a few %)."""

AUTO_AFTER = 2
"""``"auto"`` captures a key on its AUTO_AFTER-th step (capture costs a few eager steps)."""

AUTO_MAX_GRAPHS = 8
"""``"auto"`` keeps the graphs of at most this many keys per layer (least recently used dropped)."""


def use_graphs(mode, flops: float, uses: int, pending: bool) -> bool:
    """Whether a CUDA training step goes through the graphs: ``mode`` True or "auto" (False: never),
    ``flops`` the frozen layer's 4 x M x K x N, ``uses`` how many steps of this key (this one
    included) the layer has seen, ``pending`` whether the key's last replay still awaits its
    backward (then never: see the module docstring)."""
    if pending or not mode:
        return False
    if mode == "auto":
        return flops < AUTO_MAX_FLOPS and uses >= AUTO_AFTER
    return True


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


class _Pending:
    """Whether a key's last replay still awaits its backward: set by a replay, cleared when that
    replay's output gets its gradient or is freed without one (callbacks of older replays, e.g. the
    previous step's output freed after this step's replay, leave it set)."""

    __slots__ = ("serial", "on")

    def __init__(self):
        self.serial, self.on = 0, False

    def watch(self, y: torch.Tensor) -> None:
        if not y.requires_grad:
            return
        self.serial += 1
        self.on = True

        def done(*_, serial=self.serial):
            if self.serial == serial:
                self.on = False

        y.register_hook(done)
        weakref.finalize(y, done)


def graphed_forward(parent, x2: torch.Tensor, plan, fn: Callable):
    """y (M, N) of ``parent`` (a ``MultiLoRALinear`` in training mode, ``parent.cuda_graph`` True
    or "auto") on x2 (M, K), through its graphs for this key (captured on first use), or None
    where ``use_graphs`` says the plain path runs this step. Raises RuntimeError off CUDA."""
    if not x2.is_cuda:
        raise RuntimeError("the CUDA-graph path needs CUDA tensors")
    key = (tuple(x2.shape), plan.seg_lens, x2.dtype, x2.requires_grad, str(x2.device))

    def capture():
        core = GraphedCore(parent, plan, fn, parent.seed_counter(x2.device))
        sample = x2.detach().clone().requires_grad_(x2.requires_grad)
        return torch.cuda.make_graphed_callables(core, (sample,))

    g = graph_for(parent, key, 4.0 * x2.shape[0] * parent.in_features * parent.out_features, capture)
    if g is None:
        return None
    y = g(x2)
    parent.graph_pending[key].watch(y)
    return y


def graph_for(parent, key: tuple, flops: float, capture: Callable):
    """The graphed callable of ``key`` for this step (``capture()`` makes it on first use), or None
    for the plain path (``use_graphs``). Keeps ``parent``'s ``graph_cache`` (OrderedDict, least
    recently used first; at most ``AUTO_MAX_GRAPHS`` keys under "auto"), ``graph_uses`` (steps met
    per key not yet captured) and ``graph_pending`` (a ``_Pending`` per captured key)."""
    graphs = parent.graph_cache
    g = graphs.get(key)
    if g is None:
        uses = parent.graph_uses[key] = parent.graph_uses.get(key, 0) + 1
        if len(parent.graph_uses) > 64 * AUTO_MAX_GRAPHS:  # many layouts met once each: forget them
            parent.graph_uses.clear()
    else:
        uses = AUTO_AFTER  # captured before
    pending = parent.graph_pending.get(key)
    if not use_graphs(parent.cuda_graph, flops, uses, pending is not None and pending.on):
        return None
    if g is None:
        g = graphs[key] = capture()
        parent.graph_uses.pop(key, None)
        parent.graph_pending[key] = _Pending()
        if parent.cuda_graph == "auto" and len(graphs) > AUTO_MAX_GRAPHS:
            old, _ = graphs.popitem(last=False)
            parent.graph_pending.pop(old, None)
    else:
        graphs.move_to_end(key)
    return g
