"""``check_policy``: run a policy on hand-built snapshots and report where it breaks the contract.

The contract (what the engine relies on; docs/writing-a-policy.md): ``decide(snapshot)`` returns a
list (or tuple) of actions from ``tlora_sim.sim.core.snapshot`` and raises nothing; a started or
added job is in the queue, appears once, and is not already running; a group's members share one
base model; a ``StartGroup`` places exactly as many GPUs as its jobs ask for (the largest request
of its members), on GPUs that are free, counting what earlier actions of the same decision took;
``AddMembers``/``RemoveMembers``/``SetExecution``/``StopMembers`` name groups and members that exist;
the plan is a known execution plan; ``timer_s`` is None or a finite number > 0. It does not judge
whether decisions are good, only whether the engine can apply them.
"""

from __future__ import annotations

import math
import traceback as tb
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from tlora_sim.sim.core.cluster import parse_cluster
from tlora_sim.sim.core.jobs import Job
from tlora_sim.sim.core.placement import FreeGpus
from tlora_sim.sim.core.snapshot import (AddMembers, GroupView, RemoveMembers, SetExecution, Snapshot, StartGroup,
                                         StopMembers)
from tlora_sim.sim.costmodel.interface import PLANS, Member
from tlora_sim.sim.costmodel.roofline import RooflineCostModel


@dataclass(frozen=True)
class Violation:
    """One broken rule: which snapshot (``case``), what (``rule``) and the details (``detail``).

    ``traceback``: for ``rule == "raises"``, the exception's formatted traceback (``""`` otherwise);
    ``detail`` then ends with where it was raised, ``(at FILE:LINE in FUNCTION)``, the innermost frame.
    """

    case: str
    rule: str
    detail: str
    traceback: str = ""

    def __str__(self) -> str:
        return f"[{self.case}] {self.rule}: {self.detail}"


def check_policy(policy: Any, snapshots: Iterable[tuple[str, Snapshot]] | None = None) -> list[Violation]:
    """Run ``policy.decide`` on each snapshot and return every contract violation found.

    Args:
        policy: a policy object (e.g. from ``make_policy``), or anything with ``decide``.
        snapshots: ``(case name, Snapshot)`` pairs; default :func:`standard_snapshots` (empty
            queue, one job, two base models, a full cluster, running groups, a multi-node job).

    Returns:
        The violations, in the order found (empty: the policy keeps the contract on these cases).
    """
    out: list[Violation] = []
    timer = getattr(policy, "timer_s", "missing")
    if timer == "missing":
        out.append(Violation("-", "timer_s", "the policy has no timer_s attribute (None for no timer)"))
    elif timer is not None and not (isinstance(timer, (int, float)) and math.isfinite(timer) and timer > 0):
        out.append(Violation("-", "timer_s", f"must be None or a finite number > 0, got {timer!r}"))
    for case, snap in (snapshots if snapshots is not None else standard_snapshots()):
        try:
            actions = policy.decide(snap)
        except Exception as e:  # noqa: BLE001 - reporting it is the point
            frames = tb.extract_tb(e.__traceback__)
            at = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
            out.append(Violation(case, "raises", f"{type(e).__name__}: {e}{at}", "".join(tb.format_exception(e))))
            continue
        if not isinstance(actions, (list, tuple)):
            out.append(Violation(case, "return type", f"decide returned {type(actions).__name__}, not a list"))
            continue
        out += [Violation(case, rule, detail) for rule, detail in _check_actions(snap, actions)]
    return out


def _check_actions(snap: Snapshot, actions: Sequence) -> list[tuple[str, str]]:
    bad: list[tuple[str, str]] = []
    queued = {j.index: j for j in snap.queue}
    running = {j.index: gid for gid, g in snap.groups.items() for j in g.members}
    free = list(snap.free.free)
    placed: set[int] = set()
    for a in actions:
        if isinstance(a, StartGroup):
            bad += _check_start(a, queued, running, placed, free, snap)
        elif isinstance(a, AddMembers):
            g = snap.groups.get(a.group_id)
            if g is None:
                bad.append(("unknown group", f"AddMembers to group {a.group_id}"))
                continue
            for i in a.job_indices:
                bad += _check_new_job(i, queued, running, placed, "AddMembers")
                if i in queued and queued[i].model != g.model:
                    bad.append(("mixed base models", f"job {i} ({queued[i].model}) added to a {g.model} group"))
                if i in queued and queued[i].num_gpus > g.n_gpus:
                    bad.append(("gpus", f"job {i} asks for {queued[i].num_gpus} GPUs, group {g.group_id} "
                                        f"holds {g.n_gpus}"))
        elif isinstance(a, (RemoveMembers, StopMembers)):
            g = snap.groups.get(a.group_id)
            members = {j.index for j in g.members} if g else set()
            if g is None:
                bad.append(("unknown group", f"{type(a).__name__} on group {a.group_id}"))
            for i in a.job_indices:
                if i not in members:
                    bad.append(("unknown member", f"{type(a).__name__}: job {i} is not in group {a.group_id}"))
        elif isinstance(a, SetExecution):
            if a.group_id not in snap.groups:
                bad.append(("unknown group", f"SetExecution on group {a.group_id}"))
            if getattr(a, "nano_batches", 1) < 1 or getattr(a, "micro_batches", 1) < 1:
                bad.append(("execution", f"nano/micro-batches must be >= 1 in {a}"))
        else:
            bad.append(("unknown action", f"{type(a).__name__} is not an action of tlora_sim.sim.core.snapshot"))
    return bad


