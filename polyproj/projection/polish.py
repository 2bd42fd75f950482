"""The exact active-set polish of a batch of projections, written against the array API.

Given a (possibly inaccurate) projection ``Y0`` of ``X`` onto ``P = {Ay <= a, By = b, lb <= y <= ub}``
and its multipliers (inequality rows numbered as in :mod:`polyproj.polydata`), :func:`polish`

1. takes as candidate active rows those close to their hyperplane *or* with a clearly positive
   multiplier (both signals: solvers return active rows with a small positive slack and a large
   multiplier, where a slack-only rule picks a wrong face);
2. solves the equality-constrained projection onto the candidate face exactly (:func:`face_solve`);
3. accepts it when the KKT conditions of the projection hold: feasible, inequality multipliers
   ``>= 0``, the face's equations consistent — all relative to the scale of the sample (the size of
   ``x``, ``y`` and of each row's right-hand side; row values at the scale of ``y``, never below
   ``eps |x|`` unless that exceeds the polyhedron's size: a vertex at the origin has ``y = 0`` and zero
   right-hand sides, see :func:`_point_scale`; a row off the face also at the size of its own terms,
   :func:`_violation_tol`; the face's equations each at the size of its own terms ``|M_i||y| + |c_i|``),
   so data at 1e-12 or 1e12, or coordinates on scales 1e8 apart, are not special;
4. otherwise changes the face — by one row per sample (drop the most negative multiplier, else add
   the most violated row: dual feasibility first, since a wrongly active row bends the face point and
   makes other rows look violated), or for the first ``block_iter`` rounds every wrong row at once —
   and repeats. An inconsistent face (rows that cannot all hold) first drops the candidate least
   supported by the backend's point.

Constraint data may be shared or per sample (:class:`~polyproj.polydata.PolyData`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from array_api_compat import array_namespace
from array_api_compat import device as _device

from ..linalg import row_norms
from ..polydata import PolyData, ineq_slack, matvec
from .faces import (
    REFINE_ROUNDINGS,
    REFINE_STEPS,
    Face,
    expand_rows,
    face_rhs,
    gather_active_rows,
    machine_eps,
    off_rounding,
    put_rows,
    scatter_rows,
)

__all__ = ["FaceRecord", "PolishResult", "face_solve", "polish"]


def _rmax(xp, v):
    """Row-wise max of |v| (0 for empty rows), keepdims."""
    if v.shape[1] == 0:
        return xp.zeros((v.shape[0], 1), dtype=v.dtype, device=_device(v))
    return xp.max(xp.abs(v), axis=1, keepdims=True)


def face_solve(X, data: PolyData, S, *, method: str = "auto", floor=None):
    """Exact projection of ``X`` onto the face given by the candidate rows ``S`` (b, m + 2n).

    Returns ``(Y, mult, mu, cons, face)``: ``Y`` (b, n); inequality multipliers ``mult`` (b, m + 2n)
    and equality multipliers ``mu`` (b, p) with ``Y − X + Aᵀλ_A − λ_lb + λ_ub + Bᵀμ = 0``; the
    consistency ``cons`` (b,): the face's largest residual relative to its row's terms,
    ``max_i |M_i y − c_i| / (|c_i| + Σ_j |M_ij| max(|y_j|, floor))`` (``floor`` (b, 1): the scale below which
    a coordinate is rounding, 0 by default), so that a row holds at its own scale whatever the sizes of the
    other coordinates; the :class:`~polyproj.projection.faces.Face`.
    A coordinate listed at both bounds (``lb == ub``) is fixed once, at the upper bound value.
    """
    xp = array_namespace(X, data.A)
    n, m = X.shape[1], data.m
    A, a, B, b, lb, ub = data.parts()
    sA, s_lb, s_ub = S[:, :m], S[:, m: m + n], S[:, m + n:]
    at_ub = xp.astype(s_ub, X.dtype)
    at_lb = xp.astype(s_lb, X.dtype) * (1.0 - at_ub)
    fixed = at_lb + at_ub
    free = 1.0 - fixed
    lbf = xp.where(xp.isfinite(lb), lb, xp.zeros_like(lb))
    ubf = xp.where(xp.isfinite(ub), ub, xp.zeros_like(ub))
    Z = free * X + fixed * xp.where(at_ub > 0, ubf, lbf)  # x with the fixed coordinates at their bounds
    R = gather_active_rows(A, B, sA, free)
    c = face_rhs(xp, A, a, b, sA, R)
    face = Face.of_rows(R, method=method)
    lam_c, step, Mt_lam = face.project_residual(R.dot(Z) - c)
    Y = Z - step
    resid = R.dot(Y) - c

    def row_size(Rs, Ys, cs, fl):
        # the size of each row's terms |M_i||y| + |c_i|, the scale of its rounding. Taken at the current y: at a
        # far point (|x| >> |y|) the first face point carries an error ~eps |x| (cancellation in y = z - M^T lam),
        # and terms taken there would call a row "at rounding" while it still misses by eps |x| times
        # (cond(G) eps)^k, k the steps done; each refinement step takes them again at the refined points
        return Rs.abs_dot(xp.abs(Ys) if fl is None else xp.maximum(xp.abs(Ys), fl)) + xp.abs(cs)

    size = row_size(R, Y, c, floor)
    # up to REFINE_STEPS steps of iterative refinement on the samples whose face equations miss rounding
    # (faces.off_rounding: an ill-conditioned face, or cancellation at a far point), their multipliers added to
    # λ so that stationarity holds
    for _ in range(REFINE_STEPS):
        ref = off_rounding(xp, resid, size)
        if not bool(xp.any(ref)):
            break
        idx = xp.nonzero(ref)[0]
        dlam, corr, dMt = face.take(idx).project_residual(xp.take(resid, idx, axis=0))
        Y = put_rows(xp, Y, idx, xp.take(Y, idx, axis=0) - corr)
        lam_c = put_rows(xp, lam_c, idx, xp.take(lam_c, idx, axis=0) + dlam)
        Mt_lam = put_rows(xp, Mt_lam, idx, xp.take(Mt_lam, idx, axis=0) + dMt)
        Ri, Yi, ci = R.take(idx), xp.take(Y, idx, axis=0), xp.take(c, idx, axis=0)
        resid = put_rows(xp, resid, idx, Ri.dot(Yi) - ci)
        size = put_rows(xp, size, idx, row_size(Ri, Yi, ci, None if floor is None else xp.take(floor, idx, axis=0)))
    lamA, mu = expand_rows(R, lam_c)
    z_box = (X - Y - Mt_lam) * fixed  # stationarity on the fixed coordinates
    mult = xp.concat([lamA, -z_box * at_lb, z_box * at_ub], axis=1)
    rel = xp.abs(resid) / xp.where(size > 0, size, xp.ones_like(size))  # padding rows: 0 / 1
    return Y, mult, mu, _rmax(xp, rel)[:, 0], face


@dataclass
class FaceRecord:
    """The faces of one polish round, for the samples whose final active set is exactly that face.

    ``idx``: batch indices of the round's samples (None: the whole batch); ``use``: those of the
    round's samples that the record serves (a backward pass reuses their factorisation).
    """

    idx: Any
    use: Any
    face: Face


def _record(xp, idx, use, face: Face) -> FaceRecord:
    """A round's faces, kept whole when at least half its samples end there, else only those samples.

    Keeping only the samples that end in a round bounds what all records hold together by about two
    faces a sample; keeping a mostly-used round whole avoids a copy.
    """
    if 2 * int(xp.sum(xp.astype(use, xp.int64))) >= use.shape[0]:
        return FaceRecord(idx, use, face)
    keep = xp.nonzero(use)[0]
    rows = keep if idx is None else xp.take(idx, keep, axis=0)
    return FaceRecord(rows, xp.ones(keep.shape, dtype=xp.bool, device=_device(keep)), face.take(keep))


@dataclass(frozen=True)
class PolishResult:
    """Output of :func:`polish` (inequality rows numbered as in :mod:`polyproj.polydata`).

    ``Y`` (b, n); ``active`` (b, m + 2n); ``mult`` (b, m + 2n) ``>= 0``; ``mu`` (b, p); ``accepted``
    (b,) the KKT conditions verified; ``faces`` the :class:`FaceRecord` list when asked for.
    """

    Y: Any
    active: Any
    mult: Any
    mu: Any
    accepted: Any
    faces: list | None = None


@dataclass(frozen=True)
class _Scales:
    """Per-row and per-sample scales of the KKT tests (see :func:`_scales`)."""

    rhs_abs: Any  # (b, m + 2n) |right-hand side| of the rows that can bind, 0 on the others
    fin: Any  # (b, m + 2n) rows that can bind (:func:`can_bind`): finite right-hand side, not a vacuous zero row
    rn1: Any  # (b, m + 2n) 1-norm of each row
    rn2: Any  # (b, m + 2n) 2-norm of each row (1 for zero rows)
    bsum: Any  # (b, p) |b| + ||B_j||_1 (scale of the equality rows without the point)
    bn1: Any  # (b, p) 1-norm of each equality row
    size: Any  # (b, 1) the polyhedron's size: largest finite |rhs| of any row (0 for a cone)


def can_bind(xp, rhs, rn1):
    """Inequality rows some point can sit on: a finite right-hand side on a nonzero row (1-norm ``rn1``).

    A zero row ``0 y <= a`` with ``a >= 0`` holds everywhere and has no hyperplane: never a candidate nor
    active. With ``a < 0`` it counts, and the face that cannot satisfy it reports the polyhedron empty.
    """
    return xp.isfinite(rhs) & ((rn1 > 0) | (rhs < 0))


def _scales(xp, X, data: PolyData) -> _Scales:
    batch, n = X.shape
    m, p = data.m, data.p
    A, a, B, b, lb, ub = data.parts()
    dtype, dev = X.dtype, _device(X)
    rhs = xp.concat([xp.broadcast_to(a, (batch, m)), -xp.broadcast_to(lb, (batch, n)),
                     xp.broadcast_to(ub, (batch, n))], axis=1)
    ones = xp.ones((batch, 2 * n), dtype=dtype, device=dev)
    rn1 = xp.concat([xp.broadcast_to(xp.sum(xp.abs(A), axis=-1), (batch, m)), ones], axis=1)
    rn2 = xp.concat([xp.broadcast_to(row_norms(xp, A), (batch, m)), ones], axis=1)
    rn2 = xp.where(rn2 > 0, rn2, xp.ones_like(rn2))
    bn1 = xp.broadcast_to(xp.sum(xp.abs(B), axis=-1), (batch, p))
    fin = can_bind(xp, rhs, rn1)
    bsum = xp.broadcast_to(xp.abs(b), (batch, p))
    rhs_abs = xp.where(fin, xp.abs(rhs), xp.zeros_like(rhs))
    return _Scales(rhs_abs, fin, rn1, rn2, bsum, bn1, _rmax(xp, xp.concat([rhs_abs, bsum], axis=1)))


def _point_scale(xp, Y, X, sc: _Scales):
    """Scale of the face point's row values: ``max(max|y|, min(eps max|x|, S))`` (b, 1).

    The face point is exact to rounding at the scale of ``y`` once refined where ``|x| ≫ |y|`` (see
    :func:`~polyproj.projection.faces.off_rounding`), up to the refinement's own rounding. Where ``y`` itself
    vanishes (a vertex through the origin: a cone's apex, rows with zero right-hand sides, coordinates fixed
    at 0) the exact ``y`` is 0 and the computed one is that rounding (~1e-31 |x| to ~1e-29 |x| by the face's
    conditioning), which no tolerance relative to ``|y|`` and ``|rhs|`` (both 0) admits. ``eps |x|`` is the finest scale
    at which ``y = x − Mᵀλ`` is resolved at all: rows held to ``tol`` of it are exact at the input's own
    precision. The floor never exceeds the polyhedron's own size ``S`` (largest finite ``|rhs|``;
    ``max|x|`` for a cone, which has none): a point so far out that ``eps |x| > S`` would otherwise have
    a wrong face (a row missed at the scale of ``y``) accepted.
    """
    eps = machine_eps(xp, Y.dtype)
    far = _rmax(xp, X)
    return xp.maximum(_rmax(xp, Y), xp.minimum(eps * far, xp.where(sc.size > 0, sc.size, far)))


def _row_tol(xp, sc: _Scales, sig, tol: float):
    """Feasibility tolerance of every inequality row: ``tol (|rhs| + ||row||_1 σ)``, σ the sample's scale."""
    return tol * (sc.rhs_abs + sc.rn1 * sig)


