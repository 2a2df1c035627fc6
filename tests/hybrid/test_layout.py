"""MoDa rank layouts (no ranks needed): group membership, and validation of the
expert-parallel size against the world size and the topology's hierarchy."""

from __future__ import annotations

import pytest

from furnace.hybrid.layout import MoDaLayout
from furnace.runtime.presets import sunway_oceanlight
from furnace.runtime.topology import Device, Link, Topology


def toy_topology(ranks_per_node: int, nodes_per_group: int | None) -> Topology:
    link = Link(name="toy", latency_s=0.0, bandwidth_Bps=1e9)
    return Topology(name="toy", device=Device(name="core", peak_flops={"float64": 1e9},
                                              memory_bytes=2**30, memory_bandwidth_Bps=1e9),
                    ranks_per_node=ranks_per_node, intra_node=link, inter_node=link,
                    nodes_per_group=nodes_per_group, group_label="supernode")


def test_groups_of_8_ranks_with_ep_4_on_2x2x2():
    layout = MoDaLayout(world_size=8, expert_parallel_size=4, topology=toy_topology(2, 2))
    assert layout.ep_groups() == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert layout.edp_groups() == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert layout.expert_data_parallel_size == 2
    assert [layout.shard_of(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert layout.ep_group_of(6) == (4, 5, 6, 7)
    assert layout.edp_group_of(6) == (2, 6)
    topo = layout.topology
    assert topo is not None
    # each EP group is one supernode: its all-to-all never crosses the tapered level
    assert {topo.group_of(r) for r in layout.ep_group_of(5)} == {1}


@pytest.mark.parametrize(("world", "ep"), [(8, 8), (8, 1), (4, 2), (2, 2), (1, 1), (6, 3)])
def test_every_rank_is_in_exactly_one_group_of_each_kind(world, ep):
    layout = MoDaLayout(world_size=world, expert_parallel_size=ep)
    for groups, size in ((layout.ep_groups(), ep), (layout.edp_groups(), world // ep)):
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(world))
        assert all(len(g) == size for g in groups)
    # an EP group and an EDP group share exactly one rank: the shard's holder there
    for ep_group in layout.ep_groups():
        for edp_group in layout.edp_groups():
            assert len(set(ep_group) & set(edp_group)) == 1


def test_ep_must_divide_the_world():
    with pytest.raises(ValueError, match=r"expert_parallel_size=3 must divide "
                                         r"world_size=8; allowed: \[1, 2, 4, 8\]"):
        MoDaLayout(world_size=8, expert_parallel_size=3)


@pytest.mark.parametrize("bad", [0, -2, 2.0])
def test_sizes_must_be_positive_ints(bad):
    with pytest.raises(ValueError, match="expert_parallel_size must be a positive int"):
        MoDaLayout(world_size=8, expert_parallel_size=bad)
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        MoDaLayout(world_size=bad, expert_parallel_size=1)


def test_ep_group_must_not_straddle_a_node():
    # 6 core groups per node (Sunway): ranks 4..7 would span two nodes partially
    topo = sunway_oceanlight()
    with pytest.raises(ValueError, match=r"straddle nodes of 6 ranks: it must divide 6 or "
                                         r"be a multiple of it"):
        MoDaLayout(world_size=12, expert_parallel_size=4, topology=topo)
    assert MoDaLayout.allowed_sizes(12, topo) == [1, 2, 3, 6, 12]


def test_ep_group_must_not_straddle_a_supernode():
    # nodes of 2 ranks, supernodes of 3 nodes (6 ranks): 4 covers whole nodes, but
    # ranks 4..7 take part of two supernodes
    topo = toy_topology(2, 3)
    with pytest.raises(ValueError, match="straddle supernodes of 6 ranks"):
        MoDaLayout(world_size=12, expert_parallel_size=4, topology=topo)
    assert MoDaLayout.allowed_sizes(12, topo) == [1, 2, 6, 12]
    # without a topology only divisibility counts
    assert MoDaLayout.allowed_sizes(12) == [1, 2, 3, 4, 6, 12]


def test_rank_outside_the_world_is_refused():
    layout = MoDaLayout(world_size=4, expert_parallel_size=2)
    with pytest.raises(ValueError, match="rank 4 is outside a world of 4"):
        layout.shard_of(4)


def test_plan_layout_and_moda_layout_share_one_divides_rule():
    from furnace.hybrid.config import LayoutError, PlanLayout

    for world in range(1, 25):
        for ep in range(1, world + 1):
            try:
                MoDaLayout(world_size=world, expert_parallel_size=ep)
                runtime_ok = True
            except ValueError:
                runtime_ok = False
            try:
                planned = PlanLayout(world_size=world, ep_size=ep)
                planner_ok = True
            except LayoutError:
                planner_ok = False
            assert runtime_ok == planner_ok == (world % ep == 0), (world, ep)
            if planner_ok:
                assert planned.moda_layout().expert_data_parallel_size == planned.dp_size


def test_allowed_sizes_are_the_divisors_that_fit_the_hierarchy():
    assert MoDaLayout.allowed_sizes(12) == [1, 2, 3, 4, 6, 12]
    # 2-rank nodes, 2-node supernodes: 3 and 6 would straddle a node, 12 is 3 supernodes
    assert MoDaLayout.allowed_sizes(12, toy_topology(2, 2)) == [1, 2, 4, 12]
    assert MoDaLayout.allowed_sizes(0) == []
