"""The DIF engine: directional influence functions by the exact (dense) path of DESIGN §10.

``DIF(problem, kkt)`` forms H = ∇²f₀ + Σ λ̄ⱼ∇²gⱼ by ``torch.func`` once; each removal then costs the
gradients of the removed samples and one small QP solved by any registered backend (then polished
exactly). All-point scores (:meth:`DIF.influence`) stack per-sample gradients (``jacrev``) and send
one batch of QPs sharing H and the active constraint rows to the backend's ``solve_batch``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...errors import ProblemError, SolverError
from ...solution import Status
from .calculus import constraint_jacobian, lagrangian_hessian, objective_grad, per_sample, per_sample_grads
from .kkt import BINDING, EQUALITY, WEAK, KKTPoint
from .problem import ConstrainedProblem, Removal

__all__ = ["DIF", "DIFResult", "Linearisation"]


@dataclass(frozen=True)
class DIFResult:
    """Directional derivative of θ for one removal.

    Attributes
    ----------
    omega : torch.Tensor (d,)
        Predicted parameter change Δθ = ω*.
    status : Status
    constraint_change : ndarray (m,)
        First-order change of each constraint value, ∇gⱼᵀω + rⱼ (<= 0 keeps it feasible).
    active : tuple of str
        Names of the active-set constraints that the QP solution keeps at equality.
    multipliers : ndarray (m,)
        QP multipliers (the first-order change of λ), zero off the active set.
    """

    omega: torch.Tensor
    status: Status
    constraint_change: np.ndarray
    active: tuple[str, ...]
    multipliers: np.ndarray


class Linearisation:
    """First-order data of a problem at a KKT point: H, ∇g, g, per-loss means (shared by DIF and baselines)."""

    def __init__(self, problem: ConstrainedProblem, kkt: KKTPoint, *, hessian: str = "lagrangian") -> None:
        if not isinstance(problem, ConstrainedProblem):
            raise ProblemError(f"problem must be a ConstrainedProblem, got {type(problem).__name__}")
        if not isinstance(kkt, KKTPoint):
            raise ProblemError(f"kkt must be a KKTPoint (dif.solve or KKTPoint.from_params), got {type(kkt).__name__}")
        if kkt.theta.numel() != problem.dim or kkt.names != tuple(c.name for c in problem.constraints):
            raise ProblemError("kkt does not belong to this problem (parameter count or constraint names differ)")
        self.problem, self.kkt = problem, kkt
        self.theta = kkt.theta
        self.lam = kkt.lambdas.numpy().astype(np.float64)
        lam_h = self.lam if hessian == "lagrangian" else np.zeros_like(self.lam)
        self.H = lagrangian_hessian(problem, self.theta, lam_h)
        self.f0, self.grad_f0 = objective_grad(problem, self.theta)
        self.g, self.G = constraint_jacobian(problem, self.theta)
        self._cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def precompute(self) -> None:
        """Cache per-sample gradients and losses of every loss with data (for many removals)."""
        for loss in (self.problem.objective, *self.problem.constraints):
            if loss.data is not None and loss.name not in self._cache:
                self._cache[loss.name] = (per_sample_grads(self.problem, loss.name, self.theta),
                                          per_sample(self.problem, loss.name, self.theta))

    def _sample_data(self, name: str, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        if name in self._cache:
            grads, vals = self._cache[name]
            return grads[idx], vals[idx]
        vals = None if name == "objective" else per_sample(self.problem, name, self.theta, idx)
        return per_sample_grads(self.problem, name, self.theta, idx), vals

    def _weights(self, name: str) -> tuple[np.ndarray, float]:
        loss = self.problem.loss(name)
        w = np.ones(loss.n_samples) if loss.weights is None else loss.weights.numpy().astype(np.float64)
        W = float(w.sum()) if loss.renormalize else float(w.size)
        return w, W

    def removal_terms(self, removal: Removal, *, renormalize: bool = True,
                      weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For one removal: (c₀, c_constraints (m, d), r (m,)) with c = c₀ + Σ wⱼ c_constraintsⱼ.

        ``c₀`` is the objective's term, row j of ``c_constraints`` constraint j's term before its
        weight (λ̄ⱼ for DIF), ``r`` the shift of each constraint value.
        """
        rem = self.problem.check_removal(removal)
        d, m = self.problem.dim, self.problem.m
        c0, cc, r = np.zeros(d), np.zeros((m, d)), np.zeros(m)
        for name, idx in rem.items():
            w, W = self._weights(name)
            wi = w[idx]
            grads, vals = self._sample_data(name, idx)
            gterm = -(wi @ grads) / W
            if name == "objective":
                if renormalize:
                    gterm = gterm + wi.sum() / W * self.grad_f0
                c0 += gterm
            else:
                j = self.problem.names.index(name) - 1
                rj = -(wi @ vals) / W
                if renormalize:
                    mean_j = self.g[j] + self.problem.constraints[j].tau
                    rj += wi.sum() / W * mean_j
                    gterm = gterm + wi.sum() / W * self.G[j]
                cc[j] += gterm
                r[j] += rj
        return c0, cc, r

    def objective_terms(self, idx: np.ndarray | None = None, *, renormalize: bool = True) -> np.ndarray:
        """Linear terms c for removing each single objective sample, (k, d) (rows: -∇ℓ₀(zᵢ)/N₀ + renormalisation)."""
        w, W = self._weights("objective")
        idx = np.arange(w.size) if idx is None else np.asarray(idx, dtype=np.int64)
        C = -(w[idx, None] * per_sample_grads(self.problem, "objective", self.theta, idx)) / W
        if renormalize:
            C = C + (w[idx, None] / W) * self.grad_f0[None, :]
        return C


