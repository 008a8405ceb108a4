"""``_gfin``'s pass done inside the persistent backward GEMM by its programs that have no tile in
the last round (``lora_gemm._bound_persist``, GFIN; profiler/KERNELS.md, session 18), and the
backward's cuBLAS rule (``KernelConfig.bwd_cublas``).

CPU through Triton's interpreter (``TRITON_INTERPRET=1``, 4 persistent programs); fresh random
inputs per case from a fixed-seed generator, against the float64 reference.
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
from tlora_sim.profiler.kernels.config import GemmConfig  # noqa: E402
from tlora_sim.profiler.kernels.lora_gemm import (GF_BLOCK, choose_gemm,  # noqa: E402
                                                  gfin_first, gfin_items)
from tlora_sim.profiler.kernels.program import ForwardProgram  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
TOL = 1e-4 if DEV == "cpu" else 1e-3


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def test_idle_programs_of_the_last_round():
    """512 tiles on 132 SMs: programs 116-131 have no tile in the 4th round; 576 (tail split of
    48 tiles, two programs each): 96-131; whole rounds or one round: none."""
    gc = GemmConfig(bm=128, bn=256, bk=64, persistent=True, split=2, lora_first=True)
    assert gfin_first(gc, 512, 132) == 116
    assert gfin_first(gc, 576, 132) == 96
    assert gfin_first(GemmConfig(persistent=True, lora_first=True, tail_split=False), 576,
                      132) == 48
    assert gfin_first(gc, 528, 132) is None and gfin_first(gc, 100, 132) is None


def test_gfin_items_cover_the_multi_chunk_rows():
    """Items cover exactly the dA and dB rows of adapters with several token chunks, in runs of
    at most GF_BLOCK elements that stay inside one adapter's rows."""
    plan = build_plan([300, 100, 200], [8, 16, 40], [1.0] * 3, 0.1, 64, 96, "cpu")
    assert plan.nch == (3, 1, 2)
    items, n = gfin_items(plan, "cpu")
    want = set()
    for i in (0, 2):
        ro, r = plan.roffs[i], plan.ranks[i]
        want |= {("a", e) for e in range(ro * 64, (ro + r) * 64)}
        want |= {("b", e) for e in range(ro * 96, (ro + r) * 96)}
    got = set()
    for g0, d0, k, isb in items[:n].tolist():
        base = plan.sum_r * 64 if isb else 0
        assert g0 - base == d0 and 0 < k <= GF_BLOCK and k % 8 == 0
        got |= {("b" if isb else "a", d0 + e) for e in range(k)}
    assert got == want


@pytest.mark.parametrize("tail", [True, False])
@pytest.mark.parametrize("p", [0.0, 0.25])
def test_gfin_in_the_gemm_matches_reference_and_keeps_workspace_zero(tail, p):
    """Two adapters of 3 and 2 token chunks (dA/dB through the workspace), 17 row tiles on 4
    programs: with the tail split programs 2-3 have no tile in the last round, without it 1-3;
    they convert the workspace. Two steps of one plan match the float64 reference, the
    workspace is zero after each, ``_gfin`` never launched, and the gradients equal those of
    the same plan with the pass launched on its own (``gfin_fold_bytes`` 0)."""
    segs, ranks, K, N = [300, 200], [8, 40], 64, 96
    g = torch.Generator().manual_seed(1800 + int(tail) + int(4 * p))
    t = dict(x=torch.randn(500, K, generator=g), W=torch.randn(N, K, generator=g) / K ** 0.5,
             A=torch.randn(48, K, generator=g) / K ** 0.5, B=torch.randn(48, N, generator=g),
             dy=torch.randn(500, N, generator=g))
    t = {k: v.to(DEV) for k, v in t.items()}
    scales = [0.5, 1.5]
    gc = GemmConfig(bm=32, bn=64, bk=32, group_m=2, persistent=True, split=2, lora_first=True,
                    tail_split=tail)
    ref = reference_forward_backward(t["x"], t["W"], t["A"], t["B"], segs, ranks, scales,
                                     t["dy"], dropout=p, seed=9)
    outs = {}
    for fold in (True, False):
        cfg = KernelConfig(base_gemm="triton", gemm_fwd=gc, gemm_bwd=gc,
                           gfin_fold_bytes=1_600_000 if fold else 0)
        plan = build_plan(segs, ranks, scales, p, K, N, DEV, cfg)
        assert plan.nch == (3, 2)
        for _ in range(2):
            x = t["x"].clone().requires_grad_(True)
            A = t["A"].clone().requires_grad_(True)
            B = t["B"].clone().requires_grad_(True)
            y = multi_lora_linear(x, t["W"], A, B, plan, None, seed=9)
            got = (y, *torch.autograd.grad(y, [x, A, B], t["dy"]))
            for name, v in zip(("y", "dx", "dA", "dB"), got):
                assert _rel(v, ref[name]) < TOL, (fold, name)
            bprogs = [b for f in plan.extra.values() if isinstance(f, ForwardProgram)
                      for b in f.bwd.values()]
            assert len(bprogs) == 1 and bprogs[0].gfin is not None
            assert int(bprogs[0].gacc.abs().sum()) == 0          # zero again for the next step
            launched = bprogs[0].gfin.n_normal + bprogs[0].gfin.n_direct
            assert (launched == 0) == fold, launched
        outs[fold] = got
    for a, b in zip(outs[True], outs[False]):
        assert _rel(a, b) < 1e-6


def test_bwd_cublas_rule():
    """``bwd_cublas``: "table" keeps the table's persistent backward, "tail" gives it to cuBLAS
    only where our GEMM would split its last round (4 programs off CUDA: 17 tiles, a tail of 1;
    16 tiles, none), "always" everywhere; the forward keeps the table's choice."""
    ent = {"impl": "triton", "min_tokens": 0,
           "config": dict(bm=32, bn=64, bk=32, persistent=True, split=2, lora_first=True)}
    table = {"cpu": {"fwd|64|96": ent, "bwd|64|96": ent}}
    for segs, rule, want in (([300, 200], "table", True), ([300, 200], "tail", False),
                             ([256, 256], "tail", True), ([256, 256], "always", False)):
        assert KernelConfig().bwd_cublas == "tail"
        cfg = KernelConfig(bwd_cublas=rule)
        plan = build_plan(segs, [8, 40], [1.0, 1.0], 0.1, 64, 96, "cpu", cfg)
        assert (choose_gemm(plan, "bwd", "cpu", table=table) is not None) == want, (segs, rule)
        assert choose_gemm(plan, "fwd", "cpu", table=table) is not None
    with pytest.raises(ValueError):
        KernelConfig(bwd_cublas="never")
