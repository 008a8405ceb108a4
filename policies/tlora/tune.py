"""tLoRA's nano-batch tuning half (a mixin of ``TLoRA``): one AIMD step per running group per
policy tick (``NanoBatchTuner``), its probes evaluated with the cost model at once."""

from __future__ import annotations

from tlora_sim.policies.nanobatch import NanoBatchTuner
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.snapshot import Action, SetExecution, Snapshot

PROBE_STEPS = 5
"""Training steps a nano-batch probe lasts (a controller's measurement window; see ``_settle_nano``)."""
MAX_PROBES = 8
"""Most probes per group per tick (AIMD from N=1 reaches N=29 in 8 steps of +4)."""


class NanoTuning:
    """The tuner half of ``TLoRA`` (a mixin: it reads the policy's plan, tuners and picture of the
    running groups, ``_live`` and ``_kind_of``)."""

    def _settle_nano(self, snap: Snapshot, kind: tuple[str, int], members: tuple[Job, ...], tuner: NanoBatchTuner,
                     nano: int, micro: int, step_s: float) -> int:
        """Run the AIMD controller's probes for one group on a tick and return the count it settles on.

        Each probe lasts ``PROBE_STEPS`` training steps, as a real controller measures a step time
        over a few steps after the switch; at the step times of these models (0.1-2 s) all the
        probes of one tick take seconds, under 1% of ``tick_s``, so the probes are evaluated with
        the cost model at once and only the settled count runs until the next tick (ours: the
        paper does not say how long a probe lasts). A probe whose predicted step time would take
        any member past its tolerated slowdown (and is no faster than the current count) is not
        run (the paper's promise: no member past its bound); the controller treats it as a failed
        probe. ``kind``: the group's (base model, GPU count); ``members``: its jobs in member order.
        A group running its best count with no gain and no re-probe due settles at once
        (``NanoBatchTuner.steady``: the first observation below, without the loop).
        """
        if tuner.steady(step_s):
            return tuner.best_n if tuner.best_time_s < float("inf") else nano
        bound = adapters = None
        t = step_s
        for _ in range(MAX_PROBES):
            nxt = tuner.observe(t)
            if nxt == tuner.best_n and tuner.has_measured(nxt):  # settled on a count it has measured
                break
            if adapters is None:  # a probe runs: read the group (most ticks settle at once)
                bound = min(map(self.job_bound_s, members))
                adapters = tuple(j.member for j in members)
            t = snap.step_time_s(kind[0], adapters, kind[1], self.plan, nano_batches=nxt, micro_batches=micro)
            if t > max(bound, step_s) * (1 + 1e-12):  # past the bound, and no better than now
                tuner.refuse(nxt)
                t = tuner.best_time_s
        return tuner.best_n if tuner.best_time_s < float("inf") else nano

    defer_steady = True
    """Leave a group unvisited on the ticks its tuner would only observe steadily (``_quiet_ticks``):
    they are applied when it changes or a re-probe falls due (``_wake``). False: visit every
    group on every tick (the plain computation, kept for the tests)."""

    @staticmethod
    def _quiet_ticks(tuner: NanoBatchTuner, step_s: float, nano: int) -> int:
        """How many following ticks of an unchanged group (step time ``step_s``, running ``nano``
        nano-batches) its tuner would observe steadily (``NanoBatchTuner.steady``) without a
        change of count, right after an observation that kept ``nano``."""
        if tuner.n != tuner.best_n or tuner.best_n != nano or step_s < tuner.best_time_s * (1.0 - tuner.threshold):
            return 0
        # The first coming tick compares step_s with best_time_s (checked above); it sets
        # best_time_s = step_s, so every later one compares step_s with itself: never an improvement.
        # So the ticks stay steady while _since_probe + 1 < reprobe_every, unless the threshold is
        # negative: then a repeat of step_s counts as an improvement, and only the first tick is steady.
        rest = max(tuner.reprobe_every - 1 - tuner._since_probe, 0)
        if rest and step_s < step_s * (1.0 - tuner.threshold):
            return 1
        return rest

    def _wake(self, gid: int, upto: int) -> None:
        """Apply a deferred group's steady observations of the ticks up to number ``upto`` (what
        ``steady`` would have recorded on each: the same step time, one more measurement at the
        best count) and stop deferring it."""
        t0, until, step_s = self._steady.pop(gid)
        k = min(upto, until) - t0
        ent = self._tuners.get(gid)
        if k > 0 and ent is not None:
            tuner = ent[0]
            tuner._seen[tuner.n] = step_s
            tuner.best_time_s = step_s
            tuner._since_probe += k

    def _tune(self, snap: Snapshot, tick: bool, changed, skip: set) -> list[Action]:
        """One AIMD step per group per tick, on its current cost-model step time (groups in
        ``skip`` change membership in this decision and are measured next tick). A group whose
        ticks until its next re-probe are steady observations is visited again only then, or when
        it changes (``defer_steady``): the tuners end in the states visiting every group leaves."""
        out: list[Action] = []
        steady = self._steady
        if steady:
            for gid in (list(steady) if changed is None else [g for g in changed if g in steady]):
                self._wake(gid, self._tick_no)
            for gid in skip:
                steady.pop(gid, None)
        if not tick and changed is not None:
            # Between ticks only membership matters: groups that did not change keep their tuner as is,
            # so touch the changed ones and the ones changing now (the full scan below would do the same).
            for gid in skip:
                self._tuners.pop(gid, None)
            for gid in changed:
                if gid in skip:
                    continue
                if gid not in snap.groups:
                    self._tuners.pop(gid, None)
                    continue
                g = snap.groups[gid]
                members = tuple(g.members)
                ent = self._tuners.get(gid)
                if ent is None:
                    self._tuners[gid] = (NanoBatchTuner(n=g.nano_batches), -1.0, members)
                elif ent[2] != members:
                    ent[0].reset()
                    ent[0].n = g.nano_batches
                    self._tuners[gid] = (ent[0], ent[1], members)
            return out
        live = {}
        if tick:
            self._tick_no += 1
        now = self._tick_no
        defer = self.defer_steady and tick and changed is not None
        for gid in snap.groups:  # start order; the state of groups unchanged since is as last noted
            if gid in skip:
                continue
            if gid in steady:
                if steady[gid][1] >= now:  # a steady observation, applied when it is woken
                    live[gid] = self._tuners[gid]
                    continue
                self._wake(gid, now - 1)  # a re-probe is due
            members, step_s, nano, micro, paused_until_s = self._live[gid]
            ent = self._tuners.get(gid)
            tuner, last, seen_members = ent if ent is not None else (NanoBatchTuner(n=nano), -1.0, members)
            if seen_members != members:
                tuner.reset()
                tuner.n = nano
            if tick and paused_until_s <= snap.now_s:
                nxt = self._settle_nano(snap, self._kind_of[gid], members, tuner, nano, micro, step_s)
                if nxt != nano:
                    out.append(SetExecution(gid, nano_batches=nxt, micro_batches=micro))
                elif defer and (k := self._quiet_ticks(tuner, step_s, nano)):
                    steady[gid] = (now, now + k, step_s)
                last = snap.now_s
            live[gid] = (tuner, last, members)
        self._tuners = live
        return out
