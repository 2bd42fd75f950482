"""Fixed variables substituted in the IPM and Clarabel glue (as in HiGHS's and DAQP's, backends.presolve).

A variable fixed at 1e6..1e8 beside one of unit scale: the IPM returned SOLVED with the unit-scale coordinate
1e-4 to 20 % off (its tolerances relative to the largest entry); Clarabel ended SOLVED_INACCURATE or
NUMERICAL_ERROR.
"""

from __future__ import annotations

import numpy as np
import pytest

import polyproj as pp
from tests.conftest import CPU_BACKENDS

BACKENDS = [b for b in ("ipm", "clarabel") if b in CPU_BACKENDS]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("v", [1e5, 1e6, 1e7, 1e8])
def test_a_far_fixed_variable_leaves_the_others_exact(backend, v):
    qp = pp.QP(P=np.eye(2), q=[-1.0, -2.0], lb=[v, 0.0], ub=[v, 1.0])  # x = (v, 1), upper bound of x2 binding
    s = pp.solve_qp(qp, backend=backend)
    assert s.status is pp.Status.SOLVED
    assert s.x[0] == v and abs(s.x[1] - 1.0) <= 1e-8
    # stationarity P x + q + z_box = 0 with the bound multipliers (upper positive)
    np.testing.assert_allclose(s.z_box, [-(v - 1.0), 1.0], rtol=1e-8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fixed_variable_coupled_through_a_row(backend):
    # min ½|x|² − x₂ − x₃, x₁ = 1e6 fixed, x₁·1e-6 + x₂ + x₃ <= 1: x₂ = x₃ = 0, row multiplier 1
    qp = pp.QP(P=np.eye(3), q=[0.0, -1.0, -1.0], C=[[1e-6, 1.0, 1.0]], l=[-np.inf], u=[1.0],
               lb=[1e6, -5.0, -5.0], ub=[1e6, 5.0, 5.0])
    s = pp.solve_qp(qp, backend=backend)
    assert s.status is pp.Status.SOLVED
    assert s.x[0] == 1e6 and np.abs(s.x[1:]).max() <= 1e-8
    np.testing.assert_allclose(s.z, [1.0], rtol=1e-7)


def test_the_ipm_takes_a_warm_start_beside_fixed_variables():
    pytest.importorskip("polyproj.solvers.ipm")
    qp = pp.QP(P=np.eye(2), q=[-1.0, -2.0], lb=[3.0, 0.0], ub=[3.0, 1.0])
    s = pp.solve_qp(qp, backend="ipm", warm_start={"x": np.array([3.0, 0.5])})
    assert s.status is pp.Status.SOLVED and np.allclose(s.x, [3.0, 1.0], atol=1e-8)


@pytest.mark.parametrize("v", [1e6, 1e7, 1e8])
def test_the_ipm_batch_solves_elements_with_fixed_variables_exactly(v):
    """The batch run itself did not substitute: x₂ = 0.8 and 0.857 for 1 as SOLVED at v = 1e7."""
    if "ipm" not in CPU_BACKENDS:
        pytest.skip("ipm unavailable")
    qp = pp.QP(P=np.eye(2), q=[-1.0, -2.0], lb=[v, 0.0], ub=[v, 1.0])
    b = pp.get_backend("ipm").solve_batch(qp, q=np.array([[-1.0, -2.0], [-1.0, -3.0]]))
    assert all(s is pp.Status.SOLVED for s in b.status) and np.all(b.x[:, 0] == v)
    np.testing.assert_allclose(b.x[:, 1], [1.0, 1.0], rtol=0, atol=1e-8)
    # stationarity x + q + z_box = 0: the fixed variable's multiplier from it, the bound x₂ <= 1's from the solve
    np.testing.assert_allclose(b.z_box, [[-(v - 1.0), 1.0], [-(v - 1.0), 2.0]], rtol=1e-8)
    # fixed in one element only (lb, ub batched): the other goes through the batch run
    free = pp.QP(P=np.eye(2), q=[-1.0, -2.0], lb=[0.0, 0.0], ub=[1e9, 1.0])
    c = pp.get_backend("ipm").solve_batch(free, lb=np.array([[v, 0.0], [0.0, 0.0]]),
                                          ub=np.array([[v, 1.0], [1e9, 1.0]]))
    assert all(s is pp.Status.SOLVED for s in c.status)
    np.testing.assert_allclose(c.x, [[v, 1.0], [1.0, 1.0]], rtol=1e-12, atol=1e-8)
