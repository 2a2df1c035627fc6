"""One rank of a decentralized training run, in every mode (Luo et al., ASPLOS '20; design
note `prague.md` sections 2 and 7.1 items 4-5).

Modes share the task, the data shards, the optimizer (SGD with momentum, state local to
the worker), the emulated compute and the measurement:

* ``prague``: a compute thread and a communication thread (variant (b) of note 2.3). After
  each step the compute thread asks the group generator for a group; the communication
  thread executes its queue strictly in sequence order, running P-Reduce on a snapshot of
  the model and adding (mean - snapshot) to the live model, so updates the compute thread
  made meanwhile survive. With ``overlap`` the compute thread goes on at once and waits
  for its previous group only before its next request (staleness at most one group).
  Static schedules need no generator: the k-th group is a function of the rank and k.
* ``adpsgd``: AD-PSGD with the bipartite fix (Lian et al., ICML '18): odd ranks are
  active and exchange with a random even (passive) rank after each step; a passive rank's
  serving thread answers one active at a time while its compute goes on.
* ``adpsgd_naive``: every rank active and passive, each holding its own lock while it
  waits for its partner's: cyclic waits, each broken by a timeout that is counted.
* ``allreduce``: DistributedDataParallel on the world group, with the stop decision made
  collectively (a MAX all-reduce of a flag), since ranks that stop on their own clocks
  would leave the others in a collective.
* ``dpsgd``: D-PSGD on a ring, x_i <- (x_{i-1} + x_i + x_{i+1}) / 3 after each step.
* ``localsgd``: local steps with a world average every ``local_sgd_period`` steps.

Every rank snapshots its model every ``snapshot_every_s`` from a common start; after the
run the snapshots are averaged over the world, which gives the average model's held-out
accuracy against wall time and the consensus distance, whatever the mode.
"""

from __future__ import annotations

import os
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .config import RunConfig
from .generator import (
    GeneratorClient,
    GeneratorServer,
    Group,
    GroupGenerator,
    GroupTimeoutError,
    static_partitions,
)
from .hetero import Injector
from .preduce import PReduce, PReduceStats, irecv, isend, make_backend
from .tasks import (
    accuracy,
    build_model,
    flat_gradients,
    flat_parameters,
    load_digits_split,
    sample_batch,
    shard,
)

__all__ = ["Span", "WorkerReport", "WorkerStats", "run_worker"]

# the static schedule's agreed stop: a store key, and how many rounds ahead of the first
# worker past its deadline the last round is (partners block each other every round, so
# no worker runs more than a couple of rounds ahead of any other)
_STATIC_STOP = "static_stop"
_STATIC_STOP_MARGIN = 4
# how often a synchronous run that stops at an accuracy scores its model
_STOP_CHECK_S = 0.25
# tags of AD-PSGD's messages on the world group (P-Reduce uses its own, in another mode)
_TAG_CTRL, _TAG_REPLY, _TAG_TO_SERVER, _TAG_TO_INITIATOR = 11, 12, 13, 14
_REQ, _STOP, _OK, _BUSY = 1, 2, 3, 4


@dataclass
class Span:
    """A measured interval of one thread of one rank (seconds from the common start)."""

    rank: int
    thread: str
    name: str
    category: str
    start: float
    end: float
    waited_for: tuple[int, ...] = ()


@dataclass
class WorkerStats:
    """Counters for the overhead breakdown (note section 2.5) of one rank."""

    steps: int = 0
    compute_s: float = 0.0
    emulated_s: float = 0.0
    generator_s: float = 0.0
    sync_wait_s: float = 0.0
    comm_s: float = 0.0
    member_wait_s: float = 0.0
    transfer_s: float = 0.0
    create_s: float = 0.0
    link_s: float = 0.0
    groups: int = 0
    own_groups: int = 0
    conflicts: int = 0
    bytes_sent: int = 0
    timeouts: int = 0
    exchanges: int = 0
    transients: int = 0
    group_sizes: dict[int, int] = field(default_factory=dict)
    wall_s: float = 0.0

    def absorb(self, p: PReduceStats) -> None:
        self.member_wait_s += p.member_wait_s
        self.transfer_s += p.transfer_s
        self.create_s += p.create_s
        self.link_s += p.link_s
        self.bytes_sent += p.bytes_sent
        for k, v in p.group_sizes.items():
            self.group_sizes[k] = self.group_sizes.get(k, 0) + v


