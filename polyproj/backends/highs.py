"""HiGHS backend (highspy): active-set QP solver (simplex for LPs), bounds as column bounds.

HiGHS solves ``min cᵀx + ½xᵀQx  s.t.  L <= Ax <= U, lb <= x <= ub`` with ``Q`` given as its lower
triangle in column-wise (CSC) form. Its duals satisfy ``Qx + c - Aᵀy - s = 0`` (``y`` row duals,
``s`` column duals / reduced costs), so polyproj's multipliers are ``z = -y`` and ``z_box = -s``.
A non-convex ``Q`` is reported by HiGHS as a model/solve error and mapped to NON_CONVEX (never a
silent answer); ``time_limit`` and ``max_iter`` map to HiGHS's ``time_limit`` and
``qp_iteration_limit`` / ``simplex_iteration_limit``.
"""

from __future__ import annotations

import functools
import time
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from ..errors import SettingsError
from ..problem import QP
from ..solution import Solution, Status, all_finite
from .base import Capabilities, QPSolver
from .cache import converted
from .convexity import is_nonconvex, is_strictly_convex
from .options import nonnegative, nonnegative_int, one_of, positive
from .presolve import solve_without_fixed
from .quiet import c_stdout_silenced
from .validation import check_solution

__all__ = ["HiGHSSolver"]


def _arrays(qp: QP) -> tuple[np.ndarray, ...]:
    """HiGHS's constraint matrix (column-wise C) and Hessian (lower triangle of P) as CSC arrays.

    ``(a_start, a_index, a_value, q_start, q_index, q_value)`` in HiGHS's integer type; built once
    per (P, C) and cached by the caller. ``q_value`` is empty when P = 0 (an LP).
    """
    A = sp.csc_matrix(qp.C)
    Q = sp.csc_matrix(np.tril(qp.P)) if not sp.issparse(qp.P) else sp.tril(qp.P, format="csc")
    Q.eliminate_zeros()
    A.sort_indices()
    Q.sort_indices()

    def ints(v):
        return np.ascontiguousarray(v, dtype=np.int32)

    def reals(v):
        return np.ascontiguousarray(v, dtype=np.float64)

    return (ints(A.indptr), ints(A.indices), reals(A.data), ints(Q.indptr), ints(Q.indices), reals(Q.data))


def _matrices(qp: QP) -> tuple[Any, Any]:
    """HiGHS's constraint matrix and Hessian objects (None if P = 0), from the cached arrays."""
    import highspy

    a_start, a_index, a_value, q_start, q_index, q_value = converted("highs", (qp.P, qp.C), None, lambda: _arrays(qp))
    mat = highspy.HighsSparseMatrix()
    mat.format_ = highspy.MatrixFormat.kColwise
    mat.num_col_, mat.num_row_ = qp.n, qp.m
    mat.start_, mat.index_, mat.value_ = a_start, a_index, a_value
    if not q_value.size:
        return mat, None
    hess = highspy.HighsHessian()
    hess.dim_ = qp.n
    hess.format_ = highspy.HessianFormat.kTriangular
    hess.start_, hess.index_, hess.value_ = q_start, q_index, q_value
    return mat, hess


_STRINGS: dict[tuple[Any, Any], tuple[str, str]] = {}


def _status_strings(h: Any, ms: Any, run_status: Any) -> tuple[str, str]:
    """``(modelStatusToString, str(run_status))``, converted once per pair of enum values (~1.5 µs a solve)."""
    key = (ms, run_status)
    out = _STRINGS.get(key)
    if out is None:
        out = _STRINGS[key] = (h.modelStatusToString(ms), str(run_status))
    return out


@functools.cache
def _status_map() -> dict[Any, Status]:
    """HiGHS model statuses to polyproj's (looked up once)."""
    import highspy

    M = highspy.HighsModelStatus
    return {
        M.kOptimal: Status.SOLVED,
        M.kInfeasible: Status.PRIMAL_INFEASIBLE,
        M.kUnbounded: Status.DUAL_INFEASIBLE,
        M.kUnboundedOrInfeasible: Status.DUAL_INFEASIBLE,
        M.kTimeLimit: Status.TIME_LIMIT,
        M.kIterationLimit: Status.MAX_ITER,
    }


