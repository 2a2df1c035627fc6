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

The policies run round-robin in one launch (`furnace.runtime.timing.round_robin`): each
round runs one step of every policy, in an order that rotates from round to round, so a
job that starts on the host's cores mid-run slows all of them alike. A policy's step time
is the median over the rounds and a speedup the median of the rounds' paired ratios. In
emulated mode this host's compute speed is probed after every round as well
(`_HostProbe`), for the simulator's validation.

Every run reports per-rank bytes and messages (from the `CommLog`), tokens computed,
max/mean load, shadowed experts and the group size the performance model chose.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import torch
import torch.distributed as dist

from furnace.runtime.comm import Communicator
from furnace.runtime.launch import init_from_env, is_torchrun, run_distributed
from furnace.runtime.netem import NetworkEmulation, NetworkEmulator
from furnace.runtime.presets import v100_50gbps
from furnace.runtime.timing import median_paired_ratio, round_robin, stopwatch, time_call
from furnace.runtime.topology import Device, Topology, balance_matched

from .config import (
    POLICIES,
    BenchConfig,
    ExpertParallelConfig,
)
from .layer import MoETransformerMLP
from .parallel import expert_parallel
from .perfmodel import MoEPerfModel
from .workload import SyntheticGate


@dataclass
class PolicyResult:
    """One policy's numbers; times are in the run's mode (emulated or virtual-clock).

    ``step_times`` has one entry per timed round (the slowest rank's), ``step_s`` is
    their median.
    """

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
    # emulated runs: the one-core rate of each timed round, from the probe after it
    round_flops_single_thread: list[float] = field(default_factory=list)

    def speedup(self, policy: str, over: str = "baseline") -> float:
        """Median over the rounds of ``over``'s step time / ``policy``'s in the same round.

        The policies run round-robin, so each ratio pairs steps taken moments apart: a
        change in how busy the host is cancels out of it, and the median drops a round that
        was disturbed anyway.
        """
        return median_paired_ratio(self.results[over].step_times,
                                   self.results[policy].step_times)

    def to_dict(self) -> dict:
        return {"config": asdict(self.config), "label": self.label, "topology": self.topology,
                "flops_per_s": self.flops_per_s, "bandwidth_Bps": self.bandwidth_Bps,
                "latency_s": self.latency_s, "step_overhead_s": self.step_overhead_s,
                "flops_single_thread": self.flops_single_thread,
                "round_flops_single_thread": self.round_flops_single_thread,
                "results": {k: asdict(v) for k, v in self.results.items()}}


def testbed() -> Topology:
    """FasterMoE's testbed with every rank on its own node: all tokens cross 50 Gb/s."""
    return v100_50gbps(gpus_per_node=1)


