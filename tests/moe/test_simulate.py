"""The discrete-event step simulator: against the analytic model, hand-computed cases, and
its policy decisions."""

from __future__ import annotations

import numpy as np
import pytest

from furnace.moe.perfmodel import MoEPerfModel
from furnace.moe.simulate import (
    Policy,
    capacity_counts,
    choose_policy,
    simulate_policies,
    simulate_step,
    synthetic_counts,
)
from furnace.moe.workload import hot_expert

from .test_perfmodel import pin_counts, pin_models, pin_shadow

# models, counts and virtual clocks: nothing here rounds differently with the thread
# count, so `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent


def model(**kw) -> MoEPerfModel:
    base = {"d_model": 1, "d_hidden": 1, "flops_per_s": 4.0, "bandwidth_Bps": 4.0}
    return MoEPerfModel(**(base | kw))


def test_baseline_two_workers_by_hand():
    # worker 0 keeps 2 tokens and sends 3 to worker 1; worker 1 keeps 4 and sends 1
    counts = np.array([[2, 3], [1, 4]])
    m = model()
    t = simulate_step(counts, m, 1, Policy("baseline", np.zeros(2, bool), 2))
    # fwd: exchange max(3, 1) = 3 tokens (3 s), compute worker 1's 7 tokens (7 s), return
    # (3 s); bwd: 3 + 14 + 3. Total 33 s, as the analytic model (test_perfmodel) says.
    assert t.makespan == pytest.approx(33.0)
    assert t.makespan == pytest.approx(m.step_latency(counts, 1).total)
    path = [s.name for s in t.critical_path()]
    assert "fwd.C0.w1" in path and "bwd.C0.w1" in path


def test_simulator_matches_analytic_baseline_without_latency():
    m = model(flops_per_s=1e3, bandwidth_Bps=1e2)
    rng = np.random.default_rng(1)
    for _ in range(5):
        counts = rng.integers(0, 50, size=(4, 8))
        t = simulate_step(counts, m, 2, Policy("baseline", np.zeros(8, bool), 4))
        # with one step, no overlap is possible: compute and traffic of the slowest add up,
        # except that the simulator lets a worker's own exchange end with the collective
        assert t.makespan >= m.step_latency(counts, 2).total - 1e-9


def test_smart_schedule_overlaps_in_the_simulator():
    m = model()
    counts = np.full((4, 4), 8)
    serial = simulate_step(counts, m, 1, Policy("b", np.zeros(4, bool), 4)).makespan
    piped = simulate_step(counts, m, 1, Policy("s", np.zeros(4, bool), 1)).makespan
    assert piped < serial
    trace = simulate_step(counts, m, 1, Policy("s", np.zeros(4, bool), 1)).to_chrome_trace()
    assert any(e.get("name") == "fwd.C3.w0" for e in trace["traceEvents"])


def test_shadowing_removes_the_hot_spot():
    m = model(bandwidth_Bps=1.0)
    counts = synthetic_counts(4, 1, 100, hot_expert(4, 0.7))
    sims = simulate_policies(counts, m, 1)
    # the hot expert is among the shadowed (parameters of 16 bytes are cheap enough here
    # that shadowing all four is what T_base prefers)
    assert choose_policy("shadow", m, counts, 1).shadow_N[0]
    assert sims["shadow"].shadowed >= 1
    assert sims["shadow"].step_s < sims["baseline"].step_s
    assert sims["both"].step_s <= min(sims["shadow"].step_s, sims["smart"].step_s) + 1e-12


def test_host_cores_model_shares_compute():
    m = model()
    counts = np.full((4, 4), 10)
    own = simulate_step(counts, m, 1, Policy("b", np.zeros(4, bool), 4)).makespan
    shared = simulate_step(counts, m, 1, Policy("b", np.zeros(4, bool), 4), host_cores=1,
                           host_flops_per_s=4.0).makespan
    # four workers' equal compute queue on one core: strictly longer
    assert shared > own


def test_counts_and_capacity():
    counts = synthetic_counts(2, 2, 10, np.array([0.55, 0.25, 0.15, 0.05]))
    assert counts.shape == (2, 4) and (counts.sum(1) == 10).all()
    kept, dropped = capacity_counts(np.array([[8.0, 2.0], [6.0, 4.0]]), 1.0, 10)
    # capacity ceil(1.0 * 10 / 2) = 5 per expert and worker
    assert kept.tolist() == [[5, 2], [5, 4]] and dropped == pytest.approx(4 / 20)
    with pytest.raises(ValueError, match="probabilities"):
        synthetic_counts(2, 2, 10, np.ones(3) / 3)
    with pytest.raises(ValueError, match="unknown policy"):
        choose_policy("fast", model(), counts, 2)
    sims = simulate_policies(counts, model(), 2, capacity_factor=1.0, tokens_per_rank=10)
    assert "gshard-capacity" in sims and sims["gshard-capacity"].dropped > 0


