"""Runs of decentralized training on local gloo ranks or under torchrun, and what they
measure (design note `prague.md` sections 2.5 and 7.2): accuracy of the average model
against wall time, time to a target accuracy, throughput, the overhead breakdown, the
groups formed, and a Chrome/Perfetto trace of who waited for whom.

Times include the emulated compute (sleeps), so every time here is labelled emulated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from furnace.runtime.simulator import Resource, ScheduledTask, Task, Timeline

from .config import RunConfig
from .worker import Span, WorkerReport, WorkerStats, run_worker

__all__ = ["RunResult", "run", "run_on_world", "run_series", "trace_timeline"]


@dataclass
class RunResult:
    """One run, as rank 0 sees it after the run."""

    config: RunConfig
    stats: list[WorkerStats]
    curve: list[tuple[float, float, float]]
    final_accuracy: float
    final_consensus: float
    wall_s: float
    groups: list[tuple[int, tuple[int, ...]]]
    pending_groups: int
    generator_requests: int
    spans: list[Span] = field(repr=False, default_factory=list)
    final_parameters: list[Any] = field(repr=False, default_factory=list)
    # (time, worst worker, mean worker) accuracy of the workers' own models, when scored
    local_curve: list[tuple[float, float, float]] = field(default_factory=list)

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stats)

    @property
    def throughput(self) -> float:
        """Steps per second, all workers together (emulated compute included)."""
        return self.total_steps / max(max(s.wall_s for s in self.stats), 1e-9)

    @property
    def timeouts(self) -> int:
        return sum(s.timeouts for s in self.stats)

    def time_to(self, target: float) -> float | None:
        """First snapshot time at which the average model reaches ``target``, or None."""
        return next((t for t, acc, _ in self.curve if math.isfinite(t) and acc >= target),
                    None)

    def time_to_local(self, target: float) -> float | None:
        """First scored time at which every worker's own model reaches ``target``, or
        None (also when local models were not scored)."""
        return next((t for t, worst, _ in self.local_curve
                     if math.isfinite(t) and worst >= target), None)

    def breakdown(self) -> dict[str, float]:
        """Seconds per worker, averaged: compute (real), emulated compute, waiting of the
        compute thread for synchronization, P-Reduce member wait and transfer, group
        creation, generator round trip."""
        n = len(self.stats)
        keys = ("compute_s", "emulated_s", "sync_wait_s", "member_wait_s", "transfer_s",
                "create_s", "generator_s")
        return {k: sum(getattr(s, k) for s in self.stats) / n for k in keys}

    def group_sizes(self) -> dict[int, int]:
        sizes: dict[int, int] = {}
        for _, members in self.groups:
            sizes[len(members)] = sizes.get(len(members), 0) + 1
        return dict(sorted(sizes.items()))

    def summary(self) -> dict[str, Any]:
        return {"mode": self.config.mode, "policy": self.config.policy.name,
                "world_size": self.config.world_size, "wall_s": self.wall_s,
                "label_alpha": self.config.label_alpha,
                "steps": [s.steps for s in self.stats], "throughput": self.throughput,
                "final_accuracy": self.final_accuracy,
                "final_consensus": self.final_consensus, "timeouts": self.timeouts,
                "groups": len(self.groups), "group_sizes": self.group_sizes(),
                "pending_groups": self.pending_groups, "breakdown": self.breakdown(),
                "curve": [(t, a, c) for t, a, c in self.curve if math.isfinite(t)],
                "stats": [asdict(s) for s in self.stats]}


def _merge(config: RunConfig, reports: Sequence[WorkerReport]) -> RunResult:
    first = reports[0]
    groups: dict[int, tuple[int, ...]] = {}
    for r in reports:
        for seq, members in r.groups:
            groups[seq] = members
    curve = [c for c in first.curve if math.isfinite(c[0])]
    final = first.curve[-1]
    return RunResult(config=config, stats=[r.stats for r in reports], curve=curve,
                     final_accuracy=final[1], final_consensus=final[2],
                     wall_s=max(r.stats.wall_s for r in reports),
                     groups=sorted(groups.items()),
                     pending_groups=sum(r.pending_groups for r in reports),
                     generator_requests=sum(r.generator_requests for r in reports),
                     spans=[s for r in reports for s in r.spans],
                     final_parameters=[r.final_parameters for r in reports],
                     local_curve=first.local_curve)


def _series_body(rank: int, world_size: int, configs: Sequence[RunConfig]) -> list[Any]:
    return [run_worker(rank, world_size, c) for c in configs]


def run_series(configs: Sequence[RunConfig], *, timeout_s: float | None = None
               ) -> list[RunResult]:
    """Run several configs one after another on one set of local gloo ranks (one spawn),
    so a comparison does not pay process start-up per mode."""
    from furnace.runtime.launch import run_distributed

    if not configs:
        return []
    world = configs[0].world_size
    if any(c.world_size != world for c in configs):
        raise ValueError("every config of a series needs the same world_size")
    budget = timeout_s or sum(4 * c.duration_s + 4 * c.timeout_s for c in configs) + 60
    per_rank = run_distributed(_series_body, world, list(configs), timeout_s=budget,
                               collective_timeout_s=max(c.timeout_s for c in configs) * 4)
    return [_merge(c, [per_rank[r][k] for r in range(world)]) for k, c in enumerate(configs)]


def run(config: RunConfig, *, timeout_s: float | None = None) -> RunResult:
    """One run on ``config.world_size`` local gloo ranks."""
    return run_series([config], timeout_s=timeout_s)[0]


def run_on_world(config: RunConfig, progress: Callable[[int, float], None] | None = None
                 ) -> RunResult | None:
    """One run on the ranks of an existing process group (torchrun); rank 0 gets the
    result, the others None."""
    import torch.distributed as dist

    report = run_worker(dist.get_rank(), dist.get_world_size(), config, progress=progress)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, report)
    return _merge(config, gathered) if dist.get_rank() == 0 else None


def trace_timeline(spans: Sequence[Span]) -> Timeline:
    """The measured spans as a runtime Timeline (one row per rank and thread); a group's
    span depends on the members it waited for, so Perfetto shows who waited for whom."""
    tasks: list[ScheduledTask] = []
    resources: dict[str, Resource] = {}
    last: dict[tuple[int, str], str] = {}
    ordered = sorted(spans, key=lambda s: (s.start, s.rank, s.thread))
    for k, s in enumerate(ordered):
        row = f"rank {s.rank} {s.thread}"
        resources.setdefault(row, Resource(row))
        name = f"r{s.rank} {s.name} #{k}"
        deps = tuple(d for d in (last.get((m, "comm")) for m in s.waited_for
                                 if m != s.rank) if d is not None)
        tasks.append(ScheduledTask(Task(name, max(s.end - s.start, 0.0), row, deps,
                                        s.category), s.start, max(s.end, s.start)))
        last[(s.rank, s.thread)] = name
    return Timeline(tasks, resources.values())


def write_trace(result: RunResult, path: str | Path) -> Path:
    out = Path(path)
    trace_timeline(result.spans).to_chrome_trace(out)
    return out


def _rank_main(rank: int, world_size: int, config: RunConfig, show_progress: bool
               ) -> WorkerReport:
    if not (show_progress and rank == 0):
        return run_worker(rank, world_size, config)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    label = f"{config.mode} W={world_size}"
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed:.1f}/{task.total:.0f} s"),
                  TimeElapsedColumn()) as bar:
        task = bar.add_task(label, total=config.duration_s)

        def update(step: int, elapsed: float) -> None:
            bar.update(task, completed=min(elapsed, config.duration_s),
                       description=f"{label} step {step}")

        return run_worker(rank, world_size, config, progress=update)


def train(config: RunConfig, *, progress: bool = True) -> RunResult | None:
    """The CLI's run: on ``config.world_size`` local gloo ranks, or, under torchrun, on the
    launched ranks (whose count must equal ``config.world_size``); rank 0 gets the result,
    the other torchrun ranks None."""
    from furnace.runtime.launch import init_from_env, is_torchrun, run_distributed

    budget = 4 * config.duration_s + 8 * config.timeout_s + 60
    if is_torchrun():
        import torch.distributed as dist

        with init_from_env(backend="gloo", timeout_s=config.timeout_s * 4) as ctx:
            report = _rank_main(ctx.rank, ctx.world_size, config, progress)
            gathered: list[Any] = [None] * ctx.world_size
            dist.all_gather_object(gathered, report)
            return _merge(config, gathered) if ctx.rank == 0 else None
    reports = run_distributed(_rank_main, config.world_size, config, progress,
                              timeout_s=budget, collective_timeout_s=config.timeout_s * 4)
    return _merge(config, reports)
