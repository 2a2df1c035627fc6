"""`runtime.twolevel`: the hierarchical all-reduce equals a plain sum on every rank, for sizes
the node does not divide; its logged bytes per rank, and those `LevelCounter` attributes to
each link level, equal `hierarchical_all_reduce_bytes`; on the virtual clock it takes the
time `cost.hierarchical_all_reduce_time` gives."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from furnace.runtime.comm import CommLog
from furnace.runtime.cost import hierarchical_all_reduce_time
from furnace.runtime.launch import run_distributed
from furnace.runtime.netem import NetworkEmulation, NetworkEmulator
from furnace.runtime.presets import emulated_link
from furnace.runtime.twolevel import (
    HierarchicalAllReduce,
    LevelCounter,
    hierarchical_all_reduce_bytes,
    two_level_groups,
)

SIZES = (1, 7, 64, 1001)


def _topology(per_node: int):  # type: ignore[no-untyped-def]
    return emulated_link(bandwidth_Bps=1e6, latency_s=1e-4, ranks_per_node=per_node,
                         intra_bandwidth_Bps=1e7, intra_latency_s=1e-5)


def _worker(rank: int, world_size: int, per_node: int) -> dict[str, object]:
    topology = _topology(per_node)
    node, cross = two_level_groups(per_node)
    counter = LevelCounter(topology, by="group")
    network = NetworkEmulator(NetworkEmulation(topology=topology, mode="virtual"))
    log = CommLog()
    reducer = HierarchicalAllReduce(node, cross, log=log, network=network, name="ar",
                                    on_traffic=counter)
    out: dict[str, object] = {"sums": [], "times": []}
    for n in SIZES:
        gen = torch.Generator().manual_seed(1000 * rank + n)
        x = torch.randn(n, 3, generator=gen, dtype=torch.float64)
        expected = x.clone()
        dist.all_reduce(expected)
        before = network.clock.now  # type: ignore[union-attr]
        handle = reducer.all_reduce(x, async_op=True)
        got = handle.wait()
        out["times"].append(network.clock.now - before)  # type: ignore[union-attr, attr-defined]
        out["sums"].append(float((got - expected).abs().max()))  # type: ignore[attr-defined]
        assert got is x
    out["bytes"] = sum(r.bytes_sent for r in log.records)
    out["levels"] = counter.bytes["ar"]
    return out


# the ranks pin one torch thread each (run_distributed), so the caller's count changes nothing
@pytest.mark.thread_independent
@pytest.mark.timeout(90)
@pytest.mark.parametrize(("world_size", "per_node"), [(4, 2), (6, 3)])
def test_hierarchical_all_reduce_is_the_sum_with_counted_bytes(world_size, per_node):
    results = run_distributed(_worker, world_size, per_node, timeout_s=80)
    nodes = world_size // per_node
    inside = across = 0
    for n in SIZES:
        i, a = hierarchical_all_reduce_bytes(3 * n, 8, ranks_per_node=per_node,
                                             num_nodes=nodes)
        inside, across = inside + i, across + a
    topo = _topology(per_node)
    for rank, r in enumerate(results):
        assert max(r["sums"]) <= 1e-12, rank  # sums of 2-3 numbers in another order
        assert r["bytes"] == inside + across, rank
        assert r["levels"] == {"intra_node": inside, "inter_node": across}, rank
        for n, t in zip(SIZES, r["times"]):
            want = hierarchical_all_reduce_time(
                8 * per_node * -(-3 * n // per_node), ranks_per_node=per_node,
                num_nodes=nodes, intra=topo.intra_node, inter=topo.inter_node)
            assert t == pytest.approx(want, rel=1e-9), (rank, n)


@pytest.mark.thread_independent  # arithmetic only
def test_hierarchical_bytes_cross_nodes_less_than_one_ring():
    # 8 ranks as 2 nodes of 4, 4096 fp32 elements: a ring sends 2*7/8*16 KiB per rank, all
    # paced by the slow link; the hierarchy sends 2*1/2*4 KiB across nodes
    inside, across = hierarchical_all_reduce_bytes(4096, 4, ranks_per_node=4, num_nodes=2)
    assert across == 4096
    assert inside == 2 * 3 * 4096
    assert inside + across == 2 * 7 * 16384 // 8  # the same total as one ring
    # padded to a multiple of the node: 5 elements on nodes of 2 reduce 3 per rank
    assert hierarchical_all_reduce_bytes(5, 4, ranks_per_node=2, num_nodes=2) == (24, 12)
    with pytest.raises(ValueError):
        hierarchical_all_reduce_bytes(5, 4, ranks_per_node=0, num_nodes=2)