def _as_removals(removal: Removal | Sequence[Removal]) -> tuple[list[Removal], bool]:
    if isinstance(removal, Mapping):
        return [removal], True
    if isinstance(removal, Sequence) and all(isinstance(r, Mapping) for r in removal):
        return list(removal), False
    raise ProblemError("removal must be a mapping {loss name: indices} or a list of such mappings, "
                       f"got {type(removal).__name__}")


class DIF:
    """Directional influence functions at a KKT point (exact path: H formed, QP by a backend).

    Parameters
    ----------
    problem : ConstrainedProblem
    kkt : KKTPoint
    backend : str or QPSolver
        Any registered backend (default ``"proxsuite"``); the QP answer is then polished exactly.
    damping : float
        Adds ``damping·I`` to H (for singular or ill-conditioned Hessians).
    renormalize : bool
        Default True: a removal means what retraining means (every loss stays a mean over what
        remains; rⱼ includes ℓ̄ⱼ − ℓⱼ(z)). False: the paper's plain Δε = −1/Nⱼ (a τ-shifted problem).
    **settings
        QP solver settings (default ``eps_abs=1e-10``).

    Examples
    --------
    >>> dif = DIF(problem, kkt)                                    # doctest: +SKIP
    >>> dif.delta_theta({"objective": [3, 17], "group": [2]})      # doctest: +SKIP
    >>> scores = dif.influence(lambda th: test_loss(th))           # doctest: +SKIP
    """

    def __init__(self, problem: ConstrainedProblem, kkt: KKTPoint, backend: Any = "proxsuite",
                 damping: float = 0.0, *, renormalize: bool = True, **settings: Any) -> None:
        if not np.isfinite(damping) or damping < 0:
            raise ProblemError(f"damping must be a finite number >= 0, got {damping}")
        self.lin = Linearisation(problem, kkt)
        self.problem, self.kkt = problem, kkt
        self.backend, self.damping, self.renormalize = backend, float(damping), bool(renormalize)
        self.settings = settings
        self.H = self.lin.H + self.damping * np.eye(problem.dim)
        st = kkt.status
        self.rows = np.array([j for j, s in enumerate(st) if s in (BINDING, EQUALITY, WEAK)], dtype=np.int64)
        self.row_eq = np.array([st[j] != WEAK for j in self.rows], dtype=bool)
        self.C = self.lin.G[self.rows]

    # ------------------------------------------------------------------ one removal
    def qp_data(self, removal: Removal) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(H, c, C, u, eq) of the DIF QP ``min cᵀω + ½ωᵀHω s.t. Cω = u (eq), Cω <= u`` (u = −r)."""
        c, r = self._terms(removal)
        return self.H, c, self.C, -r[self.rows], self.row_eq

    def _terms(self, removal: Removal) -> tuple[np.ndarray, np.ndarray]:
        c0, cc, r = self.lin.removal_terms(removal, renormalize=self.renormalize)
        return c0 + self.lin.lam @ cc, r

    def result(self, removal: Removal) -> DIFResult:
        """The full :class:`DIFResult` for one removal (subset of samples, possibly of several losses)."""
        from .qp import solve_qp_exact

        c, r = self._terms(removal)
        sol = solve_qp_exact(self.H, c, self.C, -r[self.rows], self.row_eq, backend=self.backend, **self.settings)
        return self._pack(sol, r)

    def _pack(self, sol, r) -> DIFResult:
        m = self.problem.m
        omega = np.nan_to_num(sol.x, nan=np.nan)
        mult = np.zeros(m)
        mult[self.rows] = sol.z
        change = (self.lin.G @ omega + r) if m else np.zeros(0)
        names = tuple(self.kkt.names[j] for j, a in zip(self.rows, sol.active, strict=True) if a)
        return DIFResult(omega=torch.as_tensor(omega), status=sol.status, constraint_change=change,
                         active=names, multipliers=mult)

    def delta_theta(self, removal: Removal | Sequence[Removal]) -> torch.Tensor:
        """Predicted parameter change Δθ for a removal (d,), or for a list of removals (k, d).

        ``removal`` maps ``"objective"`` or a constraint's name to the indices removed from that loss's
        data; a subset is removed jointly (not the sum of single removals).

        Raises
        ------
        ProblemError
            Unknown loss name, index out of range, removal from a data-free constraint.
        SolverError
            The QP could not be solved (the status says why).
        """
        removals, single = _as_removals(removal)
        out = []
        for rem in removals:
            res = self.result(rem)
            if not res.status.ok:
                raise SolverError(f"the DIF QP returned {res.status.name}: {res.status.message}")
            out.append(res.omega)
        return out[0] if single else torch.stack(out) if out else torch.zeros(0, self.problem.dim,
                                                                              dtype=torch.float64)

    # ------------------------------------------------------------------ all points
    def influence(self, test_fn: Callable[[Any], Any] | None = None,
                  removals: Sequence[Removal] | None = None) -> torch.Tensor:
        """Predicted change of ``test_fn`` when each objective sample is removed (first order).

        Parameters
        ----------
        test_fn : callable, optional
            ``test_fn(params_or_model)`` -> scalar (e.g. a test loss). ``None`` returns the
            parameter changes themselves, shape (N₀, d).
        removals : list of removals, optional
            Score these removals instead of the single objective samples (e.g. a training point
            that also sits in a constraint's data: ``{"objective": [i], "group": [k]}``).

        Returns
        -------
        torch.Tensor
            (N₀,) or (len(removals),): ∇F(θ̄)ᵀω for each removal.
        """
        omegas = self._all_omegas(removals)
        if test_fn is None:
            return omegas
        return omegas @ _test_grad(self.problem, test_fn, self.kkt.theta)

    def _all_omegas(self, removals: Sequence[Removal] | None) -> torch.Tensor:
        from .qp import solve_qp_exact_batch

        m = self.problem.m
        if removals is None:
            Q = self.lin.objective_terms(renormalize=self.renormalize)
            R = np.zeros((Q.shape[0], m))
        else:
            if len(removals) > 1:
                self.lin.precompute()
            terms = [self.lin.removal_terms(rem, renormalize=self.renormalize) for rem in removals]
            Q = np.array([c0 + self.lin.lam @ cc for c0, cc, _ in terms]).reshape(-1, self.problem.dim)
            R = np.array([r for _, _, r in terms]).reshape(-1, m)
        sols = solve_qp_exact_batch(self.H, Q, self.C, -R[:, self.rows], self.row_eq,
                                    backend=self.backend, **self.settings)
        bad = [i for i, s in enumerate(sols) if not s.status.ok]
        if bad:
            raise SolverError(f"the DIF QP failed for {len(bad)} removals (first: #{bad[0]}, "
                              f"{sols[bad[0]].status.name}: {sols[bad[0]].status.message})")
        return torch.as_tensor(np.array([s.x for s in sols]).reshape(-1, self.problem.dim))


def _test_grad(problem: ConstrainedProblem, test_fn: Callable[[Any], Any], theta: torch.Tensor) -> torch.Tensor:
    def f(t):
        out = torch.as_tensor(test_fn(problem.wrap(t)))
        if out.numel() != 1:
            raise ProblemError(f"test_fn must return a scalar, got shape {tuple(out.shape)}")
        return out.reshape(())
    return torch.func.grad(f)(theta).detach().to(torch.float64)
