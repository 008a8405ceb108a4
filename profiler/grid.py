"""The grid of mixes the single-GPU profile measures: rank, batch and sequence-length values, the
quick and full token grids per model, the canonical mix key and member order, and the parallel
precompilation of the fused kernel for the mixes of a run."""
from __future__ import annotations

import random
import time
import zlib
from tlora_sim.profiler.provenance import log


PLAN_IMPL = {"alone": "loop", "loop": "loop", "fused": "fused", "lorafusion": "lorafusion", "grouped": "grouped"}
# plans measured on multi-adapter mixes only (one adapter in a loop is a job alone, the same code; the
# grouped GEMM of one adapter is a plain GEMM). LoRAFusion's kernels run one-adapter mixes too: its
# policy starts a job alone under plan ``lorafusion`` (issue 43 item 5: measured, not extrapolated)
MULTI_ONLY_PLANS = ("loop", "grouped")
DEFAULT_PLANS = "alone,loop,fused,lorafusion,grouped"
RANKS = (2, 4, 8, 16, 32, 64, 128)
BATCHES = (1, 2, 4, 8)
SEQS = (512, 1024, 2048, 4096)

# tokens per GPU the quick grid reaches, by model (one layer fits; the step stays under ~0.2 s)
T_MAX_QUICK = {"llama3-8b": 32768, "qwen3-8b": 32768, "qwen2.5-32b": 16384, "llama3-70b": 16384}
T_MAX_FULL = {"llama3-8b": 65536, "qwen3-8b": 65536, "qwen2.5-32b": 32768, "llama3-70b": 32768}
MODEL_WEIGHT = {"llama3-8b": 1.3, "qwen3-8b": 1.3, "qwen2.5-32b": 1.3, "llama3-70b": 1.6}
# per-call overhead of the harness: the layer alone and stacked three times (profile --stack)
MINI_MIXES = ([(16, 1, 512)], [(16, 2, 1024)], [(16, 1, 512)] * 4, [(2, 2, 512), (4, 1, 1024), (8, 1, 1024), (16, 1, 1024)],
              [(16, 1, 512)] * 8, [(16, 4, 2048)] * 2)
STACK_MIXES = ([(16, 1, 512)], [(16, 1, 512)] * 4, [(16, 1, 512)] * 8, [(16, 4, 2048)] * 2)




# ------------------------------------------------------------------------------------- the grid
def mix_key(members) -> str:
    """Canonical id of a mix: ``r:b:s`` per member, members sorted."""
    return "|".join(f"{r}:{b}:{s}" for r, b, s in sorted(members))


def order_members(members) -> list[tuple[int, int, int]]:
    """Segment order used by the layer: by sequence length (one SDPA call per length), then rank."""
    return sorted((tuple(m) for m in members), key=lambda m: (m[2], m[0], m[1]))


