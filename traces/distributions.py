"""The math shared by the synthetic generator and its fit: clipped lognormals and the diurnal time map.

Times are seconds. The diurnal profile is 24 hour-of-day rate factors with mean 1; operational time is
the integral of the factor over real time, so a stationary process in operational time becomes one that
follows the day/night cycle in real time.
"""

from __future__ import annotations

import math

import numpy as np

HOUR_S = 3600.0
DAY_S = 86400.0


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def clipped_lognormal_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """E[clip(exp(mu + sigma Z), lo, hi)] for standard normal Z (same unit as lo, hi); exact."""
    a, b = (math.log(lo) - mu) / sigma, (math.log(hi) - mu) / sigma
    inner = math.exp(mu + sigma**2 / 2) * (_phi(b - sigma) - _phi(a - sigma))
    return lo * _phi(a) + hi * (1.0 - _phi(b)) + inner


def sigma_for_mean(mu: float, mean: float, lo: float, hi: float) -> float | None:
    """The sigma in [0.01, 6] whose clipped lognormal (median exp(mu)) has the given mean, by bisection;
    None when no such sigma exists (e.g. mean below the median)."""
    f = lambda s: clipped_lognormal_mean(mu, s, lo, hi) - mean  # noqa: E731
    a, b = 0.01, 6.0
    if f(a) > 0 or f(b) < 0:
        return None
    for _ in range(100):
        m = 0.5 * (a + b)
        a, b = (m, b) if f(m) < 0 else (a, m)
    return 0.5 * (a + b)


def hourly_profile(submit_s: np.ndarray) -> np.ndarray:
    """24 hour-of-day rate factors (mean 1) from submit times in s (hour 0 starts at t = 0), corrected for
    the partial last day's exposure."""
    span = float(submit_s.max())
    counts = np.bincount((submit_s // HOUR_S % 24).astype(int), minlength=24).astype(float)
    full_days, rem = divmod(span, DAY_S)
    exposure = full_days * HOUR_S + np.clip(rem - np.arange(24) * HOUR_S, 0.0, HOUR_S)
    rate = counts / exposure
    return rate / rate.mean()


def _cumulative(factors: np.ndarray) -> np.ndarray:
    f = np.asarray(factors, dtype=float)
    return np.r_[0.0, np.cumsum(f * 24.0 / f.sum())] * HOUR_S


def operational_time(t_s: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """Real time (s) -> operational time (s): the integral of the hourly rate factor."""
    day, within = np.divmod(np.asarray(t_s, dtype=float), DAY_S)
    return day * DAY_S + np.interp(within, np.arange(25) * HOUR_S, _cumulative(factors))


def real_time(u_s: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """Operational time (s) -> real time (s), the inverse of :func:`operational_time`."""
    day, within = np.divmod(np.asarray(u_s, dtype=float), DAY_S)
    return day * DAY_S + np.interp(within, _cumulative(factors), np.arange(25) * HOUR_S)
