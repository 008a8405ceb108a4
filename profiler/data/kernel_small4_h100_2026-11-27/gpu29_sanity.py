"""helper 29: small4 (ranks 2/4/8/16, 128 tokens each; bf16, dropout 0.1) on 4096x4096 and
4096x14336, three steps of the two-launch path (default: _tb at two programs per SM; and
tiny_ctas 1, session 19's rule) against the four-launch path and the float64 reference, before
any timing (a hang shows here); prints each bound tiny launch's grid, options and the compiled
kernel's registers / shared memory / resident CTAs per SM."""
import torch
from tlora_sim.profiler.kernels import KernelConfig, build_plan, multi_lora_linear, reference_forward_backward
from tlora_sim.profiler.kernels.tiny import resident_ctas, tiny_plan
from tlora_sim.profiler.kernels.program import ForwardProgram


def info(bl, dyn):
    kw = dict(bl.static, **dict(zip(bl.dynamic, dyn)))
    k = bl.kernel.warmup(grid=(1,), num_stages=bl.start_stages or 3, **kw, **bl.options)
    w = bl.options.get("num_warps", 4)
    return (f"grid {bl.grid[0]} options {bl.options} regs {k.n_regs} shared {k.metadata.shared} "
            f"resident/SM {resident_ctas(k, w, 'cuda')}")


if __name__ == "__main__":
    worst = 0.0
    for K, N in ((4096, 4096), (4096, 14336)):
        segs, ranks = [128] * 4, [2, 4, 8, 16]
        g = torch.Generator().manual_seed(K + N)
        M, R = sum(segs), sum(ranks)
        bf = dict(dtype=torch.bfloat16, device="cuda")
        x = torch.randn(M, K, generator=g).to(**bf); W = (torch.randn(N, K, generator=g) / 64).to(**bf)
        A = (torch.randn(R, K, generator=g) / 64).to(**bf); B = torch.randn(R, N, generator=g).to(**bf)
        dy = torch.randn(M, N, generator=g).to(**bf)
        sc = [0.5, 1.0, 1.5, 2.0]
        rel = lambda a, b: float((a.double() - b.double()).norm() / b.double().norm())  # noqa: E731
        plans = {"tiny2": build_plan(segs, ranks, sc, 0.1, K, N, "cuda", KernelConfig()),
                 "tiny1": build_plan(segs, ranks, sc, 0.1, K, N, "cuda", KernelConfig(tiny_ctas=1)),
                 "four": build_plan(segs, ranks, sc, 0.1, K, N, "cuda", KernelConfig(tiny_tokens=0))}
        assert tiny_plan(plans["four"], "cuda") is None
        for step in range(3):
            ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=0.1, seed=step)
            outs = {}
            for k, plan in plans.items():
                xx, AA, BB = (t.clone().requires_grad_(True) for t in (x, A, B))
                y = multi_lora_linear(xx, W, AA, BB, plan, seed=step)
                outs[k] = dict(zip(("y", "dx", "dA", "dB"), (y, *torch.autograd.grad(y, [xx, AA, BB], dy))))
            torch.cuda.synchronize()
            for n in ("y", "dx", "dA", "dB"):
                e = {k: rel(outs[k][n], ref[n]) for k in plans}
                worst = max(worst, e["tiny2"], e["tiny1"])
                print(f"{K}x{N} step {step} {n}: tiny2/ref {e['tiny2']:.2e} tiny1/ref {e['tiny1']:.2e} "
                      f"four/ref {e['four']:.2e} tiny2/four {rel(outs['tiny2'][n], outs['four'][n]):.2e} "
                      f"tiny1/four {rel(outs['tiny1'][n], outs['four'][n]):.2e}")
        for k in ("tiny2", "tiny1"):
            f = [v for v in plans[k].extra.values() if isinstance(v, ForwardProgram)][0]
            b = list(f.bwd.values())[0]
            print(k, "tf:", info(f.tiny[-1], (x, A, B, x, x, x, 1, torch.zeros(1, device="cuda"))))
            if b.tiny is not None:
                print(k, "tb:", info(b.tiny[-1], (dy, x, A, B, x, x, A, B, 1)))
            else:
                print(k, "tb: four-launch backward")
    print("SANITY", "OK" if worst < 2e-2 else "FAIL", worst)
    raise SystemExit(0 if worst < 2e-2 else 1)
