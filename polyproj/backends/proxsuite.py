"""ProxSuite (ProxQP) backend: dense and sparse, native batches via ``solve_in_parallel``.

ProxQP's form is ``min ½xᵀHx + gᵀx  s.t.  Ax = b, l <= Cx <= u, l_box <= x <= u_box`` with
stationarity ``Hx + g + Aᵀy + Cᵀz (+ z_box) = 0`` — the same sign convention as polyproj, so
the multipliers are only re-ordered (equality rows and inequality rows of our C are split).
ProxQP has no time limit: ``time_limit`` is checked after the solve (status TIME_LIMIT when
exceeded) and enforced hard only by the benchmark's subprocess timeout.
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from ..problem import CLAIM_EPS, QP
from ..runtime import cpu_count, keep_torch_threads, openmp_threads
from ..solution import BatchSolution, ElementQPs, Solution, Status, all_finite
from .base import Capabilities, QPSolver
from .cache import converted
from .options import boolean, positive, positive_int

__all__ = ["RETRY_RHO", "ProxSuiteSolver"]

#: the proximal step of the retry after a refuted infeasibility claim (ProxQP's default 1e-6): on random small
#: feasible LPs and singular QPs where ProxQP claimed infeasibility, 1e-3 solved 5 of 11 and 1e-2 all 11
RETRY_RHO = 1e-2


class ProxSuiteSolver(QPSolver):
    """ProxQP from ProxSuite (``pip install "polyproj[proxsuite]"``).

    Backend-specific options: ``num_threads`` (batches; default all cores), ``rho``, ``mu_eq``,
    ``mu_in``, ``compute_preconditioner``, and ``check_duality_gap`` (default True).
    """

    name = "proxsuite"
    capabilities = Capabilities(dense=True, sparse=True, batch=True, warm_start=True, infeasibility=True)
    requires = ("proxsuite",)
    extra = "proxsuite"
    options = {"num_threads": None, "rho": None, "mu_eq": None, "mu_in": None,
               "compute_preconditioner": True, "check_duality_gap": True}
    option_checks: ClassVar[dict[str, Any]] = {
        "num_threads": positive_int, "rho": positive, "mu_eq": positive, "mu_in": positive,
        "compute_preconditioner": boolean, "check_duality_gap": boolean}


    # ---------------------------------------------------------------- problem mapping
    @staticmethod
    def _matrices(qp: QP, fold_box: bool):
        """Solver-ready equality and inequality matrices, cached per C, row pattern and bound pattern."""
        eq = qp.eq_mask
        box_rows = qp.bounded if fold_box else np.zeros(0, dtype=np.int64)
        sparse = qp.is_sparse

        def build():
            ieq, iin = np.flatnonzero(eq), np.flatnonzero(~eq)
            C = sp.csr_matrix(qp.C) if sp.issparse(qp.C) else qp.C
            A, Cin = C[ieq], C[iin]
            if box_rows.size:
                E = sp.identity(qp.n, format="csr")[box_rows]
                Cin = sp.vstack([sp.csr_matrix(Cin), E]) if sp.issparse(Cin) else np.vstack([Cin, E.toarray()])
            if sparse:
                return ieq, iin, sp.csc_matrix(A), sp.csc_matrix(Cin)
            return ieq, iin, np.ascontiguousarray(A), np.ascontiguousarray(Cin)

        ieq, iin, A, Cin = converted("proxsuite", (qp.C,), (eq.tobytes(), box_rows.tobytes(), sparse), build)
        return ieq, iin, box_rows, A, Cin

    @classmethod
    def _split(cls, qp: QP, fold_box: bool):
        """Split C into equality and inequality rows (optionally folding the bounds into C).

        Kept per problem (``qp.memo``): repeated solves of one QP split it once.
        """
        key = ("proxsuite", fold_box)
        hit = qp.memo.get(key)
        if hit is not None:
            return hit
        ieq, iin, box_rows, A, Cin = cls._matrices(qp, fold_box)
        b, l, u = qp.u[ieq], qp.l[iin], qp.u[iin]
        if box_rows.size:
            l = np.concatenate([l, qp.lb[box_rows]])
            u = np.concatenate([u, qp.ub[box_rows]])
        out = qp.memo[key] = (ieq, iin, box_rows, A, b, Cin, l, u)
        return out

    def _configure(self, solver: Any, warm: bool) -> None:
        import proxsuite

        st = solver.settings
        s = self.settings
        st.eps_abs = float(s["eps_abs"])
        st.eps_rel = float(s["eps_rel"])
        st.verbose = bool(s["verbose"])
        st.compute_timings = True  # info.solve_time / run_time (0 otherwise), which the time limit reads
        if s["max_iter"] is not None:
            st.max_iter = int(s["max_iter"])
        if self.backend_options.get("check_duality_gap", True):
            st.check_duality_gap = True
            st.eps_duality_gap_abs = float(s["eps_abs"])
            st.eps_duality_gap_rel = float(s["eps_rel"])
        st.initial_guess = (proxsuite.proxqp.InitialGuess.WARM_START if warm
                            else proxsuite.proxqp.InitialGuess.EQUALITY_CONSTRAINED_INITIAL_GUESS)

    def _init_kwargs(self) -> dict[str, Any]:
        key = tuple(self.backend_options.items())
        cached = getattr(self, "_init_kwargs_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        kw = {k: self.backend_options[k] for k in ("rho", "mu_eq", "mu_in") if self.backend_options.get(k) is not None}
        kw["compute_preconditioner"] = bool(self.backend_options.get("compute_preconditioner", True))
        self._init_kwargs_cache = (key, kw)
        return kw

    def _build(self, qp: QP, warm: bool, rho: float | None = None):
        import proxsuite

        sparse = qp.is_sparse
        # ProxQP's dense box mode mishandles warm starts (wrong dual sizes, then no convergence):
        # with a warm start the bounds are folded into C instead
        native_box = (not sparse) and qp.has_bounds and not warm
        ieq, iin, box_rows, A, b, Cin, l, u = self._split(qp, fold_box=not native_box)
        n = qp.n
        if sparse:
            solver = proxsuite.proxqp.sparse.QP(n, A.shape[0], Cin.shape[0])
            H = converted("proxsuite-H", (qp.P,), None, lambda: sp.csc_matrix(qp.P))
        else:
            solver = proxsuite.proxqp.dense.QP(n, A.shape[0], Cin.shape[0], native_box)
            H = qp.P
        self._configure(solver, warm)
        args = [H, qp.q, A if A.shape[0] else None, b if A.shape[0] else None,
                Cin if Cin.shape[0] else None, l if Cin.shape[0] else None, u if Cin.shape[0] else None]
        if native_box:
            args += [qp.lb, qp.ub]
        kw = self._init_kwargs() if rho is None else {**self._init_kwargs(), "rho": rho}
        solver.init(*args, **kw)
        return solver, (ieq, iin, box_rows, native_box)

    @staticmethod
    def _multipliers(qp: QP, layout, y: np.ndarray | None, zin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ProxQP's (y, z) in polyproj's layout (z over the rows of C, z_box); one element or a batch."""
        ieq, iin, box_rows, native_box = layout
        lead = zin.shape[:-1]
        z = np.zeros((*lead, qp.m))
        if ieq.size:
            z[..., ieq] = y
        ni = iin.size
        z[..., iin] = zin[..., :ni]
        z_box = np.zeros((*lead, qp.n))
        if native_box:
            z_box[...] = zin[..., ni: ni + qp.n]
        elif box_rows.size:
            z_box[..., box_rows] = zin[..., ni: ni + box_rows.size]
        return z, z_box

    def _final_status(self, qp_of, info_p: Any, x: np.ndarray, z: np.ndarray, z_box: np.ndarray) -> Status:
        """Status of one element: the map, non-finite x, certificates behind MAX_ITER, the time limit.

        ``qp_of()`` gives the element's QP (built only when a certificate has to be checked).
        """
        status = self._status(info_p.status, x)
        if status is Status.MAX_ITER:  # ProxQP misses some infeasibilities: check the certificates
            qp = qp_of()
            if qp.is_dual_infeasibility_certificate(x):
                status = Status.DUAL_INFEASIBLE
            elif qp.is_primal_infeasibility_certificate(z, z_box):
                status = Status.PRIMAL_INFEASIBLE
            # else MAX_ITER stands: on some small infeasible problems ProxQP's iterates drift without
            # converging to a certificate (docs/solvers.md); another backend's claim is not proof
        elif status is Status.PRIMAL_INFEASIBLE and not qp_of().is_primal_infeasibility_certificate(z, z_box):
            other = self._second_opinion(qp_of())
            if other is not None and (other.status.ok or (other.status is Status.DUAL_INFEASIBLE
                                                          and self._feasible(qp_of()))):
                # a false claim (ProxQP makes it on some feasible LPs, bounded or not)
                status = Status.NUMERICAL_ERROR
        elif status is Status.DUAL_INFEASIBLE and not qp_of().is_dual_infeasibility_certificate(x, eps=CLAIM_EPS):
            # its iterate is no recession direction (x = −1e15 on min x, 1e-6 x >= 1e-6, bounded by x* = 1):
            # a false claim where an independent backend solves the problem
            other = self._second_opinion(qp_of())
            if other is not None and other.status.ok:
                status = Status.NUMERICAL_ERROR
        tl = self.settings["time_limit"]
        if status.ok and tl is not None and info_p.run_time * 1e-6 > tl:
            status = Status.TIME_LIMIT
        return status

    def _second_opinion(self, qp: QP) -> Solution | None:
        """An independent backend's answer to ``qp`` (asked only when ProxQP's status has no certificate)."""
        from ..registry import get_backend
        from .defaults import independent_of

        other = independent_of(self.name)
        if other is None:
            return None
        try:
            return get_backend(other, eps_abs=self.settings["eps_abs"]).solve(qp)
        except Exception:  # advisory: ProxQP's own status stands without it
            return None

    def _feasible(self, qp: QP) -> bool:
        """Whether an independent backend finds a point of ``qp``'s constraints (its objective dropped)."""
        zero = sp.csc_matrix((qp.n, qp.n)) if sp.issparse(qp.P) else np.zeros((qp.n, qp.n))
        found = self._second_opinion(QP(P=zero, q=np.zeros(qp.n), C=qp.C, l=qp.l, u=qp.u, lb=qp.lb, ub=qp.ub,
                                        check_psd=False))
        return found is not None and found.status.ok

    @staticmethod
    def _info(info_p: Any) -> dict[str, Any]:
        return {"raw_status": str(info_p.status), "pri_res": info_p.pri_res, "dua_res": info_p.dua_res,
                "duality_gap": info_p.duality_gap}

    def _collect(self, qp: QP, res: Any, layout, setup_time: float) -> Solution:
        info_p = res.info
        x = np.array(res.x, dtype=np.float64)
        z, z_box = self._multipliers(qp, layout, res.y if layout[0].size else None, np.asarray(res.z))
        status = self._final_status(lambda: qp, info_p, x, z, z_box)
        return Solution(
            x=x, z=z, z_box=z_box, status=status, iterations=int(info_p.iter),
            solve_time=float(info_p.solve_time) * 1e-6, setup_time=setup_time,
            backend=self.name, qp=qp, info=self._info(info_p),
        )

    @staticmethod
    @functools.cache
    def _status_map() -> dict[Any, Status]:
        import proxsuite

        out = proxsuite.proxqp.QPSolverOutput
        return {
            out.PROXQP_SOLVED: Status.SOLVED,
            out.PROXQP_MAX_ITER_REACHED: Status.MAX_ITER,
            out.PROXQP_PRIMAL_INFEASIBLE: Status.PRIMAL_INFEASIBLE,
            out.PROXQP_DUAL_INFEASIBLE: Status.DUAL_INFEASIBLE,
            out.PROXQP_SOLVED_CLOSEST_PRIMAL_FEASIBLE: Status.PRIMAL_INFEASIBLE,
        }

    @classmethod
    def _status(cls, raw: Any, x: np.ndarray) -> Status:
        status = cls._status_map().get(raw, Status.NUMERICAL_ERROR)
        if status.ok and not all_finite(x):
            status = Status.NUMERICAL_ERROR
        return status

    @staticmethod
    def _warm_vectors(qp: QP, layout, ws: Any):
        ieq, iin, box_rows, native_box = layout
        get = (lambda k: getattr(ws, k, None)) if not isinstance(ws, dict) else ws.get
        x, z, zb = get("x"), get("z"), get("z_box")
        if x is None:
            return None
        z = np.zeros(qp.m) if z is None else np.nan_to_num(np.asarray(z, dtype=float))
        zb = np.zeros(qp.n) if zb is None else np.nan_to_num(np.asarray(zb, dtype=float))
        zin = z[iin]
        if native_box:  # ProxQP's dense box mode wants z = [z_in; z_box] (n_in + n entries)
            zin = np.concatenate([zin, zb])
        elif box_rows.size:
            zin = np.concatenate([zin, zb[box_rows]])
        return np.nan_to_num(np.asarray(x, dtype=float)), z[ieq], zin

    # ---------------------------------------------------------------- public API
    def solve(self, qp: QP, warm_start: Any = None) -> Solution:
        """Solve one QP with ProxQP (dense or sparse following the data).

        ProxQP claims primal infeasibility on some feasible LPs and QPs with a singular P (its default
        proximal step ``rho`` = 1e-6); where an independent backend refutes the claim (the status is then
        NUMERICAL_ERROR) and ``rho`` is not set, the QP is solved again with ``rho`` = :data:`RETRY_RHO`,
        and that answer is kept when it is SOLVED.
        """
        sol = self._solve(qp, warm_start)
        return self._retried(qp, sol, warm_start) if self._refuted(sol.status, sol.info) else sol

    def _refuted(self, status: Status, info: dict) -> bool:
        """ProxQP's claim of primal infeasibility that the output check refuted (NUMERICAL_ERROR), rho not set."""
        return (status is Status.NUMERICAL_ERROR and self.backend_options.get("rho") is None
                and str(info.get("raw_status", "")).endswith("PRIMAL_INFEASIBLE"))

    def _retried(self, qp: QP, sol: Solution, warm_start: Any = None) -> Solution:
        """``qp`` solved again with ``rho`` = :data:`RETRY_RHO`; that answer when SOLVED, else ``sol``."""
        again = self._solve(qp, warm_start, rho=RETRY_RHO)
        if again.status is not Status.SOLVED:
            return sol
        again.info["retry"] = f"rho {RETRY_RHO:g} after ProxQP's refuted {sol.info['raw_status']}"
        return replace(again, iterations=sol.iterations + again.iterations,
                       solve_time=sol.solve_time + again.solve_time)

    def _retried_batch(self, qp: QP, vecs: dict, size: int, bs: BatchSolution) -> BatchSolution:
        """The elements of a native batch whose refuted infeasibility :meth:`solve` would retry, retried."""
        elements = bs.info.get("elements") or [{}] * size
        idx = [i for i in range(size) if self._refuted(bs.status[i], elements[i])]
        if not idx:
            return bs
        qps = ElementQPs(qp, vecs, size)
        sols = [self._retried(qps[i], bs.solution(i)) for i in idx]
        out = bs.put(np.asarray(idx), BatchSolution.stack(sols, backend=self.name))
        info = [dict(e) for e in elements]
        for i, s in zip(idx, sols, strict=True):
            info[i] = {**info[i], **s.info}
        return replace(out, info={**bs.info, "elements": info})

    def _solve(self, qp: QP, warm_start: Any, rho: float | None = None) -> Solution:
        warm = warm_start is not None and self.settings["warm_start"]
        t0 = time.perf_counter()
        try:
            solver, layout = self._build(qp, warm, rho)
            setup = time.perf_counter() - t0
            vecs = self._warm_vectors(qp, layout, warm_start) if warm else None
            if vecs is not None:
                solver.solve(*vecs)
            else:
                solver.solve()
        except (RuntimeError, ValueError) as exc:  # ProxSuite raises on inconsistent data
            return self._nan_solution(qp, Status.NUMERICAL_ERROR, self.name, info={"error": str(exc)})
        return self._collect(qp, solver.results, layout, setup)

    def solve_batch(self, qp, q=None, l=None, u=None, lb=None, ub=None, warm_start=None) -> BatchSolution:
        """Native batch: ProxSuite ``BatchQP`` (bounds folded into C) solved by ``solve_in_parallel``."""
        import proxsuite

        if qp.is_sparse or warm_start is not None:
            return super().solve_batch(qp, q=q, l=l, u=u, lb=lb, ub=ub, warm_start=warm_start)
        vecs = self._batch_vectors(qp, q=q, l=l, u=u, lb=lb, ub=ub)
        size = self._batch_size(vecs)
        dense = proxsuite.proxqp.dense
        t0 = time.perf_counter()
        batch = dense.BatchQP()
        kw = self._init_kwargs()
        only_q = set(vecs) <= {"q"}
        qps, layouts = [], []
        shared = None
        for i in range(size):
            if only_q:  # projections: one split of C for the whole batch, no QP record per element
                if shared is None:
                    ieq, iin, box_rows, A, b, Cin, lo, hi = self._split(qp, fold_box=True)
                    shared = self._shared(A, b, Cin, lo, hi)
                q_i = vecs["q"][i] if vecs else qp.q
            else:
                qpi = qp.with_vectors(validate=False, **{k: v[i] for k, v in vecs.items()})
                ieq, iin, box_rows, A, b, Cin, lo, hi = self._split(qpi, fold_box=True)
                shared = self._shared(A, b, Cin, lo, hi)
                q_i = qpi.q
                qps.append(qpi)
                layouts.append((ieq, iin, box_rows, False))
            solver = batch.init_qp_in_place(qp.n, A.shape[0], Cin.shape[0])
            self._configure(solver, warm=False)
            solver.init(qp.P, q_i, *shared, **kw)
        setup = time.perf_counter() - t0
        threads = openmp_threads(self.backend_options.get("num_threads") or cpu_count())
        t1 = time.perf_counter()
        with keep_torch_threads():  # its omp_set_num_threads is torch's too
            dense.solve_in_parallel(batch, int(threads))
        wall = time.perf_counter() - t1
        if only_q:
            bs = self._collect_batch(qp, vecs, size, [batch.get(i).results for i in range(size)],
                                     (ieq, iin, box_rows, False), wall, setup)
        else:
            sols = [self._collect(qps[i], batch.get(i).results, layouts[i], 0.0) for i in range(size)]
            bs = BatchSolution.stack(sols, backend=self.name, solve_time=wall, setup_time=setup,
                                     info={"elements": [s.info for s in sols]})
        return self._retried_batch(qp, vecs, size, bs)

    @staticmethod
    def _shared(A, b, Cin, lo, hi) -> tuple:
        A, Cin = np.ascontiguousarray(A), np.ascontiguousarray(Cin)
        return (A if A.shape[0] else None, b if A.shape[0] else None, Cin if Cin.shape[0] else None,
                lo if Cin.shape[0] else None, hi if Cin.shape[0] else None)

    def _collect_batch(self, qp: QP, vecs: dict, size: int, results: list, layout, wall: float,
                       setup: float) -> BatchSolution:
        """Results of a batch that differs only in q, gathered as arrays (no record per element)."""
        ieq = layout[0]
        infos = [r.info for r in results]
        x = np.array([r.x for r in results], dtype=np.float64).reshape(size, qp.n)
        y = np.array([r.y for r in results]).reshape(size, ieq.size) if ieq.size else None
        z, z_box = self._multipliers(qp, layout, y, np.array([r.z for r in results]).reshape(size, -1))
        qps = ElementQPs(qp, vecs, size)
        status = tuple(self._final_status(lambda i=i: qps[i], infos[i], x[i], z[i], z_box[i]) for i in range(size))
        return BatchSolution(x=x, z=z, z_box=z_box, status=status,
                             iterations=np.array([inf.iter for inf in infos], dtype=np.int64),
                             solve_time=wall, setup_time=setup, backend=self.name, qps=qps,
                             info={"elements": [self._info(inf) for inf in infos]})
