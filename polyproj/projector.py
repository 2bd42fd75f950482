"""Exact projection onto a polyhedron with any backend: solve, identify the active set, polish.

``project(X, P)`` asks a backend for the projection (one QP with ``P = I, q = -x`` per row of
``X``), then identifies the active set from *both* the slacks and the multipliers (DESIGN §5) and
**polishes**: it solves the equality-constrained projection onto the candidate active rows exactly
(:func:`polyproj.hs_jacobian.project_on_face`) and accepts it when it is feasible and its
inequality multipliers are non-negative — the KKT conditions of the projection. Rows with negative
multipliers are dropped and violated rows added (a primal–dual active-set step) until the KKT
conditions hold or ``max_polish_iter`` is reached. The result is then exact to rounding whatever the
backend's accuracy, and its active set is the one the HS-Jacobian needs. When polish is refused the
result says so (``polished[i]`` False) and keeps the backend's point.

A backend that reports PRIMAL_INFEASIBLE for some points of a batch while it solved others to
feasible points of the same polyhedron is wrong about those (ProxSuite's dense solver does this on a
few points at tight tolerances): they are solved again one by one, what stays flagged is solved by
an independent backend (polyproj's IPM; HiGHS when the backend is the IPM), and what both flag is
polished from ``x`` — accepted when the KKT conditions are verified, NaN with a warning otherwise.
When it flags every point (a single point, or a batch with none solved), the independent backend is
asked before the polyhedron is called empty.
"""

from __future__ import annotations

import functools
import itertools
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .errors import InfeasibleError, PolyprojError, PolyprojWarning, ProblemError
from .polish import polish as polish_batch
from .problem import Polyhedron
from .registry import get_backend
from .solution import BatchSolution, Solution, Status
from .threads import small_blas

__all__ = ["ProjectionResult", "project"]


@dataclass(frozen=True)
class ProjectionResult:
    """Result of :func:`project`.

    For a single point ``x`` of shape ``(n,)`` the batch dimension is dropped from every array and
    ``status`` / ``polished`` are scalars.

    Attributes
    ----------
    y : (batch, n)
        The projections.
    active : (batch, n_ineq) bool
        Active inequality-form rows (rows of A, then finite lb, then finite ub).
    multipliers : (batch, n_ineq + m_eq)
        KKT multipliers: ``>= 0`` for inequality-form rows, free for the rows of B, with
        ``y − x + A_Iᵀλ_I + Bᵀμ − λ_lb + λ_ub = 0``.
    status : Status or tuple of Status
    max_violation : float
        Largest constraint violation over the batch.
    violation : (batch,)
    polished : bool or (batch,) bool
        Whether the exact polish was accepted (the KKT conditions hold to rounding).
    backend : str
    solution : BatchSolution
        What the backend returned.
    """

    y: np.ndarray
    active: np.ndarray
    multipliers: np.ndarray
    status: Any
    max_violation: float
    violation: np.ndarray
    polished: Any
    backend: str
    solution: BatchSolution | Solution | None = field(default=None, repr=False)


@functools.lru_cache(maxsize=32)
def _projection_qp(polyhedron: Polyhedron):
    return polyhedron.projection_qp()


def _unpolished(P: Polyhedron, Y: np.ndarray, mult0: np.ndarray, z: np.ndarray, eps: float):
    """Active set and multipliers of points that were not polished (both signals, DESIGN §5).

    A row is active when its slack is below a tolerance scaled to its right-hand side *or* its
    multiplier is clearly positive.
    """
    rhs = np.concatenate([P.a, -P.lb[P.lb_idx], P.ub[P.ub_idx]])
    tol = max(1e-7, 100.0 * eps)
    mscale = 1.0 + np.max(np.abs(mult0), axis=1, keepdims=True, initial=0.0)
    active = np.isfinite(rhs)[None, :] & (
        (P.ineq_slack(Y) <= tol * (1 + np.abs(np.nan_to_num(rhs)))) | (mult0 > tol * mscale))
    eqm = np.nan_to_num(np.atleast_2d(z))[:, P.m_ineq:]
    return active, np.concatenate([np.maximum(mult0, 0), eqm], axis=1)


def _backend_multipliers(P: Polyhedron, sol: BatchSolution) -> np.ndarray:
    """Inequality-form multipliers (>= 0 meaningful) from the backend's z, z_box."""
    z = np.nan_to_num(np.atleast_2d(sol.z))
    zb = np.nan_to_num(np.atleast_2d(sol.z_box))
    return np.concatenate([z[:, : P.m_ineq], -zb[:, P.lb_idx], zb[:, P.ub_idx]], axis=1)


