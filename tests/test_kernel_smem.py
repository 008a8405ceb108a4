"""Every configuration the fused kernels can launch fits a Hopper GPU's shared memory.

The Triton interpreter that runs the kernels in CI has no shared-memory limit, so this computes
each launch's need (``smem_bytes``) and checks it against ``SMEM_LIMIT_BYTES`` for every set of
rank buckets a mix can hold (ranks 1-256), under the shipped configuration and a range of tuned
ones. The formula is pinned to the failure measured on an H100 (rank 256, f1, 3 stages:
245,760 bytes required)."""

from __future__ import annotations

import dataclasses

import pytest

from tlora_sim.profiler.kernels.multilora import (MAX_RANK, SMEM_LIMIT_BYTES, KernelConfig, smem_bytes,
                                                  stages_for)

KERNELS = ("f1", "f2", "b1", "b2")


def bucket_of(rank: int) -> int:
    return next(i for i, r in enumerate((16, 32, 64, 128, 256)) if rank <= r)


def test_the_measured_h100_failure_is_what_the_formula_says():
    assert smem_bytes("f1", 4, KernelConfig(), 3) == 245_760 > SMEM_LIMIT_BYTES
    assert smem_bytes("f2", 4, KernelConfig(), 3) == 245_760  # the second requirement the H100 reported


CONFIGS = [KernelConfig(),
           dataclasses.replace(KernelConfig(), bms=(128, 128, 128, 128, 128)),
           dataclasses.replace(KernelConfig(), bk=64, bn=256, stages_f1=4, stages_f2=4, stages_b1=4, stages_b2=4),
           dataclasses.replace(KernelConfig(), cms=(1, 1, 2, 2, 2))]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["shipped", "bm128", "bk64-bn256-4stages", "cm2"])
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