@functools.cache
def _banner_shown() -> bool:
    """Construct one ``Highs`` with the C-level stdout silenced: HiGHS prints its banner there once per process."""
    import highspy

    with c_stdout_silenced():
        highspy.Highs()
    return True


def _new_highs() -> Any:
    """A ``highspy.Highs`` without the banner (polyproj is quiet unless ``verbose``)."""
    import highspy

    _banner_shown()
    return highspy.Highs()


def _quadratic(qp: QP) -> bool:
    """P ≠ 0: HiGHS runs its QP solver (P = 0: the simplex)."""
    return qp.P.nnz > 0 if sp.issparse(qp.P) else bool(np.any(qp.P))


def qp_iteration_cap(qp: QP) -> int:
    """HiGHS's QP iteration limit when ``max_iter`` is not set: 10,000 + 1,000 (n + m).

    An active-set QP solve takes O(n + m) iterations (on Maros–Meszaros HiGHS's most, among the problems it
    solves, is 26 (n + m): QPCSTAIR); HiGHS 1.16's cycles on some singular, badly scaled QPs (a 10-variable
    one ran 400,000 iterations in 2 s without end), and its own limit is 2³¹. Stopping there is reported as
    NUMERICAL_ERROR (the caller set no limit), which the retries then take up.
    """
    return 10_000 + 1_000 * (qp.n + qp.m)


