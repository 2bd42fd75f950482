"""HS-Jacobian: J v == hs_vjp, finite differences of project(), LICQ failures, array namespaces."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import polyproj as pp
from polyproj.projection.faces import Face
from tests.helpers import random_polytope


def _null(face, V):
    return face.null_apply(V)


def _fd_jacobian(P, x, h=1e-6):
    n = x.size
    X = np.concatenate([x + h * np.eye(n), x - h * np.eye(n)])
    Y = pp.project(X, P).y
    return (Y[:n] - Y[n:]).T / (2 * h)


def _nondegenerate(P, res, i, margin=1e-4):
    """No row is nearly active without being active, and active multipliers are clearly positive."""
    slack = P.ineq_slack(res.y[i])[0]
    lam = res.multipliers[i][: P.n_ineq]
    inactive_ok = np.all(slack[~res.active[i]] > margin)
    active_ok = np.all(lam[res.active[i]] > margin)
    return inactive_ok and active_ok


@pytest.mark.parametrize(("n", "m", "p"), [(6, 10, 0), (15, 30, 1), (30, 60, 3)])
def test_jacobian_matches_finite_differences(n, m, p):
    rng = np.random.default_rng(100 + n)
    P = random_polytope(rng, n, m, p)
    X = 2.0 * rng.normal(size=(8, n))
    res = pp.project(X, P)
    J = pp.hs_jacobian(P, res.active)
    V = rng.normal(size=(8, n))
    G = pp.hs_vjp(P, res.active, V)
    np.testing.assert_allclose(G, np.einsum("bij,bj->bi", J, V), atol=1e-12)
    checked = 0
    for i in range(8):
        if not _nondegenerate(P, res, i):
            continue
        checked += 1
        np.testing.assert_allclose(J[i], _fd_jacobian(P, X[i]), atol=1e-6)
    assert checked >= 4  # the test must actually compare at several points


def test_jacobian_is_a_symmetric_projector(rng):
    P = random_polytope(rng, 12, 24, 2)
    res = pp.project(3.0 * rng.normal(size=(5, 12)), P)
    J = pp.hs_jacobian(P, res.active)
    np.testing.assert_allclose(J, np.swapaxes(J, 1, 2), atol=1e-13)
    np.testing.assert_allclose(J @ J, J, atol=1e-12)
    # J annihilates the active rows: A_I J = 0, B J = 0
    for i in range(5):
        actA = res.active[i][: P.m_ineq]
        np.testing.assert_allclose(P.A_dense[actA] @ J[i], 0.0, atol=1e-12)
        np.testing.assert_allclose(P.B_dense @ J[i], 0.0, atol=1e-12)


def test_box_only_jacobian_is_diagonal_mask():
    P = pp.Polyhedron(lb=np.zeros(4), ub=np.ones(4))
    res = pp.project(np.array([2.0, 0.5, -1.0, 0.25]), P)
    np.testing.assert_allclose(pp.hs_jacobian(P, res.active), np.diag([0.0, 1.0, 0.0, 1.0]))


@pytest.mark.parametrize("kind", ["duplicate", "scaled", "combination"])
def test_licq_failure_leaves_the_jacobian_unchanged(kind):
    """Duplicated, scaled or dependent active rows change neither y nor J v (null space unchanged)."""
    rng = np.random.default_rng(7)
    P = random_polytope(rng, 12, 20, 1)
    X = 3.0 * rng.normal(size=(6, 12))
    res = pp.project(X, P)
    i = int(np.argmax(res.active[:, : P.m_ineq].sum(axis=1)))
    act = np.flatnonzero(res.active[i][: P.m_ineq])
    assert act.size >= 2
    if kind == "duplicate":
        extra, rhs = P.A_dense[act[:1]], P.a[act[:1]]
    elif kind == "scaled":
        extra, rhs = 3.0 * P.A_dense[act[:1]], 3.0 * P.a[act[:1]]
    else:
        extra = (P.A_dense[act[0]] + 2.0 * P.A_dense[act[1]])[None, :]
        rhs = np.array([P.a[act[0]] + 2.0 * P.a[act[1]]])
    P2 = pp.Polyhedron(A=np.vstack([P.A_dense, extra]), a=np.concatenate([P.a, rhs]), B=P.B, b=P.b, lb=P.lb, ub=P.ub)
    res2 = pp.project(X[i], P2)
    np.testing.assert_allclose(res2.y, res.y[i], atol=1e-10)
    assert res2.active[P.m_ineq]  # the added row is active too
    V = rng.normal(size=(3, 12))
    act2 = np.broadcast_to(res2.active, (3, P2.n_ineq))
    act1 = np.broadcast_to(res.active[i], (3, P.n_ineq))
    np.testing.assert_allclose(pp.hs_vjp(P2, act2, V), pp.hs_vjp(P, act1, V), atol=1e-12)


@pytest.mark.core
def test_bad_active_mask_is_rejected(rng):
    P = random_polytope(rng, 4, 6, 0)
    with pytest.raises(pp.ProblemError, match="active must have"):
        pp.hs_jacobian(P, np.zeros(3, dtype=bool))
    with pytest.raises(pp.ProblemError, match="columns"):
        pp.hs_vjp(P, np.zeros(P.n_ineq, dtype=bool), np.zeros(5))


def _factor_inputs(rng):
    A = rng.normal(size=(7, 5))
    B = rng.normal(size=(1, 5))
    active = rng.random((4, 7)) < 0.4
    free = (rng.random((4, 5)) < 0.8).astype(np.float64)
    V = rng.normal(size=(4, 5))
    return A, B, active, free, V


def test_array_api_strict_namespace(rng):
    xps = pytest.importorskip("array_api_strict")
    A, B, active, free, V = _factor_inputs(rng)
    ref = _null(Face.factor(A, B, active, free), V)
    out = _null(Face.factor(xps.asarray(A), xps.asarray(B), xps.asarray(active), xps.asarray(free)),
                     xps.asarray(V))
    assert type(out).__module__.startswith("array_api_strict")
    np.testing.assert_allclose(np.asarray(out), ref, atol=1e-12)


def test_torch_namespace_stays_torch(rng):
    torch = pytest.importorskip("torch")
    A, B, active, free, V = _factor_inputs(rng)
    ref = _null(Face.factor(A, B, active, free), V)
    t = torch.from_numpy
    out = _null(Face.factor(t(A), t(B), t(active), t(free)), t(V))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-12)
    out32 = _null(Face.factor(t(A).float(), t(B).float(), t(active), t(free).float()), t(V).float())
    assert out32.dtype == torch.float32
    np.testing.assert_allclose(out32.numpy(), ref, atol=1e-5)


def test_hs_functions_reject_bad_arguments():
    P = pp.Polyhedron(lb=np.zeros(3))
    with pytest.raises(pp.ProblemError, match="2 samples but V has 3"):
        pp.hs_vjp(P, np.zeros((2, 3), bool), np.ones((3, 3)))
    with pytest.raises(pp.ProblemError, match="take a Polyhedron"):
        pp.hs_jacobian(pp.sets.Simplex(3), np.zeros(3, bool))
    with pytest.raises(pp.ProblemError, match="boolean mask"):
        pp.hs_jacobian(P, np.array([0.3, 0.0, 1.0]))  # a float array is not a mask
    with pytest.raises(pp.ProblemError, match="boolean mask"):
        pp.hs_jacobian(P, np.array([2, 0, 1]))
    with pytest.raises(pp.ProblemError, match="boolean mask"):  # 0/1 integers too: an index list would pass
        pp.hs_jacobian(P, np.array([1, 0, 0]))
    np.testing.assert_array_equal(pp.hs_jacobian(P, np.array([1, 0, 0]).astype(bool)), np.diag([0.0, 1.0, 1.0]))


def test_malformed_arguments_are_problem_errors():
    """Ragged lists, a 3-D mask and NaN in V: ProblemErrors naming the argument (NumPy's ValueError escaped, and
    NaN in V came back as NaN silently); np.matrix points project as plain arrays."""
    P = pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0], lb=[0.0, 0.0])
    act = np.array([True, False, False])
    with pytest.raises(pp.ProblemError, match="A is not a rectangular array"):
        pp.Polyhedron(A=[[1.0, 2.0], [1.0]], a=[1.0, 2.0])
    with pytest.raises(pp.ProblemError, match=r"active must have shape \(n_ineq,\) or \(batch, n_ineq\)"):
        pp.hs_jacobian(P, np.zeros((1, 1, 3), bool))
    with pytest.raises(pp.ProblemError, match="active is not a rectangular array"):
        pp.hs_jacobian(P, [[True, False, False], [True]])
    with pytest.raises(pp.ProblemError, match="V is not a rectangular array"):
        pp.hs_vjp(P, act, [[1.0, 2.0], [1.0]])
    with pytest.raises(pp.ProblemError, match="V contains NaN"):
        pp.hs_vjp(P, act, [np.nan, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)  # np.matrix itself
        res = pp.project(np.matrix([[3.0, 3.0]]), P, backend="ipm")
    np.testing.assert_allclose(res.y, [[0.5, 0.5]], atol=1e-9)


def test_an_empty_mask_and_an_empty_batch_of_cotangents():
    """[] (float64 to NumPy) was refused as a mask of no rows; one mask against V of no samples was refused."""
    P = pp.Polyhedron(B=[[1.0, 1.0, 1.0]], b=[1.0])
    J = pp.hs_jacobian(P, [])
    np.testing.assert_allclose(J, np.eye(3) - np.ones((3, 3)) / 3, atol=1e-15)
    S = pp.Polyhedron(B=[[1.0, 1.0, 1.0]], b=[1.0], lb=np.zeros(3))
    assert pp.hs_vjp(S, np.zeros(3, dtype=bool), np.zeros((0, 3))).shape == (0, 3)
