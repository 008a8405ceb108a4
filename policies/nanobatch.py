"""tLoRA's nano-batch count tuner: additive increase, multiplicative decrease (AIMD).

The published rule (tLoRA, arXiv 2602.07263, nano-batching): after each measured step,
``N <- N + 4`` if the step time improved by more than a threshold, else ``N <- max(1, floor(N/2))``.
As published it can stick at N = 1: once timings stop improving, equal times never count as
better, so N halves down to 1 and stays. This tuner compares each measurement against the best
step time seen (not only the previous one), returns to the best N after a failed probe, and
re-probes (``N_best + 4``, then ``N_best // 2``) every ``reprobe_every`` measurements, so it
settles on the best N of any unimodal step-time curve and follows the curve when it moves
(members join or leave).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NanoBatchTuner:
    """AIMD over the nano-batch count with best-seen memory and periodic re-probing.

    Attributes:
        threshold: relative improvement that counts as better (0.01 = 1%).
        step: additive increase (tLoRA: 4).
        max_n: largest nano-batch count tried.
        reprobe_every: measurements at the best N between re-probes.
        n: the count to run next.
    """

    threshold: float = 0.01
    step: int = 4
    max_n: int = 64
    reprobe_every: int = 8
    n: int = 1
    best_n: int = 1
    best_time_s: float = float("inf")
    _since_probe: int = 0
    _down_next: bool = False
    _seen: dict[int, float] = field(default_factory=dict)

    def observe(self, step_time_s: float) -> int:
        """Record the step time measured at the current ``n``; return the next ``n`` to run."""
        self._seen[self.n] = step_time_s
        if step_time_s < self.best_time_s * (1.0 - self.threshold):
            # improvement: remember it and keep increasing additively
            self.best_n, self.best_time_s = self.n, step_time_s
            self.n = min(self.n + self.step, self.max_n)
            self._since_probe = 0
            return self.n
        if self.n == self.best_n:
            self.best_time_s = step_time_s  # the curve may have moved: trust the fresh measurement
            self._since_probe += 1
            if self._since_probe >= self.reprobe_every:
                self._since_probe = 0
                self._down_next = not self._down_next
                self.n = max(1, self.best_n // 2) if self._down_next else min(self.best_n + self.step, self.max_n)
            return self.n
        # a probe that did not beat the best: multiplicative decrease, bounded below by trying
        # from the best-known point instead of collapsing to 1
        if self.n > self.best_n:
            half = max(1, self.n // 2)
            self.n = half if half > self.best_n and half not in self._seen else self.best_n
        else:
            self.n = self.best_n
        return self.n

    def steady(self, step_time_s: float) -> bool:
        """``observe(step_time_s)`` where it keeps running the best count: the tuner runs its best
        ``n``, the time is no improvement and no re-probe is due. Then records it as ``observe``
        does (``n`` stays, and is measured) and returns True; else changes nothing and returns
        False (call ``observe``)."""
        if self.n != self.best_n or self._since_probe + 1 >= self.reprobe_every \
                or step_time_s < self.best_time_s * (1.0 - self.threshold):
            return False
        self._seen[self.n] = step_time_s
        self.best_time_s = step_time_s
        self._since_probe += 1
        return True

    @property
    def since_probe(self) -> int:
        """Measurements at the best count since the last probe (a re-probe falls due at ``reprobe_every``)."""
        return self._since_probe

    def record_steady(self, step_time_s: float, k: int) -> None:
        """Record ``k`` >= 1 observations that ``steady`` would each accept, at once: the time
        ``step_time_s`` measured again at the running (best) count, no re-probe."""
        self._seen[self.n] = step_time_s
        self.best_time_s = step_time_s
        self._since_probe += k

    def measured(self) -> set[int]:
        """The counts measured since the last reset."""
        return set(self._seen)

    def has_measured(self, n: int) -> bool:
        """Whether count ``n`` was measured since the last reset (``n in measured()``, without the copy)."""
        return n in self._seen

    def refuse(self, n: int) -> int:
        """Count ``n`` must not run (it would break a member's slowdown bound): remember it as
        failed and return to the best count; returns the count to run next."""
        self._seen[n] = float("inf")
        self.n = self.best_n
        return self.n

    def reset(self) -> None:
        """Forget measurements (the group's members changed a lot)."""
        self.best_time_s = float("inf")
        self._seen.clear()
        self._since_probe = 0
