"""OSQP backend (OSQP 1.x Python API): sparse ADMM, warm starts, native q/l/u updates for batches.

OSQP solves ``min ½xᵀPx + qᵀx  s.t.  l <= A x <= u`` with stationarity ``Px + q + Aᵀy = 0``
and ``y_i > 0`` on an active upper side — polyproj's convention. Variable bounds are appended
to ``A`` as identity rows (finite bounds only), so ``A = [C; E]`` and ``z = y[:m]``,
``z_box[box] = y[m:]``. Solution polishing is on by default (``polishing=False`` turns it off).
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from ..errors import SettingsError
from ..problem import CLAIM_EPS, QP
from ..solution import BatchSolution, Solution, Status, all_finite
from .base import Capabilities, QPSolver
from .cache import converted
from .options import boolean, nonnegative, nonnegative_int, positive, within
from .quiet import c_stdout_silenced

__all__ = ["OSQPSolver"]

_STATUS = {
    "OSQP_SOLVED": Status.SOLVED,
    "OSQP_SOLVED_INACCURATE": Status.SOLVED_INACCURATE,
    "OSQP_PRIMAL_INFEASIBLE": Status.PRIMAL_INFEASIBLE,
    "OSQP_PRIMAL_INFEASIBLE_INACCURATE": Status.PRIMAL_INFEASIBLE,
    "OSQP_DUAL_INFEASIBLE": Status.DUAL_INFEASIBLE,
    "OSQP_DUAL_INFEASIBLE_INACCURATE": Status.DUAL_INFEASIBLE,
    "OSQP_MAX_ITER_REACHED": Status.MAX_ITER,
    "OSQP_TIME_LIMIT_REACHED": Status.TIME_LIMIT,
    "OSQP_NON_CVX": Status.NON_CONVEX,
}


@functools.cache
def _status_of(value: int) -> tuple[str, Status]:
    """OSQP's status name and polyproj's Status for OSQP's ``status_val`` (one lookup per value)."""
    import osqp

    raw = osqp.SolverStatus(value).name
    return raw, _STATUS.get(raw, Status.NUMERICAL_ERROR)


