"""The constrained linear-regression study of the seed paper's first table.

Shared by the demo, the tests and ``benchmarks/dif_regression.py``.

Least squares ``ℓ₀(z, θ) = (xᵀθ − y)²`` on N training points with

* ``sum3``:   θ₀ + θ₁ + θ₂ = s               (linear equality, data-free)
* ``cap3``:   θ₃ <= c₃                       (linear inequality, data-free, binding)
* ``group``:  mean_{i∈A} (xᵢᵀθ − yᵢ)² <= τ   (group risk of group A; τ between its least
  reachable value and its value without the constraint, so binding)
* ``weak5``, ``weak7``: θ₅ <= θ̂₅, −θ₇ <= −θ̂₇  (weakly active: θ̂ solves the problem without them)
* ``loose``:  θ₆ <= θ̂₆ + 1                   (inactive)

Removing training point i removes it from the objective and, when i ∈ A, from the group data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .kkt import KKTPoint, solve
from .problem import ConstrainedProblem, Constraint, Loss

__all__ = ["RegressionStudy", "make_regression_study", "pearson"]


@dataclass(frozen=True, eq=False)
class RegressionStudy:
    """The problem, its KKT point, the test loss and the leave-one-out removals."""

    problem: ConstrainedProblem
    kkt: KKTPoint
    test_loss: object
    removals: list
    group: np.ndarray


def _sq(th: torch.Tensor, b: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return (b[0] @ th - b[1]) ** 2


def make_regression_study(n: int = 500, d: int = 10, n_test: int = 500, seed: int = 0,
                          tau_frac: float = 0.5, backend: str = "proxsuite") -> RegressionStudy:
    """Build the study problem and train it to a KKT point (residual 1e-10)."""
    if d < 8:
        raise ValueError("the study needs d >= 8 parameters")
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=d)
    beta[3] = 1.5
    X = rng.normal(size=(n, d))
    group = np.flatnonzero(rng.random(n) < 0.3)
    y = X @ beta + 0.5 * rng.normal(size=n)
    y[group] += X[group] @ (0.5 * rng.normal(size=d))  # group A follows another model: a real trade-off
    Xt = rng.normal(size=(n_test, d))
    yt = Xt @ beta + 0.5 * rng.normal(size=n_test)
    T = torch.as_tensor
    data = (T(X), T(y))
    gdata = (T(X[group]), T(y[group]))
    e = np.eye(d)

    def lin(k: int, sign: float = 1.0):
        v = T(sign * e[k])
        return lambda th: v @ th

    base = [Constraint(lambda th: th[0] + th[1] + th[2], None, tau=float(beta[:3].sum()) - 0.5, name="sum3",
                       kind="eq"),
            Constraint(lin(3), None, tau=1.0, name="cap3")]
    # unconstrained group risk, then a level below it so that the group constraint binds
    p0 = ConstrainedProblem(torch.zeros(d), Loss(_sq, data), base)
    k0 = solve(p0, backend=backend, warn=False)
    risk0 = float(_sq(k0.theta, gdata).mean())
    # the least group risk reachable under the base constraints; τ halfway keeps the constraint binding
    pg = ConstrainedProblem(k0.theta, Loss(_sq, gdata), base)
    risk_min = float(_sq(solve(pg, backend=backend, warn=False).theta, gdata).mean())
    cons = [*base, Constraint(_sq, gdata, tau=risk_min + tau_frac * (risk0 - risk_min), name="group")]
    p1 = ConstrainedProblem(k0.theta, Loss(_sq, data), cons)
    k1 = solve(p1, theta0=k0.theta, backend=backend, warn=False)
    th = k1.theta.numpy()
    cons += [Constraint(lin(5), None, tau=float(th[5]), name="weak5"),
             Constraint(lin(7, -1.0), None, tau=float(-th[7]), name="weak7"),
             Constraint(lin(6), None, tau=float(th[6]) + 1.0, name="loose")]
    problem = ConstrainedProblem(k1.theta, Loss(_sq, data), cons)
    lam0 = np.concatenate([k1.lambdas.numpy(), np.zeros(3)])
    kkt = solve(problem, theta0=k1.theta, lambdas0=lam0, backend=backend, warn=False)
    pos = {int(i): k for k, i in enumerate(group)}
    removals = [{"objective": [i], "group": [pos[i]]} if i in pos else {"objective": [i]} for i in range(n)]
    Xt_t, yt_t = T(Xt), T(yt)

    def test_loss(theta: torch.Tensor) -> torch.Tensor:
        return ((Xt_t @ theta - yt_t) ** 2).mean()

    return RegressionStudy(problem=problem, kkt=kkt, test_loss=test_loss, removals=removals, group=group)


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two flattened arrays."""
    a, b = np.ravel(a), np.ravel(b)
    return float(np.corrcoef(a, b)[0, 1])
