"""The direct path for small NumPy batches: DAQP per point, one exact face solve, KKT verified.

For a point ``x`` and shared data ``P = {A y <= a, B y = b, lb <= y <= ub}`` DAQP (a dual active-set
method) ends on a working set ``W``: rows of ``A`` with a positive multiplier, bounds with a signed
one (upper: positive, lower: negative). With ``E`` the coordinates fixed by the bounds in ``W``, ``F``
the free ones, ``M = [A_W; B]`` and its rows normalised on the free columns (``M_n = diag(s) M_F``,
``s_i = 1/||M_{i,F}||``), the projection onto the face is exact in one solve:

    z = x with z_E at its bounds,   G = M_n M_nᵀ = L Lᵀ,
    λ = s ⊙ G⁻¹ (s ⊙ (M z − c)),    y = z − (Mᵀλ)_F   (one refinement step when |z| ≫ |y|),
    λ_ub − λ_lb = (x − y − Mᵀλ)_E   (stationarity on the fixed coordinates).

The point is taken only when it is the clean, nondegenerate case, verified on ``y`` itself:

* DAQP's status is optimal;
* ``G`` is well conditioned: every pivot of ``L`` at least :data:`PIVOT` (normalised rows: ``G_ii = 1``);
* strict complementarity, clear of the KKT tolerances by the factor :data:`SEPARATION`: every face
  row's normalised multiplier (``λ_i ||row_i||``, bounds ``|λ|``) is above ``SEPARATION tol σ``,
  ``σ = 1 + max|x| + max|y|`` (the degeneracy report calls a row weakly active at ``tol σ``), and every
  other row's slack above ``SEPARATION`` times its feasibility tolerance (at which the polish counts a
  row at zero slack as active);
* KKT to the polish's tolerance ``tol``: the face's rows and the equalities hold, every row is feasible
  (``tol (|rhs| + ||row||_1 max|y|)``, as in :mod:`polyproj.projection.polish`), and the stationarity
  residual ``y − x + Aᵀλ_A + Bᵀμ − λ_lb + λ_ub`` is at most ``tol σ``.

Then the active set is unique (the rows at zero slack are exactly the face's, each with a clearly
positive multiplier), ``y`` is the exact projection and the HS-Jacobian is ``J g = f⊙g − f⊙Mᵀr`` with
``r = s ⊙ G⁻¹ (s ⊙ M(f⊙g))`` on that face, the product the pipeline's backward computes there; the
factor ``L`` is kept for it (:class:`DirectFace`). These points are never reported weakly active, and
the polish's final active set at them is the same face. Every other point
— a weakly active row, a row at zero slack outside the face, an ill-conditioned or dependent face, a
coordinate at both bounds, DAQP not optimal — goes to the pipeline (:func:`polyproj.projection.pipeline.run`)
unchanged, with its warm start where one was given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.linalg.lapack import dpotrf, dpotrs

from ..polydata import PolyData
from ..solution import Status
from .pipeline import PipelineOutput
from .polish import CANCELLATION, FaceRecord

__all__ = ["DIRECT_BATCH", "PIVOT", "SEPARATION", "DirectData", "DirectFace", "project_direct"]

#: NumPy batches of at most this many points take the direct path first
DIRECT_BATCH = 16
#: how far above the KKT tolerances the multipliers of the face rows and the slacks of the others must be:
#: the answer is verified either way; the margin keeps the direct path's active sets those of the pipeline,
#: whose candidate thresholds see the start's error (rows placed at slacks 1e-12 to 1e-3 of a point's
#: projection agree on every point at 10; below 5 the pipeline's polish refuses points verified here)
SEPARATION = 10.0
#: smallest Cholesky pivot of the normalised face Gram matrix (its diagonal is 1)
PIVOT = 1e-3


@dataclass(frozen=True)
class DirectData:
    """The DAQP arrays of the projection QP and the row norms of the KKT tests (built once per data)."""

    arrays: tuple[np.ndarray, ...]  # (H, C = [A; B], upper, lower, sense): the backend's own layout
    rhs: np.ndarray  # (m + 2n) right-hand sides [a, −lb, ub], 0 where infinite
    fin: np.ndarray  # (m + 2n) finite right-hand side
    rn1: np.ndarray  # (m + 2n) 1-norms of the inequality rows
    rn2: np.ndarray  # (m + 2n) 2-norms (1 for zero rows)
    bn1: np.ndarray  # (p,) 1-norms of the equality rows
    c: np.ndarray  # (m + p) right-hand sides of the rows of C = [A; B] (0 where infinite)
    eq_rows: np.ndarray  # indices m, ..., m + p - 1 of B's rows in C
    lb: np.ndarray
    ub: np.ndarray

    @property
    def C(self) -> np.ndarray:
        """The rows ``[A; B]`` (m + p, n)."""
        return self.arrays[1]

    @classmethod
    def of(cls, d: PolyData, solver: Any) -> DirectData:
        """The arrays of shared NumPy data ``d`` for the DAQP backend ``solver``."""
        from ..backends.projection import projection_qp

        n, m, p = d.n, d.m, d.p
        A, a, B, b, lb, ub = (np.asarray(v, dtype=np.float64) for v in d.parts())
        arrays = solver._data(projection_qp(A, a, B, b, lb, ub, np.zeros(n)))
        rhs = np.concatenate([a, -lb, ub])
        fin = np.isfinite(rhs)
        ones = np.ones(2 * n)
        rn2 = np.concatenate([np.linalg.norm(A, axis=1), ones])
        c = np.concatenate([a, b])
        return cls(arrays, np.where(fin, rhs, 0.0), fin, np.concatenate([np.abs(A).sum(axis=1), ones]),
                   np.where(rn2 > 0, rn2, 1.0), np.abs(B).sum(axis=1), np.where(np.isfinite(c), c, 0.0),
                   np.arange(m, m + p, dtype=np.intp), lb, ub)


@dataclass(frozen=True)
class _Point:
    """One point's verified face: active A rows, free coordinates, normalisation and Cholesky factor."""

    act: np.ndarray  # indices of the active rows of A
    M: np.ndarray  # (k + p, n) the face's rows: active rows of A, then B
    free: np.ndarray  # (n,) 0/1 float
    s: np.ndarray  # (k + p,) 1/||row_F||
    L: np.ndarray | None  # (k + p, k + p) lower Cholesky factor of G, None without rows


