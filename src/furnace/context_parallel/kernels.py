"""Block attention kernels with the log-sum-exp: UltraAttn's per-block compute (Yang et al.,
SC'25; forward merge and backward formulas of design note §2.7, FLOP count of §6.5).

A context-parallel plan splits every attention row over several (query block, key/value
block) kernels that run on different ranks. Each kernel returns its partial output and the
row's partial log-sum-exp, `merge_partial` combines partials exactly, and the backward of a
block needs only the WHOLE row's statistics (merged out, lse and delta = rowsum(dout * out)).

Two paths compute a block:

- ``full=True`` (the caller vouches that every (q, kv) element is allowed): on CPU the fused
  flash kernel ``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward. Probed
  on torch 2.13 (the tests pin what the code relies on): it returns (out, lse) in the
  input's dtype (fp32 lse for fp16/bf16); it silently gives wrong values for inputs whose
  last dim is not unit-stride, so every input is made contiguous; it crashes the process
  (SIGFPE) on zero-length sequences, so empty blocks never reach it; its backward derives
  delta from its ``out`` argument and turns an lse of -inf into NaN, so rows with -inf go
  to the math path; its lse output carries no autograd gradient, so whenever autograd is
  recording, the math path runs instead (its lse is differentiable).
- on CUDA, outside autograd: FlexAttention (`flex_block_forward`, compiled), with a
  BlockMask of the kernel's own token ids, on full and partial blocks alike; it returns the
  lse (natural log) and gives out 0 and lse -inf on fully masked rows. The same function runs
  eagerly on CPU in the tests, equal to the math path; no GPU was lent to this project's
  sessions yet, so the compiled CUDA run itself is unverified here.
- masked math everywhere else (partial blocks on CPU, the backward on CUDA, autograd):
  scores, -inf where the mask forbids, logsumexp, exp(scores - lse). A fully masked row
  gives out 0 and lse -inf, without a NaN in the values or in autograd's gradients.

Grouped-query attention: query head h reads kv head h // (num_heads // num_kv_heads); kv is
expanded with repeat_interleave and dk, dv are summed back over each group.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from .config import PlanError
from .masks import MaskMod, evaluate_mask

__all__ = [
    "BACKWARD_FLOP_FACTOR",
    "attention_flops",
    "block_backward",
    "block_forward",
    "empty_partial",
    "flex_block_forward",
    "lse_dtype",
    "merge_partial",
]

# The backward does 2.5x the forward's matmul FLOPs (DCP's and MagiAttention's convention,
# design note §6.5): five matmuls against two, recomputing the scores included.
BACKWARD_FLOP_FACTOR = 2.5

_NEG_INF = float("-inf")
_FLASH_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the lse a kernel returns for inputs of ``dtype``: the dtype itself for
    fp32/fp64, fp32 for the half types (as torch's own flash kernel does: an lse rounded to
    bf16 would distort each partial's weight in a merge)."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, q_idx: Tensor, kv_idx: Tensor) -> int:
    """Validate the shapes; returns the group size num_heads // num_kv_heads."""
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError("need q (B,H,Lq,D) and k, v of one shape (B,Hkv,Lk,D); got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch or "
                         "head_dim")
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} must be a multiple of "
                         f"num_kv_heads={num_kv_heads}")
    if q_idx.shape != (q.shape[2],) or kv_idx.shape != (k.shape[2],):
        raise ValueError(f"q_idx {tuple(q_idx.shape)} and kv_idx {tuple(kv_idx.shape)} must "
                         f"be 1-D with Lq={q.shape[2]} and Lk={k.shape[2]} token ids")
    if q_idx.dtype.is_floating_point or kv_idx.dtype.is_floating_point:
        raise ValueError("q_idx and kv_idx must be integer token ids")
    return num_heads // num_kv_heads


