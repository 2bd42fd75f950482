"""KKT points from models trained with Cooper (``cooper-optim``), for :class:`KKTPoint.from_cooper`.

Cooper (Gallego-Posada et al.) trains a ``ConstrainedMinimizationProblem`` by gradient descent-ascent
on the Lagrangian, usually on mini-batches, so what it ends with is an *approximate* KKT point with
stochastic-estimate multipliers. Here its multipliers are read by constraint name, the constraints
are re-evaluated on the full data of the :class:`ConstrainedProblem`, and the multipliers are
polished (non-negative least squares on stationarity over the active constraints) when they do not
satisfy stationarity to ``tol``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ProblemError, close_matches
from .problem import ConstrainedProblem

__all__ = ["cooper_multipliers"]


def cooper_multipliers(problem: ConstrainedProblem, cmp: Any) -> np.ndarray:
    """λ (m,) in the order of ``problem.constraints``, read from ``cmp.named_constraints()``.

    A Cooper constraint ``name`` with one multiplier maps to the problem's constraint ``name``; one
    with n > 1 multipliers (a vector constraint) to ``name[0]`` … ``name[n-1]``. Constraint kinds must
    agree (Cooper's ``ConstraintType.EQUALITY`` ⇔ ``kind="eq"``).

    Raises
    ------
    ProblemError
        A Cooper constraint has no counterpart in ``problem`` (or the converse), kinds differ, or a
        constraint has no explicit multiplier.
    """
    if not hasattr(cmp, "named_constraints"):
        raise ProblemError(f"cmp must be a cooper.ConstrainedMinimizationProblem, got {type(cmp).__name__}")
    import cooper

    names = [c.name for c in problem.constraints]
    lam = np.zeros(problem.m)
    seen = np.zeros(problem.m, dtype=bool)
    explicit = getattr(cooper.multipliers, "ExplicitMultiplier", None)
    for cname, constraint in cmp.named_constraints():
        mult = getattr(constraint, "multiplier", None)
        # a multiplier model (ImplicitMultiplier) may have a parameter named weight: not the multipliers
        if mult is None or not hasattr(mult, "weight") or (explicit is not None and not isinstance(mult, explicit)):
            raise ProblemError(f"Cooper constraint {cname!r} has no explicit multiplier (weight) to read")
        values = mult.weight.detach().cpu().double().reshape(-1).numpy()
        if not np.all(np.isfinite(values)):  # a diverged run: not a missing constraint
            raise ProblemError(f"the multiplier(s) of Cooper constraint {cname!r} are not finite ({values.tolist()}): "
                               "the Cooper run diverged; retrain it, or solve the problem with dif.solve")
        keys = [cname] if values.size == 1 else [f"{cname}[{i}]" for i in range(values.size)]
        is_eq = "EQUALITY" in str(constraint.constraint_type).upper() and \
            "INEQUALITY" not in str(constraint.constraint_type).upper()
        for key, v in zip(keys, values, strict=True):
            if key not in names:
                raise ProblemError(f"Cooper constraint {key!r} is not a constraint of the problem (constraints: "
                                   f"{names})." + close_matches(key, names))
            j = names.index(key)
            if (problem.constraints[j].kind == "eq") != is_eq:
                raise ProblemError(f"constraint {key!r}: Cooper says {constraint.constraint_type}, the problem "
                                   f"says kind={problem.constraints[j].kind!r}")
            lam[j], seen[j] = v, True
    missing = [n for n, s in zip(names, seen, strict=True) if not s]
    if missing:
        raise ProblemError(f"the Cooper problem has no multiplier for the constraints {missing}")
    return lam
