"""FastMoE's gates (`fmoe.gates`, FastMoE v1.1: He et al. 2021, arXiv:2103.13262) on furnace.

Each class has FastMoE's constructor (positional order, keywords, defaults), parameter
names (so ``gate.gate.weight`` checkpoints load), output (``(idx, score)`` tensors, -1 for
a dropped assignment), loss bookkeeping (``set_loss`` / ``get_loss`` / ``has_loss``) and
routing rule, as read from laekov/fastmoe ``fmoe/gates/*.py`` and its CUDA kernels:

- `NaiveGate`: top-k of a linear scorer, softmax over the k logits; a zero loss.
- `NoisyGate`: Shazeer et al. 2017's noisy top-k, weights ``w_gate`` / ``w_noise``
  [d_model, N], loss ``cv^2(importance) + cv^2(load)`` (unbiased variance, as FastMoE).
- `GShardGate`: top-2, GShard loss ``mean(c_e m_e) * num_expert^2``, capacity
  ``ceil(f * T) * 2 // N`` per expert on this rank, then random routing (in both modes).
- `SwitchGate`: logits + U(1 - eps, 1 + eps) noise in training, top-1 of the softmax,
  capacity ``ceil(f * T / num_expert)`` per expert over the whole group (the owner's T),
  Switch loss over the kept tokens.
- `DCGate`: GShard's top-2 and loss with a group-wide capacity ``ceil(f * T)``.
- `SwipeGate`: BaGuaLu's SWIPE balancing per worker in training, top-k in eval.
- `FasterGate`: FasterMoE's topology-aware top-2 (``node_rank`` positional, as FastMoE).
- `ZeroGate`: every choice of every token to expert 0 with score 1/k; no parameters.

FastMoE's CUDA kernels drop over-capacity assignments with atomics, so which ones go is
up to the GPU. Here it is the serial order: within a rank, token-major order; across the
group, rank order (rank 0's assignments claim an expert's capacity first). Group-wide
capacities (Switch, DC) and SWIPE all-gather the per-expert (or per-worker) counts over the
expert-parallel group, bound by `furnace.moe.expert_parallel` (``gate.bind``).

Other differences: softmaxes run in float32 or wider (FastMoE's Switch casts to float32
even for float64 models); NoisyGate's eval load is the count of tokens whose top k holds
the expert (FastMoE evaluates its smooth estimator with zero noise, the same except at
ties, where it divides 0 by 0); a loss over no tokens is 0 rather than NaN.

Shape suffixes: T tokens, D d_model, N global experts (tot_expert), K top_k, W workers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..gates._routing import first_come_keep, parse_capacity_factor, softmax_wide
from ..gates.base import GateContext
from ..gates.noisy import prob_in_top_k

__all__ = [
    "BaseGate",
    "DCGate",
    "FasterGate",
    "GShardGate",
    "NaiveGate",
    "NoisyGate",
    "SwipeGate",
    "SwitchGate",
    "ZeroGate",
    "gen_faster_gate",
]


class BaseGate(nn.Module):
    """FastMoE's `BaseGate(num_expert, world_size)`: expert counts and loss bookkeeping.

    ``num_expert`` counts experts per worker; ``tot_expert = num_expert * world_size``.
    Furnace adds `bind` (the expert-parallel group, set by `furnace.moe.expert_parallel`)
    and ``num_experts`` (= ``tot_expert``).
    """

    def __init__(self, num_expert: int, world_size: int) -> None:
        super().__init__()
        for name, value in (("num_expert", num_expert), ("world_size", world_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.world_size = world_size
        self.num_expert = num_expert
        self.tot_expert = world_size * num_expert
        self.loss: torch.Tensor | None = None
        self.context: GateContext | None = None

    @property
    def num_experts(self) -> int:
        return self.tot_expert

    def forward(self, x: torch.Tensor):
        raise NotImplementedError("Base gate cannot be directly used for fwd")

    def set_loss(self, loss: torch.Tensor | None) -> None:
        self.loss = loss

    def get_loss(self, clear: bool = True) -> torch.Tensor | None:
        """The loss of the last forward (None before any); ``clear`` forgets it."""
        loss = self.loss
        if clear:
            self.loss = None
        return loss

    @property
    def has_loss(self) -> bool:
        return self.loss is not None

    def bind(self, context: GateContext) -> None:
        """Tell the gate its expert-parallel group (called by `expert_parallel`)."""
        if context.world_size != self.world_size or (
                context.num_experts_per_rank != self.num_expert):
            raise ValueError(f"the gate was built for {self.world_size} workers x "
                             f"{self.num_expert} experts, the layer runs on "
                             f"{context.world_size} x {context.num_experts_per_rank}")
        self.context = context

    def group(self):
        """The group's `Communicator`, or None with one worker."""
        if self.world_size == 1:
            return None
        comm = self.context.comm if self.context is not None else None
        if comm is None:
            raise RuntimeError(
                f"{type(self).__name__} balances over its {self.world_size} workers and "
                "needs their group: use it inside FMoE(world_size=..., moe_group=...), or "
                "call gate.bind(furnace.moe.GateContext(rank=..., world_size=..., "
                "num_experts_per_rank=..., comm=...)) first")
        return comm


