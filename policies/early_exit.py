"""Early exit of weak sweep configurations, as a mechanism any policy can run (issue 16).

ALTO (arXiv 2604.05426) stops hyper-parameter configurations whose loss trails their family's
best. Here the rule is shared: ``--early-exit`` (``ReplayConfig.early_exit``) wraps whatever
policy runs (``WithEarlyExit``), so a comparison gives it to every policy or to none, and a
stopped configuration is reported apart from completed jobs (``sim/core/metrics.py``).

The rule (ALTO's, with its published knobs; the numbers are ours where the paper gives none):
on each tick of ``tick_s``, for every family with running configurations, each configuration's
*observed* loss is read from the synthetic loss model with measurement noise
(``tlora_sim.traces.sweeps.observed_loss``); a configuration is *weak* when that loss exceeds
the family's best observed running loss by more than ``gap`` (relative) after at least
``min_progress`` of its steps; one weak on ``patience`` consecutive ticks is stopped
(``StopMembers``), keeping at least ``keep`` configurations per family. Because curves converge
at different speeds and observations are noisy, the rule can stop a configuration that would have
ended best: it is not an oracle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tlora_sim.sim.core.snapshot import Action, Snapshot, StopMembers
from tlora_sim.traces.errors import InputError
from tlora_sim.traces.sweeps import observed_loss


@dataclass(frozen=True)
class EarlyExitConfig:
    """Knobs of the early-exit rule.

    Attributes:
        gap: relative loss gap to the family's best that counts as weak.
        patience: consecutive weak ticks before a stop.
        min_progress: fraction of a configuration's steps before it may stop.
        keep: configurations kept per family at least.
        tick_s: seconds between checks.
    """

    gap: float = 0.05
    patience: int = 3
    min_progress: float = 0.1
    keep: int = 1
    tick_s: float = 600.0

    def __post_init__(self) -> None:
        if not (self.patience >= 1 and self.keep >= 1 and self.gap >= 0 and 0 <= self.min_progress <= 1
                and self.tick_s > 0):
            raise InputError("early exit needs patience >= 1, keep >= 1, gap >= 0, min_progress in [0, 1], "
                             "tick_s > 0", field="early_exit")


class EarlyExitRule:
    """The stateful rule (strikes per configuration); ``stops(snap)`` on each tick."""

    def __init__(self, config: EarlyExitConfig | None = None) -> None:
        self.config = config or EarlyExitConfig()
        self._strikes: dict[int, int] = {}
        self.stopped = 0

    def stops(self, snap: Snapshot, skip: set[int] = frozenset()) -> list[StopMembers]:
        """The configurations to stop now (jobs in ``skip`` are left alone: the policy is moving
        them in this decision)."""
        c = self.config
        families: dict[str, list[tuple]] = {}
        for g in snap.groups.values():
            for job, left in zip(g.members, g.remaining_steps):
                if job.sweep_id and job.index not in skip:
                    done = job.total_steps - left
                    families.setdefault(job.sweep_id, []).append(
                        (job, g.group_id, done, observed_loss(job, done)))
        stops: dict[int, list[int]] = {}
        strikes: dict[int, int] = {}
        for runs in families.values():
            best = min(r[3] for r in runs)
            alive = len(runs)
            for job, gid, done, loss in sorted(runs, key=lambda r: (-r[3], r[0].index)):
                weak = done >= c.min_progress * job.total_steps and loss > best * (1.0 + c.gap)
                strikes[job.index] = self._strikes.get(job.index, 0) + 1 if weak else 0
                if strikes[job.index] >= c.patience and alive > c.keep:
                    stops.setdefault(gid, []).append(job.index)
                    alive -= 1
        self._strikes = strikes
        self.stopped += sum(len(v) for v in stops.values())
        return [StopMembers(gid, tuple(ix)) for gid, ix in sorted(stops.items())]


class WithEarlyExit:
    """Any policy plus the early-exit rule: the policy decides, then on ticks the rule stops weak
    configurations the policy's actions did not touch. Name, plan and config are the policy's
    (``config.json`` records ``early_exit`` among the inputs)."""

    def __init__(self, policy: Any, config: EarlyExitConfig | None = None) -> None:
        self.inner = policy
        self.rule = EarlyExitRule(config)
        self.name, self.plan, self.config = policy.name, policy.plan, getattr(policy, "config", None)
        t = self.rule.config.tick_s
        self.timer_s = min(policy.timer_s, t) if policy.timer_s else t
        self._last_tick = float("-inf")

    def decide(self, snap: Snapshot) -> list[Action]:
        """The policy's actions, then the rule's stops on a tick."""
        out = list(self.inner.decide(snap))
        if snap.now_s - self._last_tick >= self.rule.config.tick_s:
            self._last_tick = snap.now_s
            touched = {i for a in out for i in getattr(a, "job_indices", ())}
            busy = {a.group_id for a in out if hasattr(a, "group_id")}
            out += [s for s in self.rule.stops(snap, touched) if s.group_id not in busy]
        return out
