"""`furnace reproduce hybrid`'s experiments (BaGuaLu, issue 13 item 7): registered once each
with quick variants; the inner functions, run tiny or fed chosen numbers, fill the tables'
columns and compute their claims (a deliberately wrong input flips a claim)."""

from __future__ import annotations

import dataclasses

import pytest

from furnace.hybrid import experiments as ex
from furnace.hybrid.alltoall import closed_form_traffic, modelled_time
from furnace.hybrid.naive import reference_training
from furnace.hybrid.validation import PlannerValidationError, ValidationRow
from furnace.moe import MoELMConfig
from furnace.runtime.reproduce import RunContext, discover

TINY_EQ = ex.EqualityConfig(model=MoELMConfig(vocab_size=12, d_model=8, num_layers=1,
                                               num_heads=2, seq_len=4, num_experts=4, top_k=2,
                                               d_hidden=6), global_batch=4, steps=2)


def test_entries_are_registered_once_each_with_quick_variants():
    found = discover("hybrid")
    assert found is not None
    names = [e.name for e in found]
    assert len(names) == len(set(names))
    assert {"equality", "bf16_vs_fp32", "memory", "alltoall", "planner_scaling"} <= set(names)
    assert all(e.system == "hybrid" and e.quick for e in found
               if e.name in ("equality", "bf16_vs_fp32", "memory", "alltoall",
                             "planner_scaling"))


def _self_run(reference, kinds):
    """A one-rank "MoDa run" that is the reference itself (P = 1, shard 0)."""
    return {"P": 1, "shard": 0, "kinds": kinds,
            "steps": [{"loss": s.loss, "grads": {n: g.clone() for n, g in s.grads.items()},
                       "params": {n: p.clone() for n, p in s.params.items()}}
                      for s in reference]}


def test_equality_errors_are_zero_for_the_reference_and_catch_a_perturbation():
    reference = reference_training(TINY_EQ.build_model(), TINY_EQ.global_batches(),
                                   TINY_EQ.make_optimizer)
    kinds = {n: "expert" if ".moe.experts." in n else "dense"
             for n in reference[0].params}
    run = _self_run(reference, kinds)
    exact = ex.summarize_equality(1, [[run]], reference, TINY_EQ.model.num_experts)
    assert exact[0].max_error == 0.0
    assert ex.equality_result(exact, TINY_EQ).claims[0].holds is True
    name = next(n for n in kinds if kinds[n] == "expert")
    run["steps"][1]["params"][name][0] += 1e-6 * float(reference[1].params[name].abs().max())
    wrong = ex.summarize_equality(1, [[run]], reference, TINY_EQ.model.num_experts)
    assert wrong[0].param_error == pytest.approx(1e-6, rel=1e-3)
    assert wrong[0].worst == f"rank0/step2/params/{name}"
    result = ex.equality_result(wrong, TINY_EQ)
    assert result.claims[0].holds is False
    assert result.tables[0].columns[:4] == ["ranks W", "EP size P", "EDP size", "steps"]


@pytest.mark.timeout(120)
def test_moda_equality_runner_on_two_ranks():
    runs = ex.moda_equality(TINY_EQ, 2, [2], timeout_s=90)
    assert [(r.world_size, r.expert_parallel_size) for r in runs] == [(2, 2)]
    assert runs[0].max_error <= ex.EQUALITY_TOLERANCE
    assert runs[0].grad_error >= 0 and runs[0].param_error >= 0


def test_bf16_vs_fp32_curves_and_their_claims(tmp_path):
    config = ex.PrecisionCurvesConfig(model=MoELMConfig(vocab_size=12, d_model=16,
                                                        num_layers=1, num_heads=2, seq_len=8,
                                                        num_experts=2, top_k=1, d_hidden=16),
                                      steps=3, batch=2, tail=2)
    curves = ex.precision_curves(config)
    assert len(curves["fp32"]) == len(curves["bf16"]) == 3
    assert curves["fp32"] != curves["bf16"]  # bf16 did change the arithmetic
    ctx = RunContext(out_dir=tmp_path, quick=True)
    result = ex.precision_result(ctx, config, curves, 0.9, 3, 10.0, 9.0, ("avx512_bf16",))
    assert result.tables[0].columns == ["precision", "first loss", "mean of last 2 losses",
                                        "step ms (median)"]
    assert (tmp_path / result.figures[0]).exists()
    speed = result.claims[1]
    assert speed.holds is None and "0.90" in speed.ours and "avx512_bf16" in speed.ours
    # bf16 10% above fp32 at the end: the gap is computed, the claim fails
    off = {"fp32": [3.0, 2.0, 1.0], "bf16": [3.0, 2.2, 1.1]}
    assert ex.loss_gap(off["fp32"], off["bf16"], 2) == pytest.approx(0.3 / 3.0)
    bad = ex.precision_result(ctx, config, off, 0.9, 3, 10.0, 9.0, ())
    assert bad.claims[0].holds is False and "10.00%" in bad.claims[0].ours
    with pytest.raises(ValueError, match="equal length"):
        ex.loss_gap([1.0, 2.0], [1.0], 1)


