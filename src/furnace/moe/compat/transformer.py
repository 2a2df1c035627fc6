"""FastMoE's `FMoETransformerMLP` (`fmoe.transformer`, FastMoE v1.1): the MoE MLP of a
Transformer block, num_expert 2-layer MLP experts H -> d_hidden -> H per worker.

The experts are one `FusedExperts` bank (``experts.htoh4`` / ``experts.h4toh``, FastMoE
v1.0's layout, which loads v1.1's per-expert ``experts.<i>.`` checkpoints too); ``_Expert``
is its FastMoE name, for subclasses that assign ``self.experts = _Expert(...)``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..layer import MoETransformerMLP
from .experts import FusedExperts
from .layers import FMoE

__all__ = ["FMoETransformerMLP", "_Expert"]

_Expert = FusedExperts
# FastMoE's default activation; stateless, so one instance serves every layer
_GELU = torch.nn.GELU()


class FMoETransformerMLP(FMoE, MoETransformerMLP):
    """FastMoE's `FMoETransformerMLP(num_expert=32, d_model=1024, d_hidden=4096,
    activation=torch.nn.GELU(), expert_dp_comm="none", expert_rank=0, **kwargs)`.

    Args:
        num_expert, d_model, d_hidden: as FastMoE (``num_expert`` per worker).
        activation: any callable applied between the two layers, e.g. FastMoE's
            Transformer-XL ``nn.Sequential(nn.ReLU(), nn.Dropout(p))``; furnace also
            takes "gelu", "relu" or "silu".
        expert_dp_comm: the experts' ``dp_comm`` mark for `DistributedGroupedDataParallel`
            ("none": each worker's own; "dp": replicas over the data-parallel group).
        expert_rank: kept as ``FMoELinear.rank``; no effect, as in FastMoE v1.1.
        **kwargs: `FMoE`'s other arguments (world_size, moe_group, top_k, gate, gate_hook,
            gate_bias, parallel_config; the unsupported ones must stay None).

    It is both an `FMoE` and a furnace `MoETransformerMLP`; the forward takes any shape
    [..., d_model].
    """

    def __init__(self, num_expert: int = 32, d_model: int = 1024, d_hidden: int = 4096,
                 activation: Any = _GELU, expert_dp_comm: str = "none",
                 expert_rank: int = 0, **kwargs: Any) -> None:
        if "expert" in kwargs:
            raise TypeError("FMoETransformerMLP builds its own experts; pass expert= to FMoE")
        if not isinstance(expert_dp_comm, str):
            raise ValueError(f"expert_dp_comm must be a group name, got {expert_dp_comm!r}")
        FMoE.__init__(self, num_expert=num_expert, d_model=d_model, d_hidden=d_hidden,
                      activation=activation, **kwargs)
        # no expert= reaches FMoE, so it built its fused bank
        experts = self.experts
        assert isinstance(experts, FusedExperts)
        experts.htoh4.rank = experts.h4toh.rank = expert_rank
        self.mark_parallel_comm(expert_dp_comm)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return FMoE.forward(self, inp)