@dataclass
class WorkerReport:
    """What one rank returns. Only rank 0 fills the curve (it scores the averages)."""

    rank: int
    stats: WorkerStats
    spans: list[Span]
    groups: list[tuple[int, tuple[int, ...]]]
    pending_groups: int
    snapshot_times: list[float]
    curve: list[tuple[float, float, float]]
    generator_requests: int = 0
    final_parameters: torch.Tensor | None = None
    # (time, worst worker's accuracy, mean worker's accuracy) of the workers' own models,
    # when the config asks for it; rank 0 only
    local_curve: list[tuple[float, float, float]] = field(default_factory=list)


class _Shared:
    """State the threads of one rank share: the model, its lock, progress, errors."""

    def __init__(self, model: nn.Module, flat: torch.Tensor) -> None:
        self.model = model
        self.flat = flat
        self.lock = threading.Lock()
        self.cond = threading.Condition()
        self.satisfied = 0
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.stop.set()
        with self.cond:
            self.cond.notify_all()

    def mix_in(self, snapshot: torch.Tensor, mean: torch.Tensor) -> None:
        # updates applied since the snapshot stay: x <- x + (mean - snapshot)
        with self.lock:
            self.flat.add_(mean - snapshot)


def _coordination_store(rank: int, timeout_s: float) -> tuple[dist.Store, str, int]:
    """A TCPStore of this run, separate from the process group's (section 4.3 of the note:
    the default store is prefixed, so a service reading it would not see the workers)."""
    host = os.environ.get("MASTER_ADDR", "127.0.0.1") if "RANK" in os.environ else "127.0.0.1"
    timeout = timedelta(seconds=timeout_s)
    box: list[Any] = [None]
    store: dist.Store | None = None
    if rank == 0:
        master = dist.TCPStore(host, 0, None, True, timeout, wait_for_workers=False)
        store = master
        box[0] = master.port
    dist.broadcast_object_list(box, src=0)
    port = int(box[0])
    if store is None:
        store = dist.TCPStore(host, port, None, False, timeout)
    return store, host, port


def _connect(host: str, port: int, timeout_s: float) -> dist.Store:
    return dist.TCPStore(host, port, None, False, timedelta(seconds=timeout_s))


class _Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0


