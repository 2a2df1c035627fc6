"""Tests of UltraAttn's context tiling (`furnace.context_parallel.context_tiling`; design note
§2.1-§2.4): the traffic model against the plans' own byte counts, the ILP against brute
force over every assignment of tiny instances, the greedy against the ILP, the planner
against every baseline, the evidence of design note §6.4 at 4 ranks (and balance at 8),
the hierarchical tiling, the time estimate against a per-message loop, and the choice of
the number of blocks."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from furnace.context_parallel.baselines import baseline_plans
from furnace.context_parallel.config import PlanError
from furnace.context_parallel.context_tiling import (
    TilingConfig,
    TilingProblem,
    choose_num_blocks,
    degree_of_imbalance,
    estimate_time,
    greedy_assignment,
    hierarchical_tiling,
    ilp_assignment,
    ilp_gap,
    plan_attention,
    problem_traffic,
    tile2d_greedy,
    tile2d_ilp,
    tiling_problem,
)
from furnace.context_parallel.layout import make_layout
from furnace.context_parallel.masks import (
    MASK_NAMES,
    build_block_grid,
    causal_mask,
    full_mask,
    make_mask,
    sampled_block_grid,
)
from furnace.context_parallel.plan import AttentionShape, block_units, build_plan, check_plan
from furnace.runtime.cost import direct_exchange_time
from furnace.runtime.presets import h100_ib

pytestmark = pytest.mark.thread_independent

# small time limits keep the suite fast; the thresholds below hold with them
FAST = TilingConfig(time_limit_s=0.3, greedy_time_s=0.1)
# the evidence regime: P = 16 blocks of 2048 tokens (fp32, one head of 64) on one H100 node
# (the default topology), where bytes and the busiest rank's compute both show in the
# estimate; with 256-token blocks the per-message latency decides instead and the one-stage
# all-gather of K/V wins on causal
EVIDENCE_SEQ_LEN = 32768
EVIDENCE_BLOCKS = 16


def _problem(rows: list[int], cols: list[int], work: list[int], owners: list[int],
             num_ranks: int, *, cap: int, pins: list[int] | None = None,
             external_weight: float = 1.0, seed: int = 0) -> TilingProblem:
    rng = np.random.default_rng(seed)
    p = len(owners)
    return TilingProblem(
        rows=np.array(rows, dtype=np.int64), cols=np.array(cols, dtype=np.int64),
        work=np.array(work, dtype=np.int64), owners=np.array(owners, dtype=np.int64),
        num_ranks=num_ranks, row_to=rng.uniform(0.5, 2.0, p), row_from=rng.uniform(0.5, 2.0, p),
        col_to=rng.uniform(0.5, 3.0, p), col_from=rng.uniform(0.0, 2.0, p), work_cap=cap,
        pinned=np.array(pins if pins is not None else [-1] * len(rows), dtype=np.int64),
        external_weight=external_weight)


def _traffic_by_loops(problem: TilingProblem, assign: np.ndarray) -> tuple[list[float],
                                                                          list[float]]:
    """§2.3 from its definition: every (rank, row) and (rank, column) need, one at a time."""
    inbound = [0.0] * problem.num_ranks
    outbound = [0.0] * problem.num_ranks
    needs = set()
    for t, g in enumerate(assign.tolist()):
        needs.add(("row", g, int(problem.rows[t])))
        needs.add(("col", g, int(problem.cols[t])))
    for kind, g, i in needs:
        to, back = ((problem.row_to, problem.row_from) if kind == "row"
                    else (problem.col_to, problem.col_from))
        owner = int(problem.owners[i])
        if owner == g:
            continue
        weight = problem.external_weight if owner < 0 else 1.0
        inbound[g] += to[i] * weight
        outbound[g] += back[i] * weight
        if owner >= 0:
            outbound[owner] += to[i]
            inbound[owner] += back[i]
    return inbound, outbound


def _brute_force(problem: TilingProblem) -> float:
    best = math.inf
    for combo in itertools.product(range(problem.num_ranks), repeat=problem.num_tiles):
        assign = np.array(combo, dtype=np.int64)
        if not problem.meets_cap(assign) or not problem.honours_pins(assign):
            continue
        inbound, outbound = _traffic_by_loops(problem, assign)
        best = min(best, max(max(inbound), max(outbound)))
    return best


TINY = [
    # (rows, cols, work, owners, ranks, cap, pins, external weight)
    ([0, 1, 1, 2, 2, 2], [0, 0, 1, 0, 1, 2], [3, 4, 3, 4, 4, 3], [0, 1, 2], 3, 8, None, 1.0),
    ([0, 1, 1, 2, 2, 3, 3], [0, 0, 1, 1, 2, 0, 3], [2, 4, 2, 4, 2, 4, 2], [0, 0, 1, 1], 2, 12,
     [0, -1, 0, -1, -1, -1, 1], 1.0),
    ([0, 0, 1, 1, 2, 3, 3], [0, 3, 1, 2, 2, 0, 3], [5, 1, 5, 2, 5, 3, 5], [0, 1, 2, 0], 3, 10,
     None, 1.0),
    # a node's share: block 3 is held outside the group and costs 4x
    ([0, 1, 2, 3, 3, 3], [0, 1, 2, 0, 1, 3], [1, 1, 1, 2, 2, 2], [0, 1, 0, -1], 2, 5, None, 4.0),
]


@pytest.mark.parametrize("case", range(len(TINY)))
def test_ilp_optimum_equals_brute_force(case: int) -> None:
    rows, cols, work, owners, ranks, cap, pins, weight = TINY[case]
    problem = _problem(rows, cols, work, owners, ranks, cap=cap, pins=pins,
                       external_weight=weight, seed=case)
    expected = _brute_force(problem)
    assign, status, _ = ilp_assignment(problem, time_limit_s=5.0, mip_rel_gap=0.0)
    assert status == "optimal" and assign is not None
    assert problem.meets_cap(assign) and problem.honours_pins(assign)
    inbound, outbound = _traffic_by_loops(problem, assign)
    assert problem.objective(assign) == pytest.approx(max(max(inbound), max(outbound)),
                                                      rel=1e-12)
    assert problem.objective(assign) == pytest.approx(expected, rel=1e-9)
    # nothing strictly better exists: the cutoff below the optimum is infeasible
    _, below, _ = ilp_assignment(problem, time_limit_s=5.0, cutoff=expected - 1e-3)
    assert below == "infeasible"
    greedy = greedy_assignment(problem, time_s=0.05)
    assert problem.meets_cap(greedy) and problem.honours_pins(greedy)
    assert problem.objective(greedy) >= expected - 1e-9


def test_traffic_model_equals_plan_bytes() -> None:
    """The ILP's units times a q block's bytes are the plan's bottleneck bytes, for random
    assignments, GQA, batch, fp64 and a ragged last block, forward and fwd+bwd."""
    seq_len, num_blocks, ranks = 123, 8, 4
    grid = build_block_grid(make_mask("strided", seq_len), seq_len, -(-seq_len // num_blocks))
    shape = AttentionShape(batch=2, num_heads=4, num_kv_heads=2, head_dim=8, dtype="float64")
    rng = np.random.default_rng(0)
    for kind in ("contiguous", "zigzag"):
        layout = make_layout(kind, num_blocks, ranks)
        for backward in (True, False):
            problem = tiling_problem(grid, layout, shape, TilingConfig(backward=backward))
            for _ in range(3):
                assign = rng.integers(0, ranks, problem.num_tiles)
                plan = build_plan("random", grid, layout, shape, dict(zip(
                    zip(problem.rows.tolist(), problem.cols.tolist()), assign.tolist())))
                stats = plan.stats()
                inbound, outbound = problem_traffic(problem, assign)
                port = stats.max_port if backward else stats.max_forward_port
                assert problem.objective(assign) * block_units(plan) == pytest.approx(port)
                if backward:
                    assert inbound.max() * block_units(plan) == pytest.approx(
                        stats.max_inbound)
                else:
                    assert inbound.max() * block_units(plan) == pytest.approx(
                        stats.max_forward_inbound)
                    assert outbound.max() * block_units(plan) == pytest.approx(
                        max(stats.forward_out))


@pytest.mark.parametrize(("name", "kind", "num_ranks"), [("causal", "contiguous", 2),
                                                        ("causal", "zigzag", 2),
                                                        ("global_local", "contiguous", 4)])
def test_greedy_feasible_and_near_the_ilp(name: str, kind: str, num_ranks: int) -> None:
    grid = build_block_grid(make_mask(name, 256), 256, 32)
    shape = AttentionShape()
    layout = make_layout(kind, 8, num_ranks)
    config = TilingConfig(time_limit_s=5.0, greedy_time_s=0.1)
    gap = ilp_gap(grid, layout, shape, config)
    assert gap["ilp_status"] == "optimal", gap
    assert 1.0 - 1e-9 <= float(gap["gap"]) <= 1.5, gap  # type: ignore[arg-type]
    greedy = tile2d_greedy(grid, layout, shape, config)
    assert greedy.status == "heuristic"
    plan = build_plan("tiled_greedy", grid, layout, shape, greedy.assignment)
    check_plan(plan)
    assert plan.stats().max_work <= greedy.work_cap
    if num_ranks == 2:
        exact = tile2d_ilp(grid, layout, shape, config)
        assert exact.status == "optimal"
        assert exact.objective == pytest.approx(float(gap["ilp"]))  # type: ignore[arg-type]


def test_infeasible_cap_gives_no_tiling() -> None:
    # eight documents on 8 ranks: every rank's two pinned diagonal blocks already exceed a
    # 5% cap, so neither solver may return a tiling
    grid = build_block_grid(make_mask("document", 1024), 1024, 64)
    layout = make_layout("contiguous", 16, 8)
    for tiler in (tile2d_ilp, tile2d_greedy):
        result = tiler(grid, layout, AttentionShape(), FAST)
        assert result.status == "infeasible" and not result.assignment
        assert not result.feasible


@pytest.mark.parametrize("num_ranks", [2, 4])
def test_plan_attention_never_worse_than_a_baseline(num_ranks: int) -> None:
    seq_len, num_blocks = 256, 8
    shape = AttentionShape(num_heads=2, num_kv_heads=1, head_dim=16)
    config = TilingConfig(time_limit_s=0.05, greedy_time_s=0.01)
    for name in MASK_NAMES:
        grid = build_block_grid(make_mask(name, seq_len), seq_len, seq_len // num_blocks)
        plan = plan_attention(grid, num_ranks, shape, config=config)
        check_plan(plan)
        estimate = estimate_time(plan)
        assert plan.info["estimate_s"] == pytest.approx(estimate)
        for base in baseline_plans(grid, shape, num_ranks).values():
            assert estimate <= estimate_time(base) * (1 + 1e-12), (name, base.scheme)
        schemes = {c["scheme"] for c in plan.info["candidates"]}  # type: ignore[attr-defined]
        assert "tiled_ilp" in schemes and "ring" in schemes


def _evidence_plan(name: str, num_ranks: int, config: TilingConfig) -> tuple[object, dict]:
    grid = sampled_block_grid(make_mask(name, EVIDENCE_SEQ_LEN), EVIDENCE_SEQ_LEN,
                              EVIDENCE_SEQ_LEN // EVIDENCE_BLOCKS)
    plan = plan_attention(grid, num_ranks, AttentionShape(), config=config)
    candidates = plan.info["candidates"]
    ring = next(c for c in candidates if c["scheme"] == "ring")  # type: ignore[attr-defined]
    return plan, ring


@pytest.mark.parametrize(("name", "target", "forward_target"),
                         [("causal", 0.75, 0.8), ("strided", 1 / 3, 1 / 3 + 4 / 64 / 24),
                          ("global_local", 1 / 3, 1 / 3), ("document", 1 / 3, 1 / 3)])
def test_evidence_at_4_ranks(name: str, target: float, forward_target: float) -> None:
    """The issue's targets for the chosen plan's busiest receiver against ring's, fwd+bwd;
    the forward figure of the same (fwd+bwd-optimised) plan meets them too except where
    noted: strided moves 8 units (ring's 24 / 3) plus the lse of the 4 q rows whose
    partial outputs return (1/64 unit each), and causal's forward is a by-product of the
    fwd+bwd objective that a 0.3 s search leaves near 0.75, not under it."""
    plan, ring = _evidence_plan(name, 4, FAST)
    stats = plan.stats()  # type: ignore[attr-defined]
    assert plan.scheme.startswith("tiled")  # type: ignore[attr-defined]
    assert stats.max_inbound / ring["max_inbound"] <= target
    assert stats.max_forward_inbound / ring["max_forward_inbound"] <= forward_target
    assert stats.balance <= 1.1


@pytest.mark.parametrize("name", ["sliding_window", "document", "random"])
def test_balance_at_8_ranks(name: str) -> None:
    """The masks whose 16 blocks cannot meet a 5% cap with pinned diagonals on 8 ranks:
    the relaxations still give a plan within 10% of balance."""
    plan, _ = _evidence_plan(name, 8, TilingConfig(time_limit_s=0.15, greedy_time_s=0.05))
    assert plan.stats().balance <= 1.1  # type: ignore[attr-defined]


def test_hierarchical_two_nodes_of_two() -> None:
    grid = build_block_grid(make_mask("causal", 256), 256, 32)
    shape = AttentionShape()
    layout = make_layout("contiguous", 8, 4)
    topology = h100_ib(gpus_per_node=2)
    result = hierarchical_tiling(grid, layout, shape, ranks_per_node=2, config=FAST,
                                 topology=topology)
    assert result.feasible and result.info["levels"] == 2
    plan = build_plan("tiled_hierarchical", grid, layout, shape, result.assignment)
    check_plan(plan)
    # the node level within half of tau, every device within the flat cap
    assert plan.stats().max_work <= result.work_cap
    assert result.work_cap == tiling_problem(grid, layout, shape, FAST).work_cap
    chosen = plan_attention(grid, 4, shape, config=FAST, layouts=("contiguous",),
                            ranks_per_node=2, topology=topology)
    check_plan(chosen)
    schemes = {c["scheme"] for c in chosen.info["candidates"]}  # type: ignore[attr-defined]
    assert {"tiled_hierarchical", "tiled_ilp"} <= schemes
    with pytest.raises(PlanError) as err:
        hierarchical_tiling(grid, layout, shape, ranks_per_node=3)
    assert err.value.field == "ranks_per_node"


def test_estimate_equals_a_loop_over_messages() -> None:
    grid = build_block_grid(make_mask("global_local", 200), 200, 25)
    shape = AttentionShape(num_heads=2, head_dim=8)
    topology = h100_ib(gpus_per_node=2)
    for plan in baseline_plans(grid, shape, 4).values():
        expected = 0.0
        for stages, reduce in ((plan.forward, plan.forward_reduce),
                               (plan.backward, plan.backward_reduce)):
            for transfers in [s.transfers for s in stages] + [reduce]:
                if not transfers:
                    continue
                per_rank: dict[int, dict[str, list[float]]] = {}
                for (src, dst), nbytes in plan.message_bytes(transfers).items():
                    level = topology.level(src, dst)
                    per_rank.setdefault(src, {}).setdefault(level, [0.0, 0.0])[0] += nbytes
                    per_rank.setdefault(dst, {}).setdefault(level, [0.0, 0.0])[1] += nbytes
                expected += max(direct_exchange_time(
                    [(topology.link_for(lv), s, r) for lv, (s, r) in levels.items()],  # type: ignore[arg-type]
                    steps=1) for levels in per_rank.values())
        work = max(plan.stats().work)
        expected += topology.device.compute_time(4.0 * work * 2 * 8 * 3.5, "float32")
        assert estimate_time(plan, topology) == pytest.approx(expected, rel=1e-12)


def test_choose_num_blocks() -> None:
    # full: COMP = P^2 blocks, an integer share at the first candidate, 2 * CP
    assert choose_num_blocks(full_mask(), 1024, 4) == 8
    # causal at P = 8: COMP = 32.03 full blocks, 8.008 a rank, DLI 12%; at P = 16, 3%
    grid = build_block_grid(causal_mask(), 1024, 128)
    assert degree_of_imbalance(grid, 4) == pytest.approx(9 / (grid.total_work / 128**2 / 4)
                                                         - 1)
    assert degree_of_imbalance(grid, 4) > 0.05
    assert choose_num_blocks(causal_mask(), 1024, 4) == 16
    assert choose_num_blocks(causal_mask(), 1024, 4, theta=0.2) == 8
    with pytest.raises(PlanError) as err:
        choose_num_blocks(causal_mask(), 1024, 4, candidates=[8], theta=0.01)
    assert err.value.field == "theta"


@pytest.mark.parametrize(("field", "value"), [("time_limit_s", 0.0), ("balance_tolerance", -0.1),
                                              ("mip_rel_gap", 1.0), ("backward", 1),
                                              ("max_ilp_size", -1), ("greedy_time_s", math.nan)])
def test_config_is_validated(field: str, value: object) -> None:
    with pytest.raises(PlanError) as err:
        TilingConfig(**{field: value})  # type: ignore[arg-type]
    assert err.value.field == field


def test_plan_attention_refuses_bad_arguments() -> None:
    grid = build_block_grid(causal_mask(), 64, 8)
    for kwargs, field in (({"layouts": ("diagonal",)}, "layouts"),
                          ({"granularity": "tile"}, "granularity"),
                          ({"ranks_per_node": 3}, "ranks_per_node")):
        with pytest.raises(PlanError) as err:
            plan_attention(grid, 4, AttentionShape(), **kwargs)  # type: ignore[arg-type]
        assert err.value.field == field
