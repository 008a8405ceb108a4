"""The ``grouped`` plan (profiler/kernels/grouped.py) against the float64 reference on fresh random
inputs: both backends (torch._grouped_mm where this torch runs it, and the labelled per-adapter
fallback), with and without dropout, and its zero-padded ranks staying zero."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tlora_sim.profiler.kernels import grouped as gp  # noqa: E402
from tlora_sim.profiler.kernels.reference import keep_mask, reference_forward_backward  # noqa: E402

BACKENDS = ["loop"] + (["grouped_mm"] if gp.grouped_mm_supported("cpu", torch.float32) else [])


def _case(segs, ranks, scales, p, backend, seed, K=48, N=40):
    g = torch.Generator().manual_seed(seed)
    M = sum(segs)
    x = torch.randn(M, K, generator=g).requires_grad_(True)
    W = torch.randn(N, K, generator=g) / K ** 0.5
    A = torch.randn(sum(ranks), K, generator=g) / K ** 0.5
    B = torch.randn(sum(ranks), N, generator=g) * 0.1
    dy = torch.randn(M, N, generator=g)
    plan = gp.GroupedPlan(segs, ranks, scales, p, K, N, "cpu", torch.float32, backend=backend)
    A3, B3 = gp.grouped_layout(A, B, ranks, plan.R)
    A3.requires_grad_(True)
    B3.requires_grad_(True)
    keep = keep_mask(M, K, seed, p) if p > 0 else None
    y = gp.grouped_multi_lora_linear(x, W, A3, B3, plan, keep=keep)
    dx, dA3, dB3 = torch.autograd.grad(y, [x, A3, B3], dy)
    ref = reference_forward_backward(x, W, A, B, segs, ranks, scales, dy, dropout=p, seed=seed)
    return plan, ref, {"y": y, "dx": dx, "dA3": dA3, "dB3": dB3}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("p", [0.0, 0.2])
def test_matches_float64_reference(backend, p):
    segs, ranks, scales = [37, 64, 5, 90], [16, 4, 2, 12], [2.0, 0.5, 1.0, 1.5]
    plan, ref, got = _case(segs, ranks, scales, p, backend, seed=7 + int(10 * p))
    assert plan.R == 16 and plan.backend == backend
    dA, dB = gp.packed_grads(got["dA3"], got["dB3"], ranks)
    for k, v in (("y", got["y"]), ("dx", got["dx"]), ("dA", dA), ("dB", dB)):
        err = (v.double() - ref[k]).abs().max().item()
        assert err <= 2e-5 * (ref[k].abs().max().item() + 1e-12) + 1e-6, (k, err)
    # the zero-padded rank rows get exactly zero gradient (they stay zero in training)
    for i, r in enumerate(ranks):
        assert not got["dA3"][i, r:].any() and not got["dB3"][i, r:].any()


def test_implementation_string_names_the_backend():
    plan = gp.GroupedPlan([8, 8], [4, 2], [1.0, 1.0], 0.0, 16, 16, "cpu", torch.float32, backend="loop")
    assert plan.implementation() == "grouped[per-adapter-fallback,R=8]"
    if gp.grouped_mm_supported("cpu", torch.float32):
        auto = gp.GroupedPlan([8, 8], [4, 2], [1.0, 1.0], 0.0, 16, 16, "cpu", torch.float32)
        assert auto.implementation().startswith("grouped[torch._grouped_mm")
    with pytest.raises(ValueError):
        gp.GroupedPlan([8], [4, 2], [1.0, 1.0], 0.0, 16, 16, "cpu", torch.float32)


def test_torch_dropout_path_keeps_expectation():
    """Without an explicit mask, torch's dropout is used: the LoRA term averages to the undropped one."""
    segs, ranks = [64, 64], [8, 8]
    plan = gp.GroupedPlan(segs, ranks, [1.0, 1.0], 0.5, 32, 16, "cpu", torch.float64, backend="loop")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 32, generator=g, dtype=torch.float64)
    A3, B3 = gp.grouped_layout(torch.randn(16, 32, generator=g, dtype=torch.float64),
                               torch.randn(16, 16, generator=g, dtype=torch.float64), ranks, plan.R)
    W = torch.zeros(16, 32, dtype=torch.float64)
    full = gp.grouped_multi_lora_linear(x, W, A3, B3, plan, training=False)
    torch.manual_seed(0)
    mean = sum(gp.grouped_multi_lora_linear(x, W, A3, B3, plan) for _ in range(200)) / 200
    assert (mean - full).abs().mean() < 0.15 * full.abs().mean()


@pytest.mark.parametrize("segs", [[24, 24, 24], [10, 0, 31]])
def test_bench_impl_computes_the_same_function(segs):
    """``bench/kernels.py``'s ``grouped`` (baselines.GroupedImpl), an empty segment included."""
    from tlora_sim.profiler.kernels.baselines import make_impl

    g = torch.Generator().manual_seed(21)
    ranks, K, N = [2, 8, 5], 32, 40
    x, W = torch.randn(sum(segs), K, generator=g), torch.randn(N, K, generator=g) / 6
    A, B = torch.randn(sum(ranks), K, generator=g) / 6, torch.randn(sum(ranks), N, generator=g) / 6
    dy, sc = torch.randn(sum(segs), N, generator=g), [2.0, 1.0, 0.5]
    ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy)
    im = make_impl("grouped", W, A, B, segs, ranks, sc, 0.0)
    assert im.implementation.startswith("grouped[")
    dx, dA3, dB3 = im.step(*im.inputs(x, dy))
    dA, dB = gp.packed_grads(dA3, dB3, ranks)
    for got, want in ((dx, ref["dx"]), (dA, ref["dA"]), (dB, ref["dB"])):
        assert (got.double() - want).abs().max() <= 2e-5 * want.abs().max() + 1e-6
