"""The base GEMM with the LoRA term in its epilogue (profiler/kernels/lora_gemm.py), its choice
table, and the CUDA-graph path's seed counter, against the float64 reference.

CPU through Triton's interpreter (``TRITON_INTERPRET=1``); fresh random inputs per case from a
fixed-seed generator. The graph capture itself needs a GPU (bench/kernels.py measures it there);
here the counter-driven seed the captured kernels read is checked on the CPU.
"""
from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from tlora_sim.profiler.kernels import (KernelConfig, MultiLoRALinear, build_plan,  # noqa: E402
                                        multi_lora_linear, reference_forward_backward)
from tlora_sim.profiler.kernels.config import SMEM_LIMIT_BYTES, GemmConfig  # noqa: E402
from tlora_sim.profiler.kernels.graphed import GraphedCore  # noqa: E402
from tlora_sim.profiler.kernels.lora_gemm import base_gemm, choose_gemm, gemm_table, row_tiles  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
TOL = 1e-4 if DEV == "cpu" else 1e-3
SMALL = GemmConfig(bm=32, bn=32, bk=32, group_m=2)


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def _case(seed, segs, ranks, K, N, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    M, R = sum(segs), sum(ranks)
    t = dict(x=torch.randn(M, K, generator=g), W=torch.randn(N, K, generator=g) / K ** 0.5,
             A=torch.randn(R, K, generator=g) / K ** 0.5, B=torch.randn(R, N, generator=g),
             dy=torch.randn(M, N, generator=g), bias=torch.randn(N, generator=g),
             scales=[float(v) for v in torch.rand(len(ranks), generator=g) * 2 + 0.25])
    return {k: (v.to(DEV, dtype) if isinstance(v, torch.Tensor) else v) for k, v in t.items()}


def _run(t, segs, ranks, K, N, cfg, p, seed, bias=True):
    plan = build_plan(segs, ranks, t["scales"], p, K, N, DEV, cfg)
    x = t["x"].clone().requires_grad_(True)
    A = t["A"].clone().requires_grad_(True)
    B = t["B"].clone().requires_grad_(True)
    y = multi_lora_linear(x, t["W"], A, B, plan, t["bias"] if bias else None, seed=seed)
    return plan, (y, *torch.autograd.grad(y, [x, A, B], t["dy"]))


CASES = [  # (segs, ranks, K, N): empty segments, rank 1 and 256, odd K/N, tiles clipped mid-tile
    ([40, 0, 70, 33], [3, 16, 40, 130], 96, 80),
    ([0, 37, 0], [1, 256, 8], 70, 45),
    ([64, 64], [16, 16], 64, 96),
    ([5, 90, 1], [2, 64, 32], 40, 136),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("p", [0.0, 0.25])
def test_epilogue_gemm_matches_reference(case, p):
    segs, ranks, K, N = CASES[case]
    t = _case(100 + case, segs, ranks, K, N)
    cfg = KernelConfig(base_gemm="triton", gemm_fwd=SMALL,
                       gemm_bwd=GemmConfig(bm=32, bn=64, bk=32))
    plan, (y, dx, dA, dB) = _run(t, segs, ranks, K, N, cfg, p, seed=11)
    assert choose_gemm(plan, "fwd", DEV) is not None and choose_gemm(plan, "bwd", DEV) is not None
    ref = reference_forward_backward(t["x"], t["W"], t["A"], t["B"], segs, ranks, t["scales"],
                                     t["dy"], dropout=p, seed=11, bias=t["bias"])
    for name, got in (("y", y), ("dx", dx), ("dA", dA), ("dB", dB)):
        assert _rel(got, ref[name]) < TOL, name


def test_epilogue_gemm_agrees_with_cublas_path_in_bf16():
    segs, ranks, K, N = [50, 78], [8, 64], 64, 64
    t = _case(7, segs, ranks, K, N, dtype=torch.bfloat16)
    outs = {}
    for bg in ("cublas", "triton"):
        cfg = KernelConfig(base_gemm=bg, gemm_fwd=SMALL, gemm_bwd=SMALL)
        outs[bg] = _run(t, segs, ranks, K, N, cfg, 0.1, seed=5)[1]
    ref = reference_forward_backward(t["x"], t["W"], t["A"], t["B"], segs, ranks, t["scales"],
                                     t["dy"], dropout=0.1, seed=5, bias=t["bias"])
    for i, name in enumerate(("y", "dx", "dA", "dB")):
        assert _rel(outs["triton"][i], ref[name]) < 2e-2, name
        assert _rel(outs["triton"][i], outs["cublas"][i]) < 2e-2, name


def test_seed_tensor_gives_the_mask_of_its_value():
    """The graph path's kernels read the seed from device memory and hash it there: the result is
    the reference with that int seed, and differs from the next counter value's."""
    segs, ranks, K, N = [30, 41], [4, 32], 48, 40
    t = _case(3, segs, ranks, K, N)
    for bg in ("cublas", "triton"):
        cfg = KernelConfig(base_gemm=bg, gemm_fwd=SMALL, gemm_bwd=SMALL)
        got = _run(t, segs, ranks, K, N, cfg, 0.4, seed=torch.tensor(987, device=DEV), bias=False)[1]
        ref = reference_forward_backward(t["x"], t["W"], t["A"], t["B"], segs, ranks, t["scales"],
                                         t["dy"], dropout=0.4, seed=987)
        other = reference_forward_backward(t["x"], t["W"], t["A"], t["B"], segs, ranks,
                                           t["scales"], t["dy"], dropout=0.4, seed=988)
        for i, name in enumerate(("y", "dx", "dA", "dB")):
            assert _rel(got[i], ref[name]) < TOL, (bg, name)
        assert _rel(got[0], other["y"]) > 1e-2


def test_graphed_core_advances_its_counter_each_step():
    mod = MultiLoRALinear(40, 24, [4, 16], dropout=0.3, dtype=torch.float32, device=DEV)
    with torch.no_grad():
        mod.lora_B.normal_()
    mod.set_segments([10, 15])
    plan = mod.plan_for([10, 15], DEV)
    counter = mod.seed_counter(DEV)
    start = int(counter)
    core = GraphedCore(mod, plan, multi_lora_linear, counter)
    assert {id(p) for p in core.parameters()} == {id(p) for p in mod.parameters()}
    x = torch.randn(25, 40, device=DEV)
    ys = [core(x) for _ in range(2)]
    assert int(counter) == start + 2
    for k, y in enumerate(ys):
        want = multi_lora_linear(x, mod.weight, mod.lora_A, mod.lora_B, plan, seed=start + 1 + k)
        assert _rel(y, want) < 1e-6
    assert _rel(ys[0], ys[1]) > 1e-3


def test_cuda_graph_flag_is_the_plain_path_off_cuda():
    torch.manual_seed(0)
    a = MultiLoRALinear(32, 16, [2, 8], dtype=torch.float32, device="cpu", cuda_graph=True)
    b = MultiLoRALinear(32, 16, [2, 8], dtype=torch.float32, device="cpu")
    b.load_state_dict(a.state_dict())
    x = torch.randn(20, 32)
    assert torch.equal(a(x, [8, 12], seed=4), b(x, [8, 12], seed=4))
    assert not a.graph_cache


def test_row_tiles_cover_each_segment_once_and_never_straddle():
    segs = [0, 70, 1, 0, 130, 64]
    plan = build_plan(segs, [4] * len(segs), [1.0] * len(segs), 0.0, 32, 32, "cpu")
    t = row_tiles(plan, 32, "cpu").tolist()
    covered = []
    for ad, m0, m1 in t:
        s = plan.starts[ad]
        assert s <= m0 < m1 <= s + segs[ad] and m1 - m0 <= 32
        covered += list(range(m0, m1))
    assert covered == list(range(sum(segs)))
    assert row_tiles(plan, 32, "cpu") is row_tiles(plan, 32, "cpu")   # cached


@pytest.mark.parametrize("bwd", [False, True])
def test_plain_gemm_matches_torch(bwd):
    g = torch.Generator().manual_seed(9)
    a = torch.randn(77, 72, generator=g).to(DEV)
    w = torch.randn(72 if bwd else 50, 50 if bwd else 72, generator=g).to(DEV)
    got = base_gemm(a, w, SMALL, bwd, prec="ieee")
    want = a.double() @ (w.double() if bwd else w.double().t())
    assert _rel(got, want) < TOL


def test_auto_choice_follows_the_measured_table(tmp_path):
    plan = build_plan([1024, 1024], [8, 16], [1.0, 1.0], 0.0, 64, 96, "cpu",
                      KernelConfig(base_gemm="auto"))
    table = {"cpu": {"fwd|64|96": {"impl": "triton", "min_tokens": 2048,
                                   "config": {"bm": 64, "bn": 128, "bk": 32}},
                     "bwd|64|96": {"impl": "cublas", "min_tokens": 0, "config": {}}}}
    assert choose_gemm(plan, "fwd", "cpu", table=table) == GemmConfig(bm=64, bn=128, bk=32)
    assert choose_gemm(plan, "bwd", "cpu", table=table) is None
    small = build_plan([1000, 1000], [8, 16], [1.0, 1.0], 0.0, 64, 96, "cpu")
    assert choose_gemm(small, "fwd", "cpu", table=table) is None        # below min_tokens
    other = build_plan([1024, 1024], [8, 16], [1.0, 1.0], 0.0, 64, 80, "cpu")
    assert choose_gemm(other, "fwd", "cpu", table=table) is None        # shape never measured
    forced = build_plan([10], [8], [1.0], 0.0, 64, 80, "cpu", KernelConfig(base_gemm="cublas"))
    assert choose_gemm(forced, "fwd", "cpu", table=table) is None
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        gemm_table(str(bad))
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"gpus": table}))
    assert gemm_table(str(good)) == table


