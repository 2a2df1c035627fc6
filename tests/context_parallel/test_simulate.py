"""Tests of the discrete-event projection (`furnace.context_parallel.simulate`, UltraAttn,
Yang et al., SC'25; design note §6.5): a two-rank ring worked by hand, ring on a full mask
against its closed form at 2-8 ranks, overlap never slower than the serial program, the
stage engine equal to the event engine, the collective model equal to the executor's
virtual-clock run, the stream runtime, the compute model and a tiny labelled scaling study."""

from __future__ import annotations

import itertools
import math

import pytest

from furnace.context_parallel import simulate
from furnace.context_parallel.baselines import baseline_plans, ring_plan
from furnace.context_parallel.bench import MaskSpec
from furnace.context_parallel.config import PlanError
from furnace.context_parallel.masks import build_block_grid, make_mask
from furnace.context_parallel.plan import AttentionShape, Plan, build_plan
from furnace.context_parallel.simulate import (
    ComputeModel,
    ValidationConfig,
    calibrate_cpu,
    r_squared,
    scaling_study,
    simulate_plan,
)
from furnace.runtime.launch import run_distributed
from furnace.runtime.presets import emulated_link, h100_ib

# models, counts and virtual clocks: nothing here rounds differently with the thread
# count, so `make test`'s 1-thread pass skips it
pytestmark = pytest.mark.thread_independent

SHAPE = AttentionShape(batch=1, num_heads=1, num_kv_heads=1, head_dim=4, dtype="float32")
BLOCK = 8
# one full 8 x 8 block: 4 * 64 * 1 * 4 FLOPs; the rate makes it exactly KERNEL_S
KERNEL_S = 0.010
FLOPS = 4 * BLOCK * BLOCK * 4 / KERNEL_S
ALPHA, BETA = 1e-3, 1e4
KV_BYTES = BLOCK * 2 * 4 * 4  # k and v of one block: 8 tokens x 2 x D x float32
SLOW = emulated_link(bandwidth_Bps=BETA, latency_s=ALPHA)
COMPUTE = ComputeModel(flops_per_s=FLOPS)
REL = 1e-12


def _full_ring(num_ranks: int) -> Plan:
    grid = build_block_grid(make_mask("full", BLOCK * num_ranks), BLOCK * num_ranks, BLOCK)
    return ring_plan(grid, SHAPE, "contiguous", num_ranks)


def _ring_closed_form(num_ranks: int, overlap: bool) -> float:
    """Ring attention on a full mask, one block per rank, ports model.

    Forward: the local block, then CP-1 steps of (kv block in, one kernel), each step
    max(kernel, message) when overlapped. Backward: the same at 2.5x the kernel, then every
    rank sends its CP-1 dkv partials to their owners over its one port (one latency).
    """
    message = ALPHA + KV_BYTES / BETA
    steps = num_ranks - 1
    fwd, bwd = KERNEL_S, 2.5 * KERNEL_S
    if overlap:
        total = fwd + steps * max(fwd, message) + bwd + steps * max(bwd, message)
    else:
        total = fwd + steps * (fwd + message) + bwd + steps * (bwd + message)
    return total + ALPHA + steps * KV_BYTES / BETA


def _close(a: float, b: float, rel: float = REL) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


@pytest.mark.timeout(30)
def test_two_rank_ring_by_hand():
    plan = _full_ring(2)
    message = ALPHA + KV_BYTES / BETA  # 1 ms + 25.6 ms: longer than the forward kernel
    for model, engine in itertools.product(("ports", "collective"), ("events", "stages")):
        res = simulate_plan(plan, SLOW, COMPUTE, comm_model=model, engine=engine)
        # forward: the local block (10 ms) while kv crosses (26.6 ms), then the remote one
        assert _close(res.forward_s, message + KERNEL_S)
        # backward: 25 ms local while kv crosses again, 25 ms remote, 26.6 ms of dkv back
        assert _close(res.backward_s, max(2.5 * KERNEL_S, message) + 2.5 * KERNEL_S + message)
        assert res.label == "simulated" and res.num_ranks == 2
        assert _close(sum(res.compute_busy_s), 2 * 2 * 3.5 * KERNEL_S)
    serial = simulate_plan(plan, SLOW, COMPUTE, overlap=False, engine="events")
    assert _close(serial.forward_s, KERNEL_S + message + KERNEL_S)
    traced = simulate_plan(plan, SLOW, COMPUTE, engine="events")
    assert traced.timeline is not None and traced.critical_path_s
    assert math.isclose(sum(traced.critical_path_s.values()), traced.makespan_s, rel_tol=1e-9)
    trace = traced.timeline.to_chrome_trace()
    assert any(e.get("name", "").startswith("fwd.s1") for e in trace["traceEvents"])


