"""Batched ADMM for convex QPs that share ``P`` and ``C``, on one factorisation, written against the array API.

The problem ``min ½xᵀPx + qᵀx  s.t.  l <= C x <= u`` (variable bounds are rows of ``C``) is split as in
OSQP: with the rows equilibrated to unit norm, a step size ``ρ`` per row (``1000 ρ`` on equality rows),
``σ >= 0`` and ``K = P + σI + Cᵀ diag(ρ) C`` factored once, each iteration is, for the whole batch::

    x̃ = K⁻¹(σ x − q + Cᵀρ (z − s))                         (s = w / ρ: the scaled multipliers)
    v = α C x̃ + (1 − α) z,   x ← α x̃ + (1 − α) x          (over-relaxation α)
    z ← clip(v + s, l, u),   s ← v + s − z

``σ = 0`` when ``P`` is numerically positive definite (projections: ``P = I``; else a Cholesky factor whose
smallest pivot² is at least ``√eps · max Pᵢᵢ``), so that ``x`` drops out of the update and ``K⁻¹q`` is computed
once; otherwise ``σ = 1e-6`` (OSQP's), which keeps ``K`` definite on a singular ``P``. A ``K`` that cannot be
inverted all the same (no finite inverse) makes every sample NUMERICAL_ERROR, never an exception; at a step-size
update the step size is kept instead. Iterates are kept transposed, ``(rows, batch)``: the bound rows are then
one contiguous block whose product with ``x̃`` is ``x̃`` itself, and the loop is five fused passes.

Two stopping rules (:class:`Stop`):

* ``"residuals"`` — primal ``‖Cx̃ − z‖∞`` and dual ``‖Px̃ + q + Cᵀw‖∞`` residuals below
  ``eps_abs + eps_rel · scale`` (checked every ``check`` iterations), OSQP's infeasibility
  certificates from the change of ``s`` and of ``x̃`` over a check window;
* ``"faces"`` — for projections that the exact polish finishes: stop once no row has joined the
  identified active set (the rows with ``s ≠ 0`` seen at a check) in two consecutive windows, in all
  but a fraction ``stable`` of the samples. Rows leaving are not counted: ``s`` is exactly zero off the
  active rows, while weakly active rows come and go long after the face is found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from array_api_compat import array_namespace, is_numpy_namespace, is_torch_namespace
from array_api_compat import device as _device

__all__ = ["ADMMResult", "ADMMSetup", "Stop", "setup", "solve"]

#: ADMM codes (mapped to :class:`polyproj.Status` by the backend)
SOLVED, MAX_ITER, PRIMAL_INFEASIBLE, DUAL_INFEASIBLE, TIME_LIMIT, INACCURATE, NUMERICAL_ERROR = 0, 1, 2, 3, 4, 5, 6
#: the adaptive step size of the inequality rows stays within these, as OSQP's: unbounded, its product can run to
#: inf (NaN iterates) or underflow (no certificate of unboundedness found). Like OSQP's they assume data near unit
#: scale, which the backend guard's normalisation provides (polyproj.backends.scaling); the raw solver on a
#: problem whose scale needs a step beyond them ends at MAX_ITER
RHO_MIN, RHO_MAX = 1e-6, 1e6
#: the relative floor of the duality-gap test, in units of the dtype's eps: the rounding of the gap's own terms
ROUNDING = 16.0
#: σ where P is not numerically definite (OSQP's): the x-update stays strongly convex on a singular P
SIGMA = 1e-6


@dataclass(frozen=True)
class ADMMSetup:
    """The factored problem: rows equilibrated, step sizes, ``K⁻¹`` products, bounds (transposed).

    Rows ``[0, q)`` of ``C`` go through the matrix product; the last ``nb`` rows are the variable
    bounds (identity rows, their product with x is x).
    """

    xp: Any
    P: Any  # (n, n)
    C: Any  # (q, n) the equilibrated non-bound rows
    row_norm: Any  # (q + nb,) norms the rows were divided by (1 on bound rows)
    rho: Any  # (q + nb,) step sizes
    sigma: float
    Kinv: Any  # (n, n); None where K could not be inverted (solve: NUMERICAL_ERROR)
    KCr: Any  # (n, q + nb) K⁻¹ Cᵀ diag(ρ)
    lo: Any  # (q + nb, N) equilibrated lower bounds
    hi: Any  # (q + nb, N)
    nb: int
    alpha: float


@dataclass(frozen=True)
class Stop:
    """When to stop: ``rule`` is ``"residuals"`` (``eps_abs``, ``eps_rel``) or ``"faces"`` (``stable``)."""

    rule: str = "residuals"
    eps_abs: float = 1e-6
    eps_rel: float = 1e-6
    max_iter: int = 4000
    check: int = 25
    stable: float = 0.0
    deadline: float | None = None


@dataclass
class _Iterate:
    """ADMM iterate (transposed): ``x`` (n, N) only with ``σ > 0``, ``z`` and ``s`` (rows, N).

    ``qT`` (n, N): the batch's ``q`` where ``σ > 0`` (the x-update's increment form, :func:`_x_increment`).
    """

    x: Any
    z: Any
    s: Any
    qT: Any = None


@dataclass(frozen=True)
class ADMMResult:
    """Solutions (batch first): ``x`` (N, n), multipliers ``w`` (N, rows) of the original rows, codes, iterations.

    ``iterations`` is the batch's count; ``stopped_at`` (N,) each sample's: the check at which it met the
    tolerances or was certified infeasible (its answer is that iterate), the batch's count for the others.
    """

    x: Any
    w: Any
    code: Any  # (N,) int
    iterations: int
    prim_res: Any
    dual_res: Any
    stopped_at: Any = None  # (N,) int


def _factor(xp: Any, P: Any, Cs: Any, nb: int, rho_v: Any, sigma: float) -> tuple[Any, Any]:
    """``K⁻¹`` and ``K⁻¹Cᵀdiag(ρ)`` for ``K = P + σI + Cᵀdiag(ρ)C`` (C with the bound rows).

    ``(None, None)`` where ``K`` has no finite inverse (singular: the inverse raises or overflows).
    """
    n = P.shape[0]
    dt, dev = P.dtype, _device(P)
    Cfull = xp.concat([Cs, xp.eye(n, dtype=dt, device=dev)], axis=0) if nb else Cs
    CtR = xp.matrix_transpose(Cfull) * rho_v[None, :]
    K = P + sigma * xp.eye(n, dtype=dt, device=dev) + xp.matmul(CtR, Cfull)
    try:
        Kinv = xp.linalg.inv(K)
    except Exception:  # numpy's and torch's LinAlgError, and any namespace's own
        return None, None
    KCr = xp.matmul(Kinv, CtR)
    if not (bool(xp.all(xp.isfinite(Kinv))) and bool(xp.all(xp.isfinite(KCr)))):
        return None, None
    return Kinv, KCr


def rescaled(S: ADMMSetup, factor: float) -> ADMMSetup:
    """``S`` with every step size multiplied by ``factor`` (refactored); ``S`` itself where that ``K`` is singular."""
    from dataclasses import replace

    rho_v = S.rho * factor
    Kinv, KCr = _factor(S.xp, S.P, S.C, S.nb, rho_v, S.sigma)
    return S if Kinv is None else replace(S, rho=rho_v, Kinv=Kinv, KCr=KCr)


def setup(P: Any, C: Any, l: Any, u: Any, nb: int, *, rho: float = 10.0, alpha: float = 1.6,
          eq_tol: float = 0.0) -> ADMMSetup:
    """Equilibrate, choose step sizes and factor ``K`` once.

    Parameters
    ----------
    P : (n, n) array
    C : (q, n) array
        The rows that are not variable bounds.
    l, u : (q + nb, N) arrays
        Lower and upper bounds of the rows (batch last), the ``nb`` variable-bound rows last.
    nb : int
        ``0`` (no variable bound) or ``n`` (a bound row per variable, ±inf where there is none).
    """
    xp = array_namespace(P, C, l)
    dt, dev = P.dtype, _device(P)
    tiny = 1e-30
    cn = xp.linalg.vector_norm(C, axis=1)
    cn = xp.where(cn > tiny, cn, xp.ones_like(cn))
    Cs = C / cn[:, None]
    row_norm = xp.concat([cn, xp.ones((nb,), dtype=dt, device=dev)])
    lo, hi = l / row_norm[:, None], u / row_norm[:, None]
    eq = xp.all(xp.abs(hi - lo) <= eq_tol, axis=1)
    rho_v = xp.where(eq, xp.full_like(row_norm, 1e3 * rho), xp.full_like(row_norm, rho))
    diagP = xp.linalg.diagonal(P)
    pd = bool(xp.all(diagP > 0)) and _positive_definite(xp, P)
    sigma = 0.0 if pd else SIGMA
    Kinv, KCr = _factor(xp, P, Cs, nb, rho_v, sigma)
    if Kinv is None and sigma == 0.0:  # definite by the test, singular K all the same: regularise
        sigma = SIGMA
        Kinv, KCr = _factor(xp, P, Cs, nb, rho_v, sigma)
    return ADMMSetup(xp, P, Cs, row_norm, rho_v, sigma, Kinv, KCr, lo, hi, nb, float(alpha))


def _positive_definite(xp: Any, P: Any) -> bool:
    """P = I is the common case; otherwise a Cholesky factorisation with pivots clear of rounding tells.

    A Cholesky factorisation that does not fail proves nothing: on a singular P its last pivots are rounding
    (pivot² ~ 4 eps · max Pᵢᵢ on rank-2 4×4 matrices), and σ = 0 then left K = P + CᵀρC singular (LinAlgError,
    or an inverse of rounding: MAX_ITER). Every pivot² is at least P's smallest eigenvalue, so a pivot² below
    ``√eps · max Pᵢᵢ`` means P is singular or too ill-conditioned for σ = 0.
    """
    n = P.shape[0]
    if bool(xp.all(P == xp.eye(n, dtype=P.dtype, device=_device(P)))):
        return True
    try:
        L = xp.linalg.cholesky(P)
    except Exception:
        return False
    if not bool(xp.all(xp.isfinite(L))):
        return False
    pivots = xp.linalg.diagonal(L) ** 2
    return bool(xp.min(pivots) >= float(xp.finfo(P.dtype).eps) ** 0.5 * xp.max(xp.linalg.diagonal(P)))


class _Kernels:
    """The loop's fused passes: in place with ``out=`` on torch and NumPy, plain array API elsewhere."""

    def __init__(self, xp: Any) -> None:
        import sys

        import numpy as np

        self.torch = sys.modules["torch"] if is_torch_namespace(xp) else None
        self.np = np if is_numpy_namespace(xp) else None
        self.inplace = self.torch is not None or self.np is not None

    def addmm(self, base, M, v, out, beta: float = 1.0, alpha: float = 1.0):
        """``out = β base + α M v``."""
        if self.torch is not None:
            return self.torch.addmm(base, M, v, beta=beta, alpha=alpha, out=out)
        if self.np is not None:
            self.np.matmul(M, v, out=out)
            if alpha != 1.0:
                out *= alpha
            out += base if beta == 1.0 else beta * base
            return out
        return beta * base + alpha * (M @ v)

    def lerp(self, z, x, alpha: float, out):
        """``out = z + α (x − z)``."""
        if self.torch is not None:
            return self.torch.lerp(z, x, alpha, out=out)
        if self.np is not None:
            self.np.subtract(x, z, out=out)
            out *= alpha
            out += z
            return out
        return z + alpha * (x - z)

    def sub(self, a, b, out):
        """``out = a − b``."""
        if self.torch is not None:
            return self.torch.sub(a, b, out=out)
        if self.np is not None:
            return self.np.subtract(a, b, out=out)
        return a - b

    def add(self, a, b, out):
        """``out = a + b``."""
        if self.torch is not None:
            return self.torch.add(a, b, out=out)
        if self.np is not None:
            return self.np.add(a, b, out=out)
        return a + b

    def clip(self, t, lo, hi, out):
        """``out = clip(t, lo, hi)``."""
        if self.torch is not None:
            return self.torch.clamp(t, lo, hi, out=out)
        if self.np is not None:
            return self.np.minimum(self.np.maximum(t, lo, out=out), hi, out=out)
        import array_api_compat

        xp = array_api_compat.array_namespace(t)
        return xp.minimum(xp.maximum(t, lo), hi)


