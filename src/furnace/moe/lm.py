"""A tiny MoE transformer language model and the routing traces it records.

The FasterMoE reproduction benchmarks its schedules on synthetic skew (hot fraction,
Zipf) and on "traces recorded from a tiny trained MoE LM" (design note, C.3): the gate of
a real model trained on real text (the stdlib byte corpus, `furnace.runtime.corpus`)
routes unevenly, and that uneven load is what dynamic shadowing and smart scheduling are
for. This module holds the model (`MoETransformerLM`: a GPT-style decoder whose MLPs are
`MoELayer`s), a single-process trainer (`train_lm`) and the trace (`RoutingTrace`) of
per-expert token counts per step and layer.

The model holds no parallelism code: `furnace.moe.expert_parallel` applies expert
parallelism from outside by setting each MoE layer's ``parallel`` attribute.

Shape suffixes: B = batch, T = sequence length, D = d_model, H = heads, C = head width
(D / H), V = vocabulary, S = recorded steps, L = MoE layers, N = experts, R = ranks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..runtime.corpus import Corpus, batches, eval_batches
from ..runtime.training import TrainLoopConfig, TrainResult, train_loop
from .gates import GATES
from .layer import MoELayer

__all__ = [
    "MoELMConfig",
    "MoELMTrainResult",
    "MoETransformerLM",
    "RoutingTrace",
    "TrainResult",
    "train_lm",
]


@dataclass(kw_only=True)
class MoELMConfig:
    """Size and routing of the MoE language model.

    Attributes:
        vocab_size: tokens (256 for the byte corpus).
        d_model: residual width D.
        num_layers: transformer blocks, each with one MoE layer as its MLP.
        num_heads: attention heads (must divide d_model).
        seq_len: context length (size of the learned position table).
        num_experts, top_k, d_hidden, gate: the `MoELayer` of every block.
        balance_loss_weight: weight of the gates' summed auxiliary loss in the training
            loss. 0 (the default) lets routing skew as it will, which is the point here.
        dropout: on attention weights and on each residual branch.
    """

    vocab_size: int = 256
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    seq_len: int = 128
    num_experts: int = 8
    top_k: int = 2
    d_hidden: int = 128
    gate: str = "naive"
    balance_loss_weight: float = 0.0
    dropout: float = 0.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "seq_len",
                     "num_experts", "top_k", "d_hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide d_model={self.d_model}")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k={self.top_k} exceeds num_experts={self.num_experts}")
        if self.gate not in GATES:
            raise ValueError(f"unknown gate {self.gate!r}; known: {sorted(GATES)}")
        fixed = GATES[self.gate].fixed_top_k
        if fixed is not None and self.top_k != fixed:
            raise ValueError(f"gate {self.gate!r} routes each token to exactly {fixed} "
                             f"expert(s): top_k must be {fixed}, got {self.top_k}")
        if not (math.isfinite(self.balance_loss_weight) and self.balance_loss_weight >= 0):
            raise ValueError(f"balance_loss_weight must be finite and >= 0, "
                             f"got {self.balance_loss_weight}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``scaled_dot_product_attention``."""

    def __init__(self, d_model: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        H = self.num_heads
        q_BTD, k_BTD, v_BTD = self.qkv(x_BTD).split(D, dim=-1)
        q_BHTC, k_BHTC, v_BHTC = (t.reshape(B, T, H, D // H).transpose(1, 2)
                                  for t in (q_BTD, k_BTD, v_BTD))
        y_BHTC = F.scaled_dot_product_attention(
            q_BHTC, k_BHTC, v_BHTC, is_causal=True,
            dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y_BHTC.transpose(1, 2).reshape(B, T, D))


class Block(nn.Module):
    """Pre-LayerNorm block: ``x + attn(ln1(x))``, then ``x + moe(ln2(x))``."""

    def __init__(self, config: MoELMConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config.d_model, config.num_heads, config.dropout)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.moe = MoELayer(d_model=config.d_model, num_experts=config.num_experts,
                            top_k=config.top_k, d_hidden=config.d_hidden, gate=config.gate)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        x_BTD = x_BTD + self.drop(self.attn(self.ln1(x_BTD)))
        return x_BTD + self.drop(self.moe(self.ln2(x_BTD)))


class MoETransformerLM(nn.Module):
    """Decoder-only LM: token + learned position embeddings, MoE blocks, untied head."""

    def __init__(self, config: MoELMConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
        # N(0, 1) embeddings (the nn.Embedding default) swamp the LayerNorm-ed residual
        # stream at this width; GPT-2's 0.02 keeps the first steps stable
        nn.init.normal_(self.tok_emb.weight, std=0.02)
        nn.init.normal_(self.pos_emb.weight, std=0.02)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def moe_layers(self) -> list[MoELayer]:
        """The MoE layers, first block first."""
        layers = []
        for block in self.blocks:
            # nn.ModuleList types its items as plain modules; every one is a Block
            assert isinstance(block, Block)
            layers.append(block.moe)
        return layers

    def forward(self, idx_BT: torch.Tensor, targets_BT: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits ``[B, T, V]`` and, with targets, CE + weighted sum of balance losses."""
        if idx_BT.dim() != 2 or idx_BT.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"idx_BT must be an integer [B, T] tensor, got {idx_BT.dtype} "
                             f"of shape {tuple(idx_BT.shape)}")
        B, T = idx_BT.shape
        if not 1 <= T <= self.config.seq_len:
            raise ValueError(f"sequence length {T} is outside [1, seq_len={self.config.seq_len}]")
        if targets_BT is not None and targets_BT.shape != idx_BT.shape:
            raise ValueError(f"targets shape {tuple(targets_BT.shape)} != inputs shape "
                             f"{tuple(idx_BT.shape)}")
        pos_T = torch.arange(T, device=idx_BT.device)
        x_BTD = self.drop(self.tok_emb(idx_BT) + self.pos_emb(pos_T))
        for block in self.blocks:
            x_BTD = block(x_BTD)
        logits_BTV = self.head(self.ln_f(x_BTD))
        if targets_BT is None:
            return logits_BTV, None
        loss = F.cross_entropy(logits_BTV.reshape(B * T, -1), targets_BT.reshape(-1))
        if self.config.balance_loss_weight:
            balance = sum(layer.balance_loss for layer in self.moe_layers())
            loss = loss + self.config.balance_loss_weight * balance
        return logits_BTV, loss


@dataclass
class RoutingTrace:
    """Per-expert assignment counts of every MoE layer at every recorded step.

    Attributes:
        num_layers, num_experts, top_k: the model the trace came from.
        steps: one ``[L][N]`` list of counts per recorded step.
        tokens: tokens routed per step (per layer; every layer sees the same tokens).
    """

    num_layers: int
    num_experts: int
    top_k: int
    steps: list[list[list[int]]] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_experts", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if len(self.tokens) != len(self.steps):
            raise ValueError(f"{len(self.steps)} steps but {len(self.tokens)} token counts")
        for rows in self.steps:
            self._check_rows(rows)

    @classmethod
    def for_model(cls, model: MoETransformerLM) -> RoutingTrace:
        c = model.config
        return cls(num_layers=c.num_layers, num_experts=c.num_experts, top_k=c.top_k)

    def __len__(self) -> int:
        return len(self.steps)

    def _check_rows(self, rows: Sequence[Sequence[int]]) -> None:
        if len(rows) != self.num_layers or any(len(r) != self.num_experts for r in rows):
            raise ValueError(f"a step needs {self.num_layers} rows of {self.num_experts} "
                             f"counts, got {[len(r) for r in rows]}")

    def record(self, layers: MoETransformerLM | Sequence[MoELayer]) -> None:
        """Append one step: the counts of each layer's last forward."""
        if isinstance(layers, MoETransformerLM):
            layers = layers.moe_layers()
        rows, tokens = [], set()
        for i, layer in enumerate(layers):
            if layer.last_routing is None:
                raise ValueError(f"MoE layer {i} has not run a forward yet; nothing to record")
            rows.append([int(c) for c in layer.last_routing.tokens_per_expert])
            tokens.add(layer.last_routing.tokens)
        self._check_rows(rows)
        if len(tokens) != 1:
            raise ValueError(f"the layers routed different token counts {sorted(tokens)}")
        self.steps.append(rows)
        self.tokens.append(tokens.pop())

    @property
    def counts(self) -> np.ndarray:
        """int64 ``[S, L, N]`` array of assignments per expert."""
        return np.asarray(self.steps, dtype=np.int64).reshape(
            len(self.steps), self.num_layers, self.num_experts)

    def hot_share(self) -> np.ndarray:
        """``[S, L]``: the most loaded expert's share of the assignments (1/N is balanced)."""
        counts_SLN = self.counts
        total_SL = counts_SLN.sum(axis=-1)
        return np.divide(counts_SLN.max(axis=-1), total_SL, out=np.zeros(total_SL.shape),
                         where=total_SL > 0)

    def skew_summary(self) -> dict:
        """How uneven the routing is, as plain numbers (JSON-ready).

        ``imbalance`` is max / mean count per step and layer (1 is balanced, N is all on
        one expert); ``expert_share`` is each expert's share of all assignments, per layer.
        """
        if not self.steps:
            raise ValueError("the trace is empty")
        counts_SLN = self.counts.astype(np.float64)
        hot_SL = self.hot_share()
        mean_SL = counts_SLN.mean(axis=-1)
        imbalance_SL = np.divide(counts_SLN.max(axis=-1), mean_SL, out=np.ones(mean_SL.shape),
                                 where=mean_SL > 0)
        per_layer_LN = counts_SLN.sum(axis=0)
        share_LN = per_layer_LN / np.maximum(per_layer_LN.sum(axis=-1, keepdims=True), 1)
        return {
            "steps": len(self.steps),
            "layers": self.num_layers,
            "num_experts": self.num_experts,
            "top_k": self.top_k,
            "uniform_share": 1.0 / self.num_experts,
            "hot_share_mean": float(hot_SL.mean()),
            "hot_share_max": float(hot_SL.max()),
            "hot_share_last": [float(v) for v in hot_SL[-1]],
            "imbalance_mean": float(imbalance_SL.mean()),
            "imbalance_max": float(imbalance_SL.max()),
            "expert_share": [[float(v) for v in row] for row in share_LN],
        }

    def counts_for(self, num_ranks: int, step: int, layer: int) -> list[list[int]]:
        """Rows ``[R][N]``: a recorded step split as if ``num_ranks`` ranks had routed it.

        The model ran in one process, so each expert's count is split as evenly as
        possible over ranks, the remainder going to the lowest ranks; the rows sum to the
        recorded counts. Negative ``step``/``layer`` count from the end.
        """
        if num_ranks < 1:
            raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
        if not -len(self.steps) <= step < len(self.steps):
            raise ValueError(f"step {step} is outside a trace of {len(self.steps)} steps")
        if not -self.num_layers <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is outside [0, {self.num_layers})")
        counts = self.steps[step][layer]
        return [[c // num_ranks + (1 if r < c % num_ranks else 0) for c in counts]
                for r in range(num_ranks)]

    def to_json(self) -> str:
        return json.dumps({"num_layers": self.num_layers, "num_experts": self.num_experts,
                           "top_k": self.top_k, "tokens": self.tokens, "steps": self.steps})

    @classmethod
    def from_json(cls, text: str) -> RoutingTrace:
        try:
            d = json.loads(text)
            return cls(num_layers=int(d["num_layers"]), num_experts=int(d["num_experts"]),
                       top_k=int(d["top_k"]), tokens=[int(t) for t in d["tokens"]],
                       steps=[[[int(c) for c in row] for row in s] for s in d["steps"]])
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"not a RoutingTrace JSON document: {err}") from err


@dataclass(kw_only=True)
class MoELMTrainResult(TrainResult):
    """What `train_lm` returns: the loop's record (``losses``, ``seconds``, ``model`` in eval
    mode, ...) and the MoE LM's own.

    Attributes:
        trace: the routing of every training step.
        val_loss: mean loss over the evaluation batches after the last step (NaN if the
            loss stopped being finite and training stopped at ``diverged_at``).
        val_history: ``(step index from 0, val_loss)`` every ``eval_every`` steps (empty
            if 0).
    """

    trace: RoutingTrace
    val_loss: float = math.nan
    val_history: list[tuple[int, float]] = field(default_factory=list)


EVAL_BATCHES = 4
# a few early routing flips give large gradients; clipping keeps lr=3e-3 stable
GRADIENT_CLIP = 1.0


@torch.no_grad()
def evaluate(model: MoETransformerLM, data: torch.Tensor, *, batch_size: int,
             max_batches: int = EVAL_BATCHES) -> float:
    """Mean loss over the first ``max_batches`` deterministic windows of ``data``."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for x_BT, y_BT in eval_batches(data, batch_size, model.config.seq_len, max_batches):
        _, loss = model(x_BT, y_BT)
        total += float(loss) * x_BT.shape[0]
        count += x_BT.shape[0]
    model.train(was_training)
    return total / count


def train_lm(config: MoELMConfig, corpus: Corpus, *, steps: int, batch_size: int = 16,
             lr: float = 3e-3, seed: int = 0, eval_every: int = 0,
             progress: Callable[[int, float], None] | None = None,
             setup: Callable[[MoETransformerLM], None] | None = None) -> MoELMTrainResult:
    """Train a fresh `MoETransformerLM` on ``corpus.train`` with AdamW; record its routing.

    Runs `furnace.runtime.training.train_loop` (AdamW, weight decay 0.01, a constant
    learning rate, gradient norm clipped to 1). Deterministic for a fixed ``seed`` (and
    thread count): the model is initialised and dropout drawn from a forked global RNG
    seeded with ``seed``, so the caller's RNG state is untouched, and batches come from a
    generator of their own.

    Args:
        steps: optimizer steps, each on ``batch_size`` random windows of ``seq_len``.
        eval_every: also evaluate on ``corpus.val`` every this many steps (0: only at end).
        progress: called after every step with (step index from 0, training loss).
        setup: called on the fresh model before training (e.g. to bind gates).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be finite and > 0, got {lr}")
    if eval_every < 0:
        raise ValueError(f"eval_every must be >= 0, got {eval_every}")
    if config.vocab_size < corpus.vocab_size:
        raise ValueError(f"vocab_size={config.vocab_size} cannot hold the corpus's "
                         f"{corpus.vocab_size} symbols")
    for name, split in (("train", corpus.train), ("val", corpus.val)):
        if split.numel() < config.seq_len + 1:
            raise ValueError(f"the {name} split has {split.numel()} tokens, fewer than one "
                             f"window of seq_len={config.seq_len} plus one")
    trace = RoutingTrace(num_layers=config.num_layers, num_experts=config.num_experts,
                         top_k=config.top_k)

    def build_model() -> MoETransformerLM:
        model = MoETransformerLM(config)
        if setup is not None:
            setup(model)
        return model

    def loss(model: MoETransformerLM, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        _, value = model(*batch)
        trace.record(model)
        return value

    def evaluate_val(model: MoETransformerLM) -> dict[str, float]:
        return {"val_loss": evaluate(model, corpus.val, batch_size=batch_size)}

    report = None
    if progress is not None:
        report_step = progress

        def report(step: int, metrics: dict[str, float]) -> None:
            # train_lm's callers count steps from 0
            report_step(step - 1, metrics["loss"])

    loop = TrainLoopConfig(steps=steps, lr=lr, weight_decay=0.01,
                           clip=GRADIENT_CLIP, schedule="constant", seed=seed,
                           eval_every=eval_every)
    result = train_loop(
        loop, build_model=build_model,
        batches=lambda generator: batches(corpus.train, batch_size=batch_size,
                                          seq_len=config.seq_len, generator=generator),
        loss=loss, evaluate=evaluate_val, result=MoELMTrainResult(trace=trace),
        progress=report)
    result.val_history = [(step - 1, m["val_loss"]) for step, m in result.eval_history]
    if result.final_metrics is not None:
        result.val_loss = result.final_metrics["val_loss"]
    return result
