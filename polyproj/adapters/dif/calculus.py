"""Derivatives of a :class:`ConstrainedProblem` by ``torch.func`` (float64, returned as NumPy).

These are the dense building blocks of the exact path: gradients, constraint Jacobians, the
Hessian of the Lagrangian ``∇²f₀ + Σ λⱼ∇²gⱼ`` and per-sample gradients (``jacrev`` of the
per-sample losses). The matrix-free path uses :mod:`polyproj.adapters.dif.hvp` (Hessian-vector
products in data chunks) and :mod:`polyproj.adapters.dif.scores` (vmapped per-sample gradients)
instead.

Second derivatives are forward-over-reverse (``jacfwd`` / ``jvp`` of a reverse-mode gradient). A loss
with an op that PyTorch cannot differentiate in forward mode (no JVP formula: ``F.huber_loss``'s backward,
``F.soft_margin_loss``'s, a custom ``autograd.Function`` without ``jvp``) is differentiated
reverse-over-reverse instead: the same Hessian (∇²f is symmetric, so the vector-Jacobian product of ∇f
with v is H v), one more backward pass per product. The choice is remembered per problem
(:func:`reverse_only`), so forward mode is tried once per problem, not once per product.
"""

from __future__ import annotations

import re
import threading
import weakref
from typing import Any

import numpy as np
import torch

from ...errors import ProblemError
from .problem import ConstrainedProblem

__all__ = ["FORWARD_AD", "check_reverse", "constraint_jacobian", "forward_ad_missing", "lagrangian_hessian",
           "no_second_derivatives", "objective_grad", "per_sample", "per_sample_grads", "reverse_only",
           "second_derivative", "second_derivative_missing", "switch_to_reverse"]

#: held around every forward-mode section (``torch.func.hessian``, ``jvp``): torch's forward-AD levels
#: are process-wide, so two threads in forward mode at once corrupt each other's (e.g. re-solves on a
#: thread pool); reverse mode is per thread and runs unlocked
FORWARD_AD = threading.RLock()

#: problems whose losses have an op without a forward-mode derivative, switched to reverse-over-reverse second
#: derivatives: None where the switch's check (:func:`check_reverse`) passed, else the error it raised, raised
#: again by every later call (weak: a problem that is dropped leaves)
_REVERSE: weakref.WeakKeyDictionary[ConstrainedProblem, ProblemError | None] = weakref.WeakKeyDictionary()
_REVERSE_LOCK = threading.Lock()

#: torch's refusals of forward mode ("Trying to use forward AD with huber_loss_backward ...", "You must
#: implement the jvp function for custom autograd.Function to use it with forward mode AD")
_NO_FORWARD = re.compile(r"forward[- ]?(ad|mode)", re.IGNORECASE)

#: torch's refusals of a derivative in reverse mode ("derivative for aten::multi_margin_loss_backward is not
#: implemented", "trying to differentiate twice a function that was marked with @once_differentiable")
_NO_REVERSE = re.compile(r"derivative|differentiate twice|not implemented", re.IGNORECASE)


def forward_ad_missing(exc: BaseException) -> bool:
    """Whether ``exc`` is torch refusing forward-mode AD of an op of the loss (an op without a JVP formula)."""
    return isinstance(exc, NotImplementedError) and _NO_FORWARD.search(str(exc)) is not None


def second_derivative_missing(exc: BaseException) -> bool:
    """Whether ``exc`` is torch refusing a reverse-mode derivative (an op without a double backward)."""
    if isinstance(exc, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)):
        return False
    return isinstance(exc, NotImplementedError) or (isinstance(exc, RuntimeError)
                                                    and _NO_REVERSE.search(str(exc)) is not None)


def reverse_only(problem: ConstrainedProblem) -> bool:
    """Whether ``problem``'s second derivatives are taken reverse-over-reverse (forward mode failed on it).

    Raises the ``ProblemError`` of the switch's check again where reverse mode was refused for the problem.
    """
    with _REVERSE_LOCK:
        if problem not in _REVERSE:
            return False
        refused = _REVERSE[problem]
    if refused is not None:
        raise ProblemError(str(refused))
    return True


def switch_to_reverse(problem: ConstrainedProblem, what: str, grad: Any, hvp: Any, theta: torch.Tensor) -> None:
    """Take ``problem``'s second derivatives reverse-over-reverse from now on, once :func:`check_reverse` passes.

    The outcome is kept either way: a refused problem raises the same error at every later call (a caller that
    caught it and tried again got the unchecked, zero second derivatives).
    """
    try:
        check_reverse(what, grad, hvp, theta)
    except ProblemError as exc:
        with _REVERSE_LOCK:
            _REVERSE[problem] = exc
        raise
    with _REVERSE_LOCK:
        _REVERSE.setdefault(problem, None)


