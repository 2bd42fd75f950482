"""Termination: unscaled residuals and tolerances, infeasibility certificates, final statuses.

Stopping (per element, on the *unscaled* problem, qpbenchmark's definitions)::

    ‖max(Cx − u, l − Cx, x − ub, lb − x, 0)‖∞ <= ε_abs + ε_rel max(‖Cx‖∞, ‖x‖∞)
    ‖Px + q + Cᵀz + z_box‖∞                   <= ε_abs + ε_rel max(‖Px‖∞, ‖q‖∞, ‖Cᵀz‖∞, ‖z_box‖∞)
    |xᵀPx + qᵀx + uᵀz⁺ − lᵀz⁻ + ubᵀz_box⁺ − lbᵀz_box⁻| <= ε_abs + ε_rel max(|xᵀPx|, |qᵀx|, |support|)

float32 data: every tolerance is floored at ``1000 · eps(float32) · (1 + the size of its residual's terms at the
point)`` (``|C||x|``, ``|P||x|``, ``|q|ᵀ|x|``, ...: the rounding of the sums, which can cancel).

Infeasibility: the Newton direction of a primal infeasible element converges to a Farkas
certificate ``δz`` with ``Cᵀδz + δz_box ≈ 0`` and ``uᵀδz⁺ − lᵀδz⁻ + … < 0``; that of a dual
infeasible (unbounded) one to ``δx`` with ``Pδx ≈ 0``, ``qᵀδx < 0`` and ``Cδx`` in the recession
cone of ``[l, u]``. A certified element ends PRIMAL_INFEASIBLE / DUAL_INFEASIBLE with NaN primal
values; a non-finite iterate ends NUMERICAL_ERROR; nothing non-finite is ever SOLVED.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .arrays import inf_norm, mv, rmv
from .problem import BatchQP, Numerics, Rows
from .result import CODES, RUNNING, IPMResult, StatusCodes
from .state import KKTPoint, LoopState

__all__ = ["STALL_ITER", "Tolerances", "certificates", "finish", "kkt_point", "record", "tolerances"]


#: iterations without halving the best point's distance to the tolerances after which an element near them has
#: stalled (:func:`record`; the ``ipm`` backend's ``stall_iter``, which polishes the answer on its active set)
STALL_ITER = 10
#: float64 tolerances are at least this many roundings of the largest term of their residual (:class:`Tolerances`)
ROUNDINGS = 16.0


@dataclass(frozen=True)
class Tolerances:
    """Tolerances of a batch.

    Attributes
    ----------
    eps_abs, eps_rel : float
    floor : float
        ``1000 · eps(float32)`` in float32, 0 in float64: every tolerance is at least that times (1 + the size of
        its own terms at the point).
    eps_inf : float
        Tolerance of the infeasibility certificates (``1e-8`` in float64, ``1e-4`` in float32).
    rounding : float
        ``ROUNDINGS · eps(float64)`` in float64 (0 in float32, whose floor is larger): no tolerance is below that
        times the largest term of its residual.
    """

    eps_abs: float
    eps_rel: float
    floor: Any
    eps_inf: float
    rounding: float = 0.0


def tolerances(xp: Any, qp: BatchQP, rows: Rows, num: Numerics, eps_abs: float, eps_rel: float) -> Tolerances:
    """The :class:`Tolerances` of a batch (the float32 floor: relative to each residual's own terms at the point).

    The floor scaled with ``q`` and every finite bound: an inactive box at ±1e6 made it 120, and any point
    SOLVED (5.2 off). The terms at the point hold the bounds that bind there (``C x``, ``x`` at them; ``U z``).
    """
    del qp, rows  # the floor is set at each point (kkt_point)
    f32 = num.dtype == xp.float32
    return Tolerances(eps_abs, eps_rel, 1e3 * num.eps if f32 else 0.0, 1e-4 if num.dtype != xp.float64 else 1e-8,
                      0.0 if f32 else ROUNDINGS * num.eps)


def _support(xp: Any, rows: Rows, zall: Any, zero: Any) -> Any:
    """``Σ U_i z_i⁺ − L_i z_i⁻`` over the finite sides."""
    return xp.sum(rows.Uf * xp.maximum(zall, zero) - rows.Lf * xp.maximum(-zall, zero), axis=1)


def kkt_point(xp: Any, qp: BatchQP, rows: Rows, tol: Tolerances, zero: Any, x: Any, z: Any, z_box: Any) -> KKTPoint:
    """Residuals and tolerances of the unscaled point ``(x, z, z_box)``."""
    Px = mv(qp.P, x)
    Cx = mv(qp.C, x)
    gx = xp.concat([Cx, x], axis=1)
    pres = xp.max(xp.maximum(xp.maximum(gx - rows.U, rows.L - gx), zero), axis=1)
    Ctz = rmv(qp.C, z)
    dres = inf_norm(xp, Px + qp.q + Ctz + z_box)
    xPx = xp.sum(x * Px, axis=1)
    qx = xp.sum(qp.q * x, axis=1)
    supp = _support(xp, rows, xp.concat([z, z_box], axis=1), zero)
    gap = xp.abs(xPx + qx + supp)
    ea, er, fl = tol.eps_abs, tol.eps_rel, tol.floor
    sp_ = xp.maximum(inf_norm(xp, Cx), inf_norm(xp, x))
    sd = xp.maximum(xp.maximum(inf_norm(xp, Px), inf_norm(xp, qp.q)),
                    xp.maximum(inf_norm(xp, Ctz), inf_norm(xp, z_box)))
    sg = xp.maximum(xp.maximum(xp.abs(xPx), xp.abs(qx)), xp.abs(supp))
    own = [ea + er * size for size in (sp_, sd, sg)]
    tp, td, tg = own
    # the tests' tolerances: no float64 tolerance below the rounding of the residual's largest term (the duality
    # gap of 0 projected onto x₁ + x₂ >= 1e8 sums terms of 5e15 to 1: eps_abs 1e-8 with eps_rel 0 was never met,
    # and the iteration ran on to NaN); tp, td, tg, which rank the points passed (:func:`_distance`), leave it out
    floors = [tol.rounding * size for size in (sp_, sd, sg)]
    if fl:  # float32: the floor follows the rounding of the sums, the sizes of their terms (not of the sums, which
        # cancel: x₁ = x₂ with q = (1e4, −1e4 + δ) ran 100 iterations to SOLVED_INACCURATE at float32's accuracy)
        ax, az = xp.abs(x), xp.abs(xp.concat([z, z_box], axis=1))
        fp = xp.maximum(inf_norm(xp, mv(xp.abs(qp.C), ax)), inf_norm(xp, x))
        fd = xp.maximum(xp.maximum(inf_norm(xp, mv(xp.abs(qp.P), ax)), inf_norm(xp, qp.q)),
                        xp.maximum(inf_norm(xp, rmv(xp.abs(qp.C), xp.abs(z))), inf_norm(xp, z_box)))
        fg = xp.sum(ax * mv(xp.abs(qp.P), ax), axis=1) + xp.sum(xp.abs(qp.q) * ax, axis=1) + \
            xp.sum((xp.abs(rows.Uf) + xp.abs(rows.Lf)) * az, axis=1)
        floors = [fl * (1.0 + floor_size) for floor_size in (fp, fd, fg)]
        tp, td, tg = (xp.maximum(t, f) for t, f in zip(own, floors, strict=True))
    # converged: within the tolerances or their floor; near (SOLVED_INACCURATE's test): within 1000 times the
    # tolerances, and the floor once, not 1000 times (the float32 floor grows with |z|: on an empty set's diverging
    # multipliers 1000 floors passed residuals of 0.06 / 0.7 / 59)
    conv, near = None, None
    for r, t, f in zip((pres, dres, gap), own, floors, strict=True):
        c, n_ = r <= xp.maximum(t, f), r <= xp.maximum(1e3 * t, f)
        conv, near = (c, n_) if conv is None else (conv & c, near & n_)
    return KKTPoint(x, z, z_box, pres, dres, gap, tp, td, tg, conv, near)


def record(xp: Any, codes: StatusCodes, point: KKTPoint, loop: LoopState, stall_iter: int | None = None) -> LoopState:
    """The termination test at ``point``: converged elements SOLVED, non-finite ones NUMERICAL_ERROR.

    The best point of every running element becomes ``point`` where that is finite and converged, or no
    further from the tolerances (``max(pres/tp, dres/td, gap/tg)``) than the best so far: MAX_ITER and
    TIME_LIMIT return the closest point the IPM passed, not the last one (near the precision floor of
    the normal equations the iterates can move away again: 1.4e-7 returned after 1.2e-8 was passed).

    With ``stall_iter`` (:data:`STALL_ITER` from the ``ipm`` backend), an element near its tolerances
    (:attr:`KKTPoint.near`) whose best point's distance to them has not halved in ``stall_iter`` iterations
    has stalled at the precision floor of its Newton systems (``D = z/s``
    spans 20-30 magnitudes there): it ends SOLVED_INACCURATE at its best point instead of creeping on to the
    iteration cap (random QPs at n 400 stalled within 10 of 1e-8 for 40-90 iterations); the backend polishes
    such an answer on its active set (:mod:`polyproj.backends.active_polish`).
    """
    finite = (xp.isfinite(point.pres) & xp.isfinite(point.dres) & xp.isfinite(point.gap)
              & xp.all(xp.isfinite(point.x), axis=1))
    conv = finite & point.conv
    running = loop.status == RUNNING
    status = codes.set(loop.status, running & conv, "SOLVED")
    status = codes.set(status, running & ~finite, "NUMERICAL_ERROR")
    if loop.best is None:
        best = point
    else:
        closer = _distance(xp, point) <= _distance(xp, loop.best)
        best = loop.best.update(xp, running & finite & (conv | closer | ~xp.isfinite(loop.best.pres)), point)
    if stall_iter is None:  # no stall rule: the progress record is not kept
        return LoopState(loop.it, loop.iterate, best, status, loop.iterations, loop.pin_cnt, loop.din_cnt,
                         loop.stale, loop.ref)
    # progress: the best distance halved since the last time it was (steady convergence, even 1.4x an iteration,
    # halves it every other iteration; the precision floor's creep of a few % an iteration does not)
    dist = _distance(xp, best)
    ref = loop.ref if loop.ref is not None else xp.full_like(dist, math.inf)
    halved = ~(dist > 0.5 * ref)  # NaN distances (no finite best point yet) count as progress
    ref = xp.where(halved, dist, ref)
    stale = xp.where(halved, xp.zeros_like(loop.stale), loop.stale + 1)
    stalled = (status == RUNNING) & best.near & xp.isfinite(best.pres) & (stale >= stall_iter)
    status = codes.set(status, stalled, "SOLVED_INACCURATE")
    return LoopState(loop.it, loop.iterate, best, status, loop.iterations, loop.pin_cnt, loop.din_cnt, stale, ref)


def _distance(xp: Any, p: Any) -> Any:
    """How far a point is from the tolerances: ``max(pres/tp, dres/td, gap/tg)`` per element (<= 1: converged)."""
    return xp.maximum(xp.maximum(p.pres / p.tp, p.dres / p.td), p.gap / p.tg)


def _primal_certificate(xp, qp, rows, num, tol, dzg_u, dzb_u, x1):
    """``δz`` (the multiplier direction, normalised) certifies ``l <= Cx <= u, lb <= x <= ub`` empty.

    A feasible problem admits no ε-certificate beyond ``‖x̄‖₁·‖Cᵀδz + δz_box‖`` (``x̄`` feasible): the
    margin uses the current iterate as ``x̄``. A direction beyond ``1/eps²`` is a numerical blow-up,
    not a certificate: such elements end as MAX_ITER / NUMERICAL_ERROR instead.
    """
    eps, one, zero = num.eps, num.one, num.zero
    nz = xp.maximum(inf_norm(xp, dzg_u), inf_norm(xp, dzb_u))
    nz_safe = xp.where(nz > 0, nz, one)
    zall = xp.concat([dzg_u, dzb_u], axis=1) / nz_safe[:, None]
    # a certificate's multipliers lie in the dual cone of the finite sides: a part of the wrong sign on a side
    # without a bound makes the support +inf (no certificate). Dropped, it shows in ``stat`` (far projections:
    # δz ~ 1e7 with negative parts on rows bounded above only had Cᵀδz ≈ 0 and a "negative" support)
    zall = xp.where(rows.finU, zall, xp.minimum(zall, zero))
    zall = xp.where(rows.finL, zall, xp.maximum(zall, zero))
    stat = inf_norm(xp, rmv(qp.C, zall[:, :qp.m]) + zall[:, qp.m:])
    supp = _support(xp, rows, zall, zero)
    # rounding of the support function itself (huge finite bounds make it meaningless)
    supp_err = 1e2 * eps * xp.sum(xp.abs(rows.Uf) * xp.maximum(zall, zero) + xp.abs(rows.Lf) * xp.maximum(-zall, zero),
                                  axis=1)
    margin_p = xp.maximum(1e3 * tol.eps_inf + 0.0 * stat, 10.0 * x1 * stat) + supp_err
    return (nz > 0) & (nz < 1.0 / (eps * eps)) & (stat <= tol.eps_inf) & (supp < -margin_p)


def _dual_certificate(xp, qp, rows, num, tol, dx, x1, z1):
    """``δx`` certifies the QP unbounded: ``Pδx ≈ 0``, ``qᵀδx < 0``, ``Gδx`` in the recession cone.

    A bounded problem admits none beyond ``‖z̄‖₁·rec + ‖x̄‖₁·‖Pδx‖`` (``z̄`` dual feasible): the margin
    uses the current iterate as ``x̄, z̄``. Its floor ``1e3 ε_inf`` is relative to the cost's size below 1:
    ``qᵀδx`` is at most ``‖q‖₁`` with ``‖δx‖∞ = 1``, so an absolute floor would never certify an unbounded
    problem whose cost is below it (``q = -1e-6``: no certificate, and the iterates, whose residuals all lie
    within 1000 tolerances of 0, ended SOLVED_INACCURATE at a finite point).
    """
    one, zero, inf = num.one, num.zero, num.inf
    floor = 1e3 * tol.eps_inf * xp.minimum(inf_norm(xp, qp.q), one)
    nx = inf_norm(xp, dx)
    nx_safe = xp.where(nx > 0, nx, one)
    dxn = dx / nx_safe[:, None]
    Pdx = inf_norm(xp, mv(qp.P, dxn))
    qdx = xp.sum(qp.q * dxn, axis=1)
    gdx = xp.concat([mv(qp.C, dxn), dxn], axis=1)
    up_bad = xp.where(rows.finU, gdx, -inf)  # finite upper side: G δx <= 0
    lo_bad = xp.where(rows.finL, -gdx, -inf)  # finite lower side: G δx >= 0
    rec = xp.max(xp.maximum(up_bad, lo_bad), axis=1)
    rec = xp.maximum(rec, zero)
    margin = xp.maximum(floor + 0.0 * rec, 10.0 * (z1 * rec + x1 * Pdx))
    return (nx > 0) & (Pdx <= tol.eps_inf) & (qdx < -margin) & (rec <= tol.eps_inf)


def certificates(xp: Any, qp: BatchQP, rows: Rows, num: Numerics, tol: Tolerances, d: tuple[Any, Any, Any],
                 point: KKTPoint) -> tuple[Any, Any]:
    """Primal and dual infeasibility certificates, (b,) bool each.

    ``d``: the unscaled direction ``(δx, δz, δz_box)``; ``point``: the current unscaled iterate.
    """
    dx, dzg_u, dzb_u = d
    x1 = xp.sum(xp.abs(point.x), axis=1)
    z1 = xp.sum(xp.abs(xp.concat([point.z, point.z_box], axis=1)), axis=1)
    pinf = _primal_certificate(xp, qp, rows, num, tol, dzg_u, dzb_u, x1)
    # the multipliers themselves, the same test: on an infeasible element they diverge along a certificate, and
    # once they are large the direction (of a system capped at dmax) loses its accuracy while z/‖z‖ keeps
    # converging (Cᵀz + z_box = −(Px + q) + the dual residual, bounded, over ‖z‖ → ∞). A vector passing the test
    # is a certificate whichever way it was found (the margin holds a feasible problem's to ‖x̄‖₁ ‖Cᵀz + z_box‖
    # alike)
    pinf = pinf | _primal_certificate(xp, qp, rows, num, tol, point.z, point.z_box, x1)
    return pinf, _dual_certificate(xp, qp, rows, num, tol, dx, x1, z1)


def finish(xp: Any, loop: LoopState, num: Numerics, codes: StatusCodes, final: bool) -> IPMResult:
    """The result from the best points; ``final``: unfinished elements become SOLVED_INACCURATE / MAX_ITER.

    An unfinished element is SOLVED_INACCURATE when its best point is within 1000 times every
    tolerance, else MAX_ITER (TIME_LIMIT was set already). Infeasible and failed elements get NaN.
    """
    bst, status = loop.best, loop.status
    if final:
        running = status == RUNNING
        status = codes.set(status, running & bst.near & xp.isfinite(bst.pres), "SOLVED_INACCURATE")
        status = codes.set(status, status == RUNNING, "MAX_ITER")
    bad = ((status == CODES["PRIMAL_INFEASIBLE"]) | (status == CODES["DUAL_INFEASIBLE"])
           | (status == CODES["NUMERICAL_ERROR"]))
    nan = xp.full((), math.nan, dtype=num.dtype, device=num.device)
    x, z, zb = (xp.where(bad[:, None], nan, a) for a in (bst.x, bst.z, bst.z_box))
    return IPMResult(x, z, zb, status, loop.iterations, bst.pres, bst.dres, bst.gap)
