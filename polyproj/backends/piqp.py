"""PIQP backend: proximal interior-point method, dense and sparse; the default of ``solve_qp``.

PIQP solves ``min ½xᵀPx + cᵀx  s.t.  Ax = b,  h_l <= Gx <= h_u,  x_l <= x <= x_u`` with
stationarity ``Px + c + Aᵀy + Gᵀ(z_u − z_l) + (z_bu − z_bl) = 0`` and ``z_l, z_u, z_bl, z_bu >= 0``,
so polyproj's multipliers are ``z = y`` on the equality rows, ``z = z_u − z_l`` on the others and
``z_box = z_bu − z_bl``. ``eps_abs`` / ``eps_rel`` map to PIQP's ``eps_abs`` / ``eps_rel`` and, with
its duality-gap check on, to ``eps_duality_gap_abs`` / ``_rel``. PIQP has no time limit and no warm
start: ``time_limit`` is held by polyproj's check after the solve (an answer past it is TIME_LIMIT).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from ..errors import SettingsError
from ..problem import QP
from ..solution import Solution, Status
from .base import Capabilities, QPSolver
from .options import boolean, nonnegative_int, positive, within
from .scaling import HIGH

__all__ = ["PIQPSolver"]


@functools.cache
def _status_map() -> dict[Any, Status]:
    import piqp

    S = piqp.Status
    return {S.PIQP_SOLVED: Status.SOLVED, S.PIQP_MAX_ITER_REACHED: Status.MAX_ITER,
            S.PIQP_PRIMAL_INFEASIBLE: Status.PRIMAL_INFEASIBLE, S.PIQP_DUAL_INFEASIBLE: Status.DUAL_INFEASIBLE}


class PIQPSolver(QPSolver):
    """PIQP (``pip install "polyproj[piqp]"``).

    Backend-specific options (PIQP settings, passed as they are): ``rho_init``, ``delta_init``,
    ``check_duality_gap`` (default True), ``reg_lower_limit``, ``reg_finetune_lower_limit``,
    ``preconditioner_iter``, ``preconditioner_scale_cost``, ``iterative_refinement_always_enabled``,
    ``eps_primal_inf``, ``eps_dual_inf``, ``tau``.
    """

    name = "piqp"
    capabilities = Capabilities(dense=True, sparse=True, infeasibility=True)
    requires = ("piqp",)
    extra = "piqp"
    options: ClassVar[dict[str, Any]] = {
        "rho_init": None, "delta_init": None, "check_duality_gap": True, "reg_lower_limit": None,
        "reg_finetune_lower_limit": None, "preconditioner_iter": None, "preconditioner_scale_cost": None,
        "iterative_refinement_always_enabled": None, "eps_primal_inf": None, "eps_dual_inf": None, "tau": None}
    option_checks: ClassVar[dict[str, Any]] = {
        "rho_init": positive, "delta_init": positive, "check_duality_gap": boolean, "reg_lower_limit": positive,
        "reg_finetune_lower_limit": positive, "preconditioner_iter": nonnegative_int,
        "preconditioner_scale_cost": boolean, "iterative_refinement_always_enabled": boolean,
        "eps_primal_inf": positive, "eps_dual_inf": positive, "tau": within(0.0, 1.0)}

    needs_eps_abs = True  # PIQP's own check: its absolute tolerances must be positive

    def _configure(self, solver: Any) -> None:
        st, s = solver.settings, self.settings
        st.eps_abs, st.eps_rel = float(s["eps_abs"]), max(float(s["eps_rel"]), 0.0)
        st.verbose = bool(s["verbose"])
        if s["max_iter"] is not None:
            st.max_iter = int(s["max_iter"])
        if self.backend_options.get("check_duality_gap", True):
            st.check_duality_gap = True
            st.eps_duality_gap_abs, st.eps_duality_gap_rel = st.eps_abs, st.eps_rel
        for k, v in self.backend_options.items():
            if v is not None and k != "check_duality_gap":
                setattr(st, k, v)

    @staticmethod
    def _data(qp: QP) -> tuple[Any, ...]:
        """``(P, A, b, G, h_l, h_u, eq, ineq)`` in PIQP's layout (dense or sparse CSC, P's upper triangle).

        ``ineq``: the inequality rows with a finite side (the others are left out).
        """
        eq = np.flatnonzero(qp.eq_mask)
        # rows infinite on both sides bound nothing (multiplier 0): PIQP would warn on stderr and zero them
        ineq = np.flatnonzero(~qp.eq_mask & (np.isfinite(qp.l) | np.isfinite(qp.u)))
        if qp.is_sparse:
            C = sp.csr_matrix(qp.C)
            P = sp.triu(sp.csc_matrix(qp.P), format="csc")
            A, G = sp.csc_matrix(C[eq]), sp.csc_matrix(C[ineq])
        else:
            P, A, G = (np.asfortranarray(M) for M in (qp.P, qp.C[eq], qp.C[ineq]))
        return P, A, qp.u[eq], G, qp.l[ineq], qp.u[ineq], eq, ineq

    def solve(self, qp: QP, warm_start: Any = None) -> Solution:
        """Solve one QP with PIQP (its dense solver for dense data, the sparse one otherwise).

        PIQP stalls on sides that are big-M stand-ins for "no bound" (a box of ±1e10 around a unit-scale QP: its
        duality gap stops near 1e-17 of the box, MAX_ITER with x right; a row's ``l = −1e10`` under ``u = 1``
        alike). At its default iteration limit (and within ``time_limit``), the variable bounds and inequality
        rows' sides beyond :data:`~polyproj.backends.scaling.HIGH` that x is far from (:func:`_far_sides`) are
        dropped and the QP solved again; that answer stands when it is SOLVED and meets every dropped side
        (a convex QP's minimiser over the larger set that lies in the smaller one is its minimiser there; their
        multipliers are 0).
        """
        sol = self._solve(qp)
        limit = self.settings["time_limit"]
        if sol.status is not Status.MAX_ITER or self.settings["max_iter"] is not None or \
                (limit is not None and sol.solve_time + sol.setup_time > limit):
            return sol  # (a max_iter of the user's own is a limit on the whole call)
        far = _far_sides(qp, sol.x)
        if far is None:
            return sol
        relaxed, dropped = far
        again = self._solve(relaxed)
        # the dropped sides are tested exactly, the kept ones are PIQP's to meet at its tolerance (an exact test of
        # all refused right answers: Cx = 1 + 5e-9 on an active u = 1)
        if again.status is not Status.SOLVED or not _meets(qp, dropped, again.x):
            return sol
        return dataclasses.replace(again, qp=qp, iterations=sol.iterations + again.iterations,
                                   solve_time=sol.solve_time + sol.setup_time + again.solve_time,
                                   info={**again.info, "far_bounds_dropped": sum(int(d.sum()) for d in dropped)})

    def _solve(self, qp: QP) -> Solution:
        import piqp

        t0 = time.perf_counter()
        P, A, b, G, h_l, h_u, eq, ineq = self._data(qp)
        solver = piqp.SparseSolver() if qp.is_sparse else piqp.DenseSolver()
        self._configure(solver)
        solver.setup(P, qp.q, A if eq.size else None, b if eq.size else None, G if ineq.size else None,
                     h_l if ineq.size else None, h_u if ineq.size else None, qp.lb, qp.ub)
        setup = time.perf_counter() - t0
        raw = solver.solve()
        if raw == piqp.Status.PIQP_INVALID_SETTINGS:
            raise SettingsError(f"PIQP rejected the settings {self.settings} {self.backend_options}")
        res, info = solver.result, solver.result.info
        status = _status_map().get(raw, Status.NUMERICAL_ERROR)
        z = np.zeros(qp.m)
        z[eq] = res.y if eq.size else 0.0
        if ineq.size:
            z[ineq] = np.asarray(res.z_u) - np.asarray(res.z_l)
        z_box = np.asarray(res.z_bu, dtype=np.float64) - np.asarray(res.z_bl, dtype=np.float64)
        x = np.array(res.x, dtype=np.float64)
        if status in (Status.PRIMAL_INFEASIBLE, Status.DUAL_INFEASIBLE, Status.NUMERICAL_ERROR):
            x = np.full(qp.n, np.nan)
        return Solution(x=x, z=z, z_box=z_box, status=status, iterations=int(info.iter),
                        solve_time=time.perf_counter() - t0 - setup, setup_time=setup, backend=self.name, qp=qp,
                        info={"raw_status": str(raw), "pri_res": float(info.primal_res),
                              "dua_res": float(info.dual_res), "duality_gap": float(info.duality_gap)})


def _far(side: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Where a finite ``side`` beyond HIGH is far from ``y`` (by more than half its size): a big-M stand-in."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(side) & (np.abs(side) > HIGH) & (np.abs(y - side) > 0.5 * np.abs(side))


def _far_sides(qp: QP, x: np.ndarray) -> tuple[QP, tuple[np.ndarray, ...]] | None:
    """``(relaxed, (lb, ub, l, u) masks)``: ``qp`` with its far sides (:func:`_far`) made infinite.

    One rule for the variable bounds (far from ``x``) and the inequality rows' sides (far from ``Cx``, in the
    rows' units; an equality row is never dropped). None if there is none (or x is not finite).
    """
    if not np.all(np.isfinite(x)):
        return None
    Cx, ineq = np.asarray(qp.C @ x, dtype=np.float64).reshape(-1), ~qp.eq_mask
    dropped = (_far(qp.lb, x), _far(qp.ub, x), _far(qp.l, Cx) & ineq, _far(qp.u, Cx) & ineq)
    if not any(d.any() for d in dropped):
        return None
    sides = {k: np.where(d, sign * np.inf, getattr(qp, k))
             for k, d, sign in zip(("lb", "ub", "l", "u"), dropped, (-1.0, 1.0, -1.0, 1.0))}
    return qp.with_vectors(validate=False, **sides), dropped


def _meets(qp: QP, dropped: tuple[np.ndarray, ...], x: np.ndarray) -> bool:
    """Whether ``x`` meets every side of ``qp`` that ``dropped`` (:func:`_far_sides`'s masks) marks, exactly."""
    Cx = np.asarray(qp.C @ x, dtype=np.float64).reshape(-1)
    drop_lb, drop_ub, drop_l, drop_u = dropped
    return bool(np.all(x[drop_lb] >= qp.lb[drop_lb]) and np.all(x[drop_ub] <= qp.ub[drop_ub])
                and np.all(Cx[drop_l] >= qp.l[drop_l]) and np.all(Cx[drop_u] <= qp.u[drop_u]))
