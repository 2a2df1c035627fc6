"""Process launch for multi-rank runs on one machine, and the same entry points under torchrun.

`run_distributed` is the harness every distributed test and benchmark uses (the pattern of
torchrec's `MultiProcessTestBase`, `shared/design/style.md` 2.5): spawned processes, a fresh
free port, one process group per run, torn down in every case. A failure in any rank is
raised in the parent with that rank's traceback; a rank that hangs is killed at the
timeout, and the error names it and shows where every live rank was stuck.

`init_from_env` makes the same code run unchanged under ``torchrun`` (NCCL when CUDA is
available, gloo otherwise).
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "DistributedContext",
    "DistributedError",
    "find_free_port",
    "init_from_env",
    "is_torchrun",
    "run_distributed",
    "torch_threads",
]


@contextlib.contextmanager
def torch_threads(num_threads: int) -> Iterator[None]:
    """Run the block with ``num_threads`` torch intra-op threads, then restore the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class DistributedError(RuntimeError):
    """A rank of a `run_distributed` job failed or hung.

    Attributes:
        ranks: the ranks that failed (or were still running at the timeout).
        kind: "exception", "exit" (the process died without a Python error) or "timeout".
    """

    def __init__(self, message: str, *, ranks: list[int], kind: str) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.kind = kind


def find_free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class DistributedContext:
    """What an entry point needs to know about its process group."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device


def is_torchrun() -> bool:
    """True when this process was started by torchrun (or another launcher that sets RANK)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_from_env(*, backend: str | None = None, timeout_s: float = 300.0) -> DistributedContext:
    """Join the process group described by torchrun's environment.

    Picks NCCL (one GPU per local rank) when CUDA is available and gloo otherwise. Without
    a launcher's environment it starts a one-rank gloo group, so a script written for
    torchrun also runs as a plain ``python`` command.
    """
    if dist.is_initialized():
        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        backend = dist.get_backend()
        device = _device_for(backend, local_rank)
        return DistributedContext(rank, world_size, local_rank, backend, device)
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if is_torchrun():
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        device = _device_for(backend, local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    else:
        rank, world_size, local_rank = 0, 1, 0
        device = _device_for(backend, 0)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{find_free_port()}",
            rank=0,
            world_size=1,
            timeout=timedelta(seconds=timeout_s),
        )
    return DistributedContext(rank, world_size, local_rank, backend, device)


