"""Problem model: :class:`QP` (canonical form) and :class:`Polyhedron` (the papers' form).

QP (docs/architecture.md, "Conventions")::

    minimize ½ xᵀPx + qᵀx   subject to   l <= C x <= u,   lb <= x <= ub

rows with ``l_i == u_i`` are equalities; ``±inf`` (or ``|v| >= 1e20``) means no bound, except on a row scaled
up as far (:data:`DROPPED_RATIO`: refused), and never in the cost ``q``.

Polyhedron::

    P = {y : A y <= a,  B y = b,  lb <= y <= ub}

Both are frozen and validated on construction; bad data raises :class:`ProblemError` with a
message that names the offending argument (and row or entry).
"""

from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from .errors import ProblemError
from .linalg import TINY_ROW
from .polydata import empty_row

__all__ = ["QP", "Polyhedron"]

_INF_THRESHOLD = 1e20  # Maros–Meszaros and many solvers write infinite bounds as ±1e20
_DENSE_PSD_LIMIT = 3000  # dense eigenvalue check up to this size
_RANK_CHECK_LIMIT = 20_000_000  # entries of B beyond which the rank check is skipped


# --------------------------------------------------------------------------- helpers
def _asarray(v: Any, name: str) -> np.ndarray:
    """``np.asarray(v)``; ragged nested lists are a ProblemError, not NumPy's ValueError.

    A torch tensor is read on the host, detached (one that requires grad raised torch's RuntimeError), in
    float64 where NumPy has no such dtype (bfloat16 raised TypeError); a complex one keeps its dtype (refused by
    :func:`_check_numeric`).
    """
    if hasattr(v, "detach") and hasattr(v, "is_complex"):
        if v.device.type == "meta":
            raise ProblemError(f"{name} is a tensor on the 'meta' device: it holds no values")
        v = v.detach().cpu()
        if str(v.layout) != "torch.strided":  # a sparse tensor (COO, CSR, ...): its values, dense
            v = v.to_dense()
        v = v.numpy() if v.is_complex() or v.dtype.is_floating_point is False else v.double().numpy()
    elif sp.issparse(v):  # a vector given as a sparse matrix or array
        v = v.toarray()
    elif isinstance(v, np.ma.MaskedArray):
        if np.ma.is_masked(v):
            raise ProblemError(f"{name} is a masked array with masked entries: their values would be read as "
                               "given; fill them (np.ma.filled) or drop them")
        v = v.data
    try:
        arr = np.asarray(v)
    except ValueError as exc:
        raise ProblemError(f"{name} is not a rectangular array ({exc})") from exc
    if arr.dtype == object and arr.size and all(isinstance(e, numbers.Real) for e in arr.flat):
        arr = arr.astype(np.float64)  # Python integers beyond int64 (10**30): real numbers all the same
    return arr


def _shape(v: Any, name: str) -> tuple[int, ...]:
    """The shape of ``v``: an array's, a tensor's or a sparse matrix's own, else that of ``_asarray(v)``.

    Every shape read from user data goes through here: ``np.shape`` of a ragged nested list raises NumPy's
    ValueError, which is a ProblemError naming the argument here.
    """
    shp = getattr(v, "shape", None)
    if shp is not None and not callable(shp):
        return tuple(int(s) for s in shp)
    return tuple(np.shape(_asarray(v, name)))


def _check_numeric(arr: Any, name: str) -> None:
    dtype = arr.dtype if sp.issparse(arr) else np.asarray(arr).dtype
    if dtype.kind not in "biuf":
        raise ProblemError(f"{name} must hold real numbers, got dtype {dtype}")


def _matrix(M: Any, name: str, cols: int | None, *, allow_none: bool = True, one_row: bool = True):
    """Validate a matrix (dense or scipy.sparse) and return it as float64 (CSC if sparse).

    ``one_row``: a 1-D array of ``cols`` entries is the matrix of that one row (constraint rows; not P).
    """
    if M is None:
        if allow_none:
            return None
        raise ProblemError(f"{name} is required")
    if sp.issparse(M):  # any format (csr, coo, dok, lil, ...): checked on its dtype, stored as CSC
        _check_numeric(M, name)
        if M.ndim == 1 and one_row and cols is not None and M.shape[0] == cols:  # a 1-D sparse array
            M = M.toarray()[None, :]
        elif M.ndim != 2:
            raise ProblemError(f"{name} must be a 2-D matrix, got a sparse array of shape {M.shape}")
        M = sp.csc_matrix(M.astype(np.float64), copy=True)  # (float16 DIA/LIL/BSR: csc_matrix(dtype=) refused)
        vals = M.data
    else:
        arr = _asarray(M, name)  # a torch tensor given to the NumPy-level API: on the host
        _check_numeric(arr, name)
        M = np.array(arr, dtype=np.float64)  # copy: the problem must not alias user data
        if M.ndim == 1 and cols is not None and M.size == cols and (one_row or cols == 1):
            M = M[None, :]  # (a 1-D P of one variable, [2.0], is its 1 x 1 matrix)
        vals = M
    if M.ndim != 2:
        raise ProblemError(f"{name} must be a 2-D matrix, got shape {M.shape}")
    if cols is not None and M.shape[1] != cols:
        raise ProblemError(f"{name} has {M.shape[1]} columns, expected {cols} (the number of variables)")
    if not np.all(np.isfinite(vals)):
        if sp.issparse(M):  # found on the sparse data (a dense copy of a large M would not fit)
            coo = M.tocoo()
            k = int(np.flatnonzero(~np.isfinite(coo.data))[0])
            bad = (int(coo.row[k]), int(coo.col[k]))
        else:
            bad = tuple(np.argwhere(~np.isfinite(M))[0])
        raise ProblemError(f"{name} contains NaN or inf (first at row {bad[0]}, column {bad[1]})")
    return M




