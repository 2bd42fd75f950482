"""The HS-Jacobian of the projection onto a :class:`~polyproj.problem.Polyhedron` at an active set.

For ``P = {Ay <= a, By = b, lb <= y <= ub}``, ``y = Π_P(x)`` and the active rows ``I`` the element used
for backpropagation is the orthogonal projector onto the null space of the active rows::

    J(x) = I_n − H (HᵀH)⁺ Hᵀ,     H = [A_Iᵀ, Bᵀ, e_i for active bounds],

computed from one factorisation of the active rows (:class:`~polyproj.projection.faces.Face`): no
multiplier and no LICQ needed — dependent active rows leave the null space, hence ``J``, unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ProblemError
from ..polydata import RowLayout
from .faces import Face

__all__ = ["hs_jacobian", "hs_vjp"]


def _face(polyhedron: Any, active: Any, batch: int | None = None) -> tuple[bool, Face]:
    from ..problem import Polyhedron, _asarray

    if not isinstance(polyhedron, Polyhedron):
        raise ProblemError(f"the HS-Jacobian functions take a Polyhedron, got {type(polyhedron).__name__}; for a "
                           "set use S.as_polyhedron() (or S.vjp on its projection result)")
    raw = _asarray(active.detach().cpu() if hasattr(active, "detach") else active, "active")
    if raw.size == 0 and raw.dtype.kind == "f":  # [] reads as float64: an empty mask of no rows
        raw = raw.astype(bool)
    if raw.dtype != bool and not (raw.dtype.kind in "iu" and np.isin(raw, (0, 1)).all()):
        raise ProblemError(f"active must be a boolean mask (or 0/1 integers), got dtype {raw.dtype}")
    act = raw.astype(bool)
    if act.ndim not in (1, 2):
        raise ProblemError(f"active must have shape (n_ineq,) or (batch, n_ineq), got {act.shape}")
    single = act.ndim == 1
    act = np.atleast_2d(act)
    layout = RowLayout.of(polyhedron)
    if act.shape[-1] != layout.n_compact:
        raise ProblemError(f"active must have {layout.n_compact} entries per sample (rows of A, then finite lb, "
                           f"then finite ub), got shape {np.shape(active)}")
    if batch is not None and act.shape[0] == 1 and batch != 1:  # one mask for every sample (none: batch 0)
        act = np.broadcast_to(act, (batch, act.shape[1]))
    if batch is not None and act.shape[0] != batch:
        raise ProblemError(f"active has {act.shape[0]} samples but V has {batch}")
    full = layout.to_full(act, fill=False)
    m, n = polyhedron.m_ineq, polyhedron.n
    at_ub = full[:, m + n:]
    fixed = (full[:, m: m + n] | at_ub).astype(np.float64)
    return single, Face.factor(polyhedron.A_dense, polyhedron.B_dense, full[:, :m], 1.0 - fixed, method="svd")


def hs_jacobian(polyhedron: Any, active: Any) -> np.ndarray:
    """The HS-Jacobian element ``J = I − H(HᵀH)⁺Hᵀ`` at an active set.

    Parameters
    ----------
    polyhedron : Polyhedron
    active : (n_ineq,) or (batch, n_ineq) bool
        Active inequality rows (``ProjectionResult.active``).

    Returns
    -------
    (n, n) or (batch, n, n) ndarray — symmetric, idempotent.

    Examples
    --------
    >>> import numpy as np, polyproj as pp
    >>> box = pp.Polyhedron(lb=np.zeros(2), ub=np.ones(2))
    >>> res = pp.project(np.array([2.0, 0.5]), box)
    >>> pp.hs_jacobian(box, res.active)
    array([[0., 0.],
           [0., 1.]])
    """
    single, F = _face(polyhedron, active)
    n = polyhedron.n
    batch = F.free.shape[0]
    eye = np.broadcast_to(np.eye(n), (batch, n, n))
    J = np.stack([F.null_apply(np.ascontiguousarray(eye[:, :, j])) for j in range(n)], axis=-1)
    return J[0] if single else J


def hs_vjp(polyhedron: Any, active: Any, V: Any) -> np.ndarray:
    """Batched ``J v`` without forming ``J`` (``J`` is symmetric, so this is also ``vᵀ J``).

    Parameters
    ----------
    polyhedron : Polyhedron
    active : (n_ineq,) or (batch, n_ineq) bool
    V : (n,) or (batch, n) array

    Returns
    -------
    ndarray shaped like V.
    """
    from ..problem import _asarray

    raw = _asarray(V.detach().cpu() if hasattr(V, "detach") else V, "V")
    if raw.dtype == bool or not (np.issubdtype(raw.dtype, np.floating) or np.issubdtype(raw.dtype, np.integer)):
        raise ProblemError(f"V must hold real numbers, got dtype {raw.dtype}")
    V = raw.astype(np.float64)
    if not np.isfinite(V).all():
        raise ProblemError("V contains NaN or inf")
    if V.ndim not in (1, 2):
        raise ProblemError(f"V must have shape (n,) or (batch, n), got {V.shape}")
    single_v = V.ndim == 1
    V2 = np.atleast_2d(V)
    if V2.shape[-1] != polyhedron.n:
        raise ProblemError(f"V must have {polyhedron.n} columns, got shape {V.shape}")
    _, F = _face(polyhedron, active, batch=V2.shape[0])
    out = F.null_apply(V2)
    return out[0] if single_v else out
