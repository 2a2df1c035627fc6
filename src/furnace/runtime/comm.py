"""Instrumented collectives: thin wrappers over `torch.distributed` that log every call.

A `Communicator` binds a process group (passed in, never a module global), a `CommLog`
and optionally a `NetworkEmulator` (`netem.py`). Each op records the bytes this rank
sends and receives, its message count and its wall time; with an emulator it also
completes no earlier than the modelled time and records that time. An optional
``on_traffic`` observer sees each logged op's full `Traffic`, per-peer split included,
which the `CommLog` record sums away (e.g. to tally bytes per link level).

The byte model of every op is written once, in `traffic`, and states the algorithm it
assumes (ring for all-reduce, all-gather and reduce-scatter; a pipelined chain for
broadcast and reduce, as NCCL does; direct exchange for all-to-all and point-to-point).
These are models of the volume a bandwidth-optimal algorithm moves, which is what cost
models need; a backend may move bytes differently inside.

`all_to_all_single_autograd` and `all_reduce_autograd` are the differentiable duals:
the backward of an uneven all-to-all is the all-to-all with the splits swapped, and the
backward of a sum all-reduce is a sum all-reduce of the gradients.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast, overload

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from rich.table import Table

    from .netem import NetworkEmulator

__all__ = [
    "OPS",
    "CommHandle",
    "CommLog",
    "CommRecord",
    "Communicator",
    "Traffic",
    "TrafficObserver",
    "all_reduce_autograd",
    "all_to_all_single_autograd",
    "traffic",
]

OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all_single",
    "send",
    "recv",
    "barrier",
)

# torch 2.13 renamed the flat-tensor collectives; older releases only have the old names.
# The flat forms avoid per-rank tensor lists (gloo's list reduce-scatter is ~4x slower).
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}


@dataclass(frozen=True)
class Traffic:
    """What one op costs one rank under the stated algorithm.

    Attributes:
        bytes_sent / bytes_received: payload bytes leaving / entering this rank.
        messages: messages this rank sends.
        steps: sequential latency terms on this rank's critical path (alpha count).
        pattern: "ring" (paced by the slowest link of the group) or "direct" (each
            peer over its own link, all in parallel).
        peers: for "direct", (peer, bytes sent to it, bytes received from it) with
            group-local peer indices.
    """

    bytes_sent: int
    bytes_received: int
    messages: int
    steps: int
    pattern: str = "direct"
    peers: tuple[tuple[int, int, int], ...] = ()


def traffic(
    op: str,
    *,
    rank: int,
    world_size: int,
    nbytes: int = 0,
    send_bytes: Sequence[int] | None = None,
    recv_bytes: Sequence[int] | None = None,
    root: int = 0,
    peer: int | None = None,
) -> Traffic:
    """The byte model of every op, for one rank of a group of ``world_size``.

    Args:
        op: one of `OPS`.
        rank, world_size: this rank's index in the group and the group size.
        nbytes: all_reduce, broadcast, reduce: the buffer size N. all_gather: this
            rank's input n (output p*n). reduce_scatter: this rank's output n (input
            p*n). send/recv: the message size.
        send_bytes, recv_bytes: all_to_all_single: bytes to / from each group rank.
        root: broadcast source / reduce destination (group-local).
        peer: send destination / recv source (group-local).

    The models, with p = world_size:
        all_reduce (ring reduce-scatter + all-gather): sends and receives 2(p-1)/p * N
            in 2(p-1) steps.
        all_gather, reduce_scatter (ring): sends and receives (p-1) * n in p-1 steps.
        broadcast (pipelined chain root -> root+1 -> ... -> root-1): every rank but
            the root receives N and every rank but the last forwards it, in p-1 latency
            steps; reduce runs the chain the other way, ending at the root.
        all_to_all_single: each rank sends send_bytes[j] to every j != rank, receives
            recv_bytes[j], one message per non-empty destination, all in one step.
        send/recv: N bytes, one message. barrier: no payload, one step.
    """
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; known: {OPS}")
    p = world_size
    if p == 1 and op not in ("send", "recv"):
        return Traffic(0, 0, 0, 0)
    nxt, prv = (rank + 1) % p, (rank - 1) % p
    if op == "all_reduce":
        moved = 2 * (p - 1) * nbytes // p
        return Traffic(moved, moved, 2 * (p - 1), 2 * (p - 1), "ring",
                       ((nxt, moved, 0), (prv, 0, moved)))
    if op in ("all_gather", "reduce_scatter"):
        moved = (p - 1) * nbytes
        return Traffic(moved, moved, p - 1, p - 1, "ring", ((nxt, moved, 0), (prv, 0, moved)))
    if op in ("broadcast", "reduce"):
        # position along the chain; broadcast starts at the root, reduce ends there
        pos = (rank - root) % p if op == "broadcast" else (rank - root - 1) % p
        first, last = pos == 0, pos == p - 1
        sent = 0 if last else nbytes
        received = 0 if first else nbytes
        return Traffic(sent, received, 0 if last else 1, p - 1, "ring",
                       ((nxt, sent, 0), (prv, 0, received)))
    if op == "all_to_all_single":
        if send_bytes is None or recv_bytes is None:
            raise ValueError("all_to_all_single needs send_bytes and recv_bytes per rank")
        if len(send_bytes) != p or len(recv_bytes) != p:
            raise ValueError(f"all_to_all_single needs {p} send and receive sizes")
        peers = tuple((j, int(send_bytes[j]), int(recv_bytes[j]))
                      for j in range(p) if j != rank and (send_bytes[j] or recv_bytes[j]))
        sent = sum(s for _, s, _ in peers)
        received = sum(r for _, _, r in peers)
        messages = sum(1 for _, s, _ in peers if s)
        return Traffic(sent, received, messages, 1, "direct", peers)
    if op in ("send", "recv"):
        if peer is None:
            raise ValueError(f"{op} needs a peer")
        if op == "send":
            return Traffic(nbytes, 0, 1, 1, "direct", ((peer, nbytes, 0),))
        return Traffic(0, nbytes, 0, 1, "direct", ((peer, 0, nbytes),))
    # barrier: latency only, paced by the slowest link of the group
    return Traffic(0, 0, p - 1, 1, "ring", ((nxt, 0, 0), (prv, 0, 0)))


@dataclass
class CommRecord:
    """One call of one op on one rank."""

    op: str
    group: str
    rank: int
    world_size: int
    bytes_sent: int
    bytes_received: int
    messages: int
    wall_s: float
    modelled_s: float | None = None
    clock: str = "measured"
    dtype: str = ""
    numel: int = 0


@dataclass
class OpSummary:
    calls: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    messages: int = 0
    wall_s: float = 0.0
    modelled_s: float | None = None


@dataclass
class CommLog:
    """Every op a rank issued, in order; merge the logs of all ranks with `gather`."""

    records: list[CommRecord] = field(default_factory=list)

    def add(self, record: CommRecord) -> None:
        self.records.append(record)

    def clear(self) -> None:
        self.records.clear()

    def __len__(self) -> int:
        return len(self.records)

    def select(self, op: str | None = None, rank: int | None = None) -> list[CommRecord]:
        return [r for r in self.records
                if (op is None or r.op == op) and (rank is None or r.rank == rank)]

    def count(self, op: str | None = None, rank: int | None = None) -> int:
        return len(self.select(op, rank))

    def bytes_sent(self, op: str | None = None, rank: int | None = None) -> int:
        return sum(r.bytes_sent for r in self.select(op, rank))

    def bytes_received(self, op: str | None = None, rank: int | None = None) -> int:
        return sum(r.bytes_received for r in self.select(op, rank))

    def messages(self, op: str | None = None, rank: int | None = None) -> int:
        return sum(r.messages for r in self.select(op, rank))

    def summary(self) -> dict[tuple[int, str], OpSummary]:
        """Totals per (rank, op): ranks in order, each rank's ops in first-seen order."""
        out: dict[tuple[int, str], OpSummary] = {}
        for r in self.records:
            s = out.setdefault((r.rank, r.op), OpSummary())
            s.calls += 1
            s.bytes_sent += r.bytes_sent
            s.bytes_received += r.bytes_received
            s.messages += r.messages
            s.wall_s += r.wall_s
            if r.modelled_s is not None:
                s.modelled_s = (s.modelled_s or 0.0) + r.modelled_s
        return dict(sorted(out.items(), key=lambda item: item[0][0]))

    @classmethod
    def merge(cls, logs: Iterable[CommLog]) -> CommLog:
        merged = cls()
        for log in logs:
            merged.records.extend(log.records)
        return merged

    def gather(self, group: dist.ProcessGroup | None = None) -> CommLog:
        """Every rank's records, merged, on every rank of ``group`` (not itself logged)."""
        gathered: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, [asdict(r) for r in self.records], group=group)
        return CommLog([CommRecord(**d) for part in gathered for d in part])

    def to_json(self) -> str:
        return json.dumps([asdict(r) for r in self.records])

    @classmethod
    def from_json(cls, text: str) -> CommLog:
        return cls([CommRecord(**d) for d in json.loads(text)])

    def table(self, title: str = "communication per rank") -> Table:
        from rich import box
        from rich.table import Table

        modelled = any(r.modelled_s is not None for r in self.records)
        if modelled:
            clocks = sorted({r.clock for r in self.records if r.modelled_s is not None})
            title = f"{title} (modelled: {'/'.join(clocks)})"
        table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
        for col in ("rank", "op", "calls", "sent", "recv", "msgs", "wall ms"):
            table.add_column(col, justify="left" if col == "op" else "right")
        if modelled:
            table.add_column("model ms", justify="right")
        for (rank, op), s in self.summary().items():
            row = [str(rank), op, str(s.calls), format_bytes(s.bytes_sent),
                   format_bytes(s.bytes_received), str(s.messages), f"{s.wall_s * 1e3:.2f}"]
            if modelled:
                row.append("" if s.modelled_s is None else f"{s.modelled_s * 1e3:.3g}")
            table.add_row(*row)
        return table

    def print(self, title: str = "communication per rank") -> None:
        from rich.console import Console

        Console().print(self.table(title))


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


