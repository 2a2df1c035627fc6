"""DeltaFormer, softmax-attention and DeltaNet sequence models (DeltaFormer: Xu, Ao, He, Lu, Shi,
Zhong, NeurIPS 2025, Sec. 3.2-3.4 and App. E; DeltaNet: Yang et al. 2024, "Parallelizing linear
transformers with the delta rule", Sec. 2).

`DeltaFormerAttention` is the paper's layer: ordinary causal softmax attention whose values are
replaced by u_t = v_t - beta_t sum_{i<t} kappa1(w_t, k_i) u_i, with

* the erase query w taken from k (``w_source="k"``, the paper's derivation and App. E),
  from q (``"q"``, what flash-linear-attention does today) or from its own projection (``"own"``);
* beta = sigmoid(linear(x)) per u-stage head, or 2 sigmoid (opt-in, ``beta_activation="2sigmoid"``).
  With beta > 1 the recurrence u_t = v_t - beta u_{t-1} can grow exponentially in t
  (design note, Sec. 3.5), so it is not the default;
* rotary position embedding on q, k and w, optional RMSNorm per head (qk-norm) on q, k, w;
* one kappa1 per head (heads may mix kernels; heads that share a kernel go through one
  `deltaformer_u` call, and every head is read out by one causal SDPA);
* grouped / multi-query heads. When w comes from k or its own projection the u-stage depends on
  keys, values and w only, so it runs once per key-value head and the query heads of a group
  share that U in the read-out (the +25% attention-FLOP figure of the paper's 14B model relies on
  this). With ``w_source="q"`` w has one head per query head, so the u-stage runs per query head.

`DeltaFormerAttention.step` decodes one token at a time with a key-U cache (design note, Sec. 2.4):
past u_i never change, so a new token needs one strictly causal kappa1 read to form u_t and one
causal softmax read over (K, U).

The block, config and model around it (`DecoderBlock`, `LMConfig`, `SequenceModel`) differ only in
the mixer, so the three mixers can be compared at matched size. Parameters the mixers add beyond
softmax attention (q, k, v, out): DeltaFormer adds a beta projection (d_model x u-heads, + bias)
and, for ``w_source="own"``, a w projection (and its qk-norm weight); DeltaNet adds the beta
projection only. The models hold no parallelism code.

Shape suffixes: B = batch, T = time, D = d_model, H = query heads, G = key-value heads,
U = u-stage heads (G or H), C = head width.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .chunk import deltaformer_u, deltanet_chunk

# the config lives in config.py (with the training config); re-exported here
from .config import BETA_ACTIVATIONS, MIXERS, W_SOURCES, LMConfig
from .naive import _kappa1_row, default_kappa1_scale

__all__ = [
    "BETA_ACTIVATIONS",
    "MIXERS",
    "W_SOURCES",
    "DecoderBlock",
    "DeltaFormerAttention",
    "DeltaFormerLM",
    "DeltaNetMixer",
    "KUCache",
    "LMConfig",
    "Projected",
    "SequenceModel",
    "SoftmaxAttention",
    "TransformerLM",
    "apply_rotary",
]

def apply_rotary(x_BTHC: torch.Tensor, positions_T: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary position embedding (rotate-half layout) of x at integer positions."""
    width = x_BTHC.shape[-1]
    inv_freq = base ** (-torch.arange(0, width, 2, dtype=x_BTHC.dtype, device=x_BTHC.device)
                        / width)
    angles_TC = positions_T.to(x_BTHC.dtype)[:, None] * inv_freq[None, :]
    angles_TC = torch.cat([angles_TC, angles_TC], dim=-1)
    cos, sin = angles_TC.cos()[:, None, :], angles_TC.sin()[:, None, :]
    first, second = x_BTHC.chunk(2, dim=-1)
    return x_BTHC * cos + torch.cat([-second, first], dim=-1) * sin


