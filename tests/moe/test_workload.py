"""Synthetic routing (`furnace.moe.workload`): the distributions and `SyntheticGate`.

Benchmarks trust `SyntheticGate` to produce a chosen skew, so these tests check that the
first choices follow the requested distribution, that the other choices are valid
(distinct experts per token), that runs repeat exactly per (seed, rank, call) while
successive calls differ, and that the scores still train the gate's scorer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from furnace.moe import MoELayer
from furnace.moe.gates import GateContext
from furnace.moe.workload import SyntheticGate, from_counts, hot_expert, uniform, zipf


def _assert_distribution(p: np.ndarray, num_experts: int) -> None:
    assert p.shape == (num_experts,)
    assert (p >= 0).all()
    assert p.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_experts", [1, 2, 8])
def test_distributions_sum_to_one(num_experts):
    for p in (hot_expert(num_experts, 0.6), zipf(num_experts, 1.2), uniform(num_experts),
              from_counts(np.arange(1, num_experts + 1))):
        _assert_distribution(p, num_experts)


@pytest.mark.timeout(120)
def test_distribution_values():
    p = hot_expert(5, 0.6, hot=3)
    assert p[3] == pytest.approx(0.6) and np.allclose(np.delete(p, 3), 0.1)
    assert np.allclose(hot_expert(4, 1.0), [1, 0, 0, 0])
    z = zipf(4, 1.0)
    assert np.allclose(z * (1 + 1 / 2 + 1 / 3 + 1 / 4), [1, 1 / 2, 1 / 3, 1 / 4])
    assert (np.diff(z) < 0).all()
    assert np.allclose(zipf(6, 0.0), uniform(6))
    assert np.allclose(uniform(4), 0.25)
    assert np.allclose(from_counts([3, 0, 1]), [0.75, 0.0, 0.25])


@pytest.mark.timeout(120)
def test_distribution_errors():
    with pytest.raises(ValueError, match="hot share"):
        hot_expert(4, 1.5)
    with pytest.raises(ValueError, match="hot share"):
        hot_expert(4, -0.1)
    with pytest.raises(ValueError, match="sum to zero"):
        from_counts([0, 0, 0])


def _gate(num_experts=8, top_k=1, probabilities=None, seed=0, d_model=4) -> SyntheticGate:
    if probabilities is None:
        probabilities = zipf(num_experts, 1.2)
    return SyntheticGate(d_model, num_experts, top_k, probabilities=probabilities, seed=seed)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("make_p", [lambda n: zipf(n, 1.2), lambda n: hot_expert(n, 0.7, 2),
                                    uniform], ids=["zipf", "hot", "uniform"])
def test_first_choice_frequencies_follow_probabilities(top_k, make_p):
    num_experts, tokens = 8, 20000
    p = make_p(num_experts)
    gate = _gate(num_experts, top_k, p)
    ids = gate(torch.randn(tokens, 4)).expert_ids_TK
    assert ids.shape == (tokens, top_k) and ids.dtype == torch.int64
    freq = np.bincount(ids[:, 0].numpy(), minlength=num_experts) / tokens
    assert np.abs(freq - p).max() < 0.02, (freq, p)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("num_experts", "top_k"), [(4, 2), (6, 3), (4, 4)])
def test_choices_are_distinct_valid_experts(num_experts, top_k):
    gate = _gate(num_experts, top_k, hot_expert(num_experts, 0.9))
    routing = gate(torch.randn(500, 4))
    ids = routing.expert_ids_TK
    assert ids.shape == (500, top_k)
    assert int(ids.min()) >= 0 and int(ids.max()) < num_experts
    # sorted rows have no repeats iff every token's experts are distinct
    sorted_ids = torch.sort(ids, dim=1).values
    assert bool((sorted_ids[:, 1:] != sorted_ids[:, :-1]).all())
    # scores are a softmax over each token's choices
    assert torch.allclose(routing.scores_TK.sum(-1), torch.ones(500))
    assert float(routing.balance_loss) == 0.0


@pytest.mark.timeout(120)
def test_deterministic_per_seed_rank_and_call():
    x = torch.randn(300, 4)
    a, b = _gate(top_k=2, seed=3), _gate(top_k=2, seed=3)
    first_a, first_b = a(x).expert_ids_TK, b(x).expert_ids_TK
    second_a, second_b = a(x).expert_ids_TK, b(x).expert_ids_TK
    # same (seed, rank, call): identical, whatever the input or the scorer's weights
    assert torch.equal(first_a, first_b) and torch.equal(second_a, second_b)
    # the call index advances: the same input routes differently next time
    assert not torch.equal(first_a, second_a)
    assert a.calls == 2
    # another seed, or another rank, routes differently
    assert not torch.equal(_gate(top_k=2, seed=4)(x).expert_ids_TK, first_a)
    other_rank = _gate(top_k=2, seed=3)
    other_rank.bind(GateContext(rank=1, world_size=2, num_experts_per_rank=4))
    assert not torch.equal(other_rank(x).expert_ids_TK, first_a)
    same_rank = _gate(top_k=2, seed=3)
    same_rank.bind(GateContext(rank=0, world_size=2, num_experts_per_rank=4))
    assert torch.equal(same_rank(x).expert_ids_TK, first_a)


@pytest.mark.timeout(120)
def test_gradients_reach_the_scorer():
    # top_k >= 2: a softmax over a single choice is constant 1 and would carry no gradient
    gate = _gate(num_experts=4, top_k=2, probabilities=uniform(4)).double()
    x = torch.randn(64, 4, dtype=torch.float64)
    routing = gate(x)
    assert routing.scores_TK.dtype == torch.float64
    (routing.scores_TK * torch.randn(64, 2, dtype=torch.float64)).sum().backward()
    assert gate.scorer.weight.grad is not None and gate.scorer.weight.grad.abs().sum() > 0
    assert gate.scorer.bias.grad.abs().sum() > 0

    # and through a layer that uses it as its router
    layer = MoELayer(d_model=4, num_experts=4, top_k=2,
                     gate=_gate(num_experts=4, top_k=2, probabilities=zipf(4, 1.0)))
    layer(torch.randn(3, 5, 4)).square().sum().backward()
    assert layer.gate.scorer.weight.grad.abs().sum() > 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("probabilities", [
    [0.5, 0.5],  # wrong length
    [0.5, 0.5, 0.5, -0.5],  # negative
    [0.2, 0.2, 0.2, 0.2],  # sums to 0.8
    [[0.25, 0.25], [0.25, 0.25]],  # wrong shape
], ids=["length", "negative", "sum", "shape"])
def test_bad_probabilities_raise(probabilities):
    with pytest.raises(ValueError, match="probabilities"):
        SyntheticGate(4, 4, 1, probabilities=probabilities)
