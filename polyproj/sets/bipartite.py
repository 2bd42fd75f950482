"""Row- and column-sum polytopes of matrices: the dual, its semismooth Newton method, the exact face.

For ``C`` (r × c) the projection onto ``T = {X >= 0, X1 ⋈ 1, Xᵀ1 ⋈ 1, [1ᵀX1 <= α]}`` (``⋈`` is ``=``
for the Birkhoff polytope, ``<=`` for partial matchings) has the dual (Li, Sun & Toh 2018, *On the
efficient computation of a generalized Jacobian of the projector over the Birkhoff polytope*, Math.
Program. 179)

    min_y  φ(y) = ½‖(C − u1ᵀ − 1vᵀ − w11ᵀ)₊‖² + Σu + Σv + αw,   y = (u, v, w),

with ``u, v, w >= 0`` for inequality rows (free for equalities) and ``X = Z₊``, ``Z = C − u1ᵀ − 1vᵀ − w``.
``∇φ = (1 − X1, 1 − Xᵀ1, α − ΣX)`` (the slacks), and with ``Ω = [Z > 0]`` the support, ``r = Ω1``,
``c = Ωᵀ1``, ``N = ΣΩ``, the generalised Hessian is ``V = A_Ω A_Ωᵀ``::

    V = [[diag r, Ω, r], [Ωᵀ, diag c, c], [rᵀ, cᵀ, N]].

The Birkhoff polytope's ``2k`` equations have rank ``2k − 1`` (``V`` is singular along ``(1, −1)``): the
last column's multiplier is fixed at 0 (``v_c = 0``, the row :meth:`Birkhoff.as_polyhedron` omits).

* **Newton** (:func:`newton`): projected semismooth Newton steps ``(V_F + μI) d_F = −∇φ_F`` on the dual
  variables not held at their bound (Bertsekas' ε-active set), ``μ = min(1, ‖res‖)`` (LST's
  regularisation), an Armijo search along the projection arc. ``V_F`` is solved through its Schur
  complement on the columns (``u`` is eliminated: ``diag r`` is diagonal), a ``c × c`` (or ``c+1``)
  batched Cholesky (entry by entry for small systems and large batches, :func:`polyproj.linalg.entrywise`):
  the whole batch advances in a few array operations per step.
* **Exact face** (:func:`polish`): the support ``Ω`` and the dual rows held as equations ``D`` define a
  face; the correction ``V_D δy = −∇φ_D`` (``μ = 0``) makes its equations exact, then the KKT conditions
  are verified — ``X >= 0`` on the support, ``Z <= 0`` off it (the multipliers ``λ = −Z`` of the zero
  entries), ``y >= 0`` on ``D``, slacks ``>= 0`` off ``D`` — relative to the sample's scale. A sample
  that fails changes its face (every wrong entry at once) and is solved again.
* **HS-Jacobian** (:meth:`DualSystem.null_apply`): at the face, ``J g`` is ``g`` restricted to ``Ω`` minus
  ``A_Dᵀ V_D⁺ A_D (g⊙Ω)`` — one solve with the same Schur complement; no ``k² × k²`` matrix.

``V_D`` is singular when the support splits into blocks (a block with as many rows as columns carries
its own ``(1, −1)``): such samples are solved by the eigendecomposition of the scaled Schur complement
(its numerical null space dropped: the minimum-norm correction) and reported as dependent.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from array_api_compat import array_namespace
from array_api_compat import device as _device

from ..linalg import cho_solve, cholesky, eigh, entrywise, small_cho_solve, small_cholesky
from ..projection.faces import put_rows

__all__ = ["Dual", "DualSystem", "Sums", "finish", "newton", "polish"]


@dataclass(frozen=True)
class Sums:
    """The polytope: ``r × c`` matrices, rows and columns equal to 1 or at most 1, an optional total.

    ``equality``: rows and columns sum to 1 (else at most 1); ``total``: ``α`` in ``ΣX <= α`` (inequality
    rows only).
    """

    r: int
    c: int
    equality: bool
    total: float | None = None

    @property
    def has_w(self) -> bool:
        """True when the total's row exists."""
        return self.total is not None


@dataclass(frozen=True)
class Dual:
    """Dual variables ``u`` (b, r), ``v`` (b, c), ``w`` (b, 1) (zero without a total row)."""

    u: Any
    v: Any
    w: Any

    def take(self, xp: Any, idx: Any) -> Dual:
        """The samples ``idx``."""
        return Dual(*(xp.take(t, idx, axis=0) for t in (self.u, self.v, self.w)))

    def put(self, xp: Any, idx: Any, part: Dual) -> Dual:
        """The samples ``idx`` replaced by ``part``."""
        return Dual(*(put_rows(xp, a, idx, b) for a, b in zip((self.u, self.v, self.w), (part.u, part.v, part.w),
                                                              strict=True)))


def eps_of(xp: Any, dtype: Any) -> float:
    """Machine epsilon of a floating dtype."""
    return float(np.finfo(np.float32 if dtype == xp.float32 else np.float64).eps)


def z_of(C: Any, y: Dual, has_w: bool = True) -> Any:
    """``Z = C − u1ᵀ − 1vᵀ − w`` (b, r, c) (``w`` left out when the set has no total row)."""
    Z = C - spread(array_namespace(C), y.u, y.v)
    return Z - y.w[:, :, None] if has_w else Z


#: matrices with at most this many entries form ``u1ᵀ + 1vᵀ`` as one product with the line indicators
SPREAD = 64


