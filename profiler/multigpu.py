"""Multi-GPU profile: NCCL collective curves and real distributed LoRA training steps.

Run on one host with several GPUs (NVLink multicast off, see the README)::

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        python3 -m tlora_sim.profiler.multigpu --out DIR [--gpus 2] [--models llama3-8b]
    python3 -m tlora_sim.profiler.multigpu --device cpu --tiny --out DIR   # gloo, two processes, seconds

One process per GPU (``torch.multiprocessing.spawn``; NCCL on CUDA, gloo on the CPU). Rank 0
writes ``OUT/multigpu_<gpu>.csv``, one row per measurement, every row with ``n_gpus``:

* ``kind=collective``: ``op`` (all_reduce, all_gather, reduce_scatter), ``bytes`` (the full
  tensor: the all-reduced buffer, the gathered output, the reduce-scatter input), ``time_ms``
  (median over ranks' maxima), ``busbw_gbs`` (bus bandwidth by the usual convention:
  all-reduce moves 2(n-1)/n of the bytes per GPU, all-gather and reduce-scatter (n-1)/n).
* ``kind=step``: one training step of the whole model shape (embedding, every decoder layer of
  ``profiler/layer.py`` with LoRA on q,k,v,o,gate,up,down, final norm, LM head, fp32
  cross-entropy, backward, AdamW over the adapters), the slowest rank's median (``step_ms``),
  with ``parallelism``:

  - ``dp``: a base replica per GPU; every adapter's sequences split over the GPUs (an integer
    ``micro_batch_per_gpu`` each, a sequence is never split); adapter gradients all-reduced in
    one flat bucket after the backward.
  - ``local``: rank-local adapters (ALTO): a base replica per GPU, each adapter with all of its
    sequences on one GPU (round robin), no adapter all-reduce; the step waits for the slowest GPU.
  - ``fsdp``: the base sharded by rows over the GPUs, each layer's weights all-gathered before its
    forward and kept for its backward (``reshard_after_forward=False``: the frozen base needs no
    gradient reduce-scatter); adapters replicated and all-reduced as in ``dp``.
  - ``tp``: Megatron tensor parallel: q,k,v,gate,up column-parallel, o,down row-parallel (heads
    and the MLP width split over the GPUs); LoRA on the shards (A replicated and B sharded on
    column-parallel layers, A sharded and B replicated on row-parallel ones); two all-reduces of
    activations per layer forward and two in the backward; the replicated LoRA factors' gradients
    all-reduced. Every GPU sees all sequences.

  ``nano_batches`` N > 1 (``dp`` only): tLoRA's nano-batches, each micro-batch cut into N by
  sequences; after each nano-batch's backward its adapter gradients are all-reduced on a side
  stream while the next nano-batch computes (``overlap=1``).

Timing as in the single-GPU profile (``profiler/layer.py``): CUDA events, warm-up steps first,
the median of ``reps`` steps; each rank's median, then the maximum over ranks.
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import math
import os
import sys
import time
from pathlib import Path

COLUMNS = ["kind", "op", "bytes", "n_gpus", "time_ms", "busbw_gbs", "model", "layers", "parallelism", "plan",
           "n_adapters", "ranks", "batch_sizes", "micro_batch_per_gpu", "seq_lens", "tokens_per_gpu",
           "nano_batches", "overlap", "fwd_ms", "bwd_ms", "comm_ms", "opt_ms", "step_ms", "p90_ms",
           "peak_bytes", "reps", "error", "gpu", "gpu_name", "torch", "triton", "git_commit", "timestamp"]

#: per-GPU mixes (rank, sequences per GPU, tokens per sequence): ranks 2-16 and 512-2048 tokens as
#: in the trace distribution, 1-16 adapters; ``dp`` doubles each adapter's sequences globally.
MIXES = {
    1: [(16, 1, 1024)],
    2: [(8, 1, 1024), (16, 1, 512)],
    4: [(2, 1, 512), (4, 1, 1024), (8, 1, 512), (16, 1, 1024)],
    8: [(r, 1, 512) for r in (2, 4, 8, 16, 2, 4, 8, 16)],
    16: [(r, 1, 256) for r in (2, 4, 8, 16) * 4],
}
TINY_MIXES = {1: [(4, 1, 16)], 2: [(2, 1, 16), (8, 1, 16)], 4: [(2, 1, 8), (4, 1, 16), (8, 1, 8), (16, 1, 16)]}
NANO = (1, 2, 4, 8)
COLLECTIVE_BYTES = [1 << k for k in range(12, 31, 2)]  # 4 KiB .. 1 GiB


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class _Writer:
    """Rank 0's CSV: header once, one flushed row per measurement (a partial run keeps its rows)."""

    def __init__(self, path: Path, prov: dict):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.prov, self.f = prov, open(path, "a", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=COLUMNS, extrasaction="ignore")
        if path.stat().st_size == 0:
            self.w.writeheader()

    def row(self, **kw) -> None:
        r = {k: self.prov.get(k, "") for k in COLUMNS}
        r["timestamp"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        r.update({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in kw.items()})
        self.w.writerow(r)
        self.f.flush()


# ------------------------------------------------------------------------------ collectives
def _collectives(dev, world: int, sizes: list[int], reps: int) -> list[dict]:
    import torch
    import torch.distributed as dist

    rows = []
    for nbytes in sizes:
        n = max(world, nbytes // 2 // world * world)  # bf16 elements, divisible by the world size
        full = torch.randn(n, device=dev).to(torch.bfloat16)
        shard = torch.empty(n // world, device=dev, dtype=torch.bfloat16)
        ops = {"all_reduce": lambda: dist.all_reduce(full),
               "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
               "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full)}
        for op, fn in ops.items():
            times = _time_fn(fn, dev, reps)
            t = _max_over_ranks(times, dev)
            factor = 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
            rows.append(dict(kind="collective", op=op, bytes=n * 2, n_gpus=world, time_ms=t, reps=reps,
                             busbw_gbs=n * 2 * factor / (t * 1e-3) / 1e9))
        del full, shard
    return rows


def _time_fn(fn, dev, reps: int) -> float:
    import statistics

    import torch

    cuda = dev.type == "cuda"
    for _ in range(3):
        fn()
    out = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def _max_over_ranks(x: float, dev) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([x], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())




# ------------------------------------------------------------------------------------ steps
def _split_members(members, world: int, parallelism: str, rank: int):
    """The (rank, sequences, seq_len) members this GPU trains: ``dp``/``fsdp`` give every adapter
    ``micro_batch_per_gpu`` sequences on each GPU; ``local`` puts adapter i on GPU i mod world;
    ``tp`` gives every GPU every sequence."""
    if parallelism == "local":
        return [m for i, m in enumerate(members) if i % world == rank]
    return list(members)


class _TPComm:
    """Megatron's two conjugate operators as autograd functions over the default group."""

    @staticmethod
    def build():
        import torch
        import torch.distributed as dist

        class Copy(torch.autograd.Function):  # identity forward, all-reduce backward ("f")
            @staticmethod
            def forward(ctx, x):
                return x

            @staticmethod
            def backward(ctx, g):
                g = g.contiguous()
                dist.all_reduce(g)
                return g

        class Reduce(torch.autograd.Function):  # all-reduce forward, identity backward ("g")
            @staticmethod
            def forward(ctx, x):
                x = x.contiguous()
                dist.all_reduce(x)
                return x

            @staticmethod
            def backward(ctx, g):
                return g

        return Copy.apply, Reduce.apply


def _tp_layer_forward(base, lora, x, f, g):
    """``profiler.layer.layer_forward`` on tensor-parallel shards: ``f`` before the column-parallel
    projections, ``g`` after the row-parallel ones (attention heads split over the GPUs)."""
    import torch.nn.functional as F

    from tlora_sim.profiler.layer import attention_block, rmsnorm, seq_groups

    h = f(rmsnorm(x, base.norm_in))
    q, k, v = lora.linear("q", h), lora.linear("k", h), lora.linear("v", h)
    a = attention_block(base, q, k, v, seq_groups(lora.members))
    x = x + g(lora.linear("o", a))
    h2 = f(rmsnorm(x, base.norm_post))
    m = F.silu(lora.linear("gate", h2)) * lora.linear("up", h2)
    return x + g(lora.linear("down", m))


class _GatheredW(dict):
    """FSDP weights: each rank keeps a row shard; ``[name]`` all-gathers the full matrix."""

    def __init__(self, shards: dict, world: int):
        super().__init__()
        self.shards, self.world = shards, world

    def __getitem__(self, name):
        import torch
        import torch.distributed as dist

        s = self.shards[name]
        full = torch.empty((s.shape[0] * self.world, s.shape[1]), device=s.device, dtype=s.dtype)
        dist.all_gather_into_tensor(full, s)
        return full


def _replicated_grads(lora, parallelism: str):
    """The adapter parameters whose gradients must be all-reduced across GPUs."""
    if parallelism == "local":
        return []
    if parallelism != "tp":
        return list(lora.params)
    out = []
    for name in ("q", "k", "v", "gate", "up"):
        out += lora.A[name] if isinstance(lora.A[name], list) else [lora.A[name]]
    for name in ("o", "down"):
        out += lora.B[name] if isinstance(lora.B[name], list) else [lora.B[name]]
    return out


def _all_reduce_grads(params, stream=None, async_op: bool = False):
    """One flat bucket of the parameters' gradients, all-reduced (asynchronously on ``stream`` if
    given, or with ``async_op`` where there are no streams: the CPU); returns
    (work handle or None, bucket) so that the caller can unflatten after waiting; a parameter
    without a gradient (an adapter absent from a nano-batch) contributes zeros."""
    import torch
    import torch.distributed as dist

    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                      for p in params])
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            return dist.all_reduce(flat, async_op=True), flat
    if async_op:
        return dist.all_reduce(flat, async_op=True), flat
    dist.all_reduce(flat)
    return None, flat


def _build_bases(sh, dev, world: int, rank: int, parallelism: str):
    import dataclasses

    from tlora_sim.profiler.layer import BaseWeights

    if parallelism == "tp":
        if sh.heads % world or sh.kv_heads % world or sh.ffn % world:
            raise ValueError(f"{sh.name}: heads/kv heads/ffn not divisible by {world}")
        sh = dataclasses.replace(sh, heads=sh.heads // world, kv_heads=sh.kv_heads // world, ffn=sh.ffn // world)
    layers = [BaseWeights(sh, dev, seed=100 + i * world + (rank if parallelism == "tp" else 0))
              for i in range(sh.layers)]
    if parallelism == "fsdp":
        for b in layers:
            shards = {k: w.chunk(world, dim=0)[rank].contiguous() for k, w in b.W.items()}
            b.W = _GatheredW(shards, world)
    return layers


def _step_rows(sh, dev, world: int, rank: int, parallelism: str, mixes: dict, plans, nanos, reps: int,
               deadline: float) -> list[dict]:
    import gc

    import torch

    cuda = dev.type == "cuda"
    layers = _build_bases(sh, dev, world, rank, parallelism)
    g = torch.Generator(device=dev).manual_seed(11)
    emb = (torch.randn(sh.vocab, sh.hidden, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    head = (torch.randn(sh.vocab, sh.hidden, device=dev, generator=g) / math.sqrt(sh.hidden)).to(torch.bfloat16)
    nf = torch.ones(sh.hidden, device=dev, dtype=torch.bfloat16)
    f, gop = _TPComm.build() if parallelism == "tp" else (None, None)
    side = torch.cuda.Stream() if cuda else None
    rows = []
    for n, mix in mixes.items():
        mine = _split_members(sorted(mix, key=lambda m: (m[2], m[0])), world, parallelism, rank)
        for plan in plans(n):
            for nano in (nanos if parallelism == "dp" and plan == "fused" and n >= 2 else (1,)):
                stop = torch.tensor([float(time.time() > deadline)], device=dev)
                torch.distributed.all_reduce(stop, op=torch.distributed.ReduceOp.MAX)
                if stop.item():
                    return rows
                impl = "fused" if plan == "fused" else "loop"
                info = dict(kind="step", model=sh.name, layers=sh.layers, parallelism=parallelism, plan=plan,
                            n_adapters=n, n_gpus=world, nano_batches=nano, overlap=int(nano > 1),
                            ranks=";".join(str(m[0]) for m in mix),
                            batch_sizes=";".join(str(m[1] * (world if parallelism in ("dp", "fsdp") else 1))
                                                 for m in mix),
                            micro_batch_per_gpu=";".join(str(m[1]) for m in mix),
                            seq_lens=";".join(str(m[2]) for m in mix), reps=reps)
                try:
                    row = _measure(layers, mine, impl, nano, parallelism, emb, head, nf, f, gop, side, dev, g,
                                   reps)
                    rows.append({**info, **row})
                except Exception as e:  # noqa: BLE001 - one failed configuration must not end the profile
                    rows.append({**info, "error": f"{type(e).__name__}: {str(e)[:200]}"})
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
    return rows


def _measure(layers, mine, impl, nano, parallelism, emb, head, nf, f, gop, side, dev, g, reps) -> dict:
    import statistics

    import torch
    import torch.nn.functional as F

    from tlora_sim.profiler.layer import LoRASet, Marks, layer_forward, rmsnorm

    cuda = dev.type == "cuda"
    seed = 7 if parallelism != "local" else 7 + torch.distributed.get_rank()
    loras = [LoRASet(b, mine, impl, seed=seed + i) for i, b in enumerate(layers)] if mine else []
    params = [p for lo in loras for p in lo.params]
    sync_params = [p for lo in loras for p in _replicated_grads(lo, parallelism)]
    opt = torch.optim.AdamW(params, lr=1e-4, **({"fused": True} if cuda else {"foreach": True})) if params else None
    T = sum(b * s for _, b, s in mine)
    vocab = emb.shape[0]
    idx = torch.randint(0, vocab, (max(T, 1),), device=dev, generator=g)
    lab = torch.randint(0, vocab, (max(T, 1),), device=dev, generator=g)
    slices = nano_slices(mine, nano, loras[0] if loras else None, impl, dev)

    def fwd_bwd(sl):
        members, segs, plans, tok0, tok1 = sl
        for lo in loras:
            lo.members, lo.segs = members, segs
            if plans is not None:
                lo.plan = plans
        x = emb[idx[tok0:tok1]]
        for b, lo in zip(layers, loras):
            x = _tp_layer_forward(b, lo, x, f, gop) if parallelism == "tp" else layer_forward(b, lo, x)
        loss = F.cross_entropy(F.linear(rmsnorm(x, nf), head).float(), lab[tok0:tok1])
        loss.backward()

    def step(m):
        m.mark()
        if not mine:
            m.mark()
        elif nano == 1:
            fwd_bwd(slices[0])
            m.mark()
            if sync_params:
                _write_back(sync_params, _all_reduce_grads(sync_params)[1])
        else:
            pending = []
            for sl in slices:
                for p in sync_params:
                    p.grad = None
                fwd_bwd(sl)
                pending.append(_all_reduce_grads(sync_params, side, async_op=True))
            m.mark()
            for work, _flat in pending:
                work.wait()
            if cuda:
                torch.cuda.current_stream().wait_stream(side)
            _write_back(sync_params, torch.stack([fl for _w, fl in pending]).sum(0))
        m.mark()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        m.mark()

    for _ in range(2):
        w = Marks(dev)
        w.new_iter()
        step(w)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    marks = Marks(dev)
    for _ in range(reps):
        marks.new_iter()
        step(marks)
    d = marks.durations_ms()
    tot = sorted(sum(r) for r in d)
    med = statistics.median
    out = {"fwd_ms": med(r[0] for r in d), "comm_ms": med(r[1] for r in d), "opt_ms": med(r[2] for r in d),
           "step_ms": med(tot), "p90_ms": tot[min(len(tot) - 1, int(round(0.9 * (len(tot) - 1))))],
           "tokens_per_gpu": T, "peak_bytes": torch.cuda.max_memory_allocated() if cuda else 0}
    # the step is the slowest rank's: every field is reduced with MAX (tokens and memory included)
    keys = list(out)
    t = torch.tensor([float(out[k]) for k in keys], dtype=torch.float64, device=dev)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    res = dict(zip(keys, t.tolist()))
    res["bwd_ms"] = float("nan")  # forward and backward are one phase here (nano-batches interleave them)
    res["tokens_per_gpu"], res["peak_bytes"] = int(res["tokens_per_gpu"]), int(res["peak_bytes"])
    return res


def nano_slices(members, nano: int, lora, impl: str, dev) -> list[tuple]:
    """Cut the micro-batch into ``nano`` nano-batches of whole sequences, in segment order.

    Returns per nano-batch ``(members, segs, plans, tok0, tok1)``: the members with sequences in it
    (for attention), every adapter's token count in it (0 for an absent adapter: the fused
    kernel's plans and the loop's split take zero-length segments), the fused plans (None for the
    loop) and its token range in the micro-batch's token order."""
    from tlora_sim.profiler.layer import DROPOUT

    T = sum(b * s for _, b, s in members)
    if lora is None or nano <= 1:
        plans = lora.plan if lora is not None and impl == "fused" else None
        segs = lora.segs if lora is not None else []
        return [(list(members), segs, plans, 0, T)]
    owner = [i for i, (_r, b, _s) in enumerate(members) for _ in range(b)]
    nano = min(nano, len(owner))
    out, tok, lo_i = [], 0, 0
    for k in range(nano):
        hi_i = round((k + 1) * len(owner) / nano)
        counts = [0] * len(members)
        for i in owner[lo_i:hi_i]:
            counts[i] += 1
        sl_members = [(r, c, s) for (r, _b, s), c in zip(members, counts) if c]
        segs = [c * s for (_r, _b, s), c in zip(members, counts)]
        plans = None
        if impl == "fused":
            from tlora_sim.profiler.kernels import build_plan

            plans = {name: build_plan(segs, lora.ranks, lora.scales, DROPOUT, din, dout, dev)
                     for name, din, dout in lora.base.shape.linear_shapes()}
        n_tok = sum(segs)
        out.append((sl_members, segs, plans, tok, tok + n_tok))
        tok, lo_i = tok + n_tok, hi_i
    return out


def _write_back(params, flat) -> None:
    """Copy an all-reduced flat bucket back into the parameters' gradients."""
    o = 0
    for p in params:
        n = p.numel()
        g = flat[o:o + n].view_as(p).to(p.dtype)
        p.grad = g if p.grad is None else p.grad.copy_(g)
        o += n


# ------------------------------------------------------------------------------------ driver
def _worker(rank: int, world: int, args, port: int) -> None:
    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    dev = torch.device(f"cuda:{rank}" if cuda else "cpu")
    torch.manual_seed(0)
    from tlora_sim.profiler.layer import TINY, shape_of

    prov = _provenance(args.device) if rank == 0 else {}
    out = _Writer(Path(args.out) / f"multigpu_{prov.get('gpu', 'x').lower()}.csv", prov) if rank == 0 else None
    deadline = time.time() + args.budget_s
    try:
        sizes = [1 << 12, 1 << 16, 1 << 20] if args.tiny else COLLECTIVE_BYTES
        for r in _collectives(dev, world, sizes, reps=3 if args.tiny else 20):
            if out:
                out.row(**r)
        if rank == 0:
            log(f"collectives done ({len(sizes)} sizes x 3 ops)")
        models = ["tiny"] if args.tiny else args.models.split(",")
        for name in models:
            if name == "tiny":
                sh = TINY
            else:
                from tlora_sim.sim.costmodel.models import get_model

                sh = shape_of(get_model(name))
            mixes = {k: v for k, v in (TINY_MIXES if args.tiny else MIXES).items() if k <= args.max_adapters}
            for par in args.parallelisms.split(","):
                plans = (lambda n: ("alone", "fused") if n == 1 else ("loop", "fused"))
                rows = _step_rows(sh, dev, world, rank, par, mixes, plans, NANO, 1 if args.tiny else args.reps,
                                  deadline)
                if out:
                    for r in rows:
                        out.row(**r)
                    ok = [r for r in rows if not r.get("error")]
                    log(f"{name} {par}: {len(ok)}/{len(rows)} steps ok")
    finally:
        dist.barrier()
        dist.destroy_process_group()


def _provenance(device: str) -> dict:
    import torch

    from tlora_sim.profiler.provenance import git_commit, short_gpu_name

    try:
        import triton

        tv = triton.__version__
    except Exception:  # noqa: BLE001
        tv = "none"
    full = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    commit, _dirty = git_commit()
    return {"gpu": short_gpu_name(full) if device == "cuda" else "CPU", "gpu_name": full, "torch": torch.__version__,
            "triton": tv, "git_commit": commit}


def main(argv=None) -> int:
    """Command line (see the module docstring). Returns the exit status."""
    ap = argparse.ArgumentParser(prog="python3 -m tlora_sim.profiler.multigpu", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="output directory (multigpu_<gpu>.csv is appended)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda (NCCL) or cpu (gloo)")
    ap.add_argument("--gpus", type=int, default=2, help="processes / GPUs (default 2)")
    ap.add_argument("--tiny", action="store_true", help="the tiny model shape and mixes (CPU test)")
    ap.add_argument("--models", default="llama3-8b", help="comma-separated catalog models")
    ap.add_argument("--parallelisms", default="dp,local,fsdp,tp", help="comma-separated: dp, local, fsdp, tp")
    ap.add_argument("--max-adapters", type=int, default=16, help="largest mix measured (1, 2, 4, 8, 16)")
    ap.add_argument("--reps", type=int, default=5, help="timed steps per configuration (median)")
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="stop starting new configurations after this")
    args = ap.parse_args(argv)
    bad = set(args.parallelisms.split(",")) - {"dp", "local", "fsdp", "tp"}
    if bad or args.gpus < 2:
        print(f"error: unknown parallelism {sorted(bad)} or --gpus < 2", file=sys.stderr)
        return 2
    import torch.multiprocessing as mp

    port = 29500 + os.getpid() % 1000
    mp.spawn(_worker, args=(args.gpus, args, port), nprocs=args.gpus, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
