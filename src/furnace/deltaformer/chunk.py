"""Chunked DeltaFormer with a hand-written backward (Xu, Ao, He, Lu, Shi, Zhong, NeurIPS 2025,
Sec. 3.4 and App. E: chunk-wise computation of u).

    U = (I + diag(beta) P1)^-1 diag(alpha) V,    O = causal_softmax(Q K^T * scale) U

T is split into chunks processed in order. For the rows [s, e) of one chunk the finished prefix
U[:s] enters the right-hand side through kappa1(w_chunk, k_prefix); the in-chunk coupling is one
unit-lower-triangular solve. For softmax kappa1 the row normaliser is the log-sum-exp over the
whole strict prefix (earlier chunks and earlier rows of this chunk), kept per row for backward.
The read-out is ordinary causal SDPA with V replaced by U.

Backward of the u-stage is a torch.autograd.Function: with G = dL/dU, Vt = M^-T G is solved chunk
by chunk in reverse (upper-unitriangular solves with the transposed diagonal blocks, the
off-diagonal blocks subtracted from earlier chunks' right-hand sides), then
dV = alpha Vt, dalpha = <Vt, v>, dbeta = -<Vt, P1 U>, dP1 = -diag(beta) Vt U^T (strictly lower),
followed by the kappa1 backward into w and k. The SDPA stage uses PyTorch's own backward.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from .naive import default_kappa1_scale, validate_inputs


def _diagonal_future(size: int, device: torch.device) -> torch.Tensor:
    """[size, size] bool, True on and above the diagonal: the in-chunk entries that are not in
    a row's strict prefix. Columns before the chunk are all in every row's prefix, so only the
    chunk's own square block needs masking."""
    return torch.ones(size, size, dtype=torch.bool, device=device).triu()


def _chunk_kernel(scores: torch.Tensor, start: int, kappa1: str) -> torch.Tensor:
    """kappa1 weights of chunk rows [start, e) against columns [0, e), zero off the strict
    prefix. Masks ``scores``'s diagonal block in place (-inf), so a caller may reuse it.
    (Keeping forward's softmax log-sum-exp for backward was tried: no measurable gain.)"""
    future = _diagonal_future(scores.shape[-2], scores.device)
    scores[..., start:].masked_fill_(future, float("-inf"))
    if kappa1 == "softmax":
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        # Global row 0 has no keys: lse = -inf would make exp(-inf + inf) = NaN.
        lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        return (scores - lse).exp()
    if kappa1 == "linear":
        weights = scores.clone()
    elif kappa1 == "relu":
        return torch.relu(scores)  # relu(-inf) = 0
    else:
        weights = torch.round(scores * 100.0) / 100.0
    weights[..., start:].masked_fill_(future, 0.0)
    return weights


def _kernel_backward(
    grad_weights: torch.Tensor,
    weights: torch.Tensor,
    scores: torch.Tensor,
    start: int,
    kappa1: str,
) -> torch.Tensor:
    """d loss / d scores from d loss / d weights for one chunk's rows (``scores`` masked by
    `_chunk_kernel`)."""
    grad_weights[..., start:].masked_fill_(_diagonal_future(grad_weights.shape[-2],
                                                            grad_weights.device), 0.0)
    if kappa1 == "softmax":
        # Masked entries have weight 0, so the row sum only sees the strict prefix.
        row_dot = (weights * grad_weights).sum(-1, keepdim=True)
        return weights * (grad_weights - row_dot)
    if kappa1 == "linear":
        return grad_weights
    if kappa1 == "relu":
        return grad_weights * (scores > 0).to(grad_weights.dtype)
    return torch.zeros_like(grad_weights)  # round is piecewise constant


class _DeltaformerU(torch.autograd.Function):
    """u-stage: (w, k, v, beta, alpha) in [B, H, T, *] -> U [B, H, T, Dv]."""

    @staticmethod
    def forward(ctx, w, k, v, beta, alpha, kappa1, chunk_size, kappa1_scale):
        seq_len = v.shape[2]
        rhs_all = alpha[..., None] * v
        u = torch.empty_like(v)
        for start in range(0, seq_len, chunk_size):
            end = min(start + chunk_size, seq_len)
            scores = w[:, :, start:end] @ k[:, :, :end].transpose(-1, -2) * kappa1_scale
            weights = _chunk_kernel(scores, start, kappa1)
            gate = beta[:, :, start:end, None]
            rhs = rhs_all[:, :, start:end]
            if start > 0:
                rhs = rhs - gate * (weights[..., :start] @ u[:, :, :start])
            eye = torch.eye(end - start, dtype=v.dtype, device=v.device)
            coupling = eye + gate * weights[..., start:end]
            u[:, :, start:end] = torch.linalg.solve_triangular(
                coupling, rhs, upper=False, unitriangular=True
            )
        ctx.save_for_backward(w, k, v, beta, alpha, u)
        ctx.kappa1 = kappa1
        ctx.chunk_size = chunk_size
        ctx.kappa1_scale = kappa1_scale
        return u

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_u):
        w, k, v, beta, alpha, u = ctx.saved_tensors
        kappa1, chunk_size, kappa1_scale = ctx.kappa1, ctx.chunk_size, ctx.kappa1_scale
        seq_len = v.shape[2]
        # pending[c] = G_c - sum_{c' > c} [diag(beta) P1]_{c', c}^T Vt_{c'}, filled in reverse.
        pending = grad_u.clone()
        v_tilde = torch.empty_like(v)
        grad_w = torch.zeros_like(w)
        grad_k = torch.zeros_like(k)
        grad_beta = torch.zeros_like(beta)
        starts = list(range(0, seq_len, chunk_size))
        for start in reversed(starts):
            end = min(start + chunk_size, seq_len)
            w_chunk = w[:, :, start:end]
            scores = w_chunk @ k[:, :, :end].transpose(-1, -2) * kappa1_scale
            # Recomputing P1 rows is O(c e D), the same as forward; cheaper than storing T x T.
            weights = _chunk_kernel(scores, start, kappa1)
            gate = beta[:, :, start:end, None]
            eye = torch.eye(end - start, dtype=v.dtype, device=v.device)
            coupling = eye + gate * weights[..., start:end]
            vt_chunk = torch.linalg.solve_triangular(
                coupling.transpose(-1, -2),
                pending[:, :, start:end],
                upper=True,
                unitriangular=True,
            )
            v_tilde[:, :, start:end] = vt_chunk
            gated_vt = gate * vt_chunk
            if start > 0:
                pending[:, :, :start] -= weights[..., :start].transpose(-1, -2) @ gated_vt
            erase = weights @ u[:, :, :end]  # (P1 U) for these rows
            grad_beta[:, :, start:end] = -(vt_chunk * erase).sum(-1)
            grad_weights = -gated_vt @ u[:, :, :end].transpose(-1, -2)
            grad_scores = _kernel_backward(grad_weights, weights, scores, start, kappa1)
            grad_scores = grad_scores * kappa1_scale
            grad_w[:, :, start:end] = grad_scores @ k[:, :, :end]
            grad_k[:, :, :end] += grad_scores.transpose(-1, -2) @ w_chunk
        grad_v = alpha[..., None] * v_tilde
        grad_alpha = (v_tilde * v).sum(-1)
        return grad_w, grad_k, grad_v, grad_beta, grad_alpha, None, None, None


