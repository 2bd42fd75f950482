"""Backend glue: per-problem conversions (QP.memo) are reused, stay private to one problem and are not pickled."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import polyproj as pp
from tests.helpers import solution_distance_bound

GLUE_BACKENDS = [b for b in ("osqp", "highs", "proxsuite") if b in pp.available_backends()]


def _qp(rng, bounds=True):
    n, m = 6, 4
    M = rng.normal(size=(n, n))
    C = rng.normal(size=(m, n))
    l, u = -np.ones(m), np.ones(m)
    l[0] = u[0] = 0.2  # one equality
    kw = dict(lb=-2 * np.ones(n), ub=np.full(n, np.inf)) if bounds else {}
    return pp.QP(P=M @ M.T + np.eye(n), q=rng.normal(size=n), C=C, l=l, u=u, **kw)


@pytest.mark.parametrize("name", GLUE_BACKENDS)
@pytest.mark.parametrize("bounds", [True, False])
def test_repeated_solves_reuse_the_conversion_and_agree(rng, name, bounds):
    qp = _qp(rng, bounds)
    solver = pp.get_backend(name, eps_abs=1e-9)
    first = solver.solve(qp)
    assert first.ok and qp.memo  # the backend kept its solver-ready form
    again = solver.solve(qp)
    np.testing.assert_array_equal(again.x, first.x)
    # a problem with other vectors never sees the first problem's conversion
    other = qp.with_vectors(q=-qp.q, l=qp.l - 0.5)
    assert not other.memo
    sol = solver.solve(other)
    fresh_qp = pp.QP(P=qp.P, q=-qp.q, C=qp.C, l=qp.l - 0.5, u=qp.u, lb=qp.lb, ub=qp.ub)
    fresh = pp.get_backend(name, eps_abs=1e-9).solve(fresh_qp)
    assert sol.status is fresh.status is pp.Status.SOLVED
    # two inexact solves: they agree to what their KKT residuals guarantee, not to eps_abs
    dist = np.linalg.norm(sol.x - fresh.x)
    assert dist <= solution_distance_bound(other, sol) + solution_distance_bound(fresh_qp, fresh)


def test_memo_is_not_pickled(rng):
    qp = _qp(rng)
    pp.get_backend(GLUE_BACKENDS[0]).solve(qp)
    assert qp.memo
    back = pickle.loads(pickle.dumps(qp))
    assert not back.memo
    np.testing.assert_array_equal(back.C, qp.C)
    assert back.has_bounds and np.array_equal(back.bounded, qp.bounded)


@pytest.mark.skipif("highs" not in pp.available_backends(), reason="highspy not installed")
def test_highs_array_model_equals_its_model_object(rng):
    import highspy

    solver = pp.get_backend("highs", eps_abs=1e-9)
    for qp in (_qp(rng), pp.QP(P=np.zeros((3, 3)), q=[1.0, 2.0, -1.0], C=np.ones((1, 3)), l=[-1.0], u=[1.0],
                                lb=np.zeros(3), ub=np.ones(3))):  # a QP and an LP (no Hessian)
        xs = []
        for pass_model in (lambda h, q: h.passModel(solver._model(q)), solver._pass):
            h = solver._highs()
            assert pass_model(h, qp) != highspy.HighsStatus.kError
            h.run()
            xs.append(np.array(h.getSolution().col_value))
        np.testing.assert_array_equal(xs[0], xs[1])


@pytest.mark.core
@pytest.mark.parametrize("name", [b for b in ("proxsuite", "ipm") if b in pp.available_backends()])
@pytest.mark.parametrize("bounds", [True, False])
def test_batch_of_q_matches_single_solves(rng, name, bounds):
    """The array-wise batch collection (only q varies) gives what element-wise solves give,
    including the per-element QPs behind the residual methods."""
    qp = _qp(rng, bounds)
    Q = rng.normal(size=(7, qp.n)) * 3.0
    solver = pp.get_backend(name, eps_abs=1e-10)
    batch = solver.solve_batch(qp, q=Q)
    assert len(batch.qps) == 7 and batch.qps[-1].q is not None
    for i in range(7):
        one = solver.solve(qp.with_vectors(q=Q[i]))
        assert batch.status[i] == one.status == pp.Status.SOLVED
        el = batch.solution(i)
        np.testing.assert_array_equal(el.qp.q, Q[i])
        assert el.primal_residual() <= 1e-8 and el.dual_residual() <= 1e-7
        # batch and single solves are different code paths, both inexact: x agrees to the sum of the KKT
        # distance bounds; the multipliers are held to the residuals above, not to each other
        dist = np.linalg.norm(batch.x[i] - one.x)
        assert dist <= solution_distance_bound(el.qp, el) + solution_distance_bound(el.qp, one)
    with pytest.raises(IndexError):
        batch.qps[7]


def test_proxsuite_batch_flags_unbounded_elements_per_element():
    """Only q varies, yet one element is unbounded (x_n has no curvature and no upper bound)."""
    if "proxsuite" not in pp.available_backends():
        pytest.skip("proxsuite not installed")
    n = 4
    P = np.diag([1.0, 1.0, 1.0, 0.0])
    C = np.array([[1.0, 1.0, 0.0, 0.0]])
    qp = pp.QP(P=P, q=np.zeros(n), C=C, l=[-1.0], u=[1.0], lb=np.array([-5, -5, -5, 0.0]),
               ub=np.array([5, 5, 5, np.inf]))
    Q = np.tile([0.3, -0.2, 0.1, 1.0], (3, 1))
    Q[1, 3] = -1.0  # decreasing along x_n -> +inf
    batch = pp.get_backend("proxsuite", eps_abs=1e-9, max_iter=2000).solve_batch(qp, q=Q)
    assert batch.status[1] == pp.Status.DUAL_INFEASIBLE
    assert batch.status[0] == batch.status[2] == pp.Status.SOLVED


def _projection_data(rng, n=12, m=20):
    A = rng.normal(size=(m, n))
    x0 = rng.normal(size=n)
    a = A @ x0 + rng.uniform(0.1, 1.0, size=m)
    B = rng.normal(size=(1, n))
    return pp.Polyhedron(A=A, a=a, B=B, b=B @ x0, lb=x0 - 1.5, ub=x0 + 1.5), x0


def test_daqp_projections_equal_its_guarded_solves(rng):
    # DAQPSolver.solve_projections calls daqp per point on arrays built once; its starts are those of the
    # guarded per-QP path (solve_on_host), point for point
    pytest.importorskip("daqp")
    from polyproj.backends.projection import solve_on_host
    from polyproj.polydata import PolyData

    P, x0 = _projection_data(rng)
    d = PolyData.from_polyhedron(P)
    X = x0 + 3.0 * rng.normal(size=(7, P.n))
    solver = pp.get_backend("daqp")
    fast, ref = solver.solve_projections(X, d), solve_on_host(solver, X, d)
    assert fast.status == ref.status and all(s.ok for s in fast.status)
    for f in ("y", "mult", "mu"):
        assert np.max(np.abs(getattr(fast, f) - getattr(ref, f))) < 1e-9
    res = pp.project(X, P, backend="daqp")  # and the pipeline polishes them to the exact projection
    assert np.max(np.abs(res.y - pp.project(X, P, backend="proxsuite", eps_abs=1e-10).y)) < 1e-9
    assert all(bool(v) for v in res.polished)


def test_daqp_projections_far_from_unit_scale_and_time_limit(rng, monkeypatch):
    pytest.importorskip("daqp")
    from polyproj.backends import projection
    from polyproj.polydata import PolyData

    P, x0 = _projection_data(rng)
    solver = pp.get_backend("daqp")
    calls = []
    real = projection.solve_on_host
    monkeypatch.setattr(projection, "solve_on_host", lambda *a, **k: calls.append(1) or real(*a, **k))
    big = PolyData(P.A * 1e9, P.a, P.B, P.b, P.lb, P.ub)  # rows at 1e9: the guard's normalisation path
    solver.solve_projections(x0[None, :], big)
    assert calls == [1]
    late = pp.get_backend("daqp", time_limit=1e-12)  # every point after the first is not started
    out = late.solve_projections(x0 + rng.normal(size=(3, P.n)), PolyData.from_polyhedron(P))
    assert pp.Status.TIME_LIMIT in out.status and np.isnan(out.y[-1]).all()


def test_daqp_unfinished_solve_has_no_multipliers(rng):
    # DAQP's multipliers after its iteration limit vary from call to call (not defined): NaN, in both paths
    pytest.importorskip("daqp")
    from polyproj.polydata import PolyData

    P, x0 = _projection_data(rng)
    X = x0 + 3.0 * rng.normal(size=(4, P.n))
    s = pp.get_backend("daqp", max_iter=1)
    qp = pp.QP(P=np.eye(P.n), q=-X[0], C=np.vstack([P.A, P.B]), l=np.r_[np.full(P.A.shape[0], -np.inf), P.b],
               u=np.r_[P.a, P.b], lb=P.lb, ub=P.ub)
    sol = s.solve(qp)
    assert sol.status == pp.Status.MAX_ITER and np.isnan(sol.z).all() and np.isnan(sol.z_box).all()
    start = s.solve_projections(X, PolyData.from_polyhedron(P))
    assert all(st == pp.Status.MAX_ITER for st in start.status) and not np.asarray(start.mult).any()


def test_daqp_dependent_equality_rows():
    """DAQP refuses dependent equality rows ("overdetermined initial working set"): inconsistent ones are
    PRIMAL_INFEASIBLE (was NUMERICAL_ERROR); consistent ones are solved without the dependent rows."""
    pytest.importorskip("daqp")
    qp = pp.QP(P=np.eye(2), q=[0.0, 0.0], C=[[1.0, 1.0], [1.0, 1.0]], l=[1.0, 2.0], u=[1.0, 2.0])
    sol = pp.solve_qp(qp, backend="daqp")
    assert sol.status is pp.Status.PRIMAL_INFEASIBLE and "inconsistent" in sol.info["note"]
    qp = pp.QP(P=np.eye(3), q=[1.0, -2.0, 0.5], C=[[1.0, 1, 0], [2.0, 2, 0], [0, 1, 1], [1, 0, -1]],
               l=[1.0, 2.0, 0.0, -np.inf], u=[1.0, 2.0, 0.0, 1.3])
    solver = pp.get_backend("daqp")
    sol = solver._dependent_equalities(qp)  # the path DAQP's refusal takes
    assert sol.status is pp.Status.SOLVED and sol.qp is qp and sol.z.shape == (4,)
    np.testing.assert_allclose(sol.x, [-0.5, 1.5, -1.5], atol=1e-12)
    assert sol.dual_residual() <= 1e-12 and sol.primal_residual() <= 1e-12


def test_daqp_batch_answers_follow_the_per_point_rules():
    """DAQP's flags applied to a batch (the per-point loop and a single solve both use them): statuses, x kept
    after a solve or an iteration / time limit, multipliers only after a solve, a non-finite solved answer a
    NUMERICAL_ERROR, flag 0 (the batch's time limit stopped before the point) TIME_LIMIT."""
    from polyproj.backends.daqp import _answers

    S = pp.Status
    n, k = 3, 5
    flags = np.array([1, 2, -1, -4, -7, 0, 1, -6])
    x = np.arange(8 * n, dtype=float).reshape(8, n)
    lam = np.ones((8, k))
    x[5], lam[5] = np.nan, np.nan  # flag 0: never solved
    lam[6, 2] = np.inf
    status, xs, ls = _answers(flags, x.copy(), lam.copy())
    expect = [S.SOLVED, S.SOLVED, S.PRIMAL_INFEASIBLE, S.MAX_ITER, S.TIME_LIMIT, S.TIME_LIMIT, S.NUMERICAL_ERROR,
              S.NUMERICAL_ERROR]
    assert list(status) == expect
    keep_x = [True, True, False, True, True, False, False, False]
    keep_lam = [True, True, False, False, False, False, False, False]
    for i in range(8):
        if keep_x[i]:
            np.testing.assert_array_equal(xs[i], x[i])
        else:
            assert np.isnan(xs[i]).all(), i
        if keep_lam[i]:
            np.testing.assert_array_equal(ls[i], lam[i])
        else:
            assert np.isnan(ls[i]).all(), i