def _expand_kv(x: Tensor, group: int) -> Tensor:
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def _reduce_kv(grad: Tensor, group: int) -> Tensor:
    """Sum a (B,H,Lk,D) gradient over each kv group's query heads -> (B,Hkv,Lk,D)."""
    if group == 1:
        return grad
    batch, num_heads, length, head_dim = grad.shape
    return grad.view(batch, num_heads // group, group, length, head_dim).sum(dim=2)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _scale_of(q: Tensor, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else float(scale)


def _recording(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _use_flash(full: bool, *tensors: Tensor) -> bool:
    # the fused kernel's lse has no autograd gradient, so a merged result differentiated
    # through it would be wrong: recording autograd means the math path
    return (full and not _recording(*tensors) and tensors[0].device.type == "cpu"
            and tensors[0].dtype in _FLASH_DTYPES)


_COMPILED_FLEX: list[Any] = []


def flex_block_forward(q: Tensor, k: Tensor, v: Tensor, q_idx: Tensor, kv_idx: Tensor, *,
                       mask_mod: MaskMod | None, full: bool, scale: float | None = None,
                       compiled: bool = False) -> tuple[Tensor, Tensor]:
    """`block_forward` by FlexAttention: (out, lse) of the queries ``q_idx`` over the keys
    ``kv_idx``, the mask evaluated at those global ids through a BlockMask of the kernel's
    own (Lq, Lk) grid. ``compiled`` runs `torch.compile(flex_attention)` (the CUDA path);
    eager otherwise (what the CPU tests run)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    group = _check_inputs(q, k, v, q_idx, kv_idx)
    s = _scale_of(q, scale)
    if q.shape[2] == 0 or k.shape[2] == 0:
        return empty_partial(q)
    block_mask = None
    if not full:
        if mask_mod is None:
            raise ValueError("a partial block needs its mask_mod")
        rule = mask_mod
        q_ids, kv_ids = q_idx.to(q.device), kv_idx.to(q.device)

        def local(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor) -> Tensor:
            return rule(b, h, q_ids[qi], kv_ids[ki])

        block_mask = create_block_mask(local, q.shape[0], q.shape[1], q.shape[2], k.shape[2],
                                       device=q.device)
    kernel: Any = flex_attention
    if compiled:
        if not _COMPILED_FLEX:
            _COMPILED_FLEX.append(torch.compile(flex_attention))
        kernel = _COMPILED_FLEX[0]
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:  # torch < 2.9 has only return_lse
        aux_request = None
    else:
        aux_request = AuxRequest(lse=True)
    with warnings.catch_warnings():
        # eager FlexAttention warns that it is unfused: it is the CPU reference of this path
        warnings.simplefilter("ignore", UserWarning)
        if aux_request is None:
            out, lse = kernel(q, k, v, block_mask=block_mask, scale=s, enable_gqa=group > 1,
                              return_lse=True)
        else:
            out, aux = kernel(q, k, v, block_mask=block_mask, scale=s, enable_gqa=group > 1,
                              return_aux=aux_request)
            lse = aux.lse
    return out, lse.to(lse_dtype(q.dtype))


def _scores(q: Tensor, k: Tensor, q_idx: Tensor, kv_idx: Tensor, mask_mod: MaskMod | None,
            full: bool, scale: float) -> tuple[Tensor, Tensor | None]:
    """Masked scores (-inf where forbidden) in the compute dtype, and which rows have any
    allowed element (None when all do)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if full:
        return scores, None
    if mask_mod is None:
        raise ValueError("a partial block (full=False) needs its mask_mod")
    allowed = evaluate_mask(mask_mod, q_idx.to(q.device), kv_idx, batch=q.shape[0],
                            heads=q.shape[1])
    scores = scores.masked_fill(~allowed, _NEG_INF)
    return scores, allowed.any(dim=-1)


def _math_forward(q: Tensor, k: Tensor, v: Tensor, q_idx: Tensor, kv_idx: Tensor,
                  mask_mod: MaskMod | None, full: bool, scale: float) -> tuple[Tensor, Tensor]:
    work = _compute_dtype(q.dtype)
    scores, row_ok = _scores(q.to(work), k.to(work), q_idx, kv_idx, mask_mod, full, scale)
    if row_ok is None:
        lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - lse.unsqueeze(-1))
    else:
        # a fully masked row gets finite stand-in scores, so that neither logsumexp nor its
        # gradient sees a row of -inf; its results are then replaced by out 0, lse -inf
        ok = row_ok.unsqueeze(-1)
        safe_scores = torch.where(ok, scores, torch.zeros((), dtype=work, device=q.device))
        safe_lse = torch.logsumexp(safe_scores, dim=-1)
        probs = torch.where(ok, torch.exp(safe_scores - safe_lse.unsqueeze(-1)),
                            torch.zeros((), dtype=work, device=q.device))
        lse = torch.where(row_ok, safe_lse,
                          torch.full((), _NEG_INF, dtype=work, device=q.device))
    out = torch.matmul(probs, v.to(work))
    return out.to(q.dtype), lse.to(lse_dtype(q.dtype))


def block_forward(q: Tensor, k: Tensor, v: Tensor, q_idx: Tensor, kv_idx: Tensor, *,
                  mask_mod: MaskMod | None, full: bool,
                  scale: float | None = None) -> tuple[Tensor, Tensor]:
    """Attention of the queries ``q_idx`` over the keys ``kv_idx`` alone: (out, lse).

    q (B,H,Lq,D), k and v (B,Hkv,Lk,D); q_idx (Lq,), kv_idx (Lk,) the global token ids
    (blocks of a kernel need not be adjacent). ``full=True`` promises that every element is
    allowed (``mask_mod`` is then not evaluated); otherwise ``mask_mod(b, h, q_idx, kv_idx)``
    decides. Returns out (B,H,Lq,D) in q's dtype and lse (B,H,Lq) in `lse_dtype` of it;
    a row with no allowed element has out 0 and lse -inf. ``scale`` defaults to D ** -0.5.
    """
    group = _check_inputs(q, k, v, q_idx, kv_idx)
    s = _scale_of(q, scale)
    if q.shape[2] == 0 or k.shape[2] == 0:
        return empty_partial(q)
    if q.is_cuda and not _recording(q, k, v):
        return flex_block_forward(q, k, v, q_idx, kv_idx, mask_mod=mask_mod, full=full,
                                  scale=s, compiled=True)
    if _use_flash(full, q, k, v):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q.contiguous(), _expand_kv(k, group).contiguous(),
            _expand_kv(v, group).contiguous(), 0.0, False, attn_mask=None, scale=s)
        return out, lse.contiguous()
    return _math_forward(q, _expand_kv(k, group), _expand_kv(v, group), q_idx, kv_idx,
                         mask_mod, full, s)


