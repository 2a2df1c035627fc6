"""1-D finite-element reference for toroidal modes of a layered, spherically symmetric planet.

Implements the radial toroidal eigenproblem of Dahlen & Tromp (1998), ch. 8: for degree l
and the radial eigenfunction W(r),

    omega^2 int rho r^2 W^2 dr = int mu [ (r W' - W)^2 + (l - 1)(l + 2) W^2 ] dr

over one solid shell, with natural (traction-free, T = mu (W' - W/r) = 0) conditions at
both ends; a solid region reaching the centre takes W(0) = 0 instead. Toroidal modes feel
neither gravity nor fluid layers (a fluid exerts no shear traction), so the result is an
exact reference for 3-D runs in any of the non-gravitating, Cowling or full-gravity
settings. For a homogeneous ball it reproduces Lamb (1882).

Discretisation: continuous P1 or P2 Lagrange elements in r, with element edges on every
model knot so the piecewise-linear rho and mu are smooth inside each element; Gauss
quadrature exact for those polynomials; consistent mass; sparse shift-invert Lanczos.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.sparse.linalg import eigsh

from furnace.normal_modes.models import Mode, RadialModel, from_mhz, to_mhz

__all__ = ["radial_mesh", "toroidal_eigenvalues", "toroidal_matrices", "toroidal_modes"]

# 5 Gauss points integrate degree 9 exactly; the P2 mass integrand rho r^2 W^2 is degree 7
_GX, _GW = np.polynomial.legendre.leggauss(5)

# dense LAPACK only for tiny systems: with torch loaded in the same process the dense
# generalized solver was seen to take seconds at n ~ 400 (thread contention)
_DENSE_LIMIT = 40


def _solid_region(model: RadialModel, shell: int) -> tuple[float, float]:
    regions = model.solid_regions()
    if not regions:
        raise ValueError(f"model {model.name!r} has no solid shell; toroidal modes need one")
    try:
        return regions[shell]
    except IndexError:
        raise ValueError(
            f"shell index {shell} out of range; model {model.name!r} has "
            f"{len(regions)} solid region(s): {regions}"
        ) from None


def radial_mesh(model: RadialModel, num_elements: int = 1000, shell: int = -1) -> np.ndarray:
    """Element edges [km] on one solid region, including every model knot in it."""
    if int(num_elements) != num_elements or num_elements < 1:
        raise ValueError(f"num_elements must be a positive integer, got {num_elements!r}")
    rb, rt = _solid_region(model, shell)
    knots = model.knots
    knots = knots[(knots >= rb) & (knots <= rt)]
    h = (rt - rb) / num_elements
    edges = [knots[:1]]
    for a, b in zip(knots[:-1], knots[1:]):
        n = max(1, int(round((b - a) / h)))
        edges.append(np.linspace(a, b, n + 1)[1:])
    return np.concatenate(edges)


def _shape(order: int, t: np.ndarray):
    """Lagrange shape functions and d/dt on the reference element t in [-1, 1]."""
    if order == 1:
        N = np.stack([(1 - t) / 2, (1 + t) / 2])
        dN = np.stack([-0.5 * np.ones_like(t), 0.5 * np.ones_like(t)])
    else:
        # nodes at t = -1, 0, +1
        N = np.stack([t * (t - 1) / 2, 1 - t**2, t * (t + 1) / 2])
        dN = np.stack([t - 0.5, -2 * t, t + 0.5])
    return N, dN


def toroidal_matrices(
    model: RadialModel, l: int, num_elements: int = 1000, *, order: int = 2, shell: int = -1
):
    """Stiffness K, mass M (sparse CSR) and node radii for degree l on one solid region.

    Units: mu in GPa, rho in g/cm^3, r in km, so K x = omega^2 M x with omega in rad/s.
    """
    if int(l) != l or l < 1:
        raise ValueError(f"toroidal modes need an integer degree l >= 1, got {l!r}")
    if order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, got {order!r}")
    edges = radial_mesh(model, num_elements, shell)
    ne = edges.size - 1
    a, b = edges[:-1], edges[1:]
    jac = (b - a) / 2.0
    rq = (a + b)[:, None] / 2.0 + jac[:, None] * _GX[None, :]  # (ne, nq)
    wq = jac[:, None] * _GW[None, :]
    # Gauss points are interior to a knot interval, so the side does not matter
    rho, _, vs = model.at(rq)
    mu = rho * vs**2
    N, dNt = _shape(order, _GX)  # (nloc, nq)
    W = N[None, :, :]
    dW = dNt[None, :, :] / jac[:, None, None]
    strain = rq[:, None, :] * dW - W  # r W' - W per shape function
    ll = (l - 1.0) * (l + 2.0)
    Ke = np.einsum("eq,eiq,ejq->eij", mu * wq, strain, strain) + ll * np.einsum(
        "eq,iq,jq->eij", mu * wq, N, N
    )
    Me = np.einsum("eq,iq,jq->eij", rho * rq**2 * wq, N, N)
    nloc = order + 1
    conn = order * np.arange(ne)[:, None] + np.arange(nloc)[None, :]
    ndof = order * ne + 1
    rows = np.repeat(conn, nloc, axis=1).ravel()
    cols = np.tile(conn, (1, nloc)).ravel()
    K = sp.csr_matrix((Ke.ravel(), (rows, cols)), shape=(ndof, ndof))
    M = sp.csr_matrix((Me.ravel(), (rows, cols)), shape=(ndof, ndof))
    nodes = np.empty(ndof)
    nodes[::order] = edges
    if order == 2:
        nodes[1::2] = (a + b) / 2.0
    if edges[0] == 0.0:
        # a solid region reaching the centre: W(0) = 0 (regularity of the displacement)
        K, M, nodes = K[1:, 1:], M[1:, 1:], nodes[1:]
    return K.tocsr(), M.tocsr(), nodes


def _eigenvalues_below(K, M, lam_max: float) -> np.ndarray:
    n = K.shape[0]
    if n <= _DENSE_LIMIT:
        vals = scipy.linalg.eigh(K.toarray(), M.toarray(), eigvals_only=True)
        return vals[vals <= lam_max]
    # shift below zero: K is singular for l = 1 (rigid rotation) and shift-invert
    # then returns the eigenvalues nearest the bottom of the spectrum first
    sigma = -0.05 * lam_max
    Kc, Mc = K.tocsc(), M.tocsc()
    k = 8
    # a fixed start: scipy's default draws one from OS entropy, so a rare slow start
    # would make runs irreproducible
    v0 = np.random.default_rng(0).standard_normal(n)
    while k < n - 2:
        vals = np.sort(eigsh(Kc, k=k, M=Mc, sigma=sigma, which="LM", v0=v0,
                             return_eigenvectors=False))
        if vals[-1] > lam_max:
            return vals[vals <= lam_max]
        k *= 2
    # the whole spectrum lies below lam_max: the mesh is too coarse for the band asked
    vals = scipy.linalg.eigh(K.toarray(), M.toarray(), eigvals_only=True)
    return vals[vals <= lam_max]


def toroidal_eigenvalues(
    model: RadialModel,
    l: int,
    fmax_mhz: float,
    num_elements: int = 1000,
    *,
    order: int = 2,
    shell: int = -1,
) -> np.ndarray:
    """omega^2 [s^-2] of the toroidal modes of degree l up to fmax_mhz, ascending.

    The rigid rotation (omega = 0, l = 1) is removed.
    """
    if not fmax_mhz > 0:
        raise ValueError(f"fmax_mhz must be positive, got {fmax_mhz!r}")
    K, M, nodes = toroidal_matrices(model, l, num_elements, order=order, shell=shell)
    lam_max = from_mhz(fmax_mhz)
    vals = _eigenvalues_below(K, M, lam_max)
    if l == 1:
        # W = r is in the P1/P2 space, so the rotation is zero up to round-off
        scale = (float(np.max(model.vs)) / nodes[-1]) ** 2
        if vals.size == 0 or abs(vals[0]) > 1e-8 * scale:
            raise RuntimeError("l = 1: expected the rigid rotation (omega = 0) as lowest mode")
        vals = vals[1:]
    return vals


def toroidal_modes(
    model: RadialModel,
    l_values,
    fmax_mhz: float,
    num_elements: int = 1000,
    *,
    order: int = 2,
    shell: int = -1,
) -> list[Mode]:
    """Toroidal multiplets nT_l with f <= fmax_mhz for each l in ``l_values``, by frequency.

    ``shell`` picks the solid region (index into ``model.solid_regions()``; -1, the
    default, is the outermost, i.e. the crust and mantle above a fluid core). The overtone
    number counts modes upward from n = 0, from n = 1 for l = 1 as in Lamb's numbering.
    """
    ls = [int(l) for l in np.atleast_1d(l_values)]
    if any(l < 1 for l in ls):
        raise ValueError(f"toroidal modes need l >= 1, got l_values={list(l_values)!r}")
    modes = []
    for l in sorted(set(ls)):
        vals = toroidal_eigenvalues(model, l, fmax_mhz, num_elements, order=order, shell=shell)
        first = 1 if l == 1 else 0
        modes += [Mode("T", first + k, l, to_mhz(max(v, 0.0))) for k, v in enumerate(vals)]
    modes.sort(key=lambda m: (m.frequency_mhz, m.l, m.n))
    return modes
