"""Configs of BaGuaLu's planner (Ma et al., PPoPP'22): the MoE model and the MoDa layout.

`MoEModelSpec` is an M6-style MoE transformer in which every layer's FFN is a top-k MoE
layer; `PlanLayout` is a MoDa layout (MoE expert parallelism + data parallelism) on core
groups (CGs). What follows the paper: parameter counts (1.93T, 14.5T, 174T), ranks being
Sunway core groups, mixed precision with Adam (2 + 2 + 4 + 8 bytes per parameter), and the
partitioning of parameters, gradients and optimizer states (design note B.3). What is
reconstruction: BaGuaLu's model shapes are not public, so `MoEModelSpec.from_param_count`
chooses them by the rule in its docstring, and the ZeRO-style partitioning scheme
(`PlanLayout.shard_states`) is our reading of "partitioning".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from furnace.runtime.cliargs import ConfigFieldError, require_positive_ints
from furnace.runtime.topology import Topology

from .layout import MoDaLayout

__all__ = ["ConfigFieldError", "LayoutError", "MoEModelSpec", "PlanLayout", "parse_param_count",
           "require_positive_ints"]

_SUFFIXES = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "T": 1e12, "P": 1e15}


class LayoutError(ConfigFieldError):
    """An invalid spec or layout."""


def parse_param_count(text: str) -> float:
    """"14.5T" -> 1.45e13; suffixes K, M, G or B, T, P (case-insensitive); a bare number too."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]?)\s*", text)
    if match is None or match.group(2).upper() not in _SUFFIXES:
        raise ValueError(f"a parameter count such as 14.5T or 1.93e12, got {text!r}")
    value = float(match.group(1)) * _SUFFIXES[match.group(2).upper()]
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"a parameter count >= 1, got {text!r}")
    return value


@dataclass(frozen=True)
class MoEModelSpec:
    """An MoE transformer; every layer has attention and a top-k MoE FFN (pre-norm).

    Parameter counts, per layer: attention 4H^2 + 4H, two norms 4H, the gate H E + E,
    each expert 2 H F + F + H (two biased linears); plus token embeddings V H (tied with
    the output projection unless ``tied_embeddings`` is False: then the bias-free output
    projection adds another V H, as in `furnace.moe.MoETransformerLM`), position embeddings
    S H and a final norm 2H.
    """

    num_layers: int = field(default=24, metadata={"help": "transformer layers, all MoE"})
    d_model: int = field(default=4096, metadata={"help": "model width H"})
    d_hidden: int = field(default=16384, metadata={"help": "expert hidden width F"})
    num_experts: int = field(default=4500, metadata={"help": "experts per layer E"})
    top_k: int = field(default=2, metadata={"help": "experts each token goes to"})
    num_heads: int = field(default=32, metadata={"help": "attention heads"})
    seq_len: int = field(default=1024, metadata={"help": "sequence length S"})
    vocab: int = field(default=50304, metadata={"help": "vocabulary size V"})
    tokens_per_step: int = field(default=576_000 * 4096,
                                 metadata={"help": "tokens in one optimizer step, all ranks"})
    tied_embeddings: bool = field(default=True, metadata={
        "help": "the output projection shares the token embedding's V H weights"})

    def __post_init__(self) -> None:
        require_positive_ints(self, ("num_layers", "d_model", "d_hidden", "num_experts",
                                      "top_k", "num_heads", "seq_len", "vocab",
                                      "tokens_per_step"), LayoutError)
        if not isinstance(self.tied_embeddings, bool):
            raise LayoutError("tied_embeddings", f"must be a bool, got {self.tied_embeddings!r}")
        if self.top_k > self.num_experts:
            raise LayoutError("top_k", f"must be <= num_experts ({self.num_experts}), "
                              f"got {self.top_k}")
        if self.d_model % self.num_heads:
            raise LayoutError("num_heads", f"must divide d_model ({self.d_model}), "
                              f"got {self.num_heads}")

    # --- parameter counts ------------------------------------------------------------
    @property
    def expert_params(self) -> int:
        """One expert: 2 H F + F + H."""
        return 2 * self.d_model * self.d_hidden + self.d_hidden + self.d_model

    @property
    def gate_params_per_layer(self) -> int:
        return self.d_model * self.num_experts + self.num_experts

    @property
    def dense_params_per_layer(self) -> int:
        """Attention (4H^2 + 4H) and the two norms (4H); the gate is counted apart."""
        return 4 * self.d_model ** 2 + 8 * self.d_model

    @property
    def embedding_params(self) -> int:
        """Token embedding V H (and an untied output projection V H), positions S H,
        final norm 2H."""
        vocab_tables = 1 if self.tied_embeddings else 2
        return (vocab_tables * self.vocab + self.seq_len + 2) * self.d_model

    @property
    def expert_params_total(self) -> int:
        return self.num_layers * self.num_experts * self.expert_params

    @property
    def replicated_params(self) -> int:
        """Everything data-parallel over the whole world: attention, norms, gates, embeddings."""
        return (self.num_layers * (self.dense_params_per_layer + self.gate_params_per_layer)
                + self.embedding_params)

    @property
    def total_params(self) -> int:
        return self.replicated_params + self.expert_params_total

    @property
    def active_params(self) -> int:
        """Parameters one token touches: the replicated ones and k experts per layer."""
        return self.replicated_params + self.num_layers * self.top_k * self.expert_params

    @classmethod
    def from_param_count(cls, target: float | str, *, num_layers: int = 24,
                         d_model: int = 4096, ffn_ratio: int = 4, top_k: int = 2,
                         expert_multiple: int = 300, **rest: Any) -> MoEModelSpec:
        """The spec with ``target`` parameters by our reconstruction rule (not the paper's).

        The rule: width H = ``d_model``, F = ``ffn_ratio`` H, ``num_layers`` layers and
        top-``top_k`` are fixed; the experts per layer E are what the count sets, E =
        (target - embeddings - L (attention + norms)) / (L (expert + H + 1)), rounded to
        the nearest multiple of ``expert_multiple`` (300 = 50 nodes' core groups, so that
        expert-parallel groups of many nodes divide E) and at least one multiple. With the
        defaults, 14.5T gives E = 4500 and 174T gives E = 54,000 (12x: the paper's two
        sizes differ by 12x), 1.93T gives E = 600. The resulting
        `total_params` is exact and differs from ``target`` by the rounding.
        """
        count = parse_param_count(target) if isinstance(target, str) else float(target)
        probe = cls(num_layers=num_layers, d_model=d_model, d_hidden=ffn_ratio * d_model,
                    num_experts=max(top_k, 1), top_k=top_k, **rest)
        per_expert_column = num_layers * (probe.expert_params + d_model + 1)
        fixed = probe.embedding_params + num_layers * probe.dense_params_per_layer
        experts = (count - fixed) / per_expert_column
        multiple = max(1, expert_multiple)
        rounded = max(multiple, round(experts / multiple) * multiple, top_k)
        return cls(num_layers=num_layers, d_model=d_model, d_hidden=ffn_ratio * d_model,
                   num_experts=int(rounded), top_k=top_k, **rest)


