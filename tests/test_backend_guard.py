"""What polyproj checks around every backend (polyproj.backends.validation), on built-in and third-party
backends alike: broken answers never stand as SOLVED, exceptions name the backend, n = 0 and data far from
unit scale are handled, late answers are TIME_LIMIT."""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.sparse as sp

import polyproj as pp
from polyproj.testing import conformance as cf

pytestmark = pytest.mark.core

# --------------------------------------------------------------------------- third-party backends that misbehave


class _Answers(pp.QPSolver):
    """Answers every QP with what ``make(qp)`` returns (the class attribute is set per test)."""

    name = "answers"
    capabilities = pp.Capabilities(dense=True, sparse=True)

    def make(self, qp):  # pragma: no cover - replaced per test
        raise NotImplementedError

    def solve(self, qp, warm_start=None):
        return self.make(qp)


def _solver(make, **settings):
    solver = _Answers(**settings)
    solver.make = make
    return solver


def _qp(rng):
    return cf.random_feasible_qp(rng, 6, 4, 1)


REFERENCE = "proxsuite" if "proxsuite" in pp.available_backends() else "ipm"  # ipm needs only the core


def _true(qp):
    return pp.get_backend(REFERENCE, eps_abs=1e-10).solve(qp)


def _claiming(x, qp, z=None, zb=None):
    return pp.Solution(x=x, z=np.zeros(qp.m) if z is None else z, z_box=np.zeros(qp.n) if zb is None else zb,
                       status=pp.Status.SOLVED, backend="answers", qp=qp)


def test_nan_claimed_solved_is_a_numerical_error(rng):
    qp = _qp(rng)
    sol = pp.solve_qp(qp, backend=_solver(lambda q: _claiming(np.full(q.n, np.nan), q)))
    assert sol.status is pp.Status.NUMERICAL_ERROR
    assert sol.info["claimed_status"] == "SOLVED" and "non-finite" in sol.info["validation"]


def test_infeasible_x_claimed_solved_is_a_numerical_error(rng):
    qp = _qp(rng)

    def far(q):
        t = _true(q)
        return _claiming(t.x + 2e6, q, t.z, t.z_box)

    sol = pp.solve_qp(qp, backend=_solver(far))
    assert sol.status is pp.Status.NUMERICAL_ERROR and "violates the constraints" in sol.info["validation"]
    # the same answer through solve_batch (the default loop) and through a native solve_batch
    bs = _solver(far).solve_batch(qp, q=np.stack([qp.q, 2 * qp.q]))
    assert bs.status == (pp.Status.NUMERICAL_ERROR,) * 2
    assert "violates" in bs.info["elements"][0]["validation"]


def test_slightly_wrong_answer_is_inaccurate_not_solved(rng):
    qp = _qp(rng)

    def shifted(q):
        t = _true(q)
        return _claiming(t.x, q, t.z, t.z_box + 1e-3 * np.abs(t.z_box).max())

    sol = pp.solve_qp(qp, backend=_solver(shifted, eps_abs=1e-9))
    assert sol.status is pp.Status.SOLVED_INACCURATE and "exceed" in sol.info["validation"]


def test_stationary_point_with_wrong_signed_multipliers_is_a_numerical_error():
    """Feasible x, stationarity exact, but the multipliers sit on bounds x does not meet (the maximiser
    of the box corner): not a solution, whatever the residuals of x and stationarity say."""
    qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0], lb=[-5.0, -5.0], ub=[5.0, 5.0])

    def corner(q):  # x = (-5, -5) is stationary with z_box = (6, 6) on the *upper* bounds (x is at the lower)
        return _claiming(np.array([-5.0, -5.0]), q, np.zeros(1), np.array([6.0, 6.0]))

    sol = pp.solve_qp(qp, backend=_solver(corner))
    assert sol.status is pp.Status.NUMERICAL_ERROR and "complementarity" in sol.info["validation"]
    bs = _solver(corner).solve_batch(qp, q=np.stack([qp.q, qp.q]))
    assert bs.status == (pp.Status.NUMERICAL_ERROR,) * 2

    def lower_side(q):  # z < 0 on a row with l = -inf: stationarity made up with the box multipliers
        x = np.array([0.5, 0.5])
        z = np.array([-1.0])
        return _claiming(x, q, z, -(q.P @ x + q.q + q.C.T @ z))

    sol = pp.solve_qp(qp, backend=_solver(lower_side))
    assert sol.status is pp.Status.NUMERICAL_ERROR and "without a bound" in sol.info["validation"]


def test_a_correct_answer_stands(rng):
    qp = _qp(rng)
    sol = pp.solve_qp(qp, backend=_solver(_true, eps_abs=1e-9))
    assert sol.status is pp.Status.SOLVED and "validation" not in sol.info


class _NativeBatch(pp.QPSolver):
    """A native solve_batch that returns NaN rows with status SOLVED for odd elements."""

    name = "native_batch"
    capabilities = pp.Capabilities(dense=True, batch=True)

    def solve(self, qp, warm_start=None):
        return _true(qp)

    def solve_batch(self, qp, q=None, l=None, u=None, lb=None, ub=None, warm_start=None):
        sols = [_true(qp.with_vectors(q=qi)) for qi in q]
        X = np.stack([s.x for s in sols])
        X[1::2] = np.nan
        return pp.BatchSolution(x=X, z=np.stack([s.z for s in sols]), z_box=np.stack([s.z_box for s in sols]),
                                status=(pp.Status.SOLVED,) * len(sols), iterations=np.zeros(len(sols), int))


def test_native_batch_answers_are_checked_element_by_element(rng):
    qp = _qp(rng)
    bs = _NativeBatch().solve_batch(qp, q=np.stack([qp.q * s for s in (1.0, 0.5, 2.0, 3.0)]))
    assert bs.status == (pp.Status.SOLVED, pp.Status.NUMERICAL_ERROR) * 2
    assert bs.solution(2).primal_residual() <= 1e-8  # per-element problems attached for the residual methods


@pytest.mark.parametrize(("answer", "match"), [
    (lambda qp: None, "returned NoneType from solve"),
    (lambda qp: {"x": np.zeros(qp.n)}, "returned dict from solve"),
    (lambda qp: pp.Solution(x=np.zeros(qp.n + 1), z=np.zeros(qp.m), z_box=np.zeros(qp.n), status=pp.Status.SOLVED),
     r"x of shape \(7,\); expected \(6,\)"),
    (lambda qp: pp.Solution(x=np.zeros(qp.n), z=np.zeros(3), z_box=np.zeros(qp.n), status=pp.Status.SOLVED),
     "z of shape"),
    (lambda qp: pp.Solution(x=np.zeros(qp.n), z=np.zeros(qp.m), z_box=np.zeros(qp.n), status="solved"),
     "status 'solved'"),
])
def test_broken_contract_is_a_solver_error_naming_the_backend(rng, answer, match):
    qp = _qp(rng)
    with pytest.raises(pp.SolverError, match="'answers'") as info:
        pp.solve_qp(qp, backend=_solver(answer))
    assert info.match(match)


def test_complex_x_is_a_solver_error(rng):
    """float64 conversion would keep the real part with a ComplexWarning: an answer that is not real."""
    answer = lambda qp: pp.Solution(x=np.zeros(qp.n) + 5j, z=np.zeros(qp.m), z_box=np.zeros(qp.n),  # noqa: E731
                                    status=pp.Status.SOLVED)
    with pytest.raises(pp.SolverError, match="'answers' returned x with non-zero imaginary parts"):
        pp.solve_qp(_qp(rng), backend=_solver(answer))
    qp = _qp(rng)
    real = _true(qp)  # a complex dtype with zero imaginary parts (e.g. from np.linalg.eig) is a real answer
    sol = pp.solve_qp(qp, backend=_solver(lambda qp: pp.Solution(x=real.x + 0j, z=real.z, z_box=real.z_box,
                                                                  status=pp.Status.SOLVED)))
    assert sol.status is pp.Status.SOLVED and sol.x.dtype == np.float64


class _Writes(pp.QPSolver):
    """A correct backend (the reference's answer) that first writes into one of the arrays it is given."""

    name = "writes"
    capabilities = pp.Capabilities(dense=True, sparse=True)
    target = "q"

    def solve(self, qp, warm_start=None):
        arr = getattr(qp, self.target)
        (arr.data if sp.issparse(arr) else arr)[0] *= 0.5  # e.g. normalising the data in place
        return _true(qp)

    def solve_batch(self, qp, q=None, l=None, u=None, lb=None, ub=None, warm_start=None):
        q[0, 0] += 1.0
        return pp.get_backend(REFERENCE, eps_abs=1e-10).solve_batch(qp, q=q)


@pytest.mark.parametrize("target", ["q", "u", "P"])
def test_a_backend_writing_into_its_input_is_refused_and_the_input_restored(rng, target):
    """Its answer would be judged against the changed data (a wrong SOLVED), and the caller's QP changed."""
    qp = _qp(rng)
    keep = getattr(qp, target).copy()
    solver = _Writes()
    solver.target = target
    # the QP's dense arrays are read-only: the write raises at once
    with pytest.raises(pp.SolverError, match=r"'writes' wrote into the problem it was given \(.*read-only"):
        pp.solve_qp(qp, backend=solver)
    np.testing.assert_array_equal(getattr(qp, target), keep)
    Q = np.stack([qp.q, 2.0 * qp.q])
    with pytest.raises(pp.SolverError, match=r"batch q changed"):
        solver.solve_batch(qp, q=Q.copy())