def test_kernel_config_parses_gemm_tiles_and_rejects_unknown_choice():
    cfg = KernelConfig.from_dict({"bms": [64] * 5, "base_gemm": "triton",
                                  "gemm_bwd": {"bm": 64, "bn": 64, "bk": 64}})
    assert cfg.gemm_bwd == GemmConfig(bm=64, bn=64, bk=64) and cfg.bms == (64,) * 5
    hash(cfg)   # the launch wrapper keys its cache by the config
    with pytest.raises(ValueError, match="base_gemm"):
        KernelConfig(base_gemm="cutlass")


@pytest.mark.parametrize("c", [GemmConfig(), GemmConfig(bm=128, bn=256, bk=64, stages=3),
                               GemmConfig(bm=256, bn=128, bk=64, stages=5),
                               GemmConfig(bm=128, bn=128, bk=128, stages=4)])
def test_gemm_stages_fit_hopper_shared_memory(c):
    st = c.fitted_stages()
    assert 1 <= st <= c.stages
    assert c.smem_bytes(st) <= SMEM_LIMIT_BYTES or st == 1
    if st < c.stages:
        assert c.smem_bytes(st + 1) > SMEM_LIMIT_BYTES


PERSIST = [dict(split=2, lora_first=True), dict(split=4), dict(split=1, flatten=True)]


