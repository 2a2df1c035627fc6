"""State-tracking tasks for DeltaFormer experiments, generated on the fly (no external data).

Implements the synthetic tasks of design note `deltaformer.md` Sec. 4 and experiment (b):

- `SwapTask`: the swap task of DeltaFormer (Xu et al., NeurIPS 2025, Sec. 4.1 and App. G.1),
  plus its length curriculum (`curriculum`, `next_length`).
- `ParityTask` and `ModularArithmeticTask`: the regular tasks "parity" and "modular
  arithmetic (simple)" of the Chomsky-hierarchy suite (Deletang et al., ICLR 2023), as used
  in DeltaFormer App. D.
- `S5Task`: the S5 word problem (Liu et al., "Transformers learn shortcuts to automata",
  ICLR 2023; Merrill, Petty & Sabharwal, "The Illusion of State", ICML 2024), with one
  token per permutation as in Grazzi et al.'s setup (design note Sec. 6).

Every task is a dataclass with ``vocab_size``, ``num_classes``, ``chance`` and
``sample(batch_size, length, generator) -> (tokens, labels)``, both ``LongTensor [B, T]``.
Labels are given at every position so training can be dense; the honest metric is the
last position (design note, experiment (b)). ``reference_labels`` is a plain Python loop
over one sequence, kept independent of the vectorised ``sample`` so tests can check one
against the other. `get_task` builds a task by name.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

__all__ = [
    "TASKS",
    "ModularArithmeticTask",
    "ParityTask",
    "S5Task",
    "SwapTask",
    "curriculum",
    "get_task",
    "next_length",
]


def _check_sample_args(batch_size: int, length: int, generator: torch.Generator) -> None:
    # bool is an int subclass; rejecting it catches swapped positional arguments early
    for name, value in (("batch_size", batch_size), ("length", length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator (seeded for determinism), got {type(generator)}"
        )


def _check_tokens(tokens: Sequence[int], vocab_size: int) -> list[int]:
    out = [int(t) for t in tokens]
    bad = [t for t in out if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"tokens must lie in [0, {vocab_size}), got {bad[:5]}")
    return out


# --------------------------------------------------------------------------------------
# Swap task (DeltaFormer Sec. 4.1, App. G.1)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SwapTask:
    """Track an arrangement of ``num_elements`` objects under a stream of transpositions.

    The arrangement starts as the identity, ``arr = [0, 1, ..., n-1]`` (``arr[p]`` is the
    element at position ``p``). Token encoding: token ``k`` is the k-th pair ``(i, j)``,
    ``i < j``, in lexicographic order, i.e. ``itertools.combinations(range(n), 2)``; for
    n = 5 that is (0,1)->0, (0,2)->1, (0,3)->2, (0,4)->3, (1,2)->4, ..., (3,4)->9. Applying
    a token swaps the contents of positions i and j. The label at step t is the element at
    position 0 after the first t+1 swaps (the paper says "position 1", 1-indexed).
    For n >= 5 this is NC^1-complete (Barrington), which is why a TC^0 Transformer fails.
    """

    num_elements: int = 5
    pairs: tuple[tuple[int, int], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n = self.num_elements
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ValueError(f"num_elements must be an int >= 2 (need a pair to swap), got {n!r}")
        object.__setattr__(self, "pairs", tuple(itertools.combinations(range(n), 2)))

    @property
    def vocab_size(self) -> int:
        return len(self.pairs)

    @property
    def num_classes(self) -> int:
        return self.num_elements

    @property
    def chance(self) -> float:
        return 1.0 / self.num_elements

    def sample(
        self, batch_size: int, length: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_sample_args(batch_size, length, generator)
        tokens = torch.randint(0, self.vocab_size, (batch_size, length), generator=generator)
        pairs = torch.tensor(self.pairs, dtype=torch.long)  # [V, 2]
        first, second = pairs[tokens, 0], pairs[tokens, 1]  # [B, T] position indices
        arr = torch.arange(self.num_elements).repeat(batch_size, 1)  # [B, n]
        labels = torch.empty(batch_size, length, dtype=torch.long)
        rows = torch.arange(batch_size)
        # a loop over T (not B): each step is one gather/scatter for the whole batch
        for t in range(length):
            i, j = first[:, t], second[:, t]
            a, b = arr[rows, i], arr[rows, j]
            arr[rows, i] = b
            arr[rows, j] = a
            labels[:, t] = arr[:, 0]
        return tokens, labels

    def reference_labels(self, tokens: Sequence[int]) -> list[int]:
        """Labels of one sequence by simulating the swaps on a Python list."""
        arr = list(range(self.num_elements))
        out = []
        for tok in _check_tokens(tokens, self.vocab_size):
            i, j = self.pairs[tok]
            arr[i], arr[j] = arr[j], arr[i]
            out.append(arr[0])
        return out


def curriculum(final_length: int, steps: int, start_length: int = 32) -> Iterator[tuple[int, int]]:
    """Fixed-budget version of the paper's swap-task length curriculum.

    The paper (design note Sec. 4) starts at length 32 and doubles whenever accuracy reaches
    0.99, up to 256; trained directly at 256 the model stays at chance. That rule is
    `next_length`. This helper is ours, for runs with a fixed step budget: lengths double
    from ``min(start_length, final_length)`` and the last stage is clipped to
    ``final_length``; ``steps`` is split evenly over the stages (remainder to the last, so
    the longest length gets the most). Yields ``(first_step, length)`` per stage; the last
    stage always has ``length == final_length``.
    """
    for name, value in (("final_length", final_length), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if isinstance(start_length, bool) or not isinstance(start_length, int) or start_length < 1:
        raise ValueError(f"start_length must be a positive int, got {start_length!r}")
    lengths = [min(start_length, final_length)]
    while lengths[-1] < final_length:
        lengths.append(min(2 * lengths[-1], final_length))
    if steps < len(lengths):
        raise ValueError(
            f"steps={steps} is fewer than the {len(lengths)} curriculum stages {lengths}"
        )
    per_stage = steps // len(lengths)
    for k, length in enumerate(lengths):
        yield k * per_stage, length


def next_length(length: int, accuracy: float, final_length: int, threshold: float = 0.99) -> int:
    """The paper's accuracy-triggered rule: double ``length`` (capped at ``final_length``)
    once ``accuracy`` reaches ``threshold``, else keep it."""
    if length < 1 or final_length < length:
        raise ValueError(f"need 1 <= length <= final_length, got {length}, {final_length}")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must lie in (0, 1], got {threshold}")
    return min(2 * length, final_length) if accuracy >= threshold else length


# --------------------------------------------------------------------------------------
# Chomsky-hierarchy regular tasks (Deletang et al., ICLR 2023; DeltaFormer App. D)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParityTask:
    """Bits in {0, 1}; the label at step t is the parity (XOR) of bits 0..t."""

    @property
    def vocab_size(self) -> int:
        return 2

    @property
    def num_classes(self) -> int:
        return 2

    @property
    def chance(self) -> float:
        return 0.5

    def sample(
        self, batch_size: int, length: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_sample_args(batch_size, length, generator)
        tokens = torch.randint(0, 2, (batch_size, length), generator=generator)
        return tokens, tokens.cumsum(dim=1) % 2

    def reference_labels(self, tokens: Sequence[int]) -> list[int]:
        acc, out = 0, []
        for bit in _check_tokens(tokens, 2):
            acc ^= bit
            out.append(acc)
        return out


@dataclass(frozen=True)
class ModularArithmeticTask:
    """Modular arithmetic (simple): ``n0 op1 n1 op2 n2 ...`` evaluated mod ``modulus``.

    The design note names the task but does not define its operators; we use ``+`` and
    ``-`` evaluated left to right (our choice, as in the brief), so the running value is a
    walk on Z_m, a regular language. Token encoding: numbers ``0..m-1`` are tokens
    ``0..m-1``, ``+`` is token ``m`` and ``-`` is token ``m+1``. Even positions hold numbers
    and odd positions operators, so a sequence always starts with a number. The label at
    step t is the value of the prefix 0..t; at an operator position the pending operator is
    not applied yet, so the label repeats the value so far.
    """

    modulus: int = 5

    def __post_init__(self) -> None:
        m = self.modulus
        if isinstance(m, bool) or not isinstance(m, int) or m < 2:
            raise ValueError(f"modulus must be an int >= 2, got {m!r}")

    @property
    def plus(self) -> int:
        return self.modulus

    @property
    def minus(self) -> int:
        return self.modulus + 1

    @property
    def vocab_size(self) -> int:
        return self.modulus + 2

    @property
    def num_classes(self) -> int:
        return self.modulus

    @property
    def chance(self) -> float:
        return 1.0 / self.modulus

    def sample(
        self, batch_size: int, length: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_sample_args(batch_size, length, generator)
        m = self.modulus
        numbers = torch.randint(0, m, (batch_size, length), generator=generator)
        signs = torch.randint(0, 2, (batch_size, length), generator=generator)  # 1 means '-'
        is_op = (torch.arange(length) % 2 == 1).expand(batch_size, length)
        tokens = torch.where(is_op, m + signs, numbers)
        # the operator before number position t sits at t-1; position 0 is implicitly '+'
        sign_of_number = torch.ones(batch_size, length, dtype=torch.long)
        sign_of_number[:, 2::2] = 1 - 2 * signs[:, 1:-1:2]
        contrib = torch.where(is_op, torch.zeros_like(numbers), sign_of_number * numbers)
        return tokens, contrib.cumsum(dim=1) % m

    def reference_labels(self, tokens: Sequence[int]) -> list[int]:
        m = self.modulus
        value, op, out = 0, self.plus, []
        for t, tok in enumerate(_check_tokens(tokens, self.vocab_size)):
            if t % 2 == 0:
                if tok >= m:
                    raise ValueError(f"position {t} must hold a number < {m}, got {tok}")
                value = (value + tok) % m if op == self.plus else (value - tok) % m
            else:
                if tok < m:
                    raise ValueError(f"position {t} must hold an operator, got number {tok}")
                op = tok
            out.append(value)
        return out


# --------------------------------------------------------------------------------------
# S5 word problem (Liu et al., ICLR 2023; Merrill et al., ICML 2024)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class S5Task:
    """Running product of permutations of ``num_elements`` objects (S_5 by default).

    Token k is the k-th permutation of ``itertools.permutations(range(n))`` (lexicographic;
    token 0 is the identity), in one-line notation: ``p[i]`` is the image of ``i``. The
    label at step t is the index (same table) of ``P_t = g_t o g_{t-1} o ... o g_0``, i.e.
    ``P_t[i] = g_t[P_{t-1}[i]]``: earlier tokens act first. ``num_elements`` is capped at 6
    because the composition table is (n!)^2 entries.
    """

    num_elements: int = 5
    perms: tuple[tuple[int, ...], ...] = field(init=False, repr=False)
    table: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = self.num_elements
        if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= 6:
            raise ValueError(f"num_elements must be an int in [2, 6], got {n!r}")
        perms = tuple(itertools.permutations(range(n)))
        index = {p: k for k, p in enumerate(perms)}
        # table[g, p] = index of g o p, so one lookup per step advances the whole batch
        table = torch.tensor(
            [[index[tuple(g[p[i]] for i in range(n))] for p in perms] for g in perms],
            dtype=torch.long,
        )
        object.__setattr__(self, "perms", perms)
        object.__setattr__(self, "table", table)

    @property
    def vocab_size(self) -> int:
        return math.factorial(self.num_elements)

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    @property
    def chance(self) -> float:
        return 1.0 / self.vocab_size

    def sample(
        self, batch_size: int, length: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _check_sample_args(batch_size, length, generator)
        tokens = torch.randint(0, self.vocab_size, (batch_size, length), generator=generator)
        labels = torch.empty(batch_size, length, dtype=torch.long)
        state = torch.zeros(batch_size, dtype=torch.long)  # identity
        for t in range(length):
            state = self.table[tokens[:, t], state]
            labels[:, t] = state
        return tokens, labels

    def reference_labels(self, tokens: Sequence[int]) -> list[int]:
        """Labels of one sequence by composing tuples directly (no table)."""
        n = self.num_elements
        state = tuple(range(n))
        out = []
        for tok in _check_tokens(tokens, self.vocab_size):
            g = self.perms[tok]
            state = tuple(g[state[i]] for i in range(n))
            out.append(self.perms.index(state))
        return out


TASKS = {
    "swap": SwapTask,
    "parity": ParityTask,
    "modarith": ModularArithmeticTask,
    "s5": S5Task,
}


def get_task(name: str, **kwargs) -> SwapTask | ParityTask | ModularArithmeticTask | S5Task:
    """Build a task by name ("swap", "parity", "modarith", "s5"); kwargs go to its class."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}")
    try:
        return TASKS[name](**kwargs)
    except TypeError as exc:  # an unknown keyword: report it as a bad argument
        raise ValueError(f"bad arguments for task {name!r}: {exc}") from exc