#: the indicators built so far, by namespace, shape, dtype and device (a few small constant arrays)
_INDICATORS: dict[tuple, Any] = {}


def _indicators(xp: Any, r: int, c: int, dtype: Any, dev: Any) -> Any:
    """The 0/1 indicators ``(rc, r + c)`` of the rows and columns of the row-major entries (built once)."""
    key = (xp.__name__, r, c, str(dtype), str(dev))
    hit = _INDICATORS.get(key)
    if hit is None:
        if len(_INDICATORS) >= 64:
            _INDICATORS.clear()
        hit = _INDICATORS[key] = _build_indicators(xp, r, c, dtype, dev)
    return hit


def _build_indicators(xp: Any, r: int, c: int, dtype: Any, dev: Any) -> Any:
    return xp.concat([xp.reshape(xp.broadcast_to(xp.eye(r, dtype=dtype, device=dev)[:, None, :], (r, c, r)),
                                 (r * c, r)),
                      xp.reshape(xp.broadcast_to(xp.eye(c, dtype=dtype, device=dev)[None, :, :], (r, c, c)),
                                 (r * c, c))], axis=1)


def spread(xp: Any, u: Any, v: Any) -> Any:
    """``u1ᵀ + 1vᵀ`` (b, r, c) of ``u`` (b, r), ``v`` (b, c).

    Small matrices: ``[u, v]`` times the transposed indicators, one BLAS product over the batch (torch's
    CPU broadcasting over two short trailing axes is ~10x slower); larger ones broadcast.
    """
    b, r = u.shape
    c = v.shape[1]
    if r * c > SPREAD:
        return u[:, :, None] + v[:, None, :]
    ind = _indicators(xp, r, c, u.dtype, _device(u))
    return xp.reshape(xp.matmul(xp.concat([u, v], axis=1), xp.matrix_transpose(ind)), (b, r, c))


def line_sums(xp: Any, A: Any) -> tuple[Any, Any]:
    """``(A1, Aᵀ1)`` of a batch (b, r, c).

    One product of the flattened matrices with the 0/1 indicators ``(rc, r + c)`` of the rows and columns.
    """
    b, r, c = A.shape
    both = xp.matmul(xp.reshape(A, (b, r * c)), _indicators(xp, r, c, A.dtype, _device(A)))
    return both[:, :r], both[:, r:]


def slacks(xp: Any, X: Any, S: Sums) -> tuple[Any, Any, Any]:
    """``∇φ = (1 − X1, 1 − Xᵀ1, α − ΣX)`` (the last zero without a total row)."""
    rs, cs = line_sums(xp, X)
    gw = (S.total - xp.sum(rs, axis=1, keepdims=True)) if S.has_w else xp.zeros_like(rs[:, :1])
    return 1.0 - rs, 1.0 - cs, gw


# ----------------------------------------------------------------------------- the dual system
@dataclass(frozen=True)
class EigPart:
    """Eigendecomposition ``Q diag(λ) Qᵀ`` of the scaled Schur complement of samples ``idx``."""

    idx: Any
    Q: Any
    inv: Any  # 1/λ on the numerical range, 0 on the null space


