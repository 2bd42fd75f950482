"""The direct path for small NumPy batches: DAQP per point, one exact face solve, KKT verified.

For a point ``x`` and shared data ``P = {A y <= a, B y = b, lb <= y <= ub}`` DAQP (a dual active-set
method) ends on a working set ``W``: rows of ``A`` with a positive multiplier, bounds with a signed
one (upper: positive, lower: negative). With ``E`` the coordinates fixed by the bounds in ``W``, ``F``
the free ones, ``M = [A_W; B]`` and its rows normalised on the free columns (``M_n = diag(s) M_F``,
``s_i = 1/||M_{i,F}||``), the projection onto the face is exact in one solve:

    z = x with z_E at its bounds,   G = M_n M_nᵀ = L Lᵀ,
    λ = s ⊙ G⁻¹ (s ⊙ (M z − c)),    y = z − (Mᵀλ)_F   (refined where M y = c misses rounding),
    λ_ub − λ_lb = (x − y − Mᵀλ)_E   (stationarity on the fixed coordinates).

The point is taken only when it is the clean, nondegenerate case, verified on ``y`` itself:

* DAQP's status is optimal;
* ``G`` is well conditioned: every pivot of ``L`` at least :data:`PIVOT` (normalised rows: ``G_ii = 1``);
* strict complementarity, clear of the KKT tolerances by the factor :data:`SEPARATION`: every face
  row's normalised multiplier (``λ_i ||row_i||``, bounds ``|λ|``) is above ``SEPARATION tol σ``,
  ``σ = 1 + max|x| + max|y|`` (the degeneracy report calls a row weakly active at ``tol σ``), and every
  other row's slack above ``SEPARATION`` times its feasibility tolerance ``tol (|rhs| + ||row||_1 max|y|)``
  (:func:`polyproj.projection.polish._row_tol`; the polish counts a row at zero slack as active at a
  tolerance never looser, at the size of the row's own terms) and above the rounding of ``y``,
  ``REFINE_ROUNDINGS eps ||row||_1 max(|y|, |x − y|)`` (where ``y`` vanishes, a vertex through the origin,
  ``row_tol`` alone calls a rounding-level slack clear);
* KKT to the polish's tolerance ``tol``: the face's rows and the equalities hold, every row is feasible
  (to that tolerance), and the stationarity
  residual ``y − x + Aᵀλ_A + Bᵀμ − λ_lb + λ_ub`` is at most ``tol σ``.

Then the active set is unique (the rows at zero slack are exactly the face's, each with a clearly
positive multiplier), ``y`` is the exact projection and the HS-Jacobian is ``J g = f⊙g − f⊙Mᵀr`` with
``r = s ⊙ G⁻¹ (s ⊙ M(f⊙g))`` on that face, the product the pipeline's backward computes there; ``G``
is kept for it (:class:`DirectFace`). The whole batch is one set of array operations: every point's
face padded to the batch's largest (zero rows, the identity in ``G``), then one Cholesky
factorisation and its solves a point. These points are never reported weakly active, and
the polish's final active set at them is the same face. Every other point
— a weakly active row, a row at zero slack outside the face, an ill-conditioned or dependent face, a
coordinate at both bounds, DAQP not optimal — goes to the pipeline (:func:`polyproj.projection.pipeline.run`)
unchanged, with its warm start where one was given.

A warm start (a previous step's active sets, in training) is tried before DAQP: each point's guessed
working set goes through the same face solve and the same verification, and only the points whose
guess is not verified are solved by DAQP. A verified guess is the unique active set, so the answer and
the backward are those of the cold path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.linalg.lapack import dpotrs

from .. import linalg
from ..polydata import PolyData
from ..solution import Status
from .faces import REFINE_ROUNDINGS, REFINE_STEPS, NamespaceState, off_rounding
from .pipeline import PipelineOutput
from .polish import FaceRecord, can_bind

__all__ = ["DIRECT_BATCH", "PIVOT", "SEPARATION", "DirectData", "DirectFace", "project_direct"]

#: NumPy batches of at most this many points may take the direct path first (under ``"auto"`` at most
#: :func:`polyproj.backends.defaults.direct_points` of dimension n; 0 switches the path off)
DIRECT_BATCH = 1024
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

    arrays: tuple[np.ndarray, ...]  # (H, [A; B] with unit rows, upper, lower, sense): the backend's own layout
    row_norms: np.ndarray  # (m + p) the norms the rows of arrays were divided by (DAQP.projection_arrays)
    C: np.ndarray  # (m + p + 1, n) the rows [A; B] as given, then a zero row (a face's padding rows index it)
    C_abs: np.ndarray  # (m + p + 1, n) |C|: |M_i| |y| of every row by one product (the refinement's test)
    rhs: np.ndarray  # (m + 2n) right-hand sides [a, −lb, ub], 0 where infinite
    fin: np.ndarray  # (m + 2n) rows that can bind (:func:`~polyproj.projection.polish.can_bind`)
    rn1: np.ndarray  # (m + 2n) 1-norms of the inequality rows
    rn2: np.ndarray  # (m + 2n) 2-norms (1 for zero rows)
    bn1: np.ndarray  # (p,) 1-norms of the equality rows
    c: np.ndarray  # (m + p + 1) right-hand sides of the rows of C (0 where infinite, 0 on the zero row)
    eq_rows: np.ndarray  # indices m, ..., m + p - 1 of B's rows in C
    lb: np.ndarray
    ub: np.ndarray

    @classmethod
    def of(cls, d: PolyData, solver: Any) -> DirectData:
        """The arrays of shared NumPy data ``d`` for the DAQP backend ``solver``."""
        n, m, p = d.n, d.m, d.p
        A, a, B, b, lb, ub = (np.asarray(v, dtype=np.float64) for v in d.parts())
        arrays, norms = solver.projection_arrays(A, a, B, b, lb, ub)
        rhs = np.concatenate([a, -lb, ub])
        ones = np.ones(2 * n)
        rn1 = np.concatenate([np.abs(A).sum(axis=1), ones])
        fin = can_bind(np, rhs, rn1)  # the polish's rule: a zero row every point satisfies is never at its bound
        rn2 = np.concatenate([norms[:m], ones])  # 1 for zero rows, as in projection_arrays
        c = np.concatenate([a, b, [0.0]])
        C = np.vstack([A, B, np.zeros((1, n))])
        return cls(arrays, norms, C, np.abs(C), np.where(fin, rhs, 0.0), fin,
                   rn1, rn2, np.abs(B).sum(axis=1),
                   np.where(np.isfinite(c), c, 0.0),
                   np.arange(m, m + p, dtype=np.intp), lb, ub)


@dataclass(frozen=True)
class DirectRows(NamespaceState):
    """What :func:`~polyproj.projection.faces.expand_rows` reads: the compact row layout of a face batch."""

    xp: Any
    k: int  # active A rows per sample, padded
    m: int
    p: int
    order: np.ndarray  # (b, m): active rows first


@dataclass(frozen=True)
class _Faces:
    """The faces of a batch of points, padded to one size (module docstring; padding rows are zero).

    Row layout per point: its active rows of A (in increasing order) padded to ``ka`` rows, then the
    ``p`` rows of B. ``L`` is the lower Cholesky factor of the normalised Gram matrix G, which has the
    identity on the padding rows.
    """

    M: np.ndarray  # (b, ka + p, n) the face's rows
    free: np.ndarray  # (b, n) 0/1 float
    s: np.ndarray  # (b, ka + p) 1/||row_F|| (1 on padding)
    L: np.ndarray  # (b, ka + p, ka + p)
    ka: int
    batched: bool = False  # solved by polyproj.linalg as a batch (linalg.batched_solves)

    def take(self, idx: np.ndarray) -> _Faces:
        """The faces of the points ``idx``."""
        return _Faces(self.M[idx], self.free[idx], self.s[idx], self.L[idx], self.ka,
                      linalg.batched_solves(len(idx), self.L.shape[1]))

    def dot(self, v: np.ndarray) -> np.ndarray:
        """``M v`` per point, (b, ka + p) for v (b, n)."""
        return np.einsum("bkn,bn->bk", self.M, v)

    def t_dot(self, r: np.ndarray) -> np.ndarray:
        """``Mᵀ r`` per point, (b, n) for r (b, ka + p)."""
        return np.einsum("bk,bkn->bn", r, self.M)

    def solve(self, R: np.ndarray) -> np.ndarray:
        """``s ⊙ G⁻¹ (s ⊙ R)`` for R (b, ka + p).

        Batched (:mod:`polyproj.linalg`) or one LAPACK call a point (:func:`polyproj.linalg.batched_solves`).
        """
        out = self.s * R
        if self.batched:
            out = linalg.cho_solve(np, self.L, out)
        elif R.shape[1]:
            for i in range(R.shape[0]):
                out[i] = dpotrs(self.L[i], out[i], lower=1)[0]
        return self.s * out


class DirectFace:
    """The faces of the points the direct path took, with the interface the backward uses (``vjp``, ``rows``)."""

    def __init__(self, faces: _Faces, rows: DirectRows) -> None:
        self.faces, self.rows = faces, rows

    def vjp(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(J g, r, Mᵀr)`` per point: ``r = s ⊙ G⁻¹ (s ⊙ M(f⊙g))`` in the compact layout of :attr:`rows`."""
        F = self.faces
        fg = F.free * g
        r = F.solve(F.dot(fg))
        Mr = F.t_dot(r)
        return fg - F.free * Mr, np.concatenate([r[:, : self.rows.k], r[:, F.ka:]], axis=1), Mr


