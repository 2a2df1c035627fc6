"""`furnace reproduce eigen`: its entries, its box pencil against an element-by-element Q1
assembly and dense eigenvalues, and the rule that the solver library never imports the
normal-modes application (`furnace.eigen.experiments`)."""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
import torch

import furnace.eigen
from furnace.eigen import SolverConfig, eigsh_interval
from furnace.eigen.experiments import (
    BOX_BELOW,
    BOX_COUNT,
    BOX_LENGTHS,
    box_cells,
    box_comparison_pencil,
    box_eigenvalues,
    box_eigenvectors,
    box_interval,
    box_pencil,
    compare_solvers,
)
from furnace.runtime.reproduce import RunContext, discover
from furnace.runtime.testing import max_relative_error

EIGEN_DIR = Path(furnace.eigen.__file__).parent
FORBIDDEN = "furnace.normal_modes"


def _close(reference, actual, ratio, scale):
    err = max_relative_error(torch.as_tensor(np.asarray(reference, dtype=float)),
                             torch.as_tensor(np.asarray(actual, dtype=float)), scale=scale)
    assert err <= ratio, f"max relative error {err:.3e} exceeds {ratio:.1e}"


def test_registered():
    assert [e.name for e in discover("eigen")] == ["vs_arpack", "scaling", "sc18_model"]