@dataclass(frozen=True)
class DualSystem:
    """``V_F + μI`` on a face (support ``omega``, dual rows ``fu, fv, fw`` in the system), factored.

    The rows ``u`` are eliminated (``a = fu/(r + μ)``); the Schur complement ``S`` on ``(v, w)`` is
    scaled to unit diagonal (``d = 1/√diag S``) and factored by Cholesky; a sample whose pivots fall
    below ``eps^(1/4)`` (a singular face, ``μ = 0``) is solved by the eigendecomposition instead.
    """

    omega: Any  # (b, r, c) 0/1 in the working dtype
    rr: Any  # (b, r) row counts
    a: Any  # (b, r) fu / (r + μ), 0 off the system
    fv: Any  # (b, m) columns (and w) in the system, 0/1; None: the first c − 1 columns (grounded)
    d: Any  # (b, m) Jacobi scaling, or None (not scaled)
    L: Any  # (b, m, m)
    ok: Any  # (b,) Cholesky accepted
    eig: EigPart | None
    has_w: bool

    @classmethod
    def factor(cls, omega: Any, fu: Any, fv: Any, fw: Any, mu: Any, has_w: bool, *, check: bool = True
               ) -> DualSystem:
        """Factor the system of a batch (``mu`` (b, 1) >= 0; ``fw`` ignored without a total row).

        ``fu = fv = None``: the Birkhoff system, every row and the first ``c − 1`` columns (``v_c = 0``),
        formed on those columns directly. ``check`` scales and tests the pivots (faces, ``μ = 0``); a
        regularised Newton system (``μ > 0``) is positive definite and skips both.
        """
        xp = array_namespace(omega)
        rr, cc = line_sums(xp, omega)
        den = rr + mu
        a = 1.0 / xp.where(den > 0, den, xp.ones_like(den))
        a = xp.where(den > 0, a, xp.zeros_like(a)) if fu is None else xp.where((fu > 0) & (den > 0), a,
                                                                              xp.zeros_like(a))
        om = omega[:, :, :-1] if fv is None else omega
        W = om * a[:, :, None]
        cc = cc[:, :-1] if fv is None else cc
        S = -xp.matmul(xp.matrix_transpose(W), om)  # diag(c + μ) − Ωᵀ diag(a) Ω
        if has_w:
            sw = cc - xp.sum(W * rr[:, :, None], axis=1)  # c − Ωᵀ (a ⊙ r)
            sww = xp.sum(rr, axis=1, keepdims=True) - xp.sum(a * rr * rr, axis=1, keepdims=True)
            S = xp.concat([xp.concat([S, sw[:, :, None]], axis=2),
                           xp.concat([sw[:, None, :], sww[:, :, None]], axis=2)], axis=1)
            cc = xp.concat([cc, xp.zeros_like(sww)], axis=1)
            fv = xp.concat([fv, fw], axis=1)
        m = S.shape[-1]
        eye = xp.eye(m, dtype=omega.dtype, device=_device(omega))
        S = S + eye * (cc + mu)[:, None, :]
        if fv is not None:  # rows and columns not in the system: the identity
            S = S * (fv[:, :, None] * fv[:, None, :]) + eye * (1.0 - fv)[:, None, :]
        d = None
        if check:
            dg = xp.linalg.diagonal(S)
            d = 1.0 / xp.sqrt(xp.where(dg > 0, dg, xp.ones_like(dg)))
            S = S * d[:, :, None] * d[:, None, :]
        L, ok = (small_cholesky if entrywise(S.shape[0], m) else cholesky)(xp, S)
        if check:
            ok = ok & xp.all(xp.linalg.diagonal(L) >= eps_of(xp, S.dtype) ** 0.25, axis=1)
        eig = None
        if not bool(xp.all(ok)):
            idx = xp.nonzero(~ok)[0]
            lam, Q = eigh(xp, xp.take(S, idx, axis=0))
            keep = lam > m * eps_of(xp, S.dtype) * 10.0 * xp.max(xp.abs(lam), axis=1, keepdims=True)
            inv = xp.where(keep, 1.0 / xp.where(keep, lam, xp.ones_like(lam)), xp.zeros_like(lam))
            eig = EigPart(idx, Q, inv)
            L = xp.where(ok[:, None, None], L, xp.broadcast_to(eye, L.shape))
        return cls(omega, rr, a, fv, d, L, ok, eig, has_w)

    def solve(self, ru: Any, rv: Any, rw: Any) -> tuple[Any, Any, Any]:
        """``(du, dv, dw)`` with ``(V_F + μI) d = ρ`` on the system's rows (0 elsewhere)."""
        xp = array_namespace(ru)
        om, a = self.omega, self.a
        c = om.shape[2]
        ar = a * ru
        rhs = rv - xp.matmul(ar[:, None, :], om)[:, 0, :]  # ρ_v − Ωᵀ (a ⊙ ρ_u)
        if self.has_w:
            rhs = xp.concat([rhs, rw - xp.sum(ar * self.rr, axis=1, keepdims=True)], axis=1)
        rhs = rhs[:, : c - 1] if self.fv is None else rhs * self.fv
        if self.d is not None:
            rhs = rhs * self.d
        s = (small_cho_solve if entrywise(*self.L.shape[:2]) else cho_solve)(xp, self.L, rhs)
        if self.eig is not None:
            e = self.eig
            qt = xp.sum(e.Q * xp.take(rhs, e.idx, axis=0)[:, :, None], axis=1) * e.inv  # Λ⁺ Qᵀ ρ
            s = put_rows(xp, s, e.idx, xp.sum(e.Q * qt[:, None, :], axis=2))
        if self.d is not None:
            s = s * self.d
        if self.fv is None:
            dv = xp.concat([s, xp.zeros_like(rv[:, :1])], axis=1)  # v_c = 0 (s is empty for c = 1)
        else:
            s = s * self.fv
            dv = s[:, :c]
        dw = s[:, c:] if self.has_w else xp.zeros_like(ru[:, :1])
        du = a * (ru - xp.matmul(om, dv[:, :, None])[:, :, 0] - self.rr * dw)
        return du, dv, dw

    @property
    def dependent(self) -> Any:
        """(b,) the face's dual rows are dependent (the Cholesky was refused)."""
        return ~self.ok

    def null_apply(self, G: Any) -> Any:
        """``J g`` (b, r, c): ``g`` on the support minus ``A_Dᵀ V_D⁺ A_D (g⊙Ω)`` (``μ = 0`` systems)."""
        xp = array_namespace(G)
        Gm = G * self.omega
        ru, rv = line_sums(xp, Gm)
        rw = xp.sum(ru, axis=1, keepdims=True)
        du, dv, dw = self.solve(ru, rv, rw)
        shift = spread(xp, du, dv)
        return Gm - self.omega * (shift + dw[:, :, None] if self.has_w else shift)


# ----------------------------------------------------------------------------- Newton on the dual
@dataclass(frozen=True)
class NewtonOptions:
    """How :func:`newton` runs.

    ``tol``: dual residual (relative to the sample's scale) at which a sample goes to the exact face;
    ``max_iter``: Newton steps; ``backtracks``: Armijo halvings per step; ``sigma``: Armijo's constant;
    ``kappa``: the regularisation ``μ = κ min(1, ‖res‖)``.
    """

    tol: float
    max_iter: int = 60
    backtracks: int = 12
    sigma: float = 1e-4
    kappa: float = 1e-2


@dataclass
class _Iterate:
    y: Dual
    X: Any  # Z₊
    phi: Any  # (b, 1)


