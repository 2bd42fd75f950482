"""Minimal failing examples found by the long hypothesis profile (``HYPOTHESIS_PROFILE=dev``), kept as regressions."""

from __future__ import annotations

import numpy as np
import pytest

import polyproj as pp
from polyproj.testing import properties as pr
from polyproj.testing import strategies as ps


def _origin_vertex():
    """P = {y1 + 4 y3 <= 0, 4 y2 + y3 = 0, y1 >= 0}, x = (1, 0, 4): Π(x) = 0, the bound y1 >= 0 weakly active.

    DAQP's working set is the row of A alone (the bound's multiplier is 0); the face point on it is 0 up to
    rounding (y1 = 7.6e-19), and the direct path called the bound clearly inactive (its slack above a
    tolerance proportional to |y|, which vanishes at this vertex): active set [0] instead of [0, 1], and the
    degeneracy report said nondegenerate.
    """
    P = pp.Polyhedron(A=[[1.0, 0.0, 4.0]], a=[0.0], B=[[0.0, 4.0, 1.0]], b=[0.0], lb=[0.0, -np.inf, -np.inf])
    return P, np.array([1.0, 0.0, 4.0])


@pytest.mark.parametrize("backend", [None, "daqp"])
def test_a_weakly_active_bound_at_a_vertex_through_the_origin_is_active(backend):
    P, x = _origin_vertex()
    res = pp.project(x, P) if backend is None else pp.project(x, P, backend=backend)
    np.testing.assert_array_equal(res.y, 0.0)
    np.testing.assert_array_equal(res.active, [True, True])
    assert bool(np.asarray(res.degenerate.weak).all())  # the bound is at zero slack with multiplier 0


def test_licq_equivalence_at_the_origin_vertex_on_daqp():
    P, x = _origin_vertex()
    case = ps.PolyhedronCase(P, np.zeros(3), np.array([True, True]), licq=True)
    pt = ps.DegeneratePoint(case, x, np.array([1.0, 0.0]), np.zeros(1), "vertex")
    for backend in ("daqp", "proxsuite"):
        assert pr.check_licq_equivalence(pt, backend)["hs_elements"] == 2


# ----------------------------------------------------------------------------- the conformance reference
def _exact_on_active_set(qp, x):
    """The exact (rational) minimiser of ``qp`` with the sides tight at ``x`` as equalities, rounded to float64."""
    from fractions import Fraction as F

    n = qp.n
    rows, rhs = [], []
    for i in range(qp.m):
        for side in (qp.l[i], qp.u[i]):
            if np.isfinite(side) and abs(qp.C[i] @ x - side) <= 1e-9:
                rows.append([F(v) for v in qp.C[i]]), rhs.append(F(side))
                break
    for j in range(n):
        for side in (qp.lb[j], qp.ub[j]):
            if np.isfinite(side) and abs(x[j] - side) <= 1e-9:
                rows.append([F(int(k == j)) for k in range(n)]), rhs.append(F(side))
                break
    k = len(rows)
    K = [[F(qp.P[i, j]) for j in range(n)] + [rows[a][i] for a in range(k)] for i in range(n)]
    K += [rows[a] + [F(0)] * k for a in range(k)]
    r = [-F(v) for v in qp.q] + rhs
    N = n + k
    for c in range(N):  # Gauss–Jordan, exact
        piv = next(i for i in range(c, N) if K[i][c] != 0)
        K[c], K[piv], r[c], r[piv] = K[piv], K[c], r[piv], r[c]
        for i in range(N):
            if i != c and K[i][c] != 0:
                f = K[i][c] / K[c][c]
                K[i] = [a - f * b for a, b in zip(K[i], K[c], strict=True)]
                r[i] -= f * r[c]
    return np.array([float(r[i] / K[i][i]) for i in range(n)])


@pytest.mark.parametrize("seed", [89, 1925])
def test_the_conformance_reference_is_exact_to_rounding(seed):
    """A float64 KKT solve of cond 1.6e4-2.3e5 left the reference 5e-12 off the optimum, while HiGHS's and OSQP's
    answers were exact to an ulp and held to 2e-12 of it (test_random_small_qps_match_exact_reference)."""
    from polyproj.testing.conformance import random_feasible_qp, reference_solution

    qp = random_feasible_qp(np.random.default_rng(seed), 2, 4, 0)
    x = reference_solution(qp)
    np.testing.assert_allclose(x, _exact_on_active_set(qp, x), rtol=0, atol=4e-16 * (1 + np.abs(x).max()))


# ----------------------------------------------------------------------------- the IPM backend
def test_ipm_detects_an_infeasible_qp_whose_direction_loses_accuracy():
    """x₄ = 0, 2x₃ + 3x₄ <= 0, x₁ + 2x₃ + x₄ = 3, x₁ <= 2: empty (support −1). The corrector direction came within
    8e-8 of a certificate, then lost its accuracy as the multipliers passed 1e10: MAX_ITER. z/‖z‖ certifies it."""
    inf = np.inf
    qp = pp.QP(P=np.eye(4), q=np.zeros(4), C=np.array([[0, 0, 0, -2.0], [0, 0, 2, 3], [-1, 0, -2, -1]]),
               l=[0, -inf, -3], u=[0, 0, -3], ub=[2, inf, inf, inf])
    sol = pp.solve_qp(qp, backend="ipm")
    assert sol.status is pp.Status.PRIMAL_INFEASIBLE
    assert np.isnan(sol.x).all()


def test_ipm_batch_with_shared_fixed_variables_takes_a_warm_start():
    """solve_batch with a warm start on a batch sharing a fixed variable built its reduced warm start without
    ``iterations``: a TypeError, raised as SolverError."""
    qp = pp.QP(P=np.array([[2.0, 0.0], [0.0, 0.0]]), q=np.zeros(2), lb=[0.0, 0.0], ub=[0.0, 1.0])
    solver = pp.get_backend("ipm")
    cold = solver.solve_batch(qp, q=np.zeros((2, 2)))
    warm = solver.solve_batch(qp, q=np.zeros((2, 2)), warm_start=cold)
    assert warm.status == (pp.Status.SOLVED,) * 2
    np.testing.assert_allclose(warm.x, cold.x, atol=1e-8)