def _imported_modules(source: str, package: list[str]) -> list[str]:
    """Absolute names of every module ``source`` (a module of ``package``) imports, relative
    imports resolved, and every string constant naming a furnace module (the targets of
    importlib.import_module)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.append(module)
            names += [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith("furnace."):
            names.append(node.value)
    return names


def _file_imports(path: Path) -> list[str]:
    package = ["furnace", *path.relative_to(EIGEN_DIR.parent).parent.parts]
    return _imported_modules(path.read_text(), package)


def _forbidden(names: list[str]) -> list[str]:
    return [n for n in names if n == FORBIDDEN or n.startswith(FORBIDDEN + ".")]


def test_import_scan_sees_every_form_of_import():
    eigen = ["furnace", "eigen"]
    for source in ("from ..normal_modes import mesh", "from .. import normal_modes",
                   "import furnace.normal_modes.solve as s",
                   "from furnace.normal_modes.mesh import ball_mesh",
                   "def f():\n    import importlib\n"
                   "    return importlib.import_module('furnace.normal_modes.mesh')"):
        assert _forbidden(_imported_modules(source, eigen)), source
    for source in ("from . import solver", "from .mpi_runs import run_cli",
                   "import furnace.runtime.reproduce", "x = 'normal_modes'"):
        assert not _forbidden(_imported_modules(source, eigen)), source
    names = _file_imports(EIGEN_DIR / "comparison.py")
    assert "furnace.runtime.reproduce" in names and "furnace.eigen.mpi_runs.run_cli" in names


def test_eigen_source_never_imports_normal_modes():
    files = sorted(EIGEN_DIR.rglob("*.py"))
    assert len(files) > 10
    offenders = {str(f.relative_to(EIGEN_DIR)): _forbidden(_file_imports(f)) for f in files}
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.timeout(120)
def test_importing_every_eigen_module_leaves_normal_modes_unloaded():
    code = ("import importlib, pkgutil, sys\n"
            "import furnace.eigen as e\n"
            "names = [m.name for m in pkgutil.walk_packages(e.__path__, 'furnace.eigen.')]\n"
            "for name in names:\n"
            "    importlib.import_module(name)\n"
            "print(len(names))\n"
            "print(sorted(m for m in sys.modules if m.startswith('furnace.normal_modes')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=100)
    assert proc.returncode == 0, proc.stderr[-2000:]
    count, loaded = proc.stdout.strip().splitlines()
    assert int(count) > 10 and loaded == "[]"


def _naive_q1_box(cells):
    """Q1 hexahedra assembled element by element, 2-point Gauss per direction (exact for
    the Q1 stiffness and mass), nodal quadrature for the lumped mass; Dirichlet nodes
    dropped. The obviously correct reference for `box_pencil`."""
    h = [length / c for length, c in zip(BOX_LENGTHS, cells)]
    nodes = [c + 1 for c in cells]
    gauss = (0.5 - 0.5 / np.sqrt(3.0), 0.5 + 0.5 / np.sqrt(3.0))
    corners = list(itertools.product((0, 1), repeat=3))

    def shape(corner, point):
        value, grad = 1.0, np.ones(3)
        for axis in range(3):
            t, c = point[axis], corner[axis]
            phi, dphi = (t, 1.0) if c else (1.0 - t, -1.0)
            value *= phi
            for g in range(3):
                grad[g] *= dphi / h[axis] if g == axis else phi
        return value, grad

    ke, me = np.zeros((8, 8)), np.zeros((8, 8))
    weight = np.prod(h) / 8.0  # 8 Gauss points of weight 1/8 on the unit cube
    for point in itertools.product(gauss, repeat=3):
        vals = [shape(c, point) for c in corners]
        for i, j in itertools.product(range(8), repeat=2):
            ke[i, j] += weight * vals[i][1] @ vals[j][1]
            me[i, j] += weight * vals[i][0] * vals[j][0]
    total = int(np.prod(nodes))
    K, M, lumped = np.zeros((total, total)), np.zeros((total, total)), np.zeros(total)
    for cell in itertools.product(*(range(c) for c in cells)):
        ids = [np.ravel_multi_index(tuple(np.add(cell, c)), nodes) for c in corners]
        for i, j in itertools.product(range(8), repeat=2):
            K[ids[i], ids[j]] += ke[i, j]
            M[ids[i], ids[j]] += me[i, j]
        lumped[ids] += np.prod(h) / 8.0
    inner = [np.ravel_multi_index(idx, nodes)
             for idx in itertools.product(*(range(1, n - 1) for n in nodes))]
    sub = np.ix_(inner, inner)
    return K[sub], M[sub], np.diag(lumped[inner])


@pytest.mark.parametrize("cells", [(3, 4, 5), (4, 3, 2)])
def test_box_pencil_equals_element_by_element_assembly(cells):
    K_ref, M_ref, lumped_ref = _naive_q1_box(cells)
    K, M_lumped = box_pencil(cells, "lumped")
    _, M = box_pencil(cells, "consistent")
    scale = np.abs(K_ref).max()  # > 0: the diagonal of a stiffness matrix
    _close(K_ref, K.toarray(), 1e-13, scale)
    _close(M_ref, M.toarray(), 1e-13, np.abs(M_ref).max())
    _close(lumped_ref, M_lumped.toarray(), 1e-13, np.abs(lumped_ref).max())


@pytest.mark.parametrize("mass", ["lumped", "consistent"])
def test_closed_form_spectrum_equals_dense_eigh(mass):
    cells = (5, 6, 7)
    K, M = box_pencil(cells, mass)
    dense = scipy.linalg.eigh(K.toarray(), M.toarray(), eigvals_only=True)
    exact = box_eigenvalues(cells, mass)
    assert exact.size == K.shape[0] == 4 * 5 * 6
    # relative to the largest eigenvalue: the spectrum's scale, far from zero
    _close(dense, exact, 1e-12, np.abs(dense).max())


def test_closed_form_eigenvectors_are_m_orthonormal_eigenvectors():
    cells = (6, 7, 9)
    K, M = box_pencil(cells)
    values = box_eigenvalues(cells)[:8]
    vectors = box_eigenvectors(cells, 8)
    residual = K @ vectors - (M @ vectors) * values
    scale = np.abs(K @ vectors).max()
    _close(np.zeros_like(residual), residual, 1e-12, scale)
    _close(np.eye(8), vectors.T @ (M @ vectors), 1e-12, 1.0)


def test_box_interval_holds_the_27_above_the_6_lowest():
    for size in (10, 14, 37):
        cells = box_cells(size)
        values = box_eigenvalues(cells)
        a, b = box_interval(cells)
        inside = np.flatnonzero((values >= a) & (values <= b))
        assert inside.tolist() == list(range(BOX_BELOW, BOX_BELOW + BOX_COUNT))
        # the ends are mid-gap: well away from every eigenvalue
        gap = np.abs(values[:, None] - np.array([a, b])).min()
        assert gap > 1e-3 * b
        # no eigenvalue repeats within 1e-6 relative near the interval
        near = values[:BOX_BELOW + BOX_COUNT + 1]
        assert np.diff(near).min() > 1e-6 * near.max()
    assert box_cells(14) == (14, 17, 20)
    with pytest.raises(ValueError):
        box_interval((2, 2, 3))
    with pytest.raises(ValueError):
        box_cells(1)
    with pytest.raises(ValueError, match="mass"):
        box_pencil((3, 3, 3), "diagonal")


def test_filtered_lanczos_finds_the_closed_form_eigenvalues():
    cells = box_cells(10)
    K, M = box_pencil(cells)
    a, b = box_interval(cells)
    res = eigsh_interval(K, M, a, b, config=SolverConfig(a=a, b=b, mass="lumped"))
    exact = box_eigenvalues(cells)[BOX_BELOW:BOX_BELOW + BOX_COUNT]
    assert res.eigenvalues.size == BOX_COUNT
    _close(exact, res.eigenvalues, 1e-10, np.abs(exact).max())


@pytest.mark.timeout(120)
def test_compare_solvers_on_a_small_box(tmp_path):
    """The experiment's machinery end to end on one tiny size (each solver in a child)."""
    result = compare_solvers(RunContext(out_dir=tmp_path, quick=True),
                             [lambda: box_comparison_pencil(8)], size_column="N",
                             pencil_note="test.", lobpcg_iterations=200)
    table = result.tables[0]
    row = dict(zip(table.columns, table.rows[0]))
    assert row["unknowns"] == 7 * 9 * 11 and row["eigenpairs"] == BOX_COUNT
    assert row["count vouched for"] == "yes"
    assert row["filtered max error vs closed form"] < 1e-10
    assert row["ARPACK same eigenvalues"] == "yes"
    assert row["LOBPCG"].endswith("it")  # converged: its eigenvalues agree to 1e-6
    assert row["speedup vs ARPACK"] > 0 and row["filter degree"] >= 2