@pytest.mark.timeout(30)
@pytest.mark.parametrize("num_ranks", [2, 4, 8])
def test_ring_on_a_full_mask_follows_the_closed_form(num_ranks):
    plan = _full_ring(num_ranks)
    for overlap, engine in itertools.product((True, False), ("events", "stages")):
        res = simulate_plan(plan, SLOW, COMPUTE, overlap=overlap, engine=engine)
        assert _close(res.makespan_s, _ring_closed_form(num_ranks, overlap)), (overlap, engine)


def _plans(num_ranks: int) -> list[Plan]:
    """Every baseline and two tilings (a random assignment and a transposed-looking one)
    on three masks: plans whose stages carry q, kv and partials of all kinds."""
    plans = []
    for mask in ("causal", "strided", "document"):
        seq_len = 8 * BLOCK * num_ranks // 2
        grid = build_block_grid(make_mask(mask, seq_len), seq_len, BLOCK)
        plans.extend(baseline_plans(grid, SHAPE, num_ranks).values())
        layout = plans[-1].layout
        blocks = grid.nonempty()
        plans.append(build_plan("tiled_test", grid, layout, SHAPE,
                                {rc: (rc[0] * 7 + rc[1] * 3) % num_ranks for rc in blocks}))
        plans.append(build_plan("tiled_test", grid, layout, SHAPE,
                                {rc: layout.owner(rc[1]) for rc in blocks}, granularity="row"))
    return plans


@pytest.mark.timeout(30)
def test_overlap_never_slower_and_the_engines_agree():
    compute = ComputeModel(flops_per_s=FLOPS, half_efficiency_elements=32.0,
                           backward_half_efficiency_elements=8.0, partial_work="area",
                           partial_slowdown=2.0, partial_slowdown_backward=1.5,
                           merge_call_s=1e-4, merge_s_per_element=1e-6, pass_overhead_s=1e-3)
    topo = h100_ib(gpus_per_node=2).replace(intra_node=SLOW.intra_node.scaled(bandwidth=4),
                                            inter_node=SLOW.inter_node)
    for plan in _plans(4):
        for model in ("ports", "collective"):
            kwargs = {"comm_model": model, "collective_overhead_s": 2e-4,
                      "exchange_cpu_s": 1e-4}
            on = simulate_plan(plan, topo, compute, engine="events", **kwargs)
            off = simulate_plan(plan, topo, compute, engine="events", overlap=False, **kwargs)
            assert on.makespan_s <= off.makespan_s * (1 + REL), (plan.scheme, model)
            for overlap, ref in ((True, on), (False, off)):
                fast = simulate_plan(plan, topo, compute, engine="stages", overlap=overlap,
                                     **kwargs)
                assert _close(fast.forward_s, ref.forward_s, 1e-9), (plan.scheme, model)
                assert _close(fast.makespan_s, ref.makespan_s, 1e-9), (plan.scheme, model)
                assert fast.timeline is None and fast.engine == "stages"
        flow = simulate_plan(plan, topo, compute, order="dataflow")
        # the stream runtime waits for nothing the executor's program does not wait for
        assert flow.makespan_s <= on.makespan_s * (1 + 1e-9), plan.scheme
        assert flow.makespan_s >= max(flow.compute_busy_s) * (1 - REL)


