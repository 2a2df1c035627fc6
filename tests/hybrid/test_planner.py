"""BaGuaLu's planner (Ma et al., PPoPP'22; furnace.hybrid.planner): memory by hand count,
bytes per level in closed form, the calibration anchor, feasibility and layout validation."""

from __future__ import annotations

import math

import pytest

from furnace.hybrid.config import LayoutError, MoEModelSpec, PlanLayout, parse_param_count
from furnace.hybrid.planner import (
    PAPER_NODES,
    calibrate,
    default_topology,
    divisors,
    plan,
    search_layouts,
    spec_for_machine,
)
from furnace.runtime.cost import collective_time
from furnace.runtime.topology import divisors as runtime_divisors

# models, counts and virtual clocks: nothing here rounds differently with the thread
# count, so `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent

TINY = MoEModelSpec(num_layers=2, d_model=8, d_hidden=16, num_experts=4, top_k=2,
                    num_heads=2, seq_len=4, vocab=10, tokens_per_step=24)


def test_parameter_count_by_hand():
    # attention 4*64 + 8*8 = 320, gate 8*4 + 4 = 36, expert 2*8*16 + 16 + 8 = 280
    assert TINY.expert_params == 280
    assert TINY.replicated_params == 2 * (320 + 36) + (10 + 4 + 2) * 8
    assert TINY.total_params == 2 * (320 + 36) + 128 + 2 * 4 * 280


def test_memory_accounting_exact_on_a_tiny_spec():
    layout = PlanLayout(world_size=12, ep_size=4, shard_states=False, recompute=False)
    p = plan(TINY, layout)
    resident = TINY.replicated_params + 2 * 1 * 280  # one expert per rank per layer
    assert p.memory.params == 2 * resident
    assert p.memory.grads == 2 * resident
    assert p.memory.optimizer == 12 * resident
    assert p.memory.working == 0
    # 2 tokens per rank; per token and layer: attention 2*(6*8 + 2*4) = 112, MoE
    # 2*16 + 4*4 + 2*2*(8 + 32) = 208; fp32 logits 4*10 per token
    assert p.memory.activations == 2 * 2 * (112 + 208) + 2 * 40
    sharded = plan(TINY, PlanLayout(world_size=12, ep_size=4, shard_states=True,
                                    recompute=True))
    expected_resident = TINY.replicated_params / 12 + 2 * 280 / 3
    assert sharded.memory.params == pytest.approx(2 * expected_resident, rel=1e-12)
    assert sharded.memory.working == 4 * max(320 + 36 + 280, 128)
    assert sharded.memory.activations == 2 * 2 * 2 * 8 + 2 * (112 + 208) + 2 * 40


def test_all_to_all_bytes_per_level_equal_the_closed_form():
    # 12 ranks per EP group on nodes of 6 ranks and supernodes of 2 nodes (12 ranks)
    topo = default_topology().replace(nodes_per_group=1)
    spec = MoEModelSpec(num_layers=3, d_model=8, d_hidden=16, num_experts=12, top_k=2,
                        num_heads=2, seq_len=4, vocab=10, tokens_per_step=12 * 60)
    p = plan(spec, PlanLayout(world_size=24, ep_size=12), topo)
    picks = 60 / 2 * 2  # tokens per rank x k
    per_exchange = {"intra_node": 5, "inter_node": 0, "inter_group": 6}
    for level, peers in per_exchange.items():
        assert p.a2a_bytes[level] == 4 * 3 * picks * peers / 12 * 2 * 8, level
        messages = min(peers, math.ceil(picks * peers / 12)) if peers else 0
        assert p.a2a_messages[level] == 4 * 3 * messages, level
    assert p.a2a_level == "inter_group"


def test_calibration_reproduces_its_anchor():
    spec = spec_for_machine("14.5T", PAPER_NODES)
    cal = calibrate(spec, PAPER_NODES * 6)
    assert 0 < cal.efficiency <= 1
    assert cal.anchor.achieved_flops == pytest.approx(1e18, rel=1e-12)


def test_174t_fits_and_a_larger_model_is_reported_infeasible():
    spec = spec_for_machine("174T", PAPER_NODES)
    assert spec.total_params == pytest.approx(174e12, rel=0.01)
    found = search_layouts(spec, PAPER_NODES * 6)
    assert found.ok and found.best.memory.fits
    # the whole machine holds the 16 bytes per parameter
    assert 16 * spec.total_params < PAPER_NODES * 96e9
    too_big = search_layouts(spec_for_machine("1000T", PAPER_NODES), PAPER_NODES * 6)
    assert not too_big.ok
    assert too_big.reason.startswith("infeasible")
    assert too_big.infeasible and not too_big.infeasible[0].memory.fits
    assert too_big.infeasible[0].binding.startswith("memory")
    with pytest.raises(LayoutError, match="infeasible"):
        too_big.best  # noqa: B018 - the property raises


