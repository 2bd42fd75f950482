"""The raw batched IPM's infeasibility certificate (2026-12-07 probe; failing before its fix)."""

from __future__ import annotations

import numpy as np
import pytest

from polyproj.solvers.ipm import solve_qp_batch


@pytest.mark.parametrize("scale", [1e7, 1e9])
def test_a_far_projection_onto_a_nonempty_polytope_is_never_called_infeasible(scale):
    """Projecting a point ~1e7 away onto a small polytope (a known point x0 inside it) ended PRIMAL_INFEASIBLE in
    5 iterations: the multiplier direction had negative parts on rows bounded above only (support +inf, no
    certificate) that the support function read as 0, so C^T dz ~ 0 with a "negative" support passed. The
    certificate now takes dz in the dual cone of the finite sides. Far projections may end unfinished (a known
    limit of the raw IPM: README), never infeasible."""
    rng = np.random.default_rng(3)
    n, m = 5, 8
    x0 = 0.2 * rng.standard_normal(n)
    A = rng.standard_normal((m, n))
    a = A @ x0 + 0.2
    C = np.vstack([A, np.ones((1, n))])
    lo, up = np.r_[np.full(m, -np.inf), x0.sum()], np.r_[a, x0.sum()]
    assert np.all(A @ x0 <= a) and abs(C[-1] @ x0 - up[-1]) <= 1e-15
    x = 3 * rng.standard_normal(n)
    res = solve_qp_batch(np.eye(n), -(scale * x)[None], C, lo, up)
    assert res.statuses()[0].name not in ("PRIMAL_INFEASIBLE", "DUAL_INFEASIBLE"), res.statuses()[0]


def test_an_empty_polytope_is_still_certified():
    """The same rows with the equation moved past what A y <= a allows: PRIMAL_INFEASIBLE, as before."""
    n = 3
    C = np.vstack([np.eye(n), np.ones((1, n))])
    lo, up = np.r_[np.full(n, -np.inf), 4.0], np.r_[np.ones(n), 4.0]  # y <= 1 each, yet Σy = 4
    res = solve_qp_batch(np.eye(n), np.zeros((1, n)), C, lo, up)
    assert res.statuses()[0].name == "PRIMAL_INFEASIBLE"


def test_float32_never_calls_an_empty_set_solved_inaccurate():
    """float32, an empty polytope (HiGHS: infeasible): the iteration ended unfinished with residuals 0.06 / 0.74 /
    59, within 1000 of the float32 floors (which grow with the diverging multipliers): SOLVED_INACCURATE. The
    floor now counts once in that test: MAX_ITER (or a certificate), never a usable status."""
    torch = pytest.importorskip("torch")
    from scipy.optimize import linprog

    rng = np.random.default_rng(0)
    n, m = 5, 8
    C = rng.standard_normal((m, n))
    u = C @ rng.standard_normal(n) + 0.5
    lo = np.full(m, -np.inf)
    X = 2 * rng.standard_normal((6, n))
    lb, ub = -np.ones(n), np.ones(n)
    assert linprog(np.zeros(n), A_ub=C, b_ub=u, bounds=list(zip(lb, ub, strict=True))).status == 2  # infeasible
    for dt in (torch.float64, torch.float32):
        def t(v, dt=dt):
            return torch.tensor(v, dtype=dt)

        res = solve_qp_batch(t(np.eye(n)), -t(X), t(C), t(lo), t(u), t(lb), t(ub))
        names = {s.name for s in res.statuses()}
        assert not names & {"SOLVED", "SOLVED_INACCURATE"}, (dt, names)


@pytest.mark.parametrize("c", [1e8, 1e12])
@pytest.mark.parametrize("space", ["numpy", "torch"])
def test_a_far_projection_meets_tolerances_at_the_rounding_of_its_terms(c, space):
    """0 projected onto x₁ + x₂ >= c: with eps_abs 1e-8 and eps_rel 0 (the defaults) the duality gap, a sum of
    terms ~c²/2 that cancel, never met 1e-8 (it rounds to ~1 at c = 1e8) and the iteration ran on to NaN
    (NUMERICAL_ERROR). No float64 tolerance is below the rounding of its residual's largest term now: SOLVED,
    x = (c/2, c/2) to rounding."""
    P, q, C = np.eye(2), np.zeros((1, 2)), np.ones((1, 2))
    lo, up = np.array([c]), np.array([np.inf])
    if space == "torch":
        torch = pytest.importorskip("torch")
        P, q, C, lo, up = (torch.tensor(v, dtype=torch.float64) for v in (P, q, C, lo, up))
    res = solve_qp_batch(P, q, C, lo, up)
    assert res.statuses()[0].name == "SOLVED"
    np.testing.assert_allclose(np.asarray(res.x)[0], [c / 2, c / 2], rtol=1e-12)
