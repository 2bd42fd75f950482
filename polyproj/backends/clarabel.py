"""Clarabel backend: interior-point conic solver, used here for QPs (zero and nonnegative cones).

Clarabel solves ``min ½xᵀPx + qᵀx  s.t.  Ax + s = b,  s ∈ K`` with ``P`` its upper triangle (CSC)
and stationarity ``Px + q + Aᵀz = 0``, ``z ∈ K*``. polyproj's rows are written as: equalities
``Cᵢx + s = uᵢ``, ``s = 0`` (zero cone, ``z`` free), then each finite side as a nonnegative-cone
row — ``Cᵢx <= uᵢ`` as ``(Cᵢ, uᵢ)``, ``Cᵢx >= lᵢ`` as ``(−Cᵢ, −lᵢ)``, likewise ``eⱼ`` for the bounds.
A row's multiplier is then ``zᵢ = z_upper − z_lower`` (``z_box`` the same for the bounds), polyproj's
convention. Infinite sides are left out (Clarabel wants finite ``b``). ``eps_abs`` maps to
``tol_gap_abs`` and ``tol_feas``, ``eps_rel`` to ``tol_gap_rel`` (Clarabel's feasibility test is
relative to ``max(1, ‖b‖ + ‖x‖ + ‖s‖)``); ``time_limit`` and ``max_iter`` to its own.
"""

from __future__ import annotations

import functools
import time
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from ..errors import SettingsError
from ..problem import QP, _row_max
from ..solution import Solution, Status
from .base import Capabilities, QPSolver
from .options import boolean, fraction, nonnegative_int, positive, text
from .presolve import solve_without_fixed

__all__ = ["ClarabelSolver"]


@functools.cache
def _status_map() -> dict[str, Status]:
    return {"Solved": Status.SOLVED, "AlmostSolved": Status.SOLVED_INACCURATE,
            "PrimalInfeasible": Status.PRIMAL_INFEASIBLE, "AlmostPrimalInfeasible": Status.PRIMAL_INFEASIBLE,
            "DualInfeasible": Status.DUAL_INFEASIBLE, "AlmostDualInfeasible": Status.DUAL_INFEASIBLE,
            "MaxIterations": Status.MAX_ITER, "MaxTime": Status.TIME_LIMIT}


def _rows(qp: QP) -> tuple[Any, np.ndarray, int, np.ndarray, np.ndarray, np.ndarray, int | None]:
    """``(A, b, n_eq, eq, side_row, side_sign, empty)``: the stacked conic rows and where each came from.

    ``side_row`` indexes ``[rows of C, then the n variables]``; ``side_sign`` is +1 for an upper side
    and -1 for a lower side; ``empty`` the first zero row of C that 0 violates (the set is empty), or None.
    """
    C = sp.csr_matrix(qp.C)
    full = sp.vstack([C, sp.identity(qp.n, format="csr")], format="csr")
    lo, hi = np.concatenate([qp.l, qp.lb]), np.concatenate([qp.u, qp.ub])
    # a zero row that 0 satisfies constrains nothing, and as a cone row its slack is identically zero on one
    # side (0 <= 0·x): no interior, and Clarabel called a strictly feasible QP primal infeasible. Left out
    # (multiplier 0); a zero row 0 violates stays, so that the set is reported empty
    zero = np.zeros(qp.m + qp.n, dtype=bool)
    zero[: qp.m] = _row_max(C) == 0
    idle = zero & (lo <= 0) & (hi >= 0)
    violated = np.flatnonzero(zero & ~idle)  # 0·x in [l, u] with 0 outside: the set is empty
    eq = np.flatnonzero(qp.eq_mask & ~idle[: qp.m])
    ineq = ~idle
    ineq[eq] = False
    upper = np.flatnonzero(ineq & np.isfinite(hi))
    lower = np.flatnonzero(ineq & np.isfinite(lo))
    A = sp.vstack([full[eq], full[upper], -full[lower]], format="csc")
    b = np.concatenate([hi[eq], hi[upper], -lo[lower]])
    side_row = np.concatenate([upper, lower])
    side_sign = np.concatenate([np.ones(upper.size), -np.ones(lower.size)])
    return A, b, eq.size, eq, side_row, side_sign, (int(violated[0]) if violated.size else None)


