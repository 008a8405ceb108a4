"""``lookahead`` (ours): tLoRA's grouping with shortest-remaining-first ordering on predicted
LoRA durations, and joins chosen by marginal throughput.

Why it should beat tLoRA: LoRA fine-tuning jobs have predictable durations (steps x a step time
the cost model knows), so the scheduler can order the queue by predicted remaining isolated
runtime (SRPT, which minimises mean completion time on one server, Schrage 1968) instead of
tLoRA's response-ratio urgency, which lets long jobs that waited a while overtake short ones.
Joins pick the group with the largest predicted rise of collective throughput (marginal
throughput) rather than the most residual capacity, which packs small jobs where they cost
least. Everything else (slowdown bounds, binary-cut search, tiers, nano-batching) is tLoRA's,
including its incremental bookkeeping (issue 6): a join answer per job shape stands while nothing
of its kind changed, each unchanged group keeps its gain per job shape, and on large kinds the
batch cost model passes over groups it refuses by more than its margin; the joins are those of
asking every group (``tests/test_tlora_incremental.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tlora_sim.policies.planner import Planner, PlannedGroup
from tlora_sim.policies.registry import register
from tlora_sim.policies.tlora import TLoRA, TLoRAConfig, _group_memo, _job_shape
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.snapshot import Snapshot


@dataclass(frozen=True)
class LookaheadConfig(TLoRAConfig):
    """tLoRA's options with shortest-remaining-first ordering by default."""

    ordering: str = "srpt"


@register("lookahead", LookaheadConfig, "ours: tLoRA grouping with SRPT ordering on predicted LoRA durations "
                                         "and joins by marginal throughput")
class Lookahead(TLoRA):
    """tLoRA with SRPT ordering and marginal-throughput joins (see module docstring)."""

    name = "lookahead"

    def _join_target_search(self, snap: Snapshot, plan: Planner, job: Job, can_start: bool, kind: tuple,
                            jkey: tuple) -> PlannedGroup | None:
        """The group of ``kind`` where ``job`` raises collective throughput most (ties: the earliest
        in start/plan order). Running groups unchanged in this decision are read as the policy's
        own picture of them (no planned copy) and keep their gain for the job's shape, memoised per
        membership version and nano-batch count (``TLoRA._join_target`` keeps the answer per kind)."""
        # the running groups that may take the job, unchanged ones with their picture (the others
        # would refuse it: gain -inf), in start order
        order = self._join_order(snap, plan, job, kind, job.max_slowdown * job.isolated_step_time_s,
                                 1.0 if can_start else 0.0)
        running = [(gid, proto) if proto is not None else (plan.group(gid), None)
                   for _, gid, _, proto in sorted(order, key=lambda t: t[1])]
        best = self._best_gain(snap, running + [(g, None) for g in plan.new_of_kind(kind)], job, can_start, jkey)
        return plan.group(best) if isinstance(best, int) else best

    def _join_target_scan(self, snap: Snapshot, cands, job: Job, can_start: bool) -> PlannedGroup | None:
        """``_join_target_search`` over ``cands`` (snapshots without the engine's kind index)."""
        jkey = _job_shape(job, can_start)
        return self._best_gain(snap, [(g, g if g.group_id is not None and not g.added else None) for g in cands],
                               job, can_start, jkey)

    def _best_gain(self, snap: Snapshot, cands: list[tuple], job: Job, can_start: bool, jkey: tuple):
        """The first of ``cands`` with the largest positive gain (``_gain``). ``cands``: (group or
        running group id with its unchanged view; a group with None), in start/plan order; a group
        id is resolved by the caller."""
        best, best_gain = None, 0.0
        for x, view in cands:
            if view is None:
                gain = self._gain(snap, x, job, can_start)
            else:
                gains = _group_memo(self._scan_memo, view)
                gain = gains.get(jkey)
                if gain is None:
                    gain = gains[jkey] = self._gain(snap, view, job, can_start)
            if gain > best_gain:
                best, best_gain = x, gain
        return best

    def _gain(self, snap: Snapshot, g: PlannedGroup, job: Job, can_start: bool) -> float:
        """Rise of collective throughput if ``job`` joins ``g`` over the two apart (the job counted
        as 1 if it could start alone now); -inf if ``merge_ok`` refuses the join."""
        apart = self.collective_rate(g.members, g.step_time_s(snap, self.plan)) + (1.0 if can_start else 0.0)
        if not self.merge_ok(snap, g, [job], apart):
            return float("-inf")
        new_step, _ = self._merged(snap, g, [job])
        return self.collective_rate(g.members + [job], new_step) - apart
