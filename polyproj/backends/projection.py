"""Projections as QPs: the backends' entry point of the projection pipeline.

The projection of ``x`` onto ``P = {Ay <= a, By = b, lb <= y <= ub}`` is the QP with ``P = I``,
``q = -x``, ``C = [A; B]``, ``l = [-inf; b]``, ``u = [a; b]``. :func:`solve_on_host` is the default
:meth:`QPSolver.solve_projections <polyproj.backends.base.QPSolver.solve_projections>` of every backend
that works on NumPy: the batch goes to the host once (a CPU solver needs it there), is solved by the
backend's ``solve_batch`` (constraint matrices shared) or ``solve`` per sample (per-sample matrices),
and the start comes back in the input's namespace and device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..linalg import from_host, to_host
from ..polydata import PolyData, qp_multipliers_to_rows
from ..problem import QP
from ..solution import BatchSolution, LazyQPs, Status

if TYPE_CHECKING:  # pragma: no cover
    from .base import QPSolver

__all__ = ["ProjectionStart", "projection_qp", "solve_on_host"]


@dataclass(frozen=True)
class ProjectionStart:
    """A backend's projections of a batch: the start of the exact polish.

    Attributes
    ----------
    y : (batch, n) array in the input's namespace
    mult : (batch, m + 2n) array
        Inequality-row multipliers (rows numbered as in :mod:`polyproj.polydata`; NaN-free).
    mu : (batch, p) array
        Equality multipliers.
    status : tuple of Status
    accuracy : float
        The absolute accuracy the backend worked to (sets the polish's candidate thresholds).
    dist_factor : float
        Distance candidates are rows within ``dist_factor · accuracy`` of their hyperplane (below 1 for
        backends whose multipliers are exact zeros off the active rows).
    rough : bool
        The backend stopped once the face looked identified (``solve_projections(rough=True)``).
    solution : BatchSolution or None
        What the backend returned, when it works through QPs.
    """

    y: Any
    mult: Any
    mu: Any
    status: tuple[Status, ...]
    accuracy: float
    dist_factor: float = 1.0
    rough: bool = False
    solution: BatchSolution | None = None


def projection_qp(A: np.ndarray, a: np.ndarray, B: np.ndarray, b: np.ndarray, lb: np.ndarray, ub: np.ndarray,
                  x: np.ndarray) -> QP:
    """The QP of the projection of ``x`` (NumPy, one sample)."""
    n, m = x.shape[0], A.shape[0]
    return QP(P=np.eye(n), q=-x, C=np.vstack([A, B]), l=np.concatenate([np.full(m, -np.inf), b]),
              u=np.concatenate([a, b]), lb=lb, ub=ub, check_psd=False)


def _host_data(data: PolyData) -> PolyData:
    return PolyData(*(to_host(v) for v in data.parts()))


def _batch_vectors(d: PolyData, Xn: np.ndarray) -> dict[str, np.ndarray]:
    """The batched vectors of a shared-matrix projection batch for ``solve_batch``."""
    N, m, p = Xn.shape[0], d.m, d.p
    vecs: dict[str, np.ndarray] = {"q": -Xn}
    if d.a.ndim == 2 or d.b.ndim == 2:
        ab = np.broadcast_to(d.a, (N, m))
        bb = np.broadcast_to(d.b, (N, p))
        vecs["l"] = np.concatenate([np.full((N, m), -np.inf), bb], axis=1)
        vecs["u"] = np.concatenate([ab, bb], axis=1)
    if d.lb.ndim == 2:
        vecs["lb"] = d.lb
    if d.ub.ndim == 2:
        vecs["ub"] = d.ub
    return vecs


def _sample(d: PolyData, i: int) -> tuple[np.ndarray, ...]:
    def pick(v, nd):
        return v[i] if v.ndim == nd else v

    return pick(d.A, 3), pick(d.a, 2), pick(d.B, 3), pick(d.b, 2), pick(d.lb, 2), pick(d.ub, 2)


#: bytes a native batch of projections may hold at once (solver workspaces grow with every element)
CHUNK_BYTES = 2**28


def chunk_size(n: int, rows: int) -> int:
    """Elements per native batch call: solver workspaces take about ``16 (n + rows)²`` bytes an element."""
    return max(1, CHUNK_BYTES // (16 * (n + rows) ** 2))


def solve_qps(solver: QPSolver, X: np.ndarray, d: PolyData) -> BatchSolution:
    """The projections of the rows of ``X`` (NumPy) onto host data ``d`` by ``solver``, as a batch.

    Shared matrices: the backend's ``solve_batch`` in chunks of :func:`chunk_size` elements, so that memory
    stays bounded (about :data:`CHUNK_BYTES` of solver workspace) whatever the batch.
    """
    N = X.shape[0]
    if d.shared_matrices:
        qp = projection_qp(*_sample(d, 0), X[0])
        if N == 1:
            return BatchSolution.stack([solver.solve(qp)], backend=solver.name)
        vecs = _batch_vectors(d, X)
        step = chunk_size(d.n, d.m + d.p)
        if N <= step:
            return solver.solve_batch(qp, **vecs)
        parts = [solver.solve_batch(qp, **{k: v[i: i + step] for k, v in vecs.items()}) for i in range(0, N, step)]
        return _concat(parts, solver.name)
    sols = [solver.solve(projection_qp(*_sample(d, i), X[i])) for i in range(N)]
    return BatchSolution.stack(sols, backend=solver.name)


class _Chain(LazyQPs):
    """The element QPs of consecutive batches, one sequence (built on access)."""

    def __init__(self, seqs: list) -> None:
        self._seqs = seqs
        self._starts = np.cumsum([0] + [len(q) for q in seqs])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _item(self, i: int) -> Any:
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        return self._seqs[k][i - int(self._starts[k])]


def _concat(parts: list[BatchSolution], name: str) -> BatchSolution:
    cat = {k: np.concatenate([np.atleast_2d(getattr(p, k)) for p in parts]) for k in ("x", "z", "z_box")}
    qps = None if any(p.qps is None for p in parts) else _Chain([p.qps for p in parts])
    return BatchSolution(**cat, status=tuple(s for p in parts for s in p.status),
                         iterations=np.concatenate([np.asarray(p.iterations) for p in parts]),
                         solve_time=sum(p.solve_time for p in parts), setup_time=sum(p.setup_time for p in parts),
                         backend=name, qps=qps)


def start_from_solution(sol: BatchSolution, like: Any, m: int, accuracy: float, *, rough: bool = False,
                        dist_factor: float = 1.0) -> ProjectionStart:
    """A :class:`ProjectionStart` in the namespace of ``like`` from a batch of QP solutions."""
    x = np.atleast_2d(np.asarray(sol.x, dtype=np.float64))
    z = np.atleast_2d(np.asarray(sol.z, dtype=np.float64))
    zb = np.atleast_2d(np.asarray(sol.z_box, dtype=np.float64))
    mult = qp_multipliers_to_rows(np, z, zb, m)
    mu = np.nan_to_num(z[:, m:])
    return ProjectionStart(from_host(x, like), from_host(mult, like), from_host(mu, like), tuple(sol.status),
                           accuracy, dist_factor, rough, sol)


def solve_on_host(solver: QPSolver, X: Any, data: PolyData, *, rough: bool = False) -> ProjectionStart:
    """Default projection entry of a NumPy backend: one trip to the host and back (see the module docstring)."""
    d = _host_data(data)
    sol = solve_qps(solver, to_host(X), d)
    return start_from_solution(sol, X, d.m, float(solver.settings.get("eps_abs", 1e-8)))