@pytest.mark.parametrize("order", ["C", "F"])
def test_a_write_into_a_large_array_is_found_by_checksum(rng, order):
    """A batch's q of 90,000 entries: above the copy limit, compared by checksum (a Fortran one through its
    transpose). (The QP's own dense arrays are read-only: a write there raises at once.)"""
    n = 300
    qp = pp.QP(P=np.eye(n), q=rng.normal(size=n), lb=-np.ones(n), ub=np.ones(n))
    Q = np.asarray(rng.normal(size=(n, n)), order=order)
    with pytest.raises(pp.SolverError, match=r"batch q changed in place"):
        _Writes().solve_batch(qp, q=Q)


def test_a_backend_canonicalising_a_sparse_matrix_is_not_refused(rng):
    """eliminate_zeros / sort_indices change the layout, not the matrix: allowed, and the matrix stays the same."""
    C = sp.csc_matrix((np.array([1.0, 1.0, 1.0, 0.0, 1.0, 1.0]), np.array([0, 1, 0, 1, 0, 1]),
                       np.array([0, 2, 4, 6])), shape=(2, 3))  # an explicitly stored zero at (1, 1)
    qp = pp.QP(P=sp.eye(3, format="csc"), q=-np.ones(3), C=C, l=-np.ones(2), u=np.ones(2))
    dense = qp.C.toarray()

    class Canonical(pp.QPSolver):
        name = "canonical"
        capabilities = pp.Capabilities(dense=True, sparse=True)

        def solve(self, qp, warm_start=None):
            qp.C.eliminate_zeros()
            return _true(qp)

    assert pp.solve_qp(qp, backend=Canonical()).status is pp.Status.SOLVED
    np.testing.assert_array_equal(qp.C.toarray(), dense)


class _ClaimsThree:
    """A mixin (no backend itself) whose ``solve`` claims x = (3, 3) SOLVED on any QP."""

    def solve(self, qp, warm_start=None):
        return pp.Solution(x=np.full(qp.n, 3.0), z=np.zeros(qp.m), z_box=np.zeros(qp.n), status=pp.Status.SOLVED)


def _halfplane():  # min ½|x|² − 3(x₁ + x₂) s.t. x₁ + x₂ <= 1: x* = (½, ½), and (3, 3) violates the row by 5
    return pp.QP(P=np.eye(2), q=-3.0 * np.ones(2), C=np.array([[1.0, 1.0]]), l=np.array([-np.inf]),
                 u=np.array([1.0]))


def test_a_solve_inherited_from_a_mixin_is_guarded():
    class MixinSolver(_ClaimsThree, pp.QPSolver):
        name = "mixin"

    sol = pp.solve_qp(_halfplane(), backend=MixinSolver())
    assert sol.status is pp.Status.NUMERICAL_ERROR and not sol.status.ok


def test_a_solve_assigned_after_the_class_is_made_is_guarded(rng):
    class Later(pp.QPSolver):
        name = "later"

        def solve(self, qp, warm_start=None):  # pragma: no cover - replaced below
            raise NotImplementedError

    Later.solve = _ClaimsThree.solve
    assert pp.solve_qp(_halfplane(), backend=Later()).status is pp.Status.NUMERICAL_ERROR
    Later.solve = lambda self, qp, warm_start=None: {"x": 1}
    with pytest.raises(pp.SolverError, match="'later' returned dict from solve"):
        pp.solve_qp(_halfplane(), backend=Later())
    # a built-in's guarded solve, inherited, is not wrapped twice
    from polyproj.backends.ipm import IPMSolver

    class Sub(IPMSolver):
        name = "sub"

    assert "solve" not in Sub.__dict__ and Sub.solve is IPMSolver.solve


def test_a_backend_may_also_derive_from_a_class_with_another_abc_metaclass():
    from typing import Protocol, runtime_checkable

    @runtime_checkable
    class Named(Protocol):
        name: str

    class Both(pp.QPSolver, Named):
        name = "both"

        def solve(self, qp, warm_start=None):
            return _ClaimsThree.solve(self, qp)

    assert pp.solve_qp(_halfplane(), backend=Both()).status is pp.Status.NUMERICAL_ERROR


def test_backend_exceptions_are_solver_errors_naming_the_backend(rng):
    def boom(qp):
        raise ValueError("bad things")

    with pytest.raises(pp.SolverError, match=r"backend 'answers' raised ValueError: bad things") as info:
        pp.solve_qp(_qp(rng), backend=_solver(boom))
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(pp.SolverError, match="'answers' raised ValueError"):
        _solver(boom).solve_batch(_qp(rng), q=np.ones((2, 6)))

    def leave(qp):  # sys.exit() inside a backend would end the caller's process (and pass `polyproj check`)
        raise SystemExit(0)

    with pytest.raises(pp.SolverError, match=r"'answers' raised SystemExit"):
        pp.solve_qp(_qp(rng), backend=_solver(leave))

    def refuse(qp):  # errors raised on purpose by a backend keep their type
        raise pp.SettingsError("no")

    with pytest.raises(pp.SettingsError):
        pp.solve_qp(_qp(rng), backend=_solver(refuse))


def test_solve_takes_a_qp():
    with pytest.raises(pp.ProblemError, match="takes a polyproj.QP"):
        pp.get_backend(REFERENCE).solve({"P": np.eye(2)})


# --------------------------------------------------------------------------- every built-in backend
def test_no_variables(backend):
    solver = pp.get_backend(backend)
    sol = solver.solve(pp.QP(P=np.zeros((0, 0)), q=np.zeros(0)))
    assert sol.status is pp.Status.SOLVED and sol.x.shape == (0,)
    rows = pp.QP(P=np.zeros((0, 0)), q=np.zeros(0), C=np.zeros((2, 0)), l=[-1.0, 0.0], u=[1.0, np.inf])
    assert solver.solve(rows).status is pp.Status.SOLVED
    empty = pp.QP(P=np.zeros((0, 0)), q=np.zeros(0), C=np.zeros((1, 0)), l=[1.0], u=[2.0])  # 1 <= 0: empty
    assert solver.solve(empty).status is pp.Status.PRIMAL_INFEASIBLE
    bs = solver.solve_batch(rows, l=np.array([[-1.0, 0.0], [0.5, 0.0]]))
    assert bs.status == (pp.Status.SOLVED, pp.Status.PRIMAL_INFEASIBLE)


def test_non_symmetric_P_is_refused_for_every_backend(backend):
    P = np.array([[2.0, 1.0], [0.0, 2.0]])
    with pytest.raises(pp.ProblemError, match="not symmetric"):
        pp.solve_qp(pp.QP(P=P, q=[1.0, -1.0], lb=-5 * np.ones(2), ub=5 * np.ones(2), check_psd=False),
                    backend=backend)
    for M in (sp.csr_matrix(P), sp.dok_matrix(P)):
        with pytest.raises(pp.ProblemError, match="not symmetric"):
            pp.QP(P=M, q=[1.0, -1.0], check_psd=False)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scale", [1e8, 1e12, 1e-12])