def _sweep(times_scale_hier: float = 1.0, swap_traffic: bool = False):
    """A sweep whose "emulated" times are the model's own: the crossovers must agree."""
    topo = ex.a2a_topology()
    sizes = list(ex.A2A_SIZES)
    traffic = {scheme: {m: closed_form_traffic(scheme, message_bytes=m, world_size=8,
                                               ranks_per_supernode=4, ranks_per_node=2)
                        for m in sizes} for scheme in ("flat", "hierarchical")}
    if swap_traffic:
        traffic = {"flat": traffic["hierarchical"], "hierarchical": traffic["flat"]}
    return {"sizes": sizes, "flat": [modelled_time("flat", topo, 8, m) for m in sizes],
            "hierarchical": [times_scale_hier * modelled_time("hierarchical", topo, 8, m)
                             for m in sizes],
            "traffic": traffic, "label": "emulated", "rounds": 1}, topo


def test_alltoall_claims_are_computed_from_the_sweep(tmp_path):
    ctx = RunContext(out_dir=tmp_path, quick=True)
    sweep, topo = _sweep()
    result = ex.alltoall_result(ctx, sweep, topo)
    crossover, fewer = result.claims
    assert crossover.holds is True and fewer.holds is True
    assert crossover.kind == "emulated" and result.tables[0].kind == "emulated"
    assert "flat ms (emulated)" in result.tables[0].columns
    assert "flat ms (modelled)" in result.tables[0].columns
    # the model's times for the measured ones: the interpolated crossover is near the model's
    assert 0.5 < result.data["measured_crossover"] / result.data["model_crossover"] < 2
    assert (tmp_path / result.figures[0]).exists()
    # hierarchical three times slower everywhere: no crossover, the claim fails
    slow, _ = _sweep(times_scale_hier=3.0)
    assert ex.alltoall_result(ctx, slow, topo).claims[0].holds is False
    swapped, _ = _sweep(swap_traffic=True)
    assert ex.alltoall_result(ctx, swapped, topo).claims[1].holds is False


VALIDATED = [ValidationRow(2, "flops_per_step", 100.0, 100.0, 1e-9, "counted"),
             ValidationRow(2, "comm_time_s", 1e-3, 1.1e-3, 0.25, "emulated")]


def test_planner_scaling_tables_and_the_174t_claim(tmp_path, monkeypatch):
    ctx = RunContext(out_dir=tmp_path, quick=True)
    # an unvalidated planner projects nothing
    wrong = [*VALIDATED, ValidationRow(4, "a2a_bytes[inter_group]", 2048.0, 1024.0, 1e-9,
                                       "counted")]
    with pytest.raises(PlannerValidationError, match="a2a_bytes"):
        ex.planner_scaling_result(ctx, wrong)
    assert ex.validation_result(wrong).claims[0].holds is False
    assert ex.validation_result(VALIDATED).claims[0].holds is True
    result = ex.planner_scaling_result(ctx, VALIDATED)
    assert all(t.kind == "analytic" and "modelled" in t.title for t in result.tables)
    by_nodes, by_size, sens = result.tables
    assert [row[0] for row in by_nodes.rows] == list(ex.SCALING_NODES)
    assert [row[0] for row in by_size.rows] == list(ex.MODEL_SIZES)
    # the calibration reproduces the anchor: 14.5T at 1 EFLOPS on 96,000 nodes
    anchor = next(row for row in by_nodes.rows if row[0] == 96_000)
    assert anchor[3] == pytest.approx(1.0, rel=1e-9)
    assert {row[0] for row in sens.rows} == {"injection bandwidth", "GEMM efficiency"}
    fits = result.claims[0]
    assert fits.holds is True and fits.kind == "analytic"
    # half the memory per core group: 174T no longer fits, and the claim says so
    real = ex.default_topology

    def smaller(injection_bandwidth_Bps=None):
        topo = real(injection_bandwidth_Bps)
        return topo.replace(device=dataclasses.replace(topo.device, memory_bytes=8e9))

    monkeypatch.setattr(ex, "default_topology", smaller)
    assert ex.planner_scaling_result(RunContext(out_dir=tmp_path, quick=True),
                                     VALIDATED).claims[0].holds is False


