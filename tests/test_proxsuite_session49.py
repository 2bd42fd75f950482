"""ProxSuite warm starts that ProxQP accepted before its first iteration (2026-12-07, found by the kit's batches)."""

from __future__ import annotations

import numpy as np
import pytest

import polyproj as pp

pytest.importorskip("proxsuite")


def test_a_warm_start_whose_multiplier_is_on_a_slack_row_is_not_returned_as_the_answer():
    """min x₁² + x₂²/2 + x₁ s.t. -2 x₁ <= u. At u = 0 the row binds (x = 0, z = 0.5); warm-started from that answer
    at u = 1, ProxQP found the start primal and dual feasible and stopped after 0 iterations, SOLVED, with
    complementarity off by 0.5 (the guard made it NUMERICAL_ERROR). The minimum is x = (-0.5, 0), the row slack."""
    P, q = np.diag([2.0, 1.0]), np.array([1.0, 0.0])
    for C in (np.array([[-2.0, 0.0]]), np.array([[0.0, 0.0], [0.0, 0.0], [-2.0, 0.0]])):
        m = C.shape[0]
        tight = pp.QP(P=P, q=q, C=C, l=np.full(m, -np.inf), u=np.zeros(m))
        loose = pp.QP(P=P, q=q, C=C, l=np.full(m, -np.inf), u=np.r_[np.zeros(m - 1), 1.0])
        solver = pp.get_backend("proxsuite")
        start = solver.solve(tight)
        assert start.status is pp.Status.SOLVED
        sol = solver.solve(loose, warm_start=start)
        assert sol.status is pp.Status.SOLVED
        np.testing.assert_allclose(sol.x, [-0.5, 0.0], rtol=0, atol=1e-7)
        np.testing.assert_allclose(sol.z, 0.0, rtol=0, atol=1e-7)


def test_warm_starts_from_neighbouring_problems_give_the_cold_answers():
    """Random strictly convex QPs warm-started from the answer of the same QP with other right-hand sides: every
    answer SOLVED and within the tolerance of the exact solution (DAQP, an active-set method)."""
    rng = np.random.default_rng(3)
    solver = pp.get_backend("proxsuite", eps_abs=1e-9)
    for _ in range(20):
        n, m = 4, 6
        R = rng.standard_normal((n, n))
        P = R @ R.T + 0.1 * np.eye(n)
        C = rng.standard_normal((m, n))
        q = rng.standard_normal(n)
        first = pp.QP(P=P, q=q, C=C, l=np.full(m, -np.inf), u=rng.uniform(-0.5, 0.5, m) + 1.0)
        second = pp.QP(P=P, q=q, C=C, l=np.full(m, -np.inf), u=rng.uniform(-0.5, 0.5, m) + 1.0)
        sol = solver.solve(second, warm_start=solver.solve(first))
        exact = pp.solve_qp(second, backend="daqp")
        assert sol.status is pp.Status.SOLVED
        np.testing.assert_allclose(sol.x, exact.x, rtol=0, atol=1e-6)