def run_worker(rank: int, world_size: int, config: RunConfig,
               progress: Callable[[int, float], None] | None = None) -> WorkerReport:
    """Train this rank under ``config``; every rank of the world group must call it."""
    if world_size != config.world_size:
        raise ValueError(f"config.world_size is {config.world_size} but the group has "
                         f"{world_size} ranks")
    torch.manual_seed(config.seed * 7919 + rank)
    split = load_digits_split(seed=config.seed)
    x_shard, y_shard = shard(split, rank, world_size, label_alpha=config.label_alpha,
                             seed=config.seed)
    model = build_model(config.task, config.seed, hidden=config.mlp_hidden)
    flat = flat_parameters(model)
    flat_grad = flat_gradients(model)
    if config.init_spread > 0:
        noise = torch.Generator().manual_seed(config.seed * 65537 + rank)
        with torch.no_grad():
            flat.add_(torch.randn(flat.shape, generator=noise) * config.init_spread)
    shared = _Shared(model, flat)
    injector = Injector(config.hetero, rank, config.compute_ms)
    stats = WorkerStats()
    spans: list[Span] = []
    batches = torch.Generator().manual_seed(config.seed * 104729 + rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum)
    train_model: nn.Module = model
    if config.mode == "allreduce":
        train_model = nn.parallel.DistributedDataParallel(model)
    loss_fn = nn.CrossEntropyLoss()
    store, host, port = _coordination_store(rank, config.timeout_s)
    fail_rank, fail_step = config.fail if config.fail is not None else (-1, -1)

    def compute_step(clock: _Clock) -> None:
        start = clock.now()
        x, y = sample_batch(x_shard, y_shard, config.batch_size, batches)
        with shared.lock:
            flat_grad.zero_()
            loss = loss_fn(train_model(x), y)
            loss.backward()
        real = clock.now() - start
        emulated = injector.sleep_compute()
        with shared.lock:
            optimizer.step()
        end = clock.now()
        stats.compute_s += real
        stats.emulated_s += emulated
        stats.steps += 1
        spans.append(Span(rank, "compute", f"step {stats.steps}", "compute", start, end))
        if progress is not None:
            progress(stats.steps, end)

    snapshots: list[torch.Tensor] = []
    snapshot_times: list[float] = []

    def snapshotter(clock: _Clock) -> None:
        k = 0
        while not shared.stop.is_set():
            target = k * config.snapshot_every_s
            delay = target - clock.now()
            if delay > 0 and shared.stop.wait(delay):
                break
            with shared.lock:
                snapshots.append(flat.clone())
            snapshot_times.append(target)
            k += 1

    dist.barrier()
    clock = _Clock()
    snap_thread = threading.Thread(target=snapshotter, args=(clock,), daemon=True)
    snap_thread.start()
    groups_log: list[tuple[int, tuple[int, ...]]] = []
    pending = 0
    generator_requests = 0
    try:
        if config.mode == "prague":
            pending, generator_requests = _run_prague(
                rank, world_size, config, shared, stats, spans, clock, compute_step,
                injector, host, port, groups_log, (fail_rank, fail_step))
        elif config.mode in ("adpsgd", "adpsgd_naive"):
            _run_adpsgd(rank, world_size, config, shared, stats, spans, clock, compute_step,
                        injector, naive=config.mode == "adpsgd_naive")
        else:
            _run_synchronous(rank, world_size, config, shared, stats, spans, clock,
                             compute_step, injector, split)
    except GroupTimeoutError:
        if rank == 0:
            # this rank hosts the coordination store: peers that timed out at about the
            # same moment read it to name who is missing, so it outlives their look
            time.sleep(config.timeout_s / 2)
        raise
    finally:
        shared.stop.set()
        snap_thread.join(config.timeout_s)
    stats.wall_s = clock.now()
    stats.transients = injector.transients
    dist.barrier()
    # the snapshots every rank took (a rank's snapshotter may have stopped one early)
    count = torch.tensor([len(snapshots)], dtype=torch.int64)
    dist.all_reduce(count, op=dist.ReduceOp.MIN)
    common, common_times = snapshots[:int(count.item())], snapshot_times[:int(count.item())]
    curve = _score(rank, world_size, common, common_times, model, flat, split)
    local_curve = _score_local(rank, world_size, common, common_times, model, flat, split,
                               config.local_score_every)
    del store
    return WorkerReport(rank, stats, spans, groups_log, pending, snapshot_times, curve,
                        generator_requests, flat.clone(), local_curve)


def _done(config: RunConfig, stats: WorkerStats, clock: _Clock) -> bool:
    return clock.now() >= config.duration_s or stats.steps >= config.max_steps


# -- Prague -------------------------------------------------------------------------------

