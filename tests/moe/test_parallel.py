"""Expert parallelism against the brute-force reference: forward output, input gradient,
every expert's and the gate's gradients, on 2 and 4 gloo ranks in float64.

Every rank builds the same global layer (same seed) and the same global batch; the
reference (`naive_moe`) runs the whole global batch in one process, and each rank checks
its own shard. Float64 and tolerance 1e-12: the fast paths only reorder sums. Relative
errors have floors tied to the global batch (||x|| for outputs, ||w|| for input
gradients, ||x|| * ||w|| for parameter gradients), since a rank with no tokens, or an
expert nobody routes to, has an exactly zero reference.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from furnace.moe import (
    ExpertParallelConfig,
    MLPExperts,
    ModuleExperts,
    MoELayer,
    MoETransformerMLP,
    ddp_ignore_experts,
    expert_parallel,
    naive_moe,
)
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


def floors(xs, ws) -> tuple[float, float, float]:
    """(output, input-gradient, parameter-gradient) floors from the global batch."""
    nx = float(torch.cat(xs).norm())
    nw = float(torch.cat(ws).norm())
    return nx, nw, nx * nw


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
    s_out, s_x, s_p = floors(xs, ws)
    errors = {"out": relative_error(ref_outs[rank], y, s_out),
              "grad_x": relative_error(ref_grad_x, x.grad, s_x)}
    for name, p, p_ref in zip(("w1", "b1", "w2", "b2"), layer.experts.param_tensors(),
                              ref.experts.param_tensors()):
        errors[f"grad_{name}"] = relative_error(p_ref.grad[rank * E:(rank + 1) * E], p.grad,
                                                s_p)
    for (name, p), p_ref in zip(layer.gate.named_parameters(), ref.gate.parameters()):
        # the gate is replicated: its data-parallel gradient is the sum over ranks
        errors[f"grad_gate_{name}"] = relative_error(p_ref.grad, comm.all_reduce(p.grad.clone()),
                                                     s_p)
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
@pytest.mark.parametrize(("world_size", "per_rank", "top_k", "batches", "skew"), CASES[2:])
def test_smart_schedule_matches_naive(world_size, per_rank, top_k, batches, skew):
    # both group sizes in one launch: 4-rank launches dominate this file's time
    group_sizes = [1, 2]
    configs = [{"smart_schedule": True, "group_size": g} for g in group_sizes]
    per_rank_results = run_distributed(_check_rank, world_size, per_rank * world_size, top_k,
                                       batches, skew, configs)
    for i, group_size in enumerate(group_sizes):
        out = [results[i] for results in per_rank_results]
        _assert_close(out)
        steps = world_size // group_size
        # each check logs on a Communicator of its own
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


# --- banks built per rank, module experts, and torch DDP ------------------------------

class _TanhExpert(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.up = nn.Linear(d_model, 2 * d_model)
        self.down = nn.Linear(2 * d_model, d_model, bias=False)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


def _module_layer(num_experts: int) -> MoELayer:
    torch.manual_seed(9)
    bank = ModuleExperts([_TanhExpert(D_MODEL) for _ in range(num_experts)], D_MODEL)
    layer = MoELayer(d_model=D_MODEL, num_experts=num_experts, top_k=2, experts=bank).double()
    with torch.no_grad():
        layer.gate.scorer.bias[0] += 3.0
    return layer


def _check_banks(rank: int, world_size: int) -> dict:
    """Module experts (with shadowing) and a rank-local seeded bank against the reference."""
    N = 2 * world_size
    xs, ws = global_batch([5, 4, 6, 3][:world_size])
    s_out, s_x, s_p = floors(xs, ws)
    comm = Communicator()
    errors = {}
    configs = {"module": {}, "module-shadow-smart": {"shadow_mask": (True,) + (False,) * (N - 1),
                                                     "smart_schedule": True, "group_size": 1}}
    for label, config in configs.items():
        layer = _module_layer(N)
        ref = copy.deepcopy(layer)
        xs_ref = [x.clone().requires_grad_() for x in xs]
        sum((naive_moe(x, ref.gate, ref.experts) * w).sum() for x, w in zip(xs_ref, ws)).backward()
        expert_parallel(layer, comm, ExpertParallelConfig(**config))
        x = xs[rank].clone().requires_grad_()
        y = layer(x)
        (y * ws[rank]).sum().backward()
        errors[f"{label}/out"] = relative_error(naive_moe(xs[rank], ref.gate, ref.experts), y,
                                                s_out)
        errors[f"{label}/grad_x"] = relative_error(xs_ref[rank].grad, x.grad, s_x)
        for i, module in enumerate(layer.experts):
            for (name, p), p_ref in zip(module.named_parameters(),
                                        ref.experts[rank * 2 + i].parameters()):
                errors[f"{label}/expert{i}.{name}"] = relative_error(p_ref.grad, p.grad, s_p)
        errors[f"{label}/shadowed"] = float(layer.parallel.stats.shadowed
                                            != ([0] if config else []))
    # a bank built with only this rank's experts equals the full bank's slice
    torch.manual_seed(4)
    local = MoELayer(d_model=D_MODEL, num_experts=N, top_k=2,
                     experts=MLPExperts(2, D_MODEL, D_HIDDEN, first_expert=2 * rank,
                                        init_seed=77))
    torch.manual_seed(4)
    full = MoELayer(d_model=D_MODEL, num_experts=N, top_k=2,
                    experts=MLPExperts(N, D_MODEL, D_HIDDEN, init_seed=77))
    expert_parallel(local, comm)
    expert_parallel(full, comm)
    same = all(torch.equal(a, b) for a, b in zip(local.state_dict().values(),
                                                 full.state_dict().values()))
    x = xs[rank].float()
    return {"errors": errors, "same_weights": same,
            "same_output": torch.equal(local(x), full(x))}


@pytest.mark.timeout(120)
def test_module_experts_and_local_banks_on_two_ranks():
    out = run_distributed(_check_banks, 2)
    for rank, res in enumerate(out):
        for name, err in res["errors"].items():
            assert err <= TOL, f"rank {rank}: {name} relative error {err:.2e}"
        assert res["same_weights"] and res["same_output"]


def test_expert_parallel_refuses_a_foreign_slice():
    class _OneRank:
        world_size, rank = 2, 1

    layer = MoELayer(d_model=4, num_experts=4, top_k=1,
                     experts=MLPExperts(2, 4, 6, first_expert=0, init_seed=1))
    with pytest.raises(ValueError, match="rank 1 of 2 needs experts 2..3"):
        expert_parallel(layer, _OneRank())


def _check_ddp(rank: int, world_size: int) -> dict:
    """torch DDP around an expert-parallel model: correct with the ignore list, else refused."""
    xs, ws = global_batch([6, 5])
    s_out, s_x, s_p = floors(xs, ws)
    torch.manual_seed(21)
    model = nn.Sequential(nn.Linear(D_MODEL, D_MODEL),
                          MoETransformerMLP(d_model=D_MODEL, d_hidden=D_HIDDEN, num_experts=4,
                                            top_k=2)).double()
    ref = copy.deepcopy(model)
    sum((ref(x) * w).sum() for x, w in zip(xs, ws)).backward()
    expert_parallel(model, Communicator())
    ignored = sorted(model._ddp_params_and_buffers_to_ignore)
    ddp = DistributedDataParallel(model)
    # DDP broadcast rank 0's parameters, but not the experts: they are still this rank's
    kept = all(torch.equal(p, p_ref[2 * rank:2 * rank + 2]) for p, p_ref in
               zip(model[1].experts.param_tensors(), ref[1].experts.param_tensors()))
    (ddp(xs[rank]) * ws[rank]).sum().backward()
    errors = {}
    for name, p, p_ref in zip(("w1", "b1", "w2", "b2"), model[1].experts.param_tensors(),
                              ref[1].experts.param_tensors()):
        # experts: the sum over the ranks' tokens, untouched by DDP
        errors[name] = relative_error(p_ref.grad[2 * rank:2 * rank + 2], p.grad, s_p)
    for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
        if "experts" not in name:
            # replicated parameters: DDP averages the two ranks' gradients
            errors[name] = relative_error(p_ref.grad / world_size, p.grad, s_p)
    # an outer module that does not list the experts: DDP would corrupt them, so refuse
    outer = nn.Sequential(model)
    refused = ""
    try:
        DistributedDataParallel(outer)(xs[rank])
    except RuntimeError as exc:
        refused = str(exc)
    # the helper makes the outer module safe as well
    fixed = nn.Sequential(model)
    ddp_ignore_experts(fixed)
    DistributedDataParallel(fixed)(xs[rank])
    dist.barrier()
    return {"ignored": ignored, "kept": kept, "errors": errors, "refused": refused}


@pytest.mark.timeout(120)
def test_ddp_leaves_experts_local_or_is_refused():
    out = run_distributed(_check_ddp, 2)
    for rank, res in enumerate(out):
        assert res["ignored"] == ["1.experts.b1_EF", "1.experts.b2_ED", "1.experts.w1_EDF",
                                  "1.experts.w2_EFD"]
        assert res["kept"], f"rank {rank}: DDP overwrote this rank's experts"
        for name, err in res["errors"].items():
            assert err <= TOL, f"rank {rank}: {name} relative error {err:.2e}"
        assert "ddp_ignore_experts" in res["refused"] and "expert" in res["refused"]


def _check_autocast_empty_rank(rank: int, world_size: int) -> dict:
    """bf16 autocast with every token routed to rank 0's expert: rank 1 computes nothing."""
    torch.manual_seed(7)
    layer = MoETransformerMLP(d_model=D_MODEL, d_hidden=D_HIDDEN, num_experts=world_size,
                              top_k=1)
    with torch.no_grad():
        layer.gate.scorer.bias[0] += 50.0
    ref = copy.deepcopy(layer)
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(6, D_MODEL, generator=gen) for _ in range(world_size)]
    expert_parallel(layer, Communicator())
    x = xs[rank].clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
        y_ref = naive_moe(xs[rank], ref.gate, ref.experts)
    y.float().sum().backward()
    return {"error": relative_error(y_ref.float(), y.float(), float(y_ref.float().norm())),
            "grad_finite": bool(torch.isfinite(x.grad).all())}


@pytest.mark.timeout(120)
def test_autocast_exchange_with_a_rank_that_gets_no_rows():
    # a rank with no rows once answered with fp32 zeros while its peer sent bf16 rows, and
    # gloo refused the mismatched sizes in the backward exchange
    out = run_distributed(_check_autocast_empty_rank, 2)
    for rank, res in enumerate(out):
        assert res["grad_finite"], f"rank {rank}: non-finite input gradient"
        # same bf16 arithmetic on the same rows; only the summation order may differ
        assert res["error"] <= 2e-2, f"rank {rank}: relative error {res['error']:.2e}"
