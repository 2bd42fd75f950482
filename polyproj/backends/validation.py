"""What polyproj checks around every backend call: the guard of ``QPSolver.solve`` / ``solve_batch``.

:class:`~polyproj.backends.base.QPSolver` wraps the ``solve`` and ``solve_batch`` of every subclass
(built-in or third party, in ``__init_subclass__``) with :func:`guard`, so no backend repeats it:

1. **Input**: ``solve`` takes a :class:`~polyproj.problem.QP` (and a warm start that fits it, its non-finite
   parts dropped: per element for a batch, where they become NaN); an indefinite
   P (``QP(check_psd=False)``) is NON_CONVEX for every backend; a problem with no variables
   (``n = 0``) is answered here (SOLVED when ``l <= 0 <= u``, else PRIMAL_INFEASIBLE), never handed
   to a solver.
2. **Scale**: data far from unit scale is solved in normalised units (:mod:`.scaling`). An answer far below
   that normalisation's σ is solved again at its own size; one that the re-solve does not confirm is
   SOLVED_INACCURATE, and is judged (below) in the units of its own size, not σ's: NUMERICAL_ERROR where it is
   not a solution there.
3. **Exceptions**: anything a backend raises that is not a :class:`~polyproj.errors.PolyprojError`
   (``SystemExit`` included) becomes a :class:`~polyproj.errors.SolverError` naming the backend (the
   original is chained). A backend that writes into the arrays it is given (the QP's, a batch's
   vectors) is a SolverError too: its answer would be judged against the changed data, and the
   caller's problem would be silently changed (dense arrays; small ones are compared with a copy, large ones
   by checksum). So is one that rebinds a field of the frozen QP (``object.__setattr__(qp, "q", ...)``: by
   identity), the field put back.
4. **Output**: the result must be a :class:`~polyproj.solution.Solution` (``BatchSolution`` for a
   batch, one element per problem) with ``x``, ``z``, ``z_box`` of shapes ``(n,)``, ``(m,)``,
   ``(n,)``, else SolverError. Then a cheap scale-relative residual test (below) decides whether a
   claimed SOLVED stands. Claims of PRIMAL_INFEASIBLE and DUAL_INFEASIBLE are checked (an LP, P's
   definiteness), and NON_CONVEX where P is known PSD (decided by the QP, or its smallest eigenvalue) is
   NUMERICAL_ERROR.
   ``solve_projections`` (guarded for exceptions as the other two) must return a
   :class:`~polyproj.backends.projection.ProjectionStart` of the batch's shapes (``y`` (N, n), ``mult``
   (N, m + 2n), ``mu`` (N, p), N statuses), else SolverError: checked where the projection pipeline
   receives it (:func:`check_projection_start`), which verifies its points.
5. **Time**: an answer that comes later than ``time_limit`` (wall clock around the whole call) is
   TIME_LIMIT, never SOLVED (its ``x`` is kept).

The residual test: ``r_p`` is the largest constraint violation and ``S_p`` the largest of ``|x|``,
``|Cx|`` and the finite bounds (below 1e15); ``r_d = ‖Px + q + Cᵀz + z_box‖∞`` and ``S_d`` the
largest of ``|Px|``, ``|q|``, ``|Cᵀz|``, ``|z_box|`` (the dual part only for backends that return
multipliers). What the solver promised is about ``t = eps_abs · unit + eps_rel · S`` (``unit`` is 1,
or the factor back from normalised units; both tolerances floored at 1e-12). For each of the two:

- a non-finite ``x`` (or multipliers) with status SOLVED / SOLVED_INACCURATE → NUMERICAL_ERROR;
- ``r > max(GROSS · S, 10 · INACCURATE_FACTOR · t)`` (x is not a solution at any tolerance) →
  NUMERICAL_ERROR;
- SOLVED with ``r > INACCURATE_FACTOR · t`` → SOLVED_INACCURATE.

With multipliers, two gross tests of their signs → NUMERICAL_ERROR: a multiplier on a side without a
bound (``z > 0`` is an upper side) above ``max(GROSS · S_d, 10 · INACCURATE_FACTOR · t_d)``, and
complementarity ``max |z| · (distance of its side's bound)`` above ``max(GROSS · S_p S_d,
10 · INACCURATE_FACTOR · (t_p S_d + t_d S_p), 10 · eps_abs · unit)``: a stationary point with multipliers of the
wrong sign is not a minimiser. A SOLVED answer whose complementarity (the duality gap it leaves) is above
``INACCURATE_FACTOR · (t_p S_d + t_d S_p + eps_abs · unit)`` is SOLVED_INACCURATE: feasible and stationary,
but not optimal (a multiplier on a bound that ``x`` does not meet).

It catches broken answers, not solver-level inaccuracy: ``polyproj check`` tests the contract at the
requested tolerance. What was changed is said in ``info["validation"]`` (``info["elements"][i]``
for a batch), with the status the backend claimed.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp
from array_api_compat import array_namespace
from array_api_compat import device as _device

from ..errors import PolyprojError, ProblemError, SolverError
from ..problem import QP
from ..solution import BatchSolution, ElementQPs, Solution, Status
from . import scaling
from .convexity import is_nonconvex, is_strictly_convex
from .projection import ProjectionStart

__all__ = ["GROSS", "INACCURATE_FACTOR", "Promise", "check_batch", "check_projection_start", "check_solution", "guard",
           "residuals"]

GROSS = 1e-2
INACCURATE_FACTOR = 1e3
#: claims of infeasibility (or unboundedness) checked by an LP per batch whose elements have constraints of their
#: own (the others stand as claimed)
INFEASIBILITY_LPS = 64

_HUGE = scaling.IGNORE

#: ids of the solver instances whose call is being guarded in this context: a backend calling its
#: own ``solve`` (the default ``solve_batch`` loop, ``super().solve``) is checked once, by the outer call
_INSIDE: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("polyproj_guarded", default=frozenset())


# --------------------------------------------------------------------------- residual test
def _finite_bound_max(*arrays: np.ndarray) -> np.ndarray:
    """Row-wise largest finite |bound| below 1e15 of 2-D arrays (batch, k) -> (batch,)."""
    out = None
    for a in arrays:
        v = np.where(np.isfinite(a) & (np.abs(a) < _HUGE), np.abs(a), 0.0)
        m = np.max(v, axis=1, initial=0.0)
        out = m if out is None else np.maximum(out, m)
    return out


def _bounded(bound: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The sides that count as bounds in the multipliers' tests: finite below 1e15, or finite with ``v`` at them.

    Finite means below 1e20 (the QP's "no bound"); at them, to 1e-6 relative.

    A side at 1e15 or more is most often a finite stand-in for infinity (9.99e19) that ``v`` is far from: its
    multiplier is then judged as on a side without a bound (a rounding-level z times a distance of 1e19 would fail
    complementarity); but an answer at x = 1e16 on a bound of 1e16 has its multiplier there.
    """
    a = np.abs(bound)
    return np.isfinite(bound) & ((a < _HUGE) | (np.abs(bound - v) <= 1e-6 * a))


def _sides(z: np.ndarray, v: np.ndarray, lo: np.ndarray, hi: np.ndarray, weight: Any = 1.0
           ) -> tuple[np.ndarray, np.ndarray]:
    """``(sign, comp)`` of multipliers ``z`` on values ``v`` between ``lo`` and ``hi``, the last axis reduced.

    ``sign``: the largest multiplier on a side without a bound (:func:`_bounded`), times its
    row's ``weight`` (:func:`_force`); ``comp``: the largest ``|z| · distance`` to the bound of its side
    (complementarity, invariant to a row's scale).
    """
    pos, neg = np.maximum(z, 0.0), np.maximum(-z, 0.0)
    with np.errstate(invalid="ignore"):
        up, down = _bounded(hi, v), _bounded(lo, v)
        sign = np.maximum(np.where(up, 0.0, pos), np.where(down, 0.0, neg)) * weight
        comp = np.maximum(np.where(up, pos * np.abs(np.where(up, hi, 0.0) - v), 0.0),
                          np.where(down, neg * np.abs(v - np.where(down, lo, 0.0)), 0.0))
    return np.max(sign, axis=-1, initial=0.0), np.max(comp, axis=-1, initial=0.0)


