"""Tests of the plan data model and the baseline schemes of UltraAttn's context parallelism
(`furnace.context_parallel.plan`, `.baselines`; design note §2.3 traffic terms and the
§6.4 unit table): every baseline passes `check_plan` for every mask x layout x rank count,
the statistics equal hand-counted bytes, `check_plan` refuses broken plans, and the Ulysses
closed form equals a hand count."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch

from furnace.context_parallel.baselines import (
    BASELINES,
    RING_SCHEMES,
    allgather_kv_plan,
    baseline_plans,
    needed_kv_plan,
    owner_assignment,
    ring_plan,
    ulysses_stats,
)
from furnace.context_parallel.config import LayoutError, PlanError
from furnace.context_parallel.layout import LAYOUTS, make_layout
from furnace.context_parallel.masks import (
    EMPTY,
    MASK_NAMES,
    BlockGrid,
    build_block_grid,
    causal_mask,
    document_mask,
    full_mask,
    make_mask,
    sliding_window_mask,
)
from furnace.context_parallel.plan import (
    AttentionShape,
    Kernel,
    Plan,
    Stage,
    Transfer,
    block_units,
    build_plan,
    check_plan,
)

pytestmark = pytest.mark.thread_independent

UNIT_SHAPE = AttentionShape(batch=1, num_heads=1, num_kv_heads=1, head_dim=8, dtype="float32")


@functools.cache
def _grid(name: str, seq_len: int, block_size: int) -> BlockGrid:
    if name == "document_tail":  # tokens past cu_seqlens[-1] attend nothing
        mask = document_mask([0, 20, 45, 50])
    else:
        mask = make_mask(name, seq_len)
    return build_block_grid(mask, seq_len, block_size)


def _units(plan: Plan, values: tuple[int, ...]) -> list[float]:
    return [v / block_units(plan) for v in values]


# ------------------------------------------------------------------ every baseline is valid


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seq_len", [64, 61])  # 61: a ragged last block of one token
def test_every_baseline_passes_check_plan(seq_len: int) -> None:
    checked = 0
    for name in (*MASK_NAMES, "document_tail"):
        grid = _grid(name, seq_len, 4)
        for num_ranks in (1, 2, 4, 8):
            plans = baseline_plans(grid, UNIT_SHAPE, num_ranks)
            assert set(plans) == set(BASELINES)
            for kind in LAYOUTS:
                plans[f"allgather_{kind}"] = allgather_kv_plan(grid, UNIT_SHAPE, kind,
                                                                num_ranks)
                plans[f"needed_{kind}"] = needed_kv_plan(grid, UNIT_SHAPE, kind, num_ranks,
                                                          granularity="row")
            for label, plan in plans.items():
                check_plan(plan)
                stats = plan.stats()
                assert sum(stats.work) == grid.total_work, (name, num_ranks, label)
                assert plan.num_ranks == num_ranks
                checked += 1
            # q never moves in owner-computes schemes, so there is no forward reduction
            assert all(not p.forward_reduce for p in plans.values())
    # 10 masks x 4 rank counts x (5 baselines + 6 per-layout variants); P = 16 fits all
    assert checked == 10 * 4 * 11


def test_ring_structure_is_a_ring() -> None:
    grid = _grid("causal", 64, 2)  # P = 32
    for kind in LAYOUTS:
        plan = ring_plan(grid, UNIT_SHAPE, kind, 8)
        assert plan.scheme == RING_SCHEMES[kind]
        assert len(plan.forward) == 8 and plan.backward == plan.forward
        for stage in plan.forward[1:]:
            peers = {(t.src, t.dst) for t in stage.transfers}
            assert peers == {(g, (g + 1) % 8) for g in range(8)}
            assert len(stage.transfers) == 32  # every block moves once per step
        stats = plan.stats()
        # every rank receives the 28 kv blocks of the other ranks, 2 units each
        assert _units(plan, stats.forward_in) == [56.0] * 8
        # 7 ring steps each way plus the dkv reduction
        assert stats.num_collectives == 15


# ------------------------------------------------------------------ hand-counted statistics


def test_design_note_units_causal_cp4_p16() -> None:
    """The §6.4 table (forward, units of one q block): ring 24 / 96 for any layout, and
    ring waste 50% contiguous / 25% zigzag; needed-KV zigzag 24 / 72, contiguous 24 / 48."""
    grid = _grid("causal", 64, 4)
    for kind in LAYOUTS:
        plan = ring_plan(grid, UNIT_SHAPE, kind, 4)
        stats = plan.stats()
        assert _units(plan, stats.forward_in) == [24.0] * 4
        assert stats.total_forward_bytes / block_units(plan) == 96.0
        assert stats.forward_out == stats.forward_in
    contiguous = ring_plan(grid, UNIT_SHAPE, "contiguous", 4).stats()
    zigzag = ring_plan(grid, UNIT_SHAPE, "zigzag", 4)
    # forward and backward pass the same kv, so unused = 2 x the forward waste
    assert sum(contiguous.unused_in) / block_units(zigzag) == 2 * 48
    assert sum(zigzag.stats().unused_in) / block_units(zigzag) == 2 * 24
    assert zigzag.stats().balance == 1.0 and contiguous.balance > 1.7

    needed = needed_kv_plan(grid, UNIT_SHAPE, "zigzag", 4)
    # zigzag rank g holds chunks g and 7-g; its last rows need every block before them
    assert _units(needed, needed.stats().forward_in) == [24.0, 20.0, 16.0, 12.0]
    assert needed.stats().total_forward_bytes / block_units(needed) == 72.0
    assert sum(needed.stats().unused_in) == 0
    needed_c = needed_kv_plan(grid, UNIT_SHAPE, "contiguous", 4)
    assert _units(needed_c, needed_c.stats().forward_in) == [0.0, 8.0, 16.0, 24.0]


def test_sliding_window_needs_one_block_per_rank() -> None:
    grid = build_block_grid(sliding_window_mask(4), 64, 4)  # rows need kv r-1 and r
    plan = needed_kv_plan(grid, UNIT_SHAPE, "contiguous", 4)
    stats = plan.stats()
    assert _units(plan, stats.forward_in) == [0.0, 2.0, 2.0, 2.0]
    assert len(plan.forward) == 2  # only distance-1 transfers exist
    ring = ring_plan(grid, UNIT_SHAPE, "contiguous", 4).stats()
    assert ring.max_forward_inbound / block_units(plan) == 24.0


def test_pass_q_example_by_hand() -> None:
    """2x2 full grid, 2 ranks, the owner of kv block c computes column c: q and its
    partial out (and q_bwd, dq) cross, kv never moves. Shape H=1, D=2, float64, batch 2."""
    grid = build_block_grid(full_mask(), 4, 2)
    layout = make_layout("contiguous", 2, 2)
    shape = AttentionShape(batch=2, num_heads=1, num_kv_heads=1, head_dim=2, dtype="float64")
    assignment = {(r, c): c for r in range(2) for c in range(2)}
    plan = build_plan("pass_q", grid, layout, shape, assignment)
    check_plan(plan)
    stats = plan.stats()
    tokens, batch, item = 2, 2, 8
    q = tokens * batch * 2 * item  # H*D = 2 per token
    out = tokens * batch * (2 + 1) * item  # out and lse
    q_bwd = tokens * batch * (2 * 2 + 2) * item  # q, dout, lse, delta
    dq = tokens * batch * 2 * item
    assert stats.forward_in == (q + out, q + out)
    assert stats.forward_out == (q + out, q + out)
    assert stats.backward_in == (q_bwd + dq, q_bwd + dq)
    assert stats.max_port == q + out + q_bwd + dq
    assert stats.messages == (4, 4) and stats.num_collectives == 4
    assert stats.work == (8, 8) and stats.balance == 1.0
    assert stats.unused_in == (0, 0)
    assert [t.kind for t in plan.forward[1].transfers] == ["q", "q"]
    assert {(t.src, t.dst, t.block) for t in plan.forward_reduce} == {(1, 0, 0), (0, 1, 1)}
    assert {t.kind for t in plan.backward_reduce} == {"dq"}
    # stage 0 runs the diagonal blocks on local data, stage 1 the crossed ones
    assert [(k.rank, k.q_blocks, k.kv_blocks) for k in plan.forward[0].kernels] == \
        [(0, (0,), (0,)), (1, (1,), (1,))]


def test_gqa_and_dtype_scale_the_bytes() -> None:
    grid = _grid("causal", 64, 4)
    base = ring_plan(grid, UNIT_SHAPE, "contiguous", 4).stats()
    gqa = AttentionShape(batch=3, num_heads=4, num_kv_heads=2, head_dim=8, dtype="bfloat16")
    scaled = ring_plan(grid, gqa, "contiguous", 4).stats()
    # kv per token: 2*Hkv*D*batch elements of 2 bytes vs 2*1*8*1 of 4 bytes
    factor = (2 * 2 * 8 * 3 * 2) / (2 * 1 * 8 * 1 * 4)
    assert scaled.forward_in == tuple(int(v * factor) for v in base.forward_in)
    assert gqa.token_elements("q") == 3 * 4 * 8
    assert gqa.token_elements("q_bwd") == 3 * (2 * 4 * 8 + 2 * 4)
    assert gqa.payload_bytes("out", 5) == 5 * 3 * (4 * 8 + 4) * 2


def test_row_granularity_fuses_rows_and_keeps_bytes() -> None:
    grid = _grid("global_local", 64, 4)
    assignment = owner_assignment(grid, make_layout("striped", 16, 4))
    layout = make_layout("striped", 16, 4)
    block = build_plan("x", grid, layout, UNIT_SHAPE, assignment)
    row = build_plan("x", grid, layout, UNIT_SHAPE, assignment, granularity="row")
    check_plan(row)
    assert row.stats().forward_in == block.stats().forward_in
    assert row.stats().work == block.stats().work
    assert sum(row.stats().num_kernels) < sum(block.stats().num_kernels)
    for stage in row.forward:
        keys = [(k.rank, k.q_blocks) for k in stage.kernels]
        assert len(keys) == len(set(keys))  # one kernel per (rank, row) per stage
    with pytest.raises(PlanError, match="granularity"):
        build_plan("x", grid, layout, UNIT_SHAPE, assignment, granularity="column")


def test_baseline_plans_choose_and_skip_layouts() -> None:
    grid = build_block_grid(causal_mask(), 48, 4)  # P = 12: zigzag needs 8 | P on 4 ranks
    plans = baseline_plans(grid, UNIT_SHAPE, 4)
    assert "zigzag_ring" not in plans and {"ring", "striped_ring"} <= set(plans)
    ports = {kind: needed_kv_plan(grid, UNIT_SHAPE, kind, 4).stats().max_port
             for kind in ("contiguous", "striped")}
    chosen = plans["needed_kv"]
    assert chosen.stats().max_port == min(ports.values())
    assert chosen.info["layout"] in ports and ports[str(chosen.info["layout"])] == min(
        ports.values())
    only = baseline_plans(grid, UNIT_SHAPE, 4, schemes=("ring", "zigzag_ring"))
    assert set(only) == {"ring"}  # zigzag does not apply
    with pytest.raises(PlanError, match="schemes"):
        baseline_plans(grid, UNIT_SHAPE, 4, schemes=("ulysses",))
    with pytest.raises(PlanError, match="no layout"):
        baseline_plans(build_block_grid(causal_mask(), 40, 4), UNIT_SHAPE, 4)  # P = 10
    with pytest.raises(LayoutError):
        ring_plan(grid, UNIT_SHAPE, "zigzag", 4)
    with pytest.raises(PlanError, match="num_ranks"):
        ring_plan(grid, UNIT_SHAPE, "contiguous")


# ------------------------------------------------------------------ check_plan refuses


def _replace_stage(plan: Plan, index: int, stage: Stage, backward: bool = False) -> Plan:
    stages = list(plan.backward if backward else plan.forward)
    stages[index] = stage
    field = "backward" if backward else "forward"
    return dataclasses.replace(plan, **{field: tuple(stages)})


def _refused(plan: Plan, match: str) -> None:
    with pytest.raises(PlanError, match=match) as info:
        check_plan(plan)
    assert info.value.field == "plan"


def test_check_plan_rejects_broken_plans() -> None:
    grid = _grid("causal", 64, 4)
    plan = needed_kv_plan(grid, UNIT_SHAPE, "zigzag", 4)
    check_plan(plan)
    last = plan.forward[-1]
    moved = last.kernels[0]

    # a dropped kernel: its block is computed 0 times
    _refused(_replace_stage(plan, -1, Stage(last.transfers, last.kernels[1:])), "0 times")
    # a kernel before its data arrived
    early = _replace_stage(plan, 0, Stage((), (*plan.forward[0].kernels, moved)))
    early = _replace_stage(early, -1, Stage(last.transfers, last.kernels[1:]))
    _refused(early, "does not hold")
    # a duplicated block
    _refused(_replace_stage(plan, -1, Stage(last.transfers, (*last.kernels, moved))),
             "2 times")
    # a kernel over an empty block
    empty = Kernel(rank=0, q_blocks=(0,), kv_blocks=(15,), full=False, elements=0)
    assert grid.kinds[0, 15] == EMPTY
    _refused(_replace_stage(plan, 0, Stage((), (*plan.forward[0].kernels, empty))), "empty")
    # a wrong full flag would skip the mask: a silent wrong answer
    diagonal = plan.forward[0].kernels[0]
    assert not diagonal.full
    flipped = dataclasses.replace(diagonal, full=True)
    _refused(_replace_stage(plan, 0, Stage((), (flipped, *plan.forward[0].kernels[1:]))),
             "full")
    # a transfer the sender does not hold: forwarding what arrives in the same stage
    stage1 = plan.forward[1]
    t = stage1.transfers[0]
    relay = Transfer(src=t.dst, dst=(t.dst + 1) % 4, kind="kv", block=t.block)
    assert plan.layout.owner(t.block) != relay.dst
    _refused(_replace_stage(plan, 1, Stage((*stage1.transfers, relay), stage1.kernels)),
             "does not hold")
    # a payload received twice
    _refused(_replace_stage(plan, 1, Stage((*stage1.transfers, t), stage1.kernels)), "twice")
    # a forward payload kind in the backward (q instead of q_bwd)
    b1 = plan.backward[1]
    _refused(_replace_stage(plan, 1, Stage((*b1.transfers, Transfer(0, 1, "q", 0)),
                                           b1.kernels), backward=True), "only q_bwd and kv")
    # a kernel on a rank other than the assigned one
    other = dataclasses.replace(moved, rank=(moved.rank + 1) % 4)
    _refused(_replace_stage(plan, -1, Stage(last.transfers, (other, *last.kernels[1:]))),
             "assigned to rank|does not hold")
    # ring steps out of order: step 2 forwards what arrives in step 1
    ring = ring_plan(grid, UNIT_SHAPE, "contiguous", 4)
    check_plan(ring)
    swapped = (ring.forward[0], ring.forward[2], ring.forward[1], *ring.forward[3:])
    _refused(dataclasses.replace(ring, forward=swapped), "does not hold")
    # a kernel whose element count is not the grid's
    heavier = dataclasses.replace(moved, elements=moved.elements + 1)
    _refused(_replace_stage(plan, -1, Stage(last.transfers, (heavier, *last.kernels[1:]))),
             "claims")
    # a stage with no transfers after stage 0
    _refused(dataclasses.replace(plan, forward=(*plan.forward, Stage((), ()))),
             "no transfers")


def test_check_plan_rejects_broken_reductions() -> None:
    grid = _grid("causal", 64, 4)
    assignment = {(r, c): (r + c) % 4 for r, c in grid.nonempty()}  # moves q and kv
    plan = build_plan("scatter", grid, make_layout("contiguous", 16, 4), UNIT_SHAPE,
                      assignment)
    check_plan(plan)
    assert plan.forward_reduce and {t.kind for t in plan.backward_reduce} == {"dq", "dkv"}
    _refused(dataclasses.replace(plan, forward_reduce=plan.forward_reduce[1:]), "drops")
    _refused(dataclasses.replace(plan, forward_reduce=(*plan.forward_reduce,
                                                       plan.forward_reduce[0])), "twice")
    dkv = [t for t in plan.backward_reduce if t.kind == "dkv"]
    _refused(dataclasses.replace(plan, backward_reduce=tuple(
        t for t in plan.backward_reduce if t is not dkv[0])), "drops the dkv")
    t = plan.forward_reduce[0]
    wrong_dst = Transfer(src=t.src, dst=(t.dst + 1) % 4, kind="out", block=t.block)
    if wrong_dst.dst == wrong_dst.src:
        wrong_dst = Transfer(src=t.src, dst=(t.dst + 2) % 4, kind="out", block=t.block)
    _refused(dataclasses.replace(plan, forward_reduce=(wrong_dst, *plan.forward_reduce[1:])),
             "owner")
    # a reduction of a partial nobody computed
    spare = next((g, r) for r in range(16) for g in range(4)
                 if g != plan.layout.owner(r) and all(
                     assignment.get((r, c)) != g for c in range(16)))
    extra = Transfer(src=spare[0], dst=plan.layout.owner(spare[1]), kind="out",
                     block=spare[1])
    _refused(dataclasses.replace(plan, forward_reduce=(*plan.forward_reduce, extra)),
             "computed none")


def test_build_plan_rejects_bad_assignments() -> None:
    grid = _grid("causal", 64, 4)
    layout = make_layout("contiguous", 16, 4)
    good = owner_assignment(grid, layout)
    missing = dict(good)
    del missing[(5, 2)]
    with pytest.raises(PlanError, match=r"\(5, 2\) is missing"):
        build_plan("x", grid, layout, UNIT_SHAPE, missing)
    with pytest.raises(PlanError, match="empty block"):
        build_plan("x", grid, layout, UNIT_SHAPE, {**good, (0, 9): 0})
    with pytest.raises(PlanError, match="ranks must be in"):
        build_plan("x", grid, layout, UNIT_SHAPE, {**good, (5, 2): 4})


def test_attention_shape_validation() -> None:
    with pytest.raises(PlanError, match="num_kv_heads"):
        AttentionShape(num_heads=4, num_kv_heads=3)
    with pytest.raises(PlanError, match="dtype"):
        AttentionShape(dtype="int8")
    with pytest.raises(PlanError, match="head_dim"):
        AttentionShape(head_dim=0)
    with pytest.raises(PlanError, match="batch"):
        AttentionShape(batch=True)
    with pytest.raises(PlanError, match="kind"):
        UNIT_SHAPE.token_elements("k")
    q = torch.zeros(2, 4, 5, 8, dtype=torch.float64)
    k = torch.zeros(2, 2, 5, 8, dtype=torch.float64)
    assert AttentionShape.from_tensors(q, k) == AttentionShape(2, 4, 2, 8, "float64")


# ------------------------------------------------------------------ Ulysses closed form


def test_ulysses_stats_by_hand() -> None:
    shape = AttentionShape(batch=1, num_heads=4, num_kv_heads=2, head_dim=8, dtype="float32")
    grid = _grid("causal", 64, 8)
    stats = ulysses_stats(grid, shape, 2)
    assert stats is not None
    # rank 0 keeps heads {0,1} (kv head 0): it receives rank 1's 32 tokens of q (2 heads),
    # k and v (1 head each), and gets its own 32 tokens of out for rank 1's 2 heads back;
    # 8 dims of 4 bytes per token and head
    per = 8 * 4
    assert stats.forward_in == (32 * (2 + 1 + 1) * per + 32 * 2 * per,) * 2
    assert stats.forward_out == stats.forward_in
    # backward: dout in like q (2 heads); dq, dk, dv back for my tokens (2 + 1 + 1 heads)
    assert stats.backward_in == (32 * 2 * per + 32 * (2 + 1 + 1) * per,) * 2
    assert stats.messages == (8, 8) and stats.num_collectives == 8
    assert stats.work == (grid.total_work / 2,) * 2 and stats.balance == 1.0
    assert stats.max_port == 2 * (32 * 4 * per + 32 * 2 * per)
    assert ulysses_stats(grid, shape, 4) is None  # 4 ranks do not divide 2 kv heads
    one = ulysses_stats(grid, shape, 1)
    assert one is not None and one.total_bytes == 0 and one.num_collectives == 0

    # ragged: 61 tokens in 16 blocks of 4 (the last of 1); zigzag rank 0 holds chunks 0 and
    # 3 (blocks 0-3, 12-15: 29 tokens), rank 1 the 32 tokens of blocks 4-11
    ragged = _grid("causal", 61, 4)
    layout = make_layout("zigzag", 16, 2)
    r_stats = ulysses_stats(ragged, shape, 2, layout=layout)
    assert r_stats is not None
    assert r_stats.forward_in == (32 * 4 * per + 29 * 2 * per, 29 * 4 * per + 32 * 2 * per)
    assert r_stats.forward_out == (29 * 4 * per + 32 * 2 * per, 32 * 4 * per + 29 * 2 * per)
    with pytest.raises(PlanError, match="layout"):
        ulysses_stats(ragged, shape, 2, layout=make_layout("zigzag", 16, 4))


def test_owner_assignment_and_kernels_of() -> None:
    grid = _grid("star", 64, 4)
    layout = make_layout("striped", 16, 4)
    assignment = owner_assignment(grid, layout)
    assert set(assignment) == set(grid.nonempty())
    assert all(g == layout.owner(r) for (r, _), g in assignment.items())
    plan = needed_kv_plan(grid, UNIT_SHAPE, "striped", 4)
    for rank in range(4):
        kernels = plan.kernels_of(rank)
        assert sum(k.elements for k in kernels) == plan.stats().work[rank]
        assert all(k.rank == rank for k in kernels)
    counts = np.zeros(4, dtype=np.int64)
    for (_, dst), nbytes in plan.message_bytes(plan.forward[1].transfers).items():
        counts[dst] += nbytes
    assert counts.sum() > 0


def test_single_staging_puts_every_transfer_in_one_exchange():
    """`staging="single"`: the same assignment and bytes as the distance-staged plan, in one
    exchange per pass (plus the reductions), and still a valid plan."""
    grid = build_block_grid(make_mask("causal", 64), 64, 4)
    layout = make_layout("zigzag", grid.num_blocks, 4)
    assignment = {block: (block[0] + block[1]) % 4 for block in grid.nonempty()}
    shape = AttentionShape(num_heads=2, num_kv_heads=1, head_dim=8)
    staged = build_plan("t", grid, layout, shape, assignment)
    single = build_plan("t", grid, layout, shape, assignment, staging="single")
    check_plan(single)
    assert len(single.forward) == 2 and len(single.backward) == 2
    assert len(staged.forward) > 2
    assert single.stats().forward_in == staged.stats().forward_in
    assert single.stats().backward_out == staged.stats().backward_out
    assert single.stats().num_collectives == 4 < staged.stats().num_collectives
    with pytest.raises(PlanError):
        build_plan("t", grid, layout, shape, assignment, staging="ring")
