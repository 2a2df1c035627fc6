"""Discrete-event projection of context-parallel attention plans to 64-1024 GPUs, validated
against emulated runs first (UltraAttn, Yang et al., SC'25; design note §2.6 and §6.5).

`simulate_plan` turns a `Plan` (its stages of transfers and kernels, the reductions) into a
task graph on `furnace.runtime.simulator` and list-schedules it. By default
(``order="executor"``) each rank runs the program the executor
(`execute.context_parallel_attention`) runs, forward then backward:

    post stage 0's exchange (if it has one)
    for each stage s: wait exchange s; post exchange s+1; compute stage s's kernels
    post the reduction; wait it; merge the received partials at their owners

With ``overlap=False`` a rank instead posts, waits and computes each stage in turn, so
nothing overlaps (the overlap-free reference of design note §6.5 item 3). With
``order="dataflow"`` the plan runs as UltraAttn's stream runtime would run it (§2.6): every
message leaves once its sender holds its payload, every kernel starts once its inputs are
in, every partial leaves once the kernels producing it are done. The executor's lockstep
(a rank posts exchange s+1 only after computing stage s-1, and a message needs both ends
to have posted) costs the in-step imbalance of a plan's stages; the dataflow order shows
what the same plan is worth without it.

Communication has two models (``comm_model``):

``ports`` (default; the paper's stream rule, §2.6): every message (src, dst) of a stage,
    its transfers summed, occupies the sender's send port and the receiver's receive port
    of the link class it crosses for bytes / beta; messages sharing a port serialise. It
    may start once both ends have posted the exchange. A rank's exchange completes when
    all its messages have, plus one latency alpha (the largest its messages cross: the
    emulator's one step per all_to_all) and a fixed per-call overhead.
``collective``: every exchange is one collective that ends for all ranks at once, at
    the latest post plus the slowest rank's ``alpha + max(sent, received) / beta`` per
    link class: exactly the model of the sleeping network emulator
    (`furnace.runtime.netem`), which the measured validation runs over.

Compute (`ComputeModel`) is FLOPs = 4 x elements x heads x head_dim forward and a factor
more backward (design note §6.5 item 2) at ``flops_per_s * n / (n + n0)`` for a kernel of
``n`` elements (batch and heads included): the granularity curve, with ``n0`` an
assumption (`gpu_compute_model`) unless `calibrate_cpu` measured it on this CPU's
executor. Each rank has its own compute resource, or (``shared_compute_capacity``) all
ranks queue on one resource with that many slots: how emulated ranks share this machine's
cores, which the validation needs, together with the exchange overhead and the
shared-core slowdown that `probe_host` measures.

Two engines evaluate the executor's program: "events" (the task graph: a `Timeline`,
its critical path and a Chrome trace) and "stages" (the same schedule, proven equal by the
tests, evaluated stage by stage with numpy, for plans of hundreds of ranks).

`validate` compares the simulator with measured emulated runs (`bench.measure_schemes`)
at 2, 4 and 8 ranks before anything is extrapolated; `scaling_study` then projects ring,
zigzag ring and the planner's (hierarchical, §2.4) plan to 64-1024 GPUs on
`presets.h100_ib`. Every projected time is labelled "simulated", with the assumptions it
rests on.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from furnace.runtime.cost import direct_exchange_time
from furnace.runtime.presets import GPU_EXCHANGE_STEP_OVERHEAD_S, emulated_link, get_preset
from furnace.runtime.simulator import Simulator, Timeline
from furnace.runtime.topology import Link, LinkLevel, Topology

from .config import LayoutError, PlanError
from .kernels import BACKWARD_FLOP_FACTOR, attention_flops

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from .context_tiling import TilingConfig
    from .masks import BlockGrid
    from .plan import AttentionShape, Kernel, Plan, Stage, Transfer

__all__ = [
    "COMM_MODELS",
    "ENGINES",
    "ORDERS",
    "STAGE_ENGINE_ABOVE",
    "PAPER_SPEEDUP_64",
    "PartialWork",
    "ComputeModel",
    "ScalingRow",
    "ScalingStudy",
    "SimResult",
    "ValidationConfig",
    "ValidationResult",
    "ValidationRow",
    "HostProbe",
    "calibrate_cpu",
    "gpu_compute_model",
    "probe_host",
    "r_squared",
    "scaling_study",
    "scaling_study_quick",
    "simulate_cli",
    "simulate_plan",
    "validate",
]

CommModel = Literal["ports", "collective"]
COMM_MODELS: tuple[str, ...] = ("ports", "collective")
Engine = Literal["auto", "events", "stages"]
Order = Literal["executor", "dataflow"]
ORDERS: tuple[str, ...] = ("executor", "dataflow")
ENGINES: tuple[str, ...] = ("auto", "events", "stages")
# transfers + kernels of a plan above which "auto" evaluates it stage by stage
STAGE_ENGINE_ABOVE = 20_000
PartialWork = Literal["elements", "area"]
PARTIAL_WORKS: tuple[str, ...] = ("elements", "area")

# UltraAttn's headline (design note §3): average speedup over the best ring baseline across
# irregular masks on 64 H100s. Quoted for comparison next to our simulated figures only.
PAPER_SPEEDUP_64 = 5.5

# Forward FLOPs per allowed (query, key) element and head channel (`kernels.attention_flops`)
_FLOPS_PER_ELEMENT_CHANNEL = attention_flops(1, 1, 1)


# --------------------------------------------------------------------------- compute model


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or not math.isfinite(value):
        raise PlanError(name, f"must be a finite number > 0, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
            or not math.isfinite(value):
        raise PlanError(name, f"must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class ComputeModel:
    """How long a rank takes for a block-attention kernel (design note §6.5 item 2).

    A kernel's time covers the call and the accumulation of its result into the rank's
    partial sums (the LSE merge into a row's out, the sums of dq, dk, dv), as the executor
    runs them back to back. Merging the partials a reduction delivers to an owner is
    costed separately (``merge_call_s`` per received partial plus ``merge_s_per_element``),
    and so is a fixed cost per pass and rank (``pass_overhead_s``: the autograd function,
    the assembly of the outputs).

    Args:
        flops_per_s: the rate a large forward kernel reaches (FLOP/s).
        half_efficiency_elements: ``n0`` of the granularity curve ``eff(n) = n / (n + n0)``:
            a kernel of ``n0`` elements (summed over batch and heads) runs at half the rate.
        backward_factor: backward over forward seconds of a large kernel (the FLOP
            convention of DCP and MagiAttention is 2.5).
        backward_half_efficiency_elements: ``n0`` of the backward (None: the forward's).
        partial_work: what a kernel over partially masked blocks computes: "elements" (a
            block-sparse kernel such as FlexAttention skips masked tiles: the allowed
            elements) or "area" (dense masked math evaluates every element of its blocks,
            as the CPU path does).
        partial_slowdown: seconds of a masked kernel over a full one of the same work, in
            the forward; ``partial_slowdown_backward`` in the backward (None: the same).
        merge_call_s, merge_s_per_element: one received partial's merge (or sum) at its
            owner: a fixed cost per partial plus a cost per element of it.
        pass_overhead_s: fixed seconds per rank and pass (forward or backward).
        label: "assumed" or "measured": how the figures were obtained.
        source: where the figures come from.
    """

    flops_per_s: float
    half_efficiency_elements: float = 0.0
    backward_factor: float = BACKWARD_FLOP_FACTOR
    backward_half_efficiency_elements: float | None = None
    partial_work: PartialWork = "elements"
    partial_slowdown: float = 1.0
    partial_slowdown_backward: float | None = None
    merge_call_s: float = 0.0
    merge_s_per_element: float = 0.0
    pass_overhead_s: float = 0.0
    label: str = "assumed"
    source: str = ""

    def __post_init__(self) -> None:
        _positive("flops_per_s", self.flops_per_s)
        _non_negative("half_efficiency_elements", self.half_efficiency_elements)
        _positive("backward_factor", self.backward_factor)
        if self.backward_half_efficiency_elements is not None:
            _non_negative("backward_half_efficiency_elements",
                          self.backward_half_efficiency_elements)
        _positive("partial_slowdown", self.partial_slowdown)
        if self.partial_slowdown_backward is not None:
            _positive("partial_slowdown_backward", self.partial_slowdown_backward)
        _non_negative("merge_call_s", self.merge_call_s)
        _non_negative("merge_s_per_element", self.merge_s_per_element)
        _non_negative("pass_overhead_s", self.pass_overhead_s)
        if self.partial_work not in PARTIAL_WORKS:
            raise PlanError("partial_work", f"one of {PARTIAL_WORKS}, got {self.partial_work!r}")

    def efficiency(self, elements: float, *, backward: bool = False) -> float:
        """``n / (n + n0)``: the fraction of the large-kernel rate a kernel of ``n``
        elements (batch and heads included) gets."""
        if elements <= 0:
            return 1.0
        n0 = self.half_efficiency_elements
        if backward and self.backward_half_efficiency_elements is not None:
            n0 = self.backward_half_efficiency_elements
        return elements / (elements + n0)

    def work_time(self, elements: int, shape: AttentionShape, *, backward: bool = False,
                  partial: bool = False) -> float:
        """Seconds for one kernel computing ``elements`` (q, kv) pairs of every (batch, head)."""
        if elements < 0:
            raise PlanError("elements", f"must be >= 0, got {elements}")
        if elements == 0:
            return 0.0
        n = float(elements) * shape.batch * shape.num_heads
        flops = attention_flops(elements, shape.num_heads, shape.head_dim) * shape.batch
        seconds = flops / (self.flops_per_s * self.efficiency(n, backward=backward))
        if backward:
            seconds *= self.backward_factor
        if partial:
            slowdown = self.partial_slowdown
            if backward and self.partial_slowdown_backward is not None:
                slowdown = self.partial_slowdown_backward
            seconds *= slowdown
        return seconds

    def merge_time(self, elements: int, calls: int = 1) -> float:
        """Seconds to merge (or sum) ``calls`` received partials of ``elements`` in all."""
        if elements <= 0 or calls <= 0:
            return 0.0
        return calls * self.merge_call_s + self.merge_s_per_element * float(elements)

    def kernel_time(self, kernel: Kernel, shape: AttentionShape, backward: bool = False, *,
                    grid: BlockGrid | None = None) -> float:
        """Seconds for ``kernel`` (its accumulation included).

        ``grid`` gives the block lengths, needed when ``partial_work`` is "area".
        """
        work = kernel.elements
        if self.partial_work == "area" and not kernel.full:
            if grid is None:
                raise PlanError("grid", "the plan's BlockGrid: this compute model costs "
                                "masked kernels by their blocks' area")
            work = (sum(grid.block_len(r) for r in kernel.q_blocks)
                    * sum(grid.block_len(c) for c in kernel.kv_blocks))
        return self.work_time(work, shape, backward=backward, partial=not kernel.full)

    def slowed(self, factor: float) -> ComputeModel:
        """The same model with every time multiplied by ``factor`` (a busier host)."""
        _positive("factor", factor)
        return ComputeModel(
            flops_per_s=self.flops_per_s / factor,
            half_efficiency_elements=self.half_efficiency_elements,
            backward_factor=self.backward_factor,
            backward_half_efficiency_elements=self.backward_half_efficiency_elements,
            partial_work=self.partial_work, partial_slowdown=self.partial_slowdown,
            partial_slowdown_backward=self.partial_slowdown_backward,
            merge_call_s=self.merge_call_s * factor,
            merge_s_per_element=self.merge_s_per_element * factor,
            pass_overhead_s=self.pass_overhead_s * factor, label=self.label,
            source=self.source + (f", slowed x{factor:.3g}" if factor != 1 else ""))

    def describe(self) -> str:
        bwd_n0 = self.backward_half_efficiency_elements
        bwd_slow = self.partial_slowdown_backward
        return (f"{self.flops_per_s / 1e9:.4g} GFLOP/s, n0 = {self.half_efficiency_elements:.3g}"
                f" elements (backward x{self.backward_factor:.3g}"
                + (f", n0 {bwd_n0:.3g}" if bwd_n0 is not None else "")
                + f"); masked blocks costed by {self.partial_work}, x{self.partial_slowdown:.3g}"
                + (f" (backward x{bwd_slow:.3g})" if bwd_slow is not None else "")
                + f"; merge {self.merge_call_s * 1e6:.3g} us + "
                f"{self.merge_s_per_element * 1e9:.3g} ns/element; "
                f"{self.pass_overhead_s * 1e6:.3g} us per pass ({self.label}"
                + (f": {self.source}" if self.source else "") + ")")


def gpu_compute_model(topology: Topology, dtype: str, *, attainable_fraction: float = 0.35,
                      half_efficiency_elements: float = float(1 << 22),
                      backward_factor: float = BACKWARD_FLOP_FACTOR,
                      launch_s: float = 5e-6) -> ComputeModel:
    """The assumed compute model of a GPU preset (no GPU measurement is held here).

    ``attainable_fraction`` of the device's dense peak for ``dtype`` is what a large
    FlashAttention-2 kernel sustains (UltraAttn's kernels are a FlashAttention 2.5.7 fork,
    design note §2.6); ``n0 = 2**22`` elements puts half efficiency at e.g. 32 heads of a
    362 x 362 block. A reduction's merge is a kernel launch (``launch_s``) plus 3 fp32
    accesses per element at the device's memory bandwidth. All are assumptions and
    parameters.
    """
    _positive("attainable_fraction", attainable_fraction)
    device = topology.device
    return ComputeModel(
        flops_per_s=device.flops(dtype) * attainable_fraction,
        half_efficiency_elements=half_efficiency_elements,
        backward_factor=backward_factor,
        partial_work="elements",
        merge_call_s=launch_s,
        merge_s_per_element=3 * 4 / device.memory_bandwidth_Bps,
        label="assumed",
        source=f"{device.name} {dtype} peak x {attainable_fraction:g} (assumed FA2 "
        f"efficiency), n0 = {half_efficiency_elements:.3g} (assumed)",
    )


def _fit_relative(design: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Coefficients ``c >= 0`` of ``t ~ design @ c`` minimising the relative errors."""
    from scipy.optimize import nnls

    coef, _ = nnls(design / t[:, None], np.ones_like(t))
    return np.asarray(coef, dtype=np.float64)


@dataclass(frozen=True)
class _CalibrationRun:
    """One timed one-rank plan: its kernels' work and its pass times."""

    full_elements: float  # summed over the full kernels, batch and heads included
    full_kernels: int
    partial_area: float  # summed over the masked kernels, batch and heads included
    partial_kernels: int
    forward_s: float
    backward_s: float


def _time_plan_on_one_rank(plan: Plan, repeats: int, num_threads: int) -> tuple[float, float]:
    """Median seconds of the executor's forward (autograd on, as in a training step) and of
    its backward on one rank, each timed on its own in every repeat."""
    import torch

    from furnace.runtime.comm import Communicator
    from furnace.runtime.timing import stopwatch, torch_threads

    from .execute import ContextParallelAttention

    comm = Communicator(name="calibration")
    attention = ContextParallelAttention(plan, comm)
    shape, S = plan.shape, plan.grid.seq_len
    gen = torch.Generator().manual_seed(0)

    def draw(heads: int) -> torch.Tensor:
        return torch.randn(shape.batch, heads, S, shape.head_dim, generator=gen,
                           dtype=shape.torch_dtype)

    q, k, v, dout = draw(shape.num_heads), draw(shape.num_kv_heads), \
        draw(shape.num_kv_heads), draw(shape.num_heads)
    forward: list[float] = []
    backward: list[float] = []
    with torch_threads(num_threads):
        for i in range(repeats + 1):
            xs = [x.detach().requires_grad_(True) for x in (q, k, v)]
            with stopwatch() as fwd:
                out = attention(*xs)
            with stopwatch() as bwd:
                torch.autograd.grad(out, xs, dout)
            if i:  # the first call warms up
                forward.append(fwd.seconds)
                backward.append(bwd.seconds)
    return statistics.median(forward), statistics.median(backward)


def calibrate_cpu(shape: AttentionShape, block_sizes: Sequence[int] = (16, 32, 64), *,
                  repeats: int = 5, num_threads: int = 1) -> ComputeModel:
    """Time the executor on this CPU and fit a `ComputeModel` (label "measured").

    For each block size b, one-rank plans (no communication) over a full mask and a causal
    mask of 2 x 2 and 4 x 4 blocks run through `execute.ContextParallelAttention` on
    ``num_threads`` threads (one, as each emulated rank runs); the forward (autograd on)
    and the backward are timed apart, each the median of ``repeats``, so the load of the
    machine at the time is in the figures. Per block size, 16 against 4 full blocks give a
    kernel's cost and the cost per pass; over the sizes, the kernel costs fit a cost per
    element and per kernel (least squares on the relative error: the granularity curve's
    rate and ``n0``, to first order its ``1/t``); the causal runs then fit the masked-math
    slowdown (masked blocks costed by their area: the dense masked path computes every
    element). A reduction's merge is timed with
    `kernels.merge_partial` for a cost per call and per element.

    Needs no process group: it starts a one-process gloo group for the runs and ends it
    (or uses the current one if it has a single rank).
    """
    import torch
    import torch.distributed as dist

    from furnace.runtime.timing import time_call

    from .baselines import ring_plan
    from .kernels import block_forward, merge_partial
    from .masks import build_block_grid, make_mask

    sizes = sorted({int(b) for b in block_sizes})
    if len(sizes) < 1 or sizes[0] < 1:
        raise PlanError("block_sizes", f"sizes >= 1, got {block_sizes!r}")
    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    elif dist.get_world_size() != 1:
        raise PlanError("calibrate_cpu", "a process without a process group (or with a "
                        "one-rank one): the calibration runs the executor on one rank")
    runs: list[_CalibrationRun] = []
    heads = shape.batch * shape.num_heads
    try:
        for b in sizes:
            for mask_name in ("full", "causal"):
                for blocks in (2, 4):
                    S = b * blocks
                    grid = build_block_grid(make_mask(mask_name, S), S, b)
                    plan = ring_plan(grid, shape, "contiguous", 1)
                    kernels = [k for st in plan.forward for k in st.kernels]
                    full = [k for k in kernels if k.full]
                    part = [k for k in kernels if not k.full]
                    fwd, bwd = _time_plan_on_one_rank(plan, repeats, num_threads)
                    runs.append(_CalibrationRun(
                        full_elements=float(sum(k.elements for k in full) * heads),
                        full_kernels=len(full),
                        partial_area=float(len(part) * b * b * heads),
                        partial_kernels=len(part), forward_s=fwd, backward_s=bwd))
        merge_elements: list[float] = []
        merge_times: list[float] = []
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for b in sizes:
                q = torch.randn(shape.batch, shape.num_heads, b, shape.head_dim,
                                dtype=shape.torch_dtype, generator=gen)
                kv = torch.randn(shape.batch, shape.num_kv_heads, b, shape.head_dim,
                                 dtype=shape.torch_dtype, generator=gen)
                ids = torch.arange(b, dtype=torch.int64)
                out, lse = block_forward(q, kv, kv, ids + b, ids, mask_mod=None, full=True)
                merge_elements.append(float(b * shape.token_elements("out")))
                merge_times.append(time_call(
                    functools.partial(merge_partial, out, lse, out.clone(), lse.clone()),
                    repeats=repeats, warmup=1, num_threads=num_threads).median)
    finally:
        if own_group:
            dist.destroy_process_group()

    fitted = {}
    for backward in (False, True):
        def seconds(r: _CalibrationRun, backward: bool = backward) -> float:
            return r.backward_s if backward else r.forward_s

        # per block size: a kernel's cost from 16 against 4 full blocks, the rest per pass
        per_size: list[tuple[float, float, float]] = []  # (elements, kernel s, pass s)
        for i in range(0, len(runs), 4):
            small, large = runs[i], runs[i + 1]  # full 2 x 2, full 4 x 4
            one = (seconds(large) - seconds(small)) / (large.full_kernels - small.full_kernels)
            per_size.append((large.full_elements / large.full_kernels, one,
                             seconds(small) - small.full_kernels * one))
        elements = np.asarray([x[0] for x in per_size])
        kernel_s = np.asarray([max(x[1], 1e-12) for x in per_size])
        if len(per_size) >= 2:
            per_element, per_kernel = _fit_relative(
                np.stack([elements, np.ones_like(elements)], axis=1), kernel_s)
        else:
            per_element, per_kernel = kernel_s[0] / elements[0], 0.0
        if not per_element > 0:
            raise PlanError("calibrate_cpu", "kernel times that grow with the work; the "
                            f"timings of blocks {sizes} do not (a machine far too busy?)")
        per_pass = max(0.0, float(np.median([x[2] for x in per_size])))
        # the masked runs: their full kernels and pass cost as fitted, the rest masked
        mixed = [r for r in runs if r.partial_kernels > 0]
        rest = np.asarray([max(seconds(r) - per_pass - per_element * r.full_elements
                               - per_kernel * r.full_kernels, 1e-12) for r in mixed])
        masked = np.asarray([per_element * r.partial_area + per_kernel * r.partial_kernels
                             for r in mixed])
        slowdown = float(_fit_relative(masked[:, None], rest)[0])
        fitted[backward] = (float(per_element), float(per_kernel), per_pass,
                            max(slowdown, 1e-3))
    fe, fk, fp, fs = fitted[False]
    be, bk, bp, bs = fitted[True]
    per_flop = fe / (_FLOPS_PER_ELEMENT_CHANNEL * shape.head_dim)
    per_call, per_element_merge = 0.0, 0.0
    if len(sizes) >= 2:
        per_element_merge, per_call = _fit_relative(
            np.stack([np.asarray(merge_elements), np.ones(len(sizes))], axis=1),
            np.asarray(merge_times))
    else:
        per_call = merge_times[0]
    return ComputeModel(
        flops_per_s=1.0 / per_flop,
        half_efficiency_elements=fk / fe,
        backward_factor=be / fe,
        backward_half_efficiency_elements=bk / be,
        partial_work="area",
        partial_slowdown=fs,
        partial_slowdown_backward=bs,
        merge_call_s=float(per_call),
        merge_s_per_element=float(per_element_merge),
        pass_overhead_s=float((fp + bp) / 2),
        label="measured",
        source=f"the executor on one rank of this CPU ({num_threads} thread), blocks of "
        f"{', '.join(map(str, sizes))} tokens, {shape.dtype}, medians",
    )


# ----------------------------------------------------------------------- plan arithmetic


def _messages(plan: Plan, transfers: Sequence[Transfer]) -> dict[tuple[int, int], int]:
    """Bytes per (src, dst) pair of one exchange (pairs without bytes left out)."""
    return {k: v for k, v in plan.message_bytes(transfers).items() if v > 0 and k[0] != k[1]}


def _reduce_merges(plan: Plan, transfers: Sequence[Transfer]) -> dict[int, tuple[int, int]]:
    """(partials, elements) each destination merges or sums from a reduction."""
    out: dict[int, tuple[int, int]] = {}
    for t in transfers:
        if t.src == t.dst:
            continue
        calls, elements = out.get(t.dst, (0, 0))
        out[t.dst] = (calls + 1, elements + plan.shape.payload_elements(
            t.kind, plan.grid.block_len(t.block)))
    return out


# ------------------------------------------------------------------------------ simulator


@dataclass(frozen=True)
class SimResult:
    """One simulated run of a plan (label "simulated").

    ``forward_s`` is when the last rank finished the forward, ``makespan_s`` when the last
    finished everything; ``backward_s`` is their difference. Busy times are per rank:
    its kernels and merges, and the seconds its send and receive ports carried bytes.
    ``critical_path_s`` splits the critical path's seconds by task category ("compute",
    "comm", "latency", "sync"); the stage engine keeps no timeline, so it has none.
    """

    scheme: str
    num_ranks: int
    comm_model: str
    overlap: bool
    forward_s: float
    makespan_s: float
    compute_busy_s: tuple[float, ...]
    send_busy_s: tuple[float, ...]
    recv_busy_s: tuple[float, ...]
    critical_path_s: Mapping[str, float]
    critical_path_tasks: int
    timeline: Timeline | None = field(repr=False, compare=False)
    engine: str = "events"
    order: str = "executor"
    label: str = "simulated"

    @property
    def backward_s(self) -> float:
        return self.makespan_s - self.forward_s

    @property
    def total_s(self) -> float:
        return self.makespan_s

    @property
    def compute_balance(self) -> float:
        """Max over mean of the ranks' compute busy time (1.0 when nothing is computed)."""
        mean = statistics.fmean(self.compute_busy_s) if self.compute_busy_s else 0.0
        return max(self.compute_busy_s) / mean if mean > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "num_ranks": self.num_ranks,
                "comm_model": self.comm_model, "overlap": self.overlap,
                "forward_s": self.forward_s, "backward_s": self.backward_s,
                "makespan_s": self.makespan_s, "compute_busy_s": list(self.compute_busy_s),
                "send_busy_s": list(self.send_busy_s), "recv_busy_s": list(self.recv_busy_s),
                "critical_path_s": dict(self.critical_path_s),
                "critical_path_tasks": self.critical_path_tasks, "engine": self.engine,
                "order": self.order,
                "label": self.label}

    def summary(self) -> str:
        path = ", ".join(f"{k} {v * 1e3:.4g} ms" for k, v in self.critical_path_s.items())
        if self.timeline is None:
            path = "not traced (stage engine)"
        return (f"{self.scheme} on {self.num_ranks} ranks ({self.label}, {self.comm_model} "
                f"model, {self.order} order, overlap {'on' if self.overlap else 'off'}): forward "
                f"{self.forward_s * 1e3:.4g} ms, backward {self.backward_s * 1e3:.4g} ms, "
                f"total {self.makespan_s * 1e3:.4g} ms; critical path: {path or '(empty)'}")


class _Builder:
    """Adds one plan's passes to a `Simulator`, rank by rank in program order."""

    def __init__(self, plan: Plan, topology: Topology, compute: ComputeModel, *,
                 overlap: bool, comm_model: CommModel, shared_compute_capacity: int | None,
                 collective_overhead_s: float, exchange_cpu_s: float) -> None:
        self.plan = plan
        self.topology = topology
        self.compute = compute
        self.overlap = overlap
        self.comm_model = comm_model
        self.overhead = collective_overhead_s
        self.exchange_cpu_s = exchange_cpu_s
        self.num_ranks = plan.layout.num_ranks
        self.sim = Simulator()
        self.shared = shared_compute_capacity is not None
        if shared_compute_capacity is not None:
            self.sim.add_resource("cpu", shared_compute_capacity)
        self.ports: set[str] = set()
        for g in range(self.num_ranks):
            if not self.shared:
                self.sim.add_resource(f"r{g}.compute")
        self.cursor: list[str | None] = [None] * self.num_ranks
        self.compute_busy = [0.0] * self.num_ranks
        self.send_busy = [0.0] * self.num_ranks
        self.recv_busy = [0.0] * self.num_ranks

    # helpers -----------------------------------------------------------------------------

    def _deps(self, g: int, *extra: str) -> tuple[str, ...]:
        cur = self.cursor[g]
        return ((cur,) if cur is not None else ()) + extra

    def _port(self, name: str) -> str:
        if name not in self.ports:
            self.ports.add(name)
            self.sim.add_resource(name)
        return name

    def _compute_resource(self, g: int) -> str:
        return "cpu" if self.shared else f"r{g}.compute"

    def _kernel_time(self, kernel: Kernel, backward: bool) -> float:
        return self.compute.kernel_time(kernel, self.plan.shape, backward, grid=self.plan.grid)

    # exchanges ---------------------------------------------------------------------------

    def _post(self, name: str, transfers: Sequence[Transfer]) -> _Exchange:
        """Post an exchange on every rank now (at each rank's cursor)."""
        messages = _messages(self.plan, transfers)
        posts = []
        for g in range(self.num_ranks):
            post = f"{name}.post.r{g}"
            self.sim.add_task(post, 0.0, deps=self._deps(g), category="sync")
            posts.append(post)
        ex = _Exchange(name, messages, posts)
        if self.comm_model == "collective":
            self._collective(ex)
        else:
            self._port_messages(ex)
        return ex

    def _collective(self, ex: _Exchange) -> None:
        per_rank: list[dict[LinkLevel, list[int]]] = [{} for _ in range(self.num_ranks)]
        for (src, dst), nbytes in ex.messages.items():
            level = self.topology.level(src, dst)
            per_rank[src].setdefault(level, [0, 0])[0] += nbytes
            per_rank[dst].setdefault(level, [0, 0])[1] += nbytes
        durations = []
        for g in range(self.num_ranks):
            levels = [(self.topology.link_for(lvl), s, r) for lvl, (s, r) in per_rank[g].items()]
            durations.append(direct_exchange_time(levels, 1))
            for lvl, (s, r) in per_rank[g].items():
                link = self.topology.link_for(lvl)
                self.send_busy[g] += s / link.bandwidth_Bps
                self.recv_busy[g] += r / link.bandwidth_Bps
        done = f"{ex.name}.a2a"
        self.sim.add_task(done, max(durations, default=0.0) + self.overhead, deps=ex.posts,
                          category="comm")
        ex.done = [done] * self.num_ranks

    def _port_messages(self, ex: _Exchange) -> None:
        arrivals: list[list[str]] = [[] for _ in range(self.num_ranks)]
        alpha = [0.0] * self.num_ranks
        for (src, dst), nbytes in ex.messages.items():
            level = self.topology.level(src, dst)
            link: Link = self.topology.link_for(level)
            seconds = nbytes / link.bandwidth_Bps
            deps = (ex.posts[src], ex.posts[dst])
            out = f"{ex.name}.{src}>{dst}.send"
            inn = f"{ex.name}.{src}>{dst}.recv"
            self.sim.add_task(out, seconds, resource=self._port(f"r{src}.send.{level}"),
                              deps=deps, category="comm")
            self.sim.add_task(inn, seconds, resource=self._port(f"r{dst}.recv.{level}"),
                              deps=deps, category="comm")
            self.send_busy[src] += seconds
            self.recv_busy[dst] += seconds
            for g in (src, dst):
                arrivals[g].extend((out, inn))
                alpha[g] = max(alpha[g], link.latency_s)
        ex.done = []
        for g in range(self.num_ranks):
            # the exchange is complete for g once its own messages are, plus one latency
            # (the emulator's direct exchange counts one step per all_to_all) and the
            # per-call overhead
            done = f"{ex.name}.done.r{g}"
            seconds = (alpha[g] if arrivals[g] else 0.0) + self.overhead
            self.sim.add_task(done, seconds, deps=(ex.posts[g], *arrivals[g]),
                              category="latency")
            ex.done.append(done)

    def _wait(self, ex: _Exchange, g: int) -> None:
        name = f"{ex.name}.wait.r{g}"
        self.sim.add_task(name, 0.0, deps=self._deps(g, ex.done[g]), category="sync")
        self.cursor[g] = name
        if self.exchange_cpu_s > 0:
            # the rank's own work for the exchange (buffers, the backend's progress), which
            # competes with compute where ranks share cores
            task = f"{ex.name}.cpu.r{g}"
            self.sim.add_task(task, self.exchange_cpu_s, resource=self._compute_resource(g),
                              deps=(name,), category="comm")
            self.cursor[g] = task

    # compute -----------------------------------------------------------------------------

    def _compute_stage(self, name: str, stage: Stage, backward: bool) -> None:
        by_rank: dict[int, list[Kernel]] = {}
        for kernel in stage.kernels:
            by_rank.setdefault(kernel.rank, []).append(kernel)
        for g, kernels in by_rank.items():
            times = [self._kernel_time(k, backward) for k in kernels]
            self.compute_busy[g] += math.fsum(times)
            if self.shared:
                # one task per kernel, chained: the rank is one thread, and the shared
                # cores are handed out kernel by kernel
                for i, seconds in enumerate(times):
                    task = f"{name}.r{g}.k{i}"
                    self.sim.add_task(task, seconds, resource="cpu", deps=self._deps(g),
                                      category="compute")
                    self.cursor[g] = task
            else:
                # a rank's kernels of one stage run back to back on its own device
                task = f"{name}.r{g}"
                self.sim.add_task(task, math.fsum(times), resource=f"r{g}.compute",
                                  deps=self._deps(g), category="compute")
                self.cursor[g] = task

    def _merge(self, name: str, merges: Mapping[int, tuple[int, int]]) -> None:
        for g, (calls, elements) in merges.items():
            seconds = self.compute.merge_time(elements, calls)
            if seconds <= 0:
                continue
            task = f"{name}.r{g}"
            self.sim.add_task(task, seconds, resource=self._compute_resource(g),
                              deps=self._deps(g), category="compute")
            self.compute_busy[g] += seconds
            self.cursor[g] = task

    # passes ------------------------------------------------------------------------------

    def add_pass(self, tag: str, stages: Sequence[Stage], reduce: Sequence[Transfer],
                 backward: bool) -> str:
        """Add one pass (forward or backward) after each rank's cursor; returns its end."""
        # the executor calls an all_to_all for every stage with transfers, on every rank
        has_comm = [bool(st.transfers) for st in stages]
        posted: dict[int, _Exchange] = {}

        def post(s: int) -> None:
            if 0 <= s < len(stages) and has_comm[s]:
                posted[s] = self._post(f"{tag}.s{s}", stages[s].transfers)

        if self.overlap:
            post(0)
            for s, stage in enumerate(stages):
                if s in posted:
                    for g in range(self.num_ranks):
                        self._wait(posted[s], g)
                post(s + 1)
                self._compute_stage(f"{tag}.s{s}.compute", stage, backward)
        else:
            for s, stage in enumerate(stages):
                post(s)
                if s in posted:
                    for g in range(self.num_ranks):
                        self._wait(posted[s], g)
                self._compute_stage(f"{tag}.s{s}.compute", stage, backward)
        if reduce:
            ex = self._post(f"{tag}.reduce", reduce)
            for g in range(self.num_ranks):
                self._wait(ex, g)
            self._merge(f"{tag}.merge", _reduce_merges(self.plan, reduce))
        if self.compute.pass_overhead_s > 0:
            for g in range(self.num_ranks):
                task = f"{tag}.overhead.r{g}"
                self.sim.add_task(task, self.compute.pass_overhead_s,
                                  resource=self._compute_resource(g), deps=self._deps(g),
                                  category="compute")
                self.compute_busy[g] += self.compute.pass_overhead_s
                self.cursor[g] = task
        end = f"{tag}.end"
        ends = []
        for g in range(self.num_ranks):
            task = f"{tag}.end.r{g}"
            self.sim.add_task(task, 0.0, deps=self._deps(g), category="sync")
            self.cursor[g] = task
            ends.append(task)
        self.sim.add_task(end, 0.0, deps=ends, category="sync")
        return end


@dataclass
class _Exchange:
    name: str
    messages: dict[tuple[int, int], int]
    posts: list[str]
    done: list[str] = field(default_factory=list)


class _DataflowBuilder:
    """UltraAttn's stream runtime (design note §2.6) instead of the executor's lockstep:
    every message leaves as soon as its sender holds what it carries (receives are posted
    ahead, so the receiver's progress does not hold it), every kernel runs as soon as its
    inputs have arrived, and each partial of a reduction leaves once the kernels that
    produce it are done. Ports and compute serialise FIFO, as in `_Builder`."""

    def __init__(self, plan: Plan, topology: Topology, compute: ComputeModel, *,
                 collective_overhead_s: float) -> None:
        self.plan = plan
        self.topology = topology
        self.compute = compute
        self.overhead = collective_overhead_s
        self.num_ranks = plan.layout.num_ranks
        self.owners = plan.layout.owners
        self.sim = Simulator()
        self.ports: set[str] = set()
        for g in range(self.num_ranks):
            self.sim.add_resource(f"r{g}.compute")
        self.start: list[str | None] = [None] * self.num_ranks
        self.compute_busy = [0.0] * self.num_ranks
        self.send_busy = [0.0] * self.num_ranks
        self.recv_busy = [0.0] * self.num_ranks

    def _port(self, name: str) -> str:
        if name not in self.ports:
            self.ports.add(name)
            self.sim.add_resource(name)
        return name

    def _message(self, name: str, src: int, dst: int, nbytes: int,
                 deps: Sequence[str]) -> str:
        level = self.topology.level(src, dst)
        link = self.topology.link_for(level)
        seconds = nbytes / link.bandwidth_Bps
        out, inn, arrive = f"{name}.send", f"{name}.recv", f"{name}.arrive"
        self.sim.add_task(out, seconds, resource=self._port(f"r{src}.send.{level}"),
                          deps=deps, category="comm")
        self.sim.add_task(inn, seconds, resource=self._port(f"r{dst}.recv.{level}"),
                          deps=deps, category="comm")
        self.sim.add_task(arrive, link.latency_s + self.overhead, deps=(out, inn),
                          category="latency")
        self.send_busy[src] += seconds
        self.recv_busy[dst] += seconds
        return arrive

    def _start_deps(self, g: int) -> tuple[str, ...]:
        start = self.start[g]
        return (start,) if start is not None else ()

    def add_pass(self, tag: str, stages: Sequence[Stage], reduce: Sequence[Transfer],
                 backward: bool) -> str:
        plan = self.plan
        row_kind = "q_bwd" if backward else "q"
        # (rank, kind, block) -> the arrival that brought the payload there
        arrival: dict[tuple[int, str, int], str] = {}
        made: dict[tuple[int, str, int], list[str]] = {}  # (rank, row/col kind, block) -> kernels
        tasks_of: list[list[str]] = [[] for _ in range(self.num_ranks)]
        for s, stage in enumerate(stages):
            groups: dict[tuple[int, int], list[Transfer]] = {}
            for t in stage.transfers:
                if t.src != t.dst:
                    groups.setdefault((t.src, t.dst), []).append(t)
            for (src, dst), transfers in groups.items():
                nbytes = sum(plan.transfer_bytes(t) for t in transfers)
                if nbytes <= 0:
                    continue
                deps = set(self._start_deps(src))
                for t in transfers:
                    held = arrival.get((src, t.kind, t.block))
                    if held is not None:
                        deps.add(held)
                arrive = self._message(f"{tag}.s{s}.{src}>{dst}", src, dst, nbytes,
                                       sorted(deps))
                for t in transfers:
                    arrival.setdefault((dst, t.kind, t.block), arrive)
            for i, kernel in enumerate(stage.kernels):
                g = kernel.rank
                deps = set(self._start_deps(g))
                for r in kernel.q_blocks:
                    if self.owners[r] != g:
                        deps.add(arrival[(g, row_kind, r)])
                for c in kernel.kv_blocks:
                    if self.owners[c] != g:
                        deps.add(arrival[(g, "kv", c)])
                name = f"{tag}.s{s}.k{i}"
                seconds = self.compute.kernel_time(kernel, plan.shape, backward, grid=plan.grid)
                self.sim.add_task(name, seconds, resource=f"r{g}.compute", deps=sorted(deps),
                                  category="compute")
                self.compute_busy[g] += seconds
                tasks_of[g].append(name)
                for r in kernel.q_blocks:
                    made.setdefault((g, "row", r), []).append(name)
                for c in kernel.kv_blocks:
                    made.setdefault((g, "col", c), []).append(name)
        groups = {}
        for t in reduce:
            if t.src != t.dst:
                groups.setdefault((t.src, t.dst), []).append(t)
        for (src, dst), transfers in groups.items():
            deps = set(self._start_deps(src))
            for t in transfers:
                deps.update(made.get((src, "col" if t.kind == "dkv" else "row", t.block), ()))
            nbytes = sum(plan.transfer_bytes(t) for t in transfers)
            arrive = self._message(f"{tag}.reduce.{src}>{dst}", src, dst, nbytes, sorted(deps))
            tasks_of[src].append(arrive)
            elements = sum(plan.shape.payload_elements(t.kind, plan.grid.block_len(t.block))
                           for t in transfers)
            seconds = self.compute.merge_time(elements, len(transfers))
            merge = f"{tag}.merge.{src}>{dst}"
            self.sim.add_task(merge, seconds, resource=f"r{dst}.compute", deps=(arrive,),
                              category="compute")
            self.compute_busy[dst] += seconds
            tasks_of[dst].append(merge)
        ends = []
        for g in range(self.num_ranks):
            task = f"{tag}.end.r{g}"
            self.sim.add_task(task, self.compute.pass_overhead_s, deps=(
                *self._start_deps(g), *tasks_of[g]), category="compute")
            self.compute_busy[g] += self.compute.pass_overhead_s
            self.start[g] = task
            ends.append(task)
        end = f"{tag}.end"
        self.sim.add_task(end, 0.0, deps=ends, category="sync")
        return end


_LEVELS: tuple[LinkLevel, ...] = ("intra_node", "inter_node", "inter_group")
_KIND_CODE = {kind: i for i, kind in enumerate(("q", "kv", "out", "q_bwd", "dq", "dkv"))}


class _StageEngine:
    """The same program as `_Builder`, evaluated stage by stage with numpy.

    Exact for a device per rank (no shared compute): a rank's tasks are a chain, so its
    clock is one number; an exchange's messages only meet messages of the same exchange
    on a port (a rank posts the next exchange after the previous one completed for it),
    so each port is a FIFO over one exchange, served by ready time, then by the order the
    messages were added (first appearance in the plan's transfers), as the event engine
    serves them. No timeline is kept, so large plans cost seconds, not minutes.
    """

    def __init__(self, plan: Plan, topology: Topology, compute: ComputeModel, *,
                 overlap: bool, comm_model: CommModel, collective_overhead_s: float,
                 exchange_cpu_s: float) -> None:
        self.plan = plan
        self.topology = topology
        self.compute = compute
        self.overlap = overlap
        self.comm_model = comm_model
        self.overhead = collective_overhead_s
        self.exchange_cpu_s = exchange_cpu_s
        R = self.num_ranks = plan.layout.num_ranks
        self.clock = np.zeros(R)
        self.compute_busy = np.zeros(R)
        self.send_busy = np.zeros(R)
        self.recv_busy = np.zeros(R)
        links = [topology.link_for(lvl) for lvl in _LEVELS]
        self.latency = np.asarray([link.latency_s for link in links])
        self.bandwidth = np.asarray([link.bandwidth_Bps for link in links])
        grid, shape = plan.grid, plan.shape
        self.block_lens = np.asarray([grid.block_len(i) for i in range(grid.num_blocks)],
                                     dtype=np.int64)
        self.token_bytes = np.asarray([shape.payload_bytes(kind, 1) for kind in _KIND_CODE],
                                      dtype=np.int64)
        self.token_elements = np.asarray([shape.payload_elements(kind, 1) for kind in _KIND_CODE],
                                         dtype=np.int64)

    def _level(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        topo = self.topology
        node_s, node_d = src // topo.ranks_per_node, dst // topo.ranks_per_node
        level = np.where(node_s == node_d, 0, 1)
        if topo.nodes_per_group is not None:
            level = np.where((level == 1) & (node_s // topo.nodes_per_group
                                             != node_d // topo.nodes_per_group), 2, level)
        return level

    def _arrays(self, transfers: Sequence[Transfer]) -> tuple[np.ndarray, ...]:
        n = len(transfers)
        src = np.fromiter((t.src for t in transfers), dtype=np.int64, count=n)
        dst = np.fromiter((t.dst for t in transfers), dtype=np.int64, count=n)
        kind = np.fromiter((_KIND_CODE[t.kind] for t in transfers), dtype=np.int64, count=n)
        block = np.fromiter((t.block for t in transfers), dtype=np.int64, count=n)
        return src, dst, kind, block

    def _exchange(self, transfers: Sequence[Transfer]) -> None:
        """Post an exchange at every rank's clock and advance each clock to its wait."""
        R = self.num_ranks
        posts = self.clock.copy()
        src, dst, kind, block = self._arrays(transfers)
        keep = src != dst
        src, dst = src[keep], dst[keep]
        nbytes = self.token_bytes[kind[keep]] * self.block_lens[block[keep]]
        # one message per (src, dst), in order of first appearance, as plan.message_bytes
        keys, first, inverse = np.unique(src * R + dst, return_index=True, return_inverse=True)
        total = np.bincount(inverse, weights=nbytes, minlength=keys.size)
        order = np.argsort(first, kind="stable")
        m_src, m_dst, m_bytes = keys[order] // R, keys[order] % R, total[order]
        nonzero = m_bytes > 0
        m_src, m_dst, m_bytes = m_src[nonzero], m_dst[nonzero], m_bytes[nonzero]
        level = self._level(m_src, m_dst)
        seconds = m_bytes / self.bandwidth[level]
        np.add.at(self.send_busy, m_src, seconds)
        np.add.at(self.recv_busy, m_dst, seconds)
        if self.comm_model == "collective":
            durations = np.zeros(R)
            for lvl in range(len(_LEVELS)):
                here = level == lvl
                if not here.any():
                    continue
                sent = np.bincount(m_src[here], weights=m_bytes[here], minlength=R)
                got = np.bincount(m_dst[here], weights=m_bytes[here], minlength=R)
                moved = np.maximum(sent, got)
                # alpha + bytes / beta of this class (direct_exchange_time) where it is used
                per = np.where(moved > 0, self.latency[lvl] + moved / self.bandwidth[lvl], 0.0)
                durations = np.maximum(durations, per)
            done = np.full(R, posts.max() + durations.max(initial=0.0) + self.overhead)
        else:
            ready = np.maximum(posts[m_src], posts[m_dst])
            index = np.arange(m_src.size)
            send_end = _fifo(m_src * len(_LEVELS) + level, ready, seconds, index)
            recv_end = _fifo(m_dst * len(_LEVELS) + level, ready, seconds, index)
            arrive = np.maximum(send_end, recv_end)
            done = posts.copy()
            np.maximum.at(done, m_src, arrive)
            np.maximum.at(done, m_dst, arrive)
            alpha = np.zeros(R)
            np.maximum.at(alpha, m_src, self.latency[level])
            np.maximum.at(alpha, m_dst, self.latency[level])
            done = done + alpha + self.overhead
        self.clock = np.maximum(self.clock, done) + self.exchange_cpu_s

    def _kernel_times(self, kernels: Sequence[Kernel], backward: bool) -> np.ndarray:
        c, shape = self.compute, self.plan.shape
        n = len(kernels)
        full = np.fromiter((k.full for k in kernels), dtype=bool, count=n)
        work = np.fromiter((k.elements for k in kernels), dtype=np.float64, count=n)
        if c.partial_work == "area" and not full.all():
            lens = self.block_lens
            area = np.fromiter(
                (0 if k.full else int(lens[list(k.q_blocks)].sum() * lens[list(k.kv_blocks)].sum())
                 for k in kernels), dtype=np.float64, count=n)
            work = np.where(full, work, area)
        elems = work * shape.batch * shape.num_heads
        flops = 4.0 * work * shape.num_heads * shape.head_dim * shape.batch
        n0 = c.half_efficiency_elements
        if backward and c.backward_half_efficiency_elements is not None:
            n0 = c.backward_half_efficiency_elements
        with np.errstate(divide="ignore", invalid="ignore"):
            eff = elems / (elems + n0)
            seconds = np.where(work > 0, flops / (c.flops_per_s * eff), 0.0)
        if backward:
            seconds = seconds * c.backward_factor
        slowdown = c.partial_slowdown
        if backward and c.partial_slowdown_backward is not None:
            slowdown = c.partial_slowdown_backward
        return np.where(full, seconds, seconds * slowdown)

    def _compute_stage(self, stage: Stage, backward: bool) -> None:
        if not stage.kernels:
            return
        ranks = np.fromiter((k.rank for k in stage.kernels), dtype=np.int64,
                            count=len(stage.kernels))
        per_rank = np.bincount(ranks, weights=self._kernel_times(stage.kernels, backward),
                               minlength=self.num_ranks)
        self.clock += per_rank
        self.compute_busy += per_rank

    def _merge(self, transfers: Sequence[Transfer]) -> None:
        c = self.compute
        src, dst, kind, block = self._arrays(transfers)
        keep = src != dst
        dst = dst[keep]
        elements = self.token_elements[kind[keep]] * self.block_lens[block[keep]]
        calls = np.bincount(dst, minlength=self.num_ranks).astype(np.float64)
        total = np.bincount(dst, weights=elements, minlength=self.num_ranks)
        seconds = np.where(calls > 0, calls * c.merge_call_s + c.merge_s_per_element * total,
                           0.0)
        self.clock += seconds
        self.compute_busy += seconds

    def add_pass(self, stages: Sequence[Stage], reduce: Sequence[Transfer],
                 backward: bool) -> float:
        if self.overlap:
            if stages and stages[0].transfers:
                pending: int | None = 0
            else:
                pending = None
            for s, stage in enumerate(stages):
                # the exchange of stage s was posted at the clocks of before; its wait is now
                if pending == s:
                    self._wait_pending()
                if s + 1 < len(stages) and stages[s + 1].transfers:
                    self._post_pending(stages[s + 1].transfers)
                    pending = s + 1
                self._compute_stage(stage, backward)
        else:
            for stage in stages:
                if stage.transfers:
                    self._exchange(stage.transfers)
                self._compute_stage(stage, backward)
        if reduce:
            self._exchange(reduce)
            self._merge(reduce)
        if self.compute.pass_overhead_s > 0:
            self.clock += self.compute.pass_overhead_s
            self.compute_busy += self.compute.pass_overhead_s
        return float(self.clock.max(initial=0.0))

    # overlap: an exchange is posted at one clock and waited at a later one -------------

    def _post_pending(self, transfers: Sequence[Transfer]) -> None:
        saved = self.clock.copy()
        cpu, self.exchange_cpu_s = self.exchange_cpu_s, 0.0
        self.clock = saved.copy()
        # evaluate the exchange as if waited immediately; keep its completion times
        self._exchange(transfers)
        self.exchange_cpu_s = cpu
        self._pending_done = self.clock  # done (ports) or end of the collective, per rank
        self.clock = saved

    def _wait_pending(self) -> None:
        self.clock = np.maximum(self.clock, self._pending_done) + self.exchange_cpu_s


def _fifo(port: np.ndarray, ready: np.ndarray, seconds: np.ndarray,
          index: np.ndarray) -> np.ndarray:
    """End times of tasks served FIFO on their ports: by ready time, then by index."""
    end = np.empty_like(ready)
    if port.size == 0:
        return end
    order = np.lexsort((index, ready, port))
    p, r, d = port[order], ready[order], seconds[order]
    starts = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
    stops = np.r_[starts[1:], p.size]
    out = r + d
    for a, b in zip(starts, stops):
        if b - a > 1:
            t = 0.0
            for i in range(a, b):
                t = max(r[i], t) + d[i]
                out[i] = t
    end[order] = out
    return end


def simulate_plan(plan: Plan, topology: Topology, compute: ComputeModel, *,
                  overlap: bool = True, backward: bool = True, comm_model: CommModel = "ports",
                  shared_compute_capacity: int | None = None,
                  collective_overhead_s: float = 0.0, exchange_cpu_s: float = 0.0,
                  engine: Engine = "auto", order: Order = "executor") -> SimResult:
    """List-schedule ``plan`` on ``topology`` (ranks are the topology's ranks 0..CP-1).

    Args:
        plan: the plan to run (any scheme; sampled grids are fine, nothing executes).
        topology: links per rank pair (`Topology.link`); its device is not read.
        compute: kernel and merge times.
        overlap: post the next stage's exchange before computing the current one, as the
            executor does (False: exchange, then compute, stage after stage).
        backward: simulate the backward pass after the forward.
        comm_model: "ports" or "collective" (module docstring).
        shared_compute_capacity: all ranks' compute queues on one resource with this many
            slots (emulated ranks sharing this many cores); None: a device per rank.
        collective_overhead_s: fixed seconds per exchange call beyond the link's alpha
            (launch and synchronisation; assumed for NCCL), a pure delay.
        exchange_cpu_s: seconds of the rank's compute resource each exchange takes when it
            completes (emulated ranks: the backend's work and wake-ups, which queue with
            the kernels on shared cores; `probe_host`).
        engine: "events" (the `furnace.runtime.simulator` task graph: a `Timeline` with
            the critical path, any compute sharing), "stages" (the same schedule evaluated
            stage by stage with numpy, a device per rank only, no timeline: for plans of
            hundreds of ranks) or "auto" (stages for plans above `STAGE_ENGINE_ABOVE`
            transfers and kernels when each rank has its own device).

        order: "executor" (the program of `execute.context_parallel_attention`, module
            docstring) or "dataflow" (UltraAttn's stream runtime, §2.6: messages and
            kernels start as soon as their data are there; ports model, event engine, a
            device per rank).

    Returns:
        The `SimResult`; with the event engine its `Timeline`
        (``timeline.to_chrome_trace(path)`` for Perfetto).
    """
    if engine not in ENGINES:
        raise PlanError("engine", f"one of {ENGINES}, got {engine!r}")
    if comm_model not in COMM_MODELS:
        raise PlanError("comm_model", f"one of {COMM_MODELS}, got {comm_model!r}")
    if shared_compute_capacity is not None and (
            isinstance(shared_compute_capacity, bool)
            or not isinstance(shared_compute_capacity, int) or shared_compute_capacity < 1):
        raise PlanError("shared_compute_capacity",
                        f"None or an integer >= 1, got {shared_compute_capacity!r}")
    _non_negative("collective_overhead_s", collective_overhead_s)
    _non_negative("exchange_cpu_s", exchange_cpu_s)
    if order not in ORDERS:
        raise PlanError("order", f"one of {ORDERS}, got {order!r}")
    if order == "dataflow":
        if comm_model != "ports" or shared_compute_capacity is not None \
                or engine == "stages" or not overlap or exchange_cpu_s:
            raise PlanError("order", "'executor' for this combination; 'dataflow' models "
                            "a GPU runtime: the ports model, a device per rank, overlap, the "
                            "event engine and no exchange_cpu_s")
        flow = _DataflowBuilder(plan, topology, compute,
                                collective_overhead_s=collective_overhead_s)
        fwd_end = flow.add_pass("fwd", plan.forward, plan.forward_reduce, backward=False)
        if backward:
            flow.add_pass("bwd", plan.backward, plan.backward_reduce, backward=True)
        return _event_result(plan, flow.sim.run(), fwd_end, flow.num_ranks, comm_model,
                             overlap, flow.compute_busy, flow.send_busy, flow.recv_busy,
                             order)
    if engine == "auto":
        size = sum(len(st.transfers) + len(st.kernels) for st in (*plan.forward, *plan.backward))
        engine = ("stages" if shared_compute_capacity is None and size > STAGE_ENGINE_ABOVE
                  else "events")
    if engine == "stages":
        if shared_compute_capacity is not None:
            raise PlanError("engine", "'events' when ranks share compute "
                            "(shared_compute_capacity); 'stages' needs a device per rank")
        fast = _StageEngine(plan, topology, compute, overlap=overlap, comm_model=comm_model,
                            collective_overhead_s=collective_overhead_s,
                            exchange_cpu_s=exchange_cpu_s)
        forward_s = fast.add_pass(plan.forward, plan.forward_reduce, backward=False)
        total_s = forward_s
        if backward:
            total_s = fast.add_pass(plan.backward, plan.backward_reduce, backward=True)
        return SimResult(
            scheme=plan.scheme, num_ranks=fast.num_ranks, comm_model=comm_model,
            overlap=overlap, forward_s=forward_s, makespan_s=total_s,
            compute_busy_s=tuple(float(x) for x in fast.compute_busy),
            send_busy_s=tuple(float(x) for x in fast.send_busy),
            recv_busy_s=tuple(float(x) for x in fast.recv_busy),
            critical_path_s={}, critical_path_tasks=0, timeline=None, engine="stages",
            order=order)
    builder = _Builder(plan, topology, compute, overlap=overlap, comm_model=comm_model,
                       shared_compute_capacity=shared_compute_capacity,
                       collective_overhead_s=collective_overhead_s,
                       exchange_cpu_s=exchange_cpu_s)
    fwd_end = builder.add_pass("fwd", plan.forward, plan.forward_reduce, backward=False)
    if backward:
        builder.add_pass("bwd", plan.backward, plan.backward_reduce, backward=True)
    return _event_result(plan, builder.sim.run(), fwd_end, builder.num_ranks, comm_model,
                         overlap, builder.compute_busy, builder.send_busy, builder.recv_busy,
                         order)


def _event_result(plan: Plan, timeline: Timeline, fwd_end: str, num_ranks: int,
                  comm_model: str, overlap: bool, compute_busy: Sequence[float],
                  send_busy: Sequence[float], recv_busy: Sequence[float],
                  order: str) -> SimResult:
    path = timeline.critical_path()
    split: dict[str, float] = {}
    for st in path:
        cat = st.task.category or "other"
        split[cat] = split.get(cat, 0.0) + st.duration
    return SimResult(
        scheme=plan.scheme, num_ranks=num_ranks, comm_model=comm_model, overlap=overlap,
        forward_s=timeline[fwd_end].end, makespan_s=timeline.makespan,
        compute_busy_s=tuple(compute_busy), send_busy_s=tuple(send_busy),
        recv_busy_s=tuple(recv_busy),
        critical_path_s={k: v for k, v in split.items() if v > 0},
        critical_path_tasks=len(path), timeline=timeline, engine="events", order=order)


# ----------------------------------------------------------------------------- validation


def r_squared(measured: Sequence[float], predicted: Sequence[float]) -> float:
    """``1 - SS_res / SS_tot`` of predictions against measurements (the paper's Fig. 11
    statistic); raises when the measurements do not vary (R^2 is then meaningless)."""
    y = np.asarray(measured, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    if y.shape != p.shape or y.size < 2:
        raise ValueError(f"need two equal-length series of >= 2 values, got {y.size}, {p.size}")
    total = float(np.sum((y - y.mean()) ** 2))
    if not total > 0:
        raise ValueError("the measurements are all equal: R^2 has no meaning")
    return 1.0 - float(np.sum((y - p) ** 2)) / total


@dataclass(frozen=True)
class ValidationConfig:
    """What `validate` measures: emulated runs of ring and the tiled plan, then simulates.

    The emulated link (``bandwidth_Bps``, ``latency_s``, `presets.emulated_link`, netem
    "sleep" mode) is slow enough that communication matters next to this CPU's compute.
    ``tokens_per_rank`` fixes the sequence length per rank count (S = CP x it) and
    ``blocks_per_rank`` the grid (P = CP x it; even, so that zigzag applies).
    ``time_limit_s`` bounds the planner's solves; the plans are rebuilt for the simulator
    and must come out the same (a time-limited solve may not: `validate` then raises).
    """

    rank_counts: tuple[int, ...] = (2, 4, 8)
    masks: tuple[str, ...] = ("causal", "strided", "document")
    schemes: tuple[str, ...] = ("ring", "tiled")
    tokens_per_rank: int = 256
    blocks_per_rank: int = 4
    batch: int = 1
    num_heads: int = 2
    num_kv_heads: int = 2
    head_dim: int = 32
    dtype: str = "float32"
    bandwidth_Bps: float = 100e6
    latency_s: float = 1e-3
    repeats: int = 5
    warmup: int = 1
    backward: bool = True
    time_limit_s: float = 2.0
    comm_model: CommModel = "ports"
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.rank_counts or any(isinstance(w, bool) or not isinstance(w, int) or w < 2
                                       for w in self.rank_counts):
            raise PlanError("rank_counts", f"integers >= 2, got {self.rank_counts!r}")
        if not self.masks:
            raise PlanError("masks", "at least one mask name")
        if not self.schemes:
            raise PlanError("schemes", "at least one scheme")
        for name in ("tokens_per_rank", "blocks_per_rank", "batch", "num_heads",
                     "num_kv_heads", "head_dim", "repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError(name, f"must be an integer >= 1, got {value!r}")
        if self.tokens_per_rank % self.blocks_per_rank:
            raise PlanError("blocks_per_rank", f"a divisor of tokens_per_rank "
                            f"({self.tokens_per_rank}), got {self.blocks_per_rank}")
        _positive("bandwidth_Bps", self.bandwidth_Bps)
        _non_negative("latency_s", self.latency_s)
        if self.comm_model not in COMM_MODELS:
            raise PlanError("comm_model", f"one of {COMM_MODELS}, got {self.comm_model!r}")

    @classmethod
    def quick(cls) -> ValidationConfig:
        """2 and 4 ranks, one mask, 3 rounds: the quick variant."""
        return cls(rank_counts=(2, 4), masks=("strided",), repeats=3)

    @property
    def block_size(self) -> int:
        return self.tokens_per_rank // self.blocks_per_rank

    def topology(self) -> Topology:
        return emulated_link(bandwidth_Bps=self.bandwidth_Bps, latency_s=self.latency_s)


@dataclass(frozen=True)
class ValidationRow:
    """One (ranks, mask, scheme): the measured median (emulated) and the simulated times."""

    num_ranks: int
    mask: str
    scheme: str
    plan_scheme: str
    measured_s: float
    simulated_s: float
    simulated_collective_s: float
    measured_spread: float
    calibrated_flops_per_s: float

    @property
    def ratio(self) -> float:
        """measured / simulated."""
        return self.measured_s / self.simulated_s


@dataclass(frozen=True)
class ValidationResult:
    """Measured (label "emulated") against simulated (label "simulated") times."""

    rows: tuple[ValidationRow, ...]
    compute: ComputeModel
    probes: Mapping[int, HostProbe]
    config: ValidationConfig
    wall_s: float

    @property
    def r_squared(self) -> float:
        return r_squared([r.measured_s for r in self.rows], [r.simulated_s for r in self.rows])

    @property
    def r_squared_collective(self) -> float:
        return r_squared([r.measured_s for r in self.rows],
                         [r.simulated_collective_s for r in self.rows])

    @property
    def max_relative_error(self) -> float:
        """max over rows of |simulated - measured| / measured."""
        return max(abs(r.simulated_s - r.measured_s) / r.measured_s for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [{**vars(r), "ratio": r.ratio} for r in self.rows],
                "r_squared": self.r_squared, "r_squared_collective": self.r_squared_collective,
                "max_relative_error": self.max_relative_error,
                "compute": self.compute.describe(),
                "probes": {w: vars(p) for w, p in self.probes.items()}, "wall_s": self.wall_s}

    def summary(self) -> str:
        lines = [f"{'ranks':>5} {'mask':<10} {'scheme':<8} {'plan':<18} {'emulated ms':>11} "
                 f"{'simulated ms':>12} {'ratio':>6} {'collective ms':>13} {'spread %':>8} "
                 f"{'GFLOP/s':>7}"]
        for r in self.rows:
            lines.append(f"{r.num_ranks:>5} {r.mask:<10} {r.scheme:<8} {r.plan_scheme:<18} "
                         f"{r.measured_s * 1e3:>11.2f} {r.simulated_s * 1e3:>12.2f} "
                         f"{r.ratio:>6.3f} {r.simulated_collective_s * 1e3:>13.2f} "
                         f"{100 * r.measured_spread:>8.1f} {r.calibrated_flops_per_s / 1e9:>7.1f}")
        probes = "; ".join(f"{w} ranks: exchange +{p.exchange_overhead_s * 1e3:.3g} ms, "
                           f"compute x{p.compute_slowdown:.3g}" for w, p in self.probes.items())
        lines.append(f"R^2 {self.r_squared:.4f} ({self.config.comm_model} model), "
                     f"{self.r_squared_collective:.4f} (collective model); max relative "
                     f"error {100 * self.max_relative_error:.1f}%")
        lines.append(f"compute: {self.compute.describe()}")
        lines.append(f"host (measured): {probes}")
        return "\n".join(lines)


def _host_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class HostProbe:
    """How this machine runs ``num_ranks`` emulated ranks right now (label "measured").

    ``exchange_overhead_s``: seconds an emulated exchange takes beyond its modelled time
    (the emulator's control all-reduce, gloo, the ranks' wake-ups). ``compute_slowdown``:
    a kernel step's seconds with every rank computing at once, over
    ``min(cores, num_ranks) / num_ranks`` times its seconds in one process: 1 when the
    ranks share the cores ideally, more when the cores are shared with other work or
    the ranks get in each other's way (caches, memory bandwidth).
    """

    num_ranks: int
    exchange_overhead_s: float
    compute_slowdown: float


def _step_fn(shape: AttentionShape, block_size: int) -> Callable[[], object]:
    """One full-block forward kernel step (call and merge) of the executor."""
    import torch

    from .kernels import block_forward, merge_partial

    gen = torch.Generator().manual_seed(2)
    q = torch.randn(shape.batch, shape.num_heads, block_size, shape.head_dim,
                    dtype=shape.torch_dtype, generator=gen)
    kv = torch.randn(shape.batch, shape.num_kv_heads, block_size, shape.head_dim,
                     dtype=shape.torch_dtype, generator=gen)
    ids = torch.arange(block_size, dtype=torch.int64)
    acc = block_forward(q, kv, kv, ids + block_size, ids, mask_mod=None, full=True)

    def step() -> object:
        part = block_forward(q, kv, kv, ids + block_size, ids, mask_mod=None, full=True)
        return merge_partial(*acc, *part)

    return step


def _probe_rank(rank: int, world_size: int, topology: Topology, rank_counts: tuple[int, ...],
                shape: AttentionShape, block_size: int, steps: int,
                repeats: int) -> dict[int, tuple[float, float]]:
    """Per rank count W: (median seconds of a 1-float exchange among ranks 0..W-1 through
    the emulator, seconds per kernel step with ranks 0..W-1 computing at once)."""
    import torch
    import torch.distributed as dist

    from furnace.runtime.comm import Communicator
    from furnace.runtime.netem import NetworkEmulation, NetworkEmulator
    from furnace.runtime.timing import stopwatch, time_call

    sync = Communicator(name="sync")
    step = _step_fn(shape, block_size)
    out: dict[int, tuple[float, float]] = {}
    for w in rank_counts:
        # every rank creates every group (new_group is collective), only members use it
        group = dist.new_group(list(range(w)))
        exchange = compute = 0.0
        if rank < w:
            network = NetworkEmulator(NetworkEmulation(topology=topology), rank=rank)
            comm = Communicator(group, network=network, name="probe")
            inner = Communicator(group, name="probe-sync")
            x = torch.zeros(w)
            exchange = time_call(functools.partial(comm.all_to_all_single, x),
                                 repeats=repeats, warmup=2, setup=inner.barrier).median
            step()
            inner.barrier()
            with stopwatch() as lap:
                for _ in range(steps):
                    step()
            compute = lap.seconds / steps
        sync.barrier()
        out[w] = (exchange, compute)
    return out


def probe_host(topology: Topology, rank_counts: Sequence[int], shape: AttentionShape,
               block_size: int, *, steps: int = 100, repeats: int = 15) -> dict[int, HostProbe]:
    """`HostProbe` for each rank count, from ONE `run_distributed` job of the largest count
    (smaller counts run on a subgroup while the other ranks wait)."""
    from furnace.runtime.launch import run_distributed
    from furnace.runtime.timing import time_call

    counts = tuple(sorted({int(w) for w in rank_counts}))
    if not counts or counts[0] < 2:
        raise PlanError("rank_counts", f"integers >= 2, got {rank_counts!r}")
    single = time_call(_step_fn(shape, block_size), repeats=max(steps // 4, 5), warmup=2,
                       num_threads=1).median
    per_rank = run_distributed(_probe_rank, counts[-1], topology, counts, shape, block_size,
                               steps, repeats, timeout_s=180)
    link = topology.inter_node
    cores = _host_cores()
    probes = {}
    for w in counts:
        modelled = link.latency_s + 4 * (w - 1) / link.bandwidth_Bps
        exchange = max(r[w][0] for r in per_rank[:w])
        step_s = max(r[w][1] for r in per_rank[:w])
        ideal = single * w / min(cores, w)
        probes[w] = HostProbe(num_ranks=w, exchange_overhead_s=max(0.0, exchange - modelled),
                              compute_slowdown=step_s / ideal)
    return probes


def validate(config: ValidationConfig | None = None, *,
             progress: Callable[[str], object] | None = None) -> ValidationResult:
    """Measure ``config.schemes`` on emulated links and simulate the very same plans.

    One `bench.measure_schemes` job per (rank count, mask): the schemes interleaved round
    by round, the median of the rounds' slowest-rank times (label "emulated"). The
    simulator gets the plans the job ran (`BenchResult.plans`, checked against the job's
    byte counts), the emulated link, the compute of
    `calibrate_cpu` (measured right before each job) slowed by the `probe_host` factor of
    the rank count, the ranks' compute sharing this machine's cores
    (``shared_compute_capacity``), and the probed exchange overhead, charged as compute on
    those cores. Nothing is fitted to the validated times.
    """
    from .bench import BenchConfig, measure_schemes
    from .plan import AttentionShape

    cfg = config or ValidationConfig()
    t0 = time.perf_counter()
    shape = AttentionShape(batch=cfg.batch, num_heads=cfg.num_heads,
                           num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                           dtype=cfg.dtype)
    b = cfg.block_size
    sizes = sorted({max(1, b // 2), b, 2 * b})
    compute = calibrate_cpu(shape, sizes)
    topology = cfg.topology()
    cores = _host_cores()
    rows: list[ValidationRow] = []
    if progress is not None:
        progress("probing the host: exchange overhead and shared compute")
    probes = probe_host(topology, cfg.rank_counts, shape, b)
    for num_ranks in cfg.rank_counts:
        probe = probes[num_ranks]
        capacity = min(cores, num_ranks)
        # the probe's ranks share the cores: its wall overhead is num_ranks / capacity
        # times the work each rank does per exchange
        exchange_cpu_s = probe.exchange_overhead_s * capacity / num_ranks
        for mask in cfg.masks:
            if progress is not None:
                progress(f"{num_ranks} ranks, {mask}")
            # calibrated again right before the run: other work on the machine comes and
            # goes, and the kernels' speed with it
            compute = calibrate_cpu(shape, sizes, repeats=3)
            loaded = compute.slowed(probe.compute_slowdown)
            bench = BenchConfig(
                mask=mask, seq_len=num_ranks * cfg.tokens_per_rank,
                num_blocks=num_ranks * cfg.blocks_per_rank, num_ranks=num_ranks,
                batch=cfg.batch, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                head_dim=cfg.head_dim, dtype=cfg.dtype, schemes=cfg.schemes,
                repeats=cfg.repeats, warmup=cfg.warmup, bandwidth_Bps=cfg.bandwidth_Bps,
                latency_s=cfg.latency_s, backward=cfg.backward,
                time_limit_s=cfg.time_limit_s, timeout_s=cfg.timeout_s)
            result = measure_schemes(bench)
            plans = result.plans
            for measured in result.schemes:
                plan = plans[measured.name]
                _check_same_plan(plan, measured, cfg.backward)
                sims = [simulate_plan(plan, topology, loaded, backward=cfg.backward,
                                      comm_model=model, shared_compute_capacity=capacity,
                                      exchange_cpu_s=exchange_cpu_s).makespan_s
                        for model in (cfg.comm_model, "collective")]
                times = measured.seconds
                spread = (max(times) - min(times)) / statistics.median(times)
                rows.append(ValidationRow(num_ranks, mask, measured.name, plan.scheme,
                                          measured.median_s, sims[0], sims[1], spread,
                                          compute.flops_per_s))
    return ValidationResult(rows=tuple(rows), compute=compute, probes=probes, config=cfg,
                            wall_s=time.perf_counter() - t0)


def _check_same_plan(plan: Plan, measured: Any, backward: bool) -> None:
    """The rebuilt plan must be the one the job ran: same scheme, same bytes per rank."""
    stats = plan.stats()
    planned_in = tuple(int(f + (b if backward else 0))
                       for f, b in zip(stats.forward_in, stats.backward_in))
    planned_out = tuple(int(f + (b if backward else 0))
                        for f, b in zip(stats.forward_out, stats.backward_out))
    if (plan.scheme != measured.plan_scheme or planned_in != tuple(measured.planned_in)
            or planned_out != tuple(measured.planned_out)):
        raise PlanError("plan", f"the plan the benchmark ran for {measured.name}; rebuilding "
                        f"it gave {plan.scheme} with other byte counts (a time-limited "
                        "solve?): raise time_limit_s or use a smaller grid")


# -------------------------------------------------------------------------- scaling study


@dataclass(frozen=True)
class ScalingRow:
    """One (mask, ranks) of the projection (label "simulated"), fwd+bwd seconds.

    ``*_s``: under the executor's program (what `execute.context_parallel_attention`
    runs); ``*_dataflow_s``: under UltraAttn's stream runtime (``order="dataflow"``), NaN
    where not simulated (above ``dataflow_max_ranks``).
    """

    mask: str
    num_ranks: int
    seq_len: int
    num_blocks: int
    scheme: str
    ring_s: float
    zigzag_ring_s: float
    tiled_s: float
    ring_dataflow_s: float
    zigzag_ring_dataflow_s: float
    tiled_dataflow_s: float
    ring_max_port_bytes: int
    tiled_max_port_bytes: int
    ring_balance: float
    tiled_balance: float
    plan_s: float
    label: str = "simulated"

    @property
    def speedup_vs_ring(self) -> float:
        return self.ring_s / self.tiled_s

    @property
    def speedup_vs_best_ring(self) -> float:
        """Over the faster of ring and zigzag ring (the paper compares with the best)."""
        return min(self.ring_s, self.zigzag_ring_s) / self.tiled_s

    @property
    def dataflow_speedup_vs_best_ring(self) -> float:
        """The same comparison with every scheme on the stream runtime (NaN if skipped)."""
        return min(self.ring_dataflow_s, self.zigzag_ring_dataflow_s) / self.tiled_dataflow_s


@dataclass(frozen=True)
class ScalingStudy:
    """The projection's rows, with every assumption it rests on (label "simulated")."""

    rows: tuple[ScalingRow, ...]
    assumptions: Mapping[str, str]
    label: str = "simulated"
    paper_speedup_64: float = PAPER_SPEEDUP_64

    def mean_speedup(self, num_ranks: int, *, dataflow: bool = False) -> float:
        """Mean over masks of the speedup over the best ring at ``num_ranks``."""
        values = [r.dataflow_speedup_vs_best_ring if dataflow else r.speedup_vs_best_ring
                  for r in self.rows if r.num_ranks == num_ranks]
        if not values:
            raise ValueError(f"no rows at {num_ranks} ranks")
        return statistics.fmean(values)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [{**vars(r), "speedup_vs_ring": r.speedup_vs_ring,
                          "speedup_vs_best_ring": r.speedup_vs_best_ring,
                          "dataflow_speedup_vs_best_ring": r.dataflow_speedup_vs_best_ring}
                         for r in self.rows],
                "assumptions": dict(self.assumptions), "label": self.label,
                "paper_speedup_64": self.paper_speedup_64}

    def summary(self) -> str:
        lines = [f"{'mask':<13} {'ranks':>5} {'P':>5} {'chosen':<19} {'ring ms':>8} "
                 f"{'zigzag':>8} {'tiled':>8} {'x best':>6} | {'dataflow: ring':>14} "
                 f"{'zigzag':>8} {'tiled':>8} {'x best':>6} | {'ring MB':>8} {'tiled MB':>8}"]
        for r in self.rows:
            lines.append(
                f"{r.mask:<13} {r.num_ranks:>5} {r.num_blocks:>5} {r.scheme:<19} "
                f"{r.ring_s * 1e3:>8.1f} {r.zigzag_ring_s * 1e3:>8.1f} {r.tiled_s * 1e3:>8.1f} "
                f"{r.speedup_vs_best_ring:>6.2f} | {r.ring_dataflow_s * 1e3:>14.1f} "
                f"{r.zigzag_ring_dataflow_s * 1e3:>8.1f} {r.tiled_dataflow_s * 1e3:>8.1f} "
                f"{r.dataflow_speedup_vs_best_ring:>6.2f} | "
                f"{r.ring_max_port_bytes / 1e6:>8.0f} {r.tiled_max_port_bytes / 1e6:>8.0f}")
        lines.append(f"(all {self.label}, fwd+bwd; x best: over the faster of ring and zigzag "
                     f"ring; paper: {self.paper_speedup_64}x average over the best ring "
                     "baseline on irregular masks at 64 GPUs)")
        lines.extend(f"  assumption {k}: {v}" for k, v in self.assumptions.items())
        return "\n".join(lines)


def _assumptions(topology: Topology, compute: ComputeModel, overhead_s: float,
                 comm_model: str) -> dict[str, str]:
    intra, inter = topology.intra_node, topology.inter_node
    return {
        "topology": f"{topology.name}: {topology.ranks_per_node} GPUs a node",
        "alpha": f"intra-node {intra.latency_s * 1e6:g} us, inter-node "
                 f"{inter.latency_s * 1e6:g} us (assumed)",
        "beta": f"intra-node {intra.bandwidth_Bps / 1e9:g} GB/s ({intra.name}), inter-node "
                f"{inter.bandwidth_Bps / 1e9:g} GB/s ({inter.name}) per GPU per direction",
        "flops": f"{compute.flops_per_s / 1e12:.4g} TFLOP/s attainable ({compute.label}: "
                 f"{compute.source})",
        "n0": f"{compute.half_efficiency_elements:.3g} elements at half efficiency "
              f"({compute.label})",
        "backward": f"x{compute.backward_factor:g} the forward's time",
        "exchange overhead": f"{overhead_s * 1e6:g} us per all_to_all (assumed NCCL launch)",
        "comm model": comm_model,
    }


def scaling_study(masks: Sequence[str] = ("strided", "global_local", "star", "streaming",
                                          "document"),
                  rank_counts: Sequence[int] = (64, 128, 256, 512, 1024), *,
                  seq_len: int = 1 << 19, shape: AttentionShape | None = None,
                  topology: Topology | None = None, compute: ComputeModel | None = None,
                  blocks_per_rank: int = 2, ranks_per_node: int = 8,
                  config: TilingConfig | None = None, layouts: Sequence[str] | None = None,
                  dataflow_max_ranks: int = 256,
                  collective_overhead_s: float = GPU_EXCHANGE_STEP_OVERHEAD_S,
                  progress: Callable[[str], object] | None = None) -> ScalingStudy:
    """Project ring, zigzag ring and the planner's choice to ``rank_counts`` GPUs.

    For each mask and rank count: a sampled block grid (`masks.sampled_block_grid`) of
    ``seq_len`` tokens in ``blocks_per_rank * CP`` blocks, the planner's plan
    (`context_tiling.plan_attention` with ``ranks_per_node`` and ``topology``:
    hierarchical, greedy at large sizes, the best of every candidate by its estimate, over
    ``layouts``, default all), ring and zigzag ring, each simulated fwd+bwd on ``topology``
    (default `presets.h100_ib`) with ``compute`` (default `gpu_compute_model`, assumed),
    ports model: under the executor's program and, up to ``dataflow_max_ranks``, under
    UltraAttn's stream runtime. Strong scaling: ``seq_len`` is fixed. Default shape:
    Llama2-7B's attention with Nh = 32, D = 128 in bfloat16 (the paper's setup, design
    note §3).
    """
    from .baselines import ring_plan
    from .context_tiling import TilingConfig, plan_attention
    from .layout import LAYOUTS
    from .masks import make_mask, sampled_block_grid
    from .plan import AttentionShape

    shape = shape or AttentionShape(batch=1, num_heads=32, num_kv_heads=32, head_dim=128,
                                    dtype="bfloat16")
    topology = topology or get_preset("h100-ib", gpus_per_node=ranks_per_node)
    compute = compute or gpu_compute_model(topology, shape.dtype)
    config = config or TilingConfig(time_limit_s=0.5)
    rows = []
    for mask_name in masks:
        for num_ranks in rank_counts:
            if progress is not None:
                progress(f"{mask_name} on {num_ranks} ranks")
            num_blocks = blocks_per_rank * num_ranks
            if num_blocks > seq_len:
                raise PlanError("seq_len", f"at least {num_blocks} tokens for {num_blocks} "
                                f"blocks, got {seq_len}")
            block_size = -(-seq_len // num_blocks)
            # about 2**14 sampled positions per side keeps the grid's cost near a second
            samples = max(4, min(32, (1 << 14) // num_blocks))
            grid = sampled_block_grid(make_mask(mask_name, seq_len), seq_len, block_size,
                                      samples_per_block=samples)
            t0 = time.perf_counter()
            chosen = plan_attention(grid, num_ranks, shape, config=config,
                                    layouts=tuple(layouts or LAYOUTS),
                                    ranks_per_node=ranks_per_node
                                    if ranks_per_node < num_ranks else None,
                                    topology=topology)
            plan_s = time.perf_counter() - t0
            ring = ring_plan(grid, shape, "contiguous", num_ranks)
            zigzag = ring_plan(grid, shape, "zigzag", num_ranks)

            def run(plan: Plan, order: Order, num_ranks: int = num_ranks) -> float:
                if order == "dataflow" and num_ranks > dataflow_max_ranks:
                    return math.nan
                return simulate_plan(plan, topology, compute, order=order,
                                     engine="events" if order == "dataflow" else "auto",
                                     collective_overhead_s=collective_overhead_s).makespan_s

            ring_stats, tiled_stats = ring.stats(), chosen.stats()
            rows.append(ScalingRow(
                mask=mask_name, num_ranks=num_ranks, seq_len=seq_len,
                num_blocks=grid.num_blocks, scheme=chosen.scheme,
                ring_s=run(ring, "executor"), zigzag_ring_s=run(zigzag, "executor"),
                tiled_s=run(chosen, "executor"), ring_dataflow_s=run(ring, "dataflow"),
                zigzag_ring_dataflow_s=run(zigzag, "dataflow"),
                tiled_dataflow_s=run(chosen, "dataflow"),
                ring_max_port_bytes=int(ring_stats.max_port),
                tiled_max_port_bytes=int(tiled_stats.max_port),
                ring_balance=float(ring_stats.balance), tiled_balance=float(tiled_stats.balance),
                plan_s=plan_s))
    return ScalingStudy(rows=tuple(rows),
                        assumptions=_assumptions(topology, compute, collective_overhead_s,
                                                 "ports"))


def scaling_study_quick(**overrides: Any) -> ScalingStudy:
    """64 and 128 ranks, 2 masks, the zigzag layout only, short solves, the stream runtime
    at 64 ranks only: the quick variant."""
    from .context_tiling import TilingConfig

    args: dict[str, Any] = {"masks": ("strided", "global_local"), "rank_counts": (64, 128),
                            "layouts": ("zigzag",), "config": TilingConfig(time_limit_s=0.2),
                            "dataflow_max_ranks": 64}
    args.update(overrides)
    return scaling_study(**args)


# ---------------------------------------------------------------------------------- CLI


def simulate_cli(grid: BlockGrid, shape: AttentionShape, *, num_ranks: int,
                 ranks_per_node: int, preset: str, config: TilingConfig,
                 trace: Path | str | None, console: Console) -> int:
    """`furnace cp simulate`: ring baselines against the planner's plan, simulated."""
    from .baselines import ring_plan
    from .context_tiling import plan_attention

    topology = get_preset(preset, gpus_per_node=ranks_per_node)
    compute = gpu_compute_model(topology, shape.dtype)
    chosen = plan_attention(grid, num_ranks, shape, config=config,
                            ranks_per_node=ranks_per_node if ranks_per_node < num_ranks
                            else None, topology=topology)
    plans: dict[str, Plan] = {}
    for layout, name in (("contiguous", "ring"), ("zigzag", "zigzag_ring"),
                         ("striped", "striped_ring")):
        try:
            plans[name] = ring_plan(grid, shape, layout, num_ranks)
        except LayoutError:
            continue  # a layout the grid's block count does not allow
    chosen_name = f"chosen: {chosen.scheme}"
    plans[chosen_name] = chosen
    results = {name: simulate_plan(plan, topology, compute,
                                   collective_overhead_s=GPU_EXCHANGE_STEP_OVERHEAD_S,
                                   engine="events" if trace is not None and plan is chosen
                                   else "auto")
               for name, plan in plans.items()}
    ring_s = results["ring"].makespan_s if "ring" in results else math.nan
    console.print(_sim_table(plans, results, ring_s, num_ranks, topology))
    for key, value in _assumptions(topology, compute, GPU_EXCHANGE_STEP_OVERHEAD_S,
                                   "ports").items():
        console.print(f"  assumption {key}: {value}", highlight=False)
    timeline = results[chosen_name].timeline
    if trace is not None and timeline is not None:
        timeline.to_chrome_trace(trace)
        console.print(f"wrote {trace} (simulated timeline of the chosen plan)")
    return 0


def _sim_table(plans: Mapping[str, Plan], results: Mapping[str, SimResult], ring_s: float,
               num_ranks: int, topology: Topology) -> Table:
    from rich.table import Table

    table = Table(title=f"simulated on {num_ranks} GPUs of {topology.name} (fwd+bwd)")
    for col in ("scheme", "forward ms", "backward ms", "total ms", "x ring", "max port MB",
                "balance", "critical path"):
        table.add_column(col, justify="left" if col in ("scheme", "critical path") else "right")
    for name, res in results.items():
        stats = plans[name].stats()
        path = ", ".join(f"{k} {100 * v / res.makespan_s:.0f}%"
                         for k, v in res.critical_path_s.items()) if res.makespan_s else ""
        table.add_row(name, f"{res.forward_s * 1e3:.3f}", f"{res.backward_s * 1e3:.3f}",
                      f"{res.makespan_s * 1e3:.3f}", f"{ring_s / res.makespan_s:.2f}",
                      f"{stats.max_port / 1e6:.2f}", f"{stats.balance:.2f}", path)
    return table
