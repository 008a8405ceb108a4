"""``lorafusion``: LoRAFusion's adapter grouping and micro-batch packing (arXiv 2510.00206).

LoRAFusion fuses LoRA's memory-bound operations into the base GEMMs (its kernels: plan
``lorafusion`` in the cost model, tiles sized for the largest rank of a group) and schedules
multiple adapters jointly: adapters are grouped so that long- and short-sequence jobs pair up
(head-tail pairing of their mean sequence lengths balances the work per micro-batch), and each
group's sequences are bin-packed into as few micro-batches of at most ``microbatch_tokens``
tokens per GPU as possible (``tlora_sim.policies.binpack``: HiGHS MILP with a time limit, greedy
first-fit-decreasing fallback, the better kept). The micro-batch count goes to the cost model.

As a cluster policy: admission in priority order (``order``, arrival by default) with EASY
backfilling (``backfill="easy"``, the default; ``none``: strict FIFO, as LoRAFusion's own
scheduler takes its job list in order); when the queue head's GPUs are free, it forms a group
with the head and up to ``group_size - 1`` queued jobs of the same base model and GPU count from
the next ``window``: the candidates are sorted by sequence length and paired head-to-tail
(longest with shortest); pairs are added, the head's pair first, while the group fits in memory.
No slowdown check; groups are fixed once started (no elastic joins), but their micro-batches are
not: LoRAFusion's scheduler packs each training step's samples from the adapters it is training,
so when a member finishes the policy re-packs the remaining members' sequences and sets the new
micro-batch count (``SetExecution``, no pause). Samples are never split across micro-batches; one
longer than a micro-batch's token capacity fills a micro-batch alone.

Plans: groups of two or more run ``plan_group`` (``lorafusion``); a job that starts alone (no
partner, grouping off, or backfilled) runs ``plan_alone``, by default ``lorafusion`` too (its
kernels over one adapter: the cost model flags the prediction extrapolated where the artifact's
``lorafusion`` fit was profiled with two or more adapters only, its ``coverage.adapters_min``, as
the H100 artifact's; one-adapter rows folded in, ``python -m tlora_sim.profiler.fit fold-in`` after
``profiler/validation/h200_item5.sh`` (issue 43 item 5), make them measured;
``--option lorafusion.plan_alone=fused`` or ``alone`` changes it). Groups are fixed
once started, so a lone job never receives members.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

from tlora_sim.policies.binpack import pack_micro_batches
from tlora_sim.policies.ordering import backfill_starts, ordered, resolve_discipline
from tlora_sim.policies.registry import register
from tlora_sim.traces.errors import InputError
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.snapshot import Action, SetExecution, Snapshot, StartGroup
from tlora_sim.sim.costmodel.interface import check_plan


@dataclass(frozen=True)
class LoRAFusionConfig:
    """Options of ``lorafusion``.

    Attributes:
        group_size: most adapters per group.
        window: queued jobs examined after the head.
        microbatch_tokens: token capacity of a micro-batch per GPU.
        milp_time_limit_s: HiGHS time limit per packing (s).
        grouping: co-locate at all (False = the ordering-only ablation).
        order: priority order (``fifo``, ``urgency``, ``srpt``, ``sjf``).
        backfill: ``easy`` (default), ``conservative`` or ``none`` (strict head-of-line).
        ordering: legacy single option, mapped by ``discipline.LEGACY_ORDERING`` (overrides; None: unused).
        plan_alone: plan of a job that starts alone (``lorafusion``).
        plan_group: plan of groups of two or more (``lorafusion``).
    """

    group_size: int = 4
    window: int = 32
    microbatch_tokens: int = 8192
    milp_time_limit_s: float = 0.5
    grouping: bool = True
    order: str = "fifo"
    backfill: str = "easy"
    ordering: str | None = None
    plan_alone: str = "lorafusion"
    plan_group: str = "lorafusion"

    def __post_init__(self) -> None:
        resolve_discipline(self.order, self.backfill, self.ordering)
        check_plan(self.plan_alone)
        check_plan(self.plan_group)


def head_tail_pairs(jobs: list[Job]) -> list[list[Job]]:
    """Pair jobs by sequence length, longest with shortest (ties by arrival)."""
    s = sorted(jobs, key=lambda j: (j.seq_len, j.index))
    pairs, lo, hi = [], 0, len(s) - 1
    while lo < hi:
        pairs.append([s[hi], s[lo]])
        lo, hi = lo + 1, hi - 1
    if lo == hi:
        pairs.append([s[lo]])
    return pairs


@register("lorafusion", LoRAFusionConfig, "LoRAFusion: head-tail sequence-length grouping, MILP micro-batch "
                                           "packing, fused kernels sized for the largest rank")
class LoRAFusion:
    """Grouping by head-tail pairing plus micro-batch bin packing (see module docstring)."""

    name = "lorafusion"
    timer_s = None  # no timer decisions

    def __init__(self, config: LoRAFusionConfig | None = None) -> None:
        self.config = config or LoRAFusionConfig()
        self.order, self.backfill = resolve_discipline(self.config.order, self.config.backfill, self.config.ordering)
        self.plan = self.config.plan_group
        self.plan_alone = self.config.plan_alone
        if self.config.group_size < 1 or self.config.microbatch_tokens < 1:
            raise InputError("lorafusion needs group_size >= 1 and microbatch_tokens >= 1", field="lorafusion")
        self.packings = {"milp": 0, "greedy": 0}

    def micro_batches(self, members: list[Job], n_gpus: int) -> int:
        """Micro-batches of the group's sequences under the packing (>= 1)."""
        cap = self.config.microbatch_tokens * n_gpus
        sizes = [min(j.seq_len, cap) for j in members for _ in range(j.batch_size)]
        bins, how = pack_micro_batches(sizes, cap, self.config.milp_time_limit_s)
        self.packings[how] += 1
        return max(1, len(bins))

    def repack(self, snap: Snapshot) -> list[Action]:
        """``SetExecution`` for every running group of this plan whose members changed since the
        last decision and whose packing now needs another micro-batch count."""
        out: list[Action] = []
        for gid in (snap.changed if snap.changed is not None else snap.groups):
            g = snap.groups.get(gid)
            if g is None or g.plan != self.plan:
                continue
            mb = self.micro_batches(list(g.members), g.n_gpus)
            if mb != g.micro_batches:
                out.append(SetExecution(gid, g.nano_batches, mb))
        return out

    def decide(self, snap: Snapshot) -> list[Action]:
        """Re-pack changed groups, then form groups for the queue head while its GPUs are free
        (strict FIFO)."""
        free = snap.free.copy()
        out: list[Action] = self.repack(snap)
        taken: set[int] = set()
        queue = ordered(snap, self.order).queue  # read in place: no copy per decision
        for pos, head in enumerate(queue):
            if head.index in taken:
                continue
            if free.find(head.num_gpus) is None:
                break
            members = [head]
            if self.config.grouping:
                cands = list(islice((j for j in islice(queue, pos + 1, None) if j.index not in taken
                                     and j.model == head.model and j.num_gpus == head.num_gpus),
                                    self.config.window))
                pairs = head_tail_pairs([head] + cands)
                pairs.sort(key=lambda p: head not in p)  # the head's pair first, then pairing order
                members = []
                for pair in pairs:
                    trial = members + pair
                    if len(trial) > self.config.group_size:
                        continue
                    if snap.fits_memory(head.model, [j.member for j in trial], head.num_gpus, self.plan,
                                        self.micro_batches(trial, head.num_gpus)):
                        members = trial
                if head not in members:
                    members = [head]
            placement = free.take(head.num_gpus)
            taken.update(j.index for j in members)
            out.append(StartGroup(tuple(j.index for j in members), placement,
                                  self.plan if len(members) > 1 else self.plan_alone,
                                  micro_batches=self.micro_batches(members, head.num_gpus)))
        if self.backfill != "none":
            out += backfill_starts(snap, out, self.plan_alone, queue=queue, rule=self.backfill)
        return out