def _phi(xp: Any, Z: Any, y: Dual, S: Sums) -> tuple[Any, Any]:
    """``(φ(y), Z₊)``."""
    X = xp.clip(Z, min=0.0)
    Xf = xp.reshape(X, (X.shape[0], -1))
    val = 0.5 * xp.matmul(Xf * Xf, xp.ones((Xf.shape[1], 1), dtype=Xf.dtype, device=_device(Xf)))
    val = val + xp.sum(y.u, axis=1, keepdims=True) + xp.sum(y.v, axis=1, keepdims=True)
    return val + (S.total * y.w if S.has_w else 0.0), X


def _iterate(xp: Any, C: Any, y: Dual, S: Sums) -> _Iterate:
    phi, X = _phi(xp, z_of(C, y, S.has_w), y, S)
    return _Iterate(y, X, phi)


def _masks(xp: Any, y: Dual, g: tuple[Any, Any, Any], res_size: Any, S: Sums, like: Any):
    """Dual rows in the Newton system (1) and held at the bound (0): Bertsekas' ε-active set.

    ``(None, None, None)`` for the Birkhoff polytope: every row, the columns but the last.
    """
    if S.equality:
        return None, None, None
    eps_a = xp.minimum(res_size, xp.full_like(res_size, 1e-3))
    out = []
    for yy, gg in zip((y.u, y.v, y.w), g, strict=True):
        out.append(xp.astype(~((yy <= eps_a) & (gg > 0)), like.dtype))
    if not S.has_w:
        out[2] = xp.zeros_like(out[2])
    return tuple(out)


def _residual(xp: Any, y: Dual, g: tuple[Any, Any, Any], S: Sums) -> Any:
    """Size of the KKT residual of the dual, ``max |y − Π(y − ∇φ)|`` (b, 1)."""
    parts = []
    for yy, gg in zip((y.u, y.v, y.w), g, strict=True):
        parts.append(gg if S.equality else yy - xp.maximum(yy - gg, xp.zeros_like(yy)))
    if not S.has_w:
        parts = parts[:2]
    return xp.max(xp.abs(xp.concat(parts, axis=1)), axis=1, keepdims=True)


def _project(xp: Any, y: Dual, S: Sums) -> Dual:
    if S.equality:
        return y
    z = xp.zeros_like
    return Dual(xp.maximum(y.u, z(y.u)), xp.maximum(y.v, z(y.v)), xp.maximum(y.w, z(y.w)))


def start(xp: Any, C: Any, S: Sums) -> Dual:
    """A first dual point: the multipliers of the affine projection (Birkhoff), else ``u = (max_j C_ij − 1)₊``.

    With inequalities, ``u`` brings each row's largest entry down to 1 at most, where every entry of X
    lies in the end: from zero (``X = C₊``) one far entry sends the first steps' multipliers to its size on
    every row it meets, far from the solution's.
    """
    b, r, c = C.shape
    if not S.equality:
        u = xp.maximum(xp.max(C, axis=2) - 1.0, xp.zeros((b, r), dtype=C.dtype, device=_device(C)))
        return Dual(u, xp.zeros((b, c), dtype=C.dtype, device=_device(C)), xp.zeros_like(u[:, :1]))
    rs, cs = line_sums(xp, C)
    half = (xp.sum(rs, axis=1, keepdims=True) - r) / (2.0 * r)  # Σu = Σv (square: r = c)
    u, v = (rs - 1.0 - half) / c, (cs - 1.0 - half) / r
    return Dual(u + v[:, -1:], v - v[:, -1:], xp.zeros_like(u[:, :1]))  # v_c = 0


def newton(C: Any, S: Sums, scale: Any, opts: NewtonOptions, y0: Dual | None = None, stop: Any = None
           ) -> tuple[Dual, Any, int]:
    """Newton steps on the dual of every sample until its residual is below ``opts.tol · stop``.

    From ``y0`` (default :func:`start`). ``scale`` (b, 1) sizes the regularisation, ``stop`` the test (default
    ``scale``). Returns the dual point, ``done`` (b,) and the steps taken. Open samples are compacted once
    they are at most half of those still iterating.
    """
    xp = array_namespace(C)
    it = _iterate(xp, C, start(xp, C, S) if y0 is None else y0, S)
    b = C.shape[0]
    idx = None
    out_y = it.y
    done_all = xp.zeros((b,), dtype=xp.bool, device=_device(C))
    Cs, sc, st = C, scale, scale if stop is None else stop
    steps = 0
    for steps in range(1, opts.max_iter + 1):  # noqa: B007 - reported
        X = it.X
        g = slacks(xp, X, S)
        res = _residual(xp, it.y, g, S)
        done = res[:, 0] <= opts.tol * st[:, 0]
        out_y = it.y if idx is None else out_y.put(xp, idx, it.y)
        done_all = done if idx is None else put_rows(xp, done_all, idx, done)
        left = int(xp.sum(xp.astype(~done, xp.int64)))
        if left == 0:
            break
        if 2 * left <= done.shape[0]:
            keep = xp.nonzero(~done)[0]
            idx = keep if idx is None else xp.take(idx, keep, axis=0)
            it = _Iterate(it.y.take(xp, keep), xp.take(it.X, keep, axis=0), xp.take(it.phi, keep, axis=0))
            Cs, sc, st, X = xp.take(Cs, keep, axis=0), xp.take(sc, keep, axis=0), xp.take(st, keep, axis=0), it.X
            g, res = tuple(xp.take(t, keep, axis=0) for t in g), xp.take(res, keep, axis=0)
            done = None
        new = _step(xp, Cs, S, it, X, g, res, sc, opts)
        # samples already within tolerance keep their point, so a sample's answer does not depend on its batch
        # (further regularised steps move a degenerate sample's multipliers while others iterate)
        it = new if done is None or not bool(xp.any(done)) else _frozen(xp, done, it, new)
    else:
        out_y = it.y if idx is None else out_y.put(xp, idx, it.y)
    return out_y, done_all, steps