@dataclass(frozen=True)
class PlanLayout:
    """A MoDa layout on ``world_size`` ranks (core groups), laid out node-major.

    Experts are split over expert-parallel groups of ``ep_size`` consecutive ranks (so a
    group spans ``ep_size / 6`` nodes); the ``dp_size = world_size / ep_size`` groups hold
    replicas of the same experts. Replicated parameters are data-parallel over the world.
    With ``shard_states`` the 16 bytes per parameter are partitioned over each parameter's
    data-parallel group (ZeRO stage 3: gradients reduce-scattered, parameters all-gathered
    for the forward and again for the backward pass); without, gradients are all-reduced.
    """

    world_size: int = field(default=576_000, metadata={"help": "ranks (core groups)"})
    ep_size: int = field(default=4500, metadata={"help": "expert-parallel group size"})
    shard_states: bool = field(default=True, metadata={
        "help": "partition parameters, gradients and optimizer states over each "
        "parameter's data-parallel group (ZeRO-3 style)"})
    recompute: bool = field(default=True, metadata={
        "help": "activation checkpointing: keep each layer's input, recompute the rest in "
        "the backward pass (one extra forward)"})

    def __post_init__(self) -> None:
        require_positive_ints(self, ("world_size", "ep_size"), LayoutError)
        if self.ep_size > self.world_size:
            raise LayoutError("ep_size", f"must be <= world_size ({self.world_size}), "
                              f"got {self.ep_size}")
        try:
            self.moda_layout()
        except ValueError:
            # MoDaLayout holds the rule (P divides W); this keeps the planner's message
            raise LayoutError("ep_size", f"must divide world_size ({self.world_size}), "
                              f"got {self.ep_size}") from None

    def moda_layout(self, topology: Topology | None = None) -> MoDaLayout:
        """The runtime layout of these ranks (`MoDaLayout`, which also owns the rule that
        the expert-parallel size divides the world); with ``topology``, its hierarchy
        rule applies too and raises `ValueError` for a group straddling a unit."""
        return MoDaLayout(world_size=self.world_size, expert_parallel_size=self.ep_size,
                          topology=topology)

    @property
    def dp_size(self) -> int:
        """Replicas of each expert: the expert data-parallel group size."""
        return self.world_size // self.ep_size

    def validate_for(self, spec: MoEModelSpec) -> None:
        """Each expert-parallel rank holds the same whole number of experts per layer."""
        if self.ep_size > spec.num_experts:
            raise LayoutError("ep_size", f"must be <= num_experts ({spec.num_experts}), "
                              f"got {self.ep_size}")
        if spec.num_experts % self.ep_size:
            raise LayoutError("ep_size", f"must divide num_experts ({spec.num_experts}), "
                              f"got {self.ep_size}")
        if spec.tokens_per_step % self.world_size:
            raise LayoutError("tokens_per_step", f"must be a multiple of world_size "
                              f"({self.world_size}), got {spec.tokens_per_step}")
