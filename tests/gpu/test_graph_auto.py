"""``MultiLoRALinear(cuda_graph="auto")``'s choice between CUDA graphs and the plain path
(profiler/kernels/graphed.py): the rule, the per-key counts and cache, and the guard that keeps a
second replay from overwriting tensors a pending backward still reads. The capture itself needs a
GPU (``bench/kernels.py`` times it there as ``eager_auto_ms``); here a stand-in capture counts calls.
"""
from __future__ import annotations

import gc
import os
from collections import OrderedDict
from types import SimpleNamespace

import pytest
import torch

from tlora_sim.profiler.kernels.graphed import AUTO_AFTER, AUTO_MAX_FLOPS, AUTO_MAX_GRAPHS, graph_for, use_graphs
from tlora_sim.profiler.kernels.multilora import MultiLoRALinear


def _parent(mode):
    return SimpleNamespace(cuda_graph=mode, graph_cache=OrderedDict(), graph_uses={}, graph_pending={})


class _Capture:
    def __init__(self):
        self.n = 0

    def __call__(self):
        self.n += 1
        return f"graph{self.n}"


def test_rule_graphs_small_steps_met_twice_and_never_with_a_backward_pending():
    small, big = AUTO_MAX_FLOPS * 0.99, AUTO_MAX_FLOPS * 1.01
    assert not use_graphs(False, small, 10, False)
    assert use_graphs(True, big, 1, False)
    assert not use_graphs(True, small, 10, True)
    assert not use_graphs("auto", small, AUTO_AFTER - 1, False)
    assert use_graphs("auto", small, AUTO_AFTER, False)
    assert not use_graphs("auto", big, 100, False)
    assert not use_graphs("auto", small, 100, True)


def test_threshold_sits_between_the_measured_host_bound_and_gpu_bound_steps():
    # 4096x4096 at 4,608 tokens was host-bound on the plain path, at 6,125 tokens GPU-bound
    # (profiler/data/kernel_bench_h100_2026-11-26-{h,i,j,k}.csv)
    assert 4.0 * 4608 * 4096 * 4096 < AUTO_MAX_FLOPS < 4.0 * 6125 * 4096 * 4096
    assert 4.0 * 4096 * 4096 * 14336 > AUTO_MAX_FLOPS


def test_auto_captures_on_the_second_step_of_a_key_then_replays():
    p, cap = _parent("auto"), _Capture()
    key = ((4096, 4096), (2048, 2048))
    assert graph_for(p, key, 1e9, cap) is None and cap.n == 0
    assert graph_for(p, key, 1e9, cap) == "graph1" and cap.n == 1
    assert graph_for(p, key, 1e9, cap) == "graph1" and cap.n == 1
    assert key not in p.graph_uses


def test_auto_never_captures_a_large_step_or_a_layout_met_once():
    p, cap = _parent("auto"), _Capture()
    for _ in range(5):
        assert graph_for(p, ("big",), AUTO_MAX_FLOPS * 2, cap) is None
    for i in range(20):
        assert graph_for(p, ("layout", i), 1e9, cap) is None
    assert cap.n == 0 and not p.graph_cache


def test_auto_keeps_at_most_its_cap_of_keys_dropping_the_least_recently_used():
    p, cap = _parent("auto"), _Capture()
    keys = [("k", i) for i in range(AUTO_MAX_GRAPHS + 1)]
    for k in keys[:-1]:
        graph_for(p, k, 1e9, cap)
        graph_for(p, k, 1e9, cap)
    graph_for(p, keys[0], 1e9, cap)  # the first key is now the most recently used
    graph_for(p, keys[-1], 1e9, cap)
    graph_for(p, keys[-1], 1e9, cap)
    assert len(p.graph_cache) == AUTO_MAX_GRAPHS
    assert keys[1] not in p.graph_cache and keys[1] not in p.graph_pending
    assert keys[0] in p.graph_cache and keys[-1] in p.graph_cache


def test_true_captures_at_once_and_keeps_every_key():
    p, cap = _parent(True), _Capture()
    for i in range(AUTO_MAX_GRAPHS + 3):
        assert graph_for(p, ("k", i), AUTO_MAX_FLOPS * 10, cap) is not None
    assert len(p.graph_cache) == AUTO_MAX_GRAPHS + 3