@pytest.mark.parametrize("mode", range(len(PERSIST)))
@pytest.mark.parametrize("case", [0, 2])
def test_persistent_gemm_matches_reference(mode, case):
    """The persistent GEMM (``lora_gemm_persist``) in each loop mode, both passes, dropout on: the
    float64 reference; case 2's segments fill whole row tiles, so its output goes through the TMA
    store, case 0's tiles are clipped at segment ends (pointer stores)."""
    from tlora_sim.profiler.kernels import config as kconfig
    segs, ranks, K, N = CASES[case]
    t = _case(300 + case, segs, ranks, K, N)
    gc = GemmConfig(bm=32, bn=64, bk=32, group_m=2, persistent=True, **PERSIST[mode])
    cfg = KernelConfig(base_gemm="triton", gemm_fwd=gc, gemm_bwd=gc)
    kconfig.STAGES_SEEN.clear()
    plan, (y, dx, dA, dB) = _run(t, segs, ranks, K, N, cfg, 0.25, seed=17)
    ran = {k[0][:9] for k in kconfig.STAGES_SEEN}
    assert {"gemmp_fwd", "gemmp_bwd"} <= ran, ran        # the persistent kernel ran both passes
    ref = reference_forward_backward(t["x"], t["W"], t["A"], t["B"], segs, ranks, t["scales"],
                                     t["dy"], dropout=0.25, seed=17, bias=t["bias"])
    for name, got in (("y", y), ("dx", dx), ("dA", dA), ("dB", dB)):
        assert _rel(got, ref[name]) < TOL, name


@pytest.mark.parametrize("M", [96, 77])
@pytest.mark.parametrize("bwd", [False, True])
def test_plain_persistent_gemm_matches_torch(M, bwd):
    """Uniform row tiles, with (M = 96: whole tiles, TMA store) and without (77) full tiles."""
    g = torch.Generator().manual_seed(M)
    a = torch.randn(M, 64, generator=g).to(DEV)
    w = torch.randn(64 if bwd else 128, 128 if bwd else 64, generator=g).to(DEV)
    gc = GemmConfig(bm=32, bn=64, bk=32, group_m=2, persistent=True, split=2, flatten=True)
    got = base_gemm(a, w, gc, bwd, prec="ieee")
    want = a.double() @ (w.double() if bwd else w.double().t())
    assert _rel(got, want) < TOL


