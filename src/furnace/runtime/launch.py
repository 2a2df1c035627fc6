"""Process launch for multi-rank runs on one machine, and the same entry points under torchrun.

`run_distributed` is the harness every distributed test and benchmark uses (the pattern of
torchrec's `MultiProcessTestBase`, `shared/design/style.md` 2.5): spawned processes, one
process group per run, torn down after a barrier in every case. A failure in any rank is
raised in the parent with that rank's traceback. Three bounds keep a run from hanging:

- every collective has a timeout (``collective_timeout_s``, passed to the process group);
- each rank sends a heartbeat from a thread, so a rank that stops (SIGSTOP, a debugger, a
  swapped-out machine) is named by the parent within ``liveness_timeout_s``;
- the whole job has a deadline (``timeout_s``), after which the error shows each rank's stack.

SIGTERM to the parent (what a scheduler's plain ``kill`` sends) is handled like Ctrl-C: the
ranks are stopped and reaped and the parent exits 143; each rank also dies with its parent
(``PR_SET_PDEATHSIG``), so no rank outlives it. Local runs listen on loopback only: the
rendezvous store is bound to 127.0.0.1 and gloo to the loopback interface. Binding wider
(``bind_address``) is an explicit option, and the store has no authentication.

`init_from_env` makes the same code run unchanged under ``torchrun`` (NCCL when CUDA is
available, gloo otherwise); used as ``with init_from_env() as ctx:`` it destroys the group
after a barrier when the block ends, normally or by an exception. Every entry point that
joins a process group does so in that with-block.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import ipaddress
import itertools
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from pathlib import Path
from types import TracebackType
from typing import Any, TypeAlias

import torch
import torch.distributed as dist

from .signals import sigterm_exits

# torch_threads lives with the timing harness; it is re-exported here for existing callers
from .timing import torch_threads

__all__ = [
    "DistributedContext",
    "DistributedError",
    "init_from_env",
    "is_torchrun",
    "run_distributed",
    "sigterm_exits",
    "torch_threads",
]

# what a rank reports to the parent: ("ok", rank, pickled value) or ("error", rank, traceback)
Report = tuple[str, int, Any]
# monotonic seconds of each rank's last heartbeat, a shared array of doubles (mp.Array)
Heartbeats: TypeAlias = "ctypes.Array[ctypes.c_double]"

LOOPBACK = "127.0.0.1"
# a rank's heartbeat thread writes this often; the parent allows liveness_timeout_s of silence
HEARTBEAT_PERIOD_S = 0.5
# on the error path a barrier must not wait long: the peers may be the ones that failed
ERROR_BARRIER_TIMEOUT_S = 5.0
# the collective timeout of a group that init_from_env creates, unless told otherwise
DEFAULT_TIMEOUT_S = 300.0


class DistributedError(RuntimeError):
    """A rank of a `run_distributed` job failed or hung.

    Attributes:
        ranks: the ranks that failed (or were still running at the timeout).
        kind: "exception", "exit" (the process died without a Python error), "stuck" (no
            heartbeat within the liveness bound: stopped or frozen) or "timeout".
    """

    def __init__(self, message: str, *, ranks: list[int], kind: str) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.kind = kind


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _loopback_interface() -> str:
    """The name of the loopback interface, for gloo's GLOO_SOCKET_IFNAME."""
    names = [name for _, name in socket.if_nameindex()]
    for candidate in ("lo", "lo0"):
        if candidate in names:
            return candidate
    return "lo"


def _bind_gloo(host: str) -> None:
    # gloo otherwise binds to whatever the hostname resolves to, often a public address
    if _is_loopback(host) and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = _loopback_interface()


