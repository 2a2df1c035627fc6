"""Routing arithmetic the gates share: wide softmax, expert capacity, first-come drops, losses.

The capacity, its first-come pruning and the auxiliary loss ``mean_e(c_e * m_e) * N^2``
follow GShard (Lepikhin et al. 2020, section 2.2 and algorithm 1); the squared
coefficient of variation follows Shazeer et al. 2017 (section 4).

Shape suffixes: T = tokens, N = global experts, K = top_k, A = assignments.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def softmax_wide(logits: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax in float32 or wider (float64 stays float64), returned in that wide dtype."""
    wide = torch.promote_types(logits.dtype, torch.float32)
    return torch.softmax(logits.to(wide), dim=dim)


def softmax_of_selected(logits_TN: torch.Tensor, expert_ids_TK: torch.Tensor) -> torch.Tensor:
    """Softmax over each token's selected logits, in the logits' dtype (ids must be >= 0)."""
    selected_TK = torch.gather(logits_TN, 1, expert_ids_TK)
    return softmax_wide(selected_TK).to(logits_TN.dtype)


def parse_capacity_factor(value: float | Sequence[float]) -> tuple[float, float]:
    """A capacity factor or a (train, eval) pair, as a validated (train, eval) pair."""
    if isinstance(value, (int, float)):
        pair = (float(value), float(value))
    else:
        try:
            train, evaluation = value
            pair = (float(train), float(evaluation))
        except (TypeError, ValueError):
            raise ValueError("capacity_factor must be a number or a (train, eval) pair, "
                             f"got {value!r}") from None
    for factor in pair:
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"capacity factors must be finite and > 0, got {value!r}")
    return pair


def expert_capacity(factor: float, assignments: int, num_experts: int) -> int:
    """``ceil(factor * assignments / num_experts)``: the assignments one expert accepts."""
    exact = factor * assignments / num_experts
    # 1.2 * 10 * 2 / 4 is 6.000000000000001 in binary floating point; shaving a relative
    # 1e-12 makes it ceil to the 6 the formula means, and moves no other realistic value
    return math.ceil(exact * (1.0 - 1e-12))


def first_come_keep(expert_ids_A: torch.Tensor, capacity: int | torch.Tensor,
                    num_experts: int) -> torch.Tensor:
    """Which assignments fit, taking them in the given order; -1 entries never fit or count.

    The i-th assignment to expert e (counting only earlier valid ones) is kept iff
    ``i < capacity`` (or ``i < capacity[e]`` for an [N] tensor of per-expert capacities).
    A stable sort by expert gives each its rank in O(A log A) without an [A, N] one-hot.
    """
    valid_A = expert_ids_A >= 0
    # dropped entries sort into a bucket of their own past the last expert
    key_A = torch.where(valid_A, expert_ids_A, torch.full_like(expert_ids_A, num_experts))
    order_A = torch.argsort(key_A, stable=True)
    sorted_key_A = key_A[order_A]
    counts = torch.bincount(key_A, minlength=num_experts + 1)
    starts = torch.cumsum(counts, 0) - counts
    rank_sorted_A = torch.arange(key_A.numel(), device=key_A.device) - starts[sorted_key_A]
    rank_A = torch.empty_like(rank_sorted_A)
    rank_A[order_A] = rank_sorted_A
    if isinstance(capacity, torch.Tensor):
        # the dropped bucket gets capacity 0
        capacity_N1 = torch.cat([capacity.to(rank_A), rank_A.new_zeros(1)])
        return valid_A & (rank_A < capacity_N1[key_A])
    return valid_A & (rank_A < capacity)


def drop(expert_ids_TK: torch.Tensor, scores_TK: torch.Tensor,
         keep_TK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dropped assignments become id -1 and score exactly 0 (the layer skips them)."""
    ids = torch.where(keep_TK, expert_ids_TK, torch.full_like(expert_ids_TK, -1))
    return ids, torch.where(keep_TK, scores_TK, torch.zeros_like(scores_TK))


def gshard_balance_loss(logits_TN: torch.Tensor, top1_ids_T: torch.Tensor) -> torch.Tensor:
    """GShard's auxiliary loss ``mean_e(c_e * m_e) * N^2`` in the logits' dtype.

    c_e is the fraction of tokens whose top-1 expert is e (a count, not differentiable)
    and m_e the mean softmax probability of e (differentiable); N^2 makes a uniform router
    score 1 whatever N is.
    """
    num_tokens, num_experts = logits_TN.shape
    if num_tokens == 0:
        return logits_TN.new_zeros(())
    probs_TN = softmax_wide(logits_TN)
    c_N = torch.bincount(top1_ids_T, minlength=num_experts).to(probs_TN.dtype) / num_tokens
    m_N = probs_TN.mean(0)
    return (torch.mean(c_N * m_N) * num_experts**2).to(logits_TN.dtype)


def cv_squared(values: torch.Tensor) -> torch.Tensor:
    """Squared coefficient of variation ``var / mean^2`` (population variance; 0 for one value)."""
    if values.numel() <= 1:
        return values.new_zeros(())
    # the epsilon keeps an all-zero vector (an empty batch) at 0 instead of NaN
    return values.var(correction=0) / (values.mean() ** 2 + 1e-10)
