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

from ..problem import CLAIM_EPS, QP, _row_max
from ..runtime import cpu_count, keep_torch_threads, openmp_threads
from ..solution import BatchSolution, ElementQPs, Solution, Status, all_finite
from .base import Capabilities, QPSolver
from .cache import converted
from .options import boolean, positive, positive_int
from .warm import kkt_sizes, solved_again_cold

__all__ = ["FIRST_BUDGET", "RETRY_RHO", "ProxSuiteSolver"]

#: the proximal step of the retry after a refuted infeasibility claim (ProxQP's default 1e-6): on random small
#: feasible LPs and singular QPs where ProxQP claimed infeasibility, 1e-3 solved 5 of 11 and 1e-2 all 11
RETRY_RHO = 1e-2

#: ProxQP's outer iterations before the glue first looks for infeasibility certificates (its own budget is 10⁴,
#: used when this one ends without a certificate; a ``max_iter`` the caller set is used as it is). On infeasible QPs
#: it does not detect, ProxQP's inner iterations grow to ~10³ per outer one late in the run: 10⁷ in all, 17 to 26 s
#: for n = 6 (``conformance.random_infeasible_qp``), where the sides its iterate violates carry a certificate after
#: 10³ outer iterations (0.01 s). Feasible QPs converge far below it (random QPs of n <= 40: at most 37 iterations,
#: inner ones included; 28 of the 29 small Maros–Meszaros problems: at most 145), and one that does not is solved
#: again from the start with ProxQP's own budget: its answer is the one ProxQP gives unstaged (to rounding), at the
#: cost of the first run (QSHARE2B: 4,527 iterations instead of 3,465).
FIRST_BUDGET = 1000


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

    def _configure(self, solver: Any, warm: bool, first_budget: bool = False) -> None:
        """ProxQP's settings from polyproj's.

        ``first_budget``: at most :data:`FIRST_BUDGET` outer iterations (where the caller set no ``max_iter``).
        """
        import proxsuite

        st = solver.settings
        s = self.settings
        st.eps_abs = float(s["eps_abs"])
        st.eps_rel = float(s["eps_rel"])
        st.verbose = bool(s["verbose"])
        st.compute_timings = True  # info.solve_time / run_time (0 otherwise), which the time limit reads
        if s["max_iter"] is not None:
            st.max_iter = int(s["max_iter"])
        elif first_budget:
            st.max_iter = FIRST_BUDGET
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

    def _build(self, qp: QP, warm: bool, rho: float | None = None, first_budget: bool = False):
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
        self._configure(solver, warm, first_budget)
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
            elif qp.is_primal_infeasibility_certificate(z, z_box) or self._violation_certifies(qp, x):
                status = Status.PRIMAL_INFEASIBLE
            # else MAX_ITER stands: another backend's claim is not proof
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
        if (status.ok or status is Status.MAX_ITER) and tl is not None and info_p.run_time * 1e-6 > tl:
            status = Status.TIME_LIMIT
        return status

    #: largest NNLS system (entries) :meth:`_violation_certifies` builds (n = k = 500: well under a second); beyond
    #: it MAX_ITER stands, as before
    _CERTIFICATE_ENTRIES = 250_000

    @classmethod
    def _violation_certifies(cls, qp: QP, x: np.ndarray) -> bool:
        """Whether the sides that ProxQP's last iterate ``x`` violates carry a Farkas certificate.

        On an infeasible problem ProxQP's multipliers need not diverge along a certificate: on ``x <= −1``,
        ``x >= 1`` it stopped at MAX_ITER after 10⁴ iterations with ``z = 0`` and ``x = 0``, and 37 of 300 drawn
        infeasible QPs with lower sides, two-sided rows or variable bounds (``polyproj.testing.strategies.
        infeasible_qps``, seed 0) ended so, while every other backend said PRIMAL_INFEASIBLE. Its iterate does
        settle where the violation is least in its own (preconditioned, penalised) weights: at a minimiser
        ``x̄`` of ``Σ ω_k dist_k(x)²`` over the sides ``k`` (rows' sides, bounds) the weighted residuals
        ``y_k = ω_k (g_kᵀx̄ − b_k)`` satisfy ``Σ_k y_k g_k = 0`` (the gradient), are non-zero only on violated
        sides, with the sign of the side (``> 0`` on an upper side, ``< 0`` on a lower one), and their support
        ``Σ_k y_k b_k = Σ_k y_k (g_kᵀx̄ − y_k/ω_k) = −Σ_k y_k²/ω_k < 0``: a Farkas certificate on the violated
        sides. The weights are ProxQP's; so the certificate is found by non-negative least squares over the
        violated sides (columns ``s_k g_k`` in force units, ``|g_k|∞ = 1``; their weights summing to 1) and
        then judged by :meth:`~polyproj.problem.QP.is_primal_infeasibility_certificate` like any other: a
        certificate proves the constraints empty whatever produced it, and on a feasible problem none exists.
        """
        from ..linalg import nnls

        if not np.all(np.isfinite(x)):
            return False
        cx = np.asarray(qp.C @ x).reshape(-1) if qp.m else np.zeros(0)
        up_r, lo_r = np.flatnonzero(cx > qp.u), np.flatnonzero(cx < qp.l)
        up_b, lo_b = np.flatnonzero(x > qp.ub), np.flatnonzero(x < qp.lb)
        k = up_r.size + lo_r.size + up_b.size + lo_b.size
        if k == 0 or (qp.n + 1) * k > cls._CERTIFICATE_ENTRIES:
            return False
        rows = np.concatenate([up_r, lo_r])
        Cr = qp.C[rows] if qp.m else np.zeros((0, qp.n))
        Cr = Cr.toarray() if sp.issparse(Cr) else np.asarray(Cr, dtype=float).reshape(rows.size, qp.n)
        width = _row_max(Cr)
        width = np.where(width > 0, width, 1.0)
        sign_r = np.concatenate([np.ones(up_r.size), -np.ones(lo_r.size)])
        bounds = np.concatenate([up_b, lo_b])  # distinct coordinates, as the rows are distinct
        sign_b = np.concatenate([np.ones(up_b.size), -np.ones(lo_b.size)])
        E = np.zeros((bounds.size, qp.n))
        E[np.arange(bounds.size), bounds] = sign_b
        cols = np.vstack([Cr * (sign_r / width)[:, None], E])  # (k, n): s_k g_k / |g_k|∞
        a, _ = nnls(np.vstack([cols.T, np.ones((1, k))]), np.concatenate([np.zeros(qp.n), [1.0]]))
        y = np.zeros(qp.m)
        y[rows] = sign_r * a[:rows.size] / width
        y_box = np.zeros(qp.n)
        y_box[bounds] = sign_b * a[rows.size:]
        return qp.is_primal_infeasibility_certificate(y, y_box)

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
        from a cold start (the warm start may be what misled it: multipliers of an infeasible problem's answer
        made a trivial QP fail), and that answer is kept when it is SOLVED. A warm-started answer that is SOLVED
        but not verified (:meth:`_verified`), or NUMERICAL_ERROR, is first solved again cold.
        """
        sol = self._solve(qp, warm_start)
        if warm_start is not None and self.settings["warm_start"] and not self._past_limit(sol) and (
                (sol.status is Status.SOLVED and not self._verified(sol)) or sol.status is Status.NUMERICAL_ERROR):
            # a warm start is a hint: an answer after it that is not a solution of this QP (or a claim refuted) is
            # solved again, cold. ProxQP tests its stopping criteria on a warm start before its first iteration,
            # without the duality gap and without the sides' signs: another problem's answer came back SOLVED after
            # 0 iterations with complementarity off by 0.5 (the multiplier of a row now slack), or with z_box = −1
            # on a bound this QP does not have (x₂ <= 0 from x₂ = 0)
            sol = solved_again_cold(sol, self._solve(qp, None))
        return self._retried(qp, sol) if self._refuted(sol.status, sol.info) else sol

    def _past_limit(self, sol: Solution) -> bool:
        """Whether ``sol`` took the whole ``time_limit`` (then nothing is solved again: the guard judges it)."""
        tl = self.settings["time_limit"]
        return tl is not None and sol.solve_time + sol.setup_time > float(tl)

    def _verified(self, sol: Solution) -> bool:
        """Whether ``sol`` solves its QP to ProxQP's own tolerances: the KKT conditions of the problem as given.

        The primal residual, the dual residual with the multipliers on infinite sides (:meth:`Solution.dual_residual`:
        a multiplier pushing against a side the QP does not have breaks stationarity as much as a missing term;
        ProxQP's own test leaves them out) and the duality gap (:meth:`_gap_closed`), each within ``eps_abs +
        eps_rel`` times the largest term of its sum, to the rounding of those terms.
        """
        sizes = kkt_sizes(sol)
        if sizes is None:
            return False
        size_p, size_d = sizes
        eps_abs, eps_rel = float(self.settings["eps_abs"]), float(self.settings["eps_rel"])
        rel = eps_rel + 1e3 * np.finfo(float).eps
        return (sol.primal_residual() <= eps_abs + rel * size_p and sol.dual_residual() <= eps_abs + rel * size_d
                and self._gap_closed(sol))

    def _gap_closed(self, sol: Solution) -> bool:
        """Whether ``sol``'s duality gap meets ProxQP's own tolerance.

        That is ``eps_abs + eps_rel`` times the gap's largest term, to the rounding of those terms.
        """
        qp, x, z, zb = sol.qp, sol.x, sol.z, sol.z_box
        if not (np.isfinite(x).all() and np.isfinite(z).all() and np.isfinite(zb).all()):
            return False
        terms = [abs(float(x @ (qp.P @ x))), abs(float(qp.q @ x))]
        for mult, lo, hi in ((z, qp.l, qp.u), (zb, qp.lb, qp.ub)):
            terms += [float(np.abs(np.where(np.isfinite(hi), hi, 0.0) @ np.maximum(mult, 0.0))),
                      float(np.abs(np.where(np.isfinite(lo), lo, 0.0) @ np.maximum(-mult, 0.0)))]
        size = max(terms)
        eps_abs, eps_rel = float(self.settings["eps_abs"]), float(self.settings["eps_rel"])
        tol = eps_abs + eps_rel * size + 1e3 * np.finfo(float).eps * size
        return sol.duality_gap() <= tol

    def _refuted(self, status: Status, info: dict) -> bool:
        """ProxQP's claim of primal infeasibility that the output check refuted (NUMERICAL_ERROR), rho not set."""
        return (status is Status.NUMERICAL_ERROR and self.backend_options.get("rho") is None
                and str(info.get("raw_status", "")).endswith("PRIMAL_INFEASIBLE"))

    def _retried(self, qp: QP, sol: Solution) -> Solution:
        """``qp`` solved again, cold, with ``rho`` = :data:`RETRY_RHO`; that answer when SOLVED, else ``sol``."""
        again = self._solve(qp, None, rho=RETRY_RHO)
        if again.status is not Status.SOLVED:
            return sol
        again.info["retry"] = f"rho {RETRY_RHO:g} after ProxQP's refuted {sol.info['raw_status']}"
        return replace(again, iterations=sol.iterations + again.iterations,
                       solve_time=sol.solve_time + again.solve_time)

    def _resolved_batch(self, qp: QP, vecs: dict, size: int, bs: BatchSolution, idx: list[int],
                        again: Any) -> BatchSolution:
        """``bs`` with the elements ``idx`` replaced by ``again(element_qp, element_solution)``, infos merged."""
        if not idx:
            return bs
        qps = ElementQPs(qp, vecs, size)
        sols = [again(qps[i], bs.solution(i)) for i in idx]
        out = bs.put(np.asarray(idx), BatchSolution.stack(sols, backend=self.name))
        info = [dict(e) for e in (bs.info.get("elements") or [{}] * size)]
        for i, sol in zip(idx, sols, strict=True):
            info[i] = {**info[i], **sol.info}
        return replace(out, info={**bs.info, "elements": info})

    def _resumed_batch(self, qp: QP, vecs: dict, size: int, bs: BatchSolution) -> BatchSolution:
        """The elements of a native batch that ended :data:`FIRST_BUDGET` in MAX_ITER, solved again.

        Without a certificate (:meth:`_final_status`), one by one with ProxQP's own budget, as :meth:`_solve` does.
        """
        idx = [i for i in range(size) if bs.status[i] is Status.MAX_ITER] if self._staged() else []
        return self._resolved_batch(qp, vecs, size, bs, idx, self._resumed)

    def _retried_batch(self, qp: QP, vecs: dict, size: int, bs: BatchSolution) -> BatchSolution:
        """The elements of a native batch whose refuted infeasibility :meth:`solve` would retry, retried."""
        elements = bs.info.get("elements") or [{}] * size
        idx = [i for i in range(size) if self._refuted(bs.status[i], elements[i])]
        return self._resolved_batch(qp, vecs, size, bs, idx, self._retried)

    def _staged(self) -> bool:
        """Whether ProxQP runs :data:`FIRST_BUDGET` outer iterations first (no ``max_iter`` set)."""
        return self.settings["max_iter"] is None

    def _solve(self, qp: QP, warm_start: Any, rho: float | None = None) -> Solution:
        """One solve: :data:`FIRST_BUDGET` outer iterations, then ProxQP's own run if needed.

        The second run, from the start, follows a first that ends in MAX_ITER without a certificate
        (:meth:`_final_status`).
        """
        if not self._staged():
            return self._solve_once(qp, warm_start, rho)
        first = self._solve_once(qp, warm_start, rho, first_budget=True)
        if first.status is not Status.MAX_ITER:
            return first
        tl = self.settings["time_limit"]
        if tl is not None and first.solve_time + first.setup_time > tl:  # ProxQP cannot be stopped: no second run
            return replace(first, status=Status.TIME_LIMIT)
        # a warm start after which ProxQP did not converge in FIRST_BUDGET outer iterations (feasible QPs converge
        # far below it) is no help: the full run starts cold, as an unstaged one would (z = 1e10 on a unit QP
        # made the full run ~10⁷ iterations, 44 s, to MAX_ITER; cold, 20 iterations)
        return self._resumed(qp, first, None, rho)

    def _resumed(self, qp: QP, first: Solution, warm_start: Any = None, rho: float | None = None) -> Solution:
        """``qp`` solved with ProxQP's own budget after ``first`` (its FIRST_BUDGET run), the counts summed.

        TIME_LIMIT where the two runs together passed ``time_limit`` (each is judged alone in :meth:`_final_status`).
        """
        full = self._solve_once(qp, warm_start, rho)
        out = replace(full, iterations=first.iterations + full.iterations,
                      solve_time=first.solve_time + full.solve_time, setup_time=first.setup_time + full.setup_time)
        tl = self.settings["time_limit"]
        if (out.status.ok or out.status is Status.MAX_ITER) and tl is not None and out.solve_time + out.setup_time > tl:
            out = replace(out, status=Status.TIME_LIMIT)
        return out

    def _solve_once(self, qp: QP, warm_start: Any, rho: float | None = None, first_budget: bool = False) -> Solution:
        warm = warm_start is not None and self.settings["warm_start"]
        t0 = time.perf_counter()
        try:
            solver, layout = self._build(qp, warm, rho, first_budget)
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
            self._configure(solver, warm=False, first_budget=self._staged())
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
        return self._retried_batch(qp, vecs, size, self._resumed_batch(qp, vecs, size, bs))

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
