"""``costmodel calibrate``'s measuring half (``sim/executor/calibration.py``'s ``measure``) on the
CPU with the tiny shape: the points' columns, their timed steps (3 to ``MAX_REPS``), and the
host-speed probe read at least three times per point (before, between and after its timed steps),
the point's ``probe_ms`` the mean of its own readings."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def torch_one_thread():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(threads)


def _first(plans):
    from tlora_sim.profiler import calibrate as cb

    pts = cb.design(("llama3-8b",))
    return [next(p for p in pts if p["plan"] == plan and p["nano"] == 1) for plan in plans]


def test_measure_reads_the_probe_between_timed_steps(torch_one_thread):
    from tlora_sim.profiler import calibrate as cb
    from tlora_sim.sim.executor.calibration import measure

    points = _first(("alone", "loop"))
    assert any(len(p["members"]) == 2 for p in points)
    pts, probes = measure(points, "cpu", tiny=True, budget_s=120.0, log=lambda *_: None)
    assert list(pts.columns) == cb.POINT_COLUMNS and list(probes.columns) == cb.PROBE_COLUMNS
    assert pts.plan.tolist() == ["alone", "loop"] and pts.members.tolist() == [cb.members_str(p["members"])
                                                                                 for p in points]
    assert ((pts.reps >= cb.MIN_REPS) & (pts.reps <= cb.MAX_REPS)).all()
    assert (probes.t_s.diff().dropna() > 0).all()
    for i, row in pts.iterrows():
        mine = probes[probes.point == i]
        assert 3 <= len(mine) <= 2 + row.reps // 2, (i, len(mine))
        assert row.probe_ms == pytest.approx(mine.probe_ms.mean(), rel=1e-12)
    assert sorted(set(probes.point)) == [0, 1]
    # at most 4 timed steps: readings before, after the second and after the fourth
    one, pr = measure(points[:1], "cpu", tiny=True, budget_s=120.0, log=lambda *_: None, max_reps=4)
    assert one.reps.tolist() == [4] and len(pr) == 3 and np.isfinite(pr.probe_ms).all()