class OSQPSolver(QPSolver):
    """OSQP 1.x (``pip install "polyproj[osqp]"``).

    Backend-specific options (passed to OSQP as is): ``rho``, ``sigma``, ``alpha``,
    ``adaptive_rho``, ``scaling``, ``polishing`` (default True), ``polish_refine_iter``,
    ``check_dualgap``, ``eps_prim_inf``, ``eps_dual_inf``, ``scaled_termination``,
    ``check_termination``.
    """

    name = "osqp"
    capabilities = Capabilities(dense=True, sparse=True, batch=True, warm_start=True, infeasibility=True)
    requires = ("osqp",)
    extra = "osqp"
    options: ClassVar[dict[str, Any]] = {
        "rho": None, "sigma": None, "alpha": None, "adaptive_rho": None, "scaling": None, "polishing": True,
        "polish_refine_iter": None, "check_dualgap": None, "eps_prim_inf": None, "eps_dual_inf": None,
        "scaled_termination": None, "check_termination": None}
    option_checks: ClassVar[dict[str, Any]] = {
        "rho": positive, "sigma": positive, "alpha": within(0.0, 2.0), "adaptive_rho": boolean,
        "scaling": nonnegative_int, "polishing": boolean, "polish_refine_iter": nonnegative_int,
        "check_dualgap": boolean, "eps_prim_inf": nonnegative, "eps_dual_inf": nonnegative,
        "scaled_termination": boolean, "check_termination": nonnegative_int}


    # ---------------------------------------------------------------- problem mapping
    def _osqp_settings(self) -> dict[str, Any]:
        """OSQP's keyword settings, built once per value of the unified and backend settings."""
        s = self.settings
        key = (tuple(s.values()), tuple(self.backend_options.values()))
        cached = getattr(self, "_osqp_settings_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        out: dict[str, Any] = {"eps_abs": float(s["eps_abs"]), "eps_rel": float(s["eps_rel"]),
                               "verbose": bool(s["verbose"]), "warm_starting": bool(s["warm_start"]),
                               "polishing": True, "max_iter": s["max_iter"] and int(s["max_iter"]),
                               "time_limit": s["time_limit"] and float(s["time_limit"])}
        out = {k: v for k, v in out.items() if v is not None}
        out.update({k: v for k, v in self.backend_options.items() if v is not None})
        self._osqp_settings_cache = (key, out)
        return out

    @staticmethod
    def _matrices(qp: QP):
        """Upper triangle of P (CSC), A = [C; E_box] (CSC), l, u and the indices of bounded variables.

        The matrices are cached per (P, C, bounded variables) (see :mod:`polyproj.backends.cache`),
        the whole set per problem (``qp.memo``).
        """
        hit = qp.memo.get("osqp")
        if hit is not None:
            return hit
        box = qp.bounded

        def build():
            P = sp.triu(qp.P, format="csc") if sp.issparse(qp.P) else sp.csc_matrix(np.triu(qp.P))
            if sp.issparse(qp.C):
                A = sp.vstack([qp.C, sp.identity(qp.n, format="csr")[box]], format="csc") if box.size else qp.C
            else:
                E = np.zeros((box.size, qp.n))
                E[np.arange(box.size), box] = 1.0
                A = sp.csc_matrix(np.vstack([qp.C, E]))
            return P, sp.csc_matrix(A)

        P, A = converted("osqp", (qp.P, qp.C), box.tobytes(), build)
        l, u = qp.l, qp.u
        if box.size:
            l = np.concatenate([l, qp.lb[box]])
            u = np.concatenate([u, qp.ub[box]])
        out = qp.memo["osqp"] = (P, A, l, u, box)
        return out

    def _setup(self, qp: QP):
        import osqp

        P, A, l, u, box = self._matrices(qp)
        solver = osqp.OSQP()
        settings = self._osqp_settings()
        try:
            with c_stdout_silenced(not self.settings["verbose"]):  # OSQP prints its validation errors
                solver.setup(P, qp.q, A, l, u, **settings)
        except osqp.OSQPException as exc:
            if exc.args and exc.args[0] == int(osqp.SolverError.OSQP_SETTINGS_VALIDATION_ERROR):
                given = {k: v for k, v in self.backend_options.items() if v is not None}
                raise SettingsError(f"OSQP rejected the settings (its own validation; backend options given: "
                                    f"{given}, all: {settings})") from exc
            raise
        return solver, box

    @staticmethod
    def _warm_vectors(qp: QP, box: np.ndarray, ws: Any) -> tuple[np.ndarray | None, np.ndarray | None]:
        get = ws.get if isinstance(ws, dict) else (lambda k: getattr(ws, k, None))
        x, z, zb = get("x"), get("z"), get("z_box")
        x = None if x is None or not np.all(np.isfinite(x)) else np.asarray(x, dtype=np.float64)
        y = None
        if z is not None and np.all(np.isfinite(z)):
            zb = np.zeros(qp.n) if zb is None or not np.all(np.isfinite(zb)) else np.asarray(zb, dtype=np.float64)
            y = np.concatenate([np.asarray(z, dtype=np.float64), zb[box]])
        return x, y

    def _collect(self, qp: QP, res: Any, box: np.ndarray, setup_time: float) -> Solution:
        info_o = res.info
        raw, status = _status_of(info_o.status_val)
        if raw == "OSQP_SIGINT":
            # OSQP's C library catches Ctrl-C during its solve and returns this status: the user's interrupt,
            # raised as Python's (a status would let a batch run on, or answer as if the solve had failed)
            raise KeyboardInterrupt
        m = qp.m
        info: dict[str, Any] = {"raw_status": raw, "status_polish": int(info_o.status_polish),
                                "pri_res": float(info_o.prim_res), "dua_res": float(info_o.dual_res),
                                "duality_gap": float(info_o.duality_gap)}
        if status is Status.PRIMAL_INFEASIBLE or status is Status.DUAL_INFEASIBLE:
            # certificates: y with Aᵀy = 0, uᵀy⁺ - lᵀy⁻ < 0 (primal) / d with Pd = 0, qᵀd < 0 (dual)
            cert = np.array(res.prim_inf_cert if status is Status.PRIMAL_INFEASIBLE else res.dual_inf_cert)
            info["certificate"] = cert
            info["inaccurate"] = raw.endswith("INACCURATE")
            if status is Status.PRIMAL_INFEASIBLE:
                info["certificate_z"], zb = cert[:m], np.zeros(qp.n)
                zb[box] = cert[m:]
                info["certificate_z_box"] = zb
            # held to CLAIM_EPS in the problem's own units (rows of norm 1e-6 made feasible QPs "infeasible")
            proved = qp.is_primal_infeasibility_certificate(info["certificate_z"], zb, eps=CLAIM_EPS) \
                if status is Status.PRIMAL_INFEASIBLE else qp.is_dual_infeasibility_certificate(cert, eps=CLAIM_EPS)
            if not proved:
                info["validation"] = f"OSQP claimed {status.name}, but its certificate does not prove it"
                info["claimed_status"] = status.name
                status = Status.NUMERICAL_ERROR
            return self._nan_solution(qp, status, self.name, iterations=int(info_o.iter),
                                      solve_time=float(info_o.solve_time), setup_time=setup_time, info=info)
        x = np.array(res.x, dtype=np.float64)
        y = np.array(res.y, dtype=np.float64)
        n = qp.n
        if x.shape != (n,) or y.shape != (m + box.size,):
            return self._nan_solution(qp, Status.NUMERICAL_ERROR, self.name, info=info)
        z_box = np.zeros(n)
        z_box[box] = y[m:]
        if status.ok and not (all_finite(x) and all_finite(y)):
            status = Status.NUMERICAL_ERROR
        return Solution(x=x, z=y[:m], z_box=z_box, status=status, iterations=int(info_o.iter),
                        solve_time=float(info_o.solve_time + info_o.polish_time), setup_time=setup_time,
                        backend=self.name, qp=qp, info=info)

    # ---------------------------------------------------------------- solving
    def solve(self, qp: QP, warm_start: Any = None) -> Solution:
        """Solve one QP with OSQP (setup, optional warm start of x and y, solve)."""
        t0 = time.perf_counter()
        try:
            solver, box = self._setup(qp)
        except SettingsError:
            raise
        except Exception as exc:  # OSQPException(code) on data OSQP rejects, e.g. a non-convex P
            import osqp

            code = exc.args[0] if isinstance(exc, osqp.OSQPException) and exc.args else None
            status = Status.NON_CONVEX if code == int(osqp.SolverError.OSQP_NONCVX_ERROR) else Status.NUMERICAL_ERROR
            return self._nan_solution(qp, status, self.name, info={"error": repr(exc)})
        setup = time.perf_counter() - t0
        if warm_start is not None and self.settings["warm_start"]:
            x, y = self._warm_vectors(qp, box, warm_start)
            if x is not None or y is not None:
                solver.warm_start(x=x, y=y)
        return self._run(solver, qp, box, setup)

    def _run(self, solver: Any, qp: QP, box: np.ndarray, setup_time: float) -> Solution:
        """One solve of the set-up ``solver``; a polish that leaves the tolerance behind is dropped.

        OSQP's polish (an equality-constrained solve on its guessed active set) can report success with a dual
        residual far above the requested tolerance (130-600 × on badly scaled random QPs, objective 3e-4 to 2e-3
        off, SOLVED): then the problem is solved again with the polish turned off, and that answer taken where
        it is SOLVED.
        """
        with c_stdout_silenced(not self.settings["verbose"]):  # OSQP 1.1 prints a polish note regardless
            res = solver.solve(raise_error=False)
        sol = self._collect(qp, res, box, setup_time)
        if sol.status is not Status.SOLVED or sol.info["status_polish"] != 1 or self._within(qp, sol):
            return sol
        solver.update_settings(polishing=False)
        try:
            with c_stdout_silenced(not self.settings["verbose"]):
                again = self._collect(qp, solver.solve(raise_error=False), box, setup_time)
        finally:
            solver.update_settings(polishing=True)
        if again.status is not Status.SOLVED:
            return sol
        again.info["polish"] = (f"dropped: the polished answer's dual residual {sol.info['dua_res']:.3g} missed "
                                "the tolerance")
        return replace(again, iterations=sol.iterations + again.iterations,
                       solve_time=sol.solve_time + again.solve_time)

    def _within(self, qp: QP, sol: Solution) -> bool:
        """Whether ``sol``'s residuals meet OSQP's own stopping test (eps_abs + eps_rel × the terms' sizes), × 10."""
        eps_abs, eps_rel = float(self.settings["eps_abs"]), float(self.settings["eps_rel"])
        x, z, zb = sol.x, sol.z, sol.z_box
        px, cz = qp.P @ x, (qp.C.T @ z if qp.m else np.zeros(qp.n)) + zb
        dual = float(np.max(np.abs(px + qp.q + cz), initial=0.0))
        scale_d = max(float(np.max(np.abs(px), initial=0.0)), float(np.max(np.abs(cz), initial=0.0)),
                      float(np.max(np.abs(qp.q), initial=0.0)))
        cx = qp.C @ x if qp.m else np.zeros(0)
        scale_p = max(float(np.max(np.abs(cx), initial=0.0)), float(np.max(np.abs(x), initial=0.0)))
        return dual <= 10 * (eps_abs + eps_rel * scale_d) and \
            qp.primal_violation(x) <= 10 * (eps_abs + eps_rel * scale_p)

    def solve_batch(self, qp, q=None, l=None, u=None, lb=None, ub=None, warm_start=None) -> BatchSolution:
        """Native batch: one factorisation, then ``update(q, l, u)`` and a warm-started solve per element.

        Element ``i`` starts from element ``i-1``'s solution (or from ``warm_start.solution(i)``)
        when the ``warm_start`` setting is on.
        """
        vecs = self._batch_vectors(qp, q=q, l=l, u=u, lb=lb, ub=ub)
        size = self._batch_size(vecs)
        bounded = np.isfinite(qp.lb) | np.isfinite(qp.ub)
        if any(np.any(np.isfinite(vecs[k]) != bounded) for k in ("lb", "ub") if k in vecs):
            # the set of bounded variables changes along the batch: A would change, so loop
            return super().solve_batch(qp, q=q, l=l, u=u, lb=lb, ub=ub, warm_start=warm_start)
        t0 = time.perf_counter()
        try:
            solver, box = self._setup(qp)
        except SettingsError:
            raise
        except Exception:
            return super().solve_batch(qp, q=q, l=l, u=u, lb=lb, ub=ub, warm_start=warm_start)
        setup = time.perf_counter() - t0
        sols: list[Solution] = []
        t1 = time.perf_counter()
        for i in range(size):
            qpi = qp.with_vectors(**{k: v[i] for k, v in vecs.items()})
            upd: dict[str, np.ndarray] = {}
            if "q" in vecs:
                upd["q"] = qpi.q
            if vecs.keys() & {"l", "u", "lb", "ub"}:
                upd["l"] = np.concatenate([qpi.l, qpi.lb[box]])
                upd["u"] = np.concatenate([qpi.u, qpi.ub[box]])
            if i > 0 or upd:
                solver.update(**upd)
            if self.settings["warm_start"]:
                ws = warm_start.solution(i) if warm_start is not None else (sols[-1] if sols else None)
                if ws is not None and ws.ok:
                    solver.warm_start(*self._warm_vectors(qpi, box, ws))
            sols.append(self._run(solver, qpi, box, 0.0))
        return BatchSolution.stack(sols, backend=self.name, solve_time=time.perf_counter() - t1, setup_time=setup)
