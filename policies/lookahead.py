"""``lookahead`` (ours): tLoRA's grouping, configured: shortest-remaining-first priority order on
predicted LoRA durations with a starvation guard (``srpt-aged``), EASY backfilling that tries the later jobs shortest first, joins chosen
by marginal throughput, and tLoRA's promise kept against the fused kernel with the regroup pause
priced.

Why it should beat tLoRA: LoRA fine-tuning jobs have predictable durations (steps x a step time
the cost model knows), so the scheduler can order the queue by predicted remaining isolated
runtime (SRPT, which minimises mean completion time on one server, Schrage 1968) instead of
tLoRA's response-ratio urgency, which lets long jobs that waited a while overtake short ones.
Pure SRPT never lets a long multi-GPU job ahead of a stream of short ones, so it never holds
EASY's reservation and waits without bound (on ITP cluster02 that cost up to 12% of average JCT
on one seed); with ``order="srpt-aged"`` a job that has waited more than
``ordering.AGING_FACTOR`` = 3 of its own isolated runtimes goes first (the most urgent such job
first) and holds the reservation; the rest stay in SRPT order.
When the first job in order cannot start, EASY backfilling fills the GPUs it leaves idle, trying
the later jobs shortest first (``backfill_order="sjf"``: the ones most likely to finish before
the reservation, and the ones whose completion lowers the mean most), so the edge stays even
where the priority order is set to FIFO for every policy (``compare --discipline shared``).
Joins pick the group with the largest predicted rise of collective throughput (``join_rule =
"throughput"``, ``tlora/rules.py`` ``throughput_target``) rather than the most residual capacity. Everything else
(slowdown bounds against the fused kernel, the join test's pause, binary-cut search, tiers,
nano-batching, the incremental index) is tLoRA's: this module only names a configuration of
``TLoRA`` through its public config (``tlora-ref`` with ``--option tlora-ref.join_rule=throughput``
and this config's order is its plain reading).
"""

from __future__ import annotations

from dataclasses import dataclass

from tlora_sim.policies.registry import register
from tlora_sim.policies.tlora import TLoRA, TLoRAConfig


@dataclass(frozen=True)
class LookaheadConfig(TLoRAConfig):
    """tLoRA's options with SRPT order and its starvation guard, shortest-first backfilling and
    the throughput join rule."""

    order: str = "srpt-aged"
    backfill_order: str | None = "sjf"
    join_rule: str = "throughput"


@register("lookahead", LookaheadConfig, "ours: tLoRA grouping with SRPT order (starvation-guarded) on predicted LoRA durations, "
                                         "EASY backfilling shortest first, joins by marginal throughput")
class Lookahead(TLoRA):
    """``TLoRA`` with ``LookaheadConfig`` as its default configuration (no behaviour of its own)."""

    name = "lookahead"

    def __init__(self, config: LookaheadConfig | None = None) -> None:
        super().__init__(config or LookaheadConfig())
