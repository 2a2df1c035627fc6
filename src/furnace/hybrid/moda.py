"""MoDa hybrid parallelism (BaGuaLu, Ma et al., PPoPP'22): expert parallelism in the MoE
layers, data parallelism for everything else, applied from outside to an unchanged
`furnace.moe` model.

``moda_parallel(model, groups)`` shards every `MoELayer`'s experts over this rank's
expert-parallel group (`furnace.moe.expert_parallel` on ``groups.ep``) and tags each
parameter with its kind, like FastMoE's ``dp_comm`` attribute:

- ``"expert"``: a parameter of an MoE layer's expert bank (a shard, different per EP rank);
- ``"gate"``: a parameter of an MoE layer's gate (replicated; `furnace.moe` leaves its
  gradient reduction to the trainer, and it happens here);
- ``"dense"``: every other parameter (replicated).

`MoDa.reduce_gradients`, called after ``backward``, makes every rank's gradient equal
to the gradient of the **global-batch** loss. The derivation, for W ranks, EP size P and
rank r computing ``L_r``, the mean loss over its own shard of a global batch split into
W equal shards (the usual data-parallel contract; the global loss is then
``L = (1/W) sum_r L_r``):

- a replicated parameter (dense or gate) gets ``dL_r/dθ`` from rank r's backward alone
  (the gate's scores multiply the experts' outputs on the token's own rank), so
  ``dL/dθ = (1/W) sum_r dL_r/dθ``: an **average over the world**;
- an expert shard's backward already sums over its EP group: the all-to-all carries
  every EP peer's output gradients to the owner, so after backward the owner holds
  ``sum_{r in its EP group} dL_r/dθ``. Its EDP group holds one such partial sum per EP
  group, so ``dL/dθ = (1/W) sum_{EDP} (...)``: a **sum over the EDP group divided by W**,
  not by the EDP group's size W / P (averaging over the EDP group would be P times too
  large; with P = W there is nothing to reduce, but the 1/W scaling still applies).

Shards of unequal size need the loss weighted by each rank's share of the global token
count before backward (`MoDa.loss_weight`), so that ``sum_r w_r L_r`` is the global mean.
The gate's auxiliary balance loss is a per-rank quantity (as in FastMoE and GShard): with
``balance_loss_weight > 0`` the data-parallel loss is the average of per-shard balance
losses, which equals a full-batch one only for per-shard references.

`train_moda` is the trainer: `furnace.runtime.training.train_loop` with
``after_backward`` = `MoDa.reduce_gradients` and a global-norm `MoDa.clip_gradients`,
optionally under a mixed-precision policy and with a sharded checkpoint store.

What follows the paper: MoDa's split of parameters into expert-parallel and data-parallel
ones. What is reconstruction: the tagging, the reduction order (one flat buffer per kind,
dense and gate in one world all-reduce), the global-norm clip and the loss-weight helper.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import torch
from torch import nn

from furnace.moe import ExpertParallelConfig, MoELayer, expert_parallel
from furnace.runtime.comm import Communicator
from furnace.runtime.training import (
    CheckpointFormat,
    CheckpointStore,
    TrainHooks,
    TrainLoopConfig,
    TrainResult,
    train_loop,
)

from .layout import MoDaGroups
from .precision import MixedPrecision

__all__ = ["GradientHook", "MoDa", "ParamKind", "moda_parallel", "train_moda"]

ParamKind = Literal["dense", "gate", "expert"]
PARAM_KINDS: tuple[ParamKind, ...] = ("dense", "gate", "expert")


@dataclass
class MoDa:
    """A model under MoDa parallelism: its groups and every parameter's kind.

    Attributes:
        model: the model (its MoE layers expert-parallel over ``groups.ep``).
        groups: this rank's communicators.
        kinds: parameter name -> kind, in ``model.named_parameters()`` order.
    """

    model: nn.Module
    groups: MoDaGroups
    kinds: dict[str, ParamKind] = field(default_factory=dict)

    def parameters_of(self, kind: ParamKind) -> Iterator[tuple[str, nn.Parameter]]:
        """``(name, parameter)`` of one kind, in ``named_parameters()`` order."""
        for name, p in self.model.named_parameters():
            if self.kinds[name] == kind:
                yield name, p

    def loss_weight(self, local_tokens: int) -> float:
        """The factor that turns this rank's mean loss over ``local_tokens`` into its share
        of the global mean, relative to the equal-shard contract: ``W * n_r / sum_r n_r``
        (1.0 for equal shards). Multiply the loss by it before ``backward``; one world
        all-reduce of a scalar, so every rank must call it."""
        if local_tokens < 0:
            raise ValueError(f"local_tokens must be >= 0, got {local_tokens}")
        world = self.groups.world
        total = world.all_reduce(torch.tensor([float(local_tokens)], dtype=torch.float64))
        if not float(total) > 0:
            raise ValueError("no rank has any tokens: the global mean loss is undefined")
        return world.world_size * local_tokens / float(total)

    def reduce_gradients(self) -> None:
        """All-reduce the gradients after ``backward`` so that each rank holds the gradient
        of the global-batch loss (see the module docstring for the scaling):

        dense and gate: averaged over the world; experts: summed over the
        expert-data-parallel group and divided by the world size.

        Collective over the world and the EDP group; a parameter with no gradient
        contributes zeros (it had no tokens on this rank) and receives the reduced one.
        """
        W = self.groups.world.world_size
        replicated = [p for kind in ("dense", "gate") for _, p in self.parameters_of(kind)]
        experts = [p for _, p in self.parameters_of("expert")]
        _reduce(replicated, self.groups.world if W > 1 else None, 1.0 / W)
        edp = self.groups.edp
        _reduce(experts, edp if edp.world_size > 1 else None, 1.0 / W)

    def clip_gradients(self, max_norm: float) -> float:
        """Clip every gradient by the norm of the **global** gradient (after
        `reduce_gradients`); returns that norm. Replicated gradients are counted once;
        the expert shards' squared norms are summed over the EP group (each shard once).
        Collective over the EP group."""
        if not max_norm > 0:
            raise ValueError(f"max_norm must be > 0, got {max_norm}")
        squares = {}
        for kind in PARAM_KINDS:
            grads = [p.grad for _, p in self.parameters_of(kind) if p.grad is not None]
            squares[kind] = (torch.stack([g.detach().double().pow(2).sum() for g in grads]).sum()
                             if grads else torch.zeros((), dtype=torch.float64))
        expert_sq = squares["expert"].reshape(1).clone()
        if self.groups.ep.world_size > 1:
            expert_sq = self.groups.ep.all_reduce(expert_sq)
        norm = float((squares["dense"] + squares["gate"] + expert_sq[0]).sqrt())
        factor = max_norm / (norm + 1e-6)
        if factor < 1.0:
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(factor)
        return norm


def _reduce(params: list[nn.Parameter], comm: Communicator | None, scale: float) -> None:
    """Sum the gradients of ``params`` over ``comm`` (None: this rank alone) as one flat
    buffer, then multiply by ``scale``; missing gradients count as zeros."""
    if not params:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.detach().reshape(-1) for g in grads])
    if comm is not None:
        flat = comm.all_reduce(flat)
    flat.mul_(scale)
    for p, part in zip(params, torch.split(flat, [p.numel() for p in params])):
        p.grad = part.reshape(p.shape).clone()


def moda_parallel(model: nn.Module, groups: MoDaGroups,
                  config: ExpertParallelConfig | None = None) -> MoDa:
    """Apply MoDa to ``model`` in place and return its `MoDa` handle.

    Every rank must have built the same global model (same seed): the MoE layers keep
    this rank's expert shard (``groups.layout.shard_of(rank)``), everything else stays
    replicated. ``config`` is passed to `furnace.moe.expert_parallel` (shadowing, smart
    schedule); the default is the plain exchange.
    """
    layers = [m for m in model.modules() if isinstance(m, MoELayer)]
    if not layers:
        raise ValueError("the model has no MoELayer: MoDa needs expert layers to shard")
    P = groups.layout.expert_parallel_size
    for layer in layers:
        if layer.num_experts % P:
            raise ValueError(f"expert_parallel_size={P} must divide the layer's "
                             f"num_experts={layer.num_experts}")
    expert_parallel(model, groups.ep, config)
    expert_ids: set[int] = set()
    gate_ids: set[int] = set()
    for layer in layers:
        expert_ids.update(id(p) for p in layer.experts.parameters())
        gate_ids.update(id(p) for p in layer.gate.parameters())
    kinds: dict[str, ParamKind] = {}
    for name, p in model.named_parameters():
        kinds[name] = ("expert" if id(p) in expert_ids
                       else "gate" if id(p) in gate_ids else "dense")
    return MoDa(model=model, groups=groups, kinds=kinds)


Batch = tuple[torch.Tensor, torch.Tensor]
Result = TypeVar("Result", bound=TrainResult)
# called after each backward, before the reduction, with the handle and the step (from 1
# in this call): to inspect or perturb this rank's own gradients
GradientHook = Callable[[MoDa, int], None]


def train_moda(config: TrainLoopConfig, groups: MoDaGroups, *,
               build_model: Callable[[], nn.Module],
               global_batches: Callable[[torch.Generator], Iterator[Batch]],
               loss: Callable[[nn.Module, Batch], torch.Tensor], result: Result,
               expert_config: ExpertParallelConfig | None = None,
               progress: Callable[[int, dict[str, float]], None] | None = None,
               precision: MixedPrecision | None = None,
               gradient_hook: GradientHook | None = None,
               report_global_loss: bool = False,
               checkpoint_store: Callable[[list[MoDa]], CheckpointStore] | None = None,
               run_config: Any = None, checkpoint_format: CheckpointFormat | None = None,
               resume: bool = False, overwrite: bool = False,
               stop_at: int | None = None) -> Result:
    """`furnace.runtime.training.train_loop` under MoDa: the trainer.

    Every rank runs the loop with the same config, so the same seed builds the same
    global model (then `moda_parallel` shards it) and draws the same global batches; each
    rank trains on its equal, contiguous shard of every batch (rows ``[r*b, (r+1)*b)``,
    ``b = B / W``). The loop's hooks reduce the gradients (`MoDa.reduce_gradients`) and clip
    them by the global norm (`MoDa.clip_gradients`), so the run equals `train_loop` on the
    global batches in one process.

    Args:
        precision: a `MixedPrecision` policy applied to the model, its loss and its hooks
            (unscaling after the reduction, before the clip; with a loss scaler whose
            overflow flag is world-wide, every rank skips the same steps).
        gradient_hook: see `GradientHook`.
        report_global_loss: record the global-batch mean loss (one scalar all-reduce per
            step; the gradient stays the shard's own) instead of this rank's shard loss,
            so every rank records the same curve and stops together on a non-finite loss.
        checkpoint_store: builds the loop's `CheckpointStore` from the list that will hold
            the `MoDa` handle once the model exists (the loop's single-file checkpoint
            cannot hold per-rank expert shards, so a checkpoint needs one).
        run_config, checkpoint_format, resume, overwrite, stop_at: as `train_loop`'s.
    """
    if config.checkpoint is not None and checkpoint_store is None:
        raise ValueError("train_moda does not write the loop's single-file checkpoints: "
                         "pass a checkpoint_store (expert shards differ per rank)")
    W, r = groups.world.world_size, groups.rank
    handle: list[MoDa] = []
    step = [0]

    def build() -> nn.Module:
        moda = moda_parallel(build_model(), groups, expert_config)
        if precision is not None:
            precision.apply(moda.model)
        handle.append(moda)
        return moda.model

    def shard_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch
        if x.shape[0] % W:
            raise ValueError(f"a global batch of {x.shape[0]} rows does not split into "
                             f"{W} equal shards")
        b = x.shape[0] // W
        local = loss(model, (x[r * b:(r + 1) * b], y[r * b:(r + 1) * b]))
        step[0] += 1
        if not report_global_loss or W == 1:
            return local
        # float64 so the sum over ranks does not round
        total = groups.world.all_reduce(local.detach().double().reshape(1).clone())
        global_mean = (total[0] / W).to(local.dtype)
        return local + (global_mean - local.detach())

    def after_backward(model: nn.Module) -> None:
        if gradient_hook is not None:
            gradient_hook(handle[-1], step[0])
        handle[-1].reduce_gradients()

    hooks = TrainHooks(after_backward=after_backward,
                       clip_gradients=lambda model, norm: _clip(handle[-1], norm))
    loop_loss: Callable[[nn.Module, Batch], torch.Tensor] = shard_loss
    if precision is not None:
        hooks = precision.hooks(hooks)
        loop_loss = precision.wrap_loss(shard_loss)
    return train_loop(config, build_model=build, batches=global_batches, loss=loop_loss,
                      result=result, hooks=hooks, progress=progress, run_config=run_config,
                      checkpoint_format=checkpoint_format, resume=resume, overwrite=overwrite,
                      stop_at=stop_at,
                      checkpoint_store=(checkpoint_store(handle) if checkpoint_store
                                        is not None else None))


def _clip(moda: MoDa, max_norm: float) -> None:
    moda.clip_gradients(max_norm)