#: relative tolerance at which a backend's infeasibility claim is checked against its certificate (OSQP tests
#: them in its own scaled units, eps 1e-5 there and ~5e-5 as given; a certificate of nothing fails at any tolerance)
CLAIM_EPS = 1e-3


def _row_max(M: Any) -> np.ndarray:
    """Largest magnitude of each row of a dense or sparse matrix (0 for a zero row)."""
    if M.shape[0] == 0 or M.shape[1] == 0:
        return np.zeros(M.shape[0])
    return np.asarray(abs(M).max(axis=1).todense()).ravel() if sp.issparse(M) else np.abs(M).max(axis=1)


def _check_row_scale(big: np.ndarray, name: str) -> None:
    """Refuse rows whose largest entry ``big`` (:func:`_row_max`) is nonzero but below :data:`TINY_ROW`."""
    tiny = np.flatnonzero((big > 0) & (big < TINY_ROW))
    if tiny.size:
        raise ProblemError(f"rows {tiny[:5].tolist()} of {name} have entries only below {TINY_ROW:g} in magnitude "
                           f"(row {int(tiny[0])}: largest {big[tiny[0]]:.3g}); scale such a row and its right-hand "
                           "side up (the set is the same for any positive multiple), or drop a row meant as zero")


#: a right-hand side read as "no bound" (|v| >= 1e20) on a row whose entries reach |v| / DROPPED_RATIO is refused.
#: Data files write 1e20 for "no bound" on rows with entries up to 1e5 (Maros–Meszaros QSIERRA: ratio 1e15, others
#: from 2.5e16): such a side binds only where |x| reaches 1e12 and more, and is read as none; closer, it is a finite
#: right-hand side of a row scaled up as far.
DROPPED_RATIO = 1e12


def _check_scaled_rows(raw: np.ndarray, name: str, M: Any, matrix: str, sides: str, rhs: str, up: int) -> None:
    """Refuse a right-hand side ``raw`` that would read as infinite (``|v| >= 1e20``) on a row scaled up as far.

    ``1e20 (y_1 + y_2) <= 1e20`` is the set ``y_1 + y_2 <= 1``: reading its right-hand side as ``+inf`` would
    drop the row (a QP's ``u`` silently: every backend returned the unconstrained point as SOLVED), and
    ``1e20 (y_1 + y_2) = -1e20`` is no "forbidden infinity" but ``y_1 + y_2 = -1``. The convention holds where
    ``|v| / max_j |M_ij|`` reaches :data:`DROPPED_RATIO` (``v = 1e20`` on a row of unit entries, as data files
    write "no bound"); below it the value is refused, with the hint to scale the row. ``raw``: the values as given
    (float64, one a row of ``M``), by :func:`_vector` before :func:`check_values` maps them (which would name the
    mapped infinity instead). ``sides``: the row's right-hand sides for the hint (``"l[i], u[i]"``);
    ``rhs``: which side ``name`` is, for the message ("" for a one-sided row); ``up``: ``+1`` where ``+inf``
    is that side's "no bound", ``-1`` where ``-inf`` is, ``0`` where neither (equations).
    """
    cand = np.isfinite(raw) & (np.abs(raw) >= _INF_THRESHOLD)
    if not cand.any():
        return
    big = _row_max(M)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        bad = cand & (big > 0) & (np.abs(raw) / big < DROPPED_RATIO)
    if not bad.any():
        return
    i = int(np.flatnonzero(bad)[0])
    v = raw[i]
    read = "inf" if v > 0 else "-inf"
    hint = (f"divide row {i} of {matrix} and {sides.replace('[i]', f'[{i}]')} by a common factor "
            "(the set is the same)")
    if up and np.sign(v) == up:  # an allowed "no bound" on this side: the side would be dropped
        drop = f"the {rhs} side of row {i}" if rhs else f"row {i}"
        raise ProblemError(f"{name}[{i}] = {v:g} reads as no bound (|v| >= {_INF_THRESHOLD:g} means {read}), which "
                           f"would drop {drop} of {matrix}, yet that row's entries reach {big[i]:.3g}: {hint}, or "
                           f"pass {name}[{i}] = {read} for no bound")
    raise ProblemError(f"{name}[{i}] = {v:g}, which reads as {read} (|v| >= {_INF_THRESHOLD:g} means no bound), is "
                       f"a finite right-hand side of row {i} of {matrix}, whose entries reach {big[i]:.3g} (a row "
                       f"scaled up as far), not an infinity: {hint}")


