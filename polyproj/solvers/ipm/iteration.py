"""The interior-point iteration over a named state: init, step, terminate.

:func:`run` is the loop: :func:`init` builds what stays fixed for a batch (:class:`Setup`) and the
first :class:`~.state.LoopState`; every iteration applies the termination test
(:func:`~.termination.record`) and, while some element runs, one predictor–corrector :func:`step`.
A run can stop early and hand back a :class:`~.state.ResumeState` from which a subset of its
elements continues exactly where it stopped (batch compaction, :mod:`.batch`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from array_api_compat import device as _device

from .direction import corrector, direction, mean_complementarity, residuals, rhs, stationarity_error, step_length
from .kkt import KKTSystem
from .problem import BatchQP, Numerics, Rows, numerics, stack_rows
from .result import RUNNING, IPMResult, StatusCodes
from .scaling import ScaledQP, equality_pattern, ruiz, scale
from .state import Iterate, KKTPoint, LoopState, ResumeState
from .termination import Tolerances, certificates, finish, kkt_point, record, tolerances

__all__ = ["Settings", "Setup", "init", "run", "start", "step"]


@dataclass(frozen=True)
class Settings:
    """Options of a run: tolerances, iteration limit, Ruiz passes, deadline (``time.perf_counter``) or None.

    ``stall_iter``: stop an element near its tolerances that has stalled for this many iterations
    (:func:`~.termination.record`); None: iterate on to ``max_iter``.
    """

    eps_abs: float
    eps_rel: float
    max_iter: int
    ruiz_iter: int
    deadline: float | None
    stall_iter: int | None = None


@dataclass(frozen=True)
class Setup:
    """What stays fixed while a batch iterates: the problem, its rows and scaling, the KKT system, tolerances."""

    xp: Any
    qp: BatchQP
    num: Numerics
    rows: Rows
    sqp: ScaledQP
    kkt: KKTSystem
    tol: Tolerances
    settings: Settings
    codes: StatusCodes


def init(xp: Any, qp: BatchQP, settings: Settings, resume: ResumeState | None = None) -> tuple[Setup, LoopState]:
    """The :class:`Setup` of a batch and its first loop state (the starting point, or ``resume``'s)."""
    num = numerics(xp, qp.q.dtype, _device(qp.q))
    rows = stack_rows(xp, qp, num)
    if resume is None:
        scaling, e_idx = ruiz(xp, qp.P, qp.C, qp.q, settings.ruiz_iter), equality_pattern(xp, rows.eq)
    else:
        scaling, e_idx = resume.scaling, resume.e_idx
    sqp = scale(xp, qp, rows, scaling, e_idx, num)
    codes = StatusCodes(xp, qp.b, num.device)
    s = Setup(xp, qp, num, rows, sqp, KKTSystem(xp, sqp, num, qp.b),
              tolerances(xp, qp, rows, num, settings.eps_abs, settings.eps_rel), settings, codes)
    if resume is not None:
        return s, resume.loop
    return s, LoopState(0, start(s), None, codes.running, codes.zeros, codes.zeros, codes.zeros, codes.zeros)


def start(s: Setup) -> Iterate:
    """Mehrotra's starting point: one Newton step from ``x = 0``, ``s = z = 1``.

    The slacks and multipliers of the step's end are floored at 1 (multipliers of absent sides 0);
    an element whose step is not finite starts at ``x = 0``. The step's end does not depend on the x it
    starts from (the KKT residuals of a QP are affine in x, s and z held at 1), so a warm start's ``x0``
    is not used: from 0 the step is the same point, without the rounding of a far x0 (1e12 cost 11-17
    iterations more and 4e-10 of accuracy).
    """
    xp, num, r, qp = s.xp, s.num, s.rows, s.qp
    b, n, M = qp.b, qp.n, r.L.shape[1]
    dtype, dev, one, zero = num.dtype, num.device, num.one, num.zero
    x = xp.zeros((b, n), dtype=dtype, device=dev)
    ones_M = xp.ones((b, M), dtype=dtype, device=dev)
    it = Iterate(x, ones_M, r.ml * 1.0, ones_M, r.mu * 1.0, xp.zeros((b, s.sqp.p), dtype=dtype, device=dev))
    fac = s.kkt.factorize_start(r.ml + r.mu, xp.ones((b,), dtype=xp.bool, device=dev))
    d = direction(s.kkt, fac, it, residuals(s.sqp, it), it.sl * it.zl * r.ml, it.su * it.zu * r.mu, r.ml, r.mu)
    x = x + d.x
    y = it.y + d.y if s.sqp.p else it.y
    ok0 = xp.all(xp.isfinite(x), axis=1)
    return Iterate(xp.where(ok0[:, None], x, xp.zeros_like(x)),
                   xp.where(r.mlb, xp.maximum(xp.abs(it.sl + d.sl), one), one),
                   xp.where(r.mlb, xp.maximum(xp.abs(it.zl + d.zl), one), zero),
                   xp.where(r.mub, xp.maximum(xp.abs(it.su + d.su), one), one),
                   xp.where(r.mub, xp.maximum(xp.abs(it.zu + d.zu), one), zero), y)


def _capped(s: Setup, Dl: Any, Du: Any, mask: Any) -> tuple[Any, Any]:
    """``Dl, Du`` capped at ``dmax_lo`` where ``mask`` (b, 1)."""
    xp, zero, cap = s.xp, s.num.zero, s.kkt.reg.dmax_lo * s.num.one
    return xp.where(mask, xp.clip(Dl, zero, cap), Dl), xp.where(mask, xp.clip(Du, zero, cap), Du)


def _factorize(s: Setup, it: Iterate, res: Any, running: Any, status: Any):
    """Factor the iteration's system for ``D = z/s`` (capped at ``dmax``); returns (fac, Dl, Du, status).

    With equality rows the predictor's right-hand side is solved in the factorisation's pass. Where
    the factorisation fails even shifted, ``D`` is capped at ``dmax_lo`` and factored again; what
    still fails is NUMERICAL_ERROR.
    """
    xp, r, reg, zero, one = s.xp, s.rows, s.kkt.reg, s.num.zero, s.num.one
    Dl = xp.clip(it.zl / it.sl * r.ml, zero, reg.dmax * one)
    Du = xp.clip(it.zu / it.su * r.mu, zero, reg.dmax * one)
    pre = (rhs(s.sqp, it, res, it.sl * it.zl * r.ml, it.su * it.zu * r.mu, Dl, Du), -res.rpe) if s.sqp.p else None
    fac = s.kkt.factorize(Dl + Du, running, pre=pre)
    if reg.dmax > reg.dmax_lo and not bool(xp.all(fac.ok | ~running)):
        Dl, Du = _capped(s, Dl, Du, (~fac.ok)[:, None])
        fac = s.kkt.factorize(Dl + Du, running)
    return fac, Dl, Du, s.codes.set(status, running & ~fac.ok, "NUMERICAL_ERROR")


def _search_direction(s: Setup, it: Iterate, point: KKTPoint, status: Any) -> tuple[Iterate, Any]:
    """The corrector direction of the iteration and the status (NUMERICAL_ERROR where it failed).

    A shifted factorisation (:meth:`~.kkt.KKTSystem.factorize`) can leave a direction whose
    stationarity is off by more than a tenth of the tolerance (many equality rows, near-null
    directions): for those elements ``D`` is capped at ``dmax_lo`` instead and the direction computed
    again.
    """
    xp = s.xp
    running = status == RUNNING
    res = residuals(s.sqp, it)
    fac, Dl, Du, status = _factorize(s, it, res, running, status)
    running = status == RUNNING
    mu_c = mean_complementarity(xp, s.rows, it.sl, it.zl, it.su, it.zu)
    dc = corrector(s.kkt, fac, it, res, mu_c, Dl, Du, s.num)
    if fac.any_shifted:
        redo = running & fac.shifted & (stationarity_error(s.sqp, dc, res) > 0.1 * xp.maximum(point.td, point.dres))
        if bool(xp.any(redo)):
            Dl, Du = _capped(s, Dl, Du, redo[:, None])
            fac = s.kkt.factorize(Dl + Du, running)
            status = s.codes.set(status, running & ~fac.ok, "NUMERICAL_ERROR")
            dc = corrector(s.kkt, fac, it, res, mu_c, Dl, Du, s.num)
    return dc, status


def _certify(s: Setup, loop: LoopState, dc: Iterate, point: KKTPoint, status: Any) -> tuple[Any, Any, Any]:
    """Infeasibility certificates from the (unscaled) corrector direction: (status, pin_cnt, din_cnt).

    A primal certificate counts only where the point is not primal feasible.
    """
    xp = s.xp
    running = status == RUNNING
    d = s.sqp.unscale(dc.x, dc.zl, dc.zu, dc.y)
    pinf, dinf = certificates(xp, s.qp, s.rows, s.num, s.tol, d, point)
    pinf = pinf & (point.pres > point.tp)
    dinf = dinf & ~pinf
    pin_cnt = xp.where(pinf, loop.pin_cnt + 1, s.codes.zeros)
    din_cnt = xp.where(dinf, loop.din_cnt + 1, s.codes.zeros)
    status = s.codes.set(status, running & (pin_cnt >= 1), "PRIMAL_INFEASIBLE")
    status = s.codes.set(status, running & (din_cnt >= 1), "DUAL_INFEASIBLE")
    return status, pin_cnt, din_cnt


def _advance(s: Setup, it: Iterate, dc: Iterate, alpha: Any) -> Iterate:
    """``it + alpha dc`` with the entries of absent sides kept inert (s = 1, z = 0)."""
    xp, r, one, zero = s.xp, s.rows, s.num.one, s.num.zero
    a2 = alpha[:, None]
    return Iterate(it.x + a2 * dc.x,
                   xp.where(r.mlb, it.sl + a2 * dc.sl, one), xp.where(r.mlb, it.zl + a2 * dc.zl, zero),
                   xp.where(r.mub, it.su + a2 * dc.su, one), xp.where(r.mub, it.zu + a2 * dc.zu, zero),
                   (it.y + a2 * dc.y) if s.sqp.p else it.y)


def step(s: Setup, loop: LoopState, point: KKTPoint) -> LoopState:
    """One predictor–corrector iteration of the running elements (``point``: the unscaled current iterate).

    The step is 99 % of the way to the boundary (at most 1), the same for primal and dual; elements
    that stop (certified, failed) keep their iterate, and a non-finite new iterate is NUMERICAL_ERROR.
    Returns the state of the next iteration (``it + 1``).
    """
    xp, it = s.xp, loop.iterate
    running = loop.status == RUNNING
    iterations = loop.iterations + xp.astype(running, xp.int32)
    dc, status = _search_direction(s, it, point, loop.status)
    alpha = xp.minimum(0.99 * step_length(s.sqp, it, dc, s.num), s.num.one)
    status, pin_cnt, din_cnt = _certify(s, loop, dc, point, status)
    running = status == RUNNING
    new = _advance(s, it, dc, xp.where(running, alpha, s.num.zero))
    fin = (xp.all(xp.isfinite(new.x), axis=1)
           & xp.all(xp.isfinite(new.sl * new.zl + new.su * new.zu), axis=1))
    status = s.codes.set(status, running & ~fin, "NUMERICAL_ERROR")
    keep = (status == RUNNING)[:, None]
    kept = Iterate(*(xp.where(keep, a, o) for a, o in
                     zip((new.x, new.sl, new.zl, new.su, new.zu, new.y), (it.x, it.sl, it.zl, it.su, it.zu, it.y))))
    return LoopState(loop.it + 1, kept, loop.best, status, iterations, pin_cnt, din_cnt, loop.stale, loop.ref)


def terminate(s: Setup, loop: LoopState) -> tuple[LoopState, KKTPoint, int]:
    """The termination test at the current iterate: the updated state, the point, the running count."""
    xp = s.xp
    it = loop.iterate
    x, z, z_box = s.sqp.unscale(it.x, it.zl, it.zu, it.y)
    point = kkt_point(xp, s.qp, s.rows, s.tol, s.num.zero, x, z, z_box)
    loop = record(xp, s.codes, point, loop, s.settings.stall_iter)
    n_run = int(xp.sum(xp.astype(loop.status == RUNNING, xp.int32)))
    return loop, point, n_run


def run(xp: Any, qp: BatchQP, settings: Settings, resume: ResumeState | None = None,
        stop_frac: float | None = None) -> IPMResult | tuple[IPMResult, ResumeState]:
    """The IPM on a batch: the final :class:`~.result.IPMResult`, or a partial one and its resume state.

    ``stop_frac``: return ``(partial result, state)`` as soon as at most this fraction of the
    elements is still running (their status stays :data:`~.result.RUNNING`); ``resume``: such a state
    (restricted to the running elements) to continue from, with the scaling and equality pattern it
    was made with.
    """
    s, loop = init(xp, qp, settings, resume)
    it0 = loop.it
    while True:
        loop, point, n_run = terminate(s, loop)
        if n_run == 0 or loop.it >= settings.max_iter:
            break
        if stop_frac is not None and loop.it > it0 and n_run <= stop_frac * qp.b:
            return finish(xp, loop, s.num, s.codes, final=False), ResumeState(s.sqp.scaling, s.sqp.e_idx, loop)
        if settings.deadline is not None and time.perf_counter() > settings.deadline:
            loop = replace(loop, status=s.codes.set(loop.status, loop.status == RUNNING, "TIME_LIMIT"))
            break
        loop = step(s, loop, point)
    return finish(xp, loop, s.num, s.codes, final=True)
