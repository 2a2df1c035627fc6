"""FastMoE's `DistributedGroupedDataParallel` (`fmoe.distributed`, FastMoE v1.1): data
parallelism that reduces each parameter's gradient over the group its ``dp_comm`` names.

Expert parallelism (FastMoE, and FasterMoE section 2) shards the experts, so the usual
data-parallel wrapper is wrong for them: torch's DDP broadcasts rank 0's parameters at
construction and averages every gradient, overwriting each rank's experts with rank 0's.
FastMoE tags parameters instead (`mark_module_parallel_comm`): "dp" (the default for an
untagged parameter: dense layers), "gate", "world" and "moe" are reduced over the group of
that name; any other tag, "none" for sharded experts, stays local.

    model = DistributedGroupedDataParallel(model)          # groups default to the world
    loss.backward()
    model.allreduce_gradients()                            # after every backward

Beyond FastMoE, the constructor checks that no expert is averaged with a different one:
for an expert-parallel layer, every rank of the group that reduces its experts must hold
the same experts (replicas); a layer that holds every expert on every rank must reduce
them (tagging them "none" would let the replicas drift apart). It also raises on an
unknown keyword (FastMoE ignores anything not ending in ``_group``) and, before each
reduce, on ranks that disagree about how many gradient elements a group reduces.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from furnace.runtime.comm import Communicator

from ..layer import MoELayer

__all__ = ["DistributedGroupedDataParallel"]

_DEFAULT_GROUPS = ("dp", "gate", "moe", "world")


def _as_comm(group: Any, name: str) -> Communicator:
    if isinstance(group, Communicator):
        return group
    if group is None or isinstance(group, dist.ProcessGroup):
        return Communicator(group, name=name)
    raise ValueError(f"{name}_group must be a torch ProcessGroup, a furnace Communicator or "
                     f"None (the default group), got {type(group).__name__}")


def _tag(p: torch.Tensor) -> str:
    return getattr(p, "dp_comm", "dp")


class DistributedGroupedDataParallel(nn.Module):
    """FastMoE's `DistributedGroupedDataParallel(module, auto_allreduce=False,
    need_sync=True, **kwargs)`.

    Args:
        module: the model; its parameters' ``dp_comm`` tags choose their groups.
        auto_allreduce: must be False (FastMoE has no automatic reduce either); call
            `allreduce_gradients` after backward.
        need_sync: broadcast every reduced parameter from the first rank of its group
            now, so the replicas start equal (experts tagged "none" are left alone).
        **kwargs: ``<name>_group`` = a torch ``ProcessGroup`` or furnace ``Communicator``
            for the tag ``<name>``; "dp", "gate", "moe" and "world" default to the
            default process group.
    """

    def __init__(self, module: nn.Module, auto_allreduce: bool = False, need_sync: bool = True,
                 **kwargs: Any) -> None:
        if auto_allreduce:
            raise ValueError("auto_allreduce=True is not implemented (nor in FastMoE): call "
                             "model.allreduce_gradients() after each backward")
        super().__init__()
        self.module = module
        self.comms: dict[str, Communicator] = {}
        for key, group in kwargs.items():
            if not key.endswith("_group"):
                raise TypeError(f"unexpected keyword {key!r}: groups are passed as "
                                "<name>_group=..., e.g. dp_group=")
            self.comms[key[:-len("_group")]] = _as_comm(group, key[:-len("_group")])
        for name in _DEFAULT_GROUPS:
            if name not in self.comms:
                self.comms[name] = Communicator(name=name)
        self._check_experts()
        if need_sync:
            self._sync_params()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def _groups(self, with_grads: bool) -> dict[tuple[str, torch.dtype], list[nn.Parameter]]:
        groups: dict[tuple[str, torch.dtype], list[nn.Parameter]] = {}
        for p in self.module.parameters():
            if with_grads and (not p.requires_grad or p.grad is None):
                continue
            if _tag(p) in self.comms:
                groups.setdefault((_tag(p), p.dtype), []).append(p)
        return groups

    def allreduce_gradients(self, no_scale: bool = False, reduce_after: bool = False,
                            fp32_allreduce: bool = False) -> None:
        """Average (``no_scale``: sum) every gradient over its tag's group.

        ``reduce_after`` divides after the sum rather than before; ``fp32_allreduce``
        sums in float32 whatever the gradients' dtype (FastMoE's options).
        """
        for (tag, dtype), params in self._groups(with_grads=True).items():
            comm = self.comms[tag]
            # _groups(with_grads=True) keeps the parameters that have a gradient
            grads = [p.grad for p in params if p.grad is not None]
            flat = torch.cat([g.reshape(-1) for g in grads])
            self._check_sizes(comm, tag, flat.numel())
            if fp32_allreduce and dtype != torch.float32:
                flat = flat.float()
            if not no_scale and not reduce_after:
                flat /= comm.world_size
            comm.all_reduce(flat)
            if not no_scale and reduce_after:
                flat /= comm.world_size
            for g, part in zip(grads, torch.split(flat, [g.numel() for g in grads])):
                g.copy_(part.reshape(g.shape))

    def allreduce_params(self, *args: Any, **kwargs: Any) -> None:
        """FastMoE's alias of `allreduce_gradients`."""
        self.allreduce_gradients(*args, **kwargs)

    def _sync_params(self) -> None:
        with torch.no_grad():
            for (tag, _), params in self._groups(with_grads=False).items():
                flat = torch.cat([p.detach().reshape(-1) for p in params])
                self.comms[tag].broadcast(flat, src=0)
                for p, part in zip(params, torch.split(flat, [p.numel() for p in params])):
                    p.copy_(part.reshape(p.shape))

    @staticmethod
    def _check_sizes(comm: Communicator, tag: str, numel: int) -> None:
        sizes = comm.all_gather(torch.tensor([numel], dtype=torch.int64, device=comm.device))
        if len(set(sizes.tolist())) > 1:
            raise RuntimeError(f"the ranks of group {tag!r} have {sizes.tolist()} gradient "
                               "elements to reduce (some parameters have no gradient on some "
                               "ranks); give every rank the same parameters with gradients")

    def _check_experts(self) -> None:
        """Refuse groupings that would average different experts or let replicas diverge."""
        for name, layer in self.module.named_modules():
            if not isinstance(layer, MoELayer):
                continue
            tags = {_tag(p) for p in layer.experts.parameters()}
            where = name or "the model"
            if layer.parallel is None:
                unreduced = sorted(t for t in tags if t not in self.comms)
                if unreduced and self.comms["dp"].world_size > 1:
                    raise ValueError(
                        f"{where} holds every expert on every rank, but its expert "
                        f"parameters are marked dp_comm={unreduced[0]!r}, so the replicas "
                        "would drift apart: build FMoETransformerMLP with "
                        "expert_dp_comm='dp' or call layer.mark_parallel_comm('dp')")
                continue
            for tag in sorted(t for t in tags if t in self.comms):
                comm = self.comms[tag]
                mine = torch.tensor([[layer.experts.first_expert, layer.experts.num_experts]],
                                    dtype=torch.int64, device=comm.device)
                held = comm.all_gather(mine).tolist()
                if any(h != held[0] for h in held):
                    raise ValueError(
                        f"{where} is expert-parallel and its expert parameters are marked "
                        f"dp_comm={tag!r}, but the ranks of that group hold different "
                        f"experts ({[tuple(h) for h in held]} as (first, count)): reducing "
                        "would average different experts. Mark them 'none' "
                        "(layer.mark_parallel_comm('none')) or pass a <tag>_group whose "
                        "ranks hold replicas")