def _step(S: ADMMSetup, k: _Kernels, Kq: Any, it: _Iterate, buf: dict) -> None:
    """One ADMM iteration on the whole batch (five fused passes; in place where the namespace allows)."""
    xp = S.xp
    nq = S.C.shape[0]
    u = k.sub(it.z, it.s, buf.get("u"))
    xt = k.addmm(Kq, S.KCr, u, buf.get("x")) if S.sigma == 0 else _x_increment(S, it, u)
    if k.inplace:  # v = α C x̃ + (1 − α) z; the bound rows' product is x̃ itself
        Cx = buf["Cx"]
        k.addmm(it.z[:nq], S.C, xt, Cx[:nq], beta=1.0 - S.alpha, alpha=S.alpha)
        if S.nb:
            k.lerp(it.z[nq:], xt, S.alpha, Cx[nq:])
    else:
        C_x = xp.concat([xp.matmul(S.C, xt), xt], axis=0) if S.nb else xp.matmul(S.C, xt)
        Cx = S.alpha * C_x + (1.0 - S.alpha) * it.z
    t = k.add(Cx, it.s, buf.get("t"))
    it.z = k.clip(t, S.lo, S.hi, it.z if k.inplace else None)
    it.s = k.sub(t, it.z, it.s if k.inplace else None)
    if S.sigma != 0:
        it.x = S.alpha * xt + (1.0 - S.alpha) * it.x