def test_the_shared_eight_rank_spawn_is_keyed_by_the_set(tmp_path, monkeypatch):
    """equality and alltoall get the one 8-rank run of their reproduce run, built once."""
    calls = []

    def fake(quick):
        calls.append(quick)
        return {"equality": [], "alltoall": {}}

    monkeypatch.setattr(ex, "eight_rank_runs", fake)
    ctx = RunContext(out_dir=tmp_path, quick=True)
    assert ex._eight_ranks(ctx) is ex._eight_ranks(ctx)
    assert calls == [True]
    ex._eight_ranks(RunContext(out_dir=tmp_path, quick=False))
    assert calls == [True, False]


def test_the_crossover_is_where_flat_starts_winning_for_good():
    sizes, flat = [1.0, 2.0, 4.0, 8.0], [2.0, 2.0, 2.0, 2.0]
    # hierarchical loses at size 2 (a spike) and from size 8 on: the crossover is in (4, 8)
    spiked = [1.0, 3.0, 1.0, 3.0]
    assert 4.0 < ex.last_crossover(sizes, flat, spiked) < 8.0
    assert ex.last_crossover(sizes, flat, [1.0, 1.0, 1.0, 1.0]) is None  # wins everywhere
    assert ex.last_crossover(sizes, flat, [3.0, 3.0, 3.0, 3.0]) is None  # wins nowhere


def test_balance_entry_table_and_claims(tmp_path):
    from furnace.hybrid.balance import BALANCE_COLUMNS, BalanceConfig, balance_study

    ctx = RunContext(out_dir=tmp_path, quick=True)
    config = BalanceConfig(num_experts=16, ranks=8, tokens_per_rank=32, steps=2)
    study = balance_study(config, train=False)
    result = ex.balance_result(ctx, study)
    (table,) = result.tables
    assert table.columns == list(BALANCE_COLUMNS) and len(table.rows) == 3
    assert [c.holds for c in result.claims] == [True, True]
    # a SWIPE row that dropped tokens fails the no-drop claim
    rows = [dataclasses.replace(r, dropped=3) if r.gate == "swipe" else r for r in study.rows]
    broken = dataclasses.replace(study, rows=rows)
    assert ex.balance_result(ctx, broken).claims[0].holds is False


@pytest.mark.timeout(60)
def test_memory_table_measured_against_accounted_and_a_wrong_account_fails():
    runs = ex.memory_runs(ex.MemoryConfig())
    P, tensors = runs.parameters, runs.parameter_tensors
    result = ex.memory_result(runs)
    table = result.tables[0]
    by_row = {(r[0].split(" ")[0], r[1]): r for r in table.rows}
    assert [k[1] for k in by_row] == ["analytic", "measured"] * 2 + ["analytic"]
    between = table.columns.index("total between steps B/param")
    peak = table.columns.index("peak total B/param")
    # fp32 and autocast keep 16 B/param between steps plus a 4-byte step counter per tensor;
    # autocast's bf16 matrix copies come on top; the paper's split is 16 exactly
    assert by_row["fp32", "measured"][between] == pytest.approx(16 + 4 * tensors / P, rel=1e-12)
    assert by_row["bf16", "measured"][between] == pytest.approx(16 + 4 * tensors / P, rel=1e-12)
    assert by_row["bf16", "measured"][peak] > by_row["bf16", "measured"][between]
    assert by_row["paper", "analytic"][2:peak + 1] == [2, 2, 4, 8, 0, 0, 16, 16]
    assert [c.holds for c in result.claims] == [True, True]
    assert all(c.kind == "measured" for c in result.claims)

    # an account one bf16 copy short no longer matches the storage of the real tensors
    wrong = dict(runs.accounted["bf16"], half_copies=runs.accounted["bf16"]["half_copies"] - 2)
    bad = ex.memory_result(dataclasses.replace(runs, accounted={**runs.accounted,
                                                                "bf16": wrong}))
    assert bad.claims[0].holds is False
    assert "bf16 half_copies" in bad.claims[0].ours
    # a measurement that kept bf16 gradients would no longer be the paper's 16 B between steps
    half_grads = dict(runs.measured["bf16"], fp32_grads=2 * P)
    short = ex.memory_result(dataclasses.replace(runs, measured={**runs.measured,
                                                                 "bf16": half_grads}))
    assert short.claims[0].holds is False
    assert short.claims[1].holds is False
