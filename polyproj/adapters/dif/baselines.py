"""Baselines under the DIF calling convention: classic IF, Penalty-IF, and retraining (ground truth).

* :func:`classic_if` ignores the constraints: ω = −(∇²f₀)⁻¹c₀ with c₀ = −(1/N₀)Σ_{z∈Zʳ}∇ℓ₀(z, θ̄)
  (Koh & Liang). It leaves the feasible set whenever a constraint is binding.
* :func:`penalty_if` is the IF of a penalised objective F_ρ = f₀ + ρ·Σⱼ p(gⱼ) at θ̄, with the
  penalty engaged on the active constraints: quadratic p(g) = ½g² (H += ρ∇g∇gᵀ + ρg∇²g,
  c += ρ(g c_g + r ∇g)) or hinge p(g) = max(g, 0) (H += ρ∇²g, c += ρ c_g). Its accuracy depends on ρ.
* :func:`retrain` re-solves the problem without the removed samples (SQP to ``tol``), warm-started
  from the KKT point, optionally on any ``concurrent.futures.Executor`` (e.g. a Dask cluster's
  ``client.get_executor()``).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

import numpy as np
import torch

from ...errors import PolyprojWarning, ProblemError
from ...runtime import map_jobs
from .calculus import lagrangian_hessian
from .engine import _as_removals, check_damping, check_maxiter, check_rtol
from .hvp import DEFAULT_CHUNK, chunk_size_arg
from .kkt import INACTIVE, KKTPoint, check_flag, solve
from .krylov import check_krylov
from .linearisation import Linearisation
from .problem import ConstrainedProblem, Removal

__all__ = ["classic_if", "if_scores", "penalty_if", "retrain", "tracin_scores"]


def _solve_sym(H: np.ndarray, C: np.ndarray) -> np.ndarray:
    try:
        return -np.linalg.solve(H, C.T).T
    except np.linalg.LinAlgError:
        return -np.linalg.lstsq(H, C.T, rcond=None)[0].T


def _stack(rows: list[np.ndarray], single: bool, d: int) -> torch.Tensor:
    arr = np.array(rows).reshape(-1, d)
    return torch.as_tensor(arr[0] if single else arr)


#: the penalties of Penalty-IF (:func:`penalty_if`, ``if_scores(kind="penalty")``)
PENALTIES = ("quadratic", "hinge")


def _check_penalty(penalty: Any, rho: Any) -> float:
    """Penalty-IF's ``penalty`` and ``rho``, checked; ρ as a float.

    ``penalty``: one of :data:`PENALTIES` (a typo must not fall to another penalty); ``rho``: a positive finite
    number, a 0-d tensor or array counting as its number.
    """
    if not isinstance(penalty, str) or penalty not in PENALTIES:
        raise ProblemError(f"penalty must be 'quadratic' or 'hinge', got {penalty!r}")
    if isinstance(rho, (torch.Tensor, np.ndarray)) and rho.ndim == 0:
        rho = rho.item()
    if isinstance(rho, bool) or not isinstance(rho, (int, float, np.integer, np.floating)) or not 0 < rho < np.inf:
        raise ProblemError(f"rho must be a positive finite number (the penalty weight), got {rho!r}")
    return float(rho)


def classic_if(problem: ConstrainedProblem, kkt: KKTPoint, removal: Removal | Sequence[Removal], *,
               damping: float = 0.0) -> torch.Tensor:
    """Classic influence function, constraints ignored: Δθ = −(∇²f₀ + damping·I)⁻¹c₀.

    Parameters
    ----------
    problem, kkt : the problem and its KKT point
    removal : mapping ``{"objective": indices, ...}`` or a list of them (constraint entries are ignored)
    damping : float
        A finite number >= 0 added to the Hessian's diagonal.

    Returns
    -------
    torch.Tensor (d,) or (k, d)
    """
    damping = check_damping(damping, auto=False)
    lin = Linearisation(problem, kkt, hessian="objective")
    removals, single = _as_removals(removal)
    if len(removals) > 1:
        lin.precompute()
    H = lin.H + damping * np.eye(problem.dim)
    C = np.array([lin.removal_terms(r, renormalize=False)[0] for r in removals]).reshape(-1, problem.dim)
    return _stack(list(_solve_sym(H, C)), single, problem.dim)


def penalty_if(problem: ConstrainedProblem, kkt: KKTPoint, removal: Removal | Sequence[Removal], rho: float, *,
               penalty: str = "quadratic", damping: float = 0.0, renormalize: bool = True) -> torch.Tensor:
    """Influence function of the penalised objective f₀ + ρ·Σ p(gⱼ) at θ̄ (penalty on active constraints).

    Parameters
    ----------
    problem, kkt, removal : as :func:`classic_if`
    rho : float > 0
        Penalty weight (sweep it: the answer depends on it).
    penalty : {"quadratic", "hinge"}
    damping : float
        A finite number >= 0 added to the Hessian's diagonal.
    renormalize : bool
        Removal semantics of the constraint terms (as :class:`DIF`).

    Returns
    -------
    torch.Tensor (d,) or (k, d)
    """
    rho = _check_penalty(penalty, rho)
    damping = check_damping(damping, auto=False)
    renormalize = check_flag(renormalize, "renormalize")
    lin = Linearisation(problem, kkt, hessian="objective")
    act = np.array([s != INACTIVE for s in kkt.status], dtype=bool)
    g = np.where(act, lin.g, 0.0)
    Ga = lin.G[act]
    if penalty == "quadratic":
        H = lagrangian_hessian(problem, lin.theta, rho * g) + rho * Ga.T @ Ga
    else:
        H = lagrangian_hessian(problem, lin.theta, rho * act.astype(float))
    H = H + damping * np.eye(problem.dim)
    removals, single = _as_removals(removal)
    if len(removals) > 1:
        lin.precompute()
    rows = []
    for rem in removals:
        c0, _, _ = lin.removal_terms(rem, renormalize=False)
        _, cc, r = lin.removal_terms(rem, renormalize=renormalize)
        if penalty == "quadratic":
            c = c0 + rho * (g @ cc + (r * act) @ lin.G)
        else:
            c = c0 + rho * (act.astype(float) @ cc)
        rows.append(c)
    return _stack(list(_solve_sym(H, np.array(rows).reshape(-1, problem.dim))), single, problem.dim)


def _retrain_one(problem: ConstrainedProblem, theta0: torch.Tensor, lam0: torch.Tensor, kw: dict[str, Any],
                 removal: Removal) -> KKTPoint:
    return solve(problem.remove(removal), theta0=theta0, lambdas0=lam0, **kw)


def retrain(problem: ConstrainedProblem, removal: Removal | Sequence[Removal], warm_start: KKTPoint | None = None,
            executor: Executor | None = None, *, tol: float = 1e-10, progress: bool | None = None,
            **solve_kw: Any) -> KKTPoint | list[KKTPoint]:
    """Ground truth: re-solve the problem without the removed samples, to KKT residual ``tol``.

    Parameters
    ----------
    problem : ConstrainedProblem
    removal : mapping or list of mappings
        One removal gives one :class:`KKTPoint`; a list gives a list (leave-one-out: one per point).
    warm_start : KKTPoint, optional
        Start of each re-solve (θ̄, λ̄); default ``problem.theta0``.
    executor : concurrent.futures.Executor, optional
        Runs the re-solves with ``executor.map`` (threads, processes, or a Dask cluster via
        ``distributed.Client.get_executor()``). The problem must be picklable for process pools.
    tol : float
        KKT residual of each re-solve (default 1e-10). Absolute, in the units of ∇f₀ and g, as in
        :func:`~polyproj.adapters.dif.solve`: a re-solve whose warm start is already within it returns that start,
        and where the start is not a minimiser at the problem's own scale (a loss of scale 1e-10) a
        :class:`PolyprojWarning` says how many re-solves did so and suggests a smaller tol.
    progress : bool, optional
        Progress bar (default: for 50 or more removals without an executor).
    **solve_kw : passed to :func:`polyproj.adapters.dif.solve` (backend, max_iter, ...)

    Returns
    -------
    KKTPoint or list of KKTPoint
    """
    removals, single = _as_removals(removal)
    progress = check_flag(progress, "progress", none=True)
    for rem in removals:  # fail early, before any work is sent away
        problem.check_removal(rem)
    if warm_start is not None and not isinstance(warm_start, KKTPoint):
        raise ProblemError(f"warm_start must be a KKTPoint (dif.solve or KKTPoint.from_params) or None, got "
                           f"{type(warm_start).__name__}")
    th0 = warm_start.theta if warm_start is not None else problem.theta0
    lam0 = warm_start.lambdas if warm_start is not None else None
    kw = {"tol": tol, "warn": False, **solve_kw}
    job = functools.partial(_retrain_one, problem, th0, lam0, kw)
    out = map_jobs(job, removals, executor=executor, progress=progress, bar_from=50, description="retraining")
    # solve's own warning is off (warn=False, unless passed): a re-solve that returned its start unmoved while it
    # is not a minimiser at the problem's scale (tol absolute, the loss small) is told here, once for the call
    stuck = [i for i, k in enumerate(out) if "accepted_start" in k.info]
    if stuck and not kw["warn"]:
        first = out[stuck[0]].info["accepted_start"]
        warnings.warn(f"retrain: re-solve #{stuck[0]} " + first["message"] + f" ({len(stuck)} of {len(out)} "
                      "re-solves stopped at their start so)", PolyprojWarning, stacklevel=2)
    return out[0] if single else out


# ----------------------------------------------------------------------------- matrix-free scores
def _single_removals(problem: ConstrainedProblem, removals: Sequence[Removal] | None) -> list[Removal]:
    return list(removals) if removals is not None else \
        [{"objective": [i]} for i in range(problem.objective.n_samples)]


def _projected_terms(problem, kkt, lin, basis: np.ndarray, removals: list[Removal], chunk_size: int,
                     renormalize: bool):
    """Per removal: (c₀, c_constraints, r) projected on the columns of ``basis``."""
    from .linearisation import removal_terms
    from .scores import ProjectedGradients

    checked = [problem.check_removal(r) for r in removals]
    src = ProjectedGradients(problem, kkt.theta, basis, lin.grad_f0 @ basis, lin.G @ basis, chunk_size)
    src.fill(checked)
    return [removal_terms(problem, lin.g, src, rem, renormalize=renormalize) for rem in checked]


def if_scores(problem: ConstrainedProblem, kkt: KKTPoint, test_fn, removals: Sequence[Removal] | None = None, *,
              kind: str = "classic", rho: float = 1.0, penalty: str = "quadratic", damping: float = 0.0,
              krylov: str = "cg", rtol: float = 1e-8, maxiter: int | None = None,
              chunk_size: int = 1024, renormalize: bool = True, preconditioner=None) -> tuple[np.ndarray, list]:
    """Matrix-free test-loss scores ∇Fᵀω of classic IF (``kind="classic"``) or Penalty-IF (``"penalty"``).

    ω = −H⁻¹c as in :func:`classic_if` / :func:`penalty_if`, with H applied by Hessian-vector
    products and s = H⁻¹∇F solved once (CG or MINRES), so a score is −sᵀc, linear in the removed
    samples' gradients. ``preconditioner`` (≈ H⁻¹, SPD) is passed to the Krylov method. ``rho`` and
    ``penalty`` (used with ``kind="penalty"``) are checked as in :func:`penalty_if`; ``damping`` (a number
    >= 0), ``krylov``, ``rtol`` and ``maxiter`` as in :class:`~polyproj.adapters.dif.DIF`.
    Returns (scores (n,), Krylov log).
    """
    from .engine import _test_grad
    from .hvp import HessianOperator
    from .matfree import KrylovInverse

    if kind not in ("classic", "penalty"):
        raise ProblemError(f"kind must be 'classic' or 'penalty', got {kind!r}")
    if kind == "penalty":
        rho = _check_penalty(penalty, rho)
    damping = check_damping(damping, auto=False)
    renormalize = check_flag(renormalize, "renormalize")
    chunk_size = chunk_size_arg(chunk_size, DEFAULT_CHUNK)
    check_krylov(krylov)
    check_rtol(rtol)
    check_maxiter(maxiter)
    lin = Linearisation(problem, kkt, hessian="objective")
    act = np.array([s != INACTIVE for s in kkt.status], dtype=bool)
    g = np.where(act, lin.g, 0.0)
    if kind == "classic":
        op = HessianOperator(problem, kkt.theta, np.zeros(problem.m), damping=damping, chunk_size=chunk_size)
    elif penalty == "quadratic":
        op = HessianOperator(problem, kkt.theta, rho * g, damping=damping, low_rank=np.sqrt(rho) * lin.G[act],
                             chunk_size=chunk_size)
    else:
        op = HessianOperator(problem, kkt.theta, rho * act.astype(float), damping=damping, chunk_size=chunk_size)
    inv = KrylovInverse(op, krylov, rtol, maxiter, preconditioner)
    s = inv.solve(_test_grad(problem, test_fn, kkt.theta).numpy(), "s = H⁻¹∇F")
    rems = _single_removals(problem, removals)
    plain = _projected_terms(problem, kkt, lin, s[:, None], rems, chunk_size, renormalize=False)
    out = np.empty(len(rems))
    if kind == "classic":
        out[:] = [-(c0[0]) for c0, _, _ in plain]
        return out, inv.log
    ren = _projected_terms(problem, kkt, lin, s[:, None], rems, chunk_size, renormalize=renormalize)
    Gs = lin.G @ s
    for i, ((c0, _, _), (_, cc, r)) in enumerate(zip(plain, ren, strict=True)):
        c = c0[0] + rho * (g @ cc[:, 0] + (r * act) @ Gs) if penalty == "quadratic" else \
            c0[0] + rho * (act.astype(float) @ cc[:, 0])
        out[i] = -c
    return out, inv.log


def tracin_scores(problem: ConstrainedProblem, checkpoints: Sequence[tuple[Any, Any]], test_fn,
                  removals: Sequence[Removal] | None = None, *, weights: Sequence[float] | None = None,
                  chunk_size: int = 1024) -> np.ndarray:
    """Constrained TracIn: Σ_c η_c ∇F(θ_c)ᵀ ∇_θ[removed samples' share of L(θ_c, λ_c)].

    For a removal R: Σ_c η_c ∇F(θ_c)ᵀ (Σ_{z∈R₀} ∇ℓ₀(z)/N₀ + Σⱼ λ_cⱼ Σ_{z∈Rⱼ} ∇ℓⱼ(z)/Nⱼ) — the first-order
    change of F that the removed samples' gradient steps caused along training (Pruthi et al., with
    the Lagrangian's gradient), signed as a predicted change of F on removal. ``checkpoints`` are
    (θ_c, λ_c) pairs; ``weights`` the learning rates η_c (default 1): one finite number per checkpoint.
    ``chunk_size``: a positive integer, samples per chunk of per-sample gradients (as in :func:`if_scores`).
    """
    from .engine import _test_grad
    from .linearisation import loss_weights
    from .scores import ProjectedGradients

    chunk_size = chunk_size_arg(chunk_size, DEFAULT_CHUNK)
    rems = [problem.check_removal(r) for r in _single_removals(problem, removals)]
    checkpoints = _checked_checkpoints(problem, checkpoints)
    try:
        w = np.ones(len(checkpoints)) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise ProblemError(f"weights: one finite learning rate per checkpoint ({len(checkpoints)}), got "
                           f"{type(weights).__name__} {weights!r:.60}: {exc}") from None
    if w.shape != (len(checkpoints),) or not np.all(np.isfinite(w)):
        raise ProblemError(f"weights: one finite learning rate per checkpoint ({len(checkpoints)}), got {w.shape[0]} "
                           "values" + ("" if np.all(np.isfinite(w)) else " with NaN or inf"))
    out = np.zeros(len(rems))
    for eta, (th, lam) in zip(w, checkpoints, strict=True):
        gF = _test_grad(problem, test_fn, th).numpy()[:, None]
        src = ProjectedGradients(problem, th, gF, np.zeros(1), np.zeros((problem.m, 1)), chunk_size)
        src.fill(rems)
        coef = {"objective": 1.0, **{c.name: float(lam[j]) for j, c in enumerate(problem.constraints)}}
        for i, rem in enumerate(rems):
            for name, idx in rem.items():
                wts, W = loss_weights(problem, name)
                out[i] += eta * coef[name] * float(wts[idx] @ src.sample_data(name, idx)[0][:, 0]) / W
    return out


def _checked_checkpoints(problem: ConstrainedProblem, checkpoints: Any) -> list[tuple[torch.Tensor, np.ndarray]]:
    """(θ_c, λ_c) pairs as float64 θ (d,) and λ (m,) (None: zeros); a KKTPoint counts as its (θ̄, λ̄)."""
    from .kkt import KKTPoint, _flat_lambdas, _flat_theta

    if isinstance(checkpoints, KKTPoint):
        checkpoints = [checkpoints]
    out = []
    for c, item in enumerate(checkpoints):
        if isinstance(item, KKTPoint):
            item = (item.theta, item.lambdas)
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ProblemError(f"checkpoint {c}: a (θ, λ) pair (λ may be None) or a KKTPoint, got "
                               f"{type(item).__name__}")
        th, lam = item
        try:
            out.append((_flat_theta(problem, th),
                        np.zeros(problem.m) if lam is None else _flat_lambdas(problem, lam, "λ")))
        except ProblemError as exc:
            raise ProblemError(f"checkpoint {c}: {exc}") from None
    return out
