"""First-order data of a problem at a KKT point, and the linear terms (c, r) of a removal.

For a removal Zʳ the DIF QP's linear data are (docs/dif.md, "Removal semantics")::

    c = c₀ + Σⱼ λ̄ⱼ cⱼ,   c_L = −(1/W_L) Σ_{z∈Zʳ_L} w_z ∇ℓ_L(z) + (Σ w_z / W_L) ∇(mean ℓ_L)   (renormalised)
    rⱼ = −(1/Wⱼ) Σ w_z ℓⱼ(z) + (Σ w_z / Wⱼ) ℓ̄ⱼ

Both are linear in the per-sample gradients, so they can be formed in any *gradient basis*: the
full space (rows of ∇ℓ, the exact path) or the projections ∇ℓᵀM on a few directions M = [H⁻¹∇F,
H⁻¹∇g_A] (the matrix-free scores). :func:`removal_terms` takes the basis as a *source* with
``grad_f0``, ``G`` and ``sample_data(name, idx)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any, Protocol

import numpy as np
import torch

from ...errors import ProblemError
from .calculus import constraint_jacobian, lagrangian_hessian, objective_grad, per_sample, per_sample_grads
from .kkt import KKTPoint
from .problem import ConstrainedProblem, Removal

__all__ = ["GradientSource", "Linearisation", "removal_terms"]


class GradientSource(Protocol):
    """Gradients in some basis (p columns): of f₀, of each gⱼ, and per sample."""

    grad_f0: np.ndarray  # (p,)
    G: np.ndarray  # (m, p)

    def sample_data(self, name: str, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(per-sample gradients (k, p), per-sample losses (k,) or None for the objective)."""


def loss_weights(problem: ConstrainedProblem, name: str) -> tuple[np.ndarray, float]:
    """Per-sample weights w and the normaliser W of loss ``name`` (mean = Σwℓ / W)."""
    loss = problem.loss(name)
    w = np.ones(loss.n_samples) if loss.weights is None else loss.weights.numpy().astype(np.float64)
    W = float(w.sum()) if loss.renormalize else float(w.size)
    return w, W


def normaliser_share(problem: ConstrainedProblem, name: str, w: np.ndarray) -> np.ndarray:
    """What each sample of weights ``w`` adds to loss ``name``'s normaliser W.

    Its weight (W = Σw), or 1 (W = N, ``renormalize=False``). Removing samples lowers W by their shares: the
    renormalisation term of a removal.
    """
    return w if problem.loss(name).renormalize else np.ones_like(w)


