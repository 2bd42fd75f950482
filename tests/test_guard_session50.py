"""The guard checks a claim of unboundedness for a descent ray of the constraints' recession cone.

Clarabel said DUAL_INFEASIBLE for an LP whose optimum lies on a row side at −1e10 (HiGHS, DAQP and the IPM solve it);
the guard had only tested that the set is not empty, not bounded in every variable, and P not positive definite.
"""

from __future__ import annotations

import numpy as np
import pytest

import polyproj as pp
from polyproj.backends.feasibility import no_descent_ray


class SaysUnbounded(pp.QPSolver):
    """A backend that calls every problem unbounded (a bare flag, as some backends give)."""

    name = "says_unbounded"
    capabilities = pp.Capabilities(dense=True)
    options = {}

    def solve(self, qp, warm_start=None):
        return self._nan_solution(qp, pp.Status.DUAL_INFEASIBLE, self.name)


def _big_side_lp(L):
    # min x0 + ½ x1² − x1  s.t.  x0 >= L,  1e-4 x0 >= −2e-4 |L|:  x = (L, 1), bounded
    return pp.QP(P=np.diag([0.0, 1.0]), q=[1.0, -1.0], C=[[1.0, 0.0], [1e-4, 0.0]], l=[L, -2e-4 * abs(L)],
                 u=[np.inf, np.inf])


@pytest.mark.parametrize("L", [-1.0, -1e4, -1e10])
def test_a_bounded_problem_is_not_called_unbounded(L):
    sol = pp.solve_qp(_big_side_lp(L), backend=SaysUnbounded)
    assert sol.status is pp.Status.NUMERICAL_ERROR
    assert "recession cone" in str(sol.info)


@pytest.mark.parametrize("qp", [
    pp.QP(P=np.diag([0.0, 1.0]), q=[1.0, -1.0], C=[[0.0, 1.0]], l=[-1.0], u=[1.0]),  # x0 -> -inf
    pp.QP(P=np.zeros((2, 2)), q=[-1.0, 0.0], lb=[0.0, 0.0], ub=[np.inf, 1.0]),  # x0 -> +inf
    pp.QP(P=np.zeros((2, 2)), q=[-1.0, -1.0], C=[[1.0, -1.0]], l=[0.0], u=[0.0], lb=[0.0, 0.0]),  # x0 = x1 -> inf
])
def test_an_unbounded_problem_keeps_the_claim(qp):
    assert no_descent_ray(qp) is None
    assert pp.solve_qp(qp, backend=SaysUnbounded).status is pp.Status.DUAL_INFEASIBLE


def test_clarabel_on_an_optimum_at_a_big_row_side():
    pytest.importorskip("clarabel")
    sol = pp.solve_qp(_big_side_lp(-1e10), backend="clarabel")
    assert sol.status is not pp.Status.DUAL_INFEASIBLE
    if sol.status.ok:
        np.testing.assert_allclose(sol.x, [-1e10, 1.0], rtol=1e-6)


E = 2.0 ** -34  # ~5.8e-11, exact in floats


@pytest.mark.parametrize("qp", [
    # x0 − E x1 <= 0, x0 >= 0: x = (E t, t) descends −E t; HiGHS drops the 5.8e-11 of a row scaled to 1
    pp.QP(P=np.zeros((2, 2)), q=[-1.0, 0.0], C=[[1.0, -E]], l=[-np.inf], u=[0.0], lb=[0.0, -np.inf]),
    # ½ (x0 + E x1)² − x0: d = (E, −1) has P d = 0 exactly and q·d = −E
    pp.QP(P=np.array([[1.0, E], [E, E * E]]), q=[-1.0, 0.0]),
])
def test_rows_spanning_more_than_the_lp_resolves_keep_the_claim(qp):
    assert no_descent_ray(qp) is None
    assert pp.solve_qp(qp, backend=SaysUnbounded).status is pp.Status.DUAL_INFEASIBLE


@pytest.mark.parametrize("qp", [
    pp.QP(P=np.diag([1.0, 0.0]), q=[0.0, 0.0]),
    pp.QP(P=np.zeros((2, 2)), q=[0.0, 0.0], C=[[1.0, 1.0]], l=[1.0], u=[np.inf]),
])
def test_a_zero_cost_is_never_unbounded(qp):
    sol = pp.solve_qp(qp, backend=SaysUnbounded)
    assert sol.status is pp.Status.NUMERICAL_ERROR and "q = 0" in str(sol.info)


def test_identical_batch_elements_get_one_verdict():
    """Past the count of LPs a batch may run, elements sharing constraints and q were left unchecked: 64 refuted,
    the rest DUAL_INFEASIBLE for the same problem."""
    qp = _big_side_lp(-1e10)
    bs = pp.get_backend(SaysUnbounded).solve_batch(qp, q=np.tile(qp.q, (70, 1)))
    assert set(bs.status) == {pp.Status.NUMERICAL_ERROR}
    mixed = np.tile(qp.q, (4, 1))
    mixed[1] = [-1.0, 0.0]  # x0 -> +inf is a ray here: that element keeps the claim
    bs = pp.get_backend(SaysUnbounded).solve_batch(qp, q=mixed)
    assert [s.name for s in bs.status] == ["NUMERICAL_ERROR", "DUAL_INFEASIBLE", "NUMERICAL_ERROR", "NUMERICAL_ERROR"]