def _violation_tol(xp, X, Y, data: PolyData, sc: _Scales, sig, row_tol, tol: float):
    """Tolerance of the slack tests of the inequality rows (violated; at zero), (b, m + 2n), at most ``row_tol``.

    ``tol (|rhs| + |A_i|(|x| + |y|)) + k eps ||A_i||_1 max(σ, max|x − y|)`` (``k`` = :data:`REFINE_ROUNDINGS`,
    σ of :func:`_point_scale`): the slack at the size of the row's own terms (``y = x − Mᵀλ`` carries the
    rounding of ``x``), not only at that of ``||A_i||_1 max|y|``: on coordinates of scales 1e-4 to 1e4 a row
    whose support is small coordinates weighted ~1e4 has terms ~20 while ``||A_i||_1 max|y|`` is ~1e8; faces
    that missed a row by 0.06-0.23 were accepted, and rows 1 % of their terms inside were reported active.
    The rounding floor covers rows whose terms vanish (``y_j ~ 0`` on a bound of 0, where ``(Mᵀλ)_j`` sums
    terms of the multipliers' size, ``|x − y|``). Never looser than :func:`_row_tol` (a far point's ``|x|``
    does not excuse a violation at the scale of ``y``); ``row_tol``: :func:`_row_tol` at ``sig``, which the
    caller has.
    """
    size = xp.abs(X) + xp.abs(Y)
    terms = xp.concat([matvec(xp, xp.abs(data.A), size), size, size], axis=1)
    scale = xp.maximum(sig, _rmax(xp, X - Y))
    floor = xp.where(sc.rn1 > 0, REFINE_ROUNDINGS * machine_eps(xp, Y.dtype) * sc.rn1 * scale,
                     xp.zeros_like(sc.rn1))  # a zero row: no rounding (0 * inf where x − y overflows)
    return xp.minimum(row_tol, tol * (sc.rhs_abs + terms) + floor)


