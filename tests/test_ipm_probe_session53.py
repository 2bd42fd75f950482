"""Probe of the ``ipm`` backend's end game (session 53): what its answers say, and its time accounting.

- a polished answer's ``info`` residuals are those of the point returned, not of the iterate it replaced;
- a re-solve after a stall, and the elements of a batch solved one by one after the batch run (fixed variables),
  end before the call's ``time_limit`` (an answer after it is TIME_LIMIT: the answers in hand were lost with it);
- a batch element without a point (infeasible) is NaN throughout where its fixed variables were substituted, as
  ``solve``'s answer for it.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import polyproj as pp
from polyproj.backends import active_polish
from polyproj.backends.ipm import IPMSolver
from polyproj.solvers.ipm.result import CODES, IPMResult


def small_qp() -> pp.QP:
    """min ½|x|² − (2, 2, -1)·x  s.t. x1 + x2 <= 1, x1 − x2 = 0.5, x3 >= 0: x = (0.75, 0.25, 0)."""
    return pp.QP(P=np.eye(3), q=np.array([-2.0, -2.0, 1.0]), C=np.array([[1.0, 1.0, 0.0], [1.0, -1.0, 0.0]]),
                 l=np.array([-np.inf, 0.5]), u=np.array([1.0, 0.5]), lb=np.array([-5.0, -5.0, 0.0]),
                 ub=np.array([5.0, 5.0, 5.0]))


def exact_small() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # stationarity x + q + Cᵀz + z_box = 0 at x = (0.75, 0.25, 0): z = (1.5, -0.25), z_box = (0, 0, -1)
    return np.array([0.75, 0.25, 0.0]), np.array([1.5, -0.25]), np.array([0.0, 0.0, -1.0])


def test_polished_answer_reports_its_own_residuals():
    """The iterate's residuals (here 1e-7 off) were left in info beside the polished point (exact to rounding)."""
    qp = small_qp()
    x, z, zb = exact_small()
    solver = pp.get_backend("ipm", eps_abs=1e-9)
    stale = {"prim_res": 1e-7, "dual_res": 2e-7, "gap": 3e-7}
    rough = pp.Solution(x=x + 1e-7, z=z, z_box=zb, status=pp.Status.SOLVED_INACCURATE, iterations=12,
                        solve_time=0.1, qp=qp, backend="ipm", info=stale)
    got = solver._polished(rough)
    assert got.status is pp.Status.SOLVED and got.info["polished"]
    assert got.info["prim_res"] == got.primal_residual() <= 1e-12
    assert got.info["dual_res"] == got.dual_residual() <= 1e-12
    assert got.info["gap"] == got.duality_gap() <= 1e-12
    np.testing.assert_allclose(got.x, x, atol=1e-15)


def test_fixed_elements_of_a_batch_share_the_call_time_limit():
    """Each element with a fixed variable was solved with the whole time_limit after the batch run (a batch of such
    elements took their sum); now with what is left of it, and without a run (TIME_LIMIT, NaN) when none is."""
    qp = small_qp()
    solver = pp.get_backend("ipm", time_limit=5.0)
    fixed = qp.with_vectors(lb=np.array([0.75, -5.0, 0.0]), ub=np.array([0.75, 5.0, 5.0]))
    spent = solver._fixed_element(fixed, time.perf_counter() - 6.0)
    assert spent.status is pp.Status.TIME_LIMIT and np.isnan(spent.x).all() and spent.iterations == 0
    seen = []
    original = IPMSolver._solve

    def spy(self, q, warm_start=None, stall=True, time_limit=None):
        seen.append(self.settings["time_limit"])
        return original(self, q, warm_start, stall, time_limit)

    try:
        IPMSolver._solve = spy
        sol = solver._fixed_element(fixed, time.perf_counter() - 2.0, reserve=1.0)
    finally:
        IPMSolver._solve = original
    assert sol.status is pp.Status.SOLVED
    np.testing.assert_allclose(sol.x, exact_small()[0], atol=1e-7)
    assert len(seen) == 1 and 1.0 < seen[0] <= 2.0  # 5 s, less 2 spent and 1 kept back
    no_limit = pp.get_backend("ipm")._fixed_element(fixed, time.perf_counter() - 1e6)
    assert no_limit.status is pp.Status.SOLVED


