"""The cost-model interface: everything the simulator knows about time and memory goes through it.

Two implementations stand behind it: the analytic roofline model (``tlora_sim.sim.costmodel.roofline``) and the
profiled model built from real-GPU measurements (``profiler``'s shipped artifact). A *plan* names
how a group executes its adapters (docs/costmodel.md, "Reference measurements"):

* ``alone``  - one job by itself: its own base GEMM plus eager (unfused) LoRA, as PEFT runs it.
  The trace's durations were measured this way, so ``isolated_step_time_s`` uses it.
* ``loop``   - one shared base GEMM over the concatenated batch, adapters in a per-adapter loop
  (mLoRA, VLDB'25).
* ``fused``  - one shared base GEMM plus the fused rank-aware multi-LoRA kernel (tLoRA,
  arXiv 2602.07263; this project's ``profiler/kernels``).
* ``lorafusion`` - LoRAFusion's fused kernels (arXiv 2510.00206), whose tiles are sized for the
  largest rank in the group (docs/costmodel.md: 2x-4x the base layer once any adapter has rank >= 64).
* ``grouped`` - ALTO's grouped GEMMs over co-located adapters with rank-local adapter
  parallelism (arXiv 2604.05426): no fusion into the base GEMM's loads.

Two execution knobs refine a plan: ``micro_batches`` B (the group step runs its tokens as B
sequential micro-batches, each re-reading the frozen weights; activations of one micro-batch are
live at a time) and ``nano_batches`` N (tLoRA's nano-batching: each micro-batch is split into N
nano-batches so that LoRA and communication work overlaps the next nano-batch's base GEMMs; only
for the ``fused``, ``lorafusion`` and ``grouped`` plans).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, Sequence, runtime_checkable

from tlora_sim.traces.errors import InputError

PLANS = ("alone", "loop", "fused", "lorafusion", "grouped")


class Member(NamedTuple):
    """One adapter's share of a group step.

    Attributes:
        rank: LoRA rank r.
        batch_size: sequences in its micro-batch.
        seq_len: tokens per sequence.
    """

    rank: int
    batch_size: int
    seq_len: int

    @property
    def tokens(self) -> int:
        """Tokens per step (batch_size x seq_len)."""
        return self.batch_size * self.seq_len


@runtime_checkable
class CostModel(Protocol):
    """Predicts a super-model group's step time and memory.

    ``members`` is the group's adapters; the base model's weights are shared once per group.
    Implementations must be pure (same inputs, same output) so results stay deterministic.
    """

    name: str

    def step_time_s(self, model: str, gpu: str, members: Sequence[Member], n_gpus: int, plan: str,
                    nano_batches: int = 1, micro_batches: int = 1) -> float:
        """Time of one group step, every member training its batch once (s)."""
        ...

    def memory_bytes(self, model: str, gpu: str, members: Sequence[Member], n_gpus: int, plan: str,
                     micro_batches: int = 1) -> float:
        """Peak device memory per GPU of the group (bytes)."""
        ...

    def step_flops(self, model: str, members: Sequence[Member]) -> float:
        """Model FLOPs of one group step (forward + backward, frozen base, no recompute) (FLOP)."""
        ...

    def describe(self) -> dict:
        """Identity and provenance of the model, recorded in a run's ``config.json``."""
        ...

    def batch(self, model: str, gpu: str, n_gpus: int):
        """The vectorised form of the ``fused`` plan's step time for groups of this kind, or None.

        Policies that score many candidate groups per decision (tLoRA) ask it once per kind of
        group (base model, GPU type, GPU count) and evaluate whole arrays of mixes through it
        (``sim/costmodel/profiled/formula.py``: ``row``, ``merge``, ``step_times``, ``REL_MARGIN``,
        ``WIDTH``). None: the model has no batch form there; ask ``step_time_s`` instead.
        """
        ...


def check_plan(plan: str) -> str:
    """Validate a plan name. Raises InputError for an unknown plan."""
    if plan not in PLANS:
        raise InputError(f"unknown execution plan {plan!r}; known: {', '.join(PLANS)}", field="plan")
    return plan
