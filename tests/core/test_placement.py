"""GPU placement: best fit on one node, whole nodes for multi-node jobs, never double-booked."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tlora_sim.sim.core.placement import FreeGpus, place


def test_best_fit_takes_the_fullest_node_that_fits():
    assert place([8, 3, 5, 2], 2, 8) == ((3, 2),)  # exact fit
    assert place([8, 3, 5, 1], 2, 8) == ((1, 2),)  # fewest free that still fits
    assert place([8, 4, 4, 8], 4, 8) == ((1, 4),)  # ties: lowest index
    assert place([8, 1, 1, 1], 2, 8) == ((0, 2),)
    assert place([1, 1, 1, 1], 2, 8) is None  # 4 free GPUs, but no node holds 2


def test_multi_node_jobs_take_whole_free_nodes():
    assert place([8, 8, 8, 8], 16, 8) == ((0, 8), (1, 8))
    assert place([8, 7, 8, 8], 16, 8) == ((0, 8), (2, 8))
    assert place([7, 8, 7, 8], 16, 8) == ((1, 8), (3, 8))
    assert place([8, 7, 7, 7], 16, 8) is None  # 29 free GPUs but one whole node
    # a remainder goes best-fit onto another node
    p = place([8, 8, 3, 8], 19, 8)
    assert sum(k for _, k in p) == 19 and (2, 3) in p


def test_multi_node_prefers_one_rack():
    free = [8, 0, 0, 8, 8, 8, 0, 0]  # racks of 4: rack 0 has 2 whole nodes, rack 1 has 2
    p = place(free, 16, 8, nodes_per_rack=4)
    assert {n // 4 for n, _ in p} in ({0}, {1})
    free = [8, 0, 0, 0, 8, 8, 8, 0]  # only rack 1 has two
    assert place(free, 16, 8, nodes_per_rack=4) == ((4, 8), (5, 8))


@pytest.mark.parametrize("n", [0, -1, 33])
def test_impossible_requests_return_none(n):
    assert place([8, 8, 8, 8], n, 8) is None


def test_free_gpus_refuses_double_booking():
    f = FreeGpus([8, 8], 8)
    p = f.take(8)
    assert p == ((0, 8),) and f.free == [0, 8]
    with pytest.raises(RuntimeError, match="accounting"):
        f.apply(p, -1)  # node 0 again
    f.apply(p, +1)
    with pytest.raises(RuntimeError, match="accounting"):
        f.apply(p, +1)  # released twice
    assert f.take(9) == ((0, 8), (1, 1))
    assert f.take(8) is None and f.free == [0, 7]


@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 24)), min_size=1, max_size=60),
       nodes=st.integers(1, 6), gpn=st.sampled_from([1, 2, 4, 8]))
def test_random_take_and_release_never_double_books(ops, nodes, gpn):
    f = FreeGpus([gpn] * nodes, gpn, 2)
    held: list = []
    owner = [[None] * gpn for _ in range(nodes)]  # which allocation holds each GPU slot
    for k, (take, n) in enumerate(ops):
        if take or not held:
            before = list(f.free)
            p = f.take(n)
            if p is None:
                assert f.free == before
                assert n > sum(before) or place(before, n, gpn, 2) is None
                continue
            assert sum(c for _, c in p) == n
            if n <= gpn:
                assert len(p) == 1  # a job that fits one node stays on one node
            else:
                assert sum(1 for _, c in p if c == gpn) >= n // gpn  # whole nodes
            for node, c in p:
                slots = [s for s in range(gpn) if owner[node][s] is None][:c]
                assert len(slots) == c  # the GPUs were really free
                for s in slots:
                    owner[node][s] = k
            held.append((k, p))
        else:
            k0, p = held.pop(n % len(held))
            f.apply(p, +1)
            for node, c in p:
                for s in range(gpn):
                    if owner[node][s] == k0:
                        owner[node][s] = None
        for node in range(nodes):
            assert f.free[node] == sum(1 for s in owner[node] if s is None)



@given(free=st.lists(st.integers(0, 8), min_size=1, max_size=40), n=st.integers(-1, 70),
       npr=st.sampled_from([1, 2, 4]))
def test_find_answers_as_place_does(free, n, npr):
    """``FreeGpus.find`` answers one-node requests from its per-count index: the same placement as
    the plain scan of ``place`` (best fit, lowest index on ties), and None exactly where it is None."""
    f = FreeGpus(list(free), 8, npr)
    assert f.find(n) == place(free, n, 8, npr)
    assert f.total == sum(free)


@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 12)), min_size=1, max_size=80),
       nodes=st.integers(1, 8), gpn=st.sampled_from([1, 2, 4, 8]))
def test_index_follows_takes_releases_and_copies(ops, nodes, gpn):
    """After any sequence of takes and releases (on the object and on copies of it), each find
    equals ``place`` on the current ``free`` and the total is their sum; a copy's changes do not
    reach the original."""
    f = FreeGpus([gpn] * nodes, gpn, 2)
    held = []
    for take, n in ops:
        assert f.find(n) == place(list(f.free), n, gpn, 2)
        if take or not held:
            c = f.copy()
            before = list(f.free)
            if c.take(n) is not None:
                assert f.free == before and f.total == sum(before)
            p = f.take(n)
            if p is not None:
                held.append(p)
        else:
            f.apply(held.pop(n % len(held)), +1)
        assert f.total == sum(f.free)
        assert all(f.find(k) == place(list(f.free), k, gpn, 2) for k in range(1, gpn + 1))
