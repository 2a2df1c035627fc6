"""Expert banks: the experts of a layer stored as stacked tensors, applied functionally.

FastMoE's `FMoETransformerMLP` experts are 2-layer MLPs H -> alpha*H -> H. Stacking the
weights of all (local) experts along a leading expert dimension lets the expert-parallel
layer shard them by slicing, broadcast one expert's slice for dynamic shadowing, and run
any slice with the same pure function (`apply_expert`), so a shadow replica computes
exactly what its owner would.

Shape suffixes: E = experts in the bank, D = d_model, F = d_hidden, R = rows (tokens).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
}


class MLPExperts(nn.Module):
    """``num_experts`` independent MLPs ``x -> act(x W1 + b1) W2 + b2``.

    Args:
        num_experts: experts held by this bank (all of them in one process, or one
            rank's share once expert parallelism is applied).
        d_model: input and output width H.
        d_hidden: hidden width alpha*H.
        activation: "gelu", "relu" or "silu".
        first_expert: global id of the bank's first expert (its offset in the layer).
    """

    def __init__(self, num_experts: int, d_model: int, d_hidden: int, *,
                 activation: str = "gelu", first_expert: int = 0,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; known: {sorted(ACTIVATIONS)}")
        self.num_experts = num_experts
        self.d_model = d_model
        self.d_hidden = d_hidden
        self.activation = activation
        self.first_expert = first_expert
        self.w1_EDF = nn.Parameter(torch.empty(num_experts, d_model, d_hidden, dtype=dtype))
        self.b1_EF = nn.Parameter(torch.empty(num_experts, d_hidden, dtype=dtype))
        self.w2_EFD = nn.Parameter(torch.empty(num_experts, d_hidden, d_model, dtype=dtype))
        self.b2_ED = nn.Parameter(torch.empty(num_experts, d_model, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear's default init, per expert
        for w, b, fan_in in ((self.w1_EDF, self.b1_EF, self.d_model),
                             (self.w2_EFD, self.b2_ED, self.d_hidden)):
            bound = 1.0 / math.sqrt(fan_in)
            nn.init.uniform_(w, -bound, bound)
            nn.init.uniform_(b, -bound, bound)

    def param_tensors(self) -> list[torch.Tensor]:
        """The stacked parameters, each with the expert dimension first."""
        return [self.w1_EDF, self.b1_EF, self.w2_EFD, self.b2_ED]

    def expert_params(self, local_expert: int) -> list[torch.Tensor]:
        return [p[local_expert] for p in self.param_tensors()]

    def apply_expert(self, params: Sequence[torch.Tensor], x_RD: torch.Tensor) -> torch.Tensor:
        """One expert's MLP on rows ``x_RD`` with parameters ``params`` (one slice each)."""
        w1_DF, b1_F, w2_FD, b2_D = params
        return torch.addmm(b2_D, ACTIVATIONS[self.activation](torch.addmm(b1_F, x_RD, w1_DF)),
                           w2_FD)

    def forward(self, x_RD: torch.Tensor, rows_per_expert: Sequence[int]) -> torch.Tensor:
        """Apply expert e to the e-th contiguous block of rows (FastMoE's fused-expert call)."""
        if len(rows_per_expert) != self.num_experts:
            raise ValueError(f"need {self.num_experts} row counts, got {len(rows_per_expert)}")
        outs = []
        for e, x_e in enumerate(torch.split(x_RD, list(rows_per_expert))):
            outs.append(self.apply_expert(self.expert_params(e), x_e) if x_e.shape[0]
                        else x_e.new_zeros((0, self.d_model)))
        return torch.cat(outs) if outs else x_RD.new_zeros((0, self.d_model))

    def flops_per_token(self) -> int:
        """Forward FLOPs per token: two GEMMs of 2*H*F each (4*alpha*H^2)."""
        return 4 * self.d_model * self.d_hidden

    def param_bytes_per_expert(self) -> int:
        return sum(p[0].numel() * p.element_size() for p in self.param_tensors())

    def shard(self, first: int, count: int) -> MLPExperts:
        """A bank holding experts ``first .. first+count-1`` of this one (copied)."""
        out = MLPExperts(count, self.d_model, self.d_hidden, activation=self.activation,
                         first_expert=self.first_expert + first, dtype=self.w1_EDF.dtype)
        with torch.no_grad():
            for dst, src in zip(out.param_tensors(), self.param_tensors()):
                dst.copy_(src[first:first + count])
        return out

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, d_model={self.d_model}, "
                f"d_hidden={self.d_hidden}, activation={self.activation}, "
                f"first_expert={self.first_expert}")
