"""Scaling metrics, the SC'18 data, the cost model, and the quick scaling experiments
(`furnace.eigen.costmodel`, `.sc18`, `.mpi_runs`, `.scaling_experiments`; design note
eigensolver.md section 5.4)."""

from __future__ import annotations

import numpy as np
import pytest

from furnace.eigen.costmodel import (
    ClusterAssumptions,
    ScalingModel,
    Workload,
    amdahl_fit,
    calibrate_to_anchor,
    speedup,
    strong_efficiency,
    unified_time,
    weak_efficiency,
)
from furnace.eigen.mpi_runs import cli_modes, cli_options, find_mpiexec
from furnace.eigen.sc18 import (
    SC18_C3,
    SC18_E3,
    SC18_FIXED_CONST,
    SC18_FIXED_EARTH,
    SC18_NNZ_A_PER_ROW,
    SC18_NNZ_M_PER_ROW,
    sc18_workload,
)
from furnace.runtime.presets import stampede2_skx


def _work(n=100_000, steps=200, degree=50, consistent=True) -> Workload:
    a = float(degree * steps)
    return Workload(n=n, nnz_a=40.0 * n, nnz_m=(40.0 / 3 if consistent else 1.0) * n,
                    a_matvecs=a, m_matvecs=25 * a if consistent else 0.0,
                    allreduces=8.0 * steps, reorth_flops=4.0 * n * steps**2,
                    filter_degree=degree, filtered_matvecs=steps)


def test_unified_time_is_thu_tot_time_over_deg_over_it():
    assert unified_time(3247.78, 364, 672) == pytest.approx(3247.78 / 364 / 672)
    values = unified_time(np.array([10.0, 20.0]), [10, 20], [5, 5])
    np.testing.assert_allclose(values, [0.2, 0.2])
    with pytest.raises(ValueError):
        unified_time(1.0, 0, 10)


def test_speedup_and_efficiencies():
    assert speedup(10.0, 4.0) == pytest.approx(2.5)
    # SC18/THU strong scaling: T(p0) p0 / (T(p) p)
    assert strong_efficiency(192, 6854.54, 1536, 1259.08) == pytest.approx(0.6805, abs=1e-4)
    assert strong_efficiency(1, 10.0, 2, 5.0) == pytest.approx(1.0)
    np.testing.assert_allclose(strong_efficiency(1, 8.0, np.array([2, 4]), np.array([4.0, 4.0])),
                               [1.0, 0.5])
    assert weak_efficiency(3.0, 4.0) == pytest.approx(0.75)


@pytest.mark.parametrize("series", [SC18_C3, SC18_E3], ids=lambda s: s.name)
def test_sc18_transcribed_efficiencies_match_the_times(series):
    assert len(series.processes) == len(series.seconds) == len(series.efficiency)
    assert len(series.a_matvec_ms) == len(series.processes)
    recomputed = strong_efficiency(series.processes[0], series.seconds[0],
                                   np.array(series.processes), np.array(series.seconds))
    # transcribed to two significant digits (C3's 1.055 is written 1.1)
    np.testing.assert_allclose(recomputed, series.efficiency, atol=0.05)
    assert series.processes == tuple(48 * n for n in (4, 8, 16, 32)[: len(series.processes)])


def test_sc18_degree_and_count_come_from_the_same_run():
    # the fixed-interval entry of the same size has the 384-process total time
    for series, fixed in ((SC18_C3, SC18_FIXED_CONST), (SC18_E3, SC18_FIXED_EARTH)):
        i = fixed.dofs.index(series.dofs)
        assert fixed.degree[i] == series.degree
        assert fixed.filtered_matvecs[i] == series.filtered_matvecs
        assert fixed.seconds[i] == pytest.approx(series.seconds[1], abs=0.01)
    for fixed in (SC18_FIXED_CONST, SC18_FIXED_EARTH):
        lengths = {len(fixed.dofs), len(fixed.degree), len(fixed.filtered_matvecs),
                   len(fixed.seconds)}
        assert len(lengths) == 1


