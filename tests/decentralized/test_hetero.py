"""The heterogeneity injector (design note `prague.md` section 7.1 item 6): static slow
ranks scale the emulated compute, transient slowdowns hit steps at their probability and
are replayable from the seed, and a slow link charges bytes / rate.
"""

from __future__ import annotations

import pytest

from furnace.decentralized.config import HeteroConfig
from furnace.decentralized.hetero import Injector

# pure Python arithmetic on seeded draws: nothing depends on the torch thread count
pytestmark = pytest.mark.thread_independent


def test_a_slow_rank_takes_its_factor_and_the_others_do_not() -> None:
    config = HeteroConfig(slow=((1, 4.0),))
    assert Injector(config, 1, 20.0).compute_s() == pytest.approx(0.080)
    assert Injector(config, 0, 20.0).compute_s() == pytest.approx(0.020)


def test_transient_slowdowns_hit_at_their_rate_and_replay_from_the_seed() -> None:
    config = HeteroConfig(transient_prob=0.2, transient_factor=3.0, seed=7)
    first = Injector(config, 2, 10.0)
    draws = [first.compute_s() for _ in range(5000)]
    slowed = sum(d == pytest.approx(0.030) for d in draws)
    assert first.transients == slowed
    assert set(round(d, 9) for d in draws) == {0.01, 0.03}
    # binomial(5000, 0.2): mean 1000, sd 28; 6 sd either way
    assert 830 <= slowed <= 1170
    again = Injector(config, 2, 10.0)
    assert [again.compute_s() for _ in range(5000)] == draws
    other = Injector(config, 3, 10.0)
    assert [other.compute_s() for _ in range(5000)] != draws


def test_a_slow_link_charges_bytes_over_its_rate() -> None:
    config = HeteroConfig(slow_links=((0, 10e6),))
    assert Injector(config, 0, 0.0).link_s(153_128) == pytest.approx(0.0153128)
    assert Injector(config, 1, 0.0).link_s(153_128) == 0.0