def _listening_store(host: str, world_size: int, timeout: timedelta) -> dist.TCPStore:
    """A TCPStore server on ``host`` only (torch's own binds to every interface).

    Binding the socket here and handing torch its descriptor also removes the race between
    probing a free port and binding it.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(max(64, 2 * world_size))
        port = sock.getsockname()[1]
        store = dist.TCPStore(host, port, world_size, True, timeout, wait_for_workers=False,
                              master_listen_fd=sock.fileno(), use_libuv=True)
    except BaseException:
        sock.close()
        raise
    # the store owns a duplicate of the descriptor; ours can go
    sock.detach()
    return store


def _store_barrier(store: dist.Store, world_size: int, timeout: timedelta) -> None:
    """Return once all ``world_size`` ranks have called this on ``store``; raise after
    ``timeout``. It runs no collective, so a peer blocked inside one does not stall it, and
    the bound holds on every rank (gloo's monitored barrier enforces it on rank 0 only)."""
    if store.add("arrived", 1) == world_size:
        store.set("all", "1")
    store.wait(["all"], timeout)


def _barrier_then_destroy(timeout_s: float, *, failed: bool = False,
                          barrier_store: dist.Store | None = None) -> None:
    """End a process group: a barrier bounded by ``timeout_s`` (naming a missing rank on
    gloo), then destroy it. Failures of the barrier are swallowed, since this runs on the
    error path too, where the caller's own exception is the one to report.

    After a failure (``failed``) the ranks meet at ``barrier_store`` instead: a healthy
    peer may be blocked in a collective that waits for this rank, and only this rank
    destroying its group (closing its connections) releases it. A collective barrier would
    deadlock with it until the group's timeout.
    """
    if not dist.is_initialized():
        return
    timeout = timedelta(seconds=timeout_s)
    try:
        if failed and barrier_store is not None:
            _store_barrier(barrier_store, dist.get_world_size(), timeout)
        elif dist.get_backend() == "gloo" and dist.get_world_size() > 1:
            dist.monitored_barrier(timeout=timeout)
        else:
            dist.barrier()
    except Exception:
        pass
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


@dataclass(frozen=True)
class DistributedContext:
    """What an entry point needs to know about its process group.

    Used as a context manager (``with init_from_env() as ctx:``) it ends the group on leaving
    the block: a barrier (bounded by ``timeout_s``, or by ERROR_BARRIER_TIMEOUT_S when the
    block raised, since the peers may be the ranks that failed), then
    ``destroy_process_group``, on success and on error. A group that already existed when
    `init_from_env` was called is not owned (``owns_group`` is False) and is left to its
    owner.
    """

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    owns_group: bool = field(default=False, compare=False)
    timeout_s: float = field(default=DEFAULT_TIMEOUT_S, compare=False)
    # where the ranks of an owned group meet after an error (see _barrier_then_destroy)
    barrier_store: dist.Store | None = field(default=None, compare=False, repr=False)

    def __enter__(self) -> DistributedContext:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.owns_group:
            failed = exc_type is not None
            _barrier_then_destroy(ERROR_BARRIER_TIMEOUT_S if failed else self.timeout_s,
                                  failed=failed, barrier_store=self.barrier_store)


def is_torchrun() -> bool:
    """True when this process was started by torchrun (or another launcher that sets RANK)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_from_env(*, backend: str | None = None,
                  timeout_s: float | None = None) -> DistributedContext:
    """Join the process group described by torchrun's environment.

    Use the result as a context manager, ``with init_from_env() as ctx:``, so that the group
    is destroyed after a barrier when the block ends, normally or by an exception.

    Without a launcher's environment it starts a one-rank group on loopback, so a script
    written for torchrun also runs as a plain ``python`` command.

    If a process group already exists (a `run_distributed` rank, a test, an outer
    ``with init_from_env()``), the returned context describes that group but does not own
    it: leaving the block neither barriers nor destroys it. That keeps code written for
    torchrun callable where a group is already set up, and destroying a group under its
    owner would break the owner's next collective and its own teardown. The existing
    group's backend and timeout cannot change, so a ``backend`` that differs from it, or
    any ``timeout_s``, is ignored with a warning.

    Args:
        backend: "nccl" (one GPU per local rank) or "gloo"; default NCCL when CUDA is
            available, gloo otherwise.
        timeout_s: bounds every collective of the new group and the barrier at the end of
            the block (default DEFAULT_TIMEOUT_S).
    """
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if dist.is_initialized():
        return _join_existing(backend, timeout_s)
    if timeout_s is None:
        timeout_s = DEFAULT_TIMEOUT_S
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = timedelta(seconds=timeout_s)
    group_number = next(_groups_created)
    if is_torchrun():
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        device = _device_for(backend, local_rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if backend == "gloo":
            # every rank on this machine (torchrun --standalone, or one node): loopback serves
            single_node = int(os.environ.get("LOCAL_WORLD_SIZE", -1)) == world_size
            _bind_gloo(LOOPBACK if single_node else os.environ.get("MASTER_ADDR", ""))
        # the rendezvous that init_process_group(init_method="env://") does, kept here so
        # that the end-of-block barrier can meet at the same store
        store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
        store.set_timeout(timeout)
        # a namespace per group: the launcher's store outlives a group, and a second group
        # of this process under a shared prefix would read the first one's stale addresses
        dist.init_process_group(backend, store=dist.PrefixStore(
            f"{_group_namespace(group_number)}/default_pg", store), rank=rank,
            world_size=world_size, timeout=timeout)
    else:
        rank, world_size, local_rank = 0, 1, 0
        device = _device_for(backend, 0)
        if backend == "gloo":
            _bind_gloo(LOOPBACK)
        store = _listening_store(LOOPBACK, 1, timeout)
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
    return DistributedContext(rank, world_size, local_rank, backend, device,
                              owns_group=True, timeout_s=timeout_s,
                              barrier_store=dist.PrefixStore(
                                  f"{_group_namespace(group_number)}/end-of-group", store))


# groups this process has created with init_from_env; every rank counts the same sequence
_groups_created = itertools.count()


def _group_namespace(group_number: int) -> str:
    """The keys of one group in a launcher's store. The store outlives a group (a process
    may create several, torchrun may restart the workers), so the name carries the restart
    and the group's number."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"furnace/group/{restart}/{group_number}"


