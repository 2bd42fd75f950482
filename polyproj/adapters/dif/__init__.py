"""DIF engine: directional influence functions for constrained learning (docs/dif.md).

Data attribution and approximate unlearning for models trained under constraints
``min mean ℓ₀ s.t. mean ℓⱼ − τⱼ <= 0``. The directional derivative of the solution under a removal
solves a QP over the active constraints (binding: equality, weakly active: inequality); with no
active constraint it is the classic influence function. Dense (H formed) and matrix-free (Krylov
on Hessian-vector products, Schur complement over the active constraints) paths; training to a KKT
point for networks; Cooper; distributed all-point scores.

>>> from polyproj.adapters.dif import ConstrainedProblem, Loss, Constraint, solve, DIF   # doctest: +SKIP
>>> kkt = solve(problem)                                                                 # doctest: +SKIP
>>> DIF(problem, kkt).delta_theta({"objective": [0, 5]})                                 # doctest: +SKIP
"""

from .baselines import classic_if, if_scores, penalty_if, retrain, tracin_scores
from .engine import DENSE_MAX_DIM, DIF, DIFResult, Linearisation
from .kkt import KKTPoint, solve
from .krylov import IndefiniteHessianError, KrylovInfo
from .problem import ConstrainedProblem, Constraint, Loss, Removal

__all__ = [
    "DENSE_MAX_DIM",
    "DIF",
    "ConstrainedProblem",
    "Constraint",
    "DIFResult",
    "IndefiniteHessianError",
    "KKTPoint",
    "KrylovInfo",
    "Linearisation",
    "Loss",
    "Removal",
    "classic_if",
    "if_scores",
    "penalty_if",
    "retrain",
    "solve",
    "tracin_scores",
]
