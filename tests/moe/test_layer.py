"""The single-process MoE layer against the brute-force reference, and the expert bank."""

from __future__ import annotations

import copy

import pytest
import torch

from furnace.moe import MLPExperts, MoELayer, MoETransformerMLP, naive_moe
from furnace.runtime.testing import assert_close


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
    assert_close("out", y_ref, y, tol)
    assert_close("grad_x", x_ref.grad, x.grad, tol)
    for (name, p), p_ref in zip(layer.named_parameters(), ref.parameters()):
        assert_close(name, p_ref.grad, p.grad, tol)
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


def test_empty_batch():
    layer = MoETransformerMLP(d_model=4, d_hidden=6, num_experts=3, top_k=2)
    x = torch.zeros(0, 4, requires_grad=True)
    y = layer(x)
    assert y.shape == (0, 4)
    y.sum().backward()