def _where(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def _loc(idx: tuple[int, ...]) -> str:
    return ", ".join(str(i) for i in idx)


def check_values(arr: np.ndarray, name: str, allow_inf: int = 0, *, cost: bool = False) -> np.ndarray:
    """Check the entries of a float64 array of right-hand sides or bounds (any shape).

    NaN is an error; ``|v| >= 1e20`` is mapped to ``±inf``; ``allow_inf``: 0 no infinities, +1 only
    ``+inf`` (upper bounds), -1 only ``-inf`` (lower bounds). Used for single vectors and for the
    batches of ``QPSolver.solve_batch`` alike. Returns the mapped array.

    ``cost``: the entries are a linear cost (``q``), not bounds: "no bound" means nothing there, so any finite
    value is kept as it is (the backends solve far-from-unit data in normalised units, ``backends/scaling.py``:
    ``q = -1e20 e_1`` was refused as a forbidden infinity while ``P = 1e150 I`` was solved) and only ``±inf``
    is refused.
    """
    nan = np.isnan(arr)
    if nan.any():
        idx = _where(nan)
        where = f"index {idx[0]}" if arr.ndim == 1 else str(idx)
        raise ProblemError(f"{name} contains NaN (first at {where})")
    if cost:
        inf = np.isinf(arr)
        if inf.any():
            idx = _where(inf)
            raise ProblemError(f"{name}[{_loc(idx)}] = {arr[idx]} is not allowed: a cost must be finite")
        return np.array(arr)  # a fresh array, as the mapping below makes one (the problem owns its base)
    given = arr
    arr = np.where(arr >= _INF_THRESHOLD, np.inf, np.where(arr <= -_INF_THRESHOLD, -np.inf, arr))
    if allow_inf == 0:
        wrong = np.isinf(arr)
    else:
        wrong = np.isinf(arr) & ((arr < 0) if allow_inf > 0 else (arr > 0))
    if wrong.any():
        idx = _where(wrong)
        allowed = "" if allow_inf == 0 else " or " + ("+inf" if allow_inf > 0 else "-inf")
        value = f"{arr[idx]}" if np.isinf(given[idx]) else \
            f"{given[idx]:g}, which reads as {arr[idx]} (|v| >= {_INF_THRESHOLD:g} means no bound),"
        raise ProblemError(f"{name}[{_loc(idx)}] = {value} is not allowed: a forbidden infinity "
                           f"(must be finite{allowed})")
    return arr


def check_order(lo: np.ndarray, hi: np.ndarray, lname: str, uname: str, what: str = "bounds") -> None:
    """Raise when a lower bound exceeds its upper bound (arrays of any broadcastable shapes)."""
    lo, hi = np.broadcast_arrays(lo, hi)
    bad = lo > hi
    if np.any(bad):
        idx = _where(bad)
        raise ProblemError(
            f"{lname}[{_loc(idx)}] = {lo[idx]:g} > {uname}[{_loc(idx)}] = {hi[idx]:g}: the {what} cross "
            f"({int(bad.sum())} such entries)"
        )


def _vector(v: Any, name: str, size: int, *, default: float | None = None, allow_inf: int = 0,
            scalar: bool = False, cost: bool = False, rows: tuple | None = None) -> np.ndarray:
    """Validate a vector of length ``size`` (see :func:`check_values` for ``allow_inf`` and ``cost``).

    ``scalar``: a single number stands for that value in every entry (bounds: ``lb=0``). ``rows``: the right-hand
    side of these rows, ``(M, matrix, sides, rhs, up)`` of :func:`_check_scaled_rows`, run on the values as given.
    """
    if v is None:
        if default is None:
            raise ProblemError(f"{name} is required")
        return np.full(size, default, dtype=np.float64)
    arr = _asarray(v, name)
    _check_numeric(arr, name)
    if scalar and arr.ndim == 0:
        arr = np.full(size, arr, dtype=np.float64)
    arr = np.array(arr, dtype=np.float64).reshape(-1) if arr.ndim <= 1 else arr
    if arr.ndim != 1 or arr.shape[0] != size:
        raise ProblemError(f"{name} must have shape ({size},), got {np.shape(v)}")
    if rows is not None and size:
        _check_scaled_rows(arr, name, *rows)
    return check_values(arr, name, allow_inf, cost=cost)


def matrix_scale(P) -> float:
    """``max|P_ij|``: the scale of the symmetry and eigenvalue tolerances (0 for a zero or empty P).

    Relative, not floored at 1: ``1e-9 [[1, 2], [2, 1]]`` (eigenvalue −1e-9) passed an absolute −1e-8 as
    convex, and five backends returned its saddle point as SOLVED.
    """
    if P.shape[0] == 0 or (sp.issparse(P) and P.nnz == 0):
        return 0.0
    return float(abs(P).max())


def smallest_eigenvalue(P, *, iterative: bool = False) -> float | None:
    """Smallest eigenvalue of a symmetric matrix, or None where it is not computed.

    Exact and cheap for diagonal P (projections: P = I); dense ``eigvalsh`` up to n = 3000; beyond,
    Lanczos (``eigsh``) when ``iterative``, else None. The one place polyproj decides convexity:
    QP validation, and the backends' checks of QPs built with ``check_psd=False``.
    """
    n = P.shape[0]
    if n == 0:
        return 0.0
    diag = P.diagonal() if sp.issparse(P) else np.diag(P)
    offdiag = (P - sp.diags(diag)).count_nonzero() if sp.issparse(P) else np.count_nonzero(P - np.diag(diag))
    if offdiag == 0:
        return float(np.min(diag))
    if n <= _DENSE_PSD_LIMIT:
        return float(scipy.linalg.eigvalsh(P.toarray() if sp.issparse(P) else P, subset_by_index=[0, 0])[0])
    if not iterative:
        return None
    from scipy.sparse.linalg import eigsh

    try:
        return float(eigsh(sp.csc_matrix(P), k=1, which="SA", return_eigenvectors=False)[0])
    except Exception:  # no convergence: unknown
        return None


def _check_symmetric(P, name: str = "P") -> None:
    """Raise unless ``|P_ij − P_ji| <= 1e-9 max(|P_ij|, |P_ji|) + 1e-12 max|P|`` for every entry (O(nnz)).

    Per entry: against ``max|P|`` alone, a block at 1e-3 beside a diagonal at 1e6 could differ by 55 % between
    its triangles, and each backend solved another problem. The entry named is found on the sparse data.
    """
    if P.shape[0] == 0:
        return
    diff = abs(P - P.T)
    excess = diff - 1e-9 * (abs(P).maximum(abs(P.T)) if sp.issparse(P) else np.maximum(abs(P), abs(P.T)))
    if sp.issparse(excess):
        excess = excess.tocoo()
        k = int(np.argmax(excess.data)) if excess.nnz else None
        worst, i, j = (float(excess.data[k]), int(excess.row[k]), int(excess.col[k])) if k is not None else (0.0, 0, 0)
    else:
        i, j = np.unravel_index(int(np.argmax(excess)), excess.shape)
        worst = float(excess[i, j])
    if worst > 1e-12 * matrix_scale(P):
        asym = float(diff[i, j])
        triangular = (sp.issparse(P) and (sp.tril(P, -1).nnz == 0 or sp.triu(P, 1).nnz == 0)) or (
            not sp.issparse(P) and (not np.tril(P, -1).any() or not np.triu(P, 1).any()))
        hint = (f"{name} holds one triangle only: pass P + P.T - diag(P) for the symmetric matrix it stands for"
                if triangular else "pass (P + P.T) / 2 if you meant the symmetric part")
        raise ProblemError(f"{name} is not symmetric: |{name}[{i},{j}] - {name}[{j},{i}]| = {asym:.3g}; {hint}")


def _check_psd(P, name: str = "P") -> bool:
    """Raise where P is not positive semidefinite; return whether that was decided.

    False: too large for the dense check, left to the backends' Lanczos check
    (:func:`polyproj.backends.convexity.is_nonconvex`).
    """
    scale = matrix_scale(P)
    diag = P.diagonal() if sp.issparse(P) else np.diag(P)
    if np.any(diag < -1e-9 * scale):
        i = int(np.argmin(diag))
        raise ProblemError(f"{name} is not positive semidefinite ({name}[{i},{i}] = {diag[i]:.3g} < 0)")
    lam = smallest_eigenvalue(P)
    if lam is not None and lam < -1e-8 * scale:
        raise ProblemError(
            f"{name} is not positive semidefinite (smallest eigenvalue {lam:.3g}); "
            "polyproj solves convex QPs only"
        )
    return lam is not None


def _dependent_rows(B) -> list[int]:
    """Indices of rows of B that are linear combinations of the other rows (empty if full rank)."""
    dense = B.toarray() if sp.issparse(B) else B
    if dense.shape[0] == 0:
        return []
    norms = np.linalg.norm(dense, axis=1)
    zero = [int(i) for i in np.flatnonzero(norms == 0)]
    scaled = dense / np.where(norms > 0, norms, 1.0)[:, None]
    _, R, piv = scipy.linalg.qr(scaled.T, mode="economic", pivoting=True)
    d = np.abs(np.diag(R))
    tol = max(dense.shape) * np.finfo(float).eps * (d[0] if d.size else 1.0) * 100
    rank = int(np.sum(d > tol))
    dep = sorted(set(int(i) for i in piv[rank:]) | set(zero))
    return dep


def inconsistent_row(B, b: np.ndarray) -> tuple[int, float] | None:
    """The first equation ``B y = b`` misses, or None when the equations have a solution.

    ``(row, miss)``: least squares, a miss beyond rounding at the data's scale.
    """
    dense = B.toarray() if sp.issparse(B) else B
    y = np.linalg.lstsq(dense, b, rcond=None)[0]
    resid = np.abs(dense @ y - b)
    scale = 1.0 + np.abs(b).max() + np.abs(dense).sum(axis=1).max() * np.abs(y).max(initial=0.0)
    bad = np.flatnonzero(resid > 1e-10 * max(dense.shape) * scale)
    return (int(bad[0]), float(resid[bad[0]])) if bad.size else None


def _check_consistent(B, b: np.ndarray, dep: list[int]) -> None:
    """Raise unless ``B y = b`` has a solution (least-squares residual at rounding of the data's scale)."""
    miss = inconsistent_row(B, b)
    if miss is not None:
        raise ProblemError(f"B y = b is inconsistent (rows {dep} of B depend on the others, and row {miss[0]} "
                           f"misses by {miss[1]:.3g}): the set is empty")


# --------------------------------------------------------------------------- QP
def _read_only(v: Any, own: bool = True) -> Any:
    """A read-only view of a dense array the problem owns (:func:`~polyproj.linalg.own_contiguous` for libraries).

    The problem is frozen, and what is computed from it once (the backends' conversions, the guard's side masks, a
    set's faces) is reused: an edit in place (``qp.q[:] = ...``) would mix old and new data, so it raises, and a
    changed problem is a new one (``QP(...)``, ``qp.with_vectors(q=...)``). A view of a read-only base cannot be
    made writable again (``setflags(write=True)`` raises). Sparse matrices are left as they are (SciPy sorts their
    indices in place). ``own=False`` (an array the caller keeps: ``with_vectors(validate=False)``): the view alone
    is read-only.
    """
    if not isinstance(v, np.ndarray):
        return v
    if own:
        v.setflags(write=False)
    view = v.view()
    view.setflags(write=False)
    return view


def _frozen_state(obj: Any, state: dict[str, Any]) -> None:
    """Unpickling (and ``copy.deepcopy``) of a problem: its arrays read-only again, as at construction."""
    for k, v in state.items():
        object.__setattr__(obj, k, _read_only(v))


@dataclass(frozen=True, eq=False)
class QP:
    """Convex quadratic program ``min ½ xᵀPx + qᵀx  s.t.  l <= Cx <= u,  lb <= x <= ub``.

    Parameters
    ----------
    P : (n, n) array or scipy.sparse matrix
        Symmetric positive semidefinite (checked: here up to n = 3,000 or for a diagonal P, beyond that by
        every backend before it solves, by Lanczos; ``psd_known`` says whether the construction decided it).
    q : (n,) array
        Finite, of any magnitude (a cost: ``|q_i| >= 1e20`` is not "no bound").
    C : (m, n) array or scipy.sparse matrix, optional
    l, u : (m,) arrays, optional
        ``-inf`` / ``+inf`` (or beyond ±1e20) mean unbounded; ``l_i == u_i`` is an equality. A value beyond
        ±1e20 on a row whose entries reach ``|v| / 1e12`` (``1e20 (x_1 + x_2) <= 1e20``: the set
        ``x_1 + x_2 <= 1``) is refused, not dropped: scale that row and its sides down.
    lb, ub : (n,) arrays, optional
        Variable bounds.
    check_psd : bool
        Check positive semidefiniteness of P (default True; symmetry is always checked: solvers read
        one triangle or the other, so a non-symmetric P would mean different problems to them).

    Examples
    --------
    >>> import numpy as np, polyproj as pp
    >>> qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    >>> qp.n, qp.m
    (2, 1)
    """

    P: Any
    q: Any
    C: Any = None
    l: Any = None
    u: Any = None
    lb: Any = None
    ub: Any = None
    check_psd: bool = field(default=True, repr=False)

    def __post_init__(self) -> None:
        if not (isinstance(self.check_psd, (bool, np.bool_)) or (isinstance(self.check_psd, (int, np.integer))
                                                                  and self.check_psd in (0, 1))):
            # None or "" silently skipped the check (0 and 1 are flags, as in the backends' options)
            raise ProblemError(f"check_psd must be True or False, got {self.check_psd!r}")
        q = _vector(self.q, "q", int(np.prod(_shape(self.q, "q"), dtype=np.int64)), cost=True)
        n = q.shape[0]
        P = _matrix(self.P, "P", n, allow_none=False, one_row=False)
        if P.shape != (n, n):
            raise ProblemError(f"P must have shape ({n}, {n}) to match q, got {P.shape}")
        C = _matrix(self.C, "C", n)
        if C is None:
            C = np.zeros((0, n))
            # empty l/u fit the zero rows of no C, as an empty a without A does in a Polyhedron
            if any(v is not None and np.prod(_shape(v, k)) for v, k in ((self.l, "l"), (self.u, "u"))):
                raise ProblemError("l/u given without C")
        m = C.shape[0]
        l = _vector(self.l, "l", m, default=-np.inf, allow_inf=-1, rows=(C, "C", "l[i], u[i]", "lower", -1))
        u = _vector(self.u, "u", m, default=np.inf, allow_inf=1, rows=(C, "C", "l[i], u[i]", "upper", 1))
        check_order(l, u, "l", "u")
        lb = _vector(self.lb, "lb", n, default=-np.inf, allow_inf=-1, scalar=True)
        ub = _vector(self.ub, "ub", n, default=np.inf, allow_inf=1, scalar=True)
        check_order(lb, ub, "lb", "ub")
        _check_symmetric(P)  # always: solvers read one triangle each, so a non-symmetric P is ambiguous
        # psd_known: the construction decided convexity (False beyond the dense check's size: every backend
        # then runs the Lanczos check, as for check_psd=False; an indefinite sparse P of n 3,001 was SOLVED)
        object.__setattr__(self, "psd_known", bool(self.check_psd and _check_psd(P)))
        for k, v in dict(P=P, q=q, C=C, l=l, u=u, lb=lb, ub=ub).items():
            object.__setattr__(self, k, _read_only(v))

    # -- construction without re-validating P and C (hot paths: batches of projections)
    def with_vectors(self, *, validate: bool = True, **vectors: Any) -> QP:
        """Copy with some of ``q, l, u, lb, ub`` replaced; P and C are shared.

        ``validate=False`` skips the checks: for callers that validated a whole batch at once
        (float64 1-D arrays of the right sizes, infinities already mapped).
        """
        unknown = set(vectors) - {"q", "l", "u", "lb", "ub"}
        if unknown:
            raise ProblemError(f"with_vectors() takes q, l, u, lb, ub; got {sorted(unknown)}")
        new = object.__new__(QP)
        vals = {k: getattr(self, k) for k in ("q", "l", "u", "lb", "ub")}
        if validate:
            spec = {"q": (self.n, 0), "l": (self.m, -1), "u": (self.m, 1), "lb": (self.n, -1), "ub": (self.n, 1)}
            for k, v in vectors.items():  # a number stands for every bound, as in QP(lb=0)
                rows = (self.C, "C", "l[i], u[i]", "lower" if k == "l" else "upper", spec[k][1]) \
                    if k in ("l", "u") else None
                vals[k] = _read_only(_vector(v, k, spec[k][0], allow_inf=spec[k][1], scalar=k in ("lb", "ub"),
                                             cost=k == "q", rows=rows))
            check_order(vals["l"], vals["u"], "l", "u")
            check_order(vals["lb"], vals["ub"], "lb", "ub")
        else:
            vals.update({k: _read_only(v, own=False) for k, v in vectors.items()})
        for k, v in dict(P=self.P, C=self.C, check_psd=self.check_psd, psd_known=getattr(self, "psd_known", False),
                         **vals).items():
            object.__setattr__(new, k, v)
        return new

    # -- sizes and structure
    @property
    def n(self) -> int:
        """Number of variables."""
        return int(self.q.shape[0])

    @property
    def m(self) -> int:
        """Number of rows of C."""
        return int(self.C.shape[0])

    @functools.cached_property
    def is_sparse(self) -> bool:
        """True when P or C is a scipy.sparse matrix."""
        return sp.issparse(self.P) or sp.issparse(self.C)

    @functools.cached_property
    def eq_mask(self) -> np.ndarray:
        """Rows of C that are equalities (l == u)."""
        return _read_only(self.l == self.u)  # cached and shared by every reader: read-only, as the data

    @functools.cached_property
    def has_bounds(self) -> bool:
        """True when some variable bound is finite."""
        return bool(self.bounded.size)

    @functools.cached_property
    def bounded(self) -> np.ndarray:
        """Indices of the variables with a finite lower or upper bound."""
        return _read_only(np.flatnonzero(np.isfinite(self.lb) | np.isfinite(self.ub)))

    @functools.cached_property
    def memo(self) -> dict[Any, Any]:
        """Solver-ready forms of this problem, kept by the backends that made them.

        A QP never changes after construction, so a backend converts it once (keyed by the
        backend and whatever of its settings the conversion depends on) and repeated solves of the
        same problem reuse the conversion. Not pickled.
        """
        return {}

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "memo"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        _frozen_state(self, state)

    # -- evaluation
    def _point(self, x: Any) -> np.ndarray:
        """``x`` as a float64 vector of this problem's n entries (a ProblemError otherwise)."""
        arr = _asarray(x, "x")
        _check_numeric(arr, "x")
        if arr.shape != (self.n,):
            raise ProblemError(f"x must have shape ({self.n},) (the number of variables), got {arr.shape}")
        return np.asarray(arr, dtype=np.float64)

    def objective(self, x: np.ndarray) -> float:
        """½ xᵀPx + qᵀx."""
        x = self._point(x)
        return float(0.5 * x @ (self.P @ x) + self.q @ x)

    def primal_violation(self, x: np.ndarray) -> float:
        """Largest violation of the constraints at ``x`` (inf-norm; NaN x gives inf)."""
        x = self._point(x)
        if not np.all(np.isfinite(x)):
            return float("inf")
        v = 0.0
        if self.m:
            cx = self.C @ x
            v = max(v, float(np.max(np.maximum(cx - self.u, self.l - cx), initial=0.0)))
        v = max(v, float(np.max(np.maximum(x - self.ub, self.lb - x), initial=0.0)))
        return v

    # -- infeasibility certificates (used to confirm a solver's MAX_ITER as an infeasibility)
    def is_dual_infeasibility_certificate(self, d: np.ndarray, eps: float = 1e-6) -> bool:
        """True when ``d`` proves the objective unbounded below (dual infeasibility).

        ``P d ≈ 0``, ``qᵀd < 0`` and ``d`` a recession direction of the constraints (``(Cd)_i <= 0`` where
        ``u_i`` is finite, ``>= 0`` where ``l_i`` is finite; likewise for the bounds), with ``d`` scaled to
        ``||d||_inf = 1`` and each test relative to its data's own scale (tolerance ``eps``): ``|Pd|`` to
        ``max|P|``, ``qᵀd`` to ``max|q|``, ``(Cd)_i`` to row i's largest entry. In absolute terms a row
        scaled by 1e-6 passed any direction: ``d = −1`` "proved" ``min x, 1e-6 x >= 1e-6`` unbounded.
        """
        d = np.asarray(d, dtype=np.float64)
        nd = float(np.max(np.abs(d))) if d.size else 0.0
        if not np.isfinite(nd) or nd == 0.0:
            return False
        d = d / nd
        p_max = float(abs(self.P).max()) if self.P.size and (not sp.issparse(self.P) or self.P.nnz) else 0.0
        q_max = float(np.max(np.abs(self.q), initial=0.0))
        if float(np.max(np.abs(self.P @ d), initial=0.0)) > eps * p_max or float(self.q @ d) >= -eps * q_max:
            return False
        width = _row_max(self.C) if self.m else np.zeros(0)
        for v, w, lo, hi in ((self.C @ d if self.m else np.zeros(0), width, self.l, self.u),
                             (d, np.ones(self.n), self.lb, self.ub)):
            if np.any(v[np.isfinite(hi)] > eps * w[np.isfinite(hi)]) or \
                    np.any(v[np.isfinite(lo)] < -eps * w[np.isfinite(lo)]):
                return False
        return True

    def is_primal_infeasibility_certificate(self, y: np.ndarray, y_box: np.ndarray, eps: float = 1e-6) -> bool:
        """True when the multipliers ``(y, y_box)`` prove the constraints empty (Farkas).

        ``Cᵀy + y_box ≈ 0`` and ``uᵀy⁺ − lᵀy⁻ + ubᵀy_box⁺ − lbᵀy_box⁻ < 0``, with no weight on an infinite
        bound. Judged in forces: row i's multiplier times its largest entry (``y_box`` as it is), scaled to a
        largest force of 1; the residual against ``eps`` (so a row scaled by 1e-6 neither passes nor fails a
        certificate by its scale alone), the support below what that residual allows at the data's distances
        (invariant to a translation of x).
        """
        y = np.asarray(y, dtype=np.float64)
        yb = np.asarray(y_box, dtype=np.float64)
        width = _row_max(self.C) if self.m else np.zeros(0)
        width = np.where(width > 0, width, 1.0)  # a zero row (0·x <= −1) is a certificate on its own
        nf = float(np.max(np.abs(np.concatenate([y * width, yb])), initial=0.0))
        if not np.isfinite(nf) or nf == 0.0:
            return False
        y, yb = y / nf, yb / nf
        r = (self.C.T @ y if self.m else 0.0) + yb
        res = float(np.max(np.abs(r), initial=0.0))
        if res > eps:
            return False
        support, reach = 0.0, 1.0
        for mult, w, lo, hi in ((y, width, self.l, self.u), (yb, np.ones(self.n), self.lb, self.ub)):
            pos, neg = np.maximum(mult, 0.0), np.maximum(-mult, 0.0)
            if np.any((pos * w)[np.isposinf(hi)] > eps) or np.any((neg * w)[np.isneginf(lo)] > eps):
                return False
            fh, fl = np.isfinite(hi), np.isfinite(lo)
            support += float(hi[fh] @ pos[fh] - lo[fl] @ neg[fl])
            reach = max(reach, float(np.max(np.abs(hi[fh] / w[fh]), initial=0.0)),
                        float(np.max(np.abs(lo[fl] / w[fl]), initial=0.0)))
        # with Cᵀy + y_box = r, a point x of the constraints would give support >= rᵀx: the support must be
        # negative beyond what the residual can reach at the data's distances (``reach``, x's units), not
        # beyond a multiple of the bounds (which grew with a translation of x and refused exact certificates)
        return support < -(res + 1e-12) * reach

    def dense(self) -> QP:
        """The same problem with dense P and C."""
        if not self.is_sparse:
            return self
        new = self.with_vectors()
        # read-only as every QP's dense data (the problem is frozen; backends memoise what they derive from it)
        object.__setattr__(new, "P", _read_only(self.P.toarray()) if sp.issparse(self.P) else self.P)
        object.__setattr__(new, "C", _read_only(self.C.toarray()) if sp.issparse(self.C) else self.C)
        return new

    def __repr__(self) -> str:
        kind = "sparse" if self.is_sparse else "dense"
        return f"QP(n={self.n}, m={self.m}, equalities={int(self.eq_mask.sum())}, {kind})"


# --------------------------------------------------------------------------- Polyhedron
@dataclass(frozen=True, eq=False)
class Polyhedron:
    """Polyhedron ``{y : A y <= a, B y = b, lb <= y <= ub}``.

    Inequality rows are numbered in *inequality form*: first the rows of ``A``, then one row
    ``-y_i <= -lb_i`` per finite lower bound, then one row ``y_i <= ub_i`` per finite upper
    bound. Active-set masks (``ProjectionResult.active``) and :func:`polyproj.hs_jacobian` use this
    numbering; ``n_ineq`` is its length.

    Parameters
    ----------
    A : (m, n) array or sparse, optional;  a : (m,) array (``+inf`` allowed: row ignored)
    B : (p, n) array or sparse, optional;  b : (p,) array.  ``B`` must have full row rank, unless
        ``allow_dependent_rows``.
    lb, ub : (n,) arrays, optional
    n : int, optional
        Number of variables when neither A nor B is given.
    allow_dependent_rows : bool
        Accept rows of ``B`` that are linear combinations of the others, provided the equations are
        *consistent* (``b`` in the range of ``B``, to rounding at the data's scale; else the set is
        empty: :class:`ProblemError`). For sets whose structure implies the dependency — the ``2k``
        row and column sums of the Birkhoff polytope have rank ``2k − 1`` — written with all their
        rows. The rank is kept as :attr:`eq_rank`. Projections work on such a polyhedron (the polish
        factors dependent faces by the rank-revealing SVD; structured sets are recognised by
        :func:`pp.project`); the multipliers of dependent rows are then one choice among many.

    Examples
    --------
    >>> import numpy as np, polyproj as pp
    >>> simplex = pp.Polyhedron(B=np.ones((1, 3)), b=[1.0], lb=np.zeros(3))
    >>> simplex.n, simplex.n_ineq
    (3, 3)
    """

    A: Any = None
    a: Any = None
    B: Any = None
    b: Any = None
    lb: Any = None
    ub: Any = None
    n: int | None = None
    allow_dependent_rows: bool = field(default=False, kw_only=True)
    eq_rank: int = field(default=-1, init=False, repr=False)

    def __post_init__(self) -> None:
        n = self.n
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
                raise ProblemError(f"n must be a positive integer (the number of variables), got {n!r}")
            n = int(n)
        if not isinstance(self.allow_dependent_rows, (bool, np.bool_)):  # "no" is truthy: it allowed them
            raise ProblemError(f"allow_dependent_rows must be True or False, got {self.allow_dependent_rows!r}")
        for M, name in ((self.A, "A"), (self.B, "B")):
            if M is not None and n is None:
                shp = M.shape if sp.issparse(M) or hasattr(M, "shape") else np.shape(_asarray(M, name))
                if not len(shp):  # a scalar or a string: what is wrong is A (B) itself, not a missing n
                    _check_numeric(_asarray(M, name), name)
                    raise ProblemError(f"{name} must be a 2-D matrix, got shape {tuple(shp)}")
                n = int(shp[-1])
        for v, name in ((self.lb, "lb"), (self.ub, "ub")):
            shp = _shape(v, name) if v is not None and n is None else ()
            if shp:  # a scalar bound does not tell n
                n = int(np.prod(shp, dtype=np.int64))  # np.size would call a tensor's .size()
        if n is None or n <= 0:
            raise ProblemError("cannot tell the number of variables: give A, B, lb/ub or n")
        A = _matrix(self.A, "A", n)
        B = _matrix(self.B, "B", n)
        big_a = _row_max(A) if A is not None else np.zeros(0)  # each row's largest entry: read by two checks
        big_b = _row_max(B) if B is not None else np.zeros(0)
        _check_row_scale(big_a, "A")
        _check_row_scale(big_b, "B")
        if A is None:
            A = np.zeros((0, n))
            if self.a is not None and np.prod(_shape(self.a, "a")):
                raise ProblemError("a given without A")
        if B is None:
            B = np.zeros((0, n))
            if self.b is not None and np.prod(_shape(self.b, "b")):
                raise ProblemError("b given without B")
        a = _vector(self.a, "a", A.shape[0], default=np.inf if A.shape[0] == 0 else None, allow_inf=1,
                    rows=(A, "A", "a[i]", "", 1))
        b = _vector(self.b, "b", B.shape[0], default=0.0 if B.shape[0] == 0 else None, rows=(B, "B", "b[i]", "", 0))
        lb = _vector(self.lb, "lb", n, default=-np.inf, allow_inf=-1, scalar=True)
        ub = _vector(self.ub, "ub", n, default=np.inf, allow_inf=1, scalar=True)
        check_order(lb, ub, "lb", "ub")
        why = empty_row(np, big_a[:, None], a, big_b[:, None], b)  # zero rows, sparse or dense
        if why is not None:
            raise ProblemError(why)
        rank = B.shape[0]
        if B.shape[0] and B.shape[0] * n <= _RANK_CHECK_LIMIT:
            dep = _dependent_rows(B)
            if dep and not self.allow_dependent_rows:
                raise ProblemError(
                    f"B must have full row rank: rows {dep} of B are linearly dependent on the others "
                    "(remove them; if they are consistent they add nothing, if not the set is empty; or pass "
                    "allow_dependent_rows=True where the set's structure implies them)"
                )
            if dep:
                _check_consistent(B, b, dep)
            rank -= len(dep)
        for k, v in dict(A=A, a=a, B=B, b=b, lb=lb, ub=ub, n=n, eq_rank=rank).items():
            object.__setattr__(self, k, _read_only(v))

    def __setstate__(self, state: dict[str, Any]) -> None:
        _frozen_state(self, state)

    # -- sizes
    @property
    def m_ineq(self) -> int:
        """Rows of A."""
        return int(self.A.shape[0])

    @property
    def m_eq(self) -> int:
        """Rows of B."""
        return int(self.B.shape[0])

    @functools.cached_property
    def lb_idx(self) -> np.ndarray:
        """Indices of finite lower bounds (read-only: cached, and the inequality numbering of every result)."""
        return _read_only(np.flatnonzero(np.isfinite(self.lb)))

    @functools.cached_property
    def ub_idx(self) -> np.ndarray:
        """Indices of finite upper bounds (read-only: cached, and the inequality numbering of every result)."""
        return _read_only(np.flatnonzero(np.isfinite(self.ub)))

    @property
    def n_ineq(self) -> int:
        """Length of the inequality form: rows of A + finite lb + finite ub."""
        return self.m_ineq + self.lb_idx.size + self.ub_idx.size

    # -- dense views used by projection and the HS-Jacobian
    @functools.cached_property
    def A_dense(self) -> np.ndarray:
        """A as a dense array (read-only: cached and read by every later projection, as A itself)."""
        return _read_only(self.A.toarray()) if sp.issparse(self.A) else self.A

    @functools.cached_property
    def B_dense(self) -> np.ndarray:
        """B as a dense array (read-only: cached and read by every later projection, as B itself)."""
        return _read_only(self.B.toarray()) if sp.issparse(self.B) else self.B

    # -- conversions
    def constraint_form(self):
        """Return ``(C, l, u, lb, ub)`` of the canonical QP: C = [A; B], l = [-inf; b], u = [a; b]."""
        if sp.issparse(self.A) or sp.issparse(self.B):
            C = sp.vstack([sp.csc_matrix(self.A), sp.csc_matrix(self.B)], format="csc")
        else:
            C = np.vstack([self.A, self.B])
        l = np.concatenate([np.full(self.m_ineq, -np.inf), self.b])
        u = np.concatenate([self.a, self.b])
        return C, l, u, self.lb, self.ub

    def projection_qp(self, x: np.ndarray | None = None) -> QP:
        """The QP whose solution is the projection of ``x``: P = I, q = -x."""
        C, l, u, lb, ub = self.constraint_form()
        x = np.zeros(self.n) if x is None else self._points(x, "x", batch=False)
        if not np.isfinite(x).all():  # named as given: the QP's check named its q = -x
            raise ProblemError(f"x contains NaN or inf (first at index {int(np.flatnonzero(~np.isfinite(x))[0])})")
        eye = sp.identity(self.n, format="csc") if sp.issparse(C) else np.eye(self.n)
        qp = QP(P=eye, q=-np.asarray(x, dtype=np.float64), C=C, l=l, u=u, lb=lb, ub=ub, check_psd=False)
        return qp

    # -- evaluation (batched)
    def _points(self, Y: Any, name: str = "Y", batch: bool = True) -> np.ndarray:
        """``Y`` as float64 points of this set's n coordinates, shape (n,) (or (batch, n) where ``batch``).

        Real numbers only (a complex Y lost its imaginary part in the cast, silently), of the right width (a
        wrong one was NumPy's matmul ValueError), rectangular (a ragged list was NumPy's ValueError).
        """
        arr = _asarray(Y, name)
        _check_numeric(arr, name)
        if not (arr.shape == (self.n,) or (batch and arr.ndim == 2 and arr.shape[1] == self.n)):
            want = f"({self.n},) or (batch, {self.n})" if batch else f"({self.n},)"
            raise ProblemError(f"{name} must have shape {want} (the set's number of variables), got {arr.shape}")
        return np.asarray(arr, dtype=np.float64)

    def violation(self, Y: np.ndarray) -> np.ndarray:
        """Largest constraint violation of each row of ``Y`` ((n,) or (batch, n))."""
        Y = self._points(Y)
        Y2 = np.atleast_2d(Y)
        v = np.zeros(Y2.shape[0])
        if self.m_ineq:
            fin = np.isfinite(self.a)
            r = (self.A @ Y2.T).T[:, fin] - self.a[fin]
            v = np.maximum(v, np.max(r, axis=1, initial=0.0))
        if self.m_eq:
            v = np.maximum(v, np.max(np.abs((self.B @ Y2.T).T - self.b), axis=1))
        v = np.maximum(v, np.max(np.maximum(Y2 - self.ub, self.lb - Y2), axis=1, initial=0.0))
        v = np.where(np.all(np.isfinite(Y2), axis=1), v, np.inf)
        return v if Y.ndim == 2 else v[0]

    def ineq_slack(self, Y: np.ndarray) -> np.ndarray:
        """Slack ``rhs - row·y`` of every inequality row (compact numbering), shape (batch, n_ineq)."""
        from .polydata import RowLayout, ineq_slack

        Y2 = np.atleast_2d(self._points(Y))
        return ineq_slack(Y2, self.A_dense, self.a, self.lb, self.ub)[:, RowLayout.of(self).cols]

    def __repr__(self) -> str:
        return (f"Polyhedron(n={self.n}, inequalities={self.m_ineq}, equalities={self.m_eq}, "
                f"lower bounds={self.lb_idx.size}, upper bounds={self.ub_idx.size})")
