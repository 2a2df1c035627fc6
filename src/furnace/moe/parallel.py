"""Expert parallelism applied to `MoELayer`s, with FasterMoE's dynamic shadowing and smart
schedule (PPoPP'22 sections 4.1 and 4.2).

`expert_parallel(model, comm, config)` shards every `MoELayer`'s experts over the ranks of
``comm`` (expert e lives on rank e // num_experts_per_rank) and routes tokens with
`Communicator` all-to-alls. Per forward:

1. the gate routes this rank's tokens; assignments are sorted by global expert;
2. every rank all-gathers the per-expert counts c[w, e] (a fixed-size collective, so the
   order of collectives never depends on local data, even for ranks with no tokens);
3. the shadowing rule (`MoEPerfModel.shadow_policy`, identical on every rank since it is
   a deterministic float64 function of c) picks experts to replicate: their owners
   broadcast the parameters, every rank computes its own tokens for them, and in
   backward the replicas' gradients are reduced (summed) to the owner;
4. the other assignments are exchanged in n = W / G steps (G = group size): at step i a
   rank sends to group (g + i) mod n and receives from group (g - i) mod n. All sends are
   issued first; step i's experts run as soon as its tokens arrive and its results go
   back while later steps are still in flight. Without the smart schedule G = W: one
   all-to-all, compute, one all-to-all (FastMoE's baseline).

Steps 3-4 are one autograd Function with an explicit backward that mirrors the forward
(the same collectives in the same order on every rank), like FastMoE's `MoEForward`.

Data parallelism over the same ranks must leave the expert parameters alone: torch's
``DistributedDataParallel`` broadcasts rank 0's parameters at construction and averages
every gradient, which would overwrite every rank's experts with rank 0's. `expert_parallel`
therefore lists the expert parameters in the model's ``_ddp_params_and_buffers_to_ignore``
(DDP's documented way to exclude parameters; `ddp_ignore_experts` does it for any outer
module), and an expert-parallel forward inside a DDP that does not ignore them raises.

Shape suffixes: T tokens on this rank, D d_model, A kept assignments, R rows exchanged,
N global experts, W ranks, E experts per rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from furnace.runtime.comm import Communicator

from .config import ExpertParallelConfig
from .experts import ExpertBank
from .gates import GateContext, GateOutput
from .layer import MoELayer, combine, sort_assignments
from .perfmodel import MoEPerfModel


@dataclass
class StepPlan:
    """Everything the exchange needs for one forward; identical structure on every rank."""

    comm: Communicator
    counts_WN: np.ndarray
    shadow_N: np.ndarray
    experts_per_rank: int
    steps_send: list[list[int]]
    steps_recv: list[list[int]]
    # rows this rank sends to rank j, per local expert of j: [W][E]
    send_WE: np.ndarray
    # rows rank j sends to this rank, per local expert of this rank: [W][E]
    recv_WE: np.ndarray


@dataclass
class LayerStats:
    """Counters of the last forward of one layer on this rank (machine-independent)."""

    tokens_computed: int = 0
    shadowed: list[int] = field(default_factory=list)
    group_size: int = 0
    load_max_over_mean: float = 1.0
    counts_WN: list[list[int]] = field(default_factory=list)


class ExpertParallel:
    """Per-layer state of expert parallelism: the group, the config, the perf model."""

    def __init__(self, comm: Communicator, config: ExpertParallelConfig, perf: MoEPerfModel,
                 experts_per_rank: int) -> None:
        self.comm = comm
        self.config = config
        self.perf = perf
        self.experts_per_rank = experts_per_rank
        self.stats = LayerStats()

    def forward(self, layer: MoELayer, x_TD: torch.Tensor, routing: GateOutput) -> torch.Tensor:
        _refuse_ddp_over_experts(layer)
        plan = self.plan(routing, layer.num_experts)
        token_A, expert_A, slot_A = sort_assignments(routing)
        shadow_A = torch.as_tensor(plan.shadow_N, dtype=torch.bool,
                                   device=expert_A.device)[expert_A]
        routed = torch.nonzero(~shadow_A).reshape(-1)
        local = torch.nonzero(shadow_A).reshape(-1)
        y_routed, y_local = _ExchangeAndCompute.apply(
            x_TD[token_A[routed]], x_TD[token_A[local]], expert_A[local], plan, layer.experts,
            *layer.experts.param_tensors())
        y_AD = x_TD.new_zeros((token_A.shape[0], x_TD.shape[1]))
        y_AD = y_AD.index_copy(0, routed, y_routed).index_copy(0, local, y_local)
        return combine(y_AD, token_A, slot_A, routing, x_TD.shape[0])

    def plan(self, routing: GateOutput, num_experts: int) -> StepPlan:
        comm, E = self.comm, self.experts_per_rank
        ids = routing.expert_ids_TK.reshape(-1)
        counts_N = torch.bincount(ids[ids >= 0], minlength=num_experts).to(torch.int64)
        counts_WN = comm.all_gather(counts_N.reshape(1, -1)).cpu().numpy().astype(np.int64)
        shadow_N, group_size = self._decide(counts_WN)
        W, r = comm.world_size, comm.rank
        steps_send = self.perf.schedule_steps(W, group_size, r)
        n = len(steps_send)
        steps_recv = [steps_send[(-i) % n] for i in range(n)]
        routed_WN = counts_WN * ~shadow_N
        plan = StepPlan(comm, counts_WN, shadow_N, E, steps_send, steps_recv,
                        routed_WN[r].reshape(W, E), routed_WN[:, r * E:(r + 1) * E])
        computed, _, _ = self.perf.loads(counts_WN, E, shadow_N)
        self.stats = LayerStats(
            tokens_computed=int(computed[r]), shadowed=np.flatnonzero(shadow_N).tolist(),
            group_size=group_size,
            load_max_over_mean=float(computed.max() / computed.mean()) if computed.sum() else 1.0,
            counts_WN=counts_WN.tolist())
        return plan

    def _shadow_mask(self, counts_WN: np.ndarray) -> np.ndarray:
        cfg = self.config
        N = counts_WN.shape[1]
        if cfg.shadow_mask is not None:
            if len(cfg.shadow_mask) != N:
                raise ValueError(f"shadow_mask has {len(cfg.shadow_mask)} entries, need {N}")
            return np.asarray(cfg.shadow_mask, dtype=bool)
        if cfg.shadowing:
            return self.perf.shadow_policy(counts_WN, self.experts_per_rank)
        return np.zeros(N, dtype=bool)

    def _decide(self, counts_WN: np.ndarray) -> tuple[np.ndarray, int]:
        """Shadow mask and group size; with both techniques on, the pair the model prefers."""
        shadow_N = self._shadow_mask(counts_WN)
        group_size = self._group_size(counts_WN, shadow_N)
        cfg = self.config
        if (cfg.shadowing and cfg.smart_schedule and cfg.shadow_mask is None
                and cfg.group_size is None and shadow_N.any()):
            # the shadowing rule prices a non-overlapped step; once the schedule overlaps
            # the exchange, moving tokens may be the cheaper option after all
            none = np.zeros_like(shadow_N)
            g_none = self._group_size(counts_WN, none)
            E = self.experts_per_rank
            if (self.perf.smart_latency(counts_WN, E, g_none, none).total
                    < self.perf.smart_latency(counts_WN, E, group_size, shadow_N).total):
                return none, g_none
        return shadow_N, group_size

    def _group_size(self, counts_WN: np.ndarray, shadow_N: np.ndarray) -> int:
        W = self.comm.world_size
        cfg = self.config
        if not cfg.smart_schedule:
            return W
        if cfg.group_size is not None:
            if W % cfg.group_size:
                raise ValueError(f"group_size {cfg.group_size} does not divide {W} ranks")
            return cfg.group_size
        return self.perf.choose_group_size(counts_WN, self.experts_per_rank, shadow_N)


def expert_parallel(model: nn.Module, comm: Communicator,
                    config: ExpertParallelConfig | None = None) -> nn.Module:
    """Shard the experts of every `MoELayer` in ``model`` over ``comm``'s ranks (in place).

    A layer holding every expert keeps this rank's slice (every rank must then have built
    the same global weights: same seed). A layer built with only this rank's slice
    (``experts.first_expert == rank * experts_per_rank``) keeps it as it is. Gates and all
    non-expert parameters stay replicated. The expert parameters are added to
    ``model._ddp_params_and_buffers_to_ignore``, so ``DistributedDataParallel(model)``
    leaves them local.
    """
    config = config or ExpertParallelConfig()
    layers = [m for m in model.modules() if isinstance(m, MoELayer)]
    if not layers:
        raise ValueError("the model has no MoELayer to parallelize")
    W, r = comm.world_size, comm.rank
    for layer in layers:
        if layer.parallel is not None:
            raise ValueError("expert parallelism is already applied to this layer")
        if layer.num_experts % W:
            raise ValueError(f"{layer.num_experts} experts do not divide over {W} ranks")
        E = layer.num_experts // W
        bank = layer.experts
        if bank.num_experts == layer.num_experts:
            # also at W = 1: the copy draws from the global generator, as it always did,
            # so seeded runs that apply expert parallelism keep their random streams
            layer.experts = bank.shard(r * E, E)
        elif bank.num_experts != E or bank.first_expert != r * E:
            raise ValueError(f"rank {r} of {W} needs experts {r * E}..{r * E + E - 1}, but the "
                             f"layer holds experts {bank.first_expert}.."
                             f"{bank.first_expert + bank.num_experts - 1}")
        bank = layer.experts
        perf = MoEPerfModel.from_topology(config.topology, d_model=layer.d_model,
                                          d_hidden=bank.equivalent_d_hidden(),
                                          dtype=bank.dtype, world_size=W,
                                          half_efficiency_tokens=config.half_efficiency_tokens,
                                          step_overhead_s=config.step_overhead_s)
        layer.parallel = ExpertParallel(comm, config, perf, E)
        bind = getattr(layer.gate, "bind", None)
        if bind is not None:
            bind(GateContext(rank=r, world_size=W, num_experts_per_rank=E,
                             ranks_per_node=config.topology.ranks_per_node, comm=comm))
    ddp_ignore_experts(model)
    return model


def ddp_ignore_experts(module: nn.Module) -> list[str]:
    """Make ``DistributedDataParallel(module)`` leave expert-parallel parameters alone.

    Adds the names of the parameters of every expert-parallel layer's bank to
    ``module._ddp_params_and_buffers_to_ignore`` (DDP then neither broadcasts them at
    construction nor all-reduces their gradients) and returns the full list. Call it on
    the module you wrap, after expert parallelism is applied.
    """
    names = list(getattr(module, "_ddp_params_and_buffers_to_ignore", []))
    for prefix, sub in module.named_modules():
        if isinstance(sub, MoELayer) and sub.parallel is not None:
            head = f"{prefix}.experts." if prefix else "experts."
            names += [head + n for n, _ in sub.experts.named_parameters()
                      if head + n not in names]
    # the attribute DDP reads (torch's _set_params_and_buffers_to_ignore_for_model sets it)
    # nn.Module's attribute typing knows tensors and modules only
    module._ddp_params_and_buffers_to_ignore = names  # type: ignore[assignment]
    return names


def _refuse_ddp_over_experts(layer: MoELayer) -> None:
    """Raise if this forward runs inside a torch DDP that synchronizes this layer's experts."""
    ddp = getattr(DistributedDataParallel, "_active_ddp_module", None)
    if ddp is None:
        return
    ignored = {id(p) for n, p in ddp.module.named_parameters() if n in ddp.parameters_to_ignore}
    synced = [p for p in layer.experts.parameters() if id(p) not in ignored]
    if synced:
        raise RuntimeError(
            "torch DistributedDataParallel wraps an expert-parallel MoE layer without "
            f"ignoring its {len(synced)} expert parameters: DDP broadcast rank 0's experts "
            "over every rank's at construction and averages expert gradients, so the "
            "experts are already wrong. Rebuild the model and call "
            "furnace.moe.ddp_ignore_experts(model) before DistributedDataParallel(model), "
            "or wrap it in furnace.moe.compat.DistributedGroupedDataParallel")


