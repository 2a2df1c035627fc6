"""UltraAttn (Yang et al., SC'25) in Furnace: context parallelism for block-sparse attention,
with the 2-D context tiling of the attention grid, exact forward and backward on any mask.

- masks as FlexAttention ``mask_mod``s and their block grids (`masks`), layouts of the
  sequence over ranks (`layout`);
- block attention kernels with the log-sum-exp and their backward (`kernels`) beside the
  dense reference (`naive`);
- the plan model and the baselines: ring, zigzag and striped ring, all-gather of K/V,
  needed-KV, Ulysses' closed form (`plan`, `baselines`);
- the 2-D tiling ILP (HiGHS), its greedy fallback, the node-then-device hierarchy and the
  best-of planner (`context_tiling`), with every scheme side by side (`compare`);
- the autograd runtime that executes a plan with instrumented collectives (`execute`),
  Ulysses (`ulysses`), and measured runs side by side (`bench`);
- the discrete-event projection to 64-1024 GPUs and its validation (`simulate`).

See README.md for the paper, the equations and the measured figures.
"""

from .baselines import (
    BASELINES,
    UlyssesStats,
    allgather_kv_plan,
    baseline_plans,
    needed_kv_plan,
    ring_plan,
    ulysses_stats,
)
from .bench import BenchConfig, BenchResult, measure_schemes
from .compare import SchemeComparison, SchemeRow, compare_schemes, plot_tiling, tiling_picture
from .config import LayoutError, MaskError, PlanError
from .context_tiling import (
    TilingConfig,
    TilingResult,
    choose_num_blocks,
    estimate_time,
    hierarchical_tiling,
    plan_attention,
    tile2d_greedy,
    tile2d_ilp,
)
from .execute import ContextParallelAttention, context_parallel_attention
from .kernels import attention_flops, block_backward, block_forward, merge_partial
from .layout import LAYOUTS, Layout, local_positions, make_layout, shard, unshard
from .masks import (
    MASK_NAMES,
    BlockGrid,
    MaskMod,
    build_block_grid,
    causal_mask,
    check_mask_mod,
    document_mask,
    full_mask,
    global_local_mask,
    grid_from_block_mask,
    make_mask,
    random_block_mask,
    sampled_block_grid,
    sliding_window_mask,
    star_mask,
    streaming_mask,
    strided_mask,
)
from .naive import dense_attention, dense_attention_with_lse
from .plan import AttentionShape, Kernel, Plan, PlanStats, Stage, Transfer, build_plan, check_plan
from .simulate import ComputeModel, SimResult, scaling_study, simulate_plan, validate
from .ulysses import ulysses_attention

__all__ = [
    "BASELINES", "LAYOUTS", "MASK_NAMES", "AttentionShape", "BenchConfig", "BenchResult",
    "BlockGrid", "ComputeModel", "ContextParallelAttention", "Kernel", "Layout", "LayoutError",
    "MaskError", "MaskMod", "Plan", "PlanError", "PlanStats", "SchemeComparison", "SchemeRow",
    "SimResult", "Stage", "TilingConfig", "TilingResult", "Transfer", "UlyssesStats",
    "allgather_kv_plan", "attention_flops", "baseline_plans", "block_backward", "block_forward",
    "build_block_grid", "build_plan", "causal_mask", "check_mask_mod", "check_plan",
    "choose_num_blocks", "compare_schemes", "context_parallel_attention", "dense_attention",
    "dense_attention_with_lse", "document_mask", "estimate_time", "full_mask",
    "global_local_mask", "grid_from_block_mask", "hierarchical_tiling", "local_positions",
    "make_layout", "make_mask", "measure_schemes", "merge_partial", "needed_kv_plan",
    "plan_attention", "plot_tiling", "random_block_mask", "ring_plan", "sampled_block_grid",
    "scaling_study", "shard", "simulate_plan", "sliding_window_mask", "star_mask",
    "streaming_mask", "strided_mask", "tile2d_greedy", "tile2d_ilp", "tiling_picture",
    "ulysses_attention", "ulysses_stats", "unshard", "validate",
]
