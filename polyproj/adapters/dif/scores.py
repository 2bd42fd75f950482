"""All-point scores on the matrix-free path: per-sample gradients by ``vmap(grad)``, projected.

A score of removal R for a test function F is ∇Fᵀω_R with ω_R = −H⁻¹(c_R + Cᵀμ_R), so

    ∇Fᵀω_R = −(s_testᵀ c_R + bᵀ μ_R),   s_test = H⁻¹∇F,  b = C s_test,
    μ_R solves the dual QP with h_R = Vᵀ c_R + u_R,  V = H⁻¹Cᵀ.

Only c_R's projections on the columns of M = [s_test, V] (d × (1 + k)) are needed, and c_R is
linear in the per-sample gradients: each sample's gradient is formed (``torch.func.vmap`` of
``torch.func.grad``, ``chunk_size`` samples at a time), multiplied by M and dropped. The memory of
scoring is therefore one chunk's gradients, ``chunk_size × d`` floats plus one chunk's activations,
whatever N is; the (N, d) matrix of all gradients never exists.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...errors import PolyprojError
from .hvp import DEFAULT_CHUNK, chunk_size_arg
from .linearisation import check_split, removal_terms
from .problem import ConstrainedProblem, Removal, _take

__all__ = ["ProjectedGradients", "ScoreJob", "per_sample_grads_vmap"]


def _one_sample_loss(problem: ConstrainedProblem, loss, tuple_data: bool):
    def f(theta: torch.Tensor, *sample: torch.Tensor) -> torch.Tensor:
        batch = tuple(s.unsqueeze(0) for s in sample) if tuple_data else sample[0].unsqueeze(0)
        return problem.per_sample(loss, theta, batch)[0]
    return f


def per_sample_grads_vmap(problem: ConstrainedProblem, name: str, theta: torch.Tensor,
                          idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample gradients (k, d) and losses (k,) of loss ``name`` at the samples ``idx``.

    One ``vmap(grad_and_value)`` over the selected samples: the caller bounds k (a chunk). A loss that
    ``vmap`` cannot trace (data-dependent control flow, boolean-mask indexing or reading values in Python on
    the sample, e.g. ``out[r.abs() > 1] = ...`` or ``r.tolist()``; an op without a batching rule) is
    differentiated by ``jacrev`` of the chunk's losses instead, as the dense path does: the same gradients,
    k backward passes.
    """
    grads, vals, _ = _per_sample_grads(problem, name, theta, idx, try_vmap=True)
    return grads, vals


#: errors that are not vmap failing to trace the loss, passed on as they are: the user's own interrupt, memory
#: exhaustion (the jacrev fallback needs as much), polyproj's errors (already a diagnosis)
_NO_FALLBACK = (MemoryError, PolyprojError, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError))