def _check_top_k(top_k: Any, tot_expert: int) -> None:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= tot_expert:
        raise ValueError(f"top_k must be an int in [1, {tot_expert}], got {top_k!r}")


def _capacity_pair(capacity: float | Sequence[float]) -> tuple[float, float]:
    return parse_capacity_factor(capacity)


def _gshard_loss(logits_TN: torch.Tensor, top1_T: torch.Tensor, num_expert: int) -> torch.Tensor:
    """FastMoE's GShard loss ``mean_e(c_e * m_e) * num_expert^2`` (num_expert per worker)."""
    num_tokens, tot = logits_TN.shape
    if num_tokens == 0:
        return logits_TN.new_zeros(())
    probs_TN = softmax_wide(logits_TN)
    c_N = torch.bincount(top1_T, minlength=tot).to(probs_TN.dtype) / num_tokens
    return (torch.mean(c_N * probs_TN.mean(0)) * num_expert**2).to(logits_TN.dtype)


def _limit_by_capacity(gate: BaseGate, ids_A: torch.Tensor, capacity: int) -> torch.Tensor:
    """Drop (id -1) assignments beyond each expert's group-wide ``capacity``.

    ``capacity`` is this rank's value for its own experts (FastMoE lets each owner set the
    limit of its experts); senders claim it in rank order, then token order.
    """
    tot = gate.tot_expert
    counts_N = torch.bincount(ids_A[ids_A >= 0], minlength=tot)
    comm = gate.group()
    if comm is None:
        allowed_N = torch.clamp(counts_N, max=capacity)
    else:
        row = torch.cat([counts_N, counts_N.new_tensor([capacity])]).reshape(1, -1)
        table_W = comm.all_gather(row)
        counts_WN, cap_W = table_W[:, :tot], table_W[:, tot]
        cap_N = cap_W.repeat_interleave(gate.num_expert)
        before_WN = torch.cumsum(counts_WN, 0) - counts_WN
        allowed_N = torch.minimum(counts_WN, torch.clamp(cap_N - before_WN, min=0))[comm.rank]
    keep_A = first_come_keep(ids_A, allowed_N, tot)
    return torch.where(keep_A, ids_A, torch.full_like(ids_A, -1))


def _random_routing(ids_TK: torch.Tensor, scores_TK: torch.Tensor) -> torch.Tensor:
    """GShard's random routing as FastMoE applies it: drop choice 2 where 2 * p2 < U(0, 1)."""
    uniform_T = torch.rand(scores_TK.shape[0], device=scores_TK.device)
    drop_T = 2 * scores_TK[:, 1].detach().to(uniform_T.dtype) < uniform_T
    ids_TK = ids_TK.clone()
    ids_TK[:, 1] = torch.where(drop_T, torch.full_like(ids_TK[:, 1], -1), ids_TK[:, 1])
    return ids_TK