def _math_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, lse: Tensor, delta: Tensor,
                   q_idx: Tensor, kv_idx: Tensor, mask_mod: MaskMod | None, full: bool,
                   scale: float) -> tuple[Tensor, Tensor, Tensor]:
    work = _compute_dtype(q.dtype)
    qw, kw, vw, dw = q.to(work), k.to(work), v.to(work), dout.to(work)
    scores, _ = _scores(qw, kw, q_idx, kv_idx, mask_mod, full, scale)
    lse_w = lse.to(work)
    finite = torch.isfinite(lse_w).unsqueeze(-1)
    zero = torch.zeros((), dtype=work, device=q.device)
    # rows whose whole-row lse is -inf have no allowed element anywhere: they contribute 0
    probs = torch.where(finite, torch.exp(scores - torch.where(finite, lse_w.unsqueeze(-1),
                                                               zero)), zero)
    dv = torch.matmul(probs.transpose(-1, -2), dw)
    dscores = probs * (torch.matmul(dw, vw.transpose(-1, -2)) - delta.to(work).unsqueeze(-1))
    dq = torch.matmul(dscores, kw) * scale
    dk = torch.matmul(dscores.transpose(-1, -2), qw) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _check_delta(dout: Tensor, out: Tensor, delta: Tensor) -> None:
    """The fused backward derives delta from ``out``: refuse an ``out`` that is not the one
    ``delta`` came from (for instance a block's partial instead of the merged row)."""
    work = _compute_dtype(out.dtype)
    products = dout.to(work) * out.to(work)
    implied = products.sum(dim=-1)
    slack = 1e-3 * products.abs().sum(dim=-1) + torch.finfo(out.dtype).tiny
    if not bool(((implied - delta.to(work)).abs() <= slack).all()):
        raise ValueError("delta is not rowsum(dout * out): the full-block kernel needs the "
                         "merged output of the whole row as out, and delta computed from it")


