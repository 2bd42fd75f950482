"""From a probe of the ADMM and the IPM: a singular P in the ADMM, far projections in the IPM, the ADMM's
per-element iterations, a name in docs/ipm.md."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import polyproj as pp


def _rank2_qp(V: np.ndarray, xbar: np.ndarray) -> tuple[pp.QP, float]:
    """min ½xᵀPx − x̄ᵀPx s.t. x₁ <= 1, P = VVᵀ of rank 2 in R⁴, and its optimal value.

    P's null space holds a direction with a first entry (checked), so x̄ moved along it is feasible and the
    optimum is the unconstrained one, −½ x̄ᵀPx̄, whatever x̄₁.
    """
    P = V @ V.T
    P = (P + P.T) / 2
    null = np.linalg.svd(V @ V.T)[2][2:]
    assert np.abs(null[:, 0]).max() > 0.05
    return pp.QP(P=P, q=-P @ xbar, C=[[1.0, 0, 0, 0]], l=[-np.inf], u=[1.0]), -0.5 * xbar @ P @ xbar


def test_admm_solves_a_qp_whose_p_is_singular_but_passes_a_cholesky_factorisation():
    """A rank-2 P whose Cholesky factorisation succeeds by rounding was taken as definite (σ = 0): K = P + CᵀρC
    singular, SolverError (LinAlgError) or MAX_ITER; with σ > 0 the explicit K⁻¹ stalled the dual residual at
    ~1e-8 (MAX_ITER). Now SOLVED at the optimal value, on the probe's P and on random ones."""
    V = np.array([[-0.7960867750951038, -0.48721815642469163], [-0.9750001191003014, -0.6204291445949027],
                  [-1.0047872189929943, 0.36746620574561295], [0.7948910679832192, -0.48044593951821124]])
    xbar = np.array([-0.2072657954706782, -0.5810325725119153, 0.5312512156361892, 0.08905603873921995])
    rng = np.random.default_rng(0)
    drawn = [(rng.standard_normal((4, 2)), rng.standard_normal(4)) for _ in range(200)]
    # the probe's draws: 4 MAX_ITER and 1 LinAlgError in the first 40 before; 150, 156, 159 MAX_ITER at σ > 0
    cases = [(V, xbar), *drawn[:40], *drawn[150:160]]
    np.linalg.cholesky(cases[0][0] @ cases[0][0].T)  # succeeds: the trap
    for V, xbar in cases:
        qp, best = _rank2_qp(V, xbar)
        sol = pp.solve_qp(qp, backend="admm")
        assert sol.status is pp.Status.SOLVED
        value = 0.5 * sol.x @ qp.P @ sol.x + qp.q @ sol.x
        assert abs(value - best) <= 1e-8 * (1.0 + abs(best))
        assert sol.primal_residual() <= 1e-8 and sol.dual_residual() <= 1e-8


def test_admm_with_sigma_reaches_dual_residuals_at_rounding():
    """σ > 0 (P of rank 3 in R⁶): the x-update x̃ = K⁻¹(σx − q + ...) rounded K⁻¹'s entries ~1/σ into P's range,
    and the dual residual stalled at 3e-10 to 9e-9 (MAX_ITER at eps_abs 1e-12); as an increment of x it goes
    to rounding. Residuals computed here from x and w."""
    from polyproj.solvers import admm

    rng = np.random.default_rng(1)
    for _ in range(10):
        V = rng.standard_normal((6, 3))
        P, q, C = V @ V.T, -V @ (V.T @ rng.standard_normal(6)), rng.standard_normal((2, 6))
        S = admm.setup(P, C, np.full((2, 1), -np.inf), np.ones((2, 1)), 0)
        assert S.sigma > 0
        res = admm.solve(S, q[None, :], admm.Stop("residuals", 1e-12, 0.0, 4000, 25))
        x, w = res.x[0], res.w[0]
        assert res.code.tolist() == [admm.SOLVED]
        assert np.abs(P @ x + q + C.T @ w).max() <= 1e-11
        assert np.max(C @ x - 1.0) <= 1e-11


def test_admm_singular_k_is_a_status_not_an_exception():
    """K = P + σI singular (P = −σ = −1e-6, no row): NUMERICAL_ERROR with NaN x (np.linalg.inv raised)."""
    from polyproj.solvers import admm

    S = admm.setup(np.array([[-1e-6]]), np.zeros((0, 1)), np.zeros((0, 2)), np.zeros((0, 2)), 0)
    res = admm.solve(S, np.array([[1.0], [2.0]]), admm.Stop())
    assert res.code.tolist() == [admm.NUMERICAL_ERROR] * 2
    assert np.isnan(res.x).all()


def test_admm_batch_reports_each_elements_iterations():
    """solve_batch reported the batch's count (50, 50) for every element; each element's is that of its solve
    alone (25, 50)."""
    qp = pp.QP(P=np.eye(2), q=[0.0, 0.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    Q = np.array([[-1.0, -1.0], [-1e3, 5e2]])
    batch = pp.get_backend("admm").solve_batch(qp, q=Q)
    alone = [pp.solve_qp(qp.with_vectors(q=q), backend="admm") for q in Q]
    assert [s.status for s in alone] == [pp.Status.SOLVED] * 2 and batch.status == (pp.Status.SOLVED,) * 2
    assert list(batch.iterations) == [s.iterations for s in alone]
    assert alone[0].iterations < alone[1].iterations
    for i, s in enumerate(alone):
        np.testing.assert_allclose(batch.x[i], s.x, atol=1e-8)


def test_docs_ipm_names_existing_ipmsolver_attributes():
    """docs/ipm.md named IPMSolver.projection_stop_rel, which does not exist (rough_eps_rel does)."""
    from polyproj.backends.ipm import IPMSolver

    text = (Path(__file__).resolve().parents[1] / "docs" / "ipm.md").read_text(encoding="utf-8")
    names = set(re.findall(r"IPMSolver\.(\w+)", text))
    assert "rough_eps_rel" in names
    assert all(hasattr(IPMSolver, n) for n in names), sorted(n for n in names if not hasattr(IPMSolver, n))
