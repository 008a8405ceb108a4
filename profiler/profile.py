"""``tlora-sim profile``: measure what a co-located LoRA training step costs on this GPU.

For each base model (real decoder-layer shapes, random weights) it writes one CSV row per
measurement to ``OUT/profile_<gpu>.csv`` (appended and flushed row by row, so a run cut short
keeps what it measured):

* ``opt``    AdamW (fused) step over adapter parameter sets: ``params`` elements in ``tensors``
             tensors (bf16), the optimizer term of the cost model.
* ``noattn`` the frozen decoder layer without its attention block (forward + dX) at ``tokens``:
             the base curve (linear layers, norms, SwiGLU, residuals).
* ``attn``   the attention block alone (rotary + causal SDPA, forward + backward) for
             ``batch_sizes`` sequences of ``seq_lens`` tokens.
* ``base``   the full frozen layer (attention included, no adapters): checks that the base curve
             plus the attention block add up.
* ``head``   embedding lookup + final RMSNorm + LM head + fp32 cross-entropy, forward + dX.
* ``mix``    the full decoder layer with a mix of adapters (``ranks``, ``batch_sizes``,
             ``seq_lens``: one entry per adapter) under plan ``alone`` (one adapter, eager torch
             LoRA as PEFT runs it), ``loop`` (mLoRA style) or ``fused`` (our Triton kernel):
             forward, backward (dX and adapter gradients) and the layer's AdamW step.

Timing (profiler/layer.py): CUDA events around each phase, a warm-up, then ``reps`` steps without
host synchronisation between them (a training loop's steady state; eager, as trainers run),
inputs rotated over 3 random sets; the median per phase is recorded with the p10/p90 spread of
the step. Peak memory: one extra step between ``reset_peak_memory_stats`` and
``max_memory_allocated``. Every row carries the GPU name, driver, CUDA, torch and triton
versions, the kernel variant (implementation + hash of ``profiler/kernels`` sources) and the git
commit. ``OUT/e2e_<gpu>.csv`` holds the end-to-end full-model check (profiler/e2e.py).

Run (on the GPU machine, from the repository root)::

    python3 -m tlora_sim.profiler.profile --gpu-name auto --models llama3-8b,qwen3-8b,qwen2.5-32b,llama3-70b \\
        --quick --out OUT --budget-s 540 --e2e
    python3 -m tlora_sim.profiler.profile --device cpu --tiny --out /tmp/p   # a dry run on the CPU
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COLUMNS = ["kind", "model", "plan", "impl", "n_adapters", "ranks", "batch_sizes", "seq_lens", "tokens",
           "params", "tensors", "layers", "fwd_ms", "bwd_ms", "opt_ms", "step_ms", "p10_ms", "p90_ms", "reps", "host_ms",
           "saved_bytes", "peak_bytes", "static_bytes", "error",
           "gpu", "gpu_name", "driver", "cuda", "torch", "triton", "kernel_variant", "git_commit", "git_dirty",
           "profile_id", "mode", "timestamp"]

PLAN_IMPL = {"alone": "loop", "loop": "loop", "fused": "fused"}
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


# ----------------------------------------------------------------------------------- provenance
def short_gpu_name(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100``; CPU -> ``CPU``; unknown -> sanitized name."""
    for k in ("H200", "H100", "A100", "L40S", "B200", "GH200"):
        if k in name.upper():
            return k
    return "".join(c for c in name if c.isalnum())[:24] or "GPU"