@dataclass(frozen=True)
class DirectRows:
    """What :func:`~polyproj.projection.faces.expand_rows` reads: the compact row layout of a face batch."""

    xp: Any
    k: int  # active A rows per sample, padded
    m: int
    p: int
    order: np.ndarray  # (b, m): active rows first


class DirectFace:
    """The faces of the points the direct path took, with the interface the backward uses (``vjp``, ``rows``)."""

    def __init__(self, points: list[_Point], rows: DirectRows) -> None:
        self.points, self.rows = points, rows

    def vjp(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(J g, r, Mᵀr)`` per point: ``r = s ⊙ G⁻¹ (s ⊙ M(f⊙g))`` in the compact layout of :attr:`rows`."""
        k, p = self.rows.k, self.rows.p
        Jg, Mr = np.empty_like(g), np.zeros_like(g)
        r = np.zeros((g.shape[0], k + p), dtype=g.dtype)
        for i, pt in enumerate(self.points):
            fg = pt.free * g[i]
            if pt.L is None:
                Jg[i] = fg
                continue
            M = pt.M
            ri = pt.s * dpotrs(pt.L, pt.s * (M @ fg), lower=1)[0]
            Mr[i] = M.T @ ri
            Jg[i] = fg - pt.free * Mr[i]
            r[i, : pt.act.size], r[i, k:] = ri[: pt.act.size], ri[pt.act.size:]
        return Jg, r, Mr


def _face(x: np.ndarray, d: PolyData, dd: DirectData, lam: np.ndarray) -> tuple | None:
    """The exact projection of ``x`` onto DAQP's working set (module docstring).

    Returns ``(y, λ_c, Mᵀλ_c, point)`` with ``λ_c`` the multipliers of the face's rows (active rows of A,
    then B), or None when the face is not well posed (a row without free support, a small pivot).
    """
    n, m = d.n, d.m
    lam_box = lam[:n]
    up, lo = lam_box > 0, lam_box < 0
    act = np.flatnonzero(lam[n: n + m] > 0)
    idx = np.concatenate([act, dd.eq_rows]) if dd.eq_rows.size else act
    fixed = up | lo
    free = (~fixed).astype(np.float64)
    z = x.copy()
    z[up], z[lo] = dd.ub[up], dd.lb[lo]
    if not idx.size:
        return z, np.zeros(0), np.zeros(n), _Point(act, dd.C[idx], free, np.zeros(0), None)
    M = dd.C[idx]
    Mf = M * free if fixed.any() else M
    nrm = np.sqrt(np.einsum("ij,ij->i", Mf, Mf))
    if not nrm.min() > 0:
        return None  # a row whose support is fixed: dependent on the bounds
    s = 1.0 / nrm
    Mn = Mf * s[:, None]
    L, info = dpotrf(Mn @ Mn.T, lower=1, clean=1)
    if info != 0 or L.diagonal().min() < PIVOT:
        return None
    c = dd.c[idx]
    lam_c = s * dpotrs(L, s * (M @ z - c), lower=1)[0]
    Mt = lam_c @ M
    y = z - Mt * free
    if np.abs(z).max() > CANCELLATION * np.abs(y).max():  # cancellation: one refinement step
        y = y - (s * dpotrs(L, s * (M @ y - c), lower=1)[0]) @ M * free
    return y, lam_c, Mt, _Point(act, M, free, s, L)


def _verified(X, Y, d: PolyData, dd: DirectData, mult, mu, active, tol: float) -> np.ndarray:
    """(b,) strict complementarity and the KKT conditions at ``Y`` (module docstring), for the whole batch.

    The face's own equations are among these tests: its rows of A at zero slack, B by the equality test,
    its bounds exact by construction.
    """
    A, a, B, b, lb, ub = d.parts()
    m, n = d.m, d.n
    sy = np.abs(Y).max(axis=1, keepdims=True)
    sig = 1.0 + np.abs(X).max(axis=1, keepdims=True) + sy
    slack = np.concatenate([a - Y @ A.T, Y - lb, ub - Y], axis=1)
    row_tol = tol * (np.abs(dd.rhs) + dd.rn1 * sy)
    bad = active & (~dd.fin | (np.abs(slack) > row_tol) | (mult * dd.rn2 <= SEPARATION * tol * sig))
    bad |= ~active & (slack <= SEPARATION * row_tol)  # another row at (or near) its hyperplane
    ok = ~bad.any(axis=1) & np.isfinite(Y).all(axis=1)
    stat = Y - X + mult[:, :m] @ A - mult[:, m: m + n] + mult[:, m + n:]
    if d.p:
        stat += mu @ B
        ok &= (np.abs(Y @ B.T - b) <= tol * (np.abs(b) + dd.bn1 * sy)).all(axis=1)
    return ok & (np.abs(stat).max(axis=1) <= tol * sig[:, 0])


def project_direct(X: np.ndarray, d: PolyData, dd: DirectData, solver: Any, tol: float, record: bool,
                   fallback: Any) -> PipelineOutput | None:
    """The direct path on a NumPy batch (float64, shared data; see the module docstring).

    ``solver``: the DAQP backend (its settings); ``fallback(idx, solved)`` projects the samples ``idx`` the
    path does not take through the pipeline — ``solved`` their DAQP solutions, a start it may reuse — and
    returns its :class:`~polyproj.projection.pipeline.PipelineOutput` (or None to send the whole batch
    there). Returns None when no sample is taken.
    """
    from ..backends.projection import start_from_solution
    from .pipeline import _merge

    N, n, m, p = X.shape[0], d.n, d.m, d.p
    sol, flags = solver.solve_points(X, dd.arrays)
    status = sol.status
    lams = np.concatenate([sol.z_box, sol.z], axis=1)
    Y, mult = np.zeros((N, n)), np.zeros((N, m + 2 * n))
    mu, active = np.zeros((N, p)), np.zeros((N, m + 2 * n), dtype=bool)
    points: list[_Point | None] = []
    for i in range(N):
        lam = lams[i]
        # optimal (not DAQP's soft optimum), with a finite answer
        got = _face(X[i], d, dd, lam) if flags[i] == 1 and status[i].ok else None
        points.append(None if got is None else got[3])
        if got is None:
            continue
        Y[i], lam_c, Mt, pt = got
        k = pt.act.size
        fixed = 1.0 - pt.free
        z_box = (X[i] - Y[i] - Mt) * fixed  # stationarity on the fixed coordinates
        lo, up = lam[:n] < 0, lam[:n] > 0
        mult[i, pt.act] = lam_c[:k]
        mult[i, m: m + n], mult[i, m + n:] = -z_box * lo, z_box * up
        mu[i] = lam_c[k:]
        active[i, pt.act] = True
        active[i, m: m + n], active[i, m + n:] = lo, up
    polished = np.array([pt is not None for pt in points], dtype=bool)
    polished &= _verified(X, Y, d, dd, mult, mu, active, tol)
    taken = [int(i) for i in np.flatnonzero(polished)]
    if not taken:
        return None
    faces = []
    if record:
        idx = np.asarray(taken, dtype=np.int64)
        act = active[idx, :m]
        k = int(act.sum(axis=1).max()) if m else 0
        order = np.argsort(~act, axis=1, kind="stable")
        rows = DirectRows(np, k, m, p, order)
        face = DirectFace([points[i] for i in taken], rows)
        faces.append(FaceRecord(None if len(taken) == N else idx, np.ones(len(taken), dtype=bool), face))
    start = start_from_solution(sol, X, m, float(solver.settings.get("eps_abs", 1e-8)))
    out = PipelineOutput(Y, active, mult, mu, tuple(Status.SOLVED if t else st for t, st in
                                                    zip(polished, status, strict=True)),
                         polished, solver.name, faces, start)
    if len(taken) == N:
        return out
    rest = np.flatnonzero(~polished)
    sub = fallback(rest, sol.take(rest))
    return None if sub is None else _merge(np, out, rest, sub)
