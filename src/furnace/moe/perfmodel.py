"""FasterMoE's performance model (PPoPP'22, sections 3-4): latency of an MoE layer step with
load imbalance, the cost rules behind dynamic shadowing and the smart schedule, and the
DDL-Roofline.

One training step of one MoE layer, per worker w (design note `moe_bagualu.md` A.3):

    L_w    = tokens expert-computed on w (its experts' tokens from every sender, plus its
             own tokens of shadowed experts)
    comp_w = 3 * (4 H F) * L_w / P                      fwd + 2x for bwd, two GEMMs/token
    comm_w = 4 * max(out_w, in_w) * H * s / beta       dispatch + combine, fwd and bwd
    shadow = 2 * (#shadowed) * param_bytes / beta      broadcast params + reduce grads
    T_base = max_w (comp_w + comm_w) + shadow           nothing overlapped (FastMoE)

The smart schedule splits the exchange into n = W / G steps (groups of G workers) and
overlaps step i's compute with the other steps' transfers (A.5 recurrences, one FIFO
link per worker shared by sends S_i and returns R_i, compute separate):

    tS[i] = tS[i-1] + S_i;  tC[i] = max(tC[i-1], tS[i]) + C_i;
    tR[i] = max(tR[i-1], tC[i]) + R_i  with tR[-1] = tS[n-1] + shadow

applied to forward and backward (backward compute 2x). GEMM efficiency of a block of b
tokens is P * b / (b + b_half), so tiny steps pay for their small GEMMs.

Every alpha + bytes / beta term is `furnace.runtime.cost.link_time` (the model's own alpha
and beta are its link), so this model and the network emulator price a message alike. All
arithmetic is float64 on integer counts, so every rank reaches the same decision.
Symbols: W workers, E experts per worker, N = W*E experts, H d_model, F d_hidden,
s bytes per element, P FLOP/s per worker, beta bytes/s per worker, c[w, e] tokens that
worker w routes to expert e.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from furnace.runtime.cost import link_time, link_time_array
from furnace.runtime.topology import Topology, dtype_name


@dataclass(frozen=True)
class StepLatency:
    """Modelled seconds of one layer step; ``total`` is what the step takes."""

    compute_s: tuple[float, ...]
    comm_s: tuple[float, ...]
    shadow_s: float
    total: float


@dataclass(frozen=True, kw_only=True)
class MoEPerfModel:
    """Hardware and layer constants of the model.

    Args:
        d_model, d_hidden: H and F of the 2-layer MLP experts.
        bytes_per_element: s (4 for fp32 activations and parameters).
        flops_per_s: P, achieved GEMM FLOP/s per worker.
        bandwidth_Bps: beta, bytes/s per worker on the bottleneck link.
        latency_s: alpha, per message.
        half_efficiency_tokens: b_half of the GEMM efficiency curve (0: always peak).
        step_overhead_s: fixed cost of one exchange step beyond alpha (launching and
            synchronising a collective), which makes many tiny steps lose.
    """

    d_model: int
    d_hidden: int
    flops_per_s: float
    bandwidth_Bps: float
    bytes_per_element: int = 4
    latency_s: float = 0.0
    half_efficiency_tokens: float = 0.0
    step_overhead_s: float = 0.0

    @classmethod
    def from_topology(cls, topology: Topology, *, d_model: int, d_hidden: int,
                      dtype: torch.dtype | str = torch.float32, world_size: int | None = None,
                      half_efficiency_tokens: float = 0.0,
                      step_overhead_s: float = 0.0) -> MoEPerfModel:
        """Constants from a topology: its device's peak and the slowest link of the group."""
        ranks = range(world_size if world_size is not None else topology.ranks_per_node * 2)
        level = topology.slowest_level(ranks) or "intra_node"
        link = topology.link_for(level)
        name = dtype_name(dtype)
        size = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}.get(name, 4)
        return cls(d_model=d_model, d_hidden=d_hidden, bytes_per_element=size,
                   flops_per_s=topology.device.flops(name), bandwidth_Bps=link.bandwidth_Bps,
                   latency_s=link.latency_s, half_efficiency_tokens=half_efficiency_tokens,
                   step_overhead_s=step_overhead_s)

    def with_(self, **changes) -> MoEPerfModel:
        return replace(self, **changes)

    @property
    def flops_per_token(self) -> float:
        """Forward FLOPs per token and expert: 4 H F."""
        return 4.0 * self.d_model * self.d_hidden

    @property
    def token_bytes(self) -> float:
        return float(self.d_model * self.bytes_per_element)

    @property
    def param_bytes(self) -> float:
        """One expert's parameters: 2 H F weights + F + H biases."""
        return float((2 * self.d_model * self.d_hidden + self.d_hidden + self.d_model)
                     * self.bytes_per_element)

    def gemm_time(self, tokens: float, passes: float = 1.0) -> float:
        """Seconds for ``passes`` forward-equivalents of ``tokens`` tokens on one expert."""
        if tokens <= 0:
            return 0.0
        eff = tokens / (tokens + self.half_efficiency_tokens)
        return passes * self.flops_per_token * tokens / (self.flops_per_s * eff)

    def transfer_time(self, tokens: float, messages: int = 1) -> float:
        """Seconds to move ``tokens`` activations in ``messages`` messages; no tokens, no
        message and no time."""
        if tokens <= 0:
            return 0.0
        return link_time(self, tokens * self.token_bytes, messages)

    @property
    def shadow_param_s(self) -> float:
        """One expert's parameters over the link: one broadcast (or gradient reduce)."""
        return link_time(self, self.param_bytes)

    def _transfer_times(self, tokens: np.ndarray) -> np.ndarray:
        """`transfer_time` of one message elementwise; no tokens, no message."""
        moved = np.asarray(tokens, dtype=np.float64)
        return np.where(moved > 0, link_time_array(self, moved * self.token_bytes), 0.0)

    # --- load and traffic -------------------------------------------------------------

    @staticmethod
    def loads(counts_WN: np.ndarray, experts_per_rank: int,
              shadow_N: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per worker: tokens computed, tokens sent to others, tokens received from others."""
        counts = np.asarray(counts_WN, dtype=np.float64)
        W, N = counts.shape
        owner = np.arange(N) // experts_per_rank
        shadow = np.zeros(N, bool) if shadow_N is None else np.asarray(shadow_N, bool)
        routed = counts * ~shadow
        computed = np.zeros(W)
        np.add.at(computed, owner, routed.sum(0))
        computed += (counts * shadow).sum(1)
        remote = owner[None, :] != np.arange(W)[:, None]
        out = (routed * remote).sum(1)
        incoming = np.zeros(W)
        np.add.at(incoming, owner, (routed * remote).sum(0))
        return computed, out, incoming

    def step_latency(self, counts_WN: np.ndarray, experts_per_rank: int,
                     shadow_N: np.ndarray | None = None) -> StepLatency:
        """T_base: compute, then the four exchanges, nothing overlapped (FastMoE)."""
        computed, out, incoming = self.loads(counts_WN, experts_per_rank, shadow_N)
        num_shadow = 0 if shadow_N is None else int(np.count_nonzero(shadow_N))
        comp, comm, shadow, total = self._base_terms(computed, out, incoming, num_shadow)
        return StepLatency(tuple(comp.tolist()), tuple(comm.tolist()), shadow, total)

    def _base_terms(self, computed_W: np.ndarray, out_W: np.ndarray, incoming_W: np.ndarray,
                    num_shadow: int) -> tuple[np.ndarray, np.ndarray, float, float]:
        # one arithmetic path for `step_latency` and `shadow_policy`, so the policy's
        # predictions are exactly the latencies it is judged by
        comp = 3.0 * self._gemm_times(computed_W)
        comm = 4.0 * self._transfer_times(np.maximum(out_W, incoming_W))
        shadow = 2 * num_shadow * self.shadow_param_s
        return comp, comm, shadow, float((comp + comm).max()) + shadow

    # --- dynamic shadowing ------------------------------------------------------------

    def shadow_order(self, counts_WN: np.ndarray) -> list[int]:
        """Experts in descending load (tokens from all senders), ties to the lower id; experts
        with no tokens are left out, since shadowing them only adds parameter traffic."""
        load_N = np.asarray(counts_WN, dtype=np.float64).sum(0)
        return [int(e) for e in np.lexsort((np.arange(load_N.size), -load_N))
                if load_N[e] > 0]

    def _shadow_deltas(self, counts: np.ndarray, experts_per_rank: int):
        """Per expert e and worker w: how shadowing e changes w's computed, sent and
        received tokens (dropping e from the set undoes the same amounts)."""
        W, N = counts.shape
        owner_N = np.arange(N) // experts_per_rank
        own_NW = owner_N[:, None] == np.arange(W)[None, :]
        counts_NW = counts.T
        col_N = counts_NW.sum(1)
        remote_col_N = col_N - counts_NW[np.arange(N), owner_N]
        # the owner no longer computes everyone's tokens of e; each sender computes its own
        d_comp_NW = counts_NW - col_N[:, None] * own_NW
        d_out_NW = -counts_NW * ~own_NW
        d_inc_NW = -remote_col_N[:, None] * own_NW
        return d_comp_NW, d_out_NW, d_inc_NW

    def _base_totals(self, computed: np.ndarray, out: np.ndarray, incoming: np.ndarray,
                     num_shadow) -> np.ndarray:
        """`_base_terms`' total for a stack of candidates (workers on the last axis)."""
        comp = 3.0 * self._gemm_times(computed)
        comm = 4.0 * self._transfer_times(np.maximum(out, incoming))
        return (comp + comm).max(-1) + 2 * np.asarray(num_shadow) * self.shadow_param_s

    def shadow_prefix_latencies(self, counts_WN: np.ndarray, experts_per_rank: int
                                ) -> tuple[list[int], np.ndarray]:
        """`shadow_order` and T_base of shadowing each of its prefixes (entry k: the first k).

        All N + 1 candidates at once from cumulative sums of the per-expert changes; the
        counts are integers, so float64 stays exact.
        """
        counts = np.asarray(counts_WN, dtype=np.float64)
        order = self.shadow_order(counts)
        base = self.loads(counts, experts_per_rank)
        deltas = self._shadow_deltas(counts, experts_per_rank)
        computed, out, incoming = (
            np.concatenate([b[None, :], b[None, :] + np.cumsum(d[order], axis=0)])
            for b, d in zip(base, deltas))
        return order, self._base_totals(computed, out, incoming, np.arange(len(order) + 1))

    def shadow_policy(self, counts_WN: np.ndarray, experts_per_rank: int, *,
                      starts: int = 3) -> np.ndarray:
        """Which experts to replicate on every worker this iteration (FasterMoE 4.1).

        Experts are ranked by load (tokens from all senders, ties by expert id) and every
        prefix of that ranking is priced with T_base. The ``starts`` cheapest prefixes that
        are local minima of that curve (the cheapest of all among them) are then improved
        by local search (`_improve_by_flips`), and the cheapest result wins, the smaller
        set on a tie, so nothing is shadowed unless that is strictly faster.

        Stopping at the first greedy step that does not help, as the paper's prototype
        does, misses cases where one shadowed expert costs more than it saves but many
        together pay off (small H, many tokens: the parameters are cheap next to the tokens
        they keep home). The local search fixes prefixes that include an expert whose owner
        is not the bottleneck, or miss one that is not among the busiest. The result is
        never worse than any prefix, the greedy rule's included. Every step is a
        deterministic float64 function of the counts, so all ranks reach the same mask.

        The loads are summed over senders per expert. FastMoE's released policy
        (``fmoe/fastermoe/shadow_policy.py``) sums over experts per sender instead and marks
        the expert whose id is the busiest sender's rank (README, "Shadowing").
        """
        counts = np.asarray(counts_WN, dtype=np.float64)
        order, totals = self.shadow_prefix_latencies(counts, experts_per_rank)
        # a plateau keeps its shortest prefix
        padded = np.concatenate([[np.inf], totals, [np.inf]])
        minima = [k for k in range(totals.size)
                  if padded[k + 1] < padded[k] and padded[k + 1] <= padded[k + 2]]
        found = []
        for k in sorted(minima, key=lambda k: (totals[k], k))[:max(starts, 1)]:
            mask = np.zeros(counts.shape[1], bool)
            mask[order[:k]] = True
            mask = self._improve_by_flips(counts, experts_per_rank, mask, float(totals[k]))
            found.append((self.step_latency(counts, experts_per_rank, mask).total,
                          int(mask.sum()), mask))
        return min(found, key=lambda f: f[:2])[2]

    def _improve_by_flips(self, counts: np.ndarray, experts_per_rank: int, mask: np.ndarray,
                          total: float, *, pair_candidates: int = 16,
                          max_moves: int = 32) -> np.ndarray:
        """Best-improvement local search on T_base over changes of one or two experts.

        A move adds or drops one expert, or two at once: T_base is a max over workers, so
        when two workers tie as the bottleneck only a pair of changes lowers it. Pairs are
        drawn from the ``pair_candidates`` best single moves, which keeps a round at
        O(N W + pair_candidates^2 W). Each accepted move strictly lowers T_base; at most
        ``max_moves`` are made, which bounds the cost at 1024 experts (a start far from
        the optimum is not worth walking all the way).
        """
        d_comp_NW, d_out_NW, d_inc_NW = self._shadow_deltas(counts, experts_per_rank)
        computed, out, incoming = self.loads(counts, experts_per_rank, mask)
        mask = mask.copy()
        for _ in range(max_moves):
            sign_N = np.where(mask, -1.0, 1.0)
            s_comp, s_out, s_inc = (sign_N[:, None] * d for d in (d_comp_NW, d_out_NW,
                                                                  d_inc_NW))
            k = int(mask.sum())
            single_N = self._base_totals(computed + s_comp, out + s_out, incoming + s_inc,
                                         k + sign_N)
            e = int(np.argmin(single_N))
            flip: tuple[int, ...] = (e,)
            value = float(single_N[e])
            pool = np.argsort(single_N, kind="stable")[:pair_candidates]
            if pool.size > 1:
                i, j = np.triu_indices(pool.size, 1)
                a, b = pool[i], pool[j]
                pair_P = self._base_totals(computed + s_comp[a] + s_comp[b],
                                           out + s_out[a] + s_out[b],
                                           incoming + s_inc[a] + s_inc[b],
                                           k + sign_N[a] + sign_N[b])
                p = int(np.argmin(pair_P))
                if pair_P[p] < value:  # the smaller change wins a tie
                    value, flip = float(pair_P[p]), (int(a[p]), int(b[p]))
            if not value < total:
                break
            for e in flip:
                computed = computed + s_comp[e]
                out = out + s_out[e]
                incoming = incoming + s_inc[e]
                mask[e] = not mask[e]
            total = value
        return mask

    # --- smart schedule -----------------------------------------------------------------

    def schedule_steps(self, world_size: int, group_size: int, rank: int) -> list[list[int]]:
        """Peers this rank sends to at each step: the ranks of group (g + i) mod n."""
        if group_size < 1 or world_size % group_size:
            raise ValueError(f"group_size {group_size} must divide world_size {world_size}")
        n = world_size // group_size
        g = rank // group_size
        return [[((g + i) % n) * group_size + j for j in range(group_size)] for i in range(n)]

    def step_traffic(self, counts_WN: np.ndarray, experts_per_rank: int, group_size: int,
                     shadow_N: np.ndarray | None = None):
        """Per worker and step: tokens out (to others), in (from others), and computed.

        Returns three arrays of shape [W, n] (n = W / G steps), vectorised over workers.
        """
        counts = np.asarray(counts_WN, dtype=np.float64)
        W, N = counts.shape
        if group_size < 1 or W % group_size:
            raise ValueError(f"group_size {group_size} must divide world_size {W}")
        n = W // group_size
        shadow = np.zeros(N, bool) if shadow_N is None else np.asarray(shadow_N, bool)
        # tokens worker w sends to worker t (summed over t's experts)
        to_rank_WW = (counts * ~shadow).reshape(W, W, experts_per_rank).sum(2)
        self_W = np.diag(to_rank_WW).copy()
        to_group_Wn = to_rank_WW.reshape(W, n, group_size).sum(2)
        from_group_nW = to_rank_WW.reshape(n, group_size, W).sum(1)
        group_W = np.arange(W) // group_size
        steps = np.arange(n)
        targets_Wn = (group_W[:, None] + steps[None, :]) % n
        sources_Wn = (group_W[:, None] - steps[None, :]) % n
        out_Wn = to_group_Wn[np.arange(W)[:, None], targets_Wn]
        mine_Wn = from_group_nW[sources_Wn, np.arange(W)[:, None]]
        inc_Wn = mine_Wn.copy()
        # step 0 is the worker's own group: its tokens to itself do not travel
        out_Wn[:, 0] -= self_W
        inc_Wn[:, 0] -= self_W
        return out_Wn, inc_Wn, mine_Wn

    def smart_latency(self, counts_WN: np.ndarray, experts_per_rank: int, group_size: int,
                      shadow_N: np.ndarray | None = None) -> StepLatency:
        """Step latency with the group-wise pipelined exchange (forward + backward)."""
        counts = np.asarray(counts_WN, dtype=np.float64)
        N = counts.shape[1]
        shadow = np.zeros(N, bool) if shadow_N is None else np.asarray(shadow_N, bool)
        out_Wn, inc_Wn, mine_Wn = self.step_traffic(counts, experts_per_rank, group_size,
                                                    shadow)
        shadow_s = 2 * int(shadow.sum()) * self.shadow_param_s
        link_Wn = self.step_link_times(out_Wn, inc_Wn)
        comp_Wn = self._gemm_times(mine_Wn)
        local_W = self._gemm_times((counts * shadow).sum(1))
        fwd = _pipeline_vec(link_Wn, comp_Wn, link_Wn, shadow_s / 2, local_W)
        bwd = _pipeline_vec(link_Wn, 2 * comp_Wn, link_Wn, shadow_s / 2, 2 * local_W)
        comp = 3 * (comp_Wn.sum(1) + local_W)
        comm = 2 * 2 * link_Wn.sum(1)
        return StepLatency(tuple(comp.tolist()), tuple(comm.tolist()), shadow_s,
                           float((fwd + bwd).max()))

    def step_link_times(self, out_Wn: np.ndarray, inc_Wn: np.ndarray) -> np.ndarray:
        """Seconds each worker's link is busy in each exchange step (S_i or R_i).

        The step's messages to its G peers are in flight together: one alpha per step, as
        the emulator charges an all-to-all, plus the fixed per-step overhead.
        """
        return self._transfer_times(np.maximum(out_Wn, inc_Wn)) + self.step_overhead_s

    def _gemm_times(self, tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.float64)
        eff = np.where(tokens > 0, tokens / np.maximum(tokens + self.half_efficiency_tokens,
                                                       1e-300), 1.0)
        return np.where(tokens > 0, self.flops_per_token * tokens / (self.flops_per_s * eff),
                        0.0)

    def choose_group_size(self, counts_WN: np.ndarray, experts_per_rank: int,
                          shadow_N: np.ndarray | None = None, *,
                          max_steps: int | None = None) -> int:
        """The divisor G of W with the lowest modelled smart-schedule latency (ties: larger G).

        ``max_steps`` bounds the number of steps W / G considered.
        """
        W = np.asarray(counts_WN).shape[0]
        sizes = [g for g in range(W, 0, -1)
                 if W % g == 0 and (max_steps is None or W // g <= max_steps)]
        return min(sizes, key=lambda g: self.smart_latency(counts_WN, experts_per_rank, g,
                                                           shadow_N).total)

    # --- DDL-Roofline -----------------------------------------------------------------

    def intensity(self, counts_WN: np.ndarray, experts_per_rank: int,
                  shadow_N: np.ndarray | None = None) -> float:
        """I = FLOPs per worker / bytes per worker on its link (the bottleneck worker)."""
        computed, out, incoming = self.loads(counts_WN, experts_per_rank, shadow_N)
        flops = 3 * self.flops_per_token * computed.max()
        traffic = 4 * np.maximum(out, incoming).max() * self.token_bytes
        num_shadow = 0 if shadow_N is None else int(np.count_nonzero(shadow_N))
        traffic += 2 * num_shadow * self.param_bytes
        return float(flops / traffic) if traffic > 0 else float("inf")

    def roof(self, intensity: float) -> float:
        """The attainable FLOP/s per worker at intensity I: min(P, I * beta)."""
        return min(self.flops_per_s, intensity * self.bandwidth_Bps)

    def serial_curve(self, intensity: float) -> float:
        """FLOP/s per worker with no overlap: 1 / (1/P + 1/(I beta))."""
        return 1.0 / (1.0 / self.flops_per_s + 1.0 / (intensity * self.bandwidth_Bps))


def _pipeline_vec(sends_Wn, computes_Wn, returns_Wn, shadow_s: float, local_W) -> np.ndarray:
    """`_pipeline` for every worker at once (arrays [W, n]); returns each worker's end."""
    finish_sends = np.cumsum(sends_Wn, axis=1)
    t_ret = finish_sends[:, -1] + shadow_s
    t_comp = np.zeros(sends_Wn.shape[0])
    for i in range(sends_Wn.shape[1]):
        t_comp = np.maximum(t_comp, finish_sends[:, i]) + computes_Wn[:, i]
        t_ret = np.maximum(t_ret, t_comp) + returns_Wn[:, i]
    return np.maximum(t_ret, t_comp + local_W)


def _pipeline(sends, computes, returns, shadow_s: float, local_s: float) -> float:
    """FasterMoE A.5 recurrences for one pass: sends first on the link, then returns."""
    t_send = 0.0
    t_comp = 0.0
    finish_sends = []
    for s in sends:
        t_send += s
        finish_sends.append(t_send)
    t_ret = t_send + shadow_s
    for i, (c, r) in enumerate(zip(computes, returns)):
        t_comp = max(t_comp, finish_sends[i]) + c
        t_ret = max(t_ret, t_comp) + r
    # shadowed experts run on local tokens once the steps' compute is done
    return max(t_ret, t_comp + local_s)