class HiGHSSolver(QPSolver):
    """HiGHS through highspy (``pip install "polyproj[highs]"``).

    Backend-specific options: any HiGHS option name is *not* accepted blindly; the supported ones
    are ``primal_feasibility_tolerance``, ``dual_feasibility_tolerance`` (both default to
    ``eps_abs``), ``presolve`` (``"choose"``/``"on"``/``"off"``), ``threads`` and
    ``qp_regularization_value`` (default ``min(1e-7, 1e-9 eps_abs)``; HiGHS's own default 1e-7
    limits the dual residual to about 1e-7).
    """

    name = "highs"
    capabilities = Capabilities(dense=True, sparse=True, warm_start=False, infeasibility=True)
    requires = ("highspy",)
    extra = "highs"
    options: ClassVar[dict[str, Any]] = {"primal_feasibility_tolerance": None, "dual_feasibility_tolerance": None,
               "presolve": None, "threads": None, "qp_regularization_value": None}
    option_checks: ClassVar[dict[str, Any]] = {
        "primal_feasibility_tolerance": positive, "dual_feasibility_tolerance": positive,
        "presolve": one_of("choose", "on", "off"), "threads": nonnegative_int, "qp_regularization_value": nonnegative}


    def _highs(self) -> Any:
        import highspy

        h = _new_highs()
        s = self.settings
        h.setOptionValue("output_flag", bool(s["verbose"]))
        tol = max(float(s["eps_abs"]), 1e-10)  # HiGHS rejects tolerances below 1e-10
        h.setOptionValue("primal_feasibility_tolerance", tol)
        h.setOptionValue("dual_feasibility_tolerance", tol)
        if s["time_limit"] is not None:
            h.setOptionValue("time_limit", float(s["time_limit"]))
        if s["max_iter"] is not None:
            h.setOptionValue("qp_iteration_limit", int(s["max_iter"]))
            h.setOptionValue("simplex_iteration_limit", int(s["max_iter"]))
        # HiGHS's QP solver regularises with 1e-7 by default, which caps the dual residual near 1e-7
        # and leaves duality gaps of 1e-5..1e-1 on Maros–Meszaros; scale it with the requested
        # tolerance (measured: 1e-3 tol still fails the gap, 1e-9 tol passes; an explicit option wins)
        h.setOptionValue("qp_regularization_value", min(1e-7, 1e-9 * tol))
        for k, v in self.backend_options.items():
            if v is not None and h.setOptionValue(k, v) == highspy.HighsStatus.kError:
                raise SettingsError(f"HiGHS rejected the value {v!r} of its option {k!r}")
        return h

    @staticmethod
    def _model(qp: QP) -> Any:
        """The problem as a ``highspy.HighsModel`` (for callers of HiGHS's own API)."""
        import highspy

        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = qp.n, qp.m
        lp.col_cost_ = qp.q
        lp.col_lower_, lp.col_upper_ = qp.lb, qp.ub
        lp.row_lower_, lp.row_upper_ = qp.l, qp.u
        mat, hess = _matrices(qp)
        lp.a_matrix_ = mat
        model = highspy.HighsModel()
        model.lp_ = lp
        if hess is not None:
            model.hessian_ = hess
        return model

    @classmethod
    def _pass(cls, h: Any, qp: QP) -> Any:
        """Hand the problem to HiGHS: its ``HighsModel``, built once per problem and kept in ``qp.memo``.

        Passing a prepared model costs ~4 µs against ~11 µs for ``passModel``'s array form; the
        matrices inside are shared by every QP with the same P and C (see :func:`_matrices`).
        """
        model = qp.memo.get("highs")
        if model is None:
            model = qp.memo["highs"] = cls._model(qp)
        return h.passModel(model)

    def solve(self, qp: QP, warm_start: Any = None) -> Solution:
        """Solve one QP with HiGHS (warm starts are not used: HiGHS's QP solver has none here).

        Fixed variables are substituted first (HiGHS 1.16 fails on them, :mod:`.presolve`).
        """
        return solve_without_fixed(self, qp, self._solve)

    def _solve(self, qp: QP) -> Solution:
        """HiGHS; where it fails, the recession-cone check (:meth:`_unbounded`), then the retries (:meth:`_retries`).

        A retry's answer is kept only when it is SOLVED (or inaccurate) on the problem as given; the
        output check of :mod:`.validation` then holds it to the same residual test as any answer. No
        retry starts once ``time_limit`` has passed.
        """
        t0 = time.perf_counter()
        sol = self._run(qp)
        limit = self.settings["time_limit"]
        # HiGHS's QP solver also says "Unbounded" on bounded QPs with a singular P (P = [[1, 1], [1, 1]],
        # q = (1, -1), x <= 1): that claim stands only with a direction of unbounded descent (checked whatever
        # the time limit), as a failure becomes DUAL_INFEASIBLE only with one (one LP either way)
        claimed = sol.status is Status.DUAL_INFEASIBLE and _quadratic(qp)
        if claimed or ((limit is None or time.perf_counter() - t0 <= limit) and self._maybe_unbounded(qp, sol)):
            unbounded = self._unbounded(qp, sol)
            if unbounded is not None:
                return unbounded
            if claimed:
                sol = self._nan_solution(qp, Status.NUMERICAL_ERROR, self.name, iterations=sol.iterations,
                                         solve_time=sol.solve_time, setup_time=sol.setup_time,
                                         info={**sol.info, "note": "HiGHS said Unbounded, but the LP over the "
                                               "recession cone found no direction of unbounded descent"})
        for why, run in self._retries(qp):
            if sol.status is not Status.NUMERICAL_ERROR or (limit is not None and time.perf_counter() - t0 > limit):
                break
            again = run()
            if again is not None and again.status.ok:
                again.info["retry"] = f"{why} after HiGHS answered {sol.info.get('raw_status')!r}"
                return again
        return sol

    def _maybe_unbounded(self, qp: QP, sol: Solution) -> bool:
        """Whether ``sol`` is HiGHS's failure on a QP that may be unbounded (:meth:`_unbounded`).

        A failure: NUMERICAL_ERROR, or an "Optimal" of its QP solver (P ≠ 0) that is not a solution by the
        output check of :mod:`.validation`; only where P is singular (a strictly convex QP is bounded).
        """
        if sol.status is not Status.NUMERICAL_ERROR:
            if sol.status is not Status.SOLVED or not _quadratic(qp):
                return False
            if check_solution(qp, sol, self.name, self.settings).status is Status.SOLVED:
                return False
        return not is_strictly_convex(qp)

    def _unbounded(self, qp: QP, failed: Solution) -> Solution | None:
        """DUAL_INFEASIBLE when ``qp`` has a direction of unbounded descent, else None.

        HiGHS 1.16's QP solver fails ("Solve error", or a regularised "Optimal" that is not a solution) on
        some convex QPs whose objective is unbounded below (a singular P). Such a QP has a recession
        direction ``d``: ``P d = 0``, ``qᵀd < 0``, ``(C d)_i <= 0`` where ``u_i`` is finite and ``>= 0``
        where ``l_i`` is, likewise ``d`` against the bounds. It is found by the LP
        ``min qᵀd`` over those constraints and ``||d||_inf <= 1`` (HiGHS's simplex, which has no such
        defect), and the status is reported only when ``d`` passes
        :meth:`~polyproj.problem.QP.is_dual_infeasibility_certificate`.
        """
        zero = np.zeros(qp.n)
        cone = QP(P=sp.csc_matrix((qp.n, qp.n)), q=qp.q, C=sp.vstack([sp.csc_matrix(qp.C), sp.csc_matrix(qp.P)]),
                  l=np.concatenate([np.where(np.isfinite(qp.l), 0.0, -np.inf), zero]),
                  u=np.concatenate([np.where(np.isfinite(qp.u), 0.0, np.inf), zero]),
                  lb=np.where(np.isfinite(qp.lb), 0.0, -1.0), ub=np.where(np.isfinite(qp.ub), 0.0, 1.0),
                  check_psd=False)
        lp = self._run(cone)
        if not lp.status.ok or not qp.is_dual_infeasibility_certificate(lp.x):
            return None
        return self._nan_solution(qp, Status.DUAL_INFEASIBLE, self.name, iterations=failed.iterations + lp.iterations,
                                  solve_time=failed.solve_time + lp.solve_time, setup_time=failed.setup_time,
                                  info={**failed.info, "note": "HiGHS failed on the QP; the LP over its recession "
                                        "cone found a direction of unbounded descent", "direction": lp.x})

    def _retries(self, qp: QP):
        """``(why, run)`` pairs for the defects of HiGHS 1.16 that polyproj works around.

        - "Solve error" with a singular Hessian at our small regularisation (``P = diag(1, 0)``,
          ``0 <= x <= 1``): again with regularisation 1e-9;
        - "Unbounded" on some strongly convex projections (docs/solvers.md): again with a box of radius
          ``R`` (10⁴ × the data's magnitude) on the free variables, kept only when no side of the box
          is active (then it is a KKT point of the original problem, with zero box multipliers).
        """
        if self.backend_options.get("qp_regularization_value") is None:
            yield "regularisation 1e-9", lambda: self._run(qp, regularization=1e-9)
        free = np.flatnonzero(np.isneginf(qp.lb) & np.isposinf(qp.ub))
        if free.size:
            yield "free variables boxed", lambda: self._boxed(qp, free)

    def _boxed(self, qp: QP, free: np.ndarray) -> Solution | None:
        finite = [np.abs(v[np.isfinite(v)]) for v in (qp.l, qp.u, qp.lb, qp.ub)]
        radius = 1e4 * max(1.0, float(np.max(np.abs(qp.q), initial=0.0)),
                           *(float(np.max(v[v < 1e15], initial=0.0)) for v in finite))
        lb, ub = qp.lb.copy(), qp.ub.copy()
        lb[free], ub[free] = -radius, radius
        again = self._run(qp.with_vectors(validate=False, lb=lb, ub=ub))
        if not again.status.ok or np.max(np.abs(again.x[free])) > 0.5 * radius:
            return None
        z_box = np.array(again.z_box)
        z_box[free] = 0.0
        return Solution(x=again.x, z=again.z, z_box=z_box, status=again.status, iterations=again.iterations,
                        solve_time=again.solve_time, setup_time=again.setup_time, backend=self.name, qp=qp,
                        info=dict(again.info))

    def _run(self, qp: QP, regularization: float | None = None) -> Solution:
        """One HiGHS run on ``qp`` (optionally with another QP regularisation), mapped to a Solution."""
        import highspy

        if is_nonconvex(qp):
            return self._nan_solution(qp, Status.NON_CONVEX, self.name, info={"error": "P is not PSD"})
        t0 = time.perf_counter()
        h = self._highs()
        if self.settings["max_iter"] is None:  # HiGHS's own limit is 2³¹: a cycling QP solve never ends
            h.setOptionValue("qp_iteration_limit", qp_iteration_cap(qp))
        if regularization is not None:
            h.setOptionValue("qp_regularization_value", float(regularization))
        pass_status = self._pass(h, qp)
        setup = time.perf_counter() - t0
        if pass_status == highspy.HighsStatus.kError:
            return self._nan_solution(qp, Status.NUMERICAL_ERROR, self.name, setup_time=setup,
                                      info={"error": "HiGHS rejected the model"})
        t1 = time.perf_counter()
        run_status = h.run()
        if run_status == highspy.HighsStatus.kError and self.backend_options.get("threads") is not None and \
                h.getModelStatus() == highspy.HighsModelStatus.kNotset:
            # HiGHS's thread pool is the process's, sized at its first run: a run asking for another count fails
            # before it starts ("Not Set"); the pool is made again at the count asked for (other HiGHS solves
            # running in other threads at that moment would be disturbed: give them one count)
            highspy.Highs.resetGlobalScheduler(True)
            run_status = h.run()
        solve_time = time.perf_counter() - t1
        return self._collect(h, qp, run_status, solve_time, setup)

    def _collect(self, h: Any, qp: QP, run_status: Any, solve_time: float, setup: float) -> Solution:
        import highspy

        ms = h.getModelStatus()
        status = _status_map().get(ms, Status.NUMERICAL_ERROR)
        if status is Status.NUMERICAL_ERROR and is_nonconvex(qp, always=True):
            status = Status.NON_CONVEX
        if status is Status.MAX_ITER and self.settings["max_iter"] is None:
            # not a limit the caller set: HiGHS's QP solver cycled (qp_iteration_cap)
            status = Status.NUMERICAL_ERROR
        if status is Status.DUAL_INFEASIBLE and is_strictly_convex(qp):
            # HiGHS 1.16 answers "Unbounded" on some projections (P = I): impossible, so not a status
            status = Status.NUMERICAL_ERROR
        # two info values, not getInfo() (which copies HiGHS's whole info record: 5 µs against 1 µs)
        # after a failed run HiGHS's info is invalid (kWarning) and holds uninitialised counts
        iters = sum(max(int(v), 0) for ok, v in (h.getInfoValue("qp_iteration_count"),
                                                  h.getInfoValue("simplex_iteration_count"))
                    if ok == highspy.HighsStatus.kOk)
        raw, run_str = _status_strings(h, ms, run_status)
        info = {"raw_status": raw, "run_status": run_str}
        if ms == highspy.HighsModelStatus.kUnboundedOrInfeasible:
            info["note"] = "HiGHS reports unbounded-or-infeasible"
        elif ms == highspy.HighsModelStatus.kIterationLimit and self.settings["max_iter"] is None:
            info["note"] = (f"HiGHS's QP solver did not finish in {qp_iteration_cap(qp)} iterations (it cycles on some "
                            "singular, badly scaled QPs); polyproj's cap without max_iter: 10,000 + 1,000 (n + m)")
        sol = h.getSolution()
        if not status.ok and status not in (Status.TIME_LIMIT, Status.MAX_ITER):
            return self._nan_solution(qp, status, self.name, iterations=iters, solve_time=solve_time,
                                      setup_time=setup, info=info)
        x = np.array(sol.col_value, dtype=np.float64)
        if sol.dual_valid:
            z, z_box = -np.array(sol.row_dual, dtype=np.float64), -np.array(sol.col_dual, dtype=np.float64)
        else:
            z, z_box = np.full(qp.m, np.nan), np.full(qp.n, np.nan)
        if x.shape != (qp.n,) or (status.ok and not all_finite(x)):
            x, status = np.full(qp.n, np.nan), Status.NUMERICAL_ERROR
        if x.shape == (qp.n,) and run_status == highspy.HighsStatus.kWarning and status is Status.SOLVED:
            info["warning"] = "HiGHS returned a warning"
        return Solution(x=x, z=z, z_box=z_box, status=status, iterations=iters, solve_time=solve_time,
                        setup_time=setup, backend=self.name, qp=qp, info=info)