def _steps(S: ADMMSetup, k: _Kernels, Kq: Any, it: _Iterate, buf: dict, count: int) -> None:
    """``count`` iterations of :func:`_step`.

    On torch with σ = 0: one tight loop over views bound once (the same operations in the same order,
    so bitwise the same iterates, without the per-iteration dispatch).
    """
    if k.np is not None and S.sigma == 0:
        _steps_numpy(S, k.np, Kq, it, buf, count)
        return
    if k.torch is None or S.sigma != 0:
        for _ in range(count):
            _step(S, k, Kq, it, buf)
        return
    torch = k.torch
    nq = S.C.shape[0]
    u, xt, Cx, t, z, s = buf["u"], buf["x"], buf["Cx"], buf["t"], it.z, it.s
    zq, zb, Cq, Cb = z[:nq], z[nq:], Cx[:nq], Cx[nq:]
    KCr, C, lo, hi, alpha = S.KCr, S.C, S.lo, S.hi, S.alpha
    beta = 1.0 - alpha
    sub, addmm, lerp, add, clamp = torch.sub, torch.addmm, torch.lerp, torch.add, torch.clamp
    for _ in range(count):
        sub(z, s, out=u)
        addmm(Kq, KCr, u, out=xt)
        addmm(zq, C, xt, beta=beta, alpha=alpha, out=Cq)
        if S.nb:
            lerp(zb, xt, alpha, out=Cb)
        add(Cx, s, out=t)
        clamp(t, lo, hi, out=z)
        sub(t, z, out=s)


