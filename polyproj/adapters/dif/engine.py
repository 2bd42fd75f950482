"""The DIF engine: directional influence functions, by the exact (dense) or the matrix-free path.

``DIF(problem, kkt, method=...)``:

* ``"dense"`` forms H = ∇²f₀ + Σ λ̄ⱼ∇²gⱼ by ``torch.func`` once; each removal is one QP in ω
  solved by any registered backend (then polished exactly); all-point scores send one batch of QPs
  sharing H and the active rows to the backend's ``solve_batch``.
* ``"matrix-free"`` never forms H: H·v by forward-over-reverse, H⁻¹ by CG/MINRES, the QP by its
  Schur complement over the active rows (:mod:`polyproj.adapters.dif.matfree`); all-point scores
  project vmapped per-sample gradients on [H⁻¹∇F, H⁻¹C_Aᵀ] (:mod:`polyproj.adapters.dif.scores`).
* ``"auto"`` (default): dense for d <= ``DENSE_MAX_DIM``, matrix-free above.

``rule`` says what a removal is:

* ``"derivative"`` (default, the paper's DIF): the directional derivative of θ in the removal's
  direction. Binding rows stay at equality (their multiplier change μⱼ is free), weakly active rows
  keep ∇gⱼᵀω + rⱼ <= 0 with μⱼ >= 0, inactive rows are ignored.
* ``"finite"``: the removal as a finite step, the linearised KKT system of the removed problem with its
  complementarity kept at the step's end. Every inequality row j keeps gⱼ + ∇gⱼᵀω + rⱼ <= 0 (gⱼ = 0 on
  the rows active at θ̄) and λ̄ⱼ + μⱼ >= 0, so a binding row whose multiplier the removal uses up is
  released and an inactive row the step reaches becomes active. In primal form: the QP over every
  constraint with the linear term c − Σⱼ λ̄ⱼ∇gⱼ, whose multipliers are the new λ̄ + μ. It equals the
  derivative wherever no row changes status, needs no binding / weakly active threshold, and costs one
  more solve with H per inactive constraint.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
import torch

from ...errors import ProblemError, SolverError
from ...runtime import map_jobs
from ...solution import Status
from .hvp import DEFAULT_CHUNK, HessianOperator, chunk_size_arg
from .kkt import BINDING, EQUALITY, WEAK, KKTPoint, check_flag
from .krylov import SINGULAR_CURVATURE, IndefiniteHessianError, KrylovNotConvergedError, check_krylov
from .linearisation import Linearisation, check_split
from .matfree import DenseInverse, DualQP, KrylovInverse, null_basis, reduced_curvature
from .problem import ConstrainedProblem, Removal, placement_error, sample_indices
from .scores import ScoreJob
from .second_order import MIN_STEP

__all__ = ["AUTO_MAX_CONDITION", "DENSE_BATCH_BYTES", "DENSE_MAX_DIM", "DIF", "DIFResult", "Linearisation",
           "auto_damping_for", "clear_of_singular", "dense_batch_size"]


#: steps (first order) and corrections (second) at most this times (1 + ‖θ̄‖) are rounding, not a removal's effect
ROUNDING_STEP = 1e-10
#: order-2 answers warn where θ̄'s own correction (the empty removal's second-order ω, a move towards the KKT point
#: that θ̄'s residual says it is near, which every order-2 answer includes) exceeds this times (1 + ‖θ̄‖₂), a hundred
#: times ROUNDING_STEP (below which a second-order step is rounding) ...
OWN_CORRECTION = 1e-8
#: ... and this share of the second-order correction ‖ω₂ − ω₁‖ of one of the call's removals (what order 2 adds)
OWN_SHARE = 0.1
_NOT_APPLIED = ("the second-order correction lowers the removed problem's KKT residual at no step length down to "
                f"1/{1 / MIN_STEP:g} (outside the expansion's range around θ̄)")


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
    order : int
        1: the directional derivative; 2: with the second-order correction (``DIF.result(..., order=2)``),
        where ``constraint_change`` is g(θ̄ + ω) − g(θ̄) of the removed problem and ``multipliers``
        the predicted change of λ.
    correction_ratio : float or None
        With ``order=2`` asked: ‖δ‖/‖ω₁‖, the full second-order correction against the first-order
        step (above 1: the removal is at the edge of the expansion's range, where the full step
        overshoots and a shorter one is usually taken).
    step_length : float or None
        With ``order=2`` asked: the fraction t of the correction applied (ω = ω₁ + tδ), the largest of
        1, ½, …, 1/16 that lowers the removed problem's KKT residual
        (:mod:`~polyproj.adapters.dif.second_order`); 0 where none does: the correction is not applied
        and the result is the first-order one (``order`` 1). None for a removal that moves nothing.
    correction_norm : float or None
        With ``order=2`` applied: ‖ω − ω₁‖ = t‖δ‖, what the second-order correction added. None otherwise.
    """

    omega: torch.Tensor
    status: Status
    constraint_change: np.ndarray
    active: tuple[str, ...]
    multipliers: np.ndarray
    order: int = 1
    correction_ratio: float | None = None
    step_length: float | None = None
    correction_norm: float | None = None


def _check_order(order: Any) -> int:
    if isinstance(order, bool) or order not in (1, 2):
        raise ProblemError(f"order must be 1 (the directional derivative) or 2 (with one second-order "
                           f"correction), got {order!r}")
    return int(order)


def _as_removals(removal: Removal | Sequence[Removal]) -> tuple[list[Removal], bool]:
    if isinstance(removal, Mapping):
        return [removal], True
    if isinstance(removal, Sequence) and all(isinstance(r, Mapping) for r in removal):
        return list(removal), False
    raise ProblemError("removal must be a mapping {loss name: indices} or a list of such mappings, "
                       f"got {type(removal).__name__}")


# ----------------------------------------------------------------------------- argument checks
# One place for the Krylov and damping arguments of DIF and of the baselines (classic_if, penalty_if, if_scores);
# ``krylov`` by :func:`~polyproj.adapters.dif.krylov.check_krylov`.
def check_damping(damping: Any, *, auto: bool = True) -> float | str:
    """``damping``: a finite number >= 0 (a 0-d tensor or array counts as its number), or ``"auto"`` where allowed."""
    also = " or 'auto'" if auto else ""
    if isinstance(damping, (torch.Tensor, np.ndarray)) and damping.ndim == 0:  # a 0-d tensor or array: its number
        damping = damping.item()
    if isinstance(damping, str):
        if auto and damping == "auto":
            return damping
        raise ProblemError(f"damping must be a number >= 0{also}, got {damping!r}")
    if (isinstance(damping, bool) or not isinstance(damping, (int, float, np.integer, np.floating))
            or not np.isfinite(damping) or damping < 0):
        raise ProblemError(f"damping must be a finite number >= 0{also}, got {damping!r}")
    return float(damping)


def check_rtol(rtol: Any) -> float:
    """``rtol`` of the Krylov solves: a number in (0, 1)."""
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float, np.floating)) or not 0 < rtol < 1:
        raise ProblemError(f"rtol must be a number in (0, 1), got {rtol!r}")
    return float(rtol)


def check_maxiter(maxiter: Any) -> int | None:
    """``maxiter`` of the Krylov solves: a positive integer, or None (the solver's default)."""
    if maxiter is not None and (isinstance(maxiter, bool) or not isinstance(maxiter, (int, np.integer))
                                or maxiter < 1):
        raise ProblemError(f"maxiter must be a positive integer or None, got {maxiter!r}")
    return None if maxiter is None else int(maxiter)


#: dual QPs of second-order steps kept for reuse (row sets and their free rows; least recently used dropped)
STEP_DUALS_KEPT = 64
#: largest d for which ``method="auto"`` forms H (a d × d float64 matrix and its factor)
DENSE_MAX_DIM = 1000
#: ``damping="auto"`` keeps the condition number of H + δI at most this. A singular or nearly singular
#: positive semidefinite H (an over-parameterised net's; least squares with dependent features) otherwise
#: gets the stationarity floor alone, often ~1e-14: solves with H + 1e-14 I amplify rounding in null(H) by
#: 1e14 (a digits-sized study: ω off by 5 %), and CG cannot reach its tolerance at all
AUTO_MAX_CONDITION = 1e8


