"""The performance model and the planner (design note `recsys.md` Sec. 2.4): expected bytes
against exact counts of sampled batches, the search against brute force over every subset of
rows, and the decisions the design note's crossover calculation predicts."""

from __future__ import annotations

import numpy as np
import pytest

from furnace.recsys.accounting import busiest_rank_bytes, exact_bytes
from furnace.recsys.config import DataConfig, EngineConfig, PlanError, scaled_table_rows
from furnace.recsys.data import SyntheticClickLog
from furnace.recsys.perfmodel import ClusterModel, expected_phase_bytes, iteration_time
from furnace.recsys.plan import (
    assign_tables,
    brute_force_hot_set,
    choose_hot_set,
    make_plan,
    objective,
    profile_probabilities,
)
from furnace.runtime.topology import Link

# closed-form models and searches over numpy arrays: no torch threads involved
pytestmark = pytest.mark.thread_independent

FAST = Link(name="fast", latency_s=1e-6, bandwidth_Bps=100e9)
SLOW = Link(name="slow", latency_s=1e-5, bandwidth_Bps=1e9)


def _flat(world_size: int) -> ClusterModel:
    return ClusterModel(1, world_size, SLOW, SLOW)


def _two_level(nodes: int, per_node: int) -> ClusterModel:
    return ClusterModel(per_node, nodes, FAST, SLOW)


@pytest.mark.parametrize("scheme", ["table_pooled", "row", "row_dedup", "hybrid"])
@pytest.mark.parametrize("bag_size", [1, 3])
def test_expected_bytes_match_the_mean_of_exact_counts(scheme, bag_size):
    rows = scaled_table_rows(2e-4)
    data = DataConfig(table_rows=rows, zipf_exponent=1.05, bag_size=bag_size, seed=1)
    log = SyntheticClickLog(data)
    p = log.probabilities()
    hot = tuple(sorted(np.argsort(-p)[:40].tolist())) if scheme == "hybrid" else ()
    plan = make_plan(scheme, table_rows=rows, world_size=4, hot_rows=hot)
    expected = expected_phase_bytes(p, plan=plan, scheme=scheme, batch_size_per_rank=64,
                                    embedding_dim=8, bag_size=bag_size, dense_param_count=500)
    total: dict[tuple[str, int], float] = {}
    draws = 40
    for batch in log.batches(256, draws):
        for key, v in exact_bytes(batch, plan, EngineConfig(scheme=scheme), embedding_dim=8,
                                  dense_param_count=500, element_bytes=4).items():
            total[key] = total.get(key, 0.0) + v / draws
    for phase, per_rank in expected.items():
        mean_exact = np.mean([total.get((phase, r), 0.0) for r in range(4)])
        assert mean_exact == pytest.approx(per_rank.mean(), rel=0.03), phase


def _small_case(zipf: float, world_size: int) -> tuple[np.ndarray, dict]:
    rows = (3, 5, 4)
    p = SyntheticClickLog(DataConfig(table_rows=rows, zipf_exponent=zipf, seed=2)).probabilities()
    base = make_plan("hybrid", table_rows=rows, world_size=world_size)
    return p, dict(plan_base=base, batch_size_per_rank=4, embedding_dim=8,
                   dense_param_count=0, compute_s=0.0)