def _run_prague(rank: int, world_size: int, config: RunConfig, shared: _Shared,
                stats: WorkerStats, spans: list[Span], clock: _Clock,
                compute_step: Callable[[_Clock], None], injector: Injector,
                host: str, port: int, groups_log: list[tuple[int, tuple[int, ...]]],
                fail: tuple[int, int]) -> tuple[int, int]:
    static = config.policy.name == "static"
    static_groups: list[tuple[int, ...]] | None = None
    if static:
        static_groups = [g for part in static_partitions(world_size, config.policy.grid_rows)
                         for g in part]
    comm_store = _connect(host, port, config.timeout_s)
    backend: PReduce = make_backend(config.backend, rank, comm_store,
                                    timeout_s=config.timeout_s, injector=injector,
                                    static_groups=static_groups)
    server: GeneratorServer | None = None
    if rank == 0 and not static:
        server = GeneratorServer(_connect(host, port, config.timeout_s), config.policy,
                                 world_size, timeout_s=config.timeout_s)
        server.start()
    dist.barrier()
    local_queue: queue.Queue[Group | None] = queue.Queue()
    requester = GeneratorClient(_connect(host, port, config.timeout_s), rank,
                                timeout_s=config.timeout_s)
    reader = GeneratorClient(comm_store, rank, timeout_s=config.timeout_s)
    static_gen = GroupGenerator(config.policy, world_size) if static else None
    requested = 0
    request_times: dict[int, float] = {}
    died = threading.Event()
    conflicted = [False]

    def next_group() -> Group | None:
        if static:
            while True:
                try:
                    return local_queue.get(timeout=0.05)
                except queue.Empty:
                    if shared.stop.is_set() and shared.error is not None:
                        return None
        return reader.next_group(stop=died)

    def comm_loop() -> None:
        try:
            while True:
                group = next_group()
                if group is None or died.is_set():
                    return
                start = clock.now()
                groups_log.append((group.seq, group.members))
                stats.groups += 1
                own = rank in group.owners
                with shared.cond:
                    outstanding = requested > shared.satisfied
                if own:
                    stats.generator_s += max(0.0, start - request_times[shared.satisfied])
                elif outstanding:
                    # another group ran while this rank's own was still to come
                    conflicted[0] = True
                if len(group.members) > 1:
                    with shared.lock:
                        snapshot = shared.flat.clone()
                    mean = snapshot.clone()
                    backend(mean, group)
                    shared.mix_in(snapshot, mean)
                else:
                    backend(shared.flat.new_empty(0), group)
                end = clock.now()
                stats.comm_s += end - start
                spans.append(Span(rank, "comm", f"group {group.seq} {list(group.members)}",
                                  "preduce", start, end, group.members))
                if own:
                    stats.own_groups += 1
                    stats.conflicts += int(conflicted[0])
                    conflicted[0] = False
                    with shared.cond:
                        shared.satisfied += 1
                        shared.cond.notify_all()
        except BaseException as exc:
            shared.fail(exc)

    comm_thread = threading.Thread(target=comm_loop, name="comm", daemon=True)
    comm_thread.start()

    def wait_own(upto: int) -> None:
        start = clock.now()
        # twice the timeout: the communication thread's own waits (which can name the
        # missing members) run out first and are the error reported
        deadline = time.monotonic() + 2 * config.timeout_s
        with shared.cond:
            while shared.satisfied < upto and shared.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise GroupTimeoutError(rank, f"own group of request {upto} (the "
                                            "communication thread is stuck)", (),
                                            2 * config.timeout_s)
                shared.cond.wait(min(left, 0.05))
        if shared.error is not None:
            raise shared.error
        end = clock.now()
        stats.sync_wait_s += end - start
        if end - start > 1e-4:
            spans.append(Span(rank, "compute", "wait for own group", "wait", start, end))

    def request() -> None:
        nonlocal requested
        start = clock.now()
        # recorded before the request leaves: its group can reach the communication
        # thread before request() returns
        request_times[requested] = start
        if static:
            assert static_gen is not None
            members = static_gen.group_of(rank, requested)
            local_queue.put(Group(requested * world_size + min(members), members, members))
        else:
            requester.request()
        requested += 1

    stop_round: int | None = None

    def keep_going() -> bool:
        """Generator policies stop on each worker's clock and drain. A static schedule has
        no generator to drain through, and a worker that stops on its own clock would
        leave its partner waiting at the next round: so the first worker past its
        deadline proposes a last round a margin ahead, and every worker runs to it."""
        nonlocal stop_round
        if not static or stats.steps >= config.max_steps:
            return not _done(config, stats, clock)
        if stop_round is None:
            store_ = requester.store
            if store_.check([_STATIC_STOP]):
                stop_round = int(store_.get(_STATIC_STOP))
            elif _done(config, stats, clock):
                stop_round = int(store_.compare_set(_STATIC_STOP, "",
                                                    str(requested + _STATIC_STOP_MARGIN)))
        if stop_round is not None and requested > stop_round:
            raise RuntimeError(f"rank {rank}: static schedule at round {requested}, past "
                               f"the agreed last round {stop_round}")
        return stop_round is None or requested < stop_round

    ahead = 0  # steps computed since the last request
    try:
        while keep_going():
            if shared.error is not None:
                raise shared.error
            if rank == fail[0] and stats.steps >= fail[1]:
                died.set()  # this rank stops answering, as a dead one would
                break
            compute_step(clock)
            if config.overlap:
                ahead += 1
                with shared.cond:
                    idle = shared.satisfied >= requested
                if not idle and ahead < config.max_staleness:
                    continue  # the own group is still in flight: compute on
                wait_own(requested)
                request()
                ahead = 0
            else:
                request()
                wait_own(requested)
        if died.is_set():
            # outlive the peers' timeouts, so they report this rank rather than a closed
            # connection
            time.sleep(config.timeout_s * 2 + 1.0)
            raise RuntimeError(f"rank {rank} stopped at step {stats.steps} (fault injected)")
        wait_own(requested)
        if static:
            local_queue.put(None)
        else:
            requester.done()
        comm_thread.join(config.timeout_s * 4)
        if comm_thread.is_alive():
            raise GroupTimeoutError(rank, "draining the group queue", (), config.timeout_s)
        if shared.error is not None:
            raise shared.error
        if server is not None:
            server.join(config.timeout_s)
    finally:
        stats.absorb(backend.stats)
    pending = 0 if static else reader_pending(reader, comm_store, rank)
    requests = server.requests_served if server is not None else 0
    return pending, requests


