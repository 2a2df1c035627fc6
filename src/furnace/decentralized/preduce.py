"""Partial All-Reduce (P-Reduce) backends (Luo et al., ASPLOS '20; design note `prague.md`
sections 2.2, 2.4 and 4.3).

``P-Reduce(G)`` replaces every member's flat parameter buffer by the members' mean and
leaves non-members untouched. Three ways to run it on torch.distributed:

* `P2PLeaderPReduce`: the smallest member gathers, averages and scatters with send/recv on
  the world group. Messages carry the group's global sequence number as their tag, so two
  groups' messages never cross. Nothing is created, so any group works at once.
* `CachedGlooPReduce`: a member-only `ProcessGroupGloo` per distinct member set, built on
  first use under a name derived from the sorted members (every member derives the same
  one) and kept for reuse; hits, misses and creation time are counted.
* `PrecreatedPReduce`: every group of a static schedule built with `new_group` up front,
  in one order on every rank, as `new_group` requires.

Dynamic groups must never come from ``new_group(..., use_local_synchronization=True)``:
its name hashes the members with the caller's count of groups created so far, so two
members that created different numbers of groups before disagree on the name and hang
(reproduced on torch 2.13, note section 4.3). `test_preduce` guards that no backend
calls it.

Before moving data every backend marks its arrival in the coordination store and waits
for the other members' marks, which splits waiting from transfer in the overhead counters
and lets a timeout name the members that never came.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist

from .generator import Group, GroupTimeoutError, wait_for_members
from .hetero import Injector

__all__ = ["BACKEND_CLASSES", "irecv", "isend", "CachedGlooPReduce", "P2PLeaderPReduce", "PReduce",
           "PReduceStats", "PrecreatedPReduce", "make_backend"]

def isend(tensor: torch.Tensor, dst: int, tag: int = 0) -> dist.Work:
    """`dist.isend` on the world group; it returns a Work whenever this rank is in it."""
    work = dist.isend(tensor, dst, tag=tag)
    assert work is not None
    return work


def irecv(tensor: torch.Tensor, src: int | None = None, tag: int = 0) -> dist.Work:
    """`dist.irecv` on the world group (any source when ``src`` is None)."""
    work = dist.irecv(tensor, src, tag=tag)
    assert work is not None
    return work


# gloo tags are ints; the sequence number wraps well before it could collide in one run
_TAG_SPACE = 2**30


@dataclass
class PReduceStats:
    """Counters for the overhead breakdown (note section 2.5)."""

    ops: int = 0
    member_wait_s: float = 0.0
    transfer_s: float = 0.0
    create_s: float = 0.0
    link_s: float = 0.0
    bytes_sent: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    group_sizes: dict[int, int] = field(default_factory=dict)


class PReduce(Protocol):
    name: str
    stats: PReduceStats

    def __call__(self, flat: torch.Tensor, group: Group) -> None: ...


class _Base:
    name = "base"

    def __init__(self, rank: int, store: dist.Store, *, timeout_s: float,
                 injector: Injector | None = None) -> None:
        self.rank = rank
        self.store = store
        self.timeout_s = timeout_s
        self.timeout = timedelta(seconds=timeout_s)
        self.injector = injector
        self.stats = PReduceStats()

    def __call__(self, flat: torch.Tensor, group: Group) -> None:
        if self.rank not in group.members:
            raise ValueError(f"rank {self.rank} is not a member of group {group.seq} "
                             f"{list(group.members)}")
        g = len(group.members)
        self.stats.group_sizes[g] = self.stats.group_sizes.get(g, 0) + 1
        if g == 1:
            return
        start = time.perf_counter()
        wait_for_members(self.store, group, self.rank, self.timeout_s)
        arrived = time.perf_counter()
        self._reduce(flat, group)
        self.stats.ops += 1
        self.stats.member_wait_s += arrived - start
        self.stats.transfer_s += time.perf_counter() - arrived

    def _sleep_link(self, nbytes: float) -> None:
        if self.injector is not None:
            self.stats.link_s += self.injector.sleep_link(nbytes)

    def _wait(self, work: dist.Work, group: Group, peer: int | None) -> None:
        try:
            work.wait(timeout=self.timeout)
        except RuntimeError as exc:
            missing = [peer] if peer is not None else [m for m in group.members
                                                       if m != self.rank]
            raise GroupTimeoutError(self.rank, f"P-Reduce data of group {group.seq} "
                                    f"{list(group.members)} ({exc.__class__.__name__})",
                                    missing, self.timeout_s) from exc

    def _reduce(self, flat: torch.Tensor, group: Group) -> None:
        raise NotImplementedError


class P2PLeaderPReduce(_Base):
    """Leader gather, average, scatter on the world group, tag = seq."""

    name = "p2p"

    def _reduce(self, flat: torch.Tensor, group: Group) -> None:
        tag = group.seq % _TAG_SPACE
        leader, nbytes = group.members[0], flat.numel() * flat.element_size()
        if self.rank != leader:
            self._sleep_link(nbytes)
            self._wait(isend(flat, leader, tag=tag), group, leader)
            self._wait(irecv(flat, leader, tag=tag), group, leader)
            self.stats.bytes_sent += nbytes
            return
        others = group.members[1:]
        buffers = [torch.empty_like(flat) for _ in others]
        works = [irecv(b, m, tag=tag) for b, m in zip(buffers, others)]
        for work, m in zip(works, others):
            self._wait(work, group, m)
        # members' order, so every run of the same group sums in the same order
        total = flat.clone()
        for b in buffers:
            total += b
        flat.copy_(total / len(group.members))
        self._sleep_link(nbytes * len(others))
        sends = [isend(flat, m, tag=tag) for m in others]
        for work, m in zip(sends, others):
            self._wait(work, group, m)
        self.stats.bytes_sent += nbytes * len(others)


def _ring_bytes(nbytes: int, g: int) -> int:
    # what a bandwidth-optimal ring all-reduce sends per member (runtime comm.traffic)
    return 2 * (g - 1) * nbytes // g


class CachedGlooPReduce(_Base):
    """A member-only gloo group per member set, created on first use and cached."""

    name = "cached"

    def __init__(self, rank: int, store: dist.Store, *, timeout_s: float,
                 injector: Injector | None = None, namespace: str = "preduce") -> None:
        super().__init__(rank, store, timeout_s=timeout_s, injector=injector)
        self.namespace = namespace
        self._groups: dict[tuple[int, ...], dist.ProcessGroupGloo] = {}

    def _group(self, members: tuple[int, ...]) -> dist.ProcessGroupGloo:
        cached = self._groups.get(members)
        if cached is not None:
            self.stats.cache_hits += 1
            return cached
        self.stats.cache_misses += 1
        start = time.perf_counter()
        # every member derives the same prefix from the sorted members, whatever groups it
        # created before: the property new_group(use_local_synchronization=True) lacks
        prefix = f"{self.namespace}/{'_'.join(map(str, members))}"
        pg = dist.ProcessGroupGloo(
            dist.PrefixStore(prefix, self.store), members.index(self.rank), len(members),
            self.timeout)
        self.stats.create_s += time.perf_counter() - start
        self._groups[members] = pg
        return pg

    def _reduce(self, flat: torch.Tensor, group: Group) -> None:
        pg = self._group(group.members)
        nbytes = _ring_bytes(flat.numel() * flat.element_size(), len(group.members))
        self._sleep_link(nbytes)
        # the stubs leave Backend.allreduce out; ProcessGroupGloo has it
        self._wait(pg.allreduce([flat]), group, None)  # type: ignore[attr-defined]
        flat /= len(group.members)
        self.stats.bytes_sent += nbytes


class PrecreatedPReduce(_Base):
    """Groups of a static schedule created with `new_group` before training starts."""

    name = "precreated"

    def __init__(self, rank: int, store: dist.Store, *, timeout_s: float,
                 groups: list[tuple[int, ...]], injector: Injector | None = None) -> None:
        super().__init__(rank, store, timeout_s=timeout_s, injector=injector)
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        start = time.perf_counter()
        # collective over the world: every rank creates every group, in the same order
        for members in sorted(set(groups)):
            pg = dist.new_group(list(members), timeout=self.timeout)
            if self.rank in members:
                if pg is None or not isinstance(pg, dist.ProcessGroup):
                    raise RuntimeError(f"new_group({list(members)}) returned no group")
                self._groups[members] = pg
        self.stats.create_s = time.perf_counter() - start

    def _reduce(self, flat: torch.Tensor, group: Group) -> None:
        pg = self._groups.get(group.members)
        if pg is None:
            raise ValueError(f"group {list(group.members)} was not created up front; "
                             f"created: {sorted(self._groups)}")
        nbytes = _ring_bytes(flat.numel() * flat.element_size(), len(group.members))
        self._sleep_link(nbytes)
        work = dist.all_reduce(flat, group=pg, async_op=True)
        assert work is not None
        self._wait(work, group, None)
        flat /= len(group.members)
        self.stats.bytes_sent += nbytes


BACKEND_CLASSES = {"p2p": P2PLeaderPReduce, "cached": CachedGlooPReduce,
                   "precreated": PrecreatedPReduce}


def make_backend(name: str, rank: int, store: dist.Store, *, timeout_s: float,
                 injector: Injector | None = None, namespace: str = "preduce",
                 static_groups: list[tuple[int, ...]] | None = None) -> PReduce:
    """The backend called ``name``; ``precreated`` needs ``static_groups`` (and every rank
    must call this at the same point, since it creates the groups collectively)."""
    if name == "p2p":
        return P2PLeaderPReduce(rank, store, timeout_s=timeout_s, injector=injector)
    if name == "cached":
        return CachedGlooPReduce(rank, store, timeout_s=timeout_s, injector=injector,
                                 namespace=namespace)
    if name == "precreated":
        if static_groups is None:
            raise ValueError("the precreated backend needs the static schedule's groups")
        return PrecreatedPReduce(rank, store, timeout_s=timeout_s, groups=static_groups,
                                 injector=injector)
    raise ValueError(f"unknown P-Reduce backend {name!r}; one of {sorted(BACKEND_CLASSES)}")
