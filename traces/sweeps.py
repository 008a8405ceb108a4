"""Hyper-parameter sweeps as job families (ALTO, arXiv 2604.05426), and their synthetic loss model.

Expansion (seeded, applied to every policy's workload alike when ``--sweeps`` is given): each
trace job becomes, with probability ``fraction``, a sweep of K configurations (K drawn uniformly
from ``sizes``). Every configuration keeps the job's arrival, GPU count, duration, base model,
batch and sequence length (one dataset), draws its own rank from the LoRA distribution, and gets
``sweep_id`` = the original job id and job id ``<id>/c<k>``. Jobs not expanded keep ``sweep_id``
empty.

Loss model (documented, synthetic): configuration quality is a final loss
``loss_floor = LOSS_BASE + LOSS_SPREAD x u`` with u ~ Exp(1) (a few configurations are much worse,
as in LoRA learning-rate/rank sweeps), and its training loss after s of S steps is
``L(s) = floor + (LOSS_START - floor) x (1 + s / (tau x S)) ** -ALPHA``
(a power-law decay in steps, the shape of scaling-law fits of training curves: Kaplan et al. 2020,
"Scaling Laws for Neural Language Models", eq. 1.4's L(S) term). Each configuration draws its own
time constant ``tau = TAU_FRACTION x exp(TAU_SIGMA x z)``, z ~ N(0, 1), so a configuration that
converges fast can lead early and end worse than a slow one: curves cross. What a scheduler
observes is ``observed_loss``: L(s) times (1 + NOISE_REL x e), e ~ N(0, 1) drawn from a generator
seeded by the job and the step (mini-batch losses scatter by a few per cent; the same job at the
same step always reads the same value, so runs stay deterministic).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tlora_sim.traces.errors import InputError

LOSS_START = 2.5
LOSS_BASE = 1.0
LOSS_SPREAD = 0.15
TAU_FRACTION = 0.05
TAU_SIGMA = 0.7
NOISE_REL = 0.02
ALPHA = 1.0


def loss_at(loss_floor: float, steps_done: float, total_steps: float, tau_fraction: float = TAU_FRACTION) -> float:
    """Synthetic training loss after ``steps_done`` of ``total_steps`` steps (see module docstring)."""
    tau = tau_fraction * max(total_steps, 1.0)
    return loss_floor + (LOSS_START - loss_floor) * (1.0 + max(steps_done, 0.0) / tau) ** -ALPHA


def observed_loss(job, steps_done: float) -> float:
    """The loss a scheduler reads for ``job`` (a ``Job`` with ``loss_floor``, ``loss_tau``,
    ``total_steps``, ``index``) after ``steps_done`` steps: ``loss_at`` with measurement noise
    seeded by (job index, whole steps done)."""
    clean = loss_at(job.loss_floor, steps_done, job.total_steps, job.loss_tau)
    e = np.random.default_rng((int(job.index), int(steps_done))).standard_normal()
    return clean * (1.0 + NOISE_REL * e)


def parse_sweeps(spec: str | None) -> tuple[float, tuple[int, ...]] | None:
    """Parse ``FRACTION:K1,K2,...`` (e.g. ``0.3:4,8``); None or ``""`` means no sweeps.

    Raises:
        InputError: malformed spec, fraction outside (0, 1], or sizes below 2.
    """
    if not spec:
        return None
    frac, sep, sizes = spec.partition(":")
    try:
        f = float(frac)
        ks = tuple(int(k) for k in sizes.split(",")) if sep else (4,)
    except ValueError:
        raise InputError(f"sweeps spec {spec!r} is not FRACTION:K1,K2 (e.g. 0.3:4,8)", field="--sweeps") from None
    if not 0 < f <= 1 or not ks or min(ks) < 2:
        raise InputError(f"sweeps spec {spec!r}: fraction in (0, 1] and sizes >= 2 expected", field="--sweeps")
    return f, ks


def expand_sweeps(frame: pd.DataFrame, rng: np.random.Generator, fraction: float, sizes: tuple[int, ...],
                  ranks: dict[int, float]) -> pd.DataFrame:
    """Expand a fraction of jobs (with LoRA columns) into sweeps; adds ``sweep_id``, ``loss_floor``
    and ``loss_tau``.

    Draw order: expand? (uniform), K, then per configuration rank, quality and time constant.
    """
    n = len(frame)
    expand = rng.random(n) < fraction
    k = rng.choice(np.array(sizes), n)
    reps = np.where(expand, k, 1)
    out = frame.loc[frame.index.repeat(reps)].reset_index(drop=True)
    family = np.repeat(np.arange(n), reps)
    config = np.concatenate([np.arange(r) for r in reps]) if n else np.array([], dtype=int)
    swept = expand[family]
    rank_values = np.array(list(ranks.keys()))
    rank_p = np.array(list(ranks.values()), dtype=float)
    new_ranks = rng.choice(rank_values, len(out), p=rank_p / rank_p.sum())
    floors = LOSS_BASE + LOSS_SPREAD * rng.exponential(1.0, len(out))
    taus = TAU_FRACTION * np.exp(TAU_SIGMA * rng.standard_normal(len(out)))
    out["rank"] = np.where(swept, new_ranks, out["rank"].to_numpy()).astype(np.int64)
    ids = out["job_id"].astype(str).to_numpy()
    out["sweep_id"] = np.where(swept, ids, "")
    out["job_id"] = np.where(swept, [f"{i}/c{c}" for i, c in zip(ids, config)], ids)
    out["loss_floor"] = np.where(swept, floors, 0.0)
    out["loss_tau"] = np.where(swept, taus, TAU_FRACTION)
    out.attrs.update(frame.attrs)
    origin = frame.attrs.get("origin")
    if origin is not None and len(origin) == n:  # each configuration comes from its family's row
        out.attrs["origin"] = origin.repeat(reps)
    out.attrs["sweeps"] = {"fraction": fraction, "sizes": list(sizes), "families": int(expand.sum())}
    return out
