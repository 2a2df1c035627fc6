"""The single-process oracle for MoDa (BaGuaLu, PPoPP'22): the same MoE model trained in
one process on the whole global batch, every expert local, no communication.

MoDa on W ranks must give, step after step, the gradients and parameters this gives
(`furnace.hybrid.moda` derives why). The reference records, per step, the global-batch
loss, every gradient and every parameter after the optimizer step, keyed by parameter
name; a MoDa rank's expert shard is compared with the matching slice (expert dimension
first) of the reference's tensor. Run it in float64 for the strictest comparison: the
parallel path only reorders sums.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["ReferenceStep", "lm_loss", "reference_training"]

LossFn = Callable[[nn.Module, tuple[torch.Tensor, torch.Tensor]], torch.Tensor]
MakeOptimizer = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass
class ReferenceStep:
    """One optimizer step of the reference.

    Attributes:
        loss: the loss on the global batch, before the step.
        grads: parameter name -> gradient of that loss (zeros for an unused parameter).
        params: parameter name -> value after the optimizer step.
    """

    loss: float
    grads: dict[str, torch.Tensor]
    params: dict[str, torch.Tensor]


def lm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The loss a `furnace.moe.MoETransformerLM` returns for ``(inputs, targets)``."""
    _, loss = model(*batch)
    if loss is None:
        raise ValueError("the model returned no loss for a batch with targets")
    assert isinstance(loss, torch.Tensor)
    return loss


def reference_training(model: nn.Module,
                       global_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                       make_optimizer: MakeOptimizer, *,
                       loss: LossFn = lm_loss) -> list[ReferenceStep]:
    """Train ``model`` (in place, every expert local) one step per global batch.

    Args:
        model: the model, as every MoDa rank builds it before `moda_parallel`.
        global_batches: the whole batch of each step (every rank's shard together).
        make_optimizer: builds the optimizer over the parameters (the same factory the
            MoDa ranks use, e.g. ``lambda ps: torch.optim.AdamW(ps, lr=1e-2)``).
        loss: the loss of a batch (default: the MoE LM's mean cross-entropy).
    """
    optimizer = make_optimizer(model.parameters())
    out = []
    for batch in global_batches:
        optimizer.zero_grad(set_to_none=True)
        value = loss(model, batch)
        value.backward()  # type: ignore[no-untyped-call]
        grads = {name: (p.grad.detach().clone() if p.grad is not None
                        else torch.zeros_like(p.detach()))
                 for name, p in model.named_parameters()}
        optimizer.step()
        params = {name: p.detach().clone() for name, p in model.named_parameters()}
        out.append(ReferenceStep(loss=float(value.detach()), grads=grads, params=params))
    return out