def reader_pending(reader: GeneratorClient, store: dist.Store, rank: int) -> int:
    """Groups issued to this rank that it did not execute (0 after a clean drain)."""
    final = int(store.get(f"final/{rank}"))
    return final - reader.consumed


# -- AD-PSGD ------------------------------------------------------------------------------

def _exchange(flat: torch.Tensor, peer: int, send_tag: int, recv_tag: int,
              timeout: timedelta, rank: int, what: str) -> torch.Tensor:
    theirs = torch.empty_like(flat)
    works = [isend(flat, peer, tag=send_tag), irecv(theirs, peer, tag=recv_tag)]
    for work in works:
        try:
            work.wait(timeout=timeout)
        except RuntimeError as exc:
            raise GroupTimeoutError(rank, what, [peer], timeout.total_seconds()) from exc
    return theirs


def _run_adpsgd(rank: int, world_size: int, config: RunConfig, shared: _Shared,
                stats: WorkerStats, spans: list[Span], clock: _Clock,
                compute_step: Callable[[_Clock], None], injector: Injector,
                *, naive: bool) -> None:
    timeout = timedelta(seconds=config.timeout_s)
    # naive mode: a server that cannot take its own lock within this answers busy, which
    # is how a cyclic wait (i waits for j while j waits for i) is broken and counted
    lock_timeout_s = min(0.25, config.timeout_s / 4)
    passive = [r for r in range(world_size) if r % 2 == 0]
    active = [r for r in range(world_size) if r % 2 == 1]
    serves = naive or rank in passive
    initiates = naive or rank in active
    peers = [r for r in range(world_size) if r != rank] if naive else passive
    senders = [r for r in range(world_size) if r != rank] if naive else active
    own = threading.Lock()  # the naive mode's per-worker exchange lock
    rng = random.Random(config.seed * 31 + rank)
    nbytes = shared.flat.numel() * shared.flat.element_size()

    def average_with(peer: int, send_tag: int, recv_tag: int, what: str) -> None:
        """Swap models with ``peer`` and keep the pair's mean (plus local updates since)."""
        with shared.lock:
            snapshot = shared.flat.clone()
        injector.sleep_link(nbytes)
        theirs = _exchange(snapshot, peer, send_tag, recv_tag, timeout, rank, what)
        shared.mix_in(snapshot, (snapshot + theirs) / 2)
        stats.bytes_sent += nbytes
        stats.exchanges += 1

    def serve() -> None:
        try:
            stops = 0
            while stops < len(senders):
                header = torch.zeros(2, dtype=torch.int64)
                work = irecv(header, tag=_TAG_CTRL)
                try:
                    work.wait(timeout=timedelta(seconds=config.timeout_s * 4))
                except RuntimeError as exc:
                    raise GroupTimeoutError(rank, "AD-PSGD serving thread: request or stop",
                                            senders, config.timeout_s * 4) from exc
                src = int(header[1])
                if int(header[0]) == _STOP:
                    stops += 1
                    continue
                got = own.acquire(timeout=lock_timeout_s) if naive else True
                reply = torch.tensor([_OK if got else _BUSY, rank], dtype=torch.int64)
                isend(reply, src, tag=_TAG_REPLY).wait(timeout=timeout)
                if not got:
                    continue
                try:
                    start = clock.now()
                    average_with(src, _TAG_TO_INITIATOR, _TAG_TO_SERVER,
                                 f"AD-PSGD exchange served for {src}")
                    spans.append(Span(rank, "comm", f"serve {src}", "exchange", start,
                                      clock.now(), (src,)))
                finally:
                    if naive:
                        own.release()
        except BaseException as exc:
            shared.fail(exc)

    server = threading.Thread(target=serve, name="adpsgd-serve", daemon=True)
    if serves:
        server.start()

    def initiate(peer: int) -> None:
        """One exchange with ``peer``, started by this (active) worker."""
        start = clock.now()
        thread = "comm" if overlapped else "compute"
        if naive:
            own.acquire()
        try:
            header = torch.tensor([_REQ, rank], dtype=torch.int64)
            isend(header, peer, tag=_TAG_CTRL).wait(timeout=timeout)
            reply = torch.zeros(2, dtype=torch.int64)
            work = irecv(reply, peer, tag=_TAG_REPLY)
            try:
                work.wait(timeout=timeout)
            except RuntimeError as exc:
                raise GroupTimeoutError(rank, "AD-PSGD reply", [peer],
                                        config.timeout_s) from exc
            if int(reply[0]) == _BUSY:
                stats.timeouts += 1
            else:
                average_with(peer, _TAG_TO_SERVER, _TAG_TO_INITIATOR,
                             f"AD-PSGD exchange with {peer}")
        finally:
            if naive:
                own.release()
        end = clock.now()
        stats.comm_s += end - start
        spans.append(Span(rank, thread, f"exchange with {peer}", "exchange", start, end,
                          (peer,)))

    # AD-PSGD averages in a communication thread while the next gradient is computed
    # (Lian et al., as Prague's overlap: at most one exchange in flight). The naive mode
    # blocks, as the textbook locking it demonstrates does.
    overlapped = config.overlap and not naive and initiates
    jobs: queue.Queue[int | None] = queue.Queue()

    idle = threading.Event()  # no exchange of this initiator in flight
    idle.set()

    def initiator() -> None:
        while True:
            peer = jobs.get()
            try:
                if peer is None:
                    return
                initiate(peer)
            except BaseException as exc:
                shared.fail(exc)
                return
            finally:
                idle.set()
                jobs.task_done()

    initiator_thread = threading.Thread(target=initiator, name="adpsgd-initiate",
                                        daemon=True)
    if overlapped:
        initiator_thread.start()
    dist.barrier()
    ahead = 0  # steps computed since the last exchange began
    try:
        while not _done(config, stats, clock):
            if shared.error is not None:
                raise shared.error
            compute_step(clock)
            if not initiates:
                continue
            ahead += 1
            if overlapped and not idle.is_set() and ahead < config.max_staleness:
                continue  # the previous exchange is still in flight: compute on
            ahead = 0
            peer = rng.choice(peers)
            start = clock.now()
            if overlapped:
                jobs.join()  # the previous exchange, which ran during this step
                if shared.error is not None:
                    raise shared.error
                idle.clear()
                jobs.put(peer)
            else:
                initiate(peer)
            end = clock.now()
            stats.sync_wait_s += end - start
            if end - start > 1e-4:
                spans.append(Span(rank, "compute", "wait for exchange", "wait", start, end,
                                  (peer,)))
        if overlapped:
            jobs.join()
            jobs.put(None)
            initiator_thread.join(config.timeout_s)
        if shared.error is not None:
            raise shared.error
        if initiates:
            stop = torch.tensor([_STOP, rank], dtype=torch.int64)
            for peer in peers:
                isend(stop, peer, tag=_TAG_CTRL).wait(timeout=timeout)
        if serves:
            server.join(config.timeout_s * 8)
            if server.is_alive():
                raise GroupTimeoutError(rank, "AD-PSGD serving thread shutdown", senders,
                                        config.timeout_s * 8)
        if shared.error is not None:
            raise shared.error
    except BaseException as exc:
        shared.fail(exc)
        raise


