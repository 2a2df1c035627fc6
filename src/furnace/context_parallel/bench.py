"""Measured side-by-side runs of context-parallel schemes: UltraAttn's plans against ring,
zigzag and striped ring, all-gather of K/V, needed-KV and Ulysses (Yang et al., SC'25, §6;
design note §6.3, the noisy metrics, measured side by side).

`measure_schemes` runs ONE `run_distributed` job of ``num_ranks`` gloo ranks. The plans are
made in the parent, so every rank runs the identical plan (a time-limited solver could
otherwise return different plans on different ranks), and passed to the ranks. Every rank
draws the same global q, k, v and dout from the seed and takes its share under each
scheme's layout. The schemes run interleaved, round-robin in rotating order, each call
after a barrier; a round's time is the slowest rank's, and schemes are compared by the
median over rounds of their per-round ratio to the reference (ring), which cancels a change
in how busy the host is (`furnace.runtime.timing`). With a network emulated
(`furnace.runtime.netem`, "sleep" mode), every all-to-all lasts at least its modelled time,
and the times are labelled "emulated"; without, "measured" (gloo on loopback).

Machine-independent figures come with the times: the bytes each rank's `CommLog` recorded,
which must equal the plan's counts (`Plan.stats`, `baselines.ulysses_stats`), and whether
every scheme's output and gradients match the dense reference (`naive.dense_attention` in
float64, on the unsharded results). On a shared-core CPU the ranks time-slice, so wall time
mixes compute and communication (design note §6.3); the bytes are what to trust.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from furnace.runtime.comm import CommLog, Communicator
from furnace.runtime.launch import run_distributed
from furnace.runtime.netem import NetworkEmulation, NetworkEmulator
from furnace.runtime.presets import emulated_link
from furnace.runtime.testing import relative_error
from furnace.runtime.timing import median_paired_ratio, round_robin
from furnace.runtime.topology import Topology

from .baselines import BASELINES, baseline_plans, ulysses_stats
from .config import PlanError
from .execute import ContextParallelAttention
from .layout import Layout, make_layout, shard, unshard
from .masks import MASK_NAMES, BlockGrid, MaskMod, build_block_grid, make_mask
from .naive import dense_attention
from .plan import DTYPES, AttentionShape, Plan
from .ulysses import UlyssesAttention

if TYPE_CHECKING:
    from rich.table import Table

__all__ = [
    "SCHEMES",
    "TOLERANCES",
    "BenchConfig",
    "BenchResult",
    "MaskSpec",
    "SchemeResult",
    "bench_table",
    "build_bench_plans",
    "measure_schemes",
]

# "tiled": the planner's choice among the baselines and the tilings (what a user gets);
# "tiled_2d": the best 2-D tiling alone, to measure the tiling itself against the baselines
SCHEMES = (*BASELINES, "tiled", "tiled_2d", "ulysses")
# relative error (norm of the difference over the reference's) that counts as matching the
# float64 dense reference, per input dtype: a few units of each type's rounding
TOLERANCES: dict[str, float] = {"float64": 1e-10, "float32": 1e-5, "bfloat16": 3e-2,
                                "float16": 5e-3}


@dataclass(frozen=True)
class MaskSpec:
    """A mask named by its recipe: a built-in mask (`masks.MASK_NAMES`) with parameters, or
    ``MODULE:FUNCTION`` / ``FILE.py:FUNCTION`` naming a mask_mod. It is the mask_mod (calls
    go to the built function) and it pickles as its recipe, so a grid holding it travels to
    spawned ranks, which a closure cannot."""

    name: str
    seq_len: int
    params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_fn", self._build())

    def _build(self) -> MaskMod:
        if self.name in MASK_NAMES:
            return make_mask(self.name, self.seq_len, **dict(self.params))
        where, _, function = self.name.rpartition(":")
        allowed = (f"one of {', '.join(MASK_NAMES)}, or MODULE:FUNCTION or FILE.py:FUNCTION "
                   "naming a mask_mod(b, h, q_idx, kv_idx)")
        if not where or not function:
            raise PlanError("mask", f"{allowed}; got {self.name!r}")
        if self.params:
            raise PlanError("mask_params", "only with a built-in mask")
        if where.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(where).stem, where)
            if spec is None or spec.loader is None or not Path(where).is_file():
                raise PlanError("mask", f"{allowed}; no file {where}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        fn = getattr(module, function, None)
        if not callable(fn):
            raise PlanError("mask", f"{allowed}; {where} has no function {function!r}")
        return fn  # type: ignore[no-any-return]

    @property
    def fn(self) -> MaskMod:
        return self._fn  # type: ignore[attr-defined, no-any-return]

    @property
    def __name__(self) -> str:  # the grid's describe() names the mask by it
        return str(getattr(self.fn, "__name__", self.name))

    def __call__(self, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return self.fn(b, h, q_idx, kv_idx)

    def __reduce__(self) -> tuple[type[MaskSpec], tuple[str, int, tuple[tuple[str, Any], ...]]]:
        return (MaskSpec, (self.name, self.seq_len, self.params))


@dataclass(frozen=True)
class BenchConfig:
    """One side-by-side run.

    Args:
        mask: a built-in mask name or MODULE:FUNCTION / FILE.py:FUNCTION (see `MaskSpec`).
        mask_params: overrides of the built-in mask's defaults, as (name, value) pairs.
        seq_len, num_blocks: the sequence and its grid (blocks of ceil(seq_len/num_blocks)).
        num_ranks: gloo ranks on this machine.
        batch, num_heads, num_kv_heads, head_dim, dtype: the attention shape.
        schemes: from `SCHEMES`; "tiled" is the planner's choice (`plan_attention`, which
            may be a baseline when none of its tilings is estimated faster).
        repeats: timed rounds (each runs every scheme once); warmup: untimed rounds first.
        granularity, time_limit_s: the planner's kernel granularity and ILP time limit.
        emulate: the emulated machine (netem "sleep" mode); or give ``bandwidth_Bps`` (and
            ``latency_s``) for `presets.emulated_link`; neither: plain gloo loopback.
        backward: time forward and backward (else the forward only).
        reference: the scheme the ratios are taken to (ratios are None if it is not run).
        seed: the random inputs.
        timeout_s: bound of the whole distributed job.
    """

    mask: str = "causal"
    mask_params: tuple[tuple[str, Any], ...] = ()
    seq_len: int = 512
    num_blocks: int = 16
    num_ranks: int = 4
    batch: int = 1
    num_heads: int = 2
    num_kv_heads: int = 2
    head_dim: int = 32
    dtype: str = "float32"
    schemes: tuple[str, ...] = ("ring", "zigzag_ring", "needed_kv", "tiled")
    repeats: int = 5
    warmup: int = 1
    granularity: str = "block"
    time_limit_s: float = 10.0
    emulate: Topology | None = None
    bandwidth_Bps: float | None = None
    latency_s: float = 0.0
    backward: bool = True
    reference: str = "ring"
    seed: int = 0
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("seq_len", "num_blocks", "num_ranks", "repeats"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlanError(name, f"must be an integer >= 1, got {value!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise PlanError("warmup", f"must be an integer >= 0, got {self.warmup!r}")
        if not self.schemes or len(set(self.schemes)) != len(self.schemes) or \
                any(s not in SCHEMES for s in self.schemes):
            raise PlanError("schemes", f"distinct names from {', '.join(SCHEMES)}, got "
                            f"{self.schemes!r}")
        if self.dtype not in DTYPES:
            raise PlanError("dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.emulate is not None and self.bandwidth_Bps is not None:
            raise PlanError("emulate", "a Topology or a bandwidth_Bps, not both")
        if self.bandwidth_Bps is not None and not self.bandwidth_Bps > 0:
            raise PlanError("bandwidth_Bps", f"must be > 0, got {self.bandwidth_Bps}")
        if not self.latency_s >= 0:
            raise PlanError("latency_s", f"must be >= 0, got {self.latency_s}")
        if not self.timeout_s > 0:
            raise PlanError("timeout_s", f"must be > 0, got {self.timeout_s}")

    @property
    def block_size(self) -> int:
        return -(-self.seq_len // self.num_blocks)

    @property
    def topology(self) -> Topology | None:
        """The emulated machine, or None for plain loopback."""
        if self.emulate is not None:
            return self.emulate
        if self.bandwidth_Bps is not None:
            return emulated_link(bandwidth_Bps=self.bandwidth_Bps, latency_s=self.latency_s)
        return None

    @property
    def shape(self) -> AttentionShape:
        return AttentionShape(batch=self.batch, num_heads=self.num_heads,
                              num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                              dtype=self.dtype)


@dataclass(frozen=True)
class SchemeResult:
    """One scheme's figures.

    Attributes:
        name: the scheme as asked for; plan_scheme: what ran ("tiled" may pick a baseline).
        layout: the token layout it ran on.
        seconds: per round, the slowest rank's time of one call (forward, and backward if
            the config says so).
        median_s: the median of ``seconds``; ratio: the median per-round ratio to the
            reference scheme (None when the reference did not run).
        bytes_in, bytes_out: per rank, what its `CommLog` recorded in one call, forward and
            backward together (reductions included); planned_in, planned_out: the plan's
            counts of the same; bytes_match: they are equal on every rank.
        max_inbound: the busiest rank's logged bytes in; balance: max / mean work (plan).
        collectives: all_to_all_single calls per call on rank 0.
        error: the largest relative error of out, dq, dk, dv against the dense reference;
            correct: within `TOLERANCES` of the dtype.
    """

    name: str
    plan_scheme: str
    layout: str
    seconds: tuple[float, ...]
    median_s: float
    ratio: float | None
    bytes_in: tuple[int, ...]
    bytes_out: tuple[int, ...]
    planned_in: tuple[int, ...]
    planned_out: tuple[int, ...]
    bytes_match: bool
    max_inbound: int
    balance: float
    collectives: int
    error: float
    correct: bool


@dataclass(frozen=True)
class BenchResult:
    """What `measure_schemes` measured: ``label`` is "emulated" or "measured" (every time
    in it carries that label), ``grid`` the grid's one-line description."""

    config: BenchConfig
    label: str
    grid: str
    schemes: tuple[SchemeResult, ...]
    # the plans the ranks ran, by scheme name (Ulysses has none): a time-limited planner
    # need not find the same plan twice, so whoever models the run must use these
    plans: Mapping[str, Plan] = field(default_factory=dict, repr=False, compare=False)

    @property
    def all_correct(self) -> bool:
        return all(s.correct for s in self.schemes)

    @property
    def all_bytes_match(self) -> bool:
        return all(s.bytes_match for s in self.schemes)

    def scheme(self, name: str) -> SchemeResult:
        for s in self.schemes:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        config = asdict(self.config)
        config["emulate"] = None if self.config.emulate is None else self.config.emulate.name
        return {"config": config, "label": self.label, "grid": self.grid,
                "schemes": [asdict(s) for s in self.schemes], "all_correct": self.all_correct,
                "all_bytes_match": self.all_bytes_match}