class NaiveGate(BaseGate):
    """FastMoE's `NaiveGate(d_model, num_expert, world_size, top_k=2, gate_bias=True)`.

    ``self.gate`` is the ``nn.Linear(d_model, tot_expert)`` scorer. ``forward(inp,
    return_all_scores=False)`` returns ``(idx [T, K], score [T, K])``, plus the [T, N]
    logits with ``return_all_scores``; the loss is a zero tensor of shape [1].
    """

    def __init__(self, d_model: int, num_expert: int, world_size: int, top_k: int = 2,
                 gate_bias: bool = True) -> None:
        super().__init__(num_expert, world_size)
        _check_top_k(top_k, self.tot_expert)
        self.gate = nn.Linear(d_model, self.tot_expert, bias=gate_bias)
        self.top_k = top_k

    def forward(self, inp: torch.Tensor, return_all_scores: bool = False):
        logits_TN = self.gate(inp)
        top_TK, idx_TK = torch.topk(logits_TN, k=self.top_k, dim=-1)
        score_TK = F.softmax(top_TK.reshape(-1, self.top_k), dim=-1)
        self.set_loss(logits_TN.new_zeros(1))
        if return_all_scores:
            return idx_TK, score_TK, logits_TN
        return idx_TK, score_TK


class NoisyGate(BaseGate):
    """FastMoE's `NoisyGate(d_model, num_expert, world_size, top_k=2)` (Shazeer et al. 2017).

    Parameters ``w_gate`` and ``w_noise`` [d_model, tot_expert], initialised with
    kaiming_uniform(a=sqrt(5)) as FastMoE does. Returns ``(idx [T*K], score [T, 1, K])``.
    """

    def __init__(self, d_model: int, num_expert: int, world_size: int, top_k: int = 2) -> None:
        super().__init__(num_expert, world_size)
        _check_top_k(top_k, self.tot_expert)
        self.w_gate = nn.Parameter(torch.zeros(d_model, self.tot_expert))
        self.w_noise = nn.Parameter(torch.zeros(d_model, self.tot_expert))
        self.top_k = top_k
        self.noise_epsilon = 1e-2
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.w_gate, a=math.sqrt(5))
        nn.init.kaiming_uniform_(self.w_noise, a=math.sqrt(5))

    @staticmethod
    def cv_squared(x: torch.Tensor) -> torch.Tensor:
        """``var(x) / (mean(x)^2 + 1e-10)`` with the unbiased variance; 0 for one value."""
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        if wide.numel() <= 1:
            return wide.new_zeros(())
        return wide.var() / (wide.mean() ** 2 + 1e-10)

    def forward(self, inp: torch.Tensor):
        clean_TN = inp @ self.w_gate
        k = self.top_k
        std_TN = None
        if self.training:
            std_TN = F.softplus(inp @ self.w_noise) + self.noise_epsilon
            noisy_TN = clean_TN + torch.randn_like(clean_TN) * std_TN
        else:
            noisy_TN = clean_TN
        top_TK, idx_TK = noisy_TN.topk(k, dim=1)
        gates_TK = F.softmax(top_TK, dim=1)
        gates_TN = torch.zeros_like(noisy_TN).scatter(1, idx_TK, gates_TK)
        if std_TN is not None and k < self.tot_expert:
            load_N = prob_in_top_k(clean_TN, noisy_TN, std_TN, k).sum(0)
        else:
            load_N = torch.bincount(idx_TK.reshape(-1), minlength=self.tot_expert)
        loss = self.cv_squared(gates_TN.sum(0)) + self.cv_squared(load_N)
        self.set_loss(loss.to(clean_TN.dtype))
        return idx_TK.contiguous().reshape(-1), gates_TK.contiguous().unsqueeze(1)


class GShardGate(NaiveGate):
    """FastMoE's `GShardGate(d_model, num_expert, world_size, topk=2, capacity=(1.2, 2.4),
    random_routing=True, gate_bias=True)` (Lepikhin et al. 2020, section 2.2).

    Capacity ``ceil(capacity[mode] * T) * 2 // tot_expert`` assignments per expert from
    this rank, taken in token-major order; then each second choice is dropped when
    ``2 * p2 < U(0, 1)``, in eval too, as FastMoE does.
    """

    def __init__(self, d_model: int, num_expert: int, world_size: int, topk: int = 2,
                 capacity: float | Sequence[float] = (1.2, 2.4), random_routing: bool = True,
                 gate_bias: bool = True) -> None:
        if topk != 2:
            raise ValueError(f"topk should be 2 in gshard, got {topk!r}")
        super().__init__(d_model, num_expert, world_size, top_k=2, gate_bias=gate_bias)
        self.capacity = _capacity_pair(capacity)
        self.random_routing = random_routing

    def forward(self, x: torch.Tensor):  # type: ignore[override]  # FastMoE's signature
        idx_TK, val_TK, logits_TN = super().forward(x, return_all_scores=True)
        num_tokens = logits_TN.shape[0]
        self.set_loss(_gshard_loss(logits_TN, idx_TK[:, 0], self.num_expert))
        rate = self.capacity[0 if self.training else 1]
        cap = math.ceil(rate * num_tokens) * self.top_k // self.tot_expert
        flat_A = idx_TK.reshape(-1)
        keep_A = first_come_keep(flat_A, cap, self.tot_expert)
        idx_TK = torch.where(keep_A, flat_A, torch.full_like(flat_A, -1)).reshape(idx_TK.shape)
        if self.random_routing:
            idx_TK = _random_routing(idx_TK, val_TK)
        return idx_TK, val_TK


