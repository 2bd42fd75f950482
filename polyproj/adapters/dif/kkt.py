"""KKT points of a :class:`ConstrainedProblem`: :class:`KKTPoint` and :func:`solve`.

At a KKT point (θ̄, λ̄)::

    ∇f₀(θ̄) + Σ λ̄ⱼ ∇gⱼ(θ̄) = 0,   gⱼ(θ̄) <= 0,   λ̄ⱼ >= 0,   λ̄ⱼ gⱼ(θ̄) = 0

(equality constraints: gⱼ = 0, λ̄ⱼ free). Each inequality is *binding* (λ̄ⱼ > mult_tol), *weakly
active* (gⱼ >= −active_tol, λ̄ⱼ <= mult_tol: strict complementarity fails) or *inactive*.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.optimize
import torch
from torch import nn

from ...errors import PolyprojWarning, ProblemError, SolverError
from ...solution import Status
from .calculus import constraint_jacobian, lagrangian_hessian, objective_grad
from .newton import kkt_residuals
from .problem import ConstrainedProblem
from .qp import solve_qp_exact

__all__ = ["KKTPoint", "solve"]

BINDING, WEAK, INACTIVE, EQUALITY = "binding", "weakly_active", "inactive", "equality"


@dataclass(frozen=True, eq=False)
class KKTPoint:
    """A KKT point (θ̄, λ̄) with the classification of each constraint.

    Attributes
    ----------
    theta : torch.Tensor (d,)
        Flat float64 parameters θ̄.
    lambdas : torch.Tensor (m,)
        Multipliers λ̄ (>= 0 on inequalities).
    g : ndarray (m,)
        Constraint values gⱼ(θ̄) = mean ℓⱼ − τⱼ.
    status : tuple of str
        Per constraint: ``"binding"``, ``"weakly_active"``, ``"inactive"`` or ``"equality"``.
    names : tuple of str
        Constraint names.
    residuals : dict
        ``stationarity`` (‖∇θL‖∞), ``feasibility``, ``complementarity`` (max |λⱼgⱼ|), ``dual``.
    active_tol, mult_tol : float
        Tolerances of the classification.
    info : dict
        How it was obtained (iterations, time, whether multipliers were polished).
    """

    theta: torch.Tensor
    lambdas: torch.Tensor
    g: np.ndarray
    status: tuple[str, ...]
    names: tuple[str, ...]
    residuals: dict[str, float]
    active_tol: float
    mult_tol: float
    info: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def residual(self) -> float:
        """The KKT residual: max of stationarity, feasibility, complementarity and dual residuals."""
        return max(self.residuals.values(), default=0.0)

    @property
    def suggested_damping(self) -> float:
        """A damping floor sized by the stationarity residual ‖∇θL‖∞ (0 at an exact KKT point).

        At an approximately stationary point θ̄ with ∇L(θ̄) = e, H is known only up to curvature of
        the order of ‖e‖ (θ̄ sits O(‖e‖/λ) away from the KKT point it approximates), so eigenvalues
        below ‖e‖ are not trusted; ``DIF(damping="auto")`` starts from this value.
        """
        return float(self.residuals.get("stationarity", 0.0))

    def _idx(self, *kinds: str) -> np.ndarray:
        return np.array([j for j, s in enumerate(self.status) if s in kinds], dtype=np.int64)

    @property
    def binding(self) -> np.ndarray:
        """Indices of binding constraints (λ̄ > 0) and equality constraints."""
        return self._idx(BINDING, EQUALITY)

    @property
    def weakly_active(self) -> np.ndarray:
        """Indices of weakly active constraints (g = 0, λ̄ = 0)."""
        return self._idx(WEAK)

    @property
    def inactive(self) -> np.ndarray:
        """Indices of inactive constraints (g < 0)."""
        return self._idx(INACTIVE)

    @property
    def classification(self) -> dict[str, str]:
        """``{constraint name: status}``."""
        return dict(zip(self.names, self.status, strict=True))

    def __repr__(self) -> str:
        cls = ", ".join(f"{n}={s}" for n, s in self.classification.items())
        return f"KKTPoint(d={self.theta.numel()}, residual={self.residual:.2e}, [{cls}])"

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_params(cls, problem: ConstrainedProblem, theta: Any, lambdas: Any = None, *, tol: float = 1e-6,
                    active_tol: float = 1e-6, mult_tol: float = 1e-7, polish: bool | None = None,
                    warn: bool = True) -> KKTPoint:
        """Build a KKT point from a user's solution, polishing the multipliers when needed.

        Parameters
        ----------
        problem : ConstrainedProblem
        theta : 1-D tensor or nn.Module
            The trained parameters (a module in the layout of ``problem``'s module).
        lambdas : array-like (m,), optional
            Multipliers (e.g. from Cooper). Missing, or not satisfying stationarity to ``tol``, they
            are recomputed by non-negative least squares on stationarity over the active constraints,
            ``min ‖∇f₀ + G_Aᵀλ‖₂  s.t. λ >= 0`` (free on equalities).
        tol : float
            Accepted KKT residual (inf-norm); a larger one raises :class:`ProblemError`.
        active_tol : float
            |gⱼ| <= active_tol counts as active; so does a row whose given multiplier exceeds ``mult_tol``
            while λⱼ|gⱼ| <= ``tol`` (complementarity to tolerance: a KKT point at ``tol`` may leave such a
            row slightly inside).
        mult_tol : float
            λⱼ > mult_tol counts as binding.
        polish : bool, optional
            Force (True) or forbid (False) the NNLS polish; default: when needed.
        warn : bool
            Warn (:class:`PolyprojWarning`) when LICQ or strict complementarity fails.

        Raises
        ------
        ProblemError
            θ infeasible, or not stationary for any admissible multipliers (not a KKT point).
        """
        _check_tolerances(tol=tol, active_tol=active_tol, mult_tol=mult_tol)
        th = _flat_theta(problem, theta)
        gval, G = constraint_jacobian(problem, th)
        _, grad = objective_grad(problem, th)
        eq = problem.eq_mask
        names = tuple(c.name for c in problem.constraints)
        _check_finite_derivatives(grad, gval, G, names)
        viol = np.where(eq, np.abs(gval), np.maximum(gval, 0.0))
        if np.any(viol > max(active_tol, tol)):
            j = int(np.argmax(viol))
            raise ProblemError(f"not a KKT point: constraint {names[j]!r} is violated (g = {gval[j]:.3e} "
                               f"{'!= 0' if eq[j] else '> 0'}); train to feasibility first (dif.solve)")
        active = eq | (gval >= -active_tol)
        lam, polished = None, False
        if lambdas is not None:
            lam = _flat_lambdas(problem, lambdas, "lambdas")
            # a row with a clear multiplier is active while complementarity λⱼ|gⱼ| holds to tol, even when
            # its slack exceeds active_tol (a KKT point at tolerance tol may leave gⱼ ~ tol/λⱼ below zero)
            active |= (lam > mult_tol) & (np.abs(lam * gval) <= tol)
        need = lam is None or polish is True
        if lam is not None and polish is None:
            res = kkt_residuals(grad, G, gval, lam, eq)
            need = max(res.values(), default=0.0) > tol or bool(np.any(lam[~active & ~eq] != 0))
        if need and polish is not False:
            lam = _nnls_multipliers(grad, G, active, eq)
            polished = True
        res = kkt_residuals(grad, G, gval, lam, eq)
        if max(res.values(), default=0.0) > tol:
            raise ProblemError(
                f"not a KKT point: stationarity residual {res['stationarity']:.3e}, complementarity "
                f"{res['complementarity']:.3e}, dual {res['dual']:.3e} exceed tol = {tol:g}"
                + (" even with the best non-negative multipliers" if polished else "")
                + "; train further (polyproj.adapters.dif.solve) or pass a looser tol")
        if np.any(lam[~eq] < 0):  # within tol (checked above): λ >= 0 on inequalities is kept, not stored
            lam = np.where(eq, lam, np.maximum(lam, 0.0))
            res = kkt_residuals(grad, G, gval, lam, eq)
        status = tuple(EQUALITY if eq[j] else (INACTIVE if not active[j] else
                                               (BINDING if lam[j] > mult_tol else WEAK))
                       for j in range(problem.m))
        act_rows = np.array([s != INACTIVE for s in status], dtype=bool)
        if warn and act_rows.any():
            Ga = G[act_rows]
            rank = np.linalg.matrix_rank(Ga, tol=1e-9 * max(1.0, float(np.abs(Ga).max(initial=0.0))))
            if rank < Ga.shape[0]:
                warnings.warn(f"LICQ fails at this KKT point: the gradients of the {Ga.shape[0]} active constraints "
                              f"have rank {rank}; the multipliers are not unique", PolyprojWarning, stacklevel=2)
        weak = [names[j] for j, s in enumerate(status) if s == WEAK]
        if warn and weak:
            warnings.warn(f"strict complementarity fails for {weak} (active with zero multiplier): the solution "
                          "is only directionally differentiable; DIF handles it, classic IF does not",
                          PolyprojWarning, stacklevel=2)
        return cls(theta=th.clone(), lambdas=torch.as_tensor(lam.copy()), g=gval, status=status, names=names,
                   residuals=res, active_tol=active_tol, mult_tol=mult_tol, info={"polished_multipliers": polished})

    @classmethod
    def from_cooper(cls, problem: ConstrainedProblem, cmp: Any, model: Any, *, tol: float = 1e-6,
                    refine: bool = False, **kwargs: Any) -> KKTPoint:
        """The KKT point of a model trained with Cooper (``cooper-optim``).

        Parameters
        ----------
        problem : ConstrainedProblem
            The same problem on the full data, its constraints named as Cooper's (a Cooper
            constraint with n multipliers: ``name[0]`` … ``name[n-1]``).
        cmp : cooper.ConstrainedMinimizationProblem
            Its multipliers are read by constraint name.
        model : nn.Module or 1-D tensor
            The trained parameters, in the layout of ``problem``.
        tol : float
            Accepted KKT residual after the multiplier polish (see :meth:`from_params`).
        refine : bool
            Re-solve from Cooper's point with :func:`solve` to ``tol`` first (for an exact KKT
            point when Cooper stopped early or trained on mini-batches).
        **kwargs
            Passed to :meth:`from_params` (``active_tol``, ``mult_tol``, ``polish``, ``warn``).
        """
        from .cooper import cooper_multipliers

        lam = cooper_multipliers(problem, cmp)
        if refine:
            k = solve(problem, theta0=_flat_theta(problem, model), lambdas0=lam, tol=tol,
                      warn=kwargs.get("warn", True))
            k.info["from_cooper"] = {"lambdas": lam.tolist(), "refined": True}
            return k
        k = cls.from_params(problem, model, lam, tol=tol, **kwargs)
        k.info["from_cooper"] = {"lambdas": lam.tolist(), "refined": False}
        return k


def _check_tolerances(**tols: Any) -> None:
    """Each tolerance a positive finite number (NaN would accept any point)."""
    for name, v in tols.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0.0 < v < np.inf:
            raise ProblemError(f"{name} must be a positive finite number, got {v!r}")


def _flat_lambdas(problem: ConstrainedProblem, lambdas: Any, what: str) -> np.ndarray:
    """Multipliers (a tensor on any device, an array, a list) as a new float64 array of m finite numbers."""
    if isinstance(lambdas, torch.Tensor) and lambdas.is_meta:
        raise ProblemError(f"{what} are on the 'meta' device: they have a shape but no values")
    lam = np.array(lambdas.detach().cpu().numpy() if isinstance(lambdas, torch.Tensor) else lambdas,
                   dtype=np.float64).reshape(-1)
    if lam.shape != (problem.m,) or not np.all(np.isfinite(lam)):
        raise ProblemError(f"{what} must be {problem.m} finite numbers, got shape {lam.shape}")
    return lam


def _flat_theta(problem: ConstrainedProblem, theta: Any) -> torch.Tensor:
    meta = theta.is_meta if isinstance(theta, torch.Tensor) else isinstance(theta, nn.Module) and any(
        p.is_meta for p in theta.parameters())
    if meta:
        raise ProblemError("theta is on the 'meta' device: it has a shape but no values")
    if isinstance(theta, nn.Module):
        if problem.model is None:
            raise ProblemError("theta is a module but the problem was built on a tensor")
        if theta is not problem.model:
            _check_module_state(problem, theta)
        ps = [p for _, p in theta.named_parameters() if p.requires_grad]
        theta = torch.cat([p.detach().reshape(-1) for p in ps])
    if not isinstance(theta, torch.Tensor):  # a list or array: float64 (torch.as_tensor of floats is float32)
        try:
            theta = torch.as_tensor(np.asarray(theta, dtype=np.float64))
        except (TypeError, ValueError) as exc:
            raise ProblemError(f"theta must be a 1-D tensor, array or nn.Module, got {type(theta).__name__}: "
                               f"{exc}") from None
    if theta.ndim != 1:
        raise ProblemError(f"theta must be 1-D (the flat parameters, {problem.dim} entries) or an nn.Module, got "
                           f"shape {tuple(theta.shape)}")
    th = theta.detach().to("cpu", torch.float64).clone()
    if th.numel() != problem.dim:
        raise ProblemError(f"θ has {th.numel()} entries, the problem has {problem.dim} parameters")
    if not bool(torch.isfinite(th).all()):
        raise ProblemError("theta contains NaN or inf")
    return th


def _same_values(mine: torch.Tensor, theirs: Any) -> bool:
    """The problem's copy ``mine`` (float64 for floating tensors) equals the user's tensor ``theirs``.

    Compared in the user's dtype: the problem's copy of a float32 buffer is exact in float32.
    """
    if not isinstance(theirs, torch.Tensor) or theirs.is_meta or tuple(theirs.shape) != tuple(mine.shape):
        return False
    theirs = theirs.detach().cpu()
    if mine.is_floating_point() != theirs.is_floating_point():
        return False
    return bool(torch.equal(mine.to(theirs.dtype), theirs))


def _check_module_state(problem: ConstrainedProblem, module: nn.Module) -> None:
    """A ``ProblemError`` where ``module``'s state besides θ differs from the problem's copy of its module.

    The problem evaluates its losses with θ in place of the trainable parameters of the module it copied when
    it was built, keeping that copy's buffers (BatchNorm's running statistics) and frozen parameters; θ read
    from a module whose buffers training has since updated would be checked (and re-solved) on another
    network. BatchNorm's ``num_batches_tracked`` is not compared (an evaluation-mode forward does not read it).
    """
    again = (": the problem evaluates the module with θ and the buffers and frozen parameters of the copy it took "
             "when it was built, so this θ would be checked on another network; build the ConstrainedProblem from "
             "the trained module, after training (e.g. after BatchNorm's running statistics were updated)")
    names = [k for k, p in module.named_parameters() if p.requires_grad]
    if names != list(problem._names):
        diff = sorted(set(names) ^ set(problem._names))
        raise ProblemError(f"the module's trainable parameters {diff[:3] or '(their order)'} differ from those of "
                           "the module the problem was built from: pass a module in its layout, with the same "
                           "parameters trainable (requires_grad)")
    theirs = dict(module.named_parameters(remove_duplicate=False))
    for k, p in problem.model.named_parameters(remove_duplicate=False):
        if p.requires_grad:
            continue
        if not _same_values(p.detach(), theirs.get(k)):
            raise ProblemError(f"the module's frozen parameter {k!r} (requires_grad=False) differs from the "
                               "problem's" + again)
    bn_counters = {f"{m}.num_batches_tracked" if m else "num_batches_tracked"
                   for m, mod in problem.model.named_modules() if isinstance(mod, nn.modules.batchnorm._BatchNorm)}
    theirs_b = dict(module.named_buffers(remove_duplicate=False))
    for k, b in problem.model.named_buffers(remove_duplicate=False):
        if k in bn_counters:
            continue
        if not _same_values(b.detach(), theirs_b.get(k)):
            what = "is missing from the module" if k not in theirs_b else "of the module differs from the problem's"
            raise ProblemError(f"buffer {k!r} {what}" + again)


def _nnls_multipliers(grad, G, active, eq) -> np.ndarray:
    lam = np.zeros(G.shape[0])
    idx = np.flatnonzero(active)
    if idx.size == 0:
        return lam
    lo = np.where(eq[idx], -np.inf, 0.0)
    sol = scipy.optimize.lsq_linear(G[idx].T, -grad, bounds=(lo, np.full(idx.size, np.inf)),
                                    method="bvls", tol=1e-15, lsmr_tol="auto")
    lam[idx] = sol.x
    return lam


def _convexified(H: np.ndarray, grad: np.ndarray, G: np.ndarray, g: np.ndarray, work: np.ndarray,
                 shift: float) -> tuple[np.ndarray, np.ndarray]:
    """The SQP subproblem's (P, q), made strictly convex without moving its solution when possible.

    First the augmented-Lagrangian term ρ/2‖G_W d + g_W‖² on the working rows W (it vanishes on
    the linearised constraints that the QP keeps at equality, so it leaves that QP's solution
    alone, and by Debreu's lemma it makes P positive definite when H is positive definite on
    null(G_W)); then, if P still has an eigenvalue below ``shift``·‖H‖, every eigenvalue is replaced
    by its absolute value floored there (negative curvature becomes descent of a sensible length;
    ``shift`` grows when line searches cut the step and shrinks when full steps are taken).

    ‖H‖ is the Hessian's own scale (‖∇f₀‖∞ for H = 0), not an absolute one: an objective multiplied by a
    positive constant gets the same steps (an absolute floor flattened a small H to shift·I).
    """
    w = np.linalg.eigvalsh(H)
    scale = float(np.max(np.abs(w), initial=0.0))
    if not 0.0 < scale < np.inf:  # H = 0: the gradient's scale (also that of the objective)
        scale = float(np.max(np.abs(grad), initial=0.0))
        scale = scale if 0.0 < scale < np.inf else 1.0
    P, q = H, grad
    if w[0] < shift * scale and np.any(work):
        Gw = G[work]
        rho = scale / max(float(np.linalg.norm(Gw, 2)) ** 2, 1e-300)
        P = H + rho * Gw.T @ Gw
        q = grad + rho * Gw.T @ g[work]
        w = np.linalg.eigvalsh(P)
    if w[0] < shift * scale:  # saddle-free modification: |eigenvalues|, floored at shift·‖H‖
        w, Q = np.linalg.eigh(P)
        P = (Q * np.maximum(np.abs(w), shift * scale)) @ Q.T
    return P, q


def _merit(problem, th, nu, eq) -> float:
    with torch.no_grad():
        f = float(problem.objective_value(th))
        g = problem.constraint_values(th).numpy() if problem.m else np.zeros(0)
    return f + nu * float(np.sum(np.where(eq, np.abs(g), np.maximum(g, 0.0))))


#: largest d for which ``solve(method="auto")`` uses the dense SQP
SQP_MAX_DIM = 500


def solve(problem: ConstrainedProblem, theta0: Any = None, lambdas0: Any = None, *, tol: float = 1e-10,
          max_iter: int = 100, backend: Any = "proxsuite", active_tol: float = 1e-6, mult_tol: float = 1e-7,
          warn: bool = True, method: str = "auto", chunk_size: int | None = None, **settings: Any) -> KKTPoint:
    """Train to a KKT point (full batch), globalised so that non-convex models (networks) converge.

    ``method="sqp"`` (default for d <= ``SQP_MAX_DIM``): each iteration solves
    ``min ½dᵀPd + qᵀd  s.t.  gⱼ + ∇gⱼᵀd <= 0`` (``= 0`` for equalities) with ``backend`` (exact
    polish), P the Hessian of the Lagrangian made strictly convex (augmented-Lagrangian term on the
    working rows, then |eigenvalues| floored by an adaptive shift: see ``_convexified``), takes the
    QP multipliers as the new λ, and a line search on the ℓ₁ merit function. Quadratic convergence
    near a KKT point satisfying SOSC, so warm starts (leave-one-out retraining) take few iterations.

    ``method="auglag"`` (default above): the PHR augmented Lagrangian with L-BFGS inner solves to
    residual 1e-7, then Newton on the working set's KKT system by MINRES on Hessian-vector products
    to ``tol`` (:mod:`polyproj.adapters.dif.newton`); H is never formed.

    Parameters
    ----------
    problem : ConstrainedProblem
    theta0 : tensor, optional
        Start (default ``problem.theta0``).
    lambdas0 : array-like, optional
    tol : float
        Target KKT residual (inf-norm of stationarity, feasibility, complementarity).
    max_iter : int
    backend : str or QPSolver
    active_tol, mult_tol, warn : as :meth:`KKTPoint.from_params`
    method : {"auto", "sqp", "auglag"}
    chunk_size : int, optional
        Samples per chunk of gradients and Hessian-vector products (``"auglag"``).
    **settings : QP solver settings

    Returns
    -------
    KKTPoint

    Raises
    ------
    SolverError
        The QP subproblem is infeasible or the iteration does not reach ``tol``.
    """
    t0 = time.perf_counter()
    _check_tolerances(tol=tol, active_tol=active_tol, mult_tol=mult_tol)
    th = _flat_theta(problem, problem.theta0 if theta0 is None else theta0)
    lam = np.zeros(problem.m) if lambdas0 is None else _flat_lambdas(problem, lambdas0, "lambdas0")
    if method not in ("auto", "sqp", "auglag"):
        raise ProblemError(f"method must be 'auto', 'sqp' or 'auglag', got {method!r}")
    if method == "auglag" or (method == "auto" and problem.dim > SQP_MAX_DIM):
        return _solve_auglag(problem, th, lam, tol=tol, max_iter=max_iter, active_tol=active_tol,
                             mult_tol=mult_tol, warn=warn, chunk_size=chunk_size, t0=t0)
    eq = problem.eq_mask
    res, shift = np.inf, 1e-4
    for it in range(1, max_iter + 1):
        _, grad = objective_grad(problem, th)
        gval, G = constraint_jacobian(problem, th)
        res = max(kkt_residuals(grad, G, gval, lam, eq).values(), default=0.0)
        if res <= tol:
            break
        H = lagrangian_hessian(problem, th, lam)
        sol = None
        for _ in range(6):  # convexify the QP; a subproblem still reported unbounded gets a larger shift
            Hq, q = _convexified(H, grad, G, gval, eq | (lam > 0) | (gval >= -active_tol), shift)
            sol = solve_qp_exact(Hq, q, G, -gval, eq, backend=backend, **settings)
            if sol.status is not Status.DUAL_INFEASIBLE:
                break
            shift *= 100.0
        if not sol.status.ok:
            raise SolverError(f"SQP iteration {it}: the QP subproblem returned {sol.status.name} "
                              f"({sol.status.message}); the linearised constraints admit no step: check that the "
                              "constraints are feasible, or start from a feasible point")
        d, lam_new = sol.x, np.where(eq, sol.z, np.maximum(sol.z, 0.0))
        nu = 2.0 * float(np.max(np.abs(lam_new), initial=0.0)) + 1e-8
        phi0 = _merit(problem, th, nu, eq)
        slope = float(grad @ d) - nu * float(np.sum(np.where(eq, np.abs(gval), np.maximum(gval, 0.0))))
        alpha, dt = 1.0, torch.as_tensor(d)
        for _ in range(40):
            if _merit(problem, th + alpha * dt, nu, eq) <= phi0 + 1e-4 * alpha * min(slope, 0.0) + 1e-14 * abs(phi0):
                break
            alpha *= 0.5
        th = th + alpha * dt
        lam = lam + alpha * (lam_new - lam)
        shift = max(shift * 0.3, 1e-10) if alpha == 1.0 else min(shift * 10.0, 1e4) if alpha < 0.1 else shift
    else:
        _, grad = objective_grad(problem, th)
        gval, G = constraint_jacobian(problem, th)
        res = max(kkt_residuals(grad, G, gval, lam, eq).values(), default=0.0)
        if res > tol:
            raise SolverError(f"SQP did not reach the KKT residual {tol:g} in {max_iter} iterations "
                              f"(residual {res:.3e}); raise max_iter or loosen tol")
    kkt = KKTPoint.from_params(problem, th, lam, tol=max(tol, 10 * res), active_tol=active_tol,
                               mult_tol=mult_tol, polish=False, warn=warn)
    kkt.info.update(iterations=it, time=time.perf_counter() - t0, method="sqp")
    return kkt


def _solve_auglag(problem: ConstrainedProblem, th: torch.Tensor, lam: np.ndarray, *, tol: float, max_iter: int,
                  active_tol: float, mult_tol: float, warn: bool, chunk_size: int | None, t0: float) -> KKTPoint:
    from .hvp import DEFAULT_CHUNK
    from .newton import augmented_lagrangian, newton_kkt

    chunk = chunk_size or DEFAULT_CHUNK
    th, lam, info = augmented_lagrangian(problem, th, lam, tol=max(tol, 1e-7), chunk_size=chunk)
    res = info.residuals[-1] if info.residuals else np.inf
    newton = None
    if res > tol:
        th, lam, newton = newton_kkt(problem, th, lam, tol=tol, max_iter=max_iter, active_tol=active_tol,
                                     chunk_size=chunk)
        res = newton.residuals[-1]
    if res > tol:
        g = problem.constraint_values(th).numpy() if problem.m else np.zeros(0)
        eq = problem.eq_mask
        viol = np.where(eq, np.abs(g), np.maximum(g, 0.0))
        hint = "raise max_iter or loosen tol"
        if viol.size and float(viol.max()) > max(1e3 * tol, 1e-6):  # far from feasible: likely no feasible θ
            j = int(np.argmax(viol))
            hint = (f"the constraints are still violated by {float(viol.max()):.3e} (constraint "
                    f"{problem.constraints[j].name!r}): they may have no common feasible point; check the τ's "
                    "(and the starting point), or " + hint)
        raise SolverError(f"the augmented Lagrangian + Newton-MINRES did not reach the KKT residual {tol:g} "
                          f"(residual {res:.3e}); {hint}")
    kkt = KKTPoint.from_params(problem, th, lam, tol=max(tol, 10 * res), active_tol=active_tol,
                               mult_tol=mult_tol, polish=False, warn=warn)
    kkt.info.update(time=time.perf_counter() - t0, method="auglag", auglag=info, newton=newton)
    return kkt


def _check_finite_derivatives(grad: np.ndarray, g: np.ndarray, G: np.ndarray, names: tuple[str, ...]) -> None:
    """A ``ProblemError`` where the objective's gradient or a constraint's value or gradient is not finite."""
    if not np.all(np.isfinite(grad)):
        raise ProblemError("the objective's gradient is not finite at this θ (NaN or inf: e.g. a square root or a "
                           "log at 0); no KKT point can be checked there")
    bad = ~(np.isfinite(g) & np.all(np.isfinite(G), axis=1)) if G.size else ~np.isfinite(g)
    if np.any(bad):
        j = int(np.flatnonzero(bad)[0])
        raise ProblemError(f"constraint {names[j]!r}: its value or gradient is not finite at this θ")
