"""helper 27: small4 on 4096x4096 (bf16, dropout 0.1), three steps of the two-launch path against
the four-launch path and the float64 reference, before any timing (a hang shows here)."""
import torch
from tlora_sim.profiler.kernels import KernelConfig, build_plan, multi_lora_linear, reference_forward_backward
from tlora_sim.profiler.kernels.tiny import tiny_plan
segs, ranks, K, N = [128] * 4, [2, 4, 8, 16], 4096, 4096
g = torch.Generator().manual_seed(0)
M, R = sum(segs), sum(ranks)
bf = dict(dtype=torch.bfloat16, device="cuda")
x = torch.randn(M, K, generator=g).to(**bf); W = (torch.randn(N, K, generator=g) / 64).to(**bf)
A = (torch.randn(R, K, generator=g) / 64).to(**bf); B = torch.randn(R, N, generator=g).to(**bf)
dy = torch.randn(M, N, generator=g).to(**bf)
sc = [0.5, 1.0, 1.5, 2.0]
rel = lambda a, b: float((a.double() - b.double()).norm() / b.double().norm())
plans = {"tiny": build_plan(segs, ranks, sc, 0.1, K, N, "cuda", KernelConfig()),
         "four": build_plan(segs, ranks, sc, 0.1, K, N, "cuda", KernelConfig(tiny_tokens=0))}
print("tiny plan", vars(tiny_plan(plans["tiny"], "cuda")))
assert tiny_plan(plans["four"], "cuda") is None
worst = 0.0
for step in range(3):
    ref = reference_forward_backward(x, W, A, B, segs, ranks, sc, dy, dropout=0.1, seed=step)
    outs = {}
    for k, plan in plans.items():
        xx, AA, BB = (t.clone().requires_grad_(True) for t in (x, A, B))
        y = multi_lora_linear(xx, W, AA, BB, plan, seed=step)
        outs[k] = dict(zip(("y", "dx", "dA", "dB"), (y, *torch.autograd.grad(y, [xx, AA, BB], dy))))
    torch.cuda.synchronize()
    for n in ("y", "dx", "dA", "dB"):
        e1, e2 = rel(outs["tiny"][n], ref[n]), rel(outs["tiny"][n], outs["four"][n])
        e0 = rel(outs["four"][n], ref[n])
        worst = max(worst, e1)
        print(f"step {step} {n}: tiny/ref {e1:.2e} four/ref {e0:.2e} tiny/four {e2:.2e}")
print("SANITY", "OK" if worst < 2e-2 else "FAIL", worst)
raise SystemExit(0 if worst < 2e-2 else 1)