#: rounds before the polish may hand the samples left to the caller's fallback (``handoff``)
HANDOFF_AFTER = 2


def polish(X, data: PolyData, Y0, mult0, *, cand_tol: float, dist_tol: float, tol: float, max_iter: int,
           block_iter: int = 0, record: bool = False, candidates: Any = None, handoff: int = 0,
           give_up: float = 1.0, backed_only: bool = False) -> PolishResult:
    """Primal–dual active-set polish of a batch of projections (see the module docstring).

    Parameters
    ----------
    X : (batch, n) array
    data : PolyData
    Y0 : (batch, n)
        The backend's projection (rows with NaN start from X).
    mult0 : (batch, m + 2n)
        The backend's inequality multipliers (NaN-free).
    cand_tol, dist_tol : float
        Candidate thresholds: multiplier above ``cand_tol`` (relative to the largest), or distance to
        the row's hyperplane below ``dist_tol`` (relative to the sample's scale).
    tol : float
        Relative tolerance of the KKT checks.
    max_iter : int
        Active-set corrections allowed.
    block_iter : int
        The first ``block_iter`` corrections change every wrong row at once.
    record : bool
        Keep the factored faces on which samples were accepted (:class:`FaceRecord`).
    candidates : (batch, m + 2n) bool, optional
        The first candidate rows (a warm start: e.g. the active sets of a previous step) instead of those
        the start's distances and multipliers give.
    handoff : int
        After :data:`HANDOFF_AFTER` rounds, stop once at most this many samples are left (0: never); they
        are returned not accepted, for the caller to solve otherwise.
    give_up : float
        After the first round, stop when more than this share of the samples is left (a poor warm start;
        1: never).
    backed_only : bool
        The first candidates are the rows the start's multipliers back, without the rows near their
        hyperplane (the second try of a refused sample: see :func:`polyproj.projection.pipeline.run`).
    """
    xp = array_namespace(X, data.A)
    sc = _scales(xp, X, data)
    good0 = xp.all(xp.isfinite(Y0), axis=1)
    Ystart = xp.where(good0[:, None], Y0, X)
    sig0 = xp.maximum(_rmax(xp, Ystart), _rmax(xp, X))
    dist0 = ineq_slack(Ystart, *_ineq_parts(data)) / sc.rn2
    mult0_n = mult0 * sc.rn2  # multipliers of the normalised rows: the scale of x − y
    backed = mult0_n > cand_tol * (sig0 + _rmax(xp, mult0_n))
    near = xp.zeros_like(backed) if backed_only else dist0 <= dist_tol * sig0
    S = sc.fin & ((near | backed) if candidates is None else candidates)
    # how little the backend supports a candidate (an inconsistent face drops the least supported):
    # multiplier not clearly positive first, then farthest from its hyperplane
    weak = xp.where(backed, xp.full_like(dist0, -1e30), dist0)
    state = _State.start(xp, X, data, S, Ystart)
    faces: list[FaceRecord] | None = [] if record else None
    used = xp.zeros((X.shape[0],), dtype=xp.int64, device=_device(X))  # the rounds each sample took part in
    for it in range(max_iter):
        left = int(xp.sum(xp.astype(state.todo, xp.int64)))
        if left == 0 or (it >= HANDOFF_AFTER and left <= handoff) or (it == 1 and left > give_up * X.shape[0]):
            break
        used = used + xp.astype(state.todo, xp.int64)
        _round(xp, state, X, data, sc, weak, tol, block=it < block_iter, faces=faces)
    _tighten(xp, state, X, data, sc, weak, tol, faces, max_iter - used)
    return _finish(xp, state, X, data, sc, tol, faces)


