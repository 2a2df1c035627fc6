"""Tests of the row partition, the halo plans and the distributed space (pEVSL's ParCSR layout;
Shi et al., SC'18, section IV.D) in one process: the plans of several ranks are built side by
side and their exchange is emulated, and the distributed solver runs on MPI.COMM_SELF."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.linalg import aslinearoperator

from furnace.eigen import Counters, SolverConfig, eigsh_interval, scale_pencil
from furnace.eigen.distributed import owned_rows, partition_rows
from furnace.eigen.dos import kpm_dos
from furnace.eigen.parallel import ParallelLayout

from .conftest import assert_values_close, gap_interval, laplacian_pencil, lowest_eigenvalues


def _bandwidth(matrix: sp.csr_matrix) -> int:
    coo = matrix.tocoo()
    return int(np.max(np.abs(coo.row - coo.col)))


@pytest.mark.timeout(60)
def test_partition_is_balanced_deterministic_and_banded():
    A, M = laplacian_pencil((6, 5, 4), (1.0, 1.1, 1.3))
    # shuffle the rows so that the natural grid order is lost and RCM has work to do
    shuffle = np.random.default_rng(3).permutation(A.shape[0])
    A, M = A[shuffle][:, shuffle].tocsr(), M[shuffle][:, shuffle].tocsr()
    n = A.shape[0]
    pattern = (abs(A) + abs(M)).tocsr()
    row_nnz = np.diff(pattern.indptr)
    for num_parts in (1, 2, 3, 5):
        partition = partition_rows(A, M, num_parts)
        again = partition_rows(A, M, num_parts)
        np.testing.assert_array_equal(partition.order, again.order)
        np.testing.assert_array_equal(partition.offsets, again.offsets)
        np.testing.assert_array_equal(np.sort(partition.order), np.arange(n))
        assert partition.offsets[0] == 0 and partition.offsets[-1] == n
        assert np.all(np.diff(partition.offsets) > 0)
        block_nnz = [row_nnz[partition.rows(p)].sum() for p in range(num_parts)]
        # a cut at the nearest row boundary misses the ideal share by at most one row
        assert max(abs(nnz - row_nnz.sum() / num_parts) for nnz in block_nnz) <= row_nnz.max()
        np.testing.assert_array_equal(partition.owners(partition.positions[partition.rows(0)]),
                                      0)
    order = partition_rows(A, M, 2).order
    assert _bandwidth(pattern[order][:, order]) < _bandwidth(pattern) / 2


def test_partition_rejects_bad_part_counts_and_operators():
    A, M = laplacian_pencil((3, 3), (1.0, 1.0))
    with pytest.raises(ValueError, match="cannot split"):
        partition_rows(A, M, 0)
    with pytest.raises(ValueError, match="cannot split"):
        partition_rows(A, M, A.shape[0] + 1)
    with pytest.raises(ValueError, match="LinearOperator"):
        partition_rows(aslinearoperator(A), M, 2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_parts", [2, 3])
def test_halo_plans_agree_and_assemble_the_product(num_parts):
    A, M = laplacian_pencil((5, 4, 4), (1.0, 1.2, 1.1), seed=5)
    partition = partition_rows(A, M, num_parts)
    scaling = 1.0 / np.sqrt(M.diagonal())
    scaled = sp.diags(scaling) @ M @ sp.diags(scaling)
    x = np.random.default_rng(0).standard_normal((A.shape[0], 3))
    want = scaled @ x
    pieces = [owned_rows(M, partition, rank, scaling) for rank in range(num_parts)]
    assembled = np.empty_like(want)
    for rank, (local, plan) in enumerate(pieces):
        assert local.shape == (plan.num_owned, plan.num_owned + plan.num_ghosts)
        # emulate the exchange: each ghost comes from the sender's list for this rank
        ghosts = np.empty((plan.num_ghosts, x.shape[1]))
        for source, lo, hi in plan.receives():
            sender = pieces[source][1]
            segment = [(s, h) for dest, s, h in sender.sends() if dest == rank]
            assert len(segment) == 1
            sent_rows = sender.send_rows[segment[0][0] : segment[0][1]]
            np.testing.assert_array_equal(partition.offsets[source] + sent_rows,
                                          plan.ghosts[lo:hi])
            ghosts[lo:hi] = x[partition.rows(source)][sent_rows]
        # and every message sent is one that the destination expects
        for dest, _, _ in plan.sends():
            assert rank in pieces[dest][1].recv_ranks
        assembled[partition.rows(rank)] = local @ np.vstack([x[partition.rows(rank)], ghosts])
        assert plan.num_ghosts > 0
    np.testing.assert_allclose(assembled, want, rtol=1e-14, atol=1e-14)


def test_counters_merge_sums_communication():
    total = Counters(halo_bytes=80, halo_messages=2, allreduces=5, filter_degree=7)
    total.merge(Counters(halo_bytes=16, halo_messages=1, allreduces=3, filter_degree=4))
    assert (total.halo_bytes, total.halo_messages, total.allreduces) == (96, 3, 8)
    assert total.filter_degree == 7
    assert Counters().halo_bytes == Counters().allreduces == 0


def test_parallel_layout_validation():
    assert ParallelLayout("slices", 4).group_size == 1
    assert ParallelLayout("rows", 4).num_groups == 1
    assert ParallelLayout("groups", 4, 2).num_groups == 2
    with pytest.raises(ValueError, match="mode must be"):
        ParallelLayout("diagonal", 2)
    with pytest.raises(ValueError, match="needs a group_size"):
        ParallelLayout("groups", 2)
    with pytest.raises(ValueError, match="must divide"):
        ParallelLayout("groups", 4, 3)
    with pytest.raises(ValueError, match="uses group_size 1"):
        ParallelLayout("slices", 4, 2)
    with pytest.raises(ValueError, match="uses group_size 4"):
        ParallelLayout("rows", 4, 2)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mass", ["consistent", "lumped"])
def test_distributed_space_on_one_rank_matches_serial(mass):
    MPI = pytest.importorskip("mpi4py.MPI")
    from furnace.eigen.distributed import DistributedCSR, DistributedSpace
    from furnace.eigen.parallel import eigsh_interval_mpi
    from furnace.eigen.solver import _solve_slices, plan_slices

    A, M = laplacian_pencil((6, 5, 5), (1.0, 1.1, 1.3), seed=11)
    values = lowest_eigenvalues(A, M if mass == "consistent" else
                                sp.diags(np.asarray(M.sum(axis=1)).ravel()).tocsr(), 14)
    a, b = gap_interval(values, 4, 8)
    config = SolverConfig(a=a, b=b, mass=mass)
    serial = eigsh_interval(A, M, a, b, config=config, slices=2)
    scale = float(values[11])
    assert_values_close("serial", values[4:12], serial.eigenvalues, 1e-10, scale)

    # one part still reorders the rows (RCM), so sums run in another order than serially
    partition = partition_rows(A, M, 1)
    counters = Counters()
    space = DistributedSpace(MPI.COMM_SELF, partition, counters)
    pencil = scale_pencil(A, M, config, counters, space=space)
    assert pencil.space is space
    block = np.random.default_rng(1).standard_normal((A.shape[0], 2))
    operator = DistributedCSR.from_global(A, partition, MPI.COMM_SELF, Counters(), "a_matvecs")
    np.testing.assert_allclose(operator @ block[partition.order], (A @ block)[partition.order],
                               rtol=1e-14, atol=1e-13)
    assert operator.counters.a_matvecs == 2 and operator.counters.halo_bytes == 0

    serial_pencil = scale_pencil(A, M, config)
    dos = kpm_dos(pencil, degree=40, num_vectors=5)
    serial_dos = kpm_dos(serial_pencil, degree=40, num_vectors=5)
    np.testing.assert_allclose(dos.moments, serial_dos.moments, rtol=1e-10, atol=1e-9)

    plan = plan_slices(pencil, config, 2, 100, 30)
    assert plan.num_slices == 2 and plan.methods == ["dos", "dos"]
    found, vectors, residuals, infos = _solve_slices(pencil, config, plan, range(2))
    assert all(info.complete for info in infos)
    order = np.argsort(found)
    assert_values_close("distributed", serial.eigenvalues, found[order], 1e-10, scale)
    assert np.max(residuals) <= config.tol
    full = np.empty_like(vectors)
    full[space.rows] = pencil.scaling[:, None] * vectors
    lumped = M if mass == "consistent" else sp.diags(np.asarray(M.sum(axis=1)).ravel())
    gram = full.T @ (lumped @ full)
    np.testing.assert_allclose(gram, np.eye(found.size), atol=1e-10)
    assert counters.allreduces > 0 and counters.halo_bytes == 0

    # eigsh_interval_mpi on one rank: every mode is the serial solver
    result = eigsh_interval_mpi(A, M, a, b, comm=MPI.COMM_SELF, config=config, slices=2,
                                mode="rows")
    np.testing.assert_array_equal(result.eigenvalues, serial.eigenvalues)
    np.testing.assert_array_equal(result.eigenvectors, serial.eigenvectors)
    with pytest.raises(ValueError, match="must divide"):
        eigsh_interval_mpi(A, M, a, b, comm=MPI.COMM_SELF, mode="groups", group_size=2)
