"""Rows of the pencil split over MPI ranks: partition, halo-exchange SpMV, inner products.

Implements the row-distributed layout of pEVSL's parallel ChebLanNr as NormalModes runs it
(Shi, Li, Xi, Saad, de Hoop, SC'18, sections IV.B and IV.D; pEVSL `SRC/parcsrmv.c`; Li, Xi,
Erlandson, Saad, EVSL, SIAM J. Sci. Comput. 2019, section 4). Each rank of a communicator owns
a block of rows of the Jacobi-scaled pencil, stored as pEVSL's ParCSR does: a "diag" part
(the columns it owns) and an "offd" part (ghost columns owned by neighbours). A matvec posts
the ghost exchange, multiplies the diag part while the messages travel, then adds the offd
part. An inner product is a local product plus one MPI_Allreduce.

Partition. pEVSL and NormalModes partition the mesh with ParMETIS. Here the rows are ordered
by reverse Cuthill-McKee on the pattern of |A| + |M| (a bandwidth-reducing ordering, so a block
of consecutive rows touches few other blocks) and cut into contiguous blocks of about equal
nnz. The partition is computed from the whole pattern, identically on every rank.

Halo plan. Every rank holds the whole pencil (each reads the Matrix Market files), so each
derives which of its rows every neighbour needs from the global pattern (rank q needs my row
i exactly when a row of q has a stored entry in column i), with no messages; pEVSL exchanges
the ghost lists instead, with the same result. The plan is a pure function of (matrix,
partition, rank), so the plans of all ranks can be built and checked in one process.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import reverse_cuthill_mckee

from furnace.eigen.operators import Counters

# one tag for all ghost exchanges: matvecs run in the same order on every rank and each
# completes before the next starts, and MPI keeps messages between two ranks in order
_HALO_TAG = 7301


def _as_csr(matrix, name: str) -> sp.csr_matrix:
    if sp.issparse(matrix) or isinstance(matrix, np.ndarray):
        return sp.csr_matrix(matrix)
    raise ValueError(
        f"splitting rows over ranks needs {name} as a sparse matrix or an array, "
        f"got {type(matrix).__name__}"
    )


@dataclass(frozen=True)
class RowPartition:
    """Contiguous blocks of a row ordering: part p owns rows order[offsets[p]:offsets[p + 1]].

    Distributed vectors are numbered by position in `order`: local row i of part p is the
    original row order[offsets[p] + i].

    Attributes:
        order: (n,) the original row index at each position (reverse Cuthill-McKee).
        offsets: (num_parts + 1,) first position of each part; offsets[-1] = n.
    """

    order: np.ndarray
    offsets: np.ndarray

    @property
    def n(self) -> int:
        return int(self.order.size)

    @property
    def num_parts(self) -> int:
        return int(self.offsets.size - 1)

    @functools.cached_property
    def positions(self) -> np.ndarray:
        """(n,) the position of each original row (the inverse of `order`)."""
        positions = np.empty_like(self.order)
        positions[self.order] = np.arange(self.order.size)
        return positions

    def rows(self, part: int) -> np.ndarray:
        """Original indices of the rows `part` owns, in local order."""
        return self.order[self.offsets[part] : self.offsets[part + 1]]

    def owners(self, positions: np.ndarray) -> np.ndarray:
        """The part owning each position."""
        return np.searchsorted(self.offsets, positions, side="right") - 1


def partition_rows(A, M, num_parts: int) -> RowPartition:
    """Reverse Cuthill-McKee order of |A| + |M|, cut into blocks of about equal nnz.

    Each cut is the position nearest to k/num_parts of the total nnz, moved if needed so that
    every part gets at least one row. Deterministic: every rank computes the same partition.

    Args:
        A, M: the pencil (M may be None), sparse matrices or arrays.
        num_parts: number of blocks (ranks of the group).
    Raises:
        ValueError: num_parts < 1 or > n, or A or M given as a LinearOperator.
    """
    pattern = _as_csr(A, "A")
    n = pattern.shape[0]
    if not 1 <= num_parts <= n:
        raise ValueError(f"cannot split {n} rows into {num_parts} parts")
    pattern = abs(pattern)
    if M is not None:
        pattern = pattern + abs(_as_csr(M, "M"))
    # RCM wants a symmetric pattern; ones keep entries that would cancel in A + M
    pattern.data = np.ones_like(pattern.data)
    pattern = (pattern + pattern.T).tocsr()
    order = reverse_cuthill_mckee(pattern, symmetric_mode=True).astype(np.int64)
    row_nnz = np.diff(pattern.indptr)[order]
    cumulative = np.concatenate([[0], np.cumsum(row_nnz)])
    targets = cumulative[-1] * np.arange(1, num_parts) / num_parts
    above = np.searchsorted(cumulative, targets)
    below = above - 1
    nearer_below = targets - cumulative[below] < cumulative[above] - targets
    cuts = np.where(nearer_below, below, above)
    offsets = np.empty(num_parts + 1, dtype=np.int64)
    offsets[0], offsets[-1] = 0, n
    for k in range(1, num_parts):
        offsets[k] = min(max(cuts[k - 1], offsets[k - 1] + 1), n - (num_parts - k))
    return RowPartition(order, offsets)


@dataclass(frozen=True)
class HaloPlan:
    """One rank's ghost exchange for one matrix, built once and reused by every matvec.

    Attributes:
        rank: the rank the plan belongs to.
        num_owned: rows it owns.
        ghosts: (g,) positions of the columns it reads but does not own, ascending, hence
            grouped by owner; local column num_owned + j is ghosts[j].
        recv_ranks: neighbours it receives from; ghosts[recv_offsets[i]:recv_offsets[i + 1]]
            come from recv_ranks[i].
        recv_offsets: (len(recv_ranks) + 1,).
        send_ranks: neighbours it sends to.
        send_offsets: (len(send_ranks) + 1,).
        send_rows: local rows to send, send_rows[send_offsets[i]:send_offsets[i + 1]] (ascending)
            to send_ranks[i]; that is the same list as the receiver's ghosts from this rank.
    """

    rank: int
    num_owned: int
    ghosts: np.ndarray
    recv_ranks: np.ndarray
    recv_offsets: np.ndarray
    send_ranks: np.ndarray
    send_offsets: np.ndarray
    send_rows: np.ndarray

    @property
    def num_ghosts(self) -> int:
        return int(self.ghosts.size)

    def sends(self) -> list[tuple[int, int, int]]:
        """(neighbour, start, stop) into send_rows for each message sent."""
        return _segments(self.send_ranks, self.send_offsets)

    def receives(self) -> list[tuple[int, int, int]]:
        """(neighbour, start, stop) into ghosts for each message received."""
        return _segments(self.recv_ranks, self.recv_offsets)


def _segments(ranks: np.ndarray, offsets: np.ndarray) -> list[tuple[int, int, int]]:
    return [(int(r), int(lo), int(hi)) for r, lo, hi in zip(ranks, offsets[:-1], offsets[1:])]


def _grouped(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values of a sorted key array and the offsets of their runs."""
    distinct, first = np.unique(keys, return_index=True)
    return distinct, np.append(first, keys.size).astype(np.int64)