class _HostProbe:
    """This host's expert compute speed, measured at the start of a run and between its rounds.

    The start gives two rates, in expert FLOP/s per rank:

    - all ranks running one expert's fwd+bwd at once (the slowest rank's rate): the device
      speed the emulated link is balance-matched to;
    - the speed of one core when every core is busy, for a whole local MoE layer step
      (gate, dispatch, expert, combine, fwd+bwd), so it also covers the layer's non-GEMM
      work: rank 0 alone times the layer, and the expert GEMMs timed alone and all
      together give the slowdown of a fully loaded host (shared caches, memory
      bandwidth, switching). This is the rate the simulator is validated with.

    `together` re-times the all-ranks expert step; between the benchmark's rounds it tracks
    how busy the host is while the policies run (another job on the cores slows the probe
    and the policies alike), so the simulator gets the rate of each round, not only the
    rate of the moment the run started.
    """

    def __init__(self, cfg: BenchConfig, comm: Communicator) -> None:
        from .experts import MLPExperts

        self.comm = comm
        self.tokens = cfg.tokens_per_rank
        self.bank = MLPExperts(1, cfg.d_model, cfg.d_hidden)
        self.layer = MoETransformerMLP(d_model=cfg.d_model, d_hidden=cfg.d_hidden,
                                       num_experts=1, top_k=1)
        self.x = torch.randn(self.tokens, cfg.d_model, requires_grad=True)
        self.flops = 3 * self.bank.flops_per_token() * self.tokens

    def _expert_step(self) -> None:
        self.bank(self.x, [self.tokens]).sum().backward()

    def _layer_step(self) -> None:
        self.layer(self.x).sum().backward()

    def _timed(self, step, reps: int, warm: bool = True) -> float:
        # one sample of reps back-to-back steps: the probe's rate, not a best-of
        return time_call(step, repeats=1, warmup=int(warm), number=reps).min

    def together(self, reps: int = 1, warm: bool = False) -> float:
        """Seconds of one expert fwd+bwd with every rank running it at once (slowest rank).

        Between rounds the bank is warm already, so no untimed step runs first.
        """
        self.comm.barrier()
        elapsed = torch.tensor([self._timed(self._expert_step, reps, warm)],
                               dtype=torch.float64)
        self.comm.all_reduce(elapsed, "max")
        return float(elapsed)

    def calibrate(self, reps: int = 3) -> tuple[float, float, float]:
        """(all-ranks expert rate, loaded one-core layer rate, `together` seconds now)."""
        together = self.together(reps, warm=True)
        alone = torch.zeros(2, dtype=torch.float64)
        self.comm.barrier()
        if self.comm.rank == 0:
            alone[0] = self._timed(self._expert_step, reps)
            alone[1] = self._timed(self._layer_step, reps)
        self.comm.all_reduce(alone, "max")
        cores = min(os.cpu_count() or 1, self.comm.world_size)
        # ideal sharing would give each rank cores / W of a core
        loaded = min(1.0, float(alone[0]) * self.comm.world_size / (cores * together))
        return self.flops / together, loaded * self.flops / float(alone[1]), together


def _measure_step_overhead(topology: Topology, reps: int = 10) -> float:
    """The fixed cost of one exchange step here, beyond the modelled latency.

    Times an almost empty all-to-all through the sleeping emulator (so the emulator's own
    control messages and wake-up count) and subtracts the link latency it models.
    """
    comm = Communicator(network=NetworkEmulator(NetworkEmulation(topology=topology)),
                        name="calibration")
    x = torch.zeros(comm.world_size, 1)
    timing = time_call(lambda: comm.all_to_all_single(x), repeats=reps, warmup=0,
                       setup=comm.barrier)
    elapsed = torch.tensor([timing.median], dtype=torch.float64)
    return max(0.0, float(comm.all_reduce(elapsed, "max")) - topology.inter_node.latency_s)


