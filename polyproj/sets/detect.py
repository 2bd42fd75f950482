"""Structure detection: a :class:`~polyproj.problem.Polyhedron` that is a structured set, projected as one.

:func:`recognise` returns a :class:`Recognised` projector when ``P`` is, up to the order of its rows and
a scaling of each (positive for inequalities, non-zero for equations), one of

* a box (no rows: :class:`~polyproj.sets.box.Box`);
* a simplex or a capped simplex (one equation ``s·1ᵀy = s·t``, ``y >= 0``, no or one common finite upper
  bound: :class:`~polyproj.sets.simplex.Simplex`, :class:`~polyproj.sets.simplex.CappedSimplex`);
* the Birkhoff polytope of ``k × k`` matrices, row-major (the ``k`` row sums and ``k`` column sums equal
  to 1, all ``2k`` — with ``allow_dependent_rows=True`` — or any ``2k − 1`` of them; ``y >= 0``);
* partial matchings of ``r × c`` matrices (``r, c >= 2``; rows ``A``: the row sums and column sums at most
  1 and optionally the total at most ``α``; ``y >= 0``).

The recognised projector reports active sets and multipliers in ``P``'s own numbering (its rows'
order and scaling; for the Birkhoff polytope the multipliers of the equations in the gauge where the
equation ``P`` omits has multiplier 0), and :meth:`Recognised.as_polyhedron` is ``P``: the result is the
one the generic QP path would give, to rounding. The checks read ``P``'s data once (``O(rows · n)``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from array_api_compat import array_namespace, device

from ..problem import Polyhedron
from ..projection.result import ProjectionResult
from .base import Projector, as_namespace

__all__ = ["Recognised", "recognise"]


class Recognised(Projector):
    """A structured set standing for a Polyhedron: its projection, with rows in the Polyhedron's numbering.

    ``ineq[i]`` is the inner set's inequality row for ``P``'s row ``i`` and ``ineq_scale[i]`` the factor
    of ``P``'s row (``P_i = s_i · inner_row``): multipliers divide by it. ``eq`` (p, q) maps the inner
    set's equality multipliers to ``P``'s.
    """

    def __init__(self, inner: Projector, polyhedron: Polyhedron, ineq: np.ndarray, ineq_scale: np.ndarray,
                 eq: np.ndarray) -> None:
        self.inner, self.polyhedron = inner, polyhedron
        self.ineq, self.ineq_scale, self.eq = np.asarray(ineq, dtype=np.int64), np.asarray(ineq_scale, float), eq

    @property
    def n(self) -> int:
        """Number of variables."""
        return self.polyhedron.n

    @property
    def method(self) -> str:  # type: ignore[override]
        """The inner set's method."""
        return f"{self.inner.method} ({type(self.inner).__name__}, recognised)"

    def as_polyhedron(self) -> Polyhedron:
        """The Polyhedron given."""
        return self.polyhedron

    def project_batch(self, X: Any) -> ProjectionResult:
        """The inner set's projection, its rows renumbered."""
        from dataclasses import replace

        xp = array_namespace(X)
        res = self.inner.project_batch(X)
        ni = res.active.shape[1]
        idx = xp.asarray(self.ineq, device=device(X))
        active = xp.take(res.active, idx, axis=1)
        lam = xp.take(res.multipliers[:, :ni], idx, axis=1) / as_namespace(self.ineq_scale, res.multipliers)
        mu = xp.matmul(res.multipliers[:, ni:], as_namespace(self.eq.T, res.multipliers))
        # the violation of the polyhedron as given: it was recognised up to 1e-12 of its right-hand sides, and the
        # inner set's own violation hid a miss of 9e-13 (a row sum <= 1 − 9e-13 taken for <= 1)
        viol = self.violation(res.y)
        worst = float(xp.max(getattr(viol, "detach", lambda: viol)())) if viol.shape[0] else 0.0
        return replace(res, active=active, multipliers=xp.concat([lam, mu], axis=1), backend=self.method,
                       violation=viol, max_violation=max(worst, res.max_violation))

    def vjp(self, result: ProjectionResult, G: Any) -> Any:
        """The inner set's HS-Jacobian product.

        The null space of the active rows does not depend on their order or scaling.
        """
        return self.inner.vjp(result, G)

    def __repr__(self) -> str:
        return f"{self.inner!r} (recognised from {self.polyhedron!r})"


def recognise(P: Polyhedron) -> Recognised | None:
    """The structured projector of ``P`` (see the module docstring), or None."""
    if not isinstance(P, Polyhedron):
        return None
    for rule in (_box, _simplex, _birkhoff, _matching):
        found = rule(P)
        if found is not None:
            return found
    return None


# ----------------------------------------------------------------------------- the rules
def _dense(M: Any) -> np.ndarray:
    return M.toarray() if hasattr(M, "toarray") else np.asarray(M)


def _nonneg_only(P: Polyhedron) -> bool:
    """``lb = 0`` everywhere and no upper bound."""
    return bool(np.all(P.lb == 0.0) and np.all(np.isinf(P.ub)))


