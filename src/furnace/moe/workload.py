"""Synthetic routing for benchmarks: a gate whose expert choices follow a given distribution.

FasterMoE's gains depend on how skewed the routing is, so benchmarks need the skew under
control: `SyntheticGate` draws each token's first choice from a distribution over experts
(hot expert, Zipf, uniform, or counts recorded from a real gate by `furnace.moe.lm`) and
its other choices uniformly among the remaining experts. Scores stay a softmax over the
scorer's logits at the chosen experts, so gradients reach the gate as with a real router.

Shape suffixes: T tokens, N global experts, K top_k.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .gates import BaseGate, GateOutput


def hot_expert(num_experts: int, share: float, hot: int = 0) -> np.ndarray:
    """Probability ``share`` on expert ``hot``, the rest spread evenly."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"hot share must be in [0, 1], got {share}")
    if num_experts == 1:
        return np.ones(1)
    p = np.full(num_experts, (1.0 - share) / (num_experts - 1))
    p[hot] = share
    return p


def zipf(num_experts: int, exponent: float) -> np.ndarray:
    """p_i proportional to 1 / (i + 1)^exponent."""
    p = 1.0 / np.arange(1, num_experts + 1) ** exponent
    return p / p.sum()


def uniform(num_experts: int) -> np.ndarray:
    return np.full(num_experts, 1.0 / num_experts)


def from_counts(counts: Sequence[int]) -> np.ndarray:
    """A recorded per-expert count vector as a distribution."""
    c = np.asarray(counts, dtype=np.float64)
    if c.sum() <= 0:
        raise ValueError("counts sum to zero")
    return c / c.sum()


class SyntheticGate(BaseGate):
    """Routes first choices by ``probabilities``; deterministic given ``seed`` and rank.

    Each forward draws new choices from a generator seeded with (seed, rank, call index),
    so ranks route differently, runs repeat exactly, and counts are exact in expectation.
    """

    def __init__(self, d_model: int, num_experts: int, top_k: int = 1, *,
                 probabilities: Sequence[float] | np.ndarray, seed: int = 0) -> None:
        super().__init__(d_model, num_experts, top_k)
        p = np.asarray(probabilities, dtype=np.float64)
        if p.shape != (num_experts,) or (p < 0).any() or not np.isclose(p.sum(), 1.0):
            raise ValueError(f"probabilities must be {num_experts} non-negative values "
                             f"summing to 1")
        self.probabilities = p
        self.seed = seed
        self.calls = 0

    def route(self, logits_TN: torch.Tensor) -> GateOutput:
        T = logits_TN.shape[0]
        rng = np.random.default_rng([self.seed, self.context.rank, self.calls])
        self.calls += 1
        first = rng.choice(self.num_experts, size=T, p=self.probabilities)
        ids = np.empty((T, self.top_k), dtype=np.int64)
        ids[:, 0] = first
        for t in range(T):
            if self.top_k > 1:
                rest = np.delete(np.arange(self.num_experts), first[t])
                ids[t, 1:] = rng.choice(rest, size=self.top_k - 1, replace=False)
        expert_ids_TK = torch.as_tensor(ids, device=logits_TN.device)
        scores_TK = torch.softmax(logits_TN.gather(1, expert_ids_TK), dim=-1)
        return GateOutput(expert_ids_TK, scores_TK, logits_TN.new_zeros(()))