def test_validation_fits_the_rate_to_the_baseline_and_predicts_the_rest():
    # a synthetic "emulated" run whose rounds are the simulator's own times at a known
    # one-thread rate, +-1% of round-to-round noise: the rate fitted to each round's
    # baseline must predict every other policy's median, while a rate probed 30% too
    # high predicts the baseline too fast
    from furnace.moe.bench import BenchResult, PolicyResult
    from furnace.moe.config import BenchConfig
    from furnace.moe.experiments import _cores, validate_run

    W, T = 4, 400
    cfg = BenchConfig(world_size=W, d_model=8, d_hidden=16, tokens_per_rank=T, steps=3)
    perf = MoEPerfModel(d_model=8, d_hidden=16, flops_per_s=1e9, bandwidth_Bps=1e6,
                        latency_s=1e-4, step_overhead_s=1e-4)
    counts = synthetic_counts(W, 1, T, hot_expert(W, 0.6))
    rate = 2e7
    results = {}
    for name in ("baseline", "shadow", "smart", "both"):
        policy = choose_policy(name, perf, counts, 1)
        t = simulate_step(counts, perf, 1, policy, host_cores=_cores(),
                          host_flops_per_s=rate).makespan
        results[name] = PolicyResult(
            policy=name, step_s=t, step_times=[1.01 * t, t, 0.99 * t], cpu_s=0.0,
            bytes_sent=[0] * W, bytes_received=[0] * W, messages=[0] * W,
            tokens_computed=[0] * W, load_max_over_mean=1.0,
            shadowed=[int(e) for e in np.flatnonzero(policy.shadow_N)],
            group_size=policy.group_size, counts_WN=counts.astype(int).tolist())
    res = BenchResult(cfg, "emulated", "synthetic", perf.flops_per_s, perf.bandwidth_Bps,
                      perf.latency_s, perf.step_overhead_s, 1.3 * rate, results,
                      round_flops_single_thread=[1.3 * rate] * 3)
    out = validate_run(res)
    assert set(out) == set(results)
    for name, (emulated, _probed, fitted) in out.items():
        # the bisection's precision, relative to the step (> 0)
        assert emulated > 0 and abs(fitted - emulated) <= 1e-6 * emulated, name
    emulated, probed, _ = out["baseline"]
    assert probed < 0.95 * emulated


# --- makespans pinned from before the cost formulas moved onto furnace.runtime.cost -------

# computed with the code before issue 12, on test_perfmodel's pin models and routing: per
# policy [shadowed experts, group size, makespan]; "fixed" shadows experts 3 and 10 at G = 2,
# "host" is the same on 3 shared host cores at 2e10 FLOP/s; "policies" is
# simulate_policies with a 1.2 capacity factor: [step_s, shadowed, G, dropped]
SIM_PINS = {'v100': {'baseline': [[], 8, 0.05368309051547826],
              'shadow': [[3], 8, 0.016532789131130435],
              'smart': [[], 1, 0.03877977373495652],
              'both': [[3], 8, 0.016532789131130435],
              'fixed': [None, 2, 0.027722486778434783],
              'host': [None, 2, 13.987530592640002],
              'policies': {'baseline': [0.05368309051547826, 0, 8, 0.0],
                           'shadow': [0.016532789131130435, 1, 8, 0.0],
                           'smart': [0.03877977373495652, 0, 1, 0.0],
                           'both': [0.016532789131130435, 1, 8, 0.0],
                           'gshard-capacity': [0.010296754036869565, 0, 8, 0.482434731158938]}},
     'sun': {'baseline': [[], 8, 0.04735036809663652],
             'shadow': [[3], 8, 0.014796600000000002],
             'smart': [[], 4, 0.0364605872],
             'both': [[3], 8, 0.014796600000000002],
             'fixed': [None, 2, 0.02593921248],
             'host': [None, 2, 2.94422731424],
             'policies': {'baseline': [0.04735036809663652, 0, 8, 0.0],
                          'shadow': [0.014796600000000002, 1, 8, 0.0],
                          'smart': [0.0364605872, 0, 4, 0.0],
                          'both': [0.014796600000000002, 1, 8, 0.0],
                          'gshard-capacity': [0.008770242163616637, 0, 8, 0.482434731158938]}},
     'h100': {'baseline': [[], 8, 0.0009989932599402986],
              'shadow': [[3], 8, 0.0002213777537910448],
              'smart': [[], 2, 0.0006835248],
              'both': [[3], 8, 0.0002213777537910448],
              'fixed': [None, 2, 0.00037035616],
              'host': [None, 2, 0.7359946601599999],
              'policies': {'baseline': [0.0009989932599402986, 0, 8, 0.0],
                           'shadow': [0.0002213777537910448, 1, 8, 0.0],
                           'smart': [0.0006835248, 0, 2, 0.0],
                           'both': [0.0002213777537910448, 1, 8, 0.0],
                           'gshard-capacity': [0.00022906361600000003, 0, 8, 0.482434731158938]}}}


@pytest.mark.parametrize("name", list(SIM_PINS))
def test_simulated_makespans_are_pinned(name):
    m, pins = pin_models()[name], SIM_PINS[name]
    counts, E = pin_counts(), 2

    def close(got: float, want: float) -> bool:
        return abs(got - want) <= 1e-12 * abs(want)

    for policy_name in ("baseline", "shadow", "smart", "both"):
        shadowed, group, makespan = pins[policy_name]
        policy = choose_policy(policy_name, m, counts, E)
        assert np.flatnonzero(policy.shadow_N).tolist() == shadowed
        assert policy.group_size == group
        assert close(simulate_step(counts, m, E, policy).makespan, makespan), policy_name
    fixed = Policy("fixed", pin_shadow(), 2)
    assert close(simulate_step(counts, m, E, fixed).makespan, pins["fixed"][2])
    hosted = simulate_step(counts, m, E, fixed, host_cores=3, host_flops_per_s=2e10)
    assert close(hosted.makespan, pins["host"][2])
    results = simulate_policies(counts, m, E, capacity_factor=1.2,
                                tokens_per_rank=int(counts.sum(1).max()))
    assert list(results) == list(pins["policies"])
    for key, (step_s, shadowed, group, dropped) in pins["policies"].items():
        r = results[key]
        assert close(r.step_s, step_s) and close(r.dropped, dropped), key
        assert (r.shadowed, r.group_size) == (shadowed, group), key
