"""Prague's Group Generator (Luo et al., ASPLOS '20; design note `prague.md` section 2.3).

Two layers:

* `GroupGenerator` is the decision logic, pure and clock-agnostic: requests come in one at
  a time with a time stamp, and it answers with the groups it issues. Every issued group
  gets the next global sequence number and is appended to the queue of each member, so
  every member sees its groups in increasing sequence order. A worker executes its queue
  strictly in order; the minimal unfinished group then always has every member either at
  it or computing, so it runs: no cyclic wait is possible (the note's induction on seq).
  The discrete-event simulator (`simulate`) drives the same object on a virtual clock.
* `GeneratorServer` runs that logic as a service on its own `torch.distributed` TCPStore
  (a store of its own: `init_process_group` prefixes the default store, so a service
  reading it could not see the workers' keys), and `GeneratorClient` is a worker's view.

Policies, all reconstructed from the abstract and the note (the paper body is not
available): random (the requester plus g-1 uniformly drawn workers), static (a periodic
sequence of partitions, no generator traffic), buffered (Group Buffer: groups handed out
from a pre-drawn conflict-free partition), division (Group Division: random groups inside
disjoint divisions re-drawn periodically) and ready_window (groups of the workers that
become ready within a short window of the first, after Hetu's partner selection).

A group *satisfies* the outstanding request of every member that has one when it is
issued (its owners); each worker has at most one outstanding request.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from .config import PolicyConfig

__all__ = ["GeneratorClient", "GeneratorServer", "Group", "GroupGenerator",
           "GroupTimeoutError", "static_partitions"]


class GroupTimeoutError(RuntimeError):
    """A wait in the group protocol ran past its timeout; ``missing`` names who it waited
    for (ranks), ``what`` says for what."""

    def __init__(self, rank: int, what: str, missing: Sequence[int], timeout_s: float) -> None:
        self.rank = rank
        self.missing = tuple(missing)
        if self.missing:
            who = ", ".join(str(m) for m in self.missing)
            super().__init__(f"rank {rank}: {what}: still waiting for rank(s) {who} after "
                             f"{timeout_s:g} s")
        else:
            super().__init__(f"rank {rank}: {what}: nothing after {timeout_s:g} s")


@dataclass(frozen=True)
class Group:
    """One issued group: its global sequence number, its sorted members, and the members
    whose outstanding request it satisfies."""

    seq: int
    members: tuple[int, ...]
    owners: tuple[int, ...]

    def encode(self) -> str:
        return f"{self.seq}:{','.join(map(str, self.members))}:{','.join(map(str, self.owners))}"

    @staticmethod
    def decode(text: str) -> Group:
        seq, members, owners = text.split(":")
        return Group(int(seq), tuple(int(m) for m in members.split(",")),
                     tuple(int(o) for o in owners.split(",") if o))


def static_partitions(world_size: int, grid_rows: int) -> list[list[tuple[int, ...]]]:
    """The static schedule: rows of a grid_rows x (world / grid_rows) grid (rank r at row
    r // cols), then its columns. Without a gradient in between the two averagings give
    exact consensus (W_col W_row = 11^T / n, note section 2.2). One row (or one column)
    degenerates to a single partition, the world."""
    cols = world_size // grid_rows
    rows = [tuple(r * cols + c for c in range(cols)) for r in range(grid_rows)]
    columns = [tuple(r * cols + c for r in range(grid_rows)) for c in range(cols)]
    parts = [p for p in (rows, columns) if any(len(g) > 1 for g in p)]
    return parts or [[tuple(range(world_size))]]


@dataclass
class GroupGenerator:
    """The generator's decision logic for ``world_size`` workers under ``policy``.

    Drive it with `request(rank, now)` and, for ready_window, `tick(now)` once `deadline`
    has passed; both return the groups issued. ``queues[m]`` is every group issued to
    member m, in increasing seq.
    """

    policy: PolicyConfig
    world_size: int
    queues: list[list[Group]] = field(init=False)
    issued: list[Group] = field(init=False, default_factory=list)
    pending: set[int] = field(init=False, default_factory=set)
    retired: set[int] = field(init=False, default_factory=set)
    window: list[int] = field(init=False, default_factory=list)
    deadline: float | None = field(init=False, default=None)
    _rng: random.Random = field(init=False)
    _partition: list[tuple[int, ...]] = field(init=False, default_factory=list)
    _unissued: set[tuple[int, ...]] = field(init=False, default_factory=set)
    _claimed: set[int] = field(init=False, default_factory=set)
    _divisions: list[tuple[int, ...]] = field(init=False, default_factory=list)
    _since_division: int = field(init=False, default=0)
    _static: list[list[tuple[int, ...]]] = field(init=False, default_factory=list)
    _static_seqs: set[int] = field(init=False, default_factory=set)
    _requests: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.policy.check_world(self.world_size)
        self.queues = [[] for _ in range(self.world_size)]
        self._rng = random.Random(self.policy.seed)
        self._requests = [0] * self.world_size
        if self.policy.name == "static":
            self._static = static_partitions(self.world_size, self.policy.grid_rows)

    # -- public ---------------------------------------------------------------------------

    def request(self, rank: int, now: float) -> list[Group]:
        """Rank ``rank`` reached its synchronization point at time ``now``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside 0..{self.world_size - 1}")
        if rank in self.pending:
            raise ValueError(f"rank {rank} already has an outstanding request")
        k = self._requests[rank]
        self._requests[rank] += 1
        self.pending.add(rank)
        name = self.policy.name
        if name == "ready_window":
            return self._ready_window(rank, now)
        if name == "static":
            return self._static_group(rank, k)
        if name == "random":
            others = [m for m in range(self.world_size) if m != rank]
            members = [rank, *self._rng.sample(others, self.policy.group_size - 1)]
        elif name == "buffered":
            members = list(self._buffered_group(rank))
            if members == [rank]:
                # its group of this partition is already queued (it joined passively):
                # a no-op group after it satisfies the request once that one has run
                return [self._issue(members)]
        else:
            members = list(self._division_group(rank))
        return [self._issue(members)]

    def tick(self, now: float) -> list[Group]:
        """Close the ready window if its deadline has passed and it holds two workers or
        more (a lone worker waits on for a partner: a group of one mixes nothing, and
        with fewer free workers than g a fixed subset would otherwise lock in and one
        worker never mix)."""
        if self.deadline is not None and now >= self.deadline and len(self.window) >= 2:
            return self._close_window()
        return []

    def retire(self, rank: int) -> list[Group]:
        """Rank ``rank`` will request nothing more. A ready window whose members are all
        that is left closes now, whatever its size, so shutdown cannot wait forever."""
        self.retired.add(rank)
        if self.window and len(self.retired) + len(self.window) >= self.world_size:
            return self._close_window()
        return []

    def group_of(self, rank: int, k: int) -> tuple[int, ...]:
        """Static schedule: the members of rank's k-th group (a pure function)."""
        part = self._static[k % len(self._static)]
        return next(g for g in part if rank in g)

    # -- policies -------------------------------------------------------------------------

    def _ready_window(self, rank: int, now: float) -> list[Group]:
        self.window.append(rank)
        if self.deadline is None:
            self.deadline = now + self.policy.window_ms * 1e-3
        if (len(self.window) >= self.policy.group_size
                or (len(self.window) >= 2 and now >= self.deadline)
                or len(self.retired) + len(self.window) >= self.world_size):
            return self._close_window()
        return []

    def _close_window(self) -> list[Group]:
        members, self.window, self.deadline = self.window, [], None
        return [self._issue(members)] if members else []

    def _static_group(self, rank: int, k: int) -> list[Group]:
        # the group of round k goes into a member's queue when that member reaches round k,
        # never earlier: a member must not see round k+1 (issued by a faster member) at
        # the head of its queue before its own round k. All members share its seq.
        members = self.group_of(rank, k)
        self.pending.discard(rank)
        group = Group(k * self.world_size + min(members), members, members)
        if group.seq not in self._static_seqs:
            self._static_seqs.add(group.seq)
            self.issued.append(group)
        self.queues[rank].append(group)
        return [group]

    def _buffered_group(self, rank: int) -> tuple[int, ...]:
        """Group Buffer: every worker syncs once per pre-drawn partition. A worker whose
        group of the current partition is already queued (issued by a partner) has its
        round: it gets a marker group of itself. A worker that has had its round starts
        the next partition."""
        mine = next((g for g in self._partition if rank in g), None)
        if mine is not None and mine not in self._unissued and rank not in self._claimed:
            self._claimed.add(rank)
            return (rank,)
        if mine is None or mine not in self._unissued:
            self._partition = self._draw_partition(list(range(self.world_size)))
            self._unissued = set(self._partition)
            self._claimed = set()
            mine = next(g for g in self._partition if rank in g)
        self._unissued.discard(mine)
        # the requester, and every member waiting on a request, have had this round
        self._claimed.add(rank)
        self._claimed.update(m for m in mine if m in self.pending)
        return mine

    def _division_group(self, rank: int) -> tuple[int, ...]:
        if not self._divisions or self._since_division >= self.policy.division_period:
            order = list(range(self.world_size))
            self._rng.shuffle(order)
            d = self.policy.divisions
            self._divisions = [tuple(sorted(order[i::d])) for i in range(d)]
            self._since_division = 0
        self._since_division += 1
        division = next(d for d in self._divisions if rank in d)
        others = [m for m in division if m != rank]
        size = min(self.policy.group_size, len(division))
        return (rank, *self._rng.sample(others, size - 1))

    def _draw_partition(self, ranks: list[int]) -> list[tuple[int, ...]]:
        self._rng.shuffle(ranks)
        g = self.policy.group_size
        return [tuple(sorted(ranks[i:i + g])) for i in range(0, len(ranks), g)]

    # -- bookkeeping ----------------------------------------------------------------------

    def _issue(self, members: Sequence[int]) -> Group:
        ordered = tuple(sorted(set(members)))
        if len(ordered) != len(members):
            raise AssertionError(f"duplicate members in {members}")
        owners = tuple(m for m in ordered if m in self.pending)
        seq = len(self.issued)
        group = Group(seq, ordered, owners)
        self.issued.append(group)
        for m in ordered:
            self.queues[m].append(group)
        self.pending.difference_update(owners)
        return group


# -- the service ---------------------------------------------------------------------------

# store keys (one namespace per run, `prefix`): the ticket counter, request t, member m's
# queue entry i, the final queue lengths after shutdown, and per-group arrivals
_CTR = "req_ctr"
_END = "end"
# polling only while a ready window is open (timed waits on the store shorter than that
# would print a C++ warning each time they expire)
_WINDOW_POLL_S = 0.0005


def _wait_key(store: dist.Store, key: str, timeout_s: float) -> bool:
    try:
        store.wait([key], timedelta(seconds=timeout_s))
    except Exception:  # the store's timeout error (DistStoreError)
        return False
    return True


def _req(t: int) -> str:
    return f"req/{t}"


def _entry(m: int, i: int) -> str:
    return f"q/{m}/{i}"


def _final(m: int) -> str:
    return f"final/{m}"


class GeneratorServer:
    """The group generator as a thread serving requests through its own TCPStore.

    ``store`` is the master side of that store (the server never reads the default
    process group's store). Requests are served one at a time in ticket order; a request
    ``"done r"`` says rank r will ask for nothing more. When every rank is done the server
    writes each member's final queue length and exits, so workers drain exactly what was
    issued to them.
    """

    def __init__(self, store: dist.Store, policy: PolicyConfig, world_size: int, *,
                 timeout_s: float) -> None:
        self.store = store
        self.generator = GroupGenerator(policy, world_size)
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.error: BaseException | None = None
        self.requests_served = 0
        self._thread = threading.Thread(target=self._serve, name="group-generator",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise GroupTimeoutError(-1, "group generator did not finish its shutdown", (),
                                    timeout_s)
        if self.error is not None:
            raise self.error

    def _serve(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # surfaced by join() in the hosting rank
            self.error = exc

    def _loop(self) -> None:
        gen, store = self.generator, self.store
        done: set[int] = set()
        lengths = [0] * self.world_size
        t = 1
        last_seen = {r: time.monotonic() for r in range(self.world_size)}
        while len(done) < self.world_size:
            issued: list[Group] = []
            if self._next_request(t, gen.deadline):
                text = store.get(_req(t)).decode()
                t += 1
                self.requests_served += 1
                kind, rank_text = text.split()
                rank = int(rank_text)
                last_seen[rank] = time.monotonic()
                if kind == "done":
                    done.add(rank)
                    issued = gen.retire(rank)
                else:
                    issued = gen.request(rank, time.monotonic())
            else:
                issued = gen.tick(time.monotonic())
                silent = [r for r in range(self.world_size) if r not in done
                          and time.monotonic() - last_seen[r] > self.timeout_s]
                if silent and not issued:
                    raise GroupTimeoutError(-1, "group generator: no request or shutdown "
                                            "notice", silent, self.timeout_s)
            for group in issued:
                for m in group.members:
                    store.set(_entry(m, lengths[m]), group.encode())
                    lengths[m] += 1
        issued = gen.tick(float("inf"))
        if issued:
            raise AssertionError(f"groups formed after every worker was done: {issued}")
        for m in range(self.world_size):
            # the end marker lets a draining worker's blocking wait return at once
            store.set(_entry(m, lengths[m]), _END)
            store.set(_final(m), str(lengths[m]))

    def _next_request(self, t: int, deadline: float | None) -> bool:
        """Whether request t arrived: a blocking wait while no window is open (it returns
        the moment the key is set), a fine poll up to the deadline while one is."""
        if deadline is None:
            return _wait_key(self.store, _req(t), self.timeout_s)
        while time.monotonic() < deadline:
            if self.store.check([_req(t)]):
                return True
            time.sleep(_WINDOW_POLL_S)
        return self.store.check([_req(t)])


class GeneratorClient:
    """A worker's connection to the generator: request a group, read its queue in order.

    Each thread that talks to the store needs its own client (a TCPStore connection is
    not shared between threads).
    """

    def __init__(self, store: dist.Store, rank: int, *, timeout_s: float) -> None:
        self.store = store
        self.rank = rank
        self.timeout_s = timeout_s
        self.consumed = 0

    def request(self) -> None:
        t = self.store.add(_CTR, 1)
        self.store.set(_req(t), f"req {self.rank}")

    def done(self) -> None:
        t = self.store.add(_CTR, 1)
        self.store.set(_req(t), f"done {self.rank}")

    def next_group(self, stop: threading.Event | None = None) -> Group | None:
        """The next group of this rank's queue, or None once the queue is drained after
        shutdown (or ``stop`` is set). Waits at most ``timeout_s`` for it."""
        key = _entry(self.rank, self.consumed)
        if not _wait_key(self.store, key, self.timeout_s):
            if stop is not None and stop.is_set():
                return None
            raise GroupTimeoutError(self.rank, f"queue entry {self.consumed} from the "
                                    "group generator (hosted by rank 0)", (0,),
                                    self.timeout_s)
        text = self.store.get(key).decode()
        if text == _END:
            return None
        self.consumed += 1
        return Group.decode(text)


def arrival_key(seq: int, rank: int) -> str:
    return f"arrive/{seq}/{rank}"


def wait_for_members(store: dist.Store, group: Group, rank: int, timeout_s: float) -> None:
    """Mark this rank as arrived at ``group`` and wait until every member has; on timeout
    name the members that never arrived."""
    store.set(arrival_key(group.seq, rank), "1")
    keys = [arrival_key(group.seq, m) for m in group.members]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except Exception:  # the store's timeout error; find out who is missing
        try:
            missing = [m for m, k in zip(group.members, keys) if not store.check([k])]
            what = f"group {group.seq} {list(group.members)}"
        except Exception:  # the store's host (rank 0) is gone too: name every other member
            missing = [m for m in group.members if m != rank]
            what = (f"group {group.seq} {list(group.members)} (the coordination store on "
                    "rank 0 is unreachable)")
        raise GroupTimeoutError(rank, what, missing, timeout_s) from None