def test_amdahl_fit_through_two_points():
    serial, work = amdahl_fit(2, 5.0 + 100.0 / 2, 8, 5.0 + 100.0 / 8)
    assert serial == pytest.approx(5.0)
    assert work == pytest.approx(100.0)


def test_fit_compute_recovers_known_constants():
    truth = ScalingModel(c_K=1.3e-9, c_R=0.4e-9, alpha=0.0, beta=0.0, alpha_ar=0.0)
    works = [_work(n, steps, deg, consistent=False)
             for n, steps, deg in ((4_000, 110, 37), (8_000, 130, 51), (30_000, 131, 69))]
    seconds = [truth.seconds(w, 1) for w in works]
    c_K, c_R = ScalingModel.fit_compute(works, seconds)
    assert c_K == pytest.approx(truth.c_K, rel=1e-6)
    assert c_R == pytest.approx(truth.c_R, rel=1e-6)


def test_fit_link_recovers_latency_and_bandwidth():
    sizes = np.array([8, 1024, 8192, 65536, 262144])
    alpha, beta = ScalingModel.fit_link(sizes, 3e-6 + 1e-10 * sizes)
    assert alpha == pytest.approx(3e-6, rel=1e-6)
    assert beta == pytest.approx(1e-10, rel=1e-6)
    with pytest.raises(ValueError):
        ScalingModel.fit_link([8], [1e-6])


def test_model_has_no_communication_on_one_rank():
    model = ScalingModel(c_K=1e-9, c_R=2e-10, alpha=5e-6, beta=1e-9, alpha_ar=3e-6,
                         overhead=1e-4)
    work = _work()
    compute = 1e-9 * work.matvec_nonzeros + 2e-10 * work.reorth_flops
    assert model.seconds(work, 1) == pytest.approx(compute)
    assert model.exchange_seconds(work.n, 1) == 0.0
    # measured counts replace the h(p), m(p) formulas
    t = model.seconds(work, 2, halo_bytes=1e6, halo_messages=100, allreduces=10)
    expected = (compute / 2 + 1e-4 * work.exchanging_matvecs + 5e-6 * 100 + 1e-9 * 1e6
                + 3e-6 * 10)
    assert t == pytest.approx(expected)


def test_halo_model_matches_design_note():
    model = ScalingModel(c_K=1e-9, c_R=0.0, alpha=0.0, beta=0.0, alpha_ar=0.0)
    n, p = 3_894_783, 192
    assert model.halo_bytes(n, p) == pytest.approx(3 * (n / p) ** (2 / 3) * 8)
    assert model.messages(2) == 1
    assert model.messages(1536) == model.max_neighbours


def test_efficiency_falls_as_dofs_per_rank_fall():
    model = ScalingModel(c_K=2e-9, c_R=1e-9, alpha=2e-6, beta=4e-9, alpha_ar=2e-6)
    work = _work(n=4_000_000, steps=672, degree=364)
    procs = [192, 384, 768, 1536, 6144, 24576]
    eff = model.strong_efficiency(work, procs)
    assert eff[0] == pytest.approx(1.0)
    assert np.all(np.diff(eff) < 0)
    par = [model.parallel_efficiency(work, p) for p in procs]
    assert np.all(np.diff(par) < 0)
    # plenty of dofs per rank: nearly ideal; a few hundred: communication dominated
    assert model.parallel_efficiency(work, 40) > 0.9
    assert model.parallel_efficiency(work, 40_000) < 0.5


def test_cli_introspection_sees_the_parallel_modes():
    # strong_weak skips what the CLI lacks, so a blind introspection would skip silently
    assert set(cli_modes()) == {"rows", "slices", "groups"}
    assert {"--interval", "--mass", "--lumped", "--json"} <= cli_options()


