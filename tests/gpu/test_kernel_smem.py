"""Every configuration the fused kernels can launch fits a Hopper GPU's shared memory.

The Triton interpreter that runs the kernels in CI has no shared-memory limit, so this computes
each launch's need (``smem_bytes``) and checks it against ``SMEM_LIMIT_BYTES`` for every set of
rank buckets a mix can hold (ranks 1-256), under the shipped configuration and a range of tuned
ones. The model must be an upper bound of what Triton compiles: the shared-memory sizes that
Triton 3.6.0 compiled for sm_90 on the H100 image (2026-11-26, ``python3
bench/kernel_profile.py --smem``: f1, f2, b1, b2 at every rank bucket, 1-4 stages, the four tile
configurations below and every flag that changes a loop's loads; the base GEMM with the LoRA
epilogue at four tile shapes, 2-4 stages, both passes; session 16 added 90 of the persistent
GEMM, 128 x 256 x 64 at split 1/2/4 in three loop modes, 3-4 stages, every bucket, both passes,
with and without a TMA store: 470 in all) are pinned in
profiler/data/kernel_profile_h100_2026-11-26_8_smem.json (the 380 older ones identical to the
_7_ file) and each is checked here. Among them:
f1 and f2 at rank 256 and 3 stages 245,760 B (the two requirements an H100 reported when rank
256 failed), b2 at rank 64 and 3 stages 196,608 B and f2 at rank 128 and 2 stages 98,304 B (both
above the former model: 188,416 and 81,920 B), the GEMM 128 x 256 x 64 at 3 stages 147,480 B."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from tlora_sim.profiler.kernels import config as kconfig
from tlora_sim.profiler.kernels.config import (MAX_RANK, SMEM_LIMIT_BYTES, GemmConfig, KernelConfig, smem_bytes,
                                               stages_for)

MEASURED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(kconfig.__file__))), "data",
                        "kernel_profile_h100_2026-11-26_8_smem.json")
# bench/kernel_profile.py's SMEM_CONFIGS: name -> (bms, bk, bn, cms)
SWEPT = {"shipped": ((64, 64, 128, 64, 64), 128, 128, (1, 1, 1, 1, 1)),
         "bm128": ((128,) * 5, 128, 128, (1, 1, 1, 1, 1)),
         "bk64-bn256": ((64, 64, 128, 64, 64), 64, 256, (1, 1, 1, 1, 1)),
         "cm2": ((64, 64, 128, 64, 64), 128, 128, (1, 1, 2, 2, 2))}
KERNELS = ("f1", "f2", "b1", "b2")


def bucket_of(rank: int) -> int:
    return next(i for i, r in enumerate((16, 32, 64, 128, 256)) if rank <= r)


def test_the_measured_h100_failure_is_what_the_formula_says():
    old = KernelConfig(bk=128)   # the tiles of that failure (bk 128, the default until 2026-11-26)
    assert smem_bytes("f1", 4, old, 3) == 245_760 > SMEM_LIMIT_BYTES
    assert smem_bytes("f2", 4, old, 3) == 245_760  # the second requirement the H100 reported


def test_default_f1_at_rank_128_fits_two_ctas_per_sm():
    """bk 64 (was 128): _f1's rank-128 tiles need 73,728 B at its stages, so two CTAs share an SM
    (the reason for the default, profiler/KERNELS.md, session 16's second helper); at bk 128 one."""
    cfg = KernelConfig()
    st = stages_for("f1", 1 << 3, cfg)
    assert smem_bytes("f1", 3, cfg, st) == 73_728
    assert 2 * smem_bytes("f1", 3, cfg, st) <= SMEM_LIMIT_BYTES
    old = KernelConfig(bk=128)
    assert 2 * smem_bytes("f1", 3, old, stages_for("f1", 1 << 3, old)) > SMEM_LIMIT_BYTES


def _gemm_config(kern, name):
    """bench/kernel_profile.py's row names: "gemm" "128x256x64w8" (bm x bn x bk, warps), "gemmp"
    (the persistent GEMM) "128x256x64w8s2fl" (then split, "f" flattened, "l" LoRA first)."""
    bm, bn, rest = name.split("x")
    bk, rest = rest.split("w")
    if kern == "gemm":
        return GemmConfig(bm=int(bm), bn=int(bn), bk=int(bk))
    w, tail = rest.split("s")
    return GemmConfig(bm=int(bm), bn=int(bn), bk=int(bk), warps=int(w), persistent=True,
                      split=int(tail.rstrip("fl")), flatten="f" in tail, lora_first="l" in tail)


def _model(kern, cfg_name, bucket, stages):
    if kern in ("gemm", "gemmp"):
        return _gemm_config(kern, cfg_name).smem_bytes(stages)
    bms, bk, bn, cms = SWEPT[cfg_name]
    return smem_bytes(kern, bucket, KernelConfig(bms=bms, bk=bk, bn=bn, cms=cms), stages)


def test_the_model_bounds_what_triton_compiled_for_sm90():
    with open(MEASURED) as f:
        d = json.load(f)
    assert d["triton"] == "3.6.0" and d["target"] == "sm_90" and len(d["rows"]) == 470
    under = [(r, _model(*r[:4])) for r in d["rows"] if _model(*r[:4]) < r[4]]
    assert not under, under[:5]
    got = {tuple(r[:4]): r[4] for r in d["rows"]}
    # exact where the formula was fitted (also the cases the former model under-counted)
    for key, want in {("f1", "shipped", 4, 3): 245_760, ("f2", "shipped", 4, 3): 245_760,
                      ("b2", "shipped", 2, 3): 196_608, ("f2", "shipped", 3, 2): 98_304,
                      ("b1", "shipped", 3, 4): 196_608,
                      ("gemm", "128x256x64w8", 3, 3): 147_480,
                      # the persistent GEMM (session 16): flattened, its epilogue's buffers add up
                      ("gemmp", "128x256x64w8s2f", 3, 3): 213_016,
                      ("gemmp", "128x256x64w8s1f", 3, 3): 262_168,
                      ("gemmp", "128x256x64w8s4f", 3, 3): 188_440}.items():
        assert got[key] == want, key
        assert _model(*key) >= want


def test_the_persistent_gemm_fits_every_rank_at_its_fitted_stages():
    """Every swept persistent configuration launches at ``fitted_stages`` within the H100's limit
    (the compiled need at that stage count, pinned above, is below the model and the limit); the
    shipped one (base_gemm.json: 3 stages, split 2, LoRA first) keeps its 3 stages."""
    with open(MEASURED) as f:
        rows = [r for r in json.load(f)["rows"] if r[0] == "gemmp"]
    assert len(rows) == 90
    got = {tuple(r[:4]): r[4] for r in rows}
    checked = 0
    for name in sorted({r[1] for r in rows}):
        gc = _gemm_config("gemmp", name)
        for st in (3, 4):
            fit = dataclasses.replace(gc, stages=st).fitted_stages()
            for b in range(5):
                if ("gemmp", name, b, fit) in got:   # 3 or 4 stages (2: not swept)
                    assert got[("gemmp", name, b, fit)] <= SMEM_LIMIT_BYTES, (name, b, fit)
                    checked += 1
    assert checked >= 60
    shipped = GemmConfig(bm=128, bn=256, bk=64, stages=3, persistent=True, split=2, lora_first=True)
    assert shipped.fitted_stages() == 3
    assert max(got[("gemmp", "128x256x64w8s2l", b, 3)] for b in range(5)) == 180_248


CONFIGS = [KernelConfig(), KernelConfig(bk=128),
           dataclasses.replace(KernelConfig(), bms=(128, 128, 128, 128, 128)),
           dataclasses.replace(KernelConfig(), bk=64, bn=256, stages_f1=4, stages_f2=4, stages_b1=4, stages_b2=4),
           dataclasses.replace(KernelConfig(), cms=(1, 1, 2, 2, 2))]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["shipped", "bk128", "bm128", "bk64-bn256-4stages", "cm2"])
