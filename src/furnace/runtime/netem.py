"""Network emulation for `Communicator` ops: a sleeping link emulator and a virtual clock.

Switched on by a `NetworkEmulation` config passed to `NetworkEmulator`, which a
`Communicator` consults around every op. Two modes:

``sleep`` (emulated time): the real op runs on gloo, then the rank sleeps until the
    modelled completion time, so an op never finishes sooner than the topology allows.
    Sleeping leaves the CPU free, so compute overlapped with an async op really
    overlaps. Times are read from ``time.monotonic()``, which is one clock for all
    processes of one Linux machine: this mode is for ranks on one host.
``virtual`` (virtual clock): nothing sleeps. Each rank keeps a deterministic clock,
    advanced by modelled compute (`NetworkEmulator.compute`: FLOPs / device peak) and
    by modelled communication. Results do not depend on the machine's load, so tests
    assert timing claims in this mode.

The model (design note `moe_bagualu.md` C.3): each rank's link is a FIFO. An op issued
at ``now`` starts at ``start = max(now, link_free)``. Its duration is, for each link
class it crosses, ``steps * alpha + max(bytes sent, bytes received) / beta``, taking the
slowest class (a ring collective runs at the pace of the slowest link in its group; a
direct exchange uses each peer's own link, in parallel; `furnace.runtime.cost`'s
`traffic_time` and `direct_exchange_time`). A collective ends for every
member at ``max(start) + max(duration)`` over its members, which the emulator learns by
one extra small all-reduce per collective (control traffic: not logged, not modelled).
A point-to-point message ends at the sender's modelled end, which travels to the
receiver in a small control message.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
import torch.distributed as dist

from .cost import direct_exchange_time, traffic_time
from .topology import LinkLevel, Topology

if TYPE_CHECKING:
    from .comm import Communicator, Traffic

__all__ = ["NetworkEmulation", "NetworkEmulator", "VirtualClock"]

Mode = Literal["sleep", "virtual"]


@dataclass(frozen=True, kw_only=True)
class NetworkEmulation:
    """Switches emulation on: which machine to emulate, and how time is kept.

    Args:
        topology: links and device of the emulated machine (see `presets`).
        mode: "sleep" (wall-clock emulation) or "virtual" (deterministic clock).
    """

    topology: Topology
    mode: Mode = "sleep"

    def __post_init__(self) -> None:
        if self.mode not in ("sleep", "virtual"):
            raise ValueError(f"mode must be 'sleep' or 'virtual', got {self.mode!r}")


class VirtualClock:
    """A rank's deterministic clock, in seconds since the emulator started."""

    def __init__(self) -> None:
        self.now = 0.0

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"cannot advance a clock by {seconds} s")
        self.now += seconds
        return self.now

    def advance_to(self, t: float) -> float:
        self.now = max(self.now, t)
        return self.now


@dataclass
class _Pending:
    issued: float
    kind: str
    end: float = 0.0
    control: torch.Tensor | None = None
    work: dist.Work | None = None