def test_sc18_pencil_structure_is_p1_vector():
    # the consistent P1 vector mass couples only equal components: 1/3 of A's pattern
    # (the A figure itself is checked against our gmsh ball in tests/normal_modes/test_mesh.py)
    assert SC18_NNZ_M_PER_ROW * 3 == pytest.approx(SC18_NNZ_A_PER_ROW)


def test_calibration_hits_the_anchor_and_predicts_the_rest():
    work = sc18_workload(SC18_C3, nnz_a_per_row=40.0, nnz_m_per_row=40.0 / 3,
                         allreduces_per_step=8.0, reorth_flops_per_nk2=4.0)
    assert work.a_matvecs == 364 * 672 and work.m_matvecs == 25 * 364 * 672
    model = calibrate_to_anchor(work, 192, 3.40e-3)
    assert model.a_matvec_seconds(work, 192) == pytest.approx(3.40e-3, rel=1e-12)
    later = [model.a_matvec_seconds(work, p) for p in SC18_C3.processes[1:]]
    assert np.all(np.diff([3.40e-3, *later]) < 0)
    eff = model.strong_efficiency(work, SC18_C3.processes)
    assert 0.0 < eff[-1] < 1.0
    with pytest.raises(ValueError, match="exceeds"):
        calibrate_to_anchor(work, 192, 3.40e-3,
                            ClusterAssumptions(topology=stampede2_skx(latency_s=1e-3)))


@pytest.mark.timeout(300)  # about 30 s alone; 90 s seen with the 2 cores shared by others
def test_strong_weak_and_model_quick(tmp_path):
    pytest.importorskip("mpi4py")
    if find_mpiexec() is None:
        pytest.skip("mpiexec is not installed (pip install 'furnace[hpc]')")
    from furnace.eigen.scaling_experiments import sc18_model, strong_weak
    from furnace.runtime.reproduce import RunContext

    ctx = RunContext(out_dir=tmp_path, quick=True)
    result = strong_weak(ctx)
    assert (tmp_path / result.figures[0]).exists()
    strong = result.tables[0]
    assert strong.kind == "measured"
    assert {row[1] for row in strong.rows} == {1, 2}
    columns = strong.columns
    eigenpairs = columns.index("eigenpairs")
    exact = columns.index("max rel error vs closed form")
    assert all(row[eigenpairs] == 27 for row in strong.rows)  # the 27 above the 6 lowest
    # every run, on 1 or 2 ranks and in either mode, finds the box's exact eigenvalues
    assert all(row[exact] < 1e-10 for row in strong.rows)
    assert {c.what.split(" (")[0]: c.holds for c in result.claims[-2:]} == {
        "2-rank eigenvalues equal 1-rank ones": True,
        "eigenvalues against the closed form": True}
    model = sc18_model(ctx)
    assert model.data["reused_runs"]
    # alone it measures the same plan itself: what depends only on the runs' counters (the
    # SC18 tables, the Stampede2-class projection) is the same, to the last bit
    alone = sc18_model(RunContext(out_dir=tmp_path / "alone", quick=True))
    assert not alone.data["reused_runs"]
    analytic = [(t.title, t.rows) for t in model.tables if t.kind == "analytic"]
    analytic_alone = [(t.title, t.rows) for t in alone.tables if t.kind == "analytic"]
    assert len(analytic) == 4
    assert [(title, rows) for title, rows in analytic[:3]] == analytic_alone[:3]
    # the dofs-per-rank grid: its Stampede2-class column (the other uses this machine's
    # timings)
    assert [row[:3] for row in analytic[3][1]] == [row[:3] for row in analytic_alone[3][1]]
    assert model.data["projection"] == alone.data["projection"]
    for key in ("halo_coeff", "allreduces_per_step"):
        assert model.data["fit"][key] == alone.data["fit"][key]
    claim = model.claims[0]
    assert claim.paper == "0.68 (SC18, measured)" and claim.ours.endswith("(model)")
    assert 0.0 < model.data["projection"]["efficiency"][-1] <= 1.0
    assert (tmp_path / model.figures[0]).exists()


