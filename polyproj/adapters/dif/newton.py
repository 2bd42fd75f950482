"""Training a :class:`ConstrainedProblem` to a KKT point when d is large (neural networks).

Two globally used pieces:

* :func:`augmented_lagrangian` — the PHR augmented Lagrangian
  ``Φ(θ) = f₀ + Σ_ineq (ρ/2)[max(0, gⱼ + λⱼ/ρ)² − (λⱼ/ρ)²] + Σ_eq (λⱼgⱼ + (ρ/2)gⱼ²)``,
  minimised over θ by SciPy's L-BFGS-B on the full batch (chunked), then
  λ ← max(0, λ + ρg) (free for equalities) and ρ ← 10ρ when the violation does not fall by 4.
  Globally convergent to a KKT point from a poor start, but only linearly.
* :func:`newton_kkt` — Newton's method on the KKT system. Matrix-free, on a working set A (binding,
  weakly active and violated constraints)::

      [H  G_Aᵀ] [dθ ]   = − [∇f₀]          H = ∇²L(θ, λ)
      [G_A  0 ] [λ_A⁺]      [g_A]

  by MINRES on Hessian-vector products (quadratic convergence; a working-set row whose multiplier
  turns negative is dropped, an inactive constraint that becomes violated is added), optionally
  preconditioned by a frozen factorised H̄ (``preconditioner=``, see :func:`newton_kkt`). Or with a
  frozen factorised H̄ (:class:`FrozenHessian`) in place of H: SQP steps whose QP has H̄ and the exact
  gradients and constraint Jacobians of the current point, every constraint in it (so the QP finds
  active-set changes); linear convergence with rate ~‖I − H̄⁻¹H‖ (on the critical subspace) near θ̄,
  triangular solves per step — the cheap way to re-solve many nearby problems (leave-one-out ground
  truth), which stalls when H has moved too far from H̄ (rate near or above 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg
import scipy.optimize
import scipy.sparse.linalg as spla
import torch

from .hvp import DEFAULT_CHUNK, HessianOperator, LossPieces
from .problem import ConstrainedProblem

__all__ = ["FrozenHessian", "NewtonInfo", "augmented_lagrangian", "first_order", "kkt_residuals", "newton_kkt",
           "residual_backtracking"]


def first_order(problem: ConstrainedProblem, theta: torch.Tensor,
                chunk_size: int = DEFAULT_CHUNK) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
    """f₀, ∇f₀ (d,), g (m,), G (m, d) by chunked gradients (one pass per loss)."""
    f0, gf = LossPieces(problem, np.zeros(problem.m), 1.0, chunk_size).value_and_grad(theta)
    m, d = problem.m, problem.dim
    g, G = np.zeros(m), np.zeros((m, d))
    for j, c in enumerate(problem.constraints):
        e = np.zeros(m)
        e[j] = 1.0
        v, gr = LossPieces(problem, e, 0.0, chunk_size).value_and_grad(theta)
        g[j], G[j] = v - c.tau, gr.numpy()
    return f0, gf.numpy(), g, G


def kkt_residuals(grad: np.ndarray, G: np.ndarray, g: np.ndarray, lam: np.ndarray,
                  eq: np.ndarray) -> dict[str, float]:
    """Stationarity ‖∇f₀ + Gᵀλ‖∞, feasibility, complementarity max|λⱼgⱼ| and dual max(−λ, 0)."""
    stat = grad + G.T @ lam if G.shape[0] else grad
    feas = np.where(eq, np.abs(g), np.maximum(g, 0.0))
    return {"stationarity": float(np.max(np.abs(stat), initial=0.0)),
            "feasibility": float(np.max(feas, initial=0.0)),
            "complementarity": float(np.max(np.abs(np.where(eq, 0.0, lam * g)), initial=0.0)),
            "dual": float(np.max(np.where(eq, 0.0, np.maximum(-lam, 0.0)), initial=0.0))}


def residual_backtracking(problem: ConstrainedProblem, theta: torch.Tensor, dtheta: np.ndarray, lam: np.ndarray,
                          lam_new: np.ndarray, residual: float, *, min_step: float, chunk_size: int | None = None
                          ) -> tuple[float, tuple | None]:
    """The largest t in 1, ½, …, ``min_step`` that lowers the KKT residual below ``residual``.

    The residual (:func:`kkt_residuals`) at (θ + t dθ, λ + t(λ_new − λ)). Returns t and
    (θ_t, λ_t, ∇f₀, g, G, residual) there, or (0.0, None) where no t lowers it: the globalisation of a
    chord or Newton step on the KKT system (:func:`newton_kkt`'s chord steps, the second-order DIF's
    correction).
    """
    eq, t = problem.eq_mask, 1.0
    while t >= min_step:
        th_t, lam_t = theta + torch.from_numpy(t * np.asarray(dtheta, dtype=np.float64)), lam + t * (lam_new - lam)
        _, gf, g, G = first_order(problem, th_t, DEFAULT_CHUNK if chunk_size is None else chunk_size)
        res = max(kkt_residuals(gf, G, g, lam_t, eq).values(), default=0.0)
        if np.isfinite(res) and res < residual:
            return t, (th_t, lam_t, gf, g, G, res)
        t *= 0.5
    return 0.0, None


@dataclass
class NewtonInfo:
    """History of a KKT solve: residual per iteration, Krylov iterations, working set."""

    residuals: list[float] = field(default_factory=list)
    krylov_iterations: list[int] = field(default_factory=list)
    #: true relative residual ‖K x − b‖ / ‖b‖ of each Newton-MINRES step's KKT solve (not the recursion's)
    krylov_residuals: list[float] = field(default_factory=list)
    working_set: tuple[int, ...] = ()
    converged: bool = False
    method: str = ""


def augmented_lagrangian(problem: ConstrainedProblem, theta: torch.Tensor, lam: np.ndarray, *, tol: float = 1e-7,
                         rho: float = 10.0, max_outer: int = 40, inner_maxiter: int = 2000,
                         chunk_size: int = DEFAULT_CHUNK,
                         time_limit: float | None = None) -> tuple[torch.Tensor, np.ndarray, NewtonInfo]:
    """PHR augmented Lagrangian with L-BFGS-B inner solves, to KKT residual ``tol`` (or ``max_outer``).

    ``time_limit`` (seconds) stops the iteration, inner solves included, once exceeded.
    """
    import time

    t_end = np.inf if time_limit is None else time.perf_counter() + float(time_limit)

    def stop(intermediate_result) -> None:
        if time.perf_counter() > t_end:
            raise StopIteration
    eq = problem.eq_mask
    lam = np.where(eq, lam, np.maximum(lam, 0.0)).astype(np.float64)
    x = theta.detach().numpy().astype(np.float64).copy()
    info = NewtonInfo(method="augmented-lagrangian")
    prev_viol = np.inf

    def phi(xv: np.ndarray, lam: np.ndarray, rho: float) -> tuple[float, np.ndarray]:
        f0, gf, g, G = first_order(problem, torch.from_numpy(xv), chunk_size)
        shifted = np.where(eq, lam + rho * g, np.maximum(0.0, lam + rho * g))
        val = f0 + float(np.sum(np.where(eq, lam * g + 0.5 * rho * g ** 2, (shifted ** 2 - lam ** 2) / (2 * rho))))
        return val, gf + G.T @ shifted

    for _ in range(max_outer):
        _, gf, g, G = first_order(problem, torch.from_numpy(x), chunk_size)
        res = max(kkt_residuals(gf, G, g, lam, eq).values(), default=0.0)
        info.residuals.append(res)
        if res <= tol:
            info.converged = True
            break
        gtol = max(0.1 * tol, 1e-3 * res)
        if time.perf_counter() > t_end:
            break
        out = scipy.optimize.minimize(phi, x, args=(lam, rho), jac=True, method="L-BFGS-B", callback=stop,
                                      options={"maxiter": inner_maxiter, "gtol": gtol, "ftol": 0.0, "maxcor": 30})
        x = out.x
        info.krylov_iterations.append(int(out.nit))
        _, _, g, _ = first_order(problem, torch.from_numpy(x), chunk_size)
        lam = np.where(eq, lam + rho * g, np.maximum(0.0, lam + rho * g))
        viol = float(np.max(np.where(eq, np.abs(g), np.maximum(g, 0.0)), initial=0.0))
        if viol > 0.25 * prev_viol:
            rho *= 10.0
        prev_viol = viol
    return torch.from_numpy(x), lam, info


class FrozenHessian:
    """A factorised H̄ (Cholesky, with a shift when H̄ is not positive definite) for chord steps.

    Parameters
    ----------
    H : ndarray (d, d)
        E.g. ∇²L at the KKT point that re-solves are warm-started from.
    """

    def __init__(self, H: np.ndarray) -> None:
        H = 0.5 * (H + H.T)
        self.shift = 0.0
        for _ in range(30):
            try:
                self.factor = scipy.linalg.cho_factor(H + self.shift * np.eye(H.shape[0]), check_finite=False)
                break
            except np.linalg.LinAlgError:
                self.shift = max(1e-10 * float(np.abs(H).max()), 10 * self.shift)
        self.dim = H.shape[0]

    def solve(self, B: np.ndarray) -> np.ndarray:
        """H̄⁻¹B."""
        return scipy.linalg.cho_solve(self.factor, B, check_finite=False)

    def kkt_preconditioner(self, GA: np.ndarray) -> spla.LinearOperator:
        """M = diag(H̄⁻¹, S̄⁻¹), S̄ = G_A H̄⁻¹ G_Aᵀ: the block-diagonal SPD preconditioner of [[H, G_Aᵀ], [G_A, 0]].

        H̄ is positive definite (Cholesky, shifted if need be) and S̄ is when G_A has full row rank
        (LICQ); S̄'s eigenvalues are floored at 1e-14 of its largest so that M stays SPD, which
        MINRES requires, if rows are nearly dependent.
        """
        d, k = self.dim, GA.shape[0]
        if k:
            w, V = np.linalg.eigh(GA @ self.solve(GA.T))
            w = np.maximum(w, 1e-14 * max(float(w.max()), 1e-300))
            S_inv = (V / w) @ V.T
        else:
            S_inv = np.zeros((0, 0))

        def mv(v: np.ndarray) -> np.ndarray:
            v = np.asarray(v).reshape(-1)
            return np.concatenate([self.solve(v[:d]), S_inv @ v[d:]])

        return spla.LinearOperator((d + k, d + k), matvec=mv, rmatvec=mv, dtype=np.float64)


def _kkt_step(grad: np.ndarray, GA: np.ndarray, gA: np.ndarray, problem, theta, lam, chunk_size, rtol,
              preconditioner: FrozenHessian | None = None):
    """(dθ, λ_A⁺, MINRES iterations, true relative residual) of one Newton step on the working set.

    H = ∇²L(θ, λ) by Hessian-vector products; with ``preconditioner`` MINRES is preconditioned by
    :meth:`FrozenHessian.kkt_preconditioner` (the same solution, fewer iterations).
    """
    k, d = GA.shape[0], grad.size
    op = HessianOperator(problem, theta, lam, chunk_size=chunk_size)
    count = [0]

    def mv(v: np.ndarray) -> np.ndarray:
        count[0] += 1
        return np.concatenate([op.matvec(v[:d]) + GA.T @ v[d:], GA @ v[:d]])

    K = spla.LinearOperator((d + k, d + k), matvec=mv, rmatvec=mv, dtype=np.float64)
    b = -np.concatenate([grad, gA])
    M = None if preconditioner is None else preconditioner.kkt_preconditioner(GA)
    sol, _ = spla.minres(K, b, rtol=rtol, maxiter=20 * (d + k), M=M)
    its = count[0]
    rel = float(np.linalg.norm(mv(sol) - b) / max(float(np.linalg.norm(b)), 1e-300))
    return sol[:d], sol[d:], its, rel


def _sqp_step(H: FrozenHessian, grad: np.ndarray, G: np.ndarray, g: np.ndarray, eq: np.ndarray, backend: Any):
    """(dθ, λ⁺) of the QP ``min ∇f₀ᵀd + ½dᵀH̄d s.t. g + G d <= 0 (= 0 on equalities)`` by its dual."""
    from .matfree import DualQP

    Y = H.solve(np.column_stack([grad, G.T]))
    if G.shape[0] == 0:
        return -Y[:, 0], np.zeros(0)
    mu = DualQP.build(G @ Y[:, 1:], eq, backend, {}).solve(G @ Y[:, 0] - g)
    return -(Y[:, 0] + Y[:, 1:] @ mu), mu


def _working_merit(grad: np.ndarray, G: np.ndarray, g: np.ndarray, lam: np.ndarray, A: np.ndarray) -> float:
    """½‖F‖², F = (∇f₀ + G_Aᵀλ_A, g_A): the working set's KKT equations (λ zero off A)."""
    stat = grad + G[A].T @ lam[A] if A.size else grad
    return 0.5 * float(stat @ stat + g[A] @ g[A])


