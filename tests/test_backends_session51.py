"""Session 51: warm starts that do not verify are solved again cold (ProxSuite, DAQP); the ADMM's step size at x* = 0.

Every optimum below is worked out by hand from the KKT conditions (stationarity with the active sides), not taken
from a backend.
"""

from __future__ import annotations

import numpy as np
import pytest

import polyproj as pp
from polyproj.solution import BatchSolution

inf = np.inf


def _kkt(sol: pp.Solution, tol: float) -> None:
    """``sol`` SOLVED and a KKT point of its own QP at ``tol`` (multipliers on infinite sides counted)."""
    assert sol.status is pp.Status.SOLVED, (sol.status, sol.info)
    assert sol.primal_residual() <= tol and sol.dual_residual() <= tol and sol.duality_gap() <= tol


# ----------------------------------------------------------------------------- ProxSuite
def test_proxsuite_warm_start_with_a_multiplier_on_a_bound_now_gone_is_solved_again_cold():
    """A: x₂ fixed at 0 (its answer has z_box₂ = −1); B: only x₂ <= 0, optimum (0, −1) with no active bound.

    Warm-started from A's answer ProxQP returned it unchanged after 0 iterations as SOLVED (z_box₂ = −1 on the side
    B does not have: the guard made it NUMERICAL_ERROR).
    """
    pytest.importorskip("proxsuite")
    A = pp.QP(P=np.diag([2.0, 1.0]), q=[0.0, 1.0], lb=[-inf, 0.0], ub=[inf, 0.0])
    B = A.with_vectors(lb=[-inf, -inf])
    wa = pp.solve_qp(A, backend="proxsuite")
    wb = pp.solve_qp(B, backend="proxsuite", warm_start=wa)
    _kkt(wb, 1e-7)
    # min x₁² + ½x₂² + x₂, x₂ <= 0: x = (0, −1), no multiplier
    np.testing.assert_allclose(wb.x, [0.0, -1.0], atol=1e-7)
    np.testing.assert_allclose(wb.z_box, [0.0, 0.0], atol=1e-7)
    assert "claimed_status" not in wb.info


def _equality_qp():
    """min 2x₁² + ½x₂² + 2x₃²  s.t.  2x₃ <= u₀, −2x₁ + 2x₃ = 2."""
    return pp.QP(P=np.diag([4.0, 1.0, 4.0]), q=np.zeros(3), C=np.array([[0.0, 0, 2], [-2.0, 0, 2]]),
                 l=[-inf, 2.0], u=[0.0, 2.0])


def test_proxsuite_warm_start_from_a_neighbour_with_the_row_now_unbounded_is_solved_again_cold():
    """Only u₀ changes, 0 -> inf: the neighbour's z₀ = 2 sits on a side the QP no longer has (dual residual 2).

    With u₀ = inf: x₃ = x₁ + 1 and 2x₁² + 2(x₁ + 1)² is least at x₁ = −½: x = (−½, 0, ½); stationarity
    4x₁ − 2z₁ = 0 gives z₁ = −1, and 4x₃ + 2z₀ + 2z₁ = 0 gives z₀ = 0.
    """
    pytest.importorskip("proxsuite")
    qp = _equality_qp()
    near = pp.solve_qp(qp, backend="proxsuite")  # u₀ = 0: x = (−1, 0, 0), z = (2, −2)
    np.testing.assert_allclose(near.x, [-1.0, 0.0, 0.0], atol=1e-7)
    far = qp.with_vectors(u=[inf, 2.0])
    sol = pp.solve_qp(far, backend="proxsuite", warm_start={"x": near.x, "z": near.z, "z_box": near.z_box})
    _kkt(sol, 1e-7)
    np.testing.assert_allclose(sol.x, [-0.5, 0.0, 0.5], atol=1e-7)
    np.testing.assert_allclose(sol.z, [0.0, -1.0], atol=1e-7)


def test_proxsuite_warm_started_batch_verifies_each_element():
    """The kit's batch (``polyproj check proxsuite --seed 0``): element i warm-started from element 3 − i's answer."""
    pytest.importorskip("proxsuite")
    qp = _equality_qp()
    U = np.array([[0, 2], [0, 2], [inf, 2], [0, 2]], float)
    s = pp.get_backend("proxsuite")
    cold = s.solve_batch(qp, u=U)
    warm = s.solve_batch(qp, u=U, warm_start=BatchSolution.stack([cold.solution(j) for j in (3, 2, 1, 0)],
                                                                    backend="proxsuite"))
    for i in range(4):
        e = warm.solution(i)
        _kkt(e, 1e-7)
        # u₀ = 0: x₃ <= 0 active, x₁ = x₃ − 1 = −1; u₀ = inf: the optimum above
        np.testing.assert_allclose(e.x, [-0.5, 0.0, 0.5] if i == 2 else [-1.0, 0.0, 0.0], atol=1e-7)