def _device_for(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        return torch.device("cuda", local_rank % max(torch.cuda.device_count(), 1))
    return torch.device("cpu")


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 120.0,
    num_threads: int | None = 1,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` in ``world_size`` spawned processes.

    Each process joins one process group (``backend`` on a fresh 127.0.0.1 port), runs
    ``fn`` and destroys the group whatever happens. ``fn`` must be importable (a
    module-level function) and its arguments and return value picklable.

    Args:
        fn: the per-rank body.
        world_size: number of ranks (>= 1).
        backend: "gloo" (CPU) or "nccl" (one GPU per rank).
        timeout_s: wall-clock limit for the whole job; ranks still running then are
            killed and the error shows where each was stuck.
        num_threads: intra-op threads per rank; 1 keeps 4 ranks on a 2-core laptop
            from fighting over cores. None leaves torch's default.

    Returns:
        The return values of ``fn``, indexed by rank.

    Raises:
        DistributedError: a rank raised (its traceback is in the message), died, or
            did not finish within ``timeout_s``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    for attempt in range(3):
        try:
            return _run_once(fn, world_size, args, kwargs, backend, timeout_s, num_threads)
        except _PortTaken:
            # another process took the port between probing and binding it; try a new one
            if attempt == 2:
                raise DistributedError(
                    "could not bind a free port for the rendezvous after 3 tries",
                    ranks=[0],
                    kind="exception",
                ) from None
    raise AssertionError("unreachable")


class _PortTaken(Exception):
    pass


def _run_once(fn, world_size, args, kwargs, backend, timeout_s, num_threads) -> list[Any]:
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    port = find_free_port()
    with tempfile.TemporaryDirectory(prefix="furnace-launch-") as stack_dir:
        procs = [
            ctx.Process(
                target=_worker,
                args=(fn, rank, world_size, args, kwargs, backend, port, timeout_s,
                      num_threads, results, stack_dir),
                name=f"furnace-rank-{rank}",
            )
            for rank in range(world_size)
        ]
        for proc in procs:
            proc.start()
        try:
            return _collect(procs, results, world_size, timeout_s, Path(stack_dir))
        finally:
            _reap(procs)
            results.close()
            results.join_thread()


def _collect(procs, results, world_size, timeout_s, stack_dir: Path) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    outputs: dict[int, Any] = {}
    errors: dict[int, str] = {}
    first_failure: float | None = None
    while len(outputs) < world_size:
        try:
            status, rank, payload = results.get(timeout=0.05)
        except queue.Empty:
            status = None
        if status == "ok":
            outputs[rank] = pickle.loads(payload)
        elif status == "port":
            raise _PortTaken()
        elif status == "error":
            errors[rank] = payload
        dead = [r for r, p in enumerate(procs) if r not in outputs and r not in errors
                and not p.is_alive() and p.exitcode not in (None, 0)]
        if (errors or dead) and first_failure is None:
            first_failure = time.monotonic()
        # after a failure, wait a moment: the root cause may be a rank that died silently
        # while its peers are still reporting the broken connections it left behind
        if first_failure is not None and time.monotonic() - first_failure > 1.0:
            raise _failure(world_size, errors, dead, procs)
        if time.monotonic() > deadline:
            hung = [r for r in range(world_size) if r not in outputs]
            stacks = _dump_stacks(procs, hung, stack_dir)
            raise DistributedError(
                f"rank(s) {hung} of {world_size} did not finish within {timeout_s:g} s "
                f"and were killed. Where each was:\n{stacks}",
                ranks=hung,
                kind="timeout",
            )
    return [outputs[r] for r in range(world_size)]


def _failure(world_size: int, errors: dict[int, str], dead: list[int], procs) -> DistributedError:
    parts = [f"rank {r} of {world_size} died with exit code {procs[r].exitcode} "
             "(no Python exception)" for r in dead]
    parts += [f"rank {r} of {world_size} raised:\n{tb}" for r, tb in errors.items()]
    if dead:
        return DistributedError("\n".join(parts), ranks=dead, kind="exit")
    return DistributedError("\n".join(parts), ranks=list(errors)[:1], kind="exception")


def _dump_stacks(procs, ranks: list[int], stack_dir: Path) -> str:
    for r in ranks:
        if procs[r].is_alive() and procs[r].pid is not None:
            try:
                os.kill(procs[r].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
    time.sleep(0.5)
    parts = []
    for r in ranks:
        path = stack_dir / f"rank{r}.stack"
        text = path.read_text(errors="replace").strip() if path.exists() else ""
        parts.append(f"--- rank {r} ---\n{_own_thread_stack(text) or '(no stack dumped)'}")
    return "\n".join(parts)


def _own_thread_stack(text: str) -> str:
    # faulthandler lists every thread; the main thread is the one running the rank's code
    blocks = text.split("\n\n")
    main = [b for b in blocks if "most recent call first" in b and "Current thread" in b]
    return (main[-1] if main else text)[-4000:]


def _reap(procs) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + 5.0
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5.0)


def _worker(fn, rank, world_size, args, kwargs, backend, port, timeout_s, num_threads,
            results, stack_dir) -> None:
    stack_file = open(os.path.join(stack_dir, f"rank{rank}.stack"), "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=max(timeout_s, 1.0)),
        )
    except Exception as exc:
        if "address already in use" in str(exc).lower() or "EADDRINUSE" in str(exc):
            results.put(("port", rank, None))
        else:
            results.put(("error", rank, traceback.format_exc()))
        return
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        out = fn(rank, world_size, *args, **kwargs)
        # plain pickle copies tensors into bytes: the queue's torch pickler would instead
        # share their storage by file descriptor, which breaks once this process exits
        results.put(("ok", rank, pickle.dumps(out)))
    except BaseException:
        results.put(("error", rank, traceback.format_exc()))
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass
        sys.stdout.flush()
        sys.stderr.flush()
