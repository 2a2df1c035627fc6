"""The discrete-event simulator of decentralized training (`decentralized.simulate`;
design note `prague.md` sections 2.1-2.3, 7.3 and 7.5): deadlock freedom of every group
policy under random compute times, AD-PSGD's bipartite fix against the naive all-active
protocol, the straggler behaviour of allreduce against the ready window, the replay of
every decided schedule on `runtime.simulator`, the cost fit and the trace.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from furnace.decentralized.config import PolicyConfig
from furnace.decentralized.simulate import (
    CommCosts,
    SimConfig,
    SimResult,
    SimulatedDeadlock,
    calibrate_generator,
    fit_costs,
    generator_wait,
    replay,
    replay_timeline,
    scaling,
    simulate,
    validate_against,
)
from furnace.runtime.cliargs import ConfigFieldError

# pure Python and numpy on a virtual clock: no torch kernels, so nothing here depends on
# the torch thread count
pytestmark = pytest.mark.thread_independent

COSTS = CommCosts(latency_s=50e-6, bandwidth_Bps=1.25e9, generator_roundtrip_s=1e-3,
                  pair_overhead_s=5e-3, preduce_overhead_s=1e-3)


def _policy(name: str, n: int, seed: int) -> PolicyConfig:
    rows = 2 if n % 2 == 0 else 1
    return PolicyConfig(name, group_size=3, window_ms=3.0 + seed % 7, divisions=2,
                        division_period=5, grid_rows=rows, seed=seed)


def _check_prague_drained(r: SimResult) -> None:
    assert r.groups_completed == r.groups_issued > 0
    assert r.queues_drained
    for rank, seqs in enumerate(r.own_groups):
        # one own group per request, and the requester is in it
        assert len(seqs) == r.requests[rank] > 0
        assert all(rank in r.group_members[s] for s in seqs)


def _same_schedule(r: SimResult) -> None:
    """The runtime simulator, given the decided DAG, ends when the event loop did and
    starts every task when the loop did: the loop waited for nothing it did not record.
    Relative 1e-9: the two sum the same durations, possibly in another order."""
    rebuilt = replay_timeline(r)
    assert math.isclose(rebuilt.makespan, r.end_time_s, rel_tol=1e-9)
    for rec in r.records:
        if rec.replay:
            assert math.isclose(rebuilt[rec.name].start, rec.start, rel_tol=1e-9,
                                abs_tol=1e-12), rec.name


@pytest.mark.parametrize("name", ["random", "buffered", "division", "ready_window", "static"])
def test_prague_is_deadlock_free_under_random_compute_times(name: str) -> None:
    # 120 seeds x {4, 5, 8} workers, lognormal jitter and a slow worker, overlap on and
    # off, with and without a generator round trip
    for seed in range(120):
        n = (4, 5, 8)[seed % 3]
        slow = ((seed % n, 1.0 + seed % 5),) if seed % 4 else ()
        cfg = SimConfig(mode="prague", world_size=n, policy=_policy(name, n, seed),
                        compute_s=0.01, compute_jitter=0.2 + 0.4 * (seed % 3), slow=slow,
                        model_bytes=2e6, overlap=seed % 2 == 0, duration_s=0.25,
                        seed=seed, dim=4,
                        costs=COSTS if seed % 5 else replace(COSTS, generator_roundtrip_s=0))
        r = simulate(cfg)
        _check_prague_drained(r)
        if name == "static":
            # the agreed stop: every worker ran the same rounds
            assert len(set(r.requests)) == 1
        if seed % 10 == 0:
            _same_schedule(r)


def test_static_on_own_clocks_can_deadlock_and_is_reported() -> None:
    # what worker.py does for static schedules: each rank stops on its own clock, so a
    # slow partner may never reach the round a fast one waits in
    hits = 0
    for seed in range(20):
        cfg = SimConfig(mode="prague", world_size=8, policy=PolicyConfig("static", grid_rows=2),
                        compute_s=0.01, compute_jitter=0.3, slow=((1, 3.0),),
                        duration_s=0.3, seed=seed, dim=4, costs=COSTS,
                        static_stop="own_clock")
        try:
            simulate(cfg)
        except SimulatedDeadlock as exc:
            hits += 1
            assert exc.groups and "group" in exc.groups[0]
            assert exc.workers
            assert "no event can fire" in str(exc)
    assert hits > 0


def test_adpsgd_bipartite_never_times_out() -> None:
    for seed in range(40):
        n = (4, 5, 8)[seed % 3]
        cfg = SimConfig(mode="adpsgd", world_size=n, compute_s=0.01, compute_jitter=0.5,
                        slow=((seed % n, 3.0),), model_bytes=2e6, duration_s=0.4, seed=seed,
                        dim=4, overlap=seed % 2 == 0, costs=COSTS)
        r = simulate(cfg)
        assert r.timeouts == 0 and r.cyclic_waits == 0
        # no exchange waited anywhere near the lock timeout the naive mode needs
        assert 0 < r.exchanges and r.max_exchange_wait_s < cfg.timeout_s
        assert r.queues_drained
        # passives (even ranks) never request; every active request was served
        assert all(r.requests[i] == 0 for i in range(0, n, 2))
        assert sum(r.requests) == r.exchanges


def test_adpsgd_naive_has_cyclic_waits_broken_by_timeouts() -> None:
    timeouts = cycles = 0
    for seed in range(30):
        n = (4, 5, 8)[seed % 3]
        cfg = SimConfig(mode="adpsgd_naive", world_size=n, compute_s=0.02,
                        compute_jitter=0.5, model_bytes=2e6, duration_s=1.0, seed=seed,
                        dim=4, costs=replace(COSTS, latency_s=1e-3))
        r = simulate(cfg)
        # every cycle in the wait-for graph stays until one of its waiters times out
        assert r.timeouts >= r.cyclic_waits
        timeouts += r.timeouts
        cycles += r.cyclic_waits
        if seed % 10 == 0:
            _same_schedule(r)
    assert cycles > 0 and timeouts > 0


def test_allreduce_is_paced_by_the_straggler_and_the_ready_window_is_not() -> None:
    k = 4.0
    cheap = CommCosts(latency_s=1e-6, bandwidth_Bps=1e12, preduce_overhead_s=1e-5,
                      generator_roundtrip_s=1e-4)
    base = SimConfig(world_size=8, compute_s=0.1, model_bytes=1e6, costs=cheap,
                     duration_s=8.0, dim=4)
    ar = replace(base, mode="allreduce")
    hom, het = simulate(ar), simulate(replace(ar, slow=((3, k),)))
    # synchronous: every step takes the slowest worker's time (comm is ~1e-5 of a step)
    assert het.throughput / hom.throughput == pytest.approx(1 / k, rel=0.03)
    rw = replace(base, mode="prague",
                 policy=PolicyConfig("ready_window", group_size=3, window_ms=10.0))
    hom, het = simulate(rw), simulate(replace(rw, slow=((3, k),)))
    # only the slow worker's own steps are lost: (n - 1 + 1/k) / n of the total
    expected = (7 + 1 / k) / 8
    assert het.throughput / hom.throughput > 0.95 * expected
    fast = [s for i, s in enumerate(het.steps) if i != 3]
    assert min(fast) >= 0.95 * min(hom.steps)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("mode,policy", [
    ("allreduce", "ready_window"), ("adpsgd", "ready_window"), ("adpsgd_naive", "ready_window"),
    ("prague", "random"), ("prague", "buffered"), ("prague", "division"),
    ("prague", "ready_window"), ("prague", "static"),
])
def test_replay_makespan_equals_the_event_loop(mode: str, policy: str, overlap: bool) -> None:
    cfg = SimConfig(mode=mode, world_size=8, policy=_policy(policy, 8, 3), compute_s=0.02,
                    compute_jitter=0.4, slow=((5, 2.5),), model_bytes=4e6, overlap=overlap,
                    duration_s=0.6, seed=11, dim=4, costs=replace(COSTS, latency_s=5e-4))
    r = simulate(cfg)
    assert math.isclose(replay(r), r.end_time_s, rel_tol=1e-9)
    _same_schedule(r)


def test_two_level_costs_replay_and_hierarchical_allreduce() -> None:
    costs = replace(COSTS, ranks_per_node=4, intra_bandwidth_Bps=10e9)
    nbytes = 8e6
    # a group inside a node runs at the intra-node link, one across nodes at the slower
    assert costs.preduce_time(nbytes, 3, (0, 1, 2)) < costs.preduce_time(nbytes, 3, (0, 1, 4))
    assert costs.allreduce_time(nbytes, 16) < replace(
        COSTS, ranks_per_node=None, intra_bandwidth_Bps=None).allreduce_time(nbytes, 16)
    assert costs.preduce_time(nbytes, 1) == 0.0
    for mode in ("allreduce", "prague"):
        r = simulate(SimConfig(mode=mode, world_size=16, compute_s=0.02, compute_jitter=0.3,
                               model_bytes=nbytes, duration_s=0.3, dim=4, costs=costs,
                               policy=PolicyConfig("static", grid_rows=4)))
        _same_schedule(r)


def test_fit_costs_recovers_alpha_beta_and_overhead() -> None:
    truth = CommCosts(latency_s=80e-6, bandwidth_Bps=2.5e8, preduce_overhead_s=2e-3)
    samples = [(g, b, truth.preduce_time(b, g)) for g in (2, 3, 4, 8)
               for b in (4e4, 1e6, 4e6, 4e7)]
    fit = fit_costs(samples, pair_overhead_s=0.01)
    # the samples come from runtime.cost, whose byte model rounds a rank's share up to
    # whole bytes (40 kB / 3 is not whole): 1e-5 covers that, nothing else is inexact
    assert fit.latency_s == pytest.approx(truth.latency_s, rel=1e-5)
    assert fit.bandwidth_Bps == pytest.approx(truth.bandwidth_Bps, rel=1e-5)
    assert fit.preduce_overhead_s == pytest.approx(truth.preduce_overhead_s, rel=1e-5)
    assert fit.pair_overhead_s == 0.01
    assert len(fit.fit_residuals) == len(samples)
    assert max(abs(r) for r in fit.fit_residuals) < 1e-5
    # mappings work too; one group size cannot split overhead from alpha, so the whole
    # constant goes to the overhead
    one = fit_costs([{"group_size": 4, "num_bytes": b, "seconds": truth.preduce_time(b, 4)}
                     for b in (1e5, 1e6, 1e7)])
    assert one.latency_s == 0.0
    assert one.preduce_overhead_s == pytest.approx(2e-3 + 6 * 80e-6, rel=1e-6)
    # a negative unconstrained coefficient is fitted as 0, never below
    skew = fit_costs([(2, 1e6, 1e-3), (4, 1e6, 1.2e-3), (2, 1e7, 9e-3), (4, 1e7, 1.4e-2)])
    assert skew.latency_s >= 0 and skew.preduce_overhead_s >= 0 and skew.bandwidth_Bps > 0
    with pytest.raises(ValueError):
        fit_costs([(2, 1e6, 1e-3)])


def test_trace_is_valid_json_with_every_worker(tmp_path: Path) -> None:
    r = simulate(SimConfig(mode="prague", world_size=5, compute_s=0.02, compute_jitter=0.3,
                           duration_s=0.3, dim=4, costs=COSTS,
                           policy=PolicyConfig("random", group_size=3)))
    path = r.write_trace(tmp_path / "sim.json")
    trace = json.loads(path.read_text(encoding="ascii"))
    events = trace["traceEvents"]
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    used = {rows[e["tid"]] for e in events if e.get("ph") == "X"}
    for i in range(5):
        assert f"worker {i} compute" in used and f"worker {i} comm" in used
    process = next(e for e in events if e.get("name") == "process_name")
    assert "simulated" in process["args"]["name"]
    # a group appears on every member's comm row and names the members' previous tasks
    groups = [e for e in events if e.get("cat") == "preduce"]
    assert groups and any(e["args"]["deps"] for e in groups)
    assert r.timeline().makespan == pytest.approx(r.end_time_s)


def test_statistics_reach_the_target_and_label_the_outputs() -> None:
    r = simulate(SimConfig(mode="allreduce", world_size=4, compute_s=0.05, duration_s=4.0,
                           dim=8, noise=0.5, costs=COSTS))
    assert r.label == "simulated" and "[simulated]" in r.summary()
    assert r.time_to_target is not None and r.final_error < r.config.target
    assert r.samples[0][1] == pytest.approx(1.0)  # every vector starts at 0
    assert r.final_consensus < 1e-20               # allreduce keeps the copies identical
    times = [t for t, _, _ in r.samples]
    assert times == sorted(times) and times[-1] == r.end_time_s


def test_validate_against_and_scaling_shape() -> None:
    cfg = SimConfig(world_size=4, compute_s=0.02, duration_s=0.5, dim=4, costs=COSTS,
                    policy=PolicyConfig("ready_window", group_size=3, window_ms=5.0))
    sim = simulate(replace(cfg, mode="allreduce")).throughput
    out = validate_against({"allreduce": sim, "prague/static": 100.0, "adpsgd": 150.0}, cfg)
    assert out["rows"]["allreduce"]["rel_error"] == pytest.approx(0.0, abs=1e-12)
    assert out["max_abs_rel_error"] >= abs(out["rows"]["adpsgd"]["rel_error"])
    assert "simulated" in out["kind"]
    rows = scaling(COSTS, 0.02, 4e6, sizes=(8,), quarter_slow=False)
    (row,) = rows
    assert row["kind"] == "simulated" and row["world_size"] == 8
    for key in ("speedup_vs_allreduce_homog", "speedup_vs_adpsgd_homog",
                "speedup_vs_allreduce_hetero"):
        assert row[key] > 0
    # one slow worker costs allreduce far more than the ready window
    assert row["speedup_vs_allreduce_hetero"] > 2.0


def _window_config(roundtrip_s: float) -> SimConfig:
    return SimConfig(mode="prague", world_size=4,
                     policy=PolicyConfig("ready_window", group_size=3, window_ms=3.0),
                     compute_s=0.025, compute_jitter=0.08, model_bytes=153_128,
                     costs=replace(COSTS, bandwidth_Bps=10e6,
                                   generator_roundtrip_s=roundtrip_s),
                     duration_s=1.0)


def test_generator_wait_counts_a_round_trip_per_own_group() -> None:
    # every own group waits at least the round trip: half to reach the generator, half
    # to notify the members, whatever the window adds
    for rt in (0.0, 2e-3, 6e-3):
        r = simulate(_window_config(rt))
        assert len(r.generator_s) == 4
        assert generator_wait(r) >= rt
        assert all(w >= rt * len(own) for w, own in zip(r.generator_s, r.own_groups))
    static = simulate(replace(_window_config(1e-3),
                              policy=PolicyConfig("static", grid_rows=2)))
    assert static.generator_s == (0.0,) * 4 and generator_wait(static) == 0.0


def test_calibrate_generator_recovers_the_round_trip_that_made_a_wait() -> None:
    truth = 4e-3
    measured = generator_wait(simulate(_window_config(truth)))
    fitted = calibrate_generator(_window_config(0.0), measured)
    # the wait it simulates is the measured one (to the bisection's 10 us on the round
    # trip), and the round trip is near the one that produced it
    again = generator_wait(simulate(_window_config(fitted.generator_roundtrip_s)))
    assert again == pytest.approx(measured, rel=0.02)
    assert fitted.generator_roundtrip_s == pytest.approx(truth, rel=0.15)
    # a wait below what a free generator gives is a zero round trip; one no round trip
    # under the bound gives is refused, as is a policy with no generator
    assert calibrate_generator(_window_config(0.0), 0.0).generator_roundtrip_s == 0.0
    with pytest.raises(ValueError, match="round trip above"):
        calibrate_generator(_window_config(0.0), 1.0)
    with pytest.raises(ConfigFieldError, match="generator policy"):
        calibrate_generator(replace(_window_config(0.0),
                                    policy=PolicyConfig("static", grid_rows=2)), 5e-3)
