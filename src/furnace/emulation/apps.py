"""Demonstration applications whose GEMMs go through a pluggable ``matmul``.

Ape (Ma, Wang, Feng, Zhang, Xie, He, Chen, Zhai, "Efficiently Emulating High-Bitwidth
Computation with Low-Bitwidth Hardware", ICS '22) judges an emulated type by whether the
*application* still meets its accuracy requirement, not by the GEMM error alone. This module
holds the applications of design note `emulated_types.md` section 6.6, sized for a 2-core CPU,
that the selector of section 6.5 runs with candidate emulated types:

* ``gemm-narrow`` / ``gemm-wide``: a single product, uniform or wide-range (beyond fp16) data;
* ``lu-ir``: blocked LU without pivoting in float32 plus iterative refinement with a float64
  residual, graded by the HPL-MxP scaled residual (the HPL-MxP benchmark's mixed-precision
  LU + IR scheme);
* ``cg``: block conjugate gradient on a dense SPD matrix (fp64-class requirement);
* ``lanczos``: Lanczos with full reorthogonalisation for the largest eigenvalues;
* ``mlp``: a 2-layer MLP trained with SGD, where low precision is good enough;
* ``kmeans``: Lloyd's algorithm with distances ``|x|^2 + |c|^2 - 2 X C^T``, which cancels.

Division of labour, the same in every application: every GEMM-shaped product (matrix times
matrix, or matrix times a block of vectors, including a single ``(n, 1)`` column) goes through
``matmul(A, B)``. Its operands are float32 for fp32-class work and float64 where the algorithm
needs fp64-class accuracy; the callable (an emulated type) decides how to compute the product
and the application converts the result back to the dtype it works in. Everything else (vector
updates, dot products, norms, triangular solves, the small tridiagonal eigenproblem) runs on
the host in float64 numpy, except where an application says otherwise (the MLP and k-means
host work is float32, because those are float32 algorithms). The metrics are computed on the
host, independent of ``matmul``, and smaller is better; a NaN metric is reported as ``inf`` so
that comparisons with the requirement fail instead of silently passing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

__all__ = [
    "APPS",
    "SIZES",
    "Application",
    "CGApp",
    "GemmApp",
    "KMeansApp",
    "LanczosApp",
    "LUIRApp",
    "MLPApp",
    "MatMul",
    "get_app",
    "hpl_scaled_residual",
]

MatMul = Callable[[np.ndarray, np.ndarray], np.ndarray]

SIZES = ("tiny", "small")

_EPS64 = 2.0**-53  # unit roundoff of float64, the eps of the HPL-MxP scaled residual


def _product(matmul: MatMul, a: np.ndarray, b: np.ndarray, dtype) -> np.ndarray:
    """matmul(a, b) with operands of ``dtype``, checked for shape, returned as float64.

    The check turns a wrong-shaped answer from a candidate implementation into a clear error
    here instead of a broadcasting surprise deep inside an algorithm.
    """
    a = np.asarray(a, dtype=dtype)
    b = np.asarray(b, dtype=dtype)
    out = np.asarray(matmul(a, b))
    expected = (a.shape[0], b.shape[1])
    if out.shape != expected:
        raise ValueError(
            f"matmul returned shape {out.shape} for operands {a.shape} @ {b.shape}; "
            f"expected {expected}"
        )
    return out.astype(np.float64)


def _finite_or_inf(value: float) -> float:
    value = float(value)
    return value if np.isfinite(value) else float("inf")


@dataclass
class Application:
    """An application with its own accuracy metric; subclasses fill in the three methods.

    ``make_inputs(rng)`` is deterministic given the generator's state; ``run(inputs, matmul)``
    sends every GEMM-shaped product through ``matmul``; ``metric(inputs, result)`` is smaller
    is better and is met when ``metric <= requirement``.
    """

    name: str
    description: str
    metric_name: str
    requirement: float
    size: str = "small"

    def make_inputs(self, rng: np.random.Generator) -> dict:
        raise NotImplementedError(f"{type(self).__name__} does not implement make_inputs")

    def run(self, inputs: dict, matmul: MatMul) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement run")

    def metric(self, inputs: dict, result: Any) -> float:
        raise NotImplementedError(f"{type(self).__name__} does not implement metric")

    def meets_requirement(self, inputs: dict, result: Any) -> bool:
        return self.metric(inputs, result) <= self.requirement


# --------------------------------------------------------------------------------------------
# 1, 2. A single GEMM


@dataclass
class GemmApp(Application):
    """C = A B in float32 operands, graded by the normwise error against float64.

    ``wide`` draws entries as sign * m * 2^e with e uniform in [-20, 20] and forces a few
    entries above 65504, so a type with fp16's range overflows while bf16/tf32 do not.
    """

    n: int = 256
    wide: bool = False

    def make_inputs(self, rng: np.random.Generator) -> dict:
        def draw() -> np.ndarray:
            if not self.wide:
                return rng.uniform(-1.0, 1.0, (self.n, self.n)).astype(np.float32)
            mant = rng.uniform(1.0, 2.0, (self.n, self.n))
            expo = rng.integers(-20, 21, (self.n, self.n))
            sign = rng.choice([-1.0, 1.0], (self.n, self.n))
            x = sign * np.ldexp(mant, expo)
            # guarantee out-of-fp16-range entries even for tiny n, whatever the draw gave
            idx = rng.choice(x.size, max(2, x.size // 100), replace=False)
            x.flat[idx] = np.sign(x.flat[idx]) * rng.uniform(7e4, 1e6, idx.size)
            return x.astype(np.float32)

        a, b = draw(), draw()
        # products of float32 values are exact in float64 and k * 2^-53 is far below the
        # 1e-6 requirement, so float64 is an adequate reference here (section 6.4)
        return {"a": a, "b": b, "reference": a.astype(np.float64) @ b.astype(np.float64)}

    def run(self, inputs: dict, matmul: MatMul) -> np.ndarray:
        return _product(matmul, inputs["a"], inputs["b"], np.float32)

    def metric(self, inputs: dict, result: np.ndarray) -> float:
        ref = inputs["reference"]
        # a floor tied to the operands (||a|| ||b|| / k) so a vanishing product cannot turn
        # the ratio into a division by zero
        floor = np.linalg.norm(inputs["a"]) * np.linalg.norm(inputs["b"]) / self.n
        err = np.linalg.norm(np.asarray(result, np.float64) - ref) / max(
            np.linalg.norm(ref), floor)
        return _finite_or_inf(err)


# --------------------------------------------------------------------------------------------
# 3. Blocked LU in float32 + iterative refinement in float64 (HPL-MxP)


def hpl_scaled_residual(a: np.ndarray, x: np.ndarray, b: np.ndarray) -> float:
    """HPL-MxP's ||Ax - b||_inf / (||A||_inf ||x||_inf n eps), eps = 2^-53, all on the host."""
    n = a.shape[0]
    r = a @ x - b
    denom = np.linalg.norm(a, np.inf) * np.linalg.norm(x, np.inf) * n * _EPS64
    return _finite_or_inf(np.linalg.norm(r, np.inf) / denom)


