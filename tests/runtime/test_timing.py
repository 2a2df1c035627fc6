"""The timing harness `furnace.runtime.timing`: what is counted, in which order, with which
thread count, and the peak memory of a child. Counts and orders only: no wall-clock
assertions."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from furnace.runtime.timing import (
    Timing,
    measure_in_subprocess,
    median_paired_ratio,
    paired_ratios,
    round_robin,
    stopwatch,
    time_call,
    time_round_robin,
    torch_threads,
)

# nothing here rounds differently with the thread count: `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent


class Counter:
    def __init__(self) -> None:
        self.calls = 0
        self.setups = 0
        self.syncs = 0

    def call(self) -> None:
        self.calls += 1

    def setup(self) -> None:
        self.setups += 1

    def sync(self) -> None:
        self.syncs += 1


def test_warmup_is_run_but_not_counted():
    c = Counter()
    t = time_call(c.call, repeats=4, warmup=3, setup=c.setup, synchronize=c.sync)
    assert c.calls == 7 and t.repeats == 4 and len(t.samples) == 4
    # setup before every run, warm-up included; a sync on both sides of each timed sample
    assert c.setups == 7 and c.syncs == 8
    assert t.warmup == 3


def test_number_calls_per_sample():
    c = Counter()
    t = time_call(c.call, repeats=2, warmup=1, number=5)
    assert c.calls == 1 + 2 * 5 and t.repeats == 2 and t.number == 5


def test_min_time_keeps_sampling_past_repeats():
    c = Counter()

    def slow() -> None:
        c.call()
        # 10 ms of sleep per call: 50 ms of budget needs several samples, whatever the host
        time.sleep(0.01)

    t = time_call(slow, repeats=1, warmup=0, min_time_s=0.05)
    assert t.repeats >= 2 and c.calls == t.repeats


def test_statistics_are_ordered_and_from_the_samples():
    t = time_call(lambda: sum(range(1000)), repeats=7, warmup=1)
    assert t.min <= t.median <= t.max
    assert t.min == min(t.samples) and t.max == max(t.samples)
    d = t.to_dict()
    assert d["samples_s"] == list(t.samples) and d["median_s"] == t.median
    fixed = Timing((3.0, 1.0, 2.0))
    assert (fixed.min, fixed.median, fixed.max) == (1.0, 2.0, 3.0)
    with pytest.raises(ValueError):
        Timing(())


@pytest.mark.parametrize("bad", [{"repeats": 0}, {"warmup": -1}, {"number": 0},
                                 {"min_time_s": -1.0}])
def test_bad_arguments_are_refused(bad):
    with pytest.raises(ValueError):
        time_call(lambda: None, **bad)


def test_thread_count_is_applied_and_restored():
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    seen = []
    t = time_call(lambda: seen.append(torch.get_num_threads()), repeats=2, warmup=1,
                  num_threads=target)
    assert seen == [target] * 3 and t.num_threads == target
    assert torch.get_num_threads() == before


def test_thread_count_is_restored_after_an_exception():
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2

    def fails() -> None:
        assert torch.get_num_threads() == target
        raise KeyError("inside")

    with pytest.raises(KeyError, match="inside"):
        time_call(fails, repeats=1, warmup=0, num_threads=target)
    assert torch.get_num_threads() == before
    with pytest.raises(KeyError):
        with torch_threads(target):
            raise KeyError("inside")
    assert torch.get_num_threads() == before


def test_stopwatch_fills_the_lap():
    c = Counter()
    with stopwatch(synchronize=c.sync) as lap:
        assert np.isnan(lap.seconds)
        sum(range(10_000))
    assert lap.seconds >= 0 and lap.cpu_seconds >= 0 and c.syncs == 2


def test_round_robin_rotates_and_drops_warmup_rounds():
    order: list[str] = []
    probes: list[int] = []

    def measure(name: str) -> str:
        order.append(name)
        return f"{name}{len(order)}"

    values = round_robin(["a", "b", "c"], measure, rounds=3, warmup=1,
                         after_round=probes.append)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    # warm-up round (the first three runs) dropped; values in round order
    assert values == {"a": ["a6", "a8", "a10"], "b": ["b4", "b9", "b11"],
                      "c": ["c5", "c7", "c12"]}
    assert probes == [0, 1, 2]


def test_round_robin_without_rotation_keeps_the_order():
    order: list[str] = []
    round_robin(["a", "b"], order.append, rounds=2, rotate=False)
    assert order == ["a", "b", "a", "b"]
    with pytest.raises(ValueError):
        round_robin(["a", "a"], order.append, rounds=1)


def test_time_round_robin_pairs_samples_by_round():
    c = Counter()
    t = time_round_robin({"x": c.call, "y": c.call}, rounds=4, warmup=2, setup=c.setup)
    assert c.calls == 12 and c.setups == 12
    assert t["x"].repeats == t["y"].repeats == 4
    assert len(paired_ratios(t["x"], t["y"])) == 4


def test_median_paired_ratio():
    # pairing cancels the drift that a ratio of medians would keep
    a, b = [2.0, 4.0, 8.0], [1.0, 2.0, 2.0]
    assert paired_ratios(a, b) == [2.0, 2.0, 4.0]
    assert median_paired_ratio(a, b) == 2.0
    with pytest.raises(ValueError):
        paired_ratios([1.0], [1.0, 2.0])


def _allocate(megabytes: int) -> float:
    a = np.ones(megabytes * 2**20 // 8)
    return float(a.sum())


def _threads_in_child() -> int:
    return torch.get_num_threads()


def test_child_peak_memory_grows_with_a_known_allocation():
    small = measure_in_subprocess(_allocate, 1)
    big = measure_in_subprocess(_allocate, 128)
    assert big.result == 128 * 2**20 // 8
    # np.ones touches every page of the 128 MiB; the child's peak must include them
    assert big.peak_bytes - small.peak_bytes >= 0.9 * 127 * 2**20
    if big.exact:
        assert big.peak_bytes >= 0.9 * 128 * 2**20


def test_child_thread_count():
    target = 1 if torch.get_num_threads() != 1 else 2
    assert measure_in_subprocess(_threads_in_child, num_threads=target).result == target
