"""A collective self-check that runs the same under torchrun and `run_distributed`.

    torchrun --nproc-per-node 2 -m furnace.runtime.selfcheck
    furnace selfcheck --world-size 4

Every wrapped op runs on small tensors whose correct result each rank can compute by
itself; the check compares values and the logged byte counts against the byte model,
prints the merged per-rank `CommLog` table on rank 0, and exits non-zero on a mismatch.
On GPUs (NCCL) the tensors live on each rank's device.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from .comm import Communicator, traffic
from .launch import init_from_env


def check_collectives(comm: Communicator, device: torch.device) -> list[str]:
    """Run every op once; returns a list of failures (empty when all agree)."""
    p, r = comm.world_size, comm.rank
    failures: list[str] = []

    def expect(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        if not torch.equal(got.cpu(), want.cpu()):
            failures.append(f"rank {r}: {name} gave {got.tolist()}, expected {want.tolist()}")

    def f64(values: Sequence[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float64, device=device)

    n = 4 * p
    x = f64([r * 100 + i for i in range(n)])
    total = f64([sum(q * 100 + i for q in range(p)) for i in range(n)])
    expect("all_reduce", comm.all_reduce(x.clone()), total)
    expect("all_reduce(max)", comm.all_reduce(x.clone(), "max"),
           f64([(p - 1) * 100 + i for i in range(n)]))
    expect("all_gather", comm.all_gather(f64([r, r])), f64([q for q in range(p) for _ in range(2)]))
    expect("reduce_scatter", comm.reduce_scatter(x.clone()), total.chunk(p)[r])
    expect("broadcast", comm.broadcast(f64([r, 7]), src=p - 1), f64([p - 1, 7]))
    reduced = comm.reduce(x.clone(), dst=0)
    if r == 0:
        expect("reduce", reduced, total)
    # rank r sends (r + j) rows to rank j, each row filled with 10 * r + j
    send_rows = [r + j for j in range(p)]
    recv_rows = [q + r for q in range(p)]
    rows = torch.cat([f64([10 * r + j] * (r + j)) for j in range(p)]).reshape(-1, 1)
    got = comm.all_to_all_single(rows, recv_rows, send_rows)
    want = torch.cat([f64([10 * q + r] * (q + r)) for q in range(p)]).reshape(-1, 1)
    expect("all_to_all_single", got, want)
    if p > 1:
        peer = r ^ 1
        if peer < p:
            if r % 2 == 0:
                comm.send(f64([r, 1]), peer)
                expect("recv", comm.recv(f64([0, 0]), peer), f64([peer, 2]))
            else:
                expect("recv", comm.recv(f64([0, 0]), peer), f64([peer, 1]))
                comm.send(f64([r, 2]), peer)
    comm.barrier()

    for rec in comm.log.records:
        model = _model_for(rec.op, comm, n, send_rows, recv_rows)
        if (rec.bytes_sent, rec.bytes_received) != model:
            failures.append(f"rank {r}: {rec.op} logged {rec.bytes_sent}/{rec.bytes_received} "
                            f"bytes sent/received, model says {model[0]}/{model[1]}")
    return failures


def _model_for(op: str, comm: Communicator, n: int, send_rows: list[int],
               recv_rows: list[int]) -> tuple[int, int]:
    """The (bytes sent, bytes received) that the byte model gives ``op`` in this check."""
    p, r = comm.world_size, comm.rank
    kw: dict[str, Any] = {}
    if op == "all_reduce":
        kw = {"nbytes": 8 * n}
    elif op == "all_gather":
        kw = {"nbytes": 16}
    elif op == "reduce_scatter":
        kw = {"nbytes": 8 * n // p}
    elif op == "broadcast":
        kw = {"nbytes": 16, "root": p - 1}
    elif op == "reduce":
        kw = {"nbytes": 8 * n, "root": 0}
    elif op == "all_to_all_single":
        kw = {"send_bytes": [8 * s for s in send_rows], "recv_bytes": [8 * s for s in recv_rows]}
    elif op in ("send", "recv"):
        kw = {"nbytes": 16, "peer": r ^ 1}
    tr = traffic(op, rank=r, world_size=p, **kw)
    return tr.bytes_sent, tr.bytes_received


def _rank_main(rank: int, world_size: int) -> list[str]:
    comm = Communicator(name="world")
    return check_collectives(comm, torch.device("cpu"))


def main() -> int:
    # the with-block ends the group after a barrier on every path, so no rank aborts at exit
    with init_from_env() as ctx:
        comm = Communicator(name="world")
        failures = check_collectives(comm, ctx.device)
        merged = comm.log.gather()
        all_failures: list[list[str]] = [[] for _ in range(ctx.world_size)]
        dist.all_gather_object(all_failures, failures)
        flat = [f for part in all_failures for f in part]
        if ctx.rank == 0:
            merged.print(f"selfcheck: {ctx.world_size} ranks, backend {ctx.backend}")
            if flat:
                print("\n".join(flat))
            print(f"selfcheck: {'FAILED' if flat else 'ok'} "
                  f"({len(comm.log)} ops per rank, {ctx.world_size} ranks, {ctx.backend})")
    return 1 if flat else 0


if __name__ == "__main__":
    sys.exit(main())