def _polish(P: Polyhedron, X, Y0, mult0, *, cand_tol, dist_tol, tol, max_iter):
    """Primal–dual active-set polish (:func:`polyproj.polish.polish`) in the Polyhedron numbering.

    Returns Y, active (batch, n_ineq), mult (ineq + eq), accepted mask.
    """
    m, n = P.m_ineq, P.n
    cols = np.concatenate([np.arange(m), m + P.lb_idx, m + n + P.ub_idx])
    full0 = np.zeros((X.shape[0], m + 2 * n))
    full0[:, cols] = mult0

    def part(sl):
        return polish_batch(X[sl], P.A_dense, P.a, P.B_dense, P.b, P.lb, P.ub, Y0[sl], full0[sl],
                            cand_tol=cand_tol, dist_tol=dist_tol, tol=tol, max_iter=max_iter)

    # the samples are independent: a large batch is polished in parts of about _polish_part(n) (its
    # cost grows faster than the batch: n 100, batch 4096 in one part 3.5 s, in 16 parts 1.0 s), one
    # thread per core (the NumPy kernels release the GIL; batch 1024: 0.52 -> 0.25 s)
    parts = X.shape[0] // _polish_part(n)
    if parts > 1:
        bounds = np.linspace(0, X.shape[0], parts + 1).astype(int)
        with ThreadPoolExecutor(min(parts, os.cpu_count() or 1)) as pool:
            outs = list(pool.map(part, [slice(i, j) for i, j in itertools.pairwise(bounds)]))
        Y, active, mult, mu, accepted = (np.concatenate([o[k] for o in outs], axis=0) for k in range(5))
    else:
        Y, active, mult, mu, accepted = part(slice(None))
    return Y, active[:, cols], np.concatenate([mult[:, cols], mu], axis=1), accepted


_POLISH_PART = 256  # size of the parts a large batch is polished in, at n 100 ...


def _polish_part(n: int) -> int:
    """... and at other n: ~256 (100/n)² samples, 256 to 2048.

    Small faces need big parts: each part pays a fixed cost per active-set round, mostly Python
    work that holds the GIL (n 20, batch 4096: 0.30 s in parts of 256, 0.12 s in parts of 2048).
    """
    return int(min(2048, max(_POLISH_PART, _POLISH_PART * (100.0 / max(n, 1)) ** 2)))