def _expand_heads(x_BTGC: torch.Tensor, heads: int) -> torch.Tensor:
    """Repeat each key-value head for the consecutive query heads of its group."""
    groups = x_BTGC.shape[2]
    return x_BTGC if groups == heads else x_BTGC.repeat_interleave(heads // groups, dim=2)


@dataclass
class Projected:
    """Per-head tensors of one DeltaFormer layer, after qk-norm and rotary.

    q: [B, T, H, C]; k, v: [B, T, G, C]; w: [B, T, U, C]; beta: [B, T, U]."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    w: torch.Tensor
    beta: torch.Tensor


@dataclass
class KUCache:
    """Key-U cache of one DeltaFormer layer: rotated keys [B, t, G, C], u [B, t, U, C].

    The u-stage keys are the same keys (kappa1(w_t, k_i)), so K and U are all a step needs: the
    softmax kappa1 normaliser is recomputed exactly from the cached keys each step."""

    keys: torch.Tensor
    u: torch.Tensor

    @property
    def length(self) -> int:
        return self.keys.shape[1]


class _HeadProjections(nn.Module):
    """q, k, v, out projections with optional per-head RMSNorm and rotary, shared by the mixers."""

    def __init__(self, config: LMConfig, use_rotary: bool) -> None:
        super().__init__()
        self.config = config
        self.use_rotary = use_rotary and config.rotary
        d, c = config.d_model, config.head_dim
        self.q_proj = nn.Linear(d, config.num_heads * c, bias=False)
        self.k_proj = nn.Linear(d, config.kv_heads * c, bias=False)
        self.v_proj = nn.Linear(d, config.kv_heads * c, bias=False)
        self.out_proj = nn.Linear(config.num_heads * c, d, bias=False)
        self.q_norm = nn.RMSNorm(c) if config.qk_norm else None
        self.k_norm = nn.RMSNorm(c) if config.qk_norm else None

    def _heads(self, x_BTX: torch.Tensor, heads: int) -> torch.Tensor:
        return x_BTX.reshape(*x_BTX.shape[:2], heads, self.config.head_dim)

    def _position(self, x_BTHC: torch.Tensor, norm: nn.Module | None,
                  positions_T: torch.Tensor) -> torch.Tensor:
        if norm is not None:
            x_BTHC = norm(x_BTHC)
        if self.use_rotary:
            x_BTHC = apply_rotary(x_BTHC, positions_T, self.config.rotary_base)
        return x_BTHC

    def qkv(self, x_BTD: torch.Tensor, positions_T: torch.Tensor):
        cfg = self.config
        q = self._position(self._heads(self.q_proj(x_BTD), cfg.num_heads), self.q_norm,
                           positions_T)
        k = self._position(self._heads(self.k_proj(x_BTD), cfg.kv_heads), self.k_norm,
                           positions_T)
        v = self._heads(self.v_proj(x_BTD), cfg.kv_heads)
        return q, k, v

    def out(self, o_BTHC: torch.Tensor) -> torch.Tensor:
        return self.out_proj(o_BTHC.reshape(*o_BTHC.shape[:2], -1))


def _positions(seq_len: int, device: torch.device, offset: int = 0) -> torch.Tensor:
    return torch.arange(offset, offset + seq_len, device=device)


class SoftmaxAttention(_HeadProjections):
    """Causal softmax attention (the Transformer baseline = DeltaFormer with beta = 0)."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__(config, use_rotary=True)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x_BTD, _positions(x_BTD.shape[1], x_BTD.device))
        heads = self.config.num_heads
        k, v = _expand_heads(k, heads), _expand_heads(v, heads)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        return self.out(o.transpose(1, 2))


def _beta(logits: torch.Tensor, activation: str) -> torch.Tensor:
    beta = torch.sigmoid(logits)
    # beta in (0, 2) admits negative eigenvalues of the transition (Grazzi et al.), but for
    # DeltaFormer beta > 1 lets |u| grow exponentially with T; opt-in only.
    return 2.0 * beta if activation == "2sigmoid" else beta


class DeltaNetMixer(_HeadProjections):
    """Plain delta rule (Yang et al. 2024, Sec. 2) with L2-normalised q and k, no positions:

        S_t = S_{t-1} + beta_t (v_t - S_{t-1} k_t) k_t^T,    o_t = S_t q_t

    computed chunk-wise as DeltaFormer's linear-kappa1 u-stage (`deltanet_chunk`); the token
    loop `naive.deltanet_naive` is its reference."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__(config, use_rotary=False)
        self.beta_proj = nn.Linear(config.d_model, config.num_heads)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        q, k, v = self.qkv(x_BTD, _positions(x_BTD.shape[1], x_BTD.device))
        k, v = _expand_heads(k, cfg.num_heads), _expand_heads(v, cfg.num_heads)
        # Unit keys keep I - beta k k^T a contraction for beta in (0, 2).
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        beta = _beta(self.beta_proj(x_BTD), cfg.beta_activation)
        return self.out(deltanet_chunk(q, k, v, beta, chunk_size=cfg.chunk_size))


class DeltaFormerAttention(_HeadProjections):
    """DeltaFormer layer (paper Sec. 3.2, Eq. 8-9 with alpha = 1); see the module docstring."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__(config, use_rotary=True)
        c = config.head_dim
        self.w_proj: nn.Linear | None = None
        self.w_norm: nn.RMSNorm | None = None
        if config.w_source == "own":
            self.w_proj = nn.Linear(config.d_model, config.u_heads * c, bias=False)
            self.w_norm = nn.RMSNorm(c) if config.qk_norm else None
        self.beta_proj = nn.Linear(config.d_model, config.u_heads)
        self.scale = 1.0 / math.sqrt(c)

    def project(self, x_BTD: torch.Tensor, offset: int = 0) -> Projected:
        """q, k, v, w, beta of x at positions offset, offset + 1, ..."""
        cfg = self.config
        positions = _positions(x_BTD.shape[1], x_BTD.device, offset)
        q, k, v = self.qkv(x_BTD, positions)
        if cfg.w_source == "k":
            w = k
        elif cfg.w_source == "q":
            w = q
        else:
            # w_source == "own" is exactly when __init__ built the w projection
            assert self.w_proj is not None
            w = self._position(self._heads(self.w_proj(x_BTD), cfg.u_heads), self.w_norm,
                               positions)
        beta = _beta(self.beta_proj(x_BTD), cfg.beta_activation)
        return Projected(q=q, k=k, v=v, w=w, beta=beta)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        p = self.project(x_BTD)
        u_heads = cfg.u_heads
        k_u, v_u = _expand_heads(p.k, u_heads), _expand_heads(p.v, u_heads)
        kernels = cfg.kappa1_per_u_head
        u = torch.empty_like(v_u)
        # the u-stage per kappa1 (heads may mix kernels), then one read-out for all heads; a
        # U per key-value head is shared by the query heads of its group
        for kernel in dict.fromkeys(kernels):
            kernel_heads = [h for h, name in enumerate(kernels) if name == kernel]
            idx = slice(None) if len(kernel_heads) == u_heads else torch.tensor(
                kernel_heads, device=x_BTD.device)
            u[:, :, idx] = deltaformer_u(
                k_u[:, :, idx], v_u[:, :, idx], p.w[:, :, idx], p.beta[:, :, idx],
                kappa1=kernel, chunk_size=cfg.chunk_size,
                kappa1_scale=default_kappa1_scale(kernel, self.scale))
        heads = cfg.num_heads
        o = F.scaled_dot_product_attention(
            p.q.transpose(1, 2), _expand_heads(p.k, heads).transpose(1, 2),
            _expand_heads(u, heads).transpose(1, 2), is_causal=True, scale=self.scale,
        ).transpose(1, 2)
        return self.out(o)

    def step(self, x_BD: torch.Tensor, cache: KUCache | None = None
             ) -> tuple[torch.Tensor, KUCache]:
        """Decode one token: x [B, D] -> (y [B, D], cache with this token's key and u appended)."""
        cfg = self.config
        if x_BD.dim() != 2:
            raise ValueError(f"step takes one token per sequence, [B, D]; got {tuple(x_BD.shape)}")
        offset = 0 if cache is None else cache.length
        if offset >= cfg.max_len:
            raise ValueError(f"cache already holds max_len={cfg.max_len} tokens")
        p = self.project(x_BD[:, None], offset)
        u_heads = cfg.u_heads
        v_t = _expand_heads(p.v, u_heads)[:, 0]  # [B, U, C]
        if cache is None:
            u_t = v_t  # empty strict prefix: u_0 = v_0
            keys = p.k
        else:
            prefix_k = _expand_heads(cache.keys, u_heads)  # [B, t, U, C]
            w_t = p.w[:, 0]
            erase_heads = []
            for head, kernel in enumerate(cfg.kappa1_per_u_head):
                kappa1_scale = default_kappa1_scale(kernel, self.scale)
                scores = torch.einsum("bc,bic->bi", w_t[:, head], prefix_k[:, :, head])
                weights = _kappa1_row(scores * kappa1_scale, kernel)
                erase_heads.append(torch.einsum("bi,bic->bc", weights, cache.u[:, :, head]))
            erase = torch.stack(erase_heads, dim=1)
            u_t = v_t - p.beta[:, 0, :, None] * erase
            keys = torch.cat([cache.keys, p.k], dim=1)
        u_all = u_t[:, None] if cache is None else torch.cat([cache.u, u_t[:, None]], dim=1)
        heads = cfg.num_heads
        scores = torch.einsum("bhc,bihc->bhi", p.q[:, 0], _expand_heads(keys, heads))
        read = torch.softmax(scores * self.scale, dim=-1)
        o_t = torch.einsum("bhi,bihc->bhc", read, _expand_heads(u_all, heads))
        return self.out(o_t[:, None])[:, 0], KUCache(keys=keys, u=u_all)


_MIXER_CLASSES = {
    "attention": SoftmaxAttention,
    "deltaformer": DeltaFormerAttention,
    "deltanet": DeltaNetMixer,
}


class DecoderBlock(nn.Module):
    """Pre-RMSNorm block: x + mixer(norm(x)), then x + mlp(norm(x)) with a GELU MLP."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.mixer_norm = nn.RMSNorm(config.d_model)
        self.mixer = _MIXER_CLASSES[config.mixer](config)
        self.mlp_norm = nn.RMSNorm(config.d_model)
        hidden = config.mlp_ratio * config.d_model
        self.mlp = nn.Sequential(nn.Linear(config.d_model, hidden), nn.GELU(),
                                 nn.Linear(hidden, config.d_model))

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        x_BTD = x_BTD + self.mixer(self.mixer_norm(x_BTD))
        return x_BTD + self.mlp(self.mlp_norm(x_BTD))


class SequenceModel(nn.Module):
    """Token embedding -> decoder blocks -> RMSNorm -> LM head (or per-position classifier).

    Positions enter only through the mixers' rotary embedding (DeltaNet is recurrent)."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.d_model)
        # N(0, 1) embeddings swamp the normalised residual stream at small width.
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.blocks = nn.ModuleList(DecoderBlock(config) for _ in range(config.num_layers))
        self.norm = nn.RMSNorm(config.d_model)
        outputs = config.vocab_size if config.num_classes is None else config.num_classes
        self.head = nn.Linear(config.d_model, outputs, bias=False)

    def forward(self, tokens_BT: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T, vocab_size or num_classes]."""
        if tokens_BT.dim() != 2:
            raise ValueError(f"tokens must be [B, T], got shape {tuple(tokens_BT.shape)}")
        if tokens_BT.shape[1] > self.config.max_len:
            raise ValueError(f"sequence length {tokens_BT.shape[1]} exceeds "
                             f"max_len={self.config.max_len}")
        x_BTD = self.embedding(tokens_BT)
        for block in self.blocks:
            x_BTD = block(x_BTD)
        return self.head(self.norm(x_BTD))


class TransformerLM(SequenceModel):
    """`SequenceModel` with the softmax-attention mixer."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__(dataclasses.replace(config, mixer="attention"))


class DeltaFormerLM(SequenceModel):
    """`SequenceModel` with the DeltaFormer mixer."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__(dataclasses.replace(config, mixer="deltaformer"))
