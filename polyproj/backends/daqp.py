"""DAQP backend: dual active-set method for dense QPs (exact on its final active set).

DAQP solves ``min ½xᵀHx + fᵀx  s.t.  blower <= [x; A x] <= bupper`` — the first ``n`` entries of
the bounds are simple bounds on ``x`` — with ``sense = 5`` marking equality rows, and returns
multipliers ``λ`` with ``Hx + f + [I; A]ᵀλ = 0``, ``λ > 0`` on an active upper side: polyproj's
convention, so ``z_box = λ[:n]`` and ``z = λ[n:]``. Infinite sides are DAQP's ±1e30. DAQP wants a
positive definite ``H``; for a singular one it regularises itself (proximal iterations, its
``eps_prox`` option), stopping those iterations at ``eta_prox`` (here 1e-2 · ``primal_tol`` unless
given). DAQP's tolerances are absolute: ``primal_tol`` is ``eps_abs + eps_rel · σ``, with ``σ`` the size of
x the data suggest (:func:`~polyproj.backends.scaling.plan`'s, the scale the guard holds ``eps_rel`` to);
``max_iter`` maps to ``iter_limit``,
``time_limit`` to its own (checked every 32 iterations). A warm start passes the multipliers
(``dual_start``: the active set they imply). Sparse data are densified.
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from ..linalg import own_contiguous
from ..problem import QP
from ..runtime import cpu_count, parallel_map
from ..solution import Solution, Status
from .base import Capabilities, QPSolver, report_batch
from .cache import converted
from .options import nonnegative, positive, positive_int
from .presolve import fixed_variables, solve_without_fixed
from .warm import kkt_sizes, solved_again_cold

__all__ = ["DAQPSolver"]

_INF = 1e30
#: n² (m + n) (n variables, m + p general rows) from which the points of a batch are solved on threads
POINT_WORK = 100_000
#: the most points of one part of a batch on threads
PART_POINTS = 64
#: DAQP's exit flags (daqp/include/constants.h)
_STATUS = {1: Status.SOLVED, 2: Status.SOLVED, -1: Status.PRIMAL_INFEASIBLE, -3: Status.DUAL_INFEASIBLE,
           -4: Status.MAX_ITER, -5: Status.NON_CONVEX, -7: Status.TIME_LIMIT}
_NAMES = {1: "optimal", 2: "soft optimal", -1: "infeasible", -2: "cycling", -3: "unbounded", -4: "iteration limit",
          -5: "non-convex", -6: "overdetermined initial working set", -7: "time limit"}


class DAQPSolver(QPSolver):
    """DAQP (``pip install "polyproj[daqp]"``).

    Backend-specific options (DAQP settings, passed as they are): ``dual_tol``, ``zero_tol``,
    ``pivot_tol``, ``progress_tol``, ``cycle_tol``, ``eps_prox``, ``eta_prox``, ``sing_tol``,
    ``refactor_tol``.
    """

    name = "daqp"
    capabilities = Capabilities(dense=True, sparse=False, warm_start=True, infeasibility=True)
    requires = ("daqp",)
    extra = "daqp"
    options: ClassVar[dict[str, Any]] = {
        "dual_tol": None, "zero_tol": None, "pivot_tol": None, "progress_tol": None, "cycle_tol": None,
        "eps_prox": None, "eta_prox": None, "sing_tol": None, "refactor_tol": None}
    option_checks: ClassVar[dict[str, Any]] = {
        "dual_tol": positive, "zero_tol": positive, "pivot_tol": positive, "progress_tol": nonnegative,
        "cycle_tol": positive_int, "eps_prox": nonnegative, "eta_prox": positive, "sing_tol": positive,
        "refactor_tol": positive}


    def _kwargs(self, qp: QP | None = None, **batched: np.ndarray) -> dict[str, Any]:
        """DAQP's settings for ``qp`` (and batched vectors replacing its own, as for :func:`.scaling.plan`)."""
        s = self.settings
        # DAQP's tolerances are absolute: eps_rel counts relative to the size of x the data suggest (σ of the
        # normalisation's plan: big-M sides capped, 1 for all-zero data; ~1 for data the guard normalised), the
        # scale the guard's residual test holds eps_rel to. Ignored, eps_abs = 0 with eps_rel = 1e-6 ran DAQP at
        # primal_tol = eta_prox = 0: QAFIRO and QSC205 "cycling", GENHS28 10,000 iterations
        tol = float(s["eps_abs"])
        if float(s["eps_rel"]) > 0 and qp is not None:
            from .scaling import plan

            tol += float(s["eps_rel"]) * plan(qp, force=True, **batched).sigma
        # a singular H is solved by proximal-point iterations that stop on eta_prox: DAQP's own choice
        # left duality gaps of ~2e-6 on QAFIRO and QADLITTL at eps_abs 1e-6; 1e-2 of the tolerance meets it
        kw: dict[str, Any] = {"primal_tol": tol, "eta_prox": 1e-2 * tol}
        if s["max_iter"] is not None:
            kw["iter_limit"] = int(s["max_iter"])
        if s["time_limit"] is not None:
            kw["time_limit"] = float(s["time_limit"])
        kw.update({k: v for k, v in self.backend_options.items() if v is not None})
        return kw

    @staticmethod
    def _data(qp: QP) -> tuple[np.ndarray, ...]:
        """``(H, A, bupper, blower, sense)`` in DAQP's layout, kept per problem (``qp.memo``)."""
        hit = qp.memo.get("daqp")
        if hit is None:
            d = qp.dense()
            upper = np.concatenate([qp.ub, qp.u])
            lower = np.concatenate([qp.lb, qp.l])
            sense = np.zeros(qp.n + qp.m, dtype=np.intc)
            sense[qp.n:][qp.eq_mask] = 5
            # DAQP's buffers must be writable (the QP's own arrays are read-only): copies shared by the QPs of
            # one P and C (a batch's with_vectors elements)
            H, A = converted("daqp", (qp.P, qp.C), None, lambda: (own_contiguous(d.P), own_contiguous(d.C)))
            hit = qp.memo["daqp"] = (H, A,
                                     np.where(np.isfinite(upper), upper, _INF),
                                     np.where(np.isfinite(lower), lower, -_INF), sense)
        return hit

    @classmethod
    def projection_arrays(cls, A: np.ndarray, a: np.ndarray, B: np.ndarray, b: np.ndarray, lb: np.ndarray,
                          ub: np.ndarray) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """DAQP's arrays of the projection QP with every row of ``[A; B]`` scaled to unit norm, and the norms.

        The set, so the projection, is that of the rows as given; DAQP's primal tolerance then measures a
        distance, as the polish's tests do. On rows of mixed scale (``[1e-6, 0, ...]`` beside ``[1, 1, ...]``)
        DAQP otherwise called feasible points infeasible. :meth:`solve_points` with the norms returns the
        multipliers of the rows as given (a row's multiplier divided by its norm).
        """
        from .projection import projection_qp

        rows = np.vstack([A, B])
        big = np.abs(rows).max(axis=1, initial=0.0)
        big = np.where(big > 0, big, 1.0)
        norm = big * np.linalg.norm(rows / big[:, None], axis=1)  # no overflow or underflow of the squares
        norm = np.where(norm > 0, norm, 1.0)
        m = A.shape[0]
        qp = projection_qp(A / norm[:m, None], a / norm[:m], B / norm[m:, None], b / norm[m:], lb, ub,
                           np.zeros(A.shape[1]))
        return cls._data(qp), norm

    def solve_projections(self, X: Any, data: Any, *, rough: bool = False, solved: Any = None) -> Any:
        """Projections onto shared constraint data: ``daqp.solve`` per point on arrays built once.

        The projection QP (``H = I``, ``f = −x``) changes only in ``f`` from point to point, so its DAQP
        arrays are built (and validated, as a :class:`~polyproj.problem.QP`) once for the batch and each
        point is one call of the solver. What the guard of :meth:`solve` adds per point is not needed here:
        the pipeline verifies every answer by the exact polish (KKT), and data far from unit scale (which
        the guard would normalise) take the generic path (:func:`~polyproj.backends.projection.solve_on_host`).
        ``solved``: what :meth:`solve_points` already returned for ``X`` on these arrays (the direct path's
        solves), taken instead of solving again where this path applies.
        """
        from ..linalg import to_host
        from .projection import _host_data, _sample, projection_qp, solve_on_host, start_from_solution
        from .scaling import plan

        d = _host_data(data)
        Xn = to_host(X)
        if not d.shared_matrices or d.a.ndim == 2 or d.b.ndim == 2 or d.lb.ndim == 2 or d.ub.ndim == 2 or \
                Xn.shape[0] == 0 or Xn.shape[1] == 0:
            return solve_on_host(self, X, data, rough=rough)
        qp = projection_qp(*_sample(d, 0), Xn[0])
        # data far from unit scale take the guard's normalisation; points far from it alone do not: a dual
        # active-set method is exact on its final working set at any |x| (the objective's scale only scales
        # the multipliers), while the normalisation's tolerances at |x| would leave errors of eps·|x|
        if plan(qp, q=np.zeros((1, d.n))) is not None:
            return solve_on_host(self, X, data, rough=rough)
        sol = solved if solved is not None else self.solve_points(Xn, *self.projection_arrays(*d.parts()))[0]
        return start_from_solution(sol, X, d.m, float(self.settings.get("eps_abs", 1e-8)))

    def solve_points(self, X: np.ndarray, arrays: tuple[np.ndarray, ...], row_norms: np.ndarray | None = None
                     ) -> tuple[Any, np.ndarray]:
        """``daqp.solve`` for each row ``x`` of ``X`` (f = −x) on one projection QP's arrays (:meth:`_data`).

        ``row_norms``: the norms the rows of ``arrays`` were divided by (:meth:`projection_arrays`); the
        multipliers returned are those of the rows as given. Returns the
        :class:`~polyproj.solution.BatchSolution` and DAQP's exit flags (1: optimal, 2: its soft optimum, both
        reported as solved; 0 for a point the time limit left unsolved).
        """
        import daqp

        from ..errors import SolverError
        from ..solution import BatchSolution

        t0 = time.perf_counter()
        H, A, upper, lower, sense = arrays
        limit = self.settings["time_limit"]
        N, n = X.shape[0], H.shape[0]
        F = np.ascontiguousarray(-np.asarray(X, dtype=np.float64))
        # eps_rel's scale from the projection QP these arrays hold (±1e30 reads as no bound) and the points
        kw = self._kwargs(QP(P=H, q=np.zeros(n), C=A, l=lower[n:], u=upper[n:], lb=lower[:n], ub=upper[:n],
                             check_psd=False), q=F) if float(self.settings["eps_rel"]) > 0 and N else self._kwargs()
        # the loop only calls the solver and stores its raw answer; statuses, the NaNs of failed solves and
        # the finiteness rule are applied to the whole batch after it (per point they cost as much as DAQP)
        x, lam = np.full((N, n), np.nan), np.full((N, A.shape[0] + n), np.nan)
        its, flags = np.zeros(N, dtype=np.int64), np.zeros(N, dtype=np.int64)

        def solve_rows(rows: slice) -> None:
            model = None  # one DAQP workspace per part: H and A set up once, only f changes per point
            for i in range(rows.start, rows.stop):
                if limit is not None and time.perf_counter() - t0 > limit:
                    break  # this point and the rest of the part: flag 0, TIME_LIMIT
                try:
                    if model is None and rows.stop - rows.start > 1 and _has_workspace():
                        model = daqp.Model()
                        setup = model.setup(H, F[i], A, upper, lower, sense.copy())
                        model.settings = kw
                        if not (isinstance(setup, tuple) and setup and setup[0] >= 0):
                            model = False  # refused at setup (e.g. crossing bounds): daqp.solve says why, per point
                    elif model:  # the cold working set again: each point's answer is that of daqp.solve
                        model.update(f=F[i], sense=sense.copy())
                    if model:
                        xi, _, flag, info = model.solve()
                    else:
                        xi, _, flag, info = daqp.solve(H, F[i], A, upper, lower, sense.copy(), **kw)
                except Exception as exc:  # the guard's rule: a backend's exception is a SolverError
                    raise SolverError(f"backend {self.name!r} raised {type(exc).__name__}: {exc}") from exc
                x[i], lam[i], flags[i], its[i] = xi, info["lam"], flag, info["iterations"]

        # DAQP's solve releases the GIL: the points are shared by one thread per core where a point's solve
        # (~ n² (m + n) flops: about n active-set steps of O(n (m + n))) outweighs the Python around it,
        # which holds the GIL (docs/performance.md); in parts of at most PART_POINTS (an error or an interrupt
        # stops the threads at the end of their part), at least one a core
        count = max(min(N, cpu_count()), -(-N // PART_POINTS)) if n * n * (A.shape[0] + n) >= POINT_WORK else 1
        edges = np.linspace(0, N, count + 1).round().astype(int)
        parallel_map(solve_rows, [slice(int(a), int(b)) for a, b in itertools.pairwise(edges)])
        status, x, lam = _answers(flags, x, lam)
        if row_norms is not None:
            lam[:, n:] /= row_norms
        sol = BatchSolution(x=x, z=lam[:, n:], z_box=lam[:, :n], status=status, iterations=its,
                            solve_time=time.perf_counter() - t0, backend=self.name)
        return sol, flags

    def solve(self, qp: QP, warm_start: Any = None) -> Solution:
        """Solve one QP with DAQP.

        Fixed variables (``lb == ub``) are substituted first (:mod:`.presolve`: DAQP called an LP with a fixed
        variable and a free one of zero cost dual infeasible); such a problem is solved without a warm start.
        A warm start is a hint: an answer after it that is not SOLVED and verified (:meth:`_verified`; TIME_LIMIT
        aside: the time is spent) is solved again cold. Started from the multipliers of a problem where
        ``x₁`` was fixed at 0, DAQP called ``0 <= x₁ <= 1`` with ``P = diag(0, 1)`` unbounded.
        """
        start = self._dual_start(qp, warm_start)
        sol = solve_without_fixed(self, qp, lambda q: self._solve(q, start if q is qp else None))
        if start is None or sol.status is Status.TIME_LIMIT or (sol.status is Status.SOLVED and self._verified(sol)):
            return sol
        return solved_again_cold(sol, solve_without_fixed(self, qp, self._solve))

    def _dual_start(self, qp: QP, warm_start: Any) -> np.ndarray | None:
        """DAQP's ``dual_start`` from a warm start's multipliers (``[z_box; z]``), None where none is used.

        None too where ``qp`` has fixed variables (the reduced problem is solved cold).
        """
        if warm_start is None or not self.settings["warm_start"] or fixed_variables(qp) is not None:
            return None
        get = warm_start.get if isinstance(warm_start, dict) else (lambda k: getattr(warm_start, k, None))
        z, zb = get("z"), get("z_box")
        if z is None or zb is None or not (np.all(np.isfinite(z)) and np.all(np.isfinite(zb))):
            return None
        return np.concatenate([np.asarray(zb, dtype=np.float64), np.asarray(z, dtype=np.float64)])

    def _verified(self, sol: Solution) -> bool:
        """Whether ``sol`` solves its QP to DAQP's tolerance (``primal_tol``): the KKT conditions of the QP as given.

        The primal residual, the dual residual with the multipliers on infinite sides
        (:meth:`~polyproj.solution.Solution.dual_residual`) and the duality gap, each to the tolerance plus the
        rounding of its terms (the gap to the tolerances times the other side's scale, as the guard's test).
        """
        sizes = kkt_sizes(sol)
        if sizes is None:
            return False
        size_p, size_d = sizes
        tol = float(self._kwargs(sol.qp)["primal_tol"])
        rnd = 1e3 * np.finfo(float).eps
        t_p, t_d = tol + rnd * size_p, tol + rnd * size_d
        return (sol.primal_residual() <= t_p and sol.dual_residual() <= t_d
                and sol.duality_gap() <= tol + t_p * size_d + t_d * size_p)

    def _solve(self, qp: QP, dual_start: np.ndarray | None = None) -> Solution:
        import daqp

        t0 = time.perf_counter()
        H, A, upper, lower, sense = self._data(qp)
        kw = self._kwargs(qp)
        if dual_start is not None:
            kw["dual_start"] = dual_start
        t1 = time.perf_counter()
        setup = t1 - t0
        x, _, flag, info = daqp.solve(H, own_contiguous(qp.q), A, upper, lower, sense.copy(), **kw)
        wall = time.perf_counter() - t1  # around the call (DAQP's info["solve_time"] leaves its own set-up out)
        if int(flag) == -6:  # dependent equality rows: DAQP cannot start from them
            answer = self._dependent_equalities(qp)
            if answer is not None:
                return answer
        (status,), X, L = _answers(np.array([int(flag)]), np.array(x, dtype=np.float64)[None, :],
                                   np.array(info["lam"], dtype=np.float64)[None, :])
        x, lam = X[0], L[0]
        if self.settings["verbose"]:  # DAQP prints no log of its own
            report_batch(self.name, [status], [int(info["iterations"])], wall)
        return Solution(x=x, z=lam[qp.n:], z_box=lam[:qp.n], status=status, iterations=int(info["iterations"]),
                        solve_time=wall, setup_time=setup, backend=self.name, qp=qp,
                        info={"raw_status": _NAMES.get(int(flag), str(flag))})


    def _dependent_equalities(self, qp: QP) -> Solution | None:
        """The answer when DAQP refused dependent equality rows ("overdetermined initial working set").

        Inconsistent rows: the set is empty, PRIMAL_INFEASIBLE. Consistent ones: the problem without the
        dependent rows (:func:`~polyproj.problem._dependent_rows`, as for a Polyhedron's ``B``), their
        multipliers zero (stationarity holds with the others'). None when the equalities have full rank (the
        refusal had another cause).
        """
        from ..problem import _dependent_rows, inconsistent_row

        eq = np.flatnonzero(qp.eq_mask)
        C = qp.dense().C
        dep = _dependent_rows(C[eq])
        if not dep:
            return None
        miss = inconsistent_row(C[eq], qp.u[eq])
        if miss is not None:
            sol = self._nan_solution(qp, Status.PRIMAL_INFEASIBLE, self.name)
            return replace(sol, info={**sol.info, "note": f"equality rows {eq.tolist()} are inconsistent (row "
                                      f"{int(eq[miss[0]])} misses by {miss[1]:.3g})"})
        rows = np.setdiff1d(np.arange(qp.m), eq[dep])
        part = self.solve(QP(P=qp.P, q=qp.q, C=C[rows], l=qp.l[rows], u=qp.u[rows], lb=qp.lb, ub=qp.ub,
                             check_psd=False))
        z = np.zeros(qp.m)
        z[rows] = part.z
        return replace(part, z=z, qp=qp, info={**part.info, "note": f"dependent equality rows dropped: "
                       f"{eq[dep].tolist()} (multipliers 0)"})


@functools.cache
def _has_workspace() -> bool:
    """``daqp.Model`` with ``update(f=, sense=)`` (DAQP 0.11, where it is tested; older ones solve per call)."""
    import daqp

    try:
        from importlib.metadata import version

        major, minor = (int(p) for p in version("daqp").split(".")[:2])
    except Exception:
        return False
    return hasattr(daqp, "Model") and (major, minor) >= (0, 11)


def _answers(flags: np.ndarray, x: np.ndarray, lam: np.ndarray) -> tuple[tuple[Status, ...], np.ndarray, np.ndarray]:
    """``(statuses, x, λ)`` from DAQP's exit flags and raw answers (b,), (b, n), (b, n + m); in place.

    ``x`` is kept for a solved, iteration- or time-limited solve (NaN otherwise); the multipliers only for a
    solved one (after a limit DAQP's multipliers vary from call to call on the same problem). A solved answer
    that is not finite becomes NUMERICAL_ERROR with ``x`` NaN (the guard's rule). Flag 0: a point the batch's
    time limit left unsolved.
    """
    ok = (flags == 1) | (flags == 2)
    bad = ok & ~(np.isfinite(x).all(axis=1) & np.isfinite(lam).all(axis=1))
    ok &= ~bad
    keep = ok | (flags == -4) | (flags == -7)
    lam[~ok] = np.nan
    x[~keep] = np.nan
    status = tuple(Status.TIME_LIMIT if f == 0 else Status.NUMERICAL_ERROR if b
                   else _STATUS.get(f, Status.NUMERICAL_ERROR) for f, b in zip(flags.tolist(), bad.tolist()))
    return status, x, lam
