"""The HS-Jacobian of the projection onto a :class:`~polyproj.problem.Polyhedron` at an active set.

For ``P = {Ay <= a, By = b, lb <= y <= ub}``, ``y = Π_P(x)`` and the active rows ``I`` the element used
for backpropagation is the orthogonal projector onto the null space of the active rows::

    J(x) = I_n − H (HᵀH)⁺ Hᵀ,     H = [A_Iᵀ, Bᵀ, e_i for active bounds],

computed from one factorisation of the active rows: no multiplier and no LICQ needed — dependent active
rows leave the null space, hence ``J``, unchanged.

The factorisation is a Householder QR of ``M_nᵀ`` (the active rows on the free coordinates, normalised, as
columns): ``J = I_F − Q Qᵀ`` on the free coordinates, accurate to ``eps cond(M_n)`` like an SVD (Cholesky of
the Gram matrix would square the condition number) at a fraction of its cost. A face whose ``R`` has a pivot
below :data:`QR_PIVOT` — dependent or nearly dependent rows, where unpivoted QR does not reveal the rank —
takes the rank-revealing SVD (:class:`~polyproj.projection.faces.Face`, ``method="svd"``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ProblemError
from ..linalg import host_copy
from ..polydata import RowLayout
from .faces import QR_PIVOT, ActiveRows, Face, gather_active_rows, qr_null_basis

__all__ = ["QR_PIVOT", "hs_jacobian", "hs_vjp"]


def _check_polyhedron(polyhedron: Any) -> None:
    from ..problem import Polyhedron

    if not isinstance(polyhedron, Polyhedron):
        raise ProblemError(f"the HS-Jacobian functions take a Polyhedron, got {type(polyhedron).__name__}; for a "
                           "set use S.as_polyhedron() (or S.vjp on its projection result)")


def _on_host(v: Any) -> Any:
    """An array API array other than NumPy's and torch's (CuPy, ``array_api_strict`` on any device) read to the host.

    These functions compute on the host (NumPy) and ``pp.project`` returns ``active`` on the input's device:
    ``np.asarray`` of a CuPy array or of an ``array_api_strict`` array off its CPU device raises the library's own
    TypeError / RuntimeError, so the copy is asked for explicitly (one transfer). torch tensors are read by
    ``_asarray`` (which refuses a 'meta' one).
    """
    return v if hasattr(v, "detach") or not hasattr(v, "__array_namespace__") else host_copy(v)


def _face(polyhedron: Any, active: Any, batch: int | None = None) -> tuple[bool, ActiveRows]:
    from ..problem import _asarray

    _check_polyhedron(polyhedron)
    raw = _asarray(_on_host(active), "active")  # a tensor on the host (a 'meta' one, holding no values, refused)
    if raw.size == 0 and raw.dtype.kind == "f":  # [] reads as float64: an empty mask of no rows
        raw = raw.astype(bool)
    # A mask only: integers are refused, 0/1 ones included, since an index list of 0s and 1s ([0]: "row 0 is
    # active"; [1, 0]) reads as a mask of other rows without any error.
    if raw.dtype != bool:
        hint = (": 0/1 flags convert with .astype(bool) (a tensor: .bool()); for row indices build the mask, "
                "m = np.zeros(n_ineq, bool); m[idx] = True") if raw.dtype.kind in "iu" else ""
        raise ProblemError(f"active must be a boolean mask (True for an active row), got dtype {raw.dtype}{hint}")
    act = raw
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
    return single, gather_active_rows(polyhedron.A_dense, polyhedron.B_dense, full[:, :m], 1.0 - fixed)


def _null_apply(R: ActiveRows, V: np.ndarray) -> np.ndarray:
    """``J v`` (b, n) for V (b, n): ``f⊙v − Q Qᵀ (f⊙v)``; the faces QR does not settle by the SVD."""
    fv = R.free * V
    if R.scale.shape[1] == 0 or fv.shape[0] == 0:
        return fv
    Q, ok = qr_null_basis(R)
    out = fv - np.einsum("bnk,bk->bn", Q, np.einsum("bnk,bn->bk", Q, fv))
    if not ok.all():
        idx = np.flatnonzero(~ok)
        out[idx] = Face.of_rows(R.take(idx), method="svd").null_apply(V[idx])
    return out


def hs_jacobian(polyhedron: Any, active: Any) -> np.ndarray:
    """The HS-Jacobian element ``J = I − H(HᵀH)⁺Hᵀ`` at an active set.

    Parameters
    ----------
    polyhedron : Polyhedron
    active : (n_ineq,) or (batch, n_ineq) bool
        Active inequality rows (``ProjectionResult.active``): a boolean mask (NumPy, torch, a list of bools, any
        array API array such as CuPy's: read on the host).
        Integers are refused, 0/1 ones too (an index list ``[1, 0]`` would read as a mask): convert 0/1 flags
        with ``.astype(bool)``, and build the mask from row indices.

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
    single, R = _face(polyhedron, active)
    n = polyhedron.n
    batch = R.free.shape[0]
    J = np.zeros((batch, n, n))
    J[:, np.arange(n), np.arange(n)] = R.free  # diag(f) − Q Qᵀ (the fixed coordinates' rows and columns are 0)
    if R.scale.shape[1] and batch:
        Q, ok = qr_null_basis(R)
        J -= Q @ np.swapaxes(Q, 1, 2)
        if not ok.all():
            idx = np.flatnonzero(~ok)
            F = Face.of_rows(R.take(idx), method="svd")
            eye = np.broadcast_to(np.eye(n), (idx.size, n, n))
            J[idx] = np.stack([F.null_apply(np.ascontiguousarray(eye[:, :, j])) for j in range(n)], axis=-1)
    return J[0] if single else J


def hs_vjp(polyhedron: Any, active: Any, V: Any) -> np.ndarray:
    """Batched ``J v`` without forming ``J`` (``J`` is symmetric, so this is also ``vᵀ J``).

    Parameters
    ----------
    polyhedron : Polyhedron
    active : (n_ineq,) or (batch, n_ineq) bool
        A boolean mask, as for :func:`hs_jacobian`.
    V : (n,) or (batch, n) array
        Real numbers: NumPy, a list, a torch tensor or any array API array (CuPy: read on the host).

    Returns
    -------
    ndarray shaped like V, a NumPy array also for a torch V. Computed in float64 and rounded once to V's
    dtype when it is float16, float32 or float64 (a tensor's or another array API array's too: torch.float32
    gives float32); float64 for integers and other floats (bfloat16).
    """
    from ..problem import _asarray

    _check_polyhedron(polyhedron)
    # the result's dtype: V's float16/32/64 by the dtype's name, whatever its namespace prefix ("torch.float32",
    # "array_api_strict.float32": _asarray reads a tensor in float64), else float64
    name = str(getattr(V, "dtype", "")).rsplit(".", 1)[-1]
    out_dtype = np.dtype(name) if name in ("float16", "float32", "float64") else np.dtype(np.float64)
    raw = _asarray(_on_host(V), "V")  # a tensor on the host (a 'meta' one, holding no values, refused)
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
    _, R = _face(polyhedron, active, batch=V2.shape[0])
    out = _null_apply(R, V2).astype(out_dtype, copy=False)  # computed in float64, rounded once
    return out[0] if single_v else out
