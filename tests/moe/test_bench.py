"""The benchmark's claims on the virtual clock of FasterMoE's testbed (deterministic).

4 ranks, one expert each, 2048 tokens per rank, H=256, F=1024, V100 + 50 Gb/s. The same
comparison on the emulated link is a benchmark (`furnace moe bench`), not a test.
"""

from __future__ import annotations

import pytest

from furnace.moe.bench import BenchResult, PolicyResult, run_bench
from furnace.moe.config import BenchConfig


@pytest.fixture(scope="module")
def hot():
    return run_bench(BenchConfig(mode="virtual", routing="hot", hot_share=0.5, steps=1,
                                 warmup=1))


@pytest.fixture(scope="module")
def uniform():
    return run_bench(BenchConfig(mode="virtual", routing="uniform", steps=1, warmup=1))


@pytest.mark.timeout(300)
def test_shadowing_and_smart_schedule_speedups(hot):
    assert hot.label == "virtual-clock"
    assert hot.speedup("shadow") >= 1.5
    assert hot.speedup("smart") >= 1.2
    assert hot.speedup("both") >= max(hot.speedup("shadow"), hot.speedup("smart"))
    # the hot expert is the one shadowed, and shadowing evens out the load
    assert hot.results["shadow"].shadowed == [0]
    assert hot.results["shadow"].load_max_over_mean < hot.results["baseline"].load_max_over_mean


@pytest.mark.timeout(300)
def test_policies_decline_on_uniform_routing(uniform):
    assert uniform.results["shadow"].shadowed == []
    # the virtual clock charges every exchange, so the baseline step is > 0
    assert uniform.results["baseline"].step_s > 0
    cost = uniform.results["shadow"].step_s / uniform.results["baseline"].step_s - 1
    assert cost <= 0.05
    # the smart schedule still overlaps the exchange
    assert uniform.speedup("smart") >= 1.0


@pytest.mark.timeout(300)
def test_virtual_clock_is_deterministic(hot):
    again = run_bench(BenchConfig(mode="virtual", routing="hot", hot_share=0.5, steps=1,
                                  warmup=1, policies=("baseline", "shadow")))
    for name in ("baseline", "shadow"):
        assert again.results[name].step_s == hot.results[name].step_s
        assert again.results[name].bytes_sent == hot.results[name].bytes_sent


@pytest.mark.timeout(60)
def test_reported_counters(hot):
    base = hot.results["baseline"]
    assert len(base.bytes_sent) == 4 and len(base.messages) == 4
    assert sum(base.tokens_computed) == 4 * 2048
    # rank 0 owns the hot expert: it computes about half of all tokens
    assert base.tokens_computed[0] > 0.45 * 4 * 2048


def test_config_errors():
    with pytest.raises(ValueError, match="mode"):
        BenchConfig(mode="real")
    with pytest.raises(ValueError, match="policies"):
        BenchConfig(policies=("magic",))
    with pytest.raises(ValueError, match="trace_probabilities"):
        BenchConfig(routing="trace")


def _policy(name: str, step_times: list[float]) -> PolicyResult:
    return PolicyResult(policy=name, step_s=sorted(step_times)[len(step_times) // 2],
                        step_times=step_times, cpu_s=0.0, bytes_sent=[0], bytes_received=[0],
                        messages=[0], tokens_computed=[0], load_max_over_mean=1.0,
                        shadowed=[], group_size=1, counts_WN=[[0]])


def test_speedup_is_the_median_of_paired_round_ratios():
    # round 2 ran on a host twice as busy: paired ratios cancel it, a ratio of medians not
    result = BenchResult(BenchConfig(mode="virtual", steps=3), "virtual-clock", "t", 1.0, 1.0,
                         0.0, 0.0, 0.0)
    result.results["baseline"] = _policy("baseline", [4.0, 8.0, 4.0])
    result.results["shadow"] = _policy("shadow", [2.0, 4.0, 1.0])
    assert result.speedup("shadow") == 2.0
    assert result.speedup("baseline") == 1.0
