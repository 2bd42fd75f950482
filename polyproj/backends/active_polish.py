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
The polished point is taken only when it passes the solver's own tests at its tolerances — every side within
the primal tolerance, multipliers of their side's sign, stationarity and duality gap within theirs, measured by
:class:`~polyproj.solution.Solution`'s residual methods. A side of the wrong sign is dropped from W and a
violated one added, for a few rounds; otherwise the solver's answer stands.

This module is self-contained (NumPy, SciPy): backends sit below :mod:`polyproj.projection` in the dependency
order (DESIGN §1), so the projection polish of QPs (:mod:`polyproj.projection.qp_polish`, which the DIF engine
uses) is not called from here.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.linalg

from ..problem import QP
from ..solution import Solution, Status
from ..solvers.ipm.termination import ROUNDINGS  # no tolerance below this many roundings: the IPM's own rule
from .warm import kkt_sizes

__all__ = ["MAX_SIZE", "REFINE", "ROUNDS", "polish_active"]

#: largest n polished (and stopped by the ``ipm`` backend's stall rule): a dense LU of the KKT system, O((n + k)³)
#: per round; the stall rule without a polish only adds iterations before the same re-solve
MAX_SIZE = 500
#: rounds of corrections to the active set (drop a side of the wrong sign, add a violated one)
ROUNDS = 3
#: iterative refinement steps of the KKT solve
REFINE = 2


def _sides(G: np.ndarray, lo: np.ndarray, up: np.ndarray, x: np.ndarray, zz: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(upper, lower)`` bool (m + n,): the sides of the rows ``G = [C; I]`` that the multipliers ``zz`` name."""
    gx = G @ x
    upper = (zz > 0) & np.isfinite(up) & (zz > up - gx)
    lower = (zz < 0) & np.isfinite(lo) & (-zz > gx - lo)
    upper |= (lo == up) & np.isfinite(up)  # an equality row is always active (its multiplier is free)
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


def _within(sol: Solution, eps_abs: float, eps_rel: float) -> bool:
    """The IPM termination's acceptance: each residual within ``eps_abs + eps_rel·size``, or its rounding floor."""
    qp, x = sol.qp, sol.x
    size_p, size_d = kkt_sizes(sol)  # the largest primal and stationarity terms (finite: the caller's point is)
    zz = np.concatenate([sol.z, sol.z_box])
    sides = np.where(zz > 0, np.concatenate([qp.u, qp.ub]), np.concatenate([qp.l, qp.lb]))
    with np.errstate(invalid="ignore"):
        supp = float(np.sum(np.where(zz != 0, sides * zz, 0.0)))
    if not np.isfinite(supp):  # a multiplier on an infinite side: no KKT point
        return False
    px = np.asarray(qp.P @ x).reshape(-1)
    size_g = max(abs(float(x @ px)), abs(float(qp.q @ x)), abs(supp))
    rounding = ROUNDINGS * float(np.finfo(np.float64).eps)
    checks = ((sol.primal_residual(), size_p), (sol.dual_residual(), size_d), (sol.duality_gap(), size_g))
    return all(np.isfinite(r) and r <= max(eps_abs + eps_rel * s, rounding * s) for r, s in checks)


def polish_active(qp: QP, x: np.ndarray, z: np.ndarray, z_box: np.ndarray, eps_abs: float,
                  eps_rel: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The exact KKT point on the active set that ``(x, z, z_box)`` names, or None (module docstring).

    Returns ``(x, z, z_box)`` in polyproj's sign convention (``P x + q + Cᵀz + z_box = 0``) when the polished
    point passes the tests at ``eps_abs`` / ``eps_rel``; None when it does not, when the iterate is not finite, or
    when n is above :data:`MAX_SIZE`.
    """
    if qp.n > MAX_SIZE or not (np.all(np.isfinite(x)) and np.all(np.isfinite(z)) and np.all(np.isfinite(z_box))):
        return None
    m, n = qp.m, qp.n
    dense = qp.dense()
    P = dense.P
    G = np.vstack([dense.C, np.eye(n)]) if m else np.eye(n)
    lo, up = np.concatenate([qp.l, qp.lb]), np.concatenate([qp.u, qp.ub])
    upper, lower = _sides(G, lo, up, x, np.concatenate([z, z_box]))
    for _ in range(ROUNDS):
        W = np.flatnonzero(upper | lower)
        if W.size > MAX_SIZE:
            return None
        got = _kkt_solve(P, qp.q, G[W], np.where(upper[W], up[W], lo[W]))
        if got is None:
            return None
        xp_, nu = got
        zz = np.zeros(m + n)
        zz[W] = nu
        eq = lo == up
        wrong = (upper & ~eq & (zz < 0)) | (lower & (zz > 0))
        if not wrong.any() and _within(Solution(x=xp_, z=zz[:m], z_box=zz[m:], status=Status.SOLVED, qp=qp),
                                       eps_abs, eps_rel):
            return xp_, zz[:m], zz[m:]
        # one correction of the set: sides whose multiplier has the other sign leave, violated sides join
        gx = G @ xp_
        scale = 1.0 + np.abs(gx)
        over, under = gx - up > 1e-12 * scale, lo - gx > 1e-12 * scale
        if not (wrong.any() or ((over & ~upper) | (under & ~lower)).any()):
            return None
        upper, lower = (upper & ~wrong) | over, (lower & ~wrong) | (under & ~over)
    return None