def test_a_key_with_a_pending_backward_takes_the_plain_path_until_it_runs():
    p, cap = _parent(True), _Capture()
    w = torch.randn(3, requires_grad=True)
    assert graph_for(p, ("k",), 1e9, cap) == "graph1"
    y = w * 2
    p.graph_pending[("k",)].watch(y)
    assert graph_for(p, ("k",), 1e9, cap) is None  # its backward has not run
    assert graph_for(p, ("other",), 1e9, cap) == "graph2"  # other keys have their own buffers
    y.sum().backward()
    assert graph_for(p, ("k",), 1e9, cap) == "graph1"


def test_pending_clears_when_the_output_is_freed_but_not_by_an_older_output():
    p = _parent(True)
    assert graph_for(p, ("k",), 1e9, _Capture()) == "graph1"
    pend = p.graph_pending[("k",)]   # the captured key's pending state, as graphed_forward watches it
    assert not pend.on
    w = torch.randn(3, requires_grad=True)
    y1 = w * 2
    pend.watch(y1)
    y1.sum().backward()
    assert not pend.on
    y2 = w * 3
    pend.watch(y2)
    del y1
    gc.collect()
    assert pend.on  # the older output's callbacks leave the newer replay pending
    del y2
    gc.collect()
    assert not pend.on
    pend.watch(torch.randn(3))  # no gradient: nothing to wait for
    assert not pend.on


def test_bad_modes_are_refused():
    with pytest.raises(ValueError, match="cuda_graph"):
        MultiLoRALinear(32, 16, [2], cuda_graph="always")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="CPU tensors run the Triton kernels only through the interpreter (TRITON_INTERPRET=1)")
def test_auto_is_the_plain_path_off_cuda():
    torch.manual_seed(0)
    a = MultiLoRALinear(32, 16, [2, 8], dtype=torch.float32, device="cpu", cuda_graph="auto")
    b = MultiLoRALinear(32, 16, [2, 8], dtype=torch.float32, device="cpu")
    b.load_state_dict(a.state_dict())
    x = torch.randn(20, 32)
    assert torch.equal(a(x, [8, 12], seed=4), b(x, [8, 12], seed=4))
    assert not a.graph_cache and not a.graph_uses


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (run on the GPU machine)")
@pytest.mark.parametrize("tokens", [512, 8192])
def test_auto_steps_equal_the_plain_path_on_the_gpu(tokens):
    """Dropout 0: every step through "auto" (plain at first, then replayed graphs for the small
    step, always plain for the large one) gives the plain layer's y, dX, dA and dB; a second
    forward before the first's backward still gives each backward its own gradients. Compared
    by relative norm: the fp32 atomics' order differs between runs, so single bf16 elements can
    round apart (an H100 run saw 4 of 81,920 elements of a gradient differ, by up to 0.086, 7% of
    one near-zero element)."""

    def close(a, b):
        assert float((a.double() - b.double()).norm() / b.double().norm()) < 2e-3
    torch.manual_seed(0)
    ranks, segs = [4, 16], [tokens // 4, tokens - tokens // 4]
    kw = dict(dtype=torch.bfloat16, device="cuda")
    plain = MultiLoRALinear(4096, 4096, ranks, **kw).train()
    auto = MultiLoRALinear(4096, 4096, ranks, cuda_graph="auto", **kw).train()
    auto.load_state_dict(plain.state_dict())
    with torch.no_grad():
        plain.lora_B.normal_()
        auto.lora_B.copy_(plain.lora_B)

    def step(mod, x, dy):
        y = mod(x, segs)
        return [y.clone()] + list(torch.autograd.grad(y, [x, mod.lora_A, mod.lora_B], dy))

    for _ in range(4):
        x = torch.randn(tokens, 4096, **kw, requires_grad=True)
        dy = torch.randn(tokens, 4096, **kw)
        for a, b in zip(step(auto, x, dy), step(plain, x, dy)):
            close(a, b)
    assert bool(auto.graph_cache) == (4.0 * tokens * 4096 * 4096 < AUTO_MAX_FLOPS)
    x1, x2 = (torch.randn(tokens, 4096, **kw, requires_grad=True) for _ in range(2))
    dy = torch.randn(tokens, 4096, **kw)
    y1, y2 = auto(x1, segs), auto(x2, segs)  # the second must not overwrite the first's buffers
    g1 = torch.autograd.grad(y1, [x1, auto.lora_A], dy)
    g2 = torch.autograd.grad(y2, [x2, auto.lora_A], dy)
    for got, x in ((g1, x1), (g2, x2)):
        want = torch.autograd.grad(plain(x, segs), [x, plain.lora_A], dy)
        for a, b in zip(got, want):
            close(a, b)
