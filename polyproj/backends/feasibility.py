"""A point of a QP's constraints by one LP: how the guard checks a backend's claim of primal infeasibility.

A backend's PRIMAL_INFEASIBLE is its own verdict: some return a certificate the backend glue checks (OSQP,
ProxSuite), others a bare flag (DAQP said so on a feasible 4-variable QP with one row of norm 3e-5; PIQP on a
random feasible QP; DAQP on ``P = 1e-50 I`` in a box). The LP, in equilibrated variables ``x = D y``,

    t* = min t   s.t.   (C_i D y − u_i) / ||C_i D|| <= t,   (l_i − C_i D y) / ||C_i D|| <= t,
                        lb / D − t <= y <= ub / D + t,   t >= −1

finds a point of least uniform violation of the rows (in their own distances; t < 0: strictly inside, by a
margin up to 1, where the set has an interior), by HiGHS' simplex (SciPy's ``linprog``), independent of every
backend's QP method. ``D`` (:func:`column_scale`) is the geometric scaling of C's columns at the level of the
rows' sides, capped by each variable's box width: a diagonal change of variables ``x' = S x`` gives ``D' = S D``
and the same LP, so the margin measures the set's shape, not its units (in x's own units, with columns scaled
1e-8..1e8, a point 3 % inside every row was 4e-10 inside in the rows' distances, below MARGIN, and HiGHS found
t* = +4e-9: the false claims of four backends stood). The claim is refuted only by a point strictly inside every
row by more than the LP's tolerances (``t* < −``:data:`MARGIN`; equality rows and fixed variables are held exactly,
the interior is the one relative to them), checked in float64 on the constraints as given (:func:`refutes`): a set
without an interior relative to its equalities keeps every claim, and so does an empty one whose rows an LP point
misses by less than a loose tolerance would allow (a gap of 0.02 at |x| 1e9 had been "refuted" at 1e-10 of the
rows' terms). An LP that fails or runs past :data:`LP_TIME_LIMIT` leaves the claim.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from ..problem import QP

__all__ = ["EMPTY_GAP", "LP_TIME_LIMIT", "MARGIN", "ROUNDING", "certainly_empty", "column_scale", "interior_point",
           "least_violation", "no_descent_ray", "refutes"]

#: seconds the LP may take; past it, the claim stands
LP_TIME_LIMIT = 10.0
#: the LP's primal and dual feasibility tolerances
LP_TOL = 1e-10
#: the margin inside every row (in the rows' distances, equilibrated variables) an LP point must have to refute a
#: claim: beyond LP_TOL
MARGIN = 1e-8
#: and the point must meet every constraint as given to this times the size of its terms (``|rhs| + ||row||₁ |x|``)
ROUNDING = 64 * float(np.finfo(np.float64).eps)
#: the same for an equality row, which the LP meets to its factorisation's accuracy, not with a margin
EQ_ROUNDING = 1e-9


def interior_point(qp: QP) -> np.ndarray | None:
    """The LP's point (module docstring) where it lies inside every row by more than :data:`MARGIN`, else None."""
    x, t, unconstrained = least_violation(qp)
    return x if x is not None and (t < -MARGIN or unconstrained) else None