def _force(qp: QP) -> np.ndarray:
    """Each row's largest |entry| (kept in ``qp.memo``): a multiplier's wrong sign is judged by its force z·|row|.

    The sign test compares a multiplier with the stationarity scale. In raw units a row of norm 3e6 with z =
    −8.8e-8 on its upper side (a force of −0.26) passed as rounding, and HiGHS's SOLVED point, O(1) off with a
    duality gap of 0.13, stood.
    """
    hit = qp.memo.get("validation_force")
    if hit is None:
        from ..problem import _row_max

        hit = qp.memo["validation_force"] = _row_max(qp.C) if qp.m else np.zeros(0)
    return hit


def _matmul_rows(M: Any, X: np.ndarray) -> np.ndarray:
    """Rows of ``X @ Mᵀ`` for dense or sparse M."""
    if sp.issparse(M):
        return np.asarray((M @ X.T).T)
    return X @ M.T


def residuals(qp: QP, X: np.ndarray, Z: np.ndarray, ZB: np.ndarray, vecs: dict[str, np.ndarray],
              duals: bool) -> tuple[np.ndarray, ...]:
    """``(r_p, S_p, r_d, S_d, r_s, r_c)`` per element of a batch (module docstring); the dual ones 0 without duals."""
    b = X.shape[0]

    def vec(k):
        v = vecs.get(k)
        return np.broadcast_to(getattr(qp, k) if v is None else v, (b, getattr(qp, k).shape[0]))

    q, l, u, lb, ub = (vec(k) for k in ("q", "l", "u", "lb", "ub"))
    zeros = np.zeros(b)
    with np.errstate(invalid="ignore", over="ignore"):
        CX = _matmul_rows(qp.C, X) if qp.m else np.zeros((b, 0))
        r_p = np.maximum(np.max(np.maximum(CX - u, l - CX), axis=1, initial=0.0),
                         np.max(np.maximum(X - ub, lb - X), axis=1, initial=0.0))
        s_p = np.maximum.reduce([np.max(np.abs(X), axis=1, initial=0.0), np.max(np.abs(CX), axis=1, initial=0.0),
                                 _finite_bound_max(l, u, lb, ub)])
        if not duals:
            return r_p, s_p, zeros, zeros, zeros, zeros
        PX = _matmul_rows(qp.P, X)
        CZ = np.asarray(Z @ qp.C) if qp.m else np.zeros_like(X)
        r_d = np.max(np.abs(PX + q + CZ + ZB), axis=1, initial=0.0)
        s_d = np.maximum.reduce([np.max(np.abs(a), axis=1, initial=0.0) for a in (PX, q, CZ, ZB)])
        sign_c, comp_c = _sides(Z, CX, l, u, _force(qp))
        sign_b, comp_b = _sides(ZB, X, lb, ub)
    return r_p, s_p, r_d, s_d, np.maximum(sign_c, sign_b), np.maximum(comp_c, comp_b)


def _bound_scale(qp: QP) -> float:
    """Largest finite |bound| below 1e15 of one QP, kept in ``qp.memo`` (the QP never changes)."""
    hit = qp.memo.get("validation_bound_scale")
    if hit is None:
        hit = qp.memo["validation_bound_scale"] = float(
            _finite_bound_max(*(v[None] for v in (qp.l, qp.u, qp.lb, qp.ub)))[0])
    return hit


def _single_residuals(qp: QP, x: np.ndarray, z: np.ndarray, zb: np.ndarray, duals: bool) -> tuple[float, ...]:
    """:func:`residuals` for one finite answer, in 1-D (a few µs on small problems, where it matters)."""
    cx = qp.C @ x if qp.m else x[:0]
    r_p = max(float(np.max(cx - qp.u, initial=0.0)), float(np.max(qp.l - cx, initial=0.0)),
              float(np.max(x - qp.ub, initial=0.0)), float(np.max(qp.lb - x, initial=0.0)))
    s_p = max(float(np.max(np.abs(x), initial=0.0)), float(np.max(np.abs(cx), initial=0.0)), _bound_scale(qp))
    if not duals:
        return r_p, s_p, 0.0, 0.0, 0.0, 0.0
    px = qp.P @ x
    cz = qp.C.T @ z if qp.m else px * 0.0
    r_d = float(np.max(np.abs(px + qp.q + cz + zb), initial=0.0))
    s_d = max(float(np.max(np.abs(v), initial=0.0)) for v in (px, qp.q, cz, zb))
    sign, comp = _single_sides(qp, np.concatenate((z, zb)), np.concatenate((cx, x)))
    return r_p, s_p, r_d, s_d, sign, comp


def _single_sides(qp: QP, z: np.ndarray, v: np.ndarray) -> tuple[float, float]:
    """:func:`_sides` of one answer over the rows of C then the bounds, the QP's side masks kept in ``qp.memo``.

    Every side that is a bound (:func:`_bounded`) is one entry of (index, sign, bound): ``max(sign z, 0) |bound −
    v|`` is its complementarity; every other side one of (index, sign): ``max(sign z, 0)`` its sign test. Sides at
    1e15 or more are decided per answer (v at them or not).
    """
    hit = qp.memo.get("validation_sides")
    if hit is None:
        lo, hi = np.concatenate((qp.l, qp.lb)), np.concatenate((qp.u, qp.ub))
        up, down = np.isfinite(hi) & (np.abs(hi) < _HUGE), np.isfinite(lo) & (np.abs(lo) < _HUGE)
        sides = np.concatenate((np.flatnonzero(up), np.flatnonzero(down)))
        signs = np.concatenate((np.ones(int(up.sum())), -np.ones(int(down.sum()))))
        free = np.concatenate((np.flatnonzero(~up), np.flatnonzero(~down)))
        free_signs = np.concatenate((np.ones(int((~up).sum())), -np.ones(int((~down).sum()))))
        weight = np.concatenate((_force(qp), np.ones(qp.n)))
        free_weight = np.concatenate((weight[~up], weight[~down]))
        # the free sides' bounds: ±inf, or finite at 1e15 and more (:func:`_bounded`: a bound where v meets it)
        free_bounds = np.concatenate((hi[~up], lo[~down]))
        huge = np.flatnonzero(np.isfinite(free_bounds))
        hit = qp.memo["validation_sides"] = (sides, signs, np.concatenate((hi[up], lo[down])), free,
                                             free_signs * free_weight, huge, free_bounds[huge])
    sides, signs, bounds, free, free_signs, huge, huge_bounds = hit
    zf = z[free] * free_signs
    if huge.size:  # a side at 1e15 or more that v meets is a bound: its multiplier is judged by complementarity
        near = _bounded(huge_bounds, v[free[huge]])
        if near.any():
            at = huge[near]
            sides = np.concatenate((sides, free[at]))
            signs = np.concatenate((signs, np.sign(free_signs[at])))
            bounds = np.concatenate((bounds, huge_bounds[near]))
            zf[at] = 0.0
    sign = float(np.max(zf, initial=0.0))
    comp = float(np.max(np.maximum(z[sides] * signs, 0.0) * np.abs(bounds - v[sides]), initial=0.0))
    return max(sign, 0.0), comp


