"""A point of a QP's constraints by one LP: how the guard checks a backend's claim of primal infeasibility.

A backend's PRIMAL_INFEASIBLE is its own verdict: some return a certificate the backend glue checks (OSQP,
ProxSuite), others a bare flag (DAQP said so on a feasible 4-variable QP with one row of norm 3e-5; PIQP on a
random feasible QP; DAQP on ``P = 1e-50 I`` in a box). The LP

    t* = min t   s.t.   (C_i x − u_i) / ||C_i|| <= t,   (l_i − C_i x) / ||C_i|| <= t,   lb − t <= x <= ub + t,   t >= −1

finds a point of least uniform violation of the rows (in their own distances; t < 0: strictly inside, by a
margin up to 1, where the set has an interior), by HiGHS' simplex (SciPy's ``linprog``), independent of every
backend's QP method. The claim is refuted only by a point strictly inside every row by more than the LP's
tolerances (``t* < −``:data:`MARGIN`; equality rows and fixed variables are held exactly, the interior is the one
relative to them), checked in float64 on the constraints as given (:func:`refutes`): a set without an interior
relative to its equalities keeps every claim, and so does an empty one whose rows an LP point misses
by less than a loose tolerance would allow (a gap of 0.02 at |x| 1e9 had been "refuted" at 1e-10 of the rows'
terms). An LP that fails or runs past :data:`LP_TIME_LIMIT` leaves the claim.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from ..problem import QP

__all__ = ["EMPTY_GAP", "LP_TIME_LIMIT", "MARGIN", "ROUNDING", "certainly_empty", "interior_point", "least_violation",
           "refutes"]

#: seconds the LP may take; past it, the claim stands
LP_TIME_LIMIT = 10.0
#: the LP's primal and dual feasibility tolerances
LP_TOL = 1e-10
#: the margin inside every row (in the rows' distances) an LP point must have to refute a claim: beyond LP_TOL
MARGIN = 1e-8
#: and the point must meet every constraint as given to this times the size of its terms (``|rhs| + ||row||₁ |x|``)
ROUNDING = 64 * float(np.finfo(np.float64).eps)
#: the same for an equality row, which the LP meets to its factorisation's accuracy, not with a margin
EQ_ROUNDING = 1e-9


def interior_point(qp: QP) -> np.ndarray | None:
    """The LP's point (module docstring) where it lies inside every row by more than :data:`MARGIN`, else None."""
    x, t, unconstrained = least_violation(qp)
    return x if x is not None and (t < -MARGIN or unconstrained) else None


def _row_norms(qp: QP) -> tuple[Any, np.ndarray]:
    """C as CSR and the 2-norms of its rows."""
    C = sp.csr_matrix(qp.C) if qp.m else sp.csr_matrix((0, qp.n))
    return C, (np.sqrt(np.asarray(C.multiply(C).sum(axis=1)).reshape(-1)) if qp.m else np.zeros(0))


def least_violation(qp: QP) -> tuple[np.ndarray | None, float, bool]:
    """``(x, t*, unconstrained)`` of the LP (module docstring), solved once per QP (kept in ``qp.memo``).

    ``unconstrained``: no inequality row or free bound (``t`` is then meaningless, ``x`` any point of the
    equalities and fixed variables). ``(None, inf, False)`` where HiGHS finds the LP infeasible, ``(None, 0.0,
    True)`` where it does not solve it.
    """
    hit = qp.memo.get("least_violation")
    if hit is None:
        hit = qp.memo["least_violation"] = _least_violation(qp)
    return hit


