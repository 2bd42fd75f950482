"""Partial matchings: ``{X >= 0, X1 <= 1, Xᵀ1 <= 1, 1ᵀX1 <= α}`` (the relaxation NGM-v2 projects onto).

The exact projection by the projected semismooth Newton method on the dual (the rows' multipliers are
``>= 0``) and the exact face with its KKT conditions verified (:mod:`polyproj.sets.bipartite`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ProblemError
from ..problem import Polyhedron
from .bipartite import FaceSolution, Sums, line_sums
from .birkhoff import SumsProjector

__all__ = ["PartialMatching"]


class PartialMatching(SumsProjector):
    """Partial matchings of ``rows × cols``: ``{X >= 0, row sums <= 1, column sums <= 1, ΣX <= max_matches}``.

    Parameters
    ----------
    rows, cols : int
    max_matches : float, optional
        ``α`` in ``ΣX <= α`` (``None``: no such row; ``α >= min(rows, cols)`` is implied by the others).
    tol, max_iter
        As in :class:`~polyproj.sets.birkhoff.SumsProjector`.

    The rows of :meth:`as_polyhedron` are, in order: the ``rows`` row sums, the ``cols`` column sums, the
    total (if any), then ``X_ij >= 0`` row-major. Points are ``(rows, cols)`` matrices or flattened.

    Examples
    --------
    >>> import numpy as np, polyproj as pp
    >>> res = pp.project(np.array([[2.0, 0.0], [0.0, 0.3]]), pp.sets.PartialMatching(2, 2, max_matches=1.0))
    >>> np.round(res.y, 12)
    array([[1., 0.],
           [0., 0.]])
    """

    def __init__(self, rows: int, cols: int, max_matches: float | None = None, *, tol: float | None = None,
                 max_iter: int = 60) -> None:
        for name, v in (("rows", rows), ("cols", cols)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ProblemError(f"{name} must be an integer >= 1, got {v!r}")
        if max_matches is not None:
            if isinstance(max_matches, bool) or not isinstance(max_matches, (int, float, np.floating, np.integer)) \
                    or not (np.isfinite(max_matches) and max_matches >= 0):
                raise ProblemError(f"max_matches must be a finite number >= 0 or None, got {max_matches!r}")
            max_matches = float(max_matches)
        # α >= min(rows, cols) is implied by the line sums: the row stays in the set's rows (its results keep the
        # shape of as_polyhedron; active where the sum reaches α, multiplier 0) but not in the solve, whose
        # faces it would make dependent (slower, and harder to verify, for the same answers)
        implied = max_matches is not None and max_matches >= min(int(rows), int(cols))
        super().__init__(Sums(int(rows), int(cols), False, None if implied else max_matches), tol=tol,
                         max_iter=max_iter)
        self.rows, self.cols, self.max_matches = int(rows), int(cols), max_matches

    @property
    def _m(self) -> int:
        return self.rows + self.cols + (1 if self.max_matches is not None else 0)

    def _rows(self) -> Polyhedron:
        """``A = [row sums; column sums; total]``, ``a = [1; 1; α]``, ``X >= 0`` (row-major entries)."""
        r, c = self.rows, self.cols
        A = [np.kron(np.eye(r), np.ones((1, c))), np.kron(np.ones((1, r)), np.eye(c))]
        a = [np.ones(r), np.ones(c)]
        if self.max_matches is not None:
            A.append(np.ones((1, r * c)))
            a.append([self.max_matches])
        return Polyhedron(A=np.vstack(A), a=np.concatenate(a), lb=np.zeros(r * c))

    def row_counts(self) -> tuple[int, int]:
        """``(rows + cols [+ 1] + rows·cols, 0)``."""
        return self._m + self.n, 0

    def _active(self, xp: Any, face: FaceSolution, zero: Any) -> Any:
        b = zero.shape[0]
        rows = list(face.rows[:2]) + ([face.rows[2]] if self.max_matches is not None else [])
        return xp.concat([*rows, xp.reshape(zero, (b, self.n))], axis=1)

    def _final_rows(self, xp: Any, face: FaceSolution) -> Any:
        """Row, column and total rows at their bound (to rounding at the sample's scale).

        The rows of D, and rows off D whose sum is 1 (weakly active).
        """
        X = face.X
        eps = float(np.finfo(np.float32 if X.dtype == xp.float32 else np.float64).eps)
        # a line sum is at most 1: its rounding is that of r + c numbers at 1; the total's scales with max_matches
        # (a tolerance scaled by max_matches for the lines too put rows with sums 1 − 1e-7 on the face at
        # max_matches 1e9, and the answer moved off the projection)
        tol = 4.0 * (self.rows + self.cols) * eps
        rs, cs = line_sums(xp, X)
        out = [face.rows[0] | (rs >= 1.0 - tol), face.rows[1] | (cs >= 1.0 - tol)]
        if self.max_matches is not None:
            tot = xp.sum(rs, axis=1, keepdims=True)
            out.append(face.rows[2] | (tot >= self.max_matches - tol * (1.0 + self.max_matches)))
        else:
            out.append(face.rows[2])
        return tuple(out)

    def _multipliers(self, xp: Any, face: FaceSolution, lam: Any) -> Any:
        y = face.y
        z = xp.zeros_like
        parts = [xp.where(face.rows[0], xp.maximum(y.u, z(y.u)), z(y.u)),
                 xp.where(face.rows[1], xp.maximum(y.v, z(y.v)), z(y.v))]
        if self.max_matches is not None:
            parts.append(xp.where(face.rows[2], xp.maximum(y.w, z(y.w)), z(y.w)))
        return xp.concat([*parts, lam], axis=1)

    def _weak(self, xp: Any, face: FaceSolution, lam: Any, tol: Any) -> Any:
        w = super()._weak(xp, face, lam, tol)
        y = face.y
        for a, yy in zip(face.rows, (y.u, y.v, y.w), strict=True):
            w = w | xp.any(a & (yy <= tol), axis=1)
        return w

    def __repr__(self) -> str:
        return f"PartialMatching(rows={self.rows}, cols={self.cols}, max_matches={self.max_matches})"
