"""Dense single-process masked attention: the reference every UltraAttn path is tested
against (Yang et al., SC'25; the dense reference of design note §6.2).

softmax(scale * q k^T, masked to -inf where the mask_mod forbids) v over the whole sequence,
one process, autograd for the backward. It shares no arithmetic with the block kernels
(`kernels.py`): it uses torch's softmax where they use exp(scores - lse), so an agreement
between the two says something. A fully masked row gives out 0 and lse -inf, and gradient 0
in every input it touches (no NaN forward or backward).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .kernels import lse_dtype
from .masks import MaskMod, evaluate_mask

__all__ = ["dense_attention", "dense_attention_positions", "dense_attention_with_lse"]


def dense_attention_positions(q: Tensor, k: Tensor, v: Tensor, mask_mod: MaskMod,
                              q_idx: Tensor, kv_idx: Tensor, *,
                              scale: float | None = None) -> tuple[Tensor, Tensor]:
    """(out, lse) of the queries at global positions ``q_idx`` over the keys at ``kv_idx``.

    q (B,H,Lq,D), k and v (B,Hkv,Lk,D) with H a multiple of Hkv (query head h reads kv head
    h // (H // Hkv)); q_idx (Lq,), kv_idx (Lk,) int64. out (B,H,Lq,D) in q's dtype, lse
    (B,H,Lq) in `kernels.lse_dtype` of it. ``scale`` defaults to D ** -0.5.
    """
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_heads % num_kv_heads or v.shape != k.shape:
        raise ValueError(f"need k, v of one shape with num_heads={num_heads} a multiple of "
                         f"num_kv_heads={num_kv_heads}; got k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    group = num_heads // num_kv_heads
    s = q.shape[-1] ** -0.5 if scale is None else float(scale)
    work = torch.promote_types(q.dtype, torch.float32)
    k_heads = k.repeat_interleave(group, dim=1).to(work)
    v_heads = v.repeat_interleave(group, dim=1).to(work)
    scores = s * torch.einsum("bhqd,bhkd->bhqk", q.to(work), k_heads)
    allowed = evaluate_mask(mask_mod, q_idx.to(q.device), kv_idx, batch=q.shape[0],
                            heads=num_heads)
    row_ok = allowed.any(dim=-1, keepdim=True)
    # a row with nothing allowed would be softmax over all -inf (NaN, and NaN gradients):
    # give it zeros to work on and overwrite what comes out
    masked = torch.where(allowed, scores, torch.full((), float("-inf"), dtype=work,
                                                      device=q.device))
    masked = torch.where(row_ok, masked, torch.zeros((), dtype=work, device=q.device))
    probs = torch.where(row_ok, torch.softmax(masked, dim=-1),
                        torch.zeros((), dtype=work, device=q.device))
    lse = torch.where(row_ok.squeeze(-1), torch.logsumexp(masked, dim=-1),
                      torch.full((), float("-inf"), dtype=work, device=q.device))
    out = torch.einsum("bhqk,bhkd->bhqd", probs, v_heads)
    return out.to(q.dtype), lse.to(lse_dtype(q.dtype))


def dense_attention_with_lse(q: Tensor, k: Tensor, v: Tensor, mask_mod: MaskMod, *,
                             scale: float | None = None) -> tuple[Tensor, Tensor]:
    """(out, lse) of self-attention over one sequence at positions 0..S-1: q (B,H,S,D),
    k and v (B,Hkv,S,D)."""
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"self-attention needs q and k of one length; got {q.shape[2]} "
                         f"and {k.shape[2]}")
    positions = torch.arange(q.shape[2], device=q.device)
    return dense_attention_positions(q, k, v, mask_mod, positions, positions, scale=scale)


def dense_attention(q: Tensor, k: Tensor, v: Tensor, mask_mod: MaskMod, *,
                    scale: float | None = None) -> Tensor:
    """The output of `dense_attention_with_lse`."""
    return dense_attention_with_lse(q, k, v, mask_mod, scale=scale)[0]