def test_batch_with_no_time_left_for_its_fixed_elements(monkeypatch):
    """End to end: with nothing left of time_limit after the batch run, the elements with fixed variables are
    TIME_LIMIT (no run) and the others keep their SOLVED answers (they were solved with the whole limit each)."""
    qp = small_qp()
    monkeypatch.setattr(IPMSolver, "_reserve", staticmethod(lambda wall, iterations: 1e9))
    LB, UB = np.tile(qp.lb, (3, 1)), np.tile(qp.ub, (3, 1))
    LB[1, 0] = UB[1, 0] = 0.75
    bs = pp.get_backend("ipm", time_limit=100.0).solve_batch(qp, lb=LB, ub=UB)
    assert bs.status[0] is pp.Status.SOLVED and bs.status[2] is pp.Status.SOLVED
    assert bs.status[1] is pp.Status.TIME_LIMIT and np.isnan(bs.x[1]).all()
    np.testing.assert_allclose(bs.x[0], exact_small()[0], atol=1e-7)
    monkeypatch.undo()
    bs = pp.get_backend("ipm", time_limit=100.0).solve_batch(qp, lb=LB, ub=UB)
    assert all(s is pp.Status.SOLVED for s in bs.status)
    np.testing.assert_allclose(bs.x[1], exact_small()[0], atol=1e-7)


def test_reserve_is_two_iterations_of_the_first_run():
    assert IPMSolver._reserve(0.3, 10) == pytest.approx(0.06)
    assert IPMSolver._reserve(0.3, 0) == pytest.approx(0.6)
    solver = pp.get_backend("ipm", time_limit=5.0)
    rough = pp.Solution(x=np.zeros(3), z=np.zeros(2), z_box=np.zeros(3), status=pp.Status.SOLVED_INACCURATE,
                        iterations=12, qp=small_qp())
    now = time.perf_counter()
    assert 1.5 < solver._again(rough, True, now - 2.0, reserve=1.0) <= 2.0
    assert solver._again(rough, True, now - 2.0, reserve=3.5) is False


def test_a_resolve_that_overruns_its_budget_keeps_the_stalled_answer(monkeypatch):
    """The re-solve was given all the time left and, as an IPM run does, ended past its deadline: the guard then made
    the call TIME_LIMIT and the stalled SOLVED_INACCURATE answer was lost (docs/ipm.md: it stands). A stand-in run:
    the first stalls after 0.2 s (2 iterations: 0.2 s kept back), the second overruns its budget by 0.05 s; the
    0.15 s left of the limit are the margin for the Python around the runs on a loaded machine."""
    qp = small_qp()
    x, z, zb = exact_small()
    monkeypatch.setattr(active_polish, "polish_active", lambda *a, **k: None)
    calls = []

    def run(self, qp_, q, l, u, lb, ub, x0, stall=True, time_limit=None):
        calls.append(time_limit)
        code = CODES["SOLVED_INACCURATE"] if stall else CODES["TIME_LIMIT"]
        wall = 0.2 if stall else float(time_limit) + 0.05
        time.sleep(wall)
        res = IPMResult(x[None] + 1e-9, z[None], zb[None], np.array([code]), np.array([2 if stall else 40]),
                        np.array([1e-9]), np.array([0.0]), np.array([1e-9]))
        return res, wall

    monkeypatch.setattr(IPMSolver, "_run", run)
    sol = pp.solve_qp(qp, backend="ipm", eps_abs=1e-9, time_limit=1.0)
    assert len(calls) == 2 and calls[1] <= 1.0 - 0.2 - 0.2 + 1e-9  # the limit, less the first run and 2 iterations
    assert sol.status is pp.Status.SOLVED_INACCURATE, sol.info
    assert sol.iterations == 2
    np.testing.assert_allclose(sol.x, x + 1e-9, atol=1e-15)


def test_batch_without_fixed_gives_nan_for_elements_without_a_point():
    """q-only batch with a fixed variable: an infeasible element was x = (0.5, nan, nan) (its fixed value beside
    NaN), where solve gives NaN throughout; MAX_ITER elements keep their point."""
    qp = pp.QP(P=np.eye(3), q=np.zeros(3), C=np.array([[1.0, 1.0, 0.0]]), l=[5.0], u=[np.inf],
               lb=np.array([0.5, 0.0, 0.0]), ub=np.array([0.5, 1.0, 1.0]))
    Q = np.array([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    bs = pp.get_backend("ipm").solve_batch(qp, q=Q)
    one = pp.solve_qp(qp, backend="ipm")
    assert one.status is pp.Status.PRIMAL_INFEASIBLE and np.isnan(one.x).all()
    for i in range(2):
        assert bs.status[i] is pp.Status.PRIMAL_INFEASIBLE
        assert np.isnan(bs.x[i]).all() and np.isnan(bs.z[i]).all() and np.isnan(bs.z_box[i]).all()
    feasible = qp.with_vectors(l=np.array([1.0]))
    bs = pp.get_backend("ipm", max_iter=1).solve_batch(feasible, q=Q)
    assert all(s is pp.Status.MAX_ITER for s in bs.status)
    assert np.isfinite(bs.x).all() and (bs.x[:, 0] == 0.5).all()