def project(
    X: Any,
    polyhedron: Polyhedron,
    backend: Any = "proxsuite",
    *,
    polish: bool = True,
    tol: float = 1e-9,
    max_polish_iter: int = 50,
    **settings: Any,
) -> ProjectionResult:
    """Project points onto a polyhedron exactly, with the active set.

    Parameters
    ----------
    X : (n,) or (batch, n) array
    polyhedron : Polyhedron
    backend : str or QPSolver
        Any registered backend (default ``"proxsuite"``); batches use its native ``solve_batch``.
    polish : bool
        Polish to the exact projection on the identified active face (default True).
    tol : float
        Tolerance of the KKT checks of the polish (relative to the scale of each row).
    max_polish_iter : int
        Active-set corrections allowed during polish.
    **settings
        Backend settings (``eps_abs``, ``max_iter``, ...).

    Returns
    -------
    ProjectionResult

    Raises
    ------
    ProblemError
        X of the wrong shape, or holding NaN/inf.
    InfeasibleError
        The polyhedron is empty (``.solution`` holds the backend's answer).

    Examples
    --------
    >>> import numpy as np, polyproj as pp
    >>> simplex = pp.Polyhedron(B=np.ones((1, 3)), b=[1.0], lb=np.zeros(3))
    >>> res = pp.project(np.array([0.9, 0.5, -1.0]), simplex)
    >>> np.round(res.y, 12), res.active
    (array([0.7, 0.3, 0. ]), array([False, False,  True]))
    """
    if not isinstance(polyhedron, Polyhedron):
        raise ProblemError(f"polyhedron must be a polyproj.Polyhedron, got {type(polyhedron).__name__}")
    if hasattr(X, "detach"):
        raise ProblemError("pp.project takes NumPy arrays; use polyproj.adapters.torch.project for tensors")
    Xa = np.asarray(X)
    if Xa.dtype.kind not in "biuf":
        raise ProblemError(f"X must hold real numbers, got dtype {Xa.dtype}")
    single = Xa.ndim == 1
    X2 = np.atleast_2d(np.asarray(Xa, dtype=np.float64))
    if X2.ndim != 2 or X2.shape[1] != polyhedron.n:
        raise ProblemError(f"X must have shape ({polyhedron.n},) or (batch, {polyhedron.n}), got {Xa.shape}")
    if not np.all(np.isfinite(X2)):
        i = np.argwhere(~np.isfinite(X2))[0]
        raise ProblemError(f"X contains NaN or inf (first at {tuple(int(v) for v in i) if not single else int(i[1])})")
    solver = get_backend(backend, **settings)
    if X2.shape[0] == 0:  # an empty batch projects to an empty batch
        empty = np.zeros((0, polyhedron.n))
        return ProjectionResult(empty, np.zeros((0, polyhedron.n_ineq), dtype=bool),
                                np.zeros((0, polyhedron.n_ineq + polyhedron.m_eq)), (), 0.0, np.zeros(0),
                                np.zeros(0, dtype=bool), solver.name, None)
    qp = _projection_qp(polyhedron)
    # backends that can stop early and leave the rest to the polish (the batched IPM) first solve to
    # a loose relative tolerance; the points whose polish is refused are solved again as asked
    stop_rel = getattr(solver, "projection_stop_rel", None) if polish else None
    first = solver
    if stop_rel is not None and float(solver.settings.get("eps_rel") or 0.0) < stop_rel:
        first = type(solver)(**{**solver.settings, "eps_rel": float(stop_rel)})
    sol = _solve_points(first, qp, X2)
    statuses = list(sol.status)
    flagged = np.array([st is Status.PRIMAL_INFEASIBLE for st in statuses])
    report = None
    if flagged.any():
        sol, statuses, flagged, report = _recheck_infeasible(solver, qp, polyhedron, X2, sol, flagged)
    # the rest is batched NumPy work on small arrays: one BLAS thread (multithreaded OpenBLAS on
    # these sizes mostly synchronises, and stalls badly when the cores are busy)
    with small_blas():
        Y0 = np.array(sol.x, dtype=np.float64)
        mult0 = _backend_multipliers(polyhedron, sol)
        Y0[flagged] = np.nan  # false reports that a re-solve could not fix (see _recheck_infeasible)
        if polish:
            eps = float(solver.settings.get("eps_abs", 1e-8))

            def polish_at(rows, accuracy):  # candidate thresholds from the backend's accuracy
                return _polish(polyhedron, X2[rows], Y0[rows], mult0[rows], cand_tol=max(1e-7, 10.0 * accuracy),
                               dist_tol=max(1e-9, accuracy), tol=tol, max_iter=max_polish_iter)

            Y, active, mult, accepted = polish_at(slice(None), eps if first is solver else max(eps, float(stop_rel)))
            # a point still flagged starts the polish from x: its answer counts when the KKT
            # conditions are verified (a proof of optimality), else it stays NaN
            again = ~accepted & ~flagged
            if first is not solver and again.any():  # the early stop was too early for these points
                idx = np.flatnonzero(again)
                sol2 = _solve_points(solver, qp, X2[idx])
                Y0[idx] = np.asarray(sol2.x, dtype=np.float64)
                mult0[idx] = _backend_multipliers(polyhedron, sol2)
                Y[idx], active[idx], mult[idx], accepted[idx] = polish_at(idx, eps)
                sol = _patch(sol, idx, sol2)
                statuses = list(sol.status)
            Y = np.where(accepted[:, None], Y, Y0)
            statuses = [Status.SOLVED if acc else st for acc, st in zip(accepted, statuses, strict=True)]
            refused = ~accepted & ~flagged  # flagged points (NaN) are reported below
            if refused.any():
                warnings.warn(
                    f"polish refused for {int(refused.sum())} of {len(accepted)} points: the KKT "
                    "conditions could not be verified on the identified active set; those points keep "
                    f"the backend's accuracy (statuses {sorted({s.name for s in np.array(sol.status)[refused]})})",
                    PolyprojWarning,
                    stacklevel=2,
                )
            if not accepted.all():  # refused points keep the backend's point, active set by both signals
                bad = ~accepted
                active[bad], mult[bad] = _unpolished(polyhedron, Y[bad], mult0[bad], np.atleast_2d(sol.z)[bad], eps)
        else:
            Y = Y0
            accepted = np.zeros(X2.shape[0], dtype=bool)
            eps = float(solver.settings.get("eps_abs", 1e-8))
            active, mult = _unpolished(polyhedron, Y, mult0, sol.z, eps)
        if report is not None:
            by_polish, nan = int((flagged & accepted).sum()), int((flagged & ~accepted).sum())
            warnings.warn(report + (f", {by_polish} by the exact polish from x" if by_polish else "")
                          + (f", {nan} returned as NaN" if nan else ""), PolyprojWarning, stacklevel=2)
        viol = polyhedron.violation(Y)
    if single:
        return ProjectionResult(Y[0], active[0], mult[0], statuses[0], float(viol[0]), viol,
                                bool(accepted[0]), solver.name, sol.solution(0))
    return ProjectionResult(Y, active, mult, tuple(statuses), float(np.max(viol)), viol, accepted,
                            solver.name, sol)