def _steps_numpy(S: ADMMSetup, np: Any, Kq: Any, it: _Iterate, buf: dict, count: int) -> None:
    """``count`` iterations of :func:`_step` on NumPy with σ = 0, regrouped for fewer passes over the rows.

    ``t = v + s = α C x̃ + (β z + s)`` (β = 1 − α) with ``α C`` scaled once and ``w = β z + s`` formed
    before the products: eight elementwise passes an iteration instead of eleven and no temporaries. The
    iterates equal :func:`_step`'s up to rounding (the products are grouped differently).
    """
    nq = S.C.shape[0]
    u, xt, t, w, z, s = buf["u"], buf["x"], buf["t"], buf["Cx"], it.z, it.s  # w: β z + s, in the C x̃ buffer
    aC = S.alpha * S.C
    KCr, lo, hi, alpha, beta = S.KCr, S.lo, S.hi, S.alpha, 1.0 - S.alpha
    tq, tb, wq, wb = t[:nq], t[nq:], w[:nq], w[nq:]
    for _ in range(count):
        np.subtract(z, s, out=u)
        np.matmul(KCr, u, out=xt)
        xt += Kq
        np.multiply(z, beta, out=w)
        w += s
        np.matmul(aC, xt, out=tq)
        tq += wq
        if S.nb:
            np.multiply(xt, alpha, out=tb)
            tb += wb
        np.maximum(t, lo, out=z)
        np.minimum(z, hi, out=z)
        np.subtract(t, z, out=s)