def _least_violation(qp: QP) -> tuple[np.ndarray | None, float, bool]:
    from scipy.optimize import linprog

    n = qp.n
    C, norms = _row_norms(qp)
    # equality rows and fixed variables hold exactly (the margin is the interior relative to them); a zero row is
    # judged by its own sides (refutes), the LP cannot move it
    eq = (qp.l == qp.u) & (norms > 0)
    keep = (norms > 0) & ~eq
    fixed = qp.lb == qp.ub
    Cn = sp.diags(1.0 / norms[keep]) @ C[keep]
    blocks, rhs = [], []
    for side, sign in ((qp.u[keep], 1.0), (qp.l[keep], -1.0)):
        fin = np.isfinite(side)
        if fin.any():
            blocks.append(sign * Cn[np.flatnonzero(fin)])
            rhs.append(sign * side[fin] / norms[keep][fin])
    for bound, sign in ((qp.ub, 1.0), (qp.lb, -1.0)):
        fin = np.flatnonzero(np.isfinite(bound) & ~fixed)
        if fin.size:
            blocks.append(sp.csr_matrix((np.full(fin.size, sign), (np.arange(fin.size), fin)), shape=(fin.size, n)))
            rhs.append(sign * bound[fin])
    if not blocks:
        blocks.append(sp.csr_matrix((0, n)))
        rhs.append(np.zeros(0))
    G = sp.vstack(blocks, format="csr")
    cost = np.zeros(n + 1)
    cost[-1] = 1.0
    A_eq = sp.hstack([C[eq], sp.csr_matrix((int(eq.sum()), 1))], format="csr") if eq.any() else None
    bounds = [(float(v), float(v)) if f else (None, None) for v, f in zip(qp.lb, fixed, strict=True)]
    res: Any = linprog(cost, A_ub=sp.hstack([G, -np.ones((G.shape[0], 1))], format="csr"), b_ub=np.concatenate(rhs),
                       A_eq=A_eq, b_eq=qp.u[eq] if eq.any() else None, bounds=[*bounds, (-1.0, None)],
                       method="highs", options={"time_limit": LP_TIME_LIMIT, "primal_feasibility_tolerance": LP_TOL,
                                                "dual_feasibility_tolerance": LP_TOL})
    if res.status == 2:  # infeasible: the equality rows and fixed variables have no common point
        return None, float("inf"), False
    if res.status != 0 or res.x is None:
        return None, 0.0, True
    return np.asarray(res.x[:n], dtype=np.float64), float(res.x[-1]), G.shape[0] == 0


#: constraints whose least uniform violation exceeds this times (1 + their size) are empty
EMPTY_GAP = 1e-8


def certainly_empty(qp: QP) -> str | None:
    """Why no point meets ``qp``'s constraints, where that is certain; None otherwise.

    A zero row whose sides exclude 0, an LP (:func:`least_violation`) that HiGHS finds infeasible (inconsistent
    equalities or fixed variables), or one whose least uniform violation exceeds :data:`EMPTY_GAP` times
    (1 + the constraints' size: the largest distance of a hyperplane or bound from the origin). Relative: rows
    normalised at 3e10 and 9e10 round apart by 3.8e-6, and an absolute 1e-6 called a feasible set empty.
    """
    if qp.m:
        _, norms = _row_norms(qp)
        zero = norms == 0
        if np.any(zero & ((qp.l > 0) | (qp.u < 0))):
            return "a row with no entries excludes 0"
        with np.errstate(divide="ignore", invalid="ignore"):
            dist = np.where(zero, 0.0, np.maximum(np.abs(np.where(np.isfinite(qp.l), qp.l, 0.0)),
                                                  np.abs(np.where(np.isfinite(qp.u), qp.u, 0.0))) / norms)
        size = float(np.max(dist, initial=0.0))
    else:
        size = 0.0
    for bound in (qp.lb, qp.ub):
        fin = np.isfinite(bound)
        size = max(size, float(np.max(np.abs(bound[fin]), initial=0.0)))
    _, t, unconstrained = least_violation(qp)
    if t == float("inf"):
        return "the equality rows and fixed variables have no common point (HiGHS)"
    if not unconstrained and t > EMPTY_GAP * (1.0 + size):
        return f"every point misses some row by {t:.3g} or more (in the rows' distances)"
    return None


def refutes(qp: QP, x: np.ndarray | None) -> bool:
    """Whether ``x`` (an :func:`interior_point`) satisfies every constraint of ``qp`` to rounding.

    :data:`ROUNDING` of each one's terms (:data:`EQ_ROUNDING` for an equality row).
    """
    if x is None or not np.all(np.isfinite(x)):
        return False
    ax = np.abs(x)
    ok = bool(np.all(x - qp.ub <= ROUNDING * (np.abs(np.where(np.isfinite(qp.ub), qp.ub, 0.0)) + ax)))
    ok &= bool(np.all(qp.lb - x <= ROUNDING * (np.abs(np.where(np.isfinite(qp.lb), qp.lb, 0.0)) + ax)))
    if qp.m and ok:
        cx = qp.C @ x
        terms = abs(qp.C) @ ax
        tol = np.where(qp.l == qp.u, EQ_ROUNDING, ROUNDING)  # an equality row holds to the LP's own solve
        for side, sign in ((qp.u, 1.0), (qp.l, -1.0)):
            fin = np.isfinite(side)
            ok &= bool(np.all(sign * (cx[fin] - side[fin]) <= tol[fin] * (np.abs(side[fin]) + terms[fin])))
    return ok
