"""An interior-point method's end game: its answer polished on the active set its multipliers name.

Near the end of an interior-point run the rows are weighted by ``D = z/s``, which spans 20-30 orders of
magnitude; the normal equations then lose the stationarity residual to rounding (about
``eps · max D · |G|² · |dx|``) and the iteration can stall a little above a tight tolerance (random QPs at
n 400: dual residual 3.6e-8 against eps_abs 1e-8 for 90 iterations, then SOLVED_INACCURATE at the
100-iteration cap). At such an iterate the active set is plain, and the exact active-set polish of QPs
(:func:`polyproj.projection.qp_polish.polish_qp`: the projection polish in the metric of P, started from the
iterate's candidates, exact face solves, KKT verified) finds the solution. The polished point is taken only
when it also passes the solver's own tests at its tolerances — every side within the primal tolerance,
multipliers of their side's sign, stationarity and duality gap within theirs, measured by
:class:`~polyproj.solution.Solution`'s residual methods; otherwise the solver's answer stands.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..problem import QP
from ..solution import Solution, Status

__all__ = ["MAX_SIZE", "polish_active"]

#: largest n polished (and stopped by the ``ipm`` backend's stall rule): dense factorisations of P and of a face
#: per active-set round, O(n³) each; at n 1,000 up to 50 rounds took seconds (Maros–Meszaros CVXQP3_M ran past its
#: time limit), at n 400 the polish takes ~0.05 s
MAX_SIZE = 500
#: no tolerance is below this many roundings of its residual's largest term (the IPM termination's rule)
ROUNDINGS = 16.0


def _one_sided(qp: QP) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(G, u, eq, row, sign)``: the finite sides of ``l <= Cx <= u, lb <= x <= ub`` as rows ``G x <= u``.

    Equalities once (``eq``); ``row`` the index of each side in ``[C; I]``, ``sign`` +1 upper, −1 lower.
    """
    C = qp.C.toarray() if sp.issparse(qp.C) else np.asarray(qp.C, dtype=np.float64)
    M = np.vstack([C, np.eye(qp.n)]) if qp.m else np.eye(qp.n)
    lo, up = np.concatenate([qp.l, qp.lb]), np.concatenate([qp.u, qp.ub])
    eq = lo == up
    upper = np.flatnonzero(np.isfinite(up))
    lower = np.flatnonzero(np.isfinite(lo) & ~eq)
    row = np.concatenate([upper, lower])
    sign = np.concatenate([np.ones(upper.size), -np.ones(lower.size)])
    return M[row] * sign[:, None], np.where(sign > 0, up[row], -lo[row]), eq[row], row, sign


def _within(sol: Solution, eps_abs: float, eps_rel: float) -> bool:
    """The IPM termination's acceptance: each residual within ``eps_abs + eps_rel·size``, or its rounding floor."""
    qp, x, z, zb = sol.qp, sol.x, sol.z, sol.z_box
    rounding = ROUNDINGS * float(np.finfo(np.float64).eps)
    cx = np.asarray(qp.C @ x).reshape(-1) if qp.m else np.zeros(0)
    px = np.asarray(qp.P @ x).reshape(-1)
    ctz = np.asarray(qp.C.T @ z).reshape(-1) if qp.m else np.zeros_like(x)
    zz = np.concatenate([z, zb])
    sides = np.where(zz > 0, np.concatenate([qp.u, qp.ub]), np.concatenate([qp.l, qp.lb]))
    size_p = max(float(np.max(np.abs(cx), initial=0.0)), float(np.max(np.abs(x), initial=0.0)))
    size_d = max(float(np.max(np.abs(v), initial=0.0)) for v in (px, qp.q, ctz, zb))
    with np.errstate(invalid="ignore"):
        supp = float(np.sum(np.where(zz != 0, sides * zz, 0.0)))
    if not np.isfinite(supp):  # a multiplier on an infinite side: no KKT point
        return False
    size_g = max(abs(float(x @ px)), abs(float(qp.q @ x)), abs(supp))
    checks = ((sol.primal_residual(), size_p), (sol.dual_residual(), size_d), (sol.duality_gap(), size_g))
    return all(np.isfinite(r) and r <= max(eps_abs + eps_rel * s, rounding * s) for r, s in checks)


def polish_active(qp: QP, x: np.ndarray, z: np.ndarray, z_box: np.ndarray, eps_abs: float,
                  eps_rel: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The exact KKT point of the active set that ``(x, z, z_box)`` names, or None (module docstring).

    Returns ``(x, z, z_box)`` in polyproj's sign convention (``P x + q + Cᵀz + z_box = 0``) when the polished point
    passes the tests at ``eps_abs`` / ``eps_rel``; None when it does not, when the iterate is not finite, when P is
    not positive semidefinite, or when n is above :data:`MAX_SIZE`.
    """
    from ..projection.qp_polish import polish_qp

    if qp.n > MAX_SIZE or not (np.all(np.isfinite(x)) and np.all(np.isfinite(z)) and np.all(np.isfinite(z_box))):
        return None
    P = qp.P.toarray() if sp.issparse(qp.P) else np.asarray(qp.P, dtype=np.float64)
    G, u, eq, row, sign = _one_sided(qp)
    zz = np.concatenate([z, z_box])[row] * sign  # the one-sided rows' multipliers: >= 0 where their side binds
    got = polish_qp(P, qp.q, G, u, eq, x, zz)
    if got is None:
        return None
    xp_, zp, _ = got
    full = np.zeros(qp.m + qp.n)
    np.add.at(full, row, zp * sign)
    z_new, zb_new = full[: qp.m], full[qp.m:]
    if not _within(Solution(x=xp_, z=z_new, z_box=zb_new, status=Status.SOLVED, qp=qp), eps_abs, eps_rel):
        return None
    return xp_, z_new, zb_new
