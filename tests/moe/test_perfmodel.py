"""FasterMoE's performance model: hand-computed latencies, the shadowing rule, the smart
schedule's recurrences, and the DDL-Roofline."""

from __future__ import annotations

import numpy as np
import pytest

from furnace.moe.perfmodel import MoEPerfModel, _pipeline
from furnace.runtime.presets import v100_50gbps


def model(**kw) -> MoEPerfModel:
    # H = 1, F = 1: one token costs 4 FLOP forward and 4 bytes to move (s = 4)
    base = {"d_model": 1, "d_hidden": 1, "flops_per_s": 4.0, "bandwidth_Bps": 4.0}
    return MoEPerfModel(**(base | kw))


def test_loads_and_baseline_latency():
    # 2 workers, 1 expert each; worker 0 sends 3 tokens to expert 1, worker 1 sends 1 to 0
    counts = np.array([[2, 3], [1, 4]])
    m = model()
    computed, out, incoming = m.loads(counts, 1)
    assert computed.tolist() == [3, 7] and out.tolist() == [3, 1] and incoming.tolist() == [1, 3]
    lat = m.step_latency(counts, 1)
    # comp_w = 3 * 4 * L_w / 4 = 3 L_w; comm_w = 4 * max(out, in) * 4 / 4 = 4 max(out, in)
    assert lat.compute_s == (9.0, 21.0) and lat.comm_s == (12.0, 12.0)
    assert lat.total == 33.0


def test_shadowing_moves_compute_to_senders():
    counts = np.array([[2, 3], [1, 4]])
    m = model()
    computed, out, incoming = m.loads(counts, 1, np.array([False, True]))
    # expert 1's tokens stay with their senders: worker 0 computes expert 0's 2 + 1 tokens
    # and its own 3 for expert 1; worker 1 only its own 4 for expert 1
    assert computed.tolist() == [6, 4] and out.tolist() == [0, 1] and incoming.tolist() == [1, 0]
    lat = m.step_latency(counts, 1, np.array([False, True]))
    # params of one expert: (2*1*1 + 1 + 1) * 4 = 16 bytes, broadcast + reduce at 4 B/s = 8 s
    # worker 0: 3 * 6 compute + 4 * 1 token moved; then the 8 s of shadow traffic
    assert lat.shadow_s == 8.0 and lat.total == 18.0 + 4.0 + 8.0


def test_policy_shadows_a_hot_expert_and_declines_on_uniform_routing():
    v100 = MoEPerfModel.from_topology(v100_50gbps(), d_model=1024, d_hidden=4096,
                                      world_size=8)
    W, tokens = 8, 8192
    hot = np.full((W, W), tokens * 0.3 / (W - 1))
    hot[:, 0] = tokens * 0.7
    mask = v100.shadow_policy(hot.round(), 1)
    assert mask.tolist() == [True] + [False] * 7
    uniform = np.full((W, W), tokens // W)
    assert not v100.shadow_policy(uniform, 1).any()
    # below the break-even (a hot expert only slightly above the rest) nothing is shadowed
    mild = uniform.copy()
    mild[:, 0] += 16
    assert not v100.shadow_policy(mild, 1).any()


def test_policy_uses_loads_per_expert_not_per_sender():
    # the FastMoE bug: summing over experts gives equal per-sender loads and never shadows
    m = model(bandwidth_Bps=0.5)
    counts = np.array([[40, 0, 0, 0], [40, 0, 0, 0], [40, 0, 0, 0], [40, 0, 0, 0]])
    assert m.shadow_policy(counts, 1).tolist() == [True, False, False, False]


def test_pipeline_recurrences():
    # sends 1,1; computes 2,2; returns 1,1 (FasterMoE A.5):
    # tS = 1, 2; tC = 3, 5; tR starts at tS[-1] = 2: tR = 4, 6
    assert _pipeline([1, 1], [2, 2], [1, 1], 0.0, 0.0) == 6.0
    # a shadow broadcast delays the returns
    assert _pipeline([1, 1], [2, 2], [1, 1], 3.0, 0.0) == 7.0
    # local shadowed compute after the steps
    assert _pipeline([1], [1], [1], 0.0, 5.0) == 7.0


def test_smart_schedule_overlaps_and_group_choice():
    m = model()
    counts = np.full((4, 4), 8)
    serial = m.step_latency(counts, 1).total
    g1 = m.smart_latency(counts, 1, 1).total
    g4 = m.smart_latency(counts, 1, 4).total
    assert g1 < serial
    assert g1 < g4
    assert m.choose_group_size(counts, 1) == 1
    # tiny GEMMs are slow: a large b_half favours fewer, bigger steps
    slow_small = m.with_(half_efficiency_tokens=1e4)
    assert slow_small.choose_group_size(counts, 1) in (2, 4)
    assert m.schedule_steps(4, 2, 3) == [[2, 3], [0, 1]]
    with pytest.raises(ValueError, match="divide"):
        m.schedule_steps(4, 3, 0)


def test_roofline():
    m = model(flops_per_s=100.0, bandwidth_Bps=10.0)
    assert m.roof(5.0) == 50.0 and m.roof(50.0) == 100.0
    assert m.serial_curve(10.0) == pytest.approx(1 / (1 / 100 + 1 / 100))
    counts = np.array([[0, 5], [5, 0]])
    # 3 * 4 * 5 FLOP over 4 * 5 * 4 bytes
    assert m.intensity(counts, 1) == pytest.approx(60 / 80)


def test_vectorised_schedule_matches_scalar_recurrence():
    # the vectorised smart_latency against _pipeline, worker by worker, on random counts
    rng = np.random.default_rng(0)
    m = model(latency_s=0.1, half_efficiency_tokens=3.0, step_overhead_s=0.05)
    counts = rng.integers(0, 20, size=(8, 16)).astype(float)
    shadow = np.zeros(16, bool)
    shadow[3] = True
    for g in (1, 2, 4, 8):
        got = m.smart_latency(counts, 2, g, shadow).total
        out, inc, mine = m.step_traffic(counts, 2, g, shadow)
        shadow_s = 2 * (m.latency_s + m.param_bytes / m.bandwidth_Bps)
        ends = []
        for w in range(8):
            links = [(m.transfer_time(max(o, i)) if max(o, i) > 0 else 0.0)
                     + m.step_overhead_s for o, i in zip(out[w], inc[w])]
            comps = [m.gemm_time(t) for t in mine[w]]
            local = m.gemm_time(counts[w, 3])
            ends.append(_pipeline(links, comps, links, shadow_s / 2, local)
                        + _pipeline(links, [2 * c for c in comps], links, shadow_s / 2,
                                    2 * local))
        assert got == pytest.approx(max(ends), rel=1e-12)
    # the traffic of step i goes to group (g + i) mod n: check one worker by hand
    out, inc, mine = m.step_traffic(counts, 2, 4, shadow)
    to_rank = (counts * ~shadow).reshape(8, 8, 2).sum(2)
    assert out[5, 1] == to_rank[5, 0:4].sum()
    assert inc[5, 0] == to_rank[4:8, 5].sum() - to_rank[5, 5]