def test_persistent_smem_model_bounds_its_modes():
    """LoRA first and flattened loops need more shared memory than the epilogue-after-the-loop
    form (the sums/maxima of ``GemmConfig.smem_bytes``); all three fit at 3 stages."""
    base = dict(bm=128, bn=256, bk=64, stages=3, persistent=True, split=2)
    after = GemmConfig(**base).smem_bytes()
    first = GemmConfig(**base, lora_first=True).smem_bytes()
    flat = GemmConfig(**base, flatten=True).smem_bytes()
    assert after == 147_456 + 32_768 + 64 and first == 147_456 + 49_152 + 64
    assert flat == 147_456 + 65_536 + 64
    assert max(after, first, flat) <= SMEM_LIMIT_BYTES


def test_tma_store_only_when_every_row_tile_is_full():
    """A TMA block of a tile clipped at its segment's end would overwrite the next segment's
    rows: the persistent GEMM stores through TMA only when every segment is whole tiles."""
    from tlora_sim.profiler.kernels.lora_gemm import all_tiles_full
    whole = build_plan([64, 0, 32], [4, 8, 16], [1.0] * 3, 0.0, 32, 32, "cpu")
    clipped = build_plan([64, 33], [4, 8], [1.0] * 2, 0.0, 32, 32, "cpu")
    assert all_tiles_full(whole, 32, 96, False) and not all_tiles_full(whole, 64, 96, False)
    assert not all_tiles_full(clipped, 32, 97, False)
    assert all_tiles_full(None, 32, 96, True) and not all_tiles_full(None, 32, 97, True)


def test_tail_split_rule():
    """The last round is split in two K halves only when it holds at most half the SMs' tiles
    (576 tiles on 132 SMs: 48; 512: 116, not split), after a full round, LoRA first, not
    flattened, and ``tail_split`` on."""
    from tlora_sim.profiler.kernels.lora_gemm import tail_split_tiles
    gc = GemmConfig(bm=128, bn=256, bk=64, persistent=True, split=2, lora_first=True)
    assert tail_split_tiles(gc, 576, 132) == 48
    assert tail_split_tiles(gc, 512, 132) == 0 and tail_split_tiles(gc, 528, 132) == 0
    assert tail_split_tiles(gc, 66, 132) == 0          # no full round
    assert tail_split_tiles(GemmConfig(bm=128, bn=256, persistent=True, lora_first=True,
                                       tail_split=False), 576, 132) == 0
    assert tail_split_tiles(GemmConfig(persistent=True, split=2), 576, 132) == 0


@pytest.mark.parametrize("p", [0.0, 0.25])
def test_tail_split_gemm_matches_reference_and_leaves_workspace_zero(p):
    """Case 0 has 14 tiles in both passes (4 programs off CUDA): the last two are reduced in two
    K halves through the fp32 workspace; two steps of one plan match the float64 reference (the
    counters are zero again after each) and equal the same GEMM without the split."""
    segs, ranks, K, N = CASES[0]
    t = _case(400, segs, ranks, K, N)
    gc = GemmConfig(bm=32, bn=64, bk=32, group_m=2, persistent=True, split=2, lora_first=True)
    cfg = KernelConfig(base_gemm="triton", gemm_fwd=gc, gemm_bwd=gc)
    plan = build_plan(segs, ranks, t["scales"], p, K, N, DEV, cfg)
    ref = reference_forward_backward(t["x"], t["W"], t["A"], t["B"], segs, ranks, t["scales"],
                                     t["dy"], dropout=p, seed=5, bias=t["bias"])
    for _ in range(2):
        x = t["x"].clone().requires_grad_(True)
        A = t["A"].clone().requires_grad_(True)
        B = t["B"].clone().requires_grad_(True)
        y = multi_lora_linear(x, t["W"], A, B, plan, t["bias"], seed=5)
        got = (y, *torch.autograd.grad(y, [x, A, B], t["dy"]))
        ws = [v for k, v in plan.extra.items() if isinstance(k, tuple) and k[0] == "gemm_ws"]
        assert len(ws) == 2                         # forward and backward each split a tail
        assert all(int(c.abs().sum()) == 0 for _, c in ws)       # counters zero again
        for name, g in zip(("y", "dx", "dA", "dB"), got):
            assert _rel(g, ref[name]) < TOL, name
    off = KernelConfig(base_gemm="triton", gemm_fwd=GemmConfig(**{**vars(gc), "tail_split": False}),
                       gemm_bwd=GemmConfig(**{**vars(gc), "tail_split": False}))
    _, plain = _run(t, segs, ranks, K, N, off, p, seed=5)
    for a, b in zip(got, plain):
        assert _rel(a, b) < 1e-5
