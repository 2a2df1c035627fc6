"""Tests of the masks and block grids of UltraAttn's context parallelism
(`furnace.context_parallel.masks`; design note §2.1 and §3): every factory against a Python
double loop over its definition, grid kinds and exact counts against a brute-force count
(ragged last blocks, batch- and head-dependent masks), the BlockMask round trip in both
directions and FlexAttention's own output on our BlockMask, mask validation, the named
masks with their defaults, and the sampled estimate."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from furnace.context_parallel.config import LayoutError, MaskError
from furnace.context_parallel.masks import (
    DOCUMENT_PROPORTIONS,
    EMPTY,
    FULL,
    MASK_DEFAULTS,
    MASK_NAMES,
    PARTIAL,
    BlockGrid,
    MaskMod,
    build_block_grid,
    causal_mask,
    check_mask_mod,
    document_mask,
    evaluate_mask,
    full_mask,
    global_local_mask,
    grid_from_block_mask,
    make_mask,
    random_block_mask,
    sampled_block_grid,
    sliding_window_mask,
    star_mask,
    streaming_mask,
    strided_mask,
)
from furnace.runtime.testing import assert_close

Predicate = Callable[[int, int], bool]
CU_SEQLENS = (0, 5, 9, 17, 30)  # tokens 30.. of a 37-token sequence belong to no document


def _doc(i: int) -> int:
    return next((d for d in range(len(CU_SEQLENS) - 1)
                 if CU_SEQLENS[d] <= i < CU_SEQLENS[d + 1]), -1)


def _random_table(seq_len: int, granule: int, density: float, seed: int) -> list[list[bool]]:
    n = -(-seq_len // granule)
    draws = torch.rand(n, n, generator=torch.Generator().manual_seed(seed)).tolist()
    return [[draws[i][j] < density or i == j for j in range(n)] for i in range(n)]


def _cases(seq_len: int) -> list[tuple[str, MaskMod, Predicate]]:
    """(id, mask, the definition as a Python predicate over (q, kv))."""
    table = _random_table(seq_len, 3, 0.4, 7)

    def strided(q: int, k: int) -> bool:
        d = q // 3 - k // 3
        return k <= q and (d % 4 == 0 or d < 2)

    return [
        ("causal", causal_mask(), lambda q, k: k <= q),
        ("full", full_mask(), lambda q, k: True),
        ("sliding_window", sliding_window_mask(5), lambda q, k: 0 <= q - k < 5),
        ("strided", strided_mask(3, 4, 2), strided),
        ("global_local", global_local_mask(3, 4), lambda q, k: k <= q and (k < 3 or q - k < 4)),
        ("star", star_mask(4, 9), lambda q, k: k <= q and (k < 4 or q // 9 == k // 9)),
        ("streaming", streaming_mask(2, 6), lambda q, k: k <= q and (k < 2 or q - k < 6)),
        ("document", document_mask(CU_SEQLENS),
         lambda q, k: k <= q and _doc(q) == _doc(k) >= 0),
        ("document_bidirectional", document_mask(torch.tensor(CU_SEQLENS), causal=False),
         lambda q, k: _doc(q) == _doc(k) >= 0),
        ("random", random_block_mask(seq_len, 3, 0.4, 7),
         lambda q, k: k <= q and table[q // 3][k // 3]),
        ("random_noncausal", random_block_mask(seq_len, 3, 0.4, 7, causal=False),
         lambda q, k: table[q // 3][k // 3]),
    ]


def _dense(predicate: Predicate, seq_len: int) -> np.ndarray:
    return np.array([[predicate(q, k) for k in range(seq_len)] for q in range(seq_len)])


def _brute_grid(allowed: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts and kinds by counting every element; allowed is (B, H, S, S)."""
    batch, heads, seq_len, _ = allowed.shape
    num_blocks = -(-seq_len // block_size)
    per = np.zeros((batch, heads, num_blocks, num_blocks), dtype=np.int64)
    area = np.zeros((num_blocks, num_blocks), dtype=np.int64)
    for q in range(seq_len):
        for k in range(seq_len):
            area[q // block_size, k // block_size] += 1
            per[:, :, q // block_size, k // block_size] += allowed[:, :, q, k]
    kinds = np.full((num_blocks, num_blocks), PARTIAL)
    kinds[(per == 0).all(axis=(0, 1))] = EMPTY
    kinds[(per == area).all(axis=(0, 1))] = FULL
    return per.max(axis=(0, 1)), kinds


@pytest.mark.parametrize("seq_len", [21, 37])
def test_factories_match_their_definitions(seq_len: int) -> None:
    idx = torch.arange(seq_len)
    for name, mask, predicate in _cases(seq_len):
        got = evaluate_mask(mask, idx, idx)
        assert got.shape == (1, 1, seq_len, seq_len) and got.dtype == torch.bool, name
        np.testing.assert_array_equal(got[0, 0].numpy(), _dense(predicate, seq_len),
                                      err_msg=name)
        # any subset and order of ids, with batch and heads expanded
        perm = torch.randperm(seq_len, generator=torch.Generator().manual_seed(1))[:11]
        sub = evaluate_mask(mask, perm, idx.flip(0), batch=2, heads=3)
        assert sub.shape == (2, 3, 11, seq_len)
        assert torch.equal(sub[1, 2], got[0, 0][perm][:, idx.flip(0)]), name


def test_document_rows_past_the_end_attend_nothing() -> None:
    idx = torch.arange(37)
    allowed = evaluate_mask(document_mask(CU_SEQLENS), idx, idx)[0, 0]
    assert not allowed[30:].any() and not allowed[:, 30:].any()
    assert allowed[:30].any(dim=1).all()  # causal: every real token sees itself
    grid = build_block_grid(document_mask(CU_SEQLENS), 37, 8)
    assert grid.kinds[4].tolist() == [EMPTY] * 5 and grid.counts[4].sum() == 0


def test_factory_names_and_argument_errors() -> None:
    assert causal_mask().__name__ == "causal"
    assert sliding_window_mask(64).__name__ == "sliding_window(64)"
    assert strided_mask(4, 2).__name__ == "strided(4,2,1)"
    bad: list[tuple[str, Callable[[], MaskMod]]] = [
        ("window", lambda: sliding_window_mask(0)),
        ("granule", lambda: strided_mask(0, 4)),
        ("stride", lambda: strided_mask(2, 0)),
        ("local", lambda: strided_mask(2, 2, -1)),
        ("num_global", lambda: global_local_mask(-1, 2)),
        ("window", lambda: global_local_mask(1, 0)),
        ("chunk", lambda: star_mask(1, 0)),
        ("num_sink", lambda: streaming_mask(True, 3)),  # type: ignore[arg-type]
        ("cu_seqlens", lambda: document_mask([1, 5])),
        ("cu_seqlens", lambda: document_mask([0, 5, 5])),
        ("cu_seqlens", lambda: document_mask([0])),
        ("cu_seqlens", lambda: document_mask(torch.tensor([0.0, 4.0]))),
        ("causal", lambda: document_mask([0, 4], causal=1)),  # type: ignore[arg-type]
        ("density", lambda: random_block_mask(16, 2, 1.5, 0)),
        ("granule", lambda: random_block_mask(16, 0, 0.5, 0)),
        ("seq_len", lambda: random_block_mask(0, 2, 0.5, 0)),
    ]
    for field_name, build in bad:
        with pytest.raises(MaskError) as info:
            build()
        assert info.value.field == field_name


def test_random_mask_is_seeded() -> None:
    idx = torch.arange(64)
    first = evaluate_mask(random_block_mask(64, 4, 0.5, 3, causal=False), idx, idx)
    again = evaluate_mask(random_block_mask(64, 4, 0.5, 3, causal=False), idx, idx)
    other = evaluate_mask(random_block_mask(64, 4, 0.5, 4, causal=False), idx, idx)
    assert torch.equal(first, again) and not torch.equal(first, other)
    # granules off the diagonal are Bernoulli(0.5): 240 draws land well inside (0.3, 0.7)
    off_diagonal = first[0, 0, ::4, ::4][~torch.eye(16, dtype=torch.bool)]
    assert 0.3 < off_diagonal.double().mean().item() < 0.7


@pytest.mark.parametrize(("seq_len", "block_size"), [(37, 8), (37, 5), (21, 21), (13, 1),
                                                     (32, 8)])
def test_grid_kinds_and_counts_match_brute_force(seq_len: int, block_size: int) -> None:
    for name, mask, predicate in _cases(seq_len):
        grid = build_block_grid(mask, seq_len, block_size)
        dense = _dense(predicate, seq_len)
        counts, kinds = _brute_grid(dense[None, None], block_size)
        np.testing.assert_array_equal(grid.counts, counts, err_msg=name)
        np.testing.assert_array_equal(grid.kinds, kinds, err_msg=name)
        assert grid.counts.dtype == np.int64 and grid.kinds.dtype == np.int8
        assert grid.exact and grid.num_blocks == -(-seq_len // block_size)
        assert grid.total_work == int(dense.sum())
        assert grid.density == pytest.approx(dense.mean(), rel=1e-12)
        assert grid.num_full == int((kinds == FULL).sum())
        assert grid.num_partial == int((kinds == PARTIAL).sum())
        rows, cols = np.nonzero(kinds != EMPTY)
        assert grid.nonempty() == list(zip(rows.tolist(), cols.tolist()))
        assert all(grid.work(r, c) == counts[r, c] for r, c in grid.nonempty())


def test_grid_geometry_and_picture() -> None:
    grid = build_block_grid(causal_mask(), 37, 8)
    assert [grid.block_start(i) for i in range(5)] == [0, 8, 16, 24, 32]
    assert [grid.block_len(i) for i in range(5)] == [8, 8, 8, 8, 5]
    assert grid.block_lens.tolist() == [8, 8, 8, 8, 5]
    assert grid.block_tokens(4).tolist() == list(range(32, 37))
    assert grid.block_tokens(4).dtype == torch.int64
    with pytest.raises(LayoutError):
        grid.block_len(5)
    picture = grid.describe().splitlines()
    assert picture[0].startswith("causal:")
    assert picture[1:] == ["+....", "#+...", "##+..", "###+.", "####+"]
    with pytest.raises(AttributeError):
        grid.seq_len = 3  # type: ignore[misc]
    with pytest.raises(ValueError):
        grid.counts[0, 0] = 5
    for block_size in (0, 38):
        with pytest.raises(LayoutError) as info:
            build_block_grid(causal_mask(), 37, block_size)
        assert info.value.field == "block_size"
    with pytest.raises(LayoutError):
        BlockGrid(seq_len=37, block_size=8, num_blocks=4, counts=np.zeros((4, 4), np.int64),
                  kinds=np.zeros((4, 4), np.int8), mask_mod=causal_mask())


def _head_batch_mask(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                     kv: torch.Tensor) -> torch.Tensor:
    # batch 0: causal; batch 1: a window; head 2 additionally sees everything of block 0
    window = (b == 0) | (q - kv < 6)
    return (kv <= q) & (window | ((h == 2) & (kv < 8)))


def _head_batch_predicate(b: int, h: int, q: int, k: int) -> bool:
    return k <= q and (b == 0 or q - k < 6 or (h == 2 and k < 8))


def test_batch_and_head_dependent_masks_fold_by_union() -> None:
    seq_len, block_size, batch, heads = 29, 8, 2, 3
    grid = build_block_grid(_head_batch_mask, seq_len, block_size, batch=batch, heads=heads)
    dense = np.array([[[[_head_batch_predicate(b, h, q, k) for k in range(seq_len)]
                        for q in range(seq_len)] for h in range(heads)] for b in range(batch)])
    counts, kinds = _brute_grid(dense, block_size)
    np.testing.assert_array_equal(grid.counts, counts)
    np.testing.assert_array_equal(grid.kinds, kinds)
    assert (grid.batch, grid.heads) == (batch, heads)
    # block (2, 0) is full for batch 0 and head 2 of batch 1 but empty elsewhere: partial,
    # weighted by its busiest (b, h); a single (b, h) would call it full
    assert grid.kinds[2, 0] == PARTIAL and grid.counts[2, 0] == 64
    single = build_block_grid(_head_batch_mask, seq_len, block_size)
    assert single.kinds[2, 0] == FULL


def _same_grid(a: BlockGrid, b: BlockGrid, label: str) -> None:
    np.testing.assert_array_equal(a.kinds, b.kinds, err_msg=label)
    np.testing.assert_array_equal(a.counts, b.counts, err_msg=label)
    assert (a.seq_len, a.block_size, a.num_blocks) == (b.seq_len, b.block_size, b.num_blocks)


def test_block_mask_round_trips() -> None:
    seq_len, block_size = 37, 8
    idx = torch.arange(seq_len)
    for name, mask, _ in _cases(seq_len):
        grid = build_block_grid(mask, seq_len, block_size)
        for batch, heads in ((None, None), (2, 3)):
            block_mask = grid.to_block_mask(batch=batch, heads=heads)
            assert isinstance(block_mask, BlockMask)
            assert block_mask.BLOCK_SIZE == (block_size, block_size)
            assert tuple(block_mask.seq_lengths) == (seq_len, seq_len)
            back = grid_from_block_mask(block_mask, seq_len)
            _same_grid(back, grid, f"{name} via to_block_mask {batch} {heads}")
        # torch's own BlockMask of the ragged sequence (its padded last block is partial)
        made = create_block_mask(mask, B=None, H=None, Q_LEN=seq_len, KV_LEN=seq_len,
                                 BLOCK_SIZE=block_size, device="cpu")
        from_torch = grid_from_block_mask(made, seq_len)
        _same_grid(from_torch, grid, f"{name} via create_block_mask")
        assert torch.equal(evaluate_mask(from_torch.mask_mod, idx, idx),
                           evaluate_mask(mask, idx, idx)), name


def test_block_mask_with_heads_and_block_tables() -> None:
    seq_len, block_size = 29, 8
    made = create_block_mask(_head_batch_mask, B=2, H=3, Q_LEN=seq_len, KV_LEN=seq_len,
                             BLOCK_SIZE=block_size, device="cpu")
    grid = grid_from_block_mask(made, seq_len)
    _same_grid(grid, build_block_grid(_head_batch_mask, seq_len, block_size, batch=2,
                                      heads=3), "head-dependent")
    assert (grid.batch, grid.heads) == (2, 3)

    # a BlockMask given as block tables only (no mask_mod, so a listed block allows all of
    # its elements): head 0 lists blocks (0, 0) and (1, 1) as partial, head 1 lists (1, 0)
    # as full; the union is partial wherever the heads differ
    kv_idx = torch.tensor([[[[0, 1], [1, 0]], [[0, 1], [0, 1]]]], dtype=torch.int32)
    tables = BlockMask.from_kv_blocks(
        torch.tensor([[[1, 1], [0, 0]]], dtype=torch.int32), kv_idx,
        torch.tensor([[[0, 0], [0, 1]]], dtype=torch.int32),
        torch.zeros((1, 2, 2, 2), dtype=torch.int32), BLOCK_SIZE=4, seq_lengths=(7, 7))
    grid = grid_from_block_mask(tables, 7)
    assert grid.kinds.tolist() == [[PARTIAL, EMPTY], [PARTIAL, PARTIAL]]
    assert grid.counts.tolist() == [[16, 0], [12, 9]]  # the ragged edge cuts block 1
    one_head = BlockMask.from_kv_blocks(torch.tensor([[[1, 1]]], dtype=torch.int32),
                                        kv_idx[:, :1], BLOCK_SIZE=4, seq_lengths=(7, 7))
    assert grid_from_block_mask(one_head, 7).kinds.tolist() == [[FULL, EMPTY], [EMPTY, FULL]]
    idx = torch.arange(7)
    allowed = evaluate_mask(grid.mask_mod, idx, idx, heads=2)
    assert allowed[0, 0, :4, :4].all() and not allowed[0, 1, :4, :4].any()
    assert allowed[0, 1, 4:, :4].all() and not allowed[0, 0, 4:, :4].any()
    assert not allowed[0, :, :4, 4:].any()

    with pytest.raises(MaskError):
        grid_from_block_mask(tables, 9)  # seq_lengths disagree
    rectangular = create_block_mask(causal_mask(), None, None, 32, 32, BLOCK_SIZE=(8, 16),
                                    device="cpu")
    with pytest.raises(MaskError):
        grid_from_block_mask(rectangular, 32)


def test_flex_attention_on_our_block_mask_matches_dense() -> None:
    # FlexAttention's own (eager, CPU) output with our BlockMask, ragged last block and
    # fully masked rows included, against the masked softmax written out
    seq_len, head_dim = 37, 8
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, seq_len, head_dim, dtype=torch.float64, generator=gen)
    idx = torch.arange(seq_len)
    for mask in (causal_mask(), document_mask(CU_SEQLENS), strided_mask(3, 4, 2)):
        grid = build_block_grid(mask, seq_len, 8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager flex warns that it is not compiled
            out = flex_attention(q, k, v, block_mask=grid.to_block_mask())
        assert isinstance(out, torch.Tensor)
        scores = (q @ k.transpose(-1, -2)) * head_dim ** -0.5
        scores = scores.masked_fill(~evaluate_mask(mask, idx, idx), float("-inf"))
        ref = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v
        assert_close(grid.mask_mod.__name__, ref, out, 1e-10, scale=v.abs().max().item())


def test_check_mask_mod_rejects_bad_masks() -> None:
    def two_args(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return q >= kv

    def raises(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
               kv: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")

    def integer(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                kv: torch.Tensor) -> torch.Tensor:
        return q - kv

    def python_bool(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                    kv: torch.Tensor) -> bool:
        return True

    def wrong_shape(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                    kv: torch.Tensor) -> torch.Tensor:
        return torch.ones(3, 3, dtype=torch.bool)

    for bad in (two_args, raises, integer, python_bool, wrong_shape, "causal"):
        with pytest.raises(MaskError) as info:
            check_mask_mod(bad, 16)
        assert info.value.field == "mask"
        assert "mask_mod(b, h, q_idx, kv_idx)" in info.value.allowed
    with pytest.raises(MaskError):
        build_block_grid(integer, 16, 4)
    with pytest.raises(MaskError, match="boom"):
        build_block_grid(raises, 16, 4)

    def scalar_true(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                    kv: torch.Tensor) -> torch.Tensor:
        return b.new_ones((), dtype=torch.bool)  # FlexAttention's noop mask returns this

    check_mask_mod(scalar_true, 16)
    check_mask_mod(_head_batch_mask, 16)
    assert build_block_grid(scalar_true, 16, 4).num_full == 16


def test_make_mask_defaults_and_overrides() -> None:
    assert set(MASK_DEFAULTS) == set(MASK_NAMES)
    seq_len = 160
    idx = torch.arange(seq_len)
    expected: dict[str, MaskMod] = {
        "causal": causal_mask(),
        "full": full_mask(),
        "sliding_window": sliding_window_mask(20),
        "strided": strided_mask(10, 4, 2),
        "global_local": global_local_mask(10, 10),
        "star": star_mask(20, 40),
        "streaming": streaming_mask(20, 60),
        "document": document_mask([0, 30, 40, 60, 70, 80, 120, 140, 160]),
        "random": random_block_mask(seq_len, 10, 0.3, 0),
    }
    for name in MASK_NAMES:
        mask = make_mask(name, seq_len)
        assert mask.__name__ == expected[name].__name__
        assert torch.equal(evaluate_mask(mask, idx, idx),
                           evaluate_mask(expected[name], idx, idx)), name
        for tiny in (1, 2, 7):  # the defaults stay valid on sequences shorter than 16
            build_block_grid(make_mask(name, tiny), tiny, 1)
    assert MASK_DEFAULTS["document"](seq_len)["cu_seqlens"] == (0, 30, 40, 60, 70, 80, 120,
                                                                 140, 160)
    assert sum(DOCUMENT_PROPORTIONS) == 16
    ragged = MASK_DEFAULTS["document"](37)["cu_seqlens"]
    assert ragged[0] == 0 and ragged[-1] == 37 and all(a < b for a, b in zip(ragged, ragged[1:]))

    overrides: list[tuple[str, dict[str, object], MaskMod]] = [
        ("sliding_window", {"window": 3}, sliding_window_mask(3)),
        ("strided", {"stride": 2}, strided_mask(10, 2, 2)),
        ("star", {"anchor": 0, "chunk": 16}, star_mask(0, 16)),
        ("document", {"cu_seqlens": (0, 100), "causal": False},
         document_mask((0, 100), causal=False)),
        ("random", {"seed": 5, "density": 0.6}, random_block_mask(seq_len, 10, 0.6, 5)),
    ]
    for name, params, reference in overrides:
        assert torch.equal(evaluate_mask(make_mask(name, seq_len, **params), idx, idx),
                           evaluate_mask(reference, idx, idx)), name
    with pytest.raises(MaskError) as info:
        make_mask("checkerboard", seq_len)
    assert info.value.field == "mask" and "causal" in info.value.allowed
    with pytest.raises(MaskError) as info:
        make_mask("sliding_window", seq_len, width=4)
    assert info.value.field == "width" and "window" in info.value.allowed
    with pytest.raises(MaskError) as info:
        make_mask("causal", seq_len, window=4)
    assert info.value.field == "window"
    with pytest.raises(MaskError) as info:
        make_mask("strided", seq_len, stride=0)
    assert info.value.field == "stride"


def test_sampled_grid_estimates_and_agrees_on_block_aligned_masks() -> None:
    seq_len, block_size = 100, 16  # ragged: the last block holds 4 tokens
    aligned = [causal_mask(), full_mask(), strided_mask(16, 3, 1), star_mask(16, 32),
               random_block_mask(seq_len, 16, 0.5, 2), document_mask([0, 32, 48, 96])]
    for mask in aligned:
        exact = build_block_grid(mask, seq_len, block_size)
        for samples in (3, 32):
            sampled = sampled_block_grid(mask, seq_len, block_size, samples_per_block=samples)
            assert not sampled.exact and exact.exact
            np.testing.assert_array_equal(sampled.kinds, exact.kinds, err_msg=mask.__name__)
            full = exact.kinds == FULL
            np.testing.assert_array_equal(sampled.counts[full], exact.counts[full])
            assert (sampled.counts[exact.kinds == EMPTY] == 0).all()
            areas = np.outer(exact.block_lens, exact.block_lens)
            partial = exact.kinds == PARTIAL
            assert ((sampled.counts[partial] >= 1) &
                    (sampled.counts[partial] < areas[partial])).all()
    # a causal diagonal block sampled on a 3x3 lattice: 6 of 9 samples, estimated 2/3
    sampled = sampled_block_grid(causal_mask(), 64, 16, samples_per_block=3)
    assert sampled.counts[1, 1] == round(256 * 6 / 9)
    assert "(sampled)" in sampled.describe()
    # a document boundary strictly inside a block, between lattice points: the estimate is
    # only an estimate (the exact grid sees two documents in block 0, the lattice one)
    inside = document_mask([0, 3, 64])
    estimate = sampled_block_grid(inside, 64, 16, samples_per_block=3)
    assert estimate.counts[0, 0] != build_block_grid(inside, 64, 16).counts[0, 0]
    with pytest.raises(MaskError):
        sampled_block_grid(causal_mask(), 64, 16, samples_per_block=1)
