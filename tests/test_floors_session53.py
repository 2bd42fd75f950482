"""The declared dependency floors (a probe, 2026-12-07): code paths that need more than the floor declares.

NumPy 2.0 (the core floor) has no ``numpy.cumulative_sum`` (NumPy 2.1 added it), and polyproj passes the bare
``numpy`` module as an array namespace: ``pp.project`` of a batch on a polyhedron raised AttributeError there
when some points went on from DAQP's direct path to the pipeline. NumPy 2.0 is simulated here by removing the
attribute.
"""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

import polyproj as pp
from polyproj.linalg import cumulative_sum
from polyproj.projection.faces import scatter_rows


@pytest.fixture
def numpy_2_0(monkeypatch):
    """``numpy`` without ``cumulative_sum``, as NumPy 2.0 (array_api_compat's NumPy namespace, a copy of the
    module's names made at its import, imported first)."""
    import array_api_compat.numpy  # noqa: F401

    monkeypatch.delattr(np, "cumulative_sum", raising=False)
    assert not hasattr(np, "cumulative_sum")


def _polyhedron_and_points(rng):
    n, m = 8, 12
    A = rng.normal(size=(m, n))
    x0 = rng.uniform(-0.5, 0.5, size=n)
    a = A @ x0 + rng.uniform(0.1, 1.0, size=m)
    a[1] = np.inf
    B = rng.normal(size=(1, n))
    lb, ub = -np.ones(n), np.ones(n)
    lb[2] = -np.inf
    X = 2.0 * rng.normal(size=(10, n))
    return pp.Polyhedron(A=A, a=a, B=B, b=B @ x0, lb=lb, ub=ub), X


@pytest.mark.core
def test_cumulative_sum_on_the_bare_numpy_module(numpy_2_0):
    x = np.array([True, False, True, True]).astype(np.int64)
    np.testing.assert_array_equal(cumulative_sum(np, x), [1, 1, 2, 3])
    M = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(cumulative_sum(np, M, axis=1), [[0.0, 1.0, 3.0], [3.0, 7.0, 12.0]])
    np.testing.assert_array_equal(cumulative_sum(np, M, axis=0), [[0.0, 1.0, 2.0], [3.0, 5.0, 7.0]])


@pytest.mark.core
def test_scatter_rows_with_the_bare_numpy_module(numpy_2_0):
    full = np.zeros((5, 2))
    mask = np.array([False, True, False, True, True])
    part = np.arange(6.0).reshape(3, 2) + 1.0
    out = scatter_rows(np, full, mask, part)
    np.testing.assert_array_equal(out, [[0, 0], [1, 2], [0, 0], [3, 4], [5, 6]])


def test_cumulative_sum_on_array_api_strict():
    xps = pytest.importorskip("array_api_strict")
    x = xps.asarray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    np.testing.assert_array_equal(np.asarray(cumulative_sum(xps, x, axis=1)), [[1.0, 3.0, 6.0], [4.0, 9.0, 15.0]])


@pytest.mark.core
def test_batch_projection_on_numpy_2_0(numpy_2_0):
    """The batch (DAQP's direct path where available, the pipeline for the rest) equals the points projected one
    by one, and its answers lie in the set."""
    P, X = _polyhedron_and_points(np.random.default_rng(12345))
    res = pp.project(X, P)
    assert all(s is pp.Status.SOLVED for s in res.status)
    for i, x in enumerate(X):
        one = pp.project(x, P)
        np.testing.assert_allclose(res.y[i], one.y, atol=1e-8)
    A, a, B, b, lb, ub = P.A, P.a, P.B, P.b, P.lb, P.ub
    Y = res.y
    fin = np.isfinite(a)
    assert np.all(Y @ A[fin].T <= a[fin] + 1e-8)
    np.testing.assert_allclose(Y @ B.T, np.broadcast_to(b, (len(Y), len(b))), atol=1e-8)
    assert np.all(Y >= lb - 1e-8) and np.all(Y <= ub + 1e-8)


