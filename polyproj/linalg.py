"""Batched Cholesky factorisation and solves, once for the array-API code (IPM, polish, HS-Jacobian).

Fast paths: torch (``cholesky_ex``, batched ``solve_triangular``; torch tensors never become NumPy
arrays) and NumPy (SciPy's LAPACK per matrix for a few matrices; for many, NumPy's batched Cholesky
gufunc, and solves by torch's batched ``solve_triangular`` on the same memory when torch is loaded
already: one call that releases the GIL; else substitution vectorised over the batch: NumPy has no
batched triangular solve, and an explicit inverse is not accurate enough for the ill-conditioned
systems at the end of an interior-point method). Other namespaces use the standard's
``linalg.cholesky`` / ``linalg.solve``.

A failed factorisation is reported per element (``ok`` False) with an identity factor in its place,
so that solves stay finite.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from array_api_compat import array_namespace, is_numpy_namespace, is_torch_namespace
from array_api_compat import device as _device

__all__ = ["SMALL", "TINY_ROW", "batched_solves", "cho_solve", "cholesky", "cumulative_sum", "eigh", "entrywise",
           "from_host", "holds", "host_copy", "identity_where", "in_chunks", "nnls", "require_int64", "row_norms",
           "small_cho_solve", "small_cholesky", "to_host", "tri_inv"]

_FEW = 8  # up to this many matrices NumPy solves call LAPACK per matrix
#: NumPy batches without torch solve by substitution over the batch, a pass per row: worth it up to this order
SUBSTITUTION_ROWS = 16

try:  # NumPy's batched Cholesky gufunc (what np.linalg.cholesky calls), for its ``out=``
    from numpy.linalg._umath_linalg import cholesky_lo as _CHOLESKY_LO
except ImportError:  # pragma: no cover - every NumPy since 1.8 has it
    _CHOLESKY_LO = None


def nnls(A: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """``min ||A x − b|| over x >= 0``, as ``(x, ||A x − b||)`` (``scipy.optimize.nnls``'s answer).

    The problem always has a solution (a convex quadratic bounded below on a closed convex cone). SciPy
    1.12–1.14's ``nnls`` (the declared floor is SciPy 1.13) raises on rank-deficient ``A`` — "Matrix is
    singular", "Maximum number of iterations reached" — e.g. for the rows ``[G; B; −B]`` of an equality. Then
    the same problem is solved by bounded-variable least squares (``lsq_linear``, BVLS: an active-set method
    on least-squares subproblems, which tolerates dependent columns), its residual norm taken from its ``x``.
    """
    from scipy.optimize import lsq_linear
    from scipy.optimize import nnls as _nnls

    try:
        x, rnorm = _nnls(A, b)
        return x, float(rnorm)
    except (RuntimeError, np.linalg.LinAlgError):
        x = lsq_linear(A, b, bounds=(0.0, np.inf), method="bvls", tol=1e-15, lsmr_tol="auto").x
        x = np.maximum(x, 0.0)
        return x, float(np.linalg.norm(A @ x - b))


#: A nonzero row of a Polyhedron whose largest entry is below this is refused (``problem.Polyhedron``): its squared
#: norm underflows (below ~1e-154), so the solvers' tolerances and the polish's normalisation would take it for a
#: zero row and drop its constraint (a row [1e-200, 0, ...] <= 0 was ignored by every backend).
TINY_ROW = 1e-100


def row_norms(xp: Any, rows: Any) -> Any:
    """Euclidean norms of ``rows`` along the last axis, without overflow or underflow of the squares.

    ``sqrt(Σ r_j²)`` is inf once an entry passes sqrt(max) (1.3e154 in float64, 1.8e19 in float32) and loses its
    digits or vanishes once the entries fall below sqrt(smallest normal) (1.5e-154, 1.1e-19): a row then reads as a
    zero row and its constraint is dropped. The rows are finite (validated), so such norms are recomputed as
    ``b ||r / b||`` with ``b = max|r_j|`` (the entries of ``r / b`` are at most 1, the largest is 1).
    """
    with np.errstate(over="ignore", under="ignore"):  # NumPy's warnings of what this handles
        norms = xp.linalg.vector_norm(rows, axis=-1)
    if rows.shape[-1] == 0 or any(int(d) == 0 for d in rows.shape[:-1]):
        return norms
    fi = xp.finfo(rows.dtype)
    tiny = float(getattr(fi, "smallest_normal", None) or fi.tiny) ** 0.5
    bad = ~xp.isfinite(norms)
    # underflow needs entries below sqrt(smallest normal): validated rows have a largest entry of at least TINY_ROW
    # (1e-100), above float64's 1.5e-154, so only lower precisions (float32: 1.1e-19) are checked (the check reads
    # every entry once more: padding rows and zero rows have norm 0 too)
    small = norms < tiny if tiny > TINY_ROW else xp.zeros_like(bad)
    if not bool(xp.any(bad | small)):
        return norms
    big = xp.max(xp.abs(rows), axis=-1)
    redo = bad | (small & (big > 0))  # a zero row's norm is 0 already
    if not bool(xp.any(redo)):
        return norms
    safe = xp.where(big > 0, big, xp.ones_like(big))
    return xp.where(redo, xp.linalg.vector_norm(rows / safe[..., None], axis=-1) * big, norms)


def cumulative_sum(xp: Any, x: Any, axis: int | None = None) -> Any:
    """``xp.cumulative_sum(x, axis=axis)``, for every namespace polyproj passes, the bare ``numpy`` module included.

    ``cumulative_sum`` is the array API's (2023.12); the ``numpy`` module has it from NumPy 2.1 only, and the
    declared floor is NumPy 2.0, where polyproj's NumPy paths pass ``numpy`` itself as ``xp``. On NumPy arrays
    it is ``np.cumsum`` (the same running sums, same dtype; ``axis=None`` only for 1-D input, as the standard).
    """
    if is_numpy_namespace(xp):
        return np.cumsum(x, axis=axis)
    return xp.cumulative_sum(x, axis=axis)


def cholesky(xp: Any, K: Any, out: Any = None) -> tuple[Any, Any]:
    """Lower Cholesky factors ``L`` (b, n, n) of a batch and ``ok`` (b,): False where K is not PD.

    Only the lower triangle of ``K`` is read. ``out`` (NumPy batches of more than a few; the shape
    and dtype of ``K``) receives the factors: a caller that factors batches of one shape again and
    again (the IPM) reuses one buffer instead of a fresh allocation per call (a (512, 100, 100)
    batch is 40 MB, above glibc's largest mmap threshold: a fresh one costs ~10k page faults).
    """
    b, n = K.shape[0], K.shape[-1]
    if is_numpy_namespace(xp) and b > _FEW and _CHOLESKY_LO is not None and K.dtype in (np.float64, np.float32):
        return _cholesky_gufunc(K, np.empty_like(K) if out is None else out)
    if is_torch_namespace(xp):  # torch's own kernel: tensors never become NumPy arrays
        L, info = xp.linalg.cholesky_ex(K)
        ok = info == 0
        return identity_where(xp, ok, L, own=True), ok
    if is_numpy_namespace(xp) and b <= _FEW:  # a few matrices: LAPACK per matrix (the solves use the
        from scipy.linalg import lapack  # same LAPACK: an IPM near its end is sensitive to the pairing)

        potrf = lapack.dpotrf if K.dtype == np.float64 else lapack.spotrf
        L = np.empty_like(K)
        ok = np.ones(b, dtype=bool)
        for i in range(b):
            Li, info = potrf(K[i], lower=1, clean=1, overwrite_a=0)
            ok[i] = info == 0
            L[i] = Li if info == 0 else np.eye(n, dtype=K.dtype)
        return L, ok
    try:
        L = xp.linalg.cholesky(K)
        ok = xp.all(xp.isfinite(xp.reshape(L, (b, -1))), axis=1)
        return identity_where(xp, ok, L, own=True), ok
    except Exception:  # NumPy (and array_api_strict) fail the whole batch: find the culprits
        if is_numpy_namespace(xp):
            L = np.empty_like(K)
            ok = np.ones(b, dtype=bool)
            for i in range(b):
                try:
                    L[i] = np.linalg.cholesky(K[i])
                except np.linalg.LinAlgError:
                    L[i], ok[i] = np.eye(n, dtype=K.dtype), False
            return L, ok
        # other namespaces (array_api_strict; CuPy under errstate(linalg="raise")): the failed elements only are
        # marked, not the whole batch (a face is called dependent, an IPM step refused, only where its own
        # factorisation fails). Small matrices by the entrywise recurrence (one array operation per entry over the
        # batch), larger ones one at a time
        if n <= SUBSTITUTION_ROWS:
            return small_cholesky(xp, K)
        eye = xp.eye(n, dtype=K.dtype, device=_device(K))
        rows, oks = [], []
        for i in range(b):
            try:
                Li = xp.linalg.cholesky(K[i, ...])
                good = bool(xp.all(xp.isfinite(Li)))
            except Exception:  # this element is not positive definite
                Li, good = eye, False
            rows.append(Li if good else eye)
            oks.append(good)
        return xp.stack(rows, axis=0), xp.asarray(oks, dtype=xp.bool, device=_device(K))


#: largest batch one batched eigendecomposition (or SVD) call takes: torch.linalg.eigh on CUDA (cuSOLVER's
#: batched syev, torch 2.11 + CUDA 13, an H200) fails with CUSOLVER_STATUS_INTERNAL_ERROR from 65,536
#: matrices of size 7 and asks for 139 GiB of workspace at 262,144 (~0.5 MiB a matrix);
#: benchmarks/gpu_probe.py. 8,192 keeps the workspace near 4 GiB.
EIGH_CHUNK = 1 << 13


def in_chunks(xp: Any, f: Any, S: Any) -> tuple[Any, ...]:
    """``f(S)`` (a tuple of batched arrays) for a batch (b, ...), in calls of at most :data:`EIGH_CHUNK`."""
    b = S.shape[0]
    if b <= EIGH_CHUNK:
        return tuple(f(S))
    parts = [tuple(f(S[i:i + EIGH_CHUNK, ...])) for i in range(0, b, EIGH_CHUNK)]
    return tuple(xp.concat([p[j] for p in parts], axis=0) for j in range(len(parts[0])))


def eigh(xp: Any, S: Any) -> tuple[Any, Any]:
    """``xp.linalg.eigh`` of a batch (b, m, m), in calls of at most :data:`EIGH_CHUNK` matrices."""
    return in_chunks(xp, xp.linalg.eigh, S)


def identity_where(xp: Any, ok: Any, L: Any, *, own: bool = False) -> Any:
    """``L`` (b, n, n) with the identity in place of the matrices where ``ok`` (b,) is False.

    ``own``: ``L`` is the caller's own array (a fresh factorisation), overwritten at the failed matrices
    only (torch and NumPy, outside an autograd graph); otherwise a new array. A batch where most
    matrices are fine then costs a write of the few that failed, not a copy of the whole batch.
    """
    if bool(xp.all(ok)):
        return L
    n = L.shape[-1]
    eye = xp.eye(n, dtype=L.dtype, device=_device(L))
    if own and ((is_torch_namespace(xp) and not L.requires_grad) or isinstance(L, np.ndarray)):
        L[~ok] = eye
        return L
    return xp.where(ok[:, None, None], L, xp.broadcast_to(eye, L.shape))


def _cholesky_gufunc(K: np.ndarray, L: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NumPy's batched Cholesky gufunc into ``L``; a failed element gets the identity.

    Called straight, a failed element comes back as NaN (np.linalg.cholesky raises for the whole
    batch instead, and the culprits must then be found one by one).
    """
    with np.errstate(invalid="ignore"):
        _CHOLESKY_LO(K, out=L, signature="d->d" if K.dtype == np.float64 else "f->f")
    # a NaN or inf anywhere in a row reaches that row's pivot: the diagonal tells
    ok = np.isfinite(np.diagonal(L, axis1=1, axis2=2)).all(axis=1)
    return identity_where(np, ok, L, own=True), ok


def cho_solve(xp: Any, L: Any, R: Any) -> Any:
    """``X`` with ``L Lᵀ X = R``: ``L`` (b, n, n) lower triangular, ``R`` (b, n) or (b, n, k)."""
    vec = R.ndim == 2
    R3 = R[:, :, None] if vec else R
    if is_torch_namespace(xp):
        Y = xp.linalg.solve_triangular(L, R3, upper=False)  # ~4x faster than cholesky_solve on CPU
        X = xp.linalg.solve_triangular(L.mT, Y, upper=True)
    elif is_numpy_namespace(xp):
        X = _cho_solve_numpy(L, R3)
    else:
        X = xp.linalg.solve(xp.matrix_transpose(L), xp.linalg.solve(L, R3))
    return X[:, :, 0] if vec else X


def _cho_solve_numpy(L: np.ndarray, R: np.ndarray) -> np.ndarray:
    n = L.shape[-1]
    b = max(L.shape[0], R.shape[0])
    if b <= _FEW:  # a few matrices: LAPACK's triangular solves, one matrix at a time
        from scipy.linalg import solve_triangular

        L = np.broadcast_to(L, (b, n, n))
        X = np.empty((b, *R.shape[1:]), dtype=R.dtype)
        for i in range(b):
            y = solve_triangular(L[i], R[i if R.shape[0] > 1 else 0], lower=True, check_finite=False)
            X[i] = solve_triangular(L[i], y, lower=True, trans="T", check_finite=False)
        return X
    solve_tri = _torch_solve_triangular()
    if solve_tri is not None and L.dtype == R.dtype and L.dtype in (np.float32, np.float64):
        # torch is loaded already (never imported for this): its batched triangular solves on the same
        # memory, one call each that releases the GIL (docs/performance.md)
        from_numpy = sys.modules["torch"].from_numpy
        Lt, Rt = (from_numpy(own_contiguous(a)) for a in (L, R))
        return solve_tri(Lt.mT, solve_tri(Lt, Rt, upper=False), upper=True).numpy()
    # forward then backward substitution, one row at a time for all elements
    Y = np.empty(np.broadcast_shapes(L.shape[:-2], R.shape[:-2]) + R.shape[-2:], dtype=R.dtype)
    d = np.diagonal(L, axis1=-2, axis2=-1)[..., None]
    for i in range(n):
        Y[:, i, :] = (R[:, i, :] - (L[:, i : i + 1, :i] @ Y[:, :i, :])[:, 0, :]) / d[:, i]
    X = np.empty_like(Y)
    for i in range(n - 1, -1, -1):
        X[:, i, :] = (Y[:, i, :] - (L[:, i + 1 :, i : i + 1].mT @ X[:, i + 1 :, :])[:, 0, :]) / d[:, i]
    return X


def _torch_solve_triangular() -> Any:
    """The batched ``torch.linalg.solve_triangular`` when torch is loaded already (never imported for it), else None."""
    return getattr(getattr(sys.modules.get("torch"), "linalg", None), "solve_triangular", None)


def batched_solves(b: int, n: int) -> bool:
    """True when :func:`cho_solve` of ``b`` NumPy factors of order ``n`` beats LAPACK called per matrix.

    More than a few matrices, and torch's batched triangular solves at hand or an order small enough for the
    substitution (:data:`SUBSTITUTION_ROWS`). Measured (factorisation and two solves, one thread, torch
    loaded), against LAPACK per matrix: 128 systems of order 10 0.73 -> 0.24 ms, 64 of 30 0.68 -> 0.37 ms,
    16 of 47 0.30 -> 0.27 ms.
    """
    return b > _FEW and 0 < n and (n <= SUBSTITUTION_ROWS or _torch_solve_triangular() is not None)


def own_contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` C-contiguous and writeable, copied if needed.

    For a library that writes into or shares the buffer it is given: DAQP's typed memoryviews refuse read-only
    memory, torch.from_numpy / torch.asarray warn on it; a problem's own arrays are read-only
    (:func:`polyproj.problem._read_only`).
    """
    a = np.ascontiguousarray(a)
    return a if a.flags.writeable else a.copy()


def to_host(v: Any) -> np.ndarray:
    """A float64 NumPy array of an array of any namespace and device (:func:`host_copy`, then float64).

    Not always a copy: a float64 NumPy array, or a float64 torch tensor on the CPU, may come back as a view.
    """
    return np.asarray(host_copy(v), dtype=np.float64)


def from_host(a: np.ndarray, like: Any) -> Any:
    """``a`` in the namespace, device and dtype of ``like``."""
    if isinstance(like, np.ndarray):
        return np.asarray(a, dtype=like.dtype)
    return array_namespace(like).asarray(np.ascontiguousarray(a), dtype=like.dtype, device=_device(like))


def host_copy(v: Any) -> np.ndarray:
    """A NumPy array of ``v`` (any namespace and device), its dtype kept: one explicit transfer.

    ``np.asarray`` is refused by arrays off the host (CuPy raises TypeError, ``array_api_strict`` off its CPU
    device RuntimeError), so the transfer is asked for by name: torch ``.cpu()``, CuPy ``.get()``, else DLPack
    (a copy to the host where the producer supports it), ``np.asarray`` last.
    """
    if isinstance(v, np.ndarray):
        return v
    if not hasattr(v, "__dlpack__") and not hasattr(v, "__array_namespace__"):  # lists, numbers: NumPy reads them
        return np.asarray(v)
    if hasattr(v, "detach") and hasattr(v, "cpu"):  # torch
        return v.detach().cpu().numpy()
    if type(v).__module__.split(".")[0] == "cupy":
        return v.get()
    for kw in ({"device": "cpu", "copy": True}, {}):
        try:
            return np.from_dlpack(v, **kw)
        except Exception:  # a producer without that DLPack path (or without its keywords): the next way
            continue
    return np.asarray(v)


#: (namespace, device, dtype) known to be held (:func:`holds`)
_HELD: set = set()


def holds(xp: Any, dtype: Any, device: Any) -> bool:
    """Whether ``device`` holds arrays of ``dtype`` (torch's MPS has no float64; a JAX-like device no int64).

    Asked of the device itself, by making a 0-d array (any namespace: the standard has no such query before
    2023.12's ``__array_namespace_info__().dtypes(device=...)``, which not every library implements).
    """
    key = (getattr(xp, "__name__", ""), str(device), str(dtype))
    if key in _HELD:  # asked once per namespace, device and dtype
        return True
    try:
        xp.zeros((), dtype=dtype, device=device)
    except Exception:  # torch's MPS: TypeError; array_api_strict: ValueError; others: RuntimeError
        return False
    _HELD.add(key)
    return True


def require_int64(xp: Any, X: Any, what: str) -> None:
    """ProblemError unless X's device holds int64: polyproj indexes (``nonzero``, ``take``, counts) in int64.

    Asked before any work: a device without int64 (``array_api_strict``'s ``"no_x64"``, JAX without x64) cannot
    hold the indices.
    """
    dev = _device(X)
    if not holds(xp, xp.int64, dev):
        from .errors import ProblemError

        raise ProblemError(f"{what}: the device {dev} has no int64 arrays, which polyproj's array code needs "
                           "for its indices: use a device (or a configuration) with 64-bit integers")


#: matrices up to this order may be factored entry by entry (:func:`small_cholesky`)
SMALL = 8


def entrywise(b: int, n: int) -> bool:
    """True when a batch of ``b`` matrices ``n × n`` is factored faster entry by entry than per matrix.

    The entrywise recurrence costs a fixed ``O(n³)`` array operations (≈ 0.1–0.3 ms each at any batch
    up to ~1e5), LAPACK a call per matrix (≈ 0.3–0.6 µs each for ``n <= 8``): the crossover, measured on
    torch CPU, lies near ``b ≈ 250 n``.
    """
    return n <= SMALL and b >= 256 * n


def small_cholesky(xp: Any, K: Any) -> tuple[Any, Any]:
    """:func:`cholesky` of a large batch of small matrices, one array operation over the batch per step.

    The unblocked Cholesky–Banachiewicz recurrence ``l_jj = √(k_jj − Σ_p l_jp²)``,
    ``l_ij = (k_ij − Σ_p l_ip l_jp) / l_jj`` written on the entries ``K[:, i, j]`` (each a vector over the
    batch): ``n(n+1)/2`` entries of a few operations each instead of one LAPACK call per matrix (same
    arithmetic as LAPACK's unblocked kernel). A pivot that is not positive (or NaN) marks the matrix as
    failed (``ok`` False); its factor is the identity. Only the lower triangle of ``K`` is read.
    """
    b, n = K.shape[0], K.shape[-1]
    tiny = float(np.finfo(np.float32 if K.dtype == xp.float32 else np.float64).tiny)
    F = xp.zeros((b, n, n), dtype=K.dtype, device=_device(K))
    L: list[list[Any]] = [[None] * n for _ in range(n)]
    low = None  # the smallest pivot (NaN propagates)
    for j in range(n):
        d = K[:, j, j]
        for p in range(j):
            d = d - L[j][p] * L[j][p]
        low = d if low is None else xp.minimum(low, d)
        ljj = xp.sqrt(xp.clip(d, min=tiny))  # finite for a failed pivot: that factor is replaced below
        L[j][j] = F[:, j, j] = ljj
        inv = 1.0 / ljj
        for i in range(j + 1, n):
            e = K[:, i, j]
            for p in range(j):
                e = e - L[i][p] * L[j][p]
            L[i][j] = F[:, i, j] = e * inv
    if low is None:  # n = 0: empty factors, nothing can fail
        return F, xp.ones((b,), dtype=xp.bool, device=_device(K))
    ok = low > 0
    return identity_where(xp, ok, F, own=True), ok


def small_cho_solve(xp: Any, L: Any, r: Any) -> Any:
    """``x`` (b, n) with ``L Lᵀ x = r`` for a batch of small factors (as :func:`small_cholesky`).

    Forward and backward substitution on the entries, one array operation over the batch per term.
    """
    n = L.shape[-1]
    if n == 0:
        return r[:, :0]
    inv = [1.0 / L[:, i, i] for i in range(n)]
    y: list[Any] = []
    for i in range(n):
        e = r[:, i]
        for p in range(i):
            e = e - L[:, i, p] * y[p]
        y.append(e * inv[i])
    x: list[Any] = [None] * n
    for i in range(n - 1, -1, -1):
        e = y[i]
        for p in range(i + 1, n):
            e = e - L[:, p, i] * x[p]
        x[i] = e * inv[i]
    return xp.stack(x, axis=1)


def tri_inv(xp: Any, L: Any) -> Any:
    """``L⁻¹`` for a batch of lower-triangular matrices."""
    eye = xp.eye(L.shape[-1], dtype=L.dtype, device=_device(L))
    if is_torch_namespace(xp):
        return xp.linalg.solve_triangular(L, xp.broadcast_to(eye, L.shape), upper=False)
    if is_numpy_namespace(xp):  # forward substitution vectorised over the batch (batched LU is ~3x slower)
        b, k, _ = L.shape
        X = np.zeros_like(L)
        d = np.diagonal(L, axis1=1, axis2=2)
        for i in range(k):
            r = -np.matmul(L[:, i:i + 1, :i], X[:, :i, :])[:, 0, :] if i else np.zeros((b, k), dtype=L.dtype)
            r[:, i] += 1.0
            X[:, i, :] = r / d[:, i:i + 1]
        return X
    return xp.linalg.solve(L, xp.broadcast_to(eye, L.shape))
