"""The shared alpha-beta and roofline cost model (`furnace.runtime.cost`): the ring times
against the byte model of `comm.traffic`, the trees against hand counts, the hierarchical
all-reduce against the flat ring, the oversubscribed level of a topology, the roofline and
the serial compute model, and the errors for inputs that mean nothing."""

from __future__ import annotations

import numpy as np
import pytest

from furnace.runtime import cost
from furnace.runtime.comm import traffic
from furnace.runtime.presets import h100_ib, sunway_oceanlight
from furnace.runtime.topology import Device, Link

# nothing here rounds differently with the thread count: `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent

# times built from the same terms in another order agree to rounding, relative to the time
RTOL = 1e-12

SLOW = Link(name="slow", latency_s=3e-5, bandwidth_Bps=1e9)
FAST = Link(name="fast", latency_s=2e-6, bandwidth_Bps=2e11)


def close(expected: float) -> object:
    return pytest.approx(expected, rel=RTOL, abs=0.0)


def test_alpha_beta_is_the_hockney_model():
    assert cost.alpha_beta(5e8, latency_s=1e-5, bandwidth_Bps=1e9, messages=3) == close(
        3e-5 + 0.5)
    assert cost.link_time(SLOW, 2e9) == close(3e-5 + 2.0)
    assert cost.link_time(SLOW, 0, 0) == 0.0
    # Link.time is the same function
    assert SLOW.time(12345, 7) == cost.link_time(SLOW, 12345, 7)


def test_alpha_beta_refuses_bad_inputs():
    with pytest.raises(ValueError, match="bandwidth_Bps"):
        cost.alpha_beta(1.0, latency_s=0.0, bandwidth_Bps=0.0)
    with pytest.raises(ValueError, match=">= 0"):
        cost.alpha_beta(-1.0, latency_s=0.0, bandwidth_Bps=1.0)
    with pytest.raises(ValueError, match=">= 0"):
        cost.link_time(SLOW, 1.0, messages=-1)


def test_link_time_array_is_link_time_elementwise():
    num_bytes = np.array([0.0, 1.0, 4096.0, 3.3e9])
    messages = np.array([0, 1, 2, 7])
    got = cost.link_time_array(SLOW, num_bytes, messages)
    assert got.dtype == np.float64 and got.shape == (4,)
    # the same arithmetic, so the same bits
    assert got.tolist() == [cost.link_time(SLOW, b, m) for b, m in zip(num_bytes, messages)]
    assert cost.link_time_array(SLOW, num_bytes).tolist() == [cost.link_time(SLOW, b)
                                                             for b in num_bytes]

    class Broken:
        latency_s = 0.0
        bandwidth_Bps = -1.0

    with pytest.raises(ValueError, match="bandwidth_Bps"):
        cost.link_time_array(Broken(), num_bytes)


@pytest.mark.parametrize("p", [2, 3, 5, 8])
@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                "reduce", "barrier"])
@pytest.mark.parametrize("nbytes", [0, 1, 1000, 10_000_003])
def test_ring_times_are_traffic_times_of_the_byte_model(op, p, nbytes):
    expected = cost.traffic_time(traffic(op, rank=0, world_size=p, nbytes=nbytes), SLOW)
    assert cost.collective_time(op, nbytes, p, SLOW) == expected
    assert cost.collective_time(op, nbytes, p, SLOW, algorithm="ring") == expected


def test_ring_times_by_hand():
    p, n = 4, 4000
    a, b = SLOW.latency_s, SLOW.bandwidth_Bps
    assert cost.collective_time("all_reduce", n, p, SLOW) == close(6 * a + 6000 / b)
    assert cost.collective_time("all_gather", n, p, SLOW) == close(3 * a + 3 * n / b)
    assert cost.collective_time("broadcast", n, p, SLOW) == close(3 * a + n / b)
    assert cost.collective_time("barrier", 0, p, SLOW) == close(a)
    # all_to_all: n bytes to each of the p - 1 peers, all in flight together
    assert cost.collective_time("all_to_all_single", n, p, SLOW) == close(a + 3 * n / b)
    expected = cost.traffic_time(traffic("all_to_all_single", rank=0, world_size=p,
                                         send_bytes=[n] * p, recv_bytes=[n] * p), SLOW)
    assert cost.collective_time("all_to_all_single", n, p, SLOW) == expected


def test_tree_depth_is_ceil_log2():
    assert [cost.tree_depth(p) for p in (1, 2, 3, 4, 5, 8, 9, 1024, 1025)] == [
        0, 1, 2, 2, 3, 3, 4, 10, 11]
    with pytest.raises(ValueError, match="group_size"):
        cost.tree_depth(0)


