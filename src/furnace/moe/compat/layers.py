"""FastMoE's `FMoE` layer (`fmoe.layers`, FastMoE v1.1) on furnace's `MoELayer`.

`FMoE` takes FastMoE's arguments in FastMoE's order and builds a furnace `MoELayer`:
the gate is called as FastMoE calls it (``gate(d_model, num_expert, world_size, top_k)``,
plus ``gate_bias`` for `NaiveGate` subclasses) and its ``(idx, score)`` output is combined
as FastMoE does (``y_t = sum_k score_tk * expert_{idx_tk}(x_t)``, dropped ids -1 adding
nothing). Expert parallelism is furnace's (`furnace.moe.expert_parallel`, FasterMoE
sections 4.1-4.2), applied in the constructor when ``world_size > 1``.

Construction builds only this rank's experts: global expert e (= rank * num_expert + i)
is initialised from its own seed, derived from one base seed drawn from torch's global
generator, so every rank seeded alike gets the experts a single process with
``num_expert * world_size`` experts would have.

Shape suffixes: T tokens, D d_model, K top_k, E experts per worker.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from furnace.runtime.comm import Communicator

from .. import gates as _native_gates
from ..config import ExpertParallelConfig
from ..experts import ExpertBank, ModuleExperts, draw_base_seed, expert_seed, seeded
from ..gates.base import GateOutput, as_gate_output
from ..layer import MoELayer, combine, local_moe, sort_assignments
from ..parallel import ddp_ignore_experts, expert_parallel
from .experts import FusedExperts
from .gates import NaiveGate

__all__ = ["FMoE", "mark_module_parallel_comm"]


def mark_module_parallel_comm(module: nn.Module, comm: str) -> None:
    """FastMoE's marker: every parameter of ``module`` gets ``dp_comm = comm``.

    `DistributedGroupedDataParallel` reduces a parameter's gradient over the group named
    by its ``dp_comm`` ("dp" when unmarked, "gate", "world", "moe"; any other name, such
    as "none", leaves it local).
    """
    for p in module.parameters():
        p.dp_comm = comm  # type: ignore[attr-defined]  # FastMoE's mark on the tensor


_UNSUPPORTED = {
    "mp_group": "slicing a replicated batch over a model-parallel group is not supported; "
                "give each rank its own tokens (the default)",
    "slice_group": "slicing a replicated batch over a model-parallel group is not supported; "
                   "give each rank its own tokens (the default)",
    "mask": "masking tokens out of routing is not supported; run the layer on the kept "
            "tokens, e.g. layer(x[mask == 0]), and fill the others yourself",
    "mask_dict": "masking tokens out of routing is not supported; run the layer on the kept "
                 "tokens, e.g. layer(x[mask == 0]), and fill the others yourself",
}


def _resolve_group(moe_group: Any, world_size: int) -> Communicator | None:
    """The `Communicator` to shard experts over, or None for a single-process layer."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if moe_group is None:
        if world_size == 1:
            return None
        # FastMoE's moe_group=None means the default process group
        if not dist.is_initialized():
            raise ValueError(f"world_size={world_size} with moe_group=None needs an "
                             "initialized default process group; pass moe_group or "
                             "world_size=1")
        comm = Communicator(name="moe")
    elif isinstance(moe_group, Communicator):
        comm = moe_group
    elif isinstance(moe_group, dist.ProcessGroup):
        comm = Communicator(moe_group, name="moe")
    else:
        raise ValueError("moe_group must be a furnace.runtime.Communicator, a torch "
                         f"ProcessGroup or None, got {type(moe_group).__name__}")
    if comm.world_size != world_size:
        raise ValueError(f"world_size={world_size} but moe_group has {comm.world_size} ranks; "
                         "they must match (num_expert counts experts per rank)")
    return comm


