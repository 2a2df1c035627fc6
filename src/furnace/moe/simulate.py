"""Discrete-event simulation of one MoE layer step, for 16-1024 GPUs (FasterMoE section 5).

`simulate_step` turns a routing (counts c[w, e]), a policy (shadow mask, group size) and
the performance-model constants into a task graph on `furnace.runtime.simulator`: per
worker a compute resource and a FIFO link; forward and backward as the expert-parallel
layer runs them (`furnace.moe.parallel`):

    forward:  sends S_i (all first) -> shadow broadcasts -> C_i as S_i completes -> R_i,
              then the shadowed experts' local tokens
    backward: gradient sends -> shadowed experts' backward -> their gradient reduces ->
              C_i (2x) -> R_i

Each exchange step is a collective: it completes when every worker's transfer in it has
(a zero-length synchronisation task). `simulate_policies` runs the four policies of the
benchmark plus GShard-style capacity dropping (tokens over capacity are not computed and
not sent: faster, but the model changes). `project` sweeps the number of GPUs with a
synthetic routing scaled per worker.

The simulator is validated against emulated-link measurements at 2-8 ranks before it
projects (`furnace reproduce moe`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from furnace.runtime.cost import collective_time
from furnace.runtime.simulator import Simulator, Timeline

from .perfmodel import MoEPerfModel


@dataclass(frozen=True)
class Policy:
    """What the layer does in a step: which experts are shadowed, the group size."""

    name: str
    shadow_N: np.ndarray
    group_size: int


def choose_policy(name: str, perf: MoEPerfModel, counts_WN: np.ndarray,
                  experts_per_rank: int, *, max_steps: int | None = None) -> Policy:
    """The decisions `expert_parallel` makes for policy ``name`` on this routing.

    ``max_steps`` caps the smart schedule's steps (projections to 1024 GPUs use it to keep
    the task graph small; a pipeline of hundreds of steps is not what one would run).
    """
    W, N = np.asarray(counts_WN).shape
    none = np.zeros(N, bool)
    if name == "baseline":
        return Policy(name, none, W)
    if name == "shadow":
        return Policy(name, perf.shadow_policy(counts_WN, experts_per_rank), W)
    if name == "smart":
        return Policy(name, none, perf.choose_group_size(counts_WN, experts_per_rank,
                                                          max_steps=max_steps))
    if name == "both":
        # as `ExpertParallel._decide`: shadow-then-schedule, unless scheduling alone wins
        shadow = perf.shadow_policy(counts_WN, experts_per_rank)
        g = perf.choose_group_size(counts_WN, experts_per_rank, shadow, max_steps=max_steps)
        g_none = perf.choose_group_size(counts_WN, experts_per_rank, max_steps=max_steps)
        if shadow.any() and (perf.smart_latency(counts_WN, experts_per_rank, g_none).total
                             < perf.smart_latency(counts_WN, experts_per_rank, g, shadow).total):
            return Policy(name, none, g_none)
        return Policy(name, shadow, g)
    raise ValueError(f"unknown policy {name!r}")


def simulate_step(counts_WN: np.ndarray, perf: MoEPerfModel, experts_per_rank: int,
                  policy: Policy, *, host_cores: int | None = None,
                  host_flops_per_s: float | None = None) -> Timeline:
    """The timeline of one forward + backward step of one MoE layer.

    By default every worker has its own device. ``host_cores`` instead models emulated
    ranks that share a CPU: all expert GEMMs queue on one resource with that many slots,
    each running at ``host_flops_per_s`` (one thread's speed). This is how the simulator
    is validated against emulated runs on a laptop before it projects to GPUs.
    """
    counts = np.asarray(counts_WN, dtype=np.float64)
    W = counts.shape[0]
    shadow = np.asarray(policy.shadow_N, bool)
    G = policy.group_size
    out_Wn, inc_Wn, mine_Wn = perf.step_traffic(counts, experts_per_rank, G, shadow)
    n = out_Wn.shape[1]
    link_Wn = perf.step_link_times(out_Wn, inc_Wn)
    compute_perf = perf if host_flops_per_s is None else perf.with_(flops_per_s=host_flops_per_s)
    comp_Wn = compute_perf._gemm_times(mine_Wn)
    local_W = compute_perf._gemm_times((counts * shadow).sum(1))
    num_shadow = int(shadow.sum())
    # a chain-pipelined broadcast (or reduce) moves each expert's parameters once per link
    param_s = num_shadow * perf.shadow_param_s

    sim = Simulator()
    for w in range(W):
        sim.add_resource(f"link{w}")
        if host_cores is None:
            sim.add_resource(f"gpu{w}")
    if host_cores is not None:
        sim.add_resource("host", host_cores)
    gpu = [f"gpu{w}" if host_cores is None else "host" for w in range(W)]
    # the per-expert counts all-gather: a ring of W-1 latency steps (its few bytes are not
    # modelled)
    sim.add_task("counts", collective_time("all_gather", 0, W, perf) + perf.step_overhead_s,
                 category="comm")
    start = "counts"
    for phase, factor in (("fwd", 1.0), ("bwd", 2.0)):
        _add_pass(sim, phase, factor, W, n, link_Wn, comp_Wn, local_W, param_s, start, gpu)
        start = f"{phase}.end"
    return sim.run()


def _add_pass(sim: Simulator, phase: str, factor: float, W: int, n: int, link_Wn, comp_Wn,
              local_W, param_s: float, start: str, gpu: list[str]) -> None:
    p = phase
    for i in range(n):
        for w in range(W):
            send_deps = (start,) if i == 0 else (f"{p}.S{i - 1}.w{w}",)
            sim.add_task(f"{p}.S{i}.w{w}", link_Wn[w, i], resource=f"link{w}",
                         deps=send_deps, category="comm")
        sim.add_task(f"{p}.A{i}", 0.0, deps=tuple(f"{p}.S{i}.w{w}" for w in range(W)))
    shadow_done = []
    for w in range(W):
        if param_s > 0:
            # forward: broadcasts after the sends; backward: reduces after the local backward
            before = f"{p}.S{n - 1}.w{w}" if phase == "fwd" else f"{p}.L.w{w}"
            if phase == "bwd":
                sim.add_task(f"{p}.L.w{w}", factor * local_W[w], resource=gpu[w],
                             deps=(start,), category="compute")
            sim.add_task(f"{p}.B.w{w}", param_s, resource=f"link{w}",
                         deps=(before, f"{p}.S{n - 1}.w{w}"), category="comm")
            shadow_done.append(f"{p}.B.w{w}")
    if shadow_done:
        sim.add_task(f"{p}.B", 0.0, deps=tuple(shadow_done))
    ends = []
    for w in range(W):
        for i in range(n):
            deps = [f"{p}.A{i}"]
            if i:
                deps.append(f"{p}.C{i - 1}.w{w}")
            elif phase == "bwd" and param_s > 0:
                deps.append(f"{p}.L.w{w}")
            sim.add_task(f"{p}.C{i}.w{w}", factor * comp_Wn[w, i], resource=gpu[w],
                         deps=tuple(deps), category="compute")
            rdeps = [f"{p}.C{i}.w{w}"]
            if i:
                rdeps.append(f"{p}.R{i - 1}.w{w}")
            else:
                rdeps.append(f"{p}.S{n - 1}.w{w}")
                if param_s > 0:
                    rdeps.append(f"{p}.B.w{w}")
            sim.add_task(f"{p}.R{i}.w{w}", link_Wn[w, i], resource=f"link{w}",
                         deps=tuple(rdeps), category="comm")
        if phase == "fwd" and param_s > 0:
            sim.add_task(f"{p}.L.w{w}", factor * local_W[w], resource=gpu[w],
                         deps=(f"{p}.B", f"{p}.C{n - 1}.w{w}"), category="compute")
            ends.append(f"{p}.L.w{w}")
    for i in range(n):
        sim.add_task(f"{p}.Ret{i}", 0.0, deps=tuple(f"{p}.R{i}.w{w}" for w in range(W)))
        ends.append(f"{p}.Ret{i}")
    if shadow_done:
        ends.append(f"{p}.B")
    sim.add_task(f"{p}.end", 0.0, deps=tuple(ends))


def synthetic_counts(world_size: int, experts_per_rank: int, tokens_per_rank: int,
                     probabilities: np.ndarray, top_k: int = 1) -> np.ndarray:
    """Expected counts c[w, e] when every worker routes by ``probabilities`` (rounded)."""
    p = np.asarray(probabilities, dtype=np.float64)
    if p.shape != (world_size * experts_per_rank,):
        raise ValueError(f"need {world_size * experts_per_rank} probabilities, got {p.shape}")
    row = np.floor(p * tokens_per_rank * top_k)
    # give the rounding remainder to the most likely experts so rows keep their total
    remainder = int(tokens_per_rank * top_k - row.sum())
    row[np.argsort(-p, kind="stable")[:remainder]] += 1
    return np.tile(row, (world_size, 1))


def capacity_counts(counts_WN: np.ndarray, capacity_factor: float,
                    tokens_per_rank: int, top_k: int = 1) -> tuple[np.ndarray, float]:
    """GShard-style local capacity: each worker sends at most C = ceil(f T k / N) per expert.

    Returns the kept counts and the fraction of assignments dropped.
    """
    counts = np.asarray(counts_WN, dtype=np.float64)
    N = counts.shape[1]
    cap = np.ceil(capacity_factor * tokens_per_rank * top_k / N)
    kept = np.minimum(counts, cap)
    return kept, float(1.0 - kept.sum() / counts.sum())


@dataclass
class SimResult:
    policy: str
    step_s: float
    shadowed: int
    group_size: int
    dropped: float = 0.0


def simulate_policies(counts_WN: np.ndarray, perf: MoEPerfModel, experts_per_rank: int,
                      policies=("baseline", "shadow", "smart", "both"),
                      capacity_factor: float | None = None, tokens_per_rank: int | None = None,
                      top_k: int = 1, max_steps: int | None = None) -> dict[str, SimResult]:
    """Simulated step time of each policy; with a capacity factor, also GShard dropping."""
    out = {}
    for name in policies:
        policy = choose_policy(name, perf, counts_WN, experts_per_rank, max_steps=max_steps)
        timeline = simulate_step(counts_WN, perf, experts_per_rank, policy)
        out[name] = SimResult(name, timeline.makespan, int(policy.shadow_N.sum()),
                              policy.group_size)
    if capacity_factor is not None:
        if tokens_per_rank is None:
            raise ValueError("capacity dropping needs tokens_per_rank")
        kept, dropped = capacity_counts(counts_WN, capacity_factor, tokens_per_rank, top_k)
        policy = choose_policy("baseline", perf, kept, experts_per_rank)
        timeline = simulate_step(kept, perf, experts_per_rank, policy)
        out["gshard-capacity"] = SimResult("gshard-capacity", timeline.makespan, 0,
                                           policy.group_size, dropped)
    return out