def _check_new_job(i: int, queued: dict, running: dict, placed: set, what: str) -> list[tuple[str, str]]:
    bad = []
    if i in running:
        bad.append(("already running", f"{what}: job {i} runs in group {running[i]}"))
    elif i not in queued:
        bad.append(("unknown job", f"{what}: job {i} is not in the queue"))
    if i in placed:
        bad.append(("job twice", f"{what}: job {i} is placed twice in one decision"))
    placed.add(i)
    return bad


def _check_start(a: StartGroup, queued: dict, running: dict, placed: set, free: list,
                 snap: Snapshot) -> list[tuple[str, str]]:
    bad = []
    if not a.job_indices:
        return [("empty group", "StartGroup with no jobs")]
    for i in a.job_indices:
        bad += _check_new_job(i, queued, running, placed, "StartGroup")
    jobs = [queued[i] for i in a.job_indices if i in queued]
    if len({j.model for j in jobs}) > 1:
        bad.append(("mixed base models", f"group of jobs {a.job_indices}: {sorted({j.model for j in jobs})}"))
    if a.plan not in PLANS:
        bad.append(("plan", f"unknown plan {a.plan!r}; known: {', '.join(PLANS)}"))
    n = sum(k for _, k in a.placement)
    if jobs and n != max(j.num_gpus for j in jobs):
        bad.append(("gpus", f"jobs {a.job_indices} ask for {max(j.num_gpus for j in jobs)} GPUs, "
                            f"placement holds {n}"))
    for node, k in a.placement:
        if not 0 <= node < len(free) or k < 1 or free[node] < k:
            bad.append(("gpus not free", f"placement {a.placement}: node {node} has "
                                         f"{free[node] if 0 <= node < len(free) else 'no'} free GPUs, asked {k}"))
        else:
            free[node] -= k
    return bad


def standard_snapshots() -> list[tuple[str, Snapshot]]:
    """The default cases of :func:`check_policy`, on a 2x8xH100 cluster with the roofline model."""
    cm = RooflineCostModel()
    c = parse_cluster("2x8xH100")

    def job(i, gpus=1, model="llama3-8b", rank=8, batch=2, seq=1024, submit=0.0):
        iso = cm.step_time_s(model, c.gpu.name, (Member(rank, batch, seq),), gpus, "alone")
        return Job(i, f"j{i}", submit, gpus, model, rank, batch, seq, 100, 100 * iso, iso, 1.5)

    def snap(queue, free=(8, 8), groups=(), now=0.0):
        return Snapshot(now, tuple(queue), {g.group_id: g for g in groups},
                        FreeGpus(list(free), c.gpus_per_node, c.nodes_per_rack), c, cm)

    running = [job(10, rank=4), job(11, rank=16)]
    g = GroupView(0, "llama3-8b", 1, ((0, 1),), "fused", tuple(running), (50.0, 80.0),
                  cm.step_time_s("llama3-8b", c.gpu.name, [j.member for j in running], 1, "fused"), 0.0)
    mixed = [job(0, model="llama3-8b"), job(1, model="qwen3-8b"), job(2, rank=2), job(3, rank=16, seq=512)]
    return [
        ("empty queue", snap([])),
        ("one job", snap([job(0)])),
        ("two base models", snap(mixed)),
        ("full cluster", snap([job(0), job(1, gpus=4)], free=(0, 0))),
        ("running group", snap([job(0, rank=4), job(1, rank=8)], free=(7, 8), groups=[g], now=100.0)),
        ("multi-node job", snap([job(0, gpus=16), job(1)], free=(8, 8))),
        ("big head, small tail", snap([job(0, gpus=16), job(1), job(2, gpus=2)], free=(8, 3))),
    ]
