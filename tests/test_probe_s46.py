"""What the probes of 2026-12-06 (late) found in the QP layer, each failing before its fix: an active bound
between 1e15 and 1e20 (a real bound, below the QP's "no bound" of 1e20) was judged a side without a bound, so
every backend's right answer became NUMERICAL_ERROR; the ADMM re-factorised after its time limit had passed; a
Python int past int64 as a setting escaped as a TypeError from the backend's constructor; DAQP ignored
``verbose`` and its ``solve_time`` left out its own set-up."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

import polyproj as pp


@pytest.mark.parametrize("backend", pp.available_backends())
def test_an_active_bound_past_1e15_is_a_bound(backend):
    qp = pp.QP(P=np.eye(1), q=[-2e16], ub=[1e16])  # x* = 1e16 on its bound, z = 1e16
    sol = pp.solve_qp(qp, backend=backend)
    assert sol.status is pp.Status.SOLVED, sol.info.get("validation")
    assert sol.x[0] == pytest.approx(1e16, rel=1e-6)


@pytest.mark.parametrize("backend", pp.available_backends())
def test_a_finite_stand_in_for_infinity_far_from_x_is_a_side_without_a_bound(backend):
    far = pp.QP(P=np.eye(2), q=[-1.0, 1.0], lb=[-9.99e19, -9.99e19], ub=[9.99e19, 9.99e19])
    sol = pp.solve_qp(far, backend=backend)
    assert sol.status is pp.Status.SOLVED
    np.testing.assert_allclose(sol.x, [1.0, -1.0], atol=1e-5)


@pytest.mark.parametrize("box", [1e10, 1e14, 9.99e19])
def test_piqp_drops_big_m_bounds_it_stalls_on(box):
    """PIQP stopped at its iteration limit on a ±1e10 box around a unit-scale QP (its gap stalls near 1e-17 of the
    box); the far bounds are dropped at its limit and the QP solved again. A bound x meets stays."""
    qp = pp.QP(P=np.eye(3), q=[-1.0, 1.0, -5.0], C=[[1.0, 1.0, 1.0]], l=[-np.inf], u=[2.0],
               lb=[-box, -box, -box], ub=[box, box, 0.5])
    sol = pp.solve_qp(qp, backend="piqp")
    assert sol.status is pp.Status.SOLVED
    ref = pp.solve_qp(pp.QP(P=qp.P, q=qp.q, C=qp.C, l=qp.l, u=qp.u, ub=[np.inf, np.inf, 0.5]), backend="clarabel",
                      eps_abs=1e-10)  # the same QP without its far bounds
    assert ref.status is pp.Status.SOLVED
    np.testing.assert_allclose(sol.x, ref.x, atol=1e-6)
    assert sol.info.get("far_bounds_dropped") == 5 and sol.z_box[2] > 0.1  # x₃ on its bound of 0.5
    # a max_iter of the user's own bounds the whole call: no second solve
    assert pp.solve_qp(qp, backend="piqp", max_iter=250).status is pp.Status.MAX_ITER
    # far bounds that x lies beyond when dropped (an unbounded direction they close) keep PIQP's own answer
    lp = pp.QP(P=np.zeros((2, 2)), q=[-1.0, 0.0], lb=[-box, -1.0], ub=[box, 1.0])
    sol = pp.solve_qp(lp, backend="piqp")
    assert sol.status in (pp.Status.SOLVED, pp.Status.MAX_ITER)
    if sol.status is pp.Status.SOLVED:
        assert sol.x[0] == pytest.approx(box, rel=1e-6)


def test_an_active_bound_past_1e15_in_a_batch():
    from polyproj.backends.validation import residuals

    qp = pp.QP(P=np.eye(2), q=[-2e16, 0.0], ub=[1e16, 9.99e19])
    X = np.array([[1e16, 0.0]])
    ZB = np.array([[1e16, 0.0]])
    *_, sign, comp = residuals(qp, X, np.zeros((1, 0)), ZB, {}, duals=True)
    assert sign[0] == 0.0 and comp[0] == 0.0
    ZB = np.array([[1e16, 1e-3]])  # a multiplier on the stand-in x is far from: a side without a bound
    *_, sign, _ = residuals(qp, X, np.zeros((1, 0)), ZB, {}, duals=True)
    assert sign[0] == pytest.approx(1e-3)


def test_admm_stops_at_its_time_limit_before_a_step_size_update(monkeypatch):
    import polyproj.solvers.admm as admm

    rng = np.random.default_rng(0)
    M = rng.standard_normal((30, 30))
    qp = pp.QP(P=M @ M.T + 1e-3 * np.eye(30), q=1e3 * rng.standard_normal(30), C=rng.standard_normal((20, 30)),
               l=-np.ones(20), u=np.ones(20))
    calls = []
    real = admm.rescaled

    def slow(S, factor):
        calls.append(time.perf_counter())
        return real(S, factor)

    monkeypatch.setattr(admm, "rescaled", slow)
    pp.solve_qp(qp, backend="admm", max_iter=4000)
    assert calls  # this problem updates its step size
    calls.clear()
    t0 = time.perf_counter()
    sol = pp.solve_qp(qp, backend="admm", time_limit=1e-9, max_iter=4000)
    assert sol.status is pp.Status.TIME_LIMIT
    assert not calls, f"re-factorised {len(calls)} times after the limit ({time.perf_counter() - t0:.3g} s)"


@pytest.mark.parametrize("setting", [{"max_iter": 10 ** 20}, {"max_iter": 10 ** 400}, {"time_limit": 10 ** 400},
                                     {"eps_abs": 10 ** 400}])
@pytest.mark.parametrize("backend", ["piqp", "clarabel", "ipm"])
def test_an_int_past_float_or_int64_range_is_a_settings_error(backend, setting):
    qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    with pytest.raises(pp.SettingsError, match=next(iter(setting))):
        pp.solve_qp(qp, backend=backend, **setting)


def test_daqp_verbose_prints_a_line_and_times_the_whole_call(capsys):
    qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    sol = pp.solve_qp(qp, backend="daqp", verbose=True)
    assert sol.status is pp.Status.SOLVED
    assert "polyproj daqp: 1 QP(s)" in capsys.readouterr().out
    pp.solve_qp(qp, backend="daqp")
    assert capsys.readouterr().out == ""


def test_a_problem_s_arrays_are_read_only():
    """A QP, Polyhedron or Box edited in place mixed old cached data (solver-format copies, the guard's side masks,
    a set's faces) with the new values: wrong statuses, a reused Polyhedral set's answers 1.8 off its constraints.
    Their arrays are read-only; a changed problem is a new one."""
    qp = pp.QP(P=2 * np.eye(3), q=[1.0, -1.0, 0.5], C=[[1.0, 1.0, 1.0]], l=[-1.0], u=[1.0], lb=-2.0, ub=2.0)
    for k in ("P", "q", "C", "l", "u", "lb", "ub"):
        with pytest.raises(ValueError, match="read-only"):
            getattr(qp, k)[0] = 5.0
    moved = qp.with_vectors(q=[5.0, -5.0, 5.0])
    with pytest.raises(ValueError, match="read-only"):
        moved.q[0] = 1.0
    poly = pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0], B=[[1.0, -1.0]], b=[0.0], lb=-1.0, ub=1.0)
    for k in ("A", "a", "B", "b", "lb", "ub"):
        with pytest.raises(ValueError, match="read-only"):
            getattr(poly, k)[0] = 5.0
    box = pp.sets.Box(np.zeros(2), np.ones(2))
    with pytest.raises(ValueError, match="read-only"):
        box.lb[:] = -1.0
    given = np.array([1.0, -1.0, 0.5])  # the caller's own arrays stay writable (the problem holds copies)
    pp.QP(P=np.eye(3), q=given)
    given[0] = 2.0


def test_the_conversion_cache_drops_an_entry_when_its_source_is_collected():
    import gc

    from polyproj.backends import cache

    src = np.ones((50, 50))
    cache.converted("probe", (src,), None, lambda: np.zeros(10))
    key = ("probe", id(src), None)
    assert key in cache._CACHE
    del src
    gc.collect()
    assert key not in cache._CACHE
    # a collection while the cache is busy (its lock held) drops the entry at the next call
    src = np.ones(3)
    cache.converted("probe", (src,), None, lambda: np.zeros(10))
    key = ("probe", id(src), None)
    with cache._LOCK:
        del src
        gc.collect()
    assert key in cache._CACHE
    cache.converted("other", (np.ones(2),), None, lambda: 0)
    assert key not in cache._CACHE


def test_a_problem_s_arrays_stay_read_only_through_copies():
    """pickle and copy.deepcopy (a model's best-state snapshot, a process executor) gave writable arrays back, and
    an owned read-only array can be made writable again: the arrays are read-only views, restored as such."""
    import copy
    import pickle

    qp = pp.QP(P=2 * np.eye(2), q=[1.0, -1.0], C=[[1.0, 1.0]], l=[-1.0], u=[1.0])
    poly = pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0], lb=-1.0, ub=1.0)
    box = pp.sets.Box(np.zeros(2), np.ones(2))
    cases = ((qp, ("P", "q", "C", "l", "u", "lb", "ub")), (poly, ("A", "a", "lb", "ub")), (box, ("lb", "ub")))
    for obj, names in cases:
        for other in (pickle.loads(pickle.dumps(obj)), copy.deepcopy(obj)):
            for k in names:
                with pytest.raises(ValueError, match="read-only"):
                    getattr(other, k)[0] = 5.0
    with pytest.raises(ValueError):
        qp.q.setflags(write=True)
    part = qp.with_vectors(validate=False, q=np.array([3.0, 4.0]))
    with pytest.raises(ValueError, match="read-only"):
        part.q[0] = 1.0
    assert pp.solve_qp(copy.deepcopy(qp)).status is pp.Status.SOLVED


def test_a_backend_writing_through_the_read_only_flag_is_caught_and_the_qp_restored():
    """torch.from_numpy (or compiled code) writes through the read-only flag: the guard fingerprinted only writable
    arrays, so the frozen QP changed silently under a SOLVED answer."""
    torch = pytest.importorskip("torch")

    class TorchInPlace(pp.QPSolver):
        name = "probe_s46_inplace"
        capabilities = pp.Capabilities(dense=True)

        def solve(self, qp, warm_start=None):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                torch.from_numpy(qp.q).mul_(2.0)
            x = np.clip(-qp.q, qp.lb, qp.ub)
            return pp.Solution(x=x, z=np.zeros(0), z_box=-(x + qp.q), status=pp.Status.SOLVED)

    qp = pp.QP(P=np.eye(3), q=[1.0, -2.0, 0.5], lb=-np.ones(3), ub=np.ones(3))
    with pytest.raises(pp.SolverError, match=r"wrote into the problem it was given \(q changed in place"):
        pp.solve_qp(qp, backend=TorchInPlace())
    np.testing.assert_array_equal(qp.q, [1.0, -2.0, 0.5])
    assert not qp.q.flags.writeable


def test_admm_on_array_api_strict_without_the_polish():
    xs = pytest.importorskip("array_api_strict")
    rng = np.random.default_rng(0)
    poly = pp.Polyhedron(A=rng.standard_normal((3, 5)), a=np.ones(3), lb=-np.ones(5), ub=np.ones(5))
    X = rng.standard_normal((4, 5))
    for backend in ("admm", "auto"):
        got = pp.project(xs.asarray(X), poly, backend=backend, polish=False)
        ref = pp.project(X, poly, backend=backend, polish=False)
        np.testing.assert_allclose(np.asarray(got.y), ref.y, atol=1e-12)
    exact = pp.project(X, poly)
    np.testing.assert_allclose(ref.y, exact.y, atol=1e-4)


def test_a_time_limit_hit_by_some_points_caps_the_polish(monkeypatch):
    """Points the backend's time_limit cut short got the full polish rounds after the limit whenever others had
    finished (the cap applied only when every point was late): 7 s after a limit of 0.05 s on 2,000 points."""
    from dataclasses import replace

    from polyproj.backends.daqp import DAQPSolver
    from polyproj.projection import pipeline

    real_start, real_polish = DAQPSolver.solve_projections, pipeline._polish
    rounds = []

    def half_late(self, X, data, **kw):
        st = real_start(self, X, data, **kw)
        status = tuple(pp.Status.TIME_LIMIT if i % 2 else s for i, s in enumerate(st.status))
        return replace(st, status=status)

    def counted(X, data, start, opts, r, **kw):
        rounds.append(r)
        return real_polish(X, data, start, opts, r, **kw)

    monkeypatch.setattr(DAQPSolver, "solve_projections", half_late)
    monkeypatch.setattr(pipeline, "_polish", counted)
    rng = np.random.default_rng(0)
    poly = pp.Polyhedron(A=rng.normal(size=(40, 10)), a=rng.uniform(0.1, 1.0, 40), lb=-np.ones(10), ub=np.ones(10))
    X = 2 * rng.normal(size=(300, 10))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)  # "time_limit reached": the late points not verified
        res = pp.project(X, poly, backend="daqp", structured=False, max_polish_iter=50)  # (the pipeline)
    assert rounds and max(rounds) <= pipeline.LATE_ROUNDS
    ok = np.asarray([s.ok for s in res.status])
    ref = pp.project(X, poly)
    np.testing.assert_allclose(res.y[ok], ref.y[ok], atol=1e-9)  # what it calls solved is the projection


def test_project_refuses_a_result_as_warm_start_briefly_and_a_bool_polish_count():
    P = pp.Polyhedron(B=np.ones((1, 3)), b=[1.0], lb=np.zeros(3), ub=np.full(3, 0.8))
    X = np.random.default_rng(0).normal(size=(200, 3))
    res = pp.project(X, P, structured=False)
    with pytest.raises(pp.ProblemError, match=r"warm_start is the backend's on/off setting.*project_batch") as err:
        pp.project(X, P, warm_start=res)
    assert len(str(err.value)) < 300
    again = pp.sets.Polyhedral(P).project_batch(X, warm_start=res)
    np.testing.assert_allclose(again.y, res.y, atol=1e-12)
    with pytest.raises(pp.ProblemError, match="max_polish_iter must be an integer"):
        pp.project(X, P, max_polish_iter=True)