def _run_experts(experts: ExpertBank, params: Sequence[torch.Tensor], x_RD: torch.Tensor,
                 local_R: torch.Tensor, num_local: int) -> torch.Tensor:
    """Rows ``x_RD`` through local expert ``local_R[i]`` each (rows in any order)."""
    order = torch.argsort(local_R, stable=True)
    counts = torch.bincount(local_R, minlength=num_local).tolist()
    outs = []
    for e, x_e in enumerate(torch.split(x_RD[order], counts)):
        if x_e.shape[0]:
            outs.append(experts.apply_expert(experts.expert_params(e, params), x_e, e))
    if not outs:
        # no rows for any local expert: still run one on zero rows, so the result has the
        # dtype the experts produce (bf16 under autocast). Ranks size their all-to-all
        # buffers from it, and one rank's fp32 zeros against a peer's bf16 rows would
        # misread the bytes.
        outs.append(experts.apply_expert(experts.expert_params(0, params), x_RD[:0], 0))
    y_sorted = torch.cat(outs)
    return y_sorted[torch.argsort(order)]


def _charge(plan: StepPlan, rows: int, experts, passes: float) -> None:
    """Charge expert GEMMs to the virtual clock (a no-op for real or sleeping time)."""
    network = plan.comm.network
    if network is not None and rows:
        network.compute(passes * experts.flops_per_token() * rows, experts.dtype)