def column_scale(qp: QP) -> np.ndarray:
    """The LP's variables ``x = D y``: ``D`` (n,), the geometric scaling of C at the sides' level, capped by the boxes.

    Row factors ``ρ`` and column factors ``log D`` that make C's non-zero entries nearest 1 in least squares,
    ``min Σ (ρ_i + log D_j + log|C_ij|)²`` (one sparse solve of its normal equations), are unique up to a shift of ρ
    against log D in each connected set of rows and columns. The shift is the level: the median over the set's rows
    of the one that makes ``e^ρ_i s_i`` one (``s_i`` the smallest non-zero of ``|l_i|, |u_i|, u_i − l_i``: a side
    near 0 or a slab's width, not an offset; a set without one is a cone, whose margin the LP caps at 1 whatever D
    is). A median, not the least-squares mean: rows whose sides stand in for infinity (1e12) pulled D up by 1e5 and
    the margin of a feasible set below MARGIN (it still does where they are most of a set's rows). So a diagonal
    scaling of the variables ``x' = S x`` (C' = C S⁻¹) gives ``D' = S D``, and one of the rows changes nothing: the
    same LP. The bounds do not enter it (big-M boxes); a variable whose finite box is narrower than ``D_j`` (or
    that no row holds) is measured in its box (``D_j`` = its width, covariant too): rows that move little with it
    must not shrink its room below the margin.
    """
    from scipy.sparse.csgraph import connected_components
    from scipy.sparse.linalg import spsolve

    n, m = qp.n, qp.m
    A = sp.coo_matrix(qp.C) if m else sp.coo_matrix((0, n))
    nz = A.data != 0
    r, c, v = A.row[nz], A.col[nz], np.log(np.abs(A.data[nz]))
    B = sp.csr_matrix((np.ones(r.size), (r, c)), shape=(m, n))
    deg = np.concatenate([np.bincount(r, minlength=m), np.bincount(c, minlength=n)]).astype(np.float64)
    # normal equations in (ρ, log D); a relative 1e-10 on the diagonal picks one solution of each connected set
    G = sp.bmat([[None, B], [B.T, None]], format="csc") if m else sp.csc_matrix((n, n))
    K = G + sp.diags(deg + 1e-10 * max(deg.max(initial=0.0), 1.0), format="csc")
    sol = np.atleast_1d(spsolve(K, -np.concatenate([np.bincount(r, v, m), np.bincount(c, v, n)])))
    _, label = connected_components(G, directed=False)
    with np.errstate(invalid="ignore", divide="ignore"):
        side = np.full(m, np.nan)
        for size in (np.abs(qp.l), np.abs(qp.u), qp.u - qp.l):
            side = np.fmin(side, np.where(np.isfinite(size) & (size > 0), size, np.nan))
        shift = -(sol[:m] + np.log(side))  # each row's level; NaN without a non-zero side
    has = np.flatnonzero(~np.isnan(shift))
    level = np.zeros(label.max(initial=-1) + 1)
    if has.size:  # the median of each connected set's levels
        order = has[np.lexsort((shift[has], label[has]))]
        sets, first, count = np.unique(label[order], return_index=True, return_counts=True)
        level[sets] = (shift[order[first + (count - 1) // 2]] + shift[order[first + count // 2]]) / 2
    D = np.exp(np.clip(sol[m:] - level[label[m:]], -345.0, 345.0))  # (x = D y and bounds / D stay finite)
    width = qp.ub - qp.lb
    narrow = np.isfinite(width) & (width > 0) & ((width < D) | (deg[m:] == 0))
    D[narrow] = width[narrow]
    return D


def _scaled_rows(qp: QP) -> tuple[Any, np.ndarray, np.ndarray]:
    """``(C D, D, ||C_i D||)`` of the LP, made once per QP (kept in ``qp.memo``)."""
    hit = qp.memo.get("feasibility_scale")
    if hit is None:
        D = column_scale(qp)
        C = (sp.csr_matrix(qp.C) if qp.m else sp.csr_matrix((0, qp.n))) @ sp.diags(D)
        C = sp.csr_matrix(C)
        norms = np.sqrt(np.asarray(C.multiply(C).sum(axis=1)).reshape(-1)) if qp.m else np.zeros(0)
        hit = qp.memo["feasibility_scale"] = (C, D, norms)
    return hit


def least_violation(qp: QP) -> tuple[np.ndarray | None, float, bool]:
    """``(x, t*, unconstrained)`` of the LP (module docstring), solved once per QP (kept in ``qp.memo``).

    ``x`` in the QP's own variables (``D y``), ``t*`` in the LP's equilibrated distances. ``unconstrained``: no
    inequality row or free bound (``t`` is then meaningless, ``x`` any point of the equalities and fixed
    variables). ``(None, inf, False)`` where HiGHS finds the LP infeasible, ``(None, 0.0, True)`` where it does not
    solve it.
    """
    hit = qp.memo.get("least_violation")
    if hit is None:
        hit = qp.memo["least_violation"] = _least_violation(qp)
    return hit


def _least_violation(qp: QP) -> tuple[np.ndarray | None, float, bool]:
    from scipy.optimize import linprog

    n = qp.n
    C, D, norms = _scaled_rows(qp)
    lb, ub = qp.lb / D, qp.ub / D
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
    for bound, sign in ((ub, 1.0), (lb, -1.0)):
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
    A_eq = (sp.hstack([sp.diags(1.0 / norms[eq]) @ C[eq], sp.csr_matrix((int(eq.sum()), 1))], format="csr")
            if eq.any() else None)
    bounds = [(float(v), float(v)) if f else (None, None) for v, f in zip(lb, fixed, strict=True)]
    res: Any = linprog(cost, A_ub=sp.hstack([G, -np.ones((G.shape[0], 1))], format="csr"), b_ub=np.concatenate(rhs),
                       A_eq=A_eq, b_eq=qp.u[eq] / norms[eq] if eq.any() else None, bounds=[*bounds, (-1.0, None)],
                       method="highs", options={"time_limit": LP_TIME_LIMIT, "primal_feasibility_tolerance": LP_TOL,
                                                "dual_feasibility_tolerance": LP_TOL})
    if res.status == 2:  # infeasible: the equality rows and fixed variables have no common point
        return None, float("inf"), False
    if res.status != 0 or res.x is None:
        return None, 0.0, True
    x = D * np.asarray(res.x[:n], dtype=np.float64)
    x[fixed] = qp.lb[fixed]  # exactly, not D (lb / D)
    return x, float(res.x[-1]), G.shape[0] == 0


#: constraints whose least uniform violation exceeds this times (1 + their size) are empty
EMPTY_GAP = 1e-8


def certainly_empty(qp: QP) -> str | None:
    """Why no point meets ``qp``'s constraints, where that is certain; None otherwise.

    A zero row whose sides exclude 0, an LP (:func:`least_violation`) that HiGHS finds infeasible (inconsistent
    equalities or fixed variables), or one whose least uniform violation exceeds :data:`EMPTY_GAP` times
    (1 + the constraints' size: the largest distance of a hyperplane or bound from the origin), both in the LP's
    equilibrated variables. Relative: rows normalised at 3e10 and 9e10 round apart by 3.8e-6, and an absolute 1e-6
    called a feasible set empty.
    """
    _, D, norms = _scaled_rows(qp)
    size = 0.0
    if qp.m:
        zero = norms == 0
        if np.any(zero & ((qp.l > 0) | (qp.u < 0))):
            return "a row with no entries excludes 0"
        with np.errstate(divide="ignore", invalid="ignore"):
            dist = np.where(zero, 0.0, np.maximum(np.abs(np.where(np.isfinite(qp.l), qp.l, 0.0)),
                                                  np.abs(np.where(np.isfinite(qp.u), qp.u, 0.0))) / norms)
        size = float(np.max(dist, initial=0.0))
    for bound in (qp.lb, qp.ub):
        fin = np.isfinite(bound)
        size = max(size, float(np.max(np.abs(bound[fin] / D[fin]), initial=0.0)))
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


def no_descent_ray(qp: QP) -> str | None:
    """Why ``qp``'s objective is bounded below on its constraints, where that is proved; None otherwise.

    A convex QP on a non-empty polyhedron is unbounded below exactly when a direction ``d`` of the polyhedron's
    recession cone (``C_i d >= 0`` where ``l_i`` is finite, ``<= 0`` where ``u_i`` is, ``d_j >= 0`` where ``lb_j``
    is finite, ``<= 0`` where ``ub_j`` is) has ``P d = 0`` (``dᵀ P d = 0`` for ``P ⪰ 0``) and ``qᵀ d < 0``. With
    ``q = 0`` none does (the objective is ``½ xᵀPx >= 0``). Otherwise the LP ``qᵀ d <= −1`` over that cone, each row
    scaled to entries of at most 1 (a cone: the normalisation is free), that HiGHS finds infeasible proves that no
    ray exists (Clarabel said DUAL_INFEASIBLE for an LP whose optimum lies on a row side at −1e10). Only a proof
    counts: an LP that fails or runs past :data:`LP_TIME_LIMIT` leaves the claim, and so does a row of ``q``, ``C``
    or ``P`` whose non-zero entries span more than :data:`RAY_SPAN` (HiGHS drops entries below 1e-9 of a row's
    largest: the LP it solves would be another, and a ray through the small entries, ``x₀ − 5.8e-11 x₁ <= 0``, was
    "proved" absent).
    """
    from scipy.optimize import linprog

    n = qp.n
    if n == 0:
        return "the problem has no variables"
    q = np.asarray(qp.q, dtype=np.float64)
    if not np.any(q):
        return "q = 0: the objective ½ xᵀPx is bounded below by 0"
    parts = [_unit_rows(q.reshape(1, n)), _unit_rows(qp.C if qp.m else sp.csr_matrix((0, n))), _unit_rows(qp.P)]
    if any(part is None for part in parts):
        return None
    qn, Cn, Pn = parts
    rows, rhs = [qn], [np.array([-1.0])]
    for side, sign in ((qp.u, 1.0), (qp.l, -1.0)):  # C d <= 0 under a finite u, −C d <= 0 over a finite l
        fin = np.flatnonzero(np.isfinite(side))
        if fin.size:
            rows.append(sign * Cn[fin])
            rhs.append(np.zeros(fin.size))
    A_eq = Pn if Pn.nnz else None
    bounds = [(0.0 if np.isfinite(lo) else None, 0.0 if np.isfinite(hi) else None)
              for lo, hi in zip(qp.lb, qp.ub, strict=True)]
    res: Any = linprog(np.zeros(n), A_ub=sp.vstack(rows, format="csr"), b_ub=np.concatenate(rhs), A_eq=A_eq,
                       b_eq=np.zeros(n) if A_eq is not None else None, bounds=bounds, method="highs",
                       options={"time_limit": LP_TIME_LIMIT, "primal_feasibility_tolerance": LP_TOL,
                                "dual_feasibility_tolerance": LP_TOL})
    if res.status == 2:
        return "no direction of the constraints' recession cone on which P vanishes descends (HiGHS)"
    return None


#: the most a row's non-zero entries may span for :func:`no_descent_ray` to judge (HiGHS drops entries below 1e-9
#: of the largest)
RAY_SPAN = 1e8


def _unit_rows(M: Any) -> Any:
    """``M`` (dense or sparse) as a CSR copy, each row divided by its largest magnitude; None past RAY_SPAN.

    None where a row's non-zero entries span beyond RAY_SPAN. A copy: the problem's own matrix is never edited
    (``eliminate_zeros``).
    """
    M = sp.csr_matrix(M, dtype=np.float64, copy=True)
    M.eliminate_zeros()
    if not M.nnz:
        return M
    top = np.asarray(abs(M).max(axis=1).todense()).reshape(-1)
    scaled = sp.diags(1.0 / np.where(top > 0, top, 1.0)) @ M
    if np.abs(scaled.data).min() * RAY_SPAN < 1.0:
        return None
    return sp.csr_matrix(scaled)