def test_layout_validation_errors():
    with pytest.raises(LayoutError, match="ep_size.*divide world_size"):
        PlanLayout(world_size=12, ep_size=5)
    with pytest.raises(LayoutError, match="ep_size.*<= world_size"):
        PlanLayout(world_size=4, ep_size=8)
    with pytest.raises(LayoutError, match="world_size"):
        PlanLayout(world_size=0, ep_size=1)
    with pytest.raises(LayoutError, match="num_experts"):
        PlanLayout(world_size=12, ep_size=6).validate_for(TINY)
    with pytest.raises(LayoutError, match="tokens_per_step"):
        PlanLayout(world_size=16, ep_size=4).validate_for(TINY)
    with pytest.raises(LayoutError, match="top_k"):
        MoEModelSpec(num_experts=1, top_k=2)
    with pytest.raises(ValueError, match="parameter count"):
        parse_param_count("14.5X")
    assert parse_param_count("14.5T") == 14.5e12


def test_sensitivity_recalibrates_per_bandwidth_and_scales_the_anchor():
    from furnace.hybrid.planner import (
        PAPER_NODES,
        PAPER_PARAMS,
        calibrate,
        sensitivity,
        spec_for_machine,
    )

    world = PAPER_NODES * 6
    base = calibrate(spec_for_machine(PAPER_PARAMS, PAPER_NODES), world)
    preset_bw = default_topology().inter_node.bandwidth_Bps * 6
    rows = sensitivity([("174T", PAPER_NODES)], bandwidths_Bps=[preset_bw, 4 * preset_bw],
                       efficiency_scales=[1.0, 0.5])
    by_bw = [r for r in rows if r["vary"] == "injection bandwidth"]
    by_eff = [r for r in rows if r["vary"] == "GEMM efficiency"]
    assert [r["value"] for r in by_bw] == [preset_bw, 4 * preset_bw]
    # at the preset's own bandwidth the recalibration is the calibration itself
    assert by_bw[0]["efficiency"] == pytest.approx(base.efficiency, rel=1e-12)
    # more bandwidth leaves more of the anchor's step to compute: less efficiency needed
    assert by_bw[1]["efficiency"] < by_bw[0]["efficiency"]
    assert by_bw[0]["174T@96000"] is not None and by_bw[0]["174T@96000"] > 0
    key = f"{PAPER_PARAMS}@{PAPER_NODES}"
    # the calibrated factor reproduces the anchor; halving it must slow the anchor down
    assert by_eff[0][key] == pytest.approx(1e18, rel=1e-9)
    assert by_eff[1][key] < by_eff[0][key]


def test_untied_output_projection_adds_v_h():
    untied = MoEModelSpec(**{**TINY.__dict__, "tied_embeddings": False})
    assert untied.total_params - TINY.total_params == TINY.vocab * TINY.d_model
    assert untied.replicated_params - TINY.replicated_params == TINY.vocab * TINY.d_model
    with pytest.raises(LayoutError, match="tied_embeddings"):
        MoEModelSpec(tied_embeddings=1)  # type: ignore[arg-type]


def test_element_bytes_scale_the_exchanged_and_synchronized_bytes():
    layout = PlanLayout(world_size=12, ep_size=4, shard_states=False)
    bf16 = plan(TINY, layout)
    fp32 = plan(TINY, layout, element_bytes=4)
    for level, value in bf16.a2a_bytes.items():
        assert fp32.a2a_bytes[level] == 2 * value
    assert sum(fp32.sync_bytes.values()) == pytest.approx(2 * sum(bf16.sync_bytes.values()),
                                                          rel=1e-3)
    assert fp32.a2a_messages == bf16.a2a_messages and fp32.flops_total == bf16.flops_total
    with pytest.raises(LayoutError, match="element_bytes"):
        plan(TINY, layout, element_bytes=0)


def test_ring_sync_is_one_flat_ring_over_the_world():
    layout = PlanLayout(world_size=12, ep_size=4, shard_states=False)
    topo = default_topology()
    default = plan(TINY, layout, topo)
    assert default.sync_s == plan(TINY, layout, topo, sync_algorithm="hierarchical").sync_s
    ring = plan(TINY, layout, topo, sync_algorithm="ring")
    grad_bytes = 2 * TINY.replicated_params
    expert_bytes = 2 * TINY.num_layers * (TINY.num_experts // 4) * TINY.expert_params
    # 12 ranks are 2 nodes of one supernode: the world ring and the replicas cross nodes
    expected = (collective_time("all_reduce", grad_bytes, 12, topo.inter_node)
                + collective_time("all_reduce", expert_bytes, 3, topo.inter_node))
    assert ring.sync_s == pytest.approx(expected, rel=1e-12)
    assert ring.sync_bytes["intra_node"] == 0
    # the two algorithms move the same total bytes for the world all-reduce
    assert sum(ring.sync_bytes.values()) == pytest.approx(sum(default.sync_bytes.values()),
                                                          rel=1e-3)
    with pytest.raises(LayoutError, match="sync_algorithm"):
        plan(TINY, layout, topo, sync_algorithm="tree")  # type: ignore[arg-type]


def test_divisors_is_the_runtime_helper():
    assert divisors is runtime_divisors
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