def removal_terms(problem: ConstrainedProblem, g: np.ndarray, source: GradientSource, removal: Removal, *,
                  renormalize: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(c₀ (p,), c_constraints (m, p), r (m,)) of one removal in the basis of ``source``.

    ``c = c₀ + Σ wⱼ c_constraintsⱼ`` with wⱼ = λ̄ⱼ for DIF; ``g`` are the constraint values gⱼ(θ̄).
    """
    rem = problem.check_removal(removal)
    p, m = source.grad_f0.shape[0], problem.m
    c0, cc, r = np.zeros(p), np.zeros((m, p)), np.zeros(m)
    for name, idx in rem.items():
        w, W = loss_weights(problem, name)
        wi = w[idx]
        grads, vals = source.sample_data(name, idx)
        gterm = -(wi @ grads) / W
        share = float(normaliser_share(problem, name, wi).sum()) / W  # the removal's fraction of W
        if name == "objective":
            if renormalize:
                gterm = gterm + share * source.grad_f0
            c0 += gterm
        else:
            j = problem.names.index(name) - 1
            rj = -(wi @ vals) / W
            if renormalize:
                rj += share * (g[j] + problem.constraints[j].tau)
                gterm = gterm + share * source.G[j]
            cc[j] += gterm
            r[j] += rj
    return c0, cc, r


def check_split(ambiguous: np.ndarray | None, cc: np.ndarray, names: Sequence[str]) -> None:
    """Raise when a removal's term λ̄ᵀcc depends on how λ̄ is split among dependent constraints.

    ``ambiguous`` (m, a): the directions λ̄ may move along at θ̄ (left null vectors of the active gradients,
    LICQ failing), or None where the rule does not use λ̄ᵀcc on its own (``rule="derivative"``). ``cc`` (m, p):
    the removal's change of the constraint gradients, in any basis (the scores' projected one too: there
    only the part the score sees must be unambiguous). ``names``: the constraints' names.
    """
    if ambiguous is None or not ambiguous.shape[1]:
        return
    if np.abs(ambiguous.T @ cc).max(initial=0.0) <= 1e-9 * np.abs(cc).max(initial=0.0):
        return
    dependent = [names[j] for j in np.flatnonzero(np.abs(ambiguous).max(axis=1) > 1e-8)]
    raise ProblemError(f"rule='finite' is not defined for this removal: it changes the data of constraints "
                       f"{dependent}, whose gradients are linearly dependent at θ̄ (LICQ fails), so their "
                       "multipliers are not unique and the answer would depend on how λ̄ is split among "
                       "them; remove the duplicate constraint, or use rule='derivative'")


def _check_kkt_fields(kkt: KKTPoint) -> None:
    """A ``ProblemError`` naming the field where ``kkt.theta`` or ``kkt.lambdas`` is not a finite 1-D float64 tensor.

    On the CPU, as :func:`~polyproj.adapters.dif.solve` and ``KKTPoint.from_params`` make them. A KKTPoint built by hand
    (``dataclasses.replace``) with a float32 θ, a NumPy λ or a θ of shape (1, d) otherwise failed deep inside torch.
    """
    again = "; build it with KKTPoint.from_params(problem, theta, lambdas) (which converts and checks them)"
    for field, v in (("theta", kkt.theta), ("lambdas", kkt.lambdas)):
        if not isinstance(v, torch.Tensor):
            raise ProblemError(f"kkt.{field} must be a torch.Tensor (float64, 1-D), got {type(v).__name__}" + again)
        if v.ndim != 1 or v.dtype != torch.float64 or v.device.type != "cpu":
            raise ProblemError(f"kkt.{field} must be a 1-D float64 tensor on the CPU, got shape {tuple(v.shape)}, "
                               f"dtype {v.dtype}, device {v.device.type}" + again)
        if not bool(torch.isfinite(v).all()):
            raise ProblemError(f"kkt.{field} contains NaN or inf" + again)


class Linearisation:
    """First-order data of a problem at a KKT point: ∇f₀, g, ∇g; H formed only when asked (``.H``).

    Parameters
    ----------
    problem : ConstrainedProblem
    kkt : KKTPoint
    hessian : {"lagrangian", "objective"}
        What ``.H`` is: ∇²f₀ + Σ λ̄ⱼ∇²gⱼ, or ∇²f₀ alone (classic IF).
    """

    def __init__(self, problem: ConstrainedProblem, kkt: KKTPoint, *, hessian: str = "lagrangian") -> None:
        if not isinstance(problem, ConstrainedProblem):
            raise ProblemError(f"problem must be a ConstrainedProblem, got {type(problem).__name__}")
        if not isinstance(kkt, KKTPoint):
            raise ProblemError(f"kkt must be a KKTPoint (dif.solve or KKTPoint.from_params), got {type(kkt).__name__}")
        _check_kkt_fields(kkt)
        if kkt.theta.numel() != problem.dim or kkt.names != tuple(c.name for c in problem.constraints):
            raise ProblemError("kkt does not belong to this problem (parameter count or constraint names differ)")
        self.problem, self.kkt = problem, kkt
        self.theta = kkt.theta
        self.lam = kkt.lambdas.numpy().astype(np.float64)
        self.hessian_coefs = self.lam if hessian == "lagrangian" else np.zeros_like(self.lam)
        self.f0, self.grad_f0 = objective_grad(problem, self.theta)
        self.g, self.G = constraint_jacobian(problem, self.theta)
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    @cached_property
    def H(self) -> np.ndarray:
        """The dense Hessian (d, d), formed by ``torch.func.hessian`` on first use."""
        return lagrangian_hessian(self.problem, self.theta, self.hessian_coefs)

    def precompute(self) -> None:
        """Cache per-sample gradients and losses of every loss with data (for many removals)."""
        for loss in (self.problem.objective, *self.problem.constraints):
            if loss.data is not None and loss.name not in self._cache:
                self._cache[loss.name] = (per_sample_grads(self.problem, loss.name, self.theta),
                                          per_sample(self.problem, loss.name, self.theta))

    def sample_data(self, name: str, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Per-sample gradients (k, d) and losses (k,) of the samples ``idx`` of loss ``name``."""
        if name in self._cache:
            grads, vals = self._cache[name]
            return grads[idx], vals[idx]
        vals = None if name == "objective" else per_sample(self.problem, name, self.theta, idx)
        return per_sample_grads(self.problem, name, self.theta, idx), vals

    def removal_terms(self, removal: Removal, *, renormalize: bool = True,
                      weights: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For one removal: (c₀, c_constraints (m, d), r (m,)) with c = c₀ + Σ wⱼ c_constraintsⱼ."""
        return removal_terms(self.problem, self.g, self, removal, renormalize=renormalize)

    def objective_terms(self, idx: np.ndarray | None = None, *, renormalize: bool = True) -> np.ndarray:
        """Linear terms c for removing each single objective sample, (k, d)."""
        w, W = loss_weights(self.problem, "objective")
        idx = np.arange(w.size) if idx is None else np.asarray(idx, dtype=np.int64)
        C = -(w[idx, None] * per_sample_grads(self.problem, "objective", self.theta, idx)) / W
        if renormalize:
            C = C + (normaliser_share(self.problem, "objective", w[idx])[:, None] / W) * self.grad_f0[None, :]
        return C
