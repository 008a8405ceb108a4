"""The host-speed probe: a fixed, launch-bound eager training step that ``execute`` and
``costmodel calibrate`` time every few seconds, so the simulator can follow the machine's host speed
through a run (issue 43).

Why: on the lent H200 hosts the host-bound floor of the eager step drifts with time (one process,
one clock: the smallest step's 10-s median ranged 106-200 ms within 270 s;
``profiler/data/validation/h200_2026-12-01_host_drift/``), so a calibration made minutes before
an execution samples another speed. The probe measures that speed on the same path as the step's
host floor: Python, the PyTorch dispatcher, autograd (whose backward runs on its own device thread)
and kernel launches, with almost no GPU work. A pure-Python loop is timed beside it
(``python_ms``); on those hosts it did not follow the step (``step_drift.csv``), so it is recorded,
not used.

``HostProbe(device).measure()`` -> ``{"probe_ms": ..., "python_ms": ...}``: ``probe_ms`` is the
median wall time (ms, synchronised) of ``REPS`` forward+backward passes of a ``LAYERS``-layer MLP
(``WIDTH`` wide, a batch of ``BATCH`` rows, GELU, mean loss), about 170 kernel launches each.
On one H200 host a pass takes ~5 ms; every call costs about ``REPS + 1`` of those and the loop
(~3 ms): ~25 ms.
``HostProbe`` needs torch (imported when one is built); ``describe``, ``what`` and ``PARAMS`` do not.
"""

from __future__ import annotations

import time

#: the probe network: LAYERS x (Linear(WIDTH, WIDTH), GELU) on a (BATCH, WIDTH) input
LAYERS, WIDTH, BATCH = 24, 256, 16
#: timed passes per measurement (their median is ``probe_ms``). 9 passes were tried once
#: (``profiler/data/validation/h200_2026-12-02c/``, planned in its ``PLAN.md``): readings 0.6 s
#: apart still differed by a median 8-10% (3 passes: 9-10%), and both calibrations' held-out
#: errors were worse (6.5% and 8.2%); the scatter is not the passes' noise, so the probe stays at
#: 3 passes.
REPS = 3
#: iterations of the pure-Python loop (``python_ms``)
PY_ITERS = 50_000
#: the columns of ``probes.csv`` (``execute``) and of a calibration's probe record
COLUMNS = ["t_s", "probe_ms", "python_ms"]
#: the probe's definition, as a run's ``config.json`` records it (``executor.probe``)
PARAMS = {"layers": LAYERS, "width": WIDTH, "batch": BATCH, "reps": REPS, "py_iters": PY_ITERS}


def describe(params: dict) -> str:
    """One line saying what a probe of ``params`` (``PARAMS``' keys ``layers``, ``width``,
    ``reps``; a run's ``config.json`` ``executor.probe``) times: the form of a calibrated
    artifact's ``calibration.probe.what``, so a run's probe and a calibration's can be compared.

    Raises:
        KeyError: ``params`` lacks ``layers``, ``width`` or ``reps``.
    """
    return f"sim/executor/probe.py: {int(params['layers'])}x{int(params['width'])} MLP fwd+bwd, median of {int(params['reps'])}"


def what() -> str:
    """One line saying what this probe times (a calibrated artifact's ``calibration.probe.what``):
    ``describe(PARAMS)``."""
    return describe(PARAMS)


class HostProbe:
    """The probe on one device (``"cuda"``, ``"cuda:1"`` or ``"cpu"``; on the CPU it runs too, slower,
    which is what the tests use). The network and its input are built once (seeded, so every probe of
    every process runs the same work); the first ``measure`` runs one untimed pass first."""

    def __init__(self, device):
        import torch

        self.device = torch.device(device)
        gen = torch.Generator().manual_seed(0)
        layers = []
        for _ in range(LAYERS):
            lin = torch.nn.Linear(WIDTH, WIDTH)
            with torch.no_grad():
                lin.weight.copy_(torch.randn(WIDTH, WIDTH, generator=gen) / WIDTH ** 0.5)
                lin.bias.zero_()
            layers += [lin, torch.nn.GELU()]
        self.net = torch.nn.Sequential(*layers).to(self.device)
        self.x = torch.randn(BATCH, WIDTH, generator=gen).to(self.device)
        self._sync = (lambda: torch.cuda.synchronize(self.device)) if self.device.type == "cuda" else (lambda: None)
        self._warm = False

    def _pass(self) -> float:
        t0 = time.perf_counter()
        self.net.zero_grad(set_to_none=True)
        self.net(self.x).mean().backward()
        self._sync()
        return (time.perf_counter() - t0) * 1e3

    def measure(self) -> dict:
        """One measurement: ``{"probe_ms": median of REPS passes, "python_ms": the loop's ms}``."""
        if not self._warm:
            self._pass()
            self._warm = True
        passes = sorted(self._pass() for _ in range(REPS))
        return {"probe_ms": float(passes[REPS // 2]), "python_ms": python_ms()}


def python_ms(n: int = PY_ITERS) -> float:
    """Wall ms of a fixed pure-Python loop of ``n`` iterations (no torch)."""
    t0 = time.perf_counter()
    s = 0
    for i in range(n):
        s += i * i % 7
    return (time.perf_counter() - t0) * 1e3
