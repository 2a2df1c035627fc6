"""Tests of the topology-aware all-to-all (`furnace.hybrid.alltoall`, issue 13 item 3):
equality with the flat `all_to_all_single` for uneven splits (zeros included) and its
gradient, logged bytes and messages per level against the closed form, and the virtual
clock against the cost model on both sides of the model's crossover."""

from __future__ import annotations

import functools

import pytest
import torch

from furnace.hybrid.alltoall import (
    AllToAllTimingConfig,
    SupernodeAllToAll,
    closed_form_traffic,
    emulated_supernode_topology,
    exchange_timings,
    logged_traffic,
    model_crossover_bytes,
    model_crossover_closed_form,
    modelled_time,
)
from furnace.runtime import Communicator, run_distributed
from furnace.runtime.comm import all_to_all_single_autograd
from furnace.runtime.testing import max_relative_error

# (world size, ranks per node): 2 supernodes x 2 nodes x (1 or 2) ranks
LAYOUTS = ((4, 1), (8, 2))
UNIFORM_BYTES = 24  # per (src, dst) pair: 3 float64 values


def _uneven_splits(rank: int, world_size: int) -> list[int]:
    gen = torch.Generator().manual_seed(100 + rank)
    splits = torch.randint(0, 4, (world_size,), generator=gen).tolist()
    splits[(rank + 1) % world_size] = 0  # every rank has at least one empty destination
    return splits


def _virtual_config() -> tuple[AllToAllTimingConfig, int, int]:
    """Virtual-clock timings at a quarter of the model's crossover and at four times it."""
    topo = emulated_supernode_topology()
    crossover = model_crossover_bytes(topo, 8)
    assert crossover is not None
    below, above = 4 * round(crossover / 16), 4 * round(crossover)
    config = AllToAllTimingConfig(topology=topo, message_bytes=(below, above), rounds=1,
                                  warmup=0, mode="virtual")
    return config, below, above


def _rank_body(rank: int, world_size: int, ranks_per_node: int,
               virtual: AllToAllTimingConfig | None) -> dict:
    topo = emulated_supernode_topology(ranks_per_node=ranks_per_node, nodes_per_supernode=2)
    engine = SupernodeAllToAll(topo)
    flat_comm = Communicator(name="reference")
    splits = _uneven_splits(rank, world_size)
    # rows carry (source, destination, index) so misplaced rows are visible
    x = torch.tensor([[rank, dst, k] for dst, n in enumerate(splits) for k in range(n)],
                     dtype=torch.float64).reshape(-1, 3)
    out = {}
    for scheme in ("flat", "hierarchical"):
        plan = engine.plan(splits, scheme)
        xg = x.clone().requires_grad_(True)
        y = engine(xg, plan)
        weight = torch.randn(y.shape, generator=torch.Generator().manual_seed(rank),
                             dtype=torch.float64)
        (y * weight).sum().backward()
        out[scheme] = {"y": y.detach(), "grad": xg.grad, "out_splits": plan.output_split_sizes}
    xr = x.clone().requires_grad_(True)
    ref_out = list(out["flat"]["out_splits"])
    y_ref = all_to_all_single_autograd(xr, flat_comm, ref_out, splits)
    weight = torch.randn(y_ref.shape, generator=torch.Generator().manual_seed(rank),
                         dtype=torch.float64)
    (y_ref * weight).sum().backward()
    out["reference"] = {"y": y_ref.detach(), "grad": xr.grad}
    # the uniform case, payload only, forward only: the closed form's setting
    rows = UNIFORM_BYTES // 24
    uniform = torch.ones(rows * world_size, 3, dtype=torch.float64)
    for scheme in ("flat", "hierarchical"):
        plan = engine.plan([rows] * world_size, scheme)
        engine.log.clear()
        engine.run(uniform, plan)
        out[scheme]["traffic"] = logged_traffic(engine.log, rank)
    if virtual is not None:
        # same spawn, to keep the suite fast: the virtual-clock timings
        out["virtual"] = exchange_timings(rank, world_size, virtual)
    return out


@functools.cache
def _results(world_size: int, ranks_per_node: int) -> list[dict]:
    virtual = _virtual_config()[0] if world_size == 8 else None
    return run_distributed(_rank_body, world_size, ranks_per_node, virtual, timeout_s=90)