@dataclass(frozen=True)
class Promise:
    """What a backend promised: tolerances and the units of the residuals (1 unless normalised)."""

    eps_abs: float
    eps_rel: float
    unit_p: float = 1.0
    unit_d: float = 1.0

    @classmethod
    def of(cls, settings: dict[str, Any], scale: scaling.Scaling | None = None) -> Promise:
        """From a backend's settings (and the normalisation its problem was solved in)."""
        eps_abs = max(float(settings.get("eps_abs") or 0.0), 1e-12)
        eps_rel = max(float(settings.get("eps_rel") or 0.0), 1e-12)
        if scale is None:
            return cls(eps_abs, eps_rel)
        row_max = float(np.max(1.0 / scale.rows, initial=1.0))
        return cls(eps_abs, eps_rel, scale.sigma * max(1.0, row_max), 1.0 / scale.q_factor)


def _verdict(status: Status, finite: bool, res: tuple[float, ...], promise: Promise, said: str = ""
             ) -> tuple[Status, str]:
    """The status that stands after the residual test, and why it changed ('' if it did not).

    ``said``: what the backend claimed, where the guard changed it already (an answer not confirmed at its own size).
    """
    if not status.ok:
        return status, ""
    said = said or status.name
    if not finite:
        return Status.NUMERICAL_ERROR, f"the backend said {said} but returned non-finite values"
    r_p, s_p, r_d, s_d, r_s, r_c = res
    inaccurate = False
    tol = {}
    for what, r, s, unit in (("the constraints", r_p, s_p, promise.unit_p), ("stationarity", r_d, s_d, promise.unit_d)):
        t = tol[what] = promise.eps_abs * unit + promise.eps_rel * s
        if not r <= max(GROSS * s, 10 * INACCURATE_FACTOR * t):
            return Status.NUMERICAL_ERROR, (f"the backend said {said} but x violates {what} by {r:.3g} "
                                            f"(the data's scale there: {s:.3g}): not a solution")
        inaccurate |= r > INACCURATE_FACTOR * t
    # the multipliers' signs and complementarity, gross failures only (a stationary point of the wrong sign
    # is not a minimiser): a multiplier on a side without a bound, or |z| times the distance to its bound
    t_d, t_p = tol["stationarity"], tol["the constraints"]
    if not r_s <= max(GROSS * s_d, 10 * INACCURATE_FACTOR * t_d):
        return Status.NUMERICAL_ERROR, (f"the backend said {said} but a multiplier of {r_s:.3g} sits on a "
                                        "side without a bound (the sign convention: z > 0 at an upper bound): not a "
                                        "solution")
    # complementarity's tolerance: |z| times a distance, each at its own (t_c), and eps_abs in the objective's
    # units, where an interior-point method stops (its μ) whatever the scales: a weakly active bound at the
    # origin leaves z · distance ~ 1e-11 with every scale ~1e-5 (t_c ~ 1e-15; that was "not a solution"). The
    # gross test's floor is 10 eps_abs, not 1e4: at small scales (s_p s_d ~ 0.1) 1e4 eps_abs let a multiplier on
    # a bound x misses by its whole width pass
    t_c = t_p * s_d + t_d * s_p
    gap_floor = promise.eps_abs * promise.unit_p * promise.unit_d
    t_gap = t_c + gap_floor
    if not r_c <= max(GROSS * s_p * s_d, 10 * INACCURATE_FACTOR * t_c, 10 * gap_floor):
        return Status.NUMERICAL_ERROR, (f"the backend said {said} but complementarity fails by {r_c:.3g} (a "
                                        "multiplier on a bound x does not meet; the scale there: "
                                        f"{s_p * s_d:.3g}): not a solution")
    if status is Status.SOLVED and inaccurate:
        return Status.SOLVED_INACCURATE, (f"the backend said SOLVED but its residuals (primal {r_p:.3g}, dual "
                                          f"{r_d:.3g}) exceed {INACCURATE_FACTOR:g} x the tolerance")
    if status is Status.SOLVED and r_c > INACCURATE_FACTOR * t_gap:
        # feasible and stationary, but a multiplier sits on a bound that x does not meet: x is not optimal
        # (DAQP on LPs with a cost of 1e6: x 2.6e-5 inside its bound, a gap of 26)
        return Status.SOLVED_INACCURATE, (f"the backend said SOLVED but complementarity misses by {r_c:.3g} (the "
                                          f"duality gap), {INACCURATE_FACTOR:g} x its tolerance {t_gap:.3g}")
    return status, ""


def _unboundedness_verdict(qp: QP, element: QP | None = None) -> tuple[Status, str]:
    """A claim of unboundedness, checked: PRIMAL_INFEASIBLE or NUMERICAL_ERROR where it cannot hold, else the claim.

    PRIMAL_INFEASIBLE where no point meets the constraints (:func:`.feasibility.certainly_empty`: the IPM said
    DUAL_INFEASIBLE for ``x₁ <= 1, x₁ >= 2`` with a descent ray, and unbounded needs a feasible set); then
    NUMERICAL_ERROR where every variable has both bounds finite (a continuous objective on a compact set is bounded),
    P is positive definite (the objective is bounded below), or an LP proves that no direction of the constraints'
    recession cone descends with ``P d = 0`` (:func:`.feasibility.no_descent_ray`: Clarabel called an LP whose
    optimum lies on a row side at −1e10 unbounded). ``element``: the problem whose ``q`` the ray test takes (the
    batch element of a batch sharing ``qp``'s constraints; None: no ray test).
    """
    from . import feasibility

    why = feasibility.certainly_empty(qp)
    if why is not None:
        return Status.PRIMAL_INFEASIBLE, f"the backend said DUAL_INFEASIBLE (unbounded) but the set is empty: {why}"
    if np.isfinite(qp.lb).all() and np.isfinite(qp.ub).all():
        return Status.NUMERICAL_ERROR, ("the backend said DUAL_INFEASIBLE (unbounded) but every variable has a finite "
                                        "lower and upper bound: the feasible set is bounded, so is the objective")
    if is_strictly_convex(qp):
        return Status.NUMERICAL_ERROR, ("the backend said DUAL_INFEASIBLE (unbounded) but P is positive definite: "
                                        "the objective is bounded below")
    why = feasibility.no_descent_ray(element) if element is not None else None
    if why is not None:
        return Status.NUMERICAL_ERROR, ("the backend said DUAL_INFEASIBLE (unbounded) but the objective is bounded: "
                                        f"{why}")
    return Status.DUAL_INFEASIBLE, ""


def _infeasibility_verdict(qp: QP) -> tuple[Status, str]:
    """A claim of primal infeasibility, checked by a point of the constraints (:mod:`.feasibility`).

    NUMERICAL_ERROR where the point satisfies every constraint to rounding (the claim is refuted), else the claim.
    """
    from . import feasibility

    x = feasibility.interior_point(qp)  # (its LP solved once per problem: the constraints of a QP never change)
    if not feasibility.refutes(qp, x):
        return Status.PRIMAL_INFEASIBLE, ""
    return Status.NUMERICAL_ERROR, ("the backend said PRIMAL_INFEASIBLE but a point (found by an LP) satisfies every "
                                    f"constraint to rounding (largest violation {qp.primal_violation(x):.3g}): the "
                                    "claim is refuted")


def _convexity_verdict(qp: QP) -> tuple[Status, str]:
    """A claim of non-convexity, checked: NUMERICAL_ERROR where P is known PSD, else the claim.

    NON_CONVEX says that P is not PSD; the guard answers it itself before any backend runs (:func:`is_nonconvex`).
    Known PSD: decided so by the QP's construction (``psd_known``), or P's smallest eigenvalue, computed, is not
    below ``-1e-8 max|P|`` (:func:`is_nonconvex`'s threshold). OSQP said NON_CONVEX for P = I after a warm start at
    1e50 (its step size ρ had run off).
    """
    from ..problem import matrix_scale, smallest_eigenvalue
    from .cache import converted

    if getattr(qp, "psd_known", False):
        why = "the QP's construction found P positive semidefinite"
    else:
        lam = converted("smallest_eigenvalue", (qp.P,), None, lambda: smallest_eigenvalue(qp.P, iterative=True))
        if lam is None or lam < -1e-8 * matrix_scale(qp.P):
            return Status.NON_CONVEX, ""
        why = f"P's smallest eigenvalue is {lam:.3g} (max|P| {matrix_scale(qp.P):.3g}): P is positive semidefinite"
    return Status.NUMERICAL_ERROR, f"the backend said NON_CONVEX but {why}: the claim is refuted"


