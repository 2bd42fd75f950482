"""Ruiz equilibration, the scaled problem the iteration works on, and the way back.

The scaled variables are ``x = D x̃`` and the rows ``C̃ = E C D``, so the scaled stacked rows are
``G̃ = diag(E, 1/D) G D`` and the scaled bounds ``L̃ = [E l; lb / D]`` (likewise ``Ũ``). The cost of
element ``i`` is multiplied by ``c_i``: ``P̃_i = c_i D P D``, ``q̃_i = c_i D q_i``. A scaled
multiplier ``z̃`` of the rows maps back to ``z = E z̃ / c`` on ``C`` and ``z_box = z̃ / (c D)`` on
the bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from array_api_compat import device as _device

from .arrays import mv, rmv, take_rows
from .problem import BatchQP, Numerics, Rows

__all__ = ["Equalities", "ScaledQP", "Scaling", "equality_pattern", "ruiz", "scale"]


@dataclass(frozen=True)
class Scaling:
    """Ruiz scaling of a batch.

    Attributes
    ----------
    Ps : (1|b, n, n)
        ``D P D`` (the cost factor ``c`` not applied).
    Cs : (1|b, m, n)
        ``E C D``.
    D : (1|b, n)
    E : (1|b, m)
    c : (b,)
        Cost scaling per element.
    """

    Ps: Any
    Cs: Any
    D: Any
    E: Any
    c: Any

    def take(self, xp: Any, idx: Any) -> Scaling:
        """The scaling of the elements ``idx`` (shared parts stay shared)."""
        return Scaling(*(take_rows(xp, a, idx) for a in (self.Ps, self.Cs, self.D, self.E, self.c)))


def ruiz(xp: Any, P3: Any, C3: Any, q: Any, iters: int) -> Scaling:
    """Ruiz equilibration of ``[P Cᵀ; C 0]`` (``iters`` passes) and the cost scaling.

    Each pass divides every column and row by the square root of its largest entry (clipped to
    ``[1e-4, 1e4]``; a row or column whose largest entry is at most the dtype's eps times the larger of 1 and the
    element's largest entry counts as 1: zero to rounding, where 1 is the scale of the bounds' rows of ``G = [C; I]``
    that the pass leaves out. An absolute 1e-8 left columns of C at 3e-13 beside entries of 1 (a QP's columns scaled
    1e-8..1e8) as they came, and the IPM said PRIMAL_INFEASIBLE on a feasible set; a floor relative to the largest
    entry alone blew ``P = 1e-40 I`` in a unit box up by 1e20 and the IPM ran to MAX_ITER). The cost scaling ``c_i``
    is per element: one over the larger of the mean column norm of ``Ps`` and ``‖D q_i‖∞``, so that an element's
    iterates do not depend on the other elements of the batch while ``Ps`` stays shared when P is.
    """
    bs = max(P3.shape[0], C3.shape[0])
    n, m = P3.shape[-1], C3.shape[-2]
    dtype, dev = P3.dtype, _device(P3)
    if P3.shape[0] != bs:
        P3 = xp.broadcast_to(P3, (bs, n, n))
    if C3.shape[0] != bs:
        C3 = xp.broadcast_to(C3, (bs, m, n))
    D = xp.ones((bs, n), dtype=dtype, device=dev)
    E = xp.ones((bs, m), dtype=dtype, device=dev)
    Ps, Cs = P3, C3
    one = xp.ones((), dtype=dtype, device=dev)
    eps = float(xp.finfo(dtype).eps)

    def inv_sqrt(v, floor):
        v = xp.where(v <= floor, one, v)
        return 1.0 / xp.sqrt(xp.clip(v, 1e-4, 1e4))

    for _ in range(iters):
        cn = xp.max(xp.abs(Ps), axis=-2)
        if m:
            cn = xp.maximum(cn, xp.max(xp.abs(Cs), axis=-2))
        floor = eps * xp.clip(xp.max(cn, axis=-1, keepdims=True), 1.0, None)  # (bs, 1)
        if m:
            e = inv_sqrt(xp.max(xp.abs(Cs), axis=-1), floor)
        d = inv_sqrt(cn, floor)
        Ps = d[:, :, None] * Ps * d[:, None, :]
        D = D * d
        if m:
            Cs = e[:, :, None] * Cs * d[:, None, :]
            E = E * e
    if iters:
        pcol = xp.mean(xp.max(xp.abs(Ps), axis=-2), axis=-1)  # (bs,)
        qn = xp.max(xp.abs(q * D), axis=-1)
        c = 1.0 / xp.clip(xp.where(xp.maximum(pcol, qn) < 1e-8, one, xp.maximum(pcol, qn)), 1e-4, 1e4)
    else:
        c = xp.ones((q.shape[0],), dtype=dtype, device=dev)
    return Scaling(Ps, Cs, D, E, c)


def equality_pattern(xp: Any, eq: Any) -> Any:
    """Indices of the rows of G that are an equality in some element of the batch, or None."""
    eq_any = xp.any(eq, axis=0)
    return xp.nonzero(eq_any)[0] if bool(xp.any(eq_any)) else None


@dataclass(frozen=True)
class Equalities:
    """The scaled equality rows ``G̃_e x = r`` (the union of the batch's patterns, masked per element).

    Attributes
    ----------
    idx : (p,) int
        Their rows of ``G``.
    sel : (p, M)
        One-hot rows: ``y @ sel`` spreads multipliers of the equality rows over all rows of G.
    G : (1|b, p, n)
        The scaled rows ``G̃_e``.
    mask : (b, p)
        1 where the row is an equality of that element, else 0.
    rhs : (b, p)
        Scaled right-hand sides (0 where masked).
    eye : (p, p)
    """

    idx: Any
    sel: Any
    G: Any
    mask: Any
    rhs: Any
    eye: Any

    @property
    def p(self) -> int:
        """Number of equality rows."""
        return int(self.idx.shape[0])


def _equalities(xp: Any, rows: Rows, Cs: Any, Ls: Any, e_idx: Any, num: Numerics) -> Equalities:
    n = Cs.shape[-1]
    M = rows.L.shape[1]
    dtype, dev = num.dtype, num.device
    sel = xp.take(xp.eye(M, dtype=dtype, device=dev), e_idx, axis=0)
    Gfull = xp.concat([Cs, xp.broadcast_to(xp.eye(n, dtype=dtype, device=dev)[None, ...], (Cs.shape[0], n, n))],
                      axis=1)
    mask = xp.astype(xp.take(rows.eq, e_idx, axis=1), dtype)
    p = int(e_idx.shape[0])
    return Equalities(e_idx, sel, xp.take(Gfull, e_idx, axis=1), mask, xp.take(Ls, e_idx, axis=1) * mask,
                      xp.eye(p, dtype=dtype, device=dev))


@dataclass(frozen=True)
class ScaledQP:
    """The equilibrated batch the iteration works on, with its operators.

    Attributes
    ----------
    scaling : Scaling
    rows : Rows
        The unscaled rows (their masks are those of the scaled problem too).
    qs : (b, n)
        Scaled linear cost ``c_i D q_i``.
    Ls, Us : (b, M)
        Scaled finite bounds (0 where infinite).
    eqs : Equalities or None
        The equality rows; None when no element has one.
    """

    xp: Any
    scaling: Scaling
    rows: Rows
    qs: Any
    Ls: Any
    Us: Any
    eqs: Equalities | None

    @property
    def p(self) -> int:
        """Number of equality rows (0 without)."""
        return 0 if self.eqs is None else self.eqs.p

    @property
    def m(self) -> int:
        """Number of rows of C."""
        return self.scaling.Cs.shape[-2]

    @property
    def e_idx(self) -> Any:
        """The rows of G that are equality rows (None without)."""
        return None if self.eqs is None else self.eqs.idx

    def pmv(self, v: Any) -> Any:
        """Scaled Hessian times v: ``c_i Ps v_i``."""
        return self.scaling.c[:, None] * mv(self.scaling.Ps, v)

    def gx(self, x: Any) -> Any:
        """Scaled ``G̃ x`` (b, M)."""
        return self.xp.concat([mv(self.scaling.Cs, x), x], axis=1)

    def gtw(self, w: Any) -> Any:
        """Scaled ``G̃ᵀ w`` (b, n) for w (b, M)."""
        m = self.m
        return rmv(self.scaling.Cs, w[:, :m]) + w[:, m:]

    def unscale(self, x: Any, zl: Any, zu: Any, y: Any) -> tuple[Any, Any, Any]:
        """Unscaled ``(x, z, z_box)`` of a scaled point (or direction) with multipliers ``zl, zu, y``.

        The scaled combined multiplier of the rows is ``z̃ = z_u − z_l (+ y on the equality rows)``.
        """
        r, s, m = self.rows, self.scaling, self.m
        zg = zu * r.mu - zl * r.ml
        if self.eqs is not None:
            zg = zg + (y * self.eqs.mask) @ self.eqs.sel
        zg = zg / s.c[:, None]
        return x * s.D, zg[:, :m] * s.E, zg[:, m:] / s.D


def scale(xp: Any, qp: BatchQP, rows: Rows, scaling: Scaling, e_idx: Any, num: Numerics) -> ScaledQP:
    """The :class:`ScaledQP` of a batch under ``scaling`` with the equality rows ``e_idx`` (or None)."""
    D, E, c = scaling.D, scaling.E, scaling.c
    DE = xp.concat([E, 1.0 / D], axis=1)  # row scaling of G = [C; I] in the scaled problem
    Ls = rows.Lf * DE
    eqs = None if e_idx is None else _equalities(xp, rows, scaling.Cs, Ls, e_idx, num)
    return ScaledQP(xp, scaling, rows, qp.q * D * c[:, None], Ls, rows.Uf * DE, eqs)
