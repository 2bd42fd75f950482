"""The reduced KKT system of an IPM iteration: its factorisation and Newton solves.

Slacks and inequality multipliers eliminated, each iteration solves the regularised system

    [K_γ   G_eᵀ] [dx]   [r₁ + γ G_eᵀ r₂]       K_γ = P + Gᵀ D G + γ G_eᵀG_e + ρ I,
    [G_e   −δ I] [dy] = [r₂           ],       D = z_l/s_l + z_u/s_u,

by a batched Cholesky factorisation of ``K_γ`` (n × n per element) and of the Schur complement
``G_e K_γ⁻¹ G_eᵀ + δ I`` on the equality rows. ``γ`` is an augmented-Lagrangian term that keeps
``K_γ`` definite when equalities fix otherwise free directions (LPs); ``ρ`` and ``δ`` are tiny
primal / dual regularisations, so rank-deficient equalities are handled. Everything is in the scaled
problem (:mod:`.scaling`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from array_api_compat import device as _device
from array_api_compat import is_numpy_namespace, is_torch_namespace

from ...linalg import cho_solve, cholesky
from .arrays import add_diag, inf_norm, mv, rmv
from .normal_matrix import NormalMatrix
from .problem import Numerics
from .scaling import ScaledQP

__all__ = ["EIG_MIN_BATCH", "REFINE_TOL", "EigFactor", "Factorization", "KKTSystem", "Linalg", "Regularisation",
           "regularisation"]

#: refinement steps stop once every running element's Newton residual is below this, relative to
#: its right-hand side (0: always take both steps)
REFINE_TOL = 1e-10
#: smallest batch whose starting step uses one eigendecomposition (it costs about as much as ~30
#: Cholesky factorisations of the same size)
EIG_MIN_BATCH = 32


@dataclass(frozen=True)
class EigFactor:
    """``K_i⁻¹ = V diag(1 / (lam + shift_i)) Vᵀ`` for every element i: one eigendecomposition for a batch."""

    V: Any
    lam: Any
    shift: Any


class Linalg:
    """Batched SPD factor / solve.

    :mod:`polyproj.linalg` (Cholesky) on torch and NumPy; other namespaces keep ``K`` and use the
    standard ``linalg.solve`` (it cannot report failures per element, so ``ok`` is all True there).
    """

    def __init__(self, xp: Any) -> None:
        self.xp = xp
        self.kind = "torch" if is_torch_namespace(xp) else "numpy" if is_numpy_namespace(xp) else "generic"

    def factor(self, K: Any, out: Any = None) -> tuple[Any, Any]:
        """Return (factor, ok) with ok a (b,) bool array (False where K is not numerically PD).

        ``out``: a NumPy buffer of K's shape that receives the factor (see :func:`polyproj.linalg.cholesky`).
        """
        if self.kind == "generic":
            return K, self.xp.ones(K.shape[0], dtype=self.xp.bool, device=_device(K))
        return cholesky(self.xp, K, out=out)

    def solve(self, F: Any, R: Any) -> Any:
        """Solve ``K X = R`` for R (b, n, k) with the factor of :meth:`factor` (or an :class:`EigFactor`)."""
        if isinstance(F, EigFactor):
            return F.V @ ((F.V.mT @ R) / (F.lam[None, :, None] + F.shift[:, None, None]))
        if self.kind == "generic":
            return self._generic_solve(F, R)
        return cho_solve(self.xp, F, R)

    def _generic_solve(self, K: Any, R: Any) -> Any:
        """``linalg.solve`` of the batch; element by element where it raises.

        A singular element (``array_api_strict`` raised NumPy's LinAlgError out of ``pp.project``) is NaN: its
        iterates are then not finite, and the iteration reports them.
        """
        xp = self.xp
        try:
            return xp.linalg.solve(K, R)
        except Exception:  # the namespace's own error type (LinAlgError, a RuntimeError)
            nan = xp.full(R.shape[1:], float("nan"), dtype=R.dtype, device=_device(R))
            parts = []
            for i in range(K.shape[0]):
                try:
                    parts.append(xp.linalg.solve(K[i, ...], R[i, ...]))
                except Exception:
                    parts.append(nan)
            return xp.stack(parts, axis=0)


@dataclass(frozen=True)
class Regularisation:
    """Constants of the regularised system.

    Attributes
    ----------
    gamma : float
        Augmented-Lagrangian weight of the equality rows in ``K_γ``.
    rho, delta : float
        Primal and dual regularisation.
    dmax : float
        Cap of ``z/s``. In float64 effectively none (1/eps²): capping ``D`` makes the direction
        inconsistent with the complementarity of the blocking slacks and the step length collapses;
        a failed factorisation is shifted instead (:meth:`KKTSystem.factorize`), and only elements
        whose shifted direction is inaccurate fall back to ``dmax_lo``. The generic path
        (``linalg.solve``) cannot report failures per element, so it keeps ``dmax_lo``.
    dmax_lo : float
        The low cap, ``1e-2 / eps``.
    """

    gamma: float
    rho: float
    delta: float
    dmax: float
    dmax_lo: float


def regularisation(xp: Any, num: Numerics, la: Linalg) -> Regularisation:
    """The :class:`Regularisation` for the float type of ``num`` and the linear algebra ``la``."""
    eps = num.eps
    rho = max(1e-10, 1e2 * eps) if num.dtype == xp.float64 else 1e-6
    dmax_lo = 1e-2 / eps
    dmax = 1.0 / eps**2 if (num.dtype == xp.float64 and la.kind != "generic") else dmax_lo
    return Regularisation(1.0, rho, rho, dmax, dmax_lo)


@dataclass(slots=True)
class Factorization:
    """The factors of one iteration's system.

    Attributes
    ----------
    F : array or EigFactor
        Factor of ``K_γ`` (Cholesky factor; ``K_γ`` itself on the generic path).
    W : (b, n, p) or None
        ``K_γ⁻¹ G_eᵀ`` (masked); None without equality rows.
    schur : array or None
        Factor of the Schur complement ``G_e W + δ I``.
    ok : (b,) bool
        Where both factorisations succeeded.
    D : (b, m + n)
        The weights ``D`` of the system (without ``γ``), for refinement.
    any_shifted : bool
        Some element's ``K_γ`` was shifted to be factorised.
    shifted : (b,) bool
        The elements whose first factorisation failed (shifted, or not factorised).
    running : (b,) bool
        The elements the system was built for (the others have the identity).
    presolved : tuple (r1, t) or None
        A right-hand side ``r1`` solved in the factorisation's pass: ``t = K_γ⁻¹ (r1 + γ G_eᵀ r2)``.
    """

    F: Any
    W: Any
    schur: Any
    ok: Any
    D: Any
    any_shifted: bool
    shifted: Any
    running: Any
    presolved: tuple[Any, Any] | None = None


class KKTSystem:
    """Factorisation and Newton solves of the reduced KKT system of a batch of ``b`` elements."""

    def __init__(self, xp: Any, sqp: ScaledQP, num: Numerics, b: int) -> None:
        self.xp, self.sqp, self.num, self.b = xp, sqp, num, b
        self.la = Linalg(xp)
        self.reg = regularisation(xp, num, self.la)
        self.normal = NormalMatrix(xp, sqp.scaling, self.reg.rho, b, num)
        self.p = sqp.p
        self.n = sqp.scaling.Ps.shape[-1]
        self._L = None  # NumPy: the Cholesky factor's buffer (only the current factor is ever used)

    def _weights(self, Dg0: Any) -> Any:
        """``D + γ`` on the equality rows (with equality rows only)."""
        if not self.p:
            return Dg0
        return Dg0 + self.reg.gamma * (self.xp.astype(self.sqp.rows.eq, self.num.dtype))

    def factorize(self, Dg0: Any, running: Any, pre: tuple[Any, Any] | None = None) -> Factorization:
        """Factor ``K_γ`` (and the Schur complement on the equality rows) for the weights ``Dg0``.

        ``pre``: the predictor's right-hand side ``(r1, r2)`` (with equalities only), solved with
        ``K_γ`` in the same pass as ``K_γ⁻¹ G_eᵀ`` (a batched triangular solve costs a pass over all
        factors, nearly whatever the number of right-hand sides); kept as ``presolved``.
        """
        xp = self.xp
        K = self.normal.build(self._weights(Dg0), running)
        out = None
        if self.la.kind == "numpy":
            if self._L is None:
                self._L = xp.zeros(K.shape, dtype=self.num.dtype, device=self.num.device)
            out = self._L
        F, ok = self.la.factor(K, out)
        shifted = ~ok
        any_shifted = False
        if not bool(xp.all(ok)):
            any_shifted = True
            self._factor_shifted(K, F, ok)
        W = Sfac = presolved = None
        if self.p:
            W, Sfac, ok2, presolved = self._equality_factors(F, pre)
            ok = ok & ok2
        return Factorization(F, W, Sfac, ok, Dg0, any_shifted, shifted, running, presolved)

    def _factor_shifted(self, K: Any, F: Any, ok: Any) -> None:
        """Factor again, shifted, where the factorisation failed (``F`` and ``ok`` updated in place).

        Near the end ``D`` spans ~30 orders of magnitude and ``K``, as formed, is indefinite by about
        ``eps·|K|``. The shift is in proportion to the diagonal of ``K`` (a relative shift is tiny on
        the small diagonal entries; an absolute one of ``eps·max|K|`` swamps them and the direction
        loses all accuracy), and iterative refinement on the unshifted system (:meth:`refined`)
        removes what it changes. It escalates, then falls back to the absolute shift. Only the
        failed elements are factored again (the generic path never fails, so ``F`` and ``ok`` are
        Cholesky results here, which support index assignment).
        """
        xp, eps, n, b = self.xp, self.num.eps, self.n, self.b
        dK = xp.abs(xp.linalg.diagonal(K))
        diagmax = xp.max(dK, axis=-1)
        for shift in (1e2 * eps * n * dK, 1e5 * eps * n * dK,
                      xp.broadcast_to((1e3 * eps * n * diagmax)[:, None], (b, n))):
            idx = xp.nonzero(~ok)[0]
            Fb, okb = self.la.factor(add_diag(xp, xp.take(K, idx, axis=0), xp.take(shift, idx, axis=0)))
            F[idx], ok[idx] = Fb, okb
            if bool(xp.all(ok)):
                break

    def _masked_GeT(self) -> Any:
        eqs = self.sqp.eqs
        return self.xp.broadcast_to(eqs.G.mT, (self.b, self.n, self.p)) * eqs.mask[:, None, :]

    def _equality_factors(self, F: Any, pre: tuple[Any, Any] | None):
        """``W = K_γ⁻¹ G_eᵀ``, the Schur factor, its ``ok`` and the presolved predictor (or None)."""
        xp, eqs, p = self.xp, self.sqp.eqs, self.p
        GeT = self._masked_GeT()
        presolved = None
        if pre is None:
            W = self.la.solve(F, GeT)  # K⁻¹ G_eᵀ (masked)
        else:
            r1p = pre[0] + self.reg.gamma * rmv(eqs.G, pre[1] * eqs.mask)
            sol = self.la.solve(F, xp.concat([GeT, r1p[:, :, None]], axis=2))
            W, presolved = sol[..., :p], (pre[0], sol[..., p])
        Sfac, ok2 = self._schur(W)
        return W, Sfac, ok2, presolved

    def _schur(self, W: Any) -> tuple[Any, Any]:
        """Factor of the Schur complement ``G_e K⁻¹ G_eᵀ + δ I`` on the equality rows (W = K⁻¹ G_eᵀ)."""
        eqs = self.sqp.eqs
        S = (eqs.G * eqs.mask[:, :, None]) @ W
        S = S + eqs.eye[None, ...] * (self.reg.delta + (1.0 - eqs.mask))[:, :, None]
        return self.la.factor(S)

    def factorize_start(self, Dg0: Any, running: Any) -> Factorization:
        """The factorisation of the starting step (``D = 1`` on every finite side).

        With C shared, P shared, diagonal and definite (projections: ``P = I``) and the same
        constraint pattern for every element, the ``K_γ`` of the batch differ only by the cost
        scaling: ``S + c_i P``. One eigendecomposition of ``P^-½ S P^-½`` then serves the whole batch
        (instead of b Cholesky factorisations); otherwise, or when the shifted spectrum is not safely
        positive, the batched Cholesky of :meth:`factorize`.
        """
        xp, sqp, n, m = self.xp, self.sqp, self.n, self.sqp.m
        eq = sqp.rows.eq
        Pd = self.normal.shared_diagonal_P
        shared = (self.b >= EIG_MIN_BATCH and Pd is not None and Pd.shape[0] == 1 and bool(xp.all(Pd > 0))
                  and bool(xp.all(Dg0 == Dg0[0:1, :])) and (not self.p or bool(xp.all(eq == eq[0:1, :]))))
        if not shared:
            return self.factorize(Dg0, running)
        d0 = self._weights(Dg0)[0, :]
        C0 = sqp.scaling.Cs[0, ...]
        eye = xp.eye(n, dtype=self.num.dtype, device=self.num.device)
        S = (C0.mT * d0[None, :m]) @ C0 + eye * (d0[m:] + self.reg.rho)[None, :]
        # K_i = S + c_i Pd = Pd^½ (Pd^-½ S Pd^-½ + c_i I) Pd^½ with Pd^-½ S Pd^-½ = U diag(lam) Uᵀ
        ph = 1.0 / xp.sqrt(Pd[0, :])
        lam, U = xp.linalg.eigh(ph[:, None] * S * ph[None, :])
        V = ph[:, None] * U  # K_i⁻¹ = V diag(1 / (lam + c_i)) Vᵀ
        shift = sqp.scaling.c
        if not bool(xp.min(lam) + xp.min(shift) > 1e-8 * (xp.max(xp.abs(lam)) + xp.max(shift))):
            return self.factorize(Dg0, running)
        F = EigFactor(V, lam, shift)
        ok = xp.ones((self.b,), dtype=xp.bool, device=self.num.device)
        W = Sfac = None
        if self.p:
            W = self.la.solve(F, self._masked_GeT())
            Sfac, ok = self._schur(W)
        return Factorization(F, W, Sfac, ok, Dg0, False, ~ok, running)

    def newton(self, fac: Factorization, r1: Any, r2: Any, t: Any = None) -> tuple[Any, Any]:
        """``(dx, dy)`` of the regularised system for right-hand sides ``r1`` (b, n), ``r2`` (b, p).

        ``t``: ``K_γ⁻¹ (r1 + γ G_eᵀ r2)`` when already solved (:attr:`Factorization.presolved`).
        """
        la = self.la
        if not self.p:
            return la.solve(fac.F, r1[:, :, None])[..., 0], None
        eqs, gamma = self.sqp.eqs, self.reg.gamma
        if t is None:
            r1p = r1 + gamma * rmv(eqs.G, r2 * eqs.mask)
            t = la.solve(fac.F, r1p[:, :, None])[..., 0]
        rhs = (mv(eqs.G, t) - r2) * eqs.mask
        dy = la.solve(fac.schur, rhs[:, :, None])[..., 0]
        dx = t - (fac.W @ dy[:, :, None])[..., 0]
        # K dx + G_eᵀ(dy + γ(G_e dx − r₂)) = r₁ with G_e dx − r₂ = δ dy: the true multiplier step
        return dx, (1.0 + gamma * self.reg.delta) * dy

    def refined(self, fac: Factorization, r1: Any, r2: Any, t: Any = None) -> tuple[Any, Any]:
        """:meth:`newton` plus iterative refinement on the unregularised system.

        Taken with equality rows, or when some ``K_γ`` was shifted. ``K_γ`` is ill-conditioned near
        the end (``D`` spans many magnitudes), so ``K_γ⁻¹ G_eᵀ`` in the Schur complement carries
        errors that grow with the equality multipliers (they diverge on infeasible problems);
        refinement steps with the same factors remove them. A step is taken only while some running
        element's residual exceeds :data:`REFINE_TOL` relative to its right-hand side (each step is a
        solve with every factor of the batch: early on, none is needed). At most two steps.
        """
        dx, dy = self.newton(fac, r1, r2, t)
        if not self.p and not fac.any_shifted:
            return dx, dy
        rscale = None
        for _ in range(2):
            e1, e2 = self._newton_residual(fac, r1, r2, dx, dy)
            if REFINE_TOL > 0:
                if rscale is None:
                    rscale = inf_norm(self.xp, r1) + (inf_norm(self.xp, r2) if self.p else 0.0)
                err = inf_norm(self.xp, e1) + (inf_norm(self.xp, e2) if self.p else 0.0)
                if not bool(self.xp.any(fac.running & (err > REFINE_TOL * rscale))):
                    break
            if not self.p:
                dx = dx + self.newton(fac, e1, None)[0]
                continue
            ddx, ddy = self.newton(fac, e1, e2)
            dx, dy = dx + ddx, dy + ddy
        return dx, dy

    def _newton_residual(self, fac: Factorization, r1: Any, r2: Any, dx: Any, dy: Any) -> tuple[Any, Any]:
        """Residuals ``(e1, e2)`` of ``(dx, dy)`` in the unregularised system (``e2`` None without equalities)."""
        sqp = self.sqp
        e1 = r1 - (sqp.pmv(dx) + sqp.gtw(fac.D * sqp.gx(dx)) + self.reg.rho * dx)
        e2 = None
        if self.p:
            eqs = sqp.eqs
            e1 = e1 - rmv(eqs.G, dy * eqs.mask)
            e2 = (r2 - mv(eqs.G, dx)) * eqs.mask
        return e1, e2
