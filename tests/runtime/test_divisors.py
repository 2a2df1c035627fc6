"""`furnace.runtime.topology.divisors`: the one divisor helper (MoE bench configs, MoDa
layouts and the BaGuaLu planner all use it)."""

from __future__ import annotations

import pytest

from furnace.runtime.topology import divisors

# nothing here rounds differently with the thread count: `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent


@pytest.mark.parametrize("n", [1, 2, 7, 12, 36, 97, 360, 1001])
def test_divisors_equal_the_brute_force_list(n):
    assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


def test_divisors_of_a_machine_scale_count():
    found = divisors(576_000)
    assert found[0] == 1 and found[-1] == 576_000 and found == sorted(set(found))
    assert all(576_000 % d == 0 for d in found)
    assert len(found) == 120  # 576000 = 2^9 3^2 5^3: (9+1)(2+1)(3+1) divisors


@pytest.mark.parametrize("bad", [0, -4, True, 2.0])
def test_divisors_refuse_what_is_not_a_positive_int(bad):
    with pytest.raises(ValueError, match="integer >= 1"):
        divisors(bad)
