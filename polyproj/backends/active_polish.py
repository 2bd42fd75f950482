"""An interior-point method's end game: the QP on the active set its multipliers name, solved exactly.

Near the end of an interior-point run the rows are weighted by ``D = z/s``, which spans 20-30 orders of
magnitude; the normal equations then lose the stationarity residual to rounding (about
``eps · max D · |G|² · |dx|``) and the iteration can stall a little above a tight tolerance (random QPs at
n 400: dual residual 3.6e-8 against eps_abs 1e-8 for 90 iterations, then SOLVED_INACCURATE at the
100-iteration cap). At such an iterate the active set is plain: a side is active where its multiplier
outweighs its slack (``|z_i| > s_i``, i.e. ``D_i > 1``). With those sides ``W`` as equalities the KKT system

    [P    A_Wᵀ] [x]   [−q ]
    [A_W   0  ] [ν] = [c_W]

(``A_W`` the active rows of C and unit rows of the active bounds, ``c_W`` their sides' values) gives the
solution exactly when ``W`` is right: ``z = ν`` on W (positive: upper side, negative: lower side), 0 elsewhere.
The polished point is taken only when it is a KKT point to the solver's own tolerances — every constraint
within the primal tolerance, every multiplier of the sign of its side, the stationarity residual and the
duality gap within theirs (the tests of :mod:`polyproj.solvers.ipm.termination`). A side of the wrong sign is
dropped from W and a violated one added, for a few rounds; otherwise the solver's answer stands.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from ..problem import QP

__all__ = ["MAX_SIZE", "REFINE", "ROUNDS", "polish_active"]

#: largest KKT system (n + active sides) polished: a dense symmetric solve, O((n + k)³)
MAX_SIZE = 2000
#: rounds of corrections to the active set (drop a side of the wrong sign, add a violated one)
ROUNDS = 3
#: iterative refinement steps of the KKT solve
REFINE = 2
#: no tolerance is below this many roundings of its residual's largest term (the termination's rule)
ROUNDINGS = 16.0


def _dense(M):
    return M.toarray() if sp.issparse(M) else np.asarray(M, dtype=np.float64)


def _sides(qp: QP, x: np.ndarray, z: np.ndarray, z_box: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(upper, lower)`` bool (m + n,): the sides the multipliers name active (rows of C, then bounds)."""
    C = _dense(qp.C)
    gx = np.concatenate([C @ x if qp.m else np.zeros(0), x])
    lo, up = np.concatenate([qp.l, qp.lb]), np.concatenate([qp.u, qp.ub])
    zz = np.concatenate([z, z_box])
    eq = lo == up
    upper = (zz > 0) & np.isfinite(up) & (zz > up - gx)
    lower = (zz < 0) & np.isfinite(lo) & (-zz > gx - lo)
    upper |= eq & np.isfinite(up)  # an equality row is always active (its multiplier is free)
    return upper, lower & ~upper


