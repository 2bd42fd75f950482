"""Probe of session 53: the HS-Jacobian (QR / Cholesky / SVD faces) and the ``backend="auto"`` thin rule.

References are float64: the orthogonal projector onto the null space of the active rows from scipy's
``null_space`` (an SVD; rank tolerance ``max(k, n) eps σ_max``) of the normalised active rows on the free
coordinates, and an independent KKT check of each projection (non-negative least squares for the multipliers).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.linalg
import scipy.optimize

import polyproj as pp
from polyproj.polydata import RowLayout
from polyproj.projection.faces import Face, gram_cholesky


def reference_J(P: pp.Polyhedron, active: np.ndarray) -> np.ndarray:
    """J of one sample's compact mask: the null-space projector of the active rows on the free coordinates."""
    n, m = P.n, P.m_ineq
    full = RowLayout.of(P).to_full(active[None, :], fill=False)[0]
    fixed = full[m: m + n] | full[m + n:]
    rows = np.vstack([P.A_dense[full[:m]], P.B_dense])[:, ~fixed]
    big = np.abs(rows).max(axis=1, initial=0.0) if rows.size else np.zeros(rows.shape[0])
    rows = rows[big > 0] / big[big > 0, None]  # scaled by hand: no overflow of the squares at 1e160
    free = np.flatnonzero(~fixed)
    J = np.zeros((n, n))
    if rows.shape[0]:
        rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        N = scipy.linalg.null_space(rows)
    else:
        N = np.eye(free.size)
    J[np.ix_(free, free)] = N @ N.T
    return J


def kahan_rows(k: int, s: float, extra: int, seed: int) -> np.ndarray:
    """k unit rows in dimension k + extra (Kahan's matrix, rotated): QR / Cholesky pivots >= s^(k-1), λ_min tiny."""
    c = np.sqrt(1.0 - s * s)
    R = np.diag(s ** np.arange(k)) @ (np.triu(-c * np.ones((k, k)), 1) + np.eye(k))
    M = np.zeros((k, k + extra))
    M[:, :k] = R.T
    Q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(k + extra, k + extra)))
    return M @ Q


