"""An external policy: co-locate only jobs of equal LoRA rank.

A complete policy module that lives outside the tlora-sim repository. Run it with::

    tlora-sim replay --policy-module equal_rank.py --policy equal-rank \\
        --trace synthetic:jobs=200,seed=1 --cluster 2x8xH100 --out runs/eq

The rule: walk the queue in arrival order; a job joins the first running group of its base model,
GPU count and rank that has room (fewer than ``max_group_size`` members, memory fits); otherwise
it starts a new group of its own if its GPUs are free. Groups run the ``fused`` plan. No timer.
"""

from dataclasses import dataclass

from tlora_sim.policies.api import AddMembers, Snapshot, StartGroup, register


@dataclass(frozen=True)
class EqualRankConfig:
    """Options (``--option equal-rank.max_group_size=4``)."""

    max_group_size: int = 8


@register("equal-rank", EqualRankConfig, "example: co-locate only jobs of equal LoRA rank (docs/examples)")
class EqualRank:
    """Co-locate jobs of one base model, GPU count and rank; FIFO otherwise."""

    plan = "fused"
    timer_s = None

    def __init__(self, config: EqualRankConfig):
        self.config = config

    def decide(self, snap: Snapshot) -> list:
        free = snap.free.copy()
        members = {gid: list(g.adapters) for gid, g in snap.groups.items()}  # incl. this decision's joins
        out = []
        for job in snap.queue:
            target = next((g for g in snap.groups.values()
                           if (g.model, g.n_gpus, g.members[0].rank) == (job.model, job.num_gpus, job.rank)
                           and len(members[g.group_id]) < self.config.max_group_size
                           and snap.fits_memory(job.model, [*members[g.group_id], job.member], g.n_gpus, g.plan)),
                          None)
            if target is not None:
                out.append(AddMembers(target.group_id, (job.index,)))
                members[target.group_id].append(job.member)
                continue
            placement = free.take(job.num_gpus)
            if placement is None:
                break
            out.append(StartGroup((job.index,), placement, self.plan))
        return out
