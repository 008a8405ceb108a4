"""tLoRA's rules (arXiv 2602.07263) as plain functions over the snapshot, readable top to bottom. No
memo, no index: ``reference.py`` is these functions and nothing else (a decision: queue order,
consolidation on ticks, the walk, nano-batching on ticks, EASY backfilling), and ``policy.py``
reaches the same decisions faster (``index.py``).

A *group* is a super-model: jobs of one base model and GPU count trained together on the same GPUs
(``tlora_sim.policies.planner.PlannedGroup``). A job's *bound* is the largest step time it
tolerates in a group (s): ``max_slowdown`` x its isolated step time in the policy's own plan
(``promise.Promise.job_bound_s``). A group's *collective rate* is Σ_i T_iso,i / T_group: progress in
isolated-speed units per second.

1. **Queue order** (``queue_order``): by priority order (tLoRA's: ``urgency``, highest waited
   time over isolated runtime first; ties by shortest isolated runtime (ours: the order as the
   wait goes to 0+, which a real deployment deciding a little after an arrival sees), then by
   tolerated slowdown), ``tlora_sim.policies.ordering``.
2. **Join test** (``merge_ok``): newcomers may join a group when the group stays within
   ``max_group_size``, its step time with them stays within every member's bound (the
   *residual-capacity* test: min_i bound_i - T_group > 0 before, and the merged step time within
   the bound after), it fits in GPU memory, its collective rate beats what the parts do apart by
   ``min_gain``, and, with the regroup pause priced, every member keeps its promise through the
   pause (``budget_ok``).
3. **Join target** (``residual_target``): of the groups a queued job may join, the one with the most
   residual capacity left for it (tLoRA; ties: the earliest in start/plan order).
   ``throughput_target`` is ours (``lookahead``): the largest rise of collective rate.
4. **Walk with binary cut** (``walk_queue``): heads in queue order join their target or start on
   free GPUs while GPU admission is open (a head that can do neither closes it; later heads may
   only join); after each placement the next jobs of the head's kind join as a prefix whose
   length a binary search finds (``binary_cut``).
5. **Consolidation** (``consolidate``): on policy ticks running groups of one kind merge
   pairwise, smaller into larger, partners on the node first, then the rack, then the cluster.
6. **AIMD nano-batching** (``settle_nano``): each group's nano-batch count follows
   ``NanoBatchTuner`` once per tick, never to a count that takes a member past its bound.
"""

from __future__ import annotations

from typing import Callable, Sequence

from tlora_sim.policies.nanobatch import NanoBatchTuner
from tlora_sim.policies.ordering import order_queue
from tlora_sim.policies.planner import Planner, PlannedGroup
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.snapshot import Snapshot

TOL = 1e-12
"""Relative tolerance of every bound comparison (a step time equal to a bound keeps it)."""

MAX_PROBES = 8
"""Most nano-batch probes per group per tick (AIMD from N=1 reaches N=29 in 8 steps of +4)."""
PROBE_STEPS = 5
"""Training steps a nano-batch probe lasts (a controller's measurement window; ``settle_nano``)."""

Merged = Callable[[Snapshot, PlannedGroup, Sequence[Job], float, tuple], tuple[float, bool]]
"""(snapshot, group, newcomers, bound s, their cost-model members) -> (merged step time s, fits in
memory): ``merged_step`` or a memoised equivalent."""


# ---- 1. queue order -----------------------------------------------------------------------------
def queue_order(snap: Snapshot, order: str) -> list[Job]:
    """The queued jobs of ``snap`` in priority order ``order`` (``ordering.order_queue``)."""
    return order_queue(snap.queue, order, snap.now_s)


# ---- 2. the join test ---------------------------------------------------------------------------
def collective_rate(members: Sequence[Job], step_s: float) -> float:
    """Σ isolated step time / group step time: progress in isolated-speed units per second."""
    return sum(j.isolated_step_time_s for j in members) / step_s


def residual_capacity(snap: Snapshot, g: PlannedGroup, plan: str, bound_job_s: float) -> float:
    """Residual capacity (s) left in ``g`` for a job whose own bound is ``bound_job_s``:
    min(g's bound, bound_job_s) - g's step time (``plan``: the plan the groups run)."""
    return min(g.slowdown_bound_s(snap, plan), bound_job_s) - g.step_time_s(snap, plan)