def auto_damping_for(floor: float, lo: float, hi: float) -> float:
    """``damping="auto"`` for an H with extreme eigenvalues (or curvature bounds) ``lo <= hi``.

    A positive definite H, ``lo`` above rounding (:data:`~polyproj.adapters.dif.krylov.SINGULAR_CURVATURE`
    × ``hi``), gets ``floor`` (the KKT point's stationarity residual) alone, however ill-conditioned: its
    answer is the exact one. A singular one (``lo`` at rounding) or an indefinite one gets the largest of
    ``floor``, ``1.1·(−lo)`` (past the most negative curvature) and ``hi /`` :data:`AUTO_MAX_CONDITION`.
    """
    if lo > SINGULAR_CURVATURE * hi:
        return float(floor)
    return max(float(floor), 1.1 * max(-lo, 0.0), hi / AUTO_MAX_CONDITION)

def clear_of_singular(damping: float, w: np.ndarray) -> float:
    """The least δ >= ``damping`` with every |wᵢ + δ| >= max|w| / :data:`AUTO_MAX_CONDITION` (w: H's eigenvalues).

    The dense DIF QP needs H positive definite on the binding rows' null space only (it adds ρ C_BᵀC_B), but
    the paths through the Schur complement (an executor's scores, ``order=2``) solve with H + δI itself: an
    eigenvalue of H within rounding of −δ (zero curvature along a constrained direction) made that solve
    singular and their answers 11 % off the in-process ones. An indefinite H + δI clear of zero is solved (LU).
    """
    thr = float(np.max(np.abs(w), initial=0.0)) / AUTO_MAX_CONDITION
    for _ in range(w.size + 1):  # each round moves every eigenvalue in the band above it
        near = np.abs(w + damping) < thr
        if not near.any():
            break
        damping = float(np.max(-w[near])) + thr
    return float(damping)


#: memory the dense path's batches of DIF QPs may take at once: a backend's batch (ProxSuite's BatchQP) holds
#: its own copy of H and its factorisation per element, ~6 d² doubles, so all-point scores go in chunks of
#: dense_batch_size(d)
DENSE_BATCH_BYTES = 512 * 2**20