def quick_mixes(model: str, t_max: int, n_random: int = 20, seed: int = 0) -> list[list[tuple]]:
    """The mixes of a profile: uniform mixes (n adapters x one rank x one micro-batch shape) and
    seeded random heterogeneous mixes (ranks 2-128, 1-8 sequences of 512-4096 tokens, 2-16
    adapters), interleaved so that a run cut short still spans the space."""
    shapes = {1: [(1, 512), (2, 2048), (8, 2048)], 2: [(1, 512), (2, 2048)], 4: [(1, 512), (2, 1024)],
              8: [(1, 512), (1, 2048)], 16: [(1, 512), (1, 1024)]}
    uniform = []
    for n, bss in shapes.items():
        for b, s in bss:
            for r in (4, 16, 64):
                if n * b * s <= t_max:
                    uniform.append([(r, b, s)] * n)
    rng = random.Random(zlib.crc32(model.encode()) + seed)
    rand, seen = [], {mix_key(m) for m in uniform}
    tries = 0
    while len(rand) < n_random and tries < 10000:
        tries += 1
        n = rng.choice((2, 3, 4, 5, 6, 8, 10, 12, 16))
        shapes_ok = [(b, s) for b in BATCHES for s in SEQS if b * s <= t_max // n]
        if not shapes_ok:
            continue
        mem = [(rng.choice(RANKS), *rng.choice(shapes_ok)) for _ in range(n)]
        if mix_key(mem) in seen:
            continue
        seen.add(mix_key(mem))
        rand.append(mem)
    urng = random.Random(7)
    urng.shuffle(uniform)
    out = []
    for i in range(max(len(uniform), len(rand))):
        if i < len(uniform):
            out.append(uniform[i])
        if i < len(rand):
            out.append(rand[i])
    return [order_members(m) for m in out]


def lone_mixes(ranks, tokens, seq_max: int = 2048) -> list[list[tuple[int, int, int]]]:
    """One-adapter mixes (a job alone) for every token count x rank: ``[(r, T // s, s)]`` with
    ``s = min(T, seq_max)`` tokens per sequence. Token counts are taken coarse to fine
    (``spread``), ranks in the given order inside each, so a run cut short still spans the range.
    Raises ValueError for a token count that ``s`` does not divide or a value below 1."""
    out = []
    for T in spread(sorted({int(t) for t in tokens})):
        s = min(T, int(seq_max))
        if T < 1 or s < 1 or T % s:
            raise ValueError(f"lone mix of {T} tokens: not a whole number of {s}-token sequences")
        for r in ranks:
            if int(r) < 1:
                raise ValueError(f"lone mix rank {r} < 1")
            out.append([(int(r), T // s, s)])
    return out


def spread(values: list) -> list:
    """Coarse-to-fine order of a sorted grid (ends and middle first) for budgeted runs."""
    vals, out = list(values), []
    idx = [0, len(vals) - 1]
    step = len(vals) - 1
    while step > 1:
        step = (step + 1) // 2
        idx += list(range(0, len(vals), step))
    idx += list(range(len(vals)))
    for i in idx:
        if vals[i] not in out:
            out.append(vals[i])
    return out


def token_grid(t_max: int) -> list[int]:
    g = [64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152, 65536]
    return [t for t in g if t <= t_max]




def _precompile_one(ranks: tuple, device: str):
    """Compile the fused kernels' variant for one rank-bucket set (tiny shapes: Triton specialises
    on divisibility by 16 only, so the compiled kernels serve every real shape)."""
    import torch

    from tlora_sim.profiler.kernels import build_plan, multi_lora_linear

    K = N = 64
    segs = [16] * len(ranks)
    M = sum(segs)
    x = torch.randn(M, K, device=device, dtype=torch.bfloat16, requires_grad=True)
    W = torch.randn(N, K, device=device, dtype=torch.bfloat16)
    A = torch.randn(sum(ranks), K, device=device, dtype=torch.bfloat16, requires_grad=True)
    B = torch.randn(sum(ranks), N, device=device, dtype=torch.bfloat16, requires_grad=True)
    from tlora_sim.profiler.layer import ALPHA_OVER_R, DROPOUT

    plan = build_plan(segs, list(ranks), [ALPHA_OVER_R] * len(ranks), DROPOUT, K, N, device)
    y = multi_lora_linear(x, W, A, B, plan, seed=1)
    torch.autograd.grad(y, [x, A, B], torch.randn_like(y))
    torch.cuda.synchronize()
    return True


def precompile(mixes: list, device: str, workers: int = 8):
    """Warm Triton's on-disk cache for every rank-bucket set in ``mixes``, in parallel processes."""
    import multiprocessing as mp

    from tlora_sim.profiler.kernels.config import bucket_of

    keys = {}
    for mem in mixes:
        bk = tuple(sorted({bucket_of(r) for r, _, _ in mem}))
        keys.setdefault(bk, tuple(sorted({r for r, _, _ in mem})))
    t0 = time.time()
    try:
        with mp.get_context("spawn").Pool(min(workers, len(keys))) as pool:
            pool.starmap(_precompile_one, [(v, device) for v in keys.values()])
        log(f"precompiled fused kernels for {len(keys)} rank-bucket sets in {time.time() - t0:.1f} s")
    except Exception as e:  # noqa: BLE001 (the main process compiles lazily anyway)
        log(f"precompile failed ({e!r}); compiling lazily")


def lorafusion_compile_keys(model: str, mixes: list) -> list[tuple[str, int, int]]:
    """What LoRAFusion's kernels compile anew for, per model: (model, MAX_R, total rank) of each
    runnable mix (their ``fused_multi_lora_xw_sb`` takes both as ``tl.constexpr``, with the layer's
    N and K; the backward kernels MAX_R, N and K), sorted; mixes their kernels cannot run (largest
    rank below 16 or not a power of two) are left out."""
    keys = set()
    for mem in mixes:
        rs = [r for r, _, _ in mem]
        mr = max(rs)
        if mr >= 16 and not mr & (mr - 1):
            keys.add((model, mr, sum(rs)))
    return sorted(keys)


def _precompile_lorafusion_one(model: str, max_r: int, total_r: int, device: str):
    """Compile LoRAFusion's kernels for one (model, MAX_R, total rank): a forward and backward of
    the model's real decoder layer (its N and K are constexpr there) over 256 tokens per adapter, ranks ``[max_r]`` plus chunks of at most ``max_r`` summing to ``total_r``."""
    import torch

    from tlora_sim.profiler.layer import TINY, BaseWeights, LoRASet, layer_forward, shape_of

    if model == TINY.name:
        shape = TINY
    else:
        from tlora_sim.sim.costmodel.models import get_model

        shape = shape_of(get_model(model))
    ranks, left = [max_r], total_r - max_r
    while left > 0:
        ranks.append(min(left, max_r))
        left -= ranks[-1]
    base = BaseWeights(shape, device)
    # two 128-token blocks per adapter: no integer argument is 1 (Triton specialises on it), as in the runs
    lora = LoRASet(base, [(r, 1, 256) for r in ranks], "lorafusion")
    x = torch.randn(256 * len(ranks), shape.hidden, device=device, dtype=torch.bfloat16, requires_grad=True)
    y = layer_forward(base, lora, x)
    torch.autograd.grad(y, [x] + lora.params, torch.randn_like(y))
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return True


def precompile_lorafusion(keys: list, device: str, workers: int = 8):
    """Warm Triton's on-disk cache for LoRAFusion's kernels at every ``lorafusion_compile_keys``
    entry, in parallel processes (their first launch at a new key otherwise compiles for 2-20 s in
    the timed process: the 2026-11-25 H200 profile's LoRAFusion rows took 8 s each, median)."""
    import multiprocessing as mp

    if not keys:
        return
    t0 = time.time()
    try:
        with mp.get_context("spawn").Pool(min(workers, len(keys))) as pool:
            pool.starmap(_precompile_lorafusion_one, [(m, mr, tr, device) for m, mr, tr in keys])
        log(f"precompiled LoRAFusion's kernels for {len(keys)} (model, max rank, total rank) keys in "
            f"{time.time() - t0:.1f} s")
    except Exception as e:  # noqa: BLE001 (the main process compiles lazily anyway)
        log(f"LoRAFusion precompile failed ({e!r}); compiling lazily")
