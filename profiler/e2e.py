"""End-to-end check of the cost model: a full Llama-3-8B-shaped model (random weights, no
download) on one GPU, a few real training steps with 1, 4 and 8 co-located adapters.

The model: embedding, 32 decoder layers (profiler/layer.py, LoRA on q,k,v,o,gate,up,down of
every layer), final RMSNorm, LM head, fp32 cross-entropy; ``loss.backward()`` then one fused
AdamW step over every adapter parameter and ``zero_grad``, eager, no activation checkpointing.
Each step is timed with CUDA events (fwd / bwd / optimizer); the median of ``reps`` steps after
two warm-up steps is written to ``OUT/e2e_<gpu>.csv`` with the peak memory of a step
(``max_memory_allocated``, absolute) and the same provenance columns as the profile. The
prediction is made afterwards from the shipped artifact (``tlora-sim costmodel validate --e2e``).
"""
from __future__ import annotations

import time
from pathlib import Path

# (rank, sequences, tokens per sequence) per adapter; drawn from the trace distribution
# (ranks 2-16, 1-2 sequences of 512-2048 tokens) and kept under ~4k tokens so that the step fits
# in 80 GB without activation checkpointing.
E2E_MIXES = {
    1: [(16, 2, 1024)],
    4: [(2, 2, 512), (4, 1, 1024), (8, 1, 1024), (16, 1, 1024)],
    8: [(2, 1, 512), (4, 1, 512), (8, 1, 512), (16, 1, 512), (2, 1, 512), (4, 1, 512), (8, 1, 512), (16, 1, 512)],
}
TINY_MIXES = {1: [(4, 1, 16)], 4: [(2, 1, 16), (4, 1, 16), (8, 1, 16), (16, 1, 16)]}


def run(device: str, prov: dict, out: Path, deadline: float = float("inf"), tiny: bool = False,
        model: str = "llama3-8b", reps: int = 5) -> int:
    """Measure the full-model steps; returns the number of rows written."""
    import math

    import torch
    import torch.nn.functional as F

    from tlora_sim.profiler.layer import TINY, BaseWeights, LoRASet, Marks, layer_forward, rmsnorm, shape_of, sync
    from tlora_sim.profiler.grid import mix_key, order_members
    from tlora_sim.profiler.provenance import Writer, log, variant

    if tiny:
        sh, mixes, reps = TINY, TINY_MIXES, 1
    else:
        from tlora_sim.sim.costmodel.models import get_model

        sh, mixes = shape_of(get_model(model)), E2E_MIXES
    w = Writer(Path(out) / f"e2e_{prov['gpu'].lower()}.csv", prov)
    cuda = torch.device(device).type == "cuda"
    t0 = time.time()
    g = torch.Generator(device=device).manual_seed(11)
    layers = [BaseWeights(sh, device, seed=100 + i) for i in range(sh.layers)]
    emb = (torch.randn(sh.vocab, sh.hidden, device=device, generator=g) * 0.02).to(torch.bfloat16)
    head = (torch.randn(sh.vocab, sh.hidden, device=device, generator=g) / math.sqrt(sh.hidden)).to(torch.bfloat16)
    nf = torch.ones(sh.hidden, device=device, dtype=torch.bfloat16)
    static = sum(b.nbytes() for b in layers) + 2 * emb.numel() * 2
    log(f"e2e: {sh.name} ({sh.layers} layers, {static / 2**30:.1f} GiB of weights) built in {time.time() - t0:.0f} s")
    n_rows = 0
    for n, members in mixes.items():
        members = order_members(members)
        for plan in (("alone", "fused") if n == 1 else ("loop", "fused")):
            if time.time() > deadline:
                log("e2e: budget reached")
                return n_rows
            impl = "loop" if plan in ("alone", "loop") else "fused"
            T = sum(b * s for _, b, s in members)
            info = dict(kind="e2e", model=sh.name, plan=plan, impl=impl, kernel_variant=variant(impl, prov),
                        n_adapters=n, ranks=";".join(str(m[0]) for m in members),
                        batch_sizes=";".join(str(m[1]) for m in members),
                        seq_lens=";".join(str(m[2]) for m in members), tokens=T)
            try:
                loras = [LoRASet(b, members, impl, seed=7 + i) for i, b in enumerate(layers)]
                params = [p for lo in loras for p in lo.params]
                opt = (torch.optim.AdamW(params, lr=1e-4, fused=True) if cuda
                       else torch.optim.AdamW(params, lr=1e-4, foreach=True))
                idx = [torch.randint(0, sh.vocab, (T,), device=device, generator=g) for _ in range(2)]
                lab = [torch.randint(0, sh.vocab, (T,), device=device, generator=g) for _ in range(2)]

                def step(i, m):
                    m.mark()
                    x = emb[idx[i % 2]]
                    for b, lo in zip(layers, loras):
                        x = layer_forward(b, lo, x)
                    loss = F.cross_entropy(F.linear(rmsnorm(x, nf), head).float(), lab[i % 2])
                    m.mark()
                    loss.backward()
                    m.mark()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    m.mark()

                for i in range(1 if tiny else 2):
                    mm = Marks(device)
                    mm.new_iter()
                    step(i, mm)
                sync(device)
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                import gc

                gc.collect()
                gc.disable()
                try:
                    marks = Marks(device)
                    wall0 = time.perf_counter()
                    for i in range(reps):
                        marks.new_iter()
                        step(i, marks)
                    sync(device)
                    wall = (time.perf_counter() - wall0) * 1e3 / reps
                    d = marks.durations_ms()
                    hm = Marks(device, host=True)
                    for i in range(1 if tiny else 2):
                        sync(device)
                        hm.new_iter()
                        step(i, hm)
                    sync(device)
                    host = min(sum(r) for r in hm.durations_ms())
                finally:
                    gc.enable()
                peak = torch.cuda.max_memory_allocated() if cuda else 0
                tot = sorted(sum(r) for r in d)
                med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
                w.row(**info, fwd_ms=med([r[0] for r in d]), bwd_ms=med([r[1] for r in d]),
                      opt_ms=med([r[2] for r in d]), step_ms=med(tot), p10_ms=tot[0], p90_ms=tot[-1], reps=reps, host_ms=host,
                      params=sum(lo.adapter_params() for lo in loras), tensors=len(params), peak_bytes=peak,
                      static_bytes=static, error=f"wall_ms={wall:.2f}")
                n_rows += 1
                log(f"e2e {plan:5s} n={n} {mix_key(members)}: step {med(tot):.1f} ms (wall {wall:.1f}), "
                    f"peak {peak / 2**30:.1f} GiB")
            except Exception as e:  # noqa: BLE001
                log(f"e2e {plan} n={n} failed: {e!r}")
                w.row(**info, error=f"{type(e).__name__}: {str(e)[:200]}")
            finally:
                loras = params = opt = None
                import gc

                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
    w.close()
    return n_rows
