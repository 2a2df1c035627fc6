"""Console tables of a decentralized run (design note `prague.md` section 2.5): the
average model's accuracy against wall time, time to target, throughput and the overhead
breakdown per worker. Every time includes emulated compute, and says so.
"""

from __future__ import annotations

from typing import Any

from .train import RunResult

__all__ = ["print_run"]


def print_run(console: Any, result: RunResult, *, target: float) -> None:
    from rich.table import Table

    c = result.config
    slow = ", ".join(f"rank {r} x{f:g}" for r, f in c.hetero.slow) or "none"
    shards = ("iid shards" if c.label_alpha is None
              else f"label-skewed shards (Dirichlet {c.label_alpha:g})")
    console.print(f"{c.mode}" + (f" ({c.policy.name}, {c.backend})" if c.mode == "prague"
                                 else "") +
                  f" on {c.world_size} ranks, {c.task}, {shards}, emulated compute "
                  f"{c.compute_ms:g} ms per step, slow: {slow}")
    reached = result.time_to(target)
    console.print(f"wall {result.wall_s:.2f} s (emulated compute); throughput "
                  f"{result.throughput:.1f} steps/s all workers; steps per worker "
                  f"{[s.steps for s in result.stats]}")
    console.print(f"average model: held-out accuracy {result.final_accuracy:.4f} at the end; "
                  f"time to {target:.0%}: "
                  + (f"{reached:.2f} s" if reached is not None else "not reached"))
    console.print(f"consensus distance at the end {result.final_consensus:.3g}; groups "
                  f"{len(result.groups)} (sizes {result.group_sizes()}); pending "
                  f"{result.pending_groups}; timeouts {result.timeouts}")
    table = Table(title="per worker (seconds; emulated compute)")
    for col in ("rank", "steps", "compute", "emulated", "sync wait", "member wait",
                "transfer", "create", "generator", "conflicts", "MiB sent"):
        table.add_column(col, justify="right")
    for r, s in enumerate(result.stats):
        table.add_row(str(r), str(s.steps), f"{s.compute_s:.2f}", f"{s.emulated_s:.2f}",
                      f"{s.sync_wait_s:.2f}", f"{s.member_wait_s:.2f}",
                      f"{s.transfer_s:.2f}", f"{s.create_s:.3f}", f"{s.generator_s:.2f}",
                      str(s.conflicts), f"{s.bytes_sent / 2**20:.1f}")
    console.print(table)
    curve = Table(title="average model, held out (emulated wall time)")
    for col in ("t (s)", "accuracy", "consensus distance"):
        curve.add_column(col, justify="right")
    step = max(1, len(result.curve) // 12)
    for t, acc, spread in result.curve[::step]:
        curve.add_row(f"{t:.2f}", f"{acc:.4f}", f"{spread:.3g}")
    console.print(curve)
