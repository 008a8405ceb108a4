"""The single-GPU measurements of the profile: ``Profiler`` times GEMM and copy ceilings, the AdamW
step, the frozen layer without attention, attention, the LM head, mini-models and every mix under
each plan, with warm-up, CUDA-event timing, host time and memory, writing one row each."""
from __future__ import annotations

import math
import time
from tlora_sim.profiler.provenance import Writer, log, variant
from tlora_sim.profiler.grid import PLAN_IMPL, mix_key



# --------------------------------------------------------------------------------- measurements
class Profiler:
    """Runs the measurements of one device into a Writer."""

    def __init__(self, device: str, writer: Writer, prov: dict, quick: bool = True, tiny: bool = False):
        import torch

        self.torch = torch
        self.device, self.w, self.prov, self.quick, self.tiny = device, writer, prov, quick, tiny
        self.fused_ok: bool | None = None
        self.errors: list[str] = []
        # rows of mixes a plan's kernels cannot run (LoRAFusion: largest rank < 16, ...): recorded
        # with an error starting "not runnable", counted here by plan, not in ``errors``
        self.not_runnable: dict[str, int] = {}
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
    def impl_variant(self, impl: str) -> str:
        """The kernel variant recorded with a row: ``variant`` for ours, ``lorafusion@<sha12>`` (the
        commit of their copied source) and ``grouped[...]`` (refined from the built LoRASet)."""
        if impl == "lorafusion":
            from tlora_sim.profiler.kernels.lorafusion_ext import source_sha

            return f"lorafusion@{source_sha()[:12]}"
        if impl == "grouped":
            return "grouped"
        return variant(impl, self.prov)

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
                    kernel_variant=self.impl_variant(impl),
                    n_adapters=len(members), ranks=";".join(str(m[0]) for m in members),
                    batch_sizes=";".join(str(m[1]) for m in members),
                    seq_lens=";".join(str(m[2]) for m in members), tokens=T)
        try:
            try:
                lora = LoRASet(base, members, impl)
            except NotImplementedError as e:  # the plan's kernels cannot run this mix
                self.not_runnable[plan] = self.not_runnable.get(plan, 0) + 1
                log(f"{model} mix {plan} {mix_key(members)}: not runnable ({e})")
                self.w.row(error=f"not runnable: {e}"[:300], **info)
                return False
            info["kernel_variant"] = lora.implementation if impl in ("lorafusion", "grouped") else info["kernel_variant"]
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


# --------------------------------------------------------------------------------------- driver
