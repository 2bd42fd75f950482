"""The batch of QPs the IPM solves: validated inputs, the stacked constraint rows, float constants.

The canonical QP (see ``docs/ipm.md``)::

    minimize ½ xᵀPx + qᵀx   subject to   l <= C x <= u,   lb <= x <= ub

is read with a leading batch dimension on ``q, l, u, lb, ub`` (and on ``P, C`` when given per
element). The IPM works on the stacked rows ``G = [C; I]`` with bounds ``L = [l; lb]``,
``U = [u; ub]`` (:class:`Rows`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from array_api_compat import array_namespace, is_numpy_namespace
from array_api_compat import device as _device

from ...errors import ProblemError
from ...linalg import holds, require_int64
from ...problem import _INF_THRESHOLD
from .arrays import take_rows

__all__ = ["BatchQP", "Numerics", "Rows", "as_batch_qp", "numerics", "stack_rows"]

# |bound| >= 1e20 means no bound, as everywhere in polyproj; the IPM also reads bounds within a
# relative 1e-9 of it as absent (data files write -1e20 as -9.999999999999998e19): such a "finite"
# side would give a slack of 1e20 that wrecks the starting point and mu, and it can never be active
_INF = _INF_THRESHOLD * (1.0 - 1e-9)


@dataclass(frozen=True)
class BatchQP:
    """A validated batch of QPs in one namespace, on one device, in one float dtype.

    Attributes
    ----------
    P : (1|b, n, n)
    q : (b, n)
    C : (1|b, m, n)
        A leading dimension of 1: shared by the batch.
    l, u : (b, m)
    lb, ub : (b, n)
        ``±inf`` where there is no bound (possibly broadcast views).
    x0 : (b, n) or None
        Starting primal point (non-finite entries replaced by 0).
    """

    P: Any
    q: Any
    C: Any
    l: Any
    u: Any
    lb: Any
    ub: Any
    x0: Any = None

    @property
    def b(self) -> int:
        """Batch size."""
        return self.q.shape[0]

    @property
    def n(self) -> int:
        """Number of variables."""
        return self.q.shape[1]

    @property
    def m(self) -> int:
        """Number of rows of C."""
        return self.C.shape[-2]

    def part(self, i: int, j: int) -> BatchQP:
        """Elements ``i:j`` (shared P and C stay shared)."""

        def sl(M):
            return M if M.shape[0] == 1 else M[i:j, ...]

        return BatchQP(sl(self.P), self.q[i:j, ...], sl(self.C), self.l[i:j, ...], self.u[i:j, ...],
                       self.lb[i:j, ...], self.ub[i:j, ...], None if self.x0 is None else self.x0[i:j, ...])

    def take(self, xp: Any, idx: Any) -> BatchQP:
        """Elements ``idx`` for a continued run (no starting point: the run resumes its own state)."""
        return BatchQP(*(take_rows(xp, M, idx) for M in (self.P, self.q, self.C, self.l, self.u, self.lb, self.ub)))


def _detach(a: Any) -> Any:
    return a.detach() if hasattr(a, "detach") else a


def _as3(M: Any, rows: int, n: int, name: str) -> Any:
    """A matrix as (1|b, rows, n)."""
    if M.ndim == 2:
        if M.shape != (rows, n):
            raise ProblemError(f"{name} must have shape ({rows}, {n}) or (batch, {rows}, {n}), got {tuple(M.shape)}")
        return M[None, ...]
    if M.ndim == 3 and M.shape[1:] == (rows, n):
        return M
    raise ProblemError(f"{name} must have shape ({rows}, {n}) or (batch, {rows}, {n}), got {tuple(M.shape)}")


def _as_batch_vec(xp: Any, v: Any, b: int, size: int, name: str, fill: float, dtype: Any, dev: Any) -> Any:
    """A vector as (b, size); None is ``fill`` everywhere."""
    if v is None:
        return xp.full((b, size), fill, dtype=dtype, device=dev)
    v = xp.astype(v, dtype) if v.dtype != dtype else v
    if v.ndim == 1 and v.shape[0] == size:
        return xp.broadcast_to(v[None, :], (b, size))
    if v.ndim == 2 and v.shape == (b, size):
        return v
    raise ProblemError(f"{name} must have shape ({size},) or ({b}, {size}), got {tuple(v.shape)}")


def _float_dtype(xp: Any, P: Any, q: Any, C: Any, dev: Any = None) -> Any:
    """float32 when every matrix given is float32, else float64; other dtypes must be real.

    On a device without float64 (torch's MPS, array_api_strict's ``"no_float64"``) float32, integer data included
    (the device refuses float64 arrays).
    """
    dtypes = [a.dtype for a in (P, q, C) if a is not None and hasattr(a, "dtype")]
    for a, name in ((P, "P"), (q, "q"), (C, "C")):
        if a is not None and hasattr(a, "dtype") and not xp.isdtype(a.dtype, ("real floating", "integral", "bool")):
            raise ProblemError(f"{name} must hold real numbers, got dtype {a.dtype}")
    if dtypes and all(d == xp.float32 for d in dtypes):
        return xp.float32
    return xp.float64 if dev is None or holds(xp, xp.float64, dev) else xp.float32


def _start_point(conv: Any, xp: Any, warm_start: Any, b: int, n: int) -> Any:
    """The primal point of ``warm_start`` (an object or dict with ``x``) as (b, n), or None."""
    if warm_start is None:
        return None
    if hasattr(warm_start, "shape") and not hasattr(warm_start, "x"):
        raise ProblemError("warm_start must be a dict or an object with x (e.g. {'x': X} or a previous result), got "
                           f"a bare {type(warm_start).__name__}")
    x0 = warm_start.get("x") if isinstance(warm_start, dict) else getattr(warm_start, "x", None)
    if x0 is None:
        return None
    if hasattr(x0, "shape"):
        try:
            same = array_namespace(x0) is xp
        except TypeError:
            same = False
        if not same:
            raise ProblemError(f"warm_start x is a {type(x0).__module__}.{type(x0).__name__}, but the data are "
                               f"{xp.__name__} arrays: give it in the data's array library")
    x0 = conv(x0)
    x0 = x0[None, :] if x0.ndim == 1 else x0
    if tuple(x0.shape) != (b, n):
        raise ProblemError(f"warm_start x must have shape ({b}, {n}), got {tuple(x0.shape)}")
    return xp.where(xp.isfinite(x0), x0, xp.zeros_like(x0))


def as_batch_qp(P: Any, q: Any, C: Any, l: Any, u: Any, lb: Any, ub: Any, warm_start: Any) -> tuple[Any, BatchQP]:
    """The array namespace of the inputs and the validated :class:`BatchQP`.

    Raises
    ------
    ProblemError
        Inconsistent shapes, non-real dtypes, NaN/inf in P, q or C, NaN in the bounds, crossing bounds.
    """
    arrays = [a for a in (P, q, C, l, u, lb, ub) if a is not None and not isinstance(a, (list, tuple, float, int))]
    if not arrays:  # nested lists only: NumPy's
        arrays = [np.asarray(q, dtype=np.float64)]
    try:
        xp = array_namespace(*arrays)
    except TypeError as exc:  # NumPy beside torch, say: one namespace per batch
        raise ProblemError(f"the arrays must come from one array library (and device): {exc}") from None
    if any(getattr(a, "is_meta", False) for a in arrays):  # torch's own error came from a .item() deep inside
        raise ProblemError("the arrays are on torch's 'meta' device: they have shapes but no values to solve with")
    devices = {str(_device(a)) for a in arrays if hasattr(a, "shape")}
    if len(devices) > 1:  # the namespace's own error came from deep inside (array_api_strict's ValueError)
        raise ProblemError(f"the arrays must be on one device, got {sorted(devices)}")
    if P is None:
        raise ProblemError("P is required: an (n, n) or (batch, n, n) array (zeros for an LP)")
    P, q = _detach(P), xp.asarray(_detach(q))
    if q.ndim == 1:
        q = q[None, :]
    if q.ndim != 2:
        raise ProblemError(f"q must have shape (batch, n), got {tuple(q.shape)}")
    dev = _device(q)
    require_int64(xp, q, "solve_qp_batch")
    dtype = _float_dtype(xp, P, q, C, dev)
    b, n = q.shape
    if n == 0:
        raise ProblemError("a QP with no variables (q of shape (batch, 0)) has nothing to solve")

    def conv(a):
        if a is None:
            return None
        a = xp.asarray(_detach(a), device=dev) if not hasattr(a, "shape") else _detach(a)
        return xp.astype(a, dtype) if a.dtype != dtype else a

    q, P = conv(q), conv(P)
    C = conv(C) if C is not None else xp.zeros((0, n), dtype=dtype, device=dev)
    if C.ndim == 1:  # one row, as polyproj.QP reads a 1-D C (its shape[-2] was an IndexError)
        C = C[None, :]
    m = C.shape[-2]
    p_n = P.shape[-1] if getattr(P, "ndim", 0) >= 2 else None
    if p_n is not None and p_n != n:  # name the vector: q's width is what disagrees with P
        raise ProblemError(f"q has {n} columns but P is {p_n} × {p_n}: q must have shape (batch, {p_n})")
    P3, C3 = _as3(P, n, n, "P"), _as3(C, m, n, "C")
    if b == 0:  # an empty batch of per-element matrices: no element to solve, shared (zero) shapes
        P3 = P3 if P3.shape[0] else xp.zeros((1, n, n), dtype=dtype, device=dev)
        C3 = C3 if C3.shape[0] else xp.zeros((1, m, n), dtype=dtype, device=dev)
    for M, name in ((P3, "P"), (C3, "C"), (q, "q")):
        if M.shape[0] not in (1, b) and name != "q":
            raise ProblemError(f"{name} has batch size {M.shape[0]}, q has {b}")
        if not bool(xp.all(xp.isfinite(M))):
            raise ProblemError(f"{name} contains NaN or inf")
    vecs = [_as_batch_vec(xp, conv(v), b, size, name, fill, dtype, dev)
            for v, size, name, fill in ((l, m, "l", -math.inf), (u, m, "u", math.inf),
                                        (lb, n, "lb", -math.inf), (ub, n, "ub", math.inf))]
    for v, name in zip(vecs, ("l", "u", "lb", "ub")):
        if bool(xp.any(xp.isnan(v))):
            raise ProblemError(f"{name} contains NaN")
    for lo, hi, names in ((vecs[0], vecs[1], ("l", "u")), (vecs[2], vecs[3], ("lb", "ub"))):
        # as QP's check: crossing sides (the IPM ran to max_iter), or a side at the wrong infinity
        # |v| >= 1e20 reads as infinite (a lower side of +1e20 is +inf, as QP reads it)
        if bool(xp.any(lo > hi)) or bool(xp.any(lo >= _INF)) or bool(xp.any(hi <= -_INF)):
            raise ProblemError(f"{names[0]} <= {names[1]} must hold entrywise with {names[0]} < +inf and "
                               f"{names[1]} > -inf (crossing or infinite sides)")
    return xp, BatchQP(P3, q, C3, *vecs, _start_point(conv, xp, warm_start, b, n))


@dataclass(frozen=True)
class Numerics:
    """Constants of a batch's float type: ``eps`` and 0-d arrays on its device."""

    dtype: Any
    device: Any
    eps: float
    zero: Any
    one: Any
    inf: Any


