"""Whether a polyhedron is empty, decided by one LP: the least uniform violation of its rows.

A backend's PRIMAL_INFEASIBLE is an iterative method's verdict, and a backend's "feasible" point, taken at its
own tolerance, is no proof either: ``{x₁ + x₂ <= 1, x₁ + x₂ >= 1 + 1e-6}`` is empty, while an interior-point
answer 1.6e-6 outside it passed the loose test of a point of the polyhedron. The LP

    t* = min t   s.t.   (A_i y − a_i) / ||A_i|| <= t,   |B_j y − b_j| / ||B_j|| <= t,   lb − t <= y <= ub + t,   t >= 0

is the largest margin by which every point misses some row (in the rows' own distances): ``t* = 0`` exactly
when the polyhedron is non-empty. HiGHS' simplex (SciPy's ``linprog``) solves it; its answer is taken only
with its dual certificate checked in float64 against the rows as given (:func:`least_violation`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..polydata import PolyData

__all__ = ["least_violation"]

#: HiGHS' primal and dual feasibility tolerances for the LP (its default, 1e-7, is above the margins it must tell)
LP_TOL = 1e-10
#: seconds the LP may take (a large, degenerate LP: n = 1000, m = 2000 took 200 s); past it, no verdict
LP_TIME_LIMIT = 10.0
#: the certificate must exclude every point within this many times the set's size (1 + its largest distance of a
#: hyperplane from the origin) in each coordinate: its rows cancel only to rounding, and a set whose points all lie
#: farther than that (``{y₁ <= 0, −y₁ + 1e-12 y₂ <= −1e-7}``: y₂ <= −1e5) gets no verdict
CERTIFIED_RADIUS = 1e6


def least_violation(data: PolyData, reach: float = 0.0) -> float | None:
    """``t*`` of the module docstring for shared data, certified in float64; None when not certified.

    The LP's dual gives weights ``u >= 0`` on the rows with ``Gᵀu = 0`` and ``−hᵀu = t*`` (``G y <= h`` the
    normalised rows, the bounds among them): for every ``y``, ``max_i (G y − h)_i >= (−hᵀu + (Gᵀu)ᵀy) / Σu``.
    The verdict is that bound with ``Gᵀu`` recomputed here from the rows as given, over every ``y`` within
    :data:`CERTIFIED_RADIUS` times the set's size, and within ``2 reach`` (the caller's points' largest
    coordinate), in each coordinate: ``(−hᵀu − ‖Gᵀu‖∞ ‖y‖₁) / Σu`` (HiGHS drops
    matrix entries below 1e-9: the set ``{y₁ <= 0, −y₁ + 1e-9 y₂ <= −1e-3}`` is not empty, ``y₂ = −1e6``, and its
    LP without that entry said 5e-4). None (no verdict) where that bound is not positive, or when the LP fails or
    runs past :data:`LP_TIME_LIMIT`.
    """
    import scipy.sparse as sp
    from scipy.optimize import linprog

    from ..linalg import to_host

    A, a, B, b, lb, ub, norm_a, norm_b = (np.asarray(to_host(v), dtype=np.float64)
                                          for v in (*data.parts(), *data.row_norms))
    n = data.n
    rows, rhs = [], []
    for M, c, norm, both in ((A, a, norm_a, False), (B, b, norm_b, True)):
        if not M.shape[0]:
            continue
        keep = (norm > 0) & np.isfinite(c)  # a zero row's verdict is empty_row's (PolyData checks it)
        Mn, cn = M[keep] / norm[keep, None], c[keep] / norm[keep]
        for sign in ((1.0, -1.0) if both else (1.0,)):
            rows.append(sp.csr_matrix(sign * Mn))
            rhs.append(sign * cn)
    for bound, sign in ((lb, -1.0), (ub, 1.0)):
        fin = np.flatnonzero(np.isfinite(bound))
        if fin.size:
            rows.append(sp.csr_matrix((np.full(fin.size, sign), (np.arange(fin.size), fin)), shape=(fin.size, n)))
            rhs.append(sign * bound[fin])
    if not rows:
        return 0.0
    G, h = sp.vstack(rows, format="csr"), np.concatenate(rhs)
    cost = np.zeros(n + 1)
    cost[-1] = 1.0
    res: Any = linprog(cost, A_ub=sp.hstack([G, -np.ones((G.shape[0], 1))], format="csr"), b_ub=h,
                       bounds=[(None, None)] * n + [(0.0, None)], method="highs",
                       options={"primal_feasibility_tolerance": LP_TOL, "dual_feasibility_tolerance": LP_TOL,
                                "time_limit": LP_TIME_LIMIT})
    if res.status != 0 or getattr(res, "ineqlin", None) is None:
        return None
    u = np.maximum(-np.asarray(res.ineqlin.marginals, dtype=np.float64), 0.0)  # scipy: d(objective)/d(b) <= 0
    weight = float(u.sum())
    if not weight > 0:
        return 0.0 if float(res.x[-1]) <= 0.0 else None
    norm1 = n * max(CERTIFIED_RADIUS * (1.0 + data.distance_size), 2.0 * reach)  # ‖y‖₁ of the points covered
    gap = (float(-(h @ u)) - float(np.abs(G.T @ u).max(initial=0.0)) * norm1) / weight
    return gap if gap > 0.0 else None
