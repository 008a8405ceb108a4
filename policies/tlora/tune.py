"""tLoRA's nano-batch tuners (``rules.settle_nano``, one AIMD step per running group per policy
tick), with the speed machinery of the fast policy: a group whose coming ticks are steady
observations is left unvisited until it changes or a re-probe falls due (``Tuners.defer_steady``)."""

from __future__ import annotations

from typing import Callable, Mapping

from tlora_sim.policies.nanobatch import NanoBatchTuner
from tlora_sim.policies.tlora.rules import settle_nano
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.snapshot import Action, SetExecution, Snapshot


class Tuners:
    """The ``NanoBatchTuner`` of every running group of one simulation.

    Args:
        plan: the plan the groups run (the probes' step times are predicted in it).
        bound_of: a job's largest tolerated step time (s; ``Promise.job_bound_s``).
    """

    def __init__(self, plan: str, bound_of: Callable[[Job], float]) -> None:
        self.plan = plan
        self.bound_of = bound_of
        self.of: dict[int, tuple[NanoBatchTuner, float, tuple]] = {}
        """Group id -> (its tuner, when it last observed (s), the members it tunes)."""
        self.deferred: dict[int, tuple[int, int, float]] = {}
        """Group id -> (tick no., steady through tick no., step s) of a group left unvisited (``wake``)."""
        self.tick_no = 0
        """Ticks so far."""

    defer_steady = True
    """Leave a group unvisited on the ticks its tuner would only observe steadily (``quiet_ticks``):
    they are applied when it changes or a re-probe falls due (``wake``). False: visit every
    group on every tick (the plain computation, kept for the tests)."""

    @staticmethod
    def quiet_ticks(tuner: NanoBatchTuner, step_s: float, nano: int) -> int:
        """How many following ticks of an unchanged group (step time ``step_s``, running ``nano``
        nano-batches) its tuner would observe steadily (``NanoBatchTuner.steady``) without a
        change of count, right after an observation that kept ``nano``."""
        if tuner.n != tuner.best_n or tuner.best_n != nano or step_s < tuner.best_time_s * (1.0 - tuner.threshold):
            return 0
        # The first coming tick compares step_s with best_time_s (checked above); it sets
        # best_time_s = step_s, so every later one compares step_s with itself: never an improvement.
        # So the ticks stay steady while _since_probe + 1 < reprobe_every, unless the threshold is
        # negative: then a repeat of step_s counts as an improvement, and only the first tick is steady.
        rest = max(tuner.reprobe_every - 1 - tuner.since_probe, 0)
        if rest and step_s < step_s * (1.0 - tuner.threshold):
            return 1
        return rest

    def wake(self, gid: int, upto: int) -> None:
        """Apply a deferred group's steady observations of the ticks up to number ``upto`` (what
        ``steady`` would have recorded on each: the same step time, one more measurement at the
        best count) and stop deferring it."""
        t0, until, step_s = self.deferred.pop(gid)
        k = min(upto, until) - t0
        ent = self.of.get(gid)
        if k > 0 and ent is not None:
            ent[0].record_steady(step_s, k)

    def step(self, snap: Snapshot, tick: bool, changed, skip: set, live: Mapping[int, tuple],
             kind_of: Mapping[int, tuple[str, int]]) -> list[Action]:
        """One AIMD step per group per tick, on its current cost-model step time (groups in
        ``skip`` change membership in this decision and are measured next tick). A group whose
        ticks until its next re-probe are steady observations is visited again only then, or when
        it changes (``defer_steady``): the tuners end in the states visiting every group leaves."""
        out: list[Action] = []
        steady = self.deferred
        if steady:
            for gid in (list(steady) if changed is None else [g for g in changed if g in steady]):
                self.wake(gid, self.tick_no)
            for gid in skip:
                steady.pop(gid, None)
        if not tick and changed is not None:
            # Between ticks only membership matters: groups that did not change keep their tuner as is,
            # so touch the changed ones and the ones changing now (the full scan below would do the same).
            for gid in skip:
                self.of.pop(gid, None)
            for gid in changed:
                if gid in skip:
                    continue
                if gid not in snap.groups:
                    self.of.pop(gid, None)
                    continue
                g = snap.groups[gid]
                members = tuple(g.members)
                ent = self.of.get(gid)
                if ent is None:
                    self.of[gid] = (NanoBatchTuner(n=g.nano_batches), -1.0, members)
                elif ent[2] != members:
                    ent[0].reset()
                    ent[0].n = g.nano_batches
                    self.of[gid] = (ent[0], ent[1], members)
            return out
        kept = {}
        if tick:
            self.tick_no += 1
        now = self.tick_no
        defer = self.defer_steady and tick and changed is not None
        for gid in snap.groups:  # start order; the state of groups unchanged since is as last noted
            if gid in skip:
                continue
            if gid in steady:
                if steady[gid][1] >= now:  # a steady observation, applied when it is woken
                    kept[gid] = self.of[gid]
                    continue
                self.wake(gid, now - 1)  # a re-probe is due
            members, step_s, nano, micro, paused_until_s = live[gid]
            ent = self.of.get(gid)
            tuner, last, seen_members = ent if ent is not None else (NanoBatchTuner(n=nano), -1.0, members)
            if seen_members != members:
                tuner.reset()
                tuner.n = nano
            if tick and paused_until_s <= snap.now_s:
                nxt = settle_nano(snap, kind_of[gid], members, tuner, nano, micro, step_s, plan=self.plan,
                                  bound_of=self.bound_of)
                if nxt != nano:
                    out.append(SetExecution(gid, nano_batches=nxt, micro_batches=micro))
                elif defer and (k := self.quiet_ticks(tuner, step_s, nano)):
                    steady[gid] = (now, now + k, step_s)
                last = snap.now_s
            kept[gid] = (tuner, last, members)
        self.of = kept
        return out
