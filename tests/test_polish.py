"""The polish's face solve: Cholesky path, SVD path and the factor/operator formulation agree on every namespace."""

from __future__ import annotations

import numpy as np
import pytest

import polyproj as pp
from polyproj.hs_jacobian import expand_rows, project_on_face
from polyproj.polish import face_solve, factor_face, polish


def _face_data(rng, batch=6, n=8, m=12, p=1):
    A = rng.normal(size=(m, n))
    x0 = rng.uniform(-0.5, 0.5, size=n)
    a = A @ x0 + rng.uniform(0.1, 1.0, size=m)
    a[1] = np.inf  # an ignored row
    B = rng.normal(size=(p, n))
    b = B @ x0
    lb, ub = -np.ones(n), np.ones(n)
    lb[2] = -np.inf
    X = 2.0 * rng.normal(size=(batch, n))
    S = np.zeros((batch, m + 2 * n), dtype=bool)
    S[:, :m] = rng.random((batch, m)) < 0.3
    S[:, 1] = False
    S[:, m:] = rng.random((batch, 2 * n)) < 0.15
    S[:, m + 2] = False
    S[0, :m] = False  # only bounds and B
    S[1, m:] = False  # no bound active
    S[2, 0] = S[2, 3] = True
    A[3] = A[0]  # duplicated row active in sample 2: LICQ fails, the SVD fallback takes over
    a[3] = a[0]
    return X, A, a, B, b, lb, ub, S


def _reference(X, A, a, B, b, lb, ub, S):
    """The factor + operator formulation (factor_face, project_on_face) the face solve replaces."""
    n, m = X.shape[1], A.shape[0]
    at_ub = S[:, m + n:].astype(float)
    at_lb = S[:, m: m + n] * (1.0 - at_ub)
    fixed = at_lb + at_ub
    fixed_val = np.where(at_ub > 0, np.where(np.isfinite(ub), ub, 0.0), np.where(np.isfinite(lb), lb, 0.0))
    F = factor_face(A, B, S[:, :m], 1.0 - fixed)
    Y, lam_c, cons = project_on_face(F, X, np.where(np.isfinite(a), a, 0.0), b, fixed_val, fixed)
    lamA, mu = expand_rows(F, lam_c)
    z_box = (X - Y - np.sum(F.rows * lam_c[:, :, None], axis=1)) * fixed
    return Y, np.concatenate([lamA, -z_box * at_lb, z_box * at_ub], axis=1), mu, np.max(np.abs(cons), axis=1)


@pytest.mark.core
def test_face_solve_matches_the_factor_formulation_and_the_svd(rng):
    data = _face_data(rng)
    ref = _reference(*data)
    for method in ("auto", "svd"):
        out = face_solve(*data, method=method)
        for o, r in zip(out, ref, strict=True):
            np.testing.assert_allclose(o, r, atol=1e-10)
    # stationarity on the face: Y − X + Aᵀλ_A − λ_lb + λ_ub + Bᵀμ = 0
    X, A, _, B, _, _, _, _ = data
    Y, mult, mu, _ = face_solve(*data)
    m, n = A.shape[0], X.shape[1]
    r = Y - X + mult[:, :m] @ A - mult[:, m: m + n] + mult[:, m + n:] + mu @ B
    assert np.max(np.abs(r)) < 1e-10


@pytest.mark.core
def test_face_solve_with_empty_face(rng):
    X, A, a, B, b, lb, ub, S = _face_data(rng, p=0)
    B, b = np.zeros((0, X.shape[1])), np.zeros(0)
    S[:] = False
    Y, mult, mu, cons = face_solve(X, A, a, B, b, lb, ub, S)
    np.testing.assert_array_equal(Y, X)
    assert mu.shape == (X.shape[0], 0) and not mult.any() and not cons.any()


def _polish_args(rng):
    X, A, a, B, b, lb, ub, _ = _face_data(rng, batch=10)
    y = pp.project(X, pp.Polyhedron(A=A, a=a, B=B, b=b, lb=lb, ub=ub)).y
    Y0 = y + 1e-3 * rng.normal(size=y.shape)  # a rough start: some samples need a second face
    mult0 = np.zeros((X.shape[0], A.shape[0] + 2 * X.shape[1]))
    return (X, A, a, B, b, lb, ub, Y0, mult0), dict(cand_tol=1e-7, dist_tol=1e-2, tol=1e-9, max_iter=50), y


@pytest.mark.parametrize("namespace", ["torch", "array_api_strict"])
def test_polish_agrees_across_namespaces(rng, namespace):
    args, kw, y = _polish_args(rng)
    ref = polish(*args, **kw)
    assert ref[4].all()
    np.testing.assert_allclose(ref[0], y, atol=1e-10)
    if namespace == "torch":
        torch = pytest.importorskip("torch")
        conv, back = torch.from_numpy, (lambda t: t.numpy())
    else:
        xps = pytest.importorskip("array_api_strict")
        conv, back = xps.asarray, np.asarray
    out = polish(*[conv(np.ascontiguousarray(v)) for v in args], **kw)
    for o, r in zip(out, ref, strict=True):
        o = back(o)
        if r.dtype == bool:
            np.testing.assert_array_equal(o, r)
        else:
            np.testing.assert_allclose(o, r, atol=1e-9)


def test_inconsistent_candidate_face_does_not_cycle():
    """Near-active rows taken as candidates on top of a vertex make the face inconsistent: the polish
    drops the candidate least supported by the backend instead of cycling (drop a truly active
    row on its least-squares slack, re-add it as violated, ...)."""
    rng = np.random.default_rng(3)
    n, m = 10, 40
    A = rng.normal(size=(m, n))
    a = A @ rng.normal(size=n) + rng.uniform(0.05, 1.0, size=m)
    B, b = rng.normal(size=(1, n)), np.zeros(1)
    b[:] = B @ np.linalg.lstsq(A, a - 1.0, rcond=None)[0]
    P = pp.Polyhedron(A=A, a=a, B=B, b=b)
    X = 20.0 * rng.normal(size=(64, n))
    ref = pp.project(X, P, eps_abs=1e-10)
    act = np.asarray(ref.active)
    slack = a - ref.y @ A.T
    vertex = act.sum(1) + 1 >= n
    assert vertex.sum() >= 5  # far points land on vertices of the polytope
    # start at the exact answer, multipliers unknown, with a distance threshold that also takes the
    # nearest inactive rows: an over-determined (inconsistent) candidate face for those samples
    near = np.where(act, np.inf, slack / np.linalg.norm(A, axis=1)).min(1)
    ynorm = np.abs(ref.y).max(1)
    dist_tol = float(np.quantile((near / (1.0 + ynorm))[vertex], 0.5)) * 1.01
    lb, ub = np.full(n, -np.inf), np.full(n, np.inf)
    Y, active, _mult, _mu, accepted = polish(X, A, a, B, b, lb, ub, ref.y.copy(), np.zeros((64, m + 2 * n)),
                                           cand_tol=1e-2, dist_tol=dist_tol, tol=1e-9, max_iter=8)
    assert accepted.all()
    np.testing.assert_allclose(Y, ref.y, atol=1e-9)
    np.testing.assert_array_equal(active[:, :m], act)