def _buffers(xp: Any, S: ADMMSetup, N: int, dt: Any, dev: Any) -> dict:
    rows, n = S.lo.shape[0], S.P.shape[0]
    return {name: xp.empty(shape, dtype=dt, device=dev)
            for name, shape in (("u", (rows, N)), ("x", (n, N)), ("Cx", (rows, N)), ("t", (rows, N)))}


def solve(S: ADMMSetup, q: Any, stop: Stop, *, z0: Any = None) -> ADMMResult:
    """Run the ADMM on a batch ``q`` (N, n) until ``stop`` says so."""
    import time

    xp = S.xp
    N = q.shape[0]
    dt, dev = q.dtype, _device(q)
    if S.Kinv is None:  # K singular (setup): no iterate, NaN answers
        rows = S.lo.shape[0]
        return ADMMResult(xp.full((N, q.shape[1]), float("nan"), dtype=dt, device=dev),
                          xp.full((N, rows), float("nan"), dtype=dt, device=dev),
                          xp.full((N,), NUMERICAL_ERROR, dtype=xp.int64, device=dev), 0, None, None,
                          xp.zeros((N,), dtype=xp.int64, device=dev))
    qT = xp.matrix_transpose(q)
    qT = xp.asarray(qT, copy=True) if is_numpy_namespace(xp) else (qT.contiguous() if hasattr(qT, "contiguous") else qT)
    Kq = -xp.matmul(S.Kinv, qT)
    z = xp.minimum(xp.maximum(_rows_product(S, -qT) if z0 is None else z0, S.lo), S.hi)
    it = _Iterate(Kq, z, xp.zeros_like(z), qT) if S.sigma else _Iterate(None, z, xp.zeros_like(z))
    k = _Kernels(xp)
    buf = _buffers(xp, S, N, dt, dev) if k.inplace else {}
    watch = _Watch(xp, S, stop, N)
    done_at = stop.max_iter
    i = 0
    while i < stop.max_iter:
        count = min(stop.check - i % stop.check, stop.max_iter - i)
        _steps(S, k, Kq, it, buf, count)
        i += count
        if i % stop.check == 0 or i == stop.max_iter:  # and the last iterate, whatever check's period
            if watch.update(it, qT, Kq, i):
                done_at = i
                break
            # before a step-size update: its re-factorisation can take longer than the limit
            if stop.deadline is not None and time.perf_counter() > stop.deadline:
                watch.code = xp.where(watch.code == MAX_ITER, xp.full_like(watch.code, TIME_LIMIT), watch.code)
                done_at = i
                break
            factor = watch.rho_factor() if stop.rule == "residuals" else 1.0
            if factor != 1.0:  # OSQP's adaptive step size: balance the relative residuals, ρ within [RHO_MIN, RHO_MAX]
                rho = float(xp.min(S.rho))  # the inequality rows' (equality rows: 1e3 times it)
                factor = min(max(factor, RHO_MIN / rho), RHO_MAX / rho)
            if factor != 1.0:
                it.s = it.s / factor  # keeps the multipliers w = ρ s
                if watch.prev_s is not None:  # the certificates' last window in the same units
                    watch.prev_s = watch.prev_s / factor
                S = rescaled(S, factor)
                Kq = -xp.matmul(S.Kinv, qT)
                watch.S = S
    return watch.result(it, qT, Kq, done_at)


def _rows_product(S: ADMMSetup, xT: Any) -> Any:
    """``C x`` for all rows (equilibrated), transposed."""
    xp = S.xp
    Cx = xp.matmul(S.C, xT)
    return xp.concat([Cx, xT], axis=0) if S.nb else Cx


