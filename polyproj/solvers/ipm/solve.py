"""The public entry point :func:`solve_qp_batch`."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from .batch import SMALL_N, plan_parts, single_threaded_kernels, solve_batch
from .iteration import Settings
from .problem import as_batch_qp
from .result import IPMResult

__all__ = ["solve_qp_batch"]


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
    stall_iter: int | None = None,
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
        Tolerances of the stopping rule (:mod:`polyproj.solvers.ipm.termination`). For float32 data
        they are floored at ``1000 · eps(float32)`` times (1 + the size of each residual's terms at the point).
    max_iter : int
    warm_start : object or dict with ``x`` ((b, n) array), optional
        Checked and accepted, but it cannot start the method closer: Mehrotra's start is one Newton step
        from (x, s = z = 1), and for a QP (KKT residuals affine in x) the step's end is the same point from
        every x. A primal point alone is no warm start for an interior-point method.
    time_limit : float, optional
        Seconds; elements still running get code TIME_LIMIT.
    ruiz_iter : int
        Ruiz equilibration passes (0 disables scaling).
    batch_chunk : int, optional
        Largest batch solved at once (default: sized to keep the work arrays near 512 MB).
    threads : int or None
        CPU threads that solve parts of the batch concurrently (NumPy and torch CPU arrays; the
        heavy kernels release the GIL). ``None``: one per core. Each part gets at least 64 elements.
        With batch threads, or when n <= 256, BLAS and torch run single-threaded inside the call
        (batched small matrices gain nothing from intra-op threads). Other namespaces and devices
        ignore it.
    stall_iter : int, optional
        Stop an element near its tolerances (within 1000 of each) as SOLVED_INACCURATE once this many
        iterations have not halved its distance to them (:func:`~.termination.record`: the precision floor
        of the Newton systems); None (default): iterate on to ``max_iter``.

    Returns
    -------
    IPMResult
        Arrays in the namespace and on the device of the inputs.

    Raises
    ------
    ProblemError
        Inconsistent shapes, non-real dtypes, NaN/inf in P, q or C, a warm start of another array library, or a
        setting out of its range (tolerances >= 0 and not both 0, counts >= 1).

    Examples
    --------
    >>> import numpy as np
    >>> from polyproj.solvers.ipm import solve_qp_batch
    >>> C = np.ones((1, 2))
    >>> res = solve_qp_batch(np.eye(2), -np.array([[1.0, 1.0], [2.0, 0.0]]), C, [-np.inf], [1.0])
    >>> np.round(res.x, 6)
    array([[ 0.5,  0.5],
           [ 1.5, -0.5]])
    >>> [s.name for s in res.statuses()]
    ['SOLVED', 'SOLVED']
    """
    _check_settings(eps_abs=eps_abs, eps_rel=eps_rel, max_iter=max_iter, time_limit=time_limit, ruiz_iter=ruiz_iter,
                    batch_chunk=batch_chunk, threads=threads, stall_iter=stall_iter)
    xp, qp = as_batch_qp(P, q, C, l, u, lb, ub, warm_start)
    settings = Settings(float(eps_abs), float(eps_rel), int(max_iter), int(ruiz_iter),
                        None if time_limit is None else time.perf_counter() + float(time_limit),
                        None if stall_iter is None else int(stall_iter))
    chunk, n_workers = plan_parts(xp, qp, batch_chunk, threads)
    # batched small matrices gain nothing from intra-op threads, and on a loaded machine OpenMP /
    # OpenBLAS thread wake-ups cost more than the kernels
    single = n_workers > 1 or qp.n <= SMALL_N
    with single_threaded_kernels(xp, qp.q) if single else contextlib.nullcontext():
        return solve_batch(xp, qp, settings, chunk, n_workers)


def _check_settings(**given: Any) -> None:
    """ProblemError naming a setting of :func:`solve_qp_batch` out of its range (None: the default)."""
    from ...backends.options import nonnegative, nonnegative_int, positive_int
    from ...errors import ProblemError

    checks = {"eps_abs": nonnegative, "eps_rel": nonnegative, "max_iter": positive_int, "time_limit": nonnegative,
              "ruiz_iter": nonnegative_int, "batch_chunk": positive_int, "threads": positive_int,
              "stall_iter": positive_int}
    for k, v in given.items():
        why = None if v is None else checks[k](v)
        if why is not None:
            raise ProblemError(f"solve_qp_batch: {k} {why}, got {v!r}")
    if not (given["eps_abs"] > 0 or given["eps_rel"] > 0):
        raise ProblemError("solve_qp_batch: eps_abs and eps_rel are both 0; no iterate meets a zero tolerance")