def _ineq_parts(data: PolyData):
    return data.A, data.a, data.lb, data.ub


@dataclass
class _State:
    """The polish's iterate: the current point, multipliers and candidate set of every sample."""

    Y: Any
    mult: Any
    mu: Any
    S: Any  # candidate active rows (b, m + 2n)
    accepted: Any  # (b,) verified
    todo: Any  # (b,) not yet verified
    forced: Any  # rows added because the face point violated them (never dropped as least supported)

    @classmethod
    def start(cls, xp, X, data: PolyData, S, Ystart) -> _State:
        batch = X.shape[0]
        dev = _device(X)
        shape = (batch, data.m + 2 * data.n)
        return cls(Ystart, xp.zeros(shape, dtype=X.dtype, device=dev), xp.zeros((batch, data.p), dtype=X.dtype,
                   device=dev), S, xp.zeros((batch,), dtype=xp.bool, device=dev),
                   xp.ones((batch,), dtype=xp.bool, device=dev), xp.zeros(shape, dtype=xp.bool, device=dev))


def _select(xp, state: _State, X, data: PolyData, sc: _Scales, weak):
    """The round's samples: everything when all are still to do, else the rows of ``todo``."""
    if bool(xp.all(state.todo)):
        return None, X, data, sc, state.S, state.forced, weak
    mask = state.todo
    idx = xp.nonzero(mask)[0]

    def t(v):
        return xp.take(v, idx, axis=0)

    sub = _Scales(t(sc.rhs_abs), t(sc.fin), t(sc.rn1), t(sc.rn2), t(sc.bsum), t(sc.bn1), t(sc.size))
    return mask, t(X), data.take(idx), sub, t(state.S), t(state.forced), t(weak)