def owned_rows(
    matrix, partition: RowPartition, rank: int, scaling: np.ndarray | None = None
) -> tuple[sp.csr_matrix, HaloPlan]:
    """The rows `rank` owns of diag(scaling) matrix diag(scaling), and their halo plan.

    Returns:
        (local, plan): local is (num_owned, num_owned + num_ghosts) CSR with columns
        renumbered [owned | ghosts]; local @ concat(x_owned, x[ghosts]) is this rank's part
        of the product.
    """
    csr = _as_csr(matrix, "the matrix")
    start, stop = int(partition.offsets[rank]), int(partition.offsets[rank + 1])
    rows = partition.rows(rank)
    num_owned = rows.size
    block = csr[rows]
    data = block.data
    if scaling is not None:
        row_scaling = np.repeat(scaling[rows], np.diff(block.indptr))
        data = data * row_scaling * scaling[block.indices]
    column_positions = partition.positions[block.indices]
    owned = (column_positions >= start) & (column_positions < stop)
    ghosts = np.unique(column_positions[~owned])
    local_columns = np.where(
        owned, column_positions - start, num_owned + np.searchsorted(ghosts, column_positions)
    )
    local = sp.csr_matrix(
        (data, local_columns, block.indptr.copy()), shape=(num_owned, num_owned + ghosts.size)
    )
    local.sort_indices()
    recv_ranks, recv_offsets = _grouped(partition.owners(ghosts))
    # row r of rank q has an entry in column rows[i] exactly when the transpose has (rows[i], r)
    referrers = csr.T.tocsr()[rows]
    referrer_ranks = partition.owners(partition.positions[referrers.indices])
    local_row = np.repeat(np.arange(num_owned), np.diff(referrers.indptr))
    elsewhere = referrer_ranks != rank
    keys = np.unique(referrer_ranks[elsewhere] * num_owned + local_row[elsewhere])
    send_ranks, send_offsets = _grouped(keys // num_owned)
    plan = HaloPlan(
        rank=rank,
        num_owned=num_owned,
        ghosts=ghosts,
        recv_ranks=recv_ranks,
        recv_offsets=recv_offsets,
        send_ranks=send_ranks,
        send_offsets=send_offsets,
        send_rows=keys % num_owned,
    )
    return local, plan


class DistributedCSR:
    """One rank's rows of a sparse matrix; `@` maps local vectors to local vectors.

    Accepts (num_owned,) vectors and (num_owned, k) blocks; a block travels as one message
    per neighbour. Counts matvecs (per column) into counters.<field_name>, and the bytes and
    messages it sends into counters.halo_bytes and counters.halo_messages.
    """

    def __init__(self, local: sp.csr_matrix, plan: HaloPlan, comm, counters: Counters,
                 field_name: str):
        from mpi4py import MPI

        self._waitall = MPI.Request.Waitall
        self.plan = plan
        self.comm = comm
        self.counters = counters
        self.field_name = field_name
        self.diag = local[:, : plan.num_owned].tocsr()
        self.offd = local[:, plan.num_owned :].tocsr()
        self.shape = (plan.num_owned, plan.num_owned)
        self._sends = plan.sends()
        self._receives = plan.receives()

    @classmethod
    def from_global(cls, matrix, partition: RowPartition, comm, counters: Counters,
                    field_name: str, scaling: np.ndarray | None = None) -> DistributedCSR:
        """This rank's rows of diag(scaling) matrix diag(scaling) (no scaling if None)."""
        if partition.num_parts != comm.Get_size():
            raise ValueError(f"the partition has {partition.num_parts} parts, the "
                             f"communicator {comm.Get_size()} ranks")
        local, plan = owned_rows(matrix, partition, comm.Get_rank(), scaling)
        return cls(local, plan, comm, counters, field_name)

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        counters = self.counters
        setattr(counters, self.field_name,
                getattr(counters, self.field_name) + (1 if x.ndim == 1 else x.shape[1]))
        ghosts = np.empty((self.plan.num_ghosts,) + x.shape[1:])
        outgoing = x[self.plan.send_rows]
        requests = [self.comm.Irecv(ghosts[lo:hi], source=rank, tag=_HALO_TAG)
                    for rank, lo, hi in self._receives]
        requests += [self.comm.Isend(outgoing[lo:hi], dest=rank, tag=_HALO_TAG)
                     for rank, lo, hi in self._sends]
        # the owned columns need nothing from the neighbours: multiply while messages travel
        product = self.diag @ x
        self._waitall(requests)
        if ghosts.shape[0]:
            product += self.offd @ ghosts
        counters.halo_bytes += outgoing.nbytes
        counters.halo_messages += len(self._sends)
        return product


class DistributedSpace:
    """This rank's rows of a `RowPartition`: inner products are local products + Allreduce.

    The drop-in for `operators.SerialSpace`. Random vectors are drawn for all n rows on every
    rank and restricted to the local ones, so the solver starts from the serial vectors and
    the results match the serial run up to the order of summation.

    Attributes:
        size: n, the global number of rows.
        local_size: rows this rank owns.
        rows: their original indices, in local order.
        counters: where allreduces are counted (give the pencil the same object).
    """

    def __init__(self, comm, partition: RowPartition, counters: Counters):
        if partition.num_parts != comm.Get_size():
            raise ValueError(f"the partition has {partition.num_parts} parts, the "
                             f"communicator {comm.Get_size()} ranks")
        self.comm = comm
        self.partition = partition
        self.counters = counters
        self.rank = comm.Get_rank()
        self.rows = partition.rows(self.rank)
        self.size = partition.n
        self.local_size = int(self.rows.size)

    def reduce(self, partial):
        """The sum over ranks of per-rank partial sums (one Allreduce)."""
        local = np.array(partial, dtype=float)
        total = np.empty_like(local)
        # reshape(-1) gives 0-d partial sums a one-element buffer
        self.comm.Allreduce(local.reshape(-1), total.reshape(-1))
        self.counters.allreduces += 1
        return total[()]

    def dot(self, x: np.ndarray, y: np.ndarray):
        """X^T Y summed over all rows: a scalar for two vectors, an array for blocks."""
        return self.reduce(x.T @ y)

    def norms(self, x: np.ndarray) -> np.ndarray:
        """2-norm of each column of a (local_size, k) block."""
        return np.sqrt(self.reduce(np.einsum("ij,ij->j", x, x)))

    def restrict(self, x_global: np.ndarray) -> np.ndarray:
        """This rank's rows of a global (n,) or (n, k) array."""
        return x_global[self.rows]

    def scaled_operator(self, op, d: np.ndarray, counters: Counters, field_name: str):
        """This rank's rows of D op D with its halo exchange."""
        return DistributedCSR.from_global(op, self.partition, self.comm, counters, field_name,
                                          scaling=d)
