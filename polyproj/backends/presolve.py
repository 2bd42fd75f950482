"""Small exact reductions a backend can apply before handing a QP to a solver that mishandles them.

Fixed variables (``lb_j == ub_j``): HiGHS 1.16 ends ``P = diag(1, 0), q = (1, 0), lb = ub = 0`` in
"Solve error". Substituting ``x_F = lb_F`` leaves the QP in the free variables ``f``

    min ½ x_fᵀ P_ff x_f + (q_f + P_fF x_F)ᵀ x_f   s.t.  l − C_F x_F <= C_f x_f <= u − C_F x_F,
                                                      lb_f <= x_f <= ub_f,

whose multipliers ``z`` and ``z_box_f`` are those of the original problem; the fixed variables'
bound multipliers follow from stationarity, ``z_box_F = −(P x + q + Cᵀz)_F``.

A row whose free part is zero (every row, once all variables are fixed) is decided by the shift alone,
``l_i <= C_F x_F <= u_i``, and the shift carries rounding: ``3 · 0.1 − 0.3 = 5.6e-17``, and HiGHS and DAQP
called ``3 x = 0.3, x = 0.1`` infeasible. Such a row is met when it is met to the rounding of its terms,
``(k + 2) eps (|C_F| |x_F| + |l_i| + |u_i|)`` (``k`` fixed terms summed, the sides and the subtraction one
rounding each), and is then left out of the reduced problem (``±inf``: it constrains no free variable, its
multiplier is 0 and the fixed variables' ``z_box_F`` take its force); one missed by more stays, and the
reduced problem is infeasible as the original is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from ..problem import QP, _row_max
from ..solution import Solution, Status

__all__ = ["FixedVariables", "fixed_variables", "solve_without_fixed"]


def _columns(M, idx: np.ndarray):
    return sp.csc_matrix(M)[:, idx] if sp.issparse(M) else M[:, idx]


@dataclass(frozen=True)
class FixedVariables:
    """The substitution ``x_F = lb_F`` (module docstring)."""

    free: np.ndarray
    fixed: np.ndarray
    values: np.ndarray

    def problem(self, qp: QP) -> QP:
        """The QP in the free variables (``n`` may be 0)."""
        f, F, v = self.free, self.fixed, self.values
        P = qp.P.tocsr() if sp.issparse(qp.P) else qp.P
        P_ff = P[f][:, f]
        shift_q = np.asarray(P[f][:, F] @ v).reshape(-1)
        C_F, C_f = _columns(qp.C, F), _columns(qp.C, f)
        shift_c = np.asarray(C_F @ v).reshape(-1) if qp.m else np.zeros(0)
        with np.errstate(invalid="ignore"):  # inf - finite stays inf
            l, u = qp.l - shift_c, qp.u - shift_c
        if qp.m:  # rows without free variables: met to the rounding of the shift, or not (module docstring)
            terms = np.asarray(abs(C_F) @ np.abs(v)).reshape(-1)
            sides = np.where(np.isfinite(qp.l), np.abs(qp.l), 0.0) + np.where(np.isfinite(qp.u), np.abs(qp.u), 0.0)
            tol = (F.size + 2) * np.finfo(np.float64).eps * (terms + sides)
            met = (_row_max(C_f) == 0) & (l <= tol) & (u >= -tol)
            l, u = np.where(met, -np.inf, l), np.where(met, np.inf, u)
        sub = QP(P=sp.csc_matrix(P_ff) if sp.issparse(qp.P) else P_ff, q=qp.q[f] + shift_q,
                 C=C_f, l=l, u=u, lb=qp.lb[f], ub=qp.ub[f], check_psd=False)
        object.__setattr__(sub, "check_psd", qp.check_psd)  # a principal submatrix of a PSD P is PSD
        return sub

    def solution(self, sol: Solution, qp: QP) -> Solution:
        """The reduced problem's Solution in the original variables."""
        x = np.empty(qp.n)
        x[self.free], x[self.fixed] = sol.x, self.values
        z = np.asarray(sol.z, dtype=np.float64)
        z_box = np.empty(qp.n)
        z_box[self.free] = sol.z_box
        grad = qp.P @ x + qp.q + (qp.C.T @ z if qp.m else 0.0)
        z_box[self.fixed] = -np.asarray(grad).reshape(-1)[self.fixed]
        return replace(sol, x=x, z=z, z_box=z_box, qp=qp,
                       info={**sol.info, "presolve": f"{self.fixed.size} fixed variable(s) substituted"})


def fixed_variables(qp: QP) -> FixedVariables | None:
    """The substitution of the variables with ``lb == ub``, or None when there are none."""
    fixed = np.flatnonzero(qp.lb == qp.ub)
    if not fixed.size:
        return None
    free = np.flatnonzero(qp.lb != qp.ub)
    return FixedVariables(free=free, fixed=fixed, values=qp.lb[fixed].copy())


def solve_without_fixed(backend, qp: QP, run) -> Solution:
    """``run(qp)`` with the fixed variables substituted first (:func:`fixed_variables`), the answer mapped back.

    ``backend``: the QPSolver (its name and NaN solutions); a reduced problem without variables is answered
    here (:func:`~.validation.empty_solution`). HiGHS 1.16 fails on fixed variables; DAQP called an LP
    with a fixed variable and a free one of zero cost dual infeasible.
    """
    from .validation import empty_solution

    red = fixed_variables(qp)
    if red is None:
        return run(qp)
    sub = red.problem(qp)
    sol = run(sub) if sub.n else empty_solution(sub, backend.name)
    if not sol.status.ok and sol.status not in (Status.TIME_LIMIT, Status.MAX_ITER):
        return backend._nan_solution(qp, sol.status, backend.name, iterations=sol.iterations,
                                     solve_time=sol.solve_time, info=sol.info)
    return red.solution(sol, qp)