@pytest.mark.core
def test_simplex_projection_on_numpy_2_0(numpy_2_0):
    """The sort-based simplex projection (cumulative sums of the sorted entries) against its closed form."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(7, 6))
    Y = pp.project(X, pp.sets.Simplex(6)).y
    for x, y in zip(X, Y):
        u = np.sort(x)[::-1]
        css = np.cumsum(u) - 1.0
        k = np.nonzero(u - css / np.arange(1, 7) > 0)[0][-1]
        np.testing.assert_allclose(y, np.maximum(x - css[k] / (k + 1), 0.0), atol=1e-12)


@pytest.mark.core
def test_no_direct_cumulative_sum_on_a_namespace():
    """``xp.cumulative_sum`` fails where ``xp`` is the bare ``numpy`` module of NumPy 2.0: polyproj calls
    :func:`polyproj.linalg.cumulative_sum`, which is the one place that names it."""
    root = pathlib.Path(pp.__file__).parent
    hits = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if p.name != "linalg.py"
            for i, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"\bxp\.cumulative_sum\(", line)]
    assert hits == []


@pytest.mark.core
@pytest.mark.parametrize("far", [1e6, 1e17])
def test_capped_simplex_of_a_far_point(far):
    """array-api-compat 1.9 (the declared floor) raised ValueError ("Invalid integer data type 'f'") in
    ``xp.clip`` with Python int bounds on a float array: the far-point shift of a capped simplex. The answer:
    ``clip(x − θ, 0, ½)`` summing to 2, here (½, 0.3, 0.3, 0.3, 0.3, 0.3)."""
    X = np.zeros((2, 6))
    X[0, 0], X[1, 3] = far, -far
    Y = pp.project(X, pp.sets.CappedSimplex(6, total=2.0, upper=0.5)).y
    np.testing.assert_allclose(Y[0], [0.5, 0.3, 0.3, 0.3, 0.3, 0.3], atol=1e-12)
    np.testing.assert_allclose(Y[1], [0.4, 0.4, 0.4, 0.0, 0.4, 0.4], atol=1e-12)


# SciPy 1.12-1.14's nnls (the declared floor is SciPy 1.13) raises "Matrix is singular" on rank-deficient A:
# the rows [G; B; -B] of an equality in polyproj.testing.properties.exact_certificate, so `polyproj check` on
# Simplex(5, total=2.5) reported its namespaces property as an error. The matrix and vector of that failure:
_SINGULAR_A = np.array([[-1.0, 0, 0, 0, 1, -1], [0, -1, 0, 0, 1, -1], [0, 0, -1, 0, 1, -1], [0, 0, 0, 0, 1, -1],
                        [0, 0, 0, -1, 1, -1]])
_SINGULAR_B = np.array([-19.04004886, 24.59726943, -11.42768033, 45.88793515, -9.49010645])


@pytest.fixture
def nnls_of_scipy_1_13(monkeypatch):
    """``scipy.optimize.nnls`` raising on a singular subproblem, as SciPy 1.12-1.14's does."""
    import scipy.optimize

    def singular(A, b, *args, **kwargs):
        if np.linalg.matrix_rank(A) < min(A.shape):
            raise np.linalg.LinAlgError("Matrix is singular.")
        return original(A, b, *args, **kwargs)

    original = scipy.optimize.nnls
    monkeypatch.setattr(scipy.optimize, "nnls", singular)


@pytest.mark.core
def test_nnls_on_a_rank_deficient_matrix(nnls_of_scipy_1_13):
    from polyproj.linalg import nnls

    x, r = nnls(_SINGULAR_A, _SINGULAR_B)
    assert np.all(x >= 0)
    # b lies in the cone of the columns: x5 = 45.888 (the row of zeros), then x_i = x5 - b_i
    np.testing.assert_allclose(x[:5], [64.92798401, 21.29066572, 57.31561548, 55.3780416, 45.88793515], atol=1e-7)
    assert r <= 1e-10 and abs(r - np.linalg.norm(_SINGULAR_A @ x - _SINGULAR_B)) <= 1e-12
    # b = e1 outside the cone: A x = (s − x0, s − x1, s − x2, s, s − x3) with s = x4 − x5 free, so the least
    # squares are (s − x0 − 1)² + s² at best (x1 = x2 = x3 = max(s, 0)): s = ½, x0 = 0, distance √½
    x, r = nnls(_SINGULAR_A, np.array([1.0, 0, 0, 0, 0]))
    assert np.all(x >= 0)
    np.testing.assert_allclose(r, np.sqrt(0.5), rtol=1e-10)
    np.testing.assert_allclose(_SINGULAR_A @ x, [0.5, 0.0, 0.0, 0.5, 0.0], atol=1e-10)


def test_check_projector_of_a_simplex_with_scipy_1_13s_nnls(nnls_of_scipy_1_13):
    pytest.importorskip("array_api_strict")
    from polyproj.testing import check_projector

    report = check_projector(pp.sets.Simplex(5, total=2.5), examples=12, seed=3)
    assert report.passed, str(report)