def _join_existing(backend: str | None, timeout_s: float | None) -> DistributedContext:
    """A context on the group some other code initialised; it leaves the group to that code."""
    existing = str(dist.get_backend())
    # stacklevel 3: the warning names init_from_env's caller, the line that passed the value
    if backend is not None and backend != existing:
        warnings.warn(f"init_from_env: backend={backend!r} is ignored: a process group "
                      f"already exists with backend {existing!r}, and it is used as it is",
                      RuntimeWarning, stacklevel=3)
    if timeout_s is not None:
        warnings.warn(f"init_from_env: timeout_s={timeout_s:g} is ignored: a process group "
                      "already exists, and its collectives keep the timeout it was created "
                      "with", RuntimeWarning, stacklevel=3)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    return DistributedContext(rank, world_size, local_rank, existing,
                              _device_for(existing, local_rank), owns_group=False,
                              timeout_s=DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)


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
    collective_timeout_s: float | None = None,
    liveness_timeout_s: float = 30.0,
    bind_address: str = LOOPBACK,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` in ``world_size`` spawned processes.

    Each process joins one process group (``backend``, rendezvous through a store that the
    parent serves on ``bind_address``), runs ``fn``, and ends the group after a barrier
    whatever happens. ``fn`` must be importable (a module-level function) and its arguments
    and return value picklable.

    Args:
        fn: the per-rank body.
        world_size: number of ranks (>= 1).
        backend: "gloo" (CPU) or "nccl" (one GPU per rank).
        timeout_s: wall-clock limit for the whole job; ranks still running then are
            killed and the error shows where each was stuck.
        num_threads: intra-op threads per rank; 1 keeps 4 ranks on a 2-core laptop
            from fighting over cores. None leaves torch's default.
        collective_timeout_s: the process group's timeout, which bounds every collective
            (default: ``timeout_s``).
        liveness_timeout_s: a rank whose heartbeat is silent this long (stopped, frozen)
            is named in the error and the job is ended.
        bind_address: where the rendezvous store and gloo listen. The default, loopback,
            keeps a local run unreachable from other hosts; any other address exposes an
            unauthenticated store to the network, so only pass one on a trusted network.

    Returns:
        The return values of ``fn``, indexed by rank.

    Raises:
        DistributedError: a rank raised (its traceback is in the message), died, stopped
            responding, or did not finish within ``timeout_s``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if collective_timeout_s is not None and collective_timeout_s <= 0:
        raise ValueError(f"collective_timeout_s must be > 0, got {collective_timeout_s}")
    if liveness_timeout_s <= 0:
        raise ValueError(f"liveness_timeout_s must be > 0, got {liveness_timeout_s}")
    with sigterm_exits():
        return _run_once(fn, world_size, args, kwargs, backend, timeout_s, num_threads,
                         collective_timeout_s or timeout_s, liveness_timeout_s, bind_address)


def _run_once(fn: Callable[..., Any], world_size: int, args: tuple[Any, ...],
              kwargs: dict[str, Any], backend: str, timeout_s: float, num_threads: int | None,
              collective_timeout_s: float, liveness_timeout_s: float,
              bind_address: str) -> list[Any]:
    ctx = mp.get_context("spawn")
    results: Queue[Report] = ctx.Queue()
    # monotonic seconds of each rank's last heartbeat; 0 until its first one
    heartbeats = ctx.Array("d", world_size, lock=False)
    collective_timeout = timedelta(seconds=max(collective_timeout_s, 1.0))
    store = _listening_store(bind_address, world_size, collective_timeout)
    with tempfile.TemporaryDirectory(prefix="furnace-launch-") as stack_dir:
        procs = [
            ctx.Process(
                target=_worker,
                args=(fn, rank, world_size, args, kwargs, backend, bind_address, store.port,
                      collective_timeout, num_threads, results, stack_dir, heartbeats,
                      os.getpid()),
                name=f"furnace-rank-{rank}",
            )
            for rank in range(world_size)
        ]
        try:
            for proc in procs:
                proc.start()
            return _collect(procs, results, world_size, timeout_s, liveness_timeout_s,
                            heartbeats, Path(stack_dir))
        finally:
            _reap(procs)
            results.close()
            results.join_thread()
            del store


def _process_state(pid: int | None) -> str:
    """The kernel's one-letter state of a process (R, S, D, T stopped, t traced, Z), or ?."""
    if pid is None:
        return "?"
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    # the command name in parentheses may contain spaces; the state follows the last ')'
    return stat.rsplit(")", 1)[-1].split()[0]


_STATE_WORDS = {"T": "stopped by a signal", "t": "stopped by a debugger",
                "D": "in uninterruptible I/O", "Z": "a zombie"}


def _stuck_ranks(procs: Sequence[BaseProcess], heartbeats: Heartbeats, done: set[int],
                 liveness_timeout_s: float) -> dict[int, str]:
    """Ranks that started but whose heartbeat has been silent too long, with a reason."""
    now = time.monotonic()
    stuck: dict[int, str] = {}
    for r, proc in enumerate(procs):
        if r in done or not proc.is_alive() or heartbeats[r] == 0.0:
            continue
        silent = now - heartbeats[r]
        if silent > liveness_timeout_s:
            state = _process_state(proc.pid)
            what = _STATE_WORDS.get(state, f"process state {state}")
            stuck[r] = f"no heartbeat for {silent:.1f} s (pid {proc.pid}, {what})"
    return stuck


def _collect(procs: Sequence[BaseProcess], results: Queue[Report], world_size: int,
             timeout_s: float, liveness_timeout_s: float, heartbeats: Heartbeats,
             stack_dir: Path) -> list[Any]:
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
        elif status == "error":
            errors[rank] = payload
        finished = set(outputs) | set(errors)
        dead = [r for r, p in enumerate(procs) if r not in finished
                and not p.is_alive() and p.exitcode not in (None, 0)]
        stuck = _stuck_ranks(procs, heartbeats, finished, liveness_timeout_s)
        if stuck:
            parts = [f"rank {r} of {world_size} stopped responding: {why}"
                     for r, why in stuck.items()]
            parts += [f"rank {r} of {world_size} raised:\n{tb}" for r, tb in errors.items()]
            raise DistributedError("\n".join(parts), ranks=list(stuck), kind="stuck")
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


def _failure(world_size: int, errors: dict[int, str], dead: list[int],
             procs: Sequence[BaseProcess]) -> DistributedError:
    parts = [f"rank {r} of {world_size} died with exit code {procs[r].exitcode} "
             "(no Python exception)" for r in dead]
    parts += [f"rank {r} of {world_size} raised:\n{tb}" for r, tb in errors.items()]
    if dead:
        return DistributedError("\n".join(parts), ranks=dead, kind="exit")
    return DistributedError("\n".join(parts), ranks=list(errors)[:1], kind="exception")


def _dump_stacks(procs: Sequence[BaseProcess], ranks: list[int], stack_dir: Path) -> str:
    for r in ranks:
        pid = procs[r].pid
        if procs[r].is_alive() and pid is not None:
            try:
                os.kill(pid, signal.SIGUSR1)
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


def _reap(procs: Sequence[BaseProcess]) -> None:
    procs = [p for p in procs if p.pid is not None]  # a start that failed leaves none
    # ranks that reported get a moment to finish their barrier and destroy their group
    deadline = time.monotonic() + 5.0
    for proc in procs:
        if proc.is_alive():
            proc.join(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
    for proc in procs:
        if proc.is_alive():
            # a stopped process would not act on SIGTERM until continued
            with contextlib.suppress(ProcessLookupError):
                if proc.pid is not None:
                    os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5.0)


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to kill this process when its parent dies (Linux), so a parent killed
    by SIGKILL, which runs no handler, still leaves no rank behind."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the request was in place


def _heartbeat(heartbeats: Heartbeats, rank: int) -> None:
    while True:
        heartbeats[rank] = time.monotonic()
        time.sleep(HEARTBEAT_PERIOD_S)


def _worker(fn: Callable[..., Any], rank: int, world_size: int, args: tuple[Any, ...],
            kwargs: dict[str, Any], backend: str, host: str, port: int,
            collective_timeout: timedelta, num_threads: int | None, results: Queue[Report],
            stack_dir: str, heartbeats: Heartbeats, parent_pid: int) -> None:
    stack_file = open(os.path.join(stack_dir, f"rank{rank}.stack"), "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    _die_with_parent(parent_pid)
    threading.Thread(target=_heartbeat, args=(heartbeats, rank), daemon=True,
                     name="furnace-heartbeat").start()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    os.environ["MASTER_ADDR"] = host
    os.environ["MASTER_PORT"] = str(port)
    if backend == "gloo":
        _bind_gloo(host)
    try:
        store = dist.TCPStore(host, port, world_size, False, collective_timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=collective_timeout)
    except Exception:
        results.put(("error", rank, traceback.format_exc()))
        return
    failed = False
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        out = fn(rank, world_size, *args, **kwargs)
        # plain pickle copies tensors into bytes: the queue's torch pickler would instead
        # share their storage by file descriptor, which breaks once this process exits
        results.put(("ok", rank, pickle.dumps(out)))
    except BaseException:
        failed = True
        results.put(("error", rank, traceback.format_exc()))
    finally:
        _barrier_then_destroy(ERROR_BARRIER_TIMEOUT_S if failed
                              else collective_timeout.total_seconds(), failed=failed,
                              barrier_store=dist.PrefixStore("furnace/end-of-group", store))
        sys.stdout.flush()
        sys.stderr.flush()
