"""Problem generators and independent optimality checks shared by the core tests."""

from __future__ import annotations

import numpy as np

import polyproj as pp


def random_polytope(rng, n, m, p, bounds=True, scale=1.0):
    """Random polytope with a strictly feasible point x0 (so it is never empty)."""
    x0 = rng.normal(size=n)
    A = rng.normal(size=(m, n)) * scale
    a = A @ x0 + rng.uniform(0.05, 1.0, size=m)
    B = rng.normal(size=(p, n)) if p else None
    b = B @ x0 if p else None
    lb = x0 - rng.uniform(0.5, 2.0, size=n) if bounds else None
    ub = x0 + rng.uniform(0.5, 2.0, size=n) if bounds else None
    return pp.Polyhedron(A=A, a=a, B=B, b=b, lb=lb, ub=ub)


def kkt_residuals(P: pp.Polyhedron, x: np.ndarray, y: np.ndarray, mult: np.ndarray) -> dict[str, float]:
    """KKT residuals of the projection of x, computed from scratch with dense algebra.

    Stationarity y − x + Aᵀλ_A − λ_lb + λ_ub + Bᵀμ = 0, λ >= 0, complementarity λ·slack = 0,
    feasibility. ``mult`` is laid out as ProjectionResult.multipliers.
    """
    m, nl, nu = P.m_ineq, P.lb_idx.size, P.ub_idx.size
    lamA, lam_lb, lam_ub = mult[:m], mult[m:m + nl], mult[m + nl:m + nl + nu]
    mu = mult[m + nl + nu:]
    grad = y - x
    if m:
        grad = grad + P.A_dense.T @ lamA
    if P.m_eq:
        grad = grad + P.B_dense.T @ mu
    g_lb = np.zeros(P.n)
    g_lb[P.lb_idx] = lam_lb
    g_ub = np.zeros(P.n)
    g_ub[P.ub_idx] = lam_ub
    grad = grad - g_lb + g_ub
    slack = np.concatenate([P.a - P.A_dense @ y if m else np.zeros(0), y[P.lb_idx] - P.lb[P.lb_idx],
                            P.ub[P.ub_idx] - y[P.ub_idx]])
    lam = mult[:m + nl + nu]
    return {
        "stationarity": float(np.max(np.abs(grad))),
        "dual_feasibility": float(max(0.0, -np.min(lam, initial=0.0))),
        "complementarity": float(np.max(np.abs(lam * slack), initial=0.0)),
        "primal": float(P.violation(y)),
    }
