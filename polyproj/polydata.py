"""Constraint data of a polyhedron as arrays of one array namespace: the form projections work on.

``P = {y : A y <= a,  B y = b,  lb <= y <= ub}`` with every part present (empty matrices, infinite
bounds), in one namespace (NumPy, PyTorch on any device, CuPy, ``array_api_strict``) and one dtype.
Each part is shared by a batch (``A (m, n)``, ``a (m,)``, ``lb (n,)``) or carries the batch dimension
(``A (batch, m, n)``, ``a (batch, m)``, ``lb (batch, n)``): input-dependent constraints.

**The numbering of inequality rows** (the one used by the projection pipeline, the polish, the faces
and the HS-Jacobian): the ``m`` rows of ``A``, then one row ``-y_i <= -lb_i`` for every coordinate,
then one row ``y_i <= ub_i`` for every coordinate — ``m + 2n`` rows whatever the data (a row with an
infinite right-hand side is never active), so shapes never depend on values. A
:class:`~polyproj.problem.Polyhedron` reports active sets in its compact numbering (rows of ``A``,
finite lower bounds, finite upper bounds); :class:`RowLayout` is the one conversion between the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
from array_api_compat import array_namespace
from array_api_compat import device as _device

from .errors import ProblemError
from .linalg import own_contiguous, row_norms
from .linalg import to_host as _host

__all__ = ["PolyData", "RowLayout", "empty_row", "ineq_slack", "matvec"]


def matvec(xp: Any, M: Any, Y: Any) -> Any:
    """``M y`` per sample: ``M`` (r, n) shared or (b, r, n); ``Y`` (b, n) -> (b, r)."""
    if M.ndim == 2:
        return xp.matmul(Y, xp.matrix_transpose(M))
    return xp.matmul(M, Y[:, :, None])[:, :, 0]


def ineq_slack(Y: Any, A: Any, a: Any, lb: Any, ub: Any) -> Any:
    """Slack of every inequality row: ``[a − A y, y − lb, ub − y]``, shape (b, m + 2n)."""
    xp = array_namespace(Y, A)
    return xp.concat([a - matvec(xp, A, Y), Y - lb, ub - Y], axis=1)


def empty_row(xp: Any, A: Any, a: Any, B: Any, b: Any) -> str | None:
    """Why the data are empty by a zero row, or None.

    A zero row reads ``0 <= a_i`` (empty when ``a_i < 0``) or ``0 = b_j`` (empty when ``b_j != 0``). Shared
    or batched parts (``A (m, n)`` or ``(batch, m, n)``), any namespace. Such a row admits no point;
    solvers that scale rows by their norms cannot see it (a zero row has none), so it is named here, before
    any solve.
    """
    for M, v, name, vname, test in ((A, a, "A", "a", lambda r: r < 0), (B, b, "B", "b", lambda r: r != 0)):
        bad = xp.all(M == 0, axis=-1) & test(v)
        if bool(xp.any(bad)):
            v = xp.broadcast_to(v, bad.shape)
            i = int(xp.nonzero(xp.reshape(bad, (-1,)))[0][0])
            rhs, r = float(xp.reshape(v, (-1,))[i]), v.shape[-1]
            loc = f"row {i % r}" + (f" of sample {i // r}" if v.ndim > 1 else "")
            rule = f"0 <= {rhs:g}" if name == "A" else f"0 = {rhs:g}"
            return (f"{loc} of {name} is zero with {vname} = {rhs:g}: it reads {rule}, which no point satisfies, "
                    "so the polyhedron is empty")
    return None


@dataclass(frozen=True)
class PolyData:
    """The six parts of a polyhedron as arrays of one namespace and dtype (see the module docstring)."""

    A: Any
    a: Any
    B: Any
    b: Any
    lb: Any
    ub: Any

    @property
    def xp(self) -> Any:
        """The array namespace of the data."""
        return array_namespace(self.A, self.lb)

    @property
    def n(self) -> int:
        """Number of variables."""
        return int(self.lb.shape[-1])

    @property
    def m(self) -> int:
        """Rows of A."""
        return int(self.A.shape[-2])

    @property
    def p(self) -> int:
        """Rows of B."""
        return int(self.B.shape[-2])

    @property
    def shared_matrices(self) -> bool:
        """True when A and B are shared by the batch (vectors may still be per sample)."""
        return self.A.ndim == 2 and self.B.ndim == 2

    @property
    def batched(self) -> bool:
        """True when any part carries a batch dimension."""
        return not self.shared_matrices or any(v.ndim == 2 for v in (self.a, self.b, self.lb, self.ub))

    @cached_property
    def rhs_size(self) -> float:
        """Largest finite ``|a|, |b|, |lb|, |ub|`` (0.0 when there is none).

        Computed once per instance: a PolyData's arrays are not changed in place (the projection code
        makes new instances, the sets hold copies of what they were given).
        """
        xp = self.xp
        size = 0.0
        for v in (self.a, self.b, self.lb, self.ub):
            if all(int(d) > 0 for d in v.shape):  # empty parts have no size
                fin = xp.where(xp.isfinite(v), xp.abs(v), xp.zeros_like(v))
                size = max(size, float(xp.max(fin)))
        return size

    @cached_property
    def row_norms(self) -> tuple[Any, Any]:
        """The 2-norms of the rows of ``A`` and of ``B`` ((m,) and (p,), or per sample): computed once."""
        xp = self.xp
        return row_norms(xp, self.A), row_norms(xp, self.B)  # no overflow of the squares at entries ~1e160

    @cached_property
    def distance_size(self) -> float:
        """Largest distance from the origin of a constraint's hyperplane (0.0 when there is none).

        Over the finite right-hand sides and the nonzero rows: ``|a_i| / ||A_i||``, ``|b_j| / ||B_j||``,
        ``|lb_k|``, ``|ub_k|``. The polyhedron's size in the space of ``y``, whatever the rows' own scales: a row
        ``1e8 y_1 <= 1e7`` lies 0.1 from the origin, not 1e7 (:attr:`rhs_size` reads 1e7).
        Where every coordinate has both bounds, at most the box's farthest corner (bounded by ``sqrt(n) max|bound|``): a
        hyperplane beyond it does not meet the box (a row ``e·y <= 1e10`` beside a box of ±1 made the size 1e10,
        the projection's unit shrank the polytope below the backends' tolerances, and points 60 outside it came
        back as SOLVED_INACCURATE).
        """
        size = self.distance_size_within(float("inf"))
        xp = self.xp
        if self.n and bool(xp.all(xp.isfinite(self.lb))) and bool(xp.all(xp.isfinite(self.ub))):
            # ||corner||₂ <= sqrt(n) max|bound| (the norm itself overflows for bounds near 1e300)
            corner = float(xp.max(xp.maximum(xp.abs(self.lb), xp.abs(self.ub)))) * math.sqrt(self.n)
            size = min(size, corner)
        return size

    def distance_size_within(self, radius: float) -> float:
        """Largest distance from the origin of a constraint's hyperplane, over those within ``radius`` (0.0: none)."""
        xp = self.xp
        size = 0.0
        norm_a, norm_b = self.row_norms
        for norm, v in ((norm_a, self.a), (norm_b, self.b), (None, self.lb), (None, self.ub)):
            if not all(int(d) > 0 for d in v.shape):
                continue
            fin = xp.isfinite(v)
            if norm is not None:
                fin = fin & (norm > 0)
                v = v / xp.where(norm > 0, norm, xp.ones_like(norm))
            fin = fin & (xp.abs(v) <= radius)
            if bool(xp.any(fin)):
                size = max(size, float(xp.max(xp.where(fin, xp.abs(v), xp.zeros_like(v)))))
        return size

    @cached_property
    def contains_origin(self) -> bool:
        """Whether ``y = 0`` is a point of the polyhedron (of every sample's)."""
        xp = self.xp
        return all(bool(xp.all(ok)) for ok in (self.a >= 0, self.b == 0, self.lb <= 0, self.ub >= 0))

    @cached_property
    def typical_size(self) -> float:
        """The median distance from the origin of the rows' hyperplanes (finite ones), at most :attr:`distance_size`.

        :attr:`distance_size` where that median is 0 (rows through the origin, or no rows). The set's size as most
        of its rows see it: a few far rows (big right-hand sides for "no limit") do not move it, and a row through
        the origin beside a unit box does not make it 0. The bounds count only where the rows give no size: a "no
        limit" box of ±1e6 on every coordinate outvoted the rows and excused a miss of 0.35 where they did. (A box
        alone sets the size: at ±1e6 a miss of 0.35 is 3.5e-7 of it, as a miss of 3.5e-7 is in a unit box.)
        """
        norm_a, norm_b = self.row_norms

        def dists(pairs):
            out = []
            for norm, v in pairs:
                if not all(int(d) > 0 for d in v.shape):
                    continue
                d = np.abs(np.asarray(_host(v), dtype=np.float64))
                if norm is not None:
                    nrm = np.asarray(_host(norm), dtype=np.float64)
                    d = np.where(nrm > 0, d / np.where(nrm > 0, nrm, 1.0), np.inf)
                out.append(d[np.isfinite(d)].ravel())
            return np.concatenate(out) if out else np.zeros(0)

        rows = dists(((norm_a, self.a), (norm_b, self.b)))
        typical = float(np.median(rows)) if rows.size else 0.0
        # rows through the origin (or none): the set's size is its bounds' (a point near 0 in a unit box)
        return min(typical, self.distance_size) if typical > 0 else self.distance_size

    def relative_violation(self, Y: Any) -> Any:
        """Largest violation of each row of ``Y`` (b, n) as a distance, each relative to its own constraint's size.

        Row ``i`` missed by ``r_i / ||M_i||`` over ``|rhs_i| / ||M_i|| + max|y| +`` :attr:`typical_size` (bounds:
        ``r / (|bound| + max|y| + typical)``); inf where Y is not finite. Unlike :meth:`distance_violation` over
        one size for all, a far constraint's size does not excuse the miss of a near one; the typical size keeps a
        row through the origin from judging a point near it on its own |y| (a miss of 7e-9 at |y| 1e-3 in a unit
        box is rounding, not a violation).
        """
        xp = array_namespace(Y, self.A)
        y = xp.where(xp.isfinite(Y), Y, xp.zeros_like(Y))
        ymax = xp.max(xp.abs(y), axis=1, keepdims=True) if self.n else xp.zeros((Y.shape[0], 1), dtype=Y.dtype)
        ymax = ymax + self.typical_size
        v = xp.zeros((Y.shape[0],), dtype=Y.dtype, device=_device(Y))
        for r, rhs, nrm in self._row_misses(xp, Y):
            size = xp.where(xp.isfinite(rhs), xp.abs(rhs), xp.zeros_like(rhs)) / nrm + ymax
            v = xp.maximum(v, xp.max(r / nrm / xp.where(size > 0, size, xp.ones_like(size)), axis=1))
        if self.n:
            for r, bound in ((Y - self.ub, self.ub), (self.lb - Y, self.lb)):
                size = xp.where(xp.isfinite(bound), xp.abs(bound), xp.zeros_like(bound)) + ymax
                r = xp.where(r > 0, r, xp.zeros_like(r))
                v = xp.maximum(v, xp.max(r / xp.where(size > 0, size, xp.ones_like(size)), axis=1))
        return xp.where(xp.all(xp.isfinite(Y), axis=1), v, xp.full_like(v, float("inf")))

    @cached_property
    def row_size(self) -> float:
        """Largest 1-norm of a constraint row: of ``A``, of ``B``, 1 for the bounds (0.0 for ``n = 0``).

        With :attr:`rhs_size`, the scale of a violation: a row misses by ``|a_j − A_j y| <= |a_j| + ||A_j||_1 max|y|``.
        """
        xp = self.xp
        size = 1.0 if self.n else 0.0
        for M in (self.A, self.B):
            if all(int(d) > 0 for d in M.shape):
                size = max(size, float(xp.max(xp.sum(xp.abs(M), axis=-1))))
        return size

    def scale_at(self, Y: Any) -> Any:
        """The polyhedron's scale at each row of ``Y`` (b,): ``rhs_size + row_size max|y|`` (non-finite y as 0).

        A row misses ``y`` by at most this much whatever the data's units, so a violation measured against it
        means the same at every scale (``Π_{sP}(s x) = s Π_P(x)``).
        """
        xp = array_namespace(Y)
        y = xp.where(xp.isfinite(Y), Y, xp.zeros_like(Y))
        return self.rhs_size + self.row_size * xp.max(xp.abs(y), axis=1)

    def parts(self) -> tuple[Any, ...]:
        """``(A, a, B, b, lb, ub)``."""
        return self.A, self.a, self.B, self.b, self.lb, self.ub

    def take(self, idx: Any) -> PolyData:
        """The data of the samples ``idx`` (an index array); shared parts unchanged."""
        xp = self.xp

        def t(v, nd):
            return xp.take(v, idx, axis=0) if v.ndim == nd else v

        return PolyData(t(self.A, 3), t(self.a, 2), t(self.B, 3), t(self.b, 2), t(self.lb, 2), t(self.ub, 2))

    def astype(self, dtype: Any) -> PolyData:
        """The data in another floating dtype of the same namespace."""
        xp = self.xp
        return PolyData(*(xp.astype(v, dtype) for v in self.parts()))

    def _row_misses(self, xp: Any, Y: Any):
        """``(miss, rhs, norm)`` of the rows of A, then of B, at ``Y``.

        Each row's violation (>= 0; its absolute value for B), its right-hand side and its norm (1 for a zero row).
        """
        for M, rhs, norm, eq in ((self.A, self.a, self.row_norms[0], False), (self.B, self.b, self.row_norms[1], True)):
            if not M.shape[-2]:
                continue
            r = matvec(xp, M, Y) - rhs
            yield (xp.abs(r) if eq else xp.where(r > 0, r, xp.zeros_like(r))), rhs, \
                xp.where(norm > 0, norm, xp.ones_like(norm))

    def distance_violation(self, Y: Any) -> Any:
        """Largest violation of each row of ``Y`` (b, n) as a distance (inf where Y is not finite).

        Each row's miss divided by its norm. Unlike :meth:`violation` (in the rows' own units), the same for any
        scaling of the rows: a row of norm 1.3e8 missed by 5e7 is 0.4 away, not 5e7.
        """
        xp = array_namespace(Y, self.A)
        v = xp.zeros((Y.shape[0],), dtype=Y.dtype, device=_device(Y))
        for r, _, nrm in self._row_misses(xp, Y):
            v = xp.maximum(v, xp.max(r / nrm, axis=1))
        if self.n:
            r = xp.maximum(Y - self.ub, self.lb - Y)
            v = xp.maximum(v, xp.max(xp.where(r > 0, r, xp.zeros_like(r)), axis=1))
        return xp.where(xp.all(xp.isfinite(Y), axis=1), v, xp.full_like(v, float("inf")))

    def violation(self, Y: Any) -> Any:
        """Largest constraint violation of each row of ``Y`` (b, n); ``inf`` where Y is not finite."""
        xp = array_namespace(Y, self.A)
        v = xp.zeros((Y.shape[0],), dtype=Y.dtype, device=_device(Y))
        if self.m:
            r = matvec(xp, self.A, Y) - self.a
            v = xp.maximum(v, xp.max(xp.where(r > 0, r, xp.zeros_like(r)), axis=1))
        if self.p:
            v = xp.maximum(v, xp.max(xp.abs(matvec(xp, self.B, Y) - self.b), axis=1))
        if self.n:
            r = xp.maximum(Y - self.ub, self.lb - Y)
            v = xp.maximum(v, xp.max(xp.where(r > 0, r, xp.zeros_like(r)), axis=1))
        good = xp.all(xp.isfinite(Y), axis=1)
        return xp.where(good, v, xp.full_like(v, float("inf")))

    @classmethod
    def from_polyhedron(cls, polyhedron: Any, like: Any = None, dtype: Any = None) -> PolyData:
        """The dense data of a :class:`~polyproj.problem.Polyhedron` in the namespace/device of ``like``."""
        parts = (polyhedron.A_dense, polyhedron.a, polyhedron.B_dense, polyhedron.b, polyhedron.lb, polyhedron.ub)
        if like is None:
            return cls(*(np.asarray(v, dtype=dtype or np.float64) for v in parts))
        xp = array_namespace(like)
        dt = like.dtype if dtype is None else dtype
        dev = _device(like)
        if isinstance(like, np.ndarray):  # (NumPy reads the problem's read-only arrays as they are)
            return cls(*(np.asarray(v, dtype=dt) for v in parts))
        return cls(*(xp.asarray(own_contiguous(v), dtype=dt, device=dev) for v in parts))