class DCGate(GShardGate):
    """FastMoE's `DCGate` (distributed capacity): GShard's constructor, top-2 and loss, with a
    capacity of ``ceil(capacity[mode] * T)`` per expert over the whole group, then random
    routing.
    """

    def forward(self, x: torch.Tensor):  # type: ignore[override]  # FastMoE's signature
        idx_TK, val_TK, logits_TN = NaiveGate.forward(self, x, return_all_scores=True)
        self.set_loss(_gshard_loss(logits_TN, idx_TK[:, 0], self.num_expert))
        rate = self.capacity[0 if self.training else 1]
        cap = math.ceil(rate * x.shape[0])
        idx_TK = _limit_by_capacity(self, idx_TK.reshape(-1), cap).reshape(idx_TK.shape)
        if self.random_routing:
            idx_TK = _random_routing(idx_TK, val_TK)
        return idx_TK, val_TK


class SwitchGate(NaiveGate):
    """FastMoE's `SwitchGate(d_model, num_expert, world_size, topk=1, switch_eps=.1,
    capacity=(1.2, 2.4), gate_bias=True)` (Fedus et al. 2021).

    Training adds U(1 - eps, 1 + eps) to the logits (FastMoE's noise). Returns
    ``(idx [T, 1], score [T, 1])``, score being the top softmax probability.
    """

    def __init__(self, d_model: int, num_expert: int, world_size: int, topk: int = 1,
                 switch_eps: float = .1, capacity: float | Sequence[float] = (1.2, 2.4),
                 gate_bias: bool = True) -> None:
        if topk != 1:
            raise ValueError(f"topk should be 1 in switch, got {topk!r}")
        super().__init__(d_model, num_expert, world_size, top_k=1, gate_bias=gate_bias)
        self.switch_eps = switch_eps
        self.capacity = _capacity_pair(capacity)

    def forward(self, inp: torch.Tensor):  # type: ignore[override]  # FastMoE's signature
        score_TN = self.gate(inp)
        if self.training:
            noise_TN = torch.rand_like(score_TN) * 2 * self.switch_eps + 1.0 - self.switch_eps
            score_TN = score_TN + noise_TN
        probs_TN = softmax_wide(score_TN)
        top1_score_T1, top1_idx_T1 = torch.topk(probs_TN, k=1, dim=-1)
        top1_score_T1 = top1_score_T1.to(inp.dtype)
        rate = self.capacity[0 if self.training else 1]
        cap = math.ceil(rate * inp.shape[0] / self.num_expert)
        top1_idx_T1 = _limit_by_capacity(self, top1_idx_T1.reshape(-1), cap).reshape(-1, 1)
        valid = top1_idx_T1[top1_idx_T1 > -1]
        if valid.numel():
            fraction_N = torch.bincount(valid, minlength=self.tot_expert).to(probs_TN.dtype)
            fraction_N = fraction_N / valid.numel()
            prob_N = probs_TN.sum(0) / valid.numel()
            loss = (fraction_N * prob_N).sum() * self.tot_expert
        else:
            loss = probs_TN.new_zeros(())
        self.set_loss(loss.to(inp.dtype))
        return top1_idx_T1, top1_score_T1


