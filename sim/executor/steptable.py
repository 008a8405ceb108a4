"""Cost models made from an executed run's own measurements (``steps.csv``), for ``validate-run``.

A CPU run (``--device cpu``) has no profiled model of its device, and a GPU run may be replayed
with its own step times to separate the step model's error from the schedule's. Two models:

* :class:`MeasuredStepTable`: a table-driven model. Key: (base model, GPUs, plan, nano- and
  micro-batches, the members' (rank, sequences, sequence length) as a sorted multiset). Value: the mean clock
  span (``end_s - start_s``) of the *steady* steps of that composition (every step but the first
  after a build, which carries the build's one-off costs; ``first_step_excess_s`` measures those).
  The mean, not the median: step times have a slow tail (on an H100 the mean is ~5% above the
  median), and what a run's clock adds up is the mean. A composition seen only in first steps
  gets its first steps' mean minus the run's mean first-step excess, at least half of it. A
  composition the run never trained (the simulated schedule may form one) falls back to the
  profiled model times the run's ratio of measured to predicted steady step time
  (:class:`ScaledCostModel`, ``pace``). Memory and FLOPs are the profiled model's (what the policies
  planned with). ``describe()`` counts the lookups answered from the table (``hits``) and by the
  fallback (``misses``).
* :class:`ScaledCostModel`: another model's step times times one factor.

Times are seconds; ``steps.csv`` ``ms`` are milliseconds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tlora_sim.sim.costmodel.interface import Member

BUILD_EVENTS = ("start", "regroup")


class ScaledCostModel:
    """A cost model whose step times are ``inner``'s times ``factor`` (memory and FLOPs unchanged).

    Args:
        inner: the model scaled.
        factor: the multiplier (> 0).
    """

    name = "scaled"

    def __init__(self, inner, factor: float):
        self.inner, self.factor = inner, float(factor)

    def step_time_s(self, *a, **k) -> float:
        return self.factor * self.inner.step_time_s(*a, **k)

    def memory_bytes(self, *a, **k) -> float:
        return self.inner.memory_bytes(*a, **k)

    def step_flops(self, *a, **k) -> float:
        return self.inner.step_flops(*a, **k)

    def batch(self, *a, **k):
        return None

    def describe(self) -> dict:
        return {**self.inner.describe(), "name": self.name, "scale": self.factor}


def step_rows(steps: pd.DataFrame) -> pd.DataFrame:
    """The ``event == "step"`` rows of ``steps.csv`` in time order per group, with ``first``
    (True for the first step after a build of its group), ``span_s`` (end - start) and
    ``n_gpus``, ``micro_batches`` (1 where the file predates the column)."""
    st = steps.copy()
    for col in ("n_gpus", "micro_batches"):
        if col not in st.columns:
            st[col] = 1
    st = st.sort_values(["group_id", "start_s"], kind="stable")
    prev = st.groupby("group_id").event.shift()
    st["first"] = prev.isin(BUILD_EVENTS) | prev.isna()
    st["span_s"] = st.end_s - st.start_s
    return st[st.event == "step"].reset_index(drop=True)


def members_of(jobs: list, job_list) -> tuple[Member, ...]:
    """The cost-model members of a ``steps.csv`` ``jobs`` cell (``;``-separated indices)."""
    return tuple(jobs[int(i)].member for i in str(job_list).split(";"))


def _key(model: str, n_gpus: int, plan: str, nano: int, micro: int, members) -> tuple:
    return model, int(n_gpus), plan, int(nano), int(micro), tuple(sorted(Member(*m) for m in members))


def predicted_s(cm, gpu: str, jobs: list, st: pd.DataFrame) -> np.ndarray:
    """``cm``'s step time of every row of ``step_rows`` output (s)."""
    return np.array([cm.step_time_s(jobs[int(str(j).split(";")[0])].model, gpu, members_of(jobs, j), int(n), p,
                                    int(nb), int(mb))
                     for j, n, p, nb, mb in zip(st.jobs, st.n_gpus, st.plan, st.nano_batches, st.micro_batches)],
                    dtype=float)