def _frozen(xp: Any, done: Any, old: _Iterate, new: _Iterate) -> _Iterate:
    """``new``, with the samples ``done`` (b,) kept at ``old``."""
    d = done[:, None]
    y = Dual(*(xp.where(d, a, b) for a, b in zip((old.y.u, old.y.v, old.y.w), (new.y.u, new.y.v, new.y.w),
                                                     strict=True)))
    return _Iterate(y, xp.where(done[:, None, None], old.X, new.X), xp.where(d, old.phi, new.phi))


def _step(xp: Any, C: Any, S: Sums, it: _Iterate, X: Any, g, res: Any, sc: Any, opts: NewtonOptions) -> _Iterate:
    """One projected Newton step with an Armijo search along the projection arc."""
    y = it.y
    omega = xp.astype(X > 0, C.dtype)
    fu, fv, fw = _masks(xp, y, g, res, S, C)
    # LST's regularisation μ = κ min(1, ‖res‖) (relative to the sample's scale), bounded below
    mu = xp.maximum(opts.kappa * xp.minimum(res / sc, xp.ones_like(res)), xp.full_like(res, opts.tol))
    system = DualSystem.factor(omega, fu, fv, fw, mu, S.has_w, check=False)
    if S.equality:
        return _search(xp, C, S, it, g, Dual(*system.solve(-g[0], -g[1], -g[2])), opts)
    # the dual rows held at their bound move to it (d = −y there); the others take the Newton step
    hu, hv, hw = (1.0 - fu) * -y.u, (1.0 - fv) * -y.v, (1.0 - fw) * -y.w
    rr, cc = system.rr, xp.sum(omega, axis=1)
    # ρ = −∇φ − V d_held on the rows in the system
    Vh_u = rr * hu + xp.sum(omega * hv[:, None, :], axis=2) + rr * hw
    Vh_v = xp.sum(omega * hu[:, :, None], axis=1) + cc * hv + cc * hw
    Vh_w = xp.sum(rr * hu, axis=1, keepdims=True) + xp.sum(cc * hv, axis=1, keepdims=True) + \
        xp.sum(rr, axis=1, keepdims=True) * hw
    du, dv, dw = system.solve(-g[0] - Vh_u, -g[1] - Vh_v, -g[2] - Vh_w)
    d = Dual(du + hu, dv + hv, dw + hw)
    return _search(xp, C, S, it, g, d, opts)


def _search(xp: Any, C: Any, S: Sums, it: _Iterate, g, d: Dual, opts: NewtonOptions) -> _Iterate:
    """Armijo backtracking ``φ(y(t)) <= φ(y) + σ ∇φᵀ(y(t) − y)``, ``y(t) = Π(y + t d)``, per sample."""
    y = it.y
    t = 1.0
    cur = it
    todo = None  # samples still searching (None: all)
    for k in range(opts.backtracks + 1):
        base = y if todo is None else y.take(xp, todo)
        dd = d if todo is None else d.take(xp, todo)
        Cc = C if todo is None else xp.take(C, todo, axis=0)
        yt = _project(xp, Dual(base.u + t * dd.u, base.v + t * dd.v, base.w + t * dd.w), S)
        pt, Xt = _phi(xp, z_of(Cc, yt, S.has_w), yt, S)
        gg = g if todo is None else tuple(xp.take(v, todo, axis=0) for v in g)
        pred = (xp.sum(gg[0] * (yt.u - base.u), axis=1, keepdims=True)
                + xp.sum(gg[1] * (yt.v - base.v), axis=1, keepdims=True) + gg[2] * (yt.w - base.w))
        p0 = it.phi if todo is None else xp.take(it.phi, todo, axis=0)
        ok = (pt <= p0 + opts.sigma * pred)[:, 0]
        if k == opts.backtracks:
            ok = xp.ones_like(ok)  # the last, shortest step is taken
        cur = _merge(xp, cur, todo, ok, yt, Xt, pt)
        rest = xp.nonzero(~ok)[0]
        if rest.shape[0] == 0:
            break
        todo = rest if todo is None else xp.take(todo, rest, axis=0)
        t *= 0.5
    return cur


def _merge(xp: Any, cur: _Iterate, todo: Any, ok: Any, yt: Dual, Xt: Any, pt: Any) -> _Iterate:
    """``cur`` with the accepted trial points (samples ``todo[ok]``) written in."""
    if todo is None and bool(xp.all(ok)):
        return _Iterate(yt, Xt, pt)
    sel = xp.nonzero(ok)[0]
    if sel.shape[0] == 0:
        return cur
    rows = sel if todo is None else xp.take(todo, sel, axis=0)
    return _Iterate(cur.y.put(xp, rows, yt.take(xp, sel)), put_rows(xp, cur.X, rows, xp.take(Xt, sel, axis=0)),
                    put_rows(xp, cur.phi, rows, xp.take(pt, sel, axis=0)))