def merged_step(snap: Snapshot, g: PlannedGroup, extra: Sequence[Job], bound_s: float, key: tuple,
                *, plan: str) -> tuple[float, bool]:
    """(step time s, fits in memory) of ``g`` with the newcomers ``extra`` (cost-model members
    ``key``) in ``plan``, at g's nano-batch count. Memory is predicted only for a step time within
    ``bound_s`` (else fits is False: the join test refuses it anyway)."""
    members = [j.member for j in g.members] + list(key)
    step = snap.step_time_s(g.model, members, g.n_gpus, plan, g.nano_batches)
    fits = step <= bound_s * (1 + TOL) and snap.fits_memory(g.model, members, g.n_gpus, plan)
    return step, bool(fits)


def budget_ok(now_s: float, members: Sequence[Job], step_s: float, pause_s: float,
              started_s: Callable[[Job], float | None], remaining_steps: Callable[[Job], float],
              bound_of: Callable[[Job], float]) -> bool:
    """Whether every one of ``members`` keeps its promise through a regroup now (issue 40): its
    elapsed running time (since ``started_s``, None: queued, 0 s), plus the pause ``pause_s`` (s),
    plus its remaining steps at ``step_s`` (s), within max_slowdown x its reference runtime
    (total steps x reference step, i.e. ``bound_of(j)`` x total steps)."""
    for j in members:
        t0 = started_s(j)
        elapsed, rest = (0.0, float(j.total_steps)) if t0 is None else (now_s - t0, remaining_steps(j))
        if elapsed + pause_s + rest * step_s > bound_of(j) * j.total_steps * (1 + TOL):
            return False
    return True


def merge_ok(snap: Snapshot, g: PlannedGroup, extra: Sequence[Job], apart_rate: float, *, plan: str,
             max_group_size: int, min_gain: float, bound_of: Callable[[Job], float],
             pause_s: float | None, budget: Callable[[Snapshot, list, float, float], bool] | None,
             merged: Merged | None = None, bound_extra: float | None = None, key: tuple | None = None) -> bool:
    """Whether ``extra`` may join ``g``: size, every bound, memory, and collective rate above
    ``apart_rate`` + ``min_gain``, and (``pause_s`` not None: the pause priced) ``budget`` for every
    member through the pause (none for a group planned in this decision: it starts with its members).

    Cheap tests first: a group's step time only grows as members join, so a group already at the
    tightest bound of its members or of the newcomers cannot take them; memory is checked only for a
    step time within the bound. ``merged`` (default ``merged_step``) predicts the merged group;
    ``bound_extra`` (the newcomers' tightest bound) and ``key`` (their cost-model members) may be
    passed in by a caller that asks about the same newcomers again and again.
    """
    members = g.members + list(extra)
    if len(members) > max_group_size:
        return False
    if bound_extra is None:
        bound_extra = min(map(bound_of, extra))
    bound = min(g.slowdown_bound_s(snap, plan), bound_extra)
    if g.step_time_s(snap, plan) >= bound:
        return False
    if key is None:
        key = tuple(j.member for j in extra)
    step, fits = merged(snap, g, extra, bound, key) if merged is not None else \
        merged_step(snap, g, extra, bound, key, plan=plan)
    if step > bound * (1 + TOL) or not fits:
        return False
    if collective_rate(members, step) <= apart_rate + min_gain:
        return False
    return pause_s is None or budget(snap, members, step, 0.0 if g.group_id is None else pause_s)


# ---- 3. the join target -------------------------------------------------------------------------
JoinOk = Callable[[Snapshot, PlannedGroup, list, float], bool]
"""(snapshot, group, newcomers, apart rate) -> ``merge_ok`` with the policy's terms bound."""


def residual_target(snap: Snapshot, cands: Sequence[PlannedGroup], job: Job, can_start: bool, *, plan: str,
                    bound_job_s: float, ok: JoinOk) -> PlannedGroup | None:
    """tLoRA's join rule: of ``cands`` (the groups of ``job``'s kind, start/plan order), the one with
    the most residual capacity left for ``job`` that the join test ``ok`` accepts (ties: the
    earliest). ``job`` counts 1 apart if it could start alone now (``can_start``)."""
    best, best_slack = None, 0.0
    for g in cands:
        slack = residual_capacity(snap, g, plan, bound_job_s)
        if slack <= 0 or slack <= best_slack:
            continue
        if ok(snap, g, [job], collective_rate(g.members, g.step_time_s(snap, plan)) + (1.0 if can_start else 0.0)):
            best, best_slack = g, slack
    return best