class NetworkEmulator:
    """One rank's view of the emulated network; pass it to `Communicator(network=...)`.

    Args:
        config: the `NetworkEmulation` to apply.
        rank: this process's global rank (default: from the process group).

    Attributes:
        compute_s: modelled compute time charged with `compute` (virtual mode).
        comm_wait_s: time this rank spent waiting for ops to complete, modelled.
    """

    def __init__(self, config: NetworkEmulation, *, rank: int | None = None) -> None:
        self.config = config
        self.topology = config.topology
        self.rank = dist.get_rank() if rank is None else rank
        self.clock = VirtualClock() if config.mode == "virtual" else None
        self.link_free = 0.0
        self.compute_s = 0.0
        self.comm_wait_s = 0.0

    @property
    def label(self) -> str:
        """How times from this emulator must be labelled wherever they are shown."""
        return "virtual-clock" if self.clock is not None else "emulated"

    def now(self) -> float:
        return self.clock.now if self.clock is not None else time.monotonic()

    def compute(self, flops: float, dtype: torch.dtype | str = "float32") -> float:
        """Charge ``flops`` of compute at the device's peak; returns the modelled seconds.

        In virtual mode this advances the clock; in sleep mode compute is real and this
        only returns the modelled figure.
        """
        seconds = self.topology.device.compute_time(flops, dtype)
        if self.clock is not None:
            self.clock.advance(seconds)
            self.compute_s += seconds
        return seconds

    def advance(self, seconds: float) -> None:
        """Charge ``seconds`` of modelled local work (virtual mode only)."""
        if self.clock is None:
            raise RuntimeError("advance() is for the virtual clock; in sleep mode time is real")
        self.clock.advance(seconds)
        self.compute_s += seconds

    def duration(self, tr: Traffic, global_ranks: tuple[int, ...]) -> float:
        """Modelled seconds for one op's traffic on this rank, ignoring queueing."""
        topo = self.topology
        if tr.steps == 0:
            return 0.0
        me = global_ranks.index(self.rank) if self.rank in global_ranks else None
        if tr.pattern == "ring":
            level = topo.slowest_level(global_ranks)
            if level is None:
                return 0.0
            return traffic_time(tr, topo.link_for(level))
        per_level: dict[LinkLevel, list[int]] = {}
        for peer, sent, received in tr.peers:
            if me is not None and peer == me:
                continue
            level = topo.level(self.rank, global_ranks[peer])
            acc = per_level.setdefault(level, [0, 0])
            acc[0] += sent
            acc[1] += received
        levels = [(topo.link_for(lvl), s, r) for lvl, (s, r) in per_level.items()]
        return direct_exchange_time(levels, tr.steps)

    def begin(self, tr: Traffic, comm: Communicator, *, kind: str,
              peer: int | None = None) -> _Pending:
        """Called right after the real op is issued; issues the control message."""
        now = self.now()
        pending = _Pending(issued=now, kind=kind)
        if kind == "recv":
            pending.control = torch.zeros(1, dtype=torch.float64, device=comm.device)
            pending.work = dist.irecv(pending.control, _peer_rank(comm, peer, kind),
                                      group=comm.group)
            return pending
        start = max(now, self.link_free)
        duration = self.duration(tr, comm.global_ranks)
        if kind == "send":
            pending.end = start + duration
            self.link_free = pending.end
            pending.control = torch.tensor([pending.end], dtype=torch.float64, device=comm.device)
            pending.work = dist.isend(pending.control, _peer_rank(comm, peer, kind),
                                      group=comm.group)
            return pending
        # provisional until the members' starts and durations are known
        self.link_free = start + duration
        if comm.world_size == 1:
            pending.end = start + duration
            return pending
        pending.control = torch.tensor([start, duration], dtype=torch.float64,
                                       device=comm.device)
        pending.work = dist.all_reduce(pending.control, op=dist.ReduceOp.MAX, group=comm.group,
                                       async_op=True)
        return pending

    def finish(self, pending: _Pending) -> float:
        """Called after the real op completed; waits until the modelled end.

        Returns the modelled time from issue to completion, in seconds.
        """
        if pending.work is not None:
            pending.work.wait()
        if pending.kind == "recv":
            assert pending.control is not None  # a recv always waits for its control message
            end = max(float(pending.control[0]), pending.issued)
        elif pending.kind == "send":
            end = pending.end
        elif pending.control is not None:
            end = float(pending.control[0] + pending.control[1])
            self.link_free = max(self.link_free, end)
        else:
            end = pending.end
        before = self.now()
        if self.clock is not None:
            self.clock.advance_to(end)
        else:
            remaining = end - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)
        self.comm_wait_s += max(0.0, end - before)
        return end - pending.issued


def _peer_rank(comm: Communicator, peer: int | None, kind: str) -> int:
    """The global rank of a point-to-point op's group-local ``peer``."""
    if peer is None:
        raise ValueError(f"{kind} needs a peer")
    return comm.global_rank(peer)
