"""The IPM's end game: a run stalled near its tolerances stops (``stall_iter``) and the backend polishes its
answer on the active set its multipliers name (:mod:`polyproj.backends.active_polish`).

The stall: random QPs at n 400 reach dual residual ~4e-10 and then lose it to the rounding of the normal
equations (``D = z/s`` over 20+ magnitudes) and creep near 1e-8 for 40-90 iterations (SOLVED_INACCURATE at
the 100-iteration cap before).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import polyproj as pp
from polyproj.backends import active_polish
from polyproj.backends.active_polish import polish_active
from polyproj.solvers.ipm import solve_qp_batch


def stalling_qp(n: int = 400, seed: int = 0) -> pp.QP:
    rng = np.random.default_rng(seed)
    M = rng.normal(size=(n, n))
    P = M @ M.T / n + 1e-3 * np.eye(n)
    C = rng.normal(size=(n, n))
    x0 = rng.normal(size=n)
    l, u = C @ x0 - rng.uniform(0.1, 1, n), C @ x0 + rng.uniform(0.1, 1, n)
    l[: n // 2] = -np.inf
    return pp.QP(P=P, q=rng.normal(size=n), C=C, l=l, u=u, lb=x0 - 1, ub=x0 + 1)


def kkt_ok(sol: pp.Solution, tol: float) -> bool:
    return sol.primal_residual() <= tol and sol.dual_residual() <= tol and sol.duality_gap() <= tol


def point(dist: float, near: bool = True):
    """A one-element KKTPoint at distance ``dist`` from its tolerances (dual residual dist, tolerances 1)."""
    from polyproj.solvers.ipm.state import KKTPoint

    one = np.ones(1)
    return KKTPoint(np.zeros((1, 1)), np.zeros((1, 0)), np.zeros((1, 1)), 0 * one, dist * one, 0 * one, one, one,
                    one, np.array([dist <= 1]), np.array([near]))


def test_record_stops_an_element_that_stalls_near_its_tolerances():
    """stall_iter points in a row that do not halve the best distance, near the tolerances: SOLVED_INACCURATE;
    a halving resets the count; far from the tolerances, or without stall_iter, it runs on."""
    from polyproj.solvers.ipm.result import CODES, RUNNING, StatusCodes
    from polyproj.solvers.ipm.state import LoopState
    from polyproj.solvers.ipm.termination import record

    codes = StatusCodes(np, 1, "cpu")

    def run(dists, stall_iter, near=True):
        loop = LoopState(0, None, None, codes.running, codes.zeros, codes.zeros, codes.zeros, codes.zeros)
        for k, d in enumerate(dists):
            loop = record(np, codes, point(d, near), loop, stall_iter)
            if int(loop.status[0]) != RUNNING:
                return k, int(loop.status[0])
        return None, RUNNING

    creep = [50.0] + [5.0 * 0.97 ** k for k in range(30)]
    assert run(creep, 10) == (11, CODES["SOLVED_INACCURATE"])  # 10 points after the last halving (5 after 50)
    assert run(creep, None) == (None, RUNNING)
    assert run(creep, 10, near=False) == (None, RUNNING)
    halving = [50.0] + [5.0 * 0.97 ** k for k in range(8)] + [2.0] + [2.0 * 0.97 ** k for k in range(12)]
    assert run(halving, 10)[0] == 19  # the count restarts at the point that halved the best distance
    assert run([50.0, 20.0, 8.0, 3.0, 1.2, 0.5], 2) == (5, CODES["SOLVED"])
    # steady convergence slower than 2x an iteration halves the best distance every few iterations: no stall
    steady = [50.0] + [10.0 * 1.3 ** -k for k in range(40)]
    assert run(steady, 3) == (10, CODES["SOLVED"])


def test_stall_iter_is_checked():
    qp = stalling_qp(20)
    with pytest.raises(pp.ProblemError, match="stall_iter"):
        solve_qp_batch(qp.P, qp.q, qp.C, qp.l, qp.u, qp.lb, qp.ub, stall_iter=0)


@pytest.mark.parametrize("seed", [0, 1])
def test_backend_answers_exact_kkt_points_where_the_ipm_stalls(seed):
    """Whether the run stalls (and is polished) or creeps to the tolerances depends on the machine's rounding;
    either way the answer is SOLVED and within them (SOLVED_INACCURATE after 100 iterations before)."""
    qp = stalling_qp(seed=seed)
    sol = pp.solve_qp(qp, backend="ipm", eps_abs=1e-8)
    assert sol.status is pp.Status.SOLVED
    assert kkt_ok(sol, 1e-8)
    ref = pp.solve_qp(qp, backend="piqp", eps_abs=1e-9)
    obj = lambda s: 0.5 * s.x @ qp.P @ s.x + qp.q @ s.x  # noqa: E731
    assert abs(obj(sol) - obj(ref)) <= 1e-7 * (1 + abs(obj(ref)))


def test_batch_elements_are_solved_too():
    qp = stalling_qp()
    Q = np.vstack([qp.q, qp.q + 0.01])
    bs = pp.get_backend("ipm", eps_abs=1e-8).solve_batch(qp, q=Q)
    assert all(s is pp.Status.SOLVED for s in bs.status)
    for i in range(2):
        el = pp.Solution(x=bs.x[i], z=bs.z[i], z_box=bs.z_box[i], status=bs.status[i], qp=pp.QP(
            P=qp.P, q=Q[i], C=qp.C, l=qp.l, u=qp.u, lb=qp.lb, ub=qp.ub))
        assert kkt_ok(el, 1e-8)


def test_end_game_polishes_or_solves_again(monkeypatch):
    """A SOLVED_INACCURATE answer: polished when polish_active verifies a point; otherwise, stopped early by the
    stall rule, solved again without it within the time left, and that run answers only where it ended SOLVED or
    SOLVED_INACCURATE (a time limit or the cap cutting it short keeps the stalled answer)."""
    from dataclasses import replace

    qp = small_qp()
    x, z, zb = exact_small()
    solver = pp.get_backend("ipm", eps_abs=1e-9)
    rough = pp.Solution(x=x + 1e-7, z=z, z_box=zb + np.array([0.0, 0.0, -1e-9]), status=pp.Status.SOLVED_INACCURATE,
                        iterations=12, solve_time=0.5, qp=qp, backend="ipm")
    got = solver._polished(rough)
    assert got.status is pp.Status.SOLVED and got.info["polished"] and got.iterations == 12
    np.testing.assert_allclose(got.x, x, atol=1e-15)
    done = replace(rough, status=pp.Status.SOLVED)
    assert solver._polished(done) is done  # only SOLVED_INACCURATE answers are touched
    monkeypatch.setattr(active_polish, "polish_active", lambda *a, **k: None)
    assert solver._polished(rough).status is pp.Status.SOLVED_INACCURATE
    now = time.perf_counter()
    assert solver._again(rough, True, now) is None  # no time limit: solved again, unbounded
    assert solver._again(rough, False, now) is False  # not stopped by the stall rule
    assert solver._again(replace(rough, iterations=100), True, now) is False  # at the cap
    assert solver._again(done, True, now) is False
    timed = pp.get_backend("ipm", eps_abs=1e-9, time_limit=5.0)
    assert 2.5 < timed._again(rough, True, now - 2.0) <= 3.0
    assert timed._again(rough, True, now - 6.0) is False  # the time is spent
    full = replace(rough, status=pp.Status.SOLVED, iterations=40, solve_time=1.0)
    got = solver._resolved(rough, full)
    assert got.status is pp.Status.SOLVED and got.iterations == 40 and got.info["stalled_at"] == 12
    assert got.solve_time == pytest.approx(1.5)
    cut = replace(full, status=pp.Status.TIME_LIMIT)
    kept = solver._resolved(rough, cut)
    assert kept.status is pp.Status.SOLVED_INACCURATE and kept.iterations == 12
    assert kept.solve_time == pytest.approx(1.5)


def test_a_resolve_cut_by_the_time_limit_keeps_the_stalled_answer(monkeypatch):
    """The reviewer's case: the polish does not settle a stalled element and the re-solve runs into time_limit;
    the answer is the stalled run's SOLVED_INACCURATE point, not a TIME_LIMIT one, and the call keeps the limit."""
    qp = stalling_qp()
    monkeypatch.setattr(active_polish, "polish_active", lambda *a, **k: None)
    t0 = time.perf_counter()
    sol = pp.solve_qp(qp, backend="ipm", eps_abs=1e-8, time_limit=0.6)
    wall = time.perf_counter() - t0
    # SOLVED_INACCURATE: the stalled point kept (or a re-solve that finished); TIME_LIMIT only from the first run
    # (a slow machine), never a re-solve's cut-short point in place of the stalled one
    assert sol.status in (pp.Status.SOLVED, pp.Status.SOLVED_INACCURATE, pp.Status.TIME_LIMIT)
    assert not (sol.status is pp.Status.TIME_LIMIT and "stalled_at" in sol.info)
    assert wall < 0.6 + 2.0  # the limit, plus set-up and the last iteration in progress