class SwipeGate(NaiveGate):
    """FastMoE's `SwipeGate(d_model, num_expert, world_size, top_k=2, gate_bias=True)`.

    Training: for choice slot k, every worker accepts tokens up to its remaining capacity
    (T_w * K at the start, T_w its tokens), senders in rank order; the refused ones go, in
    sender order, to the workers with capacity left (lowest first), to that worker's
    local expert ``k % num_expert`` (BaGuaLu's SWIPE as FastMoE's ``swipe_once`` does it).
    Eval: plain top-k. Scores: softmax over each token's final logits. No loss.
    """

    def __init__(self, d_model: int, num_expert: int, world_size: int, top_k: int = 2,
                 gate_bias: bool = True) -> None:
        super().__init__(d_model, num_expert, world_size, top_k, gate_bias)

    def swipe_once(self, idx_T: torch.Tensor, capacity: int, bias: int) -> tuple[torch.Tensor, int]:
        """One slot of SWIPE: ``(new ids, this worker's capacity left)``."""
        W, E = self.world_size, self.num_expert
        with torch.no_grad():
            want_W = torch.bincount(idx_T // E, minlength=W)
            row = torch.cat([want_W, want_W.new_tensor([capacity])]).reshape(1, -1)
            comm = self.group()
            table = (row if comm is None else comm.all_gather(row)).tolist()
            rank = 0 if comm is None else comm.rank
            want = [r[:W] for r in table]
            room = [r[W] for r in table]
            quota = [0] * W
            drops = [0] * W
            for j in range(W):
                for i in range(W):
                    taken = min(want[i][j], room[j])
                    room[j] -= taken
                    drops[i] += want[i][j] - taken
                    if i == rank:
                        quota[j] += taken
            j = 0
            for i in range(W):
                while drops[i] > 0:
                    if j == W:
                        raise RuntimeError("SWIPE ran out of capacity; the workers' "
                                           "capacities do not cover their tokens")
                    taken = min(drops[i], room[j])
                    room[j] -= taken
                    drops[i] -= taken
                    if i == rank:
                        quota[j] += taken
                    if drops[i] > 0:
                        j += 1
            quota_W = torch.tensor(quota, dtype=torch.int64, device=idx_T.device)
            worker_T = idx_T // E
            keep_T = first_come_keep(worker_T, quota_W, W)
            left_W = quota_W - torch.bincount(worker_T[keep_T], minlength=W)
            moved = torch.repeat_interleave(torch.arange(W, device=idx_T.device), left_W)
            new_T = idx_T.clone()
            new_T[~keep_T] = moved * E + bias
        return new_T, room[rank]

    def forward(self, inp: torch.Tensor):  # type: ignore[override]  # FastMoE's signature
        score_TN = self.gate(inp)
        orig_TK, orig_idx_TK = torch.topk(score_TN, k=self.top_k, dim=-1)
        if not self.training:
            return orig_idx_TK, F.softmax(orig_TK, dim=-1)
        capacity = inp.shape[0] * self.top_k
        rows_T = torch.arange(inp.shape[0], device=inp.device)
        idxs, vals = [], []
        for k in range(self.top_k):
            idx_T, capacity = self.swipe_once(orig_idx_TK[:, k], capacity, k % self.num_expert)
            vals.append(score_TN[rows_T, idx_T])
            idxs.append(idx_T)
        idx_TK = torch.stack(idxs, dim=1)
        return idx_TK, F.softmax(torch.stack(vals, dim=1), dim=-1)


class FasterGate(NaiveGate):
    """FastMoE's `FasterGate(d_model, n_expert, world_size, node_rank, gate_bias=True)`.

    FasterMoE's topology-aware gate (He et al., PPoPP'22): experts on node ``node_rank``
    (``gpus_per_node * n_expert`` consecutive experts per node) are local. If fewer than
    ``int(T * outgoing_fraction)`` tokens have a remote top-1, it is plain top-2; otherwise
    every token takes its top-2 among local experts, and that many tokens with the
    strongest remote top-1 (ties to the earlier token) keep it as their second choice.
    Loss: FastMoE's GShard loss. ``gpus_per_node`` and ``outgoing_fraction`` replace
    FastMoE's ``FMOE_TOPO_GPUS_PER_NODE`` (default 8) and ``FMOE_TOPO_OUTGOING_FRACTION``
    (default 0.14).
    """

    def __init__(self, d_model: int, n_expert: int, world_size: int, node_rank: int,
                 gate_bias: bool = True, *, gpus_per_node: int = 8,
                 outgoing_fraction: float = 0.14) -> None:
        super().__init__(d_model, n_expert, world_size, top_k=2, gate_bias=gate_bias)
        if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be an int >= 1, got {gpus_per_node!r}")
        if not 0 <= outgoing_fraction <= 1:
            raise ValueError(f"outgoing_fraction must be in [0, 1], got {outgoing_fraction}")
        self.ne_per_node = gpus_per_node * n_expert
        self.ogn_ratio = outgoing_fraction
        self.node_rank = node_rank
        remote = torch.arange(self.tot_expert) // self.ne_per_node != node_rank
        if int((~remote).sum()) < 2:
            raise ValueError(f"node {node_rank} holds {int((~remote).sum())} of the "
                             f"{self.tot_expert} experts ({self.ne_per_node} per node); "
                             "FasterGate needs 2 local experts per token: raise "
                             "gpus_per_node or n_expert, or use NaiveGate")
        # a plain attribute, as FastMoE's, so it is no part of the state dict
        self.mask = remote
        self.policy_fn = None

    def forward(self, inp: torch.Tensor):  # type: ignore[override]  # FastMoE's signature
        if self.policy_fn is not None:
            raise NotImplementedError("FasterGate.policy_fn (shadowed experts count as local) "
                                      "is not supported; use ExpertParallelConfig("
                                      "shadowing=True) for FasterMoE's shadowing")
        remote_N = self.mask.to(inp.device)
        logits_TN = self.gate(inp)
        top2_TK, top2_idx_TK = torch.topk(logits_TN, k=2, dim=-1)
        top1_idx_T = top2_idx_TK[:, 0]
        top1_T = top2_TK[:, 0].detach()
        self.set_loss(_gshard_loss(logits_TN, top1_idx_T, self.num_expert))
        remote_T = remote_N[top1_idx_T]
        threshold = int(inp.shape[0] * self.ogn_ratio)
        if int(remote_T.sum()) < threshold:
            return top2_idx_TK, F.softmax(top2_TK, dim=-1)
        key_T = torch.where(remote_T, top1_T, torch.full_like(top1_T, float("-inf")))
        chosen = torch.sort(key_T, descending=True, stable=True).indices[:threshold]
        local_TN = logits_TN.detach().masked_fill(remote_N, float("-inf"))
        idx_TK = torch.topk(local_TN, k=2, dim=-1).indices
        idx_TK[chosen, 1] = top1_idx_T[chosen]
        return idx_TK, F.softmax(logits_TN.gather(1, idx_TK), dim=-1)


class ZeroGate(BaseGate):
    """FastMoE's `ZeroGate(_1, num_expert, world_size, top_k=2)`: every choice of every token
    to expert 0, score 1/top_k each. The first argument (d_model) is ignored; no parameters,
    no loss. Returns ``(idx [T*K], score [T, 1, K])``.
    """

    def __init__(self, _1: Any, num_expert: int, world_size: int, top_k: int = 2) -> None:
        super().__init__(num_expert, world_size)
        if not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
        self.top_k = top_k

    def forward(self, inp: torch.Tensor):
        count = inp.shape[0] * self.top_k
        idx = torch.zeros(count, dtype=torch.int64, device=inp.device)
        score = torch.full((count,), 1.0 / self.top_k, dtype=inp.dtype, device=inp.device)
        return idx, score.reshape(-1, 1, self.top_k)


def gen_faster_gate(rank: int, *, gpus_per_node: int = 8,
                    outgoing_fraction: float = 0.14) -> Callable[..., FasterGate]:
    """FastMoE's `gen_faster_gate(rank)`: a factory for `FMoE`'s ``gate=`` (node rank
    ``rank // gpus_per_node``)."""

    def _gen(d_model: int, n_expert: int, world_size: int, top_k: int = 2) -> FasterGate:
        if top_k != 2:
            raise ValueError(f"FasterGate is a top-2 gate, got top_k={top_k}")
        return FasterGate(d_model, n_expert, world_size, rank // gpus_per_node,
                          gpus_per_node=gpus_per_node, outgoing_fraction=outgoing_fraction)

    return _gen
