"""``lookahead`` (ours): tLoRA's algorithm configured with shortest-remaining-first ordering on
predicted LoRA durations and joins chosen by marginal throughput.

Why it should beat tLoRA: LoRA fine-tuning jobs have predictable durations (steps x a step time
the cost model knows), so the scheduler can order the queue by predicted remaining isolated
runtime (SRPT, which minimises mean completion time on one server, Schrage 1968) instead of
tLoRA's response-ratio urgency, which lets long jobs that waited a while overtake short ones.
Joins pick the group with the largest predicted rise of collective throughput (``join_rule =
"throughput"``, ``tlora_join.py``) rather than the most residual capacity. Everything else
(slowdown bounds, binary-cut search, tiers, nano-batching, the incremental index) is tLoRA's:
this module only names a configuration.
"""

from __future__ import annotations

from dataclasses import dataclass

from tlora_sim.policies.registry import register
from tlora_sim.policies.tlora import TLoRA, TLoRAConfig


@dataclass(frozen=True)
class LookaheadConfig(TLoRAConfig):
    """tLoRA's options with SRPT order and the throughput join rule by default."""

    order: str = "srpt"
    join_rule: str = "throughput"


@register("lookahead", LookaheadConfig, "ours: tLoRA grouping with SRPT ordering on predicted LoRA durations "
                                         "and joins by marginal throughput")
class Lookahead(TLoRA):
    """``TLoRA`` with ``LookaheadConfig`` as its default configuration (no behaviour of its own)."""

    name = "lookahead"

    def __init__(self, config: LookaheadConfig | None = None) -> None:
        super().__init__(config or LookaheadConfig())