def test_proxsuite_warm_start_from_the_answer_itself_is_kept():
    """The check costs a good warm start nothing: the QP's own answer as the start is not solved again."""
    pytest.importorskip("proxsuite")
    qp = _equality_qp()
    first = pp.solve_qp(qp, backend="proxsuite")
    again = pp.solve_qp(qp, backend="proxsuite", warm_start=first)
    _kkt(again, 1e-7)
    assert "warm_start" not in again.info
    np.testing.assert_allclose(again.x, [-1.0, 0.0, 0.0], atol=1e-7)


# ----------------------------------------------------------------------------- DAQP
def test_daqp_warm_start_from_a_problem_with_a_fixed_variable_is_solved_again_cold():
    """A: x₁ fixed at 0 (z_box₁ = 1); B: 0 <= x₁ <= 1. DAQP started from A's multipliers said DUAL_INFEASIBLE.

    B: min −x₁ + ½x₂² over 0 <= x₁ <= 1, −1 <= x₂ <= 0: x = (1, 0), z_box₁ = 1 (upper side, −1 + z = 0), z_box₂ = 0.
    """
    pytest.importorskip("daqp")
    A = pp.QP(P=np.diag([0.0, 1.0]), q=[-1.0, 0.0], lb=[0.0, -1.0], ub=[0.0, 0.0])
    B = A.with_vectors(ub=[1.0, 0.0])
    wa = pp.solve_qp(A, backend="daqp")
    wb = pp.solve_qp(B, backend="daqp", warm_start=wa)
    _kkt(wb, 1e-9)
    np.testing.assert_allclose(wb.x, [1.0, 0.0], atol=1e-9)
    np.testing.assert_allclose(wb.z_box, [1.0, 0.0], atol=1e-9)
    assert "claimed_status" not in wb.info


def test_daqp_warm_start_from_the_answer_itself_is_kept():
    """P = I, q = (−2, 0) in the same box: x = (1, 0), z_box₁ = 1 (1 − 2 + z = 0); its own answer is kept.

    (With P = diag(0, 1) DAQP calls the QP unbounded even from its own answer: solved again cold, as above.)
    """
    pytest.importorskip("daqp")
    qp = pp.QP(P=np.eye(2), q=[-2.0, 0.0], lb=[0.0, -1.0], ub=[1.0, 0.0])
    first = pp.solve_qp(qp, backend="daqp")
    again = pp.solve_qp(qp, backend="daqp", warm_start=first)
    _kkt(again, 1e-9)
    assert "warm_start" not in again.info
    np.testing.assert_allclose(again.x, [1.0, 0.0], atol=1e-9)
    np.testing.assert_allclose(again.z_box, [1.0, 0.0], atol=1e-9)


# ----------------------------------------------------------------------------- ADMM
@pytest.mark.parametrize("ub2", [0.0, 1.0])
def test_admm_solves_a_qp_whose_optimum_is_the_origin(ub2):
    """P = [[2, 1], [1, 2]], q = (0, 2), 0 <= x₂ <= ub₂ (x₂ fixed for ub₂ = 0): x* = (0, 0).

    x₂ sits on its lower side 0 (its gradient x₁ + 2x₂ + 2 = 2 > 0): z_box₂ = −2; x₁ is free, 2x₁ + x₂ = 0. The
    step-size balance measured the primal residual against |x| -> 0 and raised ρ to 1e6: MAX_ITER after 4,000
    iterations with the dual residual stalled at 1.6e-8 (8e-6 for ub₂ = 1), just above eps_abs.
    """
    qp = pp.QP(P=[[2.0, 1.0], [1.0, 2.0]], q=[0.0, 2.0], lb=[-inf, 0.0], ub=[inf, ub2])
    s = pp.solve_qp(qp, backend="admm")
    _kkt(s, 1e-8)
    assert s.iterations < 500
    np.testing.assert_allclose(s.x, [0.0, 0.0], atol=1e-8)
    np.testing.assert_allclose(s.z_box, [0.0, -2.0], atol=1e-7)


def test_admm_batch_with_one_element_at_the_origin():
    """``polyproj check admm --seed 0``: P = 2, rows −2x, 3x, −x; element 0 has −2x = −4 (x = 2), element 1 −2x = 0.

    The equality row decides x (the multipliers are not unique: the row 3x <= u is active too); run as one batch (one
    step size) element 0 ended MAX_ITER.
    """
    qp = pp.QP(P=[[2.0]], q=[-5.0], C=[[-2.0], [3.0], [-1.0]], l=[-4.0, -inf, -4.0], u=[-4.0, 6.0, inf])
    bs = pp.get_backend("admm").solve_batch(qp, q=np.array([[-5.0], [1.0]]),
                                            l=np.array([[-4.0, -inf, -4.0], [0.0, -inf, -1.0]]),
                                            u=np.array([[-4.0, 6.0, inf], [0.0, 0.0, 2.0]]))
    for i, x in enumerate([2.0, 0.0]):
        e = bs.solution(i)
        _kkt(e, 1e-8)
        np.testing.assert_allclose(e.x, [x], atol=1e-8)