def block_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                   delta: Tensor, q_idx: Tensor, kv_idx: Tensor, *, mask_mod: MaskMod | None,
                   full: bool, scale: float | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """One block's share of the gradients, given the WHOLE row's statistics.

    ``out`` (B,H,Lq,D) and ``lse`` (B,H,Lq) are the merged forward results of the rows (not
    this block's partial), ``delta`` = rowsum(dout * out) (B,H,Lq). Returns dq (B,H,Lq,D)
    and dk, dv (B,Hkv,Lk,D), each summed over the query heads of its kv group. Summing the
    blocks' results over a row (dq) or a column (dk, dv) gives the full gradient. Rows with
    lse -inf contribute 0.
    """
    group = _check_inputs(q, k, v, q_idx, kv_idx)
    lq = q.shape[2]
    if dout.shape != q.shape or out.shape != q.shape or lse.shape != q.shape[:3] \
            or delta.shape != q.shape[:3]:
        raise ValueError(f"dout and out must be {tuple(q.shape)}, lse and delta "
                         f"{tuple(q.shape[:3])}; got {tuple(dout.shape)}, {tuple(out.shape)}, "
                         f"{tuple(lse.shape)}, {tuple(delta.shape)}")
    s = _scale_of(q, scale)
    if lq == 0 or k.shape[2] == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    k_exp, v_exp = _expand_kv(k, group), _expand_kv(v, group)
    if _use_flash(full, q, k, v, dout, out) and bool(torch.isfinite(lse).all()):
        _check_delta(dout, out, delta)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout.contiguous(), q.contiguous(), k_exp.contiguous(), v_exp.contiguous(),
            out.contiguous(), lse.to(lse_dtype(q.dtype)).contiguous(), 0.0, False,
            attn_mask=None, scale=s)
    else:
        dq, dk, dv = _math_backward(dout, q, k_exp, v_exp, lse, delta, q_idx, kv_idx,
                                    mask_mod, full, s)
    return dq, _reduce_kv(dk, group), _reduce_kv(dv, group)


def empty_partial(q: Tensor) -> tuple[Tensor, Tensor]:
    """The (out, lse) of a row that has seen no key yet: zeros and -inf, shaped like ``q``;
    the identity of `merge_partial`, so it starts an accumulator."""
    lse = torch.full(q.shape[:3], _NEG_INF, dtype=lse_dtype(q.dtype), device=q.device)
    return torch.zeros_like(q), lse


def merge_partial(out: Tensor, lse: Tensor, out_part: Tensor,
                  lse_part: Tensor) -> tuple[Tensor, Tensor]:
    """Combine two partial results of the same rows over disjoint key sets (design note
    §2.7): lse' = logaddexp(lse, lse_part), out' = e^(lse - lse') out + e^(lse_part - lse')
    out_part. Weights are taken relative to the larger lse, so neither exponential
    overflows; a row -inf on both sides stays (0, -inf). No NaN forward or under autograd.
    """
    if out.shape != out_part.shape or lse.shape != lse_part.shape \
            or lse.shape != out.shape[:-1]:
        raise ValueError(f"cannot merge out {tuple(out.shape)}, lse {tuple(lse.shape)} with "
                         f"out {tuple(out_part.shape)}, lse {tuple(lse_part.shape)}")
    work = torch.promote_types(lse.dtype, lse_part.dtype)
    lse_a, lse_b = lse.to(work), lse_part.to(work)
    top = torch.maximum(lse_a, lse_b)
    zero = torch.zeros((), dtype=work, device=lse.device)
    top = torch.where(torch.isfinite(top), top, zero)
    weight_a, weight_b = torch.exp(lse_a - top), torch.exp(lse_b - top)
    total = weight_a + weight_b
    seen = total > 0
    # total is in [1, 2] wherever a row saw any key; 1 stands in elsewhere so that neither
    # log nor the division (nor their gradients) meet a zero
    safe_total = torch.where(seen, total, torch.ones((), dtype=work, device=lse.device))
    new_lse = torch.where(seen, top + torch.log(safe_total),
                          torch.full((), _NEG_INF, dtype=work, device=lse.device))
    ratio_a = (weight_a / safe_total).to(out.dtype).unsqueeze(-1)
    ratio_b = (weight_b / safe_total).to(out.dtype).unsqueeze(-1)
    return ratio_a * out + ratio_b * out_part, new_lse.to(lse.dtype)


def attention_flops(elements: int, num_heads: int, head_dim: int, *,
                    backward: bool = False) -> float:
    """FLOPs of attention over ``elements`` allowed (q, kv) pairs per head: 4 * elements *
    num_heads * head_dim forward (two matmuls, a multiply and an add each), times
    `BACKWARD_FLOP_FACTOR` for the backward (design note §6.5)."""
    for name, value, least in (("elements", elements, 0), ("num_heads", num_heads, 1),
                               ("head_dim", head_dim, 1)):
        if value < least:
            raise PlanError(name, f"an integer >= {least}, got {value}")
    forward = 4.0 * elements * num_heads * head_dim
    return forward * BACKWARD_FLOP_FACTOR if backward else forward
