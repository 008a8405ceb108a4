"""``tlora-sim costmodel predict``: one step of a job or group, asked of the cost model directly.

Prints the question, the per-GPU mix, the prediction and why any term is extrapolated, and ends
with one machine-readable line::

    step_time_s=X memory_bytes=Y parallelism=Z measured=yes|no

``measured=yes`` where every term came from inside the profiles (the profiled model, no
extrapolation reason); ``no`` otherwise (the roofline model, or a reason printed above).
"""

from __future__ import annotations

from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.traces.errors import InputError


def parse_members(text: str) -> tuple[Member, ...]:
    """``"16:8:1024,8:4:512"`` -> members (rank, sequences per step, tokens per sequence).

    Raises:
        InputError: an entry that is not three positive integers separated by ``:``.
    """
    out = []
    for i, part in enumerate(t for t in text.split(",") if t.strip()):
        bits = part.strip().split(":")
        try:
            r, b, s = (int(x) for x in bits)
        except ValueError:
            raise InputError(f"member {i + 1} {part.strip()!r} is not rank:sequences:seq_len (three integers)",
                             field="--members") from None
        if min(r, b, s) < 1:
            raise InputError(f"member {i + 1} {part.strip()!r}: rank, sequences and seq_len must be >= 1",
                             field="--members")
        out.append(Member(r, b, s))
    if not out:
        raise InputError("no members given", field="--members")
    return tuple(out)


def predict_command(args) -> int:
    """Run ``costmodel predict`` from parsed arguments; returns the exit status."""
    from tlora_sim.sim.costmodel.factory import make_cost_model
    from tlora_sim.sim.costmodel.hardware import GPUS
    from tlora_sim.sim.costmodel.interface import check_plan
    from tlora_sim.sim.costmodel.models import get_model
    from tlora_sim.sim.costmodel.parallelism import parse_parallelism, per_gpu_mixes

    gpu = args.gpu.upper()
    if gpu not in GPUS:
        raise InputError(f"unknown GPU type {args.gpu!r}; known: {', '.join(GPUS)}", field="--gpu")
    get_model(args.model)
    members = parse_members(args.members)
    if args.gpus < 1 or args.nano_batches < 1 or args.micro_batches < 1:
        raise InputError("--gpus, --nano-batches and --micro-batches must be >= 1")
    plan = check_plan(args.plan or ("alone" if len(members) == 1 else "fused"))
    cm = make_cost_model(args.cost_model, gpu, getattr(args, "artifact", None))
    print(f"cost model: {cm.describe().get('artifact', cm.name)}; {args.model} on {args.gpus}x{gpu}, plan {plan}, "
          f"{len(members)} adapter(s): " + ", ".join(f"r{m.rank} {m.batch_size}x{m.seq_len}" for m in members))
    if hasattr(cm, "predict"):
        p = cm.predict(args.model, gpu, members, args.gpus, plan, args.nano_batches, args.micro_batches,
                       parallelism=args.parallelism)
        step, name, reasons = p.step_time_s, p.parallelism, p.reasons
        mem = p.memory_bytes
        if mem != mem:  # one GPU: the memory model answers separately
            mem = cm.memory_bytes(args.model, gpu, members, args.gpus, plan, args.micro_batches)
    else:
        if args.parallelism:
            raise InputError(f"the {cm.name} model has no parallelism planner; drop --parallelism", field="--parallelism")
        step = cm.step_time_s(args.model, gpu, members, args.gpus, plan, args.nano_batches, args.micro_batches)
        mem = cm.memory_bytes(args.model, gpu, members, args.gpus, plan, args.micro_batches)
        name, reasons = cm.parallelism(args.model, gpu, members, args.gpus, plan), ("analytic roofline model",)
    par = parse_parallelism(name, args.gpus)
    mixes = per_gpu_mixes(tuple(members), par, args.micro_batches)
    print(f"parallelism {name}: " + "; ".join(
        "GPU mix " + ", ".join(f"r{r} {b:g}x{s}" for r, b, s in mix) for mix in mixes[:4])
        + (f"; ... ({len(mixes)} GPUs)" if len(mixes) > 4 else ""))
    fits = mem <= GPUS[gpu].memory_bytes
    print(f"step {step * 1e3:.2f} ms, memory {mem / 2**30:.2f} GiB per GPU"
          + ("" if fits else f" (does NOT fit the {GPUS[gpu].memory_bytes / 2**30:.0f} GiB of a {gpu})"))
    if reasons:
        print("extrapolated: " + ", ".join(reasons))
    print(f"step_time_s={step:.6g} memory_bytes={mem:.6g} parallelism={name} measured={'no' if reasons else 'yes'}")
    return 0