def _faces(X: np.ndarray, d: PolyData, dd: DirectData, W: np.ndarray) -> tuple[np.ndarray, ...]:
    """The exact projections of the points ``X`` (b, n) onto the working sets ``W``, as one batch (module docstring).

    ``W`` (b, m + 2n) bool, numbered as the pipeline's rows: rows of A, lower bounds, upper bounds.

    Returns ``(Y, λ_c, Mᵀλ_c, ok, faces, order)``: ``λ_c`` (b, ka + p) the multipliers of the face's rows
    (active rows of A padded to ``ka``, then B), ``ok`` False where the face is not well posed (a row without
    free support, a small pivot), ``order`` (b, m) the rows of A with the active ones first.
    """
    b, n, m = X.shape[0], d.n, d.m
    p = dd.eq_rows.size
    act, lo, up = W[:, :m], W[:, m: m + n], W[:, m + n:]
    count = act.sum(axis=1)
    ka = int(count.max(initial=0))
    k = ka + p
    order = np.argsort(~act, axis=1, kind="stable")
    padded = bool((count < ka).any())
    valid = np.ones((b, k), dtype=bool)
    if padded:
        valid[:, :ka] = np.arange(ka) < count[:, None]
    rows = np.empty((b, k), dtype=np.intp)
    rows[:, :ka], rows[:, ka:] = order[:, :ka], dd.eq_rows
    if padded:
        rows[:, :ka][~valid[:, :ka]] = m + p  # the zero row
    free = (~(up | lo)).astype(np.float64)
    z = np.where(up, dd.ub, np.where(lo, dd.lb, X))
    M, c = dd.C[rows], dd.c[rows]
    Mf = M * free[:, None, :]
    nrm = np.sqrt(np.einsum("bkn,bkn->bk", Mf, Mf))
    zero = valid & ~(nrm > 0)  # a row whose support is fixed: dependent on the bounds
    ok = ~zero.any(axis=1)
    s = 1.0 / np.where(valid & ~zero, nrm, 1.0)
    Mn = Mf * s[..., None]
    G = Mn @ np.swapaxes(Mn, 1, 2)
    if padded:
        diag = np.arange(k)
        G[:, diag, diag] += ~valid
    L, batched = _factor(G, ok)
    faces = _Faces(M, free, s, L, ka, batched)
    lam_c = faces.solve(faces.dot(z) - c)
    Mt = faces.t_dot(lam_c)
    Y = z - Mt * free
    # up to REFINE_STEPS refinement steps where the face's equations miss rounding (faces.off_rounding, as in
    # the polish)
    idx, part = None, faces  # the points still refined (None: all)
    for step in range(REFINE_STEPS + 1):
        Yp, cp, rp = (Y, c, rows) if idx is None else (Y[idx], c[idx], rows[idx])
        resid = part.dot(Yp) - cp
        terms = np.take_along_axis(np.abs(Yp) @ dd.C_abs.T, rp, axis=1) + np.abs(cp)  # |M_i| |y| + |c_i|
        off = np.flatnonzero(off_rounding(np, resid, terms))
        if not off.size:
            break
        idx = off if idx is None else idx[off]
        if step == REFINE_STEPS:  # still off rounding (cond(G) eps near 1): left to the pipeline's polish
            ok[idx] = False
            break
        part = faces.take(idx)
        dlam = part.solve(resid[off])
        dMt = part.t_dot(dlam)
        lam_c[idx] += dlam
        Mt[idx] += dMt
        Y[idx] -= dMt * part.free
    return Y, lam_c, Mt, ok, faces, order