@pytest.mark.timeout(30)
def test_shared_cores_serialise_compute():
    plan = _full_ring(4)
    fast_link = emulated_link(bandwidth_Bps=1e12, latency_s=0.0)
    own = simulate_plan(plan, fast_link, COMPUTE)
    shared = simulate_plan(plan, fast_link, COMPUTE, shared_compute_capacity=2)
    one = simulate_plan(plan, fast_link, COMPUTE, shared_compute_capacity=1)
    total = sum(own.compute_busy_s)
    # with (almost) free links: a device per rank gives the per-rank work, one core the sum
    # of all ranks' work, two cores half of it
    assert _close(own.makespan_s, total / 4, 1e-6)
    assert _close(one.makespan_s, total, 1e-6)
    assert _close(shared.makespan_s, total / 2, 1e-6)
    with pytest.raises(PlanError, match="engine"):
        simulate_plan(plan, fast_link, COMPUTE, shared_compute_capacity=2, engine="stages")


def _virtual_rank(rank: int, world_size: int, plans: list[Plan]) -> list[float]:
    """The virtual-clock seconds of one forward + backward of each plan on this rank."""
    import torch

    from furnace.context_parallel.execute import ContextParallelAttention
    from furnace.context_parallel.layout import shard
    from furnace.runtime.comm import Communicator
    from furnace.runtime.netem import NetworkEmulation, NetworkEmulator

    network = NetworkEmulator(NetworkEmulation(topology=SLOW, mode="virtual"))
    comm = Communicator(network=network, name="cp")
    out = []
    gen = torch.Generator().manual_seed(0)
    for plan in plans:
        S = plan.grid.seq_len
        xs = [shard(torch.randn(1, 1, S, 4, generator=gen), plan.layout, plan.grid, rank)
              .requires_grad_(True) for _ in range(3)]
        before = network.clock.now if network.clock is not None else math.nan
        y = ContextParallelAttention(plan, comm)(*xs)
        y.sum().backward()
        out.append((network.clock.now if network.clock is not None else math.nan) - before)
    return out


@pytest.mark.timeout(60)
def test_collective_model_equals_the_executor_on_the_virtual_clock():
    # the executor charges no compute to the virtual clock: only its exchanges, each ending
    # for every rank at the latest post plus the slowest rank's alpha + bytes / beta
    seq_len = 4 * BLOCK
    # a mask named by its recipe pickles to the spawned ranks (a closure does not)
    grid = build_block_grid(MaskSpec("causal", seq_len), seq_len, BLOCK)
    plans = [ring_plan(grid, SHAPE, "contiguous", 2), ring_plan(grid, SHAPE, "zigzag", 2)]
    layout = plans[0].layout
    plans.append(build_plan("tiled_test", grid, layout, SHAPE,
                            {rc: (rc[0] + 2 * rc[1]) % 2 for rc in grid.nonempty()}))
    clocks = run_distributed(_virtual_rank, 2, plans, timeout_s=60)
    free = ComputeModel(flops_per_s=1e30)
    for i, plan in enumerate(plans):
        virtual = max(c[i] for c in clocks)
        collective = simulate_plan(plan, SLOW, free, comm_model="collective").makespan_s
        ports = simulate_plan(plan, SLOW, free).makespan_s
        assert _close(collective, virtual, 1e-9), (plan.scheme, collective, virtual)
        # per-port completion lets a rank go on before its slowest peer: never later
        assert virtual / 1.5 <= ports <= virtual * (1 + 1e-9), (plan.scheme, ports, virtual)


def test_compute_model():
    model = ComputeModel(flops_per_s=1e12, half_efficiency_elements=1000.0,
                         backward_factor=3.0, partial_slowdown=2.0)
    shape = AttentionShape(batch=2, num_heads=4, num_kv_heads=2, head_dim=8)
    # 1000 elements x 2 x 4 heads = n0 * 8: efficiency 8/9
    flops = 4 * 1000 * 4 * 8 * 2
    assert _close(model.work_time(1000, shape), flops / 1e12 * 9 / 8, 1e-12)
    assert _close(model.work_time(1000, shape, backward=True, partial=True),
                  6 * flops / 1e12 * 9 / 8, 1e-12)
    assert model.work_time(0, shape) == 0.0
    assert model.slowed(2.0).work_time(1000, shape) == pytest.approx(
        2 * model.work_time(1000, shape), rel=1e-12)
    for field, value in (("flops_per_s", 0.0), ("half_efficiency_elements", -1.0),
                         ("partial_work", "tiles"), ("merge_call_s", math.nan)):
        with pytest.raises(PlanError, match=field):
            ComputeModel(**{"flops_per_s": 1.0, field: value})