def _primal_point(S: ADMMSetup, Kq: Any, it: _Iterate) -> Any:
    """``x̃`` from the current ``z, s`` (transposed)."""
    xp = S.xp
    if S.sigma != 0:
        return _x_increment(S, it, it.z - it.s)
    return Kq + xp.matmul(S.KCr, it.z - it.s)


def _x_increment(S: ADMMSetup, it: _Iterate, u: Any) -> Any:
    """``x̃ = x + K⁻¹(Cᵀρ(u − Cx) − Px − q)`` (σ > 0, ``u = z − s``): the update as an increment of ``x``.

    ``σ > 0`` is for a singular (or nearly) ``P``, where ``K`` has eigenvalues down to ``σ`` and ``K⁻¹`` entries
    up to ``1/σ``: the product ``K⁻¹ r`` is rounded to ``eps ‖r‖ / σ`` in every direction, ``P``'s range
    included, which stalled the dual residual at ~1e-8 on rank-2 4×4 ``P`` (MAX_ITER). As an increment, ``r`` is
    the x-step's own residual, which vanishes at the solution, and so does the rounding (``q`` inside it too:
    ``K⁻¹q`` formed apart keeps its rounding).
    """
    xp, x = S.xp, it.x
    nq = S.C.shape[0]
    d = (u - _rows_product(S, x)) * S.rho[:, None]
    g = xp.matmul(xp.matrix_transpose(S.C), d[:nq, ...])
    if S.nb:
        g = g + d[nq:, ...]
    return x + xp.matmul(S.Kinv, g - xp.matmul(S.P, x) - it.qT)