@pytest.mark.parametrize(("p", "depth"), [(2, 1), (3, 2), (5, 3), (8, 3), (9, 4)])
def test_tree_times_by_hand(p, depth):
    n = 1 << 20
    a, b = SLOW.latency_s, SLOW.bandwidth_Bps

    def tree(op: str) -> float:
        return cost.collective_time(op, n, p, SLOW, algorithm="tree")

    # binomial broadcast and reduce: ceil(log2 p) full-size steps
    assert tree("broadcast") == close(depth * a + depth * n / b)
    assert tree("reduce") == tree("broadcast")
    # all-reduce: a reduce, then a broadcast
    assert tree("all_reduce") == close(2 * depth * a + 2 * depth * n / b)
    # recursive doubling / halving: the ring's bytes in ceil(log2 p) steps
    assert tree("all_gather") == close(depth * a + (p - 1) * n / b)
    assert tree("reduce_scatter") == tree("all_gather")
    # ops with one algorithm cost the same under either name
    for op in ("all_to_all_single", "barrier"):
        assert cost.collective_time(op, n, p, SLOW, algorithm="tree") == (
            cost.collective_time(op, n, p, SLOW))


def test_trees_win_on_latency_and_rings_on_bandwidth():
    p = 64
    small, large = 8, 1 << 30
    assert (cost.collective_time("all_reduce", small, p, SLOW, algorithm="tree")
            < cost.collective_time("all_reduce", small, p, SLOW))
    assert (cost.collective_time("all_reduce", large, p, SLOW)
            < cost.collective_time("all_reduce", large, p, SLOW, algorithm="tree"))


def test_one_rank_costs_nothing_and_fractional_sizes_round_up():
    for op in cost.COLLECTIVES:
        assert cost.collective_time(op, 1e9, 1, SLOW) == 0.0
    # a share of 2.5 bytes: the rank holding 3 paces the ring
    assert cost.collective_time("all_gather", 2.5, 4, SLOW) == (
        cost.collective_time("all_gather", 3, 4, SLOW))
    assert cost.collective_time("all_gather", 2.5, 4, SLOW) > (
        cost.collective_time("all_gather", 2, 4, SLOW))


def test_collective_time_refuses_bad_inputs():
    with pytest.raises(ValueError, match="algorithm"):
        cost.collective_time("all_reduce", 1, 2, SLOW, algorithm="butterfly")
    with pytest.raises(ValueError, match="collectives"):
        cost.collective_time("all_reduce_scatter", 1, 2, SLOW)
    with pytest.raises(ValueError, match="collectives"):
        cost.collective_time("send", 1, 2, SLOW)
    with pytest.raises(ValueError, match="group_size"):
        cost.collective_time("all_reduce", 1, 0, SLOW)
    with pytest.raises(ValueError, match="num_bytes"):
        cost.collective_time("all_reduce", -1, 4, SLOW)


def test_traffic_and_direct_exchange_times():
    tr = traffic("all_gather", rank=0, world_size=3, nbytes=100)
    assert cost.traffic_time(tr, SLOW) == close(2 * SLOW.latency_s + 200 / SLOW.bandwidth_Bps)
    assert cost.traffic_time(traffic("all_reduce", rank=0, world_size=1, nbytes=9), SLOW) == 0.0
    # the slowest class decides; each pays its own larger direction
    levels = [(FAST, 1e9, 2e9), (SLOW, 1e6, 3e5)]
    expected = max(cost.link_time(FAST, 2e9, 2), cost.link_time(SLOW, 1e6, 2))
    assert cost.direct_exchange_time(levels, 2) == expected
    assert expected == cost.link_time(FAST, 2e9, 2)
    assert cost.direct_exchange_time(levels, 0) == 0.0
    assert cost.direct_exchange_time([], 3) == 0.0


def test_hierarchical_all_reduce_is_the_flat_ring_on_one_level():
    n = 8 * 3 * 1_000_003
    # one node: reduce-scatter + all-gather inside it is the flat ring over its ranks
    assert cost.hierarchical_all_reduce_time(n, ranks_per_node=8, num_nodes=1, intra=FAST,
                                             inter=SLOW) == close(
        cost.collective_time("all_reduce", n, 8, FAST))
    # one rank per node: the whole buffer goes round the inter-node ring
    for size in (n, n + 1):
        assert cost.hierarchical_all_reduce_time(size, ranks_per_node=1, num_nodes=5,
                                                 intra=FAST, inter=SLOW) == (
            cost.collective_time("all_reduce", size, 5, SLOW))
    assert cost.hierarchical_all_reduce_time(n, ranks_per_node=1, num_nodes=1, intra=FAST,
                                             inter=SLOW) == 0.0


def test_hierarchical_all_reduce_by_hand_and_against_the_flat_ring():
    local, nodes, n = 8, 4, 1 << 30
    share = n / local
    inside = (local - 1) * FAST.latency_s + (local - 1) * share / FAST.bandwidth_Bps
    across = (2 * (nodes - 1) * SLOW.latency_s
              + 2 * (nodes - 1) * share / nodes / SLOW.bandwidth_Bps)
    hierarchical = cost.hierarchical_all_reduce_time(n, ranks_per_node=local, num_nodes=nodes,
                                                     intra=FAST, inter=SLOW)
    assert hierarchical == close(2 * inside + across)
    # a flat ring over all 32 ranks runs at the slow link's pace with the whole buffer;
    # the two-level scheme sends only one node-share across: about 8x less slow traffic
    flat = cost.collective_time("all_reduce", n, local * nodes, SLOW)
    assert hierarchical < flat / 4


