"""hs_jacobian / hs_vjp by a QR of the active rows (the SVD only where QR's pivots do not settle the rank).

Reference: the orthogonal projector onto the null space of the active rows, from scipy's SVD-based
``null_space`` of the rows restricted to the free coordinates (fixed ones: zero rows and columns of J).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import scipy.linalg

import polyproj as pp
from polyproj.polydata import RowLayout

hsj = importlib.import_module("polyproj.projection.hs_jacobian")


def reference_J(P: pp.Polyhedron, active: np.ndarray) -> np.ndarray:
    """J from the full mask of one sample (compact numbering): null-space projector on the free coordinates."""
    n, m = P.n, P.m_ineq
    full = RowLayout.of(P).to_full(active[None, :], fill=False)[0]
    fixed = full[m: m + n] | full[m + n:]
    rows = np.vstack([P.A_dense[full[:m]], P.B_dense])[:, ~fixed]
    J = np.zeros((n, n))
    N = scipy.linalg.null_space(rows) if rows.shape[0] else np.eye(int((~fixed).sum()))
    free = np.flatnonzero(~fixed)
    J[np.ix_(free, free)] = N @ N.T
    return J


def mask(P: pp.Polyhedron, rows_a=(), lower=(), upper=()) -> np.ndarray:
    """A compact active mask: rows of A, then the finite lower bounds, then the finite upper bounds."""
    full = np.zeros(P.m_ineq + 2 * P.n, dtype=bool)
    full[list(rows_a)] = True
    full[[P.m_ineq + i for i in lower]] = True
    full[[P.m_ineq + P.n + i for i in upper]] = True
    return RowLayout.of(P).to_compact(full[None, :])[0]


def test_random_faces_agree_with_the_reference_and_are_projectors():
    rng = np.random.default_rng(0)
    n, m = 12, 20
    P = pp.Polyhedron(A=rng.normal(size=(m, n)), a=np.ones(m), B=rng.normal(size=(2, n)), b=np.zeros(2),
                      lb=-np.ones(n), ub=np.ones(n))
    masks = np.array([mask(P, rng.choice(m, size=int(rng.integers(0, 8)), replace=False),
                           lower=rng.choice(n, size=2, replace=False)[:int(rng.integers(0, 2))],
                           upper=[int(rng.integers(n))] if rng.random() < 0.5 else ())
                      for _ in range(30)])
    J = pp.hs_jacobian(P, masks)
    for i in range(masks.shape[0]):
        np.testing.assert_allclose(J[i], reference_J(P, masks[i]), rtol=0, atol=1e-12)
    np.testing.assert_allclose(J, np.swapaxes(J, 1, 2), rtol=0, atol=1e-14)
    np.testing.assert_allclose(J @ J, J, rtol=0, atol=1e-12)
    V = rng.normal(size=(30, n))
    np.testing.assert_allclose(pp.hs_vjp(P, masks, V), np.einsum("bij,bj->bi", J, V), rtol=0, atol=1e-12)


@pytest.mark.parametrize("angle", [0.0, 1e-16, 1e-9, 1e-5, 1e-2])
def test_dependent_and_nearly_dependent_rows(angle):
    """A duplicated row (LICQ fails) or rows at a tiny angle: the faces QR cannot settle go to the SVD, whose
    rank decision J follows (a row at angle 1e-16 counts as a duplicate; from 1e-9 on as its own)."""
    rng = np.random.default_rng(1)
    n = 6
    r = rng.normal(size=n)
    r /= np.linalg.norm(r)
    t = rng.normal(size=n)
    t -= (t @ r) * r
    t /= np.linalg.norm(t)
    A = np.vstack([r, r * np.cos(angle) + t * np.sin(angle), rng.normal(size=(2, n))])
    P = pp.Polyhedron(A=A, a=np.ones(4), lb=-np.ones(n), ub=np.ones(n))
    act = mask(P, rows_a=(0, 1, 2))
    _, R = hsj._face(P, act[None, :])
    from polyproj.projection.faces import qr_null_basis

    _, ok = qr_null_basis(R)
    assert bool(ok[0]) == (np.sin(angle) >= hsj.QR_PIVOT)  # the pivot |R_22| is ~ sin(angle)
    J = pp.hs_jacobian(P, act)
    from polyproj.projection.faces import Face

    F = Face.of_rows(R, method="svd")
    J_svd = np.stack([F.null_apply(np.eye(n)[None, :, j])[0] for j in range(n)], axis=-1)
    np.testing.assert_allclose(J, J_svd, rtol=0, atol=1e-10)
    rank = n - round(float(np.trace(J)))
    assert rank == (2 if angle <= 1e-16 else 3)
    np.testing.assert_allclose(J @ J, J, rtol=0, atol=1e-10)


def test_rows_whose_support_the_bounds_fix_and_empty_faces():
    """A row of A on coordinates all at their bounds is a zero row of the face (no direction); no active row:
    J is diag(free); an empty batch gives an empty answer."""
    n = 4
    A = np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    P = pp.Polyhedron(A=A, a=np.ones(2), lb=np.zeros(n), ub=np.ones(n))
    act = mask(P, rows_a=(0, 1), lower=(0,), upper=(1,))
    J = pp.hs_jacobian(P, act)
    np.testing.assert_allclose(J, reference_J(P, act), rtol=0, atol=1e-14)
    assert np.all(J[[0, 1]] == 0) and np.all(J[:, [0, 1]] == 0)
    J0 = pp.hs_jacobian(P, mask(P, upper=(2,)))
    np.testing.assert_array_equal(J0, np.diag([1.0, 1.0, 0.0, 1.0]))
    assert pp.hs_vjp(P, np.zeros((0, act.size), dtype=bool), np.zeros((0, n))).shape == (0, n)
