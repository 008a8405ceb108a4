"""Where a simulated replay's schedule parts from the executed run's (``validate-run``'s
``divergence.csv``).

Both runs are reduced to the same decision-level record: every time a group's membership changes
(a start, a join, a member finishing or preempted), the group's members after the change (all
changes of one group at one instant count as one, as the executor rebuilds once).

* Executed run: the ``start`` and ``regroup`` rows of ``steps.csv`` (``jobs`` is the members after
  the change; ``start_s`` the instant of the decision), finishes from ``jobs.csv``.
* Replay: :class:`MembershipLog`, an engine listener that records each group's members whenever the
  engine re-times it (every start, join, leave and finish re-times the group) or closes it.

Per job, its **placements**: each time it entered a group (started one, joined one, or was
restarted after a preemption), the group id and the jobs it found there (co-starters included),
written ``gid:j1;j2`` (``gid:`` alone: it started alone), joined by `` | ``. Two runs made the same
decision for a job when its placements match one for one. A job's divergence time is the earlier
of the two times of its first placement that differs (a placement only one run made counts from
when it was made; a job whose placements all match has none); the run's **first divergence** is
the earliest of these, the first point where the schedules differ. Timing alone (a finish earlier
or later, a pause longer) does not count; the decisions it leads to do.
"""

from __future__ import annotations

from typing import Sequence

import pandas as pd

from tlora_sim.sim.core.listeners import EngineListener

COLUMNS = ["policy", "job_id", "index", "submit_time_s", "real_start_s", "sim_start_s", "real_finish_s",
           "sim_finish_s", "finish_shift_s", "real_groups", "sim_groups", "same_groups", "diverged_at_s",
           "first_divergence"]
"""``divergence.csv``: one row per job. ``finish_shift_s`` is sim - real finish; ``real_groups`` and
``sim_groups`` the placements (module docstring); ``same_groups`` True when they match one for
one; ``diverged_at_s`` the job's divergence time (empty when none); ``first_divergence`` True on the
job(s) whose divergence is the run's first."""


class MembershipLog(EngineListener):
    """An engine listener recording ``(time_s, group_id, members)`` after every membership change.

    Call :meth:`bind` with the engine before it runs (the listener reads its clock). Changes of
    one group at one instant are kept as the last one (the executor rebuilds once per instant).
    """

    def __init__(self) -> None:
        self.rows: list[tuple[float, int, tuple[int, ...]]] = []
        self._now = None

    def bind(self, engine) -> "MembershipLog":
        """Read simulated time from ``engine`` (a ``sim.core.engine.Engine``); returns self."""
        self._now = lambda: engine.env.now
        return self

    def _put(self, gid: int, members: Sequence[int]) -> None:
        now = self._now() if self._now is not None else float("nan")
        row = (float(now), int(gid), tuple(int(i) for i in members))
        last = next((k for k in range(len(self.rows) - 1, -1, -1) if self.rows[k][1] == gid), None)
        if last is not None and self.rows[last][0] == row[0]:
            self.rows[last] = row  # one rebuild per group and instant
        elif last is None or self.rows[last][2] != row[2]:
            self.rows.append(row)

    def retime(self, gid, model, n_gpus, plan, members, member_indices, step_s, micro_batches) -> None:
        """Record ``gid``'s members after a start, join, leave or finish (the engine re-times then)."""
        self._put(gid, member_indices)

    def close(self, gid, engine_free) -> None:
        """Record that ``gid`` has no members left."""
        self._put(gid, ())

    def table(self) -> pd.DataFrame:
        """The log as ``time_s, group_id, jobs`` (``jobs`` ``;``-separated, as in ``steps.csv``)."""
        return pd.DataFrame({"time_s": [r[0] for r in self.rows], "group_id": [r[1] for r in self.rows],
                             "jobs": [";".join(map(str, r[2])) for r in self.rows]})


def real_changes(steps: pd.DataFrame) -> pd.DataFrame:
    """An executed run's membership changes from its ``steps.csv``: ``time_s, group_id, jobs``
    (the ``start`` and ``regroup`` rows, in time order)."""
    ch = steps[steps.event.isin(("start", "regroup"))].sort_values("start_s", kind="stable")
    return pd.DataFrame({"time_s": ch.start_s.to_numpy(dtype=float), "group_id": ch.group_id.to_numpy(dtype=int),
                         "jobs": ch.jobs.astype(str).to_numpy()})


def _members(cell) -> tuple[int, ...]:
    s = str(cell)
    return tuple(int(i) for i in s.split(";")) if s and s != "nan" else ()


def placements(changes: pd.DataFrame) -> dict[int, list[tuple[float, int, tuple[int, ...]]]]:
    """Per job index, its placements ``(time_s, group_id, the other members then, sorted)`` from a
    ``time_s, group_id, jobs`` table of membership changes (:func:`real_changes`,
    :meth:`MembershipLog.table`)."""
    out: dict[int, list] = {}
    before: dict[int, tuple[int, ...]] = {}
    for t, gid, cell in zip(changes.time_s, changes.group_id, changes.jobs):
        now = _members(cell)
        for i in now:
            if i not in before.get(gid, ()):
                out.setdefault(i, []).append((float(t), int(gid), tuple(sorted(j for j in now if j != i))))
        before[gid] = now
    return out


def _fmt(pl: list) -> str:
    return " | ".join(f"{g}:{';'.join(map(str, others))}" for _, g, others in pl)


def _diverged_at(real: list, sim: list) -> float:
    for k in range(max(len(real), len(sim))):
        r = real[k] if k < len(real) else None
        s = sim[k] if k < len(sim) else None
        if r is None or s is None:
            return (r or s)[0]
        if r[1:] != s[1:]:
            return min(r[0], s[0])
    return float("nan")


def divergence(policy: str, real_jobs: pd.DataFrame, real_changes_: pd.DataFrame, sim_jobs: pd.DataFrame,
               sim_changes: pd.DataFrame) -> pd.DataFrame:
    """The per-job table of ``divergence.csv`` (``COLUMNS``) of one executed run and its replay.

    Args:
        policy: the run's policy (first column).
        real_jobs, sim_jobs: the runs' ``jobs.csv`` tables (``index``, ``job_id``, ``submit_time_s``,
            ``start_time_s``, ``finish_time_s``).
        real_changes_, sim_changes: their membership changes (:func:`real_changes`,
            :meth:`MembershipLog.table`).
    """
    rp, sp = placements(real_changes_), placements(sim_changes)
    sim = sim_jobs.set_index("index")
    rows = []
    for r in real_jobs.sort_values("index").itertuples(index=False):
        i = int(r.index)
        s = sim.loc[i]
        a, b = rp.get(i, []), sp.get(i, [])
        at = _diverged_at(a, b)
        rows.append({"policy": policy, "job_id": r.job_id, "index": i, "submit_time_s": float(r.submit_time_s),
                     "real_start_s": float(r.start_time_s), "sim_start_s": float(s.start_time_s),
                     "real_finish_s": float(r.finish_time_s), "sim_finish_s": float(s.finish_time_s),
                     "finish_shift_s": float(s.finish_time_s - r.finish_time_s), "real_groups": _fmt(a),
                     "sim_groups": _fmt(b), "same_groups": bool(pd.isna(at)), "diverged_at_s": at})
    out = pd.DataFrame(rows, columns=COLUMNS[:-1])
    first = out.diverged_at_s.min()
    out["first_divergence"] = (out.diverged_at_s == first) if pd.notna(first) else False
    return out