def test_hierarchical_all_reduce_refuses_empty_levels():
    with pytest.raises(ValueError, match="ranks_per_node"):
        cost.hierarchical_all_reduce_time(1, ranks_per_node=0, num_nodes=2, intra=FAST,
                                          inter=SLOW)
    with pytest.raises(ValueError, match="num_nodes"):
        cost.hierarchical_all_reduce_time(1, ranks_per_node=2, num_nodes=0, intra=FAST,
                                          inter=SLOW)


def test_group_collective_time_uses_the_oversubscribed_level():
    # 6 core groups to a node, 2 nodes to a supernode, supernodes joined at a 16:3 taper
    topo = sunway_oceanlight(nodes_per_supernode=2)
    n = 10_000_000
    across = list(range(0, 24, 2))  # two supernodes
    assert topo.slowest_level(across) == "inter_group"
    tapered = topo.inter_group
    assert tapered.bandwidth_Bps == close(topo.inter_node.bandwidth_Bps * 3 / 16)
    got = cost.group_collective_time("all_reduce", n, across, topo)
    assert got == cost.collective_time("all_reduce", n, 12, tapered)
    within = list(range(0, 12, 1))  # one supernode, two nodes
    assert cost.group_collective_time("all_reduce", n, within, topo) == (
        cost.collective_time("all_reduce", n, 12, topo.inter_node))
    assert got > cost.group_collective_time("all_reduce", n, within, topo)
    node = list(range(6))
    assert cost.group_collective_time("broadcast", n, node, topo, algorithm="tree") == (
        cost.collective_time("broadcast", n, 6, topo.intra_node, algorithm="tree"))
    assert cost.group_collective_time("all_reduce", n, [7], topo) == 0.0


def test_roofline_takes_the_longer_of_compute_and_memory():
    dev = h100_ib().device
    peak, bw = dev.flops("bfloat16"), dev.memory_bandwidth_Bps
    # a GEMM far above the ridge point is compute-bound
    flops, nbytes = 2 * 8192**3, 3 * 8192**2 * 2
    assert cost.roofline_time(dev, flops, nbytes, "bfloat16") == close(flops / peak)
    # an elementwise op far below it is memory-bound
    assert cost.roofline_time(dev, 1e6, 1e9, "bfloat16") == close(1e9 / bw)
    assert cost.roofline_time(dev, 0, 1e9, "bfloat16") == close(1e9 / bw)
    assert cost.roofline_time(dev, 1e12) == close(1e12 / dev.flops("float32"))
    # Device.compute_time is the compute-only roofline
    assert dev.compute_time(1e12, "bfloat16") == cost.roofline_time(dev, 1e12, 0, "bfloat16")


def test_roofline_refuses_bad_inputs():
    dev = Device(name="d", peak_flops={"float32": 1e12}, memory_bytes=1e9,
                 memory_bandwidth_Bps=1e11)
    with pytest.raises(ValueError, match=">= 0"):
        cost.roofline_time(dev, -1.0)
    with pytest.raises(ValueError, match=">= 0"):
        cost.roofline_time(dev, 1.0, -1.0)
    with pytest.raises(ValueError, match="no peak figure"):
        cost.roofline_time(dev, 0.0, 1e6, "float16")


def test_serial_compute_time_sums_units_and_memory():
    work = [(2e12, 1e12), (0, 0.0), (3e9, 1e9)]
    assert cost.serial_compute_time(work, 4e9, 2e9) == close(2.0 + 3.0 + 2.0)
    # the serial sum is never below the roofline of the same work on one unit
    dev = Device(name="d", peak_flops={"float32": 1e12}, memory_bytes=1e9,
                 memory_bandwidth_Bps=2e9)
    serial = cost.serial_compute_time([(2e12, 1e12)], 4e9, 2e9)
    assert serial == close(4.0) and cost.roofline_time(dev, 2e12, 4e9) == close(2.0)
    # no memory traffic needs no bandwidth
    assert cost.serial_compute_time([(1e9, 1e9)]) == close(1.0)
    assert cost.serial_compute_time([]) == 0.0


def test_serial_compute_time_refuses_bad_inputs():
    with pytest.raises(ValueError, match="rate"):
        cost.serial_compute_time([(1.0, 0.0)])
    with pytest.raises(ValueError, match=">= 0"):
        cost.serial_compute_time([(-1.0, 1.0)])
    with pytest.raises(ValueError, match="bandwidth"):
        cost.serial_compute_time([], 1.0)
    with pytest.raises(ValueError, match="bandwidth"):
        cost.serial_compute_time([], 1.0, 0.0)
    with pytest.raises(ValueError, match=">= 0"):
        cost.serial_compute_time([], -1.0, 1.0)


def test_log_levels():
    assert cost.log_levels(1) == 0.0
    assert cost.log_levels(8) == 3.0
    assert cost.log_levels(6) == close(np.log2(6))
    with pytest.raises(ValueError, match="group_size"):
        cost.log_levels(0)