def deltaformer_u(
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    *,
    kappa1: str = "softmax",
    alpha: torch.Tensor | None = None,
    chunk_size: int = 64,
    kappa1_scale: float | None = None,
) -> torch.Tensor:
    """The u-stage alone: U = (I + diag(beta) P1)^-1 diag(alpha) V, chunked, custom backward.

    For layers that read U out themselves: `DeltaFormerAttention` (a u-stage per kappa1 group
    of heads, U shared by the query heads of a key-value group, one SDPA for all heads) and
    DeltaNet (a linear read). Shapes and defaults as `deltaformer_chunk` (kappa1_scale for
    softmax defaults to 1/sqrt(D)); returns U [B, T, H, Dv].
    """
    validate_inputs(k, k, v, w, beta, alpha, kappa1)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if kappa1_scale is None:
        kappa1_scale = default_kappa1_scale(kappa1, 1.0 / math.sqrt(k.shape[-1]))
    if alpha is None:
        alpha = torch.ones_like(beta)
    # the solves want the head axis ahead of time: [B, T, H, D] -> [B, H, T, D]
    u_h = _DeltaformerU.apply(
        w.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        beta.transpose(1, 2),
        alpha.transpose(1, 2),
        kappa1,
        chunk_size,
        float(kappa1_scale),
    )
    return u_h.transpose(1, 2)


def deltaformer_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    *,
    kappa1: str = "softmax",
    alpha: torch.Tensor | None = None,
    chunk_size: int = 64,
    scale: float | None = None,
    kappa1_scale: float | None = None,
    return_u: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """DeltaFormer, chunked over T, with a custom backward for the u-stage.

    Args:
        q, k, w: [B, T, H, D] read queries, keys, erase queries.
        v: [B, T, H, Dv] values.
        beta: [B, T, H] erase gate; alpha: [B, T, H] value gate (default 1).
        kappa1: "softmax" (strictly causal, row 0 empty), "linear", "relu" or "round"
            (round to two decimals; zero gradient into w and k).
        chunk_size: rows per triangular solve; T need not be a multiple of it.
        scale: kappa2 temperature, default 1/sqrt(D).
        kappa1_scale: multiplies w.k before kappa1; default ``scale`` for softmax, 1 otherwise.
        return_u: also return U [B, T, H, Dv].

    Returns:
        O [B, T, H, Dv], or (O, U) when ``return_u``.
    """
    validate_inputs(q, k, v, w, beta, alpha, kappa1)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if kappa1_scale is None:
        kappa1_scale = default_kappa1_scale(kappa1, scale)
    u = deltaformer_u(k, v, w, beta, kappa1=kappa1, alpha=alpha, chunk_size=chunk_size,
                      kappa1_scale=kappa1_scale)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), u.transpose(1, 2),
                                       is_causal=True, scale=scale).transpose(1, 2)
    return (o, u) if return_u else o


def deltanet_chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, *,
    chunk_size: int = 64,
) -> torch.Tensor:
    """DeltaNet (Yang et al. 2024) through DeltaFormer's chunked u-stage (paper App. A).

    The delta-rule write u_t = beta_t (v_t - S_{t-1} k_t) satisfies
    u_t = beta_t v_t - beta_t sum_{i<t} (k_t . k_i) u_i: the u-stage with linear kappa1,
    w = k and alpha = beta. Then S_t q_t = sum_{i<=t} (q_t . k_i) u_i, a causal *linear* read.
    The read materialises a [T, T] score matrix per head: fine for a baseline at T <= a few
    thousand. Same shapes as `furnace.deltaformer.naive.deltanet_naive`, its reference.
    """
    validate_inputs(q, k, v, k, beta, beta, "linear")
    u = deltaformer_u(k, v, k, beta, kappa1="linear", alpha=beta, chunk_size=chunk_size)
    scores = torch.einsum("bthd,bihd->bhti", q, k).tril()
    return torch.einsum("bhti,bihv->bthv", scores, u)
