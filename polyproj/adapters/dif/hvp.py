"""Matrix-free derivatives of a :class:`ConstrainedProblem`, accumulated over data chunks.

A weighted combination of the problem's losses,

    Φ(θ) = a₀ f₀(θ) + Σⱼ aⱼ gⱼ(θ),   each mean written as Σᵢ wᵢ ℓ(zᵢ, θ) / W,

is split into *pieces*, one per (loss, contiguous chunk of its samples), whose sum is Φ. Gradients
and Hessian-vector products are sums over the pieces, so the memory of one evaluation is that of
one chunk (``chunk_size`` samples) whatever N is. H·v is forward-over-reverse
(``torch.func.jvp`` of ``torch.func.grad``): one reverse and one forward pass per chunk, never H.
Where an op of the losses has no forward-mode derivative (``F.huber_loss``, a custom
``autograd.Function`` without ``jvp``), H·v is reverse-over-reverse instead: ``torch.func.vjp`` of
``torch.func.grad``, vᵀH = (Hv)ᵀ since H is symmetric, two reverse passes per chunk, the same numbers to
rounding. The switch is made at the first refused product and kept for the problem
(:func:`~polyproj.adapters.dif.calculus.reverse_only`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse.linalg as spla
import torch

from ...errors import ProblemError
from .calculus import FORWARD_AD, second_derivative
from .problem import ConstrainedProblem, Constraint, Loss

__all__ = ["DEFAULT_CHUNK", "HessianOperator", "LossPieces", "chunk_size_arg"]

#: samples per chunk when none is given
DEFAULT_CHUNK = 2048


def chunk_size_arg(value: Any, default: int) -> int:
    """A chunk size argument (``DIF``, ``solve``, :class:`LossPieces`): a positive integer, ``default`` for None."""
    if value is None:
        return int(default)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ProblemError(f"chunk_size must be a positive integer, got {value!r}")
    return int(value)


def _slice(data: Any, s: int, e: int) -> Any:
    return tuple(t[s:e] for t in data) if isinstance(data, tuple) else data[s:e]


@dataclass(frozen=True, eq=False)
class _Piece:
    """``coef · Σ_{i∈[s,e)} wᵢ ℓ(zᵢ)`` (or ``coef · ℓ`` for a data-free constraint)."""

    loss: Loss | Constraint
    coef: float
    data: Any
    weights: torch.Tensor | None


class LossPieces:
    """Φ = a₀ f₀ + Σ aⱼ gⱼ as a sum of chunk pieces (constants τⱼ dropped: derivatives only).

    Parameters
    ----------
    problem : ConstrainedProblem
    coefs : sequence of float (m,)
        aⱼ of each constraint (λ for the Lagrangian); zeros are skipped.
    objective_coef : float
        a₀ (1 for the Lagrangian, 0 for a constraint alone).
    chunk_size : int, optional
        Samples per piece: a positive integer (``ProblemError`` otherwise), None for ``DEFAULT_CHUNK``.
    """

    def __init__(self, problem: ConstrainedProblem, coefs: Sequence[float], objective_coef: float = 1.0,
                 chunk_size: int | None = DEFAULT_CHUNK) -> None:
        self.problem = problem
        # a positive integer (None: the default): 0, a negative or a fractional size is refused, not clamped
        self.chunk_size = chunk_size_arg(chunk_size, DEFAULT_CHUNK)
        terms = [(problem.objective, float(objective_coef))]
        terms += [(c, float(a)) for c, a in zip(problem.constraints, coefs, strict=True)]
        self.pieces: list[_Piece] = []
        for loss, a in terms:
            if a == 0.0:
                continue
            if loss.data is None:
                self.pieces.append(_Piece(loss, a, None, None))
                continue
            n = loss.n_samples
            w = loss.weights
            W = (float(w.sum()) if loss.renormalize else float(n)) if w is not None else float(n)
            for s in range(0, n, self.chunk_size):
                e = min(n, s + self.chunk_size)
                self.pieces.append(_Piece(loss, a / W, _slice(loss.data, s, e),
                                          None if w is None else w[s:e].to(torch.float64)))
        # pieces evaluated together, up to chunk_size samples per group: one torch.func transform per
        # group rather than per piece (the transform's overhead dominates on small losses)
        self.groups: list[list[_Piece]] = []
        size = self.chunk_size
        for p in self.pieces:
            n = 0 if p.data is None else (p.data[0] if isinstance(p.data, tuple) else p.data).shape[0]
            if not self.groups or size + n > self.chunk_size:
                self.groups.append([])
                size = 0
            self.groups[-1].append(p)
            size += n

    def _value(self, piece: _Piece, theta: torch.Tensor) -> torch.Tensor:
        if piece.data is None:
            return piece.coef * self.problem.per_sample(piece.loss, theta).sum()
        v = self.problem.per_sample(piece.loss, theta, piece.data)
        return piece.coef * (v.sum() if piece.weights is None else (piece.weights * v).sum())

    def __iter__(self) -> Iterator[_Piece]:
        return iter(self.pieces)

    def _group_value(self, group: list[_Piece], theta: torch.Tensor) -> torch.Tensor:
        out = self._value(group[0], theta)
        for p in group[1:]:
            out = out + self._value(p, theta)
        return out

    def value_and_grad(self, theta: torch.Tensor) -> tuple[float, torch.Tensor]:
        """Φ(θ) (without the τ constants) and ∇Φ(θ), summed over the pieces."""
        val, grad = 0.0, torch.zeros_like(theta)
        for grp in self.groups:
            g, v = torch.func.grad_and_value(lambda t, grp=grp: self._group_value(grp, t))(theta)
            val += float(v)
            grad += g
        return val, grad

    def hvp(self, theta: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """∇²Φ(θ) v, summed over the pieces.

        Forward-over-reverse; reverse-over-reverse where an op of the losses has no forward-mode derivative
        (then for every later product on the problem too); a ``ProblemError`` where neither mode can
        differentiate the losses twice.
        """
        return second_derivative(self.problem, "a Hessian-vector product (matrix-free path)",
                                 lambda: self._hvp_forward(theta, v), lambda: self._hvp_reverse(theta, v),
                                 lambda t: self.value_and_grad(t)[1], lambda _: self._hvp_reverse, theta)

    def _hvp_forward(self, theta: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """H v as the directional derivative of ∇Φ along v (``jvp`` of ``grad``)."""
        out = torch.zeros_like(theta)
        with FORWARD_AD:
            for grp in self.groups:
                _, hv = torch.func.jvp(torch.func.grad(lambda t, grp=grp: self._group_value(grp, t)), (theta,), (v,))
                out += hv
        return out

    def _hvp_reverse(self, theta: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """H v as vᵀ∂(∇Φ)/∂θ = vᵀH (``vjp`` of ``grad``; H symmetric); reverse mode, no lock needed."""
        out = torch.zeros_like(theta)
        for grp in self.groups:
            _, pull = torch.func.vjp(torch.func.grad(lambda t, grp=grp: self._group_value(grp, t)), theta)
            out += pull(v)[0]
        return out


class HessianOperator:
    """H = ∇²f₀ + Σ aⱼ∇²gⱼ (+ ρ Uᵀ U) (+ damping·I) at θ, applied matrix-free.

    Parameters
    ----------
    problem : ConstrainedProblem
    theta : torch.Tensor (d,)
    coefs : array-like (m,)
        Weights aⱼ of the constraint Hessians (λ̄ for the Lagrangian; zeros for the objective's).
    damping : float
        Added multiple of the identity.
    low_rank : ndarray (r, d), optional
        Adds ``Uᵀ(U v)`` (the Gauss-Newton term of a quadratic penalty).
    chunk_size : int
        Samples per chunk (memory of one product: one chunk's forward and backward pass).

    Attributes
    ----------
    n_products : int
        Hessian-vector products computed so far.
    """

    def __init__(self, problem: ConstrainedProblem, theta: torch.Tensor, coefs: Any, *, damping: float = 0.0,
                 low_rank: np.ndarray | None = None, chunk_size: int = DEFAULT_CHUNK) -> None:
        self.problem, self.theta = problem, theta.detach().to(torch.float64)
        self.pieces = LossPieces(problem, np.asarray(coefs, dtype=np.float64).reshape(-1), 1.0, chunk_size)
        self.damping = float(damping)
        self.low_rank = None if low_rank is None or low_rank.shape[0] == 0 else np.asarray(low_rank, np.float64)
        self.n_products = 0

    @property
    def dim(self) -> int:
        """Number of parameters d."""
        return int(self.theta.numel())

    def matvec(self, v: np.ndarray) -> np.ndarray:
        """H v for a NumPy vector (d,)."""
        v = np.asarray(v, dtype=np.float64).reshape(-1)
        hv = self.pieces.hvp(self.theta, torch.from_numpy(v.copy())).numpy()
        if self.damping:
            hv = hv + self.damping * v
        if self.low_rank is not None:
            hv = hv + self.low_rank.T @ (self.low_rank @ v)
        self.n_products += 1
        return hv

    def as_linear_operator(self) -> spla.LinearOperator:
        """The operator as a ``scipy.sparse.linalg.LinearOperator`` (symmetric, float64)."""
        d = self.dim
        return spla.LinearOperator((d, d), matvec=self.matvec, rmatvec=self.matvec, dtype=np.float64)

    def dense(self) -> np.ndarray:
        """H formed column by column (d products; for tests and small d only)."""
        H = np.column_stack([self.matvec(e) for e in np.eye(self.dim)])
        return 0.5 * (H + H.T)
