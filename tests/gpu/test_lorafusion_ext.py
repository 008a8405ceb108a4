"""LoRAFusion's own kernels (profiler/kernels/lorafusion_ext.py) against the float64 reference, on
the CPU under TRITON_INTERPRET=1 (fp32: the interpreter mishandles bf16 dots). Their source is not
in the repository: these tests skip unless profiler/fetch_lorafusion.sh has copied it to
.ext/lorafusion (or env TLORA_LORAFUSION names it)."""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tlora_sim.profiler.kernels import lorafusion_ext as lf  # noqa: E402
from tlora_sim.profiler.kernels.reference import reference_forward_backward  # noqa: E402

needs_src = pytest.mark.skipif(not lf.lorafusion_available(),
                               reason=f"LoRAFusion source absent under {lf.source_dir()} "
                                      "(run profiler/fetch_lorafusion.sh; CI has no network)")
needs_interp = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                  reason="needs TRITON_INTERPRET=1 on the CPU (or a GPU)")


def _ref_masked(x, W, A, B, segs, ranks, scales, dy, f):
    """Float64 multi-LoRA forward/backward with an explicit dropout factor f (M, K) = keep / (1 - p)
    (Hu et al. 2021 eq. 3)."""
    X, Wd, Ad, Bd, DY = (t.detach().double() for t in (x, W, A, B, dy))
    f = f.double()
    y, dx = X @ Wd.t(), DY @ Wd
    dA, dB = torch.zeros_like(Ad), torch.zeros_like(Bd)
    s0 = r0 = 0
    for L, r, s in zip(segs, ranks, scales):
        Xd = X[s0:s0 + L] * f[s0:s0 + L]
        Ai, Bi = Ad[r0:r0 + r], Bd[r0:r0 + r]
        P = Xd @ Ai.t()
        y[s0:s0 + L] += s * P @ Bi
        Q = s * DY[s0:s0 + L] @ Bi.t()
        dx[s0:s0 + L] += (Q @ Ai) * f[s0:s0 + L]
        dA[r0:r0 + r] = Q.t() @ Xd
        dB[r0:r0 + r] = s * P.t() @ DY[s0:s0 + L]
        s0, r0 = s0 + L, r0 + r
    return {"y": y, "dx": dx, "dA": dA, "dB": dB}