# ----------------------------------------------------------------------------- the exact face
@dataclass(frozen=True)
class FaceSolution:
    """The faces found by :func:`polish`.

    The point ``X``, its duals, the support, the dual rows ``D`` held as equations, ``accepted`` (b,) (the
    KKT test passed) and the factored system (for the backward).
    """

    X: Any
    y: Dual
    omega: Any  # (b, r, c) bool
    rows: tuple[Any, Any, Any] | None  # (b, r), (b, c), (b, 1) bool: D (None: all, Birkhoff)
    accepted: Any
    system: DualSystem


def _face_masks(xp: Any, y: Dual, S: Sums, like: Any):
    """The dual rows held as equations: all (Birkhoff: ``None``, ``v_c`` grounded) or those with ``y > 0``."""
    if S.equality:
        return None
    fw = xp.astype(y.w > 0, like.dtype) if S.has_w else xp.zeros_like(y.w)
    return xp.astype(y.u > 0, like.dtype), xp.astype(y.v > 0, like.dtype), fw


def _miss(xp: Any, g: tuple[Any, Any, Any], masks) -> Any:
    """Largest miss of the face's equations (b, 1): the rows in ``D`` (all rows and columns: Birkhoff)."""
    parts = [g[0], g[1]] if masks is None else [gv * m for gv, m in zip(g, masks, strict=True)]
    return xp.max(xp.abs(xp.concat(parts, axis=1)), axis=1, keepdims=True)


def _face_solve(xp: Any, C: Any, S: Sums, y: Dual, omega: Any, masks, rounding: Any
                ) -> tuple[Dual, Any, Any, DualSystem]:
    """The exact point of a face: ``y + δ`` with ``V_D δ = −∇φ_D`` (the face's X is affine in y).

    The full Newton step of the face's quadratic; up to two more steps with the same factorisation
    (iterative refinement) where the equations still miss by more than ``rounding`` (b, 1) — float32
    faces far from the start. Returns ``(y, Z, X = Z⊙Ω, system)``.
    """
    fu, fv, fw = (None, None, None) if masks is None else masks
    system = DualSystem.factor(omega, fu, fv, fw, xp.zeros_like(y.w), S.has_w)
    y1 = y if masks is None else Dual(y.u * fu, y.v * fv, y.w * fw)  # rows off D: multiplier 0
    for it in range(4):
        Z = z_of(C, y1, S.has_w)
        X = Z * omega
        if it == 3:
            break
        g = slacks(xp, X, S)
        if not bool(xp.any(_miss(xp, g, masks) > rounding)):
            break
        du, dv, dw = system.solve(-g[0], -g[1], -g[2])
        y1 = Dual(y1.u + du, y1.v + dv, y1.w + dw)
    return y1, Z, X, system


@dataclass(frozen=True)
class _Verdict:
    """The KKT test of a face: ``ok`` (b,), the next support and dual rows for the samples that fail.

    ``changed`` (b,): the next face differs from this one (a failed face that does not change, such as
    one whose equations are inconsistent, would be solved again to the same point).
    """

    ok: Any
    omega: Any
    masks: Any
    changed: Any


def _verify(xp: Any, S: Sums, X: Any, Z: Any, y1: Dual, omega: Any, masks, tol: Any, rounding: Any,
            rows_tol: Any, system: DualSystem | None = None, x_rounding: Any = None) -> _Verdict:
    """KKT of the face solution (tolerances (b, 1) at the sample's scale), and the next face.

    The primal conditions are tested at rounding, the dual ones at ``tol``. A support entry below zero
    beyond rounding leaves the support (its face is not the solution's); a zero entry joins it when its
    multiplier ``−Z`` is negative beyond ``tol``; dual rows with ``y < 0`` beyond ``tol`` leave ``D``; an
    inequality row off ``D`` violated beyond the rounding of ``Z`` joins it; the equations of ``D`` must
    hold to ``rows_tol`` — the rounding of ``Z`` plus ``tol`` at the scale of ``X``, not of ``C``: the
    sums of ``X`` are what the constraints bound (at ``|C|`` 1e9 a face whose column summed to 2 passed a
    test at ``C``'s scale). The rows off ``D`` are held to rounding, not to ``tol``: :func:`finish` makes
    every row at its bound exact, and a face that had left a row violated within ``tol`` (a near
    permutation: every line sum 1 ± 1e-12, multipliers ~1e-12) then turned support entries negative under
    that correction, and went to the generic path.

    A face whose equations are inconsistent fails at the rounding of ``X`` (``x_rounding``), however small its
    miss (:func:`_inconsistent`), and its rows that the least-squares point leaves slack leave ``D``.
    """
    bad_in = (omega > 0) & (X < -rounding[:, :, None])
    bad_out = (omega == 0) & (Z > rows_tol[:, :, None])
    g = slacks(xp, X, S)
    changed = xp.any(xp.reshape(bad_in | bad_out, (X.shape[0], -1)), axis=1)
    ok = ~changed & (_miss(xp, g, masks)[:, 0] <= rows_tol[:, 0])
    new_masks = masks
    if masks is not None:
        wrong = [(m > 0) & (yv < -rows_tol) for m, yv in zip(masks, (y1.u, y1.v, y1.w), strict=True)]
        viol = [(m == 0) & (gv < -rounding) for m, gv in zip(masks, g, strict=True)]
        for wv in (*wrong, *viol):
            changed = changed | xp.any(wv, axis=1)
        leave = (None,) * 3
        if system is not None:
            bad, leave = _inconsistent(xp, system, g, x_rounding)
            ok = ok & ~bad
            for lv in leave:
                changed = changed if lv is None else changed | xp.any(lv, axis=1)
        ok = ok & ~changed
        new_masks = tuple(xp.where(w, xp.zeros_like(m), xp.where(v, xp.ones_like(m), m))
                          for m, w, v in zip(masks, wrong, viol, strict=True))
        new_masks = tuple(m if lv is None else xp.where(lv, xp.zeros_like(m), m)
                          for m, lv in zip(new_masks, leave, strict=True))
    omega = xp.astype(((omega > 0) & ~bad_in) | bad_out, omega.dtype)
    return _Verdict(ok, omega, new_masks, changed)