def dense_batch_size(d: int) -> int:
    """DIF QPs per backend batch on the dense path: :data:`DENSE_BATCH_BYTES` at 8 d² doubles an element."""
    return max(1, int(DENSE_BATCH_BYTES // (64 * d * d)))


def _more_damping(damping: float, err: Exception) -> float | None:
    """The next damping of ``damping="auto"`` on the matrix-free path after ``err``, or None (give up: raise it).

    A direction of non-positive curvature (:class:`IndefiniteHessianError`, the curvature of H + δI): past it,
    at least doubling, and bounding the condition number as the dense rule does (:func:`auto_damping_for`).
    A solve short of rtol (:class:`KrylovNotConvergedError`: CG's true residual stalls near eps·cond(H + δI),
    a (nearly) singular H): :data:`AUTO_MAX_CONDITION` at first, then ten times more a round, never past the
    largest curvature seen (the answer would be mostly the damping's).
    """
    if isinstance(err, IndefiniteHessianError):
        return max(2.0 * damping, damping + 1.5 * -err.curvature + 1e-12, err.max_curvature / AUTO_MAX_CONDITION)
    top = err.info.max_curvature
    if not top > 0 or damping >= top or not _stalled(err.info):
        return None
    return min(top, max(10.0 * damping, top / AUTO_MAX_CONDITION))


#: a Krylov solve short of rtol counts as stalled at rounding — H + δI too ill-conditioned for rtol, which
#: ``damping="auto"`` cures — when its true residual is within this factor of eps·κ, κ the largest over the
#: smallest curvature it met (a lower bound on the condition number). A residual above that means the solve
#: ran out of iterations (``maxiter``) on a well-conditioned H: raised, not hidden under a damping (a cap of
#: 10 iterations had "auto" add 4.0 to an H of eigenvalues 1.9e-3…9.9 and flip the scores' signs)
STALL_FACTOR = 1e4


def _stalled(info: Any) -> bool:
    """True when the :class:`KrylovInfo` of a solve short of rtol is a stall at rounding (:data:`STALL_FACTOR`)."""
    low = info.min_curvature
    if not low > 0:
        return True
    return info.residual <= STALL_FACTOR * np.finfo(np.float64).eps * info.max_curvature / low


METHODS = ("auto", "dense", "matrix-free")
RULES = ("derivative", "finite")


class DIF:
    """Directional influence functions at a KKT point.

    Parameters
    ----------
    problem : ConstrainedProblem
    kkt : KKTPoint
    backend : str or QPSolver
        Any registered backend (default ``"proxsuite"``) for the DIF QP (dense path) or its small
        dual QP (matrix-free path); the answer is then polished exactly.
    damping : float or "auto"
        Adds ``damping·I`` to H (singular, ill-conditioned or indefinite Hessians). ``"auto"``: the
        KKT point's stationarity residual as a floor, raised above the most negative curvature that
        CG meets (matrix-free) or the most negative eigenvalue (dense); the value used is
        ``self.damping``. See docs/dif.md, "Damping".
    method : {"auto", "dense", "matrix-free"}
        ``"auto"``: dense for d <= ``DENSE_MAX_DIM`` (1000), matrix-free above.
    rule : {"derivative", "finite"}
        ``"derivative"`` (default): the directional derivative (the paper's DIF). ``"finite"``: the
        removal as a finite step, binding rows released when their multiplier would turn negative and
        inactive rows joining when reached (module docstring; docs/dif.md, "Finite removals").
    renormalize : bool
        Default True: a removal means what retraining means (every loss stays a mean over what
        remains; rⱼ includes ℓ̄ⱼ − ℓⱼ(z)). False: the paper's plain Δε = −1/Nⱼ (a τ-shifted problem).
    krylov : {"cg", "minres"}
        Matrix-free solves with H. CG stops with :class:`IndefiniteHessianError` on a direction of
        non-positive curvature; MINRES accepts an indefinite non-singular H.
    rtol, maxiter : float, int
        Relative residual and iteration cap of every Krylov solve (``self.krylov_log`` has the
        residuals and iteration counts).
    chunk_size : int, optional
        Samples per chunk of Hessian-vector products and per-sample gradients (bounds memory).
    preconditioner : LinearOperator, callable v -> M v, or d × d matrix, optional
        Matrix-free: an SPD approximation of H⁻¹ for the Krylov solves (same answers, fewer
        iterations), e.g. a factorised Hessian of a nearby point. Each product is checked (shape,
        finite); a preconditioner MINRES finds indefinite is a ProblemError.
    **settings
        QP solver settings (default ``eps_abs=1e-10``).

    Examples
    --------
    >>> dif = DIF(problem, kkt)                                    # doctest: +SKIP
    >>> dif.delta_theta({"objective": [3, 17], "group": [2]})      # doctest: +SKIP
    >>> scores = dif.influence(lambda th: test_loss(th))           # doctest: +SKIP
    """

    def __init__(self, problem: ConstrainedProblem, kkt: KKTPoint, backend: Any = "proxsuite",
                 damping: float | str = 0.0, *, method: str = "auto", rule: str = "derivative",
                 renormalize: bool = True, krylov: str = "cg",
                 rtol: float = 1e-10, maxiter: int | None = None, chunk_size: int | None = None,
                 preconditioner: Any = None, **settings: Any) -> None:
        if method not in METHODS:
            raise ProblemError(f"method must be one of {METHODS}, got {method!r}")
        if rule not in RULES:
            raise ProblemError(f"rule must be one of {RULES}, got {rule!r}")
        check_krylov(krylov)
        renormalize = check_flag(renormalize, "renormalize")
        damping = check_damping(damping)
        auto_damping = damping == "auto"
        check_rtol(rtol)
        check_maxiter(maxiter)
        if preconditioner is not None and not callable(preconditioner) and \
                not isinstance(preconditioner, spla.LinearOperator) and \
                not (isinstance(preconditioner, np.ndarray) and preconditioner.ndim == 2) and \
                not sp.issparse(preconditioner):
            raise ProblemError("preconditioner must be a callable v -> M v (M ≈ H⁻¹, symmetric positive definite), a "
                               f"scipy LinearOperator or a d × d matrix, got {type(preconditioner).__name__}")
        if isinstance(backend, str):  # a misspelt backend fails here, not at the first weakly active removal
            from ...registry import get_backend

            get_backend(backend, **settings)
        self.lin = Linearisation(problem, kkt)
        _check_point(problem, kkt, self.lin)
        self.problem, self.kkt = problem, kkt
        self.backend, self.renormalize, self.settings = backend, bool(renormalize), settings
        self.method = ("dense" if problem.dim <= DENSE_MAX_DIM else "matrix-free") if method == "auto" else method
        self.V: np.ndarray | None = None  # H⁻¹C_Aᵀ: at once on the matrix-free path, on first use on the dense
        self.chunk_size = chunk_size_arg(chunk_size, DEFAULT_CHUNK)
        self.rule = rule
        st = kkt.status
        active = np.array([s in (BINDING, EQUALITY, WEAK) for s in st], dtype=bool)
        if rule == "finite":
            # every constraint; free multipliers on equalities only, the others floored at −λ̄ⱼ
            self.rows = np.arange(problem.m, dtype=np.int64)
            self.row_eq = np.asarray(problem.eq_mask, dtype=bool).copy()
            self.floor = np.where(self.row_eq, 0.0, np.maximum(self.lin.lam, 0.0))
            #: the QP's bound is u = u0 − r: u0 = −gⱼ(θ̄) on rows inactive at θ̄, 0 on active ones
            self.u0 = np.where(active, 0.0, -self.lin.g)
        else:
            self.rows = np.flatnonzero(active).astype(np.int64)
            self.row_eq = np.array([st[j] != WEAK for j in self.rows], dtype=bool)
            self.floor = np.zeros(self.rows.size)
            self.u0 = np.zeros(self.rows.size)
        self.C = self.lin.G[self.rows]
        #: (m, k) the directions λ̄ may move along at θ̄ (left null vectors of the active gradients: LICQ fails)
        # (a row called weakly active has λ̄ⱼ = 0: a multiplier the split cannot take below zero)
        at_zero = np.array([s == WEAK for s in st], dtype=bool)
        self._ambiguous = _multiplier_null_space(self.lin.G, active, at_zero)
        #: the dense QP's linear term is c − Cᵀλ̄ under the finite rule (its multipliers are then λ̄ + μ)
        self._c_shift = self.floor @ self.C
        floor = kkt.suggested_damping if auto_damping else float(damping)
        if self.method == "dense":
            self.damping = floor
            if auto_damping:
                # the curvature the DIF needs is H's on the binding rows' null space (second-order sufficiency),
                # as MINRES checks it: negative curvature off it is the dense QP's own business (it adds
                # ρ C_BᵀC_B), and damping past the full H's most negative eigenvalue biased a well-posed DIF
                w_full = np.linalg.eigvalsh(self.lin.H)
                if self.row_eq.any():
                    Z = null_basis(self.C[self.row_eq], problem.dim)
                    w = np.linalg.eigvalsh(Z.T @ self.lin.H @ Z) if Z.shape[1] else np.array([np.inf, 0.0])
                else:  # no binding row: the null space is everything, Zᵀ H Z = H
                    w = w_full
                self.damping = clear_of_singular(auto_damping_for(floor, float(w[0]), float(w[-1])), w_full)
            self.H = self.lin.H + self.damping * np.eye(problem.dim)
            self._inv = DenseInverse(self.H)
        else:
            self._setup_matrix_free(floor, auto_damping, krylov, rtol, maxiter, preconditioner)
        self._dual: DualQP | None = None
        self._schur_checked = False  # dense: H⁻¹ allowed (_check_dense_schur)
        self._v_extra: dict[int, np.ndarray] = {}
        self._step_duals: dict[tuple, DualQP] = {}
        #: (‖δ‖/‖ω₁‖, step length t) of every second-order result, in order (t = 0: not applied)
        self.second_order_log: list[tuple[float, float | None]] = []
        self._own: tuple[float, float] | None = None  # (damping, ‖ω₂({})‖): _own_correction

    def _setup_matrix_free(self, damping: float, auto: bool, krylov: str, rtol: float, maxiter: int | None,
                           preconditioner: Any) -> None:
        """The operator, its inverse and V = H⁻¹Cᵀ at ``damping`` (raised under ``auto`` until H is usable).

        The engine's state changes only when all of it is ready, in one assignment: a re-damping interrupted
        (KeyboardInterrupt) or failed leaves the previous damping, inverse and V in force together.
        """
        label = "H⁻¹∇g_A" if self.rule == "derivative" else "H⁻¹∇g"
        for _ in range(20):
            op = HessianOperator(self.problem, self.kkt.theta, self.lin.lam, damping=damping,
                                 chunk_size=self.chunk_size)
            inv = KrylovInverse(op, krylov, rtol, maxiter, preconditioner)
            try:
                V = inv.solve_many(self.C, label)  # at once: CG meets H's negative curvature here
                if krylov == "minres":
                    self._check_second_order(op)
                break
            except (IndefiniteHessianError, KrylovNotConvergedError) as err:
                damping = _more_damping(damping, err) if auto else None
                if damping is None:
                    raise
        else:  # pragma: no cover - twenty rounds, each at least doubling
            raise SolverError("damping='auto' could not make H positive definite in 20 rounds")
        self._krylov_args, self._auto = (krylov, rtol, maxiter, preconditioner), auto
        self._inv, self.V, self.damping, self.op = inv, V, damping, op

    def _check_second_order(self, op: HessianOperator) -> None:
        """MINRES: refuse an H (+ damping) that is not positive definite on the binding rows' null space.

        CG meets such curvature itself; MINRES solves with any non-singular H and returned a saddle's ω as
        if it were a minimiser's (:func:`~polyproj.adapters.dif.matfree.reduced_curvature`). Raises
        :class:`IndefiniteHessianError` (``damping="auto"`` then damps past the curvature found).
        """
        low, top = reduced_curvature(op, self.C[self.row_eq])
        if np.isnan(low):
            import warnings

            from ...errors import PolyprojWarning

            warnings.warn("krylov='minres': Lanczos did not converge on H restricted to the binding rows' null "
                          "space, so second-order sufficiency (H positive definite there) is not verified",
                          PolyprojWarning, stacklevel=4)
        elif low <= SINGULAR_CURVATURE * max(top, 0.0):
            raise IndefiniteHessianError(
                f"the DIF is not defined here: H is not positive definite on the null space of the binding rows "
                f"(smallest curvature there {low:.3e}, largest {top:.3e}; second-order sufficiency fails, θ̄ is "
                "not a strict local minimiser). MINRES would solve with it and return a saddle's step: add "
                f"damping > {max(-low, 0.0) * 1.1 + 1e-12:.1e}, or damping='auto'", low, top)

    def _solve_h(self, b: np.ndarray, what: str) -> np.ndarray:
        """H⁻¹b, with ``damping="auto"`` kept in force after the setup.

        Matrix-free under ``damping="auto"``: a solve that meets curvature the setup's solves did not (e.g.
        s_test where no constraint is active, so the setup solved nothing) raises the damping by the setup's
        rules (:func:`_more_damping`), sets the path up again with it (V and the dual QPs anew, so every later
        answer uses one damping) and solves again.
        """
        if self.method == "dense" and not self._schur_checked:
            self._check_dense_schur()
        for _ in range(20):
            try:
                return self._inv.solve(b, what)
            except (IndefiniteHessianError, KrylovNotConvergedError) as err:
                damping = _more_damping(self.damping, err) if self.method != "dense" and self._auto else None
                if damping is None:
                    raise
                self._redamp(damping)
        raise SolverError("damping='auto' could not make H positive definite in 20 rounds")  # pragma: no cover

    def _check_dense_schur(self) -> None:
        """Dense path: refuse H⁻¹ where the DIF QP is refused (second-order sufficiency fails on null(C_B)).

        The paths through the Schur complement (score jobs, an executor's scores, ``order=2``) solve with H
        itself, which an LU factorisation does for any non-singular H: at a saddle they returned numbers where
        the QP path, by the same rule (:func:`~polyproj.adapters.dif.qp._convexified`), says the DIF QP is not
        convex.
        """
        from .qp import _convexified, _objective_scale

        if _convexified(self.H / _objective_scale(self.H), self.C, self.row_eq) is None:
            raise SolverError(_qp_failure(Status.NON_CONVEX))
        self._schur_checked = True

    def _redamp(self, damping: float) -> None:
        """Set the matrix-free path up again with ``damping`` (V and the dual QPs anew: later answers all use it)."""
        self._setup_matrix_free(damping, True, *self._krylov_args)
        self._dual, self._v_extra, self._step_duals = None, {}, {}

    # ------------------------------------------------------------------ shared pieces
    @property
    def krylov_log(self) -> list:
        """``[(what, KrylovInfo), ...]``: every Krylov solve (iterations, true relative residual)."""
        return list(self._inv.log)

    @property
    def dual(self) -> DualQP:
        """The dual QP over the active rows, S = C H⁻¹ Cᵀ (formed on first use)."""
        if self._dual is None:
            self._dual = DualQP.build(self.C @ self.active_solves, self.row_eq, self.backend, self.settings,
                                      floor=self.floor)
        return self._dual

    @property
    def active_solves(self) -> np.ndarray:
        """V = H⁻¹Cᵀ (d, k) of the QP's rows (the matrix-free path forms it at once, the dense on first use)."""
        if self.V is None:
            self.V = self._inv.solve_many(self.C, "H⁻¹∇g_A" if self.rule == "derivative" else "H⁻¹∇g")
        return self.V

    def constraint_solves(self, rows: np.ndarray, eq: np.ndarray) -> tuple[np.ndarray, DualQP]:
        """(H⁻¹C̄_Rᵀ (d, |R|), the dual QP over the rows R, free where ``eq``) for any constraints R.

        For second-order steps: the active rows' solves are ``V``'s; another row's is solved once and kept.
        """
        rows = np.asarray(rows, dtype=np.int64)
        pos = {int(j): i for i, j in enumerate(self.rows)}
        for j in rows:
            if int(j) not in pos and int(j) not in self._v_extra:
                solved = self._solve_h(self.lin.G[j], f"H⁻¹∇g[{int(j)}] (second order)")
                self._v_extra[int(j)] = solved  # after _solve_h: a re-damping there clears the dict
        V = self.active_solves  # after the solves: V of the damping they used
        VR = np.column_stack([V[:, pos[int(j)]] if int(j) in pos else self._v_extra[int(j)] for j in rows]) \
            if rows.size else np.zeros((self.problem.dim, 0))
        key = (tuple(int(j) for j in rows), tuple(bool(e) for e in eq))
        dual = self._step_duals.pop(key, None)  # re-inserted last: the dict's order is least recently used first
        if dual is None:
            dual = DualQP.build(self.lin.G[rows] @ VR, np.asarray(eq, dtype=bool), self.backend, self.settings)
            if len(self._step_duals) >= STEP_DUALS_KEPT:
                del self._step_duals[next(iter(self._step_duals))]
        self._step_duals[key] = dual
        return VR, dual

    def qp_data(self, removal: Removal) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(H, c, C, u, eq) of the DIF QP ``min cᵀω + ½ωᵀHω s.t. Cω = u (eq), Cω <= u`` (u = −r); dense only.

        Under ``rule="finite"`` c is shifted by −Cᵀλ̄ and u = u0 − r, so that the QP's multipliers are
        the new λ̄ + μ (module docstring).
        """
        if self.method != "dense":
            raise ProblemError("qp_data forms H: use method='dense'")
        c, r = self._terms(removal)
        return self.H, c - self._c_shift, self.C, self._bound(r), self.row_eq

    def _bound(self, r: np.ndarray) -> np.ndarray:
        """The bound u = u0 − r of the QP's rows, for r (m,) or (b, m)."""
        return self.u0 - r[..., self.rows]

    @property
    def _split(self) -> np.ndarray | None:
        """The multipliers' free directions whose use check_split refuses (the finite rule only), or None."""
        return self._ambiguous if self.rule == "finite" else None

    def _terms(self, removal: Removal) -> tuple[np.ndarray, np.ndarray]:
        c0, cc, r = self.lin.removal_terms(removal, renormalize=self.renormalize)
        # under the finite rule the answer's term λ̄ᵀ(Δ∇g) moves with the multipliers' split where LICQ fails
        check_split(self._split, cc, self.problem.names[1:])
        return c0 + self.lin.lam @ cc, r

    # ------------------------------------------------------------------ one removal
    def result(self, removal: Removal, order: int = 1, *, warn: bool = True) -> DIFResult:
        """The full :class:`DIFResult` for one removal (subset of samples, possibly of several losses).

        ``order=2`` adds one chord-Newton correction on the removed problem's exact KKT residual at
        θ̄ + ω, shortened where the full step does not lower that residual
        (:mod:`~polyproj.adapters.dif.second_order`): ω is then exact to second order in the removal's
        size, at the cost of one more solve with H and a pass over the data at θ̄ + ω and at each step
        length tried (one when the full step is taken) per removal.
        """
        order = _check_order(order)
        warn = check_flag(warn, "warn")
        if order == 2:
            res = self._at_one_damping(lambda: (self._own_correction(), self._result(removal, order))[1])
        else:
            res = self._at_one_damping(lambda: self._result(removal, order))
        if warn and order == 2 and res.step_length == 0.0:
            import warnings

            from ...errors import PolyprojWarning

            warnings.warn(f"{_NOT_APPLIED} (‖δ‖/‖ω‖ = {res.correction_ratio:.3g}); the first-order answer is "
                          "returned", PolyprojWarning, stacklevel=2)
        if warn and order == 2:
            self._warn_own_correction([res], stacklevel=3)
        return res

    def _own_correction(self) -> float:
        """‖ω₂({})‖: the second-order answer of the empty removal (computed once per damping).

        At an approximately stationary θ̄ (``KKTPoint.from_params`` at a loose ``tol``) the removed problem's KKT
        point, which the chord step moves towards, includes θ̄'s own move to stationarity: the empty removal's
        order-2 ω is that move, and every order-2 answer carries it (docs/dif.md, "Second order"). At an exact
        KKT point it is rounding, and the correction is not applied (0).
        """
        if self._own is None or self._own[0] != self.damping:
            damping, logged = self.damping, len(self.second_order_log)
            try:
                res = self._result({}, 2)
            finally:  # the log holds the caller's removals only (also where the run is interrupted or fails)
                del self.second_order_log[logged:]
            self._own = (damping, float(res.omega.norm()) if res.status.ok else 0.0)
        return self._own[1]

    def _warn_own_correction(self, results: list[DIFResult], stacklevel: int) -> None:
        """Warn where θ̄'s own correction (:meth:`_own_correction`) matters to the order-2 ``results``.

        It does where it is above ``OWN_CORRECTION``·(1 + ‖θ̄‖₂) (not rounding) and above ``OWN_SHARE`` of the
        correction ‖ω₂ − ω₁‖ of one of the results that applied one (a result left at first order carries none).
        """
        own = self._own[1] if self._own is not None else 0.0
        if not own > OWN_CORRECTION * (1.0 + float(self.kkt.theta.norm())):
            return
        shares = [(own / r.correction_norm, i) for i, r in enumerate(results) if r.correction_norm]
        if not shares or max(shares)[0] < OWN_SHARE:
            return
        import warnings

        from ...errors import PolyprojWarning

        share, i = max(shares)
        warnings.warn(f"order=2 at a KKT point with residual {self.kkt.residual:.2e}: the second-order step also "
                      "moves θ̄ towards the KKT point that residual says it is near, and every order-2 answer "
                      f"includes that move (the empty removal's: ‖ω₂({{}})‖ = {own:.3e}, {share:.3g} times the "
                      f"second-order correction of removal #{i}). A removal's own effect is the difference from the "
                      "empty removal's prediction (dif.delta_theta(rem, order=2) − dif.delta_theta({}, order=2); "
                      "scores: minus dif.influence(F, [{}], order=2)); or train θ̄ further (solve(problem, "
                      "theta0=kkt.theta)); docs/dif.md, 'Second order'", PolyprojWarning, stacklevel=stacklevel)

    def _at_one_damping(self, compute: Callable[[], Any]) -> Any:
        """``compute()`` again until no solve inside it raised the damping (``damping="auto"``, :meth:`_solve_h`).

        A solve that meets curvature the earlier ones did not re-damps the path; answers computed before it
        (ω₁, H⁻¹q, other removals' ω) used the old damping and are computed again, so every answer of one call
        uses one damping. The entries the discarded rounds left in :attr:`second_order_log` are dropped, and so are
        those of a round that raised (a KeyboardInterrupt, a failed solve): the log holds the results returned, one
        entry per removal of each call that returned, whatever calls were interrupted before it.
        """
        for _ in range(21):  # each re-damping at least doubles, at most 20 (_solve_h)
            damping, logged = self.damping, len(self.second_order_log)
            try:
                out = compute()
            except BaseException:
                del self.second_order_log[logged:]
                raise
            if self.damping == damping:
                return out
            del self.second_order_log[logged:]
        raise SolverError("damping='auto' could not make H positive definite in 20 rounds")  # pragma: no cover

    def _result(self, removal: Removal, order: int) -> DIFResult:
        c, r = self._terms(removal)
        if self.method == "matrix-free":
            first = self._result_schur(c, r)
        else:
            from .qp import solve_qp_exact

            sol = solve_qp_exact(self.H, c - self._c_shift, self.C, self._bound(r), self.row_eq,
                                 backend=self.backend, **self.settings)
            names = tuple(self.kkt.names[j] for j, a in zip(self.rows, sol.active, strict=True) if a)
            first = self._pack(np.nan_to_num(sol.x, nan=np.nan), sol.z - self.floor, sol.status, r, names)
        if order == 1 or not first.status.ok:
            return first
        from .second_order import correction, step_length

        removed = self.problem.remove(removal)
        omega1 = first.omega.numpy()
        step = correction(self, removed, omega1, first.multipliers)
        size_d, size_w = float(np.linalg.norm(step.delta)), float(first.omega.norm())
        # a step and a correction both at rounding level (a removal that moves nothing: data of an inactive
        # constraint only, an empty removal) have no ratio or residual to judge: the answer is ω₁
        noise = ROUNDING_STEP * (1.0 + float(self.kkt.theta.norm()))
        if max(size_d, size_w) <= noise:
            self.second_order_log.append((0.0, None))
            return replace(first, order=2, correction_ratio=0.0)
        # ω₁ = 0 exactly with a correction above rounding: no first-order effect, yet the removed problem's own
        # KKT residual moves θ (a constraint inactive at θ̄ that the removal violates, or θ̄'s residual itself)
        ratio = size_d / size_w if size_w > 0.0 else float("inf")
        t, g = step_length(self, removed, omega1, step)
        self.second_order_log.append((ratio, t))
        if t == 0.0:
            # no step along the correction lowers the removed problem's KKT residual: the removal lies
            # outside the range of the expansion around θ̄ (e.g. retraining moves to another basin)
            return replace(first, correction_ratio=ratio, step_length=0.0)
        omega = omega1 + t * step.delta
        lambdas = step.start + t * (step.lambdas - step.start)
        change = g - self.lin.g  # g(θ̄ + ω) of the removed problem, from the step length's test
        eq = self.problem.eq_mask
        floor = 1e-10 * (1.0 + float(np.max(np.abs(lambdas), initial=0.0)))  # round-off multipliers
        names = tuple(self.kkt.names[j] for j in step.rows if eq[j] or lambdas[j] > floor)
        return DIFResult(omega=torch.as_tensor(omega), status=first.status, constraint_change=change, active=names,
                         multipliers=lambdas - self.lin.lam, order=2, correction_ratio=ratio, step_length=t,
                         correction_norm=t * size_d)

    def _result_schur(self, c: np.ndarray, r: np.ndarray) -> DIFResult:
        y = self._solve_h(c, "H⁻¹c")
        u = self._bound(r)
        mu = self.dual.solve(self.C @ y + u) if self.rows.size else np.zeros(0)
        v_mu = self.V @ mu
        omega = -(y + v_mu)
        slack = u - self.C @ omega
        # held at the scale of the row's own terms, u + C y + C V μ (the norms of y and Vμ, not of ω, where they
        # cancel): an absolute floor called every weakly active row of a small removal's answer active (slack 2e-10
        # with ω 2e-10)
        tol = 1e-8 * (np.abs(u) + np.linalg.norm(self.C, axis=1) * float(np.linalg.norm(y) + np.linalg.norm(v_mu)))
        # a rounding-level positive multiplier on a row left with slack is not an active row
        new = mu + self.floor  # the QP's own multipliers (= μ under the derivative rule)
        act = self.row_eq | (new > 1e-10 * (1.0 + float(np.max(np.abs(new), initial=0.0)))) | (np.abs(slack) <= tol)
        names = tuple(self.kkt.names[j] for j, a in zip(self.rows, act, strict=True) if a)
        return self._pack(omega, mu, Status.SOLVED, r, names)

    def _pack(self, omega: np.ndarray, z: np.ndarray, status: Status, r: np.ndarray, names) -> DIFResult:
        m = self.problem.m
        mult = np.zeros(m)
        mult[self.rows] = z
        change = (self.lin.G @ omega + r) if m else np.zeros(0)
        return DIFResult(omega=torch.as_tensor(omega), status=status, constraint_change=change, active=names,
                         multipliers=mult)

    def delta_theta(self, removal: Removal | Sequence[Removal], order: int = 1) -> torch.Tensor:
        """Predicted parameter change Δθ for a removal (d,), or for a list of removals (k, d).

        ``removal`` maps ``"objective"`` or a constraint's name to the indices removed from that loss's
        data; a subset is removed jointly (not the sum of single removals). ``order=2``: with the
        second-order correction (:meth:`result`).

        Raises
        ------
        ProblemError
            Unknown loss name, index out of range, removal from a data-free constraint.
        SolverError
            The QP (or a Krylov solve) could not be solved (the message says why).
        """
        removals, single = _as_removals(removal)
        order = _check_order(order)
        results = self._at_one_damping(lambda: [self.result(rem, order, warn=False) for rem in removals])
        out, rejected = [], []
        for k, res in enumerate(results):
            if not res.status.ok:
                raise _qp_error(res.status)
            out.append(res.omega)
            if order == 2 and res.order == 1:
                rejected.append((k, res.correction_ratio))
        if rejected:
            import warnings

            from ...errors import PolyprojWarning

            warnings.warn(f"{len(rejected)} of {len(out)} removals: {_NOT_APPLIED}; their answers are the first-order "
                          f"ones (first: #{rejected[0][0]}, ‖δ‖/‖ω‖ = {rejected[0][1]:.3g})", PolyprojWarning,
                          stacklevel=2)
        if order == 2:
            self._warn_own_correction(results, stacklevel=3)
        return out[0] if single else torch.stack(out) if out else torch.zeros(0, self.problem.dim,
                                                                              dtype=torch.float64)

    # ------------------------------------------------------------------ all points
    def influence(self, test_fn: Callable[[Any], Any] | None = None, removals: Sequence[Removal] | None = None, *,
                  executor: Executor | None = None, chunk_size: int | None = None,
                  progress: bool | None = None, order: int = 1) -> torch.Tensor:
        """Predicted change of ``test_fn`` when each objective sample (or each removal) is removed.

        Parameters
        ----------
        test_fn : callable, optional
            ``test_fn(params_or_model)`` -> scalar (e.g. a test loss). ``None`` returns the
            parameter changes themselves, shape (N₀, d) (matrix-free: one Krylov solve per removal).
        removals : list of removals, optional
            Score these removals instead of the single objective samples (e.g. a training point
            that also sits in a constraint's data: ``{"objective": [i], "group": [k]}``, or groups).
        executor : concurrent.futures.Executor, optional
            Score chunks of removals on it (threads, processes, a Dask ``Client.get_executor()``),
            or with ``test_fn=None`` compute their ω there; the answers equal the in-process ones.
            The problem must be picklable for processes.
        chunk_size : int, optional
            Removals per chunk (default: the engine's ``chunk_size``); per-sample gradients are
            formed one chunk at a time, so memory is ``chunk_size × d`` floats plus one chunk's
            activations.
        progress : bool, optional
            Progress bar over chunks, on every path, an executor's too (default: for 8 or more chunks).
        order : {1, 2}
            1 (default): the first-order scores ∇F(θ̄)ᵀω. 2: F(θ̄ + ω₂) − F(θ̄) with ω₂ the
            second-order prediction (:meth:`result`), one pass over the data and one solve with H
            per removal: for tens to thousands of removals (groups, a top-k's candidates), not for
            every point of a large data set; in process only (no ``executor``).

        Returns
        -------
        torch.Tensor
            (N₀,) or (len(removals),): ∇F(θ̄)ᵀω (order 2: F(θ̄ + ω₂) − F(θ̄)) for each removal.
        """
        order = _check_order(order)
        if test_fn is not None and not callable(test_fn):
            raise ProblemError(f"test_fn must be a callable params_or_model -> scalar (or None), got "
                               f"{type(test_fn).__name__}")
        if executor is not None and not (callable(getattr(executor, "map", None))
                                         and callable(getattr(executor, "submit", None))):
            raise ProblemError("executor must be a concurrent.futures.Executor (or None), got "
                               f"{type(executor).__name__}")
        progress = check_flag(progress, "progress", none=True)
        chunk_size_arg(chunk_size, self.chunk_size)
        if isinstance(removals, Mapping):
            raise ProblemError("removals is a list of removals ({loss name: indices} each): for one removal pass "
                               "[removal]")
        rems = list(removals) if removals is not None else \
            [{"objective": [i]} for i in range(self.problem.objective.n_samples)]
        if removals is None:  # every path refuses a bad removal
            self.problem.check_single_removals()
        else:
            for rem in rems:
                self.problem.check_removal(rem)
        if order == 2:
            if executor is not None:
                raise ProblemError("influence(order=2) runs in process: pass executor=None")
            return self._second_order_scores(test_fn, rems, progress)
        step = chunk_size_arg(chunk_size, self.chunk_size)
        if test_fn is not None and (self.method == "matrix-free" or executor is not None or self._dense_schur):
            # ∇Fᵀω = −(s_testᵀc + bᵀμ): s_test = H⁻¹∇F solved once here, per-sample gradients projected (scores.py)
            parts = map_jobs(self.score_job(test_fn, step), _chunks(rems, step), executor=executor,
                             progress=progress, bar_from=8, description="DIF scores")
            return torch.as_tensor(np.concatenate([p[0] for p in parts]) if parts else np.zeros(0))
        grad = None if test_fn is None else _test_grad(self.problem, test_fn, self.kkt.theta).numpy()
        return self._chunked_omegas(None if removals is None else rems, grad, step, executor, progress)

    @property
    def _dense_schur(self) -> bool:
        """Dense path: scores through the Schur complement in process too, where H is positive definite.

        One Cholesky factorisation of H and a k-variable dual QP per removal give the answers of one d-variable QP
        per removal (the same KKT system) at a fraction of the cost (N 2,000, d 800: 0.12 s against 109 s). A
        singular or indefinite H keeps the QPs, which are defined wherever H is positive definite on the binding
        rows' null space.
        """
        return self.method == "dense" and self._inv.positive_definite

    def _chunked_omegas(self, removals: list[Removal] | None, grad: np.ndarray | None, step: int,
                        executor: Executor | None, progress: bool | None) -> torch.Tensor:
        """ω (k, d) of every removal, or the scores ∇Fᵀω (k,) for ``grad`` = ∇F(θ̄), ``step`` removals a chunk.

        ``removals=None``: each objective sample alone. A chunk is one batch of DIF QPs (dense) or one Krylov
        solve and one dual QP per removal (matrix-free), run by :class:`_OmegaJob` on ``executor`` or here.
        Every answer uses one damping: under ``damping="auto"`` a solve that meets curvature the setup's did not
        raises it (:meth:`_solve_h`) — here on the engine, so that later chunks start from it; on an executor on
        the chunk's own copy, and the engine then takes the largest — and the chunks that did not run wholly
        at the final damping run again.
        """
        n = self.problem.objective.n_samples
        total = n if removals is None else len(removals)
        # (position of the chunk's first removal, the chunk): errors name removals by their place in the call
        items: list[Any] = [(s, removals[s:s + step] if removals is not None else np.arange(s, min(s + step, n)))
                            for s in range(0, total, step)]
        if self.method == "dense" and removals is not None and len(removals) > 1:
            self.lin.precompute()  # the per-sample gradients once, which every chunk reads (or carries)
        job = _OmegaJob(self, grad, own_copy=executor is not None)
        parts: list[Any] = [None] * len(items)
        todo = list(range(len(items)))
        for _ in range(20):
            if self.method == "matrix-free" and self.rows.size:
                self.dual  # noqa: B018 - the dual QP once (again after a re-damping), which every chunk reads
            done = map_jobs(job, [items[i] for i in todo], executor=executor, progress=progress, bar_from=8,
                            description="DIF scores" if grad is not None else "DIF parameter changes")
            for i, part in zip(todo, done, strict=True):
                parts[i] = part
            top = max((end for _, _, end in done), default=self.damping)
            if top > self.damping:
                self._redamp(top)
            todo = [i for i, (_, start, end) in enumerate(parts) if not start == end == self.damping]
            if not todo:
                break
        else:  # pragma: no cover - twenty rounds, each at least doubling
            raise SolverError("damping='auto' could not make H positive definite in 20 rounds")
        if not parts:
            return torch.zeros((0,) if grad is not None else (0, self.problem.dim), dtype=torch.float64)
        return torch.as_tensor(np.concatenate([out for out, _, _ in parts]))

    def _omegas(self, chunk: np.ndarray | list[Removal], first: int = 0) -> torch.Tensor:
        """ω (k, d) of a chunk: a list of removals, or an array of objective samples each removed alone.

        ``first``: the place of the chunk's first removal in the caller's list (for the errors' numbering).
        """
        if self.method == "dense":
            return self._all_omegas(chunk, first)
        if isinstance(chunk, np.ndarray):
            chunk = [{"objective": [int(i)]} for i in chunk]
        return self.delta_theta(chunk)

    def _second_order_scores(self, test_fn: Callable[[Any], Any] | None, rems: list[Removal],
                             progress: bool | None) -> torch.Tensor:
        omegas = self._at_one_damping(lambda: map_jobs(lambda rem: self.result(rem, order=2, warn=False), rems,
                                                       progress=progress, bar_from=20,
                                                       description="DIF scores (order 2)"))
        bad = [i for i, r in enumerate(omegas) if not r.status.ok]
        if bad:
            raise SolverError(f"the DIF QP failed for {len(bad)} removals (first: #{bad[0]}, "
                              f"{omegas[bad[0]].status.name})")
        self._warn_own_correction(omegas, stacklevel=4)
        if test_fn is None:
            return torch.stack([r.omega for r in omegas]) if omegas else torch.zeros(0, self.problem.dim,
                                                                                    dtype=torch.float64)
        theta, F = self.kkt.theta, _test_scalar(self.problem, test_fn)
        rejected = [i for i, r in enumerate(omegas) if r.order == 1]
        if rejected:
            import warnings

            from ...errors import PolyprojWarning

            warnings.warn(f"{len(rejected)} of {len(omegas)} removals: {_NOT_APPLIED}; their scores are the "
                          f"first-order ones (first: #{rejected[0]}, ‖δ‖/‖ω‖ = "
                          f"{omegas[rejected[0]].correction_ratio:.3g})", PolyprojWarning, stacklevel=3)
            gF = _test_grad(self.problem, test_fn, theta)
        with torch.no_grad():
            F0 = float(F(theta))
            out = torch.as_tensor([float(gF @ r.omega) if r.order == 1 else float(F(theta + r.omega)) - F0
                                   for r in omegas], dtype=torch.float64)
        bad = torch.nonzero(~torch.isfinite(out)).flatten()
        if bad.numel():  # (order 1 refuses a non-finite gradient at θ̄; order 2 evaluates F at θ̄ + ω itself)
            raise ProblemError(f"test_fn is not finite at θ̄ + ω (second order) for removal #{int(bad[0])} "
                               f"({bad.numel()} of {len(omegas)}): F(θ̄) = {F0:.6g}")
        return out

    def score_job(self, test_fn: Callable[[Any], Any], chunk_size: int | None = None) -> ScoreJob:
        """The self-contained scoring job for ``test_fn`` (s_test = H⁻¹∇F solved once, here)."""
        gF = _test_grad(self.problem, test_fn, self.kkt.theta).numpy()
        s = self._solve_h(gF, "s_test = H⁻¹∇F")
        dual = self.dual if self.rows.size else None
        M = np.column_stack([s, self.V]) if self.rows.size else s[:, None]
        b = self.V.T @ gF if self.rows.size else np.zeros(0)
        return ScoreJob(problem=self.problem, theta=self.kkt.theta, lam=self.lin.lam, g=self.lin.g, basis=M,
                        grad_f0=self.lin.grad_f0 @ M, G=self.lin.G @ M, rows=self.rows, u0=self.u0, b=b, dual=dual,
                        renormalize=self.renormalize, split=self._split,
                        chunk_size=chunk_size_arg(chunk_size, self.chunk_size))

    def top_k(self, test_fn: Callable[[Any], Any], k: int, *, largest: bool = False,
              candidates: Sequence[int] | np.ndarray | None = None) -> tuple[np.ndarray, float]:
        """The k objective samples whose single removal most decreases (``largest``: increases) ``test_fn``.

        ``candidates``: the objective samples to rank (indices, or a boolean mask of shape (N₀,), as in a
        removal); default all. Returns the indices and the predicted change of removing them *together* (the
        group's own dual QP, not the sum of the single scores). ``k = 0`` selects nothing: an empty index array
        and a change of 0.0, without scoring (also where removing one sample would empty the objective, N₀ = 1).
        """
        if not callable(test_fn):
            raise ProblemError(f"top_k: test_fn must be a callable params_or_model -> scalar, got "
                               f"{type(test_fn).__name__} (the samples are ranked by their scores for one test "
                               "function; influence(None) gives the parameter changes)")
        n = self.problem.objective.n_samples
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k < n:
            raise ProblemError(f"top_k: k must be an integer in [0, {n}) (the objective has {n} samples), got {k!r}")
        cand = np.arange(n) if candidates is None else sample_indices(candidates, n, "top_k: candidates")
        if k == 0:  # nothing removed: nothing to rank, and the empty group changes nothing
            return np.zeros(0, dtype=np.int64), 0.0
        if cand.size < k:
            raise ProblemError(f"top_k: {cand.size} candidates cannot give k = {k} samples")
        scores = self.influence(test_fn, [{"objective": [int(i)]} for i in cand]).numpy()
        order = np.argsort(-scores if largest else scores, kind="stable")[:k]
        idx = np.sort(cand[order])
        joint = float(self.influence(test_fn, [{"objective": idx}])[0])
        return idx, joint

    def _all_omegas(self, removals: Sequence[Removal] | np.ndarray, first: int = 0) -> torch.Tensor:
        """ω (k, d) on the dense path, one batch of DIF QPs.

        ``removals``: a list of removals, or an array of objective samples each removed alone (their linear terms
        formed together, :meth:`Linearisation.objective_terms`).
        """
        from .qp import solve_qp_exact_batch

        m = self.problem.m
        if isinstance(removals, np.ndarray):
            Q = self.lin.objective_terms(removals, renormalize=self.renormalize)
            R = np.zeros((Q.shape[0], m))
        else:
            if len(removals) > 1:
                self.lin.precompute()
            terms = [self._terms(rem) for rem in removals]
            Q = np.array([c for c, _ in terms]).reshape(-1, self.problem.dim)
            R = np.array([r for _, r in terms]).reshape(len(terms), m)  # (k, 0) without constraints
        Q, U = Q - self._c_shift, self._bound(R)
        step = dense_batch_size(self.problem.dim)  # a backend's batch holds a few d × d matrices per element
        sols = [sol for i in range(0, Q.shape[0], step)
                for sol in solve_qp_exact_batch(self.H, Q[i:i + step], self.C, U[i:i + step], self.row_eq,
                                                backend=self.backend, **self.settings)]
        bad = [i for i, s in enumerate(sols) if not s.status.ok]
        if bad:
            raise _qp_error(sols[bad[0]].status, f"{len(bad)} removals (first: #{first + bad[0]}): ")
        return torch.as_tensor(np.array([s.x for s in sols]).reshape(-1, self.problem.dim))


def _check_point(problem: ConstrainedProblem, kkt: KKTPoint, lin: Linearisation) -> None:
    """``kkt`` is a KKT point of *this* problem: its residuals recomputed here match those it carries.

    A point of another problem (other data, other τ) would silently give another problem's DIF.
    """
    from .newton import kkt_residuals

    lam = kkt.lambdas.detach().numpy() if isinstance(kkt.lambdas, torch.Tensor) else np.asarray(kkt.lambdas)
    lam = np.asarray(lam, dtype=np.float64).reshape(-1)
    again = "; build it from this problem (solve or KKTPoint.from_params)"
    g_was = np.asarray(kkt.g, dtype=np.float64).reshape(-1)
    if g_was.shape != lin.g.shape or lam.shape != lin.g.shape or len(kkt.status) != lin.g.size:
        raise ProblemError(f"kkt is not a KKT point of this problem: it has {g_was.size} constraint values, "
                           f"{lam.size} multipliers and {len(kkt.status)} statuses, the problem {lin.g.size} "
                           "constraints" + again)
    _check_status(problem, kkt, lam, again)
    # the constraint values decide the classification (binding, weakly active, inactive) the engine uses: a
    # point of a problem with other data or another τ can be stationary and feasible here and still carry
    # another problem's classification
    moved = np.abs(lin.g - g_was) > 1e-7 * (1.0 + np.abs(g_was))
    if moved.any():
        j = int(np.flatnonzero(moved)[0])
        raise ProblemError(f"kkt is not a KKT point of this problem: constraint {problem.constraints[j].name!r} is "
                           f"{lin.g[j]:.6g} here against {g_was[j]:.6g} where kkt was computed (other data or "
                           "another tau)" + again)
    now = kkt_residuals(lin.grad_f0, lin.G, lin.g, lam, problem.eq_mask)
    scale = 1.0 + float(np.max(np.abs(lin.grad_f0), initial=0.0))
    for k in ("stationarity", "feasibility", "complementarity", "dual"):
        was = float(kkt.residuals.get(k, 0.0))
        if not np.isfinite(now[k]) or now[k] > 10.0 * was + 1e-8 * scale:
            raise ProblemError(f"kkt is not a KKT point of this problem: its {k} residual is {now[k]:.3e} here "
                               f"against {was:.3e} where it was computed" + again)


def _check_status(problem: ConstrainedProblem, kkt: KKTPoint, lam: np.ndarray, again: str) -> None:
    """The classification ``kkt.status`` agrees with its multipliers and constraint values.

    The rule of :meth:`KKTPoint.from_params` (binding: λⱼ > mult_tol; weakly active: λⱼ <= mult_tol — a row it calls
    active by complementarity may sit below −active_tol; inactive: gⱼ < −active_tol): an edited status was read as
    given (a binding row called inactive was left out of the DIF QP, an inactive one called binding held at
    equality, an unknown word taken for inactive).
    """
    from .kkt import INACTIVE

    g = np.asarray(kkt.g, dtype=np.float64).reshape(-1)
    for j, (st, eq) in enumerate(zip(kkt.status, problem.eq_mask, strict=True)):
        name = problem.constraints[j].name
        if st not in (BINDING, WEAK, INACTIVE, EQUALITY):
            raise ProblemError(f"kkt.status of constraint {name!r} is {st!r}: one of {BINDING!r}, {WEAK!r}, "
                               f"{INACTIVE!r}, {EQUALITY!r}")
        wrong = (st == EQUALITY) != bool(eq) or \
            (st == BINDING and not lam[j] > kkt.mult_tol) or \
            (st == WEAK and not lam[j] <= kkt.mult_tol) or \
            (st == INACTIVE and not g[j] < -kkt.active_tol)
        if wrong:
            raise ProblemError(f"kkt.status calls constraint {name!r} {st!r}, but its value is {g[j]:.3g} and its "
                               f"multiplier {lam[j]:.3g} (active_tol {kkt.active_tol:g}, mult_tol {kkt.mult_tol:g})"
                               + again)


def _multiplier_null_space(G: np.ndarray, active: np.ndarray, at_zero: np.ndarray | None = None) -> np.ndarray:
    """(m, k) the directions the active multipliers may move along at θ̄, an orthonormal basis of their span.

    The multipliers of θ̄ are the set {λ : G_Aᵀλ_A = −∇f₀, λⱼ >= 0 on inequalities}; near λ̄ it is λ̄ + K with
    K = {v ∈ null(G_Aᵀ) : vⱼ >= 0 on the inequality rows whose multiplier is zero (``at_zero``, (m,) bool)}: a
    left null vector of ``G_A`` that would take such a multiplier below zero in both of its directions moves
    nothing (two duplicated weakly active rows with λ̄ = 0: v = (1, −1) is no split of λ̄, which is unique).
    The span of the cone K is {v ∈ null : v_E = 0}, E its implicit equalities (rows of ``at_zero`` that are 0 on
    all of K), found by one LP: max Σtⱼ s.t. vⱼ >= tⱼ, 0 <= tⱼ <= 1 — a sum of cone points is a cone point, so
    one maximiser has tⱼ > 0 on every row that some v of K makes positive. ``k = 0`` under LICQ. A removal
    whose constraint terms have a component along one is not defined by the data under the finite rule.
    """
    rows = np.flatnonzero(active)
    if rows.size < 2:
        return np.zeros((G.shape[0], 0))
    U, s, _ = np.linalg.svd(G[rows], full_matrices=True)
    tol = 1e-9 * max(1.0, float(s[0]) if s.size else 1.0)
    rank = int(np.sum(s > tol))
    basis = U[:, rank:]
    zero = np.zeros(rows.size, dtype=bool) if at_zero is None else np.asarray(at_zero, dtype=bool)[rows]
    # only rows the null space reaches (a row at 0 in every null vector constrains nothing)
    zero &= np.abs(basis).max(axis=1, initial=0.0) > 1e-12
    if basis.shape[1] and zero.any():
        from scipy.optimize import linprog

        a, nz = basis.shape[1], int(zero.sum())
        # variables (z, t): v = basis z; −v_Z + t <= 0, t in [0, 1], z free; minimise −Σt
        A = np.hstack([-basis[zero], np.eye(nz)])
        lp = linprog(np.r_[np.zeros(a), -np.ones(nz)], A_ub=A, b_ub=np.zeros(nz),
                     bounds=[(None, None)] * a + [(0.0, 1.0)] * nz, method="highs")
        # an LP that fails keeps every direction (the refusal is the safe side)
        implicit = np.flatnonzero(zero)[lp.x[a:] < 0.5] if lp.status == 0 else np.zeros(0, dtype=np.int64)
        if implicit.size:
            _, si, Vt = np.linalg.svd(basis[implicit], full_matrices=True)
            keep = Vt[int(np.sum(si > 1e-9)):].T  # null space of the implicit rows, in the basis' coordinates
            basis = basis @ keep
    out = np.zeros((G.shape[0], basis.shape[1]))
    out[rows] = basis
    return out


def _chunks(items: Sequence[Any], step: int) -> list[Any]:
    """``items`` in consecutive slices of ``step``."""
    return [items[s:s + step] for s in range(0, len(items), step)]


@dataclass(frozen=True, eq=False)
class _OmegaJob:
    """ω of a chunk of removals (:meth:`DIF._omegas`), or ∇Fᵀω for ``grad`` = ∇F(θ̄); picklable when the engine is.

    Returns (the answers, the damping at the chunk's start, at its end): the chunk's answers all use one damping
    when the two are equal. ``own_copy`` (an executor's chunks): the chunk runs on a shallow copy of the engine,
    so that a re-damping (matrix-free, ``damping="auto"``) sets up that copy, never the engine that other chunks
    (threads) share.
    """

    dif: DIF
    grad: np.ndarray | None
    own_copy: bool

    def __call__(self, item: tuple[int, np.ndarray | list[Removal]]) -> tuple[np.ndarray, float, float]:
        first, chunk = item
        dif = copy.copy(self.dif) if self.own_copy else self.dif
        start = float(dif.damping)
        omega = dif._omegas(chunk, first).numpy()
        return (omega if self.grad is None else omega @ self.grad), start, float(dif.damping)


#: the message of an inconsistent removal under dependent binding constraints (the matrix-free path's too)
INCONSISTENT = ("the DIF is not defined for this removal: the binding constraints' gradients are linearly dependent "
                "(LICQ fails) and the removal asks them to move inconsistently")


def _qp_error(status: Status, prefix: str = "") -> Exception:
    """The exception of a DIF QP that was not solved.

    Its variable ω is free, so its rows admit no point only when the binding rows are dependent and the
    removal moves them inconsistently: a ProblemError about the removal, as on the matrix-free path.
    """
    if status is Status.PRIMAL_INFEASIBLE:
        return ProblemError(prefix + INCONSISTENT)
    return SolverError(prefix + _qp_failure(status))


def _qp_failure(status: Status) -> str:
    """The error message of a DIF QP that was not solved."""
    if status is Status.NON_CONVEX:
        return ("the DIF QP is not convex: H is not positive definite on the null space of the binding "
                "(under rule='finite': the equality) "
                "constraints (second-order sufficiency fails at this KKT point); pass damping > 0 (or "
                "damping='auto') to regularise it")
    return f"the DIF QP returned {status.name}: {status.message}"


_TEST_SIGNATURE = "test_fn(params_or_model) -> scalar (one argument: θ, or the module with θ's parameters)"


def _check_test_signature(test_fn: Callable[[Any], Any]) -> None:
    """A ``ProblemError`` for a test function that cannot be called with the one argument it is given."""
    if not callable(test_fn):
        raise ProblemError(f"test_fn must be callable, {_TEST_SIGNATURE}; got {type(test_fn).__name__}")
    try:
        sig = inspect.signature(test_fn)
    except (TypeError, ValueError):  # builtins without a signature: left to the call
        return
    try:
        sig.bind(object())
    except TypeError as exc:
        raise ProblemError(f"test_fn{sig} cannot be called as {_TEST_SIGNATURE} ({exc})") from None


def _check_test_depends(problem: ConstrainedProblem, test_fn: Callable[[Any], Any], theta: torch.Tensor) -> None:
    """A ``ProblemError`` for a test function whose value is not computed from θ.

    The test is structural, as for the terms of the problem: θ must be in the value's autograd graph (a zero
    gradient of a function of θ passes). A detached copy or the user's own module, called instead of the one
    test_fn is given, makes every score exactly 0.
    """
    from .problem import computed_from

    t = theta.detach().clone().to(torch.float64).requires_grad_(True)
    with torch.enable_grad():
        uses = computed_from(_test_scalar(problem, test_fn)(t), t)
    if not uses:
        raise ProblemError("test_fn's value is not differentiable in its argument (not computed from it: a detached "
                           "copy, a NumPy or Python number, the model used outside the function; or only through "
                           "non-differentiable operations: argmax, comparisons); every first-order score would be 0 "
                           f"(order=2 scores by value). Expected {_TEST_SIGNATURE}")


def _test_scalar(problem: ConstrainedProblem, test_fn: Callable[[Any], Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    """θ ↦ test_fn at θ as a 0-d tensor (a ``ProblemError`` when test_fn does not return a scalar)."""
    _check_test_signature(test_fn)

    def f(t):
        try:
            raw = test_fn(problem.wrap(t))
        except RuntimeError as exc:
            err = placement_error(exc, "test_fn failed")
            if err is None and ("data pointer" in str(exc) or "numpy" in str(exc).lower()):
                err = ProblemError("test_fn must compute its value from its argument with torch operations: it left "
                                   f"torch (.numpy(), .item() or a Python number) where θ is traced ({exc})")
            if err is None:
                raise
            raise err from exc
        # a tensor computed from θ: a tuple, a Python number or an integer / boolean tensor carries no gradient
        # (each was made a constant, caught only by the zero-gradient warning)
        if not isinstance(raw, torch.Tensor):
            raise ProblemError(f"test_fn must return a torch tensor (a real scalar computed from θ), got "
                               f"{type(raw).__name__}")
        out = raw
        if out.numel() != 1:
            raise ProblemError(f"test_fn must return a scalar, got shape {tuple(out.shape)}")
        if out.is_complex():
            raise ProblemError(f"test_fn must return a real scalar, got dtype {out.dtype}")
        if not out.is_floating_point():
            raise ProblemError(f"test_fn must return a floating-point scalar (a loss), got dtype {out.dtype}")
        return out.reshape(())
    return f


def _test_grad(problem: ConstrainedProblem, test_fn: Callable[[Any], Any], theta: torch.Tensor) -> torch.Tensor:
    g = torch.func.grad(_test_scalar(problem, test_fn))(theta).detach().to(torch.float64)
    if not bool(torch.isfinite(g).all()):
        bad = int((~torch.isfinite(g)).sum())
        raise ProblemError(f"the gradient of test_fn at θ̄ is not finite ({bad} of {g.numel()} entries NaN or inf): "
                           "check its data (a NaN feature or label) and that it is finite near θ̄")
    if not bool(g.any()):
        _check_test_depends(problem, test_fn, theta)  # refuses a test_fn not computed from θ
        import warnings

        from ...errors import PolyprojWarning

        warnings.warn("the gradient of test_fn at θ̄ is exactly zero, so every first-order score is 0 (test_fn is "
                      "computed from θ, but is stationary at θ̄)",
                      PolyprojWarning, stacklevel=3)
    return g
