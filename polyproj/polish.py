"""Exact active-set polish of a projection onto a polyhedron, written against the array API.

Given a (possibly inaccurate) projection ``Y0`` of ``X`` onto

    P = {y : A y <= a,  B y = b,  lb <= y <= ub}

and the backend's multipliers, :func:`polish` identifies candidate active rows from *both* the
slacks and the multipliers (DESIGN §5), solves the equality-constrained projection onto that face
exactly,

    y* = x − M_Fᵀ (M_F M_Fᵀ)⁺ (M x − c),     M = [A_I; B],  fixed coordinates at their bounds,

and accepts it when it is feasible and its inequality multipliers are non-negative (the KKT
conditions of the projection). Otherwise it changes the face by one row per sample (add the most
violated row, else drop the most negative multiplier: a primal active-set step) and repeats.

Everything here takes arrays of one array-API namespace (NumPy, PyTorch on CPU or CUDA,
``array_api_strict``); constraint data may be shared, ``A (m, n)``, or per sample,
``A (batch, m, n)`` (likewise ``a, B, b, lb, ub``). Inequality rows use the *full* layout: the
``m`` rows of ``A``, then one ``-y_i <= -lb_i`` row for every coordinate, then one ``y_i <= ub_i``
row for every coordinate (rows with an infinite right-hand side are never active), so shapes never
depend on the data. :func:`polyproj.project` maps this layout to the Polyhedron numbering.

The face factorisation :func:`factor_face` is a Cholesky factorisation of the Gram matrix of the
row-normalised active rows, ``G = M_n M_nᵀ = L Lᵀ`` (``O(k³)`` batched, ~40x faster than an SVD
on CPU), with ``V = L⁻¹ M_n`` an orthonormal basis of ``range(M_nᵀ)``; samples whose Gram matrix
is singular or ill-conditioned (dependent active rows: LICQ fails) fall back to the
rank-revealing SVD of :func:`polyproj.hs_jacobian.factor_active`. Both produce an
:class:`~polyproj.hs_jacobian.ActiveFactor` on which the HS-Jacobian operators (``null_apply``,
``pinv_apply``, ``pinv_t_apply``, ``gram_pinv_apply``) are exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_compat import array_namespace, is_torch_namespace
from array_api_compat import device as _device

from .hs_jacobian import ActiveFactor, ActiveRows, expand_rows, gather_active_rows, svd_factor
from .linalg import cho_solve, cholesky, tri_inv

__all__ = ["factor_face", "ineq_slack", "polish"]


def _eps(xp, dtype) -> float:
    return float(np.finfo(np.float32 if dtype == xp.float32 else np.float64).eps)



def gram_cholesky(xp, R: ActiveRows, eps: float):
    """Cholesky of the face Gram matrices ``M_n M_nᵀ`` of the rows ``R`` (padding rows get a unit pivot).

    Returns ``(L, ok)``; ``ok`` accepts well-conditioned faces only (min pivot >= eps^(1/4), which
    keeps ``L⁻¹M_n`` orthonormal to ~eps^(3/4)), and ``L`` is the identity where it is False.
    Used for padded faces up to 2n rows: padding rows get unit pivots, so only the samples whose
    own face is singular (more than n or dependent active rows) fail and take the SVD.
    """
    pos = R.scale > 0
    kk = pos.shape[1]
    dtype = R.scale.dtype
    eye = xp.eye(kk, dtype=dtype, device=_device(R.scale))
    pad = 1.0 - xp.astype(pos, dtype)  # zero rows (padding, or fully fixed support)
    G = R.gram()
    if is_torch_namespace(xp):  # in place on our own product: no (b, k, k) temporaries
        G.diagonal(dim1=1, dim2=2).add_(pad)
    elif isinstance(G, np.ndarray) and G.flags.c_contiguous:
        G.reshape(G.shape[0], kk * kk)[:, :: kk + 1] += pad
    else:
        G = G + eye[None, :, :] * pad[:, :, None]
    L, ok = cholesky(xp, G)
    diag = xp.linalg.diagonal(L)
    ok = ok & xp.all(xp.where(pos, diag, xp.ones_like(diag)) >= eps ** 0.25, axis=1)
    if bool(xp.all(ok)):
        return L, ok
    return xp.where(ok[:, None, None], L, xp.broadcast_to(eye, L.shape)), ok


def _scatter(xp, full, mask, part):
    """Write ``part`` (one row per True entry of ``mask``) into ``full`` at the True rows."""
    if part.shape[0] == 0:
        return full
    m = xp.reshape(mask, (-1,) + (1,) * (full.ndim - 1))
    if is_torch_namespace(xp):  # one kernel: the True rows take part's rows in order
        return full.masked_scatter(m, part.to(full.dtype))
    pos = xp.cumulative_sum(xp.astype(mask, xp.int64)) - 1
    pos = xp.where(pos > 0, pos, xp.zeros_like(pos))
    gathered = xp.take(part, pos, axis=0)
    return xp.where(m, gathered, full)


def _rows(xp, M, mask, ndim_batched: int):
    """Rows of per-sample data selected by a batch mask; shared data unchanged."""
    return M[mask] if M.ndim == ndim_batched else M





def factor_face(A, B, active, free, *, method: str = "auto") -> ActiveFactor:
    """Factor the active rows of a batch (Cholesky of the Gram matrix, SVD where it is singular).

    Parameters
    ----------
    A : (m, n) or (b, m, n) array
    B : (p, n) or (b, p, n) array or None
    active : (b, m) bool array
        Active rows of A.
    free : (b, n) 0/1 array
        Coordinates not fixed by an active bound.
    method : {"auto", "svd"}
        ``"svd"`` forces the rank-revealing SVD for every sample.

    Returns
    -------
    ActiveFactor
        With ``Vh`` an orthonormal basis of the row space of ``M_n`` (rows normalised, columns
        masked) and ``U, s_inv`` such that ``M_n⁺ = Vhᵀ diag(s_inv) Uᵀ``; on the Cholesky path
        ``Vh = L⁻¹M_n``, ``U = L⁻ᵀ``, ``s_inv = 1``.
    """
    R = gather_active_rows(A, B, active, free)
    xp, dtype, dev = R.xp, A.dtype, _device(A)
    batch, n = free.shape
    rows, order, k, m, p, scale, Mn = R.rows, R.order, R.k, R.m, R.p, R.scale, R.Mn
    kk = k + p
    if kk == 0:
        z = xp.zeros((batch, 0), dtype=dtype, device=dev)
        return ActiveFactor(xp, free, xp.zeros((batch, 0, n), dtype=dtype, device=dev),
                            xp.zeros((batch, 0, 0), dtype=dtype, device=dev), z, scale, rows, order, k, m, p)
    eps = _eps(xp, dtype)
    if method == "auto" and kk <= 2 * n:  # Cholesky first; the SVD only where it fails (gram_cholesky)
        L, ok = gram_cholesky(xp, R, eps)
        Linv = tri_inv(xp, L)
        Vh = xp.matmul(Linv, Mn)
        U = xp.matrix_transpose(Linv)
        s_inv = xp.astype(xp.broadcast_to(ok[:, None], (batch, kk)), dtype)
        bad = ~ok
        if bool(xp.any(bad)):
            Ub, sb, Vhb = svd_factor(Mn[bad], n)
            r = sb.shape[1]
            if r < kk:
                Ub = xp.concat([Ub, xp.zeros((Ub.shape[0], kk, kk - r), dtype=dtype, device=dev)], axis=2)
                Vhb = xp.concat([Vhb, xp.zeros((Vhb.shape[0], kk - r, n), dtype=dtype, device=dev)], axis=1)
                sb = xp.concat([sb, xp.zeros((sb.shape[0], kk - r), dtype=dtype, device=dev)], axis=1)
            Vh = _scatter(xp, Vh, bad, Vhb)
            U = _scatter(xp, U, bad, Ub)
            s_inv = _scatter(xp, s_inv, bad, sb)
        return ActiveFactor(xp, free, Vh, U, s_inv, scale, rows, order, k, m, p)
    U, s_inv, Vh = svd_factor(Mn, n)
    return ActiveFactor(xp, free, Vh, U, s_inv, scale, rows, order, k, m, p)


# ----------------------------------------------------------------------------- helpers on the full layout
def _matvec(xp, M, Y):
    """``M y`` per sample: M (r, n) shared or (b, r, n); Y (b, n) -> (b, r)."""
    if M.ndim == 2:
        return xp.matmul(Y, xp.matrix_transpose(M))
    return xp.matmul(M, Y[:, :, None])[:, :, 0]


def ineq_slack(Y, A, a, lb, ub):
    """Slack of every full-layout inequality row: ``[a − A y, y − lb, ub − y]`` (b, m + 2n)."""
    xp = array_namespace(Y, A)
    return xp.concat([a - _matvec(xp, A, Y), Y - lb, ub - Y], axis=1)


def _rmax(xp, v):
    """Row-wise max of |v| (0 for empty rows), keepdims."""
    if v.shape[1] == 0:
        return xp.zeros((v.shape[0], 1), dtype=v.dtype, device=_device(v))
    return xp.max(xp.abs(v), axis=1, keepdims=True)




def _face_step(xp, R, free, resid, n: int, method: str = "auto"):
    """Multipliers and step of the projection onto the face of the gathered rows ``R``.

    With ``M_n`` the row-normalised, column-masked rows and ``r_n = scale · resid``, returns the
    compact multipliers ``λ = scale · (M_n M_nᵀ)⁺ r_n`` (b, k+p) and the step ``M_n⁺ r_n`` (b, n), so
    that ``y = z − step`` for ``resid = M z − c``. Well-conditioned faces (the criterion of
    :func:`factor_face`) use the Cholesky factor of the Gram matrix and two triangular solves;
    the others fall back to the rank-revealing SVD of :func:`~polyproj.hs_jacobian.svd_factor`.
    """
    scale = R.scale
    batch, kk = scale.shape
    dtype, dev = scale.dtype, _device(scale)
    if kk == 0:
        z = xp.zeros((batch, n), dtype=dtype, device=dev)
        return xp.zeros((batch, 0), dtype=dtype, device=dev), z, z, None, xp.ones((batch,), dtype=xp.bool, device=dev)
    rn = resid * scale
    L = None
    if method == "auto" and kk <= 2 * n:  # Cholesky first; the SVD only where it fails (gram_cholesky)
        L, ok = gram_cholesky(xp, R, _eps(xp, dtype))
        lam = cho_solve(xp, L, rn) * scale  # two triangular solves with vectors; L⁻¹ is never formed
        Mt = R.tdot(lam)  # Mᵀλ on all columns
        step = Mt * free  # M_nᵀ (M_n M_nᵀ)⁻¹ r_n
        bad = ~ok
        if not bool(xp.any(bad)):
            return lam, step, Mt, L, ok
    else:
        bad = xp.ones((batch,), dtype=xp.bool, device=dev)
        ok = ~bad
    Ub, sb, Vhb = svd_factor(R.Mn[bad], n)
    rb = rn[bad]
    u = xp.sum(Ub * rb[:, :, None], axis=1) * sb  # Σ⁻¹ Uᵀ r_n
    step_b = xp.sum(Vhb * u[:, :, None], axis=1)
    lam_b = xp.sum(Ub * (u * sb)[:, None, :], axis=-1) * scale[bad]
    if bool(xp.all(bad)):
        lam, step = lam_b, step_b
    else:
        lam, step = _scatter(xp, lam, bad, lam_b), _scatter(xp, step, bad, step_b)
    return lam, step, R.tdot(lam), L, ok


def _face_rhs(xp, A, a, b, sA, R):
    """Right-hand sides (b, k+p) of the gathered rows: :func:`~polyproj.hs_jacobian.compact_rhs`.

    A gathered row is real (keeps its right-hand side) when it is an active row of A with a
    non-zero entry; padding rows get 0. Decided on the (m,) rows of A, not the (b, k, n) gather.
    """
    batch, k = R.scale.shape[0], R.k
    parts = []
    if R.m:
        idx = R.order[:, :k]
        a0 = xp.where(xp.isfinite(a), a, xp.zeros_like(a))
        a_k = xp.take_along_axis(xp.broadcast_to(a0, (batch, R.m)), idx, axis=1)
        real = sA & xp.broadcast_to(xp.any(A != 0, axis=-1), (batch, R.m))
        parts.append(xp.where(xp.take_along_axis(real, idx, axis=1), a_k, xp.zeros_like(a_k)))
    if R.p:
        parts.append(xp.broadcast_to(b, (batch, R.p)))
    if not parts:
        return xp.zeros((batch, 0), dtype=R.scale.dtype, device=_device(R.scale))
    return xp.concat(parts, axis=1)


def face_solve(X, A, a, B, b, lb, ub, S, *, method: str = "auto", return_factor: bool = False):
    """Exact projection of X onto the face given by the candidate set S (b, m + 2n).

    Returns ``Y``, full-layout inequality multipliers (b, m + 2n), equality multipliers (b, p) and
    the consistency residual ``max|M y − c|`` (b,), with ``Y − X + Aᵀλ_A − λ_lb + λ_ub + Bᵀμ = 0``.
    The arithmetic is that of :func:`factor_face` followed by
    :func:`~polyproj.hs_jacobian.project_on_face`, without forming the factor's matrices: only
    matrix–vector products and one Cholesky factorisation per sample (``method="svd"`` forces the
    SVD). ``return_factor=True`` also returns the :class:`FaceFactor` (for a backward pass on the
    same face).
    """
    xp = array_namespace(X, A)
    dtype = X.dtype
    n = X.shape[1]
    m = A.shape[-2]
    sA, s_lb, s_ub = S[:, :m], S[:, m: m + n], S[:, m + n:]
    at_ub = xp.astype(s_ub, dtype)
    # a coordinate listed at both bounds (lb == ub) is fixed once, at the upper bound value
    at_lb = xp.astype(s_lb, dtype) * (1.0 - at_ub)
    fixed = at_lb + at_ub
    free = 1.0 - fixed
    lbf = xp.where(xp.isfinite(lb), lb, xp.zeros_like(lb))
    ubf = xp.where(xp.isfinite(ub), ub, xp.zeros_like(ub))
    fixed_val = xp.where(at_ub > 0, ubf, lbf)
    R = gather_active_rows(A, B, sA, free)
    c = _face_rhs(xp, A, a, b, sA, R)
    Z = free * X + fixed * fixed_val  # x with the fixed coordinates at their bounds
    lam_c, step, Mt_lam, L, ok = _face_step(xp, R, free, R.dot(Z) - c, n, method)
    Y = Z - step
    cons = R.dot(Y) - c
    lamA, mu = expand_rows(R, lam_c)
    z_box = (X - Y - Mt_lam) * fixed  # stationarity on the fixed coordinates
    mult = xp.concat([lamA, -z_box * at_lb, z_box * at_ub], axis=1)
    if return_factor:
        return Y, mult, mu, _rmax(xp, cons)[:, 0], FaceFactor(R, L, ok, free)
    return Y, mult, mu, _rmax(xp, cons)[:, 0]


@dataclass(frozen=True)
class FaceFactor:
    """A face solved by :func:`face_solve`: gathered rows and Cholesky factor of their Gram matrix.

    ``L`` is None (or ``ok`` False for a sample) where the face took the SVD.
    """

    R: Any  # ActiveRows
    L: Any  # (b, k+p, k+p) or None
    ok: Any  # (b,) bool: L holds the sample's factor
    free: Any  # (b, n) 0/1


@dataclass
class FaceRecord:
    """The faces of one polish round.

    ``idx``: batch indices of the round's rows (None: all of them); ``use``: the round's rows whose
    final active set is that face and whose factor is a Cholesky factor.
    """

    idx: Any
    use: Any
    factor: FaceFactor


def _face_record(xp, idx, use, fac: FaceFactor) -> FaceRecord:
    """A round's faces for the samples that end there.

    Kept whole when at least half of the round's rows end there (no copy: the headline layer call
    took 3-5 ms longer copying round 1's 82 of 128); otherwise only those rows are kept, so that all
    records together hold at most two faces a sample (n 500, batch 128 and 20 rounds: the whole
    rounds took 5 GB).
    """
    if 2 * int(xp.sum(xp.astype(use, xp.int64))) >= use.shape[0]:
        return FaceRecord(idx, use, fac)
    keep = xp.nonzero(use)[0]

    def t(v):
        return xp.take(v, keep, axis=0)

    sub = FaceFactor(fac.R.take(keep), t(fac.L), t(fac.ok), t(fac.free))
    rows = keep if idx is None else xp.take(idx, keep, axis=0)
    return FaceRecord(rows, xp.ones(keep.shape, dtype=xp.bool, device=_device(keep)), sub)


def polish(X, A, a, B, b, lb, ub, Y0, mult0, *, cand_tol: float, dist_tol: float, tol: float,
           max_iter: int, block_iter: int = 0, faces: list | None = None) -> tuple[Any, Any, Any, Any, Any]:
    """Primal–dual active-set polish of a batch of projections.

    Parameters
    ----------
    X : (batch, n) array
        Points to project.
    A, a : (m, n), (m,) or per sample (batch, m, n), (batch, m)
        Inequality rows (``a`` may hold ``+inf``: row ignored).
    B, b : (p, n), (p,) or per sample; ``p`` may be 0
    lb, ub : (n,) or (batch, n)
        Bounds (``±inf`` allowed).
    Y0 : (batch, n)
        The backend's projection (rows with NaN start from X).
    mult0 : (batch, m + 2n)
        The backend's full-layout inequality multipliers (NaN-free).
    cand_tol, dist_tol : float
        Candidate thresholds: multiplier above ``cand_tol`` (relative), or distance to the row's
        hyperplane below ``dist_tol`` (relative).
    tol : float
        Tolerance of the KKT checks.
    max_iter : int
        Active-set corrections allowed.
    block_iter : int
        The first ``block_iter`` corrections change every wrong row at once (add all violated rows,
        drop all rows with a negative multiplier: a primal–dual active-set step, fast from a rough
        start such as a few ADMM iterations); later ones change one row: drop the most negative
        multiplier, else add the most violated row (an inconsistent face first drops its candidate
        least supported by ``Y0`` / ``mult0``).
    faces : list, optional
        When given, receives a :class:`FaceRecord` per round: the faces (with their Cholesky
        factors) on which samples were accepted, for the samples whose final active set is exactly
        that face (a backward pass can reuse them instead of factoring again).

    Returns
    -------
    Y : (batch, n); active : (batch, m + 2n) bool; mult : (batch, m + 2n) >= 0;
    mu : (batch, p); accepted : (batch,) bool.
    """
    xp = array_namespace(X, A)
    dtype, dev = X.dtype, _device(X)
    batch, n = X.shape
    m, p = A.shape[-2], B.shape[-2]
    bshape = (batch, m + 2 * n)
    rhs = xp.broadcast_to(xp.concat([xp.broadcast_to(a, (batch, m)), -xp.broadcast_to(lb, (batch, n)),
                                     xp.broadcast_to(ub, (batch, n))], axis=1), bshape)
    fin = xp.isfinite(rhs)
    ones = xp.ones((batch, 2 * n), dtype=dtype, device=dev)
    rn1 = xp.concat([xp.broadcast_to(xp.sum(xp.abs(A), axis=-1), (batch, m)), ones], axis=1)
    rn2 = xp.concat([xp.broadcast_to(xp.linalg.vector_norm(A, axis=-1), (batch, m)), ones], axis=1)
    rn2 = xp.where(rn2 > 0, rn2, xp.ones_like(rn2))
    good0 = xp.all(xp.isfinite(Y0), axis=1)
    Ystart = xp.where(good0[:, None], Y0, X)
    ynorm = _rmax(xp, Ystart)
    rscale = 1.0 + xp.abs(xp.where(fin, rhs, xp.zeros_like(rhs))) + rn1 * ynorm
    slack0 = ineq_slack(Ystart, A, a, lb, ub)
    mscale = 1.0 + _rmax(xp, mult0)
    # candidates: geometric distance to the row's hyperplane small, or multiplier clearly positive
    # (a weakly active row left out is harmless: it is re-added if the face point violates it,
    # and it enters the final active set by its zero slack)
    dist0 = slack0 / rn2
    backed = mult0 > cand_tol * mscale
    S = fin & ((dist0 <= dist_tol * (1.0 + ynorm)) | backed)
    # how little the backend supports a candidate (an inconsistent face drops the least supported):
    # multiplier not clearly positive first, then farthest from its hyperplane
    weak = xp.where(backed, xp.full_like(dist0, -1e30), dist0)
    Y = Ystart
    mult = xp.zeros(bshape, dtype=dtype, device=dev)
    mu = xp.zeros((batch, p), dtype=dtype, device=dev)
    accepted = xp.zeros((batch,), dtype=xp.bool, device=dev)
    todo = xp.ones((batch,), dtype=xp.bool, device=dev)
    forced = xp.zeros(bshape, dtype=xp.bool, device=dev)  # rows added because the face point violated them
    cols = xp.arange(m + 2 * n, device=dev)[None, :]
    bnorm = 1.0 + (float(xp.max(xp.abs(b))) if b.shape[-1] and batch else 0.0)
    for it in range(max_iter):
        if not bool(xp.any(todo)):
            break
        full = bool(xp.all(todo))
        mask = None if full else todo

        def sel(v, nd, mask=mask):
            return v if mask is None else _rows(xp, v, mask, nd)

        Xt, At, at, Bt, bt = sel(X, 2), sel(A, 3), sel(a, 2), sel(B, 3), sel(b, 2)
        lbt, ubt, St, fint = sel(lb, 2), sel(ub, 2), sel(S, 2), sel(fin, 2)
        if faces is None:
            Yt, mt, mut, cons = face_solve(Xt, At, at, Bt, bt, lbt, ubt, St)
        else:
            Yt, mt, mut, cons, fac = face_solve(Xt, At, at, Bt, bt, lbt, ubt, St, return_factor=True)
        slack = ineq_slack(Yt, At, at, lbt, ubt)
        feas_tol = tol * sel(rscale, 2)
        mtol = tol * (1.0 + _rmax(xp, mt))
        # rows to drop: negative multiplier, or left slack by an inconsistent (least-squares) face
        neg = St & ((mt < -mtol) | (slack > feas_tol))
        viol = (~St) & fint & (slack < -feas_tol)
        eq_ok = cons <= tol * (1.0 + _rmax(xp, Yt)[:, 0])
        if p:
            eq_ok = eq_ok & (_rmax(xp, _matvec(xp, Bt, Yt) - bt)[:, 0] <= tol * bnorm)
        done = ~xp.any(neg, axis=1) & ~xp.any(viol, axis=1) & eq_ok
        # next candidate set, one change per sample: drop the row with the most negative
        # multiplier if there is one, else add the most violated row (dual feasibility first, as
        # in a dual active-set method: a wrongly active row bends the face point and makes other
        # rows look violated; adding those first took 5 samples of 8 x 128 to the fallback, 3 this
        # way, and more rounds for the others).
        # An inconsistent face (the rows cannot all hold: a near-active row taken as a candidate
        # on top of a vertex) first drops the candidate farthest from active at the backend's
        # point: its least-squares multipliers and slacks do not say which row is wrong (taking
        # them cycles: drop a truly active row, re-add it as violated, drop it again)
        incons = cons > tol * (1.0 + _rmax(xp, Yt)[:, 0])
        has_v = xp.any(viol, axis=1) & ~incons
        has_n = xp.any(neg, axis=1) & ~incons
        dist = slack / sel(rn2, 2)
        inf = xp.full(dist.shape, xp.inf, dtype=dtype, device=dev)
        worst_v = xp.argmin(xp.where(viol, dist, inf), axis=1)
        worst_n = xp.argmin(xp.where(neg, xp.minimum(mt, -dist), inf), axis=1)
        ft = sel(forced, 2)
        if it < block_iter:
            add, drop = viol & ~incons[:, None], neg & ~has_v[:, None] & ~incons[:, None]  # primal–dual step
        else:
            add = (cols == worst_v[:, None]) & (has_v & ~has_n)[:, None]
            drop = (cols == worst_n[:, None]) & has_n[:, None]
        if bool(xp.any(incons)):  # drop the least-supported candidate, never a row added as violated
            droppable = St & fint & ~ft
            droppable = xp.where(xp.any(droppable, axis=1)[:, None], droppable, St & fint)
            worst_i = xp.argmax(xp.where(droppable, sel(weak, 2), -inf), axis=1)
            drop = drop | ((cols == worst_i[:, None]) & (incons & xp.any(droppable, axis=1))[:, None])
        Snew = xp.where(done[:, None], St, (St | add) & ~drop)
        if faces is not None and fac.L is not None and bool(xp.any(done & fac.ok)):
            faces.append(_face_record(xp, None if full else xp.nonzero(todo)[0], done & fac.ok, fac))
        if full:
            Y, mult, mu, S, accepted, forced = Yt, mt, mut, Snew, done, ft | add
            todo = ~done
        else:
            Y, mult = _scatter(xp, Y, todo, Yt), _scatter(xp, mult, todo, mt)
            mu, S = _scatter(xp, mu, todo, mut), _scatter(xp, S, todo, Snew)
            forced = _scatter(xp, forced, todo, ft | add)
            accepted = _scatter(xp, accepted, todo, done)
            todo = _scatter(xp, todo, todo, ~done)
    mult = xp.where(mult > 0, mult, xp.zeros_like(mult))
    slack = ineq_slack(Y, A, a, lb, ub)
    active = accepted[:, None] & (S | (fin & (xp.abs(slack) <= tol * rscale)))
    if faces:  # a recorded face serves the samples whose final active set it is (no weakly active extra)
        exact = accepted & ~xp.any(active != S, axis=1)
        for rec in faces:
            rec.use = rec.use & (exact if rec.idx is None else xp.take(exact, rec.idx, axis=0))
    return Y, active, mult, mu, accepted