def _build_gate(gate: Any, d_model: int, num_expert: int, world_size: int, top_k: int,
                gate_bias: bool) -> nn.Module:
    """The gate from FastMoE's ``gate=``: a class or factory called as FastMoE calls it."""
    if isinstance(gate, str):
        # furnace's own gates by name; they return a GateOutput, which the layer accepts
        return _native_gates.make_gate(gate, d_model, num_expert * world_size, top_k,
                                       bias=gate_bias)
    if isinstance(gate, type) and issubclass(gate, _native_gates.BaseGate):
        raise ValueError(f"gate={gate.__name__} is a furnace gate class, which takes the "
                         "global expert count; pass the furnace.moe.compat.gates class of "
                         f"that name or a gate name from {sorted(_native_gates.GATES)}")
    if isinstance(gate, type) and issubclass(gate, NaiveGate):
        built = gate(d_model, num_expert, world_size, top_k, gate_bias=gate_bias)
    elif callable(gate):
        if gate_bias is not True:
            # FastMoE ignores gate_bias here; ignoring a False would be a silent change
            raise ValueError("gate_bias=False only applies to NaiveGate and its subclasses "
                             f"(got gate={gate!r}); set the bias in the gate itself")
        built = gate(d_model, num_expert, world_size, top_k)
    else:
        raise ValueError(f"gate must be a gate class or factory, got {gate!r}")
    if not isinstance(built, nn.Module):
        raise ValueError(f"the gate factory returned {type(built).__name__}, not an nn.Module")
    return built


def _scalar_loss(loss: Any) -> torch.Tensor | None:
    if loss is None:
        return None
    loss = torch.as_tensor(loss)
    return loss.reshape(()) if loss.numel() == 1 else loss


