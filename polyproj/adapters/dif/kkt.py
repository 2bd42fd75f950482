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

from ...errors import BackendUnavailable, PolyprojWarning, ProblemError, SolverError, close_matches
from ...linalg import own_contiguous
from ...solution import Status
from .calculus import constraint_jacobian, lagrangian_hessian, objective_grad
from .hvp import DEFAULT_CHUNK, chunk_size_arg
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
            ``min ‖∇f₀ + G_Aᵀλ‖₂  s.t. λ >= 0`` (free on equalities). Where that leaves the KKT residual
            above ``tol``, every inequality whose multiplier can meet complementarity to tol (λⱼ|gⱼ| <= tol: a
            binding row that a point trained to tolerance left slightly inside) is a candidate too
            (:func:`_complementary_multipliers`), and a candidate that takes a multiplier above ``mult_tol``
            counts as active, as with given multipliers.
        tol : float
            Accepted KKT residual (inf-norm); a larger one raises :class:`ProblemError`. Absolute, in the
            units of ∇f₀ (stationarity) and of g (feasibility).
        active_tol : float
            |gⱼ| <= active_tol counts as active; so does a row whose given multiplier exceeds ``mult_tol``
            while λⱼ|gⱼ| <= ``tol`` (complementarity to tolerance: a KKT point at ``tol`` may leave such a
            row slightly inside). Absolute, in the units of gⱼ.
        mult_tol : float
            λⱼ > mult_tol counts as binding. Absolute, in the units of λ (those of f₀ over those of g).
            The defaults suit a problem at unit scale; for another, scale them with it (docs/dif.md,
            "Tolerances").
        polish : bool or None
            Force (True) or forbid (False) the NNLS polish; None (default): when needed. False needs
            ``lambdas``.
        warn : bool
            Warn (:class:`PolyprojWarning`) when LICQ or strict complementarity fails, when the
            classification depends on the absolute tolerances' scale (:func:`_scale_ambiguity`): a row called
            weakly active whose multiplier carries a share of ∇f₀, or a row counted active whose hyperplane
            is far away in θ, and when a row is called inactive although a multiplier on it would lower the
            stationarity residual tenfold (:func:`_missed_rows`: a binding row left inside by more than
            ``active_tol``, accepted because ``tol`` is loose).

        Raises
        ------
        ProblemError
            θ infeasible, or not stationary for any admissible multipliers (not a KKT point).
        """
        _check_tolerances(tol=tol, active_tol=active_tol, mult_tol=mult_tol)
        polish = check_flag(polish, "polish", none=True)
        warn = check_flag(warn, "warn")
        if polish is False and lambdas is None:
            raise ProblemError("polish=False forbids the NNLS polish, which is the only source of multipliers when "
                               "none are given: pass lambdas, or polish=None (when needed) or True")
        th = _flat_theta(problem, theta)
        gval, G = constraint_jacobian(problem, th)
        _, grad = objective_grad(problem, th)
        eq = problem.eq_mask
        names = tuple(c.name for c in problem.constraints)
        _check_finite_derivatives(grad, gval, G, names)
        # feasibility is a KKT condition at tol like the others; active_tol only classifies rows as active
        viol = np.where(eq, np.abs(gval), np.maximum(gval, 0.0))
        if np.any(viol > tol):
            j = int(np.argmax(viol))
            raise ProblemError(f"not a KKT point: constraint {names[j]!r} is violated (g = {gval[j]:.3e} "
                               f"{'!= 0' if eq[j] else '> 0'}: feasibility residual {viol[j]:.3e} exceeds tol = "
                               f"{tol:g}); train to feasibility first (dif.solve) or pass a looser tol")
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
            if max(kkt_residuals(grad, G, gval, lam, eq).values(), default=0.0) > tol:
                # the rows within active_tol do not make θ stationary: a binding row that a point trained to
                # tolerance left more than active_tol inside is a candidate as well, wherever its multiplier can
                # meet complementarity to tol; one that takes a clear multiplier is active, as with given λ
                lam_c, cand = _complementary_multipliers(grad, G, gval, eq, tol)
                wider = active | (cand & (lam_c > mult_tol))
                if np.any(wider != active):
                    lam_w = _nnls_multipliers(grad, G, wider, eq)
                    if max(kkt_residuals(grad, G, gval, lam_w, eq).values(), default=0.0) < \
                            max(kkt_residuals(grad, G, gval, lam, eq).values(), default=0.0):
                        lam, active = lam_w, wider
        res = kkt_residuals(grad, G, gval, lam, eq)
        if max(res.values(), default=0.0) > tol:
            best = max(res.values(), default=0.0)
            raise ProblemError(
                f"not a KKT point: stationarity residual {res['stationarity']:.3e}, feasibility "
                f"{res['feasibility']:.3e}, complementarity {res['complementarity']:.3e}, dual {res['dual']:.3e}: "
                f"the largest exceeds tol = {tol:g}"
                + (f" even with the best non-negative multipliers found (KKT residual {best:.3e}), on the rows "
                   f"within active_tol = {active_tol:g} and on every inequality whose multiplier can meet "
                   "complementarity to tol" if polished else " with the given multipliers")
                + "; train further (polyproj.adapters.dif.solve), pass the multipliers of the training (lambdas) "
                  "or a larger active_tol (rows counted active), or a looser tol")
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
        ambiguous = _scale_ambiguity(names, status, lam, gval, G, grad, th, tol=tol, active_tol=active_tol,
                                     mult_tol=mult_tol) if warn else ""
        if ambiguous:
            warnings.warn(ambiguous, PolyprojWarning, stacklevel=2)
        missed = _missed_rows(names, status, res, grad, G, gval, eq, tol=tol, active_tol=active_tol,
                              mult_tol=mult_tol) if warn else ""
        if missed:
            warnings.warn(missed, PolyprojWarning, stacklevel=2)
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
            Passed to :meth:`from_params` (``active_tol``, ``mult_tol``, ``polish``, ``warn``), with or without
            ``refine``: the refined point is classified with ``active_tol`` and ``mult_tol`` and its multipliers
            are polished when ``polish=True``. Any other keyword is a :class:`ProblemError`.
        """
        from .cooper import cooper_multipliers

        if "polish" in kwargs:  # checked here too: the refined path reads it only where it is True
            kwargs["polish"] = check_flag(kwargs["polish"], "polish", none=True)
        unknown = [k for k in kwargs if k not in _FROM_PARAMS_OPTIONS]
        if unknown:  # checked before any work, whatever ``refine`` (a misspelt mult_tol must not pass unread)
            hints = "".join(close_matches(k, _FROM_PARAMS_OPTIONS) for k in unknown)
            raise ProblemError(f"KKTPoint.from_cooper: unknown keyword(s) {unknown}.{hints} It takes tol, refine "
                               f"and the options of from_params: {', '.join(_FROM_PARAMS_OPTIONS)}")
        lam = cooper_multipliers(problem, cmp)
        if refine:
            # solve checks tol, active_tol and mult_tol as from_params does, and classifies the refined point
            # with them; its multipliers meet tol already, so the NNLS polish runs only when asked for
            opts = {k: kwargs[k] for k in ("active_tol", "mult_tol", "warn") if k in kwargs}
            k = solve(problem, theta0=_flat_theta(problem, model), lambdas0=lam, tol=tol, **opts)
            if kwargs.get("polish") is True:
                info = k.info
                k = cls.from_params(problem, k.theta, k.lambdas, tol=tol, **kwargs)
                k.info.update({key: v for key, v in info.items() if key not in k.info})
            k.info["from_cooper"] = {"lambdas": lam.tolist(), "refined": True}
            return k
        k = cls.from_params(problem, model, lam, tol=tol, **kwargs)
        k.info["from_cooper"] = {"lambdas": lam.tolist(), "refined": False}
        return k


