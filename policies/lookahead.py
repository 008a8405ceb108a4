"""``lookahead`` (ours): tLoRA's grouping with shortest-remaining-first ordering on predicted
LoRA durations, and joins chosen by marginal throughput.

Why it should beat tLoRA: LoRA fine-tuning jobs have predictable durations (steps x a step time
the cost model knows), so the scheduler can order the queue by predicted remaining isolated
runtime (SRPT, which minimises mean completion time on one server, Schrage 1968) instead of
tLoRA's response-ratio urgency, which lets long jobs that waited a while overtake short ones.
Joins pick the group with the largest predicted rise of collective throughput (marginal
throughput) rather than the most residual capacity, which packs small jobs where they cost
least. Everything else (slowdown bounds, binary-cut search, tiers, nano-batching) is tLoRA's.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.planner import Planner, PlannedGroup
from policies.registry import register
from policies.tlora import TLoRA, TLoRAConfig
from sim.jobs import Job
from sim.snapshot import Snapshot


@dataclass(frozen=True)
class LookaheadConfig(TLoRAConfig):
    """tLoRA's options with shortest-remaining-first ordering by default."""

    ordering: str = "srpt"


@register("lookahead", LookaheadConfig, "ours: tLoRA grouping with SRPT ordering on predicted LoRA durations "
                                         "and joins by marginal throughput")
class Lookahead(TLoRA):
    """tLoRA with SRPT ordering and marginal-throughput joins (see module docstring)."""

    name = "lookahead"

    def _join_target(self, snap: Snapshot, plan: Planner, job: Job, can_start: bool) -> PlannedGroup | None:
        """The group where ``job`` raises collective throughput most."""
        best, best_gain = None, 0.0
        for g in plan.candidates(job):
            step = g.step_time_s(snap, self.plan)
            apart = self.collective_rate(g.members, step) + (1.0 if can_start else 0.0)
            if not self.merge_ok(snap, g, [job], apart):
                continue
            new_step, _ = self._merged(snap, g, [job])
            gain = self.collective_rate(g.members + [job], new_step) - apart
            if gain > best_gain:
                best, best_gain = g, gain
        return best
