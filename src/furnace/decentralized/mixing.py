"""Mixing matrices of Partial All-Reduce and their spectral gap (Luo et al., ASPLOS '20;
design note `prague.md` section 2.2, component 1 of section 7.1).

One P-Reduce over group G of size g among n workers applies

    W_G = I - P_G + (1/g) 1_G 1_G^T,

P_G being the diagonal projection onto G. W_G is symmetric, doubly stochastic and
idempotent. The AD-PSGD-style convergence argument needs

    rho = || E[W^T W] - 11^T/n ||_2 < 1,

and for the two group distributions Prague cares about it has a closed form:

* one uniformly random group of size g: rho = 1 - (g-1)/(n-1) (g = 2 is AD-PSGD);
* a uniformly random partition of all n workers into groups of size g:
  rho = (n-g) / (g(n-1)).

Everything here is plain numpy on n x n matrices, so the formulas, the Monte Carlo
estimate and the rho of the groups a real run produced can be compared without processes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

__all__ = ["Sampler", "consensus_distance", "grid_schedule", "partition_matrix",
           "predicted_consensus_decay", "preduce_matrix", "random_group_sampler",
           "random_partition_sampler", "rho_monte_carlo", "rho_of_groups", "rho_partition",
           "rho_single_group"]

Sampler = Callable[[np.random.Generator], np.ndarray]
"""Draws one mixing matrix W (n x n) from the given random generator."""


def _check_members(n: int, members: Sequence[int]) -> tuple[int, ...]:
    group = tuple(int(m) for m in members)
    if not group:
        raise ValueError("a group needs at least one member")
    if len(set(group)) != len(group):
        raise ValueError(f"group {group} repeats a member")
    bad = [m for m in group if not 0 <= m < n]
    if bad:
        raise ValueError(f"members {bad} are outside 0..{n - 1}")
    return group


def _check_n_g(n: int, g: int) -> None:
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    if not 1 <= g <= n:
        raise ValueError(f"group size g must be in 1..{n}, got {g}")


def preduce_matrix(n: int, members: Sequence[int]) -> np.ndarray:
    """W_G = I - P_G + (1/g) 1_G 1_G^T: members end with their mean, the rest keep theirs."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    group = list(_check_members(n, members))
    w = np.eye(n)
    w[np.ix_(group, group)] = 1.0 / len(group)
    return w