def kernel_hash() -> str:
    """sha1 (12 hex) of the fused kernel sources (profiler/kernels/*.py), the kernel variant."""
    h = hashlib.sha1()
    for p in sorted((ROOT / "profiler" / "kernels").glob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def git_commit() -> tuple[str, str]:
    """(commit, dirty flag) from TLORA_GIT_COMMIT / TLORA_GIT_DIRTY or git; 'unknown' without."""
    c = os.environ.get("TLORA_GIT_COMMIT")
    if c:
        return c, os.environ.get("TLORA_GIT_DIRTY", "unknown")
    try:
        c = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        d = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if c.returncode == 0:
            return c.stdout.strip(), "1" if d.stdout.strip() else "0"
    except Exception:
        pass
    return "unknown", "unknown"


def provenance(device: str, gpu_name: str = "auto", mode: str = "quick") -> dict:
    import torch

    try:
        import triton

        tv = triton.__version__
    except Exception:
        tv = "none"
    if torch.device(device).type == "cuda":
        full = torch.cuda.get_device_name(0)
        drv = ""
        try:
            drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except Exception:
            pass
    else:
        full, drv = f"CPU {platform.processor() or platform.machine()}", ""
    short = ("CPU" if torch.device(device).type == "cpu" else short_gpu_name(full)) if gpu_name in ("auto", "", None) else gpu_name
    commit, dirty = git_commit()
    now = _dt.datetime.now(_dt.timezone.utc)
    pid = f"{short.lower()}-{now.strftime('%Y%m%dT%H%M%S')}-{zlib.crc32(platform.node().encode()) & 0xffff:04x}"
    return {"gpu": short, "gpu_name": full, "driver": drv, "cuda": torch.version.cuda or "", "torch": torch.__version__,
            "triton": tv, "git_commit": commit, "git_dirty": dirty, "profile_id": pid, "mode": mode,
            "kernel_hash": kernel_hash()}


def variant(impl: str, prov: dict) -> str:
    return {"fused": f"tlora-triton@{prov['kernel_hash']}", "loop": "torch-eager-loop",
            "padded": "torch-padded-bmm(fallback for fused)", "none": "frozen-base"}.get(impl, impl)


class Writer:
    """Appends rows to a CSV (header once) and flushes each, so partial runs keep their data."""

    def __init__(self, path: Path, prov: dict):
        self.path, self.prov = Path(path), prov
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self.f = open(self.path, "a", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=COLUMNS, extrasaction="ignore")
        if new:
            self.w.writeheader()
        self.n = 0

    def row(self, **kw):
        r = {k: self.prov.get(k, "") for k in COLUMNS}
        r["timestamp"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        for k, v in kw.items():
            r[k] = f"{v:.6g}" if isinstance(v, float) else v
        self.w.writerow(r)
        self.f.flush()
        self.n += 1

    def close(self):
        self.f.close()


def log(msg: str):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


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


# --------------------------------------------------------------------------------- measurements
class Profiler:
    """Runs the measurements of one device into a Writer."""

    def __init__(self, device: str, writer: Writer, prov: dict, quick: bool = True, tiny: bool = False):
        import torch

        self.torch = torch
        self.device, self.w, self.prov, self.quick, self.tiny = device, writer, prov, quick, tiny
        self.fused_ok: bool | None = None
        self.errors: list[str] = []
        self.target_ms = 300.0 if quick else 1000.0
        self.max_reps = 1 if tiny else (20 if quick else 60)
        self.min_reps = 1 if tiny else 5
        self.host_reps = 1 if tiny else 3
        self.last_host: list[list[float]] = []

    # -- helpers
    def _reps(self, est_ms: float) -> int:
        return int(min(self.max_reps, max(self.min_reps, math.ceil(self.target_ms / max(est_ms, 1e-3)))))

    def _warm(self, step) -> float:
        """Warm-up steps (compilation, allocator); returns the last one's wall time (ms)."""
        from tlora_sim.profiler.layer import Marks, sync

        est = 0.0
        for i in range(1 if self.tiny else 3):
            m = Marks(self.device)
            m.new_iter()
            t0 = time.perf_counter()
            step(i, m)
            sync(self.device)
            est = (time.perf_counter() - t0) * 1e3
        return est

    def _timed(self, step) -> tuple[list[list[float]], int]:
        """Event-timed steps back to back (steady state), then ``host_reps`` steps each started on
        an idle GPU whose host-side time (``self.last_host``, ms per phase) is the launch cost.
        Python's garbage collector is paused while timing (collected before)."""
        import gc

        from tlora_sim.profiler.layer import Marks, sync

        gc.collect()
        gc.disable()
        try:
            reps = self._reps(self._warm(step))
            marks = Marks(self.device)
            for i in range(reps):
                marks.new_iter()
                step(i, marks)
            d = marks.durations_ms()
            host = Marks(self.device, host=True)
            for i in range(self.host_reps):
                sync(self.device)
                host.new_iter()
                step(i, host)
            sync(self.device)
            self.last_host = host.durations_ms()
        finally:
            gc.enable()
        return d, reps

    def _host_ms(self, phases: int | None = None) -> float:
        """Median host time of the last timed step's first ``phases`` phases (ms)."""
        return self._med([sum(r[:phases]) for r in self.last_host]) if self.last_host else float("nan")

    @staticmethod
    def _med(xs):
        xs = sorted(xs)
        n = len(xs)
        return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])

    @staticmethod
    def _q(xs, p):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, max(0, int(round(p * (len(xs) - 1)))))]

    def _error(self, what: str, e: BaseException, **kw):
        msg = f"{what}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        log("ERROR " + msg)
        self.errors.append(msg)
        self.w.row(error=msg[:300], **kw)
        self._free()

    def _free(self):
        import gc

        gc.collect()
        if self.torch.device(self.device).type == "cuda":
            self.torch.cuda.empty_cache()

    def _sets(self, T: int, d_in: int, d_out: int, n: int = 3):
        torch = self.torch
        g = torch.Generator(device=self.device).manual_seed(T)
        out = []
        for _ in range(1 if self.tiny else n):
            x = torch.randn(T, d_in, device=self.device, generator=g).to(torch.bfloat16).requires_grad_(True)
            dy = torch.randn(T, d_out, device=self.device, generator=g).to(torch.bfloat16)
            out.append((x, dy))
        return out

    # -- ceilings
    def ceilings(self):
        torch = self.torch
        if torch.device(self.device).type != "cuda":
            return {}
        a = torch.randn(8192, 8192, device=self.device, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=self.device, dtype=torch.bfloat16)

        def mm(i, m):
            m.mark()
            a @ b
            m.mark()

        d, _ = self._timed(mm)
        rate = 2 * 8192 ** 3 / (self._med([r[0] for r in d]) / 1e3)
        del a, b
        n = 1 << 29
        src = torch.randn(n, device=self.device, dtype=torch.bfloat16)
        dst = torch.empty_like(src)

        def cp(i, m):
            m.mark()
            dst.copy_(src)
            m.mark()

        d, _ = self._timed(cp)
        bw = 4 * n / (self._med([r[0] for r in d]) / 1e3)
        del src, dst
        self._free()
        self.w.row(kind="ceiling", model="", plan="matmul_flops", step_ms=rate / 1e12, impl="bf16 8192^3 TFLOP/s")
        self.w.row(kind="ceiling", model="", plan="copy_bw", step_ms=bw / 1e9, impl="d2d GB/s (read+write)")
        log(f"ceilings: bf16 matmul {rate / 1e12:.0f} TFLOP/s, copy {bw / 1e9:.0f} GB/s")
        return {"matmul_flops": rate, "copy_bw": bw}

    # -- optimizer
    def optimizer(self, configs, deadline: float):
        torch = self.torch
        for P, nt in configs:
            if time.time() > deadline:
                break
            try:
                per = max(1, P // nt)
                g = torch.Generator(device=self.device).manual_seed(nt)
                ps = [torch.randn(per, device=self.device, generator=g).to(torch.bfloat16).requires_grad_(True)
                      for _ in range(nt)]
                for p in ps:
                    p.grad = torch.randn_like(p) * 1e-3
                opt = self._adamw(ps)

                def step(i, m):
                    m.mark()
                    opt.step()
                    m.mark()

                d, reps = self._timed(step)
                t = [r[0] for r in d]
                self.w.row(kind="opt", model="", plan="", impl="adamw-fused" if self._cuda() else "adamw-foreach",
                           params=per * nt, tensors=nt, opt_ms=self._med(t), step_ms=self._med(t),
                           p10_ms=self._q(t, .1), p90_ms=self._q(t, .9), reps=reps, host_ms=self._host_ms())
                del ps, opt
            except Exception as e:  # noqa: BLE001
                self._error(f"opt P={P} tensors={nt}", e, kind="opt", params=P, tensors=nt)
        self._free()

    def _cuda(self) -> bool:
        return self.torch.device(self.device).type == "cuda"

    def _adamw(self, params):
        torch = self.torch
        if self._cuda():
            return torch.optim.AdamW(params, lr=1e-4, fused=True)
        return torch.optim.AdamW(params, lr=1e-4, foreach=True)

    # -- layer components
    def noattn(self, base, model: str, tokens: list[int], deadline: float, attn: str = "skip", seq: int = 0):
        from tlora_sim.profiler.layer import LoRASet, layer_forward

        torch = self.torch
        d = base.shape.hidden
        for T in tokens:
            if time.time() > deadline:
                break
            s = seq if seq else T
            if T % s:
                continue
            members = [(0, T // s, s)]
            try:
                lora = LoRASet(base, members, "none")
                sets = self._sets(T, d, d)

                def step(i, m, lora=lora, sets=sets):
                    x, dy = sets[i % len(sets)]
                    m.mark()
                    y = layer_forward(base, lora, x, attn)
                    m.mark()
                    torch.autograd.grad(y, [x], dy)
                    m.mark()

                dd, reps = self._timed(step)
                mem = self._mem(lambda: layer_forward(base, lora, sets[0][0], attn),
                                lambda y: torch.autograd.grad(y, [sets[0][0]], sets[0][1]))
                tot = [sum(r) for r in dd]
                self.w.row(kind="noattn" if attn == "skip" else "base", model=model, impl="none", n_adapters=0,
                           batch_sizes=T // s, seq_lens=s, tokens=T, fwd_ms=self._med([r[0] for r in dd]),
                           bwd_ms=self._med([r[1] for r in dd]), step_ms=self._med(tot), p10_ms=self._q(tot, .1),
                           p90_ms=self._q(tot, .9), reps=reps, host_ms=self._host_ms(), static_bytes=base.nbytes(),
                           **mem)
                del sets, lora
            except Exception as e:  # noqa: BLE001
                self._error(f"{model} {'noattn' if attn == 'skip' else 'base'} T={T}", e,
                            kind="noattn" if attn == "skip" else "base", model=model, tokens=T)

    def attn(self, base, model: str, seqs: list[int], batches: list[int], t_max: int, deadline: float):
        from tlora_sim.profiler.layer import attention_block

        torch = self.torch
        sh = base.shape
        qd, kvd = sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim
        for s in seqs:
            for b in batches:
                T = b * s
                if T > t_max or time.time() > deadline:
                    continue
                try:
                    g = torch.Generator(device=self.device).manual_seed(T + s)
                    sets = []
                    for _ in range(1 if self.tiny else 2):
                        q, k, v = (torch.randn(T, w, device=self.device, generator=g).to(torch.bfloat16)
                                   .requires_grad_(True) for w in (qd, kvd, kvd))
                        dy = torch.randn(T, qd, device=self.device, generator=g).to(torch.bfloat16)
                        sets.append((q, k, v, dy))
                    groups = [(s, 0, T)]

                    def step(i, m, sets=sets, groups=groups):
                        q, k, v, dy = sets[i % len(sets)]
                        m.mark()
                        o = attention_block(base, q, k, v, groups)
                        m.mark()
                        torch.autograd.grad(o, [q, k, v], dy)
                        m.mark()

                    dd, reps = self._timed(step)
                    q, k, v, dy = sets[0]
                    mem = self._mem(lambda: attention_block(base, q, k, v, groups),
                                    lambda o: torch.autograd.grad(o, [q, k, v], dy))
                    tot = [sum(r) for r in dd]
                    self.w.row(kind="attn", model=model, impl="sdpa", batch_sizes=b, seq_lens=s, tokens=T,
                               fwd_ms=self._med([r[0] for r in dd]), bwd_ms=self._med([r[1] for r in dd]),
                               step_ms=self._med(tot), p10_ms=self._q(tot, .1), p90_ms=self._q(tot, .9), reps=reps,
                               host_ms=self._host_ms(), **mem)
                    del sets
                except Exception as e:  # noqa: BLE001
                    self._error(f"{model} attn s={s} b={b}", e, kind="attn", model=model, seq_lens=s, batch_sizes=b)

    def head(self, shape, model: str, tokens: list[int], deadline: float):
        import torch.nn.functional as F

        from tlora_sim.profiler.layer import rmsnorm

        torch = self.torch
        try:
            g = torch.Generator(device=self.device).manual_seed(3)
            d, V = shape.hidden, shape.vocab
            emb = (torch.randn(V, d, device=self.device, generator=g) * 0.02).to(torch.bfloat16)
            Wh = (torch.randn(V, d, device=self.device, generator=g) / math.sqrt(d)).to(torch.bfloat16)
            nf = torch.ones(d, device=self.device, dtype=torch.bfloat16)
        except Exception as e:  # noqa: BLE001
            self._error(f"{model} head weights", e, kind="head", model=model)
            return
        for T in tokens:
            if time.time() > deadline:
                break
            try:
                idx = torch.randint(0, V, (T,), device=self.device, generator=g)
                lab = torch.randint(0, V, (T,), device=self.device, generator=g)
                hs = [torch.randn(T, d, device=self.device, generator=g).to(torch.bfloat16).requires_grad_(True)
                      for _ in range(1 if self.tiny else 2)]

                def fwd(h):
                    emb[idx]  # the embedding lookup of the step (frozen: no gradient)
                    logits = F.linear(rmsnorm(h, nf), Wh)
                    return F.cross_entropy(logits.float(), lab)

                def step(i, m, hs=hs):
                    h = hs[i % len(hs)]
                    m.mark()
                    loss = fwd(h)
                    m.mark()
                    torch.autograd.grad(loss, [h])
                    m.mark()

                dd, reps = self._timed(step)
                mem = self._mem(lambda: fwd(hs[0]), lambda loss: torch.autograd.grad(loss, [hs[0]]))
                tot = [sum(r) for r in dd]
                self.w.row(kind="head", model=model, impl="embed+norm+lm_head+ce", tokens=T,
                           fwd_ms=self._med([r[0] for r in dd]), bwd_ms=self._med([r[1] for r in dd]),
                           step_ms=self._med(tot), p10_ms=self._q(tot, .1), p90_ms=self._q(tot, .9), reps=reps,
                           host_ms=self._host_ms(), static_bytes=2 * (emb.numel() + Wh.numel()), **mem)
                del hs
            except Exception as e:  # noqa: BLE001
                self._error(f"{model} head T={T}", e, kind="head", model=model, tokens=T)
        del emb, Wh
        self._free()

    def minimodel(self, shape, model: str, members, plan: str, layers: int = 8) -> bool:
        """A stack of ``layers`` decoder layers, each with its own frozen weights and adapters,
        trained as in a model (forward, ``loss.backward()``; kind ``model``): the per-layer time
        inside a model, to compare with the one-layer rows of the same mix."""
        from tlora_sim.profiler.layer import BaseWeights, LoRASet, layer_forward

        torch = self.torch
        impl = PLAN_IMPL[plan]
        if impl == "fused":
            impl = self.fused_impl()
        T = sum(b * s for _, b, s in members)
        info = dict(kind="model", layers=layers, model=model, plan=plan, impl=impl,
                    kernel_variant=variant(impl, self.prov), n_adapters=len(members),
                    ranks=";".join(str(m[0]) for m in members), batch_sizes=";".join(str(m[1]) for m in members),
                    seq_lens=";".join(str(m[2]) for m in members), tokens=T)
        try:
            bases = [BaseWeights(shape, self.device, seed=50 + i) for i in range(layers)]
            loras = [LoRASet(b, members, impl, seed=60 + i) for i, b in enumerate(bases)]
            sets = self._sets(T, shape.hidden, shape.hidden)

            def step(i, m):
                x, dy = sets[i % len(sets)]
                m.mark()
                y = x.detach()
                for b, lo in zip(bases, loras):
                    y = layer_forward(b, lo, y)
                loss = (y.float() * dy.float()).sum()
                m.mark()
                loss.backward()
                m.mark()
                for lo in loras:
                    for p in lo.params:
                        p.grad = None

            dd, reps = self._timed(step)
            st = [r[0] + r[1] for r in dd]
            self.w.row(**info, fwd_ms=self._med([r[0] for r in dd]), bwd_ms=self._med([r[1] for r in dd]),
                       step_ms=self._med(st), p10_ms=self._q(st, .1), p90_ms=self._q(st, .9), reps=reps,
                       host_ms=self._host_ms(2))
            del bases, loras, sets
            self._free()
            return True
        except Exception as e:  # noqa: BLE001
            self._error(f"{model} model-stack {plan} {mix_key(members)}", e, **info)
            return False

    def _mem(self, fwd, bwd) -> dict:
        from tlora_sim.profiler.layer import measure_memory

        try:
            return measure_memory(fwd, bwd, self.device)
        except Exception as e:  # noqa: BLE001
            log(f"memory measurement failed: {e!r}")
            self._free()
            return {"saved_bytes": "", "peak_bytes": ""}

    # -- mixes
    def fused_impl(self) -> str:
        return "fused" if self.fused_ok is not False else "padded"

    def mix(self, base, model: str, members, plan: str, stack: int = 0):
        """One mix under one plan. ``stack`` > 1: the layer applied ``stack`` times in one step
        (same weights and adapters; kind ``stack``): the difference to one layer is the per-layer
        cost inside a model, without the harness's per-call (autograd.grad) overhead."""
        from tlora_sim.profiler.layer import LoRASet, layer_forward

        torch = self.torch
        impl = PLAN_IMPL[plan]
        if impl == "fused":
            impl = self.fused_impl()
        d = base.shape.hidden
        T = sum(b * s for _, b, s in members)
        info = dict(kind="stack" if stack else "mix", layers=max(stack, 1), model=model, plan=plan, impl=impl,
                    kernel_variant=variant(impl, self.prov),
                    n_adapters=len(members), ranks=";".join(str(m[0]) for m in members),
                    batch_sizes=";".join(str(m[1]) for m in members),
                    seq_lens=";".join(str(m[2]) for m in members), tokens=T)
        try:
            lora = LoRASet(base, members, impl)
            sets = self._sets(T, d, d)
            opt = self._adamw(lora.params)

            def step(i, m):
                x, dy = sets[i % len(sets)]
                m.mark()
                y = x
                for _ in range(max(stack, 1)):
                    y = layer_forward(base, lora, y)
                m.mark()
                grads = torch.autograd.grad(y, [x] + lora.params, dy)
                m.mark()
                for p, g in zip(lora.params, grads[1:]):
                    p.grad = g
                opt.step()
                m.mark()
                for p in lora.params:
                    p.grad = None

            dd, reps = self._timed(step)
            if impl == "fused":
                self.fused_ok = True
            x0, dy0 = sets[0]
            mem = self._mem(lambda: layer_forward(base, lora, x0),
                            lambda y: torch.autograd.grad(y, [x0] + lora.params, dy0))
            st = [r[0] + r[1] for r in dd]
            adapter_bytes = sum(p.numel() * p.element_size() for p in lora.params)
            self.w.row(**info, fwd_ms=self._med([r[0] for r in dd]), bwd_ms=self._med([r[1] for r in dd]),
                       opt_ms=self._med([r[2] for r in dd]), step_ms=self._med(st), p10_ms=self._q(st, .1),
                       p90_ms=self._q(st, .9), reps=reps, host_ms=self._host_ms(2), params=lora.adapter_params(),
                       tensors=len(lora.params),
                       static_bytes=base.nbytes() + adapter_bytes, **mem)
            del lora, sets, opt
            return True
        except Exception as e:  # noqa: BLE001
            oom = "out of memory" in str(e).lower()
            if impl == "fused" and self.fused_ok is None and not oom:
                self.fused_ok = False
                log("the fused kernel failed on its first mix; fused rows use the labelled torch fallback "
                    "(padded bmm) from here on")
            self._error(f"{model} mix {plan} {mix_key(members)}", e, **info)
            return False


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

    from tlora_sim.profiler.kernels import multilora

    keys = {}
    for mem in mixes:
        bk = tuple(sorted({multilora._bucket(r) for r, _, _ in mem}))
        keys.setdefault(bk, tuple(sorted({r for r, _, _ in mem})))
    t0 = time.time()
    try:
        with mp.get_context("spawn").Pool(min(workers, len(keys))) as pool:
            pool.starmap(_precompile_one, [(v, device) for v in keys.values()])
        log(f"precompiled fused kernels for {len(keys)} rank-bucket sets in {time.time() - t0:.1f} s")
    except Exception as e:  # noqa: BLE001 (the main process compiles lazily anyway)
        log(f"precompile failed ({e!r}); compiling lazily")


# --------------------------------------------------------------------------------------- driver
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``tlora-sim profile`` (also ``python3 -m tlora_sim.profiler.profile``)."""
    p.add_argument("--gpu-name", default="auto", help="GPU type recorded in the rows (auto: from the device name)")
    p.add_argument("--models", default="llama3-8b,qwen3-8b,qwen2.5-32b,llama3-70b",
                   help="comma-separated catalog models (sim/costmodel/models.py)")
    p.add_argument("--quick", action="store_true", help="the quick grid (under 10 minutes on one GPU)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output directory")
    p.add_argument("--device", default="cuda", help="cuda or cpu (cpu: a dry run; use --tiny)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU tests): one tiny model, a few mixes")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="stop starting new measurements after this many seconds (0: 540 with --quick, else none)")
    p.add_argument("--plans", default="alone,loop,fused", help="plans to measure")
    p.add_argument("--e2e", action="store_true", help="also run the full-model end-to-end check (profiler/e2e.py)")
    p.add_argument("--e2e-only", action="store_true", help="only the end-to-end check")
    p.add_argument("--no-precompile", action="store_true", help="compile the fused kernels lazily")
    p.add_argument("--random-mixes", type=int, default=0, help="random heterogeneous mixes per model "
                                                              "(0: 20 quick, 60 full, 3 tiny)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random mixes")
    p.add_argument("--minimodel", action="store_true",
                   help="for the first model also time mixes in an 8-layer stack trained as a model (kind model)")
    p.add_argument("--e2e-start", action="store_true", help="also run the end-to-end check at the start")
    p.add_argument("--stack", action="store_true",
                   help="also time a few mixes with the layer stacked 1x and 3x (the harness's per-call overhead)")


def run(args) -> int:
    """Run a profile; returns the exit status."""
    import torch

    from tlora_sim.sim.costmodel.models import get_model
    from tlora_sim.profiler.layer import TINY, BaseWeights, shape_of

    t_start = time.time()
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("profile: no CUDA device; use --device cpu --tiny for a dry run", file=sys.stderr)
        return 2
    mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
    budget = args.budget_s or (540.0 if args.quick else 1e9)
    deadline = t_start + budget
    prov = provenance(device, args.gpu_name, mode)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = prov["gpu"]
    w = Writer(out / f"profile_{gpu.lower()}.csv", prov)
    prof = Profiler(device, w, prov, quick=args.quick or args.tiny, tiny=args.tiny)
    plans = [p.strip() for p in args.plans.split(",") if p.strip()]
    log(f"profile {prov['profile_id']}: {prov['gpu_name']} driver {prov['driver']} torch {prov['torch']} "
        f"triton {prov['triton']} commit {prov['git_commit'][:12]} kernels {prov['kernel_hash']}; mode {mode}, "
        f"budget {budget:.0f} s")
    if args.tiny:
        models = [TINY]
        grids = {"tiny": dict(tokens=[16, 32, 64], seqs=[16, 32], batches=[1, 2], head=[16, 64], t_max=64,
                              mixes=[order_members(m) for m in
                                     ([(4, 1, 16)], [(2, 1, 16), (8, 2, 16)], [(16, 1, 32), (4, 1, 16), (2, 2, 16)])])}
    else:
        models = [shape_of(get_model(m.strip())) for m in args.models.split(",") if m.strip()]
        grids = {}
        for sh in models:
            t_max = (T_MAX_QUICK if args.quick else T_MAX_FULL).get(sh.name, 16384)
            nr = args.random_mixes or (20 if args.quick else 60)
            grids[sh.name] = dict(tokens=spread(token_grid(t_max)), seqs=list(SEQS),
                                  batches=[1, 2, 4, 8, 16, 32, 64], head=spread(token_grid(min(t_max, 16384))),
                                  t_max=t_max, mixes=quick_mixes(sh.name, t_max, nr, args.seed))
    meta = {"provenance": prov, "args": {k: str(v) for k, v in vars(args).items() if k != "func"},
            "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    e2e_done = not (args.e2e or args.e2e_only)
    from tlora_sim.profiler.layer import choose_gqa

    meta["sdpa_gqa"] = choose_gqa(device)
    log(f"SDPA grouped-query attention: {meta['sdpa_gqa']}")
    (out / f"meta_{gpu.lower()}.json").write_text(json.dumps(meta, indent=1))
    try:
        if args.e2e_start:
            _run_e2e(args, device, prov, out, t_start, deadline, tiny=args.tiny)
        if not args.e2e_only:
            meta["ceilings"] = prof.ceilings()
            opt_cfgs = ([(5000, 14), (20000, 56)] if args.tiny else
                        [(P, nt) for nt in (448, 1792, 7168) for P in (4_000_000, 40_000_000, 300_000_000)])
            prof.optimizer(opt_cfgs, deadline)
            if "fused" in plans and prof._cuda() and not args.no_precompile:
                precompile([m for g in grids.values() for m in g["mixes"]], device)
        for i, sh in enumerate(models):
            if args.e2e_only:
                break
            g = grids[sh.name]
            now = time.time()
            left = deadline - now - (0 if e2e_done else 75.0)
            wsum = sum(MODEL_WEIGHT.get(m.name, 1.0) for m in models[i:])
            mdl_deadline = now + max(0.0, left) * MODEL_WEIGHT.get(sh.name, 1.0) / wsum
            log(f"{sh.name}: budget {mdl_deadline - now:.0f} s, {len(g['mixes'])} mixes")
            try:
                base = BaseWeights(sh, device)
            except Exception as e:  # noqa: BLE001
                prof._error(f"{sh.name} weights", e, kind="noattn", model=sh.name)
                continue
            comp_deadline = now + 0.3 * (mdl_deadline - now)
            prof.noattn(base, sh.name, g["tokens"], comp_deadline)
            prof.attn(base, sh.name, g["seqs"], g["batches"], g["t_max"], comp_deadline)
            prof.head(sh, sh.name, g["head"], comp_deadline)
            if not args.tiny:  # the full frozen layer at a few points: does base + attention add up?
                pts = [(2048, 512), (8192, 2048), (16384, 4096)]
                for T, s in pts:
                    if T <= g["t_max"]:
                        prof.noattn(base, sh.name, [T], comp_deadline, attn="sdpa", seq=s)
            n_rows = 0
            for mem in g["mixes"]:
                if time.time() > mdl_deadline:
                    log(f"{sh.name}: budget reached after {n_rows} mix rows")
                    break
                for plan in plans:
                    if (plan == "alone" and len(mem) != 1) or (plan == "loop" and len(mem) == 1):
                        continue  # one adapter in a loop is a job alone (the same code)
                    n_rows += prof.mix(base, sh.name, mem, plan)
            log(f"{sh.name}: {n_rows} mix rows")
            if args.minimodel and i == 0:
                n_mm = 0
                for mem in (g["mixes"][:2] if args.tiny else MINI_MIXES):
                    for plan in ("alone", "fused") if len(mem) == 1 else ("loop", "fused"):
                        n_mm += prof.mix(base, sh.name, order_members(mem), plan, stack=1)
                        n_mm += prof.minimodel(sh, sh.name, order_members(mem), plan, layers=2 if args.tiny else 8)
                log(f"{sh.name}: {n_mm} mini-model rows")
            if args.stack and not args.tiny:
                n_st = 0
                for mem in STACK_MIXES:
                    for plan in ("alone", "fused") if len(mem) == 1 else ("loop", "fused"):
                        for k in (1, 3):
                            if time.time() > mdl_deadline + 20:
                                break
                            n_st += prof.mix(base, sh.name, order_members(mem), plan, stack=k)
                log(f"{sh.name}: {n_st} stack rows")
            del base
            prof._free()
            if not e2e_done and sh.name in ("llama3-8b", "tiny"):
                _run_e2e(args, device, prov, out, t_start, deadline, tiny=args.tiny)
                e2e_done = True
        if not e2e_done:
            _run_e2e(args, device, prov, out, t_start, deadline + 75.0, tiny=args.tiny)
    finally:
        meta["errors"] = prof.errors
        meta["fused_kernel_ok"] = prof.fused_ok
        meta["rows"] = w.n
        meta["elapsed_s"] = round(time.time() - t_start, 1)
        (out / f"meta_{gpu.lower()}.json").write_text(json.dumps(meta, indent=1))
        w.close()
    log(f"done: {w.n} rows in {time.time() - t_start:.0f} s, {len(prof.errors)} errors -> {out}")
    return 0


def _run_e2e(args, device, prov, out, t_start, deadline, tiny):
    from tlora_sim.profiler import e2e

    try:
        e2e.run(device, prov, out, deadline=deadline, tiny=tiny)
    except Exception as ex:  # noqa: BLE001
        log(f"e2e failed: {ex!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tlora_sim.profiler.profile", description=__doc__.split("\n")[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
