"""Side-by-side benchmark of FasterMoE's techniques against the FastMoE baseline.

One MoE layer step (forward + backward) on W ranks with controlled routing skew, run for
each policy in one launch: ``baseline`` (one all-to-all each way, nothing overlapped),
``shadow`` (dynamic shadowing), ``smart`` (smart schedule), ``both``.

Time is kept in one of two ways, and labelled so:

- ``emulated``: wall clock with every collective slowed by the sleeping network emulator to
  a link that is balance-matched to FasterMoE's testbed: the emulated bandwidth is this
  CPU's measured expert throughput divided by the V100's FLOP per byte of a 50 Gb/s
  link (11.5 TFLOP/s / 6.25 GB/s = 1840 FLOP/B), so compute and communication keep the
  testbed's proportions (design note `moe_bagualu.md` C.3).
- ``virtual``: the deterministic virtual clock of `furnace.runtime.netem` on the testbed
  itself (V100 FLOP/s for expert GEMMs, 50 Gb/s links); tests assert claims in this mode.
- ``measured``: no emulation, plain wall clock: loopback gloo here (expected flat, since
  2 cores and a free loopback hide what the techniques fix), or real GPUs and NCCL when
  launched with ``torchrun`` (``torchrun --nproc-per-node 8 -m furnace.cli moe bench
  --mode measured``).

Every run reports per-rank bytes and messages (from the `CommLog`), tokens computed,
max/mean load, shadowed experts and the group size the performance model chose.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from furnace.runtime.comm import Communicator
from furnace.runtime.launch import init_from_env, is_torchrun, run_distributed
from furnace.runtime.netem import NetworkEmulation, NetworkEmulator
from furnace.runtime.presets import v100_50gbps
from furnace.runtime.topology import Device, Topology, balance_matched

from .config import ExpertParallelConfig
from .layer import MoETransformerMLP
from .parallel import expert_parallel
from .perfmodel import MoEPerfModel
from .workload import SyntheticGate, hot_expert, uniform, zipf

POLICIES: dict[str, dict] = {
    "baseline": {},
    "shadow": {"shadowing": True},
    "smart": {"smart_schedule": True},
    "both": {"shadowing": True, "smart_schedule": True},
}


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """One benchmark run: model size, routing, ranks, timing mode.

    Args:
        world_size: ranks W (experts are spread over them).
        experts_per_rank: E.
        d_model, d_hidden: H and alpha*H of the experts.
        tokens_per_rank: tokens each rank routes per step.
        top_k: experts per token.
        routing: "hot", "zipf", "uniform" or "trace" (first choices distributed like
            ``trace_probabilities``, e.g. a real gate's recorded counts).
        hot_share: share of first choices on expert 0 (routing="hot").
        zipf_exponent: exponent of the Zipf skew (routing="zipf").
        mode: "emulated" (sleeping link, wall clock), "virtual" (virtual clock) or
            "measured" (no emulation; real links, e.g. NCCL under torchrun).
        steps, warmup: timed and untimed steps per policy.
        policies: which of `POLICIES` to run.
        group_size: force the smart schedule's G (None: the performance model chooses).
    """

    world_size: int = 4
    experts_per_rank: int = 1
    d_model: int = 256
    d_hidden: int = 1024
    tokens_per_rank: int = 2048
    top_k: int = 1
    routing: str = "hot"
    hot_share: float = 0.5
    zipf_exponent: float = 1.2
    mode: str = "emulated"
    steps: int = 3
    warmup: int = 2
    policies: tuple[str, ...] = ("baseline", "shadow", "smart", "both")
    seed: int = 0
    group_size: int | None = None
    trace_probabilities: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("emulated", "virtual", "measured"):
            raise ValueError(f"mode must be 'emulated', 'virtual' or 'measured', "
                             f"got {self.mode!r}")
        if self.routing not in ("hot", "zipf", "uniform", "trace"):
            raise ValueError(f"routing must be hot, zipf, uniform or trace, "
                             f"got {self.routing!r}")
        if self.routing == "trace" and (self.trace_probabilities is None
                                        or len(self.trace_probabilities) != self.num_experts):
            raise ValueError(f"routing='trace' needs {self.num_experts} trace_probabilities")
        unknown = set(self.policies) - set(POLICIES)
        if unknown:
            raise ValueError(f"unknown policies {sorted(unknown)}; known: {sorted(POLICIES)}")
        if not 0.0 <= self.hot_share <= 1.0:
            raise ValueError(f"hot_share must be in [0, 1], got {self.hot_share}")
        if self.steps < 1 or self.warmup < 0 or self.world_size < 1:
            raise ValueError("steps >= 1, warmup >= 0 and world_size >= 1 are required")

    @property
    def num_experts(self) -> int:
        return self.world_size * self.experts_per_rank

    def probabilities(self) -> np.ndarray:
        if self.routing == "hot":
            return hot_expert(self.num_experts, self.hot_share)
        if self.routing == "zipf":
            return zipf(self.num_experts, self.zipf_exponent)
        if self.routing == "trace":
            return np.asarray(self.trace_probabilities, dtype=np.float64)
        return uniform(self.num_experts)


@dataclass
class PolicyResult:
    """One policy's numbers; times are in the run's mode (emulated or virtual-clock)."""

    policy: str
    step_s: float
    step_times: list[float]
    cpu_s: float
    bytes_sent: list[int]
    bytes_received: list[int]
    messages: list[int]
    tokens_computed: list[int]
    load_max_over_mean: float
    shadowed: list[int]
    group_size: int
    counts_WN: list[list[int]]


@dataclass
class BenchResult:
    config: BenchConfig
    label: str
    topology: str
    flops_per_s: float
    bandwidth_Bps: float
    latency_s: float
    step_overhead_s: float
    flops_single_thread: float
    results: dict[str, PolicyResult] = field(default_factory=dict)

    def speedup(self, policy: str, over: str = "baseline") -> float:
        return self.results[over].step_s / self.results[policy].step_s

    def to_dict(self) -> dict:
        return {"config": asdict(self.config), "label": self.label, "topology": self.topology,
                "flops_per_s": self.flops_per_s, "bandwidth_Bps": self.bandwidth_Bps,
                "latency_s": self.latency_s, "step_overhead_s": self.step_overhead_s,
                "flops_single_thread": self.flops_single_thread,
                "results": {k: asdict(v) for k, v in self.results.items()}}


def testbed() -> Topology:
    """FasterMoE's testbed with every rank on its own node: all tokens cross 50 Gb/s."""
    return v100_50gbps(gpus_per_node=1)


def _measure_expert_flops(cfg: BenchConfig, comm: Communicator) -> tuple[float, float]:
    """Two compute rates of this host, in expert FLOP/s per rank.

    - all ranks running one expert's fwd+bwd at once (the slowest rank's rate): the
      device speed the emulated link is balance-matched to;
    - the speed of one core when every core is busy, for a whole local MoE layer step
      (gate, dispatch, expert, combine, fwd+bwd), so it also covers the layer's non-GEMM
      work: rank 0 alone times the layer, and the expert GEMMs timed alone and all
      together give the slowdown of a fully loaded host (shared caches, memory
      bandwidth, switching). This is the rate the simulator is validated with.
    """
    from .experts import MLPExperts

    T = cfg.tokens_per_rank
    bank = MLPExperts(1, cfg.d_model, cfg.d_hidden)
    layer = MoETransformerMLP(d_model=cfg.d_model, d_hidden=cfg.d_hidden, num_experts=1,
                              top_k=1)
    x = torch.randn(T, cfg.d_model, requires_grad=True)
    reps = 3
    flops = reps * 3 * bank.flops_per_token() * T

    def timed(step) -> float:
        step()
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        return time.perf_counter() - t0

    def expert_step() -> None:
        bank(x, [T]).sum().backward()

    def layer_step() -> None:
        layer(x).sum().backward()

    comm.barrier()
    together = torch.tensor([timed(expert_step)], dtype=torch.float64)
    comm.all_reduce(together, "max")
    alone = torch.zeros(2, dtype=torch.float64)
    comm.barrier()
    if comm.rank == 0:
        alone[0], alone[1] = timed(expert_step), timed(layer_step)
    comm.all_reduce(alone, "max")
    cores = min(os.cpu_count() or 1, comm.world_size)
    # ideal sharing would give each rank cores / W of a core
    loaded = min(1.0, float(alone[0]) * comm.world_size / (cores * float(together)))
    return flops / float(together), loaded * flops / float(alone[1])


def _measure_step_overhead(topology: Topology, reps: int = 10) -> float:
    """The fixed cost of one exchange step here, beyond the modelled latency.

    Times an almost empty all-to-all through the sleeping emulator (so the emulator's own
    control messages and wake-up count) and subtracts the link latency it models.
    """
    comm = Communicator(network=NetworkEmulator(NetworkEmulation(topology=topology)),
                        name="calibration")
    x = torch.zeros(comm.world_size, 1)
    times = []
    for _ in range(reps):
        comm.barrier()
        t0 = time.perf_counter()
        comm.all_to_all_single(x)
        times.append(time.perf_counter() - t0)
    elapsed = torch.tensor([statistics.median(times)], dtype=torch.float64)
    return max(0.0, float(comm.all_reduce(elapsed, "max")) - topology.inter_node.latency_s)


def _bench_rank(rank: int, world_size: int, cfg: BenchConfig) -> dict:
    plain = Communicator(name="calibration")
    device = plain.device
    overhead = 0.0
    single = 0.0
    if cfg.mode == "measured":
        topology = testbed()
        netem_mode = None
    elif cfg.mode == "emulated":
        flops, single = _measure_expert_flops(cfg, plain)
        cpu = Device(name="this CPU (measured expert MLP)", peak_flops={"float32": flops},
                     memory_bytes=2**30, memory_bandwidth_Bps=1e10)
        topology = balance_matched(testbed(), cpu)
        overhead = _measure_step_overhead(topology)
        netem_mode = "sleep"
    else:
        topology = testbed()
        netem_mode = "virtual"
    out = {"topology": topology.name, "flops_per_s": topology.device.flops("float32"),
           "bandwidth_Bps": topology.inter_node.bandwidth_Bps, "step_overhead_s": overhead,
           "flops_single_thread": single,
           "policies": {}}
    probabilities = cfg.probabilities()
    for policy in cfg.policies:
        torch.manual_seed(cfg.seed)
        gate = SyntheticGate(cfg.d_model, cfg.num_experts, cfg.top_k,
                             probabilities=probabilities, seed=cfg.seed)
        layer = MoETransformerMLP(d_model=cfg.d_model, d_hidden=cfg.d_hidden,
                                  num_experts=cfg.num_experts, top_k=cfg.top_k,
                                  gate=gate).to(device)
        network = None if netem_mode is None else NetworkEmulator(
            NetworkEmulation(topology=topology, mode=netem_mode))
        comm = Communicator(network=network, name="ep")
        options = dict(POLICIES[policy])
        if options.get("smart_schedule") and cfg.group_size is not None:
            options["group_size"] = cfg.group_size
        expert_parallel(layer, comm, ExpertParallelConfig(
            topology=topology, step_overhead_s=overhead, **options))
        x = torch.randn(cfg.tokens_per_rank, cfg.d_model, device=device, requires_grad=True)
        grad = torch.randn(cfg.tokens_per_rank, cfg.d_model, device=device)
        times, cpu, per_step = [], [], []
        for step in range(cfg.warmup + cfg.steps):
            comm.barrier()
            _sync(device)
            before = len(comm.log)
            t0, c0 = time.perf_counter(), time.process_time()
            v0 = network.now() if network is not None else 0.0
            layer(x).backward(grad)
            _sync(device)
            elapsed = (network.now() - v0) if netem_mode == "virtual" else (
                time.perf_counter() - t0)
            layer.zero_grad(set_to_none=True)
            x.grad = None
            if step >= cfg.warmup:
                times.append(elapsed)
                cpu.append(time.process_time() - c0)
                recs = comm.log.records[before:]
                per_step.append((sum(r.bytes_sent for r in recs),
                                 sum(r.bytes_received for r in recs),
                                 sum(r.messages for r in recs)))
        stats = layer.parallel.stats
        out["policies"][policy] = {
            "times": times, "cpu_s": statistics.median(cpu),
            "bytes_sent": per_step[-1][0], "bytes_received": per_step[-1][1],
            "messages": per_step[-1][2], "tokens_computed": stats.tokens_computed,
            "load_max_over_mean": stats.load_max_over_mean, "shadowed": stats.shadowed,
            "group_size": stats.group_size, "counts_WN": stats.counts_WN,
        }
    out["latency_s"] = topology.inter_node.latency_s
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_bench(cfg: BenchConfig, *, timeout_s: float = 600) -> BenchResult:
    """Run every policy of ``cfg``: on ``cfg.world_size`` spawned gloo ranks, or, under
    torchrun, on the launched ranks (NCCL on GPUs); every rank gets the result."""
    if is_torchrun():
        import torch.distributed as dist

        ctx = init_from_env()
        if ctx.world_size != cfg.world_size:
            cfg = replace(cfg, world_size=ctx.world_size)
        per_rank: list = [None] * ctx.world_size
        dist.all_gather_object(per_rank, _bench_rank(ctx.rank, ctx.world_size, cfg))
    else:
        per_rank = run_distributed(_bench_rank, cfg.world_size, cfg, timeout_s=timeout_s)
    head = per_rank[0]
    label = {"emulated": "emulated", "virtual": "virtual-clock",
             "measured": "measured"}[cfg.mode]
    result = BenchResult(cfg, label, head["topology"], head["flops_per_s"],
                         head["bandwidth_Bps"], head["latency_s"], head["step_overhead_s"],
                         head["flops_single_thread"])
    for policy in cfg.policies:
        rows = [r["policies"][policy] for r in per_rank]
        # a step ends when its slowest rank does
        step_times = [max(r["times"][i] for r in rows) for i in range(cfg.steps)]
        result.results[policy] = PolicyResult(
            policy=policy,
            step_s=statistics.median(step_times),
            step_times=step_times,
            cpu_s=max(r["cpu_s"] for r in rows),
            bytes_sent=[r["bytes_sent"] for r in rows],
            bytes_received=[r["bytes_received"] for r in rows],
            messages=[r["messages"] for r in rows],
            tokens_computed=[r["tokens_computed"] for r in rows],
            load_max_over_mean=rows[0]["load_max_over_mean"],
            shadowed=rows[0]["shadowed"],
            group_size=rows[0]["group_size"],
            counts_WN=rows[0]["counts_WN"],
        )
    return result


def perf_model_of(result: BenchResult) -> MoEPerfModel:
    """The performance-model constants a run used (its device, link and step overhead)."""
    cfg = result.config
    return MoEPerfModel(d_model=cfg.d_model, d_hidden=cfg.d_hidden,
                        flops_per_s=result.flops_per_s, bandwidth_Bps=result.bandwidth_Bps,
                        latency_s=result.latency_s, step_overhead_s=result.step_overhead_s)


def format_table(result: BenchResult):
    """A rich table of one run (times labelled with the run's mode)."""
    from rich.table import Table

    cfg = result.config
    table = Table(title=f"MoE layer step, {cfg.world_size} ranks, routing {cfg.routing}"
                  + (f" (hot share {cfg.hot_share:g})" if cfg.routing == "hot" else "")
                  + f", {result.label} time")
    for col in ("policy", "step ms", "speedup", "max/mean load", "shadowed", "G",
                "MiB sent (max rank)", "msgs (max rank)"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, res in result.results.items():
        table.add_row(name, f"{res.step_s * 1e3:.1f}", f"{result.speedup(name):.2f}x",
                      f"{res.load_max_over_mean:.2f}", str(res.shadowed or "-"),
                      str(res.group_size), f"{max(res.bytes_sent) / 2**20:.2f}",
                      str(max(res.messages)))
    return table