def _kkt_solve(P: np.ndarray, q: np.ndarray, A: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(x, ν)`` of the equality-constrained QP; None when its KKT matrix is singular to working precision.

    LU with partial pivoting, then :data:`REFINE` steps of iterative refinement on the residual ``rhs − K s``:
    the Maros–Meszaros KKT matrices are ill-conditioned, and one solve left stationarity and duality-gap
    residuals far above what the iterate's own last steps reached.
    """
    n, k = P.shape[0], A.shape[0]
    K = np.zeros((n + k, n + k))
    K[:n, :n], K[:n, n:], K[n:, :n] = P, A.T, A
    rhs = np.concatenate([-q, c])
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)  # ill-conditioned: the KKT tests decide
            lu = scipy.linalg.lu_factor(K, check_finite=False)
            sol = scipy.linalg.lu_solve(lu, rhs, check_finite=False)
            for _ in range(REFINE):
                sol = sol + scipy.linalg.lu_solve(lu, rhs - K @ sol, check_finite=False)
    except (np.linalg.LinAlgError, ValueError):
        return None
    if not np.all(np.isfinite(sol)):
        return None
    return sol[:n], sol[n:]


def _kkt_ok(qp: QP, P: np.ndarray, C: np.ndarray, x, z, zb, eps_abs: float, eps_rel: float) -> bool:
    """Primal feasibility, stationarity, the duality gap and the multipliers' signs within the tolerances."""
    eps = ROUNDINGS * float(np.finfo(np.float64).eps)
    cx = C @ x if qp.m else np.zeros(0)
    gx, lo, up = np.concatenate([cx, x]), np.concatenate([qp.l, qp.lb]), np.concatenate([qp.u, qp.ub])
    zz = np.concatenate([z, zb])
    with np.errstate(invalid="ignore"):
        pres = float(np.max(np.maximum(np.maximum(gx - up, lo - gx), 0.0), initial=0.0))
    size_p = float(np.max(np.abs(gx), initial=0.0))
    px, ctz = P @ x, (C.T @ z if qp.m else np.zeros_like(x))
    dres = float(np.max(np.abs(px + qp.q + ctz + zb), initial=0.0))
    size_d = max(float(np.max(np.abs(v), initial=0.0)) for v in (px, qp.q, ctz, zb))
    # a multiplier on a side that is infinite (or of the wrong sign for its side) is no KKT point
    if np.any((zz > 0) & ~np.isfinite(up)) or np.any((zz < 0) & ~np.isfinite(lo)):
        return False
    supp = float(np.sum(np.where(zz > 0, np.where(np.isfinite(up), up, 0.0) * zz, 0.0))
                 + np.sum(np.where(zz < 0, np.where(np.isfinite(lo), lo, 0.0) * zz, 0.0)))
    xpx, qx = float(x @ px), float(qp.q @ x)
    gap = abs(xpx + qx + supp)
    size_g = max(abs(xpx), abs(qx), abs(supp))
    return all(r <= max(eps_abs + eps_rel * s, eps * s) for r, s in ((pres, size_p), (dres, size_d), (gap, size_g)))


def polish_active(qp: QP, x: np.ndarray, z: np.ndarray, z_box: np.ndarray, eps_abs: float,
                  eps_rel: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The exact KKT point on the active set that ``(x, z, z_box)`` names, or None (module docstring).

    Returns ``(x, z, z_box)`` in polyproj's sign convention (``P x + q + Cᵀz + z_box = 0``) when the polished
    point passes the KKT tests at ``eps_abs`` / ``eps_rel``; None when it does not, when the iterate is not
    finite, or when the system is larger than :data:`MAX_SIZE`.
    """
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(z)) and np.all(np.isfinite(z_box))):
        return None
    m, n = qp.m, qp.n
    upper, lower = _sides(qp, x, z, z_box)
    if n + int(np.sum(upper | lower)) > MAX_SIZE:
        return None
    P, C = _dense(qp.P), _dense(qp.C)
    G = np.vstack([C, np.eye(n)]) if m else np.eye(n)
    lo, up = np.concatenate([qp.l, qp.lb]), np.concatenate([qp.u, qp.ub])
    for _ in range(ROUNDS):
        W = np.flatnonzero(upper | lower)
        if n + W.size > MAX_SIZE:
            return None
        got = _kkt_solve(P, qp.q, G[W], np.where(upper[W], up[W], lo[W]))
        if got is None:
            return None
        xp_, nu = got
        zz = np.zeros(m + n)
        zz[W] = nu
        zp, zbp = zz[:m], zz[m:]
        if _kkt_ok(qp, P, C, xp_, zp, zbp, eps_abs, eps_rel):
            return xp_, zp, zbp
        # one correction of the set: sides whose multiplier has the other sign leave, violated sides join
        gx = G @ xp_
        eq = lo == up
        wrong = (upper & ~eq & (zz < 0)) | (lower & (zz > 0))
        scale = 1.0 + np.abs(gx)
        over, under = gx - up > 1e-12 * scale, lo - gx > 1e-12 * scale
        if not (wrong.any() or ((over & ~upper) | (under & ~lower)).any()):
            return None
        upper, lower = (upper & ~wrong) | over, (lower & ~wrong) | (under & ~over)
    return None