@dataclass(frozen=True)
class RowLayout:
    """Map between the pipeline's inequality rows (``m + 2n``) and a Polyhedron's compact numbering.

    Compact numbering: the rows of ``A``, then the finite lower bounds (``lb_idx``), then the finite
    upper bounds (``ub_idx``). ``cols[j]`` is the pipeline row of compact row ``j``.
    """

    m: int
    n: int
    lb_idx: np.ndarray
    ub_idx: np.ndarray

    @classmethod
    def of(cls, polyhedron: Any) -> RowLayout:
        """The layout of a Polyhedron."""
        return cls(polyhedron.m_ineq, polyhedron.n, polyhedron.lb_idx, polyhedron.ub_idx)

    @property
    def cols(self) -> np.ndarray:
        """Pipeline row of every compact row."""
        m, n = self.m, self.n
        return np.concatenate([np.arange(m), m + self.lb_idx, m + n + self.ub_idx]).astype(np.int64)

    @property
    def n_compact(self) -> int:
        """Length of the compact numbering."""
        return self.m + self.lb_idx.size + self.ub_idx.size

    def to_compact(self, full: Any) -> Any:
        """Columns of a (b, m + 2n) array in the compact numbering, (b, n_compact)."""
        xp = array_namespace(full)
        return xp.take(full, xp.asarray(self.cols, device=_device(full)), axis=1)

    def to_full(self, compact: Any, fill: Any = 0) -> Any:
        """A (b, n_compact) array spread to the (b, m + 2n) rows (``fill`` elsewhere)."""
        compact = np.asarray(compact)
        if compact.shape[-1] != self.n_compact:
            raise ProblemError(f"active must have {self.n_compact} entries per sample (rows of A, then finite "
                               f"lb, then finite ub), got shape {compact.shape}")
        out = np.full((*compact.shape[:-1], self.m + 2 * self.n), fill, dtype=compact.dtype)
        out[..., self.cols] = compact
        return out