def join_gain(snap: Snapshot, g: PlannedGroup, job: Job, can_start: bool, *, plan: str, ok: JoinOk,
              merged: Merged) -> float:
    """Rise of collective rate if ``job`` joins ``g`` over the two apart (the job counted as 1 if it
    could start alone now); -inf if the join test refuses it."""
    apart = collective_rate(g.members, g.step_time_s(snap, plan)) + (1.0 if can_start else 0.0)
    if not ok(snap, g, [job], apart):
        return float("-inf")
    new_step, _ = merged(snap, g, [job], float("inf"), (job.member,))
    return collective_rate(g.members + [job], new_step) - apart


def throughput_target(snap: Snapshot, cands: Sequence[PlannedGroup], job: Job, can_start: bool, *, plan: str,
                      ok: JoinOk, merged: Merged) -> PlannedGroup | None:
    """Ours (``join_rule="throughput"``): the first of ``cands`` with the largest positive
    ``join_gain``."""
    best, best_gain = None, 0.0
    for g in cands:
        gain = join_gain(snap, g, job, can_start, plan=plan, ok=ok, merged=merged)
        if gain > best_gain:
            best, best_gain = g, gain
    return best


# ---- 4. the walk and the binary cut --------------------------------------------------------------
def binary_cut(ok: Callable[[int], bool], n: int) -> int:
    """Largest k in 0..n with ``ok(k)`` (0 if none), for ``ok`` true up to some k and false after:
    feasibility shrinks as k grows (each member adds step time), so the search halves the interval,
    O(log n) calls."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def join_window(snap: Snapshot, plan: Planner, target: PlannedGroup, cands: list[Job], placed: set[int],
                admission_open: bool, *, max_group_size: int, ok: JoinOk) -> None:
    """The first k of ``cands`` (the later queued jobs of the head's kind, in queue order) join
    ``target``, k as large as ``binary_cut`` allows, each counted as 1 apart if it could start alone
    now; they are added to ``placed`` (job indices)."""
    if not cands:
        return
    free_now = {j.index: admission_open and plan.free.find(j.num_gpus) is not None for j in cands}
    base = collective_rate(target.members, target.step_time_s(snap, plan.plan))

    def fits(k: int) -> bool:
        return ok(snap, target, cands[:k], base + sum(1.0 for j in cands[:k] if free_now.get(j.index)))

    for j in cands[:binary_cut(fits, min(len(cands), max_group_size - len(target.members)))]:
        plan.join(target, j)
        placed.add(j.index)


def window_of(bucket: list[Job], start: int, placed: set[int], window: int) -> list[Job]:
    """The candidates after a head: of the kind's queued jobs ``bucket`` (queue order) from position
    ``start`` (its first unplaced one), the unplaced among the next 2 x ``window``, at most
    ``window`` of them (the look is bounded: decision time)."""
    return [j for j in bucket[start:start + 2 * window] if j.index not in placed][:window]


def walk_queue(snap: Snapshot, plan: Planner, queue: list[Job], *, grouping: bool, window: int,
               max_group_size: int, target_of: Callable[[Job, bool], PlannedGroup | None], ok: JoinOk) -> None:
    """Step 2 of a decision: every head in ``queue`` order joins its target (``target_of(job,
    can_start)``) or starts alone on free GPUs while GPU admission is open; the first head that can
    do neither closes admission (GPU admission follows the queue order, so joins never delay it) and
    later heads may only join. After each placement the head's followers join (``join_window``).
    With ``grouping`` off every job starts alone while admission is open."""
    placed: set[int] = set()
    admission_open = True
    buckets: dict[tuple[str, int], list[Job]] = {}
    for j in queue:
        buckets.setdefault((j.model, j.num_gpus), []).append(j)
    cursor = dict.fromkeys(buckets, 0)
    for head in queue:
        if head.index in placed:
            continue
        can_start = admission_open and plan.free.find(head.num_gpus) is not None
        if not grouping:
            if can_start:
                plan.start(head)
            else:
                admission_open = False
            continue
        target = target_of(head, can_start)
        if target is None:
            if not can_start:
                admission_open = False
                continue
            target = plan.start(head)
        else:
            plan.join(target, head)
        placed.add(head.index)
        kind = (head.model, head.num_gpus)
        bucket, c = buckets[kind], cursor[kind]
        while c < len(bucket) and bucket[c].index in placed:
            c += 1
        cursor[kind] = c
        join_window(snap, plan, target, window_of(bucket, c, placed, window), placed, admission_open,
                    max_group_size=max_group_size, ok=ok)


# ---- 5. consolidation ---------------------------------------------------------------------------
def tier(snap: Snapshot, a: PlannedGroup, b: PlannedGroup) -> int:
    """0: ``a`` and ``b`` start on one node, 1: in one rack, 2: across the cluster."""
    na, nb = a.placement[0][0], b.placement[0][0]
    cluster = snap.cluster
    return 0 if na == nb else 1 if cluster.rack_of(na) == cluster.rack_of(nb) else 2


def freed_value(smallest_wait: int | None, n_gpus: int) -> float:
    """What the GPUs a merge frees are worth (collective-rate units): 1 if a queued job could use
    them (``smallest_wait``: the fewest GPUs a queued job asks for; None: the queue is empty)."""
    return 1.0 if smallest_wait is not None and smallest_wait <= n_gpus else 0.0


def consolidate(snap: Snapshot, plan: Planner, smallest_wait: int | None, *, ok: JoinOk) -> None:
    """Merge running groups pairwise: groups in (size, id) order; each unchanged one moves into the
    first partner of its kind, at least its size, in (tier, -size, id) order that the join test
    accepts, against the two apart (the source's rate, minus the freed GPUs' value, plus the
    partner's)."""
    running = [g for g in plan.groups if g.group_id is not None]
    for src in sorted(running, key=lambda g: (len(g.members), g.group_id)):
        if src.added or not src.members:  # given members, or merged away, in this tick
            continue
        freed = freed_value(smallest_wait, src.n_gpus)
        rate_src = collective_rate(src.members, src.step_time_s(snap, plan.plan))
        allowed = [d for d in plan.candidates(src.members[0])
                   if d is not src and d.group_id is not None and len(d.members) >= len(src.members)
                   and ok(snap, d, list(src.members),
                          rate_src - freed + collective_rate(d.members, d.step_time_s(snap, plan.plan)))]
        if allowed:
            plan.merge(src, min(allowed, key=lambda d: (tier(snap, src, d), -len(d.members), d.group_id)))


# ---- 6. AIMD nano-batching ----------------------------------------------------------------------
def settle_nano(snap: Snapshot, kind: tuple[str, int], members: Sequence[Job], tuner: NanoBatchTuner, nano: int,
                micro: int, step_s: float, *, plan: str, bound_of: Callable[[Job], float]) -> int:
    """Run the AIMD controller's probes for one group on a tick and return the count it settles on.

    Each probe lasts ``PROBE_STEPS`` training steps, as a real controller measures a step time over
    a few steps after the switch; at the step times of these models (0.1-2 s) all the probes of one
    tick take seconds, under 1% of ``tick_s``, so the probes are evaluated with the cost model at
    once and only the settled count runs until the next tick (ours: the paper does not say how long
    a probe lasts). A probe whose predicted step time would take any member past its bound (and is
    no faster than the current count) is not run (the paper's promise); the controller treats it as
    a failed probe. ``kind``: the group's (base model, GPU count); ``members``: its jobs in member
    order; ``nano``/``micro``/``step_s``: what it runs now. A group running its best count with no
    gain and no re-probe due settles at once (``NanoBatchTuner.steady``).
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
            bound = min(map(bound_of, members))
            adapters = tuple(j.member for j in members)
        t = snap.step_time_s(kind[0], adapters, kind[1], plan, nano_batches=nxt, micro_batches=micro)
        if t > max(bound, step_s) * (1 + TOL):  # past the bound, and no better than now
            tuner.refuse(nxt)
            t = tuner.best_time_s
    return tuner.best_n if tuner.best_time_s < float("inf") else nano
