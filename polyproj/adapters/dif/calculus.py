"""Derivatives of a :class:`ConstrainedProblem` by ``torch.func`` (float64, returned as NumPy).

These are the dense building blocks of the exact path: gradients, constraint Jacobians, the
Hessian of the Lagrangian ``∇²f₀ + Σ λⱼ∇²gⱼ`` and per-sample gradients (``jacrev`` of the
per-sample losses). The matrix-free path uses :mod:`polyproj.adapters.dif.hvp` (Hessian-vector
products in data chunks) and :mod:`polyproj.adapters.dif.scores` (vmapped per-sample gradients)
instead.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from .problem import ConstrainedProblem

__all__ = ["FORWARD_AD", "constraint_jacobian", "lagrangian_hessian", "objective_grad", "per_sample",
           "per_sample_grads"]

#: held around every forward-mode section (``torch.func.hessian``, ``jvp``): torch's forward-AD levels
#: are process-wide, so two threads in forward mode at once corrupt each other's (e.g. re-solves on a
#: thread pool); reverse mode is per thread and runs unlocked
FORWARD_AD = threading.RLock()


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float64, copy=True)


def objective_grad(problem: ConstrainedProblem, theta: torch.Tensor) -> tuple[float, np.ndarray]:
    """f₀(θ) and ∇f₀(θ)."""
    g, v = torch.func.grad_and_value(problem.objective_value)(theta)
    return float(v), _np(g)


def constraint_jacobian(problem: ConstrainedProblem, theta: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """g(θ) (m,) and its Jacobian (m, d)."""
    if problem.m == 0:
        return np.zeros(0), np.zeros((0, problem.dim))
    J, v = torch.func.jacrev(lambda t: (problem.constraint_values(t),) * 2, has_aux=True)(theta)
    return _np(v), _np(J)


def lagrangian_hessian(problem: ConstrainedProblem, theta: torch.Tensor, lambdas: Any) -> np.ndarray:
    """∇²_θ L(θ, λ) = ∇²f₀ + Σ λⱼ∇²gⱼ, symmetrised, (d, d)."""
    lam = torch.as_tensor(np.asarray(lambdas, dtype=np.float64))
    with FORWARD_AD:
        H = _np(torch.func.hessian(lambda t: problem.lagrangian(t, lam))(theta))
    return 0.5 * (H + H.T)


def per_sample(problem: ConstrainedProblem, name: str, theta: torch.Tensor, idx: Any = None) -> np.ndarray:
    """Per-sample losses of loss ``name`` at θ (for the samples ``idx``; all when None)."""
    from .problem import _take

    loss = problem.loss(name)
    data = loss.data if idx is None else _take(loss.data, torch.as_tensor(np.asarray(idx, dtype=np.int64)))
    with torch.no_grad():
        return _np(problem.per_sample(loss, theta, data))


def per_sample_grads(problem: ConstrainedProblem, name: str, theta: torch.Tensor, idx: Any = None,
                     chunk: int = 4096) -> np.ndarray:
    """Per-sample gradients ∇ℓ(zᵢ, θ) of loss ``name``, shape (k, d), by ``jacrev`` in chunks."""
    from .problem import _take

    loss = problem.loss(name)
    n = loss.n_samples
    idx = np.arange(n) if idx is None else np.asarray(idx, dtype=np.int64)
    out = np.empty((idx.size, problem.dim))
    for s in range(0, idx.size, chunk):
        sub = _take(loss.data, torch.as_tensor(idx[s:s + chunk]))
        out[s:s + chunk] = _np(torch.func.jacrev(lambda t, sub=sub: problem.per_sample(loss, t, sub))(theta))
    return out
