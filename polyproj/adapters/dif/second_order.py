"""Second-order DIF: one chord-Newton correction of the first-order prediction.

The first-order DIF ω₁ (with μ₁, the change of λ) is the first step of Newton's method on the
removed problem's KKT system from (θ̄, λ̄), with the removal's terms to first order in its size ε
(ε = 1/N for one sample, |Z|/N for a group); its error is O(ε²). One more step with the *same*
KKT matrix at θ̄, J̄ = [[H, C̄ᵀ], [C̄, 0]] (H and the constraint Jacobian C̄ at θ̄, so H⁻¹C̄ᵀ and the
dual matrix are reused), on the exact residual of the removed problem at (θ₁, λ₁) = (θ̄ + ω₁, λ̄ + μ₁),

    F(θ₁, λ₁) = (∇f₀'(θ₁) + G'(θ₁)ᵀλ₁,  g'(θ₁)),

is a chord step, whose error is O(‖J̄ − J*‖·‖e₁‖) = O(ε·ε²): ω₂ = ω₁ + δ is exact to second order.
Written as a QP in δ, so that multipliers keep their signs and a constraint may leave (a binding
row with a tiny λ̄) or join (an inactive row that θ₁ violates) the active set::

    min qᵀδ + ½δᵀHδ   s.t.  g'ⱼ(θ₁) + C̄ⱼδ <= 0  (= 0 on kept rows),   q = ∇f₀'(θ₁) + (G'(θ₁) − C̄)ᵀλ₁,

whose multipliers ν are the new λ itself (stationarity Hδ + C̄ᵀν = −q is the chord step's first
row, H δ + C̄ᵀ(ν − λ₁) = −(∇f₀' + G'ᵀλ₁)). By its dual, as on the matrix-free path::

    δ = −H⁻¹(q + C̄ᵀν),   ν = argmin ½νᵀ(C̄H⁻¹C̄ᵀ)ν + (C̄H⁻¹q − g')ᵀν,   ν >= 0 on inequality rows.

Rows: the KKT point's active rows, every constraint that θ₁ violates, and every inequality that the step
crosses, both its linearisation g'ⱼ(θ₁) + C̄ⱼδ and the constraint itself at θ₁ + δ (added and δ solved again
until none is: the SQP subproblem with every constraint, solving H⁻¹C̄ⱼᵀ, once, only for the rows a step
reaches, and evaluating the constraints at θ₁ + δ only where a linearisation crosses); equalities and binding rows
with λ₁ⱼ > |μⱼ| are kept at equality (ν free), the others sign-constrained.

**Step length.** Like every chord or Newton step far from its solution (and as the re-solves of
:func:`~polyproj.adapters.dif.newton.newton_kkt` do), the step is globalised by backtracking on the
removed problem's own KKT residual (:func:`~polyproj.adapters.dif.newton.kkt_residuals`, the largest
of stationarity, feasibility, complementarity and dual sign): ω₂ = ω₁ + tδ, λ₂ = λ₁ + t(ν − λ₁) with
the largest t in 1, ½, …, :data:`MIN_STEP` at which that residual is below its value at (θ₁, λ₁).
Where the removal stays in the expansion's range t = 1 (the O(ε³) step); where retraining moves far
from θ̄ (a large group of a deep net) the full step can overshoot while a shorter one still moves
towards the removed problem's KKT point; where no t lowers the residual the correction is not applied
(t = 0: the first-order answer). Cost per removal: one pass over the removed problem's data (the
gradients of f₀ and of each gⱼ) at θ₁ and one per step length tried, and one solve with H (Krylov on
the matrix-free path); a constraint the step crosses adds a pass over the constraints' data and, once per
DIF, a solve with H for its row. A test function is then evaluated at θ̄ + ω₂, not linearised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .problem import ConstrainedProblem

__all__ = ["MIN_STEP", "SecondOrderStep", "correction", "step_length"]

#: the shortest fraction of the correction tried (halving from 1) before it is not applied
MIN_STEP = 1.0 / 16.0


@dataclass(frozen=True)
class SecondOrderStep:
    """The correction δ of one removal and what it was computed from.

    Attributes
    ----------
    delta : ndarray (d,)
        ω₂ − ω₁.
    lambdas : ndarray (m,)
        ν: the predicted multipliers of the removed problem (zero off ``rows``).
    rows : ndarray of int
        Constraints in the step's QP (active at θ̄, violated at θ̄ + ω₁, or crossed by the step).
    start : ndarray (m,)
        λ₁ = λ̄ + μ₁, the multipliers the step starts from.
    residual : float
        The removed problem's KKT residual at (θ̄ + ω₁, λ₁), which a step length must lower.
    """

    delta: np.ndarray
    lambdas: np.ndarray
    rows: np.ndarray
    start: np.ndarray
    residual: float


def correction(dif, removed: ConstrainedProblem, omega1: np.ndarray, dlam1: np.ndarray) -> SecondOrderStep:
    """δ on ``removed`` (``dif.problem.remove(removal)``) from the first-order (ω₁, μ₁) of ``dif`` (a DIF)."""
    from .newton import first_order, kkt_residuals

    problem, lin = dif.problem, dif.lin
    lam1 = lin.lam + dlam1
    theta1 = dif.kkt.theta + torch.as_tensor(omega1, dtype=torch.float64)
    _, gf, g, G = first_order(removed, theta1, dif.chunk_size)
    Cbar = lin.G
    q = gf + (G - Cbar).T @ lam1 if problem.m else gf
    y = dif._solve_h(q, "second order: H⁻¹q")
    m = problem.m
    violated = np.flatnonzero(g > 0.0) if m else np.zeros(0, np.int64)
    rows = np.union1d(dif.rows, violated).astype(np.int64)
    for _ in range(m + 1):  # each pass adds at least one row: at most m passes
        nu = np.zeros(m)
        if rows.size:
            # a binding row stays at equality when its predicted multiplier is larger than its predicted
            # change (λ₁ⱼ > |μⱼ|: a margin the removal does not use up), so that on a far step the
            # quadratic model cannot drop a clearly binding row; the others (weakly active, binding with a
            # multiplier the removal may move through zero, violated) keep the sign constraint ν >= 0
            binding = np.isin(rows, dif.rows[dif.row_eq])
            fixed = problem.eq_mask[rows] | (binding & (lam1[rows] > np.abs(dlam1[rows])))
            V, dual = dif.constraint_solves(rows, fixed)
            nu[rows] = dual.solve(Cbar[rows] @ y - g[rows])
            delta = -(y + V @ nu[rows])
        else:
            delta = -y
        # an inequality the step crosses joins the QP (the SQP subproblem holds every constraint; only those
        # the step reaches are solved for): crossed by its linearisation g'ⱼ(θ₁) + C̄ⱼδ, which the QP row
        # holds, and by the constraint itself at θ₁ + δ (a curved constraint whose linearisation alone
        # crosses would stop the step short of a point retraining reaches)
        out = ~np.isin(np.arange(m), rows) & ~problem.eq_mask if m else np.zeros(0, bool)
        reached = np.flatnonzero(out & (Cbar @ delta + g > 0.0))
        if reached.size:
            g_step = removed.constraint_values(theta1 + torch.as_tensor(delta, dtype=torch.float64))
            reached = reached[g_step.detach().numpy()[reached] > 0.0]
        if not reached.size:
            break
        rows = np.union1d(rows, reached).astype(np.int64)
    residual = max(kkt_residuals(gf, G, g, lam1, problem.eq_mask).values(), default=0.0)
    return SecondOrderStep(delta=delta, lambdas=nu, rows=rows, start=lam1, residual=residual)


def step_length(dif, removed: ConstrainedProblem, omega1: np.ndarray,
                step: SecondOrderStep) -> tuple[float, np.ndarray | None]:
    """The largest t in 1, ½, …, :data:`MIN_STEP` that lowers ``removed``'s KKT residual below ``step.residual``.

    The residual at (θ̄ + ω₁ + tδ, λ₁ + t(ν − λ₁)). Returns t and the removed problem's constraint values
    g(θ̄ + ω₁ + tδ) there, or (0.0, None) where no t lowers it (module docstring).
    """
    from .newton import residual_backtracking

    theta1 = dif.kkt.theta + torch.as_tensor(omega1, dtype=torch.float64)
    t, found = residual_backtracking(removed, theta1, step.delta, step.start, step.lambdas, step.residual,
                                     min_step=MIN_STEP, chunk_size=dif.chunk_size)
    return t, (found[3] if found is not None else None)