def numerics(xp: Any, dtype: Any, dev: Any) -> Numerics:
    """The :class:`Numerics` of ``dtype`` on ``dev``."""
    eps = float(np.finfo(np.float32 if dtype == xp.float32 else np.float64).eps)
    return Numerics(dtype, dev, eps, xp.zeros((), dtype=dtype, device=dev), xp.ones((), dtype=dtype, device=dev),
                    xp.full((), math.inf, dtype=dtype, device=dev))


@dataclass(frozen=True)
class Rows:
    """The rows of ``G = [C; I]`` (M = m + n per element) with their bounds, unscaled.

    Rows with ``L_i == U_i`` are equalities (a free multiplier); every other finite side gets a
    slack and a multiplier: ``G x − L = s_l ≥ 0`` (``z_l ≥ 0``), ``U − G x = s_u ≥ 0`` (``z_u ≥ 0``).

    Attributes
    ----------
    L, U : (b, M)
        ``[l; lb]`` and ``[u; ub]`` (infinite where absent).
    finL, finU : (b, M) bool
        Finite lower / upper side.
    eq : (b, M) bool
        Equality rows.
    mlb, mub : (b, M) bool
        Lower / upper sides with a slack (finite, not an equality); ``ml, mu``: the same as floats.
    Lf, Uf : (b, M)
        ``L, U`` with 0 where infinite.
    ncomp : (b,)
        Number of complementarity pairs (1 where there are none).
    """

    L: Any
    U: Any
    finL: Any
    finU: Any
    eq: Any
    mlb: Any
    mub: Any
    ml: Any
    mu: Any
    Lf: Any
    Uf: Any
    ncomp: Any


def stack_rows(xp: Any, qp: BatchQP, num: Numerics) -> Rows:
    """The :class:`Rows` of a batch."""
    L = xp.concat([qp.l, qp.lb], axis=1)
    U = xp.concat([qp.u, qp.ub], axis=1)
    if is_numpy_namespace(xp):  # NumPy concatenates broadcast (stride-0) rows in Fortran order: make them
        L, U = np.ascontiguousarray(L), np.ascontiguousarray(U)  # C-ordered like everything else
    finL = L > -_INF
    finU = U < _INF
    eq = finL & finU & (L == U)
    mlb = finL & ~eq
    mub = finU & ~eq
    ml = xp.astype(mlb, num.dtype)
    mu = xp.astype(mub, num.dtype)
    ncomp = xp.sum(ml, axis=1) + xp.sum(mu, axis=1)
    ncomp = xp.where(ncomp > 0, ncomp, num.one)
    return Rows(L, U, finL, finU, eq, mlb, mub, ml, mu, xp.where(finL, L, num.zero), xp.where(finU, U, num.zero),
                ncomp)
