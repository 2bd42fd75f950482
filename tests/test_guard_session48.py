"""The guard (polyproj.backends.validation), from a probe: answers not confirmed at their own size are judged
there; a batch warm start loses its non-finite parts per element; a false NON_CONVEX claim is refuted."""

from __future__ import annotations

import numpy as np
import pytest

import polyproj as pp

pytestmark = pytest.mark.core

# x0 in [-1, 1], x1 free, q0 = 1e10: σ = |q| / |P| = 1e10 while the constraints hold x near 1; x* = (-1, 0)
_Q0 = 1e10


def _held_qp(q0: float = _Q0) -> pp.QP:
    return pp.QP(P=np.eye(2), q=[q0, 0.0], lb=[-1.0, -np.inf], ub=[1.0, np.inf])


class _LooseThenFails(pp.QPSolver):
    """Normalised by a σ far above x (read from its bound ũb₀ = 1 / σ) it returns ``miss`` below the lower bound
    of x0, its multipliers from stationarity; normalised near x's size it fails (NUMERICAL_ERROR)."""

    name = "loose_then_fails"
    capabilities = pp.Capabilities(dense=True)
    miss = 0.5

    def solve(self, qp, warm_start=None):
        sigma = 1.0 / qp.ub[0]
        if sigma < 1e3:
            return self._nan_solution(qp, pp.Status.NUMERICAL_ERROR, self.name)
        x = np.array([-1.0 - self.miss, 0.0]) / sigma
        return pp.Solution(x=x, z=np.zeros(0), z_box=-(qp.P @ x + qp.q), status=pp.Status.SOLVED, backend=self.name,
                           qp=qp)


def _loose(miss: float) -> _LooseThenFails:
    solver = _LooseThenFails()
    solver.miss = miss
    return solver


def test_an_unconfirmed_answer_far_outside_its_constraints_is_a_numerical_error():
    """Solved at σ = 1e10, x0 = -1.5 on [-1, 1] met the tolerances of σ's units (~100 each); its re-solve at its own
    size failed and it was kept SOLVED_INACCURATE (ok), judged in σ's units. Judged at its own size it is no
    solution; the single and the batch path agree."""
    qp = _held_qp()
    sol = _loose(0.5).solve(qp)
    assert sol.status is pp.Status.NUMERICAL_ERROR, (sol.status, sol.info)
    assert qp.primal_violation(sol.x) == pytest.approx(0.5)  # the answer kept, as returned
    note = sol.info["validation"]
    assert "not confirmed" in note and "violates the constraints" in note and sol.info["claimed_status"] == "SOLVED"
    bs = _loose(0.5).solve_batch(qp, q=[[_Q0, 0.0], [2 * _Q0, 1.0]])
    assert bs.status == (pp.Status.NUMERICAL_ERROR,) * 2, bs.status
    for i in range(2):
        info = bs.solution(i).info
        assert "not confirmed" in info["validation"] and info["claimed_status"] == "SOLVED", info


def test_an_unconfirmed_answer_close_at_its_own_size_stays_solved_inaccurate():
    """1e-7 outside the bound (within 10³ × eps of x's own size): not confirmed, but a solution to rounding there."""
    qp = _held_qp()
    sol = _loose(1e-7).solve(qp)
    assert sol.status is pp.Status.SOLVED_INACCURATE and sol.ok, (sol.status, sol.info)
    np.testing.assert_allclose(sol.x, [-1.0, 0.0], atol=2e-7)
    bs = _loose(1e-7).solve_batch(qp, q=[[_Q0, 0.0], [2 * _Q0, 0.0]])
    assert bs.status == (pp.Status.SOLVED_INACCURATE,) * 2, bs.status
    np.testing.assert_allclose(bs.x, [[-1.0, 0.0]] * 2, atol=2e-7)


_PROBE = pp.QP(P=[[4.632, -1.024, -1.615], [-1.024, 4.129, -0.679], [-1.615, -0.679, 2.729]],
               q=[5.0e9, 1.6e10, 1.59e11], C=[[0.41, -0.26, 1.76]], l=[-0.71], u=[0.2],
               lb=[-1.0, -1.0, -np.inf], ub=[1.0, np.inf, 1.0])


