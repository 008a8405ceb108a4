"""The two-launch LoRA path at few tokens (``profiler/kernels/tiny.py``; profiler/KERNELS.md,
session 19): its rule (``KernelConfig.tiny_tokens``, ``tiny_plan``) and whole training steps
(y, dX, dA, dB) against the float64 reference and against the four-launch path, over several
steps of one plan (the counters only grow and the fp32 sums alternate between two halves).

CPU through Triton's interpreter (``TRITON_INTERPRET=1``, set here when no GPU is visible: each
kernel then runs as two launches, PHASE 1 and 2), on a GPU otherwise (one launch, the spin-wait).
Fresh random inputs per case from a fixed-seed generator; tolerances as tests/gpu/test_kernels.py.
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
from tlora_sim.profiler.kernels.tiny import (TINY_MAX_RANK, TINY_TOKENS_CUDA,  # noqa: E402
                                              tiny_plan)
from tlora_sim.profiler.kernels.program import ForwardProgram  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
F32_TOL = 1e-4 if DEV == "cpu" else 1e-3
BF16_TOL = 2e-2
SAME_TOL = 1e-5 if DEV == "cpu" else 1e-3   # against the four-launch path (fp32 atomics' order)
TINY = KernelConfig(tiny_tokens=4096, bk=32, bn=32)      # several K / N blocks at these sizes
TINY1 = KernelConfig(tiny_tokens=4096, bk=32, bn=32, tiny_ctas=1)   # session 19's backward rule
# (plans are built for 8 SMs, as off CUDA, so that a GPU run takes the same splits and backwards)
FOUR = KernelConfig(tiny_tokens=0, bk=32, bn=32)


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def _inputs(seed, segs, ranks, K, N, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    M, R = sum(segs), sum(ranks)
    t = [torch.randn(M, K, generator=g), torch.randn(N, K, generator=g) / K ** 0.5,
         torch.randn(R, K, generator=g) / K ** 0.5, torch.randn(R, N, generator=g),
         torch.randn(M, N, generator=g)]
    scales = (0.5 + torch.rand(len(ranks), generator=g) * 2).tolist()
    return [v.to(dtype).to(DEV) for v in t], scales


def _step(x, W, A, B, dy, plan, seed, bias=None, dropout_on=True, need_x=True):
    xx = x.clone().requires_grad_(need_x)
    AA, BB = A.clone().requires_grad_(True), B.clone().requires_grad_(True)
    y = multi_lora_linear(xx, W, AA, BB, plan, bias=bias, seed=seed, dropout_on=dropout_on)
    grads = torch.autograd.grad(y, ([xx] if need_x else []) + [AA, BB], dy)
    out = dict(zip((["dx"] if need_x else []) + ["dA", "dB"], grads))
    out["y"] = y
    return out


def _progs(plan):
    f = [v for v in plan.extra.values() if isinstance(v, ForwardProgram)]
    return f, [b for p in f for b in p.bwd.values()]


def test_rule():
    """-1 (default): never off CUDA (on CUDA up to 512 tokens and rank 64, checked where a GPU
    runs the test); n: up to n tokens, any rank; only with cuBLAS for both base GEMMs and at
    most one row tile per SM; ``_tb`` only where the plan leaves Q unsplit (nsplit 1)."""
    assert KernelConfig().tiny_tokens == -1 and (TINY_TOKENS_CUDA, TINY_MAX_RANK) == (512, 64)

    def mk(segs, cfg):
        return build_plan(segs, [4, 16], [1.0, 1.0], 0.1, 256, 384, "cpu", cfg)

    assert tiny_plan(mk([300, 212], KernelConfig()), "cpu", n_sm=32) is None
    assert tiny_plan(mk([300, 212], KernelConfig(tiny_tokens=512)), "cpu", n_sm=32) is not None
    assert tiny_plan(mk([300, 213], KernelConfig(tiny_tokens=512)), "cpu", n_sm=32) is None
    assert tiny_plan(mk([300, 212], KernelConfig(tiny_tokens=0)), "cpu", n_sm=32) is None
    assert tiny_plan(mk([300, 212], KernelConfig(tiny_tokens=512, base_gemm="triton")),
                     "cpu", n_sm=32) is None
    plan = mk([300, 212], KernelConfig(tiny_tokens=512))   # 5 + 4 row tiles of 64
    assert tiny_plan(plan, "cpu", n_sm=8) is None
    tp = tiny_plan(plan, "cpu", n_sm=27)   # 3 programs a tile: 4 K blocks in 2 splits, 3 N blocks
    assert (tp.fsplit, tp.kb_per, tp.grid_f, tp.nbf_per) == (2, 2, 18, 2)
    assert KernelConfig().tiny_ctas == 2 and tp.ctas == 2 and tp.backward   # two per SM
    assert (tp.bsplit, tp.nbb_per, tp.n_q, tp.n_db, tp.n_xa, tp.grid_b) == (3, 1, 27, 6, 8, 33)
    tp = tiny_plan(plan, "cpu", n_sm=27, ctas=1)   # one per SM: the grid caps the items
    assert (tp.bsplit, tp.nbb_per, tp.n_q, tp.n_db, tp.n_xa, tp.grid_b) == (3, 1, 27, 6, 8, 27)
    assert tp.backward == (plan.nsplit == 1)
    assert not tiny_plan(plan, "cpu", n_sm=27, ctas=0).backward
    tp = tiny_plan(plan, "cpu", n_sm=4, ctas=3)   # more tiles than SMs: one launch per pass only
    assert tp is None                             # where the tiles fit one program per SM
    tp = tiny_plan(plan, "cpu", n_sm=9, ctas=3)   # 27 programs: 3 N splits of Q per tile
    assert (tp.bsplit, tp.n_q, tp.grid_b, tp.n_ad) == (3, 27, 27, 2)
    assert tp.tmeta.shape == (9, 10) and tp.tmeta[:, 0].tolist() == [0] * 5 + [1] * 4
    assert tp.tmeta[:, 3:].tolist() == plan.meta_i[plan.tiles[:, 0].long(), :7].tolist()
    for N, unsplit in ((384, False), (2048, True)):   # 64 dX / dA items, 16 programs
        pl = build_plan([64], [4], [1.0], 0.1, 4096, N, "cpu", KernelConfig(tiny_tokens=512))
        tp = tiny_plan(pl, "cpu")
        assert (tp.n_xa, tp.grid_b, pl.nsplit == 1) == (64, 16, unsplit)
        assert tp.backward == unsplit   # two items a program: only where _b1 leaves Q unsplit
    if DEV == "cuda":
        def mkr(r, L):
            return build_plan([L, 0], [r, 128], [1.0, 1.0], 0.1, 256, 384, DEV)

        assert tiny_plan(mkr(64, 512), DEV) is not None and tiny_plan(mkr(64, 513), DEV) is None
        assert tiny_plan(mkr(65, 512), DEV) is None   # the empty rank-128 adapter does not count
    bw = [tiny_plan(build_plan(s, r, [1.0] * len(r), 0.1, K, N, DEV, TINY, n_sm=8), DEV,
                    ctas=1).backward for s, r, K, N in MIXES]
    assert True in bw and False in bw   # with one program per SM the cases run both backwards


MIXES = [([37, 0, 64, 5], [3, 8, 20, 130], 96, 80),       # odd tokens, an empty adapter
         ([1, 70], [256, 1], 64, 72),
         ([9, 31, 70, 2, 11], [16, 17, 64, 65, 128], 40, 100)]


@pytest.mark.parametrize("p,cfg", [(0.0, TINY), (0.25, TINY), (0.25, TINY1)])
@pytest.mark.parametrize("mix", range(len(MIXES)))
def test_steps_match_reference_and_four_launch_path(mix, p, cfg):
    """Three steps of one plan (new seeds): y, dX, dA, dB match the float64 reference and the
    four-launch path; every program's step count and each counter's arrivals add up. ``_tb``
    at two programs per SM (TINY) and at one (TINY1, only where the plan leaves Q unsplit)."""
    segs, ranks, K, N = MIXES[mix]
    (x, W, A, B, dy), sc = _inputs(1900 + mix, segs, ranks, K, N)
    plan = build_plan(segs, ranks, sc, p, K, N, DEV, cfg, n_sm=8)   # the same splits on a GPU
    four = build_plan(segs, ranks, sc, p, K, N, DEV, FOUR, n_sm=8)
    tp = tiny_plan(plan, DEV)
    assert tp is not None and tiny_plan(four, DEV) is None
    for step, seed in enumerate((5, 6, 7)):
        ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=p, seed=seed)
        got, old = _step(x, W, A, B, dy, plan, seed), _step(x, W, A, B, dy, four, seed)
        for k in ("y", "dx", "dA", "dB"):
            assert _rel(got[k], ref[k]) < F32_TOL, (step, k)
            assert _rel(got[k], old[k]) < SAME_TOL, (step, k)
        empty = [i for i, L in enumerate(segs) if L == 0]
        for i in empty:
            ro, r = plan.roffs[i], plan.ranks[i]
            assert not got["dA"][ro:ro + r].any() and not got["dB"][ro:ro + r].any()
        (f,), (b,) = _progs(plan)
        assert f.g_numel == (0 if plan.nsplit == 1 else plan.p_size)   # zeroed by _tf
        st = f.tiny[-1].static
        assert (st["Ep"] == step + 1).all() and (st["Cnt"] == (step + 1) * tp.fsplit).all()
        two = b.tiny is not None and "maxnreg" in b.tiny[-1].options
        if DEV == "cuda" and tp.ctas == 2 and not two:
            tp = tiny_plan(plan, DEV, ctas=1)   # two per SM did not fit (fp32 at rank 256)
        assert f.tiny is not None and (b.tiny is not None) == tp.backward
        if tp.backward:
            st = b.tiny[-1].static
            want = [(step + 1) * tp.bsplit * -(-L // plan.cfg.bms[bk]) for L, bk in
                    zip(segs, plan.meta_i[:, 5].tolist()) if L > 0]
            assert (st["Ep"] == step + 1).all() and st["Cnt"].tolist() == want
            assert b.tiny[-1].grid[0] == tp.grid_b


def test_bf16_bias_no_dropout_and_seed_tensor():
    """bf16 with a bias, dropout off, then on with the graph path's seed counter tensor (read by
    the kernels): against the reference and the four-launch path."""
    segs, ranks, K, N = [45, 80], [2, 40], 64, 96
    (x, W, A, B, dy), sc = _inputs(1950, segs, ranks, K, N, torch.bfloat16)
    bias = torch.randn(N, generator=torch.Generator().manual_seed(3)).to(x)
    plan = build_plan(segs, ranks, sc, 0.3, K, N, DEV, TINY)
    four = build_plan(segs, ranks, sc, 0.3, K, N, DEV, FOUR)
    ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=0.0, bias=bias)
    got = _step(x, W, A, B, dy, plan, 0, bias=bias, dropout_on=False)
    old = _step(x, W, A, B, dy, four, 0, bias=bias, dropout_on=False)
    for k in ("y", "dx", "dA", "dB"):
        assert _rel(got[k], ref[k]) < BF16_TOL, k
        assert _rel(got[k], old[k]) < 1e-2, k
    from tlora_sim.profiler.kernels import mix_seed  # noqa: F401  (the kernels mix the counter)
    ctr = torch.tensor(11, dtype=torch.int64, device=DEV)
    ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=0.3, seed=11,
                                     bias=bias)
    for pl in (plan, four):
        got = _step(x, W, A, B, dy, pl, ctr, bias=bias)
        for k in ("y", "dx", "dA", "dB"):
            assert _rel(got[k], ref[k]) < BF16_TOL, k


def test_without_dx():
    """x without grad: no dX's LoRA term is written (WRITE_DX off), dA and dB still right."""
    segs, ranks, K, N = [33, 64], [8, 16], 64, 64
    (x, W, A, B, dy), sc = _inputs(1960, segs, ranks, K, N)
    plan = build_plan(segs, ranks, sc, 0.1, K, N, DEV, TINY)
    for seed in (1, 2):
        ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=0.1, seed=seed)
        got = _step(x, W, A, B, dy, plan, seed, need_x=False)
        for k in ("y", "dA", "dB"):
            assert _rel(got[k], ref[k]) < F32_TOL, k
