"""A point of a QP's constraints by one LP: how the guard checks a backend's claim of primal infeasibility.

A backend's PRIMAL_INFEASIBLE is its own verdict: some return a certificate the backend glue checks (OSQP,
ProxSuite), others a bare flag (DAQP said so on a feasible 4-variable QP with one row of norm 3e-5; PIQP on a
random feasible QP; DAQP on ``P = 1e-50 I`` in a box). The LP

    t* = min t   s.t.   (C_i x − u_i) / ||C_i|| <= t,   (l_i − C_i x) / ||C_i|| <= t,   lb − t <= x <= ub + t,   t >= −1

finds a point of least uniform violation of the rows (in their own distances; t < 0: strictly inside, by a
margin up to 1, where the set has an interior), by HiGHS' simplex (SciPy's ``linprog``), independent of every
backend's QP method. The claim is refuted only by that point itself: its
violation of the constraints as given, in float64 (:meth:`polyproj.problem.QP.primal_violation`), at rounding
(:func:`refutes`). An LP that fails, runs past :data:`LP_TIME_LIMIT` or finds no such point leaves the claim.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from ..problem import QP

__all__ = ["LP_TIME_LIMIT", "ROUNDING", "least_violation_point", "refutes"]

#: seconds the LP may take; past it, the claim stands
LP_TIME_LIMIT = 10.0
#: a point refutes an infeasibility claim when it violates no constraint by more than this times the size of
#: the constraint's terms (``|rhs| + ||row||₁ |x|``): far below any backend's tolerance (DAQP's 1e-8 absolute)
ROUNDING = 1e-10


def least_violation_point(qp: QP) -> np.ndarray | None:
    """The LP's point (module docstring), or None when HiGHS does not solve the LP."""
    from scipy.optimize import linprog

    n = qp.n
    C = sp.csr_matrix(qp.C) if qp.m else sp.csr_matrix((0, n))
    norms = np.sqrt(np.asarray(C.multiply(C).sum(axis=1)).reshape(-1)) if qp.m else np.zeros(0)
    keep = norms > 0  # a zero row is judged by its own sides (primal_violation), the LP cannot move it
    Cn = sp.diags(1.0 / norms[keep]) @ C[keep]
    blocks, rhs = [], []
    for side, sign in ((qp.u[keep], 1.0), (qp.l[keep], -1.0)):
        fin = np.isfinite(side)
        if fin.any():
            blocks.append(sign * Cn[np.flatnonzero(fin)])
            rhs.append(sign * side[fin] / norms[keep][fin])
    for bound, sign in ((qp.ub, 1.0), (qp.lb, -1.0)):
        fin = np.flatnonzero(np.isfinite(bound))
        if fin.size:
            blocks.append(sp.csr_matrix((np.full(fin.size, sign), (np.arange(fin.size), fin)), shape=(fin.size, n)))
            rhs.append(sign * bound[fin])
    if not blocks:
        return np.zeros(n)
    G = sp.vstack(blocks, format="csr")
    cost = np.zeros(n + 1)
    cost[-1] = 1.0
    res: Any = linprog(cost, A_ub=sp.hstack([G, -np.ones((G.shape[0], 1))], format="csr"), b_ub=np.concatenate(rhs),
                       bounds=[(None, None)] * n + [(-1.0, None)], method="highs",
                       options={"time_limit": LP_TIME_LIMIT})
    if res.status != 0 or res.x is None:
        return None
    return np.asarray(res.x[:n], dtype=np.float64)


def refutes(qp: QP, x: np.ndarray | None) -> bool:
    """Whether ``x`` satisfies every constraint of ``qp`` to rounding (:data:`ROUNDING` of each one's terms)."""
    if x is None or not np.all(np.isfinite(x)):
        return False
    ax = np.abs(x)
    ok = bool(np.all(x - qp.ub <= ROUNDING * (np.abs(np.where(np.isfinite(qp.ub), qp.ub, 0.0)) + ax)))
    ok &= bool(np.all(qp.lb - x <= ROUNDING * (np.abs(np.where(np.isfinite(qp.lb), qp.lb, 0.0)) + ax)))
    if qp.m and ok:
        cx = qp.C @ x
        terms = abs(qp.C) @ ax
        for side, sign in ((qp.u, 1.0), (qp.l, -1.0)):
            fin = np.isfinite(side)
            ok &= bool(np.all(sign * (cx[fin] - side[fin]) <= ROUNDING * (np.abs(side[fin]) + terms[fin])))
    return ok