# exact data movement (torch.equal) on ranks that pin one thread each (run_distributed)
@pytest.mark.thread_independent
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("world_size", "ranks_per_node"), LAYOUTS)
def test_hierarchical_equals_flat_all_to_all_single(world_size, ranks_per_node):
    results = _results(world_size, ranks_per_node)
    for rank, res in enumerate(results):
        expected_rows = sum(_uneven_splits(src, world_size)[rank] for src in range(world_size))
        assert res["reference"]["y"].shape[0] == expected_rows
        for scheme in ("flat", "hierarchical"):
            assert torch.equal(res[scheme]["y"], res["reference"]["y"]), (rank, scheme)
            assert torch.equal(res[scheme]["grad"], res["reference"]["grad"]), (rank, scheme)
        # source-rank order, then the sender's order
        rows = res["hierarchical"]["y"]
        assert torch.equal(rows[:, 1], torch.full((expected_rows,), float(rank),
                                                  dtype=torch.float64))
        assert rows[:, 0].tolist() == sorted(rows[:, 0].tolist())


@pytest.mark.thread_independent  # byte counts from the same one-thread spawn as above
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("world_size", "ranks_per_node"), LAYOUTS)
def test_logged_traffic_per_level_equals_closed_form(world_size, ranks_per_node):
    results = _results(world_size, ranks_per_node)
    for scheme in ("flat", "hierarchical"):
        expected = closed_form_traffic(scheme, message_bytes=UNIFORM_BYTES,
                                       world_size=world_size, ranks_per_supernode=world_size // 2,
                                       ranks_per_node=ranks_per_node)
        for rank, res in enumerate(results):
            assert res[scheme]["traffic"] == expected, (rank, scheme)
    flat = results[0]["flat"]["traffic"]
    hier = results[0]["hierarchical"]["traffic"]
    assert hier.inter_supernode.messages == 1 < flat.inter_supernode.messages == world_size // 2
    assert hier.inter_supernode.bytes_sent == flat.inter_supernode.bytes_sent


def test_closed_form_counts_by_hand():
    # W=8, R=4, n=2, m=10: flat 1/2/4 messages of 10 B; hierarchical 1/2 of 20 B, 1 of 40 B
    flat = closed_form_traffic("flat", message_bytes=10, world_size=8, ranks_per_supernode=4,
                               ranks_per_node=2)
    hier = closed_form_traffic("hierarchical", message_bytes=10, world_size=8,
                               ranks_per_supernode=4, ranks_per_node=2)
    assert [(t.messages, t.bytes_sent) for t in (flat.intra_node, flat.inter_node,
                                                 flat.inter_group)] == [(1, 10), (2, 20), (4, 40)]
    assert [(t.messages, t.bytes_sent) for t in (hier.intra_node, hier.inter_node,
                                                 hier.inter_group)] == [(1, 20), (2, 40), (1, 40)]
    assert hier.intra_supernode.messages == 3


def test_model_crossover_solves_the_two_times():
    topo = emulated_supernode_topology()
    crossover = model_crossover_bytes(topo, 8)
    closed = model_crossover_closed_form(topo, 8)
    assert crossover is not None and closed is not None
    assert abs(crossover - closed) <= 1e-9 * closed
    flat = modelled_time("flat", topo, 8, crossover)
    assert abs(flat - modelled_time("hierarchical", topo, 8, crossover)) <= 1e-9 * flat
    # a single supernode has nothing to aggregate
    assert model_crossover_bytes(topo.replace(nodes_per_group=None), 8) is None


@pytest.mark.thread_independent  # virtual-clock times, from the same spawn
@pytest.mark.timeout(120)
def test_virtual_clock_hierarchical_wins_below_crossover_only():
    config, below, above = _virtual_config()
    for res in _results(8, 2):
        virtual = res["virtual"]
        assert virtual["label"] == "virtual-clock"
        sec = virtual["seconds"]
        assert sec["hierarchical"][below][0] < sec["flat"][below][0]
        assert sec["hierarchical"][above][0] > sec["flat"][above][0]
        for scheme in ("flat", "hierarchical"):
            for size in (below, above):
                model = modelled_time(scheme, config.topology, 8, size)
                assert max_relative_error(torch.tensor(model), torch.tensor(sec[scheme][size][0]),
                                          scale=model) <= 1e-9