class _ExchangeAndCompute(torch.autograd.Function):
    """Sends, shadow broadcasts, per-step expert compute and returns, as one Function."""

    @staticmethod
    def forward(ctx, x_routed_RD, x_local_SD, expert_local_S, plan: StepPlan, experts,
                *params):
        comm = plan.comm
        E = plan.experts_per_rank
        send_rows = plan.send_WE.sum(1)
        recv_rows = plan.recv_WE.sum(1)
        offsets = np.concatenate([[0], np.cumsum(send_rows)])
        # all sends first, on the link in step order (FasterMoE's comm stream)
        sends = []
        for targets, sources in zip(plan.steps_send, plan.steps_recv):
            send_split = [int(send_rows[j]) if j in targets else 0 for j in range(comm.world_size)]
            recv_split = [int(recv_rows[j]) if j in sources else 0
                          for j in range(comm.world_size)]
            rows = torch.cat([x_routed_RD[offsets[j]:offsets[j + 1]] for j in sorted(targets)])
            sends.append((comm.all_to_all_single(rows.contiguous(), recv_split, send_split,
                                                 async_op=True), send_split, recv_split))
        # shadow broadcasts follow the sends on the link and overlap the steps' compute
        pending_replicas = _broadcast_shadows(plan, experts, params)
        leaves = [p.detach().requires_grad_() for p in params]
        steps, returns = [], []
        for (handle, send_split, recv_split), sources in zip(sends, plan.steps_recv):
            x_in = handle.wait().detach().requires_grad_()
            # received rows: by source rank, each block sorted by local expert
            local_R = torch.cat([torch.repeat_interleave(
                torch.arange(E, device=x_in.device),
                torch.as_tensor(plan.recv_WE[j], device=x_in.device)) for j in sorted(sources)])
            with torch.enable_grad():
                y = _run_experts(experts, leaves, x_in, local_R, E)
            _charge(plan, x_in.shape[0], experts, 1.0)
            steps.append((x_in, y, local_R))
            returns.append(comm.all_to_all_single(y.detach(), send_split, recv_split,
                                                  async_op=True))
        x_loc = x_local_SD.detach().requires_grad_()
        rep_leaves = {e: [t.requires_grad_() for t in wait()]
                      for e, wait in pending_replicas.items()}
        with torch.enable_grad():
            y_loc = _run_shadowed(experts, rep_leaves, x_loc, expert_local_S)
        _charge(plan, x_loc.shape[0], experts, 1.0)
        back = [h.wait() for h in returns]
        y_routed = _reassemble(back, plan.steps_send, send_rows, x_routed_RD)
        ctx.plan, ctx.experts = plan, experts
        ctx.saved = (steps, leaves, x_loc, y_loc, rep_leaves, offsets, send_rows, recv_rows)
        return y_routed, y_loc.detach()

    @staticmethod
    def backward(ctx, grad_routed_RD, grad_local_SD):
        plan, experts = ctx.plan, ctx.experts
        steps, leaves, x_loc, y_loc, rep_leaves, offsets, send_rows, recv_rows = ctx.saved
        comm = plan.comm
        W = comm.world_size
        grad_routed_RD = grad_routed_RD.contiguous()
        # output gradients travel like the forward sends: sender -> expert owner
        sends = []
        for targets, sources in zip(plan.steps_send, plan.steps_recv):
            send_split = [int(send_rows[j]) if j in targets else 0 for j in range(W)]
            recv_split = [int(recv_rows[j]) if j in sources else 0 for j in range(W)]
            rows = torch.cat([grad_routed_RD[offsets[j]:offsets[j + 1]]
                              for j in sorted(targets)])
            sends.append((comm.all_to_all_single(rows, recv_split, send_split, async_op=True),
                          send_split, recv_split))
        param_grads = [torch.zeros_like(p) for p in leaves]
        # shadowed experts first (FasterMoE): their replicas' gradients travel to the
        # owners while the routed steps' backward runs
        grad_x_loc = torch.zeros_like(x_loc)
        flat_rep = [t for e in sorted(rep_leaves) for t in rep_leaves[e]]
        if x_loc.shape[0]:
            grads = torch.autograd.grad(y_loc, [x_loc, *flat_rep], grad_local_SD,
                                        allow_unused=True)
            grad_x_loc = grads[0]
            rep_grads = list(grads[1:])
        else:
            rep_grads = [None] * len(flat_rep)
        _charge(plan, x_loc.shape[0], experts, 2.0)
        pending_reduces = _reduce_shadow_grads(plan, experts, rep_leaves, rep_grads)
        returns = []
        for (handle, send_split, recv_split), (x_in, y, _) in zip(sends, steps):
            g_out = handle.wait()
            if x_in.shape[0]:
                grads = torch.autograd.grad(y, [x_in, *leaves], g_out, allow_unused=True)
                g_in = grads[0]
                for acc, g in zip(param_grads, grads[1:]):
                    if g is not None:
                        acc += g
            else:
                g_in = torch.zeros_like(x_in)
            _charge(plan, x_in.shape[0], experts, 2.0)
            returns.append(comm.all_to_all_single(g_in.contiguous(), send_split, recv_split,
                                                  async_op=True))
        for finish in pending_reduces:
            finish(param_grads)
        back = [h.wait() for h in returns]
        grad_routed_in = _reassemble(back, plan.steps_send, send_rows, grad_routed_RD)
        return (grad_routed_in, grad_x_loc, None, None, None, *param_grads)


