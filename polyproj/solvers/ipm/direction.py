"""Newton directions of the scaled problem: residuals, Mehrotra's predictor and corrector, step lengths.

With the rows ``G̃ x`` split into lower sides ``G̃ x − L̃ = s_l ≥ 0`` (multiplier ``z_l ≥ 0``), upper
sides ``Ũ − G̃ x = s_u ≥ 0`` (``z_u ≥ 0``) and equality rows ``G̃_e x = r`` (``y`` free),
stationarity reads ``P̃ x + q̃ + G̃ᵀ(z_u − z_l) + G̃_eᵀ y = 0``. Eliminating ``ds`` and ``dz`` from the
Newton system leaves the reduced system of :mod:`.kkt` in ``(dx, dy)``, with ``D = z_l/s_l + z_u/s_u``.

The affine (predictor) direction aims at complementarity 0; the centring is ``σ = (μ_aff/μ)³`` and
the corrector adds the second-order term ``Δs_aff ∘ Δz_aff`` (Mehrotra).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .arrays import inf_norm, mv, rmv
from .kkt import Factorization, KKTSystem
from .problem import Numerics, Rows
from .scaling import ScaledQP
from .state import Iterate

__all__ = ["Residuals", "corrector", "direction", "mean_complementarity", "residuals", "rhs",
           "stationarity_error", "step_length"]


@dataclass(slots=True)
class Residuals:
    """Residuals of the scaled KKT conditions at an iterate.

    Attributes
    ----------
    rd : (b, n)
        Stationarity ``P̃ x + q̃ + G̃ᵀ z (+ G̃_eᵀ y)``.
    rpl, rpu : (b, M)
        Primal residuals of the lower ``G̃ x − L̃ − s_l`` and upper ``Ũ − G̃ x − s_u`` sides (masked).
    rpe : (b, p) or None
        Equality residual ``G̃_e x − r`` (masked); None without equality rows.
    """

    rd: Any
    rpl: Any
    rpu: Any
    rpe: Any


def residuals(sqp: ScaledQP, it: Iterate) -> Residuals:
    """The :class:`Residuals` of ``it``."""
    r = sqp.rows
    gx = sqp.gx(it.x)
    zg = it.zu * r.mu - it.zl * r.ml
    rd = sqp.pmv(it.x) + sqp.qs + sqp.gtw(zg)
    rpe = None
    if sqp.eqs is not None:
        eqs = sqp.eqs
        rd = rd + rmv(eqs.G, it.y * eqs.mask)
        rpe = (mv(eqs.G, it.x) - eqs.rhs) * eqs.mask
    return Residuals(rd, (gx - sqp.Ls - it.sl) * r.ml, (sqp.Us - gx - it.su) * r.mu, rpe)


def rhs(sqp: ScaledQP, it: Iterate, res: Residuals, rcl: Any, rcu: Any, Dl: Any, Du: Any) -> Any:
    """Right-hand side ``r₁`` of the reduced system for the complementarity residuals ``rcl, rcu``."""
    r = sqp.rows
    v = (-rcu / it.su - Du * res.rpu) * r.mu + (rcl / it.sl + Dl * res.rpl) * r.ml
    return -res.rd - sqp.gtw(v)


def direction(kkt: KKTSystem, fac: Factorization, it: Iterate, res: Residuals, rcl: Any, rcu: Any, Dl: Any,
              Du: Any, r1: Any = None, t: Any = None) -> Iterate:
    """The Newton direction for the complementarity residuals ``rcl, rcu`` (``s ∘ z`` minus the target).

    ``Dl, Du``: ``z/s`` (capped), the same as in the factorised ``K``, so that the linearised
    stationarity is exact. ``r1`` (and ``t``, :attr:`Factorization.presolved`): the right-hand side
    when already formed (and solved).
    """
    sqp = kkt.sqp
    r = sqp.rows
    if r1 is None:
        r1 = rhs(sqp, it, res, rcl, rcu, Dl, Du)
    dx, dy = kkt.refined(fac, r1, -res.rpe if sqp.eqs is not None else None, t)
    gdx = sqp.gx(dx)
    dsl = (gdx + res.rpl) * r.ml
    dsu = (res.rpu - gdx) * r.mu
    dzl = (-rcl / it.sl - Dl * dsl) * r.ml
    dzu = (-rcu / it.su - Du * dsu) * r.mu
    return Iterate(dx, dsl, dzl, dsu, dzu, dy)


def corrector(kkt: KKTSystem, fac: Factorization, it: Iterate, res: Residuals, mu_c: Any, Dl: Any, Du: Any,
              num: Numerics) -> Iterate:
    """Mehrotra's corrector direction (the predictor computed on the way).

    The predictor's right-hand side is the one solved in the factorisation's pass when there is one.
    """
    xp, r = kkt.xp, kkt.sqp.rows
    sl, zl, su, zu = it.sl, it.zl, it.su, it.zu
    r1, t = fac.presolved if fac.presolved is not None else (None, None)
    da = direction(kkt, fac, it, res, sl * zl * r.ml, su * zu * r.mu, Dl, Du, r1, t)
    a_aff = xp.minimum(step_length(kkt.sqp, it, da, num), num.one)[:, None]
    mu_aff = mean_complementarity(xp, r, sl + a_aff * da.sl, zl + a_aff * da.zl, su + a_aff * da.su, zu + a_aff * da.zu)
    sigma = xp.clip((mu_aff / xp.where(mu_c > 0, mu_c, num.one)) ** 3, num.zero, num.one)
    smu = (sigma * mu_c)[:, None]
    rcl = (sl * zl + da.sl * da.zl - smu) * r.ml
    rcu = (su * zu + da.su * da.zu - smu) * r.mu
    return direction(kkt, fac, it, res, rcl, rcu, Dl, Du)


def stationarity_error(sqp: ScaledQP, d: Iterate, res: Residuals) -> Any:
    """Unscaled error of the linearised stationarity ``P dx + Gᵀdz = −r_d`` of a direction, (b,)."""
    r = sqp.rows
    lin = sqp.pmv(d.x) + sqp.gtw(d.zu * r.mu - d.zl * r.ml) + res.rd
    if sqp.eqs is not None:
        lin = lin + rmv(sqp.eqs.G, d.y * sqp.eqs.mask)
    return inf_norm(sqp.xp, lin / (sqp.scaling.D * sqp.scaling.c[:, None]))


def _max_step(xp: Any, v: Any, dv: Any, mask: Any, num: Numerics) -> Any:
    """Largest ``a`` with ``v + a dv >= 0`` on ``mask`` (inf when nothing decreases)."""
    neg = (dv < 0) & mask
    ratio = xp.where(neg, -v / xp.where(neg, dv, -num.one), num.inf)
    return xp.min(ratio, axis=-1)


def step_length(sqp: ScaledQP, it: Iterate, d: Iterate, num: Numerics) -> Any:
    """Largest step along ``d`` that keeps every slack and multiplier nonnegative, (b,)."""
    xp, r = sqp.xp, sqp.rows
    return xp.minimum(xp.minimum(_max_step(xp, it.sl, d.sl, r.mlb, num), _max_step(xp, it.zl, d.zl, r.mlb, num)),
                      xp.minimum(_max_step(xp, it.su, d.su, r.mub, num), _max_step(xp, it.zu, d.zu, r.mub, num)))


def mean_complementarity(xp: Any, r: Rows, sl: Any, zl: Any, su: Any, zu: Any) -> Any:
    """``μ = (s_lᵀz_l + s_uᵀz_u) / (number of pairs)``, (b,)."""
    return (xp.sum(sl * zl * r.ml, axis=1) + xp.sum(su * zu * r.mu, axis=1)) / r.ncomp
