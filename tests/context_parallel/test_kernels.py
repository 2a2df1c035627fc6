"""Tests of UltraAttn's block kernels and LSE merge (`furnace.context_parallel.kernels`,
design note §2.7) against the dense reference (`furnace.context_parallel.naive`): random
blocks (full, partial, fully masked rows, GQA, ragged and non-adjacent token sets), merges of
2-4 partials in every order, the fused CPU flash path against the masked math path, and a
single-process blockwise forward + backward against autograd of the dense reference."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import Tensor

from furnace.context_parallel import kernels
from furnace.context_parallel.config import MaskError, PlanError
from furnace.context_parallel.kernels import (
    attention_flops,
    block_backward,
    block_forward,
    empty_partial,
    merge_partial,
)
from furnace.context_parallel.masks import MaskMod, document_mask, evaluate_mask, make_mask
from furnace.context_parallel.naive import (
    dense_attention,
    dense_attention_positions,
    dense_attention_with_lse,
)
from furnace.runtime.testing import assert_close

SEQ_LEN = 37  # ragged: blocks of 10, the last has 7 tokens
BLOCK_SIZE = 10
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}
DTYPES = (torch.float64, torch.float32)
# document tokens past 33 are padding: rows 33..36 attend nothing
PADDED_DOCUMENTS = (0, 9, 14, 26, 33)


def _mask(name: str) -> MaskMod:
    if name == "padded_document":
        return document_mask(PADDED_DOCUMENTS)
    return make_mask(name, SEQ_LEN)


def _qkv(dtype: torch.dtype, *, seq_len: int = SEQ_LEN, num_heads: int = 4,
         num_kv_heads: int = 2, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, num_heads, seq_len, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, num_kv_heads, seq_len, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, num_kv_heads, seq_len, 8, generator=gen, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _blocks() -> list[Tensor]:
    return [torch.arange(start, min(start + BLOCK_SIZE, SEQ_LEN))
            for start in range(0, SEQ_LEN, BLOCK_SIZE)]


def _kind(mask_mod: MaskMod, q_idx: Tensor, kv_idx: Tensor) -> str:
    allowed = evaluate_mask(mask_mod, q_idx, kv_idx, batch=2, heads=4)
    return "full" if bool(allowed.all()) else "empty" if not bool(allowed.any()) else "partial"


def _assert_lse(name: str, reference: Tensor, actual: Tensor, ratio: float) -> None:
    """-inf exactly where the reference has it, close elsewhere."""
    finite = torch.isfinite(reference)
    assert torch.equal(finite, torch.isfinite(actual)), f"{name}: -inf rows differ"
    assert bool((actual[~finite] == float("-inf")).all()), f"{name}: non -inf padding rows"
    if bool(finite.any()):
        assert_close(name, reference[finite], actual[finite], ratio, scale=1.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_block_forward_matches_dense_on_random_blocks(dtype: torch.dtype) -> None:
    q, k, v = _qkv(dtype)
    blocks = _blocks()
    gen = torch.Generator().manual_seed(1)
    # single blocks, the ragged last one, and unions of non-adjacent blocks (one kernel may
    # concatenate them), under masks that make full, partial and fully masked rows
    sets = [*blocks, torch.cat([blocks[0], blocks[2]]), torch.cat([blocks[3], blocks[1]]),
            torch.randperm(SEQ_LEN, generator=gen)[:13]]
    seen = set()
    for name in ("causal", "padded_document", "random", "strided", "full"):
        mask_mod = _mask(name)
        for q_idx, kv_idx in itertools.product(sets, sets):
            full = _kind(mask_mod, q_idx, kv_idx) == "full"
            seen.add(_kind(mask_mod, q_idx, kv_idx))
            ref_out, ref_lse = dense_attention_positions(
                q[:, :, q_idx], k[:, :, kv_idx], v[:, :, kv_idx], mask_mod, q_idx, kv_idx)
            with torch.no_grad():
                out, lse = block_forward(q[:, :, q_idx], k[:, :, kv_idx], v[:, :, kv_idx],
                                         q_idx, kv_idx, mask_mod=mask_mod, full=full)
            assert out.dtype == dtype and lse.dtype == dtype
            assert_close(f"{name} out", ref_out, out, TOLERANCE[dtype], scale=1.0)
            _assert_lse(f"{name} lse", ref_lse, lse, TOLERANCE[dtype])
    assert seen == {"full", "partial", "empty"}


def test_fully_masked_rows_give_zero_output_and_no_nan() -> None:
    q, k, v = _qkv(torch.float64)
    mask_mod = _mask("padded_document")
    padded = torch.arange(PADDED_DOCUMENTS[-1], SEQ_LEN)
    q_idx, kv_idx = torch.arange(20, SEQ_LEN), torch.arange(SEQ_LEN)
    out, lse = block_forward(q[:, :, q_idx], k, v, q_idx, kv_idx, mask_mod=mask_mod,
                             full=False)
    rows = padded - 20
    assert bool((out[:, :, rows] == 0).all()) and bool((lse[:, :, rows] == float("-inf")).all())
    assert bool(torch.isfinite(out).all())
    # the dense reference's gradients are finite and read nothing from the padded queries
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    dense_out, dense_lse = dense_attention_with_lse(leaves[0], leaves[1], leaves[2], mask_mod)
    assert bool((dense_out[:, :, padded] == 0).all())
    (dense_out.square().sum() + dense_lse[torch.isfinite(dense_lse)].sum()).backward()
    for leaf in leaves:
        assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())
    assert leaves[0].grad is not None and bool((leaves[0].grad[:, :, padded] == 0).all())


def test_empty_lengths_are_handled_without_the_fused_kernel() -> None:
    # the CPU flash kernel kills the process on a zero-length sequence; it must not see one
    q, k, v = _qkv(torch.float64)
    none = torch.arange(0)
    with torch.no_grad():
        out, lse = block_forward(q, k[:, :, :0], v[:, :, :0], torch.arange(SEQ_LEN), none,
                                 mask_mod=None, full=True)
        assert bool((out == 0).all()) and bool((lse == float("-inf")).all())
        out, lse = block_forward(q[:, :, :0], k, v, none, torch.arange(SEQ_LEN),
                                 mask_mod=None, full=True)
        assert out.shape == (2, 4, 0, 8) and lse.shape == (2, 4, 0)
        grads = block_backward(q[:, :, :0], q[:, :, :0], k, v, q[:, :, :0], lse, lse[..., :0],
                               none, torch.arange(SEQ_LEN), mask_mod=None, full=True)
    assert [tuple(g.shape) for g in grads] == [(2, 4, 0, 8), (2, 2, SEQ_LEN, 8),
                                               (2, 2, SEQ_LEN, 8)]
    assert all(bool((g == 0).all()) for g in grads)


@pytest.mark.parametrize("num_kv_heads", [4, 2])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flash_full_path_equals_masked_math(dtype: torch.dtype, num_kv_heads: int) -> None:
    q, k, v = _qkv(dtype, seq_len=23, num_kv_heads=num_kv_heads)
    q_idx = kv_idx = torch.arange(23)
    # storage with a non-unit last-dim stride: the fused kernel is wrong on it unless the
    # inputs are made contiguous first
    k_strided = k.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert kernels._use_flash(True, q, k_strided, v)
    with torch.no_grad():
        flash_out, flash_lse = block_forward(q, k_strided, v, q_idx, kv_idx, mask_mod=None,
                                             full=True)
    group = q.shape[1] // k.shape[1]
    math_out, math_lse = kernels._math_forward(
        q, kernels._expand_kv(k, group), kernels._expand_kv(v, group), q_idx, kv_idx, None,
        True, 8 ** -0.5)
    assert_close("out", math_out, flash_out, TOLERANCE[dtype], scale=1.0)
    assert_close("lse", math_lse, flash_lse, TOLERANCE[dtype], scale=1.0)
    # the backward with a row's global statistics (this block is one of several in the row)
    gen = torch.Generator().manual_seed(3)
    dout = torch.randn(q.shape, generator=gen, dtype=torch.float64).to(dtype)
    row_out = (flash_out + 0.2 * torch.randn(q.shape, generator=gen,
                                             dtype=torch.float64).to(dtype))
    row_lse = flash_lse + 0.7
    delta = (dout * row_out).sum(-1)
    assert kernels._use_flash(True, q, k, v, dout, row_out)
    flash = block_backward(dout, q, k_strided, v, row_out, row_lse, delta, q_idx, kv_idx,
                           mask_mod=None, full=True)
    math = kernels._math_backward(dout, q, kernels._expand_kv(k, group),
                                  kernels._expand_kv(v, group), row_lse, delta, q_idx,
                                  kv_idx, None, True, 8 ** -0.5)
    for name, ref, act in zip(("dq", "dk", "dv"), math, flash):
        assert_close(name, kernels._reduce_kv(ref, group) if name != "dq" else ref, act,
                     TOLERANCE[dtype], scale=1.0)
    with pytest.raises(ValueError, match="delta"):
        block_backward(dout, q, k, v, flash_out, row_lse, delta, q_idx, kv_idx,
                       mask_mod=None, full=True)
    # rows whose whole-row lse is -inf contribute nothing (the fused kernel would give NaN)
    row_lse[:, :, :3] = float("-inf")
    dq, dk, dv = block_backward(dout, q, k, v, row_out, row_lse, delta, q_idx, kv_idx,
                                mask_mod=None, full=True)
    assert all(bool(torch.isfinite(g).all()) for g in (dq, dk, dv))
    assert bool((dq[:, :, :3] == 0).all())
    kept = torch.arange(3, 23)
    _, dk_kept, dv_kept = block_backward(
        dout[:, :, kept], q[:, :, kept], k, v, row_out[:, :, kept], row_lse[:, :, kept],
        delta[:, :, kept], kept, kv_idx, mask_mod=None, full=True)
    assert_close("dk without the -inf rows", dk_kept, dk, TOLERANCE[dtype], scale=1.0)
    assert_close("dv without the -inf rows", dv_kept, dv, TOLERANCE[dtype], scale=1.0)


def test_flash_path_is_not_used_under_autograd() -> None:
    q, k, v = _qkv(torch.float64)
    assert kernels._use_flash(True, q, k, v)
    assert not kernels._use_flash(False, q, k, v)
    assert not kernels._use_flash(True, q.requires_grad_(), k, v)
    with torch.no_grad():
        assert kernels._use_flash(True, q, k, v)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_merge_of_partials_in_every_order_equals_the_whole_row(dtype: torch.dtype) -> None:
    q, k, v = _qkv(dtype)
    mask_mod = _mask("padded_document")
    q_idx = torch.arange(SEQ_LEN)
    ref_out, ref_lse = dense_attention_positions(q, k, v, mask_mod, q_idx, q_idx)
    gen = torch.Generator().manual_seed(2)
    for num_parts in (2, 3, 4):
        # a random partition of the keys: parts are non-adjacent token sets, and some rows
        # see nothing in some parts (lse -inf on one or both sides of a merge)
        labels = torch.randint(0, num_parts, (SEQ_LEN,), generator=gen)
        labels[:num_parts] = torch.arange(num_parts)
        parts = []
        for part in range(num_parts):
            kv_idx = torch.nonzero(labels == part).flatten()
            with torch.no_grad():
                parts.append(block_forward(q, k[:, :, kv_idx], v[:, :, kv_idx], q_idx,
                                           kv_idx, mask_mod=mask_mod, full=False))
        for order in itertools.permutations(range(num_parts)):
            out, lse = empty_partial(q)
            for part in order:
                out, lse = merge_partial(out, lse, *parts[part])
            assert_close(f"{num_parts} parts {order} out", ref_out, out, TOLERANCE[dtype],
                         scale=1.0)
            _assert_lse(f"{num_parts} parts {order} lse", ref_lse, lse, TOLERANCE[dtype])


def test_merge_handles_infinite_lse_without_nan_under_autograd() -> None:
    inf = float("-inf")
    lse_a = torch.tensor([[[inf, inf, 0.5, 3.0]]], dtype=torch.float64, requires_grad=True)
    lse_b = torch.tensor([[[inf, 1.0, inf, 2.0]]], dtype=torch.float64, requires_grad=True)
    out_a = torch.ones(1, 1, 4, 2, dtype=torch.float64, requires_grad=True)
    out_b = torch.full((1, 1, 4, 2), 2.0, dtype=torch.float64, requires_grad=True)
    out, lse = merge_partial(out_a * (lse_a > inf).unsqueeze(-1), lse_a,
                             out_b * (lse_b > inf).unsqueeze(-1), lse_b)
    assert lse[0, 0, 0] == inf and bool((out[0, 0, 0] == 0).all())
    assert torch.allclose(out[0, 0, 1:3], torch.tensor([[2.0, 2.0], [1.0, 1.0]],
                                                       dtype=torch.float64))
    weight = 1 / (1 + torch.exp(torch.tensor(-1.0, dtype=torch.float64)))
    assert torch.allclose(out[0, 0, 3], weight + 2 * (1 - weight))
    assert torch.allclose(lse[0, 0, 1:], torch.tensor([1.0, 0.5, 3.0 + torch.log1p(
        torch.exp(torch.tensor(-1.0))).item()], dtype=torch.float64))
    (out.sum() + lse[torch.isfinite(lse)].sum()).backward()
    for leaf in (lse_a, lse_b, out_a, out_b):
        assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())


def _blockwise_attention(q: Tensor, k: Tensor, v: Tensor, mask_mod: MaskMod,
                         dout: Tensor) -> tuple[Tensor, ...]:
    """Forward then backward block by block, as a context-parallel run does: merge each
    row's partials, then every block's backward with the row's merged statistics."""
    blocks = _blocks()
    kinds = {(r, c): _kind(mask_mod, blocks[r], blocks[c])
             for r in range(len(blocks)) for c in range(len(blocks))}
    outs, lses = [], []
    for r, q_idx in enumerate(blocks):
        out, lse = empty_partial(q[:, :, q_idx])
        for c, kv_idx in enumerate(blocks):
            if kinds[r, c] != "empty":
                out, lse = merge_partial(out, lse, *block_forward(
                    q[:, :, q_idx], k[:, :, kv_idx], v[:, :, kv_idx], q_idx, kv_idx,
                    mask_mod=mask_mod, full=kinds[r, c] == "full"))
        outs.append(out)
        lses.append(lse)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for r, q_idx in enumerate(blocks):
        delta = (dout[:, :, q_idx] * outs[r]).sum(-1)
        for c, kv_idx in enumerate(blocks):
            if kinds[r, c] == "empty":
                continue
            dq_rc, dk_rc, dv_rc = block_backward(
                dout[:, :, q_idx], q[:, :, q_idx], k[:, :, kv_idx], v[:, :, kv_idx], outs[r],
                lses[r], delta, q_idx, kv_idx, mask_mod=mask_mod, full=kinds[r, c] == "full")
            dq[:, :, q_idx] += dq_rc
            dk[:, :, kv_idx] += dk_rc
            dv[:, :, kv_idx] += dv_rc
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2), dq, dk, dv


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["causal", "padded_document", "random", "full"])
def test_blockwise_forward_and_backward_match_autograd_of_dense(dtype: torch.dtype,
                                                                name: str) -> None:
    mask_mod = _mask(name)
    q, k, v = _qkv(dtype, seed=5)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(6),
                       dtype=torch.float64).to(dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref_out, ref_lse = dense_attention_with_lse(leaves[0], leaves[1], leaves[2], mask_mod)
    ref_out.backward(dout)
    with torch.no_grad():
        out, lse, dq, dk, dv = _blockwise_attention(q, k, v, mask_mod, dout)
    tol = TOLERANCE[dtype]
    assert_close("out", ref_out, out, tol, scale=1.0)
    _assert_lse("lse", ref_lse.detach(), lse, tol)
    for label, leaf, grad in zip(("dq", "dk", "dv"), leaves, (dq, dk, dv)):
        assert leaf.grad is not None
        assert_close(label, leaf.grad, grad, tol, scale=1.0)


@pytest.mark.parametrize("name", ["full", "padded_document"])
def test_autograd_through_block_forward_and_merge_matches_dense(name: str) -> None:
    # a composition that differentiates through the kernels (as Ulysses may) must get the
    # lse's share of the gradient, which the fused CPU kernel does not provide
    mask_mod = _mask(name)
    q, k, v = _qkv(torch.float64, seed=7)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(8),
                       dtype=torch.float64)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    dense_attention(ref[0], ref[1], ref[2], mask_mod).backward(dout)
    mine = [t.clone().requires_grad_() for t in (q, k, v)]
    q_idx, halves = torch.arange(SEQ_LEN), (torch.arange(0, 20), torch.arange(20, SEQ_LEN))
    out, lse = empty_partial(q)
    for kv_idx in halves:
        full = _kind(mask_mod, q_idx, kv_idx) == "full"
        out, lse = merge_partial(out, lse, *block_forward(
            mine[0], mine[1][:, :, kv_idx], mine[2][:, :, kv_idx], q_idx, kv_idx,
            mask_mod=mask_mod, full=full))
    out.backward(dout)
    for label, a, b in zip(("dq", "dk", "dv"), ref, mine):
        assert a.grad is not None and b.grad is not None
        assert_close(label, a.grad, b.grad, 1e-10, scale=1.0)