def _inconsistent(xp: Any, system: DualSystem, g: tuple[Any, Any, Any], tol: Any) -> tuple[Any, tuple]:
    """Samples whose face equations are inconsistent (b,), and the rows of ``D`` that then leave it.

    The equations ``A_D X = b_D`` of a face are inconsistent when ``b_D`` has a part on ``null(A_Dᵀ) = null(V_D)``:
    for a null vector ``n``, ``nᵀ(b_D − A_D X) = nᵀb_D`` whatever ``X`` is, so the slacks ``g`` show it exactly, at
    the rounding of ``X``'s sums (``tol`` (b, 1)) and not at that of ``C`` (which the face's miss carries). Only
    the samples the eigendecomposition solved (the Cholesky refused: a dependent face) can have one. Every row
    of ``D`` held with ``ΣX <= α``, where all the support lies in those rows, says ``ΣX = |rows|``: with ``α`` just
    below that the face has no point, and its least-squares point, within ``tol`` of both, passed the test of
    the face's equations (``max_matches = 3 − 1e-9`` on ``5·I``: ``ΣX − α = 6.7e-10``, refused by :func:`finish`
    only, then accepted by the generic path, SOLVED; in float32 at ``3 − 1e-5`` the whole gap, accepted here).
    The rows whose slack at that point (``Σ_k n_k (n_kᵀ g) / |n_k|²``, the null vectors taken as orthogonal:
    exact for one) is positive cannot all be at their bound: they leave ``D`` (there, the row sums; the total's
    row alone gives ``α/3 · I``), and rows wrongly left join again as violated in the next round.

    ``n`` from the dropped eigenvectors of the scaled Schur complement: ``(n_v, n_w) = d ⊙ q``, and the
    eliminated rows ``n_u = −a ⊙ (Ω n_v + r n_w)`` (as :meth:`DualSystem.solve` recovers ``δu``).
    """
    b = g[0].shape[0]
    r, c = system.omega.shape[1], system.omega.shape[2]
    bad = xp.zeros((b,), dtype=xp.bool, device=_device(g[0]))
    e = system.eig
    if e is None or system.fv is None or system.d is None:
        return bad, (None, None, None)
    take = lambda v: xp.take(v, e.idx, axis=0)  # noqa: E731
    k = e.idx.shape[0]
    N = take(system.d)[:, :, None] * e.Q * xp.astype(e.inv == 0, e.Q.dtype)[:, None, :]  # columns: null vectors
    nv = N[:, :c, :]
    nw = N[:, c:, :] if system.has_w else xp.zeros((k, 1, N.shape[2]), dtype=N.dtype, device=_device(N))
    nu = -take(system.a)[:, :, None] * (xp.matmul(take(system.omega), nv) + take(system.rr)[:, :, None] * nw)
    n = xp.concat([nu, nv, nw], axis=1)  # (k, r + c + 1, m)
    gk = xp.concat([take(g[0]), take(g[1]), take(g[2])], axis=1)
    norm2 = xp.sum(n * n, axis=1)
    coef = xp.sum(n * gk[:, :, None], axis=1) / xp.where(norm2 > 0, norm2, xp.ones_like(norm2))  # nᵀg / |n|²
    miss = xp.max(xp.abs(coef) * xp.sqrt(norm2), axis=1)  # |nᵀg| / |n|: slack units
    p = xp.sum(n * coef[:, None, :], axis=2)  # the least-squares point's slacks on D
    part = miss > take(tol)[:, 0]
    top = xp.max(xp.abs(p), axis=1, keepdims=True)
    leave = part[:, None] & (p > eps_of(xp, p.dtype) ** 0.5 * top)
    bad = put_rows(xp, bad, e.idx, part)
    out = put_rows(xp, xp.zeros((b, r + c + 1), dtype=xp.bool, device=_device(g[0])), e.idx, leave)
    return bad, (out[:, :r], out[:, r: r + c], out[:, r + c:])


