"""The box ``{lb <= y <= ub}``: projection by clipping, in closed form."""

from __future__ import annotations

from typing import Any

import numpy as np
from array_api_compat import array_namespace
from array_api_compat import device as _device

from ..errors import ProblemError
from ..linalg import host_copy, own_contiguous
from ..problem import Polyhedron
from ..projection.result import Degeneracy, ProjectionResult
from .base import Projector

__all__ = ["Box"]


class Box(Projector):
    """``{y : lb <= y <= ub}`` (``±inf`` allowed).

    ``Π(x) = clip(x, lb, ub)``; the active rows are the coordinates at a bound (a coordinate with
    ``lb_i == ub_i`` has both rows active), the HS-Jacobian keeps the other coordinates: ``J g = f ⊙ g``.

    Examples
    --------
    >>> import numpy as np, polyproj as pp
    >>> res = pp.project(np.array([2.0, 0.5, -1.0]), pp.sets.Box(np.zeros(3), np.ones(3)))
    >>> res.y, res.active
    (array([1. , 0.5, 0. ]), array([False, False,  True,  True, False, False]))
    """

    def __init__(self, lb: Any = None, ub: Any = None, *, n: int | None = None) -> None:
        for name, v in (("lb", lb), ("ub", ub)):
            if getattr(v, "requires_grad", False):  # held as NumPy: the gradient would be dropped silently
                raise ProblemError(f"Box holds fixed bounds, but {name} is a tensor that requires a gradient; for "
                                   f"gradients with respect to the bounds project with them: "
                                   f"polyproj.adapters.torch.project(x, lb=lb, ub=ub)")
        # held on the host (NumPy): bounds given as CuPy arrays or on another device are copied there explicitly
        # (np.asarray refuses them: CuPy's TypeError); torch tensors, lists and numbers are read by Polyhedron
        lb, ub = (host_copy(v) if hasattr(v, "__array_namespace__") and not hasattr(v, "detach") else v
                  for v in (lb, ub))
        self._polyhedron = Polyhedron(lb=lb, ub=ub, n=n)  # validates: shapes, NaN, lb <= ub
        self.lb, self.ub = self._polyhedron.lb, self._polyhedron.ub

    @property
    def n(self) -> int:
        """Number of variables."""
        return self._polyhedron.n

    def as_polyhedron(self) -> Polyhedron:
        """The box as a Polyhedron (rows: finite lower bounds, then finite upper bounds)."""
        return self._polyhedron

    def _bounds(self, X: Any):
        xp = array_namespace(X)
        host = isinstance(X, np.ndarray)  # (another namespace may share the buffer: the problem's is read-only)
        return (xp.asarray(self.lb if host else own_contiguous(self.lb), dtype=X.dtype, device=_device(X)),
                xp.asarray(self.ub if host else own_contiguous(self.ub), dtype=X.dtype, device=_device(X)))

    def project_batch(self, X: Any) -> ProjectionResult:
        """Clip; active rows and multipliers in the Polyhedron's numbering."""
        xp = array_namespace(X)
        lb, ub = self._bounds(X)
        Y = xp.minimum(xp.maximum(X, lb), ub)
        P = self._polyhedron
        host = isinstance(X, np.ndarray)  # the index arrays are read-only after a copy or pickle (torch warns)
        li = xp.asarray(P.lb_idx if host else own_contiguous(P.lb_idx), device=_device(X))
        ui = xp.asarray(P.ub_idx if host else own_contiguous(P.ub_idx), device=_device(X))
        at_lb, at_ub = Y == lb, Y == ub
        zero = xp.zeros_like(X)
        lam_lb, lam_ub = xp.maximum(lb - X, zero), xp.maximum(X - ub, zero)
        active = xp.concat([xp.take(at_lb, li, axis=1), xp.take(at_ub, ui, axis=1)], axis=1)
        mult = xp.concat([xp.take(lam_lb, li, axis=1), xp.take(lam_ub, ui, axis=1)], axis=1)
        viol = xp.zeros((X.shape[0],), dtype=X.dtype, device=_device(X))
        # weakly active: x exactly at a bound (zero multiplier); dependent: a coordinate at both bounds
        weak = xp.any((at_lb & (X == lb)) | (at_ub & (X == ub)), axis=1)
        report = Degeneracy(weak, xp.any(at_lb & at_ub, axis=1))
        return self.result(X, Y, active, mult, violation=viol, face=xp.astype(~(at_lb | at_ub), X.dtype),
                           degenerate=report)

    def vjp(self, result: ProjectionResult, G: Any) -> Any:
        """``J g``: the gradient of the coordinates not at a bound."""
        return result.face * G

    def __repr__(self) -> str:
        fin = int(np.isfinite(self.lb).sum() + np.isfinite(self.ub).sum())
        return f"Box(n={self.n}, finite bounds={fin})"
