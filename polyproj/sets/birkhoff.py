"""Doubly stochastic matrices (the Birkhoff polytope) and the shared Projector of row/column-sum sets.

:class:`Birkhoff` projects ``k × k`` matrices onto ``{X >= 0, X1 = 1, Xᵀ1 = 1}`` exactly: semismooth
Newton steps on the dual (Li, Sun & Toh 2018), then the exact face with its KKT conditions verified
(:mod:`polyproj.sets.bipartite`). The whole batch advances together in a few array operations per
step (``k × k`` Schur complements, batched Cholesky), in the input's namespace, device and dtype; far
samples start from a continuation in ``C``'s scale. float32 samples whose face cannot be verified are
projected again in float64; samples whose face cannot be verified there (far points with ties, points whose
rounding ``eps |C|`` reaches the entries' size: the measured cases are in docs/sets.md) are projected by the
generic QP path of :meth:`as_polyhedron` instead, whose answer is verified or flagged (``polished`` False,
with a warning).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_compat import array_namespace
from array_api_compat import device as _device

from ..backends.options import positive
from ..errors import ProblemError
from ..linalg import holds, host_copy, own_contiguous
from ..problem import Polyhedron
from ..projection.faces import put_rows
from ..projection.result import Degeneracy, ProjectionResult
from .base import OnHost, Projector, result_on
from .bipartite import (
    Dual,
    DualSystem,
    FaceSolution,
    NewtonOptions,
    Sums,
    _put_face,
    eps_of,
    finish,
    line_sums,
    newton,
    polish,
    start,
    z_of,
)

__all__ = ["Birkhoff", "SumsProjector"]


@dataclass(frozen=True)
class SumsFace:
    """What the backward needs: the factored face systems, and the result of the samples projected otherwise."""

    system: DualSystem
    fallback_idx: Any  # index array (possibly empty)
    fallback: Any  # (set, result) of the generic projection (or of this set in float64), or None


#: the largest dual residual (line sums of X, each at most 1) at which Newton hands a sample to its face solve
FACE_RESIDUAL = 1e-4

#: float32 samples with ``max|C|`` beyond FAR32 are projected in float64 (:meth:`SumsProjector._in_float64`)
FAR32 = 1024.0

#: scale continuation (:meth:`SumsProjector._continued`): a sample with ``max|C|`` beyond CONTINUE_FROM is first
#: projected at ``C`` scaled down to that size, then at sizes CONTINUE_RATIO times larger, each from the last dual
CONTINUE_FROM = 100.0
CONTINUE_RATIO = 1000.0


class SumsProjector(Projector):
    """Sets of ``r × c`` matrices given by ``X >= 0`` and row / column / total sums (see the subclasses).

    Parameters
    ----------
    tol : float, optional
        Relative tolerance of the KKT test of the exact face (default ``max(1e-9, 256 eps)`` of the dtype).
        It is the accuracy the result is verified to: a loose one (1e-2 and above) accepts a face whose
        point is feasible but only that close to the projection, and reports it polished.
    max_iter : int
        Newton steps before the face is tried anyway (and at most at each size of a far point's continuation).
    """

    method = "semismooth newton"

    def __init__(self, sums: Sums, *, tol: float | None = None, max_iter: int = 60) -> None:
        if tol is not None and positive(tol) is not None:
            raise ProblemError(f"tol must be a positive number, got {tol!r}")
        if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
            raise ProblemError(f"max_iter must be an integer >= 1, got {max_iter!r}")
        self.sums, self.tol, self.max_iter = sums, tol, int(max_iter)
        self._polyhedron: Polyhedron | None = None

    def as_polyhedron(self) -> Polyhedron:
        """The set as a Polyhedron (built once; rows: see the subclass's ``_rows``)."""
        if self._polyhedron is None:
            self._polyhedron = self._rows()
        return self._polyhedron

    def _rows(self) -> Polyhedron:
        raise NotImplementedError

    @property
    def n(self) -> int:
        """Entries of a matrix."""
        return self.sums.r * self.sums.c

    @property
    def event_shape(self) -> tuple[int, ...]:
        """``(r, c)``: points are matrices (row-major when flattened)."""
        return (self.sums.r, self.sums.c)

    # ------------------------------------------------------------------ to be given by the sets
    def _multipliers(self, xp: Any, face: FaceSolution, lam: Any) -> Any:
        """Multipliers in the numbering of :meth:`as_polyhedron` (b, n_ineq + m_eq)."""
        raise NotImplementedError

    def _active(self, xp: Any, face: FaceSolution, zero: Any) -> Any:
        """Active inequality rows (b, n_ineq) in the numbering of :meth:`as_polyhedron`."""
        raise NotImplementedError

    # ------------------------------------------------------------------ projection
    def _tols(self, xp: Any, dtype: Any) -> tuple[float, float, float]:
        """(Newton residual, KKT test, rounding) tolerances, relative to the sample's scale."""
        eps = eps_of(xp, dtype)
        tol = self.tol if self.tol is not None else max(1e-9, 256.0 * eps)
        return max(tol, eps ** 0.5), tol, 2.0 * (self.sums.r + self.sums.c) * eps

    def project_batch(self, X: Any) -> ProjectionResult:
        """Newton on the dual, the exact face, its KKT test; unverified samples by the generic path."""
        xp = array_namespace(X)
        S = self.sums
        b = X.shape[0]
        C = xp.reshape(X, (b, S.r, S.c))
        scale = 1.0 + xp.max(xp.abs(X), axis=1, keepdims=True)
        t_newton, t_kkt, t_round = self._tols(xp, X.dtype)
        # Newton's stop (_stop); its regularisation stays at C's size: a step damped at the stop's size converges
        # slowly on far points. Far samples start from the continuation in C's scale (_continued).
        stop = _stop(xp, scale, t_newton, t_round)
        first = min(self._first_steps(), self.max_iter)
        y0 = self._continued(C, scale, t_newton, t_round)
        y, _, _ = newton(C, S, scale, NewtonOptions(t_newton, first), y0=y0, stop=stop)
        last = self._last_rounds()
        face = polish(C, S, y, scale, t_kkt, t_round, rounds=6 if first < self.max_iter else last)
        if first < self.max_iter and not bool(xp.all(face.accepted)):
            # faces that failed their rounds: the rest of the Newton steps from the Newton iterate, then
            # the face again
            idx = xp.nonzero(~face.accepted)[0]
            Ci, si = xp.take(C, idx, axis=0), xp.take(scale, idx, axis=0)
            yi, _, _ = newton(Ci, S, si, NewtonOptions(t_newton, self.max_iter - first), y0=y.take(xp, idx),
                              stop=xp.take(stop, idx, axis=0))
            face = _put_face(xp, face, idx, polish(Ci, S, yi, si, t_kkt, t_round, rounds=last))
        face = finish(xp, S, self._final(xp, C, face, scale * t_round), t_round)
        # I(x) is every row with aᵢᵀy = aᵢ, weakly active ones too (DESIGN §6: J projects onto the null space of
        # all of them): before finish a far sample's line sums carry C's rounding (1 − 6e-8 at |C| 1e8), so a row
        # at its bound only after finish's correction was left off the active set (ties of a 4 × 4 matching at
        # 1e8: two column sums exactly 1, reported inactive, J from the other rows). Rows only, at X's rounding:
        # no entry leaves the support now (that would move the sums finish made exact).
        face = self._final(xp, C, face, None)
        Y = xp.reshape(face.X, (b, self.n)) + 0.0  # Z ⊙ Ω leaves −0.0 off the support: +0.0 there
        Z = z_of(C, face.y, S.has_w)
        # X = Z ⊙ Ω (the face's own Z): X − Z is 0 on the support and −Z off it
        lam = xp.maximum(face.X - Z, xp.zeros_like(Z))
        active = self._active(xp, face, ~face.omega)
        mult = self._multipliers(xp, face, xp.reshape(lam, (b, self.n)))
        weak = self._weak(xp, face, lam, scale * t_round)
        degenerate = Degeneracy(weak, face.system.dependent)
        result = self.result(X, Y, active, mult, violation=self._violation(xp, face.X),
                             face=SumsFace(face.system, xp.zeros((0,), dtype=xp.int64, device=_device(X)), None),
                             degenerate=degenerate)
        ok = face.accepted
        if X.dtype != xp.float64:  # float32: far samples, and those refused, in float64 (_in_float64)
            ok = ok & (scale[:, 0] <= FAR32)
        if bool(xp.all(ok)):
            return result
        idx = xp.nonzero(~ok)[0]
        if X.dtype != xp.float64:
            return self._in_float64(X, result, idx)
        return self._fall_back(X, result, idx)

    def _continued(self, C: Any, scale: Any, t_newton: float, t_round: float) -> Dual | None:
        """A start for far samples by continuation in ``C``'s scale (None: no sample beyond CONTINUE_FROM).

        The Newton steps a sample needs grow with ``|C|`` (Birkhoff(30), standard normal ``C``: ~8 at 1, 10-50 at
        1e4 and 1e6, 45-150 at 1e8, 200-460 at 1e10, over 2000 at 1e12; partial matchings more): far out the
        projection is a vertex or near one (the assignment's), the support is a sparse graph whose components each
        leave a direction in which the Hessian is only ``μ``, and every step adds an entry or two to the support.
        Past ``max_iter`` the samples went to the generic path, seconds each. The projection's dual is
        piecewise affine in the scale ``s`` of ``sC`` and, once the support settles, ``y(s) ≈ s y*`` plus a shift
        (on a vertex ``Z = C s − u1ᵀ − 1vᵀ`` is 1 on the support: ``y(λs) = λ y(s) + (λ − 1)/2`` (u, v) there): so
        ``C · CONTINUE_FROM/|C|`` is projected from :func:`start`, then ``C`` at sizes ``CONTINUE_RATIO`` times
        larger (the last ``C`` itself, by the caller), each from the last dual times the ratio (Newton's first
        steps add the shift). Measured on Birkhoff(30) and 25 × 25 matchings: 10-15 steps at the first size, 10-30
        at the next, 2-9 at each further one, every sample of 1e6 ... 1e16 at Newton's stop. Each size takes at most
        ``max_iter`` steps.
        """
        xp = array_namespace(C)
        # finite scales only: a non-finite sample has no smaller copy (f = 100/inf = 0 never grew to 1: no end)
        far = xp.nonzero(xp.isfinite(scale[:, 0]) & (scale[:, 0] > CONTINUE_FROM))[0]
        if far.shape[0] == 0:
            return None
        S = self.sums
        Cf, sf = xp.take(C, far, axis=0), xp.take(scale, far, axis=0)
        f = CONTINUE_FROM / sf  # (m, 1) < 1: the scale of each far sample's next problem
        y = start(xp, Cf * f[:, :, None], S)
        live = xp.nonzero(f[:, 0] < 1.0)[0]  # the samples of Cf still below their own scale
        while live.shape[0]:
            fl = xp.take(f, live, axis=0)
            Cl = xp.take(Cf, live, axis=0) * fl[:, :, None]
            sl = 1.0 + xp.max(xp.reshape(xp.abs(Cl), (Cl.shape[0], -1)), axis=1, keepdims=True)
            yl, _, _ = newton(Cl, S, sl, NewtonOptions(t_newton, self.max_iter), y0=y.take(xp, live),
                              stop=_stop(xp, sl, t_newton, t_round))
            up = xp.minimum(fl * CONTINUE_RATIO, xp.ones_like(fl))
            lam = up / fl
            y = y.put(xp, live, Dual(yl.u * lam, yl.v * lam, yl.w * lam))
            f = put_rows(xp, f, live, up)
            live = xp.nonzero(f[:, 0] < 1.0)[0]
        return start(xp, C, S).put(xp, far, y)

    def _first_steps(self) -> int:
        """Newton steps before the exact face is tried (default: all of ``max_iter``).

        The face rounds of :func:`~polyproj.sets.bipartite.polish` are steps of the primal-dual active-set
        method (a full semismooth Newton step with ``μ = 0``, then every wrong entry of the support
        changed at once): from a point near the solution they end in one or two rounds, but they are not
        globally convergent. A set may try the face after fewer Newton steps; the samples whose face
        fails then take the remaining steps (from the Newton iterate, with Armijo's search) and try again.
        """
        return self.max_iter

    def _last_rounds(self) -> int:
        """Face rounds of the last try, after all the Newton steps: ``max(6, r + c)``.

        Before the generic path (seconds a sample) the face rounds go on longer: at a degenerate point the
        Newton steps stop (their residual is below ``√eps``) while the multipliers are all below the KKT
        test's ``tol``, and the face is found by the rounds alone — one set of wrong entries each (near
        permutations ``P + δN`` of a partial matching, δ 1e-12 ... 1e-7, took up to 14 rounds at k = 60;
        6 rounds sent up to a third of them to the generic path, at k = 40).
        """
        return max(6, self.sums.r + self.sums.c)

    def _final_rows(self, xp: Any, face: FaceSolution) -> Any:
        """The dual rows of the reported active set (None: all rows, Birkhoff)."""
        return None

    def _final(self, xp: Any, C: Any, face: FaceSolution, zero: Any) -> FaceSolution:
        """The reported face: the entries and rows at their bound, and their systems.

        Support entries at zero to rounding (``<= zero`` (b, 1), the rounding at the sample's scale, scaled down
        to the face's: ``C`` on the support and the duals; below zero within the KKT test's tolerance;
        none when ``zero`` is None) are set to 0 and leave the support, rows at their bound join
        ``D`` (both weakly active); the samples whose face changed are factored again (the backward is ``J`` there).
        """
        if zero is None:
            small = xp.zeros_like(face.omega)
        else:
            # an entry is at zero to the rounding of its Z = C − u − v − w, which reads C on the face's support and
            # the duals only: ``zero`` (the rounding at the sample's scale, max|C| beyond 1) times the face's scale
            # 1 + |C_ij| + max|C on Ω| + max|u| + max|v| + |w| relative to max(1, max|C|), at most 1 (unchanged
            # but where the sample's largest entries lie off the support and in no dual: a far entry that no sum
            # holds does not set the rounding of the others). The dual maxima, not the entry's own u_i, v_j: a
            # dual's error comes from the others.
            y, b = face.y, C.shape[0]
            on = xp.reshape(xp.abs(C) * xp.astype(face.omega, C.dtype), (b, -1))
            seen = (xp.max(on, axis=1, keepdims=True) + xp.max(xp.abs(y.u), axis=1, keepdims=True)
                    + xp.max(xp.abs(y.v), axis=1, keepdims=True) + xp.abs(y.w))
            own = 1.0 + xp.abs(C) + seen[:, :, None]
            big = xp.max(xp.reshape(xp.abs(C), (b, -1)), axis=1, keepdims=True)
            big = xp.where(big > 1.0, big, xp.ones_like(big))[:, :, None]
            lim = zero[:, :, None] * xp.where(own < big, own / big, xp.ones_like(own))
            small = face.omega & (face.X <= lim)
        changed = xp.any(xp.reshape(small, (small.shape[0], -1)), axis=1)
        rows = self._final_rows(xp, face)
        if rows is not None:
            for new, old in zip(rows, face.rows, strict=True):
                changed = changed | xp.any(new != old, axis=1)
        if not bool(xp.any(changed)):
            return face
        omega = face.omega & ~small
        X = face.X * xp.astype(omega, face.X.dtype)
        idx = xp.nonzero(changed)[0]
        sub_rows = None if rows is None else tuple(xp.take(m, idx, axis=0) for m in rows)
        sub = _system_of(xp, xp.take(omega, idx, axis=0), sub_rows, self.sums, C.dtype)
        from .bipartite import _put_system

        return FaceSolution(X, face.y, omega, rows, face.accepted, _put_system(xp, face.system, idx, sub))

    def _weak(self, xp: Any, face: FaceSolution, lam: Any, tol: Any) -> Any:
        """Zero entries whose multiplier is zero to rounding (and, in subclasses, rows likewise)."""
        w = (~face.omega) & (lam <= tol[:, :, None])
        return xp.any(xp.reshape(w, (w.shape[0], -1)), axis=1)

    def _violation(self, xp: Any, X: Any) -> Any:
        S = self.sums
        rs, cs = line_sums(xp, X)
        if S.equality:
            parts = [xp.abs(rs - 1.0), xp.abs(cs - 1.0)]
        else:
            z = xp.zeros_like
            parts = [xp.maximum(rs - 1.0, z(rs)), xp.maximum(cs - 1.0, z(cs))]
            if S.has_w:
                tot = xp.sum(rs, axis=1, keepdims=True)
                parts.append(xp.maximum(tot - S.total, z(tot)))
        parts.append(xp.reshape(xp.maximum(-X, xp.zeros_like(X)), (X.shape[0], -1)))
        return xp.max(xp.concat(parts, axis=1), axis=1)

    def _in_float64(self, X: Any, result: ProjectionResult, idx: Any) -> ProjectionResult:
        """float32 samples ``idx`` (far, or their face refused) projected in float64 (this method) and cast back.

        In float32 the face's ``X = (C − u1ᵀ − 1vᵀ)⊙Ω`` carries ``eps₃₂ |C|`` an entry, and its KKT test the
        rounding ``2 (r + c) eps₃₂ |C|``: against entries of at most 1 that test says little once ``|C|`` is large
        (at ``|C|`` 1e5, Birkhoff(6), 2 × 2 blocks of ties: faces accepted 0.28 off the projection, their
        HS-Jacobian wrong by 1.2; at ``|C|`` ~ 1e5 and k = 30 no face passes it, and Birkhoff(30) at 1e4 sent 7 of
        16 samples to the generic path, 24 s, against 0.4 s for the same points in float64). So samples beyond
        FAR32 (1024: the simplices' far rows, at the size of these sets, 1) and those whose face is refused are
        solved in float64, where the float32 points are exact; what float64 refuses too goes to the generic path
        there. The answer is returned in X's dtype (its violation that of the rounded point), the backward
        takes the float64 face (as ``CappedSimplex._in_float64`` does for its far rows).
        """
        xp = array_namespace(X)
        if not holds(xp, xp.float64, _device(X)):
            # a device without float64 (torch's MPS): these samples solved on the host in float64, moved back
            # (in the device's float32 the faces are wrong, as above); their backward on the host (OnHost)
            Xi = host_copy(xp.take(X, idx, axis=0))
            return self._merged(X, result, idx, *self._host_part(Xi, X))
        sub = self.project_batch(xp.astype(xp.take(X, idx, axis=0), xp.float64))
        y = xp.astype(sub.y, X.dtype)
        S = self.sums
        viol = self._violation(xp, xp.reshape(xp.astype(y, xp.float64), (y.shape[0], S.r, S.c)))
        return self._merged(X, result, idx, self, sub, y, viol)

    def _host_part(self, Xi: np.ndarray, like: Any) -> tuple[Any, ProjectionResult, Any, Any]:
        """``(gen, sub, y, viol)`` for :meth:`_merged` of the float32 host samples ``Xi`` solved in float64."""
        hp = array_namespace(Xi)
        sub = self.project_batch(Xi.astype(np.float64))
        y = np.asarray(sub.y, dtype=Xi.dtype)
        viol = self._violation(hp, np.reshape(y.astype(np.float64), (y.shape[0], self.sums.r, self.sums.c)))
        moved = result_on(sub, like, Xi.dtype)
        xp, dev = array_namespace(like), _device(like)
        return (OnHost(self, sub), moved, xp.asarray(own_contiguous(y), device=dev),
                xp.asarray(own_contiguous(np.asarray(viol, dtype=Xi.dtype)), device=dev))

    def _fall_back(self, X: Any, result: ProjectionResult, idx: Any) -> ProjectionResult:
        """Samples ``idx`` by the generic QP path of :meth:`as_polyhedron` (polished, verified)."""
        from ..backends.defaults import PROJECTION_DEFAULT
        from .polyhedral import Polyhedral

        xp = array_namespace(X)
        Xi = xp.take(X, idx, axis=0)
        G = Polyhedral(self.as_polyhedron(), PROJECTION_DEFAULT, tol=self._generic_tol(xp, Xi))
        sub = G.project_batch(Xi, record=True)
        return self._merged(X, result, idx, G, sub, sub.y, sub.violation)

    def _generic_tol(self, xp: Any, X: Any) -> float:
        """The generic polish's ``tol`` that verifies the samples ``X`` to this set's own accuracy.

        The generic KKT tests are relative to the sample's scale ``s = 1 + max|x|`` (a multiplier is refused
        below ``−tol·s``), while this set's points have entries and line sums of at most 1 (``max_matches``
        at most ``min(r, c)``): a wrong face whose multiplier misses by ``δ`` moves ``X`` by about ``δ``. At
        the default ``tol`` (1e-9) and ``|x|`` 2e8 that let faces 0.17-0.375 off the projection pass as polished
        (ties of a partial matching at 1e8, the structured face's rounds exhausted). So ``tol / s`` of the
        farthest sample, for ``tol·s/s = tol`` in the units of ``X`` as the structured test (``_verify``'s
        ``tol · (1 + max|X|)``), and never below the rounding of ``x − y`` (``2 (r + c) eps`` relative: a right
        face computed at ``s`` is only exact to that).
        """
        _, t_kkt, t_round = self._tols(xp, X.dtype)
        far = 1.0 + float(xp.max(xp.abs(X))) if X.shape[0] else 1.0
        return max(t_kkt / far, t_round) if math.isfinite(far) else t_kkt

    def _merged(self, X: Any, result: ProjectionResult, idx: Any, gen: Any, sub: ProjectionResult, y: Any,
                viol: Any) -> ProjectionResult:
        """``result`` with the samples ``idx`` taken from ``sub`` (``gen``'s result: point ``y``, violation ``viol``).

        The backward of those samples is ``gen.vjp`` at ``sub`` (:class:`SumsFace`).
        """
        from dataclasses import replace

        xp = array_namespace(X)
        put = lambda full, part: put_rows(xp, full, idx, part)  # noqa: E731
        status = list(result.status)
        for k, i in enumerate(int(v) for v in (idx.tolist() if hasattr(idx, "tolist") else idx)):
            status[i] = sub.status[k]
        pol = put(result.polished, xp.asarray(sub.polished, device=_device(X)))
        viol = put(result.violation, xp.astype(viol, result.violation.dtype))
        dg, sub_dg = result.degenerate, sub.degenerate
        degenerate = dg if sub_dg is None else Degeneracy(put(dg.weak, sub_dg.weak),
                                                          put(dg.dependent, sub_dg.dependent))
        return replace(result, y=put(result.y, xp.astype(y, result.y.dtype)), active=put(result.active, sub.active),
                       multipliers=put(result.multipliers, xp.astype(sub.multipliers, result.multipliers.dtype)),
                       status=tuple(status), polished=pol, violation=viol, max_violation=float(xp.max(viol)),
                       degenerate=degenerate, face=SumsFace(result.face.system, idx, (gen, sub)))

    # ------------------------------------------------------------------ backward
    def vjp(self, result: ProjectionResult, G: Any) -> Any:
        """``J g`` at the face (one solve with its Schur complement; fallback samples: the generic VJP)."""
        xp = array_namespace(G)
        S = self.sums
        b = G.shape[0]
        G = xp.reshape(G, (b, self.n))  # (b, r, c) or (b, r·c): both paths below take the flat rows
        f: SumsFace = result.face
        if f.system.omega.dtype == xp.float64 and G.dtype != xp.float64:  # at a float64 face (_in_float64)
            G = xp.astype(G, xp.float64)
        Jg = xp.reshape(f.system.null_apply(xp.reshape(G, (b, S.r, S.c))), (b, self.n))
        if f.fallback is None:
            return Jg
        gen, sub = f.fallback
        part = gen.vjp(sub, xp.take(G, f.fallback_idx, axis=0))
        return put_rows(xp, Jg, f.fallback_idx, xp.astype(part, Jg.dtype))


def _stop(xp: Any, scale: Any, t_newton: float, t_round: float) -> Any:
    """Newton's stop (b, 1), in units of ``t_newton``: ``t_newton |C|``, at most FACE_RESIDUAL, at least C's rounding.

    Newton only finds the face (the face solve is exact), so it stops at ``t_newton`` at C's size — but its
    residual is in the units of X's line sums (at most 1), so never above FACE_RESIDUAL there (at C's size alone
    one entry at 1e8 would let it stop at 1.5, on no face), nor below C's rounding.
    """
    return xp.maximum(xp.minimum(t_newton * scale, xp.full_like(scale, FACE_RESIDUAL)), t_round * scale) / t_newton


def _system_of(xp: Any, omega: Any, rows: Any, S: Sums, dtype: Any) -> DualSystem:
    om = xp.astype(omega, dtype)
    fu, fv, fw = (None, None, None) if rows is None else (xp.astype(m, dtype) for m in rows)
    return DualSystem.factor(om, fu, fv, fw, xp.zeros((om.shape[0], 1), dtype=dtype, device=_device(om)), S.has_w)


class Birkhoff(SumsProjector):
    """Doubly stochastic ``k × k`` matrices: ``{X : X >= 0, X1 = 1, Xᵀ1 = 1}``.

    Points are matrices ``(k, k)`` (or flattened row-major, ``(k²,)``); batches ``(batch, k, k)`` or
    ``(batch, k²)`` keep their layout. The projection is exact (KKT verified at the sample's scale), its
    active set the zero entries, its HS-Jacobian the projector onto ``{D : D = 0 off the support, D1 = 0,
    Dᵀ1 = 0}`` (:mod:`polyproj.sets.bipartite`).

    :meth:`as_polyhedron` writes the ``k`` row sums and the first ``k − 1`` column sums: the last column
    sum follows from them (the ``2k`` equations have rank ``2k − 1``); its multiplier is 0 in the
    results' numbering (a Polyhedron with all ``2k`` rows, ``allow_dependent_rows=True``, is recognised
    by :func:`polyproj.project` as this set).

    Examples
    --------
    >>> import numpy as np, polyproj as pp
    >>> res = pp.project(np.array([[2.0, 0.0], [0.5, 0.5]]), pp.sets.Birkhoff(2))
    >>> np.round(res.y, 12)
    array([[1., 0.],
           [0., 1.]])
    """

    def __init__(self, k: int, *, tol: float | None = None, max_iter: int = 60) -> None:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ProblemError(f"k must be an integer >= 1, got {k!r}")
        super().__init__(Sums(int(k), int(k), True), tol=tol, max_iter=max_iter)
        self.k = int(k)

    def _rows(self) -> Polyhedron:
        """Row sums (``k`` rows), column sums but the last (``k − 1``), ``X >= 0`` (row-major entries)."""
        k = self.k
        B = np.vstack([np.kron(np.eye(k), np.ones((1, k))), np.kron(np.ones((1, k)), np.eye(k))[: k - 1]])
        return Polyhedron(B=B, b=np.ones(2 * k - 1), lb=np.zeros(k * k))

    def row_counts(self) -> tuple[int, int]:
        """``(k², 2k − 1)``."""
        return self.k * self.k, 2 * self.k - 1

    def _first_steps(self) -> int:
        """Newton steps before the exact face is tried: 1 for ``k <= 4``, 2 up to ``k = 20``, else all.

        Random 4 × 4 inputs after one step end their face rounds in 1.3 rounds on average (75 % in the
        first, none failed in 1e5); for larger ``k`` the faces after one step are further off and the
        rounds take longer than Newton's steps (measured on torch CPU at k = 3 ... 50).
        """
        return 1 if self.k <= 4 else 2 if self.k <= 20 else self.max_iter

    def _active(self, xp: Any, face: FaceSolution, zero: Any) -> Any:
        return xp.reshape(zero, (zero.shape[0], self.n))

    def _multipliers(self, xp: Any, face: FaceSolution, lam: Any) -> Any:
        return xp.concat([lam, face.y.u, face.y.v[:, : self.k - 1]], axis=1)

    def __repr__(self) -> str:
        return f"Birkhoff(k={self.k})"
