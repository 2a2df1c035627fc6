"""Tests for furnace.normal_modes.assembly against rigid modes, total mass and Lamb (1882).

Lamb's values for a Poisson solid (omega a / beta) are from the design note eigensolver.md
section 4.1; with vp = sqrt(3), vs = 1, rho = 1 on the unit ball, omega a / beta equals
sqrt(lambda).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sla
from scipy.sparse.linalg import eigsh

from furnace.runtime.testing import start_vector

pytest.importorskip("gmsh")
pytest.importorskip("skfem")

from furnace.normal_modes.assembly import (
    assemble,
    element_material,
    frequencies_mhz,
    homogeneous,
    total_mass,
)
from furnace.normal_modes.identify import group_multiplets
from furnace.normal_modes.mesh import ball_mesh

UNIT = homogeneous(1.0, np.sqrt(3.0), 1.0)
CONST = homogeneous(5.51, 10.0, 5.7735)
# (label, omega a / beta, multiplicity) for the modes in omega in [2, 4.2]
LAMB = [
    ("0T2", 2.50113, 5),
    ("0S2", 2.63987, 5),
    ("1S1", 3.42453, 3),
    ("0T3", 3.86470, 7),
    ("0S3", 3.91634, 7),
]


def lowest_omegas(mesh, order=1, lumped=False, k=36, sigma=9.0):
    K, M = assemble(mesh, UNIT, order=order, lumped=lumped)
    w = eigsh(K, k=k, M=M, sigma=sigma, which="LM", v0=start_vector(K),
              return_eigenvectors=False)
    om = np.sort(np.sqrt(np.abs(w)))
    return om[(om > 2.0) & (om < 4.2)]


@pytest.mark.timeout(180)
def test_rigid_modes_symmetry_and_mass():
    mesh = ball_mesh(1.0, 0.4)
    K, M = assemble(mesh, CONST)
    assert K.format == "csr" and M.format == "csr"
    assert abs(K - K.T).max() <= 1e-12 * abs(K).max()
    assert abs(M - M.T).max() <= 1e-12 * abs(M).max()
    Kd, Md = K.toarray(), M.toarray()
    assert np.linalg.eigvalsh(Md).min() > 0
    lam = sla.eigh(Kd, Md, eigvals_only=True)
    scale = lam.max()
    assert np.sum(np.abs(lam) < 1e-10 * scale) == 6  # 3 translations + 3 rotations
    assert lam[6] > 1e-4 * scale
    assert np.linalg.eigvalsh(Kd).min() > -1e-10 * np.abs(Kd).max()

    mass = total_mass(mesh, CONST)
    assert mass == pytest.approx(5.51 * mesh.volume(), rel=1e-12)
    _, Ml = assemble(mesh, CONST, lumped=True)
    for c in range(3):
        e = np.zeros(K.shape[0])
        e[c::3] = 1.0  # P1 vector dofs are interleaved (x, y, z) per vertex
        assert e @ (M @ e) == pytest.approx(mass, rel=1e-12)
        assert e @ (Ml @ e) == pytest.approx(mass, rel=1e-12)
    assert Ml.nnz == K.shape[0] and Ml.diagonal().min() > 0


@pytest.mark.timeout(180)
def test_lamb_sphere_p1_h015():
    om = lowest_omegas(ball_mesh(1.0, 0.15))
    assert om.size == 27
    groups = group_multiplets(om, 5e-3)
    assert [g.size for g in groups] == [5, 5, 3, 7, 7]
    for (name, ref, mult), g in zip(LAMB, groups):
        assert g.size == mult
        err = om[g] / ref - 1.0
        # consistent mass approaches from above: within 3 % for the lowest three multiplets;
        # the l=3 ones are 3.5 % (0T3) and 5.0 % (0S3) high at this h (recorded, not a target)
        assert np.all(err > 0), name
        if name in ("0T2", "0S2", "1S1"):
            assert err.max() < 0.03, name
        # splitting from the unstructured mesh is small
        assert np.ptp(om[g]) / ref < 5e-3, name
    assert om[groups[0]].mean() == pytest.approx(2.5497 + 0.001, abs=0.003)


@pytest.mark.timeout(180)
def test_lamb_sphere_p1_h015_lumped_within_3_percent():
    # the target: all 27 eigenpairs in omega in [2, 4.2], multiplets 5+5+3+7+7,
    # within 3 % of Lamb; lumped mass (what the filtered Lanczos benchmark uses) meets it
    om = lowest_omegas(ball_mesh(1.0, 0.15), lumped=True)
    assert om.size == 27
    groups = group_multiplets(om, 5e-3)
    assert [g.size for g in groups] == [5, 5, 3, 7, 7]
    for (name, ref, _), g in zip(LAMB, groups):
        assert np.abs(om[g] / ref - 1.0).max() < 0.03, name


@pytest.mark.timeout(180)
def test_p1_convergence_is_second_order():
    errs, hs = [], (0.25, 0.15)
    for h in hs:
        om = lowest_omegas(ball_mesh(1.0, h), k=12, sigma=6.5)
        errs.append(om[:5].mean() / LAMB[0][1] - 1.0)
    rate = np.log(errs[0] / errs[1]) / np.log(hs[0] / hs[1])
    assert 1.4 < rate < 3.0, (errs, rate)


@pytest.mark.timeout(180)
def test_p2_beats_p1_and_lumped_is_below():
    mesh = ball_mesh(1.0, 0.3)
    e1 = lowest_omegas(mesh, order=1, k=12, sigma=6.5)[:5].mean() / LAMB[0][1] - 1.0
    e2 = lowest_omegas(mesh, order=2, k=12, sigma=6.5)[:5].mean() / LAMB[0][1] - 1.0
    assert 0 < e2 < 0.5 * e1
    el = lowest_omegas(mesh, order=1, lumped=True, k=12, sigma=6.5)[:5].mean() / LAMB[0][1] - 1
    assert el < e1


@pytest.mark.timeout(180)
def test_fluid_layer_and_material_checks():
    mesh = ball_mesh(1.0, 0.4, interfaces=(0.5,))

    def core_fluid(r):  # scalar-only callable with a jump at r = 0.5
        return (2.0, 1.5, 0.0) if r < 0.5 else (1.0, 1.8, 1.0)

    mat = element_material(mesh, core_fluid)
    assert np.all(mat.mu[mesh.layer == 0] == 0) and np.all(mat.mu[mesh.layer == 1] > 0)
    assert np.all(mat.rho[mesh.layer == 0] == 2.0)
    K, M = assemble(mesh, core_fluid)
    Ks, Ms = assemble(mesh, homogeneous(1.0, 1.8, 1.0))
    assert abs(K - K.T).max() <= 1e-12 * abs(K).max()
    lam = np.sort(eigsh(K, k=10, M=M, sigma=-1e-3, v0=start_vector(K),
                       return_eigenvectors=False))
    lam_s = np.sort(eigsh(Ks, k=10, M=Ms, sigma=-1e-3, v0=start_vector(Ks),
                         return_eigenvectors=False))
    # still 6 rigid modes and PSD; a P1 welded fluid core locks (few divergence-free P1
    # fields), so extra null modes are not guaranteed, but the core softens the ball
    assert np.all(np.abs(lam[:6]) < 1e-9 * lam[6])
    assert lam[6] < lam_s[6]

    with pytest.raises(ValueError, match="P1"):
        assemble(mesh, UNIT, order=2, lumped=True)
    with pytest.raises(ValueError, match="order"):
        assemble(mesh, UNIT, order=3)
    with pytest.raises(ValueError, match="density"):
        assemble(mesh, homogeneous(-1.0, 2.0, 1.0))
    with pytest.raises(ValueError, match="bulk"):
        assemble(mesh, homogeneous(1.0, 1.0, 1.0))


def test_frequency_units():
    # CONST ball 0T2: omega a / beta = 2.50113 with a = 6371 km, beta = 5.7735 km/s
    lam = (2.50113 * 5.7735 / 6371.0) ** 2
    assert frequencies_mhz(np.array([lam]))[0] == pytest.approx(0.36074, abs=2e-5)
