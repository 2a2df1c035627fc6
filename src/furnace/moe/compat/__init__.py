"""FastMoE's API (laekov/fastmoe v1.1: He et al. 2021, arXiv:2103.13262) on furnace's MoE.

FastMoE user code switches by changing its import lines only:

    import fmoe                                  ->  import furnace.moe.compat as fmoe
    from fmoe import FMoETransformerMLP          ->  from furnace.moe.compat import ...
    from fmoe.gates import NaiveGate             ->  from furnace.moe.compat.gates import ...
    from fmoe.transformer import _Expert         ->  from furnace.moe.compat.transformer ...
    from fmoe.distributed import DistributedGroupedDataParallel
                                                 ->  from furnace.moe.compat.distributed ...

The modules mirror FastMoE's: `layers` (`FMoE`, `mark_module_parallel_comm`),
`transformer` (`FMoETransformerMLP`, `_Expert`), `linear` (`FMoELinear`), `gates` (every
gate, `BaseGate`, `gen_faster_gate`) and `distributed` (`DistributedGroupedDataParallel`).
Constructors take FastMoE's arguments in FastMoE's order with its defaults; gates return
FastMoE's ``(idx, score)``; parameter names and shapes are FastMoE's, so its checkpoints
load (``gate.gate.weight``, ``experts.htoh4.weight`` [num_expert, d_hidden, d_model], and
v1.1's per-expert ``experts.<i>.htoh4.weight`` [1, d_hidden, d_model]). The layer, expert
parallelism and FasterMoE's optimizations underneath are furnace's (`furnace.moe`).

    layer = FMoETransformerMLP(num_expert=2, d_model=1024, d_hidden=4096,
                               world_size=comm.world_size, moe_group=comm, top_k=2)
    model = DistributedGroupedDataParallel(model)     # not torch DDP: see below
    ...; loss.backward(); model.allreduce_gradients()

Counting experts. ``num_expert`` counts experts per worker, as in FastMoE; the layer has
``num_expert * world_size`` (furnace's ``num_experts``). With ``world_size > 1`` it is
sharded over ``moe_group`` (a torch ``ProcessGroup`` or a furnace ``Communicator``; None
means the default group). Each rank builds only its own experts; global expert e is
initialised from a seed of its own, derived from one draw of torch's global generator,
so ranks seeded alike get the experts one process with all of them would have.

Data parallelism. Do not wrap an expert-parallel model in torch's
``DistributedDataParallel`` as is: it broadcasts rank 0's parameters at construction and
averages every gradient, overwriting every rank's experts with rank 0's. Use
`DistributedGroupedDataParallel` (FastMoE's wrapper: gradients reduced per ``dp_comm``
tag, experts tagged "none" left local), or call `furnace.moe.ddp_ignore_experts(model)`
before ``DistributedDataParallel(model)``. An expert-parallel forward inside a DDP that
synchronizes its experts raises.

Environment variables. Furnace reads none; FastMoE's switches are arguments:

    FastMoE variable                   furnace
    ---------------------------------  ----------------------------------------------------
    FMOE_FASTER_SHADOW_ENABLE=1        parallel_config=ExpertParallelConfig(shadowing=True)
    FMOE_FASTER_SCHEDULE_ENABLE=1      ExpertParallelConfig(smart_schedule=True)
    FMOE_FASTER_GROUP_SIZE=G           ExpertParallelConfig(group_size=G); None lets the
                                       performance model choose
    FMOE_FASTER_GLBPLC_NETBW           ExpertParallelConfig(topology=...): the bandwidth_Bps
                                       of the slowest link the group spans
    FMOE_FASTER_GLBPLC_GPUTP           topology.device.peak_flops for the experts' dtype
    FMOE_FASTER_GLBPLC_ALPHA, _DMODEL  read from the layer's experts
    FMOE_TOPO_GPUS_PER_NODE            FasterGate(..., gpus_per_node=G),
                                       gen_faster_gate(rank, gpus_per_node=G)
    FMOE_TOPO_OUTGOING_FRACTION        FasterGate(..., outgoing_fraction=f)

Not supported (each raises an error naming the alternative): ``mp_group`` /
``slice_group`` (give each rank its own tokens), ``mask`` / ``mask_dict`` (run the layer on
the kept tokens), nested (tree) inputs (one tensor per call), overriding
``FMoE.expert_fn`` (pass ``expert=`` or assign an `ExpertBank`), a fused ``experts``
module that is not an `ExpertBank` under expert parallelism (use ``expert=`` or
``_Expert``), ``FasterGate.policy_fn`` (use ``ExpertParallelConfig(shadowing=True)``),
``DistributedGroupedDataParallel(auto_allreduce=True)`` (call ``allreduce_gradients()``).
`fmoe.megatron` (``fmoefy``) has no counterpart.

Differences that remain: where FastMoE's CUDA kernels drop over-capacity assignments in
GPU-atomic order, furnace drops in serial order (see `gates`); `FMoE` marks expert
parameters ``dp_comm="none"`` whenever ``world_size > 1`` (FastMoE only does so in
`FMoETransformerMLP`, so its plain `FMoE` experts would be averaged across workers);
softmaxes run in float32 or wider; `FMoE` also accepts furnace gate names
(`furnace.moe.gates.GATES`) and builds fused MLP experts for ``expert=None`` (FastMoE
leaves that to a subclass). The performance model's element size is fixed when expert
parallelism is applied, in the constructor; a later ``.half()`` changes the experts but
only the shadowing and group-size decisions would use the old size (results stay exact).
"""

from __future__ import annotations

from ..parallel import ddp_ignore_experts
from . import distributed, gates, layers, linear, transformer
from .distributed import DistributedGroupedDataParallel
from .gates import (
    BaseGate,
    DCGate,
    FasterGate,
    GShardGate,
    NaiveGate,
    NoisyGate,
    SwipeGate,
    SwitchGate,
    ZeroGate,
    gen_faster_gate,
)
from .layers import FMoE, mark_module_parallel_comm
from .linear import FMoELinear
from .transformer import FMoETransformerMLP

# FastMoE's method name, as a function of the layer
mark_parallel_comm = FMoE.mark_parallel_comm

__all__ = [
    "BaseGate",
    "DCGate",
    "DistributedGroupedDataParallel",
    "FMoE",
    "FMoELinear",
    "FMoETransformerMLP",
    "FasterGate",
    "GShardGate",
    "NaiveGate",
    "NoisyGate",
    "SwipeGate",
    "SwitchGate",
    "ZeroGate",
    "ddp_ignore_experts",
    "distributed",
    "gates",
    "gen_faster_gate",
    "layers",
    "linear",
    "mark_module_parallel_comm",
    "mark_parallel_comm",
    "transformer",
]