def qp_multipliers_to_rows(xp: Any, z: Any, z_box: Any, m: int) -> Any:
    """Inequality-row multipliers (b, m + 2n) from a QP solution's ``z`` (rows of ``[A; B]``) and ``z_box``.

    With ``C = [A; B]`` the QP's ``z_i > 0`` is the multiplier of an active upper side (a row of A),
    ``z_box_i < 0`` of an active lower bound, ``z_box_i > 0`` of an active upper bound.
    """
    z = xp.where(xp.isnan(z), xp.zeros_like(z), z)
    zb = xp.where(xp.isnan(z_box), xp.zeros_like(z_box), z_box)
    return xp.concat([z[:, :m], -zb, zb], axis=1)


def rows_to_qp_multipliers(xp: Any, mult: Any, mu: Any, m: int) -> tuple[Any, Any]:
    """``(z, z_box)`` of a QP solution from inequality-row multipliers (b, m + 2n) and equality ones (b, p).

    The inverse of :func:`qp_multipliers_to_rows`: ``z`` holds the rows of ``[A; B]``.
    A bound's multiplier is the upper row's positive part less the lower row's (the polish keeps one of them
    nonzero and non-negative; :func:`qp_multipliers_to_rows` writes ``−z_box`` and ``z_box``).
    """
    n = (mult.shape[1] - m) // 2
    zero = xp.zeros_like(mult[:, m: m + n])
    z_box = xp.maximum(mult[:, m + n:], zero) - xp.maximum(mult[:, m: m + n], zero)
    return xp.concat([mult[:, :m], mu], axis=1), z_box
