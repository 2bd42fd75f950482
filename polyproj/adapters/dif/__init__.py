"""DIF engine: directional influence functions for constrained learning (DESIGN §10).

Data attribution and approximate unlearning for models trained under constraints
``min mean ℓ₀ s.t. mean ℓⱼ − τⱼ <= 0``. The directional derivative of the solution under a removal
solves a QP over the active constraints (binding: equality, weakly active: inequality); with no
active constraint it is the classic influence function.

>>> from polyproj.adapters.dif import ConstrainedProblem, Loss, Constraint, solve, DIF   # doctest: +SKIP
>>> kkt = solve(problem)                                                                 # doctest: +SKIP
>>> DIF(problem, kkt).delta_theta({"objective": [0, 5]})                                 # doctest: +SKIP
"""

from .baselines import classic_if, penalty_if, retrain
from .engine import DIF, DIFResult, Linearisation
from .kkt import KKTPoint, solve
from .problem import ConstrainedProblem, Constraint, Loss, Removal

__all__ = [
    "DIF",
    "ConstrainedProblem",
    "Constraint",
    "DIFResult",
    "KKTPoint",
    "Linearisation",
    "Loss",
    "Removal",
    "classic_if",
    "penalty_if",
    "retrain",
    "solve",
]
