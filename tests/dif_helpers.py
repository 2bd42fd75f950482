"""Problems several DIF test modules build: least squares with two binding constraints, an untrained tanh net."""

from __future__ import annotations

import warnings

import numpy as np
import torch

import polyproj as pp
from polyproj.adapters.dif import ConstrainedProblem, Constraint, KKTPoint, Loss, solve


def sq(th, b):
    """Per-sample squared residuals of a linear model."""
    return (b[0] @ th - b[1]) ** 2


def second_coordinate(th):
    return th[1]


def binding_least_squares(n: int):
    """Least squares (N = n, d = 4) with a binding bound on θ₁ and a binding group-risk constraint with data.

    Returns ``(problem, kkt, X, y)``; the group's τ lies between its least reachable risk and its risk at the
    bound-only optimum, so both constraints bind. Module-level functions: picklable for process pools.
    """
    rng = np.random.default_rng(7)
    X = torch.as_tensor(rng.normal(size=(n, 4)))
    y = torch.as_tensor(rng.normal(size=n) + X.numpy() @ np.array([1.0, 2.0, -1.0, 0.5]))
    G = (X[:10], y[:10] + 1.0)
    cap = Constraint(second_coordinate, None, tau=1.0, name="cap")
    k0 = solve(ConstrainedProblem(torch.zeros(4), Loss(sq, (X, y)), [cap]))
    kg = solve(ConstrainedProblem(torch.zeros(4), Loss(sq, G), [cap]))  # least reachable group risk
    tau = 0.5 * (float(sq(kg.theta, G).mean()) + float(sq(k0.theta, G).mean()))  # feasible and binding
    prob = ConstrainedProblem(k0.theta, Loss(sq, (X, y)), [cap, Constraint(sq, G, tau=tau, name="group")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        kkt = solve(prob)
    return prob, kkt, X, y


def net_sq(m, b):
    """Per-sample squared residuals of a module."""
    return (m(b[0]).squeeze(-1) - b[1]) ** 2


def untrained_tanh(n: int, width: int):
    """An untrained tanh net (3 → width → 1, seed 0) on n samples with a risk cap it is far from (inactive).

    Its Hessian has negative curvature: ``damping="auto"`` must raise the damping. Returns ``(problem, kkt, X, y)``.
    """
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    X, y = torch.as_tensor(rng.normal(size=(n, 3))), torch.as_tensor(rng.normal(size=n))
    net = torch.nn.Sequential(torch.nn.Linear(3, width), torch.nn.Tanh(), torch.nn.Linear(width, 1)).double()
    prob = ConstrainedProblem(net, Loss(net_sq, (X, y)), [Constraint(net_sq, (X[:10], y[:10]), tau=100.0, name="cap")])
    return prob, KKTPoint.from_params(prob, net, tol=10.0), X, y


def _linear_first(th, b):
    """Least squares in θ₁..θ₃ and a linear pull on θ₀: zero curvature along θ₀, which the cap θ₀ <= 0.7 binds."""
    return (b[0][:, 1:] @ th[1:] - b[1]) ** 2 - th[0]


def _theta0(th):
    return th[0]


def flat_along_a_cap(n: int):
    """``(problem, kkt)``: H singular along θ₀, positive definite on the binding cap θ₀ <= 0.7's null space (n samples).

    Module-level functions: picklable for process pools.
    """
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 4, dtype=torch.float64, generator=g)
    y = X[:, 1:] @ torch.tensor([-2.0, 0.5, 3.0], dtype=torch.float64) + 0.3 * torch.randn(n, dtype=torch.float64,
                                                                                          generator=g)
    prob = ConstrainedProblem(torch.zeros(4), Loss(_linear_first, (X, y)), [Constraint(_theta0, None, tau=0.7)])
    return prob, solve(prob)