@pytest.mark.parametrize("zipf", [0.0, 1.2])
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("fabric", ["flat", "two_level"])
def test_the_search_finds_the_brute_force_optimum(zipf, world_size, fabric):
    p, kw = _small_case(zipf, world_size)
    cluster = _flat(world_size) if fabric == "flat" else _two_level(2, world_size // 2)
    budget = 12 * 8 * 4  # every row fits
    brute = brute_force_hot_set(p, cluster=cluster, memory_budget_bytes=budget, **kw)
    chosen = choose_hot_set(p, cluster=cluster, memory_budget_bytes=budget, **kw)
    # the planner keeps K = 0 within its margin, so it may only lose that margin
    assert chosen.modelled_s <= brute.modelled_s * 1.0101
    best_top_k = min(objective(tuple(np.argsort(-p, kind="stable")[:k]), p, cluster=cluster,
                               **kw) for k in range(len(p) + 1))
    assert best_top_k == pytest.approx(brute.modelled_s, rel=1e-12)


def test_the_budget_caps_the_hot_set_and_a_negative_one_is_refused():
    p, kw = _small_case(1.2, 4)
    cluster = _two_level(2, 2)
    choice = choose_hot_set(p, cluster=cluster, memory_budget_bytes=3 * 8 * 4, **kw)
    assert choice.size <= 3 and choice.memory_bytes_per_rank <= 3 * 8 * 4
    with pytest.raises(PlanError) as err:
        choose_hot_set(p, cluster=cluster, memory_budget_bytes=-1, **kw)
    assert err.value.field == "memory_budget"


def _criteo(zipf: float, world_size: int) -> tuple[np.ndarray, dict]:
    rows = scaled_table_rows(1e-3)
    p = SyntheticClickLog(DataConfig(table_rows=rows, zipf_exponent=zipf)).probabilities()
    return p, dict(plan_base=make_plan("hybrid", table_rows=rows, world_size=world_size),
                   batch_size_per_rank=256, embedding_dim=16, memory_budget_bytes=8 * 2**20)


def test_uniform_access_on_a_flat_fabric_is_declined():
    p, kw = _criteo(0.0, 4)
    choice = choose_hot_set(p, cluster=_flat(4), **kw)
    assert choice.size == 0 and choice.reason.startswith("declined")


def test_skewed_access_across_nodes_replicates_and_models_faster():
    p, kw = _criteo(1.05, 4)
    choice = choose_hot_set(p, cluster=_two_level(2, 2), dense_param_count=20_000,
                            fuse_allreduce=True, **kw)
    assert choice.size > 0 and choice.modelled_s < 0.95 * choice.baseline_s


def test_replicating_everything_removes_the_exchange():
    rows = (3, 4)
    p = np.full(7, 0.25)
    plan = make_plan("hybrid", table_rows=rows, world_size=2, hot_rows=tuple(range(7)))
    phases = expected_phase_bytes(p, plan=plan, scheme="hybrid", batch_size_per_rank=4,
                                  embedding_dim=2)
    assert set(phases) == {"hot_allreduce"}
    assert iteration_time(phases, _flat(2)) > 0


def test_tables_are_balanced_and_profiles_normalised():
    assert assign_tables((10, 9, 8, 1), 2) == (0, 1, 1, 0)
    prob = profile_probabilities(np.array([0, 0, 3, 1, 0]), (2, 3))
    assert prob.tolist() == [0.5, 0.5, 0.75, 0.25, 0.0]
    with pytest.raises(PlanError):
        make_plan("row", table_rows=(3,), world_size=2, hot_rows=(1,))


def test_busiest_rank_is_the_largest_sender():
    assert busiest_rank_bytes({("ids", 0): 5, ("grads", 0): 5, ("ids", 1): 7}) == 10


@pytest.mark.parametrize("dedup", [False, True])
def test_expected_ids_match_a_numpy_count_of_sampled_batches(dedup):
    # an independent count from the batch IDs alone (not via `accounting`): per source rank,
    # the cold IDs it sends to each other owner, unique per (source, owner) when deduplicated
    rows = scaled_table_rows(2e-4)
    log = SyntheticClickLog(DataConfig(table_rows=rows, zipf_exponent=1.2, bag_size=2, seed=3))
    p = log.probabilities()
    w, b_local = 4, 32
    hot = np.sort(np.argsort(-p, kind="stable")[:25])
    scheme = "hybrid" if dedup else "row"
    plan = make_plan("hybrid", table_rows=rows, world_size=w, hot_rows=tuple(hot.tolist()))
    expected = expected_phase_bytes(p, plan=plan, scheme=scheme, batch_size_per_rank=b_local,
                                    embedding_dim=4, bag_size=2)
    is_hot = np.zeros(len(p), dtype=bool)
    is_hot[hot] = True
    draws = 60
    sent = np.zeros(w)
    for batch in log.batches(w * b_local, draws):
        for src in range(w):
            local = batch.local(src, w)
            ids = np.concatenate([g.numpy() for g in local.global_ids(plan.table_offsets)])
            ids = ids[~is_hot[ids]]
            ids = ids[ids % w != src]
            sent[src] += (len(np.unique(ids)) if dedup else len(ids)) * 8 / draws
    assert sent.mean() == pytest.approx(expected["ids"].mean(), rel=0.03)
    assert expected["ids"].mean() > 0


def test_the_search_matches_brute_force_exactly_when_it_replicates():
    p, kw = _small_case(1.2, 4)
    cluster = ClusterModel(2, 2, Link(name="nv", latency_s=1e-7, bandwidth_Bps=1e12),
                           Link(name="eth", latency_s=1e-7, bandwidth_Bps=1e8))
    budget = 12 * 8 * 4
    brute = brute_force_hot_set(p, cluster=cluster, memory_budget_bytes=budget, **kw)
    chosen = choose_hot_set(p, cluster=cluster, memory_budget_bytes=budget, **kw)
    assert chosen.size > 0
    assert chosen.modelled_s == pytest.approx(brute.modelled_s, rel=1e-12)


def test_an_even_matrix_times_as_its_busiest_rank_and_a_hotspot_slows_it():
    cluster = _two_level(2, 2)
    even = np.full((4, 4), 3000.0) - np.diag(np.full(4, 3000.0))
    assert cluster.all_to_all_time(even) == pytest.approx(cluster.all_to_all_time(9000.0),
                                                          rel=1e-12)
    hotspot = even.copy()
    hotspot[0, 2] *= 10  # rank 0 sends ten times as much across nodes
    # its 30 kB + 3 kB across nodes pace the exchange: latency plus bytes over the slow link
    assert cluster.all_to_all_time(hotspot) == pytest.approx(1e-5 + 33_000 / 1e9, rel=1e-12)