def _box(P: Polyhedron) -> Recognised | None:
    from .box import Box

    if P.m_ineq or P.m_eq:
        return None
    S = Box(P.lb, P.ub)
    ni = S.as_polyhedron().n_ineq
    return Recognised(S, P, np.arange(ni), np.ones(ni), np.zeros((0, 0)))


def _simplex(P: Polyhedron) -> Recognised | None:
    from .simplex import CappedSimplex, Simplex

    if P.m_ineq or P.m_eq != 1 or not np.all(P.lb == 0.0):
        return None
    row = _dense(P.B)[0]
    s = row[0]
    if s == 0 or not np.all(row == s):
        return None
    total = float(P.b[0] / s)
    if total < 0:
        return None
    n = P.n
    if np.all(np.isinf(P.ub)):
        S: Projector = Simplex(n, total)
        ni = n
    else:
        U = P.ub[0]
        if not (np.all(P.ub == U) and U > 0 and total <= n * U):
            return None
        S, ni = CappedSimplex(n, total, float(U)), 2 * n
    return Recognised(S, P, np.arange(ni), np.ones(ni), np.array([[1.0 / s]]))


def _patterns(M: np.ndarray, r: int, c: int):
    """Each row of ``M`` as ``(kind, index, scale)``: kind 0 a row sum, 1 a column sum, 2 the total, or None."""
    out = []
    for row in M:
        nz = np.flatnonzero(row)
        if nz.size == 0:
            return None
        s = row[nz[0]]
        if not np.all(row[nz] == s):
            return None
        if nz.size == r * c:
            out.append((2, 0, s))
        elif nz.size == c and np.all(nz // c == nz[0] // c):
            out.append((0, int(nz[0] // c), s))
        elif nz.size == r and np.all(nz % c == nz[0] % c) and np.all(np.diff(nz) == c):
            out.append((1, int(nz[0] % c), s))
        else:
            return None
    return out


def _birkhoff(P: Polyhedron) -> Recognised | None:
    from .birkhoff import Birkhoff

    k = round(float(np.sqrt(P.n)))
    if k < 2 or k * k != P.n or P.m_ineq or P.m_eq not in (2 * k - 1, 2 * k) or not _nonneg_only(P):
        return None
    pats = _patterns(_dense(P.B), k, k)
    if pats is None or any(kind == 2 for kind, _, _ in pats):
        return None
    keys = [(kind, i) for kind, i, _ in pats]
    if len(set(keys)) != len(keys) or not np.allclose([P.b[j] / s for j, (_, _, s) in enumerate(pats)], 1.0,
                                                      rtol=1e-12, atol=0.0):
        return None
    missing = sorted(({(0, i) for i in range(k)} | {(1, j) for j in range(k)}) - set(keys))
    # inner multipliers (u_1..u_k, v_1..v_{k-1}; v_k = 0) -> all 2k, then the gauge where P's missing row is 0
    pad = np.zeros((2 * k, 2 * k - 1))
    pad[: 2 * k - 1] = np.eye(2 * k - 1)
    gauge = np.eye(2 * k)
    if missing:
        kind, i = missing[0]
        pos = i if kind == 0 else k + i
        sign = np.r_[np.ones(k), -np.ones(k)]  # (u + c, v − c) leaves u_i + v_j unchanged
        gauge = gauge - np.outer(sign, np.eye(2 * k)[pos]) * sign[pos]
    full = gauge @ pad
    rows = [full[i if kind == 0 else k + i] / s for kind, i, s in pats]
    return Recognised(Birkhoff(k), P, np.arange(k * k), np.ones(k * k), np.vstack(rows))


def _matching(P: Polyhedron) -> Recognised | None:
    from .matching import PartialMatching

    if P.m_eq or not P.m_ineq or not _nonneg_only(P) or not np.all(np.isfinite(P.a)):
        return None
    A = _dense(P.A)
    for c in range(2, P.n // 2 + 1):
        r = P.n // c
        if r * c != P.n or r < 2 or P.m_ineq not in (r + c, r + c + 1):
            continue
        pats = _patterns(A, r, c)
        if pats is None or any(s <= 0 for _, _, s in pats):
            continue
        keys = [(kind, i) for kind, i, _ in pats]
        need = {(0, i) for i in range(r)} | {(1, j) for j in range(c)}
        if len(set(keys)) != len(keys) or not need <= set(keys):
            continue
        rhs = [P.a[j] / s for j, (_, _, s) in enumerate(pats)]
        if not np.allclose([v for v, (kind, _, _) in zip(rhs, pats, strict=True) if kind != 2], 1.0, rtol=1e-12,
                           atol=0.0):
            continue
        alpha = next((v for v, (kind, _, _) in zip(rhs, pats, strict=True) if kind == 2), None)
        if alpha is not None and not alpha >= 0:
            return None  # ΣX <= α < 0 with X >= 0: empty, which the generic path reports
        S = PartialMatching(r, c, alpha)
        base = {(0, i): i for i in range(r)} | {(1, j): r + j for j in range(c)} | {(2, 0): r + c}
        m_in = r + c + (1 if alpha is not None else 0)
        ineq = np.r_[[base[key] for key in keys], m_in + np.arange(P.n)]
        scale = np.r_[[s for _, _, s in pats], np.ones(P.n)]
        return Recognised(S, P, ineq, scale, np.zeros((0, 0)))
    return None
