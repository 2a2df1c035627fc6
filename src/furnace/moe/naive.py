"""The reference MoE: a brute-force loop over experts on all (gathered) expert weights.

Obviously correct and slow, like FastMoE's `BruteForceMoE`: for every global expert e and
every choice k, the tokens whose k-th choice is e go through expert e and are added to
the output with their gate score. Every fast path (local dispatch, expert parallelism,
shadowing, smart schedule) is tested against it.

Shape suffixes: T tokens, D d_model, K top_k, N global experts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .experts import MLPExperts
from .gates import BaseGate


def naive_moe(x_TD: torch.Tensor, gate: BaseGate, experts: MLPExperts,
              expert_params: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
    """``y_t = sum_k score_tk * expert_{e_tk}(x_t)`` by looping over experts and choices.

    Args:
        x_TD: tokens.
        gate: the router (its output decides e_tk and score_tk).
        experts: supplies the expert function (`apply_expert`).
        expert_params: stacked parameters of all N global experts (expert dim first);
            the bank's own parameters if None.
    """
    routing = gate(x_TD)
    params = list(expert_params) if expert_params is not None else experts.param_tensors()
    num_experts = params[0].shape[0]
    y_TD = x_TD.new_zeros(x_TD.shape)
    for e in range(num_experts):
        for k in range(routing.expert_ids_TK.shape[1]):
            rows = torch.nonzero(routing.expert_ids_TK[:, k] == e).reshape(-1)
            if rows.numel() == 0:
                continue
            out = experts.apply_expert([p[e] for p in params], x_TD[rows])
            y_TD = y_TD.index_add(0, rows, routing.scores_TK[rows, k:k + 1] * out)
    return y_TD
