"""FastMoE's `FMoELinear` (`fmoe.linear`, FastMoE v1.1): one linear layer per local expert.

``weight`` is [num_expert, out_feat, in_feat] and ``bias`` [num_expert, out_feat], the
layout of FastMoE checkpoints. ``forward(inp, fwd_expert_count)`` applies expert e to the
e-th block of ``fwd_expert_count[e]`` rows, as FastMoE's CUDA kernel does; here it is a
loop of GEMMs (furnace runs on CPUs too).

Initialization is FastMoE's: ``kaiming_uniform_(weight, a=sqrt(5))`` on the 3-D tensor,
whose fan-in torch takes as out_feat * in_feat, so every weight is U(-b, b) with
b = 1 / sqrt(out_feat * in_feat); the bias starts at zero. With ``init_seed``, expert e
draws its weight from a generator of its own (`furnace.moe.experts.expert_seed` of its
global id ``first_expert + e``), so one rank can build its experts alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..experts import expert_seed

__all__ = ["FMoELinear", "split_counts"]


def split_counts(fwd_expert_count: torch.Tensor | Sequence[int], num_expert: int) -> list[int]:
    """FastMoE's per-expert row counts (a tensor or a sequence) as a list of ints."""
    if isinstance(fwd_expert_count, torch.Tensor):
        counts = [int(c) for c in fwd_expert_count.reshape(-1).tolist()]
    else:
        counts = [int(c) for c in fwd_expert_count]
    if len(counts) != num_expert:
        raise ValueError(f"need {num_expert} expert counts, got {len(counts)}")
    return counts


class FMoELinear(nn.Module):
    """FastMoE's `FMoELinear(num_expert, in_feat, out_feat, bias=True, rank=0)`.

    ``rank`` is kept as an attribute, as FastMoE v1.1 does, and has no effect. Furnace's
    keyword-only ``init_seed`` / ``first_expert`` give each expert its own init stream.
    """

    def __init__(self, num_expert: int, in_feat: int, out_feat: int, bias: bool = True,
                 rank: int = 0, *, init_seed: int | None = None, first_expert: int = 0) -> None:
        super().__init__()
        self.num_expert = num_expert
        self.in_feat = in_feat
        self.out_feat = out_feat
        self.rank = rank
        self.init_seed = init_seed
        self.first_expert = first_expert
        self.weight = nn.Parameter(torch.empty(num_expert, out_feat, in_feat))
        if bias:
            self.bias = nn.Parameter(torch.zeros(num_expert, out_feat))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.init_seed is None:
            nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        else:
            bound = 1.0 / math.sqrt(self.out_feat * self.in_feat)
            with torch.no_grad():
                for e in range(self.num_expert):
                    gen = torch.Generator().manual_seed(
                        expert_seed(self.init_seed, self.first_expert + e))
                    draw = torch.empty(self.weight.shape[1:], dtype=torch.float64, device="cpu")
                    self.weight[e].copy_(draw.uniform_(-bound, bound, generator=gen))
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, inp: torch.Tensor,
                fwd_expert_count: torch.Tensor | Sequence[int]) -> torch.Tensor:
        counts = split_counts(fwd_expert_count, self.num_expert)
        if sum(counts) != inp.shape[0]:
            raise ValueError(f"expert counts sum to {sum(counts)}, input has {inp.shape[0]} rows")
        x = inp.type_as(self.weight)
        outs = [F.linear(x_e, self.weight[e], None if self.bias is None else self.bias[e])
                for e, x_e in enumerate(torch.split(x, counts))]
        return torch.cat(outs) if outs else x.new_zeros((0, self.out_feat))

    def extra_repr(self) -> str:
        return (f"num_expert={self.num_expert}, in_features={self.in_feat}, "
                f"out_features={self.out_feat}, bias={self.bias is not None}, rank={self.rank}")
