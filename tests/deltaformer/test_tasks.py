"""Tests for the DeltaFormer state-tracking tasks (`furnace.deltaformer.tasks`).

Checks the swap task and curriculum (DeltaFormer, Xu et al., NeurIPS 2025, Sec. 4.1 / App. G.1),
parity and modular arithmetic (Deletang et al., ICLR 2023; DeltaFormer App. D) and the S5
word problem (Liu et al., ICLR 2023; Merrill et al., ICML 2024) against references written
here independently of the module, plus determinism, ranges, chance and argument errors.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from furnace.deltaformer.tasks import (
    ModularArithmeticTask,
    ParityTask,
    S5Task,
    SwapTask,
    curriculum,
    get_task,
    next_length,
)

ALL_TASKS = [
    ("swap", {}, SwapTask, 0.2),
    ("parity", {}, ParityTask, 0.5),
    ("modarith", {}, ModularArithmeticTask, 0.2),
    ("s5", {}, S5Task, 1 / 120),
]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- independent references (written from the task definitions, not from the module) ----


def _swap_ref(tokens: list[int], n: int = 5) -> list[int]:
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]  # documented encoding
    arr, out = list(range(n)), []
    for tok in tokens:
        i, j = pairs[tok]
        arr[i], arr[j] = arr[j], arr[i]
        out.append(arr[0])
    return out


def _parity_ref(tokens: list[int]) -> list[int]:
    return [sum(tokens[: t + 1]) % 2 for t in range(len(tokens))]


def _modarith_ref(tokens: list[int], m: int = 5) -> list[int]:
    # evaluate each prefix from scratch as a string expression, dropping a trailing operator
    out = []
    for t in range(len(tokens)):
        prefix = tokens[: t + 1] if t % 2 == 0 else tokens[:t]
        text = " ".join(str(x) if x < m else ("+" if x == m else "-") for x in prefix)
        out.append(eval(text) % m)  # safe: the text holds only digits, "+" and "-"
    return out


def _s5_ref(tokens: list[int]) -> list[int]:
    perms = list(itertools.permutations(range(5)))
    state = list(range(5))
    out = []
    for tok in tokens:
        g = perms[tok]
        state = [g[state[i]] for i in range(5)]  # earlier tokens act first
        out.append(perms.index(tuple(state)))
    return out


REFS = {"swap": _swap_ref, "parity": _parity_ref, "modarith": _modarith_ref, "s5": _s5_ref}


@pytest.mark.parametrize("name,kwargs,cls,chance", ALL_TASKS)
def test_labels_match_independent_reference(name, kwargs, cls, chance):
    task = get_task(name, **kwargs)
    assert isinstance(task, cls)
    tokens, labels = task.sample(8, 37, _gen(1))
    assert tokens.shape == labels.shape == (8, 37)
    assert tokens.dtype == labels.dtype == torch.long
    for row_tok, row_lab in zip(tokens.tolist(), labels.tolist()):
        assert row_lab == REFS[name](row_tok)
        assert row_lab == task.reference_labels(row_tok)


@pytest.mark.parametrize("name,kwargs,cls,chance", ALL_TASKS)
def test_ranges_and_chance(name, kwargs, cls, chance):
    task = get_task(name, **kwargs)
    tokens, labels = task.sample(64, 50, _gen(2))
    assert 0 <= int(tokens.min()) and int(tokens.max()) < task.vocab_size
    assert 0 <= int(labels.min()) and int(labels.max()) < task.num_classes
    assert task.chance == pytest.approx(chance)
    assert task.chance == pytest.approx(1 / task.num_classes)


@pytest.mark.parametrize("name,kwargs,cls,chance", ALL_TASKS)
def test_deterministic_for_seed(name, kwargs, cls, chance):
    task = get_task(name, **kwargs)
    a = task.sample(4, 20, _gen(7))
    b = task.sample(4, 20, _gen(7))
    c = task.sample(4, 20, _gen(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_vocab_and_classes():
    assert (SwapTask().vocab_size, SwapTask().num_classes) == (10, 5)
    assert (ParityTask().vocab_size, ParityTask().num_classes) == (2, 2)
    assert (ModularArithmeticTask(7).vocab_size, ModularArithmeticTask(7).num_classes) == (9, 7)
    assert (S5Task().vocab_size, S5Task().num_classes) == (120, 120)
    assert SwapTask(num_elements=4).vocab_size == 6


def test_swap_token_encoding_and_example():
    task = SwapTask()
    assert task.pairs[0] == (0, 1) and task.pairs[3] == (0, 4) and task.pairs[9] == (3, 4)
    # (0,1): [1,0,2,3,4] -> 1; (1,2) moves 0 to position 2, 1 stays at 0; (0,2): 0 back to front
    assert task.reference_labels([0, 4, 1]) == [1, 1, 0]


def test_modarith_layout_and_example():
    task = ModularArithmeticTask(5)
    tokens, _ = task.sample(3, 9, _gen(3))
    assert (tokens[:, 0::2] < 5).all() and (tokens[:, 1::2] >= 5).all()
    # 3 + 4 - 2 = 5 -> 0 (mod 5); operator positions repeat the value so far
    assert task.reference_labels([3, task.plus, 4, task.minus, 2]) == [3, 3, 2, 2, 0]
    with pytest.raises(ValueError):
        task.reference_labels([task.plus])


def test_s5_identity_and_composition_order():
    task = S5Task()
    assert task.perms[0] == (0, 1, 2, 3, 4)
    g, h = 1, 7  # two non-commuting permutations
    gh = task.perms.index(tuple(task.perms[h][task.perms[g][i]] for i in range(5)))
    assert task.reference_labels([g, h]) == [g, gh]
    assert task.reference_labels([0]) == [0]


def test_curriculum_stages():
    stages = list(curriculum(256, 4000))
    assert [length for _, length in stages] == [32, 64, 128, 256]
    assert [step for step, _ in stages] == [0, 1000, 2000, 3000]
    # non-power-of-two final length is clipped; short final lengths give one stage
    assert [length for _, length in curriculum(100, 30)] == [32, 64, 100]
    assert list(curriculum(16, 10)) == [(0, 16)]
    assert [length for _, length in curriculum(32, 10, start_length=4)] == [4, 8, 16, 32]
    for final in (1, 5, 33, 256, 1000):
        assert list(curriculum(final, 100))[-1][1] == final


def test_next_length():
    assert next_length(32, 0.995, 256) == 64
    assert next_length(32, 0.9, 256) == 32
    assert next_length(200, 1.0, 256) == 256
    with pytest.raises(ValueError):
        next_length(300, 1.0, 256)


@pytest.mark.parametrize(
    "build",
    [
        lambda: SwapTask(num_elements=1),
        lambda: ModularArithmeticTask(modulus=1),
        lambda: S5Task(num_elements=7),
        lambda: get_task("nope"),
        lambda: get_task("parity", modulus=3),
        lambda: SwapTask().sample(0, 4, _gen()),
        lambda: ParityTask().sample(2, 0, _gen()),
        lambda: S5Task().sample(2, -1, _gen()),
        lambda: SwapTask().reference_labels([10]),
        lambda: list(curriculum(0, 10)),
        lambda: list(curriculum(256, 2)),
    ],
)
def test_bad_arguments_raise(build):
    with pytest.raises(ValueError):
        build()


def test_generator_type_checked():
    with pytest.raises(TypeError):
        ParityTask().sample(2, 3, 0)