def _reassemble(blocks: list[torch.Tensor], steps_send: list[list[int]], send_rows,
                like: torch.Tensor) -> torch.Tensor:
    """Put per-step returned blocks (ordered by target rank) back in send order."""
    by_rank: dict[int, torch.Tensor] = {}
    for block, targets in zip(blocks, steps_send):
        sizes = [int(send_rows[j]) for j in sorted(targets)]
        for j, part in zip(sorted(targets), torch.split(block, sizes)):
            by_rank[j] = part
    parts = [by_rank[j] for j in range(len(send_rows)) if j in by_rank]
    return torch.cat(parts) if parts else like.new_zeros((0, *like.shape[1:]))


def _broadcast_shadows(plan: StepPlan, experts: ExpertBank, params) -> dict:
    """Start broadcasting every shadowed expert's parameters from its owner (ascending id).

    Returns, per shadowed expert, a function that waits for its parameters and returns
    fresh copies (one tensor per parameter of one expert).
    """
    comm, E = plan.comm, plan.experts_per_rank
    out = {}
    for e in np.flatnonzero(plan.shadow_N).tolist():
        owner, i = divmod(e, E)
        # every rank knows the shapes from its own expert at the same local index
        template = experts.expert_params(i, params)
        shapes = [t.shape for t in template]
        sizes = [t.numel() for t in template]
        if len({t.dtype for t in template}) > 1:
            raise ValueError("shadowing needs one dtype for all of an expert's parameters")
        if owner == comm.rank:
            flat = torch.cat([t.detach().reshape(-1) for t in template])
        else:
            flat = template[0].new_empty(sum(sizes))
        handle = comm.broadcast(flat, src=owner, async_op=True)

        def wait(handle=handle, shapes=shapes, sizes=sizes):
            flat = handle.wait()
            return [t.reshape(s).clone() for t, s in zip(torch.split(flat, sizes), shapes)]

        out[e] = wait
    return out


