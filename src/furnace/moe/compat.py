"""FastMoE's user-facing names (`FMoE`, `FMoETransformerMLP`, the gate classes) on furnace.

FastMoE users switch with an import change: ``from fmoe import FMoETransformerMLP`` becomes
``from furnace.moe.compat import FMoETransformerMLP``. The classes here only translate
FastMoE's constructor arguments; the layer, the gates and expert parallelism are
furnace's own (`furnace.moe.MoELayer`, `furnace.moe.gates`, `furnace.moe.expert_parallel`).

    layer = FMoETransformerMLP(num_expert=2, d_model=1024, d_hidden=4096,
                               world_size=comm.world_size, moe_group=comm, top_k=2)

Counting experts. FastMoE's ``num_expert`` counts experts *per worker*; furnace's
``num_experts`` counts them over the whole expert-parallel group. Every class here builds
``num_experts = num_expert * world_size`` global experts. With ``world_size > 1`` the
layer is sharded over ``moe_group`` (a `furnace.runtime.Communicator`, or a torch
``ProcessGroup``, which is wrapped in one); ``moe_group=None`` means the default process
group, as in FastMoE. Every rank must build the layer from the same seed, since each keeps
its slice of the same global experts.

Name map:

    FastMoE                                  furnace
    ---------------------------------------  ----------------------------------------------
    fmoe.FMoE (expert=None)                  FMoE -> MoELayer with an MLPExperts bank
    fmoe.FMoETransformerMLP                  FMoETransformerMLP -> MoETransformerMLP
    fmoe.gates.NaiveGate                     NaiveGate -> gates.NaiveGate
    fmoe.gates.NoisyGate                     NoisyGate -> gates.NoisyGate
    fmoe.gates.GShardGate                    GShardGate -> gates.GShardGate
    fmoe.gates.SwitchGate                    SwitchGate -> gates.SwitchGate
    fmoe.gates.SwipeGate                     SwipeGate -> gates.SwipeGate
    fmoe.gates.FasterGate, gen_faster_gate   FasterGate, gen_faster_gate -> gates.TopologyGate
    fmoe.gates.ZeroGate                      ZeroGate -> gates.ZeroGate
    gate kwargs topk, capacity               top_k, capacity_factor
    gate kwarg switch_eps                    SwitchGate jitter_eps (see below)
    gate kwarg gate_bias                     bias of the gate's scorer
    gate.get_loss() / gate.has_loss          the same, and layer.balance_loss after forward

Environment variables. Furnace reads none: FastMoE's switches become fields of the
`ExpertParallelConfig` passed as ``parallel_config=`` (or to `furnace.moe.expert_parallel`),
and its hardware constants come from that config's ``topology``:

    FastMoE variable                   furnace
    ---------------------------------  ----------------------------------------------------
    FMOE_FASTER_SHADOW_ENABLE=1        ExpertParallelConfig(shadowing=True)
    FMOE_FASTER_SCHEDULE_ENABLE=1      ExpertParallelConfig(smart_schedule=True)
    FMOE_FASTER_GROUP_SIZE=G           ExpertParallelConfig(group_size=G); None lets the
                                       performance model choose
    FMOE_FASTER_GLBPLC_NETBW           ExpertParallelConfig(topology=...): the bandwidth_Bps
                                       of the slowest link the group spans
    FMOE_FASTER_GLBPLC_GPUTP           topology.device.peak_flops for the experts' dtype
    FMOE_FASTER_GLBPLC_ALPHA           d_hidden / d_model, read from the layer's experts
    FMOE_FASTER_GLBPLC_DMODEL          d_model, read from the layer
    FMOE_TOPO_GPUS_PER_NODE            topology.ranks_per_node (FasterGate's node layout)
    FMOE_TOPO_OUTGOING_FRACTION        FasterGate(..., outgoing_fraction=f)

Differences that remain:

- Experts are furnace's stacked 2-layer MLP bank (`MLPExperts`, GELU, ReLU or SiLU); a
  custom ``expert`` class is refused with a ValueError rather than approximated.
- Arguments furnace does not implement (``mp_group``, ``slice_group``, ``gate_hook``,
  ``mask``, ``mask_dict``, ``expert_dp_comm`` other than "none", ``expert_rank`` other
  than 0) raise a ValueError naming the argument when given a non-default value.
- Calling a gate returns a `furnace.moe.GateOutput`, not FastMoE's ``(idx, score)`` tuple.
- SwitchGate's exploration noise multiplies the router input (the Switch Transformer
  code's jitter) where FastMoE adds noise to the logits; ``switch_eps`` sets its width.
- The performance model's element size is fixed when expert parallelism is applied, in
  the constructor; a later ``.half()`` changes the experts but only the shadowing and
  group-size decisions would use the old size (results stay exact).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from furnace.runtime.comm import Communicator

from . import gates as _gates
from .config import ExpertParallelConfig
from .experts import ACTIVATIONS
from .layer import MoELayer, MoETransformerMLP
from .parallel import expert_parallel

__all__ = [
    "FMoE",
    "FMoETransformerMLP",
    "FasterGate",
    "GShardGate",
    "NaiveGate",
    "NoisyGate",
    "SwipeGate",
    "SwitchGate",
    "ZeroGate",
    "gen_faster_gate",
]


def _global_experts(num_expert: int, world_size: int) -> int:
    if not isinstance(num_expert, int) or num_expert < 1:
        raise ValueError(f"num_expert (experts per worker) must be an int >= 1, "
                         f"got {num_expert!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    return num_expert * world_size


class _FastMoEGate:
    """FastMoE's gate constructor ``gate(d_model, num_expert, world_size, top_k)`` on top of a
    furnace gate (the second base class), plus FastMoE's ``get_loss`` / ``has_loss``.

    ``renames`` maps FastMoE keyword names to the furnace gate's; any other keyword goes to
    the furnace gate unchanged, so its own options (e.g. NoisyGate's ``w_load``) work too.
    """

    default_top_k = 2
    renames: dict[str, str] = {"gate_bias": "bias"}

    def __init__(self, d_model: int, num_expert: int, world_size: int = 1,
                 top_k: int | None = None, **kwargs: Any) -> None:
        if "topk" in kwargs:
            # FastMoE's GShardGate and SwitchGate spell it topk
            if top_k is not None:
                raise ValueError("give top_k or topk, not both")
            top_k = kwargs.pop("topk")
        native_kwargs: dict[str, Any] = {}
        for key, value in kwargs.items():
            name = self.renames.get(key, key)
            if name in native_kwargs:
                raise ValueError(f"{key!r} and {name!r} set the same option; give one")
            native_kwargs[name] = value
        super().__init__(d_model, _global_experts(num_expert, world_size),
                         self.default_top_k if top_k is None else top_k, **native_kwargs)
        # FastMoE's gate attributes, for code that reads them
        self.num_expert = num_expert
        self.world_size = world_size
        self.tot_expert = num_expert * world_size
        self.loss: torch.Tensor | None = None

    def forward(self, x_TD: torch.Tensor) -> _gates.GateOutput:
        routing = super().forward(x_TD)
        self.loss = routing.balance_loss
        return routing

    def get_loss(self, clear: bool = True) -> torch.Tensor | None:
        """The balance loss of the last forward (None before any); ``clear`` forgets it."""
        loss = self.loss
        if clear:
            self.loss = None
        return loss

    @property
    def has_loss(self) -> bool:
        return self.loss is not None


class NaiveGate(_FastMoEGate, _gates.NaiveGate):
    """FastMoE's `NaiveGate`: top-k of a linear scorer, softmax over the k selected logits."""


class NoisyGate(_FastMoEGate, _gates.NoisyGate):
    """FastMoE's `NoisyGate`: Shazeer et al.'s noisy top-k gating."""


class GShardGate(_FastMoEGate, _gates.GShardGate):
    """FastMoE's `GShardGate`: top-2 with GShard's capacity and random routing."""

    renames = {"gate_bias": "bias", "capacity": "capacity_factor"}


class SwitchGate(_FastMoEGate, _gates.SwitchGate):
    """FastMoE's `SwitchGate`: top-1 with capacity; ``switch_eps`` is the jitter width."""

    default_top_k = 1
    renames = {"gate_bias": "bias", "capacity": "capacity_factor", "switch_eps": "jitter_eps"}


class SwipeGate(_FastMoEGate, _gates.SwipeGate):
    """FastMoE's `SwipeGate`: BaGuaLu's balanced, drop-free assignment."""


class FasterGate(_FastMoEGate, _gates.TopologyGate):
    """FastMoE's `FasterGate`, furnace's `TopologyGate`: caps the tokens sent across nodes.

    FastMoE takes the node rank as an argument and the node size from
    ``FMOE_TOPO_GPUS_PER_NODE``; here both come from the expert-parallel group and
    ``ExpertParallelConfig.topology.ranks_per_node`` when expert parallelism is applied.
    """


class ZeroGate(_FastMoEGate, _gates.ZeroGate):
    """FastMoE's `ZeroGate`: every token to the first ``top_k`` experts (for tests)."""


def gen_faster_gate(rank: int) -> Callable[..., FasterGate]:
    """FastMoE's `gen_faster_gate(rank)`: a gate factory for `FMoE`'s ``gate=`` argument.

    ``rank`` is accepted and unused: furnace's gate learns its rank, and from it its node,
    from the expert-parallel group.
    """
    del rank

    def make(d_model: int, num_expert: int, world_size: int, top_k: int = 2,
             **kwargs: Any) -> FasterGate:
        return FasterGate(d_model, num_expert, world_size, top_k, **kwargs)

    return make


def _build_gate(gate: Any, d_model: int, num_expert: int, world_size: int, top_k: int,
                gate_bias: bool) -> _gates.BaseGate:
    """A gate from FastMoE's ``gate=`` argument: a compat class, a factory or a GATES name."""
    if isinstance(gate, str):
        return _gates.make_gate(gate, d_model, _global_experts(num_expert, world_size), top_k,
                                bias=gate_bias)
    if isinstance(gate, type) and issubclass(gate, _FastMoEGate):
        return gate(d_model, num_expert, world_size, top_k, gate_bias=gate_bias)
    if isinstance(gate, type) and issubclass(gate, _gates.BaseGate):
        # furnace's own classes take the global expert count, not FastMoE's arguments
        raise ValueError(f"gate={gate.__name__} is a furnace gate class; pass the "
                         "furnace.moe.compat class of that name or a gate name "
                         f"from {sorted(_gates.GATES)}")
    if not callable(gate):
        raise ValueError(f"gate must be a gate class, a factory or a gate name, got {gate!r}")
    if gate_bias is not True:
        raise ValueError("gate_bias=False only applies to furnace.moe.compat gate classes and "
                         "gate names; a custom gate factory sets its own bias")
    built = gate(d_model, num_expert, world_size, top_k)
    if not isinstance(built, _gates.BaseGate):
        raise ValueError(f"the gate factory returned {type(built).__name__}, "
                         "not a furnace.moe.gates.BaseGate")
    return built


def _activation_name(activation: Any) -> str:
    """FastMoE's activation (a module, a function or a name) as an `MLPExperts` name."""
    if isinstance(activation, str):
        if activation.lower() in ACTIVATIONS:
            return activation.lower()
    elif isinstance(activation, nn.GELU):
        # the tanh approximation is a different function; refuse it rather than change it
        if activation.approximate == "none":
            return "gelu"
    elif isinstance(activation, nn.ReLU):
        return "relu"
    elif isinstance(activation, nn.SiLU):
        return "silu"
    else:
        for func, name in ((F.gelu, "gelu"), (F.relu, "relu"), (torch.relu, "relu"),
                           (F.silu, "silu")):
            if activation is func:
                return name
    raise ValueError(f"unsupported activation {activation!r}: furnace's experts support "
                     "nn.GELU() (exact), nn.ReLU(), nn.SiLU(), their functional forms, "
                     f"or a name in {sorted(ACTIVATIONS)}")


def _check_unsupported(**given: Any) -> None:
    """Refuse FastMoE arguments furnace does not implement, rather than ignore them."""
    defaults = {"mp_group": None, "slice_group": None, "gate_hook": None, "mask": None,
                "mask_dict": None, "expert_dp_comm": "none", "expert_rank": 0}
    reasons = {
        "mp_group": "furnace does not split the batch over a model-parallel group",
        "slice_group": "furnace does not split the batch over a model-parallel group",
        "gate_hook": "furnace's layer has no gate hook; wrap the gate module instead",
        "mask": "furnace's layer does not mask tokens out of routing",
        "mask_dict": "furnace's layer does not mask tokens out of routing",
        "expert_dp_comm": "furnace does not tag expert parameters for a data-parallel "
                          "wrapper; reduce expert gradients yourself if experts are "
                          "replicated",
        "expert_rank": "furnace's experts are not split over a model-parallel group",
    }
    for name, value in given.items():
        default = defaults[name]
        unchanged = value is None if default is None else value == default
        if not unchanged:
            raise ValueError(f"{name}={value!r} is not supported by furnace.moe.compat: "
                             f"{reasons[name]} (leave it at {default!r})")


def _resolve_group(moe_group: Any, world_size: int) -> Communicator | None:
    """The `Communicator` to shard experts over, or None for a single-process layer."""
    if moe_group is None:
        if world_size == 1:
            return None
        # FastMoE's moe_group=None means the default process group
        if not dist.is_initialized():
            raise ValueError(f"world_size={world_size} with moe_group=None needs an "
                             "initialized default process group; pass moe_group or "
                             "world_size=1")
        comm = Communicator()
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


class FMoE(MoELayer):
    """FastMoE's `FMoE` with furnace's MLP expert bank (FastMoE's ``expert=None`` case).

    Args (FastMoE's, in its order):
        num_expert: experts per worker; the layer has ``num_expert * world_size``.
        d_model: token width.
        world_size: ranks of the expert-parallel group.
        mp_group, slice_group: unsupported; must be None.
        moe_group: the expert-parallel group (`Communicator` or ``ProcessGroup``); None
            means the default process group when ``world_size > 1``.
        top_k: experts per token.
        gate: a `furnace.moe.compat` gate class, a factory called as
            ``gate(d_model, num_expert, world_size, top_k)`` returning a furnace gate, or a
            name from `furnace.moe.gates.GATES`.
        expert: must be None: furnace's experts are a stacked MLP bank, not per-expert
            modules.
        gate_hook, mask, mask_dict: unsupported; must be None.
        gate_bias: whether the gate's scorer has a bias.

    Furnace's keyword-only additions:
        d_hidden: the experts' hidden width (default 4 * d_model).
        activation: the experts' activation (see `FMoETransformerMLP`).
        parallel_config: `ExpertParallelConfig` for the sharded layer (FastMoE's
            ``FMOE_FASTER_*`` variables); needs expert parallelism.

    The forward takes any shape [..., d_model] and returns the same shape.
    """

    def __init__(self, num_expert: int = 32, d_model: int = 1024, world_size: int = 1,
                 mp_group: Any = None, slice_group: Any = None, moe_group: Any = None,
                 top_k: int = 2, gate: Any = NaiveGate, expert: Any = None,
                 gate_hook: Any = None, mask: Any = None, mask_dict: Any = None,
                 gate_bias: bool = True, *, d_hidden: int | None = None,
                 activation: Any = "gelu",
                 parallel_config: ExpertParallelConfig | None = None) -> None:
        if expert is not None:
            raise ValueError("expert= is not supported: furnace's experts are a stacked MLP "
                             "bank (set d_hidden and activation instead of an expert class)")
        _check_unsupported(mp_group=mp_group, slice_group=slice_group, gate_hook=gate_hook,
                           mask=mask, mask_dict=mask_dict)
        num_experts = _global_experts(num_expert, world_size)
        comm = _resolve_group(moe_group, world_size)
        if parallel_config is not None and comm is None:
            raise ValueError("parallel_config configures expert parallelism; it needs "
                             "moe_group or world_size > 1")
        activation_name = _activation_name(activation)
        built_gate = _build_gate(gate, d_model, num_expert, world_size, top_k, gate_bias)
        super().__init__(d_model=d_model, num_experts=num_experts, top_k=top_k,
                         d_hidden=4 * d_model if d_hidden is None else d_hidden, gate=built_gate,
                         activation=activation_name)
        self.num_expert = num_expert
        self.world_size = world_size
        if comm is not None:
            expert_parallel(self, comm, parallel_config)


class FMoETransformerMLP(FMoE, MoETransformerMLP):
    """FastMoE's `FMoETransformerMLP`: ``num_expert`` MLP experts H -> d_hidden -> H per worker.

    Args:
        num_expert, d_model, d_hidden: as FastMoE (``num_expert`` per worker).
        activation: ``nn.GELU()`` (exact), ``nn.ReLU()``, ``nn.SiLU()``, their functional
            forms, or "gelu" / "relu" / "silu"; anything else raises ValueError.
        expert_dp_comm: must be "none" (the default).
        expert_rank: must be 0 (the default).
        **kwargs: `FMoE`'s other arguments (world_size, moe_group, top_k, gate,
            gate_bias, parallel_config, and the unsupported ones, which must keep their
            defaults).

    It is both an `FMoE` and a furnace `MoETransformerMLP`.
    """

    def __init__(self, num_expert: int = 32, d_model: int = 1024, d_hidden: int = 4096,
                 activation: Any = "gelu", expert_dp_comm: str = "none", expert_rank: int = 0,
                 **kwargs: Any) -> None:
        _check_unsupported(expert_dp_comm=expert_dp_comm, expert_rank=expert_rank)
        super().__init__(num_expert, d_model, d_hidden=d_hidden, activation=activation,
                         **kwargs)