#: the keyword options of :meth:`KKTPoint.from_params` that :meth:`KKTPoint.from_cooper` passes on
_FROM_PARAMS_OPTIONS = ("active_tol", "mult_tol", "polish", "warn")


def check_flag(value: Any, name: str, *, none: bool = False) -> bool | None:
    """A flag argument as a bool: True or False (a NumPy bool too), or None where ``none`` allows it.

    Anything else is a :class:`ProblemError`: a truthy string ("no") or number would silently mean True.
    One check for every flag of the DIF adapter (``renormalize``, ``progress``, ``polish``, ``warn``).
    """
    if value is None and none:
        return None
    if not isinstance(value, (bool, np.bool_)):
        raise ProblemError(f"{name} must be True{', False or None' if none else ' or False'}, got {value!r}")
    return bool(value)


def _check_tolerances(**tols: Any) -> None:
    """Each tolerance a positive finite number (NaN would accept any point)."""
    for name, v in tols.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0.0 < v < np.inf:
            raise ProblemError(f"{name} must be a positive finite number, got {v!r}")


#: :meth:`KKTPoint.from_params` calls a weakly active row's classification scale-ambiguous where its multiplier
#: carries at least this share of the objective's gradient, λⱼ‖∇gⱼ‖₂ >= SCALE_SHARE·‖∇f₀(θ̄)‖₂ (and more than the
#: point's ``tol`` of stationarity: λⱼ‖∇gⱼ‖∞ > tol, so that λⱼ is not rounding)
SCALE_SHARE = 1e-3
#: ... and an active row's, where |gⱼ| <= active_tol but its hyperplane gⱼ + ∇gⱼᵀδ = 0 is at least this times
#: (1 + ‖θ̄‖₂) away in θ: |gⱼ| / ‖∇gⱼ‖₂ >= SCALE_DISTANCE·(1 + ‖θ̄‖₂)
SCALE_DISTANCE = 1e-3
#: the default active_tol and mult_tol: what a problem at unit scale calls a zero slack and a zero multiplier. Only
#: values below them are suspected of being small for the problem's scale alone (a λ of 0.117 that the user's
#: mult_tol = 10 calls weakly active is a choice, not an accident of scale)
UNIT_ACTIVE_TOL, UNIT_MULT_TOL = 1e-6, 1e-7