def _bench_rank(rank: int, world_size: int, cfg: BenchConfig) -> dict:
    plain = Communicator(name="calibration")
    device = plain.device
    overhead = 0.0
    single = 0.0
    probe = None
    if cfg.mode == "measured":
        topology = testbed()
        netem_mode: Literal["sleep", "virtual"] | None = None
    elif cfg.mode == "emulated":
        probe = _HostProbe(cfg, plain)
        flops, single, probe_start = probe.calibrate()
        cpu = Device(name="this CPU (measured expert MLP)", peak_flops={"float32": flops},
                     memory_bytes=2**30, memory_bandwidth_Bps=1e10)
        topology = balance_matched(testbed(), cpu)
        overhead = _measure_step_overhead(topology)
        netem_mode = "sleep"
    else:
        topology = testbed()
        netem_mode = "virtual"
    out: dict[str, Any] = {
        "topology": topology.name, "flops_per_s": topology.device.flops("float32"),
        "bandwidth_Bps": topology.inter_node.bandwidth_Bps, "step_overhead_s": overhead,
        "flops_single_thread": single, "round_flops_single_thread": [], "policies": {}}
    probabilities = cfg.probabilities()
    runs: dict[str, dict[str, Any]] = {}
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
        runs[policy] = {"layer": layer, "comm": comm, "network": network, "x": x,
                        "grad": grad, "times": [], "cpu": [], "per_step": []}
    def probe_after(round_index: int) -> None:
        if probe is not None:
            out["round_flops_single_thread"].append(single * probe_start / probe.together())

    # round-robin, in an order that rotates from round to round: each round runs one step
    # of every policy, so a change in how busy the host is (another job starting) reaches
    # all policies alike, and the probe after the round measures the compute speed the
    # round ran at
    steps = round_robin(cfg.policies, lambda policy: _one_step(runs[policy], device, netem_mode),
                        rounds=cfg.steps, warmup=cfg.warmup, after_round=probe_after)
    for policy, run in runs.items():
        for elapsed, cpu_s, traffic in steps[policy]:
            run["times"].append(elapsed)
            run["cpu"].append(cpu_s)
            run["per_step"].append(traffic)
    for policy, run in runs.items():
        stats = run["layer"].parallel.stats
        per_step = run["per_step"]
        out["policies"][policy] = {
            "times": run["times"], "cpu_s": statistics.median(run["cpu"]),
            "bytes_sent": per_step[-1][0], "bytes_received": per_step[-1][1],
            "messages": per_step[-1][2], "tokens_computed": stats.tokens_computed,
            "load_max_over_mean": stats.load_max_over_mean, "shadowed": stats.shadowed,
            "group_size": stats.group_size, "counts_WN": stats.counts_WN,
        }
    out["latency_s"] = topology.inter_node.latency_s
    return out


def _one_step(run: dict, device: torch.device, netem_mode: str | None):
    """One timed fwd+bwd of a policy's layer: (seconds, CPU seconds, (bytes out, in, msgs))."""
    layer, comm, network, x = run["layer"], run["comm"], run["network"], run["x"]
    comm.barrier()
    before = len(comm.log)
    with stopwatch(synchronize=lambda: _sync(device)) as lap:
        v0 = network.now() if network is not None else 0.0
        layer(x).backward(run["grad"])
    elapsed = (network.now() - v0) if netem_mode == "virtual" else lap.seconds
    cpu_s = lap.cpu_seconds
    layer.zero_grad(set_to_none=True)
    x.grad = None
    recs = comm.log.records[before:]
    return elapsed, cpu_s, (sum(r.bytes_sent for r in recs),
                            sum(r.bytes_received for r in recs),
                            sum(r.messages for r in recs))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_bench(cfg: BenchConfig, *, timeout_s: float = 600) -> BenchResult:
    """Run every policy of ``cfg``: on ``cfg.world_size`` spawned gloo ranks, or, under
    torchrun, on the launched ranks (NCCL on GPUs); every rank gets the result.

    Under torchrun the process group is joined here and left here: all ranks meet at a
    barrier and destroy it on the way out, on success and on error, so no rank exits
    while a peer still holds the group (which aborts at exit with "terminate called
    without an active exception").
    """
    if is_torchrun():
        with init_from_env(timeout_s=timeout_s) as ctx:
            if ctx.world_size != cfg.world_size:
                cfg = replace(cfg, world_size=ctx.world_size)
            per_rank: list = [None] * ctx.world_size
            dist.all_gather_object(per_rank, _bench_rank(ctx.rank, ctx.world_size, cfg))
    else:
        per_rank = run_distributed(_bench_rank, cfg.world_size, cfg, timeout_s=timeout_s)
    return _assemble(cfg, per_rank)


def _assemble(cfg: BenchConfig, per_rank: list[dict]) -> BenchResult:
    head = per_rank[0]
    label = {"emulated": "emulated", "virtual": "virtual-clock",
             "measured": "measured"}[cfg.mode]
    result = BenchResult(cfg, label, head["topology"], head["flops_per_s"],
                         head["bandwidth_Bps"], head["latency_s"], head["step_overhead_s"],
                         head["flops_single_thread"],
                         round_flops_single_thread=head["round_flops_single_thread"])
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