def _solve_points(solver, qp, X2: np.ndarray) -> BatchSolution:
    """The projections of the rows of ``X2`` (``q = -x``) by ``solver``, as a batch."""
    if X2.shape[0] == 1:
        return BatchSolution.stack([solver.solve(qp.with_vectors(validate=False, q=-X2[0]))], backend=solver.name)
    return solver.solve_batch(qp, q=-X2)


def _patch(sol: BatchSolution, idx: np.ndarray, part: BatchSolution, rows: np.ndarray | None = None) -> BatchSolution:
    """``sol`` with the elements ``idx`` replaced by the elements ``rows`` of ``part`` (default: all)."""
    rows = np.arange(len(part)) if rows is None else rows
    x, z, zb = (np.array(a, dtype=np.float64) for a in (sol.x, sol.z, sol.z_box))
    it = np.array(sol.iterations)
    st = list(sol.status)
    x[idx], z[idx], zb[idx] = (np.asarray(a)[rows] for a in (part.x, part.z, part.z_box))
    it[idx] = np.asarray(part.iterations)[rows] + it[idx]
    for i, k in zip(idx, rows, strict=True):
        st[i] = part.status[k]
    return replace(sol, x=x, z=z, z_box=zb, iterations=it, status=tuple(st))


def _feasible_points(polyhedron: Polyhedron, sol: BatchSolution) -> np.ndarray:
    """Elements solved to a finite point of the polyhedron (a proof that it is not empty)."""
    x = np.asarray(sol.x, dtype=np.float64)
    good = sol.ok & np.isfinite(x).all(axis=1)
    if good.any():
        good[good] = polyhedron.violation(x[good]) <= 1e-5
    return good


def _recheck_infeasible(solver, qp, polyhedron: Polyhedron, X2, sol: BatchSolution, flagged):
    """Re-solve elements of a batch reported PRIMAL_INFEASIBLE.

    The polyhedron is shared, so an element solved to a feasible point proves it is not empty and
    the other reports are false (ProxSuite's dense solver gives a few at tight tolerances): those
    elements are solved again one by one, warm-started at that feasible point. What the backend still
    flags, and every flagged point when no element was solved (a single point, or every point
    flagged: no proof), goes to an independent backend (polyproj's IPM; HiGHS when the backend is the
    IPM); the polyhedron is called empty only when that finds no point of it either (random checks:
    ProxSuite at eps_abs 1e-10 misreported 1 of 20 feasible single projections, and kept flagging 2
    points of a batch of 62 on their own, which then came back as NaN).
    Returns the (patched) batch solution, its statuses, the elements still flagged and the start of
    the warning :func:`project` completes (the polish may still verify a flagged point from x).
    """
    idx = np.flatnonzero(flagged)
    donors = np.flatnonzero(_feasible_points(polyhedron, sol))
    head = f"backend {solver.name!r} reported PRIMAL_INFEASIBLE for {int(flagged.sum())} of {len(sol.status)} points "
    report = ""
    if donors.size:
        warm = {"x": np.asarray(sol.x, dtype=np.float64)[donors[0]]} if solver.capabilities.warm_start else None
        again = BatchSolution.stack([solver.solve(qp.with_vectors(validate=False, q=-X2[i]), warm_start=warm)
                                     for i in idx], backend=solver.name)
        good = _feasible_points(polyhedron, again)
        if good.any():
            sol = _patch(sol, idx[good], again, np.flatnonzero(good))
        report = head + ("although others were solved to feasible points of the same polyhedron; solved again one "
                         f"by one: {int(good.sum())} recovered")
        idx = idx[~good]
    if idx.size:  # no proof that the polyhedron is not empty, or points the backend keeps flagging
        other = "highs" if solver.name == "ipm" else "ipm"
        empty = InfeasibleError(
            f"the polyhedron is empty (backend {solver.name!r} reports PRIMAL_INFEASIBLE): "
            f"{Status.PRIMAL_INFEASIBLE.message}",
            solution=sol,
        )
        try:
            alt = get_backend(other)
        except PolyprojError:  # no independent backend installed: the report stands
            if not donors.size:
                raise empty from None
            alt = None
        if alt is not None:
            again = _solve_points(alt, qp, X2[idx])
            good = _feasible_points(polyhedron, again)
            if not donors.size and not good.any():
                raise empty
            if good.any():
                sol = _patch(sol, idx[good], again, np.flatnonzero(good))
            if not donors.size:
                report = head + (f"and solved none; backend {other!r} found them feasible: "
                                 f"{int(good.sum())} solved by it")
            elif good.any():
                report += f"; backend {other!r} solved {int(good.sum())} it kept flagging"
    statuses = list(sol.status)
    still = np.array([st is Status.PRIMAL_INFEASIBLE for st in statuses])
    return sol, statuses, still, report
