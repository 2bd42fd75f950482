"""Whether a polyhedron is empty, decided by one LP: the least uniform violation of its rows.

A backend's PRIMAL_INFEASIBLE is an iterative method's verdict, and a backend's "feasible" point, taken at its
own tolerance, is no proof either: ``{x₁ + x₂ <= 1, x₁ + x₂ >= 1 + 1e-6}`` is empty, while an interior-point
answer 1.6e-6 outside it passed the loose test of a point of the polyhedron. The LP

    t* = min t   s.t.   (A_i y − a_i) / ||A_i|| <= t,   |B_j y − b_j| / ||B_j|| <= t,   lb − t <= y <= ub + t,   t >= 0

is the largest margin by which every point misses some row (in the rows' own distances): ``t* = 0`` exactly
when the polyhedron is non-empty. HiGHS' simplex (SciPy's ``linprog``) ends on a vertex, exact to its
feasibility tolerance (set here far below the threshold the caller compares ``t*`` with).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..polydata import PolyData

__all__ = ["least_violation"]

#: HiGHS' primal and dual feasibility tolerances for the LP (its default, 1e-7, is above the margins it must tell)
LP_TOL = 1e-10


def least_violation(data: PolyData) -> float | None:
    """``t*`` of the module docstring for shared data (the rows' own distance units), or None when the LP fails."""
    from scipy.optimize import linprog

    from ..backends.projection import to_host

    A, a, B, b, lb, ub = (np.asarray(to_host(v), dtype=np.float64) for v in data.parts())
    n = A.shape[-1] if A.ndim == 2 and A.shape[0] else data.n
    rows, rhs = [], []
    for M, c, both in ((A, a, False), (B, b, True)):
        if not M.shape[0]:
            continue
        norm = np.linalg.norm(M, axis=1)
        keep = (norm > 0) & np.isfinite(c)  # a zero row's verdict is empty_row's (PolyData checks it)
        Mn, cn = M[keep] / norm[keep, None], c[keep] / norm[keep]
        for sign in ((1.0, -1.0) if both else (1.0,)):
            rows.append(np.hstack([sign * Mn, -np.ones((Mn.shape[0], 1))]))
            rhs.append(sign * cn)
    eye = np.eye(n)
    for bound, sign in ((lb, -1.0), (ub, 1.0)):
        fin = np.isfinite(bound)
        if fin.any():
            rows.append(np.hstack([sign * eye[fin], -np.ones((int(fin.sum()), 1))]))
            rhs.append(sign * bound[fin])
    if not rows:
        return 0.0
    cost = np.zeros(n + 1)
    cost[-1] = 1.0
    res: Any = linprog(cost, A_ub=np.vstack(rows), b_ub=np.concatenate(rhs),
                       bounds=[(None, None)] * n + [(0.0, None)], method="highs",
                       options={"primal_feasibility_tolerance": LP_TOL, "dual_feasibility_tolerance": LP_TOL})
    return float(res.x[-1]) if res.status == 0 else None