def _scale_ambiguity(names: tuple[str, ...], status: tuple[str, ...], lam: np.ndarray, g: np.ndarray, G: np.ndarray,
                     grad: np.ndarray, theta: torch.Tensor, *, tol: float, active_tol: float,
                     mult_tol: float) -> str:
    """A warning's text where the classification depends on the absolute thresholds' scale ('' where not).

    ``mult_tol`` is in the units of λ and ``active_tol`` in those of g, so a problem far from unit scale can be
    misclassified by the defaults: an objective multiplied by 1e-8 has every multiplier 1e-8 times smaller, and a
    binding row (λ = 1.6e-8) is called weakly active; a constraint multiplied by 1e-8 has its slack 1e-8 times
    smaller, and an inactive row (g = −5e-10) is counted active. Two tests, free of the problem's scale, with the
    derivatives at θ̄ the caller has (no further work):

    * a row called weakly active with a multiplier small in absolute terms (0 < λⱼ <= min(mult_tol,
      UNIT_MULT_TOL)) that still balances a share of the objective's gradient, λⱼ‖∇gⱼ‖₂ >= SCALE_SHARE·‖∇f₀‖₂,
      beyond the point's own stationarity tolerance (λⱼ‖∇gⱼ‖∞ > tol: λⱼ is not rounding, and setting it to 0
      would break stationarity): binding at the problem's own scale;
    * a row counted active by a slack small in absolute terms (0 < |gⱼ| <= min(active_tol, UNIT_ACTIVE_TOL))
      whose linearised hyperplane is far from θ̄, |gⱼ|/‖∇gⱼ‖₂ >= SCALE_DISTANCE·(1 + ‖θ̄‖₂): a step of that
      length moves θ without reaching it (inactive at the constraint's own scale). A row with ∇gⱼ = 0 constrains
      no step and is left alone.

    A threshold raised above the unit-scale default on purpose (``mult_tol=1e-5`` for tiny multipliers) is the
    user's choice and is not questioned: only values the default itself would call zero are.
    """
    shares = np.linalg.norm(G, axis=1) * lam if G.size else np.zeros(len(names))
    gnorm = float(np.linalg.norm(grad))
    reach = SCALE_DISTANCE * (1.0 + float(torch.linalg.vector_norm(theta)))
    parts, weak_lams, far_gs = [], [], []
    for j, st in enumerate(status):
        if st == WEAK and 0.0 < lam[j] <= UNIT_MULT_TOL and gnorm > 0.0 and shares[j] >= SCALE_SHARE * gnorm and \
                lam[j] * float(np.abs(G[j]).max(initial=0.0)) > tol:
            weak_lams.append(float(lam[j]))
            parts.append(f"{names[j]!r} is called weakly active (λ = {lam[j]:.3g} <= mult_tol = {mult_tol:g}) though "
                         f"its multiplier balances {shares[j] / gnorm:.0%} of ‖∇f₀‖")
        if st in (BINDING, WEAK) and 0.0 < abs(g[j]) <= min(active_tol, UNIT_ACTIVE_TOL):
            gj = float(np.linalg.norm(G[j]))
            if gj > 0.0 and abs(g[j]) >= reach * gj:
                far_gs.append(abs(float(g[j])))
                parts.append(f"{names[j]!r} is counted active (|g| = {abs(g[j]):.3g} <= active_tol = {active_tol:g}) "
                             f"though its linearised boundary is {abs(g[j]) / gj:.3g} away in θ")
    if not parts:
        return ""
    fix = []
    if weak_lams:
        fix.append(f"mult_tol below those multipliers (e.g. mult_tol={min(weak_lams) / 10:.1e}) to call them binding")
    if far_gs:
        fix.append(f"active_tol below those slacks (e.g. active_tol={min(far_gs) / 10:.1e}) to call them inactive")
    return ("the classification of the constraints depends on the scale of the absolute tolerances (is the problem "
            "far from unit scale?): " + "; ".join(parts) + ". Pass " + " and ".join(fix) + " (to solve or "
            "KKTPoint.from_params), sized to the problem's units (docs/dif.md, 'Tolerances'): a misclassified row "
            "blocks a direction that retraining moves along, or frees one it keeps, and ω is wrong along it")


