"""``ipm`` backend: the batched array-API interior-point method of :mod:`polyproj.solvers.ipm`.

Glue only: the canonical :class:`~polyproj.problem.QP` (NumPy) is handed to
:func:`polyproj.solvers.ipm.solve_qp_batch` in the chosen array namespace (NumPy by default, ``torch`` on
request) and the result is mapped to :class:`~polyproj.solution.Solution`. The IPM already uses the
polyproj sign convention, so multipliers are returned as they are. ``solve_batch`` is native: the
whole batch is one batched IPM run, with P and C shared.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp
from array_api_compat import device as _device

from ..linalg import own_contiguous
from ..polydata import PolyData, qp_multipliers_to_rows
from ..problem import QP
from ..runtime import small_blas
from ..solution import BatchSolution, ElementQPs, Solution, Status
from .base import Capabilities, QPSolver, report_batch
from .options import nonnegative_int, one_of, positive_int
from .presolve import solve_without_fixed
from .projection import ProjectionStart

__all__ = ["IPMSolver"]


class IPMSolver(QPSolver):
    """Batched Mehrotra predictor–corrector IPM written once against the array API.

    Backend-specific options: ``ruiz_iter`` (equilibration passes, default 10), ``batch_chunk``
    (largest batch solved at once), ``namespace`` (``"numpy"`` default, or ``"torch"`` to run the
    same code on PyTorch CPU tensors), ``threads`` (CPU threads sharing a large batch; default one
    per core, 1 to disable).
    """

    name = "ipm"
    capabilities = Capabilities(dense=True, sparse=False, batch=True, warm_start=False, infeasibility=True,
                                array_api=True, batch_matrices=True, early_stop=True)
    requires = ("array_api_compat",)
    extra = "ipm"
    options = {"ruiz_iter": 10, "batch_chunk": None, "namespace": "numpy", "threads": None}
    option_checks: ClassVar[dict[str, Any]] = {
        "ruiz_iter": nonnegative_int, "batch_chunk": positive_int, "namespace": one_of("numpy", "torch"),
        "threads": positive_int}

    #: ``solve_projections(rough=True)`` stops at this relative tolerance (``eps_rel``) and leaves the
    #: rest to the exact polish (docs/performance.md: the active faces are identified well before the
    #: IPM's own stop)
    rough_eps_rel: float = 1e-4

    @classmethod
    def version(cls) -> str:
        """The IPM is polyproj's own: its version is polyproj's."""
        from .._version import __version__

        return f"polyproj {__version__}"

    # ---------------------------------------------------------------- namespace conversion
    def _to(self, a: np.ndarray | None):
        if a is None or self.backend_options.get("namespace", "numpy") == "numpy":
            return a
        import torch  # only when namespace='torch' is asked for

        return torch.from_numpy(own_contiguous(a))

    @staticmethod
    def _back(a: Any) -> np.ndarray:
        return np.asarray(a.cpu() if hasattr(a, "cpu") else a, dtype=np.float64)

    def _run(self, qp: QP, q: np.ndarray, l: np.ndarray, u: np.ndarray, lb: np.ndarray, ub: np.ndarray,
             x0: np.ndarray | None, stall: bool = True, time_limit: float | None = None):
        """The IPM on the batch ``q`` (b, n); ``stall``: stop elements stalled near their tolerances (then polished).

        ``time_limit``: seconds left of the call's ``time_limit`` (None: the setting itself).
        """
        from ..solvers.ipm import solve_qp_batch
        from ..solvers.ipm.termination import STALL_ITER
        from .active_polish import MAX_SIZE

        P = qp.P.toarray() if sp.issparse(qp.P) else qp.P
        C = qp.C.toarray() if sp.issparse(qp.C) else qp.C
        s = self.settings
        warm = {"x": self._to(x0)} if (x0 is not None and s["warm_start"]) else None
        t0 = time.perf_counter()
        # one QP: one BLAS thread (its kernels are mostly matrix-vector products); a batch: the thread
        # policy of solve_qp_batch (docs/performance.md)
        numpy = self.backend_options.get("namespace", "numpy") == "numpy"
        with small_blas() if numpy and q.shape[0] == 1 else nullcontext():
            res = solve_qp_batch(
                self._to(P), self._to(q), self._to(C), self._to(l), self._to(u), self._to(lb), self._to(ub),
                eps_abs=float(s["eps_abs"]), eps_rel=float(s["eps_rel"]),
                max_iter=int(s["max_iter"]) if s["max_iter"] is not None else 100,
                warm_start=warm, time_limit=s["time_limit"] if time_limit is None else time_limit,
                ruiz_iter=int(self.backend_options.get("ruiz_iter", 10)),
                batch_chunk=self.backend_options.get("batch_chunk"),
                threads=self.backend_options.get("threads"),
                stall_iter=STALL_ITER if stall and qp.n <= MAX_SIZE else None,  # the polish runs up to MAX_SIZE
            )
        wall = time.perf_counter() - t0
        if s["verbose"]:
            report_batch(self.name, res.statuses(), self._back(res.iterations), wall,
                         {"primal residual": self._back(res.prim_res), "dual residual": self._back(res.dual_res),
                          "gap": self._back(res.gap)})
        return res, wall

    def _collect(self, res: Any) -> tuple[np.ndarray, ...]:
        st = res.statuses()
        info = [{"prim_res": float(p), "dual_res": float(d), "gap": float(g)}
                for p, d, g in zip(self._back(res.prim_res), self._back(res.dual_res), self._back(res.gap))]
        return (self._back(res.x), self._back(res.z), self._back(res.z_box), st,
                np.asarray(self._back(res.iterations), dtype=np.int64), info)

    # ---------------------------------------------------------------- public API
    def solve(self, qp: QP, warm_start: Any = None) -> Solution:
        """Solve one QP (a batch of one).

        Fixed variables (``lb == ub``) are substituted first (:mod:`.presolve`): the IPM's tolerances are relative
        to the largest entry, and a variable fixed at 1e7 beside one of unit scale came back SOLVED with that one
        0.8 instead of 1. The reduced problem gets no warm start (its variables are others).
        """
        return solve_without_fixed(self, qp, lambda q: self._solve(q, warm_start if q is qp else None))

    def _solve(self, qp: QP, warm_start: Any = None, stall: bool = True, time_limit: float | None = None) -> Solution:
        t0 = time.perf_counter()
        x0 = None
        if warm_start is not None:
            x0 = warm_start.get("x") if isinstance(warm_start, dict) else getattr(warm_start, "x", None)
            x0 = None if x0 is None else np.asarray(x0, dtype=np.float64)[None, :]
        res, wall = self._run(qp, qp.q[None, :], qp.l, qp.u, qp.lb, qp.ub, x0, stall, time_limit)
        x, z, zb, st, it, info = self._collect(res)
        sol = self._polished(Solution(x=x[0], z=z[0], z_box=zb[0], status=st[0], iterations=int(it[0]),
                                      solve_time=wall, backend=self.name, qp=qp, info=info[0]))
        # the re-solve ends two of the stalled run's iterations before the limit (:meth:`_reserve`)
        left = self._again(sol, stall, t0, self._reserve(wall, sol.iterations))
        if left is False:
            return sol
        return self._resolved(sol, self._solve(qp, warm_start, stall=False, time_limit=left))

    # ---------------------------------------------------------------- the end game (active_polish)
    def _polished(self, sol: Solution) -> Solution:
        """A SOLVED_INACCURATE answer (stalled near its tolerances, or at the cap) polished on its active set.

        :func:`.active_polish.polish_active`: SOLVED when the exact KKT point of the active set the multipliers
        name passes the tolerances; otherwise ``sol`` as it is (the polish's time added).
        """
        if sol.status is not Status.SOLVED_INACCURATE:
            return sol
        from .active_polish import polish_active

        t0 = time.perf_counter()
        got = polish_active(sol.qp, sol.x, sol.z, sol.z_box, float(self.settings["eps_abs"]),
                            float(self.settings["eps_rel"]))
        wall = sol.solve_time + time.perf_counter() - t0
        if got is None:
            return replace(sol, solve_time=wall)
        x, z, zb = got
        done = replace(sol, x=x, z=z, z_box=zb, status=Status.SOLVED, solve_time=wall)
        # the residuals in info describe the point returned (the polished one), not the iterate it replaced
        return replace(done, info={**sol.info, "prim_res": done.primal_residual(), "dual_res": done.dual_residual(),
                                   "gap": done.duality_gap(), "polished": True, "ipm_status": sol.status.name})

    def _stalled_early(self, sol: Solution) -> bool:
        """Whether ``sol`` is SOLVED_INACCURATE before ``max_iter``: stopped by the stall rule.

        The creep may still reach the tolerances: such an answer the polish did not settle is solved again.
        """
        cap = self.settings["max_iter"] if self.settings["max_iter"] is not None else 100
        return sol.status is Status.SOLVED_INACCURATE and sol.iterations < int(cap)

    def _again(self, sol: Solution, stall: bool, started: float, reserve: float = 0.0) -> float | bool | None:
        """Whether a stalled answer is solved again without the stall rule.

        The seconds left (None: no limit), or False: not stopped by the rule, at the cap, or no time left since
        ``started`` once ``reserve`` seconds are kept back (:meth:`_time_left`).
        """
        return self._time_left(started, reserve) if stall and self._stalled_early(sol) else False

    def _time_left(self, started: float, reserve: float = 0.0) -> float | bool | None:
        """Seconds left of ``time_limit`` since ``started``, less ``reserve`` (None: no limit; False: none left)."""
        limit = self.settings["time_limit"]
        if limit is None:
            return None
        left = float(limit) - (time.perf_counter() - started) - reserve
        return left if left > 0 else False

    @staticmethod
    def _reserve(wall: float, iterations: int) -> float:
        """Seconds a run after the first keeps back from the limit: two iterations of the first (``wall / iterations``).

        An IPM run checks its deadline before each iteration, so it ends up to one iteration past it, and an answer
        that comes after ``time_limit`` is TIME_LIMIT (the guard): a re-solve (or an element solved after the batch
        run) that ran to the limit turned the answers already in hand into TIME_LIMIT, the stalled one it was to
        keep included. Stopping two iterations early leaves the last one and the end game inside the limit.
        """
        return 2.0 * wall / max(1, int(iterations))

    @staticmethod
    def _resolved(stalled: Solution, full: Solution) -> Solution:
        """The answer for an element solved again without the stall rule (``full``) after it stalled (``stalled``).

        ``full`` repeats the stalled run's iterations and goes on, so where it ends SOLVED or SOLVED_INACCURATE
        (converged, or its closest point by the cap) it is at least as close; where a time limit or the cap cut it
        short otherwise (TIME_LIMIT, MAX_ITER, ...) the stalled answer stands. Iterations: the run that answers;
        times: both.
        """
        wall = stalled.solve_time + full.solve_time
        if full.status in (Status.SOLVED, Status.SOLVED_INACCURATE):
            return replace(full, solve_time=wall, info={**full.info, "stalled_at": stalled.iterations})
        return replace(stalled, solve_time=wall)

    def solve_batch(self, qp, q=None, l=None, u=None, lb=None, ub=None, warm_start=None) -> BatchSolution:
        """Native batch: one batched IPM run over all elements (P and C shared).

        Fixed variables (``lb == ub``) are substituted (a variable fixed at 1e7: the batch run's x₂ = 0.8 for 1 as
        SOLVED): for the whole batch where only ``q`` varies (:meth:`_batch_without_fixed`), else in the elements
        that have them, one by one by :meth:`solve`. Elements that stall are polished, and those the polish does
        not settle are solved again without the stall rule in one batched run (:meth:`_solve`'s end game).
        """
        t_batch = time.perf_counter()  # the call's time_limit bounds the re-solve of stalled elements too
        vecs = self._batch_vectors(qp, q=q, l=l, u=u, lb=lb, ub=ub)
        size = self._batch_size(vecs)
        if set(vecs) <= {"q"} and np.any(qp.lb == qp.ub):
            return self._batch_without_fixed(qp, vecs, size, warm_start)
        Q = vecs.get("q", np.broadcast_to(qp.q, (size, qp.n)))
        x0 = None if warm_start is None else np.asarray(warm_start.x, dtype=np.float64)
        LB, UB = vecs.get("lb", qp.lb), vecs.get("ub", qp.ub)
        fixed = np.any(np.broadcast_to(LB == UB, (size, qp.n)), axis=1)
        run = np.flatnonzero(~fixed)
        qps = ElementQPs(qp, vecs, size)  # per-element QPs for the residual methods, built on access
        x, z, zb = np.full((size, qp.n), np.nan), np.full((size, qp.m), np.nan), np.full((size, qp.n), np.nan)
        st, it, info, wall = [Status.NUMERICAL_ERROR] * size, np.zeros(size, dtype=np.int64), [{}] * size, 0.0

        def batch_run(idx: np.ndarray, stall: bool, time_limit: float | None = None) -> tuple[list, float]:
            """One IPM run on the elements ``idx``; returns their SOLVED_INACCURATE answers (polished) and the wall."""
            def part(v):  # the batched vectors of the elements idx
                return v[idx] if v.ndim == 2 else v

            res, w = self._run(qp, np.ascontiguousarray(Q[idx]), part(vecs.get("l", qp.l)), part(vecs.get("u", qp.u)),
                               part(LB), part(UB), None if x0 is None else x0[idx], stall, time_limit)
            x[idx], z[idx], zb[idx], str_, it[idx], infor = self._collect(res)
            for j, i in enumerate(idx):
                st[i], info[i] = str_[j], infor[j]
            # the end game per element only where the run ended SOLVED_INACCURATE (stalled, or at the cap)
            return [self._polished(self._element(qps, int(i), x, z, zb, st, it, info)) for i in idx
                    if st[i] is Status.SOLVED_INACCURATE], w

        def put(sol: Solution, i: int) -> None:
            nonlocal wall
            x[i], z[i], zb[i], st[i], it[i], info[i] = sol.x, sol.z, sol.z_box, sol.status, sol.iterations, sol.info
            wall += sol.solve_time

        reserve = 0.0
        if run.size:
            ended, wall = batch_run(run, True)
            reserve = self._reserve(wall, int(np.max(it[run])))  # later runs end before the limit (_reserve)
            for sol in ended:
                put(sol, sol.info["index"])
            again = [sol for sol in ended if self._stalled_early(sol)]
            left = self._time_left(t_batch, reserve) if again else False
            if left is not False:
                full, w = batch_run(np.asarray([sol.info["index"] for sol in again]), False, left)
                wall += w
                full = {sol.info["index"]: sol for sol in full}
                for sol in again:  # where the re-solve ended elsewhere than SOLVED_INACCURATE it is the arrays' already
                    i = sol.info["index"]
                    answer = full.get(i) or self._element(qps, i, x, z, zb, st, it, info)
                    put(replace(self._resolved(sol, answer), solve_time=0.0), i)
        for i in np.flatnonzero(fixed):
            put(self._fixed_element(qps[int(i)], t_batch, reserve), int(i))
        for i in range(size):
            info[i] = {k: v for k, v in info[i].items() if k != "index"}
        return BatchSolution(x=x, z=z, z_box=zb, status=tuple(st), iterations=it, solve_time=wall,
                             backend=self.name, qps=qps, info={"elements": info})

    def _fixed_element(self, qp: QP, started: float, reserve: float = 0.0) -> Solution:
        """An element with fixed variables, solved by :meth:`solve` within what is left of ``time_limit``.

        The call's ``time_limit`` bounds the whole batch, not each of its elements: each gets the seconds left since
        ``started``, less ``reserve`` (:meth:`_reserve`; none left: TIME_LIMIT with NaN values, without a run).
        """
        left = self._time_left(started, reserve)
        if left is None:
            return self.solve(qp)
        if left is False:
            return self._nan_solution(qp, Status.TIME_LIMIT, self.name)
        return type(self)(**{**self.settings, "time_limit": left}, **self.backend_options).solve(qp)

    def _element(self, qps: Any, i: int, x, z, zb, st, it, info) -> Solution:
        """Element ``i`` of a batch run as a Solution (its index in ``info["index"]``, for the end game)."""
        return Solution(x=x[i].copy(), z=z[i].copy(), z_box=zb[i].copy(), status=st[i], iterations=int(it[i]),
                        backend=self.name, qp=qps[i], info={**info[i], "index": i})

    def _batch_without_fixed(self, qp: QP, vecs: dict, size: int, warm_start: Any) -> BatchSolution:
        """:meth:`solve_batch` where the elements share ``qp``'s fixed variables and differ in ``q`` only.

        One substitution (:func:`.presolve.fixed_variables`) for the batch: the reduced problem's ``q`` moves with
        each element's by the same shift ``P_fF x_F``; the answers are mapped back as
        :meth:`~.presolve.FixedVariables.solution` does, the fixed variables' ``z_box`` from stationarity.
        """
        from .presolve import fixed_variables

        red = fixed_variables(qp)
        sub = red.problem(qp)
        Q = np.broadcast_to(vecs.get("q", qp.q), (size, qp.n))
        if sub.n:
            x0 = None if warm_start is None else np.asarray(warm_start.x, dtype=np.float64)[:, red.free]
            bs = self.solve_batch(sub, q=Q[:, red.free] + (sub.q - qp.q[red.free]),
                                  warm_start=None if x0 is None else BatchSolution(
                                      x=x0, z=np.zeros((size, sub.m)), z_box=np.zeros((size, sub.n)),
                                      status=(Status.SOLVED,) * size, iterations=np.zeros(size, dtype=np.int64)))
            xf, z, zbf = bs.x, np.array(bs.z, dtype=np.float64), bs.z_box
            st, it, info, wall = bs.status, bs.iterations, bs.info["elements"], bs.solve_time
        else:
            xf, z, zbf = np.zeros((size, 0)), np.zeros((size, qp.m)), np.zeros((size, 0))
            st, it, info, wall = (Status.SOLVED,) * size, np.zeros(size, dtype=np.int64), [{}] * size, 0.0
        x = np.empty((size, qp.n))
        x[:, red.free], x[:, red.fixed] = xf, red.values
        zb = np.empty((size, qp.n))
        zb[:, red.free] = zbf
        grad = np.asarray((qp.P @ x.T).T) + Q + (np.asarray((qp.C.T @ z.T).T) if qp.m else 0.0)
        zb[:, red.fixed] = -grad[:, red.fixed]
        # an element without a point (infeasible, unbounded, failed) is NaN throughout, as solve's answer for it
        # (presolve.solve_without_fixed): not its fixed values beside NaN free ones
        failed = np.array([not s.ok and s not in (Status.TIME_LIMIT, Status.MAX_ITER) for s in st], dtype=bool)
        x[failed], z[failed], zb[failed] = np.nan, np.nan, np.nan
        return BatchSolution(x=x, z=z, z_box=zb, status=tuple(st), iterations=it, solve_time=wall,
                             backend=self.name, qps=ElementQPs(qp, vecs, size), info={"elements": info})

    def solve_projections(self, X: Any, data: PolyData, *, rough: bool = False) -> ProjectionStart:
        """Native: one batched IPM run in the namespace and on the device of ``X`` (P = I, q = -x).

        ``rough``: elements stalled near the tolerances stop there too (``stall_iter``): the pipeline's exact polish
        follows.
        """
        from ..solvers.ipm import solve_qp_batch
        from ..solvers.ipm.termination import STALL_ITER

        xp = data.xp
        N, n = X.shape
        A, a, B, b, lb, ub = data.parts()
        if data.shared_matrices:
            C = xp.concat([A, B], axis=0)
        else:
            C = xp.concat([xp.broadcast_to(M, (N, *M.shape[-2:])) if M.ndim == 2 else M for M in (A, B)], axis=1)
        if a.ndim == 2 or b.ndim == 2:
            a, b = xp.broadcast_to(a, (N, data.m)), xp.broadcast_to(b, (N, data.p))
        lo = xp.concat([xp.full_like(a, -float("inf")), b], axis=-1)
        hi = xp.concat([a, b], axis=-1)
        s = self.settings
        eps_abs = float(s["eps_abs"])
        eps_rel = max(float(s["eps_rel"]), self.rough_eps_rel) if rough else float(s["eps_rel"])
        res = solve_qp_batch(xp.eye(n, dtype=X.dtype, device=_device(X)), -X, C,
                             lo, hi, lb, ub, eps_abs=eps_abs, eps_rel=eps_rel,
                             max_iter=int(s["max_iter"]) if s["max_iter"] is not None else 100,
                             time_limit=s["time_limit"], ruiz_iter=int(self.backend_options.get("ruiz_iter", 10)),
                             batch_chunk=self.backend_options.get("batch_chunk"),
                             threads=self.backend_options.get("threads"), stall_iter=STALL_ITER if rough else None)
        z = res.z
        mu = z[:, data.m:]
        return ProjectionStart(res.x, qp_multipliers_to_rows(xp, z, res.z_box, data.m),
                               xp.where(xp.isnan(mu), xp.zeros_like(mu), mu), res.statuses(),
                               max(eps_abs, eps_rel) if rough else eps_abs, rough=rough)