def _factor(G: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, bool]:
    """The lower Cholesky factors of the Gram matrices ``G`` (b, k, k), and whether they are solved as a batch.

    A point whose matrix is not positive definite, has a pivot below :data:`PIVOT`, or is not ``ok`` on entry
    gets ``ok`` False (in place) and the identity as its factor.
    """
    b, k = G.shape[0], G.shape[1]
    if not k:
        return G, False
    eye = np.eye(k)
    G[~ok] = eye
    L, pd = linalg.cholesky(np, G)  # LAPACK per matrix for a few, NumPy's batched Cholesky for more
    ok &= pd & (np.diagonal(L, axis1=1, axis2=2).min(axis=1) >= PIVOT)
    L[~ok] = eye
    return L, linalg.batched_solves(b, k)


def _verified(X, Y, d: PolyData, dd: DirectData, mult, mu, active, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """(b,) strict complementarity and the KKT conditions at ``Y`` (module docstring), for the whole batch.

    The face's own equations are among these tests: its rows of A at zero slack, B by the equality test,
    its bounds exact by construction. Also returns the violation of each ``Y`` (b,), as
    :meth:`~polyproj.polydata.PolyData.violation` defines it, from the same slacks.
    """
    A, a, B, b, lb, ub = d.parts()
    m, n = d.m, d.n
    sy = np.abs(Y).max(axis=1, keepdims=True)
    sig = 1.0 + np.abs(X).max(axis=1, keepdims=True) + sy
    slack = np.concatenate([a - Y @ A.T, Y - lb, ub - Y], axis=1)
    row_tol = tol * (np.abs(dd.rhs) + dd.rn1 * sy)
    bad = active & (~dd.fin | (np.abs(slack) > row_tol) | (mult * dd.rn2 <= SEPARATION * tol * sig))
    # another row at (or near) its hyperplane. Its slack is told from zero only beyond the rounding of y: the face
    # point y = z − (Mᵀλ)_F carries an error ~eps ||row||_1 max(|y|, |x − y|) (the polish's rounding floor,
    # polish._violation_tol), which row_tol (∝ |y|) does not cover where y vanishes (a vertex through the origin:
    # a weakly active row left off the working set has a rounding-level slack there)
    rounding = REFINE_ROUNDINGS * np.finfo(np.float64).eps * dd.rn1 * np.maximum(sy, np.abs(X - Y).max(
        axis=1, keepdims=True))
    bad |= ~active & dd.fin & (slack <= SEPARATION * np.maximum(row_tol, rounding))
    finite = np.isfinite(Y).all(axis=1)
    ok = ~bad.any(axis=1) & finite
    viol = np.maximum(-slack.min(axis=1, initial=0.0), 0.0)
    stat = Y - X + mult[:, :m] @ A - mult[:, m: m + n] + mult[:, m + n:]
    if d.p:
        stat += mu @ B
        eq = np.abs(Y @ B.T - b)
        ok &= (eq <= tol * (np.abs(b) + dd.bn1 * sy)).all(axis=1)
        viol = np.maximum(viol, eq.max(axis=1))
    return ok & (np.abs(stat).max(axis=1) <= tol * sig[:, 0]), np.where(finite, viol, np.inf)


@dataclass
class _Taken:
    """The points the direct path took from one set of working sets (batch numbering, pipeline rows)."""

    Y: np.ndarray
    mult: np.ndarray  # (N, m + 2n)
    mu: np.ndarray  # (N, p)
    active: np.ndarray  # (N, m + 2n) bool
    polished: np.ndarray  # (N,) bool: taken
    z_box: np.ndarray  # (N, n) signed bound multipliers (upper positive), DAQP's layout
    record: FaceRecord | None
    viol: np.ndarray  # (N,) the violation of each Y


def _take(X: np.ndarray, d: PolyData, dd: DirectData, W: np.ndarray, idx: np.ndarray, tol: float,
          record: bool) -> _Taken:
    """The exact faces of the points ``idx`` on their working sets ``W`` (N, m + 2n) bool, pipeline numbering.

    The points verified (:func:`_verified`) are taken.
    """
    N, n, m, p = X.shape[0], d.n, d.m, d.p
    Y, mult = np.zeros((N, n)), np.zeros((N, m + 2 * n))
    mu, active, z_box = np.zeros((N, p)), np.zeros((N, m + 2 * n), dtype=bool), np.zeros((N, n))
    polished = np.zeros(N, dtype=bool)
    if idx.size:
        Wi = W[idx]
        Yi, lam_c, Mt, ok, faces, order = _faces(X[idx], d, dd, Wi)
        ka = faces.ka
        lo, up = Wi[:, m: m + n], Wi[:, m + n:]
        zb = (X[idx] - Yi - Mt) * (1.0 - faces.free)  # stationarity on the fixed coordinates
        multA = np.zeros((idx.size, m))
        multA[np.arange(idx.size)[:, None], order[:, :ka]] = lam_c[:, :ka]  # padding rows: inactive ones, 0
        Y[idx] = Yi
        mult[idx] = np.concatenate([multA, -zb * lo, zb * up], axis=1)
        mu[idx] = lam_c[:, ka:]
        z_box[idx] = zb
        active[idx] = Wi
        polished[idx] = ok
        bad = idx[~ok]
        Y[bad], mult[bad], mu[bad], active[bad], z_box[bad] = 0.0, 0.0, 0.0, False, 0.0
    verified, viol = _verified(X, Y, d, dd, mult, mu, active, tol)
    polished &= verified
    taken = np.flatnonzero(polished)
    rec = None
    if record and taken.size:
        pos = np.searchsorted(idx, taken)  # taken ⊂ idx, both sorted
        k = int(active[taken, :m].sum(axis=1).max()) if m else 0
        face = DirectFace(faces.take(pos), DirectRows(np, k, m, p, order[pos]))
        rec = FaceRecord(None if taken.size == N else taken, np.ones(taken.size, dtype=bool), face)
    return _Taken(Y, mult, mu, active, polished, z_box, rec, viol)


def project_direct(X: np.ndarray, d: PolyData, dd: DirectData, solver: Any, tol: float, record: bool,
                   fallback: Any, warm: np.ndarray | None = None) -> PipelineOutput | None:
    """The direct path on a NumPy batch (float64, shared data; see the module docstring).

    ``solver``: the DAQP backend (its settings); ``fallback(idx, solved, warm)`` projects the samples ``idx``
    the path does not take through the pipeline — ``solved`` their DAQP solutions (a start it may reuse) or
    None, ``warm`` their guessed active sets or None — and returns its
    :class:`~polyproj.projection.pipeline.PipelineOutput` (or None to send the whole batch there).
    ``warm`` (N, m + 2n) bool: guessed active sets (a previous step's). Each point's guess is tried first,
    the exact face on it verified as DAQP's would be; the points it does not give go the cold way (DAQP,
    then ``fallback``). Returns None when no sample is taken.
    """
    from ..backends.projection import ProjectionStart, start_from_solution
    from ..solution import BatchSolution
    from .pipeline import _merge

    N, m = X.shape[0], d.m
    if warm is not None:
        t0 = time.perf_counter()
        got = _take(X, d, dd, warm, np.arange(N), tol, record)
        if not got.polished.any():
            return project_direct(X, d, dd, solver, tol, record,
                                  lambda idx, solved, _: fallback(idx, solved, warm[idx]))
        rest = np.flatnonzero(~got.polished)
        sub = None
        if rest.size:
            part = warm[rest]
            sub = project_direct(X[rest], d, dd, solver, tol, record,
                                 lambda idx, solved, _: fallback(rest[idx], solved, part[idx]))
            if sub is None:
                sub = fallback(rest, None, part)
            if sub is None:
                return None
        # the guessed faces are these points' solutions; the others' are those of the way they went (a start
        # without a backend record, the ADMM's, leaves them NaN with their statuses)
        sol = BatchSolution(x=np.where(got.polished[:, None], got.Y, np.nan),
                            z=np.concatenate([got.mult[:, :m], got.mu], axis=1), z_box=got.z_box,
                            status=(Status.SOLVED,) * N, iterations=np.zeros(N, dtype=np.int64),
                            solve_time=time.perf_counter() - t0, backend=solver.name)
        if sub is not None:
            other = sub.start.solution
            sol = sol.put(rest, other if other is not None else replace(sol.take(rest), status=sub.status))
        start = start_from_solution(sol, X, m, float(solver.settings.get("eps_abs", 1e-8)))
        out = PipelineOutput(got.Y, got.active, got.mult, got.mu, (Status.SOLVED,) * N,
                             got.polished, solver.name, [got.record] if got.record is not None else [], start,
                             got.viol, nondegenerate=True)  # every point verified (_merge drops both otherwise)
        return out if sub is None else _merge(np, out, rest, sub)
    sol, flags = solver.solve_points(X, dd.arrays, dd.row_norms)
    status = sol.status
    # optimal (not DAQP's soft optimum), with a finite answer (solve_points makes a non-finite one NaN)
    idx = np.flatnonzero((flags == 1) & np.isfinite(sol.x).all(axis=1))
    # DAQP's working set: rows of A with a positive multiplier, bounds with a signed one (upper positive)
    W = np.concatenate([sol.z[:, :m] > 0, sol.z_box < 0, sol.z_box > 0], axis=1)
    got = _take(X, d, dd, W, idx, tol, record)
    taken = np.flatnonzero(got.polished)
    if not taken.size:
        return None
    every = taken.size == N  # every point verified: their violations and their degeneracy report (none) are known
    accuracy = float(solver.settings.get("eps_abs", 1e-8))
    # the start is read again only where some points go on to the pipeline (_merge); with every point verified
    # it is their exact answer, and its solution what DAQP returned
    start = ProjectionStart(got.Y, got.mult, got.mu, tuple(status), accuracy, solution=sol) if every else \
        start_from_solution(sol, X, m, accuracy)
    out = PipelineOutput(got.Y, got.active, got.mult, got.mu, tuple(Status.SOLVED if t else st for t, st in
                                                                    zip(got.polished, status, strict=True)),
                         got.polished, solver.name, [got.record] if got.record is not None else [], start,
                         got.viol if every else None, nondegenerate=every)
    if every:
        return out
    rest = np.flatnonzero(~got.polished)
    sub = fallback(rest, sol.take(rest), None)
    return None if sub is None else _merge(np, out, rest, sub)
