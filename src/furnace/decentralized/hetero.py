"""The heterogeneity injector (design note `prague.md` section 7.1 item 6): emulated device
compute, static slow ranks, transient slowdowns and slow links.

Compute is emulated by sleeping after the real forward and backward, so several worker
processes on a two-core laptop measure synchronization rather than CPU contention; every
time that includes it is labelled emulated. The draws are seeded per rank, so a run's
slowdowns can be replayed.
"""

from __future__ import annotations

import random
import time

from .config import HeteroConfig

__all__ = ["Injector"]


class Injector:
    """One rank's slowdowns. ``compute_s(step)`` is the emulated compute of a step;
    ``link_s(nbytes)`` the extra time this rank's emulated link takes to send nbytes."""

    def __init__(self, config: HeteroConfig, rank: int, compute_ms: float) -> None:
        self.config = config
        self.rank = rank
        self.base_s = compute_ms * 1e-3
        self.factor = config.factor(rank)
        self.link_rate = dict(config.slow_links).get(rank)
        self._rng = random.Random(config.seed * 1_000_003 + rank)
        self.transients = 0

    def compute_s(self) -> float:
        seconds = self.base_s * self.factor
        if self.config.transient_prob > 0 and self._rng.random() < self.config.transient_prob:
            self.transients += 1
            seconds *= self.config.transient_factor
        return seconds

    def link_s(self, nbytes: float) -> float:
        return 0.0 if self.link_rate is None else nbytes / self.link_rate

    def sleep_compute(self) -> float:
        seconds = self.compute_s()
        if seconds > 0:
            time.sleep(seconds)
        return seconds

    def sleep_link(self, nbytes: float) -> float:
        seconds = self.link_s(nbytes)
        if seconds > 0:
            time.sleep(seconds)
        return seconds
