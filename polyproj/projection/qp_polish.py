"""The exact active-set polish of a convex QP, by the projection polish in the metric of P.

With ``P = L Lᵀ`` and ``v = Lᵀx`` the QP ``min ½xᵀPx + qᵀx  s.t. C_eq x = u_eq, C_in x <= u_in`` is the projection
of ``−L⁻¹q`` onto ``{v : C_in L⁻ᵀ v <= u_in, C_eq L⁻ᵀ v = u_eq}``, whose KKT multipliers are the QP's; the polish of
:mod:`polyproj.projection.polish` (candidates from a start, exact face solves, KKT verified, active-set changes)
then serves QPs as it serves projections. Used by the DIF engine's QPs (:mod:`polyproj.adapters.dif.qp`); the
backends, below this package in the dependency order, have their own end game (:mod:`polyproj.backends.active_polish`).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

__all__ = ["metric_factor", "polish_qp"]


def metric_factor(P: np.ndarray) -> np.ndarray | None:
    """Lower Cholesky factor of ``P`` (of ``P + δI``, ``δ = 1e-12 max(1, max|P|)``, when P is singular).

    None when P is indefinite: the QP is not convex and there is nothing to polish. (With P singular the
    polish solves the QP of P + δI: an unbounded QP's answer grows like 1/δ, and a bounded one's far along
    null(P) leaves the same residual δx, so the residual cannot tell them apart: the backend's certificate
    of unboundedness is what refuses the former: the DIF engine's ``_NO_SOLUTION``.)
    """
    for shift in (0.0, 1e-12 * max(1.0, float(np.max(np.abs(P), initial=0.0)))):
        try:
            return np.linalg.cholesky(P + shift * np.eye(P.shape[0]))
        except np.linalg.LinAlgError:
            continue
    return None


def polish_qp(P, q, C, u, eq, x, z, max_rounds: int = 50) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(x, z, active)`` of the QP, polished as a projection in the metric of P (module docstring).

    The QP: ``min ½xᵀPx + qᵀx  s.t. C_eq x = u_eq, C_in x <= u_in``, multipliers with ``Px + q + Cᵀz = 0``.
    Started from the backend's ``(x, z)``; None when the polish cannot verify the KKT conditions (or P is not
    positive semidefinite).
    """
    from ..polydata import PolyData
    from .polish import polish

    L = metric_factor(P)
    if L is None:
        return None
    n, m = P.shape[0], C.shape[0]
    Linv_t = scipy.linalg.solve_triangular(L, np.eye(n), lower=True).T  # L⁻ᵀ
    ineq = np.flatnonzero(~eq)
    data = PolyData(C[ineq] @ Linv_t, u[ineq], C[eq] @ Linv_t, u[eq], np.full(n, -np.inf), np.full(n, np.inf))
    X = -scipy.linalg.solve_triangular(L, q, lower=True)[None, :]
    Y0 = (L.T @ x)[None, :]
    mult0 = np.concatenate([np.maximum(z[ineq], 0.0), np.zeros(2 * n)])[None, :]
    out = polish(X, data, Y0, mult0, cand_tol=1e-6, dist_tol=1e-6, tol=1e-11, max_iter=max_rounds)
    if not bool(out.accepted[0]):
        return None
    zf = np.zeros(m)
    zf[ineq] = out.mult[0, : ineq.size]
    zf[eq] = out.mu[0]
    act = eq.copy()
    act[ineq] = out.active[0, : ineq.size]
    return Linv_t @ out.Y[0], zf, act