# ----------------------------------------------------------------------------- polish_active itself
def small_qp():
    """min ½|x|² − (2, 2, -1)·x  s.t. x1 + x2 <= 1 (active), x3 >= 0 (active bound), x1 − x2 = 0.5 (equality)."""
    return pp.QP(P=np.eye(3), q=np.array([-2.0, -2.0, 1.0]), C=np.array([[1.0, 1.0, 0.0], [1.0, -1.0, 0.0]]),
                 l=np.array([-np.inf, 0.5]), u=np.array([1.0, 0.5]), lb=np.array([-5.0, -5.0, 0.0]),
                 ub=np.array([5.0, 5.0, 5.0]))


def exact_small():
    # x1 + x2 = 1, x1 − x2 = 0.5: x = (0.75, 0.25, 0); stationarity x + q + Cᵀz + z_box = 0
    x = np.array([0.75, 0.25, 0.0])
    # rows: z1 (x1 + x2 <= 1, upper: > 0), z2 (equality); (0.75 − 2) + z1 + z2 = 0, (0.25 − 2) + z1 − z2 = 0
    z1 = 1.5
    z2 = 1.25 - z1
    return x, np.array([z1, z2]), np.array([0.0, 0.0, -1.0])  # x3: 0 + 1 + zb3 = 0, lower bound: negative