def _round(xp, state: _State, X, data: PolyData, sc: _Scales, weak, tol: float, *, block: bool, faces) -> None:
    """One polish round on the samples still to do: face solve, KKT tests, next candidate sets."""
    mask, Xt, dt, st, St, ft, wt = _select(xp, state, X, data, sc, weak)
    eps = machine_eps(xp, Xt.dtype)
    far = _rmax(xp, Xt)
    Yt, mt, mut, cons, face = face_solve(Xt, dt, St, floor=xp.minimum(eps * far, xp.where(st.size > 0, st.size, far)))
    slack = ineq_slack(Yt, *_ineq_parts(dt))
    # feasibility and the face's equations at the scale of y and of the rows (not of x: a far point's
    # y must hold its constraints to rounding at its own scale; the rounding floor only where y vanishes,
    # see _point_scale); multipliers at the scale of x − y
    sig_y = _point_scale(xp, Yt, Xt, st)
    feas_tol = _row_tol(xp, st, sig_y, tol)
    mt_n = mt * st.rn2  # multipliers of the normalised rows
    mtol = tol * (xp.maximum(sig_y, _rmax(xp, Xt)) + _rmax(xp, mt_n))
    neg = St & ((mt_n < -mtol) | (slack > feas_tol))  # drop: negative multiplier, or left slack
    viol_tol = _violation_tol(xp, Xt, Yt, dt, st, sig_y, feas_tol, tol)
    viol = (~St) & st.fin & (slack < -viol_tol)
    incons = cons > tol
    eq_ok = ~incons
    if dt.p:
        eq_res = xp.abs(matvec(xp, dt.B, Yt) - dt.b)
        eq_ok = eq_ok & xp.all(eq_res <= tol * (st.bsum + st.bn1 * sig_y), axis=1)
    # a face row the face solve left violated: its hyperplane has no point on the face (a zero row whose
    # right-hand side is negative, a row whose support the face's bounds fix): never an accepted answer
    off_face = St & st.fin & (slack < -viol_tol)
    done = ~xp.any(neg, axis=1) & ~xp.any(viol, axis=1) & ~xp.any(off_face, axis=1) & eq_ok
    add, drop = _changes(xp, St, slack, st, mt_n, neg, viol, incons, ft, wt, block)
    Snew = xp.where(done[:, None], St, (St | add) & ~drop)
    if faces is not None and bool(xp.any(done)):
        faces.append(_record(xp, None if mask is None else xp.nonzero(mask)[0], done, face))
    if mask is None:
        state.Y, state.mult, state.mu, state.S, state.accepted = Yt, mt, mut, Snew, done
        state.forced, state.todo = ft | add, ~done
        return
    state.Y, state.mult = scatter_rows(xp, state.Y, mask, Yt), scatter_rows(xp, state.mult, mask, mt)
    state.mu, state.S = scatter_rows(xp, state.mu, mask, mut), scatter_rows(xp, state.S, mask, Snew)
    state.forced = scatter_rows(xp, state.forced, mask, ft | add)
    state.accepted = scatter_rows(xp, state.accepted, mask, done)
    state.todo = scatter_rows(xp, state.todo, mask, ~done)