def test_r_squared_and_validation_config():
    assert r_squared([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0
    assert r_squared([1.0, 2.0, 3.0], [2.0, 2.0, 2.0]) == 0.0
    with pytest.raises(ValueError, match="equal"):
        r_squared([1.0, 1.0], [1.0, 2.0])
    assert ValidationConfig.quick().rank_counts == (2, 4)
    for field, value in (("rank_counts", (1,)), ("blocks_per_rank", 3),
                         ("comm_model", "wires"), ("bandwidth_Bps", 0.0)):
        with pytest.raises(PlanError, match=field):
            ValidationConfig(**{field: value})


@pytest.mark.timeout(60)
def test_tiny_scaling_study_is_labelled_and_complete():
    study = scaling_study(("strided",), (8,), seq_len=1024, ranks_per_node=4,
                          shape=AttentionShape(num_heads=2, num_kv_heads=2, head_dim=16,
                                               dtype="bfloat16"), layouts=("zigzag",),
                          dataflow_max_ranks=8)
    assert study.label == "simulated" and len(study.rows) == 1
    row = study.rows[0]
    assert row.label == "simulated" and row.num_blocks == 16 and row.num_ranks == 8
    for value in (row.ring_s, row.zigzag_ring_s, row.tiled_s, row.ring_dataflow_s,
                  row.zigzag_ring_dataflow_s, row.tiled_dataflow_s):
        assert math.isfinite(value) and value > 0
    assert math.isfinite(row.dataflow_speedup_vs_best_ring)
    assert row.speedup_vs_best_ring == pytest.approx(
        min(row.ring_s, row.zigzag_ring_s) / row.tiled_s)
    assert {"alpha", "beta", "flops", "n0"} <= set(study.assumptions)
    assert "simulated" in study.summary()
    skipped = scaling_study(("strided",), (8,), seq_len=1024, ranks_per_node=4,
                            layouts=("zigzag",), dataflow_max_ranks=4)
    assert math.isnan(skipped.rows[0].tiled_dataflow_s)


@pytest.mark.timeout(60)
def _planted_timings(plan, repeats, num_threads):
    """Executor times from a known cost law (per element, per kernel, per pass; partial
    blocks twice as dear per element, backward 2.2x): the fit is checked without timing
    this shared, noisy machine."""
    kernels = [k for stage in plan.forward for k in stage.kernels]
    forward = 2e-4 + sum(3e-9 * k.elements * (1 if k.full else 2) + 4e-6 for k in kernels)
    return forward, 2.2 * forward


def test_calibrate_cpu_fits_the_executor(monkeypatch):
    monkeypatch.setattr(simulate, "_time_plan_on_one_rank", _planted_timings)
    model = calibrate_cpu(SHAPE, (16, 64), repeats=3)
    # the planted law: 3 ns an element of a full block, 4 FLOPs x head_dim per element
    assert _close(model.flops_per_s, 4 * SHAPE.head_dim / 3e-9, 0.05)
    assert model.label == "measured" and model.partial_work == "area"
    for value in (model.flops_per_s, model.backward_factor, model.partial_slowdown):
        assert math.isfinite(value) and value > 0
    # the fit's own inputs: a 4 x 4 full-mask plan costs 16 kernels of 16 x 16 and a pass
    plan = ring_plan(build_block_grid(make_mask("full", 64), 64, 16), SHAPE, "contiguous", 1)
    res = simulate_plan(plan, SLOW, model)
    per_kernel = model.work_time(256, SHAPE)
    assert _close(res.forward_s, 16 * per_kernel + model.pass_overhead_s, 1e-9)