@dataclass(frozen=True)
class _Job:
    """What every rank receives: the same plans, grid and config."""

    config: BenchConfig
    grid: BlockGrid
    shape: AttentionShape
    plans: Mapping[str, Plan]
    ulysses_layout: Layout | None


def _grid(config: BenchConfig) -> BlockGrid:
    mask = MaskSpec(config.mask, config.seq_len, tuple(config.mask_params))
    grid = build_block_grid(mask, config.seq_len, config.block_size, batch=config.batch,
                            heads=config.num_heads)
    if grid.num_blocks != config.num_blocks:
        raise PlanError("num_blocks", f"a count that cuts {config.seq_len} tokens into blocks "
                        f"of ceil(S/P) tokens with a shorter last one; {config.num_blocks} "
                        f"gives {grid.num_blocks} blocks")
    return grid


def build_bench_plans(config: BenchConfig, grid: BlockGrid) -> dict[str, Plan]:
    """The plan of every scheme of ``config`` but Ulysses (which has none), made once."""
    shape = config.shape
    plans: dict[str, Plan] = {}
    wanted = [s for s in config.schemes if s in BASELINES]
    if wanted:
        baselines = baseline_plans(grid, shape, config.num_ranks)
        for name in wanted:
            if name not in baselines:
                raise PlanError("schemes", f"{name} needs a layout that {config.num_blocks} "
                                f"blocks on {config.num_ranks} ranks do not allow; available: "
                                f"{', '.join(baselines)}")
            plans[name] = baselines[name]
    for name in ("tiled", "tiled_2d"):
        if name not in config.schemes:
            continue
        # the planner (and SciPy's solver behind it) only when a tiled plan is asked for
        from .context_tiling import TilingConfig, plan_attention

        # planned for the machine it runs on: the emulated one when there is one
        plans[name] = plan_attention(grid, config.num_ranks, shape,
                                     config=TilingConfig(time_limit_s=config.time_limit_s),
                                     granularity=config.granularity,
                                     topology=config.topology, baselines=name == "tiled")
    return plans


