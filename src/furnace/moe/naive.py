"""The reference MoE: a brute-force loop over experts on all (gathered) expert weights.

Obviously correct and slow, like FastMoE's `BruteForceMoE`: for every global expert e and
every choice k, the tokens whose k-th choice is e go through expert e and are added to
the output with their gate score. Every fast path (local dispatch, expert parallelism,
shadowing, smart schedule) is tested against it.

Shape suffixes: T tokens, D d_model, K top_k, N global experts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .experts import ExpertBank
from .gates import GateOutput


def naive_moe(x_TD: torch.Tensor, gate: Callable[[torch.Tensor], GateOutput],
              experts: ExpertBank,
              expert_params: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
    """``y_t = sum_k score_tk * expert_{e_tk}(x_t)`` by looping over experts and choices.

    Args:
        x_TD: tokens.
        gate: the router (its `GateOutput` decides e_tk and score_tk); or a routing
            already computed, as a `GateOutput`.
        experts: a bank holding every expert (global id = local id), which supplies the
            expert function (`apply_expert`).
        expert_params: for an `MLPExperts` bank, stacked parameters of all N global
            experts (expert dim first) to use instead of the bank's own.
    """
    routing = gate if isinstance(gate, GateOutput) else gate(x_TD)
    if expert_params is not None:
        params = list(expert_params)
        num_experts = params[0].shape[0]

        def params_of(e: int) -> list[torch.Tensor]:
            return [p[e] for p in params]
    else:
        if experts.first_expert != 0:
            raise ValueError("naive_moe needs a bank of every expert (first_expert 0)")
        num_experts = experts.num_experts

        def params_of(e: int) -> list[torch.Tensor]:
            return experts.expert_params(e)
    y_TD = x_TD.new_zeros(x_TD.shape)
    for e in range(num_experts):
        for k in range(routing.expert_ids_TK.shape[1]):
            rows = torch.nonzero(routing.expert_ids_TK[:, k] == e).reshape(-1)
            if rows.numel() == 0:
                continue
            out = experts.apply_expert(params_of(e), x_TD[rows], e)
            # accumulated in the input's dtype, whatever autocast made of the product
            y_TD = y_TD.index_add(0, rows, (routing.scores_TK[rows, k:k + 1] * out)
                                  .to(y_TD.dtype))
    return y_TD
