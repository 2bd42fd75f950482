"""The simplex ``{y >= 0, Σ y = total}``: the exact projection by sorting."""

from __future__ import annotations

from typing import Any

import numpy as np
from array_api_compat import array_namespace
from array_api_compat import device as _device

from ..errors import ProblemError
from ..problem import Polyhedron
from ..projection.result import ProjectionResult
from .base import Projector

__all__ = ["Simplex"]


class Simplex(Projector):
    """``{y : y >= 0, Σ y = total}`` with ``total >= 0``.

    With ``u`` the entries of ``x`` sorted in decreasing order and ``ρ`` the largest ``j`` with
    ``u_j > (Σ_{i<=j} u_i − total)/j``, the projection is ``y = max(x − θ, 0)``,
    ``θ = (Σ_{i<=ρ} u_i − total)/ρ`` (Held, Wolfe & Crowder; Duchi et al. 2008). The active rows are the
    coordinates at zero; the multipliers are ``λ_i = θ − x_i`` there and ``μ = θ`` for the sum; the
    HS-Jacobian is ``J g = f ⊙ (g − mean_F g)`` on the support ``F``.

    Examples
    --------
    >>> import numpy as np, polyproj as pp
    >>> res = pp.project(np.array([0.9, 0.5, -1.0]), pp.sets.Simplex(3))
    >>> np.round(res.y, 12), res.active
    (array([0.7, 0.3, 0. ]), array([False, False,  True]))
    """

    def __init__(self, n: int, total: float = 1.0) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ProblemError(f"n must be an integer >= 1, got {n!r}")
        if not (isinstance(total, (int, float, np.floating)) and np.isfinite(total) and total >= 0):
            raise ProblemError(f"total must be a finite number >= 0 (the simplex is empty otherwise), got {total!r}")
        self._n, self.total = int(n), float(total)

    @property
    def n(self) -> int:
        """Number of variables."""
        return self._n

    def as_polyhedron(self) -> Polyhedron:
        """``Polyhedron(B=1ᵀ, b=total, lb=0)``: the active rows are the lower bounds."""
        return Polyhedron(B=np.ones((1, self._n)), b=[self.total], lb=np.zeros(self._n))

    def project_batch(self, X: Any) -> ProjectionResult:
        """The sort-based projection of every row."""
        xp = array_namespace(X)
        n = self._n
        u = xp.sort(X, axis=1, descending=True)
        css = xp.cumulative_sum(u, axis=1) - self.total
        j = xp.arange(1, n + 1, dtype=X.dtype, device=_device(X))
        rho = xp.sum(xp.astype(u * j > css, xp.int64), axis=1)  # the condition holds exactly for j <= ρ
        rho = xp.maximum(rho, xp.ones_like(rho))
        theta = xp.take_along_axis(css, (rho - 1)[:, None], axis=1) / xp.astype(rho, X.dtype)[:, None]
        zero = xp.zeros_like(X)
        Y = xp.maximum(X - theta, zero)
        active = Y == 0
        mult = xp.concat([xp.where(active, xp.maximum(theta - X, zero), zero), theta], axis=1)
        viol = xp.abs(xp.sum(Y, axis=1) - self.total)
        return self.result(X, Y, active, mult, violation=viol, face=xp.astype(~active, X.dtype))

    def vjp(self, result: ProjectionResult, G: Any) -> Any:
        """``J g = f ⊙ (g − mean_F g)`` (zero where the support is empty)."""
        xp = array_namespace(G)
        f = result.face
        count = xp.sum(f, axis=1, keepdims=True)
        mean = xp.sum(f * G, axis=1, keepdims=True) / xp.where(count > 0, count, xp.ones_like(count))
        return xp.where(f > 0, G - mean, xp.zeros_like(G))

    def __repr__(self) -> str:
        return f"Simplex(n={self._n}, total={self.total:g})"