def _as_float(a: Any, shape: tuple[int, ...], what: str, backend: str) -> np.ndarray:
    if np.iscomplexobj(a):  # float64 conversion would drop the imaginary part with only a warning
        if np.any(np.imag(a) != 0):
            raise SolverError(f"backend {backend!r} returned {what} with non-zero imaginary parts; expected real "
                              "numbers")
        a = np.real(a)
    try:
        arr = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise SolverError(f"backend {backend!r} returned {what} that is not numeric: {exc}") from exc
    if arr.shape != shape:
        raise SolverError(f"backend {backend!r} returned {what} of shape {arr.shape}; expected {shape}")
    return arr


def check_solution(qp: QP, sol: Any, backend: str, settings: dict[str, Any], duals: bool = True,
                   elapsed: float | None = None, scale: scaling.Scaling | None = None) -> Solution:
    """Hold one backend answer to the contract (module docstring); return the Solution that stands."""
    if not isinstance(sol, Solution):
        raise SolverError(f"backend {backend!r} returned {type(sol).__name__} from solve(); "
                          "expected a polyproj.Solution")
    if not isinstance(sol.status, Status):
        raise SolverError(f"backend {backend!r} returned status {sol.status!r}; expected a polyproj.Status")
    x = _as_float(sol.x, (qp.n,), "x", backend)
    z = _as_float(sol.z, (qp.m,), "z", backend)
    zb = _as_float(sol.z_box, (qp.n,), "z_box", backend)
    status, note = sol.status, ""
    if status.ok:
        finite = bool(np.isfinite(x).all() and (not duals or (np.isfinite(z).all() and np.isfinite(zb).all())))
        res = _single_residuals(qp, x, z, zb, duals) if finite else (0.0,) * 6
        status, note = _verdict(status, finite, res, Promise.of(settings, scale), _claimed(sol.info))
    elif status is Status.PRIMAL_INFEASIBLE:
        status, note = _infeasibility_verdict(qp)
    elif status is Status.DUAL_INFEASIBLE:
        status, note = _unboundedness_verdict(qp, qp)
    elif status is Status.NON_CONVEX:
        status, note = _convexity_verdict(qp)
    status, note = _time_verdict(status, note, settings, elapsed)
    info = sol.info if not note else {**sol.info, **_noted(sol.info, note, sol.status.name)}
    if (status is sol.status and x is sol.x and z is sol.z and zb is sol.z_box and sol.qp is qp
            and sol.backend):
        return sol
    return replace(sol, x=x, z=z, z_box=zb, status=status, qp=qp, info=info, backend=sol.backend or backend)


def _claimed(info: dict) -> str:
    """What the backend claimed where the guard changed its status already (its note there), else ''."""
    return str(info.get("claimed_status", "")) if info.get("validation") else ""


def _noted(info: dict, note: str, claimed: str) -> dict[str, str]:
    """``validation`` and ``claimed_status`` for a new ``note`` on an answer whose backend claimed ``claimed``.

    The one rule for the guard's notes, on a single answer's ``info`` or a batch element's: a note made already (an
    answer not confirmed at its own size) is kept before the new one, with the status the backend claimed first.
    """
    prior = info.get("validation")
    if not prior:
        return {"validation": note, "claimed_status": claimed}
    return {"validation": f"{prior}; {note}", "claimed_status": str(info.get("claimed_status", claimed))}


def _time_verdict(status: Status, note: str, settings: dict[str, Any], elapsed: float | None) -> tuple[Status, str]:
    limit = settings.get("time_limit")
    if status.ok and limit is not None and elapsed is not None and elapsed > float(limit):
        return Status.TIME_LIMIT, (note + "; " if note else "") + (
            f"the answer came after {elapsed:.3g} s, past time_limit = {float(limit):g} s")
    return status, note


def check_batch(qp: QP, vecs: dict[str, np.ndarray], size: int, bs: Any, backend: str, settings: dict[str, Any],
                duals: bool = True, elapsed: float | None = None,
                scale: scaling.Scaling | list[scaling.Scaling | None] | None = None) -> BatchSolution:
    """Hold a backend's batch answer to the contract, element by element (vectorised).

    ``scale``: the normalisation the answers were judged in, one for all or one per element (:func:`_replanned_batch`).
    """
    if not isinstance(bs, BatchSolution):
        raise SolverError(f"backend {backend!r} returned {type(bs).__name__} from solve_batch(); "
                          "expected a polyproj.BatchSolution")
    if len(bs.status) != size:
        raise SolverError(f"backend {backend!r} returned {len(bs.status)} statuses for a batch of {size}")
    wrong = next((s for s in bs.status if not isinstance(s, Status)), None)
    if wrong is not None:
        raise SolverError(f"backend {backend!r} returned a batch status {wrong!r} of type {type(wrong).__name__}; "
                          "expected polyproj.Status members")
    X = _as_float(bs.x, (size, qp.n), "batch x", backend)
    Z = _as_float(bs.z, (size, qp.m), "batch z", backend)
    ZB = _as_float(bs.z_box, (size, qp.n), "batch z_box", backend)
    ok = np.array([s.ok for s in bs.status], dtype=bool)
    statuses, notes = list(bs.status), {}
    given = bs.info.get("elements") if isinstance(bs.info, dict) else None
    given = given if isinstance(given, (list, tuple)) and len(given) == size else [{}] * size
    given = [g if isinstance(g, dict) else {} for g in given]
    if ok.any():
        idx = np.flatnonzero(ok)
        sub = {k: v[idx] for k, v in vecs.items()}
        finite = np.isfinite(X[idx]).all(axis=1)
        if duals:
            finite &= np.isfinite(Z[idx]).all(axis=1) & np.isfinite(ZB[idx]).all(axis=1)
        res = residuals(qp, X[idx], Z[idx], ZB[idx], sub, duals)
        each = scale if isinstance(scale, list) else [scale] * size
        promises = {id(s): Promise.of(settings, s) for s in {id(s): s for s in each}.values()}
        for j, i in enumerate(idx):
            statuses[i], note = _verdict(statuses[i], bool(finite[j]), tuple(float(a[j]) for a in res),
                                         promises[id(each[i])], _claimed(given[i]))
            if note:
                notes[int(i)] = note
    qps = bs.qps if bs.qps is not None and len(bs.qps) == size else ElementQPs(qp, vecs, size)
    shared = _constraints_shared(vecs)  # the elements' constraints are qp's: one verdict for all
    checked, rays = 0, {}
    for i in range(size):
        if statuses[i] is Status.PRIMAL_INFEASIBLE and (shared or checked < INFEASIBILITY_LPS):
            statuses[i], note = _infeasibility_verdict(qp if shared else qps[i])
            checked += 1
            if note:
                notes[i] = note
        elif statuses[i] is Status.DUAL_INFEASIBLE and shared:
            # the constraints' verdicts are shared; the ray test takes the element's q: one verdict per distinct q
            # (identical elements get one answer), ray tests for INFEASIBILITY_LPS of them at most
            key = np.asarray(qps[i].q).tobytes()
            if key not in rays:
                rays[key] = _unboundedness_verdict(qp, qps[i] if len(rays) < INFEASIBILITY_LPS else None)
            statuses[i], note = rays[key]
            if note:
                notes[i] = note
        elif statuses[i] is Status.DUAL_INFEASIBLE and checked < INFEASIBILITY_LPS:
            statuses[i], note = _unboundedness_verdict(qps[i], qps[i])
            checked += 1
            if note:
                notes[i] = note
        elif statuses[i] is Status.NON_CONVEX:  # P is shared: one verdict (cached) for all
            statuses[i], note = _convexity_verdict(qp)
            if note:
                notes[i] = note
        statuses[i], note = _time_verdict(statuses[i], notes.get(i, ""), settings, elapsed)
        if note:
            notes[i] = note
    if not notes and X is bs.x and Z is bs.z and ZB is bs.z_box and bs.qps is qps:
        return bs
    info = dict(bs.info)
    if notes:
        elements = list(given)
        for i, note in notes.items():
            elements[i] = {**elements[i], **_noted(elements[i], note, bs.status[i].name)}
        info["elements"] = elements
    return replace(bs, x=X, z=Z, z_box=ZB, status=tuple(statuses), qps=qps, info=info,
                   backend=bs.backend or backend)