class ClarabelSolver(QPSolver):
    """Clarabel (``pip install "polyproj[clarabel]"``).

    Backend-specific options (Clarabel settings, passed as they are): ``tol_ktratio``,
    ``tol_infeas_abs``, ``tol_infeas_rel``, ``equilibrate_enable``, ``presolve_enable``,
    ``static_regularization_enable``, ``dynamic_regularization_enable``, ``iterative_refinement_enable``,
    ``max_step_fraction``, ``direct_solve_method``, ``max_threads``.
    """

    name = "clarabel"
    capabilities = Capabilities(dense=True, sparse=True, infeasibility=True)
    requires = ("clarabel",)
    extra = "clarabel"
    options: ClassVar[dict[str, Any]] = {
        "tol_ktratio": None, "tol_infeas_abs": None, "tol_infeas_rel": None, "equilibrate_enable": None,
        "presolve_enable": None, "static_regularization_enable": None, "dynamic_regularization_enable": None,
        "iterative_refinement_enable": None, "max_step_fraction": None, "direct_solve_method": None,
        "max_threads": None}
    option_checks: ClassVar[dict[str, Any]] = {
        "tol_ktratio": positive, "tol_infeas_abs": positive, "tol_infeas_rel": positive,
        "equilibrate_enable": boolean, "presolve_enable": boolean, "static_regularization_enable": boolean,
        "dynamic_regularization_enable": boolean, "iterative_refinement_enable": boolean,
        "max_step_fraction": fraction, "direct_solve_method": text, "max_threads": nonnegative_int}


    def _settings(self) -> Any:
        import clarabel

        st, s = clarabel.DefaultSettings(), self.settings
        st.verbose = bool(s["verbose"])
        # Clarabel's feasibility tolerance is relative: eps_abs = 0 (only a relative tolerance asked for) takes
        # eps_rel there (0 made it stop "almost solved" on exactly solved problems)
        st.tol_gap_abs = float(s["eps_abs"])
        st.tol_feas = float(s["eps_abs"]) or float(s["eps_rel"]) or 1e-12
        st.tol_gap_rel = float(s["eps_rel"])
        if s["max_iter"] is not None:
            st.max_iter = int(s["max_iter"])
        if s["time_limit"] is not None:
            st.time_limit = float(s["time_limit"])
        for k, v in self.backend_options.items():
            if v is not None:
                setattr(st, k, v)
        return st

    def solve(self, qp: QP, warm_start: Any = None) -> Solution:
        """Solve one QP with Clarabel (no warm start: Clarabel has none).

        Fixed variables (``lb == ub``) are substituted first (:mod:`.presolve`): a variable fixed at 1e6 to 1e8
        beside one of unit scale ended SOLVED_INACCURATE (that one 1e-5 off) or NUMERICAL_ERROR.
        """
        return solve_without_fixed(self, qp, self._solve)

    def _solve(self, qp: QP) -> Solution:
        import clarabel

        t0 = time.perf_counter()
        hit = qp.memo.get("clarabel")
        if hit is None:
            hit = qp.memo["clarabel"] = _rows(qp)
        A, b, n_eq, eq, side_row, side_sign, empty = hit
        if empty is not None:  # an empty set, which Clarabel's cones call a numerical error
            sol = self._nan_solution(qp, Status.PRIMAL_INFEASIBLE, self.name)
            return replace(sol, info={**sol.info, "note": f"row {empty} is zero and 0 is outside [l, u]"})
        P = sp.triu(sp.csc_matrix(qp.P), format="csc")
        cones = ([clarabel.ZeroConeT(n_eq)] if n_eq else []) + (
            [clarabel.NonnegativeConeT(side_row.size)] if side_row.size else [])
        try:
            solver = clarabel.DefaultSolver(P, qp.q, A, b, cones, self._settings())
        except Exception as exc:  # its settings are validated here, by Clarabel itself
            if "settings" not in str(exc).lower():
                raise
            raise SettingsError(f"Clarabel rejected the settings ({exc}; backend options given: "
                                f"{ {k: v for k, v in self.backend_options.items() if v is not None} })") from exc
        setup = time.perf_counter() - t0
        res = solver.solve()
        raw = str(res.status).split(".")[-1]
        status = _status_map().get(raw, Status.NUMERICAL_ERROR)
        zc = np.asarray(res.z, dtype=np.float64)
        mult = np.zeros(qp.m + qp.n)
        mult[eq] = zc[:n_eq]
        np.add.at(mult, side_row, side_sign * zc[n_eq:])
        x = np.array(res.x, dtype=np.float64)
        if not (status.ok or status in (Status.MAX_ITER, Status.TIME_LIMIT)):
            x = np.full(qp.n, np.nan)
        return Solution(x=x, z=mult[:qp.m], z_box=mult[qp.m:], status=status, iterations=int(res.iterations),
                        solve_time=float(res.solve_time), setup_time=setup, backend=self.name, qp=qp,
                        info={"raw_status": raw, "pri_res": float(res.r_prim), "dua_res": float(res.r_dual)})