# -- synchronous modes ----------------------------------------------------------------------

def _run_synchronous(rank: int, world_size: int, config: RunConfig, shared: _Shared,
                     stats: WorkerStats, spans: list[Span], clock: _Clock,
                     compute_step: Callable[[_Clock], None], injector: Injector,
                     split: Any) -> None:
    timeout = timedelta(seconds=config.timeout_s)
    flat = shared.flat
    nbytes = flat.numel() * flat.element_size()
    left, right = (rank - 1) % world_size, (rank + 1) % world_size
    next_check = _STOP_CHECK_S
    while True:
        compute_step(clock)
        start = clock.now()
        if config.mode == "allreduce":
            # DDP reduced the gradients inside backward; a slow link delays its share
            injector.sleep_link(2 * (world_size - 1) * nbytes / world_size)
            stats.bytes_sent += 2 * (world_size - 1) * nbytes // world_size
        elif config.mode == "dpsgd":
            injector.sleep_link(2 * nbytes)
            with shared.lock:
                mine = flat.clone()
            got = [torch.empty_like(flat) for _ in range(2)]
            works = [isend(mine, left, tag=21), isend(mine, right, tag=22),
                     irecv(got[0], right, tag=21), irecv(got[1], left, tag=22)]
            for work, peer in zip(works, (left, right, right, left)):
                try:
                    work.wait(timeout=timeout)
                except RuntimeError as exc:
                    raise GroupTimeoutError(rank, "D-PSGD ring exchange", [peer],
                                            config.timeout_s) from exc
            shared.mix_in(mine, (mine + got[0] + got[1]) / 3)
            stats.bytes_sent += 2 * nbytes
        elif stats.steps % config.local_sgd_period == 0:
            injector.sleep_link(2 * (world_size - 1) * nbytes / world_size)
            with shared.lock:
                work = dist.all_reduce(flat, async_op=True)
                assert work is not None
                work.wait(timeout=timeout)
                flat /= world_size
            stats.bytes_sent += 2 * (world_size - 1) * nbytes // world_size
        want_stop = float(_done(config, stats, clock))
        if (config.stop_at_accuracy is not None and rank == 0
                and clock.now() >= next_check):
            # every peer waits for this check at the stop all-reduce: spaced out so it
            # costs the baseline a few percent at most, not every snapshot
            next_check = clock.now() + max(config.snapshot_every_s, _STOP_CHECK_S)
            with shared.lock:
                acc = accuracy(shared.model, split.test_x, split.test_y)
            want_stop = max(want_stop, float(acc >= config.stop_at_accuracy))
        flag = torch.tensor([want_stop])
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
        assert work is not None
        try:
            work.wait(timeout=timeout)
        except RuntimeError as exc:
            raise GroupTimeoutError(rank, "collective stop decision",
                                    [r for r in range(world_size) if r != rank],
                                    config.timeout_s) from exc
        end = clock.now()
        stats.comm_s += end - start
        stats.sync_wait_s += end - start
        spans.append(Span(rank, "compute", "synchronize", "wait", start, end))
        if flag.item() > 0:
            return