# --------------------------------------------------------------------------- problems answered here
def empty_solution(qp: QP, backend: str, vecs: dict[str, np.ndarray] | None = None) -> Solution:
    """The answer for ``n = 0``: ``Cx = 0``, so SOLVED when ``l <= 0 <= u``, else PRIMAL_INFEASIBLE."""
    feasible = bool(np.all(qp.l <= 0.0) and np.all(qp.u >= 0.0))
    return Solution(x=np.zeros(0), z=np.zeros(qp.m), z_box=np.zeros(0),
                    status=Status.SOLVED if feasible else Status.PRIMAL_INFEASIBLE, backend=backend, qp=qp,
                    info={"note": "no variables: answered by polyproj without calling the solver"})


def _warm_part(ws: Any, key: str) -> Any:
    v = ws.get(key) if isinstance(ws, dict) else getattr(ws, key, None)
    if v is not None and hasattr(v, "detach"):  # a torch tensor (one that requires grad, bfloat16): on the host
        from ..problem import _asarray

        v = _asarray(v, f"warm_start {key}")
    return v


def check_warm_start(qp: QP, warm_start: Any) -> None:
    """A warm start of ``solve`` must fit ``qp``: ``x`` (n,), ``z`` (m,), ``z_box`` (n,) where given.

    A Solution or BatchSolution element, or a dict with those keys; anything else (a bare array, another
    problem's solution) is a ProblemError rather than ignored by some backends and an IndexError in others.
    """
    if warm_start is None:
        return
    if not (isinstance(warm_start, dict) or hasattr(warm_start, "x")):
        raise ProblemError(f"warm_start must be a Solution or a dict with 'x' (and 'z', 'z_box'), got "
                           f"{type(warm_start).__name__}")
    if isinstance(warm_start, dict):
        unknown = sorted(set(map(str, warm_start)) - {"x", "z", "z_box"})
        if unknown or not warm_start:
            raise ProblemError(f"warm_start takes the keys 'x', 'z', 'z_box'; got {sorted(map(str, warm_start))} "
                               "(a misspelt key would be ignored)")
    from ..problem import _asarray, _check_numeric, _shape

    for key, size in (("x", qp.n), ("z", qp.m), ("z_box", qp.n)):
        v = _warm_part(warm_start, key)
        shape = None if v is None else _shape(v, f"warm_start {key}")  # a ragged list: a ProblemError
        if v is not None and shape != (size,):
            raise ProblemError(f"warm_start {key} must have shape ({size},) for this problem, got {shape}")
        if v is not None:
            _check_numeric(_asarray(v, f"warm_start {key}"), f"warm_start {key}")


def finite_warm_start(warm_start: Any) -> Any:
    """The warm start without its non-finite parts; as given when every part is finite, None when none is left.

    A failed solve's NaN multipliers carry no start; an infinite one made ProxSuite fail a problem it solves.
    """
    if warm_start is None:
        return None
    parts = {k: _warm_part(warm_start, k) for k in ("x", "z", "z_box")}
    bad = [k for k, v in parts.items() if v is not None and not np.all(np.isfinite(np.asarray(v, dtype=np.float64)))]
    given = [warm_start.get(k) if isinstance(warm_start, dict) else getattr(warm_start, k, None) for k in parts]
    if not bad and all(a is b for a, b in zip(parts.values(), given, strict=True)):
        return warm_start
    kept = {k: v for k, v in parts.items() if v is not None and k not in bad}
    return kept or None


def check_batch_warm_start(qp: QP, size: int, warm_start: Any) -> None:
    """A warm start of ``solve_batch``: a BatchSolution of ``size`` elements of this problem's sizes."""
    if warm_start is None:
        return
    if not isinstance(warm_start, BatchSolution):
        raise ProblemError(f"warm_start of solve_batch must be a BatchSolution, got {type(warm_start).__name__}")
    for key, cols in (("x", qp.n), ("z", qp.m), ("z_box", qp.n)):
        if np.shape(getattr(warm_start, key)) != (size, cols):
            raise ProblemError(f"warm_start {key} must have shape ({size}, {cols}) for this batch, got "
                               f"{np.shape(getattr(warm_start, key))}")


def finite_batch_warm_start(warm_start: BatchSolution | None) -> BatchSolution | None:
    """A batch warm start without its non-finite parts, per element as :func:`finite_warm_start` does for one.

    An element's ``x``, ``z`` or ``z_box`` with a non-finite entry becomes NaN throughout: a batch has no absent
    part, and NaN is what a failed element carries (the backends start without it; ProxSuite reads NaN as 0 and
    ±inf as ±1.8e308, and z = inf made every element of its batch MAX_ITER with NaN x). None when nothing finite is
    left; as given when every entry is finite.
    """
    if warm_start is None:
        return None
    parts = {k: np.asarray(getattr(warm_start, k), dtype=np.float64) for k in ("x", "z", "z_box")}
    bad = {k: ~np.isfinite(v).all(axis=1) for k, v in parts.items()}
    if not any(b.any() for b in bad.values()):
        return warm_start
    if all(b.all() for k, b in bad.items() if parts[k].shape[1]):
        return None
    kept = {k: np.where(bad[k][:, None], np.nan, v) for k, v in parts.items()}
    return replace(warm_start, **kept)


def empty_batch(qp: QP, backend: str) -> BatchSolution:
    """The answer for a batch of no elements."""
    return BatchSolution(x=np.zeros((0, qp.n)), z=np.zeros((0, qp.m)), z_box=np.zeros((0, qp.n)), status=(),
                         iterations=np.zeros(0, dtype=np.int64), backend=backend)


# --------------------------------------------------------------------------- the guard
#: arrays up to this many entries are compared with a copy of their bytes after the call; larger ones by checksum
_COPY_ENTRIES = 1 << 16


def _inputs(args: tuple, kw: dict) -> dict[str, np.ndarray]:
    """The dense arrays a backend call is given: the QP's vectors and dense matrices, the batch's vectors.

    Sparse matrices are left out: a backend may legitimately canonicalise one in place (``sort_indices``,
    ``eliminate_zeros``) without changing the matrix it stands for.
    """
    out: dict[str, np.ndarray] = {}
    qp = args[0] if args and isinstance(args[0], QP) else None
    if qp is not None:
        for k in ("P", "C", "q", "l", "u", "lb", "ub"):
            v = getattr(qp, k)
            if isinstance(v, np.ndarray):
                out[k] = v
    for k, v in kw.items():
        if isinstance(v, np.ndarray):
            out[f"batch {k}"] = v
    return out


def _checksum(a: np.ndarray) -> int:
    # a Fortran-ordered array is its transpose's C order; any other layout is read through a transient copy
    c = a if a.flags.c_contiguous else a.T if a.flags.f_contiguous else np.ascontiguousarray(a)
    return zlib.adler32(memoryview(c).cast("B"))


def _fingerprint(a: np.ndarray) -> bytes | int:
    return a.tobytes() if a.size <= _COPY_ENTRIES else _checksum(a)  # bytes: exact, and ~50x faster to compare


def _unchanged(a: np.ndarray, before: bytes | int) -> bool:
    return a.tobytes() == before if isinstance(before, bytes) else _checksum(a) == before


