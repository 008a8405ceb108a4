"""``KernelConfig.overlap`` (profiler/KERNELS.md, session 21): cuBLAS runs both base GEMMs with
beta = 0 while ``_f1`` and ``_b1`` + ``_b2``'s dA run on a side stream, then ``_f2`` adds s P B
onto Y and ``_b2`` (``WRITE_DX`` 2) the masked Q A onto dX. Whole training steps (y, dX, dA,
dB) against the float64 reference and against the default path, over several steps of one plan.

CPU through Triton's interpreter (``TRITON_INTERPRET=1``, set here when no GPU is visible: the
launches then run in order on one stream), on a GPU otherwise (two streams, the carve-out).
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from tlora_sim.profiler.kernels import (KernelConfig, build_plan, multi_lora_linear,  # noqa: E402
                                        reference_forward_backward)
from tlora_sim.profiler.kernels.program import ForwardProgram  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
F32_TOL = 1e-4 if DEV == "cpu" else 1e-3
SAME_TOL = 1e-5 if DEV == "cpu" else 1e-3   # against the default path (fp32 sums' order)
BASE = KernelConfig(bk=32, bn=32)           # several K / N blocks at these sizes
OVER = KernelConfig(bk=32, bn=32, overlap=0)
OVER8 = KernelConfig(bk=32, bn=32, overlap=8)   # 8 SMs held back from cuBLAS (none on the CPU)

MIXES = [([37, 0, 64, 5], [3, 8, 20, 130], 96, 80),       # odd tokens, an empty adapter
         ([1, 70], [256, 1], 64, 72),
         ([9, 31, 70, 2, 11], [16, 17, 64, 65, 128], 40, 100)]


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def _inputs(seed, segs, ranks, K, N):
    g = torch.Generator().manual_seed(seed)
    M, R = sum(segs), sum(ranks)
    t = [torch.randn(M, K, generator=g), torch.randn(N, K, generator=g) / K ** 0.5,
         torch.randn(R, K, generator=g) / K ** 0.5, torch.randn(R, N, generator=g),
         torch.randn(M, N, generator=g), torch.randn(N, generator=g)]
    scales = (0.5 + torch.rand(len(ranks), generator=g) * 2).tolist()
    return [v.to(DEV) for v in t], scales


def _step(x, W, A, B, dy, plan, seed, bias=None, need_x=True):
    xx = x.clone().requires_grad_(need_x)
    AA, BB = A.clone().requires_grad_(True), B.clone().requires_grad_(True)
    y = multi_lora_linear(xx, W, AA, BB, plan, bias=bias, seed=seed, dropout_on=True)
    grads = torch.autograd.grad(y, ([xx] if need_x else []) + [AA, BB], dy)
    out = dict(zip((["dx"] if need_x else []) + ["dA", "dB"], grads))
    out["y"] = y
    return out


@pytest.mark.parametrize("p,cfg,bias", [(0.0, OVER, False), (0.25, OVER, True),
                                        (0.25, OVER8, False)])
@pytest.mark.parametrize("mix", range(len(MIXES)))
def test_overlapped_steps_match_reference_and_default_path(mix, p, cfg, bias):
    """Three steps of one plan (new seeds): y, dX, dA, dB match the float64 reference and the
    default path; the programs took the overlapped launches (cuBLAS, no ``_tiny`` path)."""
    segs, ranks, K, N = MIXES[mix]
    (x, W, A, B, dy, b), sc = _inputs(2100 + mix, segs, ranks, K, N)
    b = b if bias else None
    plan = build_plan(segs, ranks, sc, p, K, N, DEV, cfg, n_sm=8)
    base = build_plan(segs, ranks, sc, p, K, N, DEV, BASE, n_sm=8)
    for step, seed in enumerate((5, 6, 7)):
        ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=p, seed=seed,
                                         bias=b)
        got, old = _step(x, W, A, B, dy, plan, seed, b), _step(x, W, A, B, dy, base, seed, b)
        for k in ("y", "dx", "dA", "dB"):
            assert _rel(got[k], ref[k]) < F32_TOL, (step, k)
            assert _rel(got[k], old[k]) < SAME_TOL, (step, k)
    fwd = [v for v in plan.extra.values() if isinstance(v, ForwardProgram)]
    assert fwd and all(f.side is not None and f.gc is None and f.tiny is None for f in fwd)
    bwd = [v for f in fwd for v in f.bwd.values()]
    assert bwd and all(v.side is not None and v.b2x is not None for v in bwd)


def test_without_dx_the_backward_is_the_default_one():
    """With X frozen (no dX) there is no base GEMM in the backward to run beside: the overlapped
    plan's backward is the default four-launch one and its dA, dB match the reference."""
    segs, ranks, K, N = MIXES[0]
    (x, W, A, B, dy, _), sc = _inputs(2150, segs, ranks, K, N)
    plan = build_plan(segs, ranks, sc, 0.25, K, N, DEV, OVER, n_sm=8)
    ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=0.25, seed=9)
    got = _step(x, W, A, B, dy, plan, 9, need_x=False)
    for k in ("y", "dA", "dB"):
        assert _rel(got[k], ref[k]) < F32_TOL, k
    bwd = [v for f in plan.extra.values() if isinstance(f, ForwardProgram) for v in f.bwd.values()]
    assert bwd and all(v.side is None and v.b2x is None for v in bwd)
