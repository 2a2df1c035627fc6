"""Literal token-by-token DeltaFormer reference (Xu, Ao, He, Lu, Shi, Zhong, NeurIPS 2025,
Sec. 3.2, Eq. 8-9).

    u_t = alpha_t v_t - beta_t * sum_{i<t} kappa1(w_t, k_i) u_i
    o_t = sum_{i<=t} kappa2(q_t, k_i) u_i,    kappa2 = causal softmax with scale 1/sqrt(D)

Shapes are [B, T, H, D] for q, k, w, v (v may have its own last dim) and [B, T, H] for beta and
alpha. This file is the slow ground truth that the chunked path is tested against; it favours
being obviously right over being fast.
"""

from __future__ import annotations

import math

import torch

KAPPA1_KINDS = ("softmax", "linear", "relu", "round")


def validate_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    alpha: torch.Tensor | None,
    kappa1: str,
) -> None:
    """Raise ValueError unless the inputs have DeltaFormer's shapes and one float dtype."""
    named = {"q": q, "k": k, "v": v, "w": w, "beta": beta}
    if alpha is not None:
        named["alpha"] = alpha
    for name, tensor in named.items():
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if not tensor.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {tensor.dtype}")
        if tensor.dtype != q.dtype:
            raise ValueError(f"{name} has dtype {tensor.dtype} but q has {q.dtype}")
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, D], got shape {tuple(q.shape)}")
    for name, tensor in (("k", k), ("w", w)):
        if tensor.shape != q.shape:
            raise ValueError(
                f"{name} must match q's shape {tuple(q.shape)}, got {tuple(tensor.shape)}"
            )
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"v must be [B, T, H, Dv] with [B, T, H] = {tuple(q.shape[:3])}, got {tuple(v.shape)}"
        )
    for name in ("beta", "alpha"):
        gate = named.get(name)
        if gate is not None and gate.shape != q.shape[:3]:
            raise ValueError(
                f"{name} must be [B, T, H] = {tuple(q.shape[:3])}, got {tuple(gate.shape)}"
            )
    if kappa1 not in KAPPA1_KINDS:
        raise ValueError(f"kappa1 must be one of {KAPPA1_KINDS}, got {kappa1!r}")


def default_kappa1_scale(kappa1: str, scale: float) -> float:
    """Softmax kappa1 shares kappa2's temperature; the other kernels are the plain dot product
    as the paper lists them (linear w.k, ReLU(w.k), round(w.k)), so DeltaNet is recovered."""
    return scale if kappa1 == "softmax" else 1.0


def _kappa1_row(scores: torch.Tensor, kappa1: str) -> torch.Tensor:
    """kappa1 weights of one query row against its strict prefix; scores is [..., t]."""
    if kappa1 == "softmax":
        return torch.softmax(scores, dim=-1)
    if kappa1 == "linear":
        return scores
    if kappa1 == "relu":
        return torch.relu(scores)
    # Paper: round to two decimals. torch.round has zero gradient, so this kernel passes no
    # gradient to w or k (training it would need a straight-through estimator).
    return torch.round(scores * 100.0) / 100.0


def deltaformer_naive(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    beta: torch.Tensor,
    *,
    kappa1: str = "softmax",
    alpha: torch.Tensor | None = None,
    scale: float | None = None,
    kappa1_scale: float | None = None,
    return_u: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """DeltaFormer by the literal recurrence, one token at a time.

    Args:
        q, k, w: [B, T, H, D] read queries, keys, erase queries.
        v: [B, T, H, Dv] values.
        beta: [B, T, H] erase gate; alpha: [B, T, H] value gate (default 1).
        kappa1: "softmax" (strictly causal, row 0 empty), "linear", "relu" or "round".
        scale: kappa2 temperature, default 1/sqrt(D).
        kappa1_scale: multiplies w.k before kappa1; default ``scale`` for softmax, 1 otherwise.
        return_u: also return U.

    Returns:
        O [B, T, H, Dv], or (O, U) when ``return_u``.
    """
    validate_inputs(q, k, v, w, beta, alpha, kappa1)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if kappa1_scale is None:
        kappa1_scale = default_kappa1_scale(kappa1, scale)
    if alpha is None:
        alpha = torch.ones_like(beta)
    seq_len = q.shape[1]

    us: list[torch.Tensor] = []
    for t in range(seq_len):
        u_t = alpha[:, t, :, None] * v[:, t]
        if t > 0:
            prefix_k = k[:, :t]  # [B, t, H, D]
            prefix_u = torch.stack(us, dim=1)  # [B, t, H, Dv]
            scores = torch.einsum("bhd,bihd->bhi", w[:, t], prefix_k) * kappa1_scale
            weights = _kappa1_row(scores, kappa1)
            erase = torch.einsum("bhi,bihd->bhd", weights, prefix_u)
            u_t = u_t - beta[:, t, :, None] * erase
        us.append(u_t)
    u = torch.stack(us, dim=1)

    os_: list[torch.Tensor] = []
    for t in range(seq_len):
        scores = torch.einsum("bhd,bihd->bhi", q[:, t], k[:, : t + 1]) * scale
        os_.append(torch.einsum("bhi,bihd->bhd", torch.softmax(scores, dim=-1), u[:, : t + 1]))
    o = torch.stack(os_, dim=1)
    return (o, u) if return_u else o


def deltanet_naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """DeltaNet (Yang et al. 2024, Sec. 2) by its state update, one token at a time:

        S_t = S_{t-1} + beta_t (v_t - S_{t-1} k_t) k_t^T,    o_t = S_t q_t

    q, k: [B, T, H, D]; v: [B, T, H, Dv]; beta: [B, T, H]. Returns O [B, T, H, Dv]. Keys are
    used as given (the DeltaNet mixer L2-normalises them first).
    """
    batch, seq_len, heads, _ = q.shape
    state = q.new_zeros(batch, heads, v.shape[-1], k.shape[-1])  # S: value x key
    outputs = []
    for t in range(seq_len):
        k_t, v_t = k[:, t], v[:, t]
        predicted = torch.einsum("bhvk,bhk->bhv", state, k_t)
        state = state + torch.einsum("bhv,bhk->bhvk", beta[:, t, :, None] * (v_t - predicted),
                                     k_t)
        outputs.append(torch.einsum("bhvk,bhk->bhv", state, q[:, t]))
    return torch.stack(outputs, dim=1)
