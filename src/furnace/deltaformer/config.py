"""Configs of DeltaFormer's models and training runs (design note `deltaformer.md` Sec. 7).

`LMConfig` sizes a `SequenceModel` and picks its mixer (DeltaFormer, Xu et al., NeurIPS 2025,
Sec. 3.2-3.4; softmax attention; DeltaNet); `TrainConfig` is one run of `train.train`: the
task or byte-level LM, the model fields it varies, the optimizer, the data and checkpoints.
Both live here, apart from the model and the loop, so the CLI can build its options from
them; `model` and `train` re-export them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from .naive import KAPPA1_KINDS
from .tasks import TASKS, get_task

__all__ = [
    "BETA_ACTIVATIONS",
    "LM_TASK",
    "MIXERS",
    "W_SOURCES",
    "LMConfig",
    "TrainConfig",
]

LM_TASK = "lm"
MIXERS = ("attention", "deltaformer", "deltanet")
W_SOURCES = ("k", "q", "own")
BETA_ACTIVATIONS = ("sigmoid", "2sigmoid")


@dataclass(kw_only=True)
class LMConfig:
    """Size and mixer of a `SequenceModel`.

    Attributes:
        vocab_size: input tokens.
        d_model: residual width D.
        num_layers: decoder blocks.
        num_heads: query heads H (must divide d_model).
        num_kv_heads: key-value heads G (must divide num_heads); None means num_heads.
        mixer: "attention", "deltaformer" or "deltanet".
        kappa1: DeltaFormer erase kernel, one name for all heads or a tuple with one per head.
        w_source: "k" (paper default), "q" (flash-linear-attention) or "own" (own projection).
        beta_activation: "sigmoid" (beta in (0, 1)) or "2sigmoid" (beta in (0, 2); can blow up).
        qk_norm: RMSNorm per head on q, k (and an own w).
        rotary: rotary position embedding on q, k, w (not used by the DeltaNet mixer).
        rotary_base: RoPE frequency base.
        max_len: longest sequence accepted.
        num_classes: None for an LM head over vocab_size; else a per-position classifier.
        mlp_ratio: MLP hidden width / d_model.
        chunk_size: rows per triangular solve in the chunked DeltaFormer u-stage.
    """

    vocab_size: int = 256
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int | None = None
    mixer: str = "deltaformer"
    kappa1: str | tuple[str, ...] = "softmax"
    w_source: str = "k"
    beta_activation: str = "sigmoid"
    qk_norm: bool = False
    rotary: bool = True
    rotary_base: float = 10000.0
    max_len: int = 128
    num_classes: int | None = None
    mlp_ratio: int = 4
    chunk_size: int = 64

    def __post_init__(self) -> None:
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_heads
        for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads",
                     "max_len", "mlp_ratio", "chunk_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_classes is not None and (
            isinstance(self.num_classes, bool) or not isinstance(self.num_classes, int)
            or self.num_classes < 1
        ):
            raise ValueError(f"num_classes must be None or a positive int, got "
                             f"{self.num_classes!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide d_model={self.d_model}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={self.num_kv_heads} must divide "
                             f"num_heads={self.num_heads}")
        if self.mixer not in MIXERS:
            raise ValueError(f"unknown mixer {self.mixer!r}; known: {MIXERS}")
        if self.w_source not in W_SOURCES:
            raise ValueError(f"unknown w_source {self.w_source!r}; known: {W_SOURCES}")
        if self.beta_activation not in BETA_ACTIVATIONS:
            raise ValueError(f"unknown beta_activation {self.beta_activation!r}; "
                             f"known: {BETA_ACTIVATIONS}")
        if self.rotary and self.head_dim % 2:
            raise ValueError(f"rotary needs an even head width, got {self.head_dim}")
        if isinstance(self.kappa1, list):
            self.kappa1 = tuple(self.kappa1)
        names = (self.kappa1,) if isinstance(self.kappa1, str) else self.kappa1
        if not isinstance(names, tuple) or not names:
            raise ValueError(f"kappa1 must be a name or a non-empty tuple of names, "
                             f"got {self.kappa1!r}")
        for name in names:
            if name not in KAPPA1_KINDS:
                raise ValueError(f"unknown kappa1 {name!r}; known: {KAPPA1_KINDS}")
        if not isinstance(self.kappa1, str) and len(self.kappa1) != self.num_heads:
            raise ValueError(f"kappa1 tuple has {len(self.kappa1)} entries but num_heads="
                             f"{self.num_heads}")
        # A u-stage shared by a key-value group has one kernel; heads of a group must agree.
        if self.u_heads < self.num_heads:
            group = self.num_heads // self.num_kv_heads
            per_head = self.kappa1_per_head
            for g in range(self.num_kv_heads):
                if len(set(per_head[g * group:(g + 1) * group])) > 1:
                    raise ValueError(
                        f"query heads {g * group}..{(g + 1) * group - 1} share key-value head "
                        f"{g} and so one U (w_source={self.w_source!r}), but have kappa1 "
                        f"{per_head[g * group:(g + 1) * group]}"
                    )

    @property
    def kv_heads(self) -> int:
        """Key-value heads G: num_kv_heads, which `__post_init__` resolves from None."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def kappa1_per_head(self) -> tuple[str, ...]:
        if isinstance(self.kappa1, str):
            return (self.kappa1,) * self.num_heads
        return self.kappa1

    @property
    def u_heads(self) -> int:
        """Heads of the DeltaFormer u-stage: one per key-value head unless w comes from q."""
        return self.num_heads if self.w_source == "q" else self.kv_heads

    @property
    def kappa1_per_u_head(self) -> tuple[str, ...]:
        stride = self.num_heads // self.u_heads
        return self.kappa1_per_head[::stride]


