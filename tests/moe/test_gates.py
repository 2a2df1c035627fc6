"""Gates of `furnace.moe.gates`: the `GateOutput` contract for every gate, then each paper's rule.

Hand-built cases set the scorer to the identity (D = N, no bias), so a token's input row
is its logits and the routing is known in advance. The SWIPE multi-rank tests compare
each gloo rank with one process routing the concatenated batch.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from furnace.moe.gates import (
    GATES,
    BaseGate,
    EmulatedRanksGate,
    GateContext,
    GShardGate,
    NaiveGate,
    NoisyGate,
    SwipeGate,
    SwitchGate,
    TopologyGate,
    ZeroGate,
    make_gate,
)
from furnace.moe.gates.noisy import prob_in_top_k
from furnace.moe.gates.swipe import swipe_assign
from furnace.runtime import Communicator, run_distributed

D, N, T = 12, 8, 40
TOP_K = {"naive": 2, "noisy": 2, "gshard": 2, "switch": 1, "swipe": 2, "topology": 2, "zero": 1}
# 8 experts, 2 per rank, 2 ranks per node: node 0 holds experts 0-3, node 1 experts 4-7
TOPO = GateContext(rank=0, world_size=4, num_experts_per_rank=2, ranks_per_node=2)
RENORMALISED = {"naive", "noisy", "gshard", "swipe", "topology", "zero"}
DTYPES = [torch.float32, torch.float64]


def build(name: str, dtype: torch.dtype = torch.float32, **kwargs) -> BaseGate:
    gate = make_gate(name, D, N, TOP_K[name], **kwargs).to(dtype)
    if name == "topology":
        gate.bind(TOPO)
    return gate


def identity_gate(cls, num_experts: int, top_k: int, **kwargs) -> BaseGate:
    """A gate whose logits are its input rows (D = N, identity scorer, no bias)."""
    gate = cls(num_experts, num_experts, top_k, bias=False, **kwargs)
    with torch.no_grad():
        gate.scorer.weight.copy_(torch.eye(num_experts))
    return gate


def skewed_input(dtype: torch.dtype = torch.float32, num_tokens: int = T) -> torch.Tensor:
    """Random tokens; the skew of a random scorer is enough to trigger drops."""
    return torch.randn(num_tokens, D, dtype=dtype) * 3


def check_contract(out, num_tokens: int, top_k: int, dtype: torch.dtype) -> None:
    ids, scores = out.expert_ids_TK, out.scores_TK
    assert ids.shape == (num_tokens, top_k) and ids.dtype == torch.int64
    assert scores.shape == (num_tokens, top_k) and scores.dtype == dtype
    assert out.balance_loss.shape == () and out.balance_loss.dtype == dtype
    assert torch.isfinite(out.balance_loss)
    assert ((ids >= -1) & (ids < N)).all()
    assert (scores[ids < 0] == 0).all()
    assert (scores[ids >= 0] >= 0).all() and (scores <= 1).all()
    for row in ids.tolist():
        kept = [e for e in row if e >= 0]
        assert len(kept) == len(set(kept)), f"an expert twice for one token: {row}"


# --- every gate --------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_registry_builds_every_gate():
    assert set(GATES) == set(TOP_K)
    for name, cls in GATES.items():
        assert isinstance(make_gate(name, D, N, TOP_K[name]), cls)
    with pytest.raises(ValueError, match="unknown gate"):
        make_gate("nope", D, N, 2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(TOP_K))
def test_output_contract(name, dtype, training):
    gate = build(name, dtype).train(training)
    x = skewed_input(dtype)
    out = gate(x)
    check_contract(out, T, TOP_K[name], dtype)
    kept = out.expert_ids_TK >= 0
    sums = out.scores_TK.sum(-1)
    if name in RENORMALISED:
        full = kept.all(-1)
        assert full.any()
        torch.testing.assert_close(sums[full], torch.ones_like(sums[full]))
    elif not training:
        # Switch: the score is the token's top softmax probability, not renormalised
        top = torch.softmax(gate.scorer(x), -1).max(-1).values
        torch.testing.assert_close(sums[kept[:, 0]], top[kept[:, 0]].detach())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(set(TOP_K) - {"zero"}))
def test_gradients_reach_scorer_through_scores(name, dtype):
    gate = build(name, dtype).train()
    out = gate(skewed_input(dtype))
    weighting = torch.randn(out.scores_TK.shape, dtype=dtype)
    (out.scores_TK * weighting).sum().backward()
    assert gate.scorer.weight.grad is not None
    assert gate.scorer.weight.grad.abs().sum() > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(TOP_K))
def test_eval_is_deterministic(name):
    gate = build(name).eval()
    x = skewed_input()
    first = gate(x)
    torch.manual_seed(1234)
    second = gate(x)
    assert torch.equal(first.expert_ids_TK, second.expert_ids_TK)
    assert torch.equal(first.scores_TK, second.scores_TK)
    assert torch.equal(first.balance_loss, second.balance_loss)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["noisy", "gshard", "switch"])
def test_training_randomness_follows_the_global_seed(name):
    gate = build(name).train()
    x = skewed_input()
    torch.manual_seed(7)
    first = gate(x)
    torch.manual_seed(7)
    second = gate(x)
    assert torch.equal(first.expert_ids_TK, second.expert_ids_TK)
    assert torch.equal(first.scores_TK, second.scores_TK)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(TOP_K))
def test_empty_batch(name):
    gate = build(name)
    out = gate(torch.zeros(0, D))
    check_contract(out, 0, TOP_K[name], torch.float32)
    assert out.balance_loss.item() == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("make", "match"), [
    (lambda: GShardGate(D, N, 1), "top-2"),
    (lambda: GShardGate(D, N, 2, capacity_factor=0), "capacity"),
    (lambda: GShardGate(D, N, 2, capacity_factor=(1.0,)), "capacity_factor"),
    (lambda: GShardGate(D, N, 2, capacity_factor=(1.0, float("inf"))), "capacity"),
    (lambda: GShardGate(D, N, 2, capacity_factor="big"), "capacity_factor"),
    (lambda: SwitchGate(D, N, 2), "top-1"),
    (lambda: SwitchGate(D, N, 1, capacity_factor=(1.0, -2.0)), "capacity"),
    (lambda: SwitchGate(D, N, 1, jitter_eps=1.0), "jitter_eps"),
    (lambda: SwitchGate(D, N, 1, jitter_eps=-0.1), "jitter_eps"),
    (lambda: TopologyGate(D, N, 1), "top-2"),
    (lambda: TopologyGate(D, N, 2, outgoing_fraction=1.5), "outgoing_fraction"),
    (lambda: TopologyGate(D, N, 2, outgoing_fraction=-0.1), "outgoing_fraction"),
    (lambda: NoisyGate(D, N, 2, w_importance=-1.0), "loss weights"),
    (lambda: NoisyGate(D, N, 2, w_load=-1.0), "loss weights"),
    (lambda: NoisyGate(D, N, 2, noise_epsilon=-1.0), "noise_epsilon"),
    (lambda: SwipeGate(D, N, N + 1), "top_k"),
    (lambda: ZeroGate(D, N, 0), "top_k"),
])
def test_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# --- GShard ------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_gshard_capacity_hand_computed():
    # every token wants expert 0 then 1; C = ceil(1.2 * 10 * 2 / 4) = 6 (not 7)
    gate = identity_gate(GShardGate, 4, 2, capacity_factor=1.2, random_routing=False)
    x = torch.tensor([[3.0, 2.0, 0.0, 0.0]]).repeat(10, 1)
    for training in (True, False):
        out = gate.train(training)(x)
        assert gate.capacity(10) == 6
        expected = torch.tensor([[0, 1]] * 6 + [[-1, -1]] * 4)
        assert torch.equal(out.expert_ids_TK, expected)
        assert (out.scores_TK[6:] == 0).all()


@pytest.mark.timeout(60)
def test_gshard_first_choices_before_second_choices():
    # C = ceil(1.0 * 4 * 2 / 4) = 2. Expert 1 is the second choice of tokens 0, 1 and the
    # first choice of tokens 2, 3: the later tokens' first choices win its two places.
    gate = identity_gate(GShardGate, 4, 2, capacity_factor=1.0).eval()
    x = torch.tensor([[3.0, 2.0, 0.0, 0.0],
                      [3.0, 2.0, 0.0, 0.0],
                      [0.0, 3.0, 2.0, 0.0],
                      [0.0, 3.0, 0.0, 2.0]])
    out = gate(x)
    assert torch.equal(out.expert_ids_TK, torch.tensor([[0, -1], [0, -1], [1, 2], [1, 3]]))
    p = torch.softmax(torch.tensor([3.0, 2.0]), 0)
    torch.testing.assert_close(out.scores_TK[0], torch.stack([p[0], torch.tensor(0.0)]))


@pytest.mark.timeout(60)
def test_gshard_first_come_in_token_order():
    # expert 2 is everyone's first choice; C = ceil(1.0 * 5 * 2 / 5) = 2, tokens 0 and 1 fit
    gate = identity_gate(GShardGate, 5, 2, capacity_factor=1.0).eval()
    x = torch.zeros(5, 5)
    x[:, 2] = 4.0
    x[torch.arange(5), torch.tensor([0, 1, 3, 4, 0])] = 1.0
    ids = gate(x).expert_ids_TK
    assert ids[:, 0].tolist() == [2, 2, -1, -1, -1]
    assert ids[:, 1].tolist() == [0, 1, 3, 4, 0]


@pytest.mark.timeout(60)
def test_gshard_random_routing_drops_only_second_choices_in_training():
    gate = build("gshard", capacity_factor=100.0)
    x = skewed_input(num_tokens=400)
    out = gate.train()(x)
    assert (out.expert_ids_TK[:, 0] >= 0).all()
    dropped = out.expert_ids_TK[:, 1] < 0
    assert 0 < int(dropped.sum()) < 400
    assert (out.scores_TK[dropped, 1] == 0).all()
    # the second choice survives with probability 2 * p2
    p2 = gate.eval()(x).scores_TK[:, 1]
    assert abs((~dropped).double().mean() - (2 * p2).double().mean()) < 0.08
    assert (gate.eval()(x).expert_ids_TK >= 0).all()
    gate.random_routing = False
    assert (gate.train()(x).expert_ids_TK >= 0).all()


@pytest.mark.timeout(60)
def test_gshard_balance_loss_formula():
    gate = identity_gate(GShardGate, 3, 2).eval()
    x = torch.tensor([[2.0, 1.0, 0.0], [0.0, 2.0, 1.0], [0.5, 0.0, 3.0], [1.0, 0.0, 0.0]],
                     dtype=torch.float64)
    gate = gate.double()
    probs = torch.softmax(x, -1)
    c = torch.tensor([2, 1, 1], dtype=torch.float64) / 4
    expected = (c * probs.mean(0)).mean() * 9
    torch.testing.assert_close(gate(x).balance_loss, expected)
    # a uniform router scores 1 whatever N is
    uniform = identity_gate(GShardGate, 4, 2).eval()(torch.eye(4) * 1e-3)
    assert abs(uniform.balance_loss.item() - 1.0) < 1e-2


# --- Switch ------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_switch_capacity_and_token_order():
    # all 10 tokens want expert 2: C = ceil(1.0 * 10 / 4) = 3 in training, ceil(2.0 * 10 / 4)
    # = 5 in eval; the earliest tokens keep their place
    gate = identity_gate(SwitchGate, 4, 1, jitter_eps=0.0)
    x = torch.zeros(10, 4)
    x[:, 2] = 2.0
    for training, capacity in ((True, 3), (False, 5)):
        out = gate.train(training)(x)
        assert gate.capacity(10) == capacity
        expected = torch.tensor([2] * capacity + [-1] * (10 - capacity))
        assert torch.equal(out.expert_ids_TK[:, 0], expected)
        assert (out.scores_TK[capacity:] == 0).all()


@pytest.mark.timeout(60)
def test_switch_loss_and_scores_hand_built():
    probs = torch.tensor([[0.75, 0.25], [0.75, 0.25], [0.6, 0.4], [0.25, 0.75]],
                         dtype=torch.float64)
    gate = identity_gate(SwitchGate, 2, 1).double().eval()
    out = gate(probs.log())
    # f = (3/4, 1/4), P = (0.5875, 0.4125): 2 * (0.75 * 0.5875 + 0.25 * 0.4125) = 1.0875
    torch.testing.assert_close(out.balance_loss, torch.tensor(1.0875, dtype=torch.float64))
    assert out.expert_ids_TK[:, 0].tolist() == [0, 0, 0, 1]
    torch.testing.assert_close(out.scores_TK[:, 0],
                               torch.tensor([0.75, 0.75, 0.6, 0.75], dtype=torch.float64))


@pytest.mark.timeout(60)
def test_switch_jitter_only_in_training():
    gate = build("switch", capacity_factor=100.0)
    x = skewed_input()
    clean = gate.route(gate.scorer(x))
    assert torch.equal(gate.eval()(x).scores_TK, clean.scores_TK)
    jittered = gate.train()(x)
    assert not torch.equal(jittered.scores_TK, clean.scores_TK)
    gate.jitter_eps = 0.0
    assert torch.equal(gate.train()(x).scores_TK, clean.scores_TK)


# --- Noisy -------------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("top_k", [1, 2])
def test_noisy_loss_is_zero_for_uniform_importance_and_load(top_k):
    gate = identity_gate(NoisyGate, 4, top_k).eval()
    # token t prefers experts t % 4 and (t + 1) % 4 equally: both sums are uniform
    x = torch.zeros(8, 4)
    rows = torch.arange(8)
    x[rows, rows % 4] = 5.0
    if top_k == 2:
        x[rows, (rows + 1) % 4] = 5.0
    assert gate(x).balance_loss.item() < 1e-8
    skewed = torch.zeros(8, 4)
    skewed[:, 0] = 5.0
    assert gate(skewed).balance_loss.item() > 1e-3


@pytest.mark.timeout(60)
def test_noisy_eval_is_naive_top_k():
    noisy = build("noisy").eval()
    naive = NaiveGate(D, N, 2)
    naive.load_state_dict({k: v for k, v in noisy.state_dict().items() if k.startswith("scorer")})
    x = skewed_input()
    a, b = noisy(x), naive(x)
    assert torch.equal(a.expert_ids_TK, b.expert_ids_TK)
    torch.testing.assert_close(a.scores_TK, b.scores_TK)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_noisy_load_estimator_matches_monte_carlo(k):
    # averaged over the other experts' noise, P(x, e) is the probability e is in the top k
    clean = torch.tensor([1.0, 0.5, 0.0, -0.5, 0.2], dtype=torch.float64)
    std = torch.tensor([0.5, 1.0, 0.8, 0.3, 0.6], dtype=torch.float64)
    samples = 40000
    noisy = clean + torch.randn(samples, 5, dtype=torch.float64) * std
    estimate = prob_in_top_k(clean.expand(samples, 5), noisy, std.expand(samples, 5), k).mean(0)
    in_top = torch.zeros(samples, 5, dtype=torch.float64)
    in_top.scatter_(1, torch.topk(noisy, k, -1).indices, 1.0)
    assert (estimate - in_top.mean(0)).abs().max() < 0.015
    torch.testing.assert_close(estimate.sum(), torch.tensor(float(k), dtype=torch.float64),
                               rtol=0.01, atol=0.0)


@pytest.mark.timeout(60)
def test_noisy_training_loss_trains_the_noise_scale():
    gate = build("noisy").train()
    gate(skewed_input()).balance_loss.backward()
    assert gate.noise.weight.grad is not None and gate.noise.weight.grad.abs().sum() > 0
    assert gate.scorer.weight.grad.abs().sum() > 0


# --- SWIPE -------------------------------------------------------------------------------

def check_swipe(ids: torch.Tensor, num_experts: int, top_k: int, group_tokens: int) -> None:
    capacity = math.ceil(group_tokens * top_k / num_experts)
    assert (ids >= 0).all() and (ids < num_experts).all()
    assert int(torch.bincount(ids.reshape(-1), minlength=num_experts).max()) <= capacity
    assert all(len(set(row)) == top_k for row in ids.tolist())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("kind", ["skewed", "uniform", "random"])
def test_swipe_invariants(kind, top_k, dtype):
    num_tokens = 37
    if kind == "skewed":
        logits = torch.randn(num_tokens, N, dtype=dtype)
        logits[:, 0] += 20.0
    elif kind == "uniform":
        logits = torch.zeros(num_tokens, N, dtype=dtype)
    else:
        logits = torch.randn(num_tokens, N, dtype=dtype)
    gate = SwipeGate(D, N, top_k)
    out = gate.route(logits)
    check_contract(out, num_tokens, top_k, dtype)
    check_swipe(out.expert_ids_TK, N, top_k, num_tokens)
    torch.testing.assert_close(out.scores_TK.sum(-1), torch.ones(num_tokens, dtype=dtype))
    assert out.balance_loss.item() == 0
    again = gate.route(logits.clone())
    assert torch.equal(again.expert_ids_TK, out.expert_ids_TK)
    if kind == "skewed":
        # the first C tokens keep their favourite; the rest are spread out
        capacity = math.ceil(num_tokens * top_k / N)
        assert (out.expert_ids_TK[:capacity, 0] == 0).all()
        assert int((out.expert_ids_TK == 0).sum()) == capacity


@pytest.mark.timeout(60)
def test_swipe_keeps_preferences_that_fit():
    logits = torch.zeros(N, N)
    rows = torch.arange(N)
    logits[rows, rows] = 2.0
    logits[rows, (rows + 3) % N] = 1.0
    out = SwipeGate(D, N, 2).route(logits)
    assert torch.equal(out.expert_ids_TK, torch.stack([rows, (rows + 3) % N], 1))


@pytest.mark.timeout(60)
def test_swipe_overflow_goes_to_most_room_lowest_id():
    # N=4, K=1, 6 tokens: C = 2. Tokens 0-4 want expert 3, token 5 wants expert 1.
    # Tokens 0, 1 get 3; token 5 gets 1; the overflow of tokens 2, 3, 4 goes to the most
    # room: 0 (2 left), then 2 (2 left, 0 has 1), then 0 (tie 0/2 at 1 left: lowest id)
    prefs = np.array([[3], [3], [3], [3], [3], [1]])
    assert swipe_assign(prefs, 4)[:, 0].tolist() == [3, 3, 0, 2, 0, 1]


@pytest.mark.timeout(60)
def test_swipe_unsticks_a_cornered_token():
    # N=3, K=2, C=2: after slot 0 token 2 sits on expert 1 and, in slot 1, the only room
    # left is on expert 1 again; token 1 moves from expert 0 to 1 and token 2 takes 0
    out = swipe_assign(np.array([[0, 2], [0, 2], [0, 2]]), 3)
    assert out.tolist() == [[0, 2], [1, 2], [1, 0]]


@pytest.mark.timeout(60)
def test_swipe_assign_invariants_random_small_cases():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        num_experts = int(rng.integers(1, 7))
        top_k = int(rng.integers(1, num_experts + 1))
        num_tokens = int(rng.integers(0, 15))
        prefs = np.array([rng.permutation(num_experts)[:top_k] for _ in range(num_tokens)],
                         dtype=np.int64).reshape(num_tokens, top_k)
        if rng.random() < 0.5 and num_tokens:
            prefs = np.repeat(prefs[:1], num_tokens, 0)
        ids = torch.from_numpy(swipe_assign(prefs, num_experts))
        check_swipe(ids, num_experts, top_k, num_tokens)


def _swipe_rank(rank: int, world_size: int, logits_GN: torch.Tensor, counts: list[int],
                top_k: int) -> tuple[list[list[int]], list[list[float]]]:
    first = sum(counts[:rank])
    gate = SwipeGate(D, logits_GN.shape[1], top_k)
    gate.bind(GateContext(rank=rank, world_size=world_size,
                          num_experts_per_rank=logits_GN.shape[1] // world_size,
                          comm=Communicator()))
    out = gate.route(logits_GN[first:first + counts[rank]])
    return out.expert_ids_TK.tolist(), out.scores_TK.tolist()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("counts", [[5, 3], [4, 0, 7, 2]], ids=["2ranks", "4ranks"])
def test_swipe_multi_rank_matches_single_process(counts):
    logits = torch.randn(sum(counts), N, dtype=torch.float64)
    logits[:, 1] += 3.0
    top_k = 2
    reference = SwipeGate(D, N, top_k).route(logits)
    check_swipe(reference.expert_ids_TK, N, top_k, sum(counts))
    results = run_distributed(_swipe_rank, len(counts), logits, counts, top_k)
    ids = torch.tensor([row for rank_ids, _ in results for row in rank_ids], dtype=torch.int64)
    scores = torch.tensor([row for _, rank_scores in results for row in rank_scores],
                          dtype=torch.float64)
    assert torch.equal(ids.reshape(-1, top_k), reference.expert_ids_TK)
    torch.testing.assert_close(scores.reshape(-1, top_k), reference.scores_TK)


# --- Topology ----------------------------------------------------------------------------

def node_of(expert_ids: torch.Tensor, ctx: GateContext) -> torch.Tensor:
    return expert_ids // (ctx.num_experts_per_rank * ctx.ranks_per_node)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("rank", [0, 1, 3])
@pytest.mark.parametrize("fraction", [0.0, 0.14, 0.5])
def test_topology_bounds_cross_node_tokens(fraction, rank):
    ctx = GateContext(rank=rank, world_size=4, num_experts_per_rank=2, ranks_per_node=2)
    gate = TopologyGate(D, N, 2, outgoing_fraction=fraction)
    gate.bind(ctx)
    logits = torch.randn(50, N)
    # make remote experts popular so that the cap binds
    remote = node_of(torch.arange(N), ctx) != rank // 2
    logits[:, remote] += 1.0
    out = gate.route(logits)
    check_contract(out, 50, 2, torch.float32)
    crossing = (node_of(out.expert_ids_TK, ctx) != rank // 2).any(-1)
    assert int(crossing.sum()) <= math.floor(fraction * 50)
    torch.testing.assert_close(out.scores_TK.sum(-1), torch.ones(50))
    plain = torch.topk(logits, 2).indices
    assert int((node_of(plain, ctx) != rank // 2).any(-1).sum()) > math.floor(fraction * 50)


@pytest.mark.timeout(60)
def test_topology_counts_remote_second_choices():
    # every top-1 is local but every second choice remote: FasterMoE's top-1 count would
    # keep plain top-2 and send all 6 tokens across; the bound allows floor(0.34 * 6) = 2
    gate = identity_gate(TopologyGate, N, 2, outgoing_fraction=0.34)
    gate.bind(TOPO)
    x = torch.zeros(6, N)
    rows = torch.arange(6)
    x[rows, rows % 4] = 3.0
    x[rows, 4 + rows % 4] = 2.0
    x[rows, (rows + 1) % 4] = 1.0
    ids = gate(x).expert_ids_TK
    assert torch.equal(ids, torch.stack([rows % 4, (rows + 1) % 4], 1))


@pytest.mark.timeout(60)
def test_topology_full_fraction_is_plain_top2():
    gate = build("topology", outgoing_fraction=1.0)
    naive = NaiveGate(D, N, 2)
    naive.load_state_dict(gate.state_dict())
    x = skewed_input()
    a, b = gate(x), naive(x)
    assert torch.equal(a.expert_ids_TK, b.expert_ids_TK)
    torch.testing.assert_close(a.scores_TK, b.scores_TK)


@pytest.mark.timeout(60)
def test_topology_keeps_the_strongest_remote_tokens():
    # node 0 = experts 0-3. Every token's top-1 is remote (expert 4 + t % 4), budget
    # floor(0.2 * 10) = 2: tokens 7 and 3 have the highest top-1 logits and keep theirs
    gate = identity_gate(TopologyGate, N, 2, outgoing_fraction=0.2)
    gate.bind(TOPO)
    x = torch.zeros(10, N)
    rows = torch.arange(10)
    top1 = torch.tensor([1.0, 2.0, 3.0, 9.0, 4.0, 5.0, 6.0, 10.0, 7.0, 8.0])
    x[rows, 4 + rows % 4] = top1
    x[rows, rows % 4] = 0.5
    x[rows, (rows + 1) % 4] = 0.25
    ids = gate(x).expert_ids_TK
    expected = torch.stack([rows % 4, (rows + 1) % 4], 1)
    expected[3] = torch.tensor([3, 7])
    expected[7] = torch.tensor([3, 7])
    assert torch.equal(ids, expected)


@pytest.mark.timeout(60)
def test_topology_single_expert_node_falls_back_to_plain_top2():
    ctx = GateContext(rank=1, world_size=4, num_experts_per_rank=1, ranks_per_node=1)
    gate = identity_gate(TopologyGate, 4, 2, outgoing_fraction=0.5)
    gate.bind(ctx)
    # expert 1 is the only local one; every token prefers remote experts
    x = torch.tensor([[5.0, 0.0, 4.0, 1.0],
                      [0.0, 0.0, 3.0, 2.0],
                      [1.0, 0.0, 2.0, 6.0],
                      [0.0, 0.0, 1.0, 0.5]])
    ids = gate(x).expert_ids_TK
    # budget 2: tokens 2 (top-1 logit 6) and 0 (5) get (local 1, remote top-1)
    assert ids.tolist() == [[1, 0], [2, 3], [1, 3], [2, 3]]


@pytest.mark.timeout(60)
def test_topology_rank_without_experts_is_an_error():
    gate = TopologyGate(D, N, 2)
    gate.bind(GateContext(rank=4, world_size=5, num_experts_per_rank=2, ranks_per_node=2))
    with pytest.raises(ValueError, match="holds none"):
        gate(skewed_input())


# --- emulated ranks -----------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_tokens", [40, 37, 0])
def test_emulated_ranks_routes_each_slice_as_its_rank(num_tokens):
    # slice r of the batch goes through the wrapped gate bound to rank r, 2 ranks per node
    inner = TopologyGate(D, N, 2, outgoing_fraction=0.1)
    gate = EmulatedRanksGate(inner, world_size=4, num_experts_per_rank=2, ranks_per_node=2)
    reference = TopologyGate(D, N, 2, outgoing_fraction=0.1)
    reference.load_state_dict(inner.state_dict())
    x = skewed_input(num_tokens=num_tokens)
    out = gate(x)
    check_contract(out, num_tokens, 2, torch.float32)
    ids, scores, losses, cross = [], [], [], 0
    for r, part in enumerate(torch.chunk(x, 4)):
        ctx = GateContext(rank=r, world_size=4, num_experts_per_rank=2, ranks_per_node=2)
        reference.bind(ctx)
        o = reference(part)
        ids.append(o.expert_ids_TK)
        scores.append(o.scores_TK)
        losses.append(o.balance_loss)
        cross += int((node_of(o.expert_ids_TK, ctx) != r // 2).sum())
    assert torch.equal(out.expert_ids_TK, torch.cat(ids))
    torch.testing.assert_close(out.scores_TK, torch.cat(scores), rtol=0, atol=0)
    torch.testing.assert_close(out.balance_loss, sum(losses) / len(losses), rtol=0, atol=0)
    assert (gate.cross_node, gate.assignments) == (cross, 2 * num_tokens)
    # the counts accumulate over forwards until reset
    gate(x)
    assert (gate.cross_node, gate.assignments) == (2 * cross, 4 * num_tokens)
    gate.reset_counts()
    assert (gate.cross_node, gate.assignments) == (0, 0)
    # the wrapped gate's own context is untouched
    assert inner.context == GateContext(num_experts_per_rank=N)


@pytest.mark.timeout(60)
def test_emulated_ranks_cuts_cross_node_traffic_with_the_topology_gate():
    # the experiment's use: the topology gate's budget lowers the cross-node share
    x = skewed_input(num_tokens=400)
    shares = []
    for fraction in (0.05, 1.0):
        inner = build("topology", outgoing_fraction=fraction)
        gate = EmulatedRanksGate(inner, world_size=4, num_experts_per_rank=2, ranks_per_node=2)
        gate(x)
        shares.append(gate.cross_node / gate.assignments)
    # f = 0.05: at most floor(0.05 * 100) = 5 tokens per rank (2 assignments each) cross
    assert shares[0] <= 4 * 5 * 2 / 800 < shares[1]


@pytest.mark.timeout(60)
def test_emulated_ranks_in_a_layer_trains_the_wrapped_scorer():
    from furnace.moe import MoELayer

    inner = make_gate("naive", D, N, 2)
    gate = EmulatedRanksGate(inner, world_size=4, num_experts_per_rank=2)
    layer = MoELayer(d_model=D, num_experts=N, top_k=2, gate=gate)
    layer(skewed_input()).square().sum().backward()
    assert inner.scorer.weight.grad is not None and bool(inner.scorer.weight.grad.any())
    # one scorer, owned by the wrapped gate
    assert [n for n, _ in gate.named_parameters()] == ["inner.scorer.weight",
                                                       "inner.scorer.bias"]


@pytest.mark.timeout(60)
def test_emulated_ranks_bad_arguments():
    with pytest.raises(ValueError, match="3 ranks x 2 experts hold 6"):
        EmulatedRanksGate(NaiveGate(D, N, 2), world_size=3, num_experts_per_rank=2)
    with pytest.raises(ValueError, match=">= 1"):
        EmulatedRanksGate(NaiveGate(D, N, 2), world_size=0, num_experts_per_rank=2)
    gate = EmulatedRanksGate(NaiveGate(D, N, 2), world_size=4, num_experts_per_rank=2)
    with pytest.raises(TypeError, match="emulates its ranks itself"):
        gate.bind(TOPO)


# --- Zero --------------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("top_k", [1, 3])
def test_zero_gate(top_k):
    out = ZeroGate(D, N, top_k).double()(skewed_input(torch.float64))
    assert torch.equal(out.expert_ids_TK, torch.arange(top_k).expand(T, top_k))
    assert (out.scores_TK == 1 / top_k).all() and out.scores_TK.dtype == torch.float64
