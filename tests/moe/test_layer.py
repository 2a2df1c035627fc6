"""The single-process MoE layer against the brute-force reference, and the expert banks.

Relative errors have a floor tied to the inputs (``scale``): a gradient the path never
reads is exactly zero (the gate of a top-1 naive router gets none, since the softmax of
one logit is constant), and a pure ratio would divide by it. The floors are the
magnitudes the compared tensors have when they are not zero: ||x|| for outputs, ||w||
for input gradients (w weights the loss), ||x|| * ||w|| for parameter gradients.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from furnace.moe import MLPExperts, ModuleExperts, MoELayer, MoETransformerMLP, naive_moe
from furnace.runtime.testing import assert_close


def scales(x: torch.Tensor, w: torch.Tensor) -> tuple[float, float, float]:
    """Floors for (output, input gradient, parameter gradient) comparisons."""
    nx, nw = float(x.detach().norm()), float(w.norm())
    return nx, nw, nx * nw


@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_local_layer_matches_naive(top_k, dtype):
    layer = MoETransformerMLP(d_model=8, d_hidden=12, num_experts=5, top_k=top_k).to(dtype)
    ref = copy.deepcopy(layer)
    x = torch.randn(2, 9, 8, dtype=dtype, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    w = torch.randn(2, 9, 8, dtype=dtype)
    y = layer(x)
    y_ref = naive_moe(x_ref.reshape(-1, 8), ref.gate, ref.experts).reshape(2, 9, 8)
    (y * w).sum().backward()
    (y_ref * w).sum().backward()
    # float64: only the order of the per-token sums differs; float32: a few ulps of GEMMs
    tol = 1e-13 if dtype == torch.float64 else 1e-5
    s_out, s_x, s_p = scales(x, w)
    assert_close("out", y_ref, y, tol, scale=s_out)
    assert_close("grad_x", x_ref.grad, x.grad, tol, scale=s_x)
    for (name, p), p_ref in zip(layer.named_parameters(), ref.parameters()):
        assert_close(name, p_ref.grad, p.grad, tol, scale=s_p)
    stats = layer.last_routing
    assert stats.tokens == 18 and sum(stats.tokens_per_expert) == 18 * top_k


def test_experts_bank_blocks_and_shard():
    bank = MLPExperts(4, d_model=3, d_hidden=5, activation="relu").double()
    x = torch.randn(7, 3, dtype=torch.float64)
    y = bank(x, [2, 0, 4, 1])
    manual = torch.cat([bank.apply_expert(bank.expert_params(e), part)
                        for e, part in zip([0, 2, 3], torch.split(x, [2, 4, 1]))])
    assert torch.equal(y, manual)
    shard = bank.shard(2, 2)
    assert shard.first_expert == 2 and shard.num_experts == 2
    assert torch.equal(shard.w1_EDF, bank.w1_EDF[2:4])
    assert bank.flops_per_token() == 4 * 3 * 5
    assert bank.param_bytes_per_expert() == (2 * 3 * 5 + 5 + 3) * 8
    with pytest.raises(ValueError, match="row counts"):
        bank(x, [7])
    with pytest.raises(ValueError, match="activation"):
        MLPExperts(1, 2, 2, activation="tanh")


def test_layer_errors():
    with pytest.raises(ValueError, match="last dim"):
        MoELayer(d_model=4, num_experts=2, top_k=1)(torch.randn(3, 5))
    with pytest.raises(ValueError, match="unknown gate"):
        MoELayer(d_model=4, num_experts=2, gate="magic")
    with pytest.raises(ValueError, match="top_k"):
        MoELayer(d_model=4, num_experts=2, top_k=3)
    with pytest.raises(ValueError, match="expert bank"):
        MoELayer(d_model=4, num_experts=2, experts=MLPExperts(3, 4, 8))
    # a slice must sit on a slice boundary of the global experts
    with pytest.raises(ValueError, match="expert bank"):
        MoELayer(d_model=4, num_experts=4, experts=MLPExperts(2, 4, 8, first_expert=1))
    with pytest.raises(ValueError, match="expert bank"):
        MoELayer(d_model=4, num_experts=4, experts=MLPExperts(2, 5, 8))
    with pytest.raises(ValueError, match="ExpertBank"):
        MoELayer(d_model=4, num_experts=2, experts=nn.Linear(4, 4))


def test_seeded_bank_slices_equal_the_full_bank():
    # a rank that builds experts 2..3 alone gets the full bank's experts 2..3
    full = MLPExperts(4, 3, 5, init_seed=123)
    torch.manual_seed(0)
    part = MLPExperts(2, 3, 5, first_expert=2, init_seed=123)
    for a, b in zip(full.param_tensors(), part.param_tensors()):
        assert torch.equal(a[2:4], b)
    # the global generator is not consumed, and different seeds give different experts
    state = torch.get_rng_state()
    other = MLPExperts(4, 3, 5, init_seed=124)
    assert torch.equal(state, torch.get_rng_state())
    assert not torch.equal(other.w1_EDF, full.w1_EDF)
    assert not torch.equal(full.w1_EDF[0], full.w1_EDF[1])
    # nn.Linear's bounds: |w1| <= 1/sqrt(d_model), |w2| <= 1/sqrt(d_hidden)
    assert full.w1_EDF.abs().max() <= 3 ** -0.5 and full.w2_EFD.abs().max() <= 5 ** -0.5


def test_partial_bank_needs_expert_parallelism():
    layer = MoELayer(d_model=4, num_experts=4, top_k=1,
                     experts=MLPExperts(2, 4, 6, first_expert=2, init_seed=1))
    assert not layer.holds_all_experts and layer.num_experts_per_rank == 2
    with pytest.raises(RuntimeError, match="experts 2..3 of 4"):
        layer(torch.randn(3, 4))


class _Expert(nn.Module):
    def __init__(self, d_model: int, width: int):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(d_model, width), nn.Tanh(),
                                   nn.Linear(width, d_model, bias=False))

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize("top_k", [1, 2])
def test_module_experts_match_naive(top_k):
    torch.manual_seed(3)
    # experts of different widths: each local index has its own structure
    bank = ModuleExperts([_Expert(6, 4 + e) for e in range(4)], 6).double()
    assert bank.num_experts == len(bank) == 4 and bank[1] is bank._modules["1"]
    assert [n for n, _ in bank.named_parameters()][:3] == [
        "0.inner.0.weight", "0.inner.0.bias", "0.inner.2.weight"]
    layer = MoELayer(d_model=6, num_experts=4, top_k=top_k, experts=bank).double()
    ref = copy.deepcopy(layer)
    x = torch.randn(3, 7, 6, dtype=torch.float64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    w = torch.randn(3, 7, 6, dtype=torch.float64)
    (layer(x) * w).sum().backward()
    y_ref = naive_moe(x_ref.reshape(-1, 6), ref.gate, ref.experts).reshape(x.shape)
    (y_ref * w).sum().backward()
    s_out, s_x, s_p = scales(x, w)
    assert_close("out", y_ref, layer(x), 1e-13, scale=s_out)
    assert_close("grad_x", x_ref.grad, x.grad, 1e-13, scale=s_x)
    for (name, p), p_ref in zip(layer.named_parameters(), ref.parameters()):
        assert_close(name, p_ref.grad, p.grad, 1e-13, scale=s_p)
    # apply_expert with given parameters is the module itself (functional_call)
    rows = torch.randn(5, 6, dtype=torch.float64)
    assert torch.equal(bank.apply_expert(bank.expert_params(2), rows, 2), bank[2](rows))
    doubled = [2 * p for p in bank.expert_params(2)]
    assert not torch.allclose(bank.apply_expert(doubled, rows, 2), bank[2](rows))
    assert bank.flops_per_token() == 2 * sum(p.numel() for p in bank[0].parameters())
    shard = bank.shard(1, 2)
    assert shard.first_expert == 1 and shard[0] is bank[1]


def test_module_experts_errors():
    shared = nn.Linear(3, 3)
    with pytest.raises(ValueError, match="shares a parameter"):
        ModuleExperts([shared, shared], 3)
    with pytest.raises(ValueError, match="at least one"):
        ModuleExperts([], 3)
    with pytest.raises(ValueError, match="nn.Module"):
        ModuleExperts([lambda x: x], 3)


def test_empty_batch():
    layer = MoETransformerMLP(d_model=4, d_hidden=6, num_experts=3, top_k=2)
    x = torch.zeros(0, 4, requires_grad=True)
    y = layer(x)
    assert y.shape == (0, 4)
    y.sum().backward()
