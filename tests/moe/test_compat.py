"""FastMoE's names in `furnace.moe.compat` against furnace's own layer and reference.

A FastMoE user switches by changing the import, so the compat classes must (1) compute
exactly what furnace's layer computes (checked against the brute-force `naive_moe` in
float64), (2) read ``num_expert`` per worker, building ``num_expert * world_size`` global
experts, (3) map every FastMoE gate name to the right furnace gate, and (4) refuse, by
name, every FastMoE argument furnace does not implement instead of ignoring it.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from furnace.moe import ExpertParallelConfig, MoELayer, MoETransformerMLP, compat, gates, naive_moe
from furnace.moe.compat import FMoE, FMoETransformerMLP
from furnace.runtime import Communicator, run_distributed
from furnace.runtime.testing import assert_close, relative_error

# float64 and a tight tolerance: the fast path only reorders the per-token sums
TOL = 1e-12


def _forward_and_reference(layer: MoELayer, shape: tuple[int, ...]):
    """Output and input gradient of ``layer`` and of `naive_moe` on a copy of its weights."""
    ref = copy.deepcopy(layer)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    w = torch.randn(*shape, dtype=torch.float64)
    y = layer(x)
    d = layer.d_model
    y_ref = naive_moe(x_ref.reshape(-1, d), ref.gate, ref.experts).reshape(shape)
    (y * w).sum().backward()
    (y_ref * w).sum().backward()
    return (y, x.grad, layer), (y_ref, x_ref.grad, ref)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("activation", "name"), [(nn.GELU(), "gelu"), ("relu", "relu"),
                                                  (nn.SiLU(), "silu"), (torch.relu, "relu")])
def test_transformer_mlp_matches_naive(activation, name):
    torch.manual_seed(0)
    layer = FMoETransformerMLP(num_expert=4, d_model=8, d_hidden=16,
                               activation=activation).double()
    assert isinstance(layer, MoETransformerMLP) and isinstance(layer, FMoE)
    assert layer.num_experts == 4 and layer.top_k == 2 and layer.parallel is None
    assert layer.experts.d_hidden == 16 and layer.experts.activation == name
    assert type(layer.gate) is compat.NaiveGate
    # FastMoE's layers take any leading shape [..., d_model]
    (y, grad_x, fast), (y_ref, grad_ref, ref) = _forward_and_reference(layer, (2, 5, 8))
    assert_close("out", y_ref, y, TOL)
    assert_close("grad_x", grad_ref, grad_x, TOL)
    for (pname, p), p_ref in zip(fast.named_parameters(), ref.parameters()):
        assert_close(pname, p_ref.grad, p.grad, TOL)


@pytest.mark.timeout(120)
def test_fmoe_builds_mlp_bank_and_matches_naive():
    torch.manual_seed(1)
    layer = FMoE(num_expert=3, d_model=4, top_k=1, gate=compat.SwitchGate).double()
    layer.eval()  # no Switch jitter, so the copy in the reference routes identically
    assert layer.experts.d_hidden == 16 and layer.num_expert == 3 and layer.world_size == 1
    assert isinstance(layer.gate, gates.SwitchGate)
    (y, grad_x, _), (y_ref, grad_ref, _) = _forward_and_reference(layer, (3, 2, 2, 4))
    assert_close("out", y_ref, y, TOL)
    assert_close("grad_x", grad_ref, grad_x, TOL)
    assert layer.gate.has_loss and torch.equal(layer.gate.get_loss(), layer.balance_loss)
    assert not layer.gate.has_loss  # get_loss() clears it, as in FastMoE


GATE_CASES = [
    # (compat class, furnace class, top_k passed (None: the class default), expected top_k)
    pytest.param(compat.NaiveGate, gates.NaiveGate, None, 2, id="naive"),
    pytest.param(compat.NoisyGate, gates.NoisyGate, 3, 3, id="noisy"),
    pytest.param(compat.GShardGate, gates.GShardGate, 2, 2, id="gshard"),
    pytest.param(compat.SwitchGate, gates.SwitchGate, None, 1, id="switch"),
    pytest.param(compat.SwipeGate, gates.SwipeGate, 2, 2, id="swipe"),
    pytest.param(compat.FasterGate, gates.TopologyGate, None, 2, id="faster"),
    pytest.param(compat.ZeroGate, gates.ZeroGate, None, 2, id="zero"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("fastmoe_cls", "furnace_cls", "top_k", "expected_top_k"), GATE_CASES)
@pytest.mark.parametrize("world_size", [1, 4])
def test_gate_names_map_to_furnace_gates(fastmoe_cls, furnace_cls, top_k, expected_top_k,
                                         world_size):
    args = (6, 3, world_size) if top_k is None else (6, 3, world_size, top_k)
    gate = fastmoe_cls(*args)
    assert isinstance(gate, furnace_cls)
    assert gate.num_experts == 3 * world_size and gate.tot_expert == 3 * world_size
    assert gate.num_expert == 3 and gate.world_size == world_size
    assert gate.top_k == expected_top_k and gate.scorer.in_features == 6
    # the layer calls the class as FastMoE does, gate(d_model, num_expert, world_size, top_k)
    layer = FMoE(num_expert=3 * world_size, d_model=6, top_k=expected_top_k,
                 gate=fastmoe_cls, gate_bias=False)
    assert type(layer.gate) is fastmoe_cls and layer.gate.scorer.bias is None
    routing = layer.gate(torch.randn(5, 6))
    assert routing.expert_ids_TK.shape == (5, expected_top_k)
    assert layer.gate.get_loss() is routing.balance_loss


@pytest.mark.timeout(120)
def test_gate_keywords_translate():
    gshard = compat.GShardGate(4, 2, 2, topk=2, capacity=(1.0, 2.0), random_routing=False,
                               gate_bias=False)
    assert gshard.capacity_factor == (1.0, 2.0) and not gshard.random_routing
    assert gshard.scorer.bias is None
    switch = compat.SwitchGate(4, 2, 2, switch_eps=0.2, capacity=1.5)
    assert switch.jitter_eps == 0.2 and switch.capacity_factor == (1.5, 1.5)
    faster = compat.gen_faster_gate(rank=3)(4, 2, 2, 2, outgoing_fraction=0.3)
    assert isinstance(faster, gates.TopologyGate) and faster.outgoing_fraction == 0.3
    # furnace's own options pass through
    assert compat.NoisyGate(4, 2, 1, 2, w_load=0.5).w_load == 0.5
    by_name = FMoE(num_expert=4, d_model=4, top_k=1, gate="switch")
    assert isinstance(by_name.gate, gates.SwitchGate) and by_name.gate.num_experts == 4

    def factory(d_model, num_expert, world_size, top_k):
        return gates.ZeroGate(d_model, num_expert * world_size, top_k)

    assert isinstance(FMoE(num_expert=2, d_model=4, gate=factory).gate, gates.ZeroGate)
    with pytest.raises(ValueError, match="top_k or topk"):
        compat.GShardGate(4, 2, 1, 2, topk=2)
    with pytest.raises(ValueError, match="top-1"):
        compat.SwitchGate(4, 2, 1, 2)
    with pytest.raises(ValueError, match="num_expert"):
        compat.NaiveGate(4, 0, 1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"mp_group": object()}, "mp_group"),
    ({"slice_group": object()}, "slice_group"),
    ({"gate_hook": lambda *a: None}, "gate_hook"),
    ({"mask": torch.zeros(3)}, "mask"),
    ({"mask_dict": {}}, "mask_dict"),
    ({"expert_dp_comm": "dp"}, "expert_dp_comm"),
    ({"expert_rank": 1}, "expert_rank"),
    ({"expert": nn.Linear}, "expert"),
    ({"activation": nn.Tanh()}, "activation"),
    ({"activation": nn.GELU(approximate="tanh")}, "activation"),
    ({"activation": "swish"}, "activation"),
    ({"gate": gates.NaiveGate}, "furnace gate class"),
    ({"gate": 3}, "gate"),
    ({"gate": lambda *a: nn.Linear(2, 2)}, "BaseGate"),
    ({"gate": lambda *a: gates.NaiveGate(4, 4, 2), "gate_bias": False}, "gate_bias"),
    ({"world_size": 2}, "initialized default process group"),
    ({"moe_group": "world", "world_size": 2}, "moe_group"),
    ({"parallel_config": ExpertParallelConfig()}, "parallel_config"),
    ({"world_size": 0}, "world_size"),
])
def test_unsupported_arguments_raise(kwargs, message):
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match=message):
        FMoETransformerMLP(num_expert=2, d_model=4, d_hidden=8, **kwargs)


# --- expert parallelism on 2 gloo ranks ------------------------------------------------

D_MODEL, D_HIDDEN, PER_RANK = 6, 10, 2
SHAPES = [(2, 3, D_MODEL), (4, 2, D_MODEL)]  # per rank, unequal, with a leading batch dim
VARIANTS = ["communicator", "process_group", "default_group", "parallel_config"]


def _build(seed: int, **kwargs) -> FMoETransformerMLP:
    torch.manual_seed(seed)
    layer = FMoETransformerMLP(num_expert=kwargs.pop("num_expert"), d_model=D_MODEL,
                               d_hidden=D_HIDDEN, top_k=2, **kwargs).double()
    with torch.no_grad():
        # a hot expert, so some ranks send most tokens away and some experts stay idle
        layer.gate.scorer.bias[0] += 2.0
    return layer


def _check_rank(rank: int, world_size: int) -> dict:
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(*s, generator=gen, dtype=torch.float64) for s in SHAPES]
    ws = [torch.randn(*s, generator=gen, dtype=torch.float64) for s in SHAPES]

    # the reference: one process, every expert, the global batch
    ref = _build(11, num_expert=PER_RANK * world_size)
    xs_ref = [x.clone().requires_grad_() for x in xs]
    ref_outs = [naive_moe(x.reshape(-1, D_MODEL), ref.gate, ref.experts).reshape(x.shape)
                for x in xs_ref]
    sum((y * w).sum() for y, w in zip(ref_outs, ws)).backward()

    reducer = Communicator()
    results = {}
    for variant in VARIANTS:
        kwargs: dict = {"num_expert": PER_RANK, "world_size": world_size}
        if variant == "communicator":
            kwargs["moe_group"] = Communicator()
        elif variant == "process_group":
            kwargs["moe_group"] = dist.new_group(ranks=list(range(world_size)))
        elif variant == "parallel_config":
            kwargs["moe_group"] = Communicator()
            kwargs["parallel_config"] = ExpertParallelConfig(smart_schedule=True, group_size=1)
        # "default_group": moe_group=None means the default group, as in FastMoE
        layer = _build(11, **kwargs)
        x = xs[rank].clone().requires_grad_()
        y = layer(x)
        (y * ws[rank]).sum().backward()

        lo, hi = rank * PER_RANK, (rank + 1) * PER_RANK
        errors = {"out": relative_error(ref_outs[rank], y),
                  "grad_x": relative_error(xs_ref[rank].grad, x.grad)}
        for name, p, p_ref in zip(("w1", "b1", "w2", "b2"), layer.experts.param_tensors(),
                                  ref.experts.param_tensors()):
            errors[f"grad_{name}"] = relative_error(p_ref.grad[lo:hi], p.grad)
        for (name, p), p_ref in zip(layer.gate.named_parameters(), ref.gate.parameters()):
            # the gate is replicated: its gradient over the group is the sum over ranks
            summed = reducer.all_reduce(p.grad.clone())
            errors[f"grad_gate_{name}"] = relative_error(p_ref.grad, summed)
        results[variant] = {
            "errors": errors,
            "num_experts": layer.num_experts,
            "local_experts": (layer.experts.first_expert, layer.experts.num_experts),
            "group_size": layer.parallel.stats.group_size,
            "gate_context": (layer.gate.context.rank, layer.gate.context.world_size),
        }
    return results


@pytest.mark.timeout(120)
def test_expert_parallel_on_two_ranks_matches_naive():
    world_size = 2
    out = run_distributed(_check_rank, world_size)
    for rank, results in enumerate(out):
        assert list(results) == VARIANTS
        for variant, res in results.items():
            for name, err in res["errors"].items():
                assert err <= TOL, f"rank {rank} {variant}: {name} relative error {err:.2e}"
            assert res["num_experts"] == PER_RANK * world_size
            assert res["local_experts"] == (rank * PER_RANK, PER_RANK)
            assert res["gate_context"] == (rank, world_size)
            expected_group = 1 if variant == "parallel_config" else world_size
            assert res["group_size"] == expected_group