def _per_sample_grads(problem: ConstrainedProblem, name: str, theta: torch.Tensor, idx: np.ndarray, *,
                      try_vmap: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(gradients (k, d), losses (k,), whether vmap gave them) of loss ``name`` at the samples ``idx``.

    ``vmap`` first (unless ``try_vmap`` is false); any error it raises while tracing the loss, whatever its
    type or message (vmap's refusals are RuntimeErrors, NotImplementedErrors, ValueErrors, ... and do not all
    name vmap), sends the chunk to ``jacrev``. An error of ``jacrev`` too is the loss's own: it is raised,
    chained to vmap's.
    """
    loss = problem.loss(name)
    sub = _take(loss.data, torch.as_tensor(np.asarray(idx, dtype=np.int64)))
    vmap_error: Exception | None = None
    if try_vmap:
        items = sub if isinstance(sub, tuple) else (sub,)
        f = _one_sample_loss(problem, loss, isinstance(sub, tuple))
        fn = torch.func.vmap(torch.func.grad_and_value(f), in_dims=(None, *([0] * len(items))))
        try:
            grads, vals = fn(theta, *items)
            return grads.detach(), vals.detach(), True
        except _NO_FALLBACK:
            raise
        except Exception as exc:
            vmap_error = exc
    try:
        grads, vals = torch.func.jacrev(lambda t: (problem.per_sample(loss, t, sub),) * 2, has_aux=True)(theta)
    except Exception as exc:
        if vmap_error is None:
            raise
        raise exc from vmap_error
    return grads.detach(), vals.detach(), False


#: per problem, the losses vmap could not trace: not traced again in this process (each chunk of each score job
#: would fail the same way before its jacrev)
_NO_VMAP: weakref.WeakKeyDictionary[ConstrainedProblem, set[str]] = weakref.WeakKeyDictionary()
_NO_VMAP_LOCK = threading.Lock()


def _vmap_traces(problem: ConstrainedProblem, name: str) -> bool:
    with _NO_VMAP_LOCK:
        return name not in _NO_VMAP.get(problem, ())


def _no_vmap(problem: ConstrainedProblem, name: str) -> None:
    with _NO_VMAP_LOCK:
        _NO_VMAP.setdefault(problem, set()).add(name)


@dataclass(eq=False)
class ProjectedGradients:
    """A :class:`~polyproj.adapters.dif.linearisation.GradientSource` in the basis M (d, p).

    Per-sample gradients of the samples that the given removals touch are computed ``chunk_size``
    at a time and kept only as their projections ∇ℓᵀM (k, p).
    """

    problem: ConstrainedProblem
    theta: torch.Tensor
    basis: np.ndarray
    grad_f0: np.ndarray
    G: np.ndarray
    chunk_size: int
    _proj: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a chunk size below 1 would leave fill's arrays unwritten (np.empty: garbage scores) or stop range()
        self.chunk_size = chunk_size_arg(self.chunk_size, DEFAULT_CHUNK)

    def fill(self, removals: list[dict[str, np.ndarray]]) -> None:
        """Project the gradients of every sample named by ``removals`` (checked removals)."""
        M = torch.from_numpy(self.basis)
        names = {n for rem in removals for n in rem}
        for name in names:
            idx = np.unique(np.concatenate([rem[name] for rem in removals if name in rem]))
            P = np.empty((idx.size, self.basis.shape[1]))
            vals = np.empty(idx.size)
            vmap_ok = _vmap_traces(self.problem, name)
            for s in range(0, idx.size, self.chunk_size):
                g, v, vmap_ok = _per_sample_grads(self.problem, name, self.theta, idx[s:s + self.chunk_size],
                                                  try_vmap=vmap_ok)
                if not vmap_ok:
                    _no_vmap(self.problem, name)
                P[s:s + self.chunk_size] = (g @ M).numpy()
                vals[s:s + self.chunk_size] = v.numpy()
                del g
            self._proj[name] = (idx, P, vals)

    def sample_data(self, name: str, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Projected per-sample gradients (k, p) and losses (k,)."""
        have, P, vals = self._proj[name]
        pos = np.searchsorted(have, idx)
        return P[pos], vals[pos]


@dataclass(frozen=True, eq=False)
class ScoreJob:
    """Scores of a list of removals, self-contained so that an executor can run it elsewhere.

    Attributes
    ----------
    problem, theta, lam, g : the problem and its KKT point
    basis : ndarray (d, 1 + k)
        [s_test, V] (s_test = H⁻¹∇F, V = H⁻¹C_Aᵀ).
    grad_f0, G : projections of ∇f₀ (1 + k,) and of the constraint Jacobian (m, 1 + k)
    rows : the DIF QP's constraint rows;  u0 : their constant bound (k,), u = u0 − r (0 but under
        ``rule="finite"``);  b : C_A s_test (k,)
    dual : the dual-QP solver of the KKT point (``solve_batch(h) -> μ``)
    renormalize, chunk_size : as :class:`~polyproj.adapters.dif.DIF`
    """

    problem: ConstrainedProblem
    theta: torch.Tensor
    lam: np.ndarray
    g: np.ndarray
    basis: np.ndarray
    grad_f0: np.ndarray
    G: np.ndarray
    rows: np.ndarray
    u0: np.ndarray
    b: np.ndarray
    dual: Any
    renormalize: bool
    chunk_size: int
    split: np.ndarray | None = None  # DIF._split: the finite rule's refusal of a multiplier-split dependent term

    def __call__(self, removals: list[Removal]) -> tuple[np.ndarray, np.ndarray]:
        """(scores (n,), μ (n, k)) of the removals (gradients on for the call only: the caller's mode stays)."""
        with torch.enable_grad():
            return self._scores(removals)

    def _scores(self, removals: list[Removal]) -> tuple[np.ndarray, np.ndarray]:
        checked = [self.problem.check_removal(r) for r in removals]
        src = ProjectedGradients(self.problem, self.theta, self.basis, self.grad_f0, self.G, self.chunk_size)
        src.fill(checked)
        k = self.rows.size
        A = np.empty(len(checked))
        Hd = np.empty((len(checked), k))
        for i, rem in enumerate(checked):
            c0, cc, r = removal_terms(self.problem, self.g, src, rem, renormalize=self.renormalize)
            check_split(self.split, cc, self.problem.names[1:])
            cp = c0 + self.lam @ cc
            A[i] = cp[0]
            Hd[i] = cp[1:] + self.u0 - r[self.rows]
        mu = self.dual.solve_batch(Hd) if k else np.zeros((len(checked), 0))
        return -(A + mu @ self.b), mu
