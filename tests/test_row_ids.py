"""``batch.RowIds``: merged step times kept by the ids of their parts are the plain batch call's,
bit for bit, on one GPU (``FusedBatch``) and several (``PlannerBatch``), on first asking and from
the memo (its dict and its sorted arrays, partly each, and past its capacity), and on every
fallback (an id of -1, a nano-batch count that is not a whole number, too few pairs)."""

from __future__ import annotations

import numpy as np
import pytest

from tlora_sim.sim.costmodel.batch import FusedBatch, RowIds
from tlora_sim.sim.costmodel.batch_multigpu import PlannerBatch
from tlora_sim.sim.costmodel.factory import default_cost_model
from tlora_sim.sim.costmodel.interface import Member


def _rows(batch, rng, count):
    groups = [[Member(int(rng.choice([4, 8, 16, 64, 128])), int(rng.choice([1, 2, 4, 8])),
                      int(rng.choice([256, 512, 1024, 2048])))
               for _ in range(int(rng.integers(1, 5)))] for _ in range(count)]
    return np.array([batch.row(g) for g in groups])


@pytest.mark.parametrize("n_gpus,recent,cap", [(1, 1 << 12, 1 << 20), (4, 1 << 12, 1 << 20), (1, 7, 50), (4, 7, 50)])
def test_merged_step_times_equal_the_plain_call(n_gpus, recent, cap, monkeypatch):
    monkeypatch.setattr(RowIds, "RECENT", recent)  # small: answers sorted in as they come, some dropped
    monkeypatch.setattr(RowIds, "CAP", cap)
    cm = default_cost_model("H100")
    batch = (FusedBatch if n_gpus == 1 else PlannerBatch).of(cm, "llama3-8b", "H100", n_gpus)
    rng = np.random.default_rng(5)
    rows = _rows(batch, rng, 40)
    ids = np.array([batch.row_ids.id_of(r) for r in rows])
    assert len(set(ids.tolist())) == len({r.tobytes() for r in rows})  # one id per distinct row
    assert batch.row_ids.id_of(rows[3].copy()) == ids[3]
    plain = FusedBatch.merge
    for P in (3, RowIds.MIN_ROWS, 300):
        a, b = rng.integers(0, len(rows), P), rng.integers(0, len(rows), P)
        for nano in (rng.choice([1.0, 2.0, 5.0], P), 3):
            want = batch.step_times(plain(rows[a], rows[b]) if n_gpus == 1 else batch.merge(rows[a], rows[b]), nano)
            for sort in (False, True, False):  # asked, then kept (in the dict, then sorted into the arrays)
                if sort:
                    batch.row_ids._sort()
                got = batch.row_ids.merged_step_times(ids[a], ids[b], lambda i: (rows[a[i]], rows[b[i]]), nano)
                assert np.array_equal(got, want)
    # fallbacks: an unnumbered row, a count that is not a whole number: the plain call, not a wrong key
    P = 100
    a, b = rng.integers(0, len(rows), P), rng.integers(0, len(rows), P)
    ia = ids[a].copy()
    ia[7] = -1
    got = batch.row_ids.merged_step_times(ia, ids[b], lambda i: (rows[a[i]], rows[b[i]]), 2.0)
    assert np.array_equal(got, batch.step_times(batch.merge(rows[a], rows[b]), 2.0))
    nano = np.full(P, 2.0)
    nano[3] = 2.5
    got = batch.row_ids.merged_step_times(ids[a], ids[b], lambda i: (rows[a[i]], rows[b[i]]), nano)
    assert np.array_equal(got, batch.step_times(batch.merge(rows[a], rows[b]), nano))
    assert got[3] != batch.row_ids.merged_step_times(ids[a], ids[b], lambda i: (rows[a[i]], rows[b[i]]), 2.0)[3]


def test_ids_run_out_into_the_plain_call(monkeypatch):
    cm = default_cost_model("H100")
    fb = FusedBatch.of(cm, "llama3-8b", "H100", 1)
    monkeypatch.setattr(RowIds, "MAX_IDS", 4)
    rows = _rows(fb, np.random.default_rng(2), 12)
    ids = [fb.row_ids.id_of(r) for r in rows]
    assert max(ids) <= 3 and -1 in ids
