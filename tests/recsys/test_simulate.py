"""Tests of the two-level cluster simulator (`furnace.recsys.simulate`; pattern-aware sparse
communication, He, Chen, Zhai, PPoPP '24 poster, design note Sec. 2.4 and Sec. 7
"Simulator"): the projection's invariants (K = 0 hybrid is row_dedup, the schedule never
loses, table_pooled sends no IDs), the crossover (replication loses on a flat fabric with
uniform access and at large K, pays on a two-level fabric with skew), the validation
functions on planted inputs, and the model's expected bytes against exact counts of
sampled batches on the emulated-link topology at W = 4 and 8."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from furnace.recsys.accounting import exact_bytes
from furnace.recsys.config import (
    DataConfig,
    DataError,
    EngineConfig,
    ModelConfig,
    PlanError,
    scaled_table_rows,
)
from furnace.recsys.data import SyntheticClickLog
from furnace.recsys.model import DLRM
from furnace.recsys.perfmodel import ClusterModel
from furnace.recsys.plan import make_plan, ranked_rows
from furnace.recsys.simulate import (
    SCENARIOS,
    CrossoverRow,
    SimulationConfig,
    break_even_touches,
    bytes_validation_table,
    crossover,
    crossover_table,
    dense_param_count,
    model_schemes,
    scaling_bytes_table,
    scaling_table,
    simulate_scaling,
    time_validation_table,
    validate_bytes,
    validate_times,
)
from furnace.runtime.presets import emulated_link

# closed-form numpy models, planners and byte counters in one process: nothing depends on
# the torch/OpenMP thread count
pytestmark = pytest.mark.thread_independent

SMALL = dict(row_scale=1e-4, batch_size_per_rank=256)


def test_config_rejects_bad_fields_by_name() -> None:
    for kwargs, name in (({"memory_budget_bytes": -1}, "memory_budget"),
                         ({"preset": "nope"}, "preset"),
                         ({"world_sizes": (8, 0)}, "world_sizes"),
                         ({"optimizer": "adam"}, "optimizer"),
                         ({"compute_efficiency": 0.0}, "compute_efficiency"),
                         ({"embedding_dim": 0}, "embedding_dim")):
        with pytest.raises(PlanError) as err:
            SimulationConfig(**kwargs)
        assert err.value.field == name
    with pytest.raises(DataError):
        SimulationConfig(row_scale=2.0)
    with pytest.raises(DataError):
        SimulationConfig(zipf_exponent=-1.0)


def test_dense_param_count_matches_the_model() -> None:
    for interaction in ("dot", "dcn"):
        cfg = ModelConfig(embedding_dim=8, bottom_mlp=(32, 8), top_mlp=(16, 1),
                          interaction=interaction)
        model = DLRM(cfg, num_dense=5, num_tables=7)
        assert dense_param_count(cfg, 5, 7) == sum(p.numel() for p in model.parameters())


def test_break_even_is_the_design_note_figure() -> None:
    # (W-1) 2De/(i+2De) = 0.941 (W-1) for D=16 fp32 and 8-byte IDs
    assert break_even_touches(8, 16) == pytest.approx(7 * 128 / 136, rel=1e-12)
    assert break_even_touches(8, 16) / 7 == pytest.approx(0.941, abs=1e-3)


def test_scaling_invariants() -> None:
    # tiny tables, a big batch and a tiny MLP: the exchanges outweigh the compute, so the
    # planner replicates (here everything) once the all-reduce is fused
    config = SimulationConfig(world_sizes=(8, 32, 128), zipf_exponent=1.2, row_scale=1e-4,
                              embedding_dim=64, batch_size_per_rank=4096, bottom_hidden=(16,),
                              top_mlp=(16, 1), compute_efficiency=1.0)
    study = simulate_scaling(config)
    per_row = config.embedding_dim * config.element_bytes
    assert [r.world_size for r in study.rows] == [8, 32, 128]
    for r in study.rows:
        assert set(r.seconds) == set(SCENARIOS)
        assert all(t > 0 and math.isfinite(t) for t in r.seconds.values())
        assert r.num_nodes == math.ceil(r.world_size / config.ranks_per_node)
        # overlap and one fused all-reduce cannot lose (up to the planner's 1 % margin,
        # within which it keeps K = 0)
        assert r.seconds["hybrid_scheduled"] <= r.seconds["hybrid"] * 1.01
        assert r.seconds["hybrid_scheduled"] < r.seconds["row_dedup"]
        # the planner keeps K > 0 only if it models faster than row_dedup
        if r.hot_rows:
            assert r.seconds["hybrid"] < r.seconds["row_dedup"]
        else:
            assert r.seconds["hybrid"] == pytest.approx(r.seconds["row_dedup"], rel=1e-12)
        for k, memory in ((r.hot_rows, r.hot_memory_bytes_per_rank),
                          (r.scheduled_hot_rows, r.scheduled_hot_memory_bytes_per_rank)):
            assert memory == k * per_row <= config.memory_budget_bytes
        if r.scheduled_hot_rows:
            assert r.scheduled_planner_reason.startswith("replicate")
            hot = r.busiest_bytes["hybrid_scheduled"]
            assert hot.get("vectors", 0.0) < r.busiest_bytes["row_dedup"]["vectors"]
        pooled = r.busiest_bytes["table_pooled"]
        assert pooled.get("ids", 0.0) == 0 and pooled.get("splits", 0.0) == 0
        assert pooled["vectors"] > 0
        # dedup never sends more IDs than one per occurrence
        assert r.busiest_bytes["row_dedup"]["ids"] <= r.busiest_bytes["row"]["ids"]
        assert r.speedup_vs_row_dedup == pytest.approx(
            r.seconds["row_dedup"] / r.seconds["hybrid_scheduled"], rel=1e-12)
    assert any(r.scheduled_hot_rows > 0 for r in study.rows)
    table = scaling_table(study)
    assert table.kind == "simulated" and len(table.rows) == 3
    assert "simulated" in table.note
    bytes_table = scaling_bytes_table(study)
    assert bytes_table.kind == "simulated" and len(bytes_table.rows) == 3 * 4
    assert study.to_dict()["rows"][0]["world_size"] == 8


def test_crossover_flat_uniform_loses_and_skewed_two_level_pays() -> None:
    uniform = crossover(SimulationConfig(zipf_exponent=0.0, row_scale=1e-3), world_size=8)
    assert uniform.replication_pays["flat"] is False
    # a heavy exchange (B_l = 4096, D = 64) over 4 nodes: the hierarchical all-reduce
    # sends a node's share across nodes, the all-to-all every GPU's
    skewed = crossover(SimulationConfig(zipf_exponent=1.2, row_scale=1e-3, embedding_dim=64,
                                        batch_size_per_rank=4096), world_size=32)
    assert skewed.replication_pays == {"flat": False, "two-level": True}
    assert skewed.best_hot_rows["two-level"] > 0
    assert skewed.rows_above_break_even > 0
    for result in (uniform, skewed):
        by: dict[str, dict[int, CrossoverRow]] = defaultdict(dict)
        for row in result.rows:
            by[row.fabric][row.hot_rows] = row
        for fabric, rows in by.items():
            k_all = max(rows)
            # every row hot: no all-to-all at all; replicating everything loses to K=0 on
            # the flat fabric (the design note's crossover)
            assert rows[k_all].all_to_all_bytes == 0
            assert rows[0].hot_allreduce_bytes == 0 and rows[0].all_to_all_bytes > 0
            if fabric == "flat":
                assert rows[k_all].seconds > rows[0].seconds
            # the a2a shrinks as K grows, the all-reduce grows
            ks = sorted(rows)
            a2a = [rows[k].all_to_all_bytes for k in ks]
            assert all(b <= a * (1 + 1e-12) for a, b in zip(a2a, a2a[1:]))
    table = crossover_table(skewed)
    assert table.kind == "simulated" and "pays" in table.note


def test_validate_bytes_on_planted_inputs() -> None:
    predicted = {"ids": np.array([100.0, 200.0, 300.0, 400.0]),
                 "vectors": np.array([10.0, 10.0, 10.0, 10.0])}
    exact: dict[tuple[str, int], float] = {
        ("ids", r): float(v) for r, v in enumerate([100, 200, 300, 400])}
    exact.update({("vectors", r): 10.0 for r in range(4)})
    ok = validate_bytes(exact, predicted)
    assert ok.passed and ok.max_relative_error == 0.0
    off = dict(exact)
    off["ids", 3] = 400 / 1.05  # the model over-predicts the busiest rank by 5 %
    bad = validate_bytes(off, predicted, tolerance=0.03)
    assert not bad.passed
    ids_row = next(r for r in bad.rows if r[0] == "ids")
    assert ids_row[5] == pytest.approx(0.05, rel=1e-9)
    assert validate_bytes(off, predicted, tolerance=0.06).passed
    # busiest-rank form; a phase that the model misses entirely, and one it invents
    assert validate_bytes({"ids": 400.0, "vectors": 10.0}, predicted).passed
    missing = validate_bytes({"ids": 400.0, "vectors": 10.0, "grads": 5.0}, predicted)
    assert not missing.passed and missing.max_relative_error == 1.0
    invented = validate_bytes({"ids": 400.0}, predicted)
    assert not invented.passed and math.isinf(invented.max_relative_error)
    with pytest.raises(PlanError):
        validate_bytes({"ids": 1.0, ("ids", 0): 1.0}, predicted)
    table = bytes_validation_table(bad)
    assert table.kind == "measured" and "FAIL" in table.note


def test_validate_times_on_planted_inputs() -> None:
    modelled = {"table_pooled": 0.022, "row": 0.040, "row_dedup": 0.020, "hybrid": 0.015}
    measured = {k: 1.3 * v for k, v in modelled.items()}
    good = validate_times(measured, modelled)
    assert good.passed and all(r[3] == pytest.approx(1.3) for r in good.rows)
    slow = dict(measured, row=0.040 * 2.0)
    assert not validate_times(slow, modelled).within_tolerance
    # row_dedup now measures slower than table_pooled, which models 10 % slower
    swapped = dict(measured, row_dedup=measured["table_pooled"] * 1.02)
    result = validate_times(swapped, modelled)
    assert result.within_tolerance and not result.ordering_agrees
    assert result.disagreements == (("table_pooled", "row_dedup"),)
    # a modelled near-tie (within 5 %) does not constrain the order
    tie_model = dict(modelled, hybrid=0.0195)
    tie_measured = dict(measured, hybrid=0.020 * 1.3 * 1.02)
    assert validate_times(tie_measured, tie_model).ordering_agrees
    with pytest.raises(PlanError):
        validate_times({"other": 1.0}, modelled)
    with pytest.raises(PlanError):
        validate_times(dict(measured, row=0.0), modelled)
    assert time_validation_table(result).kind == "emulated"


@pytest.mark.parametrize("world_size", [4, 8])
def test_expected_bytes_match_sampled_exact_counts_on_emulated_link(world_size: int) -> None:
    table_rows = scaled_table_rows(1e-4)
    d, b_local, dense_params = 8, 64, 1000
    data = DataConfig(table_rows=table_rows, zipf_exponent=1.05, seed=3)
    log = SyntheticClickLog(data)
    probabilities = log.probabilities()
    topology = emulated_link(bandwidth_Bps=1e8, latency_s=1e-4)
    cluster = ClusterModel.from_topology(topology, world_size)
    hot = tuple(int(g) for g in ranked_rows(probabilities)[:40])
    models = model_schemes(probabilities, table_rows=table_rows, world_size=world_size,
                           cluster=cluster, batch_size_per_rank=b_local, embedding_dim=d,
                           hot_rows=hot, dense_param_count=dense_params)
    engines = {"table_pooled": EngineConfig("table_pooled"), "row": EngineConfig("row"),
               "row_dedup": EngineConfig("row_dedup"), "hybrid": EngineConfig("hybrid"),
               "hybrid_scheduled": EngineConfig.scheduled("hybrid")}
    batches = [log.batch(i, b_local * world_size) for i in range(40)]
    for scenario, engine in engines.items():
        plan = models[scenario].plan
        assert plan == make_plan(engine.scheme, table_rows=table_rows, world_size=world_size,
                                 hot_rows=hot if engine.scheme == "hybrid" else ())
        total: dict[tuple[str, int], float] = defaultdict(float)
        for batch in batches:
            counts = exact_bytes(batch, plan, engine, embedding_dim=d,
                                 dense_param_count=dense_params, element_bytes=4)
            for key, v in counts.items():
                total[key] += v / len(batches)
        check = validate_bytes(total, models[scenario].phase_bytes, tolerance=0.03)
        assert check.passed, (scenario, check.rows)
    # the modelled times on the emulated link feed validate_times
    modelled = {s: m.seconds for s, m in models.items()}
    assert validate_times({s: 1.2 * t for s, t in modelled.items()}, modelled).passed
    # with this link, dedup must model faster than per-occurrence row sharding
    assert modelled["row_dedup"] < modelled["row"]