@dataclass
class LUIRApp(Application):
    """Solve A x = b as HPL-MxP does: low-precision LU, then refinement to fp64 accuracy.

    The factorisation is blocked and right-looking without pivoting (the matrix is diagonally
    dominant, so no pivoting is needed and the factors stay bounded). Panel factorisation and
    the U12 triangular solve run on the host; the trailing update A22 -= L21 U12, which holds
    almost all the flops, goes through ``matmul`` with float32 operands and is stored in
    float32. Refinement computes r = b - A x through ``matmul`` with float64 operands (the
    residual must be fp64-accurate or the refinement cannot get below float32's error) and
    solves L U d = r on the host in float64 arithmetic with the float32 factor values.
    """

    n: int = 512
    block: int = 64
    max_ir_steps: int = 30
    # refinement stops once the matmul-computed scaled residual is this far below the
    # requirement; the margin covers the difference from the host-computed metric
    ir_target: float = 1.0

    def make_inputs(self, rng: np.random.Generator) -> dict:
        n = self.n
        a = rng.uniform(-1.0, 1.0, (n, n))
        # strict row diagonal dominance (off-diagonal row sums are about n/2) makes LU without
        # pivoting stable and keeps the condition number small
        a[np.diag_indices(n)] = n * rng.uniform(1.0, 2.0, n) * rng.choice([-1.0, 1.0], n)
        b = rng.uniform(-1.0, 1.0, n)
        return {"a": a, "b": b}

    def _factor(self, a: np.ndarray, matmul: MatMul) -> np.ndarray:
        n, nb = self.n, self.block
        lu = a.astype(np.float32)
        for k0 in range(0, n, nb):
            k1 = min(k0 + nb, n)
            # unblocked LU of the panel (level-2 work, host float64, stored as float32)
            panel = lu[k0:, k0:k1].astype(np.float64)
            for j in range(k1 - k0):
                pivot = panel[j, j]
                if pivot == 0.0 or not np.isfinite(pivot):
                    raise FloatingPointError(f"zero or non-finite pivot at column {k0 + j}")
                panel[j + 1 :, j] /= pivot
                panel[j + 1 :, j + 1 :] -= np.outer(panel[j + 1 :, j], panel[j, j + 1 :])
            lu[k0:, k0:k1] = panel
            if k1 == n:
                break
            l11 = lu[k0:k1, k0:k1].astype(np.float64)
            u12 = scipy.linalg.solve_triangular(
                l11, lu[k0:k1, k1:].astype(np.float64), lower=True, unit_diagonal=True
            )
            lu[k0:k1, k1:] = u12
            update = _product(matmul, lu[k1:, k0:k1], lu[k0:k1, k1:], np.float32)
            lu[k1:, k1:] = lu[k1:, k1:].astype(np.float64) - update
        return lu

    @staticmethod
    def _solve(lu: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        lu64 = lu.astype(np.float64)
        y = scipy.linalg.solve_triangular(lu64, rhs, lower=True, unit_diagonal=True)
        return scipy.linalg.solve_triangular(lu64, y, lower=False)

    def run(self, inputs: dict, matmul: MatMul) -> dict:
        a, b = inputs["a"], inputs["b"]
        n = self.n
        norm_a = np.linalg.norm(a, np.inf)
        try:
            lu = self._factor(a, matmul)
        except FloatingPointError:
            # a candidate type broke the factorisation: report failure, not an exception
            return {"x": np.full(n, np.nan), "ir_steps": 0, "scaled_residuals": []}
        x = self._solve(lu, b)
        history = []
        steps = 0
        while True:
            r = b - _product(matmul, a, x[:, None], np.float64)[:, 0]
            scaled = np.linalg.norm(r, np.inf) / (norm_a * np.linalg.norm(x, np.inf) * n * _EPS64)
            history.append(float(scaled))
            if not np.isfinite(scaled) or scaled <= self.ir_target or steps >= self.max_ir_steps:
                break
            x = x + self._solve(lu, r)
            steps += 1
        return {"x": x, "ir_steps": steps, "scaled_residuals": history}

    def metric(self, inputs: dict, result: dict) -> float:
        return hpl_scaled_residual(inputs["a"], result["x"], inputs["b"])


# --------------------------------------------------------------------------------------------
# 4. Conjugate gradient on a dense SPD matrix


def _random_orthogonal(rng: np.random.Generator, n: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    # fixing the signs of R's diagonal makes Q Haar-distributed and the result unique
    return q * np.sign(np.diag(r))


@dataclass
class CGApp(Application):
    """Conjugate gradient for A X = B with several right-hand sides at once.

    A = Q diag(lambda) Q^T with lambda log-spaced in [1, kappa], so the condition number is
    exactly kappa by construction. The RHS columns run independent CG recurrences (each its own
    alpha and beta), but A P is one GEMM with an (n, nrhs) block, in float64. A column stops
    once its recursive residual is below ``freeze`` (further steps would only divide by
    rounding noise). The metric is the *true* residual max_j ||b_j - A x_j|| / ||b_j||,
    computed on the host, after at most ``iterations`` steps.
    """

    n: int = 512
    nrhs: int = 8
    kappa: float = 1e3
    iterations: int = 400
    freeze: float = 1e-14

    def make_inputs(self, rng: np.random.Generator) -> dict:
        q = _random_orthogonal(rng, self.n)
        lam = np.logspace(0.0, np.log10(self.kappa), self.n)
        a = (q * lam) @ q.T
        a = 0.5 * (a + a.T)  # exactly symmetric despite rounding in the product
        b = rng.standard_normal((self.n, self.nrhs))
        return {"a": a, "b": b}

    def run(self, inputs: dict, matmul: MatMul) -> dict:
        a, b = inputs["a"], inputs["b"]
        x = np.zeros_like(b)
        r = b.copy()
        p = r.copy()
        rr = np.sum(r * r, axis=0)
        stop = (self.freeze**2) * np.sum(b * b, axis=0)
        active = rr > stop
        steps = 0
        for _ in range(self.iterations):
            if not active.any():
                break
            ap = _product(matmul, a, p, np.float64)
            pap = np.sum(p * ap, axis=0)
            # a non-positive curvature can only come from a broken product: freeze the column
            active &= pap > 0
            alpha = np.divide(rr, pap, out=np.zeros_like(rr), where=active)
            x += alpha * p
            r -= alpha * ap
            rr_new = np.sum(r * r, axis=0)
            beta = np.divide(rr_new, rr, out=np.zeros_like(rr), where=active)
            p = np.where(active, r + beta * p, p)
            rr = np.where(active, rr_new, rr)
            active &= rr > stop
            steps += 1
        return {"x": x, "iterations": steps}

    def metric(self, inputs: dict, result: dict) -> float:
        a, b = inputs["a"], inputs["b"]
        res = np.linalg.norm(b - a @ result["x"], axis=0) / np.linalg.norm(b, axis=0)
        return _finite_or_inf(np.max(res))


# --------------------------------------------------------------------------------------------
# 5. Lanczos with full reorthogonalisation


@dataclass
class LanczosApp(Application):
    """The ``nev`` largest eigenvalues of a symmetric matrix with known spectrum.

    A = Q diag(lambda) Q^T with the top ``nev`` eigenvalues 10, 9, ..., well separated from
    the rest (uniform in [-5, 5]), so ``steps`` Lanczos steps converge them far below 1e-10
    in exact arithmetic. A q_j, the projection h = Q_j^T w and the correction Q_j h all go
    through ``matmul`` with float64 operands; classical Gram-Schmidt is applied twice ("twice
    is enough") so that orthogonality is kept to working accuracy. alpha_j, beta_j and the
    tridiagonal eigenproblem are host float64.
    """

    n: int = 400
    nev: int = 5
    steps: int = 80

    def make_inputs(self, rng: np.random.Generator) -> dict:
        n, k = self.n, self.nev
        lam = np.concatenate([10.0 - np.arange(k), rng.uniform(-5.0, 5.0, n - k)])
        q = _random_orthogonal(rng, n)
        a = (q * lam) @ q.T
        a = 0.5 * (a + a.T)
        start = rng.standard_normal(n)
        return {"a": a, "start": start / np.linalg.norm(start), "eigenvalues": lam}

    def run(self, inputs: dict, matmul: MatMul) -> dict:
        a = inputs["a"]
        n = self.n
        m = min(self.steps, n)
        basis = np.zeros((m + 1, n))  # rows are the Lanczos vectors q_0 .. q_m
        basis[0] = inputs["start"]
        alphas: list[float] = []
        betas: list[float] = []
        for j in range(m):
            w = _product(matmul, a, basis[j][:, None], np.float64)[:, 0]
            alphas.append(float(basis[j] @ w))
            w -= alphas[-1] * basis[j]
            if j > 0:
                w -= betas[-1] * basis[j - 1]
            qj = basis[: j + 1]
            for _ in range(2):
                h = _product(matmul, qj, w[:, None], np.float64)
                w -= _product(matmul, np.ascontiguousarray(qj.T), h, np.float64)[:, 0]
            beta = float(np.linalg.norm(w))
            if not np.isfinite(beta) or beta <= 1e-300:
                break  # invariant subspace (or a broken product): T is complete
            betas.append(beta)
            basis[j + 1] = w / beta
        k = len(alphas)
        diag, offdiag = np.array(alphas), np.array(betas[: k - 1])
        if np.all(np.isfinite(diag)) and np.all(np.isfinite(offdiag)):
            ritz = scipy.linalg.eigvalsh_tridiagonal(diag, offdiag)
        else:  # a broken product poisoned T; report NaN so that the metric is inf
            ritz = np.full(k, np.nan)
        q_used = basis[:k]
        orth = np.linalg.norm(q_used @ q_used.T - np.eye(k))
        return {"eigenvalues": np.sort(ritz)[::-1][: self.nev], "steps": k, "orthogonality": orth}

    def metric(self, inputs: dict, result: dict) -> float:
        ref = np.sort(inputs["eigenvalues"])[::-1][: self.nev]
        got = np.asarray(result["eigenvalues"], np.float64)
        if got.shape != ref.shape:
            return float("inf")
        # relative to each eigenvalue, floored at eps times the spectrum's scale
        scale = np.finfo(np.float64).eps * np.max(np.abs(inputs["eigenvalues"]))
        return _finite_or_inf(np.max(np.abs(got - ref) / np.maximum(np.abs(ref), scale)))


# --------------------------------------------------------------------------------------------
# 6. Two-layer MLP training


@dataclass
class MLPApp(Application):
    """Full-batch SGD on a 2-layer tanh MLP fitting a noisy random teacher network.

    All arithmetic is float32, as in ordinary training. The five GEMMs of a step (forward
    X W1 and H W2; backward H^T dY, dY W2^T and X^T dH) go through ``matmul``; biases,
    activations and the SGD update are host float32. The metric compares the final training
    loss (evaluated on the host with plain float32 numpy, so that only the training, not the
    evaluation, depends on ``matmul``) with the same run using numpy's float32 matmul, which
    ``make_inputs`` computes once and stores as ``reference_loss``.
    """

    samples: int = 1024
    features: int = 32
    hidden: int = 64
    outputs: int = 4
    steps: int = 200
    lr: float = 0.1
    noise: float = 0.1

    def make_inputs(self, rng: np.random.Generator) -> dict:
        d, h, o = self.features, self.hidden, self.outputs
        x = rng.standard_normal((self.samples, d))
        t1 = rng.standard_normal((d, h)) / np.sqrt(d)
        t2 = rng.standard_normal((h, o)) / np.sqrt(h)
        y = np.tanh(x @ t1) @ t2 + self.noise * rng.standard_normal((self.samples, o))
        inputs = {
            "x": x.astype(np.float32),
            "y": y.astype(np.float32),
            "w1": (rng.standard_normal((d, h)) / np.sqrt(d)).astype(np.float32),
            "b1": np.zeros(h, np.float32),
            "w2": (rng.standard_normal((h, o)) / np.sqrt(h)).astype(np.float32),
            "b2": np.zeros(o, np.float32),
        }
        ref = self.run(inputs, lambda p, q: np.matmul(p, q))
        inputs["reference_loss"] = self._loss(inputs, ref)
        return inputs

    def run(self, inputs: dict, matmul: MatMul) -> dict:
        f32 = np.float32

        def mm(p: np.ndarray, q: np.ndarray) -> np.ndarray:
            return _product(matmul, p, q, f32).astype(f32)

        x, y = inputs["x"], inputs["y"]
        w1, b1 = inputs["w1"].copy(), inputs["b1"].copy()
        w2, b2 = inputs["w2"].copy(), inputs["b2"].copy()
        lr = f32(self.lr)
        scale = f32(1.0 / y.size)  # loss = 0.5 * mean of squared errors over all entries
        for _ in range(self.steps):
            hid = np.tanh(mm(x, w1) + b1)
            err = (mm(hid, w2) + b2 - y) * scale
            grad_w2 = mm(hid.T, err)
            grad_hid = mm(err, w2.T) * (f32(1.0) - hid * hid)
            grad_w1 = mm(x.T, grad_hid)
            w2 -= lr * grad_w2
            b2 -= lr * err.sum(axis=0)
            w1 -= lr * grad_w1
            b1 -= lr * grad_hid.sum(axis=0)
        return {"w1": w1, "b1": b1, "w2": w2, "b2": b2}

    @staticmethod
    def _loss(inputs: dict, weights: dict) -> float:
        hid = np.tanh(inputs["x"] @ weights["w1"] + weights["b1"])
        diff = hid @ weights["w2"] + weights["b2"] - inputs["y"]
        return float(0.5 * np.mean(diff * diff, dtype=np.float64))

    def metric(self, inputs: dict, result: dict) -> float:
        ref = inputs["reference_loss"]
        return _finite_or_inf(abs(self._loss(inputs, result) - ref) / ref)


# --------------------------------------------------------------------------------------------
# 7. k-means with distances through a GEMM


@dataclass
class KMeansApp(Application):
    """Lloyd's k-means where squared distances are |x|^2 + |c|^2 - 2 X C^T, in float32.

    The points sit about ``offset`` away from the origin in every coordinate, so |x|^2 and
    X C^T are ~1e7 while the distance differences that decide an assignment are ~1e2: the
    cross term must be accurate to a few float32 ulps. X C^T goes through ``matmul`` with
    float32 operands; norms, the combination, argmin and centroid updates are host float32.
    The metric is the fraction of final assignments that differ from the same algorithm
    (same initial centroids) with direct, non-cancelling float64 distances, which
    ``make_inputs`` computes and stores as ``reference_labels``.
    """

    points: int = 4000
    dims: int = 16
    k: int = 8
    iterations: int = 10
    offset: float = 1000.0
    spread: float = 4.0

    def make_inputs(self, rng: np.random.Generator) -> dict:
        centres = self.offset + self.spread * rng.standard_normal((self.k, self.dims))
        member = rng.integers(0, self.k, self.points)
        x = centres[member] + rng.standard_normal((self.points, self.dims))
        # farthest-point initialisation (host float64, direct distances): with random initial
        # points two seeds often land in one cluster, whose split then runs through dense
        # data where float32 rounding alone flips assignments; the metric should measure the
        # cancellation in the GEMM, not that ill-posedness
        init = [int(rng.integers(self.points))]
        nearest = np.sum((x - x[init[0]]) ** 2, axis=1)
        for _ in range(self.k - 1):
            init.append(int(np.argmax(nearest)))
            nearest = np.minimum(nearest, np.sum((x - x[init[-1]]) ** 2, axis=1))
        inputs = {"x": x.astype(np.float32), "init": np.array(init)}
        inputs["reference_labels"] = self._reference(inputs)
        return inputs

    def _reference(self, inputs: dict) -> np.ndarray:
        x = inputs["x"].astype(np.float64)
        c = x[inputs["init"]]
        labels = np.zeros(len(x), dtype=np.int64)
        for _ in range(self.iterations):
            labels = np.argmin(((x[:, None, :] - c[None, :, :]) ** 2).sum(axis=2), axis=1)
            c = self._update(x, labels, c)
        return labels

    def _update(self, x: np.ndarray, labels: np.ndarray, c: np.ndarray) -> np.ndarray:
        new = c.copy()
        for j in range(self.k):
            members = x[labels == j]
            if len(members):  # an empty cluster keeps its centroid
                new[j] = members.mean(axis=0, dtype=np.float64).astype(x.dtype)
        return new

    def run(self, inputs: dict, matmul: MatMul) -> dict:
        x = inputs["x"]
        c = x[inputs["init"]].copy()
        xx = (x * x).sum(axis=1, dtype=np.float32)[:, None]
        labels = np.zeros(len(x), dtype=np.int64)
        for _ in range(self.iterations):
            cross = _product(matmul, x, np.ascontiguousarray(c.T), np.float32).astype(np.float32)
            cc = (c * c).sum(axis=1, dtype=np.float32)[None, :]
            dist = xx + cc - np.float32(2.0) * cross
            labels = np.argmin(np.where(np.isnan(dist), np.inf, dist), axis=1)
            c = self._update(x, labels, c)
        return {"labels": labels, "centroids": c}

    def metric(self, inputs: dict, result: dict) -> float:
        return float(np.mean(np.asarray(result["labels"]) != inputs["reference_labels"]))


# --------------------------------------------------------------------------------------------
# Registry

_SIZE_PARAMS: dict[str, dict[str, dict]] = {
    "gemm-narrow": {"tiny": {"n": 32}, "small": {"n": 256}},
    "gemm-wide": {"tiny": {"n": 32}, "small": {"n": 256}},
    "lu-ir": {"tiny": {"n": 64, "block": 16}, "small": {"n": 512, "block": 64}},
    "cg": {"tiny": {"n": 64, "iterations": 200}, "small": {"n": 512, "iterations": 400}},
    "lanczos": {"tiny": {"n": 80, "steps": 50}, "small": {"n": 400, "steps": 80}},
    "mlp": {
        "tiny": {"samples": 128, "features": 8, "hidden": 16, "outputs": 2},
        "small": {"samples": 1024, "features": 32, "hidden": 64, "outputs": 4},
    },
    "kmeans": {"tiny": {"points": 400}, "small": {"points": 4000}},
}


def _build(name: str, size: str) -> Application:
    try:
        params = _SIZE_PARAMS[name][size]
    except KeyError:
        if name not in _SIZE_PARAMS:
            raise ValueError(
                f"unknown application {name!r}; known: {sorted(_SIZE_PARAMS)}"
            ) from None
        raise ValueError(f"unknown size {size!r}; known: {list(SIZES)}") from None
    if name == "gemm-narrow":
        return GemmApp(
            name,
            "C = A B, A and B uniform in [-1, 1]",
            "normwise relative error",
            1e-6,
            size,
            wide=False,
            **params,
        )
    if name == "gemm-wide":
        return GemmApp(
            name,
            "C = A B, entries 2^-20..2^20 and some above fp16's 65504",
            "normwise relative error",
            1e-6,
            size,
            wide=True,
            **params,
        )
    if name == "lu-ir":
        return LUIRApp(
            name,
            "float32 blocked LU (no pivoting) + float64-residual iterative refinement",
            "HPL scaled residual",
            16.0,
            size,
            **params,
        )
    if name == "cg":
        return CGApp(
            name,
            "block CG on a dense SPD matrix, kappa = 1e3, 8 right-hand sides",
            "true relative residual",
            1e-10,
            size,
            **params,
        )
    if name == "lanczos":
        return LanczosApp(
            name,
            "Lanczos with full reorthogonalisation, 5 largest eigenvalues",
            "relative eigenvalue error",
            1e-10,
            size,
            **params,
        )
    if name == "mlp":
        return MLPApp(
            name,
            "2-layer tanh MLP, 200 full-batch SGD steps on a noisy teacher",
            "relative final-loss difference from float32",
            0.01,
            size,
            **params,
        )
    return KMeansApp(
        name,
        "Lloyd k-means, k = 8, 10 iterations, distances via |x|^2 + |c|^2 - 2 X C^T",
        "fraction of assignments differing from float64",
        1e-3,
        size,
        **params,
    )


def get_app(name: str, size: str = "small") -> Application:
    """A fresh application object: ``size`` is "tiny" (tests) or "small" (demos)."""
    return _build(name, size)


APPS: dict[str, Application] = {name: _build(name, "small") for name in _SIZE_PARAMS}