def _flat_lambdas(problem: ConstrainedProblem, lambdas: Any, what: str) -> np.ndarray:
    """Multipliers (a tensor on any device, an array, a list) as a new float64 array of m finite numbers.

    A wrong count and a non-finite value are told apart: NaN multipliers of the right shape are not a shape error.
    """
    if isinstance(lambdas, torch.Tensor) and lambdas.is_meta:
        raise ProblemError(f"{what} are on the 'meta' device: they have a shape but no values")
    try:
        raw = np.array(lambdas.detach().cpu().numpy() if isinstance(lambdas, torch.Tensor) else lambdas,
                       dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ProblemError(f"{what} must be {problem.m} numbers (one per constraint), got "
                           f"{type(lambdas).__name__}: {exc}") from None
    lam = raw.reshape(-1)
    if lam.shape != (problem.m,):
        raise ProblemError(f"{what} must be {problem.m} numbers (one per constraint), got {lam.size} "
                           f"(shape {raw.shape})")
    bad = np.flatnonzero(~np.isfinite(lam))
    if bad.size:
        j = int(bad[0])
        raise ProblemError(f"{what} must be finite: {what}[{j}] (constraint {problem.constraints[j].name!r}) is "
                           f"{lam[j]}" + (f", and {bad.size - 1} more" if bad.size > 1 else ""))
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
            theta = torch.from_numpy(own_contiguous(np.asarray(theta, dtype=np.float64)))  # (a read-only array too)
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


#: :func:`_missed_rows` calls a row's multiplier missed where it lowers the stationarity residual by this factor
MISSED_GAIN = 10.0


def _complementary_multipliers(grad: np.ndarray, G: np.ndarray, g: np.ndarray, eq: np.ndarray,
                               tol: float) -> tuple[np.ndarray, np.ndarray]:
    """The NNLS multipliers over every row whose multiplier meets complementarity to ``tol``, and those rows.

    A point trained to tolerance (``tol``) may leave a binding row gⱼ ~ tol/λⱼ inside, beyond ``active_tol``; any
    inequality is a candidate while its multiplier keeps λⱼ|gⱼ| <= tol. Starting from every row, the NNLS on
    stationarity runs over the candidates and the rows whose multiplier breaks complementarity (λⱼ|gⱼ| > tol) are
    dropped, until none is (each round drops one at least: at most m + 1 rounds). Returns (λ (m,), candidates).
    """
    cand = np.ones(G.shape[0], dtype=bool)
    lam = np.zeros(G.shape[0])
    for _ in range(G.shape[0] + 1):
        lam = _nnls_multipliers(grad, G, cand, eq)
        over = cand & ~eq & (np.abs(lam * g) > tol)
        if not over.any():
            break
        cand &= ~over
    return lam, cand


def _missed_rows(names: tuple[str, ...], status: tuple[str, ...], res: dict[str, float], grad: np.ndarray,
                 G: np.ndarray, g: np.ndarray, eq: np.ndarray, *, tol: float, active_tol: float,
                 mult_tol: float) -> str:
    """A warning's text where an accepted point calls a row inactive that a multiplier would make stationary.

    With a loose ``tol`` a binding row left inside by more than ``active_tol`` is accepted as inactive (λ = 0) while
    the stationarity residual stays at the size of that row's share of ∇f₀: the DIF is then the classic IF along it.
    Called so where the candidates' multipliers (:func:`_complementary_multipliers`, complementarity to tol) lower
    the stationarity residual by ``MISSED_GAIN`` at least, and give the row a multiplier that is binding (above
    ``mult_tol``) and carries a share of the objective's gradient (λⱼ‖∇gⱼ‖₂ >= SCALE_SHARE·‖∇f₀‖₂, as in
    :func:`_scale_ambiguity`); '' otherwise.
    """
    out = [j for j, st in enumerate(status) if st == INACTIVE]
    if not out or not res["stationarity"] > 0.0:
        return ""
    lam_c, _ = _complementary_multipliers(grad, G, g, eq, tol)
    stat_c = kkt_residuals(grad, G, g, lam_c, eq)["stationarity"]
    if not stat_c * MISSED_GAIN <= res["stationarity"]:
        return ""
    gnorm = float(np.linalg.norm(grad))
    rows = [j for j in out if lam_c[j] > mult_tol and lam_c[j] * float(np.linalg.norm(G[j])) >= SCALE_SHARE * gnorm]
    if not rows:
        return ""
    what = ", ".join(f"{names[j]!r} (g = {g[j]:.3g}, λ = {lam_c[j]:.3g})" for j in rows)
    slack = max(abs(float(g[j])) for j in rows)
    return (f"constraint(s) {what} are called inactive (slack beyond active_tol = {active_tol:g}) though those "
            f"multipliers would lower the stationarity residual from {res['stationarity']:.3e} to {stat_c:.3e} "
            f"with complementarity within tol = {tol:g}: binding rows that training left slightly inside, accepted "
            "because tol is loose. The DIF treats them as absent (the classic IF along them); pass the training's "
            f"multipliers (lambdas), active_tol above the slack (e.g. active_tol={2 * slack:.1e}), or a tighter tol")


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

#: the SQP has diverged once its KKT residual exceeds this multiple of the smallest it has reached. A ratio, so free
#: of the problem's scale: the SQP runs of the test suite that converge rise at most ~14× above their best, while a
#: runaway of the multipliers (each QP's multipliers a multiple of the last: see :func:`solve`) passes 10⁸ within a
#: few iterations.
SQP_DIVERGED = 1e8

#: the largest shift (a multiple of ‖H‖) that the SQP's convexification may use: at this shift the step is short and
#: close to steepest descent, so one that still lowers no merit along it shows that the SQP has stalled
_MAX_SHIFT = 1e4


class _SQPStalled(SolverError):
    """The SQP stopped short of a KKT point in a way the augmented Lagrangian may get past.

    No step lowers the merit, the iteration diverged, or it reached non-finite values (``solve(method="auto")``
    then falls back on the augmented Lagrangian). ``what`` says what happened, ``hint`` what may be wrong
    (infeasible constraints: the violation where it stopped).
    """

    def __init__(self, what: str, hint: str) -> None:
        super().__init__(f"{what}; {hint}. method='auglag' (the augmented Lagrangian) may converge where the SQP "
                         "does not")
        self.what, self.hint = what, hint


def _violation_hint(problem: ConstrainedProblem, g: np.ndarray | None, tol: float) -> str:
    """Where the constraints are still clearly violated at ``g``: which, by how much, and that they may be infeasible.

    A solver cannot tell an infeasible problem from one it has not solved yet, so it says "may". '' when ``g`` is
    (nearly) feasible.
    """
    if g is None or g.size == 0:
        return ""
    viol = np.where(problem.eq_mask, np.abs(g), np.maximum(g, 0.0))
    if not np.all(np.isfinite(viol)) or float(viol.max()) <= max(1e3 * tol, 1e-6):
        return ""
    j = int(np.argmax(viol))
    # "may ... or not yet": a feasible problem the method has not converged on ends here too (a tanh MLP whose
    # equality any bias meets stalled at a violation of 3e-5), and the violation alone cannot tell the two apart
    return (f"the constraints are still violated by {float(viol.max()):.3e} (constraint "
            f"{problem.constraints[j].name!r}): they may have no common feasible point (check the τ's and the "
            "starting point), or the method has not reached one yet")


def _stall_hint(problem: ConstrainedProblem, g: np.ndarray | None, tol: float) -> str:
    return _violation_hint(problem, g, tol) or ("the constraints may have no common feasible point (check the "
                                                "τ's), or the SQP does not converge from this start")


def _check_max_iter(max_iter: Any) -> int:
    """``max_iter`` as a positive int (0 would return an unchecked start; 2.5 counts no iterations)."""
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ProblemError(f"max_iter must be a positive integer, got {max_iter!r}")
    return int(max_iter)




def _check_backend(backend: Any, settings: dict[str, Any]) -> None:
    """Resolve the QP backend with its settings now, for every method.

    An unknown name (``BackendNotFound``) or setting (``SettingsError``) is refused before any work, whether or not
    a QP is ever solved: the SQP's first QP (or a converged start, or the augmented Lagrangian, which solves none)
    would otherwise decide whether a misspelt name is noticed. ``eps_abs`` defaults as in ``solve_qp_exact``, so
    the settings are checked as the QPs will get them. A known backend whose package is missing is refused where a
    QP is solved, as before (the augmented Lagrangian needs none).
    """
    from ...registry import get_backend

    try:
        get_backend(backend, **{"eps_abs": 1e-10, **settings})
    except BackendUnavailable:
        pass


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
    A direction along which the line search finds no decrease is not taken: the shift is raised and
    the QP solved again, and once the shift is at its cap the SQP has *stalled*. Far from feasibility
    the SQP can also *diverge*: H carries λⱼ∇²gⱼ, so while the line search keeps the steps short of a
    violated constraint, each QP's multipliers can come out a multiple of the last ones and the
    multipliers, and H with them, grow geometrically (×2 to ×10 an iteration on a small tanh net whose
    group-risk cap is near the lowest risk reachable); a KKT residual above ``SQP_DIVERGED`` times the
    smallest one reached, or a non-finite H, gradient, step or multiplier, stops it.

    ``method="auglag"`` (default above): the PHR augmented Lagrangian with L-BFGS inner solves to
    residual 1e-7, then Newton on the working set's KKT system by MINRES on Hessian-vector products
    to ``tol`` (:mod:`polyproj.adapters.dif.newton`); H is never formed.

    ``method="auto"``: the SQP up to ``SQP_MAX_DIM``, and where it stalls or diverges the augmented
    Lagrangian from the same start (its penalty globalises without QP multipliers), then the SQP
    again from the augmented Lagrangian's point; the returned point says so (``info["method"]`` is
    ``"auglag+sqp"``, ``info["sqp_failure"]`` the first SQP's failure) and a :class:`PolyprojWarning`
    is issued (with ``warn``).

    Parameters
    ----------
    problem : ConstrainedProblem
    theta0 : tensor, optional
        Start (default ``problem.theta0``).
    lambdas0 : array-like, optional
    tol : float
        Target KKT residual (inf-norm of stationarity, feasibility, complementarity). Absolute, in the units of
        ∇f₀ and g: scale it with a problem far from unit scale (docs/dif.md, "Tolerances"). A start whose residual
        is within ``tol`` is returned as it is; where it is not a minimiser at the problem's own scale (a step
        from it, sized by the curvature there, would move θ by more than ``START_STEP``·(1 + ‖θ‖)) a
        :class:`PolyprojWarning` says so and suggests a tol (``info["accepted_start"]`` has the numbers).
    max_iter : int
        A positive integer: SQP iterations (QP subproblems), or Newton iterations after the augmented
        Lagrangian.
    backend : str or QPSolver
        The SQP's QP solver, resolved with ``settings`` up front for every method: an unknown name or
        setting raises ``BackendNotFound`` / ``SettingsError`` even where no QP is solved.
    active_tol, mult_tol, warn : as :meth:`KKTPoint.from_params`
    method : {"auto", "sqp", "auglag"}
    chunk_size : int, optional
        Samples per chunk of gradients and Hessian-vector products (the augmented Lagrangian); a
        positive integer, as in ``DIF(chunk_size=...)``.
    **settings : QP solver settings

    Returns
    -------
    KKTPoint

    Raises
    ------
    ProblemError
        An invalid argument, or a start where the gradients are not finite.
    SolverError
        The QP subproblem is infeasible, the SQP stalled or diverged (after the fallback, with
        ``method="auto"``), or the iteration does not reach ``tol``.
    """
    t0 = time.perf_counter()
    _check_tolerances(tol=tol, active_tol=active_tol, mult_tol=mult_tol)
    warn = check_flag(warn, "warn")
    max_iter = _check_max_iter(max_iter)
    th = _flat_theta(problem, problem.theta0 if theta0 is None else theta0)
    lam = np.zeros(problem.m) if lambdas0 is None else _flat_lambdas(problem, lambdas0, "lambdas0")
    if method not in ("auto", "sqp", "auglag"):
        raise ProblemError(f"method must be 'auto', 'sqp' or 'auglag', got {method!r}")
    chunk = chunk_size_arg(chunk_size, DEFAULT_CHUNK)
    _check_backend(backend, settings)
    opts = {"tol": tol, "max_iter": max_iter, "active_tol": active_tol}
    if method == "auglag" or (method == "auto" and problem.dim > SQP_MAX_DIM):
        kkt = _solve_auglag(problem, th, lam, mult_tol=mult_tol, warn=warn, chunk_size=chunk, t0=t0, **opts)
    else:
        try:
            th_k, lam_k, it, res = _sqp(problem, th, lam, backend=backend, settings=settings, users_start=True,
                                        **opts)
        except _SQPStalled as failure:
            if method == "sqp":  # the user's error is a SolverError (the subclass only marks what auto falls back on)
                raise SolverError(str(failure)) from None
            kkt = _auglag_fallback(problem, th, lam, failure, backend=backend, settings=settings, mult_tol=mult_tol,
                                   warn=warn, chunk_size=chunk, t0=t0, **opts)
        else:
            kkt = KKTPoint.from_params(problem, th_k, lam_k, tol=max(tol, 10 * res), active_tol=active_tol,
                                       mult_tol=mult_tol, polish=False, warn=warn)
            kkt.info.update(iterations=it, time=time.perf_counter() - t0, method="sqp")
    start = _accepted_start(problem, kkt, th, tol, chunk)
    if start is not None:
        kkt.info["accepted_start"] = start
        if warn:
            warnings.warn("solve " + start["message"], PolyprojWarning, stacklevel=2)
    return kkt


#: solve and retrain warn where they return their start unmoved while a step along the start's (projected) KKT
#: residual, sized by the curvature there, would move θ by more than this times (1 + ‖θ‖₂): tol is absolute, and
#: on a problem at a small scale the start's residual is within it before any iteration
START_STEP = 1e-4


def _accepted_start(problem: ConstrainedProblem, kkt: KKTPoint, th0: torch.Tensor, tol: float,
                    chunk_size: int) -> dict[str, Any] | None:
    """Where :func:`solve` took no step (θ is its start) although its start is not a minimiser at the problem's scale.

    tol is absolute (in the units of ∇f₀): an objective multiplied by 1e-11 has a residual of ~1e-11 anywhere, and
    the start passed as "converged" (θ0 returned; a retraining warm-started from θ̄ moved θ by exactly 0, the truth
    0.155). The start's residual alone cannot tell that from a start that *is* a KKT point (a re-solve from θ̄ after
    a removal that leaves it optimal, a refined Cooper point), nor can ∇f₀ (nonzero at every binding row). The step
    can: r, the stationarity residual ∇f₀ + Gᵀλ projected off the active rows' gradients (the directions left
    free), and κ = rᵀHr/rᵀr its curvature (one Hessian-vector product) give the length ‖r‖/κ of the minimising step
    along −r — a lower bound on the Newton step, and free of the problem's scale. A point converged to a tol that
    suits its scale has it of the order of tol/κ; one accepted only because the problem is small has it of the
    order of the distance to the solution. Returns None where the step is below ``START_STEP``·(1 + ‖θ‖₂), θ
    moved, ∇f₀ = 0, or r has no positive curvature to size a step by; else the numbers and the warning's text.
    """
    from .hvp import HessianOperator

    if not torch.equal(kkt.theta, th0):
        return None
    _, grad = objective_grad(problem, th0)
    if not np.any(grad):
        return None
    G = constraint_jacobian(problem, th0)[1]
    lam = kkt.lambdas.numpy()
    r = grad + G.T @ lam
    GA = G[[st != INACTIVE for st in kkt.status]]
    if GA.shape[0]:
        r = r - GA.T @ np.linalg.lstsq(GA.T, r, rcond=None)[0]
    rr = float(r @ r)
    if not 0.0 < rr < np.inf:
        return None
    curv = float(r @ HessianOperator(problem, th0, lam, chunk_size=chunk_size).matvec(r)) / rr
    if not 0.0 < curv < np.inf:
        return None
    scale = 1.0 + float(torch.linalg.vector_norm(th0))
    step = float(np.sqrt(rr)) / curv
    if step <= START_STEP * scale:
        return None
    # the residual at which the same curvature gives a step of 1e-10 (1 + ‖θ‖): tol's default at unit scale
    suggested = curv * 1e-10 * scale
    message = (f"stopped at its start, with no iteration taken: the KKT residual there ({kkt.residual:.3e}) is "
               f"already within tol ({tol:g}), though the objective's gradient is not zero (‖∇f₀‖∞ = "
               f"{float(np.abs(grad).max()):.3e}) and a step along the residual, sized by the curvature there "
               f"({curv:.3e}), would move θ by {step:.3e}. tol is absolute (in the units of ∇f₀): pass a smaller tol "
               f"for a problem of this scale (about tol={suggested:.0e} asks for θ to 1e-10 relative here; "
               "docs/dif.md, 'Tolerances')")
    return {"residual": kkt.residual, "gradient": float(np.abs(grad).max()), "curvature": curv, "step": step,
            "suggested_tol": suggested, "message": message}


def _sqp(problem: ConstrainedProblem, th: torch.Tensor, lam: np.ndarray, *, tol: float, max_iter: int, backend: Any,
         active_tol: float, settings: dict[str, Any],
         users_start: bool) -> tuple[torch.Tensor, np.ndarray, int, float]:
    """The SQP of :func:`solve` from (θ, λ): (θ, λ, iterations, KKT residual) of a point that meets ``tol``.

    Raises :class:`_SQPStalled` (no descent, divergence, non-finite values), a ``SolverError`` (a QP subproblem
    without a solution, ``max_iter`` spent) or, at a start of the user's (``users_start``) where the gradients
    are not finite, a ``ProblemError``.
    """
    eq = problem.eq_mask
    names = tuple(c.name for c in problem.constraints)
    res, shift, best, g_best, moved = np.inf, 1e-4, np.inf, None, True
    for it in range(1, max_iter + 1):
        if moved:  # a rejected step leaves θ, λ and their derivatives as they were
            _, grad = objective_grad(problem, th)
            gval, G = constraint_jacobian(problem, th)
            if not (np.all(np.isfinite(grad)) and np.all(np.isfinite(gval)) and np.all(np.isfinite(G))):
                if it == 1 and users_start:
                    _check_finite_derivatives(grad, gval, G, names)
                raise _SQPStalled(f"the SQP reached a point where the gradients are not finite (iteration {it})",
                                  _stall_hint(problem, g_best, tol))
            res = max(kkt_residuals(grad, G, gval, lam, eq).values(), default=0.0)
            if res <= tol:
                return th, lam, it, res
            if not res < SQP_DIVERGED * best:  # NaN too
                raise _SQPStalled(f"the SQP diverged: its KKT residual grew from {best:.3e} to {res:.3e} by iteration "
                                  f"{it}, the multipliers to {float(np.max(np.abs(lam), initial=0.0)):.3e}",
                                  _stall_hint(problem, gval, tol))
            if res < best:
                best, g_best = res, gval
            H = lagrangian_hessian(problem, th, lam)
            if not np.all(np.isfinite(H)):
                raise _SQPStalled(f"the SQP diverged: the Hessian of the Lagrangian is not finite at iteration {it}",
                                  _stall_hint(problem, gval, tol))
        sol = None
        work = eq | (lam > 0) | (gval >= -active_tol)
        for _ in range(6 + problem.m):  # convexify the QP; a subproblem still reported unbounded gets a larger shift
            try:
                Hq, q = _convexified(H, grad, G, gval, work, shift)
            except np.linalg.LinAlgError as exc:  # an eigensolver that fails on a finite but huge H
                raise _SQPStalled(f"the SQP diverged: the eigenvalues of the Hessian of the Lagrangian (largest entry "
                                  f"{float(np.max(np.abs(H))):.3e}) could not be computed at iteration {it} ({exc})",
                                  _stall_hint(problem, gval, tol)) from None
            sol = solve_qp_exact(Hq, q, G, -gval, eq, backend=backend, **settings)
            if sol.status is not Status.DUAL_INFEASIBLE:
                # The augmented-Lagrangian term ρ/2‖G_W d + g_W‖² leaves the QP's solution alone only on rows the
                # solution keeps at equality. An inequality row in W only by its multiplier (λⱼ > 0 while θ is
                # strictly inside it: a warm start's multiplier on a row the removal made inactive) that the
                # solution leaves inside too (G_j d + g_j < 0) had the term pull d towards its boundary, off the
                # QP's solution: the step ascended the merit and a warm-started re-solve crawled at its start's
                # residual for max_iter. Such rows leave W and the QP is solved again. (Rows violated or active at
                # θ keep the term: there it pulls an overshooting linearisation back towards the boundary.)
                # ``_convexified`` returns ``grad`` itself where it added no term: then nothing to correct.
                inside = (work & ~eq & (gval < -active_tol) & (G @ sol.x + gval < -active_tol)
                          if sol.status.ok and q is not grad else None)
                if inside is None or not inside.any():
                    break
                work = work & ~inside
                continue
            shift *= 100.0
        if not sol.status.ok:
            raise SolverError(f"SQP iteration {it}: the QP subproblem returned {sol.status.name} "
                              f"({sol.status.message}); the linearised constraints admit no step: check that the "
                              "constraints are feasible, or start from a feasible point")
        d, lam_new = sol.x, np.where(eq, sol.z, np.maximum(sol.z, 0.0))
        if not (np.all(np.isfinite(d)) and np.all(np.isfinite(lam_new))):
            raise _SQPStalled(f"the SQP diverged: the QP subproblem's step or multipliers are not finite at "
                              f"iteration {it}", _stall_hint(problem, gval, tol))
        nu = 2.0 * float(np.max(np.abs(lam_new), initial=0.0)) + 1e-8
        phi0 = _merit(problem, th, nu, eq)
        slope = float(grad @ d) - nu * float(np.sum(np.where(eq, np.abs(gval), np.maximum(gval, 0.0))))
        alpha, dt = 1.0, torch.as_tensor(d)
        for _ in range(40):
            if _merit(problem, th + alpha * dt, nu, eq) <= phi0 + 1e-4 * alpha * min(slope, 0.0) + 1e-14 * abs(phi0):
                break
            alpha *= 0.5
        else:
            # no decrease of the merit (beyond rounding) even at α = 2⁻⁴⁰: the step is not taken. A larger shift
            # gives a shorter step nearer steepest descent of the Lagrangian, which is tried next; at the cap no
            # descent is left to find from here
            if shift >= _MAX_SHIFT:
                raise _SQPStalled(f"the SQP stalled at iteration {it}: no step along its direction lowers the ℓ₁ "
                                  f"merit, even at the largest convexification shift (KKT residual {res:.3e})",
                                  _stall_hint(problem, gval, tol))
            shift, moved = min(shift * 10.0, _MAX_SHIFT), False
            continue
        th = th + alpha * dt
        lam = lam + alpha * (lam_new - lam)
        shift = max(shift * 0.3, 1e-10) if alpha == 1.0 else min(shift * 10.0, _MAX_SHIFT) if alpha < 0.1 else shift
        moved = True
    if moved:
        _, grad = objective_grad(problem, th)
        gval, G = constraint_jacobian(problem, th)
        res = max(kkt_residuals(grad, G, gval, lam, eq).values(), default=0.0)
        if res <= tol:
            return th, lam, max_iter, res
    stationarity = kkt_residuals(grad, G, gval, lam, eq)["stationarity"]
    hint = _violation_hint(problem, gval, tol) or _curvature_hint(H, stationarity, tol)
    raise SolverError(f"SQP did not reach the KKT residual {tol:g} in {max_iter} iterations (residual {res:.3e}); "
                      + (hint + ", or " if hint else "") + "raise max_iter or loosen tol")


def _curvature_hint(H: np.ndarray, stationarity: float, tol: float) -> str:
    """Where the Hessian of the Lagrangian vanishes while its gradient does not: a loss without curvature.

    Zero next to the gradient's size (an L1 loss, a hinge on a linear model, a linear objective): the
    SQP's steps are then ruled by its convexification shift alone, and a minimum, if any, sits on a kink
    where no gradient vanishes. ``H`` is the last one the SQP formed (at most one iterate old);
    ``stationarity``: ‖∇f₀ + Gᵀλ‖∞ there (:func:`~polyproj.adapters.dif.newton.kkt_residuals`). '' otherwise.
    """
    if not stationarity > tol or float(np.max(np.abs(H), initial=0.0)) > 1e-12 * stationarity:
        return ""
    return ("the Hessian of the Lagrangian is zero at the last iterates while its gradient is not: a loss "
            "without curvature (|r|, a hinge on a linear model, a linear objective) has no smooth KKT point for "
            "the SQP to converge to (a minimum, if any, sits on a kink) and DIF, which needs second derivatives, "
            "does not apply; use a twice-differentiable loss (e.g. Huber, smooth L1)")


def _auglag_fallback(problem: ConstrainedProblem, th0: torch.Tensor, lam0: np.ndarray, failure: _SQPStalled, *,
                     tol: float, max_iter: int, backend: Any, active_tol: float, mult_tol: float, warn: bool,
                     chunk_size: int, settings: dict[str, Any], t0: float) -> KKTPoint:
    """``method="auto"`` after the SQP stalled or diverged: the augmented Lagrangian, then the SQP from its point.

    The augmented Lagrangian starts where the SQP did (its diverged iterates are dropped) and updates λ by its
    first-order rule λ ← [λ + ρg]₊ between inner minimisations, so it does not take the QP multipliers whose
    runaway made the SQP diverge; near a KKT point the SQP converges quadratically, and at d <= SQP_MAX_DIM it is
    the better local method (on a small tanh net with a binding group risk, Newton-MINRES from the same point
    stalled at 3.6e-9, the SQP reached 3e-12).
    """
    from .newton import augmented_lagrangian

    th, lam, info = augmented_lagrangian(problem, th0, lam0, tol=max(tol, 1e-7), chunk_size=chunk_size)
    try:
        th, lam, it, res = _sqp(problem, th, lam, tol=tol, max_iter=max_iter, backend=backend, active_tol=active_tol,
                                settings=settings, users_start=False)
    except SolverError as exc:
        again = exc.what if isinstance(exc, _SQPStalled) else str(exc)
        g = problem.constraint_values(th).detach().numpy() if problem.m else np.zeros(0)
        hint = _violation_hint(problem, g, tol) or failure.hint
        raise SolverError(f"{failure.what}; the fallback on the augmented Lagrangian from the same start, then the "
                          f"SQP from its point, did not converge either ({again}); {hint}") from None
    if warn:
        warnings.warn(f"solve: {failure.what}; fell back on the augmented Lagrangian from the same start, then the "
                      f"SQP from its point, which reached the KKT residual {res:.2e}", PolyprojWarning, stacklevel=3)
    kkt = KKTPoint.from_params(problem, th, lam, tol=max(tol, 10 * res), active_tol=active_tol, mult_tol=mult_tol,
                               polish=False, warn=warn)
    kkt.info.update(iterations=it, time=time.perf_counter() - t0, method="auglag+sqp", sqp_failure=str(failure),
                    auglag=info)
    return kkt


def _solve_auglag(problem: ConstrainedProblem, th: torch.Tensor, lam: np.ndarray, *, tol: float, max_iter: int,
                  active_tol: float, mult_tol: float, warn: bool, chunk_size: int, t0: float) -> KKTPoint:
    from .newton import augmented_lagrangian, newton_kkt

    th, lam, info = augmented_lagrangian(problem, th, lam, tol=max(tol, 1e-7), chunk_size=chunk_size)
    res = info.residuals[-1] if info.residuals else np.inf
    newton = None
    if res > tol:
        th, lam, newton = newton_kkt(problem, th, lam, tol=tol, max_iter=max_iter, active_tol=active_tol,
                                     chunk_size=chunk_size)
        res = newton.residuals[-1]
    if res > tol:
        g = problem.constraint_values(th).numpy() if problem.m else np.zeros(0)
        hint = _violation_hint(problem, g, tol)
        raise SolverError(f"the augmented Lagrangian + Newton-MINRES did not reach the KKT residual {tol:g} "
                          f"(residual {res:.3e}); " + (hint + ", or " if hint else "") + "raise max_iter or loosen tol")
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
