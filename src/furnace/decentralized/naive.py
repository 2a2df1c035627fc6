"""The slow, obviously correct reference for decentralized training (design note
`prague.md` sections 2.1-2.2): every worker's model in one process, on the same global
tensors the distributed run uses.

* `mean_of` and `preduce_reference`: P-Reduce as the definition says, in float64.
* `replay`: the deterministic modes step by step: allreduce (one averaged gradient),
  Prague with a static schedule and blocking synchronization (step, then the k-th
  partition's group means), D-PSGD on a ring and local SGD. A distributed run of these
  with the same seeds and ``max_steps`` must end at the same models.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .config import RunConfig
from .generator import static_partitions
from .tasks import (
    build_model,
    flat_gradients,
    flat_parameters,
    load_digits_split,
    sample_batch,
    shard,
)

__all__ = ["mean_of", "preduce_reference", "replay"]


def mean_of(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The members' mean, summed in float64."""
    total = torch.zeros_like(tensors[0], dtype=torch.float64)
    for t in tensors:
        total += t.double()
    return total / len(tensors)


def preduce_reference(models: Sequence[torch.Tensor], members: Sequence[int]
                      ) -> list[torch.Tensor]:
    """Every model after P-Reduce(members): members get the mean, the rest are untouched."""
    mean = mean_of([models[m] for m in members]).to(models[0].dtype)
    return [mean.clone() if r in members else m.clone() for r, m in enumerate(models)]


def replay(config: RunConfig, steps: int) -> list[torch.Tensor]:
    """The flat parameters of every worker after ``steps`` steps of ``config``'s mode,
    computed in one process. Supports allreduce, prague with the static policy and no
    overlap, dpsgd and localsgd: the modes whose result does not depend on timing."""
    n = config.world_size
    mode = config.mode
    if mode == "prague" and (config.policy.name != "static" or config.overlap):
        raise ValueError("replay covers prague only with the static policy and no overlap")
    if mode not in ("allreduce", "prague", "dpsgd", "localsgd"):
        raise ValueError(f"mode {mode!r} depends on timing; replay cannot reproduce it")
    split = load_digits_split(seed=config.seed)
    shards = [shard(split, r, n, label_alpha=config.label_alpha, seed=config.seed)
              for r in range(n)]
    models = [build_model(config.task, config.seed, hidden=config.mlp_hidden)
              for _ in range(n)]
    flats = [flat_parameters(m) for m in models]
    grads = [flat_gradients(m) for m in models]
    optimizers = [torch.optim.SGD(m.parameters(), lr=config.lr, momentum=config.momentum)
                  for m in models]
    generators = [torch.Generator().manual_seed(config.seed * 104729 + r) for r in range(n)]
    loss_fn = nn.CrossEntropyLoss()
    partitions = static_partitions(n, config.policy.grid_rows)
    for step in range(steps):
        for r in range(n):
            x, y = sample_batch(*shards[r], config.batch_size, generators[r])
            grads[r].zero_()
            loss_fn(models[r](x), y).backward()
        if mode == "allreduce":
            mean_grad = mean_of(grads).float()
            for g in grads:
                g.copy_(mean_grad)
        for opt in optimizers:
            opt.step()
        with torch.no_grad():
            if mode == "prague":
                before = [f.clone() for f in flats]
                for members in partitions[step % len(partitions)]:
                    mean = mean_of([before[m] for m in members]).float()
                    for m in members:
                        flats[m].copy_(mean)
            elif mode == "dpsgd":
                before = [f.clone() for f in flats]
                for r in range(n):
                    flats[r].copy_(mean_of([before[(r - 1) % n], before[r],
                                            before[(r + 1) % n]]).float())
            elif mode == "localsgd" and (step + 1) % config.local_sgd_period == 0:
                mean = mean_of(flats).float()
                for f in flats:
                    f.copy_(mean)
    return [f.clone() for f in flats]
