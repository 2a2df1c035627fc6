"""Expert parallelism against the brute-force reference: forward output, input gradient,
every expert's and the gate's gradients, on 2 and 4 gloo ranks in float64.

Every rank builds the same global layer (same seed) and the same global batch; the
reference (`naive_moe`) runs the whole global batch in one process, and each rank checks
its own shard. Float64 and tolerance 1e-12: the fast paths only reorder sums.
"""

from __future__ import annotations

import copy

import pytest
import torch

from furnace.moe import ExpertParallelConfig, MoETransformerMLP, expert_parallel, naive_moe
from furnace.runtime import Communicator, emulated_link, run_distributed
from furnace.runtime.testing import relative_error

D_MODEL, D_HIDDEN = 6, 10
TOL = 1e-12


def build_layer(num_experts: int, top_k: int, skew: bool) -> MoETransformerMLP:
    torch.manual_seed(7)
    layer = MoETransformerMLP(d_model=D_MODEL, d_hidden=D_HIDDEN, num_experts=num_experts,
                              top_k=top_k).double()
    if skew:
        with torch.no_grad():
            # expert 0 wins almost every first choice: a hot expert, and empty ones
            layer.gate.scorer.bias[0] += 6.0
    return layer


def global_batch(batch_sizes: list[int]):
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(b, D_MODEL, generator=gen, dtype=torch.float64) for b in batch_sizes]
    ws = [torch.randn(b, D_MODEL, generator=gen, dtype=torch.float64) for b in batch_sizes]
    return xs, ws


def _check_rank(rank: int, world_size: int, num_experts: int, top_k: int,
                batch_sizes: list[int], skew: bool, config: dict | list[dict]):
    """One check per config (a list runs several in one launch and returns a list)."""
    if isinstance(config, list):
        return [_check_rank(rank, world_size, num_experts, top_k, batch_sizes, skew, c)
                for c in config]
    layer = build_layer(num_experts, top_k, skew)
    ref = copy.deepcopy(layer)
    xs, ws = global_batch(batch_sizes)
    xs_ref = [x.clone().requires_grad_() for x in xs]
    ref_outs = [naive_moe(x, ref.gate, ref.experts) for x in xs_ref]
    sum((y * w).sum() for y, w in zip(ref_outs, ws)).backward()

    comm = Communicator()
    if "emulate" in config:
        from furnace.runtime import NetworkEmulation, NetworkEmulator

        topo = emulated_link(bandwidth_Bps=1e6, latency_s=1e-4)
        comm = Communicator(network=NetworkEmulator(NetworkEmulation(topology=topo,
                                                                     mode="virtual")))
        config = {k: v for k, v in config.items() if k != "emulate"}
    expert_parallel(layer, comm, ExpertParallelConfig(**config))
    x = xs[rank].clone().requires_grad_()
    y = layer(x)
    (y * ws[rank]).sum().backward()

    E = num_experts // world_size
    # an empty batch never reaches the reference's graph: its gradient is zero
    ref_grad_x = xs_ref[rank].grad
    if ref_grad_x is None:
        ref_grad_x = torch.zeros_like(x)
    errors = {"out": relative_error(ref_outs[rank], y),
              "grad_x": relative_error(ref_grad_x, x.grad)}
    for name, p, p_ref in zip(("w1", "b1", "w2", "b2"), layer.experts.param_tensors(),
                              ref.experts.param_tensors()):
        errors[f"grad_{name}"] = relative_error(p_ref.grad[rank * E:(rank + 1) * E], p.grad)
    for (name, p), p_ref in zip(layer.gate.named_parameters(), ref.gate.parameters()):
        # the gate is replicated: its data-parallel gradient is the sum over ranks
        errors[f"grad_gate_{name}"] = relative_error(p_ref.grad, comm.all_reduce(p.grad.clone()))
    stats = layer.parallel.stats
    return {"errors": errors, "shadowed": stats.shadowed, "group_size": stats.group_size,
            "a2a": comm.log.count("all_to_all_single")}