def first_step_excess_s(steps: pd.DataFrame, jobs: list, cm, gpu: str) -> float:
    """Mean over the run's builds of (first step - ``cm``'s step) (s, >= 0): what a freshly
    built super-model's first step costs beyond a steady one (allocations, autotuning)."""
    st = step_rows(steps)
    first = st[st["first"]]
    if first.empty:
        return 0.0
    return float(max(0.0, np.mean(first.ms.to_numpy() / 1e3 - predicted_s(cm, gpu, jobs, first))))


def pace(steps: pd.DataFrame, jobs: list, cm, gpu: str) -> float:
    """Measured over ``cm``'s time of the steady steps (all steps if none), summed: how much
    slower (> 1) or faster than ``cm`` the run's device trained."""
    st = step_rows(steps)
    steady = st[~st["first"]] if (~st["first"]).any() else st
    if steady.empty:
        return 1.0
    return float(steady.span_s.sum() / predicted_s(cm, gpu, jobs, steady).sum())


class MeasuredStepTable:
    """Step times looked up in an executed run's measurements (see the module docstring).

    Args:
        table: key (``_key``) -> step time (s).
        planning: the profiled model the run's policy planned with (memory, FLOPs).
        fallback: step times of compositions not in ``table``.
    """

    name = "measured"

    def __init__(self, table: dict, planning, fallback):
        self.table, self.planning, self.fallback = dict(table), planning, fallback
        self.hits = self.misses = 0

    @classmethod
    def from_run(cls, steps: pd.DataFrame, jobs: list, planning, gpu: str) -> "MeasuredStepTable":
        """The table of one run's ``steps.csv`` (``jobs``: its ``workload.csv`` jobs in index order)."""
        st = step_rows(steps)
        keys = [_key(jobs[int(str(j).split(";")[0])].model, n, p, nb, mb, members_of(jobs, j))
                for j, n, p, nb, mb in zip(st.jobs, st.n_gpus, st.plan, st.nano_batches, st.micro_batches)]
        st = st.assign(key=keys, s=st.span_s)
        steady = st[~st["first"]].groupby("key").s.mean().to_dict()
        firsts = st[st["first"]]
        excess = [f - steady[k] for k, f in zip(firsts.key, firsts.s) if k in steady]
        excess_s = max(0.0, float(np.mean(excess))) if excess else 0.0
        table = dict(steady)
        for k, f in firsts.groupby("key").s.mean().items():
            if k not in table:
                table[k] = max(f - excess_s, 0.5 * f)
        return cls(table, planning, ScaledCostModel(planning, pace(steps, jobs, planning, gpu)))

    def step_time_s(self, model: str, gpu: str, members, n_gpus: int, plan: str, nano_batches: int = 1,
                    micro_batches: int = 1) -> float:
        """The measured step time of this composition, else the fallback's (s)."""
        v = self.table.get(_key(model, n_gpus, plan, nano_batches, micro_batches, members))
        if v is not None:
            self.hits += 1
            return v
        self.misses += 1
        return self.fallback.step_time_s(model, gpu, members, n_gpus, plan, nano_batches, micro_batches)

    def memory_bytes(self, *a, **k) -> float:
        return self.planning.memory_bytes(*a, **k)

    def step_flops(self, *a, **k) -> float:
        return self.planning.step_flops(*a, **k)

    def batch(self, *a, **k):
        return None

    def hit_share(self) -> float:
        """Share of the lookups so far answered from the table (1.0 when none)."""
        n = self.hits + self.misses
        return self.hits / n if n else 1.0

    def describe(self) -> dict:
        return {"name": self.name, "compositions": len(self.table), "hits": self.hits, "misses": self.misses,
                "fallback": self.fallback.describe()}


def pauses_by_size(steps: pd.DataFrame, extra_s: float = 0.0) -> dict[int, float]:
    """Mean measured ``regroup`` time by members after the change (s), plus ``extra_s`` (the
    first-step excess a rebuilt group pays, ``steptable.first_step_excess_s``)."""
    r = steps[steps.event == "regroup"]
    if r.empty:
        return {}
    n = r.jobs.astype(str).str.count(";") + 1
    return {int(k): float(v) / 1e3 + extra_s for k, v in r.ms.groupby(n).mean().items()}