def _run_shadowed(experts: ExpertBank, rep_leaves: dict[int, list[torch.Tensor]],
                  x_SD: torch.Tensor, expert_S: torch.Tensor) -> torch.Tensor:
    outs = []
    for e, params in rep_leaves.items():
        rows = torch.nonzero(expert_S == e).reshape(-1)
        if rows.numel():
            outs.append((rows, experts.apply_expert(params, x_SD[rows], e % experts.num_experts)))
    # the experts' output dtype (bf16 under autocast), not the input's
    y_SD = x_SD.new_zeros(x_SD.shape, dtype=outs[0][1].dtype if outs else x_SD.dtype)
    for rows, y in outs:
        y_SD = y_SD.index_copy(0, rows, y)
    return y_SD


def _reduce_shadow_grads(plan: StepPlan, experts: ExpertBank, rep_leaves, rep_grads) -> list:
    """Start summing each shadowed expert's replica gradients onto its owner.

    Returns functions that wait for one reduce and, on the owner, add the result to the
    gradients of its parameters.
    """
    comm, E = plan.comm, plan.experts_per_rank
    pending = []
    k = 0
    for e in sorted(rep_leaves):
        leaves = rep_leaves[e]
        grads = [g if g is not None else torch.zeros_like(t)
                 for g, t in zip(rep_grads[k:k + len(leaves)], leaves)]
        k += len(leaves)
        flat = torch.cat([g.reshape(-1) for g in grads])
        owner, i = divmod(e, E)
        handle = comm.reduce(flat, dst=owner, async_op=True)
        sizes = [g.numel() for g in grads]

        def finish(param_grads, handle=handle, owner=owner, i=i, sizes=sizes):
            flat = handle.wait()
            if owner == comm.rank:
                # views into param_grads, so the sum lands in the owner's gradient
                for acc, part in zip(experts.expert_params(i, param_grads),
                                     torch.split(flat, sizes)):
                    acc += part.reshape(acc.shape)

        pending.append(finish)
    return pending