# -- scoring --------------------------------------------------------------------------------

def _score(rank: int, world_size: int, snapshots: list[torch.Tensor], times: list[float],
           model: nn.Module, flat: torch.Tensor, split: Any
           ) -> list[tuple[float, float, float]]:
    """Average the snapshots (as many on every rank) over the world; rank 0 scores each
    average on the held-out split. Returns (time, accuracy of the average model, consensus
    distance); the last entry, at time inf, is the final models after the run."""
    with torch.no_grad():
        final = flat.clone()
        states = [*snapshots, final]
        stamps = [*times, float("inf")]
        curve = []
        # several snapshots per all-reduce (chunks of at most _SCORE_CHUNK_BYTES), since
        # one all-reduce per snapshot costs more than the scoring itself
        per_chunk = max(1, _SCORE_CHUNK_BYTES // max(1, final.numel() * 4))
        for lo in range(0, len(states), per_chunk):
            block = torch.stack(states[lo:lo + per_chunk])
            mean = block.clone()
            dist.all_reduce(mean)
            mean /= world_size
            spread = ((block - mean) ** 2).sum(dim=1)
            dist.all_reduce(spread)
            if rank == 0:
                for j in range(block.shape[0]):
                    flat.copy_(mean[j])
                    acc = accuracy(model, split.test_x, split.test_y)
                    curve.append((stamps[lo + j], acc, float(spread[j]) / world_size))
        flat.copy_(final)
    return curve


_SCORE_CHUNK_BYTES = 32 << 20


def _score_local(rank: int, world_size: int, snapshots: list[torch.Tensor],
                 times: list[float], model: nn.Module, flat: torch.Tensor, split: Any,
                 every: int) -> list[tuple[float, float, float]]:
    """Every rank scores its own model at every ``every``-th snapshot (as many on every
    rank) and at the end, the ranks in parallel; rank 0 gets (time, worst, mean) accuracy
    over the workers. Nothing (and no collective) when ``every`` is 0."""
    if every <= 0:
        return []
    picked = list(range(0, len(snapshots), every))
    with torch.no_grad():
        final = flat.clone()
        accs = []
        for k in picked:
            flat.copy_(snapshots[k])
            accs.append(accuracy(model, split.test_x, split.test_y))
        flat.copy_(final)
        accs.append(accuracy(model, split.test_x, split.test_y))
    worst = torch.tensor(accs, dtype=torch.float64)
    mean = worst.clone()
    dist.all_reduce(worst, op=dist.ReduceOp.MIN)
    dist.all_reduce(mean)
    if rank != 0:
        return []
    stamps = [times[k] for k in picked] + [float("inf")]
    return [(t, float(w), float(m) / world_size) for t, w, m in zip(stamps, worst, mean)]