#: rounds of :func:`_tighten` at most
TIGHTEN_ROUNDS = 2


def _tighten(xp, state: _State, X, data: PolyData, sc: _Scales, weak, tol: float, faces, budget) -> None:
    """Accepted answers that violate a row off their face beyond rounding: that face with those rows added, tried.

    The acceptance test lets a face point violate a row off the face by up to its tolerance (``tol`` relative,
    :func:`_violation_tol`), so a start that missed a row whose hyperplane lies within that tolerance of the
    projection (an inexact backend's; the same backend's in another namespace, rounded otherwise) had the face
    without it accepted: an answer up to ~1e-8 outside the set and as far off the projection, where a start that
    had the row gave the exact point. The projection satisfies every row, so it lies on a face holding such a row:
    the face with the rows violated beyond rounding (:data:`~polyproj.projection.faces.REFINE_ROUNDINGS` ``eps``
    in place of ``tol``) added is solved (one :func:`_round`, the same tests) and replaces the answer where
    accepted; the others keep the answer they had (accepted at the tolerance). At most :data:`TIGHTEN_ROUNDS`, and
    for each sample at most its ``budget`` (b,): the rounds the polish's ``max_iter`` leaves it (counted per sample:
    one hard sample of a batch must not spend the others').
    """
    rounding = REFINE_ROUNDINGS * machine_eps(xp, X.dtype)
    for _ in range(TIGHTEN_ROUNDS):
        if not bool(xp.any(state.accepted)):
            return
        slack = ineq_slack(state.Y, *_ineq_parts(data))
        sig = _point_scale(xp, state.Y, X, sc)
        off = _violation_tol(xp, X, state.Y, data, sc, sig, _row_tol(xp, sc, sig, rounding), rounding)
        over = (state.accepted & (budget > 0))[:, None] & ~state.S & sc.fin & (slack < -off)
        again = xp.any(over, axis=1)
        budget = budget - xp.astype(again, xp.int64)
        if not bool(xp.any(again)):
            return
        before = (state.Y, state.mult, state.mu, state.S, state.forced)
        accepted, todo, known = state.accepted, state.todo, 0 if faces is None else len(faces)
        state.S = state.S | over
        state.accepted, state.todo = accepted & ~again, again
        _round(xp, state, X, data, sc, weak, tol, block=False, faces=faces)
        took = again & state.accepted
        keep = (again & ~took)[:, None]
        state.Y, state.mult, state.mu, state.S, state.forced = (
            xp.where(keep, old, new) for old, new in
            zip(before, (state.Y, state.mult, state.mu, state.S, state.forced), strict=True))
        state.accepted, state.todo = accepted, todo
        for rec in (faces or [])[:known]:  # an earlier face no longer serves the samples that left it
            rec.use = rec.use & ~(took if rec.idx is None else xp.take(took, rec.idx, axis=0))
        if not bool(xp.any(took)):
            return