def _restore(a: np.ndarray, old: np.ndarray) -> None:
    """Write ``old`` back into ``a``; a problem's read-only view through the array that owns its memory."""
    if a.flags.writeable:
        a[...] = old
        return
    owner = a
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    if owner.flags.owndata and owner.shape == a.shape and owner.strides == a.strides:
        owner.setflags(write=True)
        owner[...] = old
        owner.setflags(write=False)


#: the attributes a QP is given at construction and never changes (its cached forms, ``eq_mask``, ``memo``, are
#: added on first use, by any thread)
_QP_FIELDS = ("P", "q", "C", "l", "u", "lb", "ub", "check_psd", "psd_known")


def _qp_state(qp: QP | None) -> tuple[dict, dict] | None:
    """The QP's attributes (its fields, its cached forms) and memo, by reference: a cheap snapshot."""
    if qp is None:
        return None
    attrs = dict(vars(qp))
    memo = attrs.get("memo")
    return attrs, dict(memo) if isinstance(memo, dict) else {}


def _rebound(qp: QP | None, state: tuple[dict, dict] | None) -> list[str]:
    """The fields of ``qp`` that a call rebound (``object.__setattr__`` on the frozen QP), put back as they were.

    A QP never changes, so each field must be the same object after the call (identity: no pass over the data).
    Where one was rebound, what the call cached (``eq_mask``, memo entries) may derive from the changed data:
    the attributes and the memo are reset to the snapshot.
    """
    if qp is None or state is None:
        return []
    attrs, memo = state
    now = vars(qp)
    rebound = [k for k in _QP_FIELDS if k in attrs and now.get(k, _QP_FIELDS) is not attrs[k]]
    if rebound:
        now.clear()
        now.update(attrs)
        if isinstance(attrs.get("memo"), dict):
            attrs["memo"].clear()
            attrs["memo"].update(memo)
    return rebound


def _call(solver: Any, fn: Callable, *args: Any, **kw: Any) -> Any:
    name = solver.name or type(solver).__name__
    if not hasattr(solver, "settings"):  # every guard reads them; an AttributeError from deep inside said nothing
        raise SolverError(f"backend {name!r} was not set up: its __init__ did not call QPSolver.__init__ "
                          "(super().__init__(**settings))")
    given = _inputs(args, kw)
    # read-only arrays too (a problem's): torch.from_numpy, ctypes or a cast in compiled code write through the flag
    before = {k: _fingerprint(v) for k, v in given.items()}
    qp = args[0] if args and isinstance(args[0], QP) else None
    state = _qp_state(qp)
    token = _INSIDE.set(_INSIDE.get() | {id(solver)})
    try:
        with _named_errors(name):
            out = fn(solver, *args, **kw)
    finally:
        _INSIDE.reset(token)
    changed = [k for k, v in before.items() if not _unchanged(given[k], v)]
    for k in changed:  # the caller's arrays back as they were, where a copy was kept
        if isinstance(before[k], bytes):
            _restore(given[k], np.frombuffer(before[k], dtype=given[k].dtype).reshape(given[k].shape))
    rebound = _rebound(qp, state)
    if changed or rebound:
        what = ", ".join([f"{k} changed in place" for k in changed] + [f"{k} replaced" for k in rebound])
        raise SolverError(f"backend {name!r} wrote into the problem it was given ({what}): a backend must not "
                          "modify its input; copy an array before changing it")
    if isinstance(out, (Solution, BatchSolution)) and not isinstance(out.info, dict):  # the guards add to it
        raise SolverError(f"backend {name!r} returned info of type {type(out.info).__name__}; expected a dict")
    return out


def _scaled_solve(solver: Any, fn: Callable, qp: QP, warm_start: Any, scale: scaling.Scaling | None) -> Any:
    """``fn`` on ``qp`` as given (``scale`` None) or normalised by ``scale``, its answer in ``qp``'s units."""
    if scale is None:
        return _call(solver, fn, qp, warm_start)
    raw = _call(solver, fn, scale.problem(qp), scale.warm_start(warm_start))
    return scale.solution(raw, qp) if isinstance(raw, Solution) else raw


def _scaled_batch(solver: Any, fn: Callable, qp: QP, vecs: dict, size: int, warm_start: Any,
                  scale: scaling.Scaling | None) -> Any:
    """``fn`` on the batch as given or normalised by ``scale``, its answers in the batch's units."""
    if scale is None:
        return _call(solver, fn, qp, warm_start=warm_start, **vecs)
    raw = _call(solver, fn, scale.problem(qp), **scale.vectors(**vecs))
    return scale.batch(raw, ElementQPs(qp, vecs, size)) if isinstance(raw, BatchSolution) else raw


def _unconfirmed_note(again: Any) -> str:
    """Why an answer solved with σ far above its size is not confirmed; ``again`` the re-solve at its own size.

    ``again`` None: the re-solves ran out (:data:`~.scaling.REPLAN_ROUNDS`) with σ still far above the answer.
    """
    if again is None:
        return (f"solved with a normalisation σ far above the answer's size, still after {scaling.REPLAN_ROUNDS} "
                "re-solves: the answer is not confirmed at its own size")
    what = again.name if isinstance(again, Status) else again.status.name if isinstance(again, Solution) \
        else type(again).__name__
    return (f"solved with a normalisation σ far above the answer's size; the re-solve at its own size ended "
            f"{what}, so the answer is not confirmed at that size")


def _unconfirmed(sol: Solution, again: Any) -> Solution:
    """``sol`` (solved with σ far above its size) whose re-solve at its own size failed: SOLVED_INACCURATE.

    The caller then judges it in the units of its own size (the residual test's NUMERICAL_ERROR where it is not a
    solution there): in σ's, the promised tolerances are ~σ eps and the gross threshold 10⁴ of them, and a
    point 161 outside unit-scale constraints (σ = 1e10) passed as SOLVED_INACCURATE.
    """
    return replace(sol, status=Status.SOLVED_INACCURATE if sol.status is Status.SOLVED else sol.status,
                   info={**sol.info, "validation": _unconfirmed_note(again), "claimed_status": sol.status.name})


def _constraints_shared(vecs: dict) -> bool:
    """Whether a batch's elements share ``qp``'s constraints (only ``q`` batched)."""
    return not (vecs.keys() & {"l", "u", "lb", "ub"})


def _infeasible_at_own_size(qp: QP, again: Any) -> bool:
    """Whether a re-solve at the answer's own size found ``qp`` PRIMAL_INFEASIBLE, and an LP agrees.

    Then that is the answer: the first one, normalised by a σ far above x's size, met loose tolerances only
    (σ from ``|q| / |P|`` can exceed by far the size at which the constraints hold x).
    """
    return (isinstance(again, Solution) and again.status is Status.PRIMAL_INFEASIBLE
            and _infeasibility_verdict(qp)[0] is Status.PRIMAL_INFEASIBLE)


