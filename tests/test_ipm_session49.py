"""The IPM's unboundedness certificate at costs below its absolute floor (2026-12-07 probe, README known limit)."""

from __future__ import annotations

import numpy as np
import pytest

import polyproj as pp


@pytest.mark.parametrize("cost", [1e-9, 1e-6, 1e-3, 1.0, 1e6])
def test_an_unbounded_lp_with_a_tiny_cost_is_dual_infeasible(cost):
    """min -c x₁ over x >= 0, 0 <= x₂ <= 1 is unbounded for any c > 0. The certificate's floor 1e3 ε_inf (1e-5) was
    absolute: qᵀδx = -c never passed it for c <= 1e-5, and the iterates, whose residuals all lay within 1000
    tolerances of 0, ended SOLVED_INACCURATE at a finite point (x₁ 3.19 at c = 1e-6). The problem turned around is
    bounded, with the minimum at x₁ = 0."""
    P, C = np.zeros((2, 2)), np.array([[0.0, 1.0]])
    unbounded = pp.QP(P=P, q=np.array([-cost, 0.0]), C=C, l=[0.0], u=[1.0], lb=[0.0, 0.0])
    for sol in (pp.solve_qp(unbounded, backend="ipm"), pp.get_backend("ipm").solve(unbounded)):
        assert sol.status is pp.Status.DUAL_INFEASIBLE
        assert np.isnan(sol.x).all()
    bounded = pp.QP(P=P, q=np.array([cost, 0.0]), C=C, l=[0.0], u=[1.0], lb=[0.0, 0.0])
    sol = pp.solve_qp(bounded, backend="ipm")
    assert sol.status is pp.Status.SOLVED
    assert cost * sol.x[0] <= 1e-7  # the objective's value within the duality-gap tolerance of the minimum 0
    assert 0.0 <= sol.x[1] <= 1.0
