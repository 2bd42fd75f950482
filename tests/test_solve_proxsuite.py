"""solve_qp with ProxSuite: residuals, sign convention, statuses, warm start, sparse data, batches."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import polyproj as pp
from tests.helpers import solution_distance_bound


def _feasible_qp(rng, n=10, m=8, p=2, sparse=False, bounds=True):
    M = rng.normal(size=(n, n))
    P = M @ M.T + 0.1 * np.eye(n)
    x0 = rng.normal(size=n)
    C = rng.normal(size=(m + p, n))
    l = np.concatenate([C[:m] @ x0 - rng.uniform(0, 1, m), C[m:] @ x0])
    u = np.concatenate([C[:m] @ x0 + rng.uniform(0, 1, m), C[m:] @ x0])
    l[:2] = -np.inf  # one-sided rows
    kw = {"lb": x0 - 1.0, "ub": x0 + 1.0} if bounds else {}
    if sparse:
        P, C = sp.csc_matrix(P), sp.csc_matrix(C)
    return pp.QP(P=P, q=rng.normal(size=n) * 5, C=C, l=l, u=u, **kw)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("bounds", [False, True])
def test_solution_residuals_and_sign_convention(rng, sparse, bounds):
    qp = _feasible_qp(rng, sparse=sparse, bounds=bounds)
    sol = pp.solve_qp(qp, backend="proxsuite", eps_abs=1e-10)
    assert sol.status is pp.Status.SOLVED and sol.ok
    r = sol.residuals()
    assert r["primal"] < 1e-8 and r["dual"] < 1e-8 and r["gap"] < 1e-7, r
    # sign convention: z > 0 only where the upper side is active, z < 0 only at the lower side
    Cx = qp.C @ sol.x
    up = sol.z > 1e-7
    lo = sol.z < -1e-7
    np.testing.assert_allclose(Cx[up], qp.u[up], atol=1e-7)
    np.testing.assert_allclose(Cx[lo], qp.l[lo], atol=1e-7)
    np.testing.assert_allclose(sol.x[sol.z_box > 1e-7], qp.ub[sol.z_box > 1e-7], atol=1e-7)
    np.testing.assert_allclose(sol.x[sol.z_box < -1e-7], qp.lb[sol.z_box < -1e-7], atol=1e-7)
    assert sol.backend == "proxsuite" and sol.iterations > 0


def test_residual_methods_detect_wrong_answers(rng):
    qp = _feasible_qp(rng)
    sol = pp.solve_qp(qp, backend="proxsuite", eps_abs=1e-10)
    flipped = pp.Solution(x=sol.x, z=-sol.z, z_box=-sol.z_box, status=sol.status, qp=qp)
    assert flipped.dual_residual() > 1e-3
    moved = pp.Solution(x=sol.x + 0.1, z=sol.z, z_box=sol.z_box, status=sol.status, qp=qp)
    assert moved.dual_residual() > 1e-3
    with pytest.raises(pp.PolyprojError, match="carries no problem"):
        pp.Solution(x=sol.x, z=sol.z, z_box=sol.z_box, status=sol.status).primal_residual()


def test_duality_gap_definition():
    # min ½x² - x  s.t. x <= 0.5: x* = 0.5, z = 0.5; gap = |x²-x + 0.5*0.5| = 0 at the optimum
    qp = pp.QP(P=[[1.0]], q=[-1.0], C=[[1.0]], l=[-np.inf], u=[0.5])
    sol = pp.Solution(x=np.array([0.5]), z=np.array([0.5]), z_box=np.zeros(1), status=pp.Status.SOLVED, qp=qp)
    assert sol.duality_gap() == pytest.approx(0.0, abs=1e-15)
    assert sol.dual_residual() == pytest.approx(0.0, abs=1e-15)
    bad = pp.Solution(x=np.array([0.5]), z=np.array([0.2]), z_box=np.zeros(1), status=pp.Status.SOLVED, qp=qp)
    assert bad.duality_gap() == pytest.approx(0.15)


def test_primal_infeasible_is_a_status():
    # x1 <= -1 and -x1 <= -1; (ProxQP does not certify every infeasible problem: some end in MAX_ITER)
    qp = pp.QP(P=np.eye(2), q=np.zeros(2), C=[[1.0, 0.0], [-1.0, 0.0]], l=[-np.inf, -np.inf], u=[-1.0, -1.0])
    sol = pp.solve_qp(qp, backend="proxsuite")
    assert sol.status is pp.Status.PRIMAL_INFEASIBLE
    assert not sol.ok
    assert "no point" in sol.status.message


def test_dual_infeasible_is_a_status():
    # min -x1 with x1 unbounded above
    qp = pp.QP(P=np.zeros((2, 2)), q=[-1.0, 0.0], C=[[0.0, 1.0]], l=[0.0], u=[1.0])
    sol = pp.solve_qp(qp, backend="proxsuite")
    assert sol.status in (pp.Status.DUAL_INFEASIBLE, pp.Status.MAX_ITER)
    assert not sol.ok


def test_max_iter_is_a_status(rng):
    qp = _feasible_qp(rng, n=30, m=40)
    sol = pp.solve_qp(qp, backend="proxsuite", eps_abs=1e-12, max_iter=1)
    assert sol.status is pp.Status.MAX_ITER


def test_warm_start_from_the_solution_needs_fewer_iterations(rng):
    qp = _feasible_qp(rng, n=40, m=60)
    cold = pp.solve_qp(qp, backend="proxsuite", eps_abs=1e-9)
    warm = pp.solve_qp(qp.with_vectors(q=qp.q + 1e-4), backend="proxsuite", eps_abs=1e-9, warm_start=cold)
    assert warm.status is pp.Status.SOLVED
    assert warm.iterations <= cold.iterations
    warm2 = pp.solve_qp(qp, backend="proxsuite", eps_abs=1e-9,
                        warm_start={"x": cold.x, "z": cold.z, "z_box": cold.z_box})
    assert warm2.iterations <= cold.iterations


def test_solve_batch_native_matches_single_solves(rng):
    qp = _feasible_qp(rng, n=12, m=10)
    Q = rng.normal(size=(7, 12)) * 5
    solver = pp.get_backend("proxsuite", eps_abs=1e-10)
    batch = solver.solve_batch(qp, q=Q)
    assert len(batch) == 7 and batch.ok.all()
    for i in range(7):
        qpi = qp.with_vectors(q=Q[i])
        single = solver.solve(qpi)
        el = batch.solution(i)
        assert el.dual_residual() < 1e-8 and single.dual_residual() < 1e-8
        # batch and single solves are both inexact: x agrees to the sum of the KKT distance bounds
        bound = solution_distance_bound(qpi, el) + solution_distance_bound(qpi, single)
        assert np.linalg.norm(el.x - single.x) <= bound


def test_solve_batch_with_batched_bounds(rng):
    qp = _feasible_qp(rng, n=6, m=4, p=0)
    U = np.broadcast_to(qp.u, (3, qp.m)).copy()
    U[1] += 0.5
    batch = pp.get_backend("proxsuite", eps_abs=1e-10).solve_batch(qp, u=U)
    for i in range(3):
        qpi = qp.with_vectors(u=U[i])
        ref = pp.solve_qp(qpi, backend="proxsuite", eps_abs=1e-10)
        el = batch.solution(i)
        assert np.linalg.norm(el.x - ref.x) <= solution_distance_bound(qpi, el) + solution_distance_bound(qpi, ref)


def test_solve_batch_rejects_bad_shapes(rng):
    qp = _feasible_qp(rng, n=4, m=2, p=0)
    solver = pp.get_backend("proxsuite")
    with pytest.raises(pp.ProblemError, match=r"batched q must have shape \(batch, 4\)"):
        solver.solve_batch(qp, q=np.zeros((2, 5)))
    with pytest.raises(pp.ProblemError, match="disagree on the batch size"):
        solver.solve_batch(qp, q=np.zeros((2, 4)), u=np.zeros((3, 2)))


def test_solve_qp_rejects_non_qp():
    with pytest.raises(pp.ProblemError, match="takes a polyproj.QP"):
        pp.solve_qp({"P": np.eye(2)})


def test_solve_batch_validates_the_batch(rng):
    qp = _feasible_qp(rng, n=4, m=2, p=0)
    solver = pp.get_backend("proxsuite")
    Q = np.zeros((3, 4))
    Q[1, 2] = np.nan
    with pytest.raises(pp.ProblemError, match=r"batched q contains NaN \(first at \(1, 2\)\)"):
        solver.solve_batch(qp, q=Q)
    with pytest.raises(pp.ProblemError, match=r"batched q\[0, 0\] = inf is not allowed: a cost must be finite"):
        solver.solve_batch(qp, q=np.full((2, 4), np.inf))
    L = np.broadcast_to(qp.u + 1.0, (2, qp.m))
    with pytest.raises(pp.ProblemError, match="batched bounds cross"):
        solver.solve_batch(qp, l=L)


def test_an_uncertified_infeasibility_claim_on_a_feasible_lp_is_not_kept():
    """ProxQP says PRIMAL_INFEASIBLE on this small feasible LP (optimum (3, 0.5)); without a certificate and
    with an independent backend solving it, the claim becomes NUMERICAL_ERROR, never a wrong status."""
    qp = pp.QP(P=np.zeros((2, 2)), q=[-1.0, -1.0], C=[[1.0, 2.0]], l=[-np.inf], u=[4.0], lb=[0, 0], ub=[3, 3])
    sol = pp.solve_qp(qp, backend="proxsuite")
    assert sol.status is not pp.Status.PRIMAL_INFEASIBLE
    if sol.status.ok:  # a future ProxSuite may solve it
        np.testing.assert_allclose(sol.x, [3.0, 0.5], atol=1e-6)


def test_a_refuted_infeasibility_claim_is_solved_again_with_a_larger_rho():
    """Random small feasible LPs (P = 0, box and inequality rows) on which ProxQP's default rho claims
    PRIMAL_INFEASIBLE: the retry with rho = RETRY_RHO solves them, to the exact optimum (DAQP's, an active
    set method's), and says so; a rho the user set is never overridden."""
    from polyproj.backends.proxsuite import RETRY_RHO

    rng = np.random.default_rng(0)
    retried = 0
    for _ in range(60):
        n, m = int(rng.integers(2, 8)), int(rng.integers(1, 6))
        C, x0 = rng.normal(size=(m, n)), rng.normal(size=n)
        qp = pp.QP(P=np.zeros((n, n)), q=rng.normal(size=n), C=C, l=np.full(m, -np.inf),
                   u=C @ x0 + rng.uniform(0.1, 1, m), lb=x0 - rng.uniform(0.5, 2, n), ub=x0 + rng.uniform(0.5, 2, n))
        sol = pp.solve_qp(qp, backend="proxsuite")
        assert sol.status is pp.Status.SOLVED
        ref = pp.solve_qp(qp, backend="daqp")
        assert abs(qp.objective(sol.x) - qp.objective(ref.x)) <= 1e-6 * (1 + abs(qp.objective(ref.x)))
        if "retry" in sol.info:
            retried += 1
            assert f"rho {RETRY_RHO:g}" in sol.info["retry"]
            fixed = pp.get_backend("proxsuite", rho=1e-6).solve(qp)
            assert fixed.status is pp.Status.NUMERICAL_ERROR and "retry" not in fixed.info
    assert retried  # ProxQP's default claimed infeasibility on some of them


def test_solve_time_is_reported():
    """ProxQP fills its timings only with compute_timings on (its time-limit check reads them too)."""
    qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    sol = pp.solve_qp(qp, backend="proxsuite")
    assert sol.status is pp.Status.SOLVED and sol.solve_time > 0.0


def test_a_false_infeasibility_claim_on_an_unbounded_lp_is_not_kept():
    """ProxQP said PRIMAL_INFEASIBLE (no certificate) on a feasible, unbounded LP (x = (4, 0) is feasible);
    the second opinion says DUAL_INFEASIBLE, which did not refute the claim. Now a feasibility check by the
    independent backend does: the claim becomes NUMERICAL_ERROR, never PRIMAL_INFEASIBLE."""
    qp = pp.QP(P=np.zeros((2, 2)), q=[1.0, -2.0], C=[[-2.0, 0.0]], l=[-10.0], u=[-7.0], lb=[1.0, -1.0],
               ub=[4.0, np.inf])
    sol = pp.solve_qp(qp, backend="proxsuite")
    assert sol.status is not pp.Status.PRIMAL_INFEASIBLE
    assert sol.status in (pp.Status.DUAL_INFEASIBLE, pp.Status.NUMERICAL_ERROR)


def test_a_native_batch_retries_a_refuted_infeasibility_claim_as_solve_does():
    """An LP ProxQP calls infeasible at its default rho: solve() retried it (SOLVED), both native batch paths
    (only q varying, and per-element vectors) left it NUMERICAL_ERROR."""
    q = np.array([1.6443627009055837, -0.13137742257009144, -0.6083885777334679, -1.2718979918739488])
    C = np.array([[0.7415884212884828, 0.7239565416499906, 1.6187762233340763, -1.2055581426463289]])
    l = u = np.array([2.615449667089659])
    lb = np.array([0.46271579544048747, 1.2768403952034537, -0.06929442458292592, -1.1668209961560962])
    ub = np.array([1.5807307413728613, 2.0283293323300544, 0.3459683394301002, -1.036233342237963])
    qp = pp.QP(np.zeros((4, 4)), q, C, l, u, lb=lb, ub=ub)
    ref = pp.solve_qp(qp, backend="proxsuite")
    assert ref.status is pp.Status.SOLVED
    solver = pp.get_backend("proxsuite")
    for bs in (solver.solve_batch(qp, q=np.stack([q, q])), solver.solve_batch(qp, q=np.stack([q, q]),
                                                                              l=np.stack([l, l]))):
        assert [s.name for s in bs.status] == ["SOLVED", "SOLVED"]
        np.testing.assert_allclose(bs.x, np.stack([ref.x, ref.x]), atol=1e-6)


def test_the_retry_after_a_refuted_infeasibility_starts_cold():
    """Warm-started from an infeasible problem's answer (z = −51, z_box = 50), ProxQP claimed a trivial feasible QP
    infeasible; the claim was refuted but the retry reused the same start and failed too (NUMERICAL_ERROR). The
    retry starts cold now."""
    qp = pp.QP(P=np.eye(3), q=[1.0, -2.0, 3.0], C=[[1.0, 1.0, 1.0]], l=[1.0], u=[2.0], lb=[-1.0] * 3, ub=[1.0] * 3)
    bad = pp.QP(P=np.eye(3), q=[0.0, 0.0, 0.0], C=[[1.0, 1.0, 1.0]], l=[5.0], u=[6.0], lb=[-1.0] * 3, ub=[1.0] * 3)
    prev = pp.solve_qp(bad, backend="proxsuite")
    assert prev.status is pp.Status.PRIMAL_INFEASIBLE
    sol = pp.solve_qp(qp, backend="proxsuite", warm_start=prev)
    assert sol.status is pp.Status.SOLVED, sol.info
    np.testing.assert_allclose(sol.x, [1.0, 1.0, -1.0], atol=1e-6)