class FMoE(MoELayer):
    """FastMoE's `FMoE(num_expert=32, d_model=1024, world_size=1, mp_group=None,
    slice_group=None, moe_group=None, top_k=2, gate=NaiveGate, expert=None, gate_hook=None,
    mask=None, mask_dict=None, gate_bias=True)`.

    Args (FastMoE's):
        num_expert: experts per worker; the layer has ``num_expert * world_size``.
        d_model: token width.
        world_size: workers of the expert-parallel group.
        mp_group, slice_group, mask, mask_dict: unsupported (ValueError naming the
            alternative) unless None.
        moe_group: the expert-parallel group (a torch ``ProcessGroup`` or a furnace
            ``Communicator``); None means the default group when ``world_size > 1``.
        top_k: experts per token.
        gate: a gate class or factory (see `furnace.moe.compat.gates`), or a
            furnace gate name (`furnace.moe.gates.GATES`).
        expert: a module class built as ``expert(d_model)`` once per local expert, or a
            list of classes (one per local expert; ``num_expert`` becomes its length).
            Experts are called as FastMoE calls them, ``expert(x, count)``. None builds
            FastMoE's fused MLP experts (``d_hidden``, ``activation``).
        gate_hook: called as ``gate_hook(idx, score, None)`` after the gate.
        gate_bias: whether a `NaiveGate`-family scorer has a bias.

    Furnace's keyword-only additions:
        d_hidden: hidden width of the fused experts built for ``expert=None`` (default
            4 * d_model; FastMoE leaves ``experts`` to a subclass there).
        activation: their activation (any callable, or "gelu" / "relu" / "silu").
        parallel_config: `ExpertParallelConfig` (FastMoE's ``FMOE_FASTER_*`` switches).

    With ``world_size > 1`` every expert parameter is marked ``dp_comm = "none"`` (FastMoE
    marks them only in `FMoETransformerMLP`; unmarked, its data-parallel wrapper would
    average different experts) and the gate's ``"gate"``. ``self.experts`` may be
    replaced after construction, as FastMoE's tests do, by an `ExpertBank` of
    ``num_expert`` experts (e.g. ``furnace.moe.compat.transformer._Expert``), an
    ``nn.ModuleList`` of expert modules, or (one worker only) any module called as
    ``experts(x, fwd_expert_count)``.
    """

    def __init__(self, num_expert: int = 32, d_model: int = 1024, world_size: int = 1,
                 mp_group: Any = None, slice_group: Any = None, moe_group: Any = None,
                 top_k: int = 2, gate: Any = NaiveGate, expert: Any = None,
                 gate_hook: Callable | None = None, mask: Any = None, mask_dict: Any = None,
                 gate_bias: bool = True, *, d_hidden: int | None = None,
                 activation: Any = "gelu",
                 parallel_config: ExpertParallelConfig | None = None) -> None:
        for name, value in (("mp_group", mp_group), ("slice_group", slice_group),
                            ("mask", mask), ("mask_dict", mask_dict)):
            if value is not None:
                raise ValueError(f"{name}= is not supported by furnace.moe.compat: "
                                 f"{_UNSUPPORTED[name]}")
        if type(self).expert_fn is not FMoE.expert_fn or (
                type(self).expert_fn_single is not FMoE.expert_fn_single):
            raise NotImplementedError("overriding FMoE.expert_fn is not supported: furnace "
                                      "runs the experts itself; pass expert= a module class "
                                      "or assign an ExpertBank to self.experts")
        comm = _resolve_group(moe_group, world_size)
        if parallel_config is not None and comm is None:
            raise ValueError("parallel_config configures expert parallelism; it needs "
                             "moe_group or world_size > 1")
        if isinstance(expert, list):
            classes = list(expert)
            num_expert = len(classes)
        elif expert is not None:
            if not callable(expert):
                raise ValueError(f"expert must be a module class or a list of them, "
                                 f"got {expert!r}")
            classes = [expert] * num_expert if isinstance(num_expert, int) else []
        if not isinstance(num_expert, int) or isinstance(num_expert, bool) or num_expert < 1:
            raise ValueError(f"num_expert (experts per worker) must be an int >= 1, "
                             f"got {num_expert!r}")
        rank = comm.rank if comm is not None else 0
        first = rank * num_expert
        base_seed = draw_base_seed()
        if expert is None:
            bank: ExpertBank = FusedExperts(num_expert, d_model,
                                            4 * d_model if d_hidden is None else d_hidden,
                                            activation, first_expert=first, init_seed=base_seed)
        else:
            if d_hidden is not None:
                raise ValueError("d_hidden only applies to the fused experts of expert=None")
            modules = [seeded(expert_seed(base_seed, first + i), partial(cls, d_model))
                       for i, cls in enumerate(classes)]
            bank = ModuleExperts(modules, d_model, first_expert=first, call_with_count=True)
        built_gate = _build_gate(gate, d_model, num_expert, world_size, top_k, gate_bias)
        MoELayer.__init__(self, d_model=d_model, num_experts=num_expert * world_size,
                          top_k=top_k, gate=built_gate, experts=bank)
        # FastMoE's attributes, for code that reads them
        self.num_expert = num_expert
        self.world_size = world_size
        self.slice_group = None
        self.slice_size = 1
        self.slice_rank = 0
        self.gate_hook = gate_hook
        self.mask = None
        self.mask_dict = None
        self.moe_group = moe_group
        self.experts_fused = expert is None
        self._moe_rank = rank
        if world_size > 1:
            self.mark_parallel_comm("none")
        self._adopting = True
        if comm is not None:
            expert_parallel(self, comm, parallel_config)

    # -- FastMoE's methods -----------------------------------------------------------------

    def mark_parallel_comm(self, expert_dp_comm: str = "none") -> None:
        """FastMoE's marker: experts get ``dp_comm = expert_dp_comm``, the gate "gate"."""
        if self.experts is not None:
            mark_module_parallel_comm(self.experts, expert_dp_comm)
        mark_module_parallel_comm(self.gate, "gate")

    def expert_fn(self, inp: torch.Tensor, fwd_expert_count: torch.Tensor) -> torch.Tensor:
        """FastMoE's call of the local experts on rows sorted by local expert."""
        counts = fwd_expert_count.reshape(-1).tolist() if isinstance(
            fwd_expert_count, torch.Tensor) else list(fwd_expert_count)
        if isinstance(self.experts, ExpertBank):
            return ExpertBank.forward(self.experts, inp, counts)
        return self.experts(inp, fwd_expert_count)

    def expert_fn_single(self, inp: torch.Tensor, fwd_expert_count: torch.Tensor,
                         idx: int) -> torch.Tensor:
        """FastMoE's call of one local expert."""
        return self.experts.run_local(idx, inp)

    # -- furnace's hooks -------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        adopting = name == "experts" and self.__dict__.get("_adopting", False)
        if adopting:
            value = self._adopt_experts(value)
        super().__setattr__(name, value)
        if adopting and self.parallel is not None:
            # the new parameters replace the old ones in DDP's ignore list
            names = getattr(self, "_ddp_params_and_buffers_to_ignore", [])
            self._ddp_params_and_buffers_to_ignore = [
                n for n in names if not n.startswith("experts.")]
            ddp_ignore_experts(self)

    def _adopt_experts(self, value: Any) -> nn.Module:
        """Accept a replacement ``self.experts`` as FastMoE subclasses assign it."""
        E, first = self.num_expert, self._moe_rank * self.num_expert
        if isinstance(value, nn.ModuleList):
            value = ModuleExperts(list(value), self.d_model, first_expert=first,
                                  call_with_count=True)
        if isinstance(value, ExpertBank):
            if value.num_experts != E or value.d_model != self.d_model:
                raise ValueError(f"the new experts hold {value.num_experts} experts of width "
                                 f"{value.d_model}; this layer needs {E} of width "
                                 f"{self.d_model} on each worker")
            # a bank built by user code counts from 0; it holds this rank's experts
            value.first_expert = first
            self.__dict__["experts_fused"] = not isinstance(value, ModuleExperts)
        elif isinstance(value, nn.Module):
            if self.world_size > 1:
                raise ValueError(f"{type(value).__name__} is not a furnace ExpertBank, so it "
                                 "cannot run under expert parallelism; use expert= a module "
                                 "class, or furnace.moe.compat.transformer._Expert")
            self.__dict__["experts_fused"] = True
        else:
            raise ValueError(f"experts must be an nn.Module, got {type(value).__name__}")
        if self.world_size > 1:
            mark_module_parallel_comm(value, "none")
        return value

    @property
    def holds_all_experts(self) -> bool:
        if not isinstance(self.experts, ExpertBank):
            return True
        return super().holds_all_experts

    def forward(self, moe_inp: torch.Tensor) -> torch.Tensor:
        if not isinstance(moe_inp, torch.Tensor):
            raise TypeError("furnace.moe.compat.FMoE takes one tensor [..., d_model]; "
                            "FastMoE's nested inputs are not supported: call the layer "
                            "once per tensor")
        return super().forward(moe_inp)

    def route(self, x_TD: torch.Tensor) -> GateOutput:
        out = self.gate(x_TD)
        if isinstance(out, GateOutput):
            if self.gate_hook is not None:
                self.gate_hook(out.expert_ids_TK, out.scores_TK, None)
            return out
        if not isinstance(out, (tuple, list)) or len(out) < 2:
            raise TypeError(f"the gate returned {type(out).__name__}; FastMoE gates return "
                            "(idx, score)")
        idx, score = out[0], out[1]
        if self.gate_hook is not None:
            self.gate_hook(idx, score, None)
        loss = _scalar_loss(self.gate.loss) if getattr(self.gate, "has_loss", False) else None
        return as_gate_output(idx, score, x_TD.shape[0], self.top_k, self.num_experts, loss)

    def local_forward(self, x_TD: torch.Tensor, routing: GateOutput) -> torch.Tensor:
        if isinstance(self.experts, ExpertBank):
            return local_moe(x_TD, routing, self.experts)
        # a user's fused module, called as FastMoE calls it
        token_A, expert_A, slot_A = sort_assignments(routing)
        counts = torch.bincount(expert_A, minlength=self.num_expert)
        y_AD = self.experts(x_TD[token_A], counts.cpu())
        return combine(y_AD, token_A, slot_A, routing, x_TD.shape[0])