def _fake_records(plan):
    """What `measure(plan)` returns, made up but consistent: the closed-form eigenvalues,
    counters that grow with n, 2-rank runs at 0.6 of the 1-rank time."""
    from furnace.eigen.experiments import BOX_BELOW, BOX_COUNT, box_cells, box_eigenvalues
    from furnace.eigen.scaling_experiments import RunRecord

    sizes = sorted({*plan.strong, plan.weak_one, plan.weak_two})
    records = []
    for size in sizes:
        cells = box_cells(size)
        n = (cells[0] - 1) * (cells[1] - 1) * (cells[2] - 1)
        exact = box_eigenvalues(cells)[BOX_BELOW:BOX_BELOW + BOX_COUNT].tolist()
        for ranks, mode in ((1, "serial"), (2, "rows"), (2, "slices")):
            steps = 100 + size
            counters = {"a_matvecs": 20 * steps, "m_matvecs": 0, "filter_degree": 20,
                        "filtered_matvecs": steps, "lanczos_steps": steps,
                        "reorth_flops": 4 * n * steps**2 // ranks,
                        "allreduces": 5 * steps if mode == "rows" else 0,
                        "halo_bytes": 800 * size * steps if mode == "rows" else 0,
                        "halo_messages": 20 * steps if mode == "rows" else 0}
            records.append(RunRecord(label=f"N={size}", n=n, nnz_a=7 * n, nnz_m=n, ranks=ranks,
                                     mode=mode, slices=2 if mode == "slices" else 1,
                                     seconds=1e-6 * n * (1.0 if ranks == 1 else 0.6),
                                     timed_by="solver", counters=counters, eigenvalues=exact,
                                     total_reorth_flops=4.0 * n * steps**2,
                                     count_method="dos", complete=True))
    return records


def _deterministic(result):
    """A result's tables and claims without the note that says where the runs came from."""
    return ([(t.title, t.kind, t.columns, t.rows) for t in result.tables],
            [(c.what, c.paper, c.ours, c.holds) for c in result.claims])


def test_model_measures_the_runs_alone_and_shares_them_after_scaling(tmp_path, monkeypatch):
    """`scaling` and `sc18_model` take their runs from `RunContext.shared`: after `scaling`
    the model reuses them (one measurement for both), alone it measures the same plan, and
    either way it reports the same tables (the measurement is faked, so all of them)."""
    from furnace.eigen import scaling_experiments
    from furnace.runtime.reproduce import RunContext

    calls = []

    def fake_measure(plan, work_dir, *, runs=None, progress=lambda text: None):
        calls.append(plan)
        return _fake_records(plan)

    link = {"exchange_seconds": {"8": 3e-6}, "allreduce_seconds": 4e-6, "iterations": 200,
            "alpha": 3e-6, "beta": 2e-10}
    monkeypatch.setattr(scaling_experiments, "measure", fake_measure)
    monkeypatch.setattr(scaling_experiments, "measure_link",
                        lambda mpiexec, out_dir, iterations: dict(link))
    monkeypatch.setattr(scaling_experiments, "find_mpiexec", lambda: "mpiexec")

    shared = RunContext(out_dir=tmp_path / "shared", quick=True)
    scaling_experiments.strong_weak(shared)
    after = scaling_experiments.sc18_model(shared)
    assert calls == [scaling_experiments.QUICK] and after.data["reused_runs"]
    assert list(shared.artifacts) == [scaling_experiments.runs_key(scaling_experiments.QUICK)]

    alone = scaling_experiments.sc18_model(RunContext(out_dir=tmp_path / "alone", quick=True))
    assert calls == [scaling_experiments.QUICK] * 2 and not alone.data["reused_runs"]
    assert _deterministic(alone) == _deterministic(after)
    assert alone.data["fit"] == after.data["fit"]
    assert alone.data["projection"] == after.data["projection"]