def _run(segs, ranks, scales, p, K=64, N=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    M = sum(segs)
    x = torch.randn(M, K, generator=g).requires_grad_(True)
    W = torch.randn(N, K, generator=g) / K ** 0.5
    A = (torch.randn(sum(ranks), K, generator=g) / K ** 0.5).requires_grad_(True)
    Bp = torch.randn(sum(ranks), N, generator=g) * 0.1
    Bl = [b.requires_grad_(True) for b in lf.lorafusion_b_layout(Bp, ranks)]
    dy = torch.randn(M, N, generator=g)
    plan = lf.LoRAFusionPlan(segs, ranks, scales, p, K, N, "cpu", torch.float32)
    y = lf.lorafusion_multi_lora_linear(x, W, A, Bl, plan, seed=seed + 11)
    gx, gA, *gB = torch.autograd.grad(y, [x, A, *Bl], dy)
    return plan, (x, W, A, Bp, dy), {"y": y, "dx": gx, "dA": gA, "dB": lf.packed_b_grad(gB)}


def _close(got, ref, tol=2e-5):
    for k in ("y", "dx", "dA", "dB"):
        err = (got[k].double() - ref[k]).abs().max().item()
        scale = ref[k].abs().max().item() + 1e-12
        assert err <= tol * scale + 1e-6, (k, err, scale)


@needs_src
@needs_interp
def test_matches_float64_reference_without_dropout():
    segs, ranks, scales = [128, 256, 128], [16, 8, 4], [2.0, 0.5, 1.5]
    _, (x, W, A, Bp, dy), got = _run(segs, ranks, scales, 0.0)
    _close(got, reference_forward_backward(x, W, A, Bp, segs, ranks, scales, dy))


@needs_src
@needs_interp
def test_dropout_and_repadded_segments_match_reference():
    segs, ranks, scales = [100, 160, 37], [32, 16, 2], [2.0, 1.0, 0.25]   # not multiples of 128
    plan, (x, W, A, Bp, dy), got = _run(segs, ranks, scales, 0.25, seed=3)
    assert plan.needs_pad and "+pad" in plan.implementation()
    keep = lf.lorafusion_keep_mask(plan, 3 + 11)
    assert 0.6 < keep.float().mean().item() < 0.9  # p = 0.25 drops about a quarter
    _close(got, _ref_masked(x, W, A, Bp, segs, ranks, scales, dy, keep.double() / 0.75))


@needs_src
@needs_interp
def test_per_adapter_dropout_uses_their_blocked_kernel():
    segs, ranks, scales = [128, 128], [16, 16], [1.0, 2.0]
    g = torch.Generator().manual_seed(5)
    K, N = 64, 32
    x = torch.randn(256, K, generator=g).requires_grad_(True)
    W = torch.randn(N, K, generator=g) / 8
    A = (torch.randn(32, K, generator=g) / 8).requires_grad_(True)
    Bp = torch.randn(32, N, generator=g) * 0.1
    Bl = [b.requires_grad_(True) for b in lf.lorafusion_b_layout(Bp, ranks)]
    dy = torch.randn(256, N, generator=g)
    plan = lf.LoRAFusionPlan(segs, ranks, scales, [0.0, 0.5], K, N, "cpu", torch.float32)
    assert plan.same_p is None
    y = lf.lorafusion_multi_lora_linear(x, W, A, Bl, plan, seed=9)
    gx, gA, *gB = torch.autograd.grad(y, [x, A, *Bl], dy)
    keep = lf.lorafusion_keep_mask(plan, 9)
    assert keep[:128].all() and 0.3 < keep[128:].float().mean().item() < 0.7
    # per-adapter p: adapter 0 undropped, adapter 1 with p = 0.5 (keep / (1 - p) per block)
    f = torch.ones(256, K, dtype=torch.float64)
    f[128:] = keep[128:].double() / 0.5
    ref = _ref_masked(x, W, A, Bp, segs, ranks, scales, dy, f)
    _close({"y": y, "dx": gx, "dA": gA, "dB": lf.packed_b_grad(gB)}, ref)


@needs_src
def test_unrunnable_mixes_raise_not_implemented():
    for ranks in ([8, 4], [2], [24, 16]):  # largest rank below 16 / not a power of two
        with pytest.raises(NotImplementedError):
            lf.LoRAFusionPlan([128] * len(ranks), ranks, [1.0] * len(ranks), 0.1, 64, 64, "cpu", torch.float32)


@needs_src
def test_stage_count_fits_shared_memory():
    hw = lf.load_lorafusion()["config"].H100_CONFIG.fused_multi_lora_xw_sb
    got = {r: lf.stage_count(hw, r) for r in (16, 32, 64, 128)}
    assert got == {16: 4, 32: 4, 64: 3, 128: 2}
    assert all(lf.smem_estimate(hw, r, s) <= lf.SMEM_BYTES for r, s in got.items())
    assert lf.smem_estimate(hw, 64, 4) > lf.SMEM_BYTES  # their shipped 4 stages overflow at rank 64
    with pytest.raises(NotImplementedError):
        lf.stage_count(hw, 256)


def test_available_is_false_for_a_missing_source(monkeypatch, tmp_path):
    monkeypatch.setenv(lf.ENV, str(tmp_path / "nowhere"))
    monkeypatch.setattr(lf, "_MODS", {})
    assert lf.lorafusion_available() is False
    assert lf.source_sha() == "unknown"


@needs_src
@needs_interp
def test_bench_impl_computes_the_same_function():
    """``bench/kernels.py``'s ``lorafusion`` (baselines.LoRAFusionImpl), an empty segment included."""
    from tlora_sim.profiler.kernels.baselines import make_impl

    g = torch.Generator().manual_seed(21)
    segs, ranks, K, N = [130, 0, 100], [16, 8, 4], 32, 40
    x, W = torch.randn(sum(segs), K, generator=g), torch.randn(N, K, generator=g) / 6
    A, B = torch.randn(sum(ranks), K, generator=g) / 6, torch.randn(sum(ranks), N, generator=g) / 6
    dy, sc = torch.randn(sum(segs), N, generator=g), [2.0, 1.0, 0.5]
    ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy)
    im = make_impl("lorafusion", W, A, B, segs, ranks, sc, 0.0)
    assert im.implementation.startswith("lorafusion@") and "+pad" in im.implementation
    dx, dA, *dB = im.step(*im.inputs(x, dy))
    _close({"y": ref["y"], "dx": dx, "dA": dA, "dB": lf.packed_b_grad(dB)}, ref)
    with pytest.raises(NotImplementedError):
        make_impl("lorafusion", W, A, B, segs, [8, 4, 2], sc, 0.0)
