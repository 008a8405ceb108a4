"""The GPU profiler's layer timer on the CPU with tiny shapes (torch needed; skipped without it).

Checks that a tiny profile runs end to end on the CPU (the fused plan through Triton's
interpreter), writes every kind of row, and that every row carries the provenance columns
(GPU name, driver, torch, triton versions, kernel variant, git commit).
"""
from __future__ import annotations

import csv
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from tlora_sim.profiler.layer import TINY, BaseWeights, LoRASet, layer_forward, seq_groups  # noqa: E402
from tlora_sim.profiler.grid import quick_mixes, spread  # noqa: E402
from tlora_sim.profiler.profile import main  # noqa: E402
from tlora_sim.profiler.provenance import COLUMNS  # noqa: E402

PROVENANCE = ("gpu", "gpu_name", "torch", "triton", "git_commit", "git_dirty", "profile_id", "mode", "timestamp")


def test_layer_forward_backward_tiny():
    base = BaseWeights(TINY, "cpu")
    members = [(2, 1, 16), (8, 2, 16), (4, 1, 32)]
    assert seq_groups(members) == [(16, 0, 48), (32, 48, 32)]
    x = torch.randn(80, TINY.hidden, dtype=torch.bfloat16, requires_grad=True)
    outs = {}
    for impl in ("none", "loop", "padded", "grouped"):
        lora = LoRASet(base, members, impl)
        y = layer_forward(base, lora, x)
        grads = torch.autograd.grad(y, [x] + lora.params, torch.randn_like(y))
        assert y.shape == x.shape and all(torch.isfinite(g.float()).all() for g in grads)
        outs[impl] = lora
    assert outs["loop"].adapter_params() == sum(r for r, _, _ in members) * sum(i + o for _, i, o in TINY.linear_shapes())


def test_tiny_profile_writes_rows_with_provenance(tmp_path):
    os.environ.setdefault("TLORA_GIT_COMMIT", "0123456789abcdef")
    assert main(["--device", "cpu", "--tiny", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "profile_cpu.csv")))
    kinds = {r["kind"] for r in rows}
    assert {"opt", "noattn", "attn", "head", "mix"} <= kinds
    assert set(rows[0]) == set(COLUMNS)
    from tlora_sim.profiler.kernels.lorafusion_ext import lorafusion_available

    lf = lorafusion_available()
    not_runnable = [r for r in rows if r["error"].startswith("not runnable")]
    # LoRAFusion needs a rank >= 16 in the mix: the tiny rank-4 job alone and the mix of ranks 2 and 8
    # are recorded, not dropped (one-adapter mixes run under lorafusion too: issue 43 item 5)
    assert [(r["plan"], r["ranks"]) for r in not_runnable] == ([("lorafusion", "4"), ("lorafusion", "2;8")] if lf else [])
    rows = [r for r in rows if r not in not_runnable]
    for r in rows:
        assert not r["error"], r["error"]
        for c in PROVENANCE:
            assert r[c], (c, r)
        assert float(r["step_ms"]) > 0
    mix = [r for r in rows if r["kind"] == "mix"]
    assert {r["plan"] for r in mix} == {"alone", "loop", "fused", "grouped"} | ({"lorafusion"} if lf else set())
    for r in mix:
        if r["plan"] in ("grouped", "lorafusion"):
            assert int(r["n_adapters"]) > (1 if r["plan"] == "grouped" else 0) and r["kernel_variant"].startswith(r["plan"])
        assert r["kernel_variant"], r
        if r["plan"] == "fused":
            assert r["kernel_variant"].startswith(("tlora-triton@", "torch-padded-bmm"))
        n = int(r["n_adapters"])
        assert len(r["ranks"].split(";")) == n == len(r["seq_lens"].split(";"))
        assert float(r["fwd_ms"]) > 0 and float(r["bwd_ms"]) > 0 and float(r["opt_ms"]) > 0


def test_quick_grid_is_deterministic_and_in_range():
    a, b = quick_mixes("llama3-8b", 32768), quick_mixes("llama3-8b", 32768)
    assert a == b and len(a) >= 50
    for m in a:
        assert 1 <= len(m) <= 16
        assert sum(bb * s for _, bb, s in m) <= 32768
        assert all(2 <= r <= 128 and 1 <= bb <= 8 and 512 <= s <= 4096 for r, bb, s in m)
        assert [x[2] for x in m] == sorted(x[2] for x in m)  # one SDPA call per sequence length
    assert sorted(spread([1, 2, 3, 4, 5])) == [1, 2, 3, 4, 5]
