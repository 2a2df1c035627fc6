"""Load balance at scale (furnace.hybrid.balance): SWIPE never drops and never exceeds its
capacity, at emulated scale and on real gloo ranks through an expert-parallel MoELayer;
GShard and Switch drop under skew, with counts equal to a recount of their expert ids;
SWIPE's max/mean load is at most GShard's; config validation; the loss curves.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.distributed as dist

from furnace.hybrid.balance import (
    BALANCE_COLUMNS,
    BalanceConfig,
    balance_loss_curves,
    balance_study,
    route_group,
    routing_balance,
    skewed_logits,
)
from furnace.moe import MoELayer, expert_parallel
from furnace.runtime import run_distributed
from furnace.runtime.comm import Communicator
from furnace.runtime.reproduce import Table

# small enough for one core: the scale is in the rank count, not the token count
SMALL = dict(num_experts=64, ranks=32, tokens_per_rank=24)


def check_swipe(ids_GK: torch.Tensor, num_experts: int, top_k: int) -> None:
    """No drop, distinct experts per token, every load within ceil(G * K / N)."""
    G = ids_GK.shape[0]
    capacity = math.ceil(G * top_k / num_experts)
    assert ids_GK.shape == (G, top_k)
    assert bool((ids_GK >= 0).all()), "SWIPE dropped an assignment"
    assert all(len(set(row)) == top_k for row in ids_GK.tolist())
    load_N = torch.bincount(ids_GK.reshape(-1), minlength=num_experts)
    assert int(load_N.max()) <= capacity
    assert int(load_N.sum()) == G * top_k


@pytest.mark.timeout(60)
@pytest.mark.parametrize("top_k", [1, 2])
def test_swipe_never_drops_nor_exceeds_capacity(top_k):
    # (experts, ranks, tokens per rank): G * K rarely a multiple of N, so C rounds up
    shapes = [(64, 32, 24), (12, 4, 5), (128, 64, 5), (6, 3, 1)]
    overflowed = 0
    for seed in range(3):
        for skew in (0.0, 1.0, 3.0):
            for N, W, T in shapes:
                config = BalanceConfig(num_experts=N, ranks=W, tokens_per_rank=T, top_k=top_k,
                                       skew=skew, seed=seed, gates=("swipe",))
                logits_GN = skewed_logits(config)
                ids_GK, capacity, per_rank = route_group("swipe", logits_GN, ranks=W,
                                                         top_k=top_k, capacity_factor=1.0)
                check_swipe(ids_GK, N, top_k)
                assert capacity == math.ceil(W * T * top_k / N) and per_rank is None
                demand = torch.bincount(logits_GN.topk(top_k, -1).indices.reshape(-1),
                                        minlength=N)
                overflowed += int(demand.max()) > capacity
    # the skewed batches did ask for more than the capacity, so the bound was tested
    assert overflowed >= 3 * 2 * len(shapes)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("top_k", [1, 2])
def test_swipe_when_every_token_prefers_one_expert(top_k):
    for N, W, T in [(16, 8, 7), (9, 3, 4)]:
        logits_GN = torch.randn(W * T, N, generator=torch.Generator().manual_seed(N),
                                dtype=torch.float64)
        logits_GN[:, 2] += 100.0
        ids_GK, _, _ = route_group("swipe", logits_GN, ranks=W, top_k=top_k,
                                   capacity_factor=1.0)
        check_swipe(ids_GK, N, top_k)
        # expert 2 is full: exactly C of the tokens got their favourite
        assert int((ids_GK == 2).sum()) == math.ceil(W * T * top_k / N)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("gate", ["gshard", "switch"])
def test_capacity_gates_drop_under_skew_and_counts_match_a_recount(gate):
    config = BalanceConfig(**SMALL, skew=2.0, capacity_factor=1.0, gates=(gate,))
    [row] = routing_balance(config)
    ids_GK, capacity, per_rank = route_group(gate, skewed_logits(config), ranks=config.ranks,
                                             top_k=config.top_k, capacity_factor=1.0)
    K = 2 if gate == "gshard" else 1
    G = config.ranks * config.tokens_per_rank
    dropped = int((ids_GK == -1).sum())
    load_N = torch.bincount(ids_GK[ids_GK >= 0], minlength=config.num_experts)
    assert dropped > 0.2 * G * K, "strong skew must overflow the capacity"
    assert (row.top_k, row.tokens, row.assignments) == (K, G, G * K)
    assert row.dropped == dropped
    assert row.dropped_fraction == dropped / (G * K)
    assert row.max_load == int(load_N.max())
    assert row.mean_load == float(load_N.sum()) / config.num_experts
    assert row.redirected == 0
    assert row.capacity == capacity == config.ranks * per_rank
    assert row.capacity_per_rank == per_rank == math.ceil(G // config.ranks * K
                                                          / config.num_experts)
    # the per-rank rule: no rank sends one expert more than C_r
    T = config.tokens_per_rank
    for r in range(config.ranks):
        part = ids_GK[r * T:(r + 1) * T]
        assert int(torch.bincount(part[part >= 0], minlength=config.num_experts).max()) \
            <= per_rank
    assert row.max_load <= row.capacity


@pytest.mark.timeout(60)
def test_swipe_row_counts_redirections_and_is_balanced():
    config = BalanceConfig(**SMALL, skew=1.5, gates=("swipe",))
    [row] = routing_balance(config)
    logits_GN = skewed_logits(config)
    ids_GK, _, _ = route_group("swipe", logits_GN, ranks=config.ranks, top_k=2,
                               capacity_factor=1.0)
    preferred = logits_GN.topk(2, -1).indices
    recount = sum(len(set(got) - set(want)) for got, want in zip(ids_GK.tolist(),
                                                                 preferred.tolist()))
    assert row.redirected == recount > 0
    assert row.dropped == 0
    assert row.max_load <= row.capacity
    assert row.demand_max_over_mean > 5 * row.max_over_mean


@pytest.mark.timeout(60)
def test_swipe_max_over_mean_at_most_gshards():
    for seed in range(3):
        for skew in (0.5, 1.0, 2.0):
            config = BalanceConfig(**SMALL, skew=skew, seed=seed, gates=("gshard", "swipe"))
            gshard, swipe = routing_balance(config)
            assert swipe.max_over_mean <= gshard.max_over_mean
            assert swipe.dropped == 0 < gshard.dropped
    # deterministic: the same config gives the same rows
    assert routing_balance(config) == [gshard, swipe]


# per expert-parallel group, the tokens of each of its ranks (uneven on purpose)
GROUP_COUNTS = {4: [4, 1, 7, 3], 2: [5, 8]}


def _swipe_layer_rank(rank: int, world_size: int) -> list[dict]:
    """What this rank's expert-parallel SWIPE layer did, for top_k 1 and 2, in the group of
    all 4 ranks and in its pair (ranks 0-1 and 2-3: two 2-rank groups of one launch)."""
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    out = []
    for size, group in ((4, None), (2, pairs[rank // 2])):
        comm = Communicator(group, name=f"ep{size}")
        counts = GROUP_COUNTS[size]
        for top_k in (1, 2):
            torch.manual_seed(3)
            layer = MoELayer(d_model=4, num_experts=8, top_k=top_k, d_hidden=6,
                             gate="swipe").double()
            with torch.no_grad():
                # a hot expert: the tokens' preferences overflow its capacity
                layer.gate.scorer.bias[5] += 4.0
            expert_parallel(layer, comm)
            x_GD = torch.randn(sum(counts), 4, generator=torch.Generator().manual_seed(7),
                               dtype=torch.float64)
            first = sum(counts[:comm.rank])
            x_TD = x_GD[first:first + counts[comm.rank]]
            layer(x_TD)
            assert layer.last_routing is not None
            with torch.no_grad():
                logits_TN = layer.gate.scorer(x_TD)
            out.append({"size": size, "top_k": top_k,
                        "loads": layer.last_routing.tokens_per_expert,
                        "dropped": layer.last_routing.dropped, "logits": logits_TN})
    return out


@pytest.mark.timeout(90)
def test_swipe_on_gloo_ranks_through_an_expert_parallel_layer():
    per_rank = run_distributed(_swipe_layer_rank, 4, timeout_s=75)
    N = 8
    checked = []
    for runs in zip(*per_rank):
        size, top_k = runs[0]["size"], runs[0]["top_k"]
        # the 4-rank group once; each pair of ranks is a group of its own
        groups = [runs] if size == 4 else [runs[:2], runs[2:]]
        for group in groups:
            G = sum(GROUP_COUNTS[size])
            capacity = math.ceil(G * top_k / N)
            loads = torch.tensor([o["loads"] for o in group]).sum(0)
            assert [o["dropped"] for o in group] == [0] * size
            assert int(loads.sum()) == G * top_k
            assert int(loads.max()) <= capacity
            logits_GN = torch.cat([o["logits"] for o in group])
            demand = torch.bincount(logits_GN.topk(top_k, -1).indices.reshape(-1),
                                    minlength=N)
            assert int(demand.max()) > capacity, "the hot expert must overflow"
            # the one-process emulation is what the ranks computed together
            ids_GK, _, _ = route_group("swipe", logits_GN, ranks=1, top_k=top_k,
                                       capacity_factor=1.0)
            assert torch.bincount(ids_GK.reshape(-1), minlength=N).tolist() == loads.tolist()
            checked.append((size, top_k))
    assert sorted(checked) == [(2, 1), (2, 1), (2, 2), (2, 2), (4, 1), (4, 2)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("field", "value", "named"), [
    ("num_experts", 0, "num_experts"), ("top_k", 0, "top_k"),
    ("tokens_per_rank", -1, "tokens_per_rank"), ("ranks", True, "ranks"),
    # 128 experts do not divide over 3 ranks
    ("ranks", 3, "num_experts=128 must be a multiple of ranks=3"),
    ("capacity_factor", 0.0, "capacity_factor"), ("capacity_factor", math.inf,
                                                  "capacity_factor"),
    ("skew", -1.0, "skew"), ("skew", math.nan, "skew"), ("seed", -1, "seed"),
    ("gates", (), "gates"), ("gates", ("gshard", "top2"), "gates: unknown"),
    ("gates", ("swipe", "swipe"), "gates must not repeat"), ("gates", ["swipe"], "gates"),
    ("steps", 0, "steps"), ("lm_num_heads", 3, "lm_num_heads"), ("lr", 0.0, "lr"),
    ("balance_loss_weight", -0.1, "balance_loss_weight"),
    # GShard is top-2: one expert is too few
    ("lm_num_experts", 1, "lm_num_experts=1"), ("top_k", 200, "num_experts=128"),
])
def test_config_validation_names_the_field(field, value, named):
    with pytest.raises(ValueError, match=named):
        BalanceConfig(**{field: value})


TINY = BalanceConfig(num_experts=8, ranks=4, tokens_per_rank=8, steps=3, lm_d_model=8,
                     lm_num_layers=1, lm_num_heads=2, lm_seq_len=8, lm_num_experts=4,
                     lm_d_hidden=8, lm_batch_size=2, corpus_bytes=100_000)


@pytest.mark.timeout(60)
def test_loss_curves_are_finite_and_reproducible():
    curves = balance_loss_curves(TINY)
    assert list(curves) == list(TINY.gates)
    for curve in curves.values():
        assert len(curve) == TINY.steps
        assert all(math.isfinite(v) and v > 0 for v in curve)
    assert balance_loss_curves(TINY) == curves
    other = balance_loss_curves(dataclasses.replace(TINY, seed=1, gates=("swipe",)))
    assert other["swipe"] != curves["swipe"]


@pytest.mark.timeout(60)
def test_study_table_fits_a_reproduce_table():
    study = balance_study(dataclasses.replace(TINY, steps=1))
    rows = study.table()
    table = Table(title="balance", columns=list(BALANCE_COLUMNS), rows=rows, kind="emulated")
    assert [r[0] for r in table.rows] == list(TINY.gates)
    assert [r[-1] for r in rows] == [study.curves[g][-1] for g in TINY.gates]
    assert balance_study(TINY, train=False).curves == {}