def _reference(qp: pp.QP) -> np.ndarray:
    """x* of :data:`_PROBE`, a KKT point checked here: x0 = 1, x1 = -1 at their bounds, the row at its lower side."""
    P, q, c = np.asarray(qp.P), qp.q, np.asarray(qp.C)[0]
    x = np.array([1.0, -1.0, 0.0])
    x[2] = (qp.l[0] - c[:2] @ x[:2]) / c[2]
    z = -(P[2] @ x + q[2]) / c[2]  # the row's multiplier from stationarity in x2
    z_box = -(P @ x + q + c * z)
    assert z < 0 and z_box[0] > 0 and z_box[1] < 0  # lower side, upper bound, lower bound
    assert qp.primal_violation(x) <= 1e-12
    return x


@pytest.mark.parametrize("backend", ["proxsuite", "admm"])
def test_a_probes_answers_are_solutions_or_failures(backend):
    """The probe's QP (|q| 1.6e11, unit-scale constraints): ProxSuite's answer 161 outside the row came back
    SOLVED_INACCURATE (ok), alone and in a batch. Whatever a backend does, an ok answer is x*."""
    if backend not in pp.available_backends():
        pytest.skip(f"{backend} not installed")
    x_star = _reference(_PROBE)
    sol = pp.solve_qp(_PROBE, backend=backend)
    if sol.ok:
        np.testing.assert_allclose(sol.x, x_star, atol=1e-5, err_msg=str(sol.info.get("validation")))
    bs = pp.get_backend(backend).solve_batch(_PROBE, q=np.array([_PROBE.q, _PROBE.q]))
    for i in range(2):
        if bs.status[i].ok:
            np.testing.assert_allclose(bs.x[i], x_star, atol=1e-5)


def test_admm_answer_after_a_free_row_is_a_solution_or_a_failure():
    """A probe: with a free row (both sides infinite) the ADMM's answer, 0.27 outside a row, was kept
    SOLVED_INACCURATE after its re-solve at its own size ended MAX_ITER."""
    P = np.array([[3.263, -0.141, 0.893], [-0.141, 0.716, -1.503], [0.893, -1.503, 7.599]])
    qp = pp.QP(P=P, q=[1.75e10, -2.18e10, 1.77e10],
               C=[[0.86, 0.37, -0.04], [0.86, 0.37, -0.04], [0.67, 0.21, -0.17]],
               l=[-np.inf, -0.3298, -0.5482], u=[np.inf, 0.2002, 0.9018],
               lb=[-np.inf, -0.55, -np.inf], ub=[0.67, 0.33, -0.87])
    sol = pp.solve_qp(qp, backend="admm")
    if sol.ok:
        assert qp.primal_violation(sol.x) <= 1e-6 * max(1.0, np.abs(sol.x).max()), (sol.x, sol.info)
    else:
        assert sol.status is pp.Status.NUMERICAL_ERROR and "not confirmed" in sol.info["validation"], sol.info


# --------------------------------------------------------------------------- batch warm starts
_SIMPLEX = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0], lb=[0.0, 0.0])
_Q = np.array([[-1.0, -1.0], [-2.0, 0.0], [0.5, -3.0]])
_X = np.array([[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]])  # the projections of -q onto {x >= 0, x0 + x1 <= 1}


def _warm(z: float) -> pp.BatchSolution:
    return pp.BatchSolution(x=np.zeros((3, 2)), z=np.full((3, 1), z), z_box=np.zeros((3, 2)),
                            status=(pp.Status.SOLVED,) * 3, iterations=np.zeros(3, dtype=np.int64))


class _Records(pp.QPSolver):
    """Solves nothing (MAX_ITER); keeps the warm starts the default batch loop hands it."""

    name = "records"
    capabilities = pp.Capabilities(dense=True, warm_start=True)

    def solve(self, qp, warm_start=None):
        self.seen.append(warm_start)
        return self._nan_solution(qp, pp.Status.MAX_ITER, self.name)