def test_data_far_from_unit_scale_is_solved(backend, scale):
    """Projection QPs with bounds, right-hand sides and x at 1e8, 1e12 and 1e-12 (the 1e8 box took ProxSuite
    10 million iterations; at 1e12 OSQP, HiGHS and the IPM ended in MAX_ITER): SOLVED, with residuals small
    relative to the data, and the box projection exact to rounding at that scale."""
    rng = np.random.default_rng(0)
    box = pp.Polyhedron(lb=-scale * np.ones(2), ub=scale * np.ones(2))
    sol = pp.solve_qp(box.projection_qp(np.array([3.0, -2.0]) * scale), backend=backend, time_limit=5)
    assert sol.status is pp.Status.SOLVED, sol.info
    np.testing.assert_allclose(sol.x, [scale, -scale], rtol=1e-6)
    A = rng.standard_normal((40, 20))
    x0 = rng.standard_normal(20)
    poly = pp.Polyhedron(A=A, a=(A @ x0 + rng.uniform(0.05, 1.0, 40)) * scale, lb=(x0 - 2) * scale,
                         ub=(x0 + 2) * scale)
    qp = poly.projection_qp(3 * rng.standard_normal(20) * scale)
    sol = pp.solve_qp(qp, backend=backend, time_limit=5, max_iter=2000)
    assert sol.status is pp.Status.SOLVED, sol.info
    assert sol.primal_residual() <= 1e-6 * scale and sol.dual_residual() <= 1e-6 * scale
    assert "scaling" in sol.info


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scale", [1e12, 1e-12])
def test_objective_far_from_unit_scale_is_solved(backend, scale):
    """min scale·(½|x|² − x₁ − x₂) s.t. x₁ + x₂ <= 1, x at unit scale: x* = (½, ½) at any scale. At 1e-12 every
    point is "optimal" to an absolute dual tolerance, at 1e12 none is: normalised by the objective's scale."""
    qp = pp.QP(P=scale * np.eye(2), q=[-scale, -scale], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    sol = pp.solve_qp(qp, backend=backend, time_limit=5)
    assert sol.status is pp.Status.SOLVED, sol.info
    np.testing.assert_allclose(sol.x, [0.5, 0.5], atol=1e-6)
    assert sol.info["scaling"]["gamma"] == pytest.approx(1.0 / scale)
    np.testing.assert_allclose(sol.z, [0.5 * scale], rtol=1e-5)  # in the caller's units: Px + q + Cᵀz = 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("big", [1e8, 1e10, 1e14])
def test_loose_bounds_do_not_set_the_scale(backend, big):
    """Bounds at ±1e8…1e14 around a problem at unit scale are big-M stand-ins for "no bound": taken as the scale
    of x they made every backend but OSQP return SOLVED points off by orders of magnitude (objective 5e5 for
    -1.5 at 1e8; x0 + x1 <= 1 broken by 2 at 1e10), and in a batch one element's box spoiled the others.
    Now a SOLVED answer is the solution (a backend may still fail honestly, with a status that says so)."""
    box = dict(lb=[-big, -big], ub=[big, big])
    cases = [(pp.QP(P=np.eye(2), q=[-1.0, -2.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0], **box), [0.0, 1.0]),
             (pp.QP(P=np.zeros((2, 2)), q=[1.0, 2.0], C=[[1.0, 1.0]], l=[1.0], u=[np.inf], lb=[0.0, 0.0],
                    ub=[big, big]), [1.0, 0.0])]
    for qp, x in cases:
        sol = pp.solve_qp(qp, backend=backend, time_limit=5)
        if backend in ("proxsuite", "highs", "daqp", "osqp"):  # these solve all of them (measured)
            assert sol.status.ok, sol.info
        if sol.status.ok:
            np.testing.assert_allclose(sol.x, x, atol=1e-5, err_msg=str(sol.info))
    free = cases[0][0].with_vectors(lb=np.full(2, -np.inf), ub=np.full(2, np.inf))
    bs = pp.get_backend(backend, time_limit=5).solve_batch(free, lb=[[-np.inf, -np.inf], [-big, -big]],
                                                           ub=[[np.inf, np.inf], [big, big]])
    for i in range(2):
        if bs.status[i].ok:
            np.testing.assert_allclose(bs.x[i], [0.0, 1.0], atol=1e-5)


# --------------------------------------------------------------------------- time limits
class _Slow(pp.QPSolver):
    """ProxSuite after a pause of ``delay`` seconds (a solver that ignores time_limit)."""

    name = "slow"
    capabilities = pp.Capabilities(dense=True)
    delay = 0.2

    def solve(self, qp, warm_start=None):
        time.sleep(self.delay)
        return _true(qp)


def test_late_answers_are_time_limit(rng):
    qp = _qp(rng)
    sol = pp.solve_qp(qp, backend=_Slow(time_limit=0.05))
    assert sol.status is pp.Status.TIME_LIMIT and np.all(np.isfinite(sol.x))
    assert "past time_limit" in sol.info["validation"]
    assert pp.solve_qp(qp, backend=_Slow(time_limit=5)).status is pp.Status.SOLVED


def test_default_batch_loop_stops_at_the_time_limit(rng):
    qp = _qp(rng)
    t0 = time.perf_counter()
    bs = _Slow(time_limit=0.3).solve_batch(qp, q=np.tile(qp.q, (20, 1)))
    elapsed = time.perf_counter() - t0
    assert elapsed < 20 * 0.2 / 2  # the loop stopped instead of running all 20 solves
    assert set(bs.status) == {pp.Status.TIME_LIMIT}  # finished late or not started
    assert np.isnan(bs.x[-1]).all()


def test_backends_are_quiet_unless_verbose(backend, capfd, rng):
    """Nothing reaches the process's stdout/stderr from a solver library (HiGHS printed its banner on the first
    construction, OSQP 1.1 'Polishing not needed ...' whenever no constraint was active)."""
    import polyproj.backends.highs as highs_glue

    highs_glue._banner_shown.cache_clear()  # as in a fresh process
    inactive = pp.QP(P=2 * np.eye(2), q=[1.0, -1.0], lb=-5 * np.ones(2), ub=5 * np.ones(2))
    for qp in (inactive, _qp(rng)):
        assert pp.solve_qp(qp, backend=backend).status.ok
    out, err = capfd.readouterr()
    assert out == "" and err == ""


# --------------------------------------------------------------------------- inputs every backend sees alike
def test_non_convex_P_is_never_solved(backend):
    """A saddle point is not a solution: every backend (the IPM included) says NON_CONVEX."""
    for P in (np.diag([1.0, -1.0]), sp.csc_matrix(np.diag([1.0, -1.0]))):
        qp = pp.QP(P=P, q=[0.0, 0.0], lb=[-1.0, -1.0], ub=[1.0, 1.0], check_psd=False)
        assert pp.solve_qp(qp, backend=backend).status is pp.Status.NON_CONVEX
        bs = pp.get_backend(backend).solve_batch(qp, q=np.zeros((2, 2)))
        assert bs.status == (pp.Status.NON_CONVEX,) * 2


def test_warm_starts_that_do_not_fit_and_empty_batches(backend):
    """A warm start of the wrong sizes is a ProblemError on every backend (was: IndexError, a status, or
    silently ignored); a batch of no elements is an empty BatchSolution."""
    qp = pp.QP(P=np.eye(3), q=[-1.0, -2, -3], C=[[1.0, 1, 1]], l=[-np.inf], u=[1.0], lb=[-1] * 3, ub=[1] * 3)
    other = pp.solve_qp(pp.QP(P=np.eye(2), q=[1.0, 1.0]), backend=backend)
    for ws, what in (({"x": np.zeros(5)}, "x must have shape"), (other, "x must have shape"),
                     ({"x": np.zeros(3), "z": np.zeros(2)}, "z must have shape"), (np.zeros(3), "must be a Solution")):
        with pytest.raises(pp.ProblemError, match=what):
            pp.solve_qp(qp, backend=backend, warm_start=ws)
    good = pp.solve_qp(qp, backend=backend)
    assert pp.solve_qp(qp, backend=backend, warm_start=good).status.ok
    S = pp.get_backend(backend)
    empty = S.solve_batch(qp, q=np.zeros((0, 3)))
    assert len(empty) == 0 and empty.x.shape == (0, 3) and empty.z.shape == (0, 1)
    two = S.solve_batch(qp, q=np.ones((2, 3)))
    with pytest.raises(pp.ProblemError, match=r"shape \(3, 3\) for this batch"):
        S.solve_batch(qp, q=np.ones((3, 3)), warm_start=two)
    with pytest.raises(pp.ProblemError, match="must be a BatchSolution"):
        S.solve_batch(qp, q=np.ones((2, 3)), warm_start=good)


def test_batch_solution_put_inverts_take():
    S = pp.Status
    sol = pp.BatchSolution(x=np.arange(8.0).reshape(4, 2), z=np.arange(12.0).reshape(4, 3), z_box=-np.ones((4, 2)),
                           status=(S.SOLVED, S.MAX_ITER, S.SOLVED, S.PRIMAL_INFEASIBLE),
                           iterations=np.array([1, 2, 3, 4]), backend="b")
    part = sol.take([3, 1])
    other = pp.BatchSolution(x=part.x + 100, z=part.z + 100, z_box=part.z_box + 100,
                             status=(S.SOLVED, S.SOLVED), iterations=part.iterations + 10)
    out = sol.put([3, 1], other)
    np.testing.assert_array_equal(out.x[[0, 2]], sol.x[[0, 2]])
    np.testing.assert_array_equal(out.x[[3, 1]], other.x)
    np.testing.assert_array_equal(out.z[[3, 1]], other.z)
    np.testing.assert_array_equal(out.z_box[[3, 1]], other.z_box)
    np.testing.assert_array_equal(out.iterations, [1, 12, 3, 14])
    assert out.status == (S.SOLVED, S.SOLVED, S.SOLVED, S.SOLVED) and out.backend == "b"
    assert sol.status[1] is S.MAX_ITER and sol.x[1, 0] == 2.0  # the original is untouched
    back = out.put([3, 1], part)
    np.testing.assert_array_equal(back.x, sol.x)
    assert back.status == sol.status


def test_an_indefinite_P_beyond_the_dense_check_is_never_solved():
    """P = I of n 3,001 with one off-diagonal pair 2 (eigenvalue -1): the construction's dense check stops at
    n = 3,000 and passed it silently, and ProxSuite, PIQP and Clarabel returned SOLVED x = 0 (the minimum is
    -1). Undecided there (psd_known False), every backend's Lanczos check answers NON_CONVEX."""
    n = 3001
    P = sp.eye(n, format="lil")
    P[0, 1] = P[1, 0] = 2.0
    qp = pp.QP(P=P.tocsc(), q=np.zeros(n), lb=-np.ones(n), ub=np.ones(n))
    assert not qp.psd_known and qp.with_vectors(q=np.ones(n)).psd_known is False
    assert pp.QP(P=sp.eye(n, format="csc"), q=np.zeros(n)).psd_known  # diagonal: decided
    for backend in ("proxsuite", "piqp", "clarabel", "osqp", "highs"):
        if backend in pp.available_backends():
            assert pp.solve_qp(qp, backend=backend).status is pp.Status.NON_CONVEX, backend


def test_admm_batch_keeps_each_solved_element_as_it_was_solved():
    """A batch with an infeasible element kept iterating (and adapting its step size) after the feasible one had
    met the tolerance, and returned that one at 190 times it (z = -0.50187, dual residual 1.9e-3 at eps_abs
    1e-5). Each element's iterate is now kept when it is solved: the stationarity residual within eps_abs."""
    qp = pp.QP(P=np.eye(2), q=[0.0, 0.0], C=[[1.0, 1.0]], l=[1.0], u=[1.0], lb=[0.0, 0.0], ub=[1.0, 1.0])
    for eps in (1e-4, 1e-5, 1e-6):
        bs = pp.get_backend("admm", eps_abs=eps).solve_batch(qp, l=[[1.0], [5.0]], u=[[1.0], [5.0]])
        assert bs.status == (pp.Status.SOLVED, pp.Status.PRIMAL_INFEASIBLE)
        residual = bs.x[0] + bs.z[0, 0] + bs.z_box[0]  # P x + q + Cᵀz + z_box
        assert np.abs(residual).max() <= 10 * eps
        np.testing.assert_allclose(bs.x[0], [0.5, 0.5], atol=10 * eps)


def test_non_finite_warm_start_parts_are_dropped(backend):
    """A warm start with an infinite multiplier (or a failed solve's NaN ones) made ProxSuite return
    NUMERICAL_ERROR on a problem it solves: the guard drops non-finite parts and keeps the rest."""
    qp = pp.QP(P=np.eye(2), q=[-1.0, -2.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    for ws in ({"x": np.array([0.0, 1.0]), "z": np.array([np.inf])}, {"x": np.full(2, np.nan)}):
        sol = pp.solve_qp(qp, backend=backend, warm_start=ws)
        assert sol.status is pp.Status.SOLVED, sol.info
        np.testing.assert_allclose(sol.x, [0.0, 1.0], atol=1e-5)


def test_option_values_beyond_what_the_solvers_take_are_settings_errors():
    """Counts beyond a C integer failed at the first solve as an OverflowError (SolverError) or a status with a
    TypeError inside (OSQP); Clarabel's own refusal of a value and an ADMM step size that makes its matrix
    singular were SolverErrors: each is a SettingsError naming the option, when built or at the first solve."""
    qp = pp.QP(P=np.eye(2), q=[-1.0, -2.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    for backend, kw in (("osqp", {"max_iter": 2**31}), ("osqp", {"polish_refine_iter": 10**12}),
                        ("clarabel", {"max_iter": 10**12}), ("clarabel", {"max_threads": 10**12}),
                        ("daqp", {"cycle_tol": 10**12}), ("admm", {"rho": 1e300})):
        if backend in pp.available_backends():
            with pytest.raises(pp.SettingsError, match=next(iter(kw))):
                pp.get_backend(backend, **kw)
    if "clarabel" in pp.available_backends():
        with pytest.raises(pp.SettingsError, match="direct_solve_method"):
            pp.solve_qp(qp, backend="clarabel", direct_solve_method="nonsense")


def test_a_warm_start_dict_with_unknown_keys_is_refused():
    """{'y': ...} (a misspelt or another library's key) was accepted and silently ignored by every backend."""
    qp = pp.QP(P=np.eye(2), q=[-1.0, -2.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    for ws in ({"y": np.zeros(1)}, {}, {"x": np.zeros(2), "lam": np.zeros(1)}):
        with pytest.raises(pp.ProblemError, match="takes the keys 'x', 'z', 'z_box'"):
            pp.solve_qp(qp, backend="ipm", warm_start=ws)
    assert pp.solve_qp(qp, backend="ipm", warm_start={"x": np.zeros(2)}).status is pp.Status.SOLVED


def test_verbose_reports_polyproj_s_own_solvers(capsys):
    """verbose=True printed nothing for the IPM and the ADMM (the external solvers print their logs): one line a
    call now, with the statuses, iterations and largest residuals; quiet by default."""
    qp = pp.QP(P=np.eye(2), q=[-1.0, -2.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    for backend in ("ipm", "admm"):
        pp.solve_qp(qp, backend=backend)
        assert capsys.readouterr().out == ""
        pp.get_backend(backend, verbose=True).solve_batch(qp, q=[[-1.0, -2.0], [1.0, 1.0]])
        out = capsys.readouterr().out
        assert out.startswith(f"polyproj {backend}: 2 QP(s)") and "SOLVED 2" in out and "residual" in out


@pytest.mark.timeout(120)
def test_constraints_far_tighter_than_the_unconstrained_minimiser(backend):
    """min ½x² + 1e8 x on [−1, 1]: σ = |q| / |P| = 1e8 set the tolerances, and ProxSuite, PIQP, Clarabel, the IPM
    and the ADMM returned SOLVED points up to 47 % outside the box; the same with rows (P = 1e-6 I, q = (1e4,
    −3e3), −1 <= x1 ± x2 <= 1: residuals up to 7). An answer far below σ has the problem solved again, normalised
    by its own size (scaling.replan)."""
    qp = pp.QP(np.array([[1.0]]), np.array([1e8]), lb=[-1.0], ub=[1.0])
    sol = pp.solve_qp(qp, backend=backend)
    assert sol.status is pp.Status.SOLVED, sol.info
    np.testing.assert_allclose(sol.x, [-1.0], atol=1e-7)
    bs = pp.get_backend(backend).solve_batch(qp, q=np.array([[1e8], [2e8]]))
    assert all(s is pp.Status.SOLVED for s in bs.status)
    np.testing.assert_allclose(bs.x, [[-1.0], [-1.0]], atol=1e-7)
    qp = pp.QP(1e-6 * np.eye(2), np.array([1e4, -3e3]), C=np.array([[1.0, 1.0], [1.0, -1.0]]), l=[-1.0, -1.0],
               u=[1.0, 1.0])
    sol = pp.solve_qp(qp, backend=backend)
    assert sol.status in (pp.Status.SOLVED, pp.Status.SOLVED_INACCURATE), sol.info
    np.testing.assert_allclose(sol.x, [-1.0, 0.0], atol=1e-6)


@pytest.mark.timeout(120)
def test_replan_per_element_repeated_and_normalised(backend):
    """Three gaps of the first re-plan: (1) it was decided for a whole batch from its largest |x|, so one element
    with a legitimate x of 1e9 kept another's σ = 1e8 (SOLVED answers up to 6.8 outside [-1, 1]); (2) it re-solved
    without normalisation where the answer's size alone needed none, and OSQP and the ADMM ended at MAX_ITER
    on |q| ~ 1e8 with the right x; (3) it ran once, from a first answer 2e4 too large, and stopped 4e4 above
    the answer's size (ProxSuite 3.2e-6 outside the box)."""
    qp = pp.QP(np.eye(3), np.zeros(3), lb=[-1.0, -np.inf, -np.inf], ub=[1.0, np.inf, np.inf])
    bs = pp.get_backend(backend).solve_batch(qp, q=np.array([[1e8, 0.0, 0.0], [0.0, -1e9, 0.0]]))
    assert all(s in (pp.Status.SOLVED, pp.Status.SOLVED_INACCURATE) for s in bs.status), bs.status
    np.testing.assert_allclose(bs.x[0], [-1.0, 0.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(bs.x[1], [0.0, 1e9, 0.0], atol=1e-6 * 1e9)  # accurate relative to its size
    P = np.array([[0.0867054506383755, 0.1368378634514905, -0.03188522115139904, -0.0044077242277103],
                  [0.1368378634514905, 0.3812499700920932, 0.09173572956043506, -0.02696021535155963],
                  [-0.03188522115139904, 0.09173572956043506, 0.23975612055200518, 0.02462508060189436],
                  [-0.0044077242277103, -0.02696021535155963, 0.02462508060189436, 0.03419457757822846]])
    q = np.array([1.4468623302555799e+08, -1.0050271562097830e+08, -1.9477127500634363e+06, -4.9929432875389747e+07])
    C = np.array([[1.430481507294281, 1.2440888408102686, 0.7554071817584939, -1.402601976480008],
                  [2.0812327075463277, 0.5166960895746487, -0.10846324499681578, 0.02150059611472391],
                  [-0.3395191336516016, 0.4238805727238128, 0.3101678081106041, -0.3601000456667026]])
    w = 15.565124204125828
    qp = pp.QP(P, q, C, np.full(3, -np.inf), [20.373969870311544, 18.789618582693606, 13.703783487237569],
               lb=-w * np.ones(4), ub=w * np.ones(4))
    sol = pp.solve_qp(qp, backend=backend)
    if backend == "proxsuite" and sol.status is pp.Status.NUMERICAL_ERROR:  # an honest failure, not a wrong answer:
        assert "PRIMAL_INFEASIBLE" in sol.info["raw_status"]  # ProxQP's infeasibility claim, refuted
    else:
        assert sol.status is pp.Status.SOLVED, sol.info
        np.testing.assert_allclose(sol.x, [-w, w, w, w], atol=1e-6 * w)
    ub = 0.00809566292279501
    sol = pp.solve_qp(pp.QP([[1.2351097488477127]], [-4.2868038348788864e+10], lb=[-0.00868474255939732], ub=[ub]),
                      backend=backend)
    assert sol.status is pp.Status.SOLVED, sol.info
    # the tolerances hold in units of σ ~ 2 ub: 1e-6 ub leaves interior-point answers their margin and still
    # catches the first re-plan's answer 3.2e-6 outside the box (4e-4 ub)
    assert abs(sol.x[0] - ub) <= 1e-6 * ub


@pytest.mark.timeout(120)
def test_a_batch_of_far_apart_sizes_is_normalised_in_groups(backend):
    """One normalisation for a whole batch took its largest |q|: beside |q| = 1e8 an element with |q| = 1 had a
    dual tolerance 1e8 times its own scale (SOLVED at x = 0.33 for x* = 1 from four backends). Each element now
    gets what its own solve gets (x* = -1e-9 to the absolute tolerance, as alone: the box sets its scale)."""
    qp = pp.QP([[1.0]], [0.0], lb=[-10.0], ub=[10.0])
    Q = [[-1e8], [-1.0], [0.0], [1e-9], [-2.0]]
    bs = pp.get_backend(backend).solve_batch(qp, q=Q)
    for i, want in enumerate([10.0, 1.0, 0.0, -1e-9, 2.0]):
        alone = pp.solve_qp(qp.with_vectors(q=Q[i]), backend=backend)
        assert bs.status[i] is alone.status, (i, bs.status, alone.status)
        if alone.status.ok:
            np.testing.assert_allclose(bs.x[i], [want], rtol=1e-6, atol=1e-8)
    assert sorted(map(sorted, bs.info["groups"])) == [[0], [1, 4], [2], [3]]
    # a batch of like sizes is one solve, as before
    assert "groups" not in pp.get_backend(backend).solve_batch(qp, q=[[-1e8], [-3e7]]).info


@pytest.mark.filterwarnings("ignore::polyproj.PolyprojWarning")
def test_admm_step_size_is_bounded_and_its_tests_have_a_rounding_floor():
    """From a probe of the ADMM: its adaptive ρ had no bounds (inf: NaN iterates and MAX_ITER on an infeasible
    QP; 1e-185: no certificate on an unbounded LP); an exact answer at |x| 1e4-1e6 ran to MAX_ITER (an absolute
    1e-8 on a gap whose terms are 1e12); the last iterate was never tested when check > max_iter."""
    qp = pp.QP(P=np.eye(2), q=[1.0, 1.0], C=[[0.0, 0.0], [1.0, 0.0]], l=[0.5, 0.0], u=[1.0, 1.0])  # 0·x >= 0.5
    assert pp.solve_qp(qp, backend="admm").status is pp.Status.PRIMAL_INFEASIBLE
    inf = np.inf
    lp = pp.QP(P=np.zeros((5, 5)), q=[-1.6676, -0.583, -0.5277, 0.4797, -3.4374],
               C=[[-0.1272, 0.123, -0.6333, -0.7213, 0.3083]], l=[-0.4244], u=[0.2801],
               lb=[-0.08, -inf, -0.7394, -0.7861, -inf], ub=[inf, inf, 0.4242, inf, 0.6782])
    assert lp.is_dual_infeasibility_certificate(np.array([1.0, 0.1272 / 0.123, 0, 0, 0]))
    assert pp.solve_qp(lp, backend="admm").status is pp.Status.DUAL_INFEASIBLE
    for s in (1e4, 1e6):
        sol = pp.solve_qp(pp.QP(P=np.eye(2), q=[-s, -s], C=[[1.0, 1.0]], l=[-np.inf], u=[s]), backend="admm")
        assert sol.status is pp.Status.SOLVED, (s, sol.status)
        np.testing.assert_allclose(sol.x, [s / 2, s / 2], rtol=1e-12)
    P = np.array([[4.0, 1.0], [1.0, 2.0]])
    sol = pp.solve_qp(pp.QP(P, [1.0, 1.0], [[1.0, 1.0]], [1.0], [1.0], lb=[0.0, 0.0], ub=[0.7, 0.7]), backend="admm",
                      check=5000)
    assert sol.status is pp.Status.SOLVED, sol.status


def test_grouped_batches_keep_the_time_limit_of_the_whole_call_and_the_groups_info():
    """The groups went through the guard one by one, each with the whole time_limit and its own clock; their
    info was dropped (a review)."""
    qp = pp.QP([[1.0]], [0.0], lb=[-10.0], ub=[10.0])
    Q = np.r_[np.full((3, 1), -1e8), np.full((3, 1), -1.0)]
    bs = pp.get_backend("ipm").solve_batch(qp, q=Q)
    assert len(bs.info["groups"]) == 2 and len(bs.info["group_info"]) == 2
    assert any("scaling" in g for g in bs.info["group_info"])
    timed = pp.get_backend("ipm", time_limit=1e-9).solve_batch(qp, q=Q)  # spent before the first group ends
    assert all(s is pp.Status.TIME_LIMIT for s in timed.status), timed.status


@pytest.mark.timeout(120)
def test_an_infeasible_problem_is_not_kept_solved_at_a_loose_scale(backend):
    """σ from |q| / |P| (3e8) while the constraints hold x near 0.1: an infeasible problem's point 0.24 outside
    its bound passed the normalised tolerances, its re-solve at x's size said PRIMAL_INFEASIBLE, and the first
    answer was kept as SOLVED_INACCURATE (every backend); in a batch likewise (a probe)."""
    qp = pp.QP([[3.7e-8]], [11.7], [[0.16], [-1.0]], l=[-0.14, 0.1], u=[np.inf, 0.1], ub=[-0.34])  # x = -0.1 <= -0.34
    assert pp.solve_qp(qp, backend=backend).status is pp.Status.PRIMAL_INFEASIBLE
    # element 1: 0.16 x >= 0.34 needs x >= 2.1, but x <= -0.17
    L, U = np.array([[-np.inf, -1.74], [0.34, -0.43]]), np.array([[1.08, -1.74], [np.inf, 0.32]])
    bs = pp.get_backend(backend).solve_batch(pp.QP([[3.7e-8]], [0.0], [[0.16], [-1.0]], L[1], U[1]), q=[[-6.4], [4.1]],
                                             l=L, u=U, lb=[[0.12], [-1.14]], ub=[[np.inf], [-0.17]])
    assert not bs.status[1].ok, (bs.status, bs.x[1])
    if bs.status[0].ok:
        np.testing.assert_allclose(bs.x[0], [1.74], rtol=1e-6)


@pytest.mark.parametrize("R", [1e8, 1e10, 1e13])
@pytest.mark.parametrize("zero_row", [False, True])
def test_a_loose_or_zero_row_does_not_set_the_scale(R, zero_row):
    """``min ½x² + x`` on x >= 0 with a row 0·x <= R: x* = 0. The zero row's right-hand side set σ = R, the
    objective shrank below the tolerances, and five backends returned SOLVED x = −1 or x = 3905…6659 (R = 1e8).
    Every backend now answers x* to its tolerance or reports that it did not solve. A nonzero row x <= R (a
    big-M stand-in the origin satisfies) still sets the first σ; the re-solves at the answer's size count it
    only up to 1 (scaling.replan), and an answer still far below σ after them is SOLVED_INACCURATE: a SOLVED
    answer is x* (before, SOLVED answers 0.1-0.4 off at R = 1e13, 3e-6 at R = 1e8)."""
    qp = pp.QP(P=[[1.0]], q=[1.0], C=[[0.0 if zero_row else 1.0]], l=[-np.inf], u=[R], lb=[0.0])
    two = pp.QP(P=np.eye(2), q=[1.0, -1.0], C=[[1.0, 1.0]] if not zero_row else [[0.0, 0.0]], l=[-R], u=[R],
                lb=[0.0, -np.inf], ub=[np.inf, 0.5])
    solved = 0
    for b in pp.available_backends():
        for problem, x_star in ((qp, [0.0]), (two, [0.0, 0.5])):
            sol = pp.solve_qp(problem, backend=b)
            solved += sol.status is pp.Status.SOLVED
            if zero_row and sol.status.ok:
                np.testing.assert_allclose(sol.x, x_star, rtol=0, atol=1e-5, err_msg=f"{b}, R={R:g}")
            elif sol.status is pp.Status.SOLVED:  # tolerances relative to the normalisation it stands in
                sigma = sol.info.get("scaling", {}).get("sigma", 1.0)
                np.testing.assert_allclose(sol.x, x_star, rtol=0, atol=max(1e-5, 1e-6 * sigma), err_msg=f"{b}, R={R:g}")
    # most backends solve both (PIQP and Clarabel fail honestly on the nonzero row at 1e10 and 1e13: MAX_ITER,
    # NUMERICAL_ERROR): the rule is not met by reporting failures
    assert solved >= len(pp.available_backends()), solved


@pytest.mark.parametrize("bound", [1e8, 1e10])
def test_a_box_the_origin_satisfies_does_not_keep_the_scale(bound):
    """``min ½p|x|² + x₀ + x₁`` s.t. ``x₀ − x₁ <= 1`` in a box of ±B (p = 1e-4, B = 1e8; 1e-6, 1e10): x* = −1/p
    (1, 1). The box set σ = B, the objective's normalisation left the answer's gap at eps_abs, and PIQP (the
    default), Clarabel and the IPM returned SOLVED objectives 8-19 % above the optimum. The re-solve at the
    answer's size counts such a box up to 1 only (scaling.replan)."""
    p = 1e-4 if bound == 1e8 else 1e-6
    qp = pp.QP(P=p * np.eye(2), q=[1.0, 1.0], C=[[1.0, -1.0]], l=[-np.inf], u=[1.0], lb=[-bound] * 2, ub=[bound] * 2)
    solved = 0
    for b in pp.available_backends():
        sol = pp.solve_qp(qp, backend=b)
        if sol.status is pp.Status.SOLVED:
            solved += 1
            # the optimum -1/p to the gap an interior point leaves on the nearly active row (|gap| <= 3.3e-1 at 1e6)
            assert abs(sol.objective + 1 / p) <= 1e-6 / p, (b, sol.objective)
    assert solved >= len(pp.available_backends()) - 1, solved


def test_a_box_bounds_the_unconstrained_minimisers_size():
    """``P = s I`` with s <= 1e-35, q = (1, 0) in [−1, 1]²: σ = |q| / |P| = 1e35 and more; ProxSuite, PIQP, the
    IPM and Clarabel returned SOLVED points 4 to 3.7e18 outside the box. Every variable boxed: σ is at most the
    box (scaling.plan)."""
    for s in (1e-35, 1e-40, 1e-50):
        qp = pp.QP(P=s * np.eye(2), q=[1.0, 0.0], lb=[-1.0, -1.0], ub=[1.0, 1.0])
        solved = 0
        for b in pp.available_backends():
            sol = pp.solve_qp(qp, backend=b)
            solved += sol.status is pp.Status.SOLVED
            if sol.status.ok:  # x₁ is free to rounding: its cost s x₁² / 2 is below every tolerance
                assert qp.primal_violation(sol.x) <= 1e-6 and abs(sol.x[0] + 1.0) <= 1e-6, (b, s, sol.x)
        assert solved >= len(pp.available_backends()) - 1, (s, solved)


def test_extreme_but_finite_scales_are_normalised_without_overflow():
    """``P = 1e-200 I`` raised a bare OverflowError (σ² in the normalisation), ``P = 1e200 I`` became a zero P
    (DUAL_INFEASIBLE from all backends), ``q = 1e-160`` made P̃ NaN: the normalisation's factors are formed from
    the sizes directly."""
    # (the first's x₁ is free to rounding: its cost 1e-200 x₁² / 2 is below every tolerance; on it DAQP fails,
    # NUMERICAL_ERROR after its claim of infeasibility is refuted, the others solve it)
    cases = [(pp.QP(P=1e-200 * np.eye(2), q=[1.0, 0.0], lb=[-1.0, -1.0], ub=[1.0, 1.0]), [-1.0, 0.0], 1),
             (pp.QP(P=1e200 * np.eye(2), q=[1.0, 0.0]), [-1e-200, 0.0], 2),
             (pp.QP(P=np.eye(2), q=[1e-160, 0.0]), [-1e-160, 0.0], 2)]
    for qp, x_star, k in cases:
        for b in pp.available_backends():
            sol = pp.solve_qp(qp, backend=b)
            if k == 1 and b == "daqp":
                assert sol.status is pp.Status.NUMERICAL_ERROR, sol.status
                continue
            assert sol.status is pp.Status.SOLVED, (b, sol.status, sol.info.get("validation"))
            assert qp.primal_violation(sol.x) <= 1e-9, b
            np.testing.assert_allclose(sol.x[:k], x_star[:k], rtol=1e-6, atol=1e-6 * abs(x_star[0]), err_msg=b)


def test_small_matrices_are_judged_relative_to_their_size():
    """The symmetry and convexity tolerances were ``1e-9 max(1, max|P|)``: ``1e-9 [[1, 2], [2, 1]]``
    (eigenvalue −1e-9) was accepted, and five backends returned its saddle point SOLVED; ``1e-10 [[1, 2], [0,
    1]]`` passed as symmetric. Both are relative to max|P| now; a zero P and a tiny PSD P stay accepted."""
    with pytest.raises(pp.ProblemError, match="positive semidefinite"):
        pp.QP(P=1e-9 * np.array([[1.0, 2.0], [2.0, 1.0]]), q=[0.0, 0.0], lb=[-1, -1], ub=[1, 1])
    with pytest.raises(pp.ProblemError, match="symmetric"):
        pp.QP(P=1e-10 * np.array([[1.0, 2.0], [0.0, 1.0]]), q=[0.0, 0.0])
    qp = pp.QP(P=-1e-9 * np.eye(2), q=[1e-9, 0.0], check_psd=False)
    assert all(pp.solve_qp(qp, backend=b).status is pp.Status.NON_CONVEX for b in pp.available_backends())
    pp.QP(P=np.zeros((2, 2)), q=[1.0, 0.0], lb=[-1, -1], ub=[1, 1])
    pp.QP(P=1e-300 * np.eye(2), q=[0.0, 0.0])


def test_a_zero_row_satisfied_by_zero_does_not_empty_the_set_for_clarabel():
    """``0 <= 0·x <= 3e6`` beside ordinary rows: as a cone row its lower side has a slack identically zero, and
    Clarabel reported the strictly feasible QP PRIMAL_INFEASIBLE (rows x1e6) or NUMERICAL_ERROR (x1). The row is
    left out of Clarabel's cones (multiplier 0); a zero row that 0 violates still empties the set."""
    if "clarabel" not in pp.available_backends():
        pytest.skip("clarabel not installed")
    P, q = np.diag([0.2, 0.6]), np.array([-0.5, -2.5])
    for scale in (1e6, 1.0):
        C = np.array([[-0.7 * scale, 1.4 * scale], [0.12 * scale, 0.0], [0.0, 0.0]])
        kw = dict(P=P, q=q, lb=[-2.0, -np.inf], ub=[0.012, 0.48])
        qp = pp.QP(C=C, l=[-np.inf, -np.inf, 0.0], u=[-7.5 * scale, 0.88 * scale, 3e6], **kw)
        ref = pp.solve_qp(pp.QP(C=C[:2], l=[-np.inf, -np.inf], u=[-7.5 * scale, 0.88 * scale], **kw), backend="highs")
        sol = pp.solve_qp(qp, backend="clarabel")
        assert sol.status is pp.Status.SOLVED, (scale, sol.status)
        np.testing.assert_allclose(sol.x, ref.x, rtol=0, atol=1e-6)
        assert sol.z[2] == 0.0
        bad = pp.solve_qp(pp.QP(C=C, l=[-np.inf, -np.inf, 1.0], u=[-7.5 * scale, 0.88 * scale, 3e6], **kw),
                          backend="clarabel")
        assert bad.status is pp.Status.PRIMAL_INFEASIBLE


def test_a_wrong_signed_multiplier_is_judged_by_its_force():
    """HiGHS at eps_abs 1e-6 on a row of norm 3e6 returned SOLVED x = (−0.5, −0.05) (x* = (0.355, 0.548), duality
    gap 0.13) with z = −8.8e-8 on the row's upper side: tiny in raw units, a force z·|row| of −0.26 against a
    stationarity scale of ~1. The sign test now weighs each multiplier by its row; the guard names the error, and
    what stands is x* or a status that says it is not."""
    if "highs" not in pp.available_backends():
        pytest.skip("highs not installed")
    P, q = np.array([[0.8, -0.7], [-0.7, 1.0]]), np.array([0.1, -0.3])
    qp = pp.QP(P=P, q=q, C=[[-3e6, 0.0]], l=[-np.inf], u=[1.5e6])
    x_star = np.linalg.solve(P, -q)
    for eps in (1e-6, 1e-7):
        sol = pp.solve_qp(qp, backend="highs", eps_abs=eps)
        if sol.status.ok:
            np.testing.assert_allclose(sol.x, x_star, rtol=0, atol=1e-4)
        else:
            assert sol.status is pp.Status.NUMERICAL_ERROR
            assert "multiplier" in sol.info.get("validation", "")
    # the force test leaves right answers alone on every backend
    for b in pp.available_backends():
        sol = pp.solve_qp(qp, backend=b)
        if sol.status.ok:
            np.testing.assert_allclose(sol.x, x_star, rtol=0, atol=1e-5, err_msg=b)


def test_infeasibility_certificates_are_judged_at_the_rows_scale():
    """A row scaled by 1e-6 (inside the band that is not normalised): ``d = −1`` passed as a proof that
    ``min x s.t. 1e-6 x >= 1e-6`` (x* = 1) is unbounded, and OSQP's PRIMAL_INFEASIBLE claims on such feasible
    QPs (whose certificates prove nothing) stood. Certificates are now tested in the rows' own units and
    OSQP's unproved claims are NUMERICAL_ERROR; true certificates at any row scale still pass."""
    lp = pp.QP(P=[[0.0]], q=[1.0], C=[[1e-6]], l=[1e-6], u=[np.inf])
    assert not lp.is_dual_infeasibility_certificate(np.array([-1.0]))
    for s in (1e-6, 1.0, 1e6):
        unbounded = pp.QP(P=[[0.0]], q=[1.0], C=[[s]], l=[-np.inf], u=[s])  # min x, x <= 1: d = −1 proves it
        assert unbounded.is_dual_infeasibility_certificate(np.array([-1.0]))
        empty = pp.QP(P=[[1.0]], q=[0.0], C=[[s]], l=[2 * s], u=[np.inf], ub=[1.0])  # x >= 2 and x <= 1
        assert empty.is_primal_infeasibility_certificate(np.array([-1.0 / s]), np.array([1.0]))
        assert not empty.is_primal_infeasibility_certificate(np.array([-1.0 / s]), np.array([0.5]))
    for t in (1e3, 1e6):  # translated: x >= t + 1 and x <= t, an exact certificate at any offset (a review)
        moved = pp.QP(P=[[1.0]], q=[0.0], C=[[1.0], [1.0]], l=[t + 1.0, -np.inf], u=[np.inf, t])
        assert moved.is_primal_infeasibility_certificate(np.array([-1.0, 1.0]), np.zeros(1), eps=1e-3)
        if "osqp" in pp.available_backends():
            assert pp.solve_qp(moved, backend="osqp").status is pp.Status.PRIMAL_INFEASIBLE
    if "osqp" not in pp.available_backends():
        return
    feasible = [pp.QP(P=[[1.0]], q=[0.0], C=[[-1e-6]], l=[1e-6], u=[np.inf]),
                pp.QP(P=[[0.0]], q=[1.0], C=[[1e-6]], l=[1e-6], u=[np.inf])]
    for qp, x_star in zip(feasible, ([-1.0], [1.0]), strict=True):
        sol = pp.solve_qp(qp, backend="osqp")
        assert sol.status not in (pp.Status.PRIMAL_INFEASIBLE, pp.Status.DUAL_INFEASIBLE), sol.status
        if sol.status.ok:
            np.testing.assert_allclose(sol.x, x_star, atol=1e-4)
    infeasible = pp.QP(P=[[1.0, 0.0], [0.0, 1.0]], q=[0.0, 0.0], C=[[1.0, 1.0]], l=[12.0], u=[np.inf],
                       lb=[-1.0, 0.0], ub=[1.0, 1.0])
    assert pp.solve_qp(infeasible, backend="osqp").status is pp.Status.PRIMAL_INFEASIBLE


def test_proxsuite_unproved_unboundedness_on_a_bounded_lp_is_not_reported():
    """``min x s.t. 1e-6 x >= 1e-6`` (x* = 1): ProxQP answered DUAL_INFEASIBLE with x = −1e15, no recession
    direction; an independent backend solves it, so the claim is a NUMERICAL_ERROR. A truly unbounded LP keeps
    DUAL_INFEASIBLE."""
    if "proxsuite" not in pp.available_backends():
        pytest.skip("proxsuite not installed")
    lp = pp.QP(P=[[0.0]], q=[1.0], C=[[1e-6]], l=[1e-6], u=[np.inf])
    sol = pp.solve_qp(lp, backend="proxsuite")
    assert sol.status is not pp.Status.DUAL_INFEASIBLE
    if sol.status.ok:
        np.testing.assert_allclose(sol.x, [1.0], atol=1e-4)
    unbounded = pp.QP(P=[[0.0]], q=[1.0], C=[[1.0]], l=[-np.inf], u=[1.0])
    assert pp.solve_qp(unbounded, backend="proxsuite").status is pp.Status.DUAL_INFEASIBLE


@pytest.mark.parametrize("R", [1e8, 1e10])
def test_a_binding_big_right_hand_side_is_the_scale(R):
    """``min ½(x0² + x1²) − x1`` with ``x0 >= R``: x* = (R, 1). The right-hand side binds, so it is the scale of
    x: capped as a big-M stand-in it left the problem unnormalised, and Clarabel said PRIMAL_INFEASIBLE, OSQP,
    PIQP and ProxSuite MAX_ITER (a review of the cap). Every backend answers x* or says it did not solve, never
    a false infeasibility."""
    qp = pp.QP(P=np.eye(2), q=[0.0, -1.0], C=[[1.0, 0.0]], l=[R], u=[np.inf])
    for b in pp.available_backends():
        sol = pp.solve_qp(qp, backend=b)
        assert sol.status is not pp.Status.PRIMAL_INFEASIBLE, b
        if sol.status.ok:
            np.testing.assert_allclose(sol.x, [R, 1.0], rtol=1e-6, atol=1e-6 * R, err_msg=b)


def test_a_solved_answer_that_misses_complementarity_is_inaccurate():
    """min 1e6 x on [-2, 10]: DAQP returned SOLVED at x = -1.99997 with z_box = -1e6, feasible and stationary, but
    2.6e-5 inside the bound its multiplier sits on (duality gap 26): now SOLVED_INACCURATE. An interior-point
    answer at a weakly active row through the origin (z · distance ~ 1e-11, at its eps_abs) stays SOLVED."""
    pytest.importorskip("daqp")
    for q in (1e6, 5e6):
        sol = pp.solve_qp(pp.QP(P=np.zeros((1, 1)), q=[q], lb=[-2.0], ub=[10.0]), backend="daqp")
        if sol.status is pp.Status.SOLVED:  # an exact answer (another DAQP build) stands
            assert abs(sol.x[0] + 2.0) <= 1e-9
        else:
            assert sol.status is pp.Status.SOLVED_INACCURATE and "complementarity" in sol.info["validation"]
    P = pp.Polyhedron(A=[[4.0, 0.0], [4.0, 0.0]], a=[0.0, 0.0])
    sol = pp.get_backend("ipm", eps_abs=1e-10, eps_rel=1e-10).solve(P.projection_qp(np.zeros(2)))
    assert sol.status is pp.Status.SOLVED


def test_a_large_linear_cost_is_solved_in_normalised_units():
    """An LP with |q| = 4.7e7 whose σ an inactive row sets at ~11 (|q| / σ = 4.3e6, below the objective trigger):
    left unnormalised, ProxSuite ran 3e6 iterations (28 s) to MAX_ITER, OSQP and the ADMM ended MAX_ITER. |q|
    itself (the dual residual's scale) is a trigger now: every backend solves it, to x* = -2.02795."""
    from polyproj.backends import scaling

    qp = pp.QP(P=np.zeros((1, 1)), q=[47213526.36568301],
               C=[[-0.06420072913400163], [0.29820079483120987], [-0.2952455420037893], [0.5504210574496845],
                  [-0.30122678345494547], [0.8346637027002156]],
               l=[-0.7078269123297193, -np.inf, 0.2614172473354128, -1.1162278545442823, -np.inf, -np.inf],
               u=[0.2100018084457784, np.inf, 0.839089969192947, 0.02050660539871851, np.inf, np.inf],
               lb=[-2.7495996992232064], ub=[-0.6105723886768348])
    assert scaling.plan(qp) is not None
    for backend in ("proxsuite", "osqp", "admm", "ipm"):
        if backend not in pp.available_backends():  # the floors' environment (make test-min) has the core only
            continue
        sol = pp.solve_qp(qp, backend=backend, time_limit=20.0)
        assert sol.status.ok and abs(sol.x[0] + 2.02795267) <= 1e-5, (backend, sol.status, sol.x)


@pytest.mark.parametrize("backend", ["ipm", "clarabel", "piqp"])
def test_a_weakly_active_bound_at_the_origin_stays_solved_at_tight_tolerances(backend):
    """min ½x² s.t. x >= 0 (as a bound, a row, or both): an interior-point answer x ~ 1e-5 with z ~ 1e-6 (its μ at
    eps_abs) was 'not a solution' (NUMERICAL_ERROR) at eps_abs <= 1e-9: complementarity's gross test scaled with
    |x| and |z| alone. eps_abs in the objective's units is its floor now."""
    if backend not in pp.available_backends():
        pytest.skip(f"{backend} not installed")
    inf = np.inf
    for qp in (pp.QP(P=np.eye(1), q=[0.0], lb=[0.0]), pp.QP(P=np.eye(1), q=[0.0], C=[[1.0]], l=[0.0], u=[inf]),
               pp.QP(P=np.eye(1), q=[0.0], C=[[1.0]], l=[0.0], u=[inf], lb=[0.0])):
        for eps in (1e-9, 1e-10, 1e-11):
            sol = pp.get_backend(backend, eps_abs=eps).solve(qp)
            assert sol.status is pp.Status.SOLVED and abs(sol.x[0]) <= 1e-4, (eps, sol.status, sol.info)


def test_a_claim_of_infeasibility_is_refuted_by_a_point_of_the_constraints():
    """DAQP said PRIMAL_INFEASIBLE on this feasible QP (one row of norm 7e-5, x0 satisfies every constraint
    exactly; DAQP and PIQP pass such claims on as a bare flag). The guard's LP (backends/feasibility.py) finds a
    point of the constraints: the claim becomes NUMERICAL_ERROR, saying so; a truly empty set keeps its claim."""
    P = np.array([[87778.84382652181, 11272.266830688905, 7741.1630036780525, -46056.491878944835],
                  [11272.266830688905, 115678.48098198044, 60683.489890661884, 32004.616385176534],
                  [7741.1630036780525, 60683.489890661884, 76685.62203899374, 6494.259699715713],
                  [-46056.491878944835, 32004.616385176534, 6494.259699715713, 48555.20532793308]])
    q = np.array([-226.3694500391631, -194.67456302725603, -234.59358651491743, -6.049422225933314])
    C = np.array([[6.358840596389099e-06, -3.299210859808487e-05, 6.575670610243006e-05, 4.211081913104519e-06]])
    lb = np.array([-0.03558330746387334, -0.09335940898801816, -0.03777270775781871, -0.02372364721563739])
    ub = np.array([0.01336399351617986, -0.0236091940535033, -0.03278003351611484, 0.0309017401071019])
    qp = pp.QP(P=P, q=q, C=C, l=[-np.inf], u=[-3.456156692032402e-07], lb=lb, ub=ub)
    x0 = np.array([0.0003562212829999, -0.0524746098577271, -0.0369110575752068, -0.01853032140556996])
    assert qp.primal_violation(x0) == 0.0
    for b in pp.available_backends():
        sol = pp.solve_qp(qp, backend=b)
        assert sol.status is not pp.Status.PRIMAL_INFEASIBLE, b
        if sol.status is pp.Status.NUMERICAL_ERROR and sol.info.get("claimed_status") == "PRIMAL_INFEASIBLE":
            assert "refuted" in sol.info["validation"]
    # the batch path checks each element's claim; an empty element keeps it
    empty = np.array([[-np.inf], [-np.inf]]), np.array([[-3.456156692032402e-07], [-1.0]])
    for b in pp.available_backends():
        bs = pp.get_backend(b).solve_batch(qp, l=empty[0], u=empty[1])
        assert bs.status[0] is not pp.Status.PRIMAL_INFEASIBLE, b
        assert bs.status[1] in (pp.Status.PRIMAL_INFEASIBLE, pp.Status.MAX_ITER), (b, bs.status[1])


def test_a_true_claim_of_infeasibility_stands_at_any_scale():
    """``x₁ − x₂ <= −0.01`` and ``x₂ − x₁ <= −0.01`` in a box at 1e9: empty by 0.02. Every backend says so; the
    first refutation test (an LP point within 1e-10 of the rows' terms, 0.2 at |x| 1e9) turned the claims into
    NUMERICAL_ERROR. A claim is refuted only by a point strictly inside every row."""
    qp = pp.QP(P=np.eye(2), q=[0.0, 0.0], C=[[1.0, -1.0], [-1.0, 1.0]], l=[-np.inf] * 2, u=[-0.01] * 2,
               lb=[1e9] * 2, ub=[2e9] * 2)
    for b in pp.available_backends():
        assert pp.solve_qp(qp, backend=b).status in (pp.Status.PRIMAL_INFEASIBLE, pp.Status.MAX_ITER), b


def test_a_claim_of_unboundedness_with_a_positive_definite_p_is_refuted():
    """Clarabel claimed DUAL_INFEASIBLE for P = I beside rows with sides at −1e11; with P positive definite the
    objective is bounded below, so the guard makes such a claim NUMERICAL_ERROR (a backend that always claims it)."""

    class Unbounded(pp.QPSolver):
        name = "always_unbounded"
        capabilities = pp.Capabilities(dense=True)

        def solve(self, qp, warm_start=None):
            return self._nan_solution(qp, pp.Status.DUAL_INFEASIBLE, self.name)

    sol = Unbounded().solve(pp.QP(P=np.eye(2), q=[1.0, 0.0]))
    assert sol.status is pp.Status.NUMERICAL_ERROR and "positive definite" in sol.info["validation"]
    sol = Unbounded().solve(pp.QP(P=np.diag([1.0, 0.0]), q=[1.0, 1.0]))  # truly unbounded: the claim stands
    assert sol.status is pp.Status.DUAL_INFEASIBLE


def test_batched_vectors_and_warm_starts_that_are_not_real_numbers_are_problem_errors():
    """Strings and ragged lists as batched vectors, or strings as a warm start, raised NumPy's ValueError; a
    complex batched q was solved with its imaginary part dropped (QP() refuses all three with ProblemError)."""
    qp = pp.QP(P=np.eye(2), q=[1.0, 1.0], C=[[1.0, 1.0]], l=[0.0], u=[1.0])
    solver = pp.get_backend("ipm")
    for q in (np.array([["a", "b"]]), [[1.0, 1.0], [1.0]], np.array([[1 + 5j, 0.0]])):
        with pytest.raises(pp.ProblemError, match="batched q"):
            solver.solve_batch(qp, q=q)
    with pytest.raises(pp.ProblemError, match="warm_start x"):
        pp.solve_qp(qp, backend="ipm", warm_start={"x": np.array(["a", "b"])})
    bs = solver.solve_batch(qp, q=np.array([[1.0 + 0j, 0.0]]).real)  # real parts of a complex array are numbers
    assert bs.status[0] is pp.Status.SOLVED


def test_torch_tensors_as_warm_starts_and_batched_vectors():
    """A warm start that requires grad raised torch's RuntimeError from inside a backend; bfloat16 warm starts,
    batched vectors and QP data raised TypeError (NumPy has no bfloat16). They are read on the host in float64;
    a complex tensor is refused."""
    torch = pytest.importorskip("torch")
    qp = pp.QP(P=np.eye(2), q=[1.0, 1.0], C=[[1.0, 1.0]], l=[0.0], u=[1.0])
    for b in pp.available_backends():
        for x in (torch.zeros(2, requires_grad=True), torch.zeros(2, dtype=torch.bfloat16)):
            assert pp.solve_qp(qp, backend=b, warm_start={"x": x}).status is pp.Status.SOLVED, b
    ipm = pp.get_backend("ipm")
    for q in (torch.ones(3, 2, dtype=torch.bfloat16), torch.ones(3, 2, dtype=torch.float64, requires_grad=True)):
        assert all(s is pp.Status.SOLVED for s in ipm.solve_batch(qp, q=q).status)
    with pytest.raises(pp.ProblemError, match="real numbers"):
        ipm.solve_batch(qp, q=torch.ones(3, 2, dtype=torch.complex64))
    np.testing.assert_array_equal(pp.QP(P=torch.eye(2, dtype=torch.bfloat16), q=torch.ones(2)).P, np.eye(2))


def test_a_claim_of_unboundedness_on_an_empty_set_becomes_primal_infeasible():
    """``x₁ <= 1``, ``x₁ >= 2`` with a descent ray along x₀: the IPM and ProxSuite said DUAL_INFEASIBLE ("the
    objective is unbounded below on the feasible set"), the others PRIMAL_INFEASIBLE. Unbounded needs a feasible
    set: the constraints' LP decides; a truly unbounded problem keeps its status."""
    qp = pp.QP(P=np.zeros((3, 3)), q=[-1.0, 0.0, 0.0], C=[[0.0, 1.0, 0.0]], l=[2.0], u=[np.inf],
               ub=[np.inf, 1.0, np.inf])
    for b in pp.available_backends():
        assert pp.solve_qp(qp, backend=b).status in (pp.Status.PRIMAL_INFEASIBLE, pp.Status.MAX_ITER), b
    free = pp.QP(P=np.zeros((2, 2)), q=[-1.0, 0.0], ub=[np.inf, 1.0])
    assert pp.solve_qp(free, backend="ipm").status is pp.Status.DUAL_INFEASIBLE
    bs = pp.get_backend("ipm").solve_batch(qp, q=np.array([[-1.0, 0.0, 0.0], [0.0, 0.0, -1.0]]))
    assert all(s is pp.Status.PRIMAL_INFEASIBLE for s in bs.status), bs.status
    # (review) feasible and unbounded, rows normalised at 3e10 and 9e10 rounding 3.8e-6 apart: an absolute test of
    # the LP's least violation called it empty; relative to the constraints' size it stands
    far = pp.QP(P=np.zeros((2, 2)), q=[-1.0, 0.0], C=[[1.0, 1.0], [3.0, 3.0]], l=[-np.inf, 9e10], u=[3e10, np.inf])
    for b in pp.available_backends():
        assert pp.solve_qp(far, backend=b).status is not pp.Status.PRIMAL_INFEASIBLE, b
    # inconsistent equalities: the LP itself is infeasible (HiGHS): empty, whatever a backend says
    from polyproj.backends.feasibility import certainly_empty

    assert certainly_empty(pp.QP(P=np.zeros((2, 2)), q=[-1.0, 0.0], C=[[1.0, 1.0], [1.0, 1.0]], l=[1.0, 2.0],
                                 u=[1.0, 2.0])) is not None
    assert certainly_empty(far) is None