def kkt_residual(P: pp.Polyhedron, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(relative violation, relative stationarity residual) of y as the projection of x (multipliers by NNLS)."""
    A, a, lb, ub = P.A_dense, P.a, P.lb, P.ub
    n = x.size
    terms = np.abs(A) @ np.abs(y) + np.abs(a)
    size = np.abs(y).max() + np.abs(x).max()  # a bound's rounding is that of the point's scale (a vertex's y_i ~ 0)
    viol = max(0.0, float(np.max((A @ y - a) / terms)), float(np.max((lb - y) / size)), float(np.max((y - ub) / size)))
    act = A @ y - a >= -1e-9 * terms
    at_lb = np.isfinite(lb) & (y - lb <= 1e-9 * size)
    at_ub = np.isfinite(ub) & (ub - y <= 1e-9 * size)
    M = np.hstack([A[act].T, -np.eye(n)[:, at_lb], np.eye(n)[:, at_ub]])
    if M.shape[1] == 0:
        res = float(np.linalg.norm(x - y))
    else:
        res = scipy.optimize.nnls(M / np.linalg.norm(M, axis=0), x - y, maxiter=20 * M.shape[1])[1]
    return viol, res / (np.linalg.norm(x) + np.linalg.norm(y) + 1e-300)


# ----------------------------------------------------------------------------- the HS-Jacobian
@pytest.mark.parametrize("scale", [1e-90, 1.0, 1e100, 1e160, 1e200])
def test_rows_whose_squares_overflow_stay_in_the_face(scale):
    """A row [1e160, 1e160, 0] had norm inf (its squares overflow), read as a zero row: J = I, the row dropped."""
    P = pp.Polyhedron(A=np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]) * scale, a=np.zeros(2))
    act = np.array([True, False])
    expected = np.array([[0.5, -0.5, 0.0], [-0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    np.testing.assert_allclose(pp.hs_jacobian(P, act), expected, rtol=0, atol=1e-15)
    np.testing.assert_allclose(pp.hs_vjp(P, act, np.array([1.0, 0.0, 0.0])), [0.5, -0.5, 0.0], rtol=0, atol=1e-15)
    face = Face.factor(P.A_dense, np.zeros((0, 3)), act[None, :], np.ones((1, 3)))
    np.testing.assert_allclose(face.null_apply(np.array([[1.0, 0.0, 0.0]])), [[0.5, -0.5, 0.0]], rtol=0, atol=1e-15)
    res = pp.project(np.array([1.0, 2.0, 3.0]), P)
    assert res.status is pp.Status.SOLVED
    np.testing.assert_allclose(res.y, [-0.5, 0.5, 0.0], rtol=0, atol=1e-15)


def test_torch_backward_with_rows_whose_squares_overflow():
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    A = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64) * 1e160
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64, requires_grad=True)
    a = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    y = project(x, A, a)
    y[0, 0].backward()
    np.testing.assert_allclose(y.detach().numpy(), [[-0.5, 0.5, 0.0]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(x.grad.numpy(), [[0.5, -0.5, 0.0]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(a.grad.numpy() * 1e160, [0.5, 0.0], rtol=1e-14)  # dy0/da0 = 1 / (2 · 1e160)


@pytest.mark.parametrize(("k", "s", "seed"), [(12, 0.45, 0), (25, 0.68, 0), (40, 0.795, 0)])
def test_cholesky_face_with_large_pivots_but_tiny_eigenvalue_takes_the_svd(k, s, seed):
    """Kahan's rows: every Cholesky pivot of G above eps^(1/4), λ_min(G) 1e-14 .. 1e-24; J v was off by 4e-3 .. 0.4."""
    M = kahan_rows(k, s, 3, seed=seed)
    n = M.shape[1]
    act, free = np.ones((1, k), dtype=bool), np.ones((1, n))
    face = Face.factor(M, np.zeros((0, n)), act, free)
    assert not bool(face.ok[0])
    sigma_min = np.linalg.svd(M, compute_uv=False)[-1]
    P = pp.Polyhedron(A=M, a=np.zeros(k))
    J = reference_J(P, np.ones(k, dtype=bool))
    g = np.random.default_rng(k).normal(size=(1, n))
    tol = 100 * np.finfo(float).eps / sigma_min  # the SVD's own accuracy on these rows
    np.testing.assert_allclose(face.null_apply(g), g @ J, rtol=0, atol=tol)
    np.testing.assert_allclose(pp.hs_vjp(P, act, g), g @ J, rtol=0, atol=tol)


def test_torch_and_array_api_faces_refuse_kahan_rows_quietly():
    """The same test on torch and array_api_strict rows (the estimate's start vector is converted without a warning)."""
    M = kahan_rows(12, 0.45, 3, seed=0)
    n = M.shape[1]
    J = reference_J(pp.Polyhedron(A=M, a=np.zeros(12)), np.ones(12, dtype=bool))
    g = np.random.default_rng(1).normal(size=(1, n))
    for name in ("torch", "array_api_strict"):
        mod = pytest.importorskip(name)

        def conv(v, mod=mod):
            return mod.asarray(np.ascontiguousarray(v))

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            face = Face.factor(conv(M), conv(np.zeros((0, n))), conv(np.ones((1, 12), bool)), conv(np.ones((1, n))))
            out = np.asarray(face.null_apply(conv(g)))
        assert not bool(face.ok[0])
        np.testing.assert_allclose(out, g @ J, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("angle", "accepted"), [(1e-1, True), (2e-4, True), (1e-4, False), (1e-9, False)])
def test_two_rows_at_an_angle_keep_the_pivot_rule(angle, accepted):
    """For two unit rows λ_min(G) = 1 − cos θ ≈ θ²/2: the eigenvalue test refuses what the pivot test refuses."""
    A = np.array([[1.0, 0.0, 0.0], [np.cos(angle), np.sin(angle), 0.0]])
    _, ok = gram_cholesky(np, Face.factor(A, np.zeros((0, 3)), np.ones((1, 2), bool), np.ones((1, 3))).rows,
                          float(np.finfo(float).eps))
    assert bool(ok[0]) is accepted
    face = Face.factor(A, np.zeros((0, 3)), np.ones((1, 2), bool), np.ones((1, 3)))
    np.testing.assert_allclose(face.null_apply(np.array([[1.0, 1.0, 1.0]])), [[0.0, 0.0, 1.0]], rtol=0, atol=1e-6)


@pytest.mark.parametrize("k", [7, 13, 14, 20, 30, 40, 48])
def test_nearly_dependent_rows_exactly_represented(k):
    """Rows e1 and e1 + 2^-k e2 (exact in float64): the null space is span(e3..e6) at every k (QR, then the SVD)."""
    n = 6
    A = np.zeros((3, n))
    A[0, 0] = A[1, 0] = 1.0
    A[1, 1] = 2.0 ** -k
    A[2] = np.arange(1.0, n + 1)
    P = pp.Polyhedron(A=A, a=np.ones(3))
    act = np.array([True, True, False])
    expected = np.diag([0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    np.testing.assert_allclose(pp.hs_jacobian(P, act), expected, rtol=0, atol=1e-15)
    v = np.arange(1.0, n + 1)
    np.testing.assert_allclose(pp.hs_vjp(P, act, v), expected @ v, rtol=0, atol=1e-14)


def test_a_batch_mixing_empty_vertex_redundant_dependent_and_box_faces():
    rng = np.random.default_rng(7)
    n = 4
    r = rng.normal(size=(3, n))
    A = np.vstack([r, r[0] * 1e8, r[1] * 1e-8, r[0] + r[1], r[2] + 1e-9 * r[0], rng.normal(size=(2, n))])
    B = np.vstack([rng.normal(size=n), np.zeros(n)])
    B[1] = B[0] * 3.0
    P = pp.Polyhedron(A=A, a=np.ones(A.shape[0]), B=B, b=np.array([1.0, 3.0]), lb=-np.ones(n),
                      ub=np.r_[np.ones(n - 1), np.inf], allow_dependent_rows=True)
    m, nc = A.shape[0], RowLayout.of(P).n_compact
    masks = np.zeros((7, nc), dtype=bool)
    masks[1, :m] = True  # k > n: every row of A (redundant, duplicated, scaled 1e±8)
    masks[2, [0, 3, 4]] = True  # r0 with its multiples 1e8 and 1e-8 and r1
    masks[3, [0, 5]] = True  # r0 and r0 + r1 (independent), with r1 below
    masks[3, 1] = True
    masks[4, [2, 6]] = True  # nearly dependent: r2 and r2 + 1e-9 r0
    masks[5, [0, m + 1, m + n + 2]] = True  # a row of A with a lower and an upper bound
    masks[6, m: m + n] = True  # every coordinate at its lower bound: a vertex, J = 0
    J = pp.hs_jacobian(P, masks)
    V = rng.normal(size=(7, n))
    G = pp.hs_vjp(P, masks, V)
    for i in range(7):
        ref = reference_J(P, masks[i])
        np.testing.assert_allclose(J[i], ref, rtol=0, atol=1e-6 if i == 4 else 1e-12)  # i 4: σ_min ~ 1e-9
        np.testing.assert_allclose(G[i], ref @ V[i], rtol=0, atol=1e-6 if i == 4 else 1e-12)
    np.testing.assert_allclose(J, np.swapaxes(J, 1, 2), rtol=0, atol=1e-14)
    np.testing.assert_allclose(J @ J, J, rtol=0, atol=1e-12)
    assert not J[6].any()


def test_hs_vjp_keeps_the_float32_of_an_array_api_array():
    xps = pytest.importorskip("array_api_strict")
    P = pp.Polyhedron(A=np.array([[1.0, 1.0, 0.0]]), a=np.zeros(1))
    out = pp.hs_vjp(P, np.array([True]), xps.asarray([1.0, 0.0, 0.0], dtype=xps.float32))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [0.5, -0.5, 0.0], rtol=1e-7)
    assert pp.hs_vjp(P, np.array([True]), xps.asarray([1.0, 0.0, 0.0])).dtype == np.float64


def test_torch_backward_at_nearly_dependent_and_redundant_faces():
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    rng = np.random.default_rng(3)
    n = 5
    Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    for delta in (1e-2, 1e-4, 1e-6):  # 1e-8: the known limit of nearly parallel rows (README)
        A = np.vstack([Q[0], Q[0] + delta * Q[1], Q[0], 2 * Q[0], rng.normal(size=n)])
        y0 = Q[3]
        a = A @ y0
        a[4] += 10.0
        x = y0 + 0.7 * A[0] + 0.3 * A[1]
        xt = torch.tensor(x[None, :], requires_grad=True)
        y = project(xt, torch.tensor(A), torch.tensor(a))
        g = rng.normal(size=(1, n))
        (y * torch.tensor(g)).sum().backward()
        P = pp.Polyhedron(A=A, a=a)
        J = reference_J(P, np.array([True, True, True, True, False]))
        np.testing.assert_allclose(xt.grad.numpy(), g @ J, rtol=0, atol=1e-12 / delta)


# ----------------------------------------------------------------------------- backend="auto" on thin polytopes
def _thin_polytope(rng):
    """m = 60 rows in n = 6: a degenerate vertex (15 rows through y0, each twice), rows never active, a box on
    some coordinates only (unbounded directions elsewhere)."""
    n = 6
    y0 = np.zeros(n)
    y0[0] = 1.0
    D = rng.normal(size=(15, n))
    D[:, 0] = np.abs(D[:, 0]) + 0.5
    A = rng.normal(size=(20, n))
    a = np.abs(rng.normal(size=20)) + 0.5
    far = rng.normal(size=(10, n))
    rows = np.vstack([D, D, A, far])
    rhs = np.concatenate([D @ y0, D @ y0, a + A @ y0, 1e3 + np.abs(far @ y0)])
    lb = np.r_[-np.inf, -np.inf, 0.0, -np.inf, -np.inf, -1.0]
    return pp.Polyhedron(A=rows, a=rhs, lb=lb, ub=np.r_[np.inf, 2.0, np.full(n - 2, np.inf)]), y0, D


@pytest.mark.parametrize(("batch", "scale"), [(1, 1.0), (1025, 1.0), (1025, 1e-6), (1025, 1e6)])
def test_auto_on_a_thin_polytope_is_the_exact_projection(batch, scale):
    rng = np.random.default_rng(batch)
    P0, y0, D = _thin_polytope(rng)
    P = pp.Polyhedron(A=P0.A_dense, a=P0.a * scale, lb=P0.lb * scale, ub=P0.ub * scale)
    X = y0 + D[rng.integers(15, size=(batch, 3))].sum(axis=1) * rng.random((batch, 1)) * 2
    X[::3] = rng.normal(size=X[::3].shape) * 3
    X *= scale
    res = pp.project(X, P)
    assert res.backend == "daqp"
    assert all(s is pp.Status.SOLVED for s in np.atleast_1d(res.status))
    Y = np.atleast_2d(res.y)
    ref = np.atleast_2d(pp.project(X, P, backend="clarabel").y)
    size = np.abs(X).max(axis=1) + np.abs(Y).max(axis=1)
    assert float((np.abs(ref - Y).max(axis=1) / size).max()) < 1e-12
    for i in range(0, batch, max(1, batch // 60)):
        viol, stat = kkt_residual(P, X[i], Y[i])
        assert viol < 1e-12 and stat < 1e-12, (i, viol, stat)


@pytest.mark.parametrize(("k", "s"), [(25, 0.68), (40, 0.795)])
def test_kahan_rows_with_signs_against_the_estimates_start_vector(k, s):
    """Row signs leave the face (and J) unchanged but move G's eigenvectors: signs chosen so that the estimate's
    fixed start vector v is nearly orthogonal to u_min made vᵀG⁻¹v miss 1/λ_min by ~1e12, the face passed, and J g
    was off by 0.1-0.4 (review of session 53). The second, data-chosen right-hand side sign(G⁻¹v) still sees it."""
    from polyproj.projection.faces import _unit_start

    M = kahan_rows(k, s, 3, seed=0)
    _, U = np.linalg.eigh(M @ M.T)
    u, v = U[:, 0], _unit_start(k)
    signs, run = np.ones(k), 0.0
    for i in np.argsort(-np.abs(v * u)):  # greedy: keep Σ sᵢ vᵢ uᵢ near 0
        signs[i] = -1.0 if run * v[i] * u[i] > 0 else 1.0
        run += signs[i] * v[i] * u[i]
    Ms = M * signs[:, None]
    assert (v @ (signs * u)) ** 2 < 1e-6 / k  # the start vector is blind to the small eigenvalue
    n = Ms.shape[1]
    face = Face.factor(Ms, np.zeros((0, n)), np.ones((1, k), dtype=bool), np.ones((1, n)))
    assert not bool(face.ok[0])
    J = reference_J(pp.Polyhedron(A=Ms, a=np.zeros(k)), np.ones(k, dtype=bool))
    g = np.random.default_rng(k).normal(size=(1, n))
    tol = 100 * np.finfo(float).eps / np.linalg.svd(Ms, compute_uv=False)[-1]  # the SVD's own accuracy
    np.testing.assert_allclose(face.null_apply(g), g @ J, rtol=0, atol=tol)


def test_float32_rows_whose_squares_underflow_stay_in_the_face():
    """A float32 row [1e-25, 1e-25, 0]: its squares underflow to 0, and the row read as a zero row (J = I)."""
    torch = pytest.importorskip("torch")
    M = torch.tensor([[1e-25, 1e-25, 0.0]], dtype=torch.float32)
    face = Face.factor(M, torch.zeros((0, 3), dtype=torch.float32), torch.ones((1, 1), dtype=torch.bool),
                       torch.ones((1, 3), dtype=torch.float32))
    out = face.null_apply(torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float32)).numpy()
    np.testing.assert_allclose(out, [[0.5, -0.5, 0.0]], rtol=0, atol=1e-6)
    from polyproj.linalg import row_norms

    # float32 rows below sqrt(smallest normal) and above sqrt(max), and a zero row; float64 rows above sqrt(max)
    # (validated float64 rows have an entry of at least problem.TINY_ROW, whose square does not underflow)
    rows32 = np.array([[1e-25, 1e-25], [1e20, 1e20], [0.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(row_norms(np, rows32), np.sqrt(2) * rows32[:, 0].astype(np.float64), rtol=1e-6)
    np.testing.assert_allclose(row_norms(np, np.array([[1e160, 1e160], [0.0, 0.0], [3.0, 4.0]])),
                               [np.sqrt(2) * 1e160, 0.0, 5.0], rtol=1e-15)
