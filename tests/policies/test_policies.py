"""Policies as pure functions of hand-built snapshots: independent, mlora, tlora, and the registry."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import CM, group_view, make_job, policy, snapshot
from tlora_sim.traces.errors import InputError
from tlora_sim.sim.core.snapshot import AddMembers, RemoveMembers, SetExecution, StartGroup


def starts(actions):
    return [a for a in actions if isinstance(a, StartGroup)]


def adds(actions):
    return [a for a in actions if isinstance(a, AddMembers)]


def started_indices(actions):
    return [i for a in starts(actions) for i in a.job_indices]


# ---- independent -----------------------------------------------------------------------------------
def test_independent_is_strict_fifo_with_head_of_line_blocking():
    q = [make_job(0, gpus=1), make_job(1, gpus=4), make_job(2, gpus=8), make_job(3, gpus=1)]
    acts = policy("independent", backfill="none").decide(snapshot(q, spec="1x8xH100"))
    # jobs 0 and 1 fit (5 GPUs), job 2 needs 8 of the 3 left and blocks job 3 (no backfilling)
    assert [a.job_indices for a in acts] == [(0,), (1,)]
    assert all(a.plan == "alone" for a in acts)
    assert [a.placement for a in acts] == [((0, 1),), ((0, 4),)]
    # the default (EASY backfilling): job 3 passes the blocked job 2
    acts = policy("independent").decide(snapshot(q, spec="1x8xH100"))
    assert [a.job_indices for a in acts] == [(0,), (1,), (3,)]


def test_independent_blocked_head_starts_nothing():
    q = [make_job(0, gpus=8), make_job(1, gpus=1)]
    assert policy("independent", backfill="none").decide(snapshot(q, spec="1x8xH100", free=[4])) == []
    assert started_indices(policy("independent").decide(snapshot(q, spec="1x8xH100"))) == [0]


def test_independent_places_multi_node_jobs_on_whole_nodes():
    q = [make_job(0, gpus=16)]
    (a,) = policy("independent").decide(snapshot(q, spec="4x8xH100", free=[8, 3, 8, 8]))
    assert sorted(k for _, k in a.placement) == [8, 8] and all(f == 8 for f in (8, 8))
    assert 1 not in [n for n, _ in a.placement]


jobs_strategy = st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from(["llama3-8b", "qwen3-8b"]),
                                   st.sampled_from([2, 4, 8, 16]), st.sampled_from([1, 2, 4]),
                                   st.sampled_from([512, 1024]), st.sampled_from([1.25, 1.5, 2.0])),
                         min_size=1, max_size=12)


def build_queue(spec):
    return [make_job(i, gpus=g, model=m, rank=r, batch=b, seq=s, slowdown=x)
            for i, (g, m, r, b, s, x) in enumerate(spec)]


@given(spec=jobs_strategy, free=st.lists(st.integers(0, 8), min_size=2, max_size=2))
def test_independent_property_fifo_prefix_and_no_double_booking(spec, free, reliability):
    q = build_queue(spec)
    acts = policy("independent", backfill="none").decide(snapshot(q, spec="2x8xH100", free=free))
    idx = started_indices(acts)
    assert idx == list(range(len(idx)))  # a prefix of the queue, in order
    used = [0, 0]
    for a in acts:
        assert len(a.job_indices) == 1 and a.plan == "alone"
        assert sum(k for _, k in a.placement) == q[a.job_indices[0]].num_gpus
        for node, k in a.placement:
            used[node] += k
    assert all(u <= f for u, f in zip(used, free))
    if len(idx) < len(q):  # the next job really did not fit in what was left
        left = [f - u for f, u in zip(free, used)]
        from tlora_sim.sim.core.placement import place

        assert place(left, q[len(idx)].num_gpus, 8) is None
    reliability("policy_cases")


# ---- mlora -----------------------------------------------------------------------------------------
def test_mlora_packs_up_to_concurrency_num():
    q = [make_job(i) for i in range(6)]
    acts = policy("mlora", concurrency_num=4).decide(snapshot(q, spec="1x1xH100"))
    # one GPU: a group of 4; the 5th job can neither join (full) nor start (no GPU) and blocks the 6th
    assert [a.job_indices for a in acts] == [(0, 1, 2, 3)]
    assert acts[0].plan == "loop"
    acts = policy("mlora", concurrency_num=4).decide(snapshot(q, spec="1x2xH100"))
    assert sorted(a.job_indices for a in acts) == [(0, 1, 2, 3), (4, 5)]


def test_mlora_joins_running_groups_with_room():
    running = group_view(7, [make_job(10), make_job(11), make_job(12)], ((0, 1),), plan="loop")
    q = [make_job(0), make_job(1)]
    acts = policy("mlora", concurrency_num=4).decide(snapshot(q, spec="1x1xH100", groups=[running]))
    assert acts == [AddMembers(7, (0,))]  # fills the group; job 1 has no GPU to start on


def test_mlora_never_mixes_base_models():
    q = [make_job(0), make_job(1, model="qwen3-8b"), make_job(2), make_job(3, model="qwen3-8b")]
    acts = policy("mlora").decide(snapshot(q, spec="1x2xH100"))
    assert sorted(a.job_indices for a in acts) == [(0, 2), (1, 3)]
    # one GPU: the qwen job 1 can neither join nor start, and strict FIFO stops there
    assert policy("mlora").decide(snapshot(q, spec="1x1xH100")) == [StartGroup((0,), ((0, 1),), "loop")]


@given(spec=jobs_strategy, conc=st.integers(1, 6), free=st.lists(st.integers(0, 8), min_size=2, max_size=2))
def test_mlora_property_single_model_bounded_groups(spec, conc, free, reliability):
    q = build_queue(spec)
    by_index = {j.index: j for j in q}
    acts = policy("mlora", concurrency_num=conc).decide(snapshot(q, spec="2x8xH100", free=free))
    seen = set()
    for a in acts:
        assert isinstance(a, StartGroup)
        members = [by_index[i] for i in a.job_indices]
        assert len({j.model for j in members}) == 1
        assert len({j.num_gpus for j in members}) == 1
        assert 1 <= len(members) <= conc
        assert not seen & set(a.job_indices)
        seen |= set(a.job_indices)
        assert CM.memory_bytes(members[0].model, "H100", [j.member for j in members], members[0].num_gpus,
                               "loop") <= 80 * 2**30
    reliability("policy_cases")


# ---- tlora -----------------------------------------------------------------------------------------
def group_ok(members, n_gpus, nano=1):
    """Every member within its tolerated slowdown under the fused plan."""
    step = CM.step_time_s(members[0].model, "H100", [j.member for j in members], n_gpus, "fused", nano)
    return all(step <= j.max_slowdown * j.isolated_step_time_s * (1 + 1e-9) for j in members), step


EAGER = dict(slowdown_reference="eager", regroup_pause_s=0.0)
"""tLoRA's join test as these tests' ``group_ok`` reads it: bounds against the eager isolated step,
no pause priced (the own-plan reference and the pause are tests/policies/test_ours_policy.py's)."""


def rate(members, step):
    return sum(j.isolated_step_time_s for j in members) / step


def test_tlora_groups_small_jobs_within_their_slowdown():
    q = [make_job(i, rank=4, batch=1, seq=512, slowdown=2.0) for i in range(4)]
    acts = policy("tlora", ordering="fifo", **EAGER).decide(snapshot(q, spec="1x1xH100"))
    (s,) = starts(acts)
    assert len(s.job_indices) >= 2 and s.plan == "fused"
    ok, step = group_ok([q[i] for i in s.job_indices], 1)
    assert ok
    assert rate([q[i] for i in s.job_indices], step) > rate([q[s.job_indices[0]]], group_ok([q[s.job_indices[0]]], 1)[1])


def test_tlora_does_not_group_when_a_member_would_exceed_its_slowdown():
    # large, tight jobs: any pair is slower than 1.25x alone for each
    q = [make_job(i, rank=16, batch=8, seq=2048, slowdown=1.25) for i in range(3)]
    ok, _ = group_ok(q[:2], 1)
    assert not ok
    acts = policy("tlora", ordering="fifo", **EAGER).decide(snapshot(q, spec="1x2xH100"))
    assert sorted(a.job_indices for a in starts(acts)) == [(0,), (1,)]
    assert not adds(acts)


def test_tlora_joins_a_running_group_only_when_throughput_rises():
    small = [make_job(10 + i, rank=4, batch=1, seq=512, slowdown=2.0) for i in range(2)]
    running = group_view(3, small, ((0, 1),))
    q = [make_job(0, rank=4, batch=1, seq=512, slowdown=2.0)]
    acts = policy("tlora", ordering="fifo", **EAGER).decide(snapshot(q, spec="1x1xH100", groups=[running]))
    assert acts == [AddMembers(3, (0,))]
    ok, step = group_ok(small + q, 1)
    assert ok and rate(small + q, step) > rate(small, running.step_time_s)
    # with the free GPU a lone start is worth 1 isolated-speed unit: a join must beat that too
    acts = policy("tlora", ordering="fifo", **EAGER).decide(snapshot(q, spec="1x2xH100", groups=[running]))
    if adds(acts):
        assert rate(small + q, step) > rate(small, running.step_time_s) + 1.0
    else:
        assert started_indices(acts) == [0]


@given(spec=jobs_strategy, free=st.lists(st.integers(0, 8), min_size=2, max_size=2), with_group=st.booleans())
def test_tlora_property_bounds_throughput_and_fifo_admission(spec, free, with_group, reliability):
    q = build_queue(spec)
    groups = []
    if with_group and free[0] >= 1:
        base = [make_job(100, rank=4, batch=1, seq=512, slowdown=2.0, model=q[0].model, gpus=q[0].num_gpus)]
        if q[0].num_gpus <= 8:
            groups = [group_view(0, base, ((0, q[0].num_gpus),))]
            free = [max(free[0] - q[0].num_gpus, 0), free[1]]
    snap = snapshot(q, spec="2x8xH100", free=free, groups=groups)
    acts = policy("tlora", ordering="fifo", **EAGER, consolidate=False).decide(snap)
    by_index = {j.index: j for j in q}
    final = {g.group_id: list(g.members) for g in groups}
    for a in acts:
        assert not isinstance(a, RemoveMembers)  # no consolidation asked for
        if isinstance(a, StartGroup):
            members = [by_index[i] for i in a.job_indices]
            assert len({j.model for j in members}) == 1 and len({j.num_gpus for j in members}) == 1
            ok, step = group_ok(members, members[0].num_gpus, a.nano_batches)
            assert ok or len(members) == 1
            if len(members) > 1:
                assert rate(members, step) > rate(members[:1], group_ok(members[:1], members[0].num_gpus)[1])
        elif isinstance(a, AddMembers):
            old = final[a.group_id]
            new = old + [by_index[i] for i in a.job_indices]
            assert {j.model for j in new} == {old[0].model}
            ok, step = group_ok(new, snap.groups[a.group_id].n_gpus)
            assert ok
            assert rate(new, step) > rate(old, group_ok(old, snap.groups[a.group_id].n_gpus)[1])
            final[a.group_id] = new
        else:
            assert isinstance(a, SetExecution)
    # GPU admission is FIFO: if the head got no place, nobody got GPUs
    placed = set(started_indices(acts)) | {i for a in adds(acts) for i in a.job_indices}
    if 0 not in placed:
        assert not starts(acts)
        from tlora_sim.sim.core.placement import place

        assert place(list(free), q[0].num_gpus, 8) is None
    reliability("policy_cases")


def test_tlora_head_that_fits_always_gets_gpus_or_a_group():
    # the head fits on the free GPUs: whatever else happens, it is placed in this decision
    for n in (1, 2, 4, 8):
        q = [make_job(0, gpus=n, rank=16, batch=8, seq=2048)] + [make_job(i, rank=2, batch=1, seq=512)
                                                                  for i in range(1, 6)]
        acts = policy("tlora", ordering="fifo", **EAGER).decide(snapshot(q, spec="1x8xH100", free=[n]))
        assert 0 in started_indices(acts)


# ---- registry ----------------------------------------------------------------------------------
def test_registry_lists_builtin_policies_with_descriptions():
    from tlora_sim.policies.registry import available

    names = [e.name for e in available()]
    assert {"independent", "mlora", "tlora"} <= set(names)
    assert all(e.description.strip() and "\n" not in e.description for e in available())


@pytest.mark.parametrize("name, options, field", [
    ("nope", {}, "--policy"),
    ("mlora", {"concurrency_num": "x"}, "concurrency_num"),
    ("mlora", {"concurrency_num": 0}, "concurrency_num"),
    ("mlora", {"nosuch": 1}, "nosuch"),
    ("tlora", {"max_group_size": 0}, None),
    ("tlora", {"ordering": "random"}, "ordering"),
])
def test_bad_policy_configs_raise_input_error(name, options, field, reliability):
    with pytest.raises(InputError) as info:
        policy(name, **options)
    if field is not None:
        assert info.value.field == field
    assert "\n" not in str(info.value)
    reliability("bad_inputs")


def test_bool_options_from_the_command_line_are_parsed():
    """Regression: ``--option tlora.grouping=False`` once stayed the truthy string 'False'."""
    p = policy("tlora", grouping="False", nano_batching="0")
    assert p.config.grouping is False and p.config.nano_batching is False
