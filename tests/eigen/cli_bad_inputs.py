"""Bad inputs of `furnace eigen solve` (the pEVSL-style solver's CLI; Shi et al., SC'18): each
must exit 2 with one line on stderr naming the argument, before any solve starts.

`BAD_INPUTS` is read by the central CLI-contract test; the small broken Matrix Market files
are in tests/eigen/data/ (absolute paths from this file, so the cases run from any folder).
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
A_OK = str(DATA / "a_ok.mtx")


def _solve(*argv: str) -> list[str]:
    return ["eigen", "solve", *argv]


def _matrix(name: str) -> list[str]:
    return _solve(str(DATA / name), "--interval", "0", "1")


def _mass(name: str) -> list[str]:
    return _solve(A_OK, "--mass", str(DATA / name), "--interval", "0", "1")


def _flag(*flag: str) -> list[str]:
    return _solve(A_OK, "--interval", "0", "1", *flag)


BAD_INPUTS: list[tuple[str, list[str]]] = [
    # A: missing, a folder, not Matrix Market, entries the solver cannot take
    ("eigen-solve-matrix-missing", _matrix("missing.mtx")),
    ("eigen-solve-matrix-is-a-folder", _solve(str(DATA), "--interval", "0", "1")),
    ("eigen-solve-matrix-not-matrix-market", _matrix("a_garbage.mtx")),
    ("eigen-solve-matrix-nan", _matrix("a_nan.mtx")),
    ("eigen-solve-matrix-inf", _matrix("a_inf.mtx")),
    ("eigen-solve-matrix-complex", _matrix("a_complex.mtx")),
    ("eigen-solve-matrix-not-symmetric", _matrix("a_nonsymmetric.mtx")),
    ("eigen-solve-matrix-not-square", _matrix("a_nonsquare.mtx")),
    # M: missing, the wrong shape, not symmetric, not positive definite
    ("eigen-solve-mass-missing", _mass("missing.mtx")),
    ("eigen-solve-mass-not-matrix-market", _mass("a_garbage.mtx")),
    ("eigen-solve-mass-shape", _mass("m_shape.mtx")),
    ("eigen-solve-mass-nan", _mass("a_nan.mtx")),
    ("eigen-solve-mass-not-symmetric", _mass("m_nonsymmetric.mtx")),
    ("eigen-solve-mass-zero-diagonal", _mass("m_zero_diag.mtx")),
    ("eigen-solve-mass-negative-diagonal", _mass("m_negative_diag.mtx")),
    ("eigen-solve-mass-nan-diagonal", _mass("m_nan_diag.mtx")),
    ("eigen-solve-mass-indefinite", _mass("m_indefinite.mtx")),
    ("eigen-solve-mass-singular", _mass("m_singular.mtx")),
    ("eigen-solve-mass-lumped-negative-row-sums", [*_mass("m_negative_rows.mtx"), "--lumped"]),
    # --interval
    ("eigen-solve-interval-reversed", _solve(A_OK, "--interval", "2", "1")),
    ("eigen-solve-interval-empty", _solve(A_OK, "--interval", "1", "1")),
    ("eigen-solve-interval-infinite", _solve(A_OK, "--interval", "0", "inf")),
    ("eigen-solve-interval-minus-infinite", _solve(A_OK, "--interval", "-inf", "1")),
    ("eigen-solve-interval-nan", _solve(A_OK, "--interval", "nan", "1")),
    ("eigen-solve-interval-not-a-number", _solve(A_OK, "--interval", "zero", "1")),
    ("eigen-solve-interval-one-end", _solve(A_OK, "--interval", "1")),
    # every other numeric flag and the choices
    ("eigen-solve-slices-0", _flag("--slices", "0")),
    ("eigen-solve-slices-negative", _flag("--slices", "-2")),
    ("eigen-solve-slices-not-an-integer", _flag("--slices", "1.5")),
    ("eigen-solve-tol-0", _flag("--tol", "0")),
    ("eigen-solve-tol-negative", _flag("--tol", "-1e-10")),
    ("eigen-solve-tol-1", _flag("--tol", "1")),
    ("eigen-solve-tol-nan", _flag("--tol", "nan")),
    ("eigen-solve-threads-0", _flag("--threads", "0")),
    ("eigen-solve-group-size-0", _flag("--mode", "groups", "--group-size", "0")),
    ("eigen-solve-group-size-not-dividing", _flag("--mode", "groups", "--group-size", "2")),
    ("eigen-solve-group-size-without-groups", _flag("--group-size", "2")),
    ("eigen-solve-mode-groups-without-size", _flag("--mode", "groups")),
    ("eigen-solve-mode-unknown", _flag("--mode", "diagonal")),
    ("eigen-solve-count-check-unknown", _flag("--count-check", "guess")),
    ("eigen-solve-max-lanczos-steps-0", _flag("--max-lanczos-steps", "0")),
    ("eigen-solve-max-restarts-negative", _flag("--max-restarts", "-1")),
    # --json: checked before the solve, not after it
    ("eigen-solve-json-missing-folder", _flag("--json", str(DATA / "no-such-folder" / "o.json"))),
    ("eigen-solve-json-is-a-folder", _flag("--json", str(DATA))),
]