def _replanned_batch(solver: Any, fn: Callable, qp: QP, vecs: dict, size: int, scale: scaling.Scaling,
                     bs: BatchSolution) -> tuple[BatchSolution, list[scaling.Scaling]]:
    """The elements of a batch whose answers lie far below σ, solved again at their own size.

    Per element: one element's legitimately large x must not keep another's σ. Returned with the normalisation
    each element is judged in (:func:`check_batch`): its re-solve's, and for one not confirmed at its own size
    (SOLVED_INACCURATE, noted) that size's, as for a single solve.
    """
    sigma = np.full(size, scale.sigma)
    own: list[scaling.Scaling] = [scale] * size
    notes: dict[int, tuple[str, str]] = {}  # element: (why it is not confirmed, the status its backend claimed)
    qps = ElementQPs(qp, vecs, size)
    shared = _constraints_shared(vecs)
    for _ in range(scaling.REPLAN_ROUNDS):
        x = np.asarray(bs.x, dtype=np.float64)
        ok = np.array([s.ok for s in bs.status], dtype=bool) & np.isfinite(x).all(axis=1)
        x_each = np.max(np.abs(x), axis=1, initial=0.0)
        idx = np.flatnonzero(ok & scaling.needs_replan(qp, sigma, x_each, **vecs))
        if not idx.size:
            return _with_notes(bs, notes), own
        sub_vecs = {k: np.asarray(a)[idx] for k, a in vecs.items()}
        better = scaling.replan(qp, float(x_each[idx].max()), float(sigma[idx].max()), **sub_vecs)
        sub = _scaled_batch(solver, fn, qp, sub_vecs, int(idx.size), None, better)
        if not isinstance(sub, BatchSolution) or len(sub) != idx.size:
            for i in idx:  # not confirmed at their own size, judged there
                own[i] = better
                notes[int(i)] = (_unconfirmed_note(sub), notes.get(int(i), ("", bs.status[i].name))[1])
            return _with_notes(_demoted(bs, idx), notes), own
        good = np.array([s.ok for s in sub.status], dtype=bool)
        # an element the re-solve at its own size finds PRIMAL_INFEASIBLE, an LP agreeing, takes that answer (as
        # a single solve does), not the first one's loose-tolerance point
        empty = np.array([sub.status[k] is Status.PRIMAL_INFEASIBLE
                          and _infeasible_at_own_size(qp if shared else qps[int(i)], sub.solution(k))
                          for k, i in enumerate(idx)], dtype=bool)
        if empty.any():
            bs = bs.put(idx[empty], sub.take(np.flatnonzero(empty)))
        for k, i in enumerate(idx):  # judged at their own size: confirmed there, or not (SOLVED_INACCURATE, noted)
            own[i] = better
            if good[k] or empty[k]:
                notes.pop(int(i), None)
            else:
                notes[int(i)] = (_unconfirmed_note(sub.status[k]), notes.get(int(i), ("", bs.status[i].name))[1])
        bs = _demoted(bs, idx[~(good | empty)])
        if not good.any():
            return _with_notes(bs, notes), own
        bs = bs.put(idx[good], sub.take(np.flatnonzero(good)))
        sigma[idx[good]] = better.sigma
    # the re-solves ran out with σ still far above these answers: not confirmed at their own size, judged there
    x = np.asarray(bs.x, dtype=np.float64)
    ok = np.array([s.ok and i not in notes for i, s in enumerate(bs.status)], dtype=bool) & np.isfinite(x).all(axis=1)
    x_each = np.max(np.abs(x), axis=1, initial=0.0)
    left = np.flatnonzero(ok & scaling.needs_replan(qp, sigma, x_each, **vecs))
    if left.size:
        there = scaling.replan(qp, float(x_each[left].max()), float(sigma[left].max()),
                               **{k: np.asarray(a)[left] for k, a in vecs.items()})
        for i in left:
            own[i], notes[int(i)] = there, (_unconfirmed_note(None), bs.status[i].name)
        bs = _demoted(bs, left)
    return _with_notes(bs, notes), own


def _demoted(bs: BatchSolution, idx: Any) -> BatchSolution:
    """``bs`` with its SOLVED elements among ``idx`` made SOLVED_INACCURATE."""
    status = list(bs.status)
    for i in idx:
        status[i] = Status.SOLVED_INACCURATE if status[i] is Status.SOLVED else status[i]
    return replace(bs, status=tuple(status))


def _with_notes(bs: BatchSolution, notes: dict[int, tuple[str, str]]) -> BatchSolution:
    """``bs`` with the guard's ``notes`` (element: why, the status claimed) in ``info["elements"]``."""
    if not notes:
        return bs
    elements = bs.info.get("elements")
    elements = list(elements) if isinstance(elements, (list, tuple)) and len(elements) == len(bs) else [{}] * len(bs)
    for i, (note, claimed) in notes.items():
        base = elements[i] if isinstance(elements[i], dict) else {}
        elements[i] = {**base, **_noted(base, note, claimed)}
    return replace(bs, info={**bs.info, "elements": elements})


