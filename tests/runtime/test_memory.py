"""Peak memory of a call in a child process: it sees a known allocation and reports errors."""

from __future__ import annotations

import numpy as np
import pytest

from furnace.runtime import memory, timing
from furnace.runtime.memory import measure_in_subprocess


def _allocate(megabytes: int) -> float:
    a = np.ones(megabytes * 2**20 // 8)
    return float(a.sum())


def _fail() -> None:
    raise KeyError("boom")


def test_peak_sees_the_allocation_and_not_the_parent():
    small = measure_in_subprocess(_allocate, 1)
    big = measure_in_subprocess(_allocate, 200)
    assert big.result == 200 * 2**20 // 8
    if big.exact:
        # 200 MiB touched by np.ones, plus a little interpreter noise
        assert 190 * 2**20 < big.peak_bytes < 260 * 2**20
        assert small.peak_bytes < 40 * 2**20
    assert big.peak_bytes > small.peak_bytes
    assert big.seconds > 0


def test_memory_is_the_timing_harness_measurement():
    # one implementation: the old module name is the harness's function, not a copy
    assert measure_in_subprocess is timing.measure_in_subprocess
    assert memory.Measured is timing.Measured


def test_errors_in_the_child_are_raised_with_their_traceback():
    with pytest.raises(RuntimeError, match="KeyError"):
        measure_in_subprocess(_fail)


def test_a_child_that_dies_is_reported_not_waited_for():
    import os

    with pytest.raises(RuntimeError, match="died"):
        measure_in_subprocess(os._exit, 3)