def measure_schemes(config: BenchConfig) -> BenchResult:
    """Run the schemes side by side (see the module docstring) and check each one."""
    grid = _grid(config)
    shape = config.shape
    ulysses_layout = None
    if "ulysses" in config.schemes:
        if config.num_heads % config.num_ranks or config.num_kv_heads % config.num_ranks:
            raise PlanError("schemes", f"ulysses only when num_ranks ({config.num_ranks}) "
                            f"divides num_heads ({config.num_heads}) and num_kv_heads "
                            f"({config.num_kv_heads})")
        ulysses_layout = make_layout("contiguous", grid.num_blocks, config.num_ranks)
    plans = build_bench_plans(config, grid)
    job = _Job(config, grid, shape, plans, ulysses_layout)
    per_rank = run_distributed(_bench_rank, config.num_ranks, job, timeout_s=config.timeout_s)
    return _summarise(job, per_rank)


def _inputs(config: BenchConfig) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The global q, k, v, dout every rank draws alike."""
    gen = torch.Generator().manual_seed(config.seed)
    dtype = DTYPES[config.dtype][0]
    s, b, d = config.seq_len, config.batch, config.head_dim

    def draw(heads: int) -> Tensor:
        return torch.randn(b, heads, s, d, generator=gen, dtype=torch.float64).to(dtype)

    return draw(config.num_heads), draw(config.num_kv_heads), draw(config.num_kv_heads), \
        draw(config.num_heads)


def _layout_of(job: _Job, name: str) -> Layout:
    if name == "ulysses":
        assert job.ulysses_layout is not None
        return job.ulysses_layout
    return job.plans[name].layout


def _bench_rank(rank: int, world_size: int, job: _Job) -> dict[str, Any]:
    """Per-rank body: every scheme timed in rotating rounds, bytes logged, outputs kept."""
    config = job.config
    topology = config.topology
    network = (NetworkEmulator(NetworkEmulation(topology=topology, mode="sleep"))
               if topology is not None else None)
    comm = Communicator(log=CommLog(), network=network, name="cp")
    # the barrier before each timed call is not part of any scheme's traffic or time
    sync = Communicator(log=CommLog(), name="sync")
    q, k, v, dout = _inputs(config)
    attention: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {}
    local: dict[str, tuple[Tensor, Tensor, Tensor, Tensor]] = {}
    for name in config.schemes:
        layout = _layout_of(job, name)
        local[name] = (shard(q, layout, job.grid, rank), shard(k, layout, job.grid, rank),
                       shard(v, layout, job.grid, rank), shard(dout, layout, job.grid, rank))
        if name == "ulysses":
            attention[name] = UlyssesAttention(comm, job.grid, layout)
        else:
            attention[name] = ContextParallelAttention(job.plans[name], comm)
    logged: dict[str, tuple[int, int, int]] = {}

    def call(name: str) -> tuple[Tensor, ...]:
        lq, lk, lv, ldout = local[name]
        if not config.backward:
            with torch.no_grad():
                return (attention[name](lq, lk, lv),)
        xs = tuple(x.detach().requires_grad_(True) for x in (lq, lk, lv))
        out = attention[name](*xs)
        grads = torch.autograd.grad(out, xs, ldout)
        return (out.detach(), *grads)

    def measure(name: str) -> float:
        sync.barrier()
        comm.log.clear()
        start = time.perf_counter()
        call(name)
        seconds = time.perf_counter() - start
        logged[name] = (comm.log.bytes_received(), comm.log.bytes_sent(),
                        comm.log.count("all_to_all_single"))
        return seconds

    seconds = round_robin(list(config.schemes), measure, rounds=config.repeats,
                          warmup=config.warmup)
    sync.barrier()
    # one more call of each, untimed, for the correctness check in the parent
    outputs = {name: call(name) for name in config.schemes}
    sync.barrier()
    return {"seconds": seconds, "logged": logged, "outputs": outputs,
            "label": network.label if network is not None else "measured"}


def _reference(job: _Job) -> tuple[Tensor, ...]:
    config = job.config
    q, k, v, dout = (x.to(torch.float64) for x in _inputs(config))
    xs = tuple(x.clone().requires_grad_(config.backward) for x in (q, k, v))
    with torch.set_grad_enabled(config.backward):
        out = dense_attention(xs[0], xs[1], xs[2], job.grid.mask_mod)
    if not config.backward:
        return (out.detach(),)
    grads = torch.autograd.grad(out, xs, dout)
    return (out.detach(), *grads)


def _error(job: _Job, name: str, reference: Sequence[Tensor],
           per_rank: Sequence[Mapping[str, Any]]) -> float:
    layout = _layout_of(job, name)
    # a gradient the mask never reaches is exactly zero; the output's size is the floor
    floor = float(reference[0].norm()) or 1.0
    worst = 0.0
    for i, ref in enumerate(reference):
        got = unshard([r["outputs"][name][i] for r in per_rank], layout, job.grid)
        worst = max(worst, relative_error(ref, got.to(torch.float64), scale=floor))
    return worst


def _summarise(job: _Job, per_rank: Sequence[Mapping[str, Any]]) -> BenchResult:
    config = job.config
    reference = _reference(job)
    rounds = {name: tuple(max(r["seconds"][name][i] for r in per_rank)
                          for i in range(config.repeats)) for name in config.schemes}
    results = []
    for name in config.schemes:
        bytes_in = tuple(int(r["logged"][name][0]) for r in per_rank)
        bytes_out = tuple(int(r["logged"][name][1]) for r in per_rank)
        if name == "ulysses":
            stats: Any = ulysses_stats(job.grid, job.shape, config.num_ranks)
            plan_scheme, layout_kind = "ulysses", _layout_of(job, name).kind
        else:
            plan = job.plans[name]
            stats = plan.stats()
            plan_scheme, layout_kind = plan.scheme, plan.layout.kind
        planned_in = tuple(int(f + (b if config.backward else 0))
                           for f, b in zip(stats.forward_in, stats.backward_in))
        planned_out = tuple(int(f + (b if config.backward else 0))
                            for f, b in zip(stats.forward_out, stats.backward_out))
        error = _error(job, name, reference, per_rank)
        ratio = (median_paired_ratio(rounds[name], rounds[config.reference])
                 if config.reference in rounds else None)
        results.append(SchemeResult(
            name=name, plan_scheme=plan_scheme, layout=layout_kind, seconds=rounds[name],
            median_s=float(statistics.median(rounds[name])), ratio=ratio,
            bytes_in=bytes_in, bytes_out=bytes_out, planned_in=planned_in,
            planned_out=planned_out,
            bytes_match=bytes_in == planned_in and bytes_out == planned_out,
            max_inbound=max(bytes_in), balance=float(stats.balance),
            collectives=int(per_rank[0]["logged"][name][2]), error=error,
            correct=math.isfinite(error) and error <= TOLERANCES[config.dtype]))
    return BenchResult(config=config, label=str(per_rank[0]["label"]),
                       grid=job.grid.describe().splitlines()[0], schemes=tuple(results),
                       plans=dict(job.plans))


def bench_table(result: BenchResult) -> Table:
    """The result as a table: time (labelled), ratio, bytes against the plan, correctness."""
    from rich import box
    from rich.table import Table

    from furnace.runtime.comm import format_bytes

    c = result.config
    title = (f"{result.grid}; {c.num_ranks} ranks, {'fwd+bwd' if c.backward else 'fwd'}, "
             f"{c.repeats} rounds ({result.label} time)")
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    # the times' label is in the title; short headers keep the table narrow
    for col in ("scheme", "plan", "layout", "median ms", f"x {c.reference}", "max in",
                "= plan", "balance", "a2a", "error", "ok"):
        table.add_column(col, justify="left" if col in ("scheme", "plan", "layout") else "right")
    for s in result.schemes:
        table.add_row(s.name, s.plan_scheme, s.layout, f"{s.median_s * 1e3:.2f}",
                      "" if s.ratio is None else f"{s.ratio:.2f}", format_bytes(s.max_inbound),
                      "yes" if s.bytes_match else "NO", f"{s.balance:.2f}", str(s.collectives),
                      f"{s.error:.1e}", "yes" if s.correct else "NO")
    return table