def second_derivative(problem: ConstrainedProblem, what: str, forward: Any, reverse: Any, grad: Any, hvp_of: Any,
                      theta: torch.Tensor) -> Any:
    """``forward()`` (forward-over-reverse), or ``reverse()`` (reverse-over-reverse) for a reverse-only problem.

    A forward-mode refusal switches the problem to reverse mode; the first reverse result is checked by
    :func:`switch_to_reverse` against central differences of ``grad`` (``hvp_of(result)`` gives its products
    ``(θ, v) -> H v``); neither mode: :func:`no_second_derivatives`. ``what`` names the quantity in errors.
    """
    if not reverse_only(problem):
        try:
            return forward()
        except NotImplementedError as exc:
            if not forward_ad_missing(exc):
                raise
    switched = not reverse_only(problem)
    try:
        out = reverse()
    except RuntimeError as exc:
        if not second_derivative_missing(exc):
            raise
        raise no_second_derivatives(what, exc) from exc
    if switched:  # once per problem: reverse mode checked against differences of the gradient
        switch_to_reverse(problem, what, grad, hvp_of(out), theta)
    return out


def no_second_derivatives(what: str, exc: BaseException) -> ProblemError:
    """The ``ProblemError`` for a loss that torch can differentiate only once (neither mode has its op's H)."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return ProblemError(f"{what}: PyTorch has neither a forward-mode derivative nor a double backward for an "
                        f"operation of the losses ({first}); DIF needs second derivatives of the losses: write that "
                        "operation with twice-differentiable torch ops (or give its autograd.Function a jvp or a "
                        "differentiable backward)")


#: relative agreement the first reverse-over-reverse product must show with central differences of the gradient
REVERSE_CHECK_RTOL = 1e-3


def check_reverse(what: str, grad: Any, hvp: Any, theta: torch.Tensor) -> None:
    """Refuse reverse-over-reverse second derivatives that central differences of the gradient contradict.

    Reverse mode takes a backward that runs without a graph (a custom ``autograd.Function`` whose backward is
    ``@once_differentiable``) for a constant: its part of H v comes out 0, silently. Forward mode refused
    such an op outright; reverse mode is checked once, where a problem switches to it: H v along a fixed
    random v against ``(∇(θ + h v) − ∇(θ − h v)) / 2h``, ``h = eps^(1/3) (1 + |θ|∞)`` (error ~h² |∇³| and
    eps/h |∇|). ``grad(θ)`` and ``hvp(θ, v)`` are the problem's own.
    """
    v = torch.randn(theta.shape, dtype=theta.dtype, generator=torch.Generator().manual_seed(0)).to(theta.device)
    h = float(np.finfo(np.float64).eps) ** (1.0 / 3.0) * (1.0 + float(theta.detach().abs().max()))
    fd = (grad(theta + h * v) - grad(theta - h * v)) / (2.0 * h)
    hv = hvp(theta, v)
    gap, size = float((hv - fd).norm()), float(hv.norm()) + float(fd.norm())
    if not gap <= REVERSE_CHECK_RTOL * size + 1e-8 * (1.0 + float(grad(theta).norm())):
        raise ProblemError(f"{what}: PyTorch has no forward-mode derivative for an operation of the losses, and the "
                           f"reverse-mode second derivative differs from central differences of the gradient "
                           f"(|Hv − differences| = {gap:.3g} against |Hv| = {float(hv.norm()):.3g}): an operation's "
                           "backward is not differentiable (e.g. a custom autograd.Function whose backward is "
                           "@once_differentiable, which reverse mode reads as a constant); give it a jvp or a "
                           "differentiable backward")


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
    """∇²_θ L(θ, λ) = ∇²f₀ + Σ λⱼ∇²gⱼ, symmetrised, (d, d).

    ``jacfwd(jacrev)``, or ``jacrev(jacrev)`` where forward mode is missing for an op of the losses (see the
    module's notes); a ``ProblemError`` where reverse mode cannot differentiate twice either.
    """
    lam = torch.as_tensor(np.asarray(lambdas, dtype=np.float64))

    def lagrangian(t: torch.Tensor) -> torch.Tensor:
        return problem.lagrangian(t, lam)

    def forward() -> np.ndarray:
        with FORWARD_AD:
            return _np(torch.func.hessian(lagrangian)(theta))

    def reverse() -> np.ndarray:
        return _np(torch.func.jacrev(torch.func.jacrev(lagrangian))(theta))

    def products(H: np.ndarray) -> Any:  # (θ, v) -> H v, for the check at the switch
        return lambda t, v: torch.as_tensor(H @ v.detach().cpu().numpy().astype(np.float64)).to(v)

    H = second_derivative(problem, "the Hessian of the Lagrangian", forward, reverse, torch.func.grad(lagrangian),
                          products, theta)
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
