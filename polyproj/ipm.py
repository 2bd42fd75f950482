"""Batched Mehrotra predictor–corrector primal–dual interior-point method on the array API.

One implementation, written against the array API standard (``array_api_compat.array_namespace``),
runs on NumPy, PyTorch (CPU or CUDA, no copy), CuPy and ``array_api_strict``. It solves a batch of
convex QPs in the canonical form of DESIGN §2::

    minimize ½ xᵀPx + qᵀx   subject to   l <= C x <= u,   lb <= x <= ub

with a leading batch dimension on ``q, l, u, lb, ub`` (and on ``P, C`` when given per sample).

Method
------
Stack the constraints as ``G = [C; I]`` with bounds ``L = [l; lb]``, ``U = [u; ub]``. Rows with
``L_i == U_i`` are equalities (multiplier ``y`` free); every other finite side gets a slack and a
multiplier: ``G x − L = s_l ≥ 0`` (``z_l ≥ 0``), ``U − G x = s_u ≥ 0`` (``z_u ≥ 0``). With the
combined multiplier ``z = z_u − z_l (+ y)`` stationarity reads ``P x + q + Gᵀz = 0`` — exactly the
polyproj sign convention. Each iteration eliminates slacks and inequality multipliers and solves
the regularised reduced KKT system

    [K_γ   G_eᵀ] [dx]   [r₁ + γ G_eᵀ r₂]       K_γ = P + Gᵀ D G + γ G_eᵀG_e + ρ I,
    [G_e   −δ I] [dy] = [r₂           ],       D = z_l/s_l + z_u/s_u,

by a batched Cholesky factorisation of ``K_γ`` (n × n per element) and of the Schur complement
``G_e K_γ⁻¹ G_eᵀ + δ I`` on the equality rows (``γ`` is an augmented-Lagrangian term that keeps
``K_γ`` definite when equalities fix free directions; ``ρ`` and ``δ`` are tiny primal/dual
regularisations, so rank-deficient equalities and LPs are handled). The affine (predictor)
direction sets the centring ``σ = (μ_aff/μ)³`` and the corrector adds the second-order term
``Δs_aff ∘ Δz_aff`` (Mehrotra). Data are equilibrated (Ruiz) beforehand.

Stopping (per element, on the *unscaled* problem, qpbenchmark's definitions):

    ‖max(Cx − u, l − Cx, x − ub, lb − x, 0)‖∞ <= ε_abs + ε_rel max(‖Cx‖∞, ‖x‖∞)
    ‖Px + q + Cᵀz + z_box‖∞                   <= ε_abs + ε_rel max(‖Px‖∞, ‖q‖∞, ‖Cᵀz‖∞, ‖z_box‖∞)
    |xᵀPx + qᵀx + uᵀz⁺ − lᵀz⁻ + ubᵀz_box⁺ − lbᵀz_box⁻| <= ε_abs + ε_rel max(|xᵀPx|, |qᵀx|, ...)

Infeasibility: the Newton direction of a primal infeasible element converges to a Farkas
certificate ``δz`` with ``Cᵀδz + δz_box ≈ 0`` and ``uᵀδz⁺ − lᵀδz⁻ + … < 0``; that of a dual
infeasible (unbounded) one to ``δx`` with ``Pδx ≈ 0``, ``qᵀδx < 0`` and ``Cδx`` in the recession
cone of ``[l, u]``. Both are checked on every element at every iteration; a certified element is
frozen with status PRIMAL_INFEASIBLE / DUAL_INFEASIBLE and NaN primal values, without touching the
other elements. A non-finite iterate is NUMERICAL_ERROR; nothing non-finite is ever SOLVED.

Everything shared across the batch (P, C, the scaling, the equality pattern) is prepared once; the
per-element work is batched linear algebra (one GEMM for ``Cᵀ D C`` when C is shared, batched
Cholesky), with no Python loop over the batch.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from array_api_compat import array_namespace, is_numpy_namespace, is_torch_namespace
from array_api_compat import device as _device

from .errors import ProblemError
from .linalg import cho_solve, cholesky
from .problem import _INF_THRESHOLD
from .solution import Status

__all__ = ["CODES", "IPMResult", "code_to_status", "solve_qp_batch"]

# |bound| >= 1e20 means no bound, as everywhere in polyproj; the IPM also reads bounds within a
# relative 1e-9 of it (data files write -1e20 as -9.999999999999998e19) as absent: such a "finite"
# side gives a slack of 1e20 that wrecks the starting point and mu, and it can never be active
_INF = _INF_THRESHOLD * (1.0 - 1e-9)

#: integer status codes of :class:`IPMResult.status`
CODES: dict[str, int] = {
    "SOLVED": 0,
    "SOLVED_INACCURATE": 1,
    "PRIMAL_INFEASIBLE": 2,
    "DUAL_INFEASIBLE": 3,
    "MAX_ITER": 4,
    "NUMERICAL_ERROR": 5,
    "TIME_LIMIT": 6,
}
_RUNNING = -1
#: debugging hook: ``_TRACE(it, namespace)`` is called once per iteration when set (None: no cost)
_TRACE = None
#: refinement steps stop once every running element's Newton residual is below this, relative
_REFINE_TOL = 1e-10
_STATUS_OF_CODE = {v: Status[k] for k, v in CODES.items()}


def code_to_status(code: int) -> Status:
    """Map an integer code of :attr:`IPMResult.status` to :class:`polyproj.Status`."""
    return _STATUS_OF_CODE.get(int(code), Status.NUMERICAL_ERROR)


def _host_list(a: Any) -> list:
    """Small array -> Python list (one device sync)."""
    if hasattr(a, "tolist"):
        return a.tolist()
    return [a[i].__index__() if hasattr(a[i], "__index__") else float(a[i]) for i in range(a.shape[0])]


@dataclass(frozen=True)
class IPMResult:
    """Result of :func:`solve_qp_batch`; every array is in the namespace and on the device of the input.

    Attributes
    ----------
    x : (b, n)
        Primal solutions (NaN for PRIMAL_INFEASIBLE, DUAL_INFEASIBLE and NUMERICAL_ERROR elements).
    z : (b, m)
        Multipliers of ``l <= Cx <= u`` (``z > 0``: upper side active, ``z < 0``: lower side).
    z_box : (b, n)
        Multipliers of ``lb <= x <= ub``; ``Px + q + Cᵀz + z_box = 0``.
    status : (b,) int array
        Codes of :data:`CODES`; :meth:`statuses` maps them to :class:`polyproj.Status`.
    iterations : (b,) int array
        Iterations each element took.
    prim_res, dual_res, gap : (b,)
        Unscaled primal residual, dual residual and duality gap at the returned point.
    """

    x: Any
    z: Any
    z_box: Any
    status: Any
    iterations: Any
    prim_res: Any = field(default=None, repr=False)
    dual_res: Any = field(default=None, repr=False)
    gap: Any = field(default=None, repr=False)

    def statuses(self) -> tuple[Status, ...]:
        """The statuses as :class:`polyproj.Status` (one host transfer of the code array)."""
        return tuple(code_to_status(c) for c in _host_list(self.status))


# ============================================================================ linear algebra
class _Linalg:
    """Batched SPD factor/solve for the IPM.

    :mod:`polyproj.linalg` (Cholesky) on torch and NumPy; other namespaces keep ``K`` and use the
    standard ``linalg.solve`` (it cannot report failures per element, so ``ok`` is all True there).
    """

    def __init__(self, xp: Any) -> None:
        self.xp = xp
        self.kind = "torch" if is_torch_namespace(xp) else "numpy" if is_numpy_namespace(xp) else "generic"

    def factor(self, K: Any, out: Any = None) -> tuple[Any, Any]:
        """Return (factor, ok) with ok a (b,) bool array (False where K is not numerically PD).

        ``out``: a NumPy buffer of K's shape that receives the factor (see :func:`polyproj.linalg.cholesky`).
        """
        if self.kind == "generic":
            return K, self.xp.ones(K.shape[0], dtype=self.xp.bool, device=_device(K))
        return cholesky(self.xp, K, out=out)

    def solve(self, F: Any, R: Any) -> Any:
        """Solve ``K X = R`` for R (b, n, k) with the factor of :meth:`factor` (or an :class:`_EigFactor`)."""
        if isinstance(F, _EigFactor):
            return F.V @ ((F.V.mT @ R) / (F.lam[None, :, None] + F.shift[:, None, None]))
        if self.kind == "generic":
            return self.xp.linalg.solve(F, R)
        return cho_solve(self.xp, F, R)


@dataclass(frozen=True)
class _EigFactor:
    """``K_i⁻¹ = V diag(1 / (lam + shift_i)) Vᵀ`` for every element i: one eigendecomposition for a batch."""

    V: Any
    lam: Any
    shift: Any


_EIG_MIN_BATCH = 32  # one n x n eigendecomposition costs about as much as ~30 Cholesky factorisations


# ============================================================================ helpers
def _mv(M: Any, v: Any) -> Any:
    """(1|b, r, n) matrix times (b, n) vectors -> (b, r); one GEMM when M is shared."""
    if M.shape[0] == 1:
        return v @ M[0, ...].mT
    return (M @ v[..., None])[..., 0]


def _rmv(M: Any, w: Any) -> Any:
    """Transposed product: (1|b, r, n)ᵀ times (b, r) -> (b, n)."""
    if M.shape[0] == 1:
        return w @ M[0, ...]
    return (M.mT @ w[..., None])[..., 0]


def _inf_norm(xp: Any, v: Any) -> Any:
    if v.shape[-1] == 0:
        return xp.zeros(v.shape[:-1], dtype=v.dtype, device=_device(v))
    return xp.max(xp.abs(v), axis=-1)


def _add_diag(xp: Any, K: Any, d: Any) -> Any:
    """K + diag(d) for K (b, n, n), d (b, n)."""
    n = K.shape[-1]
    if is_torch_namespace(xp):
        K = K.clone()
        K.diagonal(dim1=-2, dim2=-1).add_(d)
        return K
    return K + xp.eye(n, dtype=K.dtype, device=_device(K))[None, ...] * d[:, :, None]


def _as3(xp: Any, M: Any, rows: int, n: int, name: str) -> Any:
    if M.ndim == 2:
        if M.shape != (rows, n):
            raise ProblemError(f"{name} must have shape ({rows}, {n}) or (batch, {rows}, {n}), got {tuple(M.shape)}")
        return M[None, ...]
    if M.ndim == 3 and M.shape[1:] == (rows, n):
        return M
    raise ProblemError(f"{name} must have shape ({rows}, {n}) or (batch, {rows}, {n}), got {tuple(M.shape)}")


def _as_batch_vec(xp: Any, v: Any, b: int, size: int, name: str, fill: float, dtype: Any, dev: Any) -> Any:
    if v is None:
        return xp.full((b, size), fill, dtype=dtype, device=dev)
    v = xp.astype(v, dtype) if v.dtype != dtype else v
    if v.ndim == 1 and v.shape[0] == size:
        return xp.broadcast_to(v[None, :], (b, size))
    if v.ndim == 2 and v.shape == (b, size):
        return v
    raise ProblemError(f"{name} must have shape ({size},) or ({b}, {size}), got {tuple(v.shape)}")


def _detach(a: Any) -> Any:
    return a.detach() if hasattr(a, "detach") else a


# ============================================================================ public entry point
def solve_qp_batch(
    P: Any,
    q: Any,
    C: Any,
    l: Any,
    u: Any,
    lb: Any = None,
    ub: Any = None,
    *,
    eps_abs: float = 1e-8,
    eps_rel: float = 0.0,
    max_iter: int = 100,
    warm_start: Any = None,
    time_limit: float | None = None,
    ruiz_iter: int = 10,
    batch_chunk: int | None = None,
    threads: int | None = 1,
) -> IPMResult:
    """Solve a batch of convex QPs ``min ½xᵀPx + qᵀx s.t. l <= Cx <= u, lb <= x <= ub``.

    Parameters
    ----------
    P : (n, n) or (b, n, n) array
        Symmetric PSD (not checked here: the backend and :class:`polyproj.QP` check it).
    q : (b, n) array
        ``(n,)`` is read as a batch of one.
    C : (m, n) or (b, m, n) array, or None (no rows)
    l, u : (m,) or (b, m) arrays, or None (±inf)
        ``±inf`` or ``|v| >= 1e20`` means no bound; ``l_i == u_i`` is an equality.
    lb, ub : (n,) or (b, n) arrays, optional
    eps_abs, eps_rel : float
        Tolerances of the stopping rule (see the module docstring). For float32 data they are
        floored at ``1000 · eps(float32)`` times the scale of the data.
    max_iter : int
    warm_start : object or dict with ``x`` ((b, n) array), optional
        Starting primal point (the interior-point start heuristic is applied from it).
    time_limit : float, optional
        Seconds; elements still running get code TIME_LIMIT.
    ruiz_iter : int
        Ruiz equilibration passes (0 disables scaling).
    batch_chunk : int, optional
        Largest batch solved at once (default: sized to keep the work arrays near 512 MB).
    threads : int or None
        CPU threads that solve parts of the batch concurrently (NumPy and torch CPU arrays; the
        heavy kernels release the GIL). ``None``: one per core. Each part gets at least
        ``_MIN_PER_THREAD`` elements. With batch threads, or when n <= 256, BLAS and torch run
        single-threaded inside the call (batched small matrices gain nothing from intra-op threads).
        Other namespaces and devices ignore it.

    Returns
    -------
    IPMResult
        Arrays in the namespace and on the device of the inputs.

    Raises
    ------
    ProblemError
        Inconsistent shapes, non-real dtypes, or NaN/inf in P, q or C.

    Examples
    --------
    >>> import numpy as np
    >>> from polyproj.ipm import solve_qp_batch
    >>> C = np.ones((1, 2))
    >>> res = solve_qp_batch(np.eye(2), -np.array([[1.0, 1.0], [2.0, 0.0]]), C, [-np.inf], [1.0])
    >>> np.round(res.x, 6)
    array([[ 0.5,  0.5],
           [ 1.5, -0.5]])
    >>> [s.name for s in res.statuses()]
    ['SOLVED', 'SOLVED']
    """
    arrays = [a for a in (P, q, C, l, u, lb, ub) if a is not None and not isinstance(a, (list, tuple, float, int))]
    xp = array_namespace(*arrays)
    P, q = _detach(P), _detach(q)
    q = xp.asarray(q)
    if q.ndim == 1:
        q = q[None, :]
    if q.ndim != 2:
        raise ProblemError(f"q must have shape (batch, n), got {tuple(q.shape)}")
    dev = _device(q)
    dtypes = [a.dtype for a in (P, q, C) if a is not None and hasattr(a, "dtype")]
    for a, name in ((P, "P"), (q, "q"), (C, "C")):
        if a is not None and hasattr(a, "dtype") and not xp.isdtype(a.dtype, ("real floating", "integral", "bool")):
            raise ProblemError(f"{name} must hold real numbers, got dtype {a.dtype}")
    dtype = xp.float32 if dtypes and all(d == xp.float32 for d in dtypes) else xp.float64
    b, n = q.shape

    def conv(a):
        if a is None:
            return None
        a = xp.asarray(_detach(a), device=dev) if not hasattr(a, "shape") else _detach(a)
        return xp.astype(a, dtype) if a.dtype != dtype else a

    q, P = conv(q), conv(P)
    C = conv(C) if C is not None else xp.zeros((0, n), dtype=dtype, device=dev)
    m = C.shape[-2]
    P3 = _as3(xp, P, n, n, "P")
    C3 = _as3(xp, C, m, n, "C")
    for M, name in ((P3, "P"), (C3, "C"), (q, "q")):
        if M.shape[0] not in (1, b) and name != "q":
            raise ProblemError(f"{name} has batch size {M.shape[0]}, q has {b}")
        if not bool(xp.all(xp.isfinite(M))):
            raise ProblemError(f"{name} contains NaN or inf")
    l = _as_batch_vec(xp, conv(l), b, m, "l", -math.inf, dtype, dev)
    u = _as_batch_vec(xp, conv(u), b, m, "u", math.inf, dtype, dev)
    lb = _as_batch_vec(xp, conv(lb), b, n, "lb", -math.inf, dtype, dev)
    ub = _as_batch_vec(xp, conv(ub), b, n, "ub", math.inf, dtype, dev)
    for v, name in ((l, "l"), (u, "u"), (lb, "lb"), (ub, "ub")):
        if bool(xp.any(xp.isnan(v))):
            raise ProblemError(f"{name} contains NaN")
    x0 = None
    if warm_start is not None:
        x0 = warm_start.get("x") if isinstance(warm_start, dict) else getattr(warm_start, "x", None)
        if x0 is not None:
            x0 = conv(x0)
            x0 = x0[None, :] if x0.ndim == 1 else x0
            if tuple(x0.shape) != (b, n):
                raise ProblemError(f"warm_start x must have shape ({b}, {n}), got {tuple(x0.shape)}")
            x0 = xp.where(xp.isfinite(x0), x0, xp.zeros_like(x0))

    chunk = batch_chunk or max(1, int(2**26 // max(1, n * (m + n))))
    kw = dict(eps_abs=float(eps_abs), eps_rel=float(eps_rel), max_iter=int(max_iter), ruiz_iter=int(ruiz_iter),
              deadline=None if time_limit is None else time.perf_counter() + float(time_limit))
    workers = _workers(xp, q, b, threads, n, m)
    if batch_chunk is None and _on_cpu(xp, q):
        # CPU: the factorisation, K's assembly and the triangular solves are bound by memory
        # traffic; parts of at most ~64 MB of n x n matrices (bench_batch n 100, batch 4096, two
        # threads: 4.8-5.1 s in two parts of 2048, 4.0 s in parts of 512 or 1024)
        chunk = min(chunk, max(_MIN_PER_THREAD, _PART_BYTES // (8 * n * n)))
    if workers > 1:
        chunk = min(chunk, -(-b // workers))
    if batch_chunk is None and b > chunk:  # equal parts, as many for each thread
        parts = -(-b // chunk)
        parts = -(-parts // workers) * workers
        chunk = -(-b // parts)
    # batched small matrices gain nothing from intra-op threads, and on a loaded machine OpenMP /
    # OpenBLAS thread wake-ups cost more than the kernels (seen: 4 s instead of 0.04 s)
    single = workers > 1 or n <= _SMALL_N
    with _single_threaded_kernels(xp, q) if single else contextlib.nullcontext():
        if b <= chunk:
            return _solve_batched(xp, P3, q, C3, l, u, lb, ub, x0, kw)
        return _solve_parts(xp, P3, q, C3, l, u, lb, ub, x0, kw, chunk, workers)


def _solve_parts(xp, P3, q, C3, l, u, lb, ub, x0, kw, chunk, workers) -> IPMResult:
    """The batch in parts of ``chunk`` elements, solved by ``workers`` threads."""
    b = q.shape[0]

    def part(i):
        j = min(b, i + chunk)

        def sl(M):
            return M if M.shape[0] == 1 else M[i:j, ...]

        return _solve_batched(xp, sl(P3), q[i:j, ...], sl(C3), l[i:j, ...], u[i:j, ...], lb[i:j, ...],
                              ub[i:j, ...], None if x0 is None else x0[i:j, ...], kw)

    starts = range(0, b, chunk)
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(part, starts))
    else:
        parts = [part(i) for i in starts]
    return IPMResult(*[xp.concat([getattr(p, f) for p in parts], axis=0) for f in _FIELDS])


_MIN_PER_THREAD = 64  # smaller parts do not pay for a thread
_PART_BYTES = 2**26  # CPU: largest part of a batch, in bytes of its n x n matrices


def _on_cpu(xp: Any, q: Any) -> bool:
    return is_numpy_namespace(xp) or (is_torch_namespace(xp) and q.device.type == "cpu")


def _workers(xp: Any, q: Any, b: int, threads: int | None, n: int, m: int) -> int:
    """Threads for a batch of ``b``: only NumPy and torch CPU arrays, at most one per part of 64.

    ``threads=None`` (one per core) also keeps small problems on fewer threads: below n 64 a part
    pays for its thread only when its arrays hold at least ``_THREAD_MIN_SIZE`` entries
    (``part · (m + n)``); smaller ones are dominated by per-operation costs that hold the GIL
    (measured, n 20, batch 1024: 0.095 s on one thread, 0.15 s on two; batch 2048: 0.19 vs 0.12 s).
    """
    if threads == 1 or not _on_cpu(xp, q):
        return 1
    want = (os.cpu_count() or 1) if threads is None else int(threads)
    if want < 1:
        raise ProblemError(f"threads must be >= 1 or None, got {threads}")
    w = max(1, min(want, b // _MIN_PER_THREAD))
    if threads is None and n < _THREAD_MIN_N:
        while w > 1 and (b // w) * (m + n) < _THREAD_MIN_SIZE:
            w -= 1
    return w


_THREAD_MIN_N = 64  # from this n the factorisations dominate a part (batch threads pay from 64 elements)
_THREAD_MIN_SIZE = 50_000  # below _THREAD_MIN_N: entries of a part's (part, m + n) arrays for a thread


_SMALL_N = 256  # up to this n the per-element kernels run single-threaded


@contextlib.contextmanager
def _single_threaded_kernels(xp: Any, q: Any):
    """One BLAS thread (and one torch intra-op thread, torch being loaded) on the CPU; nothing elsewhere."""
    from .runtime import small_blas

    if not _on_cpu(xp, q):
        yield
        return
    with small_blas():
        yield


_FIELDS = ("x", "z", "z_box", "status", "iterations", "prim_res", "dual_res", "gap")
_COMPACT_FRAC = 0.75  # compact the batch once at most this fraction of its elements is still running
_COMPACT_MIN = 2  # ... down to batches of 2 (13 elements ran ~50 iterations for the slowest of them)
_PACKED_MAX = 2**23  # largest packed (m, n(n+1)/2) table of products c_i c_iᵀ (64 MB in float64)


def _take_rows(xp: Any, M: Any, idx: Any) -> Any:
    """Elements ``idx`` of a per-element array; shared data (leading dimension 1) unchanged."""
    return M if M.shape[0] == 1 else xp.take(M, idx, axis=0)


def _take_state(xp: Any, cont: dict, idx: Any) -> dict:
    """The continuation state of :func:`_solve` restricted to the elements ``idx``."""
    out = {}
    for k, v in cont.items():
        if k in ("it0", "e_idx"):
            out[k] = v
        elif isinstance(v, tuple):
            out[k] = tuple(_take_rows(xp, a, idx) for a in v)
        else:
            out[k] = _take_rows(xp, v, idx)
    return out


def _solve_batched(xp, P3, q, C3, l, u, lb, ub, x0, kw, resume=None) -> IPMResult:
    """Run the IPM on a batch, compacting it as its elements finish.

    The batch iterates until its slowest element is done, and every iteration costs a factorisation
    per element; most elements converge in 10–15 iterations, a few take many more. Whenever at
    most ``_COMPACT_FRAC`` of the elements are still running, :func:`_solve` hands back its full
    state (iterates, scaling, counters); the running elements are gathered into a smaller batch that
    continues exactly where it stopped (no restart), and the results are merged back with a gather,
    not a Python loop over the batch.
    """
    b = q.shape[0]
    out = _solve(xp, P3, q, C3, l, u, lb, ub, x0, **kw, resume=resume,
                 stop_frac=_COMPACT_FRAC if b >= _COMPACT_MIN else None)
    if isinstance(out, IPMResult):
        return out
    part, cont = out
    # indices on the device (no host round trip of the status array)
    running = part.status == _RUNNING
    idx = xp.nonzero(running)[0]
    sub = _solve_batched(xp, *(_take_rows(xp, M, idx) for M in (P3, q, C3, l, u, lb, ub)), None, kw,
                         resume=_take_state(xp, cont, idx))
    # element i of the merged result: its place in the continued batch if it was running, else its own
    rank = xp.cumulative_sum(xp.astype(running, idx.dtype)) - 1
    gidx = xp.where(running, b + rank, xp.arange(b, dtype=idx.dtype, device=_device(q)))
    return IPMResult(*[xp.take(xp.concat([getattr(part, f), getattr(sub, f)], axis=0), gidx, axis=0)
                       for f in _FIELDS])


# ============================================================================ scaling
def _ruiz(xp: Any, P3: Any, C3: Any, q: Any, iters: int):
    """Ruiz equilibration of [P Cᵀ; C 0] and cost scaling: returns Ps, Cs, D, E, c.

    ``c`` is per element, (b,): the cost of element i is scaled by ``c_i`` (the scaled Hessian is
    ``c_i Ps``, applied by the caller), so that an element's iterates do not depend on the other
    elements of the batch while ``Ps`` stays shared when P is.
    """
    bs = max(P3.shape[0], C3.shape[0])
    n, m = P3.shape[-1], C3.shape[-2]
    dtype, dev = P3.dtype, _device(P3)
    if P3.shape[0] != bs:
        P3 = xp.broadcast_to(P3, (bs, n, n))
    if C3.shape[0] != bs:
        C3 = xp.broadcast_to(C3, (bs, m, n))
    D = xp.ones((bs, n), dtype=dtype, device=dev)
    E = xp.ones((bs, m), dtype=dtype, device=dev)
    Ps, Cs = P3, C3
    one = xp.ones((), dtype=dtype, device=dev)

    def inv_sqrt(v):
        v = xp.where(v < 1e-8, one, v)
        return 1.0 / xp.sqrt(xp.clip(v, 1e-4, 1e4))

    for _ in range(iters):
        cn = xp.max(xp.abs(Ps), axis=-2)
        if m:
            cn = xp.maximum(cn, xp.max(xp.abs(Cs), axis=-2))
            e = inv_sqrt(xp.max(xp.abs(Cs), axis=-1))
        d = inv_sqrt(cn)
        Ps = d[:, :, None] * Ps * d[:, None, :]
        D = D * d
        if m:
            Cs = e[:, :, None] * Cs * d[:, None, :]
            E = E * e
    if iters:
        pcol = xp.mean(xp.max(xp.abs(Ps), axis=-2), axis=-1)  # (bs,)
        qn = xp.max(xp.abs(q * D), axis=-1)
        c = 1.0 / xp.clip(xp.where(xp.maximum(pcol, qn) < 1e-8, one, xp.maximum(pcol, qn)), 1e-4, 1e4)
    else:
        c = xp.ones((q.shape[0],), dtype=dtype, device=dev)
    return Ps, Cs, D, E, c


# ============================================================================ the IPM
def _solve(xp, P3, q, C3, l, u, lb, ub, x0, *, eps_abs, eps_rel, max_iter, ruiz_iter, deadline,
           resume=None, stop_frac=None):
    """The IPM proper (see the module docstring).

    ``stop_frac``: return ``(partial IPMResult, state)`` as soon as at most this fraction of the
    elements is still running (their status stays ``_RUNNING``); ``resume``: such a state (restricted
    to the running elements) to continue from, with the scaling and equality pattern it was made
    with. Otherwise the final :class:`IPMResult` is returned.
    """
    b, n = q.shape
    m = C3.shape[-2]
    M = m + n
    dtype, dev = q.dtype, _device(q)
    la = _Linalg(xp)
    eps = float(np.finfo(np.float32 if dtype == xp.float32 else np.float64).eps)
    zero = xp.zeros((), dtype=dtype, device=dev)
    one = xp.ones((), dtype=dtype, device=dev)
    inf = xp.full((), math.inf, dtype=dtype, device=dev)

    # ---------------------------------------------------------------- structure (masks) and scaling
    L = xp.concat([l, lb], axis=1)
    U = xp.concat([u, ub], axis=1)
    if is_numpy_namespace(xp):  # NumPy concatenates broadcast (stride-0) rows in Fortran order, and every
        # elementwise operation mixing the orders was ~20 % slower (shared l, u, lb, ub: pp.project)
        L, U = np.ascontiguousarray(L), np.ascontiguousarray(U)
    finL = L > -_INF
    finU = U < _INF
    eq = finL & finU & (L == U)
    mlb = finL & ~eq
    mub = finU & ~eq
    ml = xp.astype(mlb, dtype)
    mu = xp.astype(mub, dtype)
    Lf = xp.where(finL, L, zero)  # unscaled, finite (0 where infinite)
    Uf = xp.where(finU, U, zero)

    Ps, Cs, D, E, c = _ruiz(xp, P3, C3, q, ruiz_iter) if resume is None else resume["scaling"]
    DE = xp.concat([E, 1.0 / D], axis=1)  # row scaling of G = [C; I] in the scaled problem
    qs = q * D * c[:, None]

    def pmv(v):  # scaled Hessian (c_i Ps) times v
        return c[:, None] * _mv(Ps, v)
    Ls = Lf * DE
    Us = Uf * DE

    # equality rows: union of the patterns over the batch, masked per element
    if resume is None:
        eq_any = xp.any(eq, axis=0)
        e_idx = xp.nonzero(eq_any)[0] if bool(xp.any(eq_any)) else None
    else:
        e_idx = resume["e_idx"]
    p = 0 if e_idx is None else int(e_idx.shape[0])
    bs = Cs.shape[0]
    eyeM = None
    if p:
        eyeM = xp.eye(M, dtype=dtype, device=dev)
        sel = xp.take(eyeM, e_idx, axis=0)  # (p, M) one-hot rows of G
        Gfull = xp.concat([Cs, xp.broadcast_to(xp.eye(n, dtype=dtype, device=dev)[None, ...], (bs, n, n))],
                          axis=1)  # scaled G (bs, M, n)
        Ge = xp.take(Gfull, e_idx, axis=1)  # (bs, p, n)
        mee = xp.astype(xp.take(eq, e_idx, axis=1), dtype)  # (b, p)
        erhs = xp.take(Ls, e_idx, axis=1) * mee
    gamma = 1.0
    rho = max(1e-10, 1e2 * eps) if dtype == xp.float64 else 1e-6
    delta = rho
    # cap of z/s: in float64 effectively none (1/eps²): capping D makes the direction inconsistent
    # with the complementarity of the blocking slacks, and the step length then collapses (QBRANDY,
    # QBEACONF stalled at 1e-4 steps); a failed factorisation is shifted in factorize instead, and
    # only elements whose shifted direction is inaccurate fall back to the low cap (see the loop);
    # the generic path (linalg.solve) cannot report failures per element, so it keeps the low cap
    dmax_lo = 1e-2 / eps
    dmax = 1.0 / eps**2 if (dtype == xp.float64 and la.kind != "generic") else dmax_lo
    eye_p = xp.eye(p, dtype=dtype, device=dev) if p else None

    def gx_of(x):  # scaled G x  (b, M)
        return xp.concat([_mv(Cs, x), x], axis=1)

    def gtw(w):  # scaled Gᵀ w  (b, n)
        return _rmv(Cs, w[:, :m]) + w[:, m:]

    # shared C: Cᵀ D C = Σ_i d_i c_i c_iᵀ is linear in D. With the products c_i c_iᵀ packed (lower
    # triangle, (m, n(n+1)/2)), all K of the batch are ONE GEMM D @ CC with half the flops of the
    # (b·n, m) x (m, n) product, unpacked to full symmetric matrices by a gather (xp.take)
    CC = sym_gather = Ct = None
    if Cs.shape[0] == 1 and m * n * (n + 1) // 2 <= _PACKED_MAX:
        ti, tj = np.tril_indices(n)
        pos = np.empty((n, n), dtype=np.int64)
        pos[ti, tj] = pos[tj, ti] = np.arange(ti.size)
        C0 = Cs[0, ...]
        CC = xp.take(C0, xp.asarray(ti, device=dev), axis=1) * xp.take(C0, xp.asarray(tj, device=dev), axis=1)
        sym_gather = xp.asarray(pos.reshape(-1), device=dev)
        diag_np = (ti == tj)
        eye_packed = xp.asarray(diag_np.astype(np.float64), dtype=dtype, device=dev)  # packed identity (T,)
        diag_pos = xp.asarray(np.flatnonzero(diag_np), device=dev)  # packed positions of the diagonal
        inplace = is_numpy_namespace(xp) or is_torch_namespace(xp)
        row_off = [i * (i + 1) // 2 for i in range(n + 1)]  # packed row i: row_off[i]:row_off[i + 1]
        if not inplace:  # standard-only: the diagonal spread over the packed positions by a gather
            owner = np.zeros(ti.size, dtype=np.int64)
            owner[diag_np] = np.arange(n)
            diag_owner = xp.asarray(owner, device=dev)
        Pp = xp.take(xp.reshape(Ps, (Ps.shape[0], n * n)), xp.asarray(ti * n + tj, device=dev), axis=1)
        P_diag = xp.linalg.diagonal(Ps)  # (bs, n)
        if not bool(xp.any(xp.take(Pp, xp.asarray(np.flatnonzero(~diag_np), device=dev), axis=1) != 0)):
            Pp = None  # diagonal P (projections: P = I) is folded into the diagonal update
    elif Cs.shape[0] == 1:  # Cᵀ row-major (reshape copies a transposed view in C order in every namespace)
        Ct = xp.reshape(xp.reshape(Cs[0, ...].mT, (n * m,)), (n, m))

    # NumPy and torch: the batch's n x n (and packed) arrays are allocated once and reused by every
    # iteration (a fresh (512, 100, 100) array is 40 MB, above glibc's largest mmap threshold: each
    # one cost ~10k page faults; bench_batch n 100, batch 1024: IPM 0.89 -> 0.76 s)
    ws: dict[str, Any] = {}

    def buffer(name, shape):
        """The workspace array ``name`` (zeros when first made; the caller overwrites what it uses)."""
        if name not in ws:
            ws[name] = xp.zeros(shape, dtype=dtype, device=dev)
        return ws[name]

    def build_K(Dg, running):
        Dc = Dg[:, :m]
        if CC is not None:  # everything in the packed domain (half the memory traffic), one gather at the end
            Kp = xp.matmul(Dc, CC, out=buffer("Kp", (b, CC.shape[1]))) if inplace else Dc @ CC
            dvec = Dg[:, m:] + rho
            if Pp is not None and inplace:
                Kp += c[:, None] * Pp
            elif Pp is not None:
                Kp = Kp + c[:, None] * Pp
            else:
                dvec = dvec + c[:, None] * P_diag
            if inplace:
                Kp[:, diag_pos] += dvec
            else:
                Kp = Kp + xp.take(dvec, diag_owner, axis=1) * eye_packed
            frozen = ~running
            if bool(xp.any(frozen)):
                Kp = xp.where(frozen[:, None], eye_packed[None, :], Kp)
            if inplace:
                # the Cholesky factorisations read the lower triangle only: copy the packed rows
                # into it (half the traffic of the symmetric gather; the upper triangle stays zero)
                K = buffer("K", (b, n, n))  # zeros once: the upper triangle is never written
                for i in range(n):
                    K[:, i, : i + 1] = Kp[:, row_off[i]: row_off[i + 1]]
                return K
            return xp.reshape(xp.take(Kp, sym_gather, axis=1), (b, n, n))
        if Ct is not None:
            K = xp.reshape(xp.reshape(Ct[None, ...] * Dc[:, None, :], (b * n, m)) @ Cs[0, ...], (b, n, n))
        else:
            K = (Cs.mT * Dc[:, None, :]) @ Cs
        K = K + c[:, None, None] * Ps
        K = _add_diag(xp, K, Dg[:, m:] + rho)
        frozen = ~running
        if bool(xp.any(frozen)):
            K = xp.where(frozen[:, None, None], xp.eye(n, dtype=dtype, device=dev)[None, ...], K)
        return K

    def factorize(Dg0, running, retry=True, pre=None):
        """Factor ``K_γ`` (and the Schur complement on the equality rows).

        ``pre``: the predictor's right-hand side ``(r1, r2)`` (with equalities only), solved with
        ``K_γ`` in the same pass as ``K_γ⁻¹ G_eᵀ`` (a batched triangular solve costs a pass over
        all factors, nearly whatever the number of right-hand sides); kept in the result for
        :func:`newton`.
        """
        Dg = Dg0 + gamma * (xp.astype(eq, dtype)) if p else Dg0
        K = build_K(Dg, running)
        # NumPy: the factor overwrites the previous iteration's (only the current one is ever used)
        F, ok = la.factor(K, buffer("L", K.shape) if la.kind == "numpy" else None)
        regd = False
        shifted = ~ok
        if not bool(xp.all(ok)) and retry:
            # where the factorisation failed, regularise in proportion to the diagonal of K: near the
            # end D spans ~30 orders of magnitude and K, as formed, is indefinite by about eps·|K|;
            # a relative shift is tiny on the small diagonal entries (an absolute one of eps·max|K|
            # swamps them and the direction loses all accuracy), and iterative refinement on the
            # unshifted system (newton_refined) removes what it changes. Escalate, then fall back to
            # the absolute shift.
            dK = xp.abs(xp.linalg.diagonal(K))
            diagmax = xp.max(dK, axis=-1)
            for shift in (1e2 * eps * n * dK, 1e5 * eps * n * dK,
                          xp.broadcast_to((1e3 * eps * n * diagmax)[:, None], (b, n))):
                # only the failed elements are factored again (retry is False on the generic path,
                # whose factor never fails, so F and ok support index assignment here)
                idx = xp.nonzero(~ok)[0]
                Fb, okb = la.factor(_add_diag(xp, xp.take(K, idx, axis=0), xp.take(shift, idx, axis=0)))
                F[idx], ok[idx] = Fb, okb
                regd = True
                if bool(xp.all(ok)):
                    break
        Sfac = W = t_pre = None
        if p:
            GeT = xp.broadcast_to(Ge.mT, (b, n, p)) * mee[:, None, :]
            if pre is None:
                W = la.solve(F, GeT)  # K⁻¹ G_eᵀ (masked)
            else:
                r1p = pre[0] + gamma * _rmv(Ge, pre[1] * mee)
                sol = la.solve(F, xp.concat([GeT, r1p[:, :, None]], axis=2))
                W, t_pre = sol[..., :p], (pre[0], sol[..., p])
            Sfac, ok2 = schur(W)
            ok = ok & ok2
        return F, W, Sfac, ok, Dg0, regd, shifted, running, t_pre

    def schur(W):
        """Factor of the Schur complement ``G_e K⁻¹ G_eᵀ + δ I`` on the equality rows (W = K⁻¹ G_eᵀ)."""
        S = (Ge * mee[:, :, None]) @ W
        S = S + eye_p[None, ...] * (delta + (1.0 - mee))[:, :, None]
        return la.factor(S)

    def factorize_start(Dg0, running):
        """The factorisation of the starting step (``D = 1`` on every finite side).

        With C shared, P shared, diagonal and definite (projections: ``P = I``) and the same
        constraint pattern for every element, the ``K_γ`` of the batch differ only by the cost
        scaling: ``S + c_i P``. One eigendecomposition of ``P^-½ S P^-½`` then serves the whole batch
        (instead of b Cholesky factorisations); otherwise, or when the shifted spectrum is not safely
        positive, the batched Cholesky of :func:`factorize`.
        """
        shared = (b >= _EIG_MIN_BATCH and CC is not None and Pp is None and P_diag.shape[0] == 1
                  and bool(xp.all(P_diag > 0)) and bool(xp.all(Dg0 == Dg0[0:1, :]))
                  and (not p or bool(xp.all(eq == eq[0:1, :]))))
        if not shared:
            return factorize(Dg0, running)
        Dg = Dg0 + gamma * (xp.astype(eq, dtype)) if p else Dg0
        d0 = Dg[0, :]
        C0 = Cs[0, ...]
        S = (C0.mT * d0[None, :m]) @ C0 + xp.eye(n, dtype=dtype, device=dev) * (d0[m:] + rho)[None, :]
        # K_i = S + c_i Pd = Pd^½ (Pd^-½ S Pd^-½ + c_i I) Pd^½ with Pd^-½ S Pd^-½ = U diag(lam) Uᵀ
        ph = 1.0 / xp.sqrt(P_diag[0, :])
        lam, U = xp.linalg.eigh(ph[:, None] * S * ph[None, :])
        V = ph[:, None] * U  # K_i⁻¹ = V diag(1 / (lam + c_i)) Vᵀ
        shift = c
        if not bool(xp.min(lam) + xp.min(shift) > 1e-8 * (xp.max(xp.abs(lam)) + xp.max(shift))):
            return factorize(Dg0, running)
        F = _EigFactor(V, lam, shift)
        ok = xp.ones((b,), dtype=xp.bool, device=dev)
        Sfac = W = None
        if p:
            W = la.solve(F, xp.broadcast_to(Ge.mT, (b, n, p)) * mee[:, None, :])
            Sfac, ok = schur(W)
        return F, W, Sfac, ok, Dg0, False, ~ok, running, None

    def newton(fac, r1, r2):
        F, W, Sfac = fac[:3]
        if not p:
            return la.solve(F, r1[:, :, None])[..., 0], None
        if fac[8] is not None and fac[8][0] is r1:  # solved with the factorisation
            t = fac[8][1]
        else:
            r1p = r1 + gamma * _rmv(Ge, r2 * mee)
            t = la.solve(F, r1p[:, :, None])[..., 0]
        rhs = (_mv(Ge, t) - r2) * mee
        dy = la.solve(Sfac, rhs[:, :, None])[..., 0]
        dx = t - (W @ dy[:, :, None])[..., 0]
        # K dx + G_eᵀ(dy + γ(G_e dx − r₂)) = r₁ with G_e dx − r₂ = δ dy: the true multiplier step
        return dx, (1.0 + gamma * delta) * dy

    def newton_refined(fac, r1, r2):
        """Newton solve plus iterative refinement on the unregularised system (with equalities only).

        ``K_γ`` is ill-conditioned near the end (``D`` spans many magnitudes), so ``K_γ⁻¹ G_eᵀ`` in
        the Schur complement carries errors that grow with the equality multipliers (they diverge
        on infeasible problems); refinement steps with the same factors remove them. A step is taken
        only while some running element's residual exceeds ``_REFINE_TOL`` relative to its right-hand
        side (each step is a solve with every factor of the batch: early on, none is needed).
        """
        dx, dy = newton(fac, r1, r2)
        if not p and not fac[5]:
            return dx, dy
        Dg = fac[4]
        run = fac[7]
        rscale = None
        for _ in range(2):
            e1 = r1 - (pmv(dx) + gtw(Dg * gx_of(dx)) + rho * dx)
            if p:
                e1 = e1 - _rmv(Ge, dy * mee)
                e2 = (r2 - _mv(Ge, dx)) * mee
            if _REFINE_TOL > 0:
                if rscale is None:
                    rscale = _inf_norm(xp, r1) + (_inf_norm(xp, r2) if p else 0.0)
                err = _inf_norm(xp, e1) + (_inf_norm(xp, e2) if p else 0.0)
                if not bool(xp.any(run & (err > _REFINE_TOL * rscale))):
                    break
            if not p:
                dx = dx + newton(fac, e1, None)[0]
                continue
            ddx, ddy = newton(fac, e1, e2)
            dx, dy = dx + ddx, dy + ddy
        return dx, dy

    def rhs(st, res, rcl, rcu, Dl, Du):
        """Right-hand side r1 of the reduced system for complementarity residuals rcl, rcu."""
        _, sl, _, su, _, _ = st
        rd, rpl, rpu, _ = res
        v = (-rcu / su - Du * rpu) * mu + (rcl / sl + Dl * rpl) * ml
        return -rd - gtw(v)

    def direction(fac, st, res, rcl, rcu, Dl, Du, r1=None):
        # Dl, Du: z/s (capped) — used both in K and here, so the linearised stationarity is exact
        _, sl, _, su, _, _ = st
        _, rpl, rpu, rpe = res
        if r1 is None:
            r1 = rhs(st, res, rcl, rcu, Dl, Du)
        dx, dy = newton_refined(fac, r1, -rpe if p else None)
        gdx = gx_of(dx)
        dsl = (gdx + rpl) * ml
        dsu = (rpu - gdx) * mu
        dzl = (-rcl / sl - Dl * dsl) * ml
        dzu = (-rcu / su - Du * dsu) * mu
        return dx, dsl, dzl, dsu, dzu, dy

    def pred_corr(fac, st, res, mu_c, Dl, Du):
        """Mehrotra predictor and corrector directions (da, dc) and the centring sigma."""
        _, sl, zl, su, zu, _ = st
        r1a = fac[8][0] if fac[8] is not None else None  # solved with the factorisation
        da = direction(fac, st, res, sl * zl * ml, su * zu * mu, Dl, Du, r1a)
        a_aff = xp.minimum(step_len(st, da), one)
        mu_aff = mu_of(sl + a_aff[:, None] * da[1], zl + a_aff[:, None] * da[2],
                       su + a_aff[:, None] * da[3], zu + a_aff[:, None] * da[4])
        sigma = xp.clip((mu_aff / xp.where(mu_c > 0, mu_c, one)) ** 3, zero, one)
        smu = (sigma * mu_c)[:, None]
        rcl = (sl * zl + da[1] * da[2] - smu) * ml
        rcu = (su * zu + da[3] * da[4] - smu) * mu
        return da, direction(fac, st, res, rcl, rcu, Dl, Du), sigma

    def stat_error(d, res):
        """Unscaled error of the linearised stationarity ``P dx + Gᵀdz = −r_d`` of a direction."""
        dzg = d[4] * mu - d[2] * ml
        lin = pmv(d[0]) + gtw(dzg) + res[0]
        if p:
            lin = lin + _rmv(Ge, d[5] * mee)
        return _inf_norm(xp, lin / (D * c[:, None]))

    def residuals(st):
        x, sl, zl, su, zu, y = st
        gx = gx_of(x)
        zg = zu * mu - zl * ml
        rd = pmv(x) + qs + gtw(zg)
        rpe = None
        if p:
            rd = rd + _rmv(Ge, y * mee)
            rpe = (_mv(Ge, x) - erhs) * mee
        rpl = (gx - Ls - sl) * ml
        rpu = (Us - gx - su) * mu
        return rd, rpl, rpu, rpe

    def max_step(v, dv, mask):
        neg = (dv < 0) & mask
        ratio = xp.where(neg, -v / xp.where(neg, dv, -one), inf)
        return xp.min(ratio, axis=-1)

    def step_len(st, d):
        _, sl, zl, su, zu, _ = st
        _, dsl, dzl, dsu, dzu, _ = d
        a = xp.minimum(xp.minimum(max_step(sl, dsl, mlb), max_step(zl, dzl, mlb)),
                       xp.minimum(max_step(su, dsu, mub), max_step(zu, dzu, mub)))
        return a

    ncomp = xp.sum(ml, axis=1) + xp.sum(mu, axis=1)
    ncomp = xp.where(ncomp > 0, ncomp, one)

    def mu_of(sl, zl, su, zu):
        return (xp.sum(sl * zl * ml, axis=1) + xp.sum(su * zu * mu, axis=1)) / ncomp

    # ---------------------------------------------------------------- unscaled quantities and checks
    Dx = D  # x = D x̃
    Pu = P3
    Cu = C3

    def unscale(st):
        x, _, zl, _, zu, y = st
        zg = zu * mu - zl * ml
        if p:
            zg = zg + (y * mee) @ sel
        zg = zg / c[:, None]
        return x * Dx, zg[:, :m] * E, zg[:, m:] / D

    def kkt(xu, zu_, zbu):
        Px = _mv(Pu, xu)
        Cx = _mv(Cu, xu)
        gx = xp.concat([Cx, xu], axis=1)
        pres = xp.max(xp.maximum(xp.maximum(gx - U, L - gx), zero), axis=1)
        Ctz = _rmv(Cu, zu_)
        dres = _inf_norm(xp, Px + q + Ctz + zbu)
        zall = xp.concat([zu_, zbu], axis=1)
        xPx = xp.sum(xu * Px, axis=1)
        qx = xp.sum(q * xu, axis=1)
        supp = xp.sum(Uf * xp.maximum(zall, zero) - Lf * xp.maximum(-zall, zero), axis=1)
        gap = xp.abs(xPx + qx + supp)
        tp = eps_abs + eps_rel * xp.maximum(_inf_norm(xp, Cx), _inf_norm(xp, xu))
        td = eps_abs + eps_rel * xp.maximum(xp.maximum(_inf_norm(xp, Px), _inf_norm(xp, q)),
                                            xp.maximum(_inf_norm(xp, Ctz), _inf_norm(xp, zbu)))
        tg = eps_abs + eps_rel * xp.maximum(xp.maximum(xp.abs(xPx), xp.abs(qx)), xp.abs(supp))
        return pres, dres, gap, tp, td, tg

    # data scale for the float32 floor of the tolerances
    finite_scale = xp.maximum(_inf_norm(xp, q), _inf_norm(xp, xp.concat([Lf, Uf], axis=1)))
    floor = 1e3 * eps * (1.0 + finite_scale) if dtype == xp.float32 else 0.0 * finite_scale

    eps_inf = 1e-8 if dtype == xp.float64 else 1e-4

    def certificates(dx, dzg_u, dzb_u, xu, zall_u):
        """Primal (δz) and dual (δx) infeasibility certificates, unscaled; (b,) bool each.

        A feasible problem admits no ε-certificate beyond ``‖x̄‖₁·stat`` (``x̄`` feasible), and a
        bounded one none beyond ``‖z̄‖₁·rec + ‖x̄‖₁·‖Pδx‖`` (``z̄`` dual feasible): the margins use
        the current iterate as ``x̄, z̄``.
        """
        x1 = xp.sum(xp.abs(xu), axis=1)
        z1 = xp.sum(xp.abs(zall_u), axis=1)
        nz = xp.maximum(_inf_norm(xp, dzg_u), _inf_norm(xp, dzb_u))
        nz_safe = xp.where(nz > 0, nz, one)
        zall = xp.concat([dzg_u, dzb_u], axis=1) / nz_safe[:, None]
        stat = _inf_norm(xp, _rmv(Cu, zall[:, :m]) + zall[:, m:])
        supp = xp.sum(Uf * xp.maximum(zall, zero) - Lf * xp.maximum(-zall, zero), axis=1)
        # rounding of the support function itself (huge finite bounds make it meaningless)
        supp_err = 1e2 * eps * xp.sum(xp.abs(Uf) * xp.maximum(zall, zero) + xp.abs(Lf) * xp.maximum(-zall, zero),
                                      axis=1)
        margin_p = xp.maximum(1e3 * eps_inf + 0.0 * stat, 10.0 * x1 * stat) + supp_err
        # a direction beyond 1/eps² is a numerical blow-up (seen with rank-deficient equalities),
        # not a certificate: such elements end as MAX_ITER / NUMERICAL_ERROR instead
        pinf = (nz > 0) & (nz < 1.0 / (eps * eps)) & (stat <= eps_inf) & (supp < -margin_p)
        nx = _inf_norm(xp, dx)
        nx_safe = xp.where(nx > 0, nx, one)
        dxn = dx / nx_safe[:, None]
        Pdx = _inf_norm(xp, _mv(Pu, dxn))
        qdx = xp.sum(q * dxn, axis=1)
        gdx = xp.concat([_mv(Cu, dxn), dxn], axis=1)
        up_bad = xp.where(finU, gdx, -inf)  # finite upper side: G δx <= 0
        lo_bad = xp.where(finL, -gdx, -inf)  # finite lower side: G δx >= 0
        rec = xp.max(xp.maximum(up_bad, lo_bad), axis=1)
        rec = xp.maximum(rec, zero)
        margin = xp.maximum(1e3 * eps_inf + 0.0 * rec, 10.0 * (z1 * rec + x1 * Pdx))
        dinf = (nx > 0) & (Pdx <= eps_inf) & (qdx < -margin) & (rec <= eps_inf)
        return pinf, dinf

    # ---------------------------------------------------------------- starting point (Mehrotra heuristic)
    if resume is None:
        x = xp.zeros((b, n), dtype=dtype, device=dev) if x0 is None else x0 / D
        ones_M = xp.ones((b, M), dtype=dtype, device=dev)
        sl = ones_M
        su = ones_M
        zl = ml * 1.0
        zu = mu * 1.0
        y = xp.zeros((b, p), dtype=dtype, device=dev)
        st = (x, sl, zl, su, zu, y)
        running = xp.ones((b,), dtype=xp.bool, device=dev)
        fac = factorize_start(ml + mu, running)
        res = residuals(st)
        d = direction(fac, st, res, sl * zl * ml, su * zu * mu, ml, mu)
        x = x + d[0]
        y = y + d[5] if p else y
        sl = xp.where(mlb, xp.maximum(xp.abs(sl + d[1]), one), one)
        zl = xp.where(mlb, xp.maximum(xp.abs(zl + d[2]), one), zero)
        su = xp.where(mub, xp.maximum(xp.abs(su + d[3]), one), one)
        zu = xp.where(mub, xp.maximum(xp.abs(zu + d[4]), one), zero)
        ok0 = xp.all(xp.isfinite(x), axis=1)
        x = xp.where(ok0[:, None], x, xp.zeros_like(x))
        st = (x, sl, zl, su, zu, y)
    code = {k: xp.full((b,), v, dtype=xp.int32, device=dev) for k, v in CODES.items()}
    zero_i = xp.zeros((b,), dtype=xp.int32, device=dev)
    if resume is None:
        status = xp.full((b,), _RUNNING, dtype=xp.int32, device=dev)
        iters = zero_i
        best = None
        pin_cnt = zero_i
        din_cnt = zero_i
        it0 = 0
    else:
        st, best = resume["st"], resume["best"]
        status, iters, pin_cnt, din_cnt = resume["status"], resume["iters"], resume["pin_cnt"], resume["din_cnt"]
        it0 = resume["it0"]
    for it in range(it0, max_iter + 1):
        xu, zu_, zbu = unscale(st)
        pres, dres, gap, tp, td, tg = kkt(xu, zu_, zbu)
        finite = xp.isfinite(pres) & xp.isfinite(dres) & xp.isfinite(gap) & xp.all(xp.isfinite(xu), axis=1)
        conv = (finite & (pres <= xp.maximum(tp, floor)) & (dres <= xp.maximum(td, floor))
                & (gap <= xp.maximum(tg, floor)))
        running = status == _RUNNING
        newly = running & conv
        status = xp.where(newly, code["SOLVED"], status)
        status = xp.where(running & ~finite, code["NUMERICAL_ERROR"], status)
        # keep the last finite unscaled point per element (returned for MAX_ITER / TIME_LIMIT)
        cur = (xu, zu_, zbu, pres, dres, gap, xp.maximum(tp, floor), xp.maximum(td, floor), xp.maximum(tg, floor))
        if best is None:
            best = cur
        else:
            upd = running & finite
            best = tuple(xp.where(upd[:, None] if a.ndim == 2 else upd, a, bst) for a, bst in zip(cur, best))
        running = status == _RUNNING
        n_run = int(xp.sum(xp.astype(running, xp.int32)))
        if n_run == 0 or it == max_iter:
            break
        if stop_frac is not None and it > it0 and n_run <= stop_frac * b:
            cont = dict(scaling=(Ps, Cs, D, E, c), e_idx=e_idx, st=st, best=best, status=status, iters=iters,
                        pin_cnt=pin_cnt, din_cnt=din_cnt, it0=it)
            return _finish(xp, best, status, iters, dtype, dev, final=False), cont
        if deadline is not None and time.perf_counter() > deadline:
            status = xp.where(running, code["TIME_LIMIT"], status)
            break
        iters = iters + xp.astype(running, xp.int32)

        x, sl, zl, su, zu, y = st
        Dl = xp.clip(zl / sl * ml, zero, dmax * one)
        Du = xp.clip(zu / su * mu, zero, dmax * one)
        res = residuals(st)
        # the predictor's system is solved in the factorisation's pass (see factorize)
        pre = (rhs(st, res, sl * zl * ml, su * zu * mu, Dl, Du), -res[3]) if p else None
        fac = factorize(Dl + Du, running, pre=pre)
        if dmax > dmax_lo and not bool(xp.all(fac[3] | ~running)):
            low = (~fac[3])[:, None]
            Dl = xp.where(low, xp.clip(Dl, zero, dmax_lo * one), Dl)
            Du = xp.where(low, xp.clip(Du, zero, dmax_lo * one), Du)
            fac = factorize(Dl + Du, running)
        status = xp.where(running & ~fac[3], code["NUMERICAL_ERROR"], status)
        running = status == _RUNNING
        mu_c = mu_of(sl, zl, su, zu)
        da, dc, sigma = pred_corr(fac, st, res, mu_c, Dl, Du)
        if fac[5]:
            # the shifted factorisation (see factorize) can leave a direction whose stationarity is
            # off by more than the tolerance (many equality rows, near-null directions): there, cap
            # D instead (dmax_lo) and recompute
            redo = running & fac[6] & (stat_error(dc, res) > 0.1 * xp.maximum(xp.maximum(td, floor), dres))
            if bool(xp.any(redo)):
                Dl = xp.where(redo[:, None], xp.clip(Dl, zero, dmax_lo * one), Dl)
                Du = xp.where(redo[:, None], xp.clip(Du, zero, dmax_lo * one), Du)
                fac = factorize(Dl + Du, running)
                status = xp.where(running & ~fac[3], code["NUMERICAL_ERROR"], status)
                running = status == _RUNNING
                da, dc, sigma = pred_corr(fac, st, res, mu_c, Dl, Du)
        alpha = xp.minimum(0.99 * step_len(st, dc), one)
        alpha = xp.where(running, alpha, zero)
        # infeasibility certificates from the corrector direction (unscaled)
        dzg = dc[4] * mu - dc[2] * ml
        if p:
            dzg = dzg + (dc[5] * mee) @ sel
        dzg = dzg / c[:, None]
        pinf, dinf = certificates(dc[0] * Dx, dzg[:, :m] * E, dzg[:, m:] / D, xu, xp.concat([zu_, zbu], axis=1))
        pinf = pinf & (pres > xp.maximum(tp, floor))
        dinf = dinf & ~pinf
        pin_cnt = xp.where(pinf, pin_cnt + 1, zero_i)
        din_cnt = xp.where(dinf, din_cnt + 1, zero_i)
        status = xp.where(running & (pin_cnt >= 1), code["PRIMAL_INFEASIBLE"], status)
        status = xp.where(running & (din_cnt >= 1), code["DUAL_INFEASIBLE"], status)
        running = status == _RUNNING
        alpha = xp.where(running, alpha, zero)
        a2 = alpha[:, None]
        if _TRACE is not None:
            _TRACE(it, locals())
        new = (x + a2 * dc[0], sl + a2 * dc[1], zl + a2 * dc[2], su + a2 * dc[3], zu + a2 * dc[4],
               (y + a2 * dc[5]) if p else y)
        # keep masked-off entries inert and every element finite
        new = (new[0], xp.where(mlb, new[1], one), xp.where(mlb, new[2], zero),
               xp.where(mub, new[3], one), xp.where(mub, new[4], zero), new[5])
        fin = xp.all(xp.isfinite(new[0]), axis=1) & xp.all(xp.isfinite(new[1] * new[2] + new[3] * new[4]), axis=1)
        status = xp.where(running & ~fin, code["NUMERICAL_ERROR"], status)
        keep = (status == _RUNNING)
        st = tuple(xp.where(keep[:, None], a, o) for a, o in zip(new, st))

    return _finish(xp, best, status, iters, dtype, dev, final=True)


def _finish(xp, best, status, iters, dtype, dev, final: bool) -> IPMResult:
    """Result from the best points; ``final``: unfinished elements become SOLVED_INACCURATE / MAX_ITER."""
    xu, zu_, zbu, pres, dres, gap, tp, td, tg = best
    if final:
        running = status == _RUNNING
        # unfinished: SOLVED_INACCURATE when within 1e3 x tolerance, else MAX_ITER / TIME_LIMIT
        loose = (pres <= 1e3 * tp) & (dres <= 1e3 * td) & (gap <= 1e3 * tg)
        code = {k: xp.full(status.shape, CODES[k], dtype=xp.int32, device=dev)
                for k in ("SOLVED_INACCURATE", "MAX_ITER")}
        status = xp.where(running & loose & xp.isfinite(pres), code["SOLVED_INACCURATE"], status)
        status = xp.where(status == _RUNNING, code["MAX_ITER"], status)
    bad = ((status == CODES["PRIMAL_INFEASIBLE"]) | (status == CODES["DUAL_INFEASIBLE"])
           | (status == CODES["NUMERICAL_ERROR"]))
    nan = xp.full((), math.nan, dtype=dtype, device=dev)
    xu = xp.where(bad[:, None], nan, xu)
    zu_ = xp.where(bad[:, None], nan, zu_)
    zbu = xp.where(bad[:, None], nan, zbu)
    return IPMResult(xu, zu_, zbu, status, iters, pres, dres, gap)