def polish(C: Any, S: Sums, y: Dual, scale: Any, tol: float, rounding: float, rounds: int = 6) -> FaceSolution:
    """The exact projection on the face of ``y`` (support ``Z > 0``, dual rows ``y > 0``), verified.

    ``rounding`` (relative to the scale) is the miss of the equations below which a face solve is not
    refined. Faces that fail the KKT test (:func:`_verify`) change every wrong entry at once and are
    solved again, up to ``rounds`` times (a failed face that would not change is not solved again);
    ``accepted`` says which samples passed.
    """
    xp = array_namespace(C)
    omega = xp.astype(z_of(C, y, S.has_w) > 0, C.dtype)
    masks = _face_masks(xp, y, S, C)
    out = None
    idx = None
    Cs, sc, yy = C, scale, y
    for _ in range(rounds):
        y1, Z, X, system = _face_solve(xp, Cs, S, yy, omega, masks, rounding * sc)
        size = 1.0 + xp.max(xp.reshape(xp.abs(X), (X.shape[0], -1)), axis=1, keepdims=True)
        v = _verify(xp, S, X, Z, y1, omega, masks, tol * sc, rounding * sc, rounding * sc + tol * size, system,
                    rounding * size)
        rows = None if masks is None else tuple(m > 0 for m in masks)
        part = FaceSolution(X, y1, omega > 0, rows, v.ok, system)
        out = part if out is None else _put_face(xp, out, idx, part)
        again = ~v.ok & v.changed
        if not bool(xp.any(again)):
            break
        keep = xp.nonzero(again)[0]
        idx = keep if idx is None else xp.take(idx, keep, axis=0)
        omega = xp.take(v.omega, keep, axis=0)
        masks = None if masks is None else tuple(xp.take(m, keep, axis=0) for m in v.masks)
        Cs, sc, yy = xp.take(Cs, keep, axis=0), xp.take(sc, keep, axis=0), y1.take(xp, keep)
    return out


def finish(xp: Any, S: Sums, face: FaceSolution, rounding: float) -> FaceSolution:
    """The face's equations made exact at the point's own scale by one primal correction.

    ``X = (C − u1ᵀ − 1vᵀ − w) ⊙ Ω`` carries the rounding of ``C``, ``eps |C|`` an entry: for far points
    (``|C| ≫ 1``) its line sums miss by far more than the rounding of ``X`` itself (by 1.0 at ``|C|`` 1e12).
    The correction ``δX = −(δu1ᵀ + 1δvᵀ + δw) ⊙ Ω`` with ``V_D δ = −∇φ_D`` (the face's own system) is
    applied to ``X``, not to the duals: the sums then hold to ``rounding (1 + max|X|)``. A sample whose
    corrected support turns negative beyond that is no longer accepted (the generic path takes it).
    """
    X = face.X
    b = X.shape[0]
    masks = None if face.rows is None else tuple(xp.astype(m, X.dtype) for m in face.rows)
    g = slacks(xp, X, S)
    tol = rounding * (1.0 + xp.max(xp.reshape(xp.abs(X), (b, -1)), axis=1, keepdims=True))
    need = _miss(xp, g, masks) > tol
    if not bool(xp.any(need)):
        return face
    du, dv, dw = face.system.solve(-g[0], -g[1], -g[2])
    om = xp.astype(face.omega, X.dtype)
    X2 = xp.where(need[:, :, None], X - (spread(xp, du, dv) + dw[:, :, None]) * om, X)
    y2 = Dual(xp.where(need, face.y.u + du, face.y.u), xp.where(need, face.y.v + dv, face.y.v),
              xp.where(need, face.y.w + dw, face.y.w))
    X2 = X2 * om
    negative = xp.any(xp.reshape((om > 0) & (X2 < -tol[:, :, None]), (b, -1)), axis=1)
    missed = _miss(xp, slacks(xp, X2, S), masks)[:, 0] > 4.0 * tol[:, 0]  # an inconsistent face
    return replace(face, X=X2, y=y2, accepted=face.accepted & ~negative & ~missed)


def _put_face(xp: Any, full: FaceSolution, idx: Any, part: FaceSolution) -> FaceSolution:
    """``full`` with samples ``idx`` replaced by ``part`` (the system is kept per sample set)."""
    if idx is None:
        return part
    p = lambda a, v: put_rows(xp, a, idx, v)  # noqa: E731
    return FaceSolution(p(full.X, part.X), full.y.put(xp, idx, part.y), p(full.omega, part.omega),
                        None if full.rows is None else tuple(p(a, v) for a, v in zip(full.rows, part.rows,
                                                                                      strict=True)),
                        p(full.accepted, part.accepted),
                        full.system if not bool(xp.any(part.accepted)) else
                        _put_system(xp, full.system, idx, part.system))


def _put_system(xp: Any, full: DualSystem, idx: Any, part: DualSystem) -> DualSystem:
    """The factored systems of ``part`` written into ``full`` at ``idx`` (eigen parts merged)."""
    def p(a, v):
        return None if a is None else put_rows(xp, a, idx, v)

    eig = full.eig
    if eig is not None:  # the samples solved again leave the old part
        replaced = put_rows(xp, xp.zeros(full.ok.shape, dtype=xp.bool, device=_device(full.ok)), idx,
                            xp.ones(idx.shape, dtype=xp.bool, device=_device(full.ok)))
        keep = xp.nonzero(~xp.take(replaced, eig.idx, axis=0))[0]
        eig = EigPart(xp.take(eig.idx, keep, axis=0), xp.take(eig.Q, keep, axis=0), xp.take(eig.inv, keep, axis=0))
    if part.eig is not None:
        gidx = xp.take(idx, part.eig.idx, axis=0)
        eig = EigPart(gidx, part.eig.Q, part.eig.inv) if eig is None else EigPart(
            xp.concat([eig.idx, gidx]), xp.concat([eig.Q, part.eig.Q], axis=0),
            xp.concat([eig.inv, part.eig.inv], axis=0))
    if eig is not None and eig.idx.shape[0] == 0:
        eig = None
    return replace(full, omega=p(full.omega, part.omega), rr=p(full.rr, part.rr), a=p(full.a, part.a),
                   fv=p(full.fv, part.fv), d=p(full.d, part.d), L=p(full.L, part.L), ok=p(full.ok, part.ok), eig=eig)