def test_every_rank_mix_fits_shared_memory(cfg):
    for mask in range(1, 32):  # every set of rank buckets a mix can hold
        for k in KERNELS:
            stages = stages_for(k, mask, cfg)
            assert stages >= 1
            for b in range(5):
                if mask >> b & 1:
                    need = smem_bytes(k, b, cfg, stages)
                    assert need <= SMEM_LIMIT_BYTES, (k, mask, b, stages, need)


def test_low_rank_mixes_keep_the_tuned_stages():
    cfg = KernelConfig()
    for k in KERNELS:
        assert stages_for(k, 0b00011, cfg) == getattr(cfg, f"stages_{k}")  # ranks up to 32


def test_every_rank_maps_to_a_bucket():
    assert [bucket_of(r) for r in (1, 16, 17, 64, 65, 200, MAX_RANK)] == [0, 0, 1, 2, 3, 4, 4]


def test_b1_takes_its_high_rank_stages_only_without_low_ranks():
    cfg = KernelConfig()
    assert stages_for("b1", 0b01000, cfg) == stages_for("b1", 0b01100, cfg) == cfg.stages_b1_hi == 4
    assert stages_for("b1", 0b01001, cfg) == stages_for("b1", 0b01010, cfg) == cfg.stages_b1 == 3
    assert stages_for("b1", 0b10000, cfg) == 2   # rank 256: lowered to fit, as before
    assert stages_for("b2", 0b01000, cfg) == cfg.stages_b2   # b1 only
    assert smem_bytes("b1", 2, cfg, 4) <= SMEM_LIMIT_BYTES and smem_bytes("b1", 3, cfg, 4) <= SMEM_LIMIT_BYTES