@dataclass(kw_only=True)
class TrainConfig:
    """One training run.

    Attributes:
        task: a `tasks.TASKS` name ("swap", "parity", "modarith", "s5") or "lm".
        length: sequence length T (the LM's context).
        mixer, d_model, num_layers, num_heads, kappa1, w_source, beta_activation, rotary,
            chunk_size: the `LMConfig` fields of the model (the rest keep their defaults).
        steps: optimizer steps (also the OneCycle horizon).
        batch_size: sequences per step.
        lr: OneCycle peak learning rate.
        weight_decay: AdamW weight decay.
        betas: AdamW betas.
        clip: gradient-norm clip.
        seed: model initialisation and data.
        eval_sequences: fresh evaluation sequences (tasks) or validation windows (LM).
        eval_lengths: tasks only: further lengths to evaluate the last-position accuracy
            at, after training at ``length``. Longer ones test length generalisation, the
            protocol of the Chomsky-hierarchy suite (Deletang et al., ICLR 2023) that
            DeltaFormer App. D uses.
        corpus_bytes: LM only: bytes of stdlib source, both splits together.
        val_fraction: LM only: share of files held out for validation.
        checkpoint: where to write checkpoints (None: no checkpoints).
        checkpoint_every: steps between checkpoints (0: only at the end).
    """

    # metadata["help"] is the help of the field's `furnace deltaformer train` option
    task: str = field(default="swap", metadata={
        "help": "state-tracking task, or lm: the byte-level LM on stdlib sources",
        "choices": (*sorted(TASKS), LM_TASK)})
    length: int = field(default=16, metadata={
        "help": "training sequence length (the LM's context)"})
    mixer: str = field(default="deltaformer", metadata={
        "help": "sequence mixer of every block", "choices": MIXERS})
    d_model: int = field(default=64, metadata={
        "help": "residual width; the number of heads must divide it"})
    num_layers: int = field(default=1, metadata={"help": "decoder blocks"})
    num_heads: int = field(default=4, metadata={"help": "attention heads"})
    kappa1: str | tuple[str, ...] = field(default="linear", metadata={
        "help": f"erase kernel ({', '.join(KAPPA1_KINDS)}), or comma-separated, one per head"})
    w_source: str = field(default="k", metadata={
        "help": "where w comes from: k, q or its own projection", "choices": W_SOURCES})
    beta_activation: str = field(default="sigmoid", metadata={
        "help": "beta activation (2sigmoid: beta in (0, 2), can blow up)",
        "choices": BETA_ACTIVATIONS})
    rotary: bool = field(default=True, metadata={
        "help": "rotary positions (--no-rotary: none, NoPE)"})
    chunk_size: int = field(default=64, metadata={
        "help": "rows per triangular solve of the chunked u-stage"})
    steps: int = field(default=1500, metadata={"help": "optimizer steps, the OneCycle horizon"})
    batch_size: int = field(default=128, metadata={"help": "sequences per step"})
    lr: float = field(default=3e-3, metadata={"help": "OneCycle peak rate"})
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay"})
    betas: tuple[float, float] = field(default=(0.9, 0.999), metadata={"help": "AdamW betas"})
    clip: float = field(default=1.0, metadata={"help": "gradient-norm clip"})
    seed: int = field(default=0, metadata={"help": "model initialisation and data"})
    eval_sequences: int = field(default=2000, metadata={
        "help": "fresh evaluation sequences (tasks) or validation windows (lm)"})
    eval_lengths: tuple[int, ...] = field(default=(), metadata={
        "help": "tasks only: also report last-position accuracy at these lengths (length "
        "generalisation)"})
    # the note's 6.0 MB train + 0.5 MB validation; corpus.py splits by whole files (every
    # 13th file is validation) rather than by a byte offset, so the split is ~1/13 of it
    corpus_bytes: int = field(default=6_500_000, metadata={
        "help": "LM only: bytes of stdlib source, both splits together"})
    val_fraction: float = field(default=1 / 13, metadata={
        "help": "LM only: share of files held out for validation"})
    checkpoint: str | Path | None = field(default=None, metadata={
        "help": "checkpoint file (its folder must exist and be writable)"})
    checkpoint_every: int = field(default=0, metadata={
        "help": "steps between checkpoints (0: only at the end)"})

    def __post_init__(self) -> None:
        if self.task != LM_TASK and self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose one of "
                             f"{sorted(TASKS) + [LM_TASK]}")
        for name in ("length", "steps", "batch_size", "eval_sequences", "corpus_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.eval_lengths = tuple(self.eval_lengths)
        for value in self.eval_lengths:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"eval_lengths must hold positive ints, got {value!r}")
        if self.eval_lengths and self.task == LM_TASK:
            raise ValueError("eval_lengths applies to tasks, not to the LM")
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be positive and finite, got {self.lr}")
        if not self.clip > 0:
            raise ValueError(f"clip must be positive, got {self.clip}")
        # building the model config here reports bad model fields at construction time
        self.model_config()

    def model_config(self) -> LMConfig:
        if self.task == LM_TASK:
            vocab, classes = 256, None
        else:
            task = get_task(self.task)
            vocab, classes = task.vocab_size, task.num_classes
        return LMConfig(vocab_size=vocab, num_classes=classes, d_model=self.d_model,
                        num_layers=self.num_layers, num_heads=self.num_heads, mixer=self.mixer,
                        kappa1=self.kappa1, w_source=self.w_source,
                        beta_activation=self.beta_activation, rotary=self.rotary,
                        max_len=max((self.length, *self.eval_lengths)),
                        chunk_size=self.chunk_size)
