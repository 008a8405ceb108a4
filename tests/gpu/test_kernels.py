"""Correctness of the fused multi-LoRA kernels (profiler/kernels) against a float64 reference.

Runs on the CPU through Triton's interpreter (``TRITON_INTERPRET=1``, set here when no GPU is
visible), on a GPU otherwise. Every case draws fresh random inputs from its own fixed-seed
generator. Tolerances (relative Frobenius error, /work/.library/device/METHOD.md): float32
1e-4 (CPU interpreter), bf16 2e-2.
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from tlora_sim.profiler.kernels import (KernelConfig, MultiLoRALinear, build_plan,  # noqa: E402
                              dropout_keep_mask_triton, keep_mask, multi_lora_linear,
                              reference_forward_backward)
from tlora_sim.profiler.kernels.baselines import make_impl  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
F32_TOL = 1e-4 if DEV == "cpu" else 1e-3   # GPU fp32 runs the dots in "ieee" mode
BF16_TOL = 2e-2


def _rel(a, b):
    a, b = a.detach(), b.detach().double()
    den = b.norm()
    return float((a.double() - b).norm() / (den if den > 0 else 1.0))


def _inputs(gen, segs, ranks, K, N, dtype=torch.float32):
    M, R = sum(segs), sum(ranks)
    x = torch.randn(M, K, generator=gen).to(dtype)
    W = (torch.randn(N, K, generator=gen) / K ** 0.5).to(dtype)
    A = (torch.randn(R, K, generator=gen) / K ** 0.5).to(dtype)
    B = torch.randn(R, N, generator=gen).to(dtype)       # LoRA term as large as the base term
    dy = torch.randn(M, N, generator=gen).to(dtype)
    scales = (0.5 + torch.rand(len(ranks), generator=gen) * 2).tolist()
    return [t.to(DEV) for t in (x, W, A, B, dy)], scales


def _run(x, W, A, B, dy, plan, seed=0, bias=None, dropout_on=True):
    xx, AA, BB = (t.clone().requires_grad_(True) for t in (x, A, B))
    y = multi_lora_linear(xx, W, AA, BB, plan, bias=bias, seed=seed, dropout_on=dropout_on)
    gx, gA, gB = torch.autograd.grad(y, [xx, AA, BB], dy)
    return {"y": y, "dx": gx, "dA": gA, "dB": gB}


def _check(out, ref, tol):
    for k in ("y", "dx", "dA", "dB"):
        assert torch.isfinite(out[k]).all(), k
        err = _rel(out[k], ref[k])
        assert err < tol, f"{k}: relative error {err:.2e} >= {tol:.0e}"


def _random_mix(gen, n_max=5, r_max=256, L_max=150):
    n = int(torch.randint(1, n_max + 1, (), generator=gen))
    ranks = [int(torch.randint(1, r_max + 1, (), generator=gen)) for _ in range(n)]
    segs = [int(torch.randint(0, L_max + 1, (), generator=gen)) for _ in range(n)]
    if sum(segs) == 0:
        segs[0] = 1
    K = int(torch.randint(16, 161, (), generator=gen))
    N = int(torch.randint(16, 161, (), generator=gen))
    return segs, ranks, K, N


CFG_NOSPLIT = KernelConfig(waves=0.01)                       # one program per tile: no splits
CFG_SPLIT = KernelConfig(bk=32, bn=32, waves=16, bms=(32, 64, 32, 64, 32),  # many K/N splits,
                         cms=(2, 1, 2, 1, 2))                  # wide dA/dB column tiles too


@pytest.mark.parametrize("case", range(6))
def test_random_mixes_match_float64(case):
    gen = torch.Generator().manual_seed(1000 + case)
    segs, ranks, K, N = _random_mix(gen)
    (x, W, A, B, dy), sc = _inputs(gen, segs, ranks, K, N)
    cfg = CFG_SPLIT if case % 2 else CFG_NOSPLIT
    plan = build_plan(segs, ranks, sc, 0.0, K, N, DEV, cfg)
    if case % 2:
        assert plan.ksplit > 1 or plan.nsplit > 1 or plan.n_chunks > len(segs)
    ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy)
    _check(_run(x, W, A, B, dy, plan), ref, F32_TOL)


@pytest.mark.parametrize("segs,ranks,K,N", [
    ([1], [1], 16, 16),                                 # rank 1, one token
    ([37, 0, 100, 64], [1, 8, 20, 70], 96, 80),         # empty segment, odd lengths
    ([0, 129, 0], [256, 3, 16], 40, 72),                # empty first/last, rank 256 unused
    ([65, 130], [256, 128], 48, 24),                    # the two largest buckets, K, N % 16 != 0
    ([5, 7, 11, 13, 17], [2, 4, 33, 64, 65], 130, 33),  # one adapter per bucket boundary
])
def test_edge_mixes_match_float64(segs, ranks, K, N):
    gen = torch.Generator().manual_seed(sum(segs) * 7 + K)
    (x, W, A, B, dy), sc = _inputs(gen, segs, ranks, K, N)
    plan = build_plan(segs, ranks, sc, 0.0, K, N, DEV, CFG_SPLIT)
    ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy)
    _check(_run(x, W, A, B, dy, plan), ref, F32_TOL)


def test_all_segments_empty():
    gen = torch.Generator().manual_seed(5)
    (x, W, A, B, dy), sc = _inputs(gen, [0, 0], [4, 8], 32, 48)
    plan = build_plan([0, 0], [4, 8], sc, 0.1, 32, 48, DEV)
    out = _run(x, W, A, B, dy, plan)
    assert out["y"].shape == (0, 48) and out["dx"].shape == (0, 32)
    assert torch.count_nonzero(out["dA"]) == 0 and torch.count_nonzero(out["dB"]) == 0


@pytest.mark.parametrize("p,seed", [(0.1, 3), (0.5, 11)])
def test_dropout_matches_reference_with_same_mask(p, seed):
    gen = torch.Generator().manual_seed(int(p * 100) + seed)
    segs, ranks, K, N = [50, 0, 77, 33], [8, 4, 40, 1], 72, 56
    (x, W, A, B, dy), sc = _inputs(gen, segs, ranks, K, N)
    plan = build_plan(segs, ranks, sc, p, K, N, DEV, CFG_SPLIT)
    ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=p, seed=seed)
    _check(_run(x, W, A, B, dy, plan, seed=seed), ref, F32_TOL)
    # the kernels' own mask equals the torch rebuild, and keeps about 1 - p of the elements
    m_tr = dropout_keep_mask_triton(sum(segs), K, seed, p, DEV).bool().cpu()
    m_pt = keep_mask(sum(segs), K, seed, p)
    assert torch.equal(m_tr, m_pt)
    assert abs(m_pt.float().mean().item() - (1 - p)) < 0.03
    # a wrong mask (another seed) does not match: the test can fail
    other = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=p, seed=seed + 1)
    assert _rel(ref["y"], other["y"]) > 10 * F32_TOL


def test_keep_mask_statistics():
    m = keep_mask(512, 512, seed=42, p=0.1)
    assert abs(m.float().mean().item() - 0.9) < 0.005
    assert not torch.equal(m, keep_mask(512, 512, seed=43, p=0.1))
    # rows and columns look independent: no column or row is (nearly) all kept/dropped
    assert m.float().mean(0).min() > 0.75 and m.float().mean(1).min() > 0.75
    assert keep_mask(64, 64, seed=1, p=0.0).all()


def test_per_adapter_dropout_and_eval_mode():
    gen = torch.Generator().manual_seed(77)
    segs, ranks, K, N = [20, 30, 40], [4, 16, 8], 64, 48
    (x, W, A, B, dy), sc = _inputs(gen, segs, ranks, K, N)
    ps = [0.0, 0.25, 0.6]
    plan = build_plan(segs, ranks, sc, ps, K, N, DEV)
    ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=ps, seed=9)
    _check(_run(x, W, A, B, dy, plan, seed=9), ref, F32_TOL)
    ref0 = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy)
    _check(_run(x, W, A, B, dy, plan, seed=9, dropout_on=False), ref0, F32_TOL)


def test_module_3d_input_bias_and_init():
    gen = torch.Generator().manual_seed(8)
    torch.manual_seed(8)
    mod = MultiLoRALinear(40, 24, ranks=[2, 16, 5], alphas=[4, 16, 10], dropout=0.0, bias=True,
                          dtype=torch.float32, device=DEV)
    with torch.no_grad():
        mod.bias.normal_()
    x = torch.randn(2, 35, 40, generator=gen).to(DEV)
    segs = [30, 0, 40]
    # fresh adapters: B = 0, so the layer is the base Linear
    base = torch.nn.functional.linear(x, mod.weight, mod.bias)
    assert _rel(mod(x, seg_lens=segs), base) < F32_TOL
    with torch.no_grad():
        mod.lora_B.normal_(generator=None)
    x2 = x.clone().requires_grad_(True)
    y = mod(x2, seg_lens=segs)
    assert y.shape == (2, 35, 24)
    dy = torch.randn(2, 35, 24, generator=gen).to(DEV)
    y.backward(dy)
    ref = reference_forward_backward(x.reshape(70, 40), mod.weight, mod.lora_A, mod.lora_B,
                                     segs, mod.ranks, mod.scales, dy.reshape(70, 24),
                                     bias=mod.bias)
    assert mod.scales == (2.0, 1.0, 2.0)
    assert _rel(y.reshape(70, 24), ref["y"]) < F32_TOL
    assert _rel(x2.grad.reshape(70, 40), ref["dx"]) < F32_TOL
    assert _rel(mod.lora_A.grad, ref["dA"]) < F32_TOL
    assert _rel(mod.lora_B.grad, ref["dB"]) < F32_TOL
    assert mod.weight.grad is None and mod.bias.grad is None


def test_errors():
    with pytest.raises(ValueError):
        build_plan([4], [0], [1.0], 0.0, 16, 16, "cpu")
    with pytest.raises(ValueError):
        build_plan([4], [257], [1.0], 0.0, 16, 16, "cpu")
    with pytest.raises(ValueError):
        build_plan([4, 4], [8], [1.0], 0.0, 16, 16, "cpu")
    with pytest.raises(ValueError):
        build_plan([-1], [8], [1.0], 0.0, 16, 16, "cpu")
    with pytest.raises(ValueError):
        build_plan([4], [8], [1.0], 1.0, 16, 16, "cpu")
    with pytest.raises(ValueError):
        MultiLoRALinear(16, 16, ranks=[])
    mod = MultiLoRALinear(16, 8, ranks=[4, 4], dtype=torch.float32, device=DEV)
    with pytest.raises(ValueError):
        mod(torch.randn(10, 16, device=DEV), seg_lens=[4, 4])     # segments cover 8 of 10
    with pytest.raises(ValueError):
        mod(torch.randn(10, 16, device=DEV))                      # no segments set
    with pytest.raises(ValueError):
        mod(torch.randn(8, 12, device=DEV), seg_lens=[4, 4])      # wrong in_features


@pytest.mark.parametrize("impl", ["loop", "padded", "alone", "fused"])
def test_baselines_compute_the_same_function(impl):
    gen = torch.Generator().manual_seed(21)
    for segs in ([24, 24, 24], [10, 0, 31]):
        ranks, K, N = [2, 8, 5], 32, 40
        (x, W, A, B, dy), sc = _inputs(gen, segs, ranks, K, N)
        ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy)
        im = make_impl(impl, W, A, B, segs, ranks, sc, 0.0)
        args = im.inputs(x, dy)
        grads = im.step(*args)
        if impl in ("loop", "fused"):
            assert _rel(grads[0], ref["dx"]) < F32_TOL
        elif impl == "alone":
            live = [i for i, L in enumerate(segs) if L]
            dx = torch.cat([grads[3 * j] for j in range(len(live))])
            assert _rel(dx, ref["dx"]) < F32_TOL
            for j, i in enumerate(live):
                o = sum(ranks[:i])
                assert _rel(grads[3 * j + 1], ref["dA"][o:o + ranks[i]]) < F32_TOL
                assert _rel(grads[3 * j + 2].t(), ref["dB"][o:o + ranks[i]]) < F32_TOL
        else:  # padded: dA, dB padded to the largest rank, zero beyond each rank
            assert _rel(grads[0], ref["dx"]) < F32_TOL
            for i, r in enumerate(ranks):
                o = sum(ranks[:i])
                assert _rel(grads[1][i, :r], ref["dA"][o:o + r]) < F32_TOL
                assert torch.count_nonzero(grads[1][i, r:]) == 0
                assert _rel(grads[2][i, :, :r].t(), ref["dB"][o:o + r]) < F32_TOL


def test_bf16_matches_float64():
    gen = torch.Generator().manual_seed(16)
    segs, ranks, K, N = [40, 70], [16, 64], 64, 48
    (x, W, A, B, dy), sc = _inputs(gen, segs, ranks, K, N, dtype=torch.bfloat16)
    plan = build_plan(segs, ranks, sc, 0.2, K, N, DEV)
    ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=0.2, seed=4)
    out = _run(x, W, A, B, dy, plan, seed=4)
    assert out["y"].dtype == torch.bfloat16 and out["dA"].dtype == torch.bfloat16
    _check(out, ref, BF16_TOL)


def test_property_random_mixes_hypothesis():
    hyp = pytest.importorskip("hypothesis")
    st = pytest.importorskip("hypothesis.strategies")

    @hyp.settings(max_examples=4, deadline=None, derandomize=True)
    @hyp.given(st.lists(st.tuples(st.integers(1, 130), st.integers(0, 90)), min_size=1,
                        max_size=4),
               st.integers(16, 100), st.integers(16, 100), st.sampled_from([0.0, 0.3]),
               st.integers(0, 2 ** 31 - 2))
    def prop(adapters, K, N, p, seed):
        ranks = [r for r, _ in adapters]
        segs = [L for _, L in adapters]
        gen = torch.Generator().manual_seed(seed)
        (x, W, A, B, dy), sc = _inputs(gen, segs, ranks, K, N)
        plan = build_plan(segs, ranks, sc, p, K, N, DEV, CFG_SPLIT)
        ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=p, seed=seed)
        _check(_run(x, W, A, B, dy, plan, seed=seed), ref, F32_TOL)

    prop()


def test_k_split_workspace_is_left_zeroed_across_steps():
    """_f1's K splits add into a workspace that the last split of each tile zeroes again: three
    consecutive steps (dropout on, new seeds) each match the reference, and the workspace and
    the per-tile counters are zero after each."""
    segs, ranks, K, N = [70, 0, 41], [5, 64, 130], 96, 40
    gen = torch.Generator().manual_seed(77)
    (x, W, A, B, dy), sc = _inputs(gen, segs, ranks, K, N)
    plan = build_plan(segs, ranks, sc, 0.2, K, N, DEV, CFG_SPLIT)
    assert plan.ksplit > 1
    for seed in (1, 2, 3):
        ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=0.2, seed=seed)
        _check(_run(x, W, A, B, dy, plan, seed=seed), ref, F32_TOL)
        progs = [v for k, v in plan.extra.items() if k[0] == "fwdprog"]
        assert progs and all(int(p.cnt.abs().sum()) == 0 for p in progs)
        assert all(float(p.pacc.abs().sum()) == 0.0 for p in progs)



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grad_blocks_single_and_multi_chunk_across_steps(dtype):
    """dA/dB go straight into the gradients: adapters with one token chunk store their blocks,
    adapters with several add into a workspace that ``_gfin`` converts and zeroes again
    (``lora_kernels._grad_out``). Three steps (new seeds) each match the float64 reference,
    the empty adapter's gradients are exactly zero, and workspace and counters are zero after
    each step."""
    segs, ranks, K, N = [300, 0, 41, 129], [5, 64, 130, 17], 96, 72
    gen = torch.Generator().manual_seed(78)
    (x, W, A, B, dy), sc = _inputs(gen, segs, ranks, K, N, dtype)
    plan = build_plan(segs, ranks, sc, 0.2, K, N, DEV, CFG_SPLIT)
    nch = plan.meta_i[:, 7].tolist()
    assert nch[1] == 0 and nch[2] == 1 and nch[0] > 1 and nch[3] > 1
    for seed in (1, 2, 3):
        ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=0.2, seed=seed)
        out = _run(x, W, A, B, dy, plan, seed=seed)
        _check(out, ref, F32_TOL if dtype == torch.float32 else BF16_TOL)
        assert out["dA"].dtype == dtype and out["dB"].dtype == dtype
        assert not out["dA"][5:69].any() and not out["dB"][5:69].any()   # the empty adapter
        progs = [p for k, v in plan.extra.items() if k[0] == "fwdprog" for p in v.bwd.values()]
        assert progs and all(float(p.gacc.abs().sum()) == 0.0 for p in progs)
        assert all(p.gacc.numel() == plan.sum_r * (K + N) for p in progs)


def test_rank64_tiles_and_chunk_granularity():
    """Defaults of session 17 (profiler/KERNELS.md): rank-64 adapters get token tiles of 64 rows
    (64x8 at 4,096 tokens: 64 tiles), while token chunks stay multiples of ``chunk_gran`` = 128
    rows, so that 8-128x8 (1,024 tokens an adapter) keeps one chunk per adapter and no ``_gfin``
    pass; with chunks of 64-row granularity it got two."""
    cfg = KernelConfig()
    assert cfg.bms[2] == 64 and cfg.chunk_gran == 128
    mix = ([1024] * 8, [8, 16, 32, 64, 128, 16, 8, 32])
    plan = build_plan(*mix, [1.0] * 8, 0.1, 4096, 4096, "cpu", cfg, n_sm=132)
    assert plan.nch == (1,) * 8
    fine = build_plan(*mix, [1.0] * 8, 0.1, 4096, 4096, "cpu", KernelConfig(chunk_gran=64),
                      n_sm=132)
    assert fine.nch == (2,) * 8
    p64 = build_plan([512] * 8, [64] * 8, [1.0] * 8, 0.1, 4096, 4096, "cpu", cfg, n_sm=132)
    assert p64.n_tiles == 64 and p64.nch == (1,) * 8