def test_a_batch_warm_start_reaches_the_backend_without_non_finite_values():
    """solve() drops a warm start's non-finite parts (finite_warm_start); solve_batch handed an infinite z on."""
    ws = _warm(0.0)
    ws.z[1, 0] = np.inf
    ws.x[2, 0] = -np.inf
    solver = _Records()
    solver.seen = []
    solver.solve_batch(_SIMPLEX, q=_Q, warm_start=ws)
    assert len(solver.seen) == 3
    for i, got in enumerate(solver.seen):
        for key in ("x", "z", "z_box"):
            v = np.asarray(getattr(got, key))
            assert not np.isinf(v).any(), (i, key, v)
            if np.isfinite(getattr(ws, key)[i]).all():  # a finite part arrives as given
                np.testing.assert_array_equal(v, getattr(ws, key)[i])
    assert np.isnan(solver.seen[1].z).all() and np.isnan(solver.seen[2].x).all()


def test_proxsuite_batch_with_an_infinite_warm_multiplier_solves_every_element():
    """ProxSuite's batch read z = inf as 1.8e308: MAX_ITER and NaN x for every element (its solve() was SOLVED)."""
    pytest.importorskip("proxsuite")
    bs = pp.get_backend("proxsuite").solve_batch(_SIMPLEX, q=_Q, warm_start=_warm(np.inf))
    assert bs.status == (pp.Status.SOLVED,) * 3, bs.status
    np.testing.assert_allclose(bs.x, _X, atol=1e-6)


# --------------------------------------------------------------------------- NON_CONVEX claims
class _SaysNonConvex(pp.QPSolver):
    name = "says_nonconvex"
    capabilities = pp.Capabilities(dense=True)

    def solve(self, qp, warm_start=None):
        return self._nan_solution(qp, pp.Status.NON_CONVEX, self.name)


def test_a_non_convex_claim_on_a_psd_P_is_refuted():
    """NON_CONVEX says that P is not PSD; on P = I (decided PSD by the QP, or by its eigenvalue where the QP did not
    check) the claim is a NUMERICAL_ERROR with a note, alone and in a batch."""
    for qp in (_SIMPLEX, pp.QP(P=np.eye(2), q=[1.0, 0.0], check_psd=False)):
        sol = _SaysNonConvex().solve(qp)
        assert sol.status is pp.Status.NUMERICAL_ERROR and sol.info["claimed_status"] == "NON_CONVEX", sol.info
        assert "refuted" in sol.info["validation"]
    bs = _SaysNonConvex().solve_batch(_SIMPLEX, q=_Q)
    assert bs.status == (pp.Status.NUMERICAL_ERROR,) * 3
    assert bs.solution(0).info["claimed_status"] == "NON_CONVEX"


def test_osqp_far_off_warm_start_is_never_non_convex():
    """OSQP said NON_CONVEX for P = I from a warm start at ±1e50 (alone) or 1e300 (a batch)."""
    pytest.importorskip("osqp")
    solver = pp.get_backend("osqp")
    for big in (1e50, 1e300):
        sol = solver.solve(_SIMPLEX.with_vectors(q=_Q[0]), warm_start={"x": np.array([big, -big])})
        assert sol.status is not pp.Status.NON_CONVEX, (big, sol.status)
        if sol.ok:
            np.testing.assert_allclose(sol.x, _X[0], atol=1e-6)
    huge = pp.BatchSolution(x=np.full((3, 2), 1e300), z=np.full((3, 1), 1e300), z_box=np.full((3, 2), -1e300),
                            status=(pp.Status.SOLVED,) * 3, iterations=np.zeros(3, dtype=np.int64))
    bs = solver.solve_batch(_SIMPLEX, q=_Q, warm_start=huge)
    assert pp.Status.NON_CONVEX not in bs.status, bs.status
    for i in np.flatnonzero(bs.ok):
        np.testing.assert_allclose(bs.x[i], _X[i], atol=1e-6)