def partition_matrix(n: int, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """The product of disjoint groups' W_G, which is block averaging.

    Disjoint W_G commute, so the product is order-free; built directly rather than by
    multiplying so that the entries are exactly 1/g. Ranks in no group are untouched.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    w = np.eye(n)
    seen: set[int] = set()
    for members in groups:
        group = _check_members(n, members)
        overlap = seen.intersection(group)
        if overlap:
            raise ValueError(f"groups overlap in members {sorted(overlap)}")
        seen.update(group)
        w[np.ix_(group, group)] = 1.0 / len(group)
    return w


def rho_single_group(n: int, g: int) -> float:
    """rho for one uniformly random group of size g among n workers: 1 - (g-1)/(n-1).

    By symmetry E[W_G] = a I + b 11^T with b = (g-1)/(n(n-1)) (the chance that i and j
    share the group, over g) and a = E[W_ii] - b. W_G being idempotent, E[W^T W] = E[W],
    whose eigenvalue on the vectors orthogonal to 1 is a = 1 - (g-1)/(n-1).
    """
    _check_n_g(n, g)
    return 1.0 - (g - 1) / (n - 1)


def rho_partition(n: int, g: int) -> float:
    """rho for a uniformly random partition of n workers into n/g groups of size g:
    (n-g) / (g(n-1)). Requires g to divide n."""
    _check_n_g(n, g)
    if n % g:
        raise ValueError(f"a partition into groups of size {g} needs g to divide n={n}")
    return (n - g) / (g * (n - 1))


def _rho_of_mean(n: int, mean_wtw: np.ndarray) -> float:
    # symmetric by construction; the 2-norm of a symmetric matrix is its largest |eigenvalue|
    gap = mean_wtw - np.full((n, n), 1.0 / n)
    return float(np.max(np.abs(np.linalg.eigvalsh((gap + gap.T) / 2.0))))


def rho_monte_carlo(n: int, sampler: Sampler, samples: int, seed: int) -> float:
    """|| E[W^T W] - 11^T/n ||_2 with the expectation replaced by the mean of ``samples``
    matrices drawn by ``sampler``.

    The estimate is biased upwards by the sampling noise (the top eigenvalue of a noisy
    matrix overshoots), by roughly the noise's own spectral norm; a few thousand samples
    keep it within 0.02 at n <= 16.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    rng = np.random.default_rng(seed)
    acc = np.zeros((n, n))
    for _ in range(samples):
        w = sampler(rng)
        if w.shape != (n, n):
            raise ValueError(f"sampler returned shape {w.shape}, expected {(n, n)}")
        acc += w.T @ w
    return _rho_of_mean(n, acc / samples)


def random_group_sampler(n: int, g: int) -> Sampler:
    """Draws W_G for one uniformly random group of size g."""
    _check_n_g(n, g)

    def sample(rng: np.random.Generator) -> np.ndarray:
        return preduce_matrix(n, [int(m) for m in rng.choice(n, size=g, replace=False)])

    return sample


def random_partition_sampler(n: int, g: int) -> Sampler:
    """Draws the block-averaging matrix of a uniformly random partition into groups of g."""
    rho_partition(n, g)  # validates n, g and divisibility

    def sample(rng: np.random.Generator) -> np.ndarray:
        groups = rng.permutation(n).reshape(n // g, g)
        return partition_matrix(n, [[int(m) for m in row] for row in groups])

    return sample


def rho_of_groups(n: int, groups_list: Sequence[Sequence[int]]) -> float:
    """Empirical rho of an observed sequence of P-Reduce groups (one member tuple each):
    || mean_t(W_t^T W_t) - 11^T/n ||_2, to hold the groups a real run produced against the
    formulas. Note that a partition executed as n/g separate groups counts as n/g
    syncs here, each of which mixes only its members."""
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    if not groups_list:
        raise ValueError("need at least one group")
    acc = np.zeros((n, n))
    for members in groups_list:
        w = preduce_matrix(n, members)
        acc += w.T @ w
    return _rho_of_mean(n, acc / len(groups_list))


def consensus_distance(models: np.ndarray | torch.Tensor) -> float:
    """(1/n) sum_i ||x_i - xbar||^2 for n models stacked as the rows of an (n, d) array.

    Accumulated in float64: the spread of nearly converged float32 models is a small
    difference of large numbers.
    """
    if isinstance(models, torch.Tensor):
        x = models.detach().to(device="cpu", dtype=torch.float64).numpy()
    else:
        x = np.asarray(models, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"expected an (n, d) array with n >= 1, got shape {x.shape}")
    centred = x - x.mean(axis=0, keepdims=True)
    return float(np.sum(centred * centred) / x.shape[0])


def predicted_consensus_decay(rho: float, syncs: int) -> float:
    """rho**syncs: the expected contraction of the consensus distance over ``syncs``
    synchronizations with no gradient step in between.

    Derivation. Stack the models as the rows of X (n x d), let J = 11^T/n and
    E_k = (I - J) X_k, so that consensus_distance = ||E_k||_F^2 / n. Every W is doubly
    stochastic, hence JW = WJ = J and (I - J) W = W (I - J), giving E_{k+1} = W_k E_k.
    With W_k drawn independently of the past,

        E[||E_{k+1}||_F^2 | E_k] = tr(E_k^T E[W^T W] E_k) = tr(E_k^T (E[W^T W] - J) E_k)
                                 <= rho ||E_k||_F^2,

    the middle step because J E_k = 0, the last because every column of E_k is orthogonal
    to 1. Induction gives E||x_k - xbar||^2 <= rho^k ||x_0 - xbar||^2 (xbar never moves).
    For the exchangeable distributions here (one random group, one random partition)
    E[W^T W] - J = rho (I - J) exactly, so the bound holds with equality in expectation
    for every starting point, not only along the worst eigenvector; single runs scatter
    around it.
    """
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    if syncs < 0:
        raise ValueError(f"syncs must be >= 0, got {syncs}")
    return float(rho**syncs)


def grid_schedule(rows: int, cols: int) -> list[list[tuple[int, ...]]]:
    """The two partitions of a rows x cols grid of ranks (rank = r*cols + c): the row
    groups (intra-node), then the column groups (inter-node). Averaging rows then columns
    gives exact consensus, W_col W_row = 11^T/n, with groups of only cols and rows ranks."""
    if rows < 1 or cols < 1:
        raise ValueError(f"rows and cols must be >= 1, got {rows} x {cols}")
    row_groups = [tuple(r * cols + c for c in range(cols)) for r in range(rows)]
    col_groups = [tuple(r * cols + c for r in range(rows)) for c in range(cols)]
    return [row_groups, col_groups]