CASES = [
    # (world_size, experts per rank, top_k, batch sizes, skew)
    pytest.param(2, 1, 1, [5, 7], False, id="W2-E1-top1"),
    pytest.param(2, 2, 2, [6, 3], True, id="W2-E2-top2-skew"),
    pytest.param(4, 1, 2, [5, 0, 7, 3], True, id="W4-E1-top2-skew-empty-rank"),
    pytest.param(4, 2, 1, [4, 9, 1, 6], False, id="W4-E2-top1-unequal"),
]


def _assert_close(results: list[dict]) -> None:
    for rank, res in enumerate(results):
        for name, err in res["errors"].items():
            assert err <= TOL, f"rank {rank}: {name} relative error {err:.2e}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("world_size", "per_rank", "top_k", "batches", "skew"), CASES)
def test_expert_parallel_matches_naive(world_size, per_rank, top_k, batches, skew):
    out = run_distributed(_check_rank, world_size, per_rank * world_size, top_k, batches, skew,
                          {})
    _assert_close(out)
    # baseline: one all-to-all each way, forward and backward
    assert all(r["a2a"] == 4 and r["shadowed"] == [] for r in out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("group_size", [1, 2])
@pytest.mark.parametrize(("world_size", "per_rank", "top_k", "batches", "skew"), CASES[2:])
def test_smart_schedule_matches_naive(world_size, per_rank, top_k, batches, skew, group_size):
    out = run_distributed(_check_rank, world_size, per_rank * world_size, top_k, batches, skew,
                          {"smart_schedule": True, "group_size": group_size})
    _assert_close(out)
    steps = world_size // group_size
    assert all(r["group_size"] == group_size and r["a2a"] == 4 * steps for r in out)


def _masks(num_experts: int):
    yield tuple([True] + [False] * (num_experts - 1))  # the owner's expert on rank 0
    yield tuple(e % 2 == 1 for e in range(num_experts))
    yield tuple([True] * num_experts)  # every expert shadowed: no token travels


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("world_size", "per_rank", "top_k", "batches", "skew"),
                         [CASES[1], CASES[2]])
def test_shadowed_matches_naive_with_forced_masks(world_size, per_rank, top_k, batches, skew):
    N = per_rank * world_size
    configs = [{"shadow_mask": mask, "smart_schedule": smart, "group_size": 1 if smart else None}
               for mask in _masks(N) for smart in (False, True)]
    per_rank_results = run_distributed(_check_rank, world_size, N, top_k, batches, skew, configs)
    for i, config in enumerate(configs):
        out = [results[i] for results in per_rank_results]
        _assert_close(out)
        mask = config["shadow_mask"]
        assert all(r["shadowed"] == [e for e in range(N) if mask[e]] for r in out)


@pytest.mark.timeout(120)
def test_policy_shadows_hot_expert_identically_on_every_rank():
    # a slow link (1 MB/s) makes moving tokens expensive, so the hot expert is shadowed
    from furnace.runtime.presets import emulated_link as link

    topo = link(bandwidth_Bps=1e6, latency_s=0.0)
    out = run_distributed(_check_rank, 4, 4, 2, [40, 40, 40, 40], True,
                          {"shadowing": True, "topology": topo})
    _assert_close(out)
    # the hot expert is shadowed first (FastMoE's released rule would shadow nothing)
    assert out[0]["shadowed"][:1] == [0]
    assert all(r["shadowed"] == out[0]["shadowed"] for r in out)


@pytest.mark.timeout(120)
def test_virtual_clock_run_matches_naive():
    out = run_distributed(_check_rank, 2, 4, 2, [6, 5], True,
                          {"emulate": True, "smart_schedule": True, "group_size": 1,
                           "shadow_mask": (True, False, False, False)})
    _assert_close(out)