def test_inputs_are_validated() -> None:
    q, k, v = _qkv(torch.float64, num_heads=3, num_kv_heads=2)
    ids = torch.arange(SEQ_LEN)
    with pytest.raises(ValueError, match="multiple"):
        block_forward(q, k, v, ids, ids, mask_mod=None, full=True)
    q, k, v = _qkv(torch.float64)
    with pytest.raises(ValueError, match="token ids"):
        block_forward(q, k, v, ids[:5], ids, mask_mod=None, full=True)
    with pytest.raises(ValueError, match="mask_mod"):
        block_forward(q, k, v, ids, ids, mask_mod=None, full=False)

    def float_mask(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (q_idx - kv_idx).double()

    with pytest.raises(MaskError):
        block_forward(q, k, v, ids, ids, mask_mod=float_mask, full=False)


def test_attention_flops() -> None:
    assert attention_flops(10, 2, 8) == 4 * 10 * 2 * 8
    assert attention_flops(10, 2, 8, backward=True) == 2.5 * 4 * 10 * 2 * 8
    assert attention_flops(0, 1, 1) == 0
    with pytest.raises(PlanError, match="elements"):
        attention_flops(-1, 1, 8)
    with pytest.raises(PlanError, match="head_dim"):
        attention_flops(1, 1, 0)


@pytest.mark.parametrize("full", [True, False])
def test_half_precision_keeps_an_fp32_lse(full: bool) -> None:
    q, k, v = _qkv(torch.float64, seq_len=16)
    ids = torch.arange(16)
    mask_mod = make_mask("full" if full else "causal", 16)
    ref_out, ref_lse = dense_attention_positions(q, k, v, mask_mod, ids, ids)
    with torch.no_grad():
        out, lse = block_forward(q.bfloat16(), k.bfloat16(), v.bfloat16(), ids, ids,
                                 mask_mod=mask_mod, full=full)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert_close("bf16 out", ref_out, out, 2e-2, scale=1.0)
    assert_close("bf16 lse", ref_lse, lse, 2e-2, scale=1.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flex_path_equals_the_math_path(dtype: torch.dtype) -> None:
    """`flex_block_forward` (what CUDA runs, compiled) eagerly on CPU: the same out and lse
    as the math path on partial blocks with fully masked rows, shuffled token ids, GQA, and
    on a full block."""
    q, k, v = _qkv(dtype)
    q_idx = torch.tensor([30, 2, 35, 17, 33, 9, 36, 21])
    kv_idx = torch.tensor([0, 5, 31, 14, 34, 9, 26, 20, 3])
    qs, ks, vs = q[:, :, q_idx], k[:, :, kv_idx], v[:, :, kv_idx]
    for name in ("padded_document", "strided", "causal", "random"):
        mask = _mask(name)
        ref_out, ref_lse = block_forward(qs, ks, vs, q_idx, kv_idx, mask_mod=mask, full=False)
        out, lse = kernels.flex_block_forward(qs, ks, vs, q_idx, kv_idx, mask_mod=mask,
                                              full=False)
        assert_close(f"{name} out", ref_out, out, TOLERANCE[dtype], scale=1.0)
        _assert_lse(f"{name} lse", ref_lse, lse, TOLERANCE[dtype])
    ref_out, ref_lse = block_forward(qs, ks, vs, q_idx, kv_idx, mask_mod=None, full=True)
    out, lse = kernels.flex_block_forward(qs, ks, vs, q_idx, kv_idx, mask_mod=None, full=True)
    assert_close("full out", ref_out, out, TOLERANCE[dtype], scale=1.0)
    _assert_lse("full lse", ref_lse, lse, TOLERANCE[dtype])