ResultT = TypeVar("ResultT")


class CommHandle(Generic[ResultT]):
    """An op in flight; `wait` returns its result and finishes the log record."""

    def __init__(self, finish: Callable[[], ResultT]) -> None:
        self._finish = finish
        self._done = False
        self._result: ResultT | None = None

    def wait(self) -> ResultT:
        if not self._done:
            self._result = self._finish()
            self._done = True
        # after the first wait _result holds finish()'s value, None included
        return self._result  # type: ignore[return-value]


TrafficObserver = Callable[[str, Traffic, "Communicator"], None]
"""``on_traffic(op, traffic, comm)``: an op's name, its `Traffic` on this rank (``peers``
group-local: ``comm.global_ranks[peer]`` is the global rank) and the communicator."""


class Communicator:
    """Collectives over one process group, logged and optionally network-emulated.

    Args:
        group: the process group (None means the default group).
        log: where records go; a fresh `CommLog` if omitted.
        network: a `NetworkEmulator` that paces every op to its modelled time.
        name: the group's name in logs ("world", "ep", "dp", ...).
        on_traffic: called once per op, when the op completes and its record is added
            to ``log`` (so exactly for the ops the log holds, in the same order).

    Ranks passed to ops (``src``, ``dst``, ``root``) are indices within the group.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        *,
        log: CommLog | None = None,
        network: NetworkEmulator | None = None,
        name: str = "world",
        on_traffic: TrafficObserver | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("Communicator needs an initialized process group "
                               "(run_distributed or init_from_env)")
        self.group = group
        self.log = log if log is not None else CommLog()
        self.network = network
        self.name = name
        self.on_traffic = on_traffic
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.global_ranks = tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
        # where small helper tensors (emulator control messages) must live for this backend
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if dist.get_backend(group) == "nccl" else torch.device("cpu"))

    def global_rank(self, group_rank: int) -> int:
        if not 0 <= group_rank < self.world_size:
            raise ValueError(f"rank {group_rank} is outside group {self.name!r} "
                             f"of size {self.world_size}")
        return self.global_ranks[group_rank]

    def _issue(self, op: str, tensor: torch.Tensor | None, tr: Traffic, work: dist.Work | None,
               result: ResultT, *, kind: str = "collective",
               peer: int | None = None) -> CommHandle[ResultT]:
        """The handle of an op just started; its wait finishes ``work`` and logs the op."""
        t0 = time.perf_counter()
        network = self.network
        pending = None
        if network is not None:
            pending = network.begin(tr, self, kind=kind, peer=peer)

        def finish() -> ResultT:
            if work is not None:
                work.wait()
            modelled = (network.finish(pending)
                        if network is not None and pending is not None else None)
            self.log.add(CommRecord(
                op=op, group=self.name, rank=self.rank, world_size=self.world_size,
                bytes_sent=tr.bytes_sent, bytes_received=tr.bytes_received,
                messages=tr.messages, wall_s=time.perf_counter() - t0, modelled_s=modelled,
                clock=self.network.label if self.network is not None else "measured",
                dtype=str(tensor.dtype).removeprefix("torch.") if tensor is not None else "",
                numel=tensor.numel() if tensor is not None else 0,
            ))
            if self.on_traffic is not None:
                self.on_traffic(op, tr, self)
            return result

        return CommHandle(finish)

    @staticmethod
    def _result(handle: CommHandle[torch.Tensor],
                async_op: bool) -> torch.Tensor | CommHandle[torch.Tensor]:
        return handle if async_op else handle.wait()

    def _traffic(self, op: str, **kw: Any) -> Traffic:
        return traffic(op, rank=self.rank, world_size=self.world_size, **kw)

    # each collective returns its tensor, or with async_op=True a handle whose wait does
    @overload
    def all_reduce(self, tensor: torch.Tensor, op: str = ..., *,
                   async_op: Literal[False] = ...) -> torch.Tensor: ...
    @overload
    def all_reduce(self, tensor: torch.Tensor, op: str = ..., *,
                   async_op: Literal[True]) -> CommHandle[torch.Tensor]: ...
    @overload
    def all_reduce(self, tensor: torch.Tensor, op: str = ..., *,
                   async_op: bool) -> torch.Tensor | CommHandle[torch.Tensor]: ...

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", *,
                   async_op: bool = False) -> torch.Tensor | CommHandle[torch.Tensor]:
        """In-place all-reduce; returns ``tensor`` (or a handle whose wait returns it)."""
        work = dist.all_reduce(tensor, op=_reduce_op(op), group=self.group, async_op=True)
        tr = self._traffic("all_reduce", nbytes=_nbytes(tensor))
        return self._result(self._issue("all_reduce", tensor, tr, work, tensor), async_op)

    @overload
    def all_gather(self, tensor: torch.Tensor, *,
                   async_op: Literal[False] = ...) -> torch.Tensor: ...
    @overload
    def all_gather(self, tensor: torch.Tensor, *,
                   async_op: Literal[True]) -> CommHandle[torch.Tensor]: ...
    @overload
    def all_gather(self, tensor: torch.Tensor, *,
                   async_op: bool) -> torch.Tensor | CommHandle[torch.Tensor]: ...

    def all_gather(self, tensor: torch.Tensor, *,
                   async_op: bool = False) -> torch.Tensor | CommHandle[torch.Tensor]:
        """Concatenation of every rank's ``tensor`` along dim 0 (equal shapes)."""
        _need_dim0("all_gather", tensor)
        out = tensor.new_empty((self.world_size * tensor.shape[0], *tensor.shape[1:]))
        work = _all_gather_flat(out, tensor.contiguous(), group=self.group, async_op=True)
        tr = self._traffic("all_gather", nbytes=_nbytes(tensor))
        return self._result(self._issue("all_gather", tensor, tr, work, out), async_op)

    @overload
    def reduce_scatter(self, tensor: torch.Tensor, op: str = ..., *,
                       async_op: Literal[False] = ...) -> torch.Tensor: ...
    @overload
    def reduce_scatter(self, tensor: torch.Tensor, op: str = ..., *,
                       async_op: Literal[True]) -> CommHandle[torch.Tensor]: ...
    @overload
    def reduce_scatter(self, tensor: torch.Tensor, op: str = ..., *,
                       async_op: bool) -> torch.Tensor | CommHandle[torch.Tensor]: ...

    def reduce_scatter(self, tensor: torch.Tensor, op: str = "sum", *,
                       async_op: bool = False) -> torch.Tensor | CommHandle[torch.Tensor]:
        """This rank's dim-0 chunk of the elementwise reduction of every rank's ``tensor``."""
        _need_dim0("reduce_scatter", tensor)
        if tensor.shape[0] % self.world_size:
            raise ValueError(f"reduce_scatter: dim 0 ({tensor.shape[0]}) is not divisible "
                             f"by the group size {self.world_size}")
        out = tensor.new_empty((tensor.shape[0] // self.world_size, *tensor.shape[1:]))
        work = _reduce_scatter_flat(out, tensor.contiguous(), op=_reduce_op(op),
                                    group=self.group, async_op=True)
        tr = self._traffic("reduce_scatter", nbytes=_nbytes(out))
        return self._result(self._issue("reduce_scatter", tensor, tr, work, out), async_op)

    @overload
    def broadcast(self, tensor: torch.Tensor, src: int = ..., *,
                  async_op: Literal[False] = ...) -> torch.Tensor: ...
    @overload
    def broadcast(self, tensor: torch.Tensor, src: int = ..., *,
                  async_op: Literal[True]) -> CommHandle[torch.Tensor]: ...
    @overload
    def broadcast(self, tensor: torch.Tensor, src: int = ..., *,
                  async_op: bool) -> torch.Tensor | CommHandle[torch.Tensor]: ...

    def broadcast(self, tensor: torch.Tensor, src: int = 0, *,
                  async_op: bool = False) -> torch.Tensor | CommHandle[torch.Tensor]:
        """In-place broadcast from group rank ``src``; returns ``tensor``."""
        work = dist.broadcast(tensor, self.global_rank(src), group=self.group, async_op=True)
        tr = self._traffic("broadcast", nbytes=_nbytes(tensor), root=src)
        return self._result(self._issue("broadcast", tensor, tr, work, tensor), async_op)

    @overload
    def reduce(self, tensor: torch.Tensor, dst: int = ..., op: str = ..., *,
               async_op: Literal[False] = ...) -> torch.Tensor: ...
    @overload
    def reduce(self, tensor: torch.Tensor, dst: int = ..., op: str = ..., *,
               async_op: Literal[True]) -> CommHandle[torch.Tensor]: ...
    @overload
    def reduce(self, tensor: torch.Tensor, dst: int = ..., op: str = ..., *,
               async_op: bool) -> torch.Tensor | CommHandle[torch.Tensor]: ...

    def reduce(self, tensor: torch.Tensor, dst: int = 0, op: str = "sum", *,
               async_op: bool = False) -> torch.Tensor | CommHandle[torch.Tensor]:
        """In-place reduce to group rank ``dst`` (other ranks' tensors are scratch)."""
        work = dist.reduce(tensor, self.global_rank(dst), op=_reduce_op(op), group=self.group,
                           async_op=True)
        tr = self._traffic("reduce", nbytes=_nbytes(tensor), root=dst)
        return self._result(self._issue("reduce", tensor, tr, work, tensor), async_op)

    @overload
    def all_to_all_single(self, tensor: torch.Tensor,
                          output_split_sizes: Sequence[int] | None = ...,
                          input_split_sizes: Sequence[int] | None = ..., *,
                          async_op: Literal[False] = ...) -> torch.Tensor: ...
    @overload
    def all_to_all_single(self, tensor: torch.Tensor,
                          output_split_sizes: Sequence[int] | None = ...,
                          input_split_sizes: Sequence[int] | None = ..., *,
                          async_op: Literal[True]) -> CommHandle[torch.Tensor]: ...
    @overload
    def all_to_all_single(self, tensor: torch.Tensor,
                          output_split_sizes: Sequence[int] | None = ...,
                          input_split_sizes: Sequence[int] | None = ..., *,
                          async_op: bool) -> torch.Tensor | CommHandle[torch.Tensor]: ...

    def all_to_all_single(
        self,
        tensor: torch.Tensor,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
        *,
        async_op: bool = False,
    ) -> torch.Tensor | CommHandle[torch.Tensor]:
        """Uneven all-to-all along dim 0; splits count rows (None means equal splits).

        Every rank must call it, including ranks that send or receive nothing, and the
        splits must agree across ranks (exchange counts first when they are data-dependent).
        """
        _need_dim0("all_to_all_single", tensor)
        p = self.world_size
        rows_in = _splits(input_split_sizes, tensor.shape[0], p, "input")
        if output_split_sizes is None:
            rows_out = rows_in if input_split_sizes is None else None
            if rows_out is None:
                raise ValueError("all_to_all_single: give output_split_sizes with uneven input")
        else:
            rows_out = [int(s) for s in output_split_sizes]
            if len(rows_out) != p or min(rows_out, default=0) < 0:
                raise ValueError(f"all_to_all_single: need {p} non-negative output splits")
        row_bytes = tensor.element_size() * math.prod(tensor.shape[1:])
        out = tensor.new_empty((sum(rows_out), *tensor.shape[1:]))
        work = dist.all_to_all_single(out, tensor.contiguous(), rows_out, rows_in,
                                      group=self.group, async_op=True)
        tr = self._traffic("all_to_all_single",
                           send_bytes=[r * row_bytes for r in rows_in],
                           recv_bytes=[r * row_bytes for r in rows_out])
        return self._result(self._issue("all_to_all_single", tensor, tr, work, out), async_op)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.isend(tensor, dst).wait()

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        return self.irecv(tensor, src).wait()

    def isend(self, tensor: torch.Tensor, dst: int) -> CommHandle[None]:
        work = dist.isend(tensor.contiguous(), self.global_rank(dst), group=self.group)
        tr = self._traffic("send", nbytes=_nbytes(tensor), peer=dst)
        return self._issue("send", tensor, tr, work, None, kind="send", peer=dst)

    def irecv(self, tensor: torch.Tensor, src: int) -> CommHandle[torch.Tensor]:
        """Receive into ``tensor`` from group rank ``src``; the handle's wait returns it."""
        work = dist.irecv(tensor, self.global_rank(src), group=self.group)
        tr = self._traffic("recv", nbytes=_nbytes(tensor), peer=src)
        return self._issue("recv", tensor, tr, work, tensor, kind="recv", peer=src)

    def barrier(self) -> None:
        work = dist.barrier(group=self.group, async_op=True)
        self._issue("barrier", None, self._traffic("barrier"), work, None).wait()


def _reduce_op(op: str) -> dist.ReduceOp.RedOpType:
    try:
        return _REDUCE_OPS[op]
    except KeyError:
        raise ValueError(f"unknown reduce op {op!r}; known: {sorted(_REDUCE_OPS)}") from None


def _need_dim0(op: str, tensor: torch.Tensor) -> None:
    if tensor.dim() == 0:
        raise ValueError(f"{op} works along dim 0; got a 0-d tensor (reshape it to (1,))")


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _splits(sizes: Sequence[int] | None, rows: int, p: int, what: str) -> list[int]:
    if sizes is None:
        if rows % p:
            raise ValueError(f"all_to_all_single: {rows} rows do not split evenly over {p} ranks")
        return [rows // p] * p
    sizes = [int(s) for s in sizes]
    if len(sizes) != p or min(sizes, default=0) < 0:
        raise ValueError(f"all_to_all_single: need {p} non-negative {what} splits, got {sizes}")
    if sum(sizes) != rows:
        raise ValueError(f"all_to_all_single: {what} splits sum to {sum(sizes)}, "
                         f"but the tensor has {rows} rows")
    return sizes


class _AllToAllSingle(torch.autograd.Function):
    # ctx is torch's FunctionCtx, which carries the attributes set on it untyped
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Communicator,
                output_split_sizes: Sequence[int],
                input_split_sizes: Sequence[int]) -> torch.Tensor:
        ctx.comm = comm
        ctx.splits = (list(output_split_sizes), list(input_split_sizes))
        return comm.all_to_all_single(x, output_split_sizes, input_split_sizes)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out_splits, in_splits = ctx.splits
        comm: Communicator = ctx.comm
        grad_in = comm.all_to_all_single(grad_out.contiguous(), in_splits, out_splits)
        return grad_in, None, None, None


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: Communicator) -> torch.Tensor:
        ctx.comm = comm
        return comm.all_reduce(x.clone())

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, None]:
        comm: Communicator = ctx.comm
        return comm.all_reduce(grad_out.clone()), None


def all_to_all_single_autograd(
    x: torch.Tensor,
    comm: Communicator,
    output_split_sizes: Sequence[int],
    input_split_sizes: Sequence[int],
) -> torch.Tensor:
    """Differentiable uneven all-to-all along dim 0 (row splits, as `Communicator`)."""
    # torch.autograd.Function.apply is untyped
    out = _AllToAllSingle.apply(x, comm, output_split_sizes,  # type: ignore[no-untyped-call]
                                input_split_sizes)
    return cast(torch.Tensor, out)


def all_reduce_autograd(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Differentiable sum all-reduce: y = sum over ranks of x; dx = sum over ranks of dy."""
    return cast(torch.Tensor, _AllReduceSum.apply(x, comm))  # type: ignore[no-untyped-call]