def newton_kkt(problem: ConstrainedProblem, theta: torch.Tensor, lam: np.ndarray, *, tol: float = 1e-10,
               max_iter: int = 30, hessian: FrozenHessian | None = None,
               preconditioner: FrozenHessian | None = None, active_tol: float = 1e-6,
               chunk_size: int = DEFAULT_CHUNK, rtol: float = 1e-12,
               backend: Any = "proxsuite") -> tuple[torch.Tensor, np.ndarray, NewtonInfo]:
    r"""Newton iterations on the KKT system, to KKT residual ``tol``.

    With ``hessian`` (a :class:`FrozenHessian`): the chord SQP. Steps of the QP with H̄ fixed and
    the exact gradients and constraint Jacobians, every constraint in it (its dual, m variables,
    by ``backend``), so active-set changes are found by the QP; a step (dθ, λ_QP − λ) that does not
    lower the KKT residual is halved, θ and λ together. Linear convergence, rate set by how far H̄ is
    from the current ∇²L.

    Without ``hessian``: Newton on the working set A's KKT equations
    F(θ, λ_A) = (∇f₀ + G_Aᵀλ_A, g_A) = 0 with the *exact* H = ∇²L(θ, λ), i.e. the system

        K [dθ; λ_A⁺] = −[∇f₀; g_A],   K = [[H, G_Aᵀ], [G_A, 0]],

    solved by MINRES on Hessian-vector products to relative residual ``rtol``. K is symmetric and
    indefinite (and H itself may be indefinite off the critical cone of a non-convex model), which
    MINRES accepts; CG on a reduced/projected system would need H positive definite on null(G_A) at
    every iterate, so the full system is kept.

    ``preconditioner`` (a :class:`FrozenHessian` H̄, e.g. ∇²L at a nearby KKT point) makes MINRES use
    the block-diagonal SPD preconditioner P⁻¹ = diag(H̄⁻¹, S̄⁻¹), S̄ = G_A H̄⁻¹ G_Aᵀ (Murphy, Golub &
    Wathen 2000). With H = H̄ the preconditioned matrix P⁻¹K has only the eigenvalues 1 and (1 ± √5)/2,
    so MINRES ends in 3 iterations. With H = H̄ + E, P^{-1/2}KP^{-1/2} is that ideal matrix plus the
    symmetric diag(H̄^{-1/2}EH̄^{-1/2}, 0), so (Weyl) its eigenvalues lie within
    ε = ‖H̄^{-1/2}EH̄^{-1/2}‖ of those three points and MINRES gains a factor O(ε) every few iterations.
    The answer is still the exact-Hessian Newton step (quadratic convergence): H̄ only sets the
    iteration count, unlike the chord SQP, whose rate ~ε is lost once ε nears 1.

    Globalisation: the step (dθ, dλ_A = λ_A⁺ − λ_A) is a descent direction of the merit ½‖F‖²
    (exact Newton: ∇(½‖F‖²)·step = −‖F‖²; inexact with ‖r‖ <= η‖F‖: <= −(1 − η)‖F‖²), so θ and λ move
    together, θ + α dθ and λ + α dλ, with the largest α = 2⁻ⁱ that meets Armijo's
    ½‖F(α)‖² <= (1 − 2·10⁻⁴α)·½‖F(0)‖². Working set: every equality, every j with λⱼ + gⱼ > 0 (the
    primal-dual active-set prediction: a multiplier larger than the constraint's slack) and every
    gⱼ >= −``active_tol`` at the start; a row whose λ⁺ⱼ < 0 is dropped (the most negative first,
    the step re-solved, within the same iteration); a constraint off A with gⱼ > ``tol`` after a
    step is added (its violation would otherwise stay above the target). Convergence is judged on
    the full KKT residual.

    Returns (θ, λ, info); ``info.converged`` says whether the KKT residual reached ``tol``;
    ``info.krylov_iterations`` / ``info.krylov_residuals`` give each step's MINRES iterations and
    true relative residual.
    """
    if hessian is not None and preconditioner is not None:
        raise ValueError("newton_kkt: pass hessian (chord SQP with H̄) or preconditioner (Newton-MINRES), not both")
    eq = problem.eq_mask
    th = theta.detach().clone().to(torch.float64)
    lam = np.asarray(lam, dtype=np.float64).copy()
    method = "chord-sqp" if hessian is not None else \
        "newton-minres (H̄-preconditioned)" if preconditioner is not None else "newton-minres"
    info = NewtonInfo(method=method)
    _, gf, g, G = first_order(problem, th, chunk_size)
    # working set: λⱼ + gⱼ > 0 predicts the active set from the point's complementarity (a multiplier
    # larger than the slack; a round-off multiplier of a clearly inactive constraint stays out), plus
    # every nearly active constraint
    work = eq | (lam + g > 0) | (g >= -active_tol)
    res = max(kkt_residuals(gf, G, g, lam, eq).values(), default=0.0)
    info.residuals.append(res)
    for _ in range(max_iter):
        if res <= tol:
            info.converged = True
            break
        if hessian is not None:
            dth, lam_new = _sqp_step(hessian, gf, G, g, eq, backend)
            info.krylov_iterations.append(0)
            # accept the step when it lowers the KKT residual, else halve θ's and λ's steps (11 times at most)
            _, found = residual_backtracking(problem, th, dth, lam, lam_new, res, min_step=2.0 ** -11,
                                             chunk_size=chunk_size)
            if found is None:
                break
            th_try, lam_try, gf_t, g_t, G_t, res_t = found
        else:
            its_total = 0
            while True:  # a working-set row whose λ⁺ is negative wants to leave: drop the most negative, re-solve
                A = np.flatnonzero(work)
                lam = np.where(work, lam, 0.0)
                dth, lamA, its, krel = _kkt_step(gf, G[A], g[A], problem, th, lam, chunk_size, rtol, preconditioner)
                its_total += its
                neg = (lamA < 0) & ~eq[A]
                if not neg.any():
                    break
                work[A[np.flatnonzero(neg)[np.argmin(lamA[neg])]]] = False
            info.krylov_iterations.append(its_total)
            info.krylov_residuals.append(krel)
            dlam = np.zeros_like(lam)
            dlam[A] = lamA - lam[A]
            phi0 = _working_merit(gf, G, g, lam, A)
            alpha = 1.0
            for _ in range(30):  # Armijo on ½‖F‖² along (dθ, dλ)
                th_try, lam_try = th + alpha * torch.from_numpy(dth), lam + alpha * dlam
                _, gf_t, g_t, G_t = first_order(problem, th_try, chunk_size)
                phi = _working_merit(gf_t, G_t, g_t, lam_try, A)
                if np.isfinite(phi) and phi <= (1.0 - 2e-4 * alpha) * phi0:
                    break
                alpha *= 0.5
            else:
                break
            res_t = max(kkt_residuals(gf_t, G_t, g_t, lam_try, eq).values(), default=0.0)
        th, lam, gf, g, G, res = th_try, lam_try, gf_t, g_t, G_t, res_t
        info.residuals.append(res)
        work |= np.where(eq, False, g > (tol if hessian is None else active_tol))
    info.converged = res <= tol
    info.working_set = tuple(int(j) for j in np.flatnonzero(eq | (lam > 0) | (g >= -active_tol)))
    return th, lam, info
