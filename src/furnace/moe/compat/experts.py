"""FastMoE's fused MLP experts (`fmoe.transformer._Expert`) as a furnace `ExpertBank`.

Two `FMoELinear` layers with an activation between them, ``htoh4`` [E, F, D] and
``h4toh`` [E, D, F] (FastMoE v1.0's ``experts.htoh4.weight`` checkpoint layout). The bank
also loads FastMoE v1.1 checkpoints, where `FMoETransformerMLP` keeps one single-expert
``_Expert`` per expert (``experts.<i>.htoh4.weight`` of shape [1, F, D]): the per-expert
tensors are stacked on load. Being an `ExpertBank`, it runs under furnace's expert
parallelism, shadowing included (FasterMoE section 4.1).

Shape suffixes: E local experts, D d_model, F d_hidden, R rows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..experts import ACTIVATIONS, ExpertBank, expert_seed
from .linear import FMoELinear, split_counts

__all__ = ["FusedExperts", "resolve_activation"]

_PER_EXPERT_KEY = re.compile(r"(\d+)\.(.+)")


def resolve_activation(activation: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """FastMoE's ``activation``: any callable (a module such as ``nn.Sequential(nn.ReLU(),
    nn.Dropout(p))``, or a function); furnace also takes "gelu", "relu" or "silu"."""
    if isinstance(activation, str):
        if activation.lower() in ACTIVATIONS:
            return ACTIVATIONS[activation.lower()]
        raise ValueError(f"unknown activation {activation!r}: pass a callable (an nn.Module "
                         f"or a function) or a name in {sorted(ACTIVATIONS)}")
    if not callable(activation):
        raise ValueError(f"activation must be callable (an nn.Module or a function), "
                         f"got {type(activation).__name__}")
    return activation


class FusedExperts(ExpertBank):
    """FastMoE's `_Expert(num_expert, d_model, d_hidden, activation, rank=0)`.

    ``forward(inp, fwd_expert_count)`` is FastMoE's call (counts as a tensor or a list).
    Furnace's keyword-only ``first_expert`` (global id of local expert 0) and
    ``init_seed`` (per-expert init streams, see `FMoELinear`) let a rank build only its
    own experts with the weights a single process would give them.
    """

    def __init__(self, num_expert: int, d_model: int, d_hidden: int, activation: Any,
                 rank: int = 0, *, first_expert: int = 0, init_seed: int | None = None) -> None:
        super().__init__()
        self.num_experts = num_expert
        self.d_model = d_model
        self.d_hidden = d_hidden
        self.first_expert = first_expert
        # distinct streams for the two layers of one expert
        seeds = (None, None) if init_seed is None else (init_seed, expert_seed(init_seed, -2))
        self.htoh4 = FMoELinear(num_expert, d_model, d_hidden, bias=True, rank=rank,
                                init_seed=seeds[0], first_expert=first_expert)
        self.h4toh = FMoELinear(num_expert, d_hidden, d_model, bias=True, rank=rank,
                                init_seed=seeds[1], first_expert=first_expert)
        self.activation = resolve_activation(activation)
        self.register_load_state_dict_pre_hook(_stack_per_expert_keys)

    @property
    def num_expert(self) -> int:
        return self.num_experts

    def forward(self, inp: torch.Tensor,
                fwd_expert_count: torch.Tensor | Sequence[int]) -> torch.Tensor:
        return super().forward(inp, split_counts(fwd_expert_count, self.num_experts))

    def param_tensors(self) -> list[torch.Tensor]:
        return [self.htoh4.weight, self.htoh4.bias, self.h4toh.weight, self.h4toh.bias]

    def expert_params(self, local_expert: int,
                      tensors: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
        return [t[local_expert] for t in (self.param_tensors() if tensors is None else tensors)]

    def apply_expert(self, params: Sequence[torch.Tensor], x_RD: torch.Tensor,
                     local_expert: int = 0) -> torch.Tensor:
        w1_FD, b1_F, w2_DF, b2_D = params
        return F.linear(self.activation(F.linear(x_RD, w1_FD, b1_F)), w2_DF, b2_D)

    def flops_per_token(self) -> int:
        return 4 * self.d_model * self.d_hidden

    def equivalent_d_hidden(self) -> int:
        return self.d_hidden

    def shard(self, first: int, count: int) -> FusedExperts:
        out = FusedExperts(count, self.d_model, self.d_hidden, self.activation,
                           self.htoh4.rank, first_expert=self.first_expert + first,
                           init_seed=0).to(self.htoh4.weight.dtype)
        with torch.no_grad():
            for dst, src in zip(out.param_tensors(), self.param_tensors()):
                dst.copy_(src[first:first + count])
        return out

    def extra_repr(self) -> str:
        return (f"num_expert={self.num_experts}, d_model={self.d_model}, "
                f"d_hidden={self.d_hidden}, first_expert={self.first_expert}")


def _stack_per_expert_keys(module: FusedExperts, state_dict, prefix, local_metadata, strict,
                           missing_keys, unexpected_keys, error_msgs) -> None:
    """Rewrite FastMoE v1.1's ``<i>.htoh4.weight`` [1, F, D] keys as ``htoh4.weight`` [E, F, D].

    The activation module is shared by every expert in v1.1, so its entries (if any) are
    taken from expert 0.
    """
    per_expert: dict[str, dict[int, torch.Tensor]] = {}
    for key in [k for k in state_dict if k.startswith(prefix)]:
        match = _PER_EXPERT_KEY.fullmatch(key[len(prefix):])
        if match is None:
            continue
        per_expert.setdefault(match.group(2), {})[int(match.group(1))] = state_dict.pop(key)
    for name, parts in per_expert.items():
        if name.startswith("activation."):
            state_dict[prefix + name] = parts[min(parts)]
            continue
        if sorted(parts) != list(range(module.num_experts)):
            error_msgs.append(f"{prefix}<i>.{name}: the checkpoint has experts "
                              f"{sorted(parts)}, this rank's layer has {module.num_experts}")
            continue
        if (prefix + name) in state_dict:
            error_msgs.append(f"{prefix}{name} is given both stacked and per expert")
            continue
        state_dict[prefix + name] = torch.cat([parts[i] for i in range(module.num_experts)])
