"""SWIPE gate: balanced top-k assignment with no token dropped (BaGuaLu, He et al. PPoPP '22,
as FastMoE's `SwipeGate`; see the design note moe_bagualu.md, B.3).

Every expert gets capacity ``C = ceil(T_total * K / N)``, T_total being the tokens of the
whole expert-parallel group, so ``N * C >= T_total * K`` and everything fits. Each token
brings its top-k preferences (ties to the lower expert id). For choice slot k = 0 .. K-1:

1. accept: in group order (rank order, then token order) each token's k-th preference is
   accepted while that expert has room and the token is not already on it;
2. move: each refused assignment, in the same order, goes to the expert with the most
   room left (ties to the lowest id) that the token is not already on.

Step 2 can corner a token: the only experts with room may all be ones it already holds
(e.g. N=3, K=2, the last free slot is on the token's first expert). Then one earlier
assignment is swapped out of the way: the lowest full expert x the token is not on gives
its latest token u (one not on the free expert r) to r, and the cornered token takes u's
place on x. Such a u always exists (x holds C tokens, r fewer than C), and loads stay
within C. This rule is ours; FastMoE's kernel balances per worker and slot.

Scores are the softmax over each token's final k experts' logits. With a `Communicator`
of more than one rank in ``self.context.comm``, every rank all-gathers the [T_r, N] logits
(counts first, so the collectives never depend on local data), runs the same
deterministic assignment on the group's batch and keeps its own rows; there is no
gradient through the exchange, only through the local logits in the scores. No balance
loss: the assignment is balanced by construction.

Shape suffixes: T = tokens on this rank, G = tokens of the group, N = global experts,
K = top_k.
"""

from __future__ import annotations

import numpy as np
import torch

from furnace.runtime.comm import Communicator

from ._routing import softmax_of_selected
from .base import BaseGate, GateOutput


def swipe_assign(preferences_GK: np.ndarray, num_experts: int) -> np.ndarray:
    """SWIPE's deterministic balanced assignment of ranked preferences (see the module doc).

    Args:
        preferences_GK: int array, each row a token's distinct experts, best first.
        num_experts: N.

    Returns:
        [G, K] int64 experts per token and slot: distinct per row, each expert used at most
        ``ceil(G * K / N)`` times.
    """
    num_tokens, top_k = preferences_GK.shape
    capacity = -(-num_tokens * top_k // num_experts)
    assigned_GK = np.full((num_tokens, top_k), -1, dtype=np.int64)
    holds_GN = np.zeros((num_tokens, num_experts), dtype=bool)
    load_N = np.zeros(num_experts, dtype=np.int64)
    tokens_G = np.arange(num_tokens)
    for slot in range(top_k):
        want_G = preferences_GK[:, slot].astype(np.int64)
        eligible_G = ~holds_GN[tokens_G, want_G]
        # rank of each eligible token among the eligible ones wanting the same expert
        order = np.argsort(np.where(eligible_G, want_G, num_experts), kind="stable")
        sorted_want = np.where(eligible_G, want_G, num_experts)[order]
        starts = np.searchsorted(sorted_want, sorted_want, side="left")
        rank_G = np.empty(num_tokens, dtype=np.int64)
        rank_G[order] = np.arange(num_tokens) - starts
        accept_G = eligible_G & (rank_G < capacity - load_N[want_G])
        assigned_GK[accept_G, slot] = want_G[accept_G]
        holds_GN[tokens_G[accept_G], want_G[accept_G]] = True
        load_N += np.bincount(want_G[accept_G], minlength=num_experts)
        for token in np.flatnonzero(~accept_G):
            room_N = np.where(holds_GN[token], -1, capacity - load_N)
            expert = int(np.argmax(room_N))  # argmax takes the first maximum: lowest id
            if room_N[expert] <= 0:
                expert = _swap_for_room(int(token), assigned_GK, holds_GN, load_N, capacity)
            assigned_GK[token, slot] = expert
            holds_GN[token, expert] = True
            load_N[expert] += 1
    return assigned_GK


def _swap_for_room(token: int, assigned_GK: np.ndarray, holds_GN: np.ndarray,
                   load_N: np.ndarray, capacity: int) -> int:
    """Free a slot for a cornered ``token``; returns the expert it may take (load unchanged)."""
    room_N = capacity - load_N
    free = int(np.argmax(np.where(holds_GN[token], room_N, -1)))
    full = int(np.flatnonzero(~holds_GN[token])[0])
    donors = np.flatnonzero(holds_GN[:, full] & ~holds_GN[:, free])
    donor = int(donors[-1])
    slot = int(np.flatnonzero(assigned_GK[donor] == full)[0])
    assigned_GK[donor, slot] = free
    holds_GN[donor, full] = False
    holds_GN[donor, free] = True
    load_N[free] += 1
    # the donor's place on `full` goes to the token, so the caller adds it back there
    load_N[full] -= 1
    return full


class SwipeGate(BaseGate):
    """Balanced, drop-free top-k assignment over the expert-parallel group.

    Args: as `BaseGate`. Multi-rank balancing needs `bind` with a `GateContext` whose
    ``comm`` is the group's `Communicator`; without one the local batch is the whole batch.
    """

    def route(self, logits_TN: torch.Tensor) -> GateOutput:
        group_logits_GN, first_row = self._group_logits(logits_TN.detach())
        # a stable descending sort ranks equal logits by expert id on every rank alike
        preferences_GK = torch.sort(group_logits_GN, dim=-1, descending=True,
                                    stable=True).indices[:, :self.top_k]
        assigned_GK = swipe_assign(preferences_GK.cpu().numpy(), self.num_experts)
        local_GK = assigned_GK[first_row:first_row + logits_TN.shape[0]]
        expert_ids_TK = torch.from_numpy(local_GK).to(logits_TN.device)
        scores_TK = softmax_of_selected(logits_TN, expert_ids_TK)
        return GateOutput(expert_ids_TK, scores_TK, logits_TN.new_zeros(()))

    def _group_logits(self, logits_TN: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The group's logits in rank order, and the row where this rank's begin."""
        comm = self.context.comm
        if not isinstance(comm, Communicator) or comm.world_size == 1:
            return logits_TN, 0
        count = torch.tensor([logits_TN.shape[0]], dtype=torch.int64, device=logits_TN.device)
        counts = comm.all_gather(count).tolist()
        longest = max(counts)
        # equal shapes for all_gather; the padding rows are cut away below
        padded_TN = logits_TN.new_zeros((longest, self.num_experts))
        padded_TN[:logits_TN.shape[0]] = logits_TN
        gathered = comm.all_gather(padded_TN).reshape(comm.world_size, longest, self.num_experts)
        group_logits_GN = torch.cat([gathered[r, :counts[r]] for r in range(comm.world_size)])
        return group_logits_GN, sum(counts[:comm.rank])
