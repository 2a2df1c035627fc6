"""The planner against emulated MoDa steps at W = 2, 4, 8 (`furnace.hybrid.validation`).

One spawned job of 8 gloo ranks runs the three worlds (2 = 1x1x2, 4 = 2x1x2, 8 = 2x2x2
supernodes x nodes x ranks, virtual clock); every validated quantity must be within its
tolerance (counts exact, communication time 25%), and a planner told the wrong link
bandwidth must be caught by `assert_validated`. The single-process checks (the spec
against the LM, FLOPs on one rank, routing, row semantics) need no ranks.
"""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest
import torch

from furnace.hybrid.config import PlanLayout
from furnace.hybrid.naive import lm_loss
from furnace.hybrid.planner import plan
from furnace.hybrid.validation import (
    EmulatedStep,
    PlannerValidationError,
    UniformRoutingGate,
    ValidationConfig,
    ValidationRow,
    assert_validated,
    build_lm,
    compare_with_planner,
    emulate_steps,
    flop_counter,
    format_rows,
    spec_for,
)

# models, counts and virtual clocks: nothing here rounds differently with the thread
# count, so `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent

CONFIG = ValidationConfig(timeout_s=150.0)


@cache
def emulated() -> tuple[EmulatedStep, ...]:
    return tuple(emulate_steps(CONFIG))


def test_spec_reconstruction_counts_the_lm_exactly():
    model = build_lm(CONFIG)
    spec = spec_for(CONFIG, 1)
    assert spec.total_params == sum(p.numel() for p in model.parameters())
    # the spec's default ties the output projection: exactly V H fewer
    tied = dataclasses.replace(spec, tied_embeddings=True)
    assert spec.total_params - tied.total_params == CONFIG.vocab * CONFIG.d_model


def test_flops_of_one_process_step_equal_the_planner():
    model = build_lm(CONFIG)
    seq = torch.randint(0, CONFIG.vocab, (CONFIG.rows_per_rank, CONFIG.seq_len + 1),
                        generator=torch.Generator().manual_seed(0))
    with flop_counter() as counter:
        lm_loss(model, (seq[:, :-1], seq[:, 1:])).backward()
    p = plan(spec_for(CONFIG, 1), PlanLayout(world_size=1, ep_size=1, shard_states=False,
                                             recompute=False))
    assert counter.get_total_flops() == p.flops_total


def test_uniform_routing_sends_every_expert_the_same_rows():
    gate = UniformRoutingGate(8, 8, 2)
    out = gate(torch.randn(8, 8))
    counts = torch.bincount(out.expert_ids_TK.reshape(-1), minlength=8)
    assert counts.tolist() == [2] * 8
    assert (out.expert_ids_TK[:, 0] != out.expert_ids_TK[:, 1]).all()
    torch.testing.assert_close(out.scores_TK.sum(-1), torch.ones(8))


def test_row_tolerance_and_assert_validated_semantics():
    good = ValidationRow(2, "x", 100.0, 120.0, 0.25, "emulated")
    bad = ValidationRow(2, "comm_time_s", 100.0, 130.0, 0.25, "emulated")
    assert good.ok and not bad.ok and bad.ratio == pytest.approx(1.3)
    assert ValidationRow(2, "bytes", 0.0, 0.0, 0.0, "counted").ok
    assert not ValidationRow(2, "bytes", 0.0, 1.0, 0.0, "counted").ok
    assert_validated([good])
    with pytest.raises(PlannerValidationError, match="W=2 comm_time_s"):
        assert_validated([good, bad])
    with pytest.raises(PlannerValidationError, match="nothing was checked"):
        assert_validated([])


@pytest.mark.timeout(200)
def test_every_quantity_validates_at_2_4_8_ranks():
    rows = compare_with_planner(CONFIG, list(emulated()))
    assert_validated(rows)
    by_world = {w: {r.quantity: r for r in rows if r.world_size == w}
                for w in CONFIG.world_sizes}
    common = {"total_params", "flops_per_step", "comm_time_s", "memory_params_bytes",
              "memory_grads_bytes", "memory_optimizer_bytes"}
    for w, quantities in by_world.items():
        assert common <= set(quantities), (w, sorted(quantities))
        assert quantities["comm_time_s"].label == "emulated"
        assert quantities["flops_per_step"].label == "counted"
        # counted quantities agree exactly; only time has a tolerance
        for q, r in quantities.items():
            if r.label == "counted":
                assert r.measured == r.modelled, (w, q)
    # the levels each world's all-to-all crosses (rank 0's view)
    assert {q for q in by_world[2] if q.startswith("a2a_bytes")} == {"a2a_bytes[intra_node]"}
    assert {q for q in by_world[4] if q.startswith("a2a_bytes")} == {
        "a2a_bytes[intra_node]", "a2a_bytes[inter_group]"}
    assert {q for q in by_world[8] if q.startswith("a2a_bytes")} == {
        "a2a_bytes[intra_node]", "a2a_bytes[inter_node]", "a2a_bytes[inter_group]"}
    assert "sync_bytes[inter_group]" in by_world[8]
    assert "comm_time_s" in format_rows(rows)


@pytest.mark.timeout(200)
def test_a_wrong_link_bandwidth_is_caught():
    wrong = dataclasses.replace(CONFIG, planner_bandwidth_scale=0.5)
    rows = compare_with_planner(wrong, list(emulated()))
    with pytest.raises(PlannerValidationError, match="comm_time_s"):
        assert_validated(rows)
    # the counts do not depend on the links: only the time rows fail
    assert {r.quantity for r in rows if not r.ok} == {"comm_time_s"}