def test_polish_active_recovers_the_exact_point_from_an_interior_iterate():
    qp = small_qp()
    x, z, zb = exact_small()
    rng = np.random.default_rng(0)
    # an IPM-like iterate: strictly inside, multipliers ~1e-6 off, inactive ones tiny but nonzero
    xi = x + 1e-6 * rng.normal(size=3)
    xi[2] = 1e-7
    zi, zbi = z + 1e-6, zb + np.array([1e-9, -1e-9, 1e-6])
    got = polish_active(qp, xi, zi, zbi, 1e-9, 0.0)
    assert got is not None
    np.testing.assert_allclose(got[0], x, atol=1e-15)
    np.testing.assert_allclose(got[1], z, atol=1e-14)
    np.testing.assert_allclose(got[2], zb, atol=1e-14)


def test_polish_active_corrects_a_wrong_side_and_refuses_what_it_cannot_verify():
    qp = small_qp()
    x, z, zb = exact_small()
    # the bound of x3 named active with the wrong sign (upper side): dropped, the violated lower side added
    got = polish_active(qp, x, z, np.array([0.0, 0.0, 1.0]), 1e-9, 0.0)
    assert got is not None
    np.testing.assert_allclose(got[0], x, atol=1e-14)
    assert polish_active(qp, x * np.nan, z, zb, 1e-9, 0.0) is None
    # a multiplier on a side with no bound never names it active (x1 has no upper C side besides row 1)
    inf_qp = pp.QP(P=np.eye(1), q=np.array([1.0]), lb=np.array([-np.inf]), ub=np.array([np.inf]))
    got = polish_active(inf_qp, np.array([-1.0]), np.zeros(0), np.array([5.0]), 1e-9, 0.0)
    assert got is not None and got[2][0] == 0.0 and got[0][0] == -1.0


def test_polish_active_leaves_large_systems_alone(monkeypatch):
    monkeypatch.setattr(active_polish, "MAX_SIZE", 2)
    x, z, zb = exact_small()
    assert polish_active(small_qp(), x, z, zb, 1e-9, 0.0) is None