def _guard_solve(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def solve(self: Any, qp: QP, warm_start: Any = None) -> Solution:
        if id(self) in _INSIDE.get():
            return fn(self, qp, warm_start)
        if not isinstance(qp, QP):
            raise ProblemError(f"solve() takes a polyproj.QP, got {type(qp).__name__}")
        name = self.name or type(self).__name__
        check_warm_start(qp, warm_start)
        warm_start = finite_warm_start(warm_start)
        if qp.n == 0:
            return empty_solution(qp, name)
        if is_nonconvex(qp):  # QP(check_psd=False) with an indefinite P: no backend's answer is a solution
            return self._nan_solution(qp, Status.NON_CONVEX, name)
        t0 = time.perf_counter()
        if "scaling_plan" not in qp.memo:  # a QP never changes: planned once per problem
            qp.memo["scaling_plan"] = scaling.plan(qp)
        scale = qp.memo["scaling_plan"]
        sol = _scaled_solve(self, fn, qp, warm_start, scale)
        for rounds in range(scaling.REPLAN_ROUNDS + 1):  # σ far above the answer's size: so were its tolerances
            if scale is None or not (isinstance(sol, Solution) and sol.status.ok):
                break
            x_max = float(np.max(np.abs(np.asarray(sol.x, dtype=np.float64)), initial=0.0))
            if not scaling.needs_replan(qp, scale.sigma, x_max):
                break
            better = scaling.replan(qp, x_max, scale.sigma)
            if rounds == scaling.REPLAN_ROUNDS:  # judged at its own size (better's units), as below
                scale, sol = better, _unconfirmed(sol, None)
                break
            again = _scaled_solve(self, fn, qp, warm_start, better)
            if _infeasible_at_own_size(qp, again):
                scale, sol = better, again
                break
            if not (isinstance(again, Solution) and again.status.ok):  # not confirmed at its own size: judged there
                scale, sol = better, _unconfirmed(sol, again)
                break
            scale, sol = better, again
        return check_solution(qp, sol, name, self.settings, self.capabilities.duals, time.perf_counter() - t0, scale)

    solve._polyproj_guarded = True  # type: ignore[attr-defined]
    return solve


def _guard_solve_batch(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def solve_batch(self: Any, qp: QP, q: Any = None, l: Any = None, u: Any = None, lb: Any = None,
                    ub: Any = None, warm_start: Any = None) -> BatchSolution:
        if id(self) in _INSIDE.get():
            return fn(self, qp, q=q, l=l, u=u, lb=lb, ub=ub, warm_start=warm_start)
        if not isinstance(qp, QP):
            raise ProblemError(f"solve_batch() takes a polyproj.QP, got {type(qp).__name__}")
        name = self.name or type(self).__name__
        vecs = self._batch_vectors(qp, q=q, l=l, u=u, lb=lb, ub=ub)
        size = self._batch_size(vecs)
        check_batch_warm_start(qp, size, warm_start)
        warm_start = finite_batch_warm_start(warm_start)
        if size == 0:
            return empty_batch(qp, name)
        if qp.n == 0:
            qps = ElementQPs(qp, vecs, size)
            return BatchSolution.stack([empty_solution(qps[i], name) for i in range(size)], backend=name)
        if is_nonconvex(qp):
            return BatchSolution.stack([self._nan_solution(qp, Status.NON_CONVEX, name)] * size, backend=name)
        t0 = time.perf_counter()
        scale = scaling.plan(qp, **vecs)
        parts = scaling.groups(qp, scale, size, **vecs)
        if parts is not None:  # elements of far apart sizes: each group normalised (and checked) on its own
            return _grouped_batch(self, qp, vecs, size, warm_start, parts, name, t0)
        bs = _scaled_batch(self, fn, qp, vecs, size, warm_start, scale)
        judged: Any = scale
        if scale is not None and isinstance(bs, BatchSolution):
            bs, judged = _replanned_batch(self, fn, qp, vecs, size, scale, bs)
        return check_batch(qp, vecs, size, bs, name, self.settings, self.capabilities.duals,
                           time.perf_counter() - t0, judged)

    solve_batch._polyproj_guarded = True  # type: ignore[attr-defined]
    return solve_batch


def _grouped_batch(solver: Any, qp: QP, vecs: dict, size: int, warm_start: Any, parts: list[np.ndarray], name: str,
                   t0: float) -> BatchSolution:
    """A batch solved as the groups ``parts`` (:func:`.scaling.groups`), each through the guard, put back in order.

    ``time_limit`` bounds the whole call: an answer that came after it is TIME_LIMIT, and the groups not started
    by then are TIME_LIMIT without an answer. The groups' own ``info`` is kept under ``group_info``.
    """
    x, z, zb = np.full((size, qp.n), np.nan), np.full((size, qp.m), np.nan), np.full((size, qp.n), np.nan)
    its, status = np.zeros(size, dtype=np.int64), [Status.TIME_LIMIT] * size
    elements: list[dict] = [{} for _ in range(size)]
    group_info, setup = [], 0.0
    limit = solver.settings.get("time_limit")
    for idx in parts:
        if limit is not None and time.perf_counter() - t0 > float(limit):
            for i in idx.tolist():
                elements[i] = {"note": "not started: the batch reached time_limit"}
            continue
        ws = None if warm_start is None else warm_start.take(idx)
        part = solver.solve_batch(qp, warm_start=ws, **{k: v[idx] for k, v in vecs.items()})
        elapsed = time.perf_counter() - t0
        x[idx], z[idx], zb[idx], its[idx] = part.x, part.z, part.z_box, part.iterations
        info = part.info if isinstance(part.info, dict) else {}
        per = info.get("elements")
        group_info.append({k: v for k, v in info.items() if k != "elements"})
        setup += float(part.setup_time)
        for k, i in enumerate(idx.tolist()):
            st = part.status[k]
            el = per[k] if isinstance(per, (list, tuple)) and len(per) == len(idx) and isinstance(per[k], dict) else {}
            status[i], note = _time_verdict(st, el.get("validation", ""), solver.settings, elapsed)
            elements[i] = {**el, "validation": note, "claimed_status": st.name} if status[i] is not st else el
    info: dict[str, Any] = {"groups": [idx.tolist() for idx in parts], "group_info": group_info,
                            "note": "elements of far apart sizes: each group normalised and solved on its own"}
    if any(elements):
        info["elements"] = elements
    return BatchSolution(x, z, zb, tuple(status), its, solve_time=time.perf_counter() - t0, setup_time=setup,
                         backend=name, qps=ElementQPs(qp, vecs, size), info=info)


def guard(name: str, fn: Callable) -> Callable:
    """``fn`` (a ``solve``, ``solve_batch`` or ``solve_projections`` method) wrapped with the checks of this module.

    ``solve_projections`` answers are verified by the projection pipeline (the exact polish), their form where it
    receives them (:func:`check_projection_start`; ``polyproj check`` sees the raw answer); its guard only makes a
    backend's own exception a SolverError naming the backend, as for the other two.
    """
    if getattr(fn, "_polyproj_guarded", False):
        return fn
    if name == "solve_projections":
        return _guard_raises(fn)
    return _guard_solve(fn) if name == "solve" else _guard_solve_batch(fn)


@contextlib.contextmanager
def _named_errors(name: str):
    """A backend's own exception as a SolverError naming it (``sys.exit()`` too: it must not end the caller).

    PolyprojErrors and out-of-memory errors (MemoryError, torch's OutOfMemoryError, a RuntimeError: the caller
    may shrink the batch) pass as they are.
    """
    try:
        yield
    except (PolyprojError, MemoryError):
        raise
    except (Exception, SystemExit) as exc:
        if type(exc).__name__ == "OutOfMemoryError":
            raise
        if isinstance(exc, ValueError) and "read-only" in str(exc):  # the QP's arrays are read-only (problem.py)
            raise SolverError(f"backend {name!r} wrote into the problem it was given ({exc}): a backend must not "
                              "modify its input; copy an array before changing it (or before handing it to a "
                              "library that needs a writable buffer)") from exc
        raise SolverError(f"backend {name!r} raised {type(exc).__name__}: {exc}") from exc


def _guard_raises(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kw: Any) -> Any:
        with _named_errors(self.name or type(self).__name__):
            return fn(self, *args, **kw)

    call._polyproj_guarded = True  # type: ignore[attr-defined]
    return call


def check_projection_start(start: Any, X: Any, data: Any, backend: str) -> ProjectionStart:
    """A backend's ``solve_projections`` answer for the batch ``X`` (N, n) on ``data``, held to its form.

    Called by the projection pipeline where it receives an answer (:mod:`polyproj.projection.pipeline`).

    A :class:`~.projection.ProjectionStart` with ``y`` (N, n), ``mult`` (N, m + 2n), ``mu`` (N, p) real arrays of
    ``X``'s namespace and device (anything else, a list, is converted to ``X``'s dtype there, as ``solve_batch``'s
    answers are to float64), N :class:`~polyproj.solution.Status` values, and ``accuracy`` / ``dist_factor``
    non-negative finite numbers; else a SolverError naming the backend and what is wrong. Shapes and types only (no
    pass over the values): the polish verifies the points. A short ``y`` was a broadcast ValueError in the polish, a
    ``None`` an AttributeError, a short ``status`` a ValueError from ``zip``.
    """
    def wrong(what: str) -> SolverError:
        return SolverError(f"backend {backend!r} returned a solve_projections() answer whose {what}")

    if not isinstance(start, ProjectionStart):
        raise SolverError(f"backend {backend!r} returned {type(start).__name__} from solve_projections(); expected "
                          "a polyproj.backends.projection.ProjectionStart")
    N, n, m, p = int(X.shape[0]), data.n, data.m, data.p
    xp, dev = array_namespace(X), _device(X)
    fixed: dict[str, Any] = {}
    for key, shape in (("y", (N, n)), ("mult", (N, m + 2 * n)), ("mu", (N, p))):
        v = getattr(start, key)
        if "complex" in str(getattr(v, "dtype", "")):
            raise wrong(f"{key} is complex ({v.dtype}); expected real numbers")
        if not _real_array_of(xp, dev, v):
            try:
                v = fixed[key] = xp.asarray(v, dtype=X.dtype, device=dev)
            except Exception as exc:
                raise wrong(f"{key} ({type(v).__name__}) is not an array of numbers: {exc}") from exc
        if tuple(v.shape) != shape:
            raise wrong(f"{key} has shape {tuple(v.shape)}; expected {shape} (batch {N}, n = {n}, m = {m}, p = {p})")
    status = start.status
    if not isinstance(status, (tuple, list)) or len(status) != N:
        got = f"{len(status)} values" if isinstance(status, (tuple, list)) else f"a {type(status).__name__}"
        raise wrong(f"status is {got}; expected a tuple of {N} polyproj.Status values")
    bad = next((s for s in status if not isinstance(s, Status)), None)
    if bad is not None:
        raise wrong(f"status holds {bad!r} of type {type(bad).__name__}; expected polyproj.Status members")
    if isinstance(status, list):
        fixed["status"] = tuple(status)
    for key in ("accuracy", "dist_factor"):
        v = getattr(start, key)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0 <= v < np.inf:
            raise wrong(f"{key} is {v!r}; expected a non-negative finite number")
    if start.solution is not None and not isinstance(start.solution, BatchSolution):
        raise wrong(f"solution is a {type(start.solution).__name__}; expected a BatchSolution or None")
    return replace(start, **fixed) if fixed else start


def _real_array_of(xp: Any, dev: Any, v: Any) -> bool:
    """Whether ``v`` is an array of namespace ``xp`` on device ``dev`` with a real floating dtype."""
    try:
        return array_namespace(v) is xp and xp.isdtype(v.dtype, "real floating") and _device(v) == dev
    except (TypeError, AttributeError):
        return False
