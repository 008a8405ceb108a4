"""Jobs: the immutable spec of one LoRA fine-tuning job (trace arrival + assigned LoRA attributes)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Sequence

from tlora_sim.sim.costmodel.interface import Member
from tlora_sim.sim.core.gc_scope import no_collections


@dataclass(frozen=True, slots=True)
class Job:
    """One LoRA fine-tuning job.

    The arrival, GPU demand and duration come from the trace; the LoRA attributes are assigned
    (``tlora_sim.traces.lora``); ``total_steps`` is derived so that the job alone on its requested GPUs runs
    for its traced duration under the cost model (docs/model.md, "The simulation model").

    Attributes:
        index: 0-based position in submit order; the tie-break for every same-time decision.
        job_id: the trace's id.
        submit_time_s: arrival (s from trace start).
        num_gpus: GPUs requested.
        model: base model catalog name (``tlora_sim.sim.costmodel.models``).
        rank: LoRA rank r.
        batch_size: sequences of the whole job per optimizer step (global batch):
            ``micro_batch_per_gpu`` x data-parallel degree of ``parallelism`` x ``grad_accum``.
        seq_len: tokens per sequence.
        total_steps: training steps to run (>= 1).
        trace_duration_s: the trace's duration (s).
        isolated_step_time_s: step time alone on ``num_gpus`` GPUs under the cost model (s).
        max_slowdown: tolerated slowdown while co-located (step time in group / isolated step time).
        tenant: trace tenant or virtual cluster ("" when none).
        sweep_id: hyper-parameter sweep family (ALTO), or None.
        loss_tau: the configuration's loss-curve time constant, a fraction of its steps
            (``tlora_sim.traces.sweeps``).
        loss_floor: final training loss of this configuration under the synthetic loss model
            (``tlora_sim.traces.sweeps``); 0 when the job is not part of a sweep.
        micro_batch_per_gpu: sequences per model replica per micro-batch (>= 1: a sequence is never
            split across data-parallel ranks).
        grad_accum: micro-batches per optimizer step (the simulator runs a step's micro-batches
            together unless a policy sets a group's ``micro_batches``).
        parallelism: the plan the job runs alone under (``sim/costmodel/parallelism.py`` names:
            ``dp8``, ``fsdp16``, ``tp2-dp4``); "" when built without a planner.
    """

    index: int
    job_id: str
    submit_time_s: float
    num_gpus: int
    model: str
    rank: int
    batch_size: int
    seq_len: int
    total_steps: int
    trace_duration_s: float
    isolated_step_time_s: float
    max_slowdown: float = 1.5
    tenant: str = ""
    sweep_id: str | None = None
    loss_floor: float = 0.0
    loss_tau: float = 0.05
    micro_batch_per_gpu: int = 1
    grad_accum: int = 1
    parallelism: str = ""
    member: Member = field(init=False, repr=False, compare=False)

    def __eq__(self, other: object) -> bool:
        # the dataclass's comparison (a tuple of every field but ``member``), after a look at the
        # index, which tells two different jobs apart at once (policies test ``job in group``)
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self.index == other.index and _compared(self) == _compared(other)

    def __post_init__(self) -> None:
        # This job as a member of a super-model group (for the cost model); built once.
        object.__setattr__(self, "member", Member(self.rank, self.batch_size, self.seq_len))

    @property
    def tokens_per_step(self) -> int:
        """Tokens trained per step: batch_size x seq_len."""
        return self.batch_size * self.seq_len

    @property
    def isolated_runtime_s(self) -> float:
        """Run time alone on its requested GPUs: total_steps x isolated step time (s)."""
        return self.total_steps * self.isolated_step_time_s


_compared = attrgetter(*(f.name for f in fields(Job) if f.compare))


def jobs_from_columns(columns: dict[str, Sequence]) -> list[Job]:
    """The jobs ``Job(**row)`` for each row of ``columns`` (every field of :class:`Job` but
    ``member``, one sequence of values per field, all of one length), as the constructor would
    build them, field by field over whole columns: a million jobs in ~1.5 s instead of ~6 s
    (issue 20). Values are stored as given; the caller converts them (``int``/``float``/``str``).
    Jobs with equal (rank, batch_size, seq_len) share one ``member`` (an equal immutable tuple)."""
    names = [f.name for f in fields(Job) if f.name != "member"]
    if set(columns) != set(names):
        raise ValueError(f"jobs_from_columns needs exactly the fields {names}, got {sorted(columns)}")
    n = len(columns["index"])
    new = object.__new__
    with no_collections():  # a million jobs in a row
        jobs = [new(Job) for _ in range(n)]
    for name in names:
        col = columns[name]
        if len(col) != n:
            raise ValueError(f"column {name!r} has {len(col)} values, not {n}")
        deque(map(Job.__dict__[name].__set__, jobs, col), maxlen=0)  # the slot's setter, as __init__ uses
    shared: dict = {}
    members = [shared.get(k) or shared.setdefault(k, Member(*k))
               for k in zip(columns["rank"], columns["batch_size"], columns["seq_len"])]
    deque(map(Job.__dict__["member"].__set__, jobs, members), maxlen=0)
    return jobs