def _changes(xp, St, slack, sc: _Scales, mt_n, neg, viol, incons, forced, weak, block: bool):
    """Rows to add and to drop for the next round (see the module docstring)."""
    dtype, dev = slack.dtype, _device(slack)
    cols = xp.arange(St.shape[1], device=dev)[None, :]
    has_v = xp.any(viol, axis=1) & ~incons
    has_n = xp.any(neg, axis=1) & ~incons
    dist = slack / sc.rn2
    inf = xp.full(dist.shape, float("inf"), dtype=dtype, device=dev)
    if block:  # a primal–dual step: every wrong row at once
        add = viol & ~incons[:, None]
        drop = neg & ~has_v[:, None] & ~incons[:, None]
    else:
        worst_v = xp.argmin(xp.where(viol, dist, inf), axis=1)
        worst_n = xp.argmin(xp.where(neg, xp.minimum(mt_n, -dist), inf), axis=1)
        add = (cols == worst_v[:, None]) & (has_v & ~has_n)[:, None]
        drop = (cols == worst_n[:, None]) & has_n[:, None]
    if bool(xp.any(incons)):  # drop the least-supported candidate, never a row added as violated
        droppable = St & sc.fin & ~forced
        droppable = xp.where(xp.any(droppable, axis=1)[:, None], droppable, St & sc.fin)
        worst_i = xp.argmax(xp.where(droppable, weak, -inf), axis=1)
        drop = drop | ((cols == worst_i[:, None]) & (incons & xp.any(droppable, axis=1))[:, None])
    return add, drop


def _finish(xp, state: _State, X, data: PolyData, sc: _Scales, tol: float, faces) -> PolishResult:
    """Final active sets: the accepted face plus rows at zero slack (weakly active), relative to scale."""
    mult = xp.where(state.mult > 0, state.mult, xp.zeros_like(state.mult))
    slack = ineq_slack(state.Y, *_ineq_parts(data))
    sig = _point_scale(xp, state.Y, X, sc)
    zero_tol = _violation_tol(xp, X, state.Y, data, sc, sig, _row_tol(xp, sc, sig, tol), tol)
    at_zero = sc.fin & (xp.abs(slack) <= zero_tol)
    active = state.accepted[:, None] & (state.S | at_zero)
    if faces:  # a recorded face serves the samples whose final active set it is (no weakly active extra)
        exact = state.accepted & ~xp.any(active != state.S, axis=1)
        for rec in faces:
            rec.use = rec.use & (exact if rec.idx is None else xp.take(exact, rec.idx, axis=0))
    return PolishResult(state.Y, active, mult, state.mu, state.accepted, faces)
