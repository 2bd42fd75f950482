"""Problem generators and independent optimality checks shared by the core tests."""

from __future__ import annotations

import textwrap

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


# --------------------------------------------------------------------------- comparing inexact answers
def kkt_distance_bound(P, q, C, l, u, lb, ub, x, z, zb) -> float:
    """A bound on ‖x − x*‖₂ from the KKT residuals of ``(x, z, z_box)`` for a strongly convex QP.

    With ``μ = λ_min(P) > 0``, ``r_d = Px + q + Cᵀz + z_box``, ``r_p`` the largest violation and
    ``gap`` the duality gap, strong monotonicity of ∇f gives
    ``μ‖x − x*‖² <= gap + ‖r_d‖∞‖x*‖₁ + ‖(z*, z_box*)‖₁ r_p``; the unknown optimum's norms are taken
    as twice the approximate point's (first order in the residuals). An interior-point or ADMM
    answer at tolerance ε is this close to the optimum and no closer: two such answers may differ
    by the sum of their bounds (element 28 of an IPM batch stopped at gap 9.4e-9 and 1.1e-6 from
    the optimum, while a test compared two answers at 1e-8).
    """
    P, C = np.asarray(P, float), np.asarray(C, float).reshape(-1, np.size(x))
    mu = float(np.linalg.eigvalsh((P + P.T) / 2)[0])
    if mu <= 0:
        raise ValueError("kkt_distance_bound needs a positive definite P")
    cx = C @ x
    r_p = max(np.max(np.maximum(np.maximum(cx - u, l - cx), 0.0), initial=0.0),
              np.max(np.maximum(np.maximum(x - ub, lb - x), 0.0), initial=0.0))
    r_d = np.max(np.abs(P @ x + q + C.T @ z + zb), initial=0.0)
    fin = lambda v: np.where(np.isfinite(v), v, 0.0)  # noqa: E731
    gap = abs(x @ P @ x + q @ x + fin(u) @ np.maximum(z, 0) - fin(l) @ np.maximum(-z, 0)
              + fin(ub) @ np.maximum(zb, 0) - fin(lb) @ np.maximum(-zb, 0))
    rhs = gap + 2 * r_d * np.abs(x).sum() + 2 * (np.abs(z).sum() + np.abs(zb).sum()) * r_p
    return float(np.sqrt(max(rhs, 0.0) / mu)) + 1e-12 * (1.0 + float(np.abs(x).max(initial=0.0)))


def solution_distance_bound(qp: pp.QP, sol) -> float:
    """:func:`kkt_distance_bound` for a Solution of ``qp``."""
    d = qp.dense()
    return kkt_distance_bound(d.P, d.q, d.C, d.l, d.u, d.lb, d.ub, np.asarray(sol.x), np.asarray(sol.z),
                              np.asarray(sol.z_box))


def assert_active_sets_agree_up_to_weak_rows(P: pp.Polyhedron, Y: np.ndarray, results, tol: float = 1e-7) -> None:
    """Active sets of exact projections ``Y`` found by different backends (or code paths) may differ only on
    *weakly active* rows: slack ~ 0 and multiplier ~ 0 in every result, where identification is a choice."""
    Y = np.atleast_2d(Y)
    slack = P.ineq_slack(Y)
    acts = [np.atleast_2d(r.active) for r in results]
    lams = [np.atleast_2d(r.multipliers)[:, :P.n_ineq] for r in results]
    scale = 1.0 + np.abs(Y).max(axis=1, keepdims=True)
    differ = np.zeros_like(acts[0], dtype=bool)
    for a in acts[1:]:
        differ |= a != acts[0]
    weak = (np.abs(slack) <= tol * scale) & np.all([np.abs(lam) <= tol * scale for lam in lams], axis=0)
    bad = differ & ~weak
    assert not bad.any(), (f"active sets differ on rows that are not weakly active: {np.argwhere(bad)[:5]}, "
                           f"slack {slack[bad][:5]}, multipliers {[lam[bad][:5] for lam in lams]}")


FAKE_DIST = """
Metadata-Version: 2.1
Name: polyproj-fake-solver
Version: 0.0.1
"""


def installed_entry_point(tmp_path, monkeypatch, entry: str) -> None:
    """An installed distribution on ``tmp_path`` with the backend entry point ``entry`` ("name = module:Class").

    No name is warned about yet (the registry's record of hidden names is emptied for the test).
    """
    from polyproj import registry

    dist = tmp_path / "polyproj_fake_solver-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(textwrap.dedent(FAKE_DIST).lstrip())
    (dist / "entry_points.txt").write_text(f"[polyproj.backends]\n{entry}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_WARNED_HIDDEN", set())