class _Watch:
    """The stopping rule's memory between checks (see the module docstring)."""

    def __init__(self, xp: Any, S: ADMMSetup, stop: Stop, N: int) -> None:
        self.xp, self.S, self.stop = xp, S, stop
        dev = _device(S.lo)
        self.code = xp.full((N,), MAX_ITER, dtype=xp.int64, device=dev)
        self.pattern = None
        self.clean = 0
        self.prev_s = None
        self.prev_x = None
        self.prim = self.dual = None
        self.ratio = None
        #: each sample's iteration count when its code left MAX_ITER (solved, certified)
        self.at = xp.zeros((N,), dtype=xp.int64, device=dev)
        # each sample's iterate when it first met the tolerances: the others keep running (and the step size
        # keeps adapting to them), which moved solved samples off their answer (a batch with an infeasible
        # element returned its solved one at 190 times the tolerance)
        self.kept: dict[str, Any] | None = None

    def update(self, it: _Iterate, qT: Any, Kq: Any, iters: int) -> bool:
        """True when the batch may stop."""
        xp = self.xp
        running = self.code == MAX_ITER
        done = self._faces(it) if self.stop.rule == "faces" else self._residuals(it, qT, Kq)
        self.at = xp.where(running & (self.code != MAX_ITER), xp.full_like(self.at, iters), self.at)
        return done

    def _faces(self, it: _Iterate) -> bool:
        xp = self.xp
        new = it.s != 0
        if self.pattern is None:
            self.pattern = new
            return False
        N = new.shape[1]
        joined = int(xp.sum(xp.astype(xp.any(new & ~self.pattern, axis=0), xp.int64)))
        self.clean = self.clean + 1 if joined <= self.stop.stable * N else 0
        self.pattern = self.pattern | new
        if self.clean >= 2:
            self.code = xp.full_like(self.code, INACCURATE)
            return True
        return False

    def _residuals(self, it: _Iterate, qT: Any, Kq: Any) -> bool:
        xp, S = self.xp, self.S
        xt = _primal_point(S, Kq, it)
        Cx = _rows_product(S, xt)
        w = it.s * S.rho[:, None]  # multipliers of the equilibrated rows
        rn = S.row_norm[:, None]
        prim = _colmax(xp, xp.abs(Cx - it.z) * rn)
        Cw = xp.matmul(xp.matrix_transpose(S.C), w[: S.C.shape[0], ...])
        if S.nb:
            Cw = Cw + w[S.C.shape[0]:, ...]
        Px = xp.matmul(S.P, xt)
        dual = _colmax(xp, xp.abs(Px + qT + Cw))
        scale_p = xp.maximum(_colmax(xp, xp.abs(Cx) * rn), _colmax(xp, xp.abs(it.z) * rn))
        scale_d = xp.maximum(xp.maximum(_colmax(xp, xp.abs(Px)), _colmax(xp, xp.abs(Cw))), _colmax(xp, xp.abs(qT)))
        gap, scale_g = _gap(xp, S, xt, Px, qT, w)
        # the gap test has the rounding of its own terms as a floor: at |x| 1e6 they are ~1e12, and an absolute 1e-8
        # lies below their rounding (an exact answer ran to MAX_ITER)
        eps_a, eps_r = self.stop.eps_abs, self.stop.eps_rel
        eps_g = max(eps_r, ROUNDING * float(xp.finfo(xt.dtype).eps))
        ok = (prim <= eps_a + eps_r * scale_p) & (dual <= eps_a + eps_r * scale_d) & (gap <= eps_a + eps_g * scale_g)
        tiny = 1e-30
        # the step-size balance compares the residuals relative to 1 + their scale (SCS's normalisation; the data
        # are near unit scale, the guard normalises the others), not to the scale alone (OSQP's): at x* = 0 the
        # primal scale |Cx|, |z| vanishes with x, a primal residual far below eps_abs read as a fifth of that
        # scale, and the balance raised ρ to RHO_MAX, where ρ on an inactive bound row is a proximal weight that
        # moves x by O(1/ρ) an iteration: the dual residual stalled (e.g. at x = 8e-9 on P = [[2, 1], [1, 2]],
        # q = (0, 2), x₂ = 0)
        self.ratio = xp.sqrt((prim / (1.0 + scale_p)) / (dual / (1.0 + scale_d) + tiny))
        running = self.code == MAX_ITER
        newly = running & ok
        self.code = xp.where(newly, xp.full_like(self.code, SOLVED), self.code)
        if bool(xp.any(newly)):
            self._keep(newly, xt, it.s * (S.rho / S.row_norm)[:, None], prim, dual)
        self._certificates(it, xt, qT)
        self.prim, self.dual = prim, dual
        return not bool(xp.any(self.code == MAX_ITER))

    def _keep(self, newly: Any, xt: Any, w: Any, prim: Any, dual: Any) -> None:
        """Remember the iterate (x̃, multipliers of the original rows, residuals) of the samples ``newly``."""
        xp = self.xp
        if self.kept is None:
            self.kept = {"mask": xp.zeros_like(newly), "x": xp.zeros_like(xt), "w": xp.zeros_like(w),
                         "prim": xp.zeros_like(prim), "dual": xp.zeros_like(dual)}
        k = self.kept
        k["mask"] = k["mask"] | newly
        k["x"], k["w"] = xp.where(newly[None, :], xt, k["x"]), xp.where(newly[None, :], w, k["w"])
        k["prim"], k["dual"] = xp.where(newly, prim, k["prim"]), xp.where(newly, dual, k["dual"])

    def rho_factor(self) -> float:
        """Step-size change suggested by the last residual check (1: keep), from the running samples."""
        xp = self.xp
        running = self.code == MAX_ITER
        if self.ratio is None or not bool(xp.any(running)):
            return 1.0
        r = self.ratio[running]
        r = float(xp.max(r)) if r.shape[0] == 1 else float(xp.sort(r)[r.shape[0] // 2])
        if not (r > 0 and r < float("inf")) or 0.2 <= r <= 5.0:
            return 1.0
        return min(max(r, 1e-6), 1e6)

    def _certificates(self, it: _Iterate, xt: Any, qT: Any) -> None:
        """OSQP's primal / dual infeasibility tests on the change over one check window."""
        xp, S = self.xp, self.S
        s, prev_s, prev_x = it.s, self.prev_s, self.prev_x
        self.prev_s, self.prev_x = s * 1.0, xt * 1.0
        if prev_s is None:
            return
        eps = 1e-5
        running = self.code == MAX_ITER
        dw = (s - prev_s) * S.rho[:, None]  # change of the equilibrated multipliers
        nw = _colmax(xp, xp.abs(dw))
        Ctdw = xp.matmul(xp.matrix_transpose(S.C), dw[: S.C.shape[0], ...])
        if S.nb:
            Ctdw = Ctdw + dw[S.C.shape[0]:, ...]
        pos, neg = xp.where(dw > 0, dw, xp.zeros_like(dw)), xp.where(dw < 0, dw, xp.zeros_like(dw))
        hi = xp.where(xp.isfinite(S.hi), S.hi, xp.zeros_like(S.hi))
        lo = xp.where(xp.isfinite(S.lo), S.lo, xp.zeros_like(S.lo))
        inf_hi = _colmax(xp, xp.where(xp.isfinite(S.hi), xp.zeros_like(pos), pos))
        inf_lo = _colmax(xp, xp.where(xp.isfinite(S.lo), xp.zeros_like(neg), -neg))
        support = xp.sum(hi * pos + lo * neg, axis=0)
        pinf = (nw > 0) & (_colmax(xp, xp.abs(Ctdw)) <= eps * nw) & (support < -eps * nw) & \
               (inf_hi <= eps * nw) & (inf_lo <= eps * nw)
        self.code = xp.where(running & pinf, xp.full_like(self.code, PRIMAL_INFEASIBLE), self.code)
        dx = xt - prev_x
        nx = _colmax(xp, xp.abs(dx))
        Cdx = _rows_product(S, dx)
        rec = xp.all(~(xp.isfinite(S.hi) & (Cdx > eps * nx)), axis=0) & \
              xp.all(~(xp.isfinite(S.lo) & (Cdx < -eps * nx)), axis=0)
        dinf = (nx > 0) & (_colmax(xp, xp.abs(xp.matmul(S.P, dx))) <= eps * nx) & \
               (xp.sum(qT * dx, axis=0) < -eps * nx) & rec
        running = self.code == MAX_ITER
        self.code = xp.where(running & dinf, xp.full_like(self.code, DUAL_INFEASIBLE), self.code)

    def result(self, it: _Iterate, qT: Any, Kq: Any, iters: int) -> ADMMResult:
        xp, S = self.xp, self.S
        # the samples still running (MAX_ITER, TIME_LIMIT) ran all the batch's iterations
        at = xp.where(self.at > 0, self.at, xp.full_like(self.at, iters))
        xt = _primal_point(S, Kq, it)
        w = it.s * (S.rho / S.row_norm)[:, None]  # multipliers of the original rows
        prim, dual = self.prim, self.dual
        if self.kept is not None:  # solved samples: their iterate when they were solved
            k = self.kept
            xt, w = xp.where(k["mask"][None, :], k["x"], xt), xp.where(k["mask"][None, :], k["w"], w)
            if prim is not None:
                prim, dual = xp.where(k["mask"], k["prim"], prim), xp.where(k["mask"], k["dual"], dual)
        return ADMMResult(xp.matrix_transpose(xt), xp.matrix_transpose(w), self.code, iters, prim, dual, at)


def _gap(xp: Any, S: ADMMSetup, xt: Any, Px: Any, qT: Any, w: Any) -> tuple[Any, Any]:
    """Duality gap ``|xᵀPx + qᵀx + uᵀw⁺ − lᵀw⁻|`` per column (equilibrated rows) and its scale."""
    pos, neg = xp.where(w > 0, w, xp.zeros_like(w)), xp.where(w < 0, -w, xp.zeros_like(w))
    hi = xp.where(xp.isfinite(S.hi), S.hi, xp.zeros_like(S.hi))
    lo = xp.where(xp.isfinite(S.lo), S.lo, xp.zeros_like(S.lo))
    xPx, qx = xp.sum(xt * Px, axis=0), xp.sum(qT * xt, axis=0)
    sup = xp.sum(hi * pos, axis=0) - xp.sum(lo * neg, axis=0)
    scale = xp.maximum(xp.maximum(xp.abs(xPx), xp.abs(qx)), xp.abs(sup))
    return xp.abs(xPx + qx + sup), scale


def _colmax(xp: Any, v: Any) -> Any:
    """Column-wise max (0 for no rows)."""
    if v.shape[0] == 0:
        return xp.zeros((v.shape[1],), dtype=v.dtype, device=_device(v))
    return xp.max(v, axis=0)
