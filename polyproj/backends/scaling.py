"""Normalisation of QPs whose data is far from unit scale (shared by every backend).

Solvers stop on *absolute* residuals: ProxSuite asked for ``eps_abs = 1e-8`` on data at 1e8 (the
spacing of doubles there is 1.5e-8) runs ten million iterations; OSQP, HiGHS and the IPM end in
MAX_ITER on data at 1e12; on data at 1e-12 every solver is "done" before it starts. Such a problem
is solved in normalised units instead, with the change of variables

    x = σ x̃,   rows  C̃ = D C  (D_i = 1 / ‖C_i‖∞),   objective multiplied by γ,

that is ``P̃ = γσ²P``, ``q̃ = γσq``, ``l̃ = D l / σ``, ``ũ = D u / σ``, ``lb̃ = lb / σ``,
``ub̃ = ub / σ``. The normalised problem has the same solution set and its stationarity
``P̃x̃ + q̃ + C̃ᵀz̃ + z̃_box = 0`` gives back polyproj's multipliers as

    z = D z̃ / (γσ),   z_box = z̃_box / (γσ).

``σ`` is the magnitude of x suggested by the data (the largest finite right-hand side relative to its
row and ``|q| / |P|``, and the largest finite bound; a bound beyond ``HIGH`` counts only up to
``max(LOOSE`` times the others, ``HIGH)``: a big-M stand-in for "no bound"), ``γ`` makes the largest
entry of ``P̃`` and ``q̃`` one.
Normalisation applies when σ, a row of C or the objective's scale is far from one (``LOW``,
``HIGH``), or ``|q|`` is above ``HIGH`` (see :func:`plan`);
then the tolerances
``eps_abs`` and ``eps_rel`` are met in the normalised units, i.e. *relative to the data's scale*
(an absolute 1e-8 on data at 1e8 is below the rounding of the data itself). Bounds at or beyond
``IGNORE`` (finite stand-ins for infinity, e.g. ``9.99e19``) do not set the scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..problem import QP
from ..solution import BatchSolution, Solution
from .cache import converted

__all__ = ["HIGH", "IGNORE", "LOOSE", "LOW", "REPLAN", "REPLAN_ROUNDS", "SPREAD", "Scaling", "groups", "needs_replan",
           "plan", "replan"]

HIGH = 1e7
LOW = 1e-7
IGNORE = 1e15
#: variable bounds beyond HIGH and this factor beyond the right-hand sides and |q| / |P| do not set σ (:func:`plan`)
LOOSE = 1e4

_VECTORS = ("q", "l", "u", "lb", "ub")


def _absmax(M: Any) -> float:
    if M is None or M.size == 0 or (sp.issparse(M) and M.nnz == 0):
        return 0.0
    return float(abs(M).max())


def _row_norms(C: Any) -> np.ndarray:
    if C.shape[0] == 0:
        return np.zeros(0)
    if sp.issparse(C):
        return np.asarray(abs(C).max(axis=1).toarray()).reshape(-1)
    return np.max(np.abs(C), axis=1)


@dataclass(frozen=True)
class Scaling:
    """The change of variables of this module: ``x = sigma x̃``, ``C̃ = diag(rows) C``, cost times ``gamma``.

    The products with ``γ`` are kept as computed from the data's own sizes (``γσ² = 1 / max(|P|, |q| / σ)``,
    ``γσ = 1 / max(|P| σ, |q|)``): ``γ`` and ``σ²`` alone over- and underflow at sizes the products do not
    (``P = 1e-200 I`` raised OverflowError, ``P = 1e200 I`` became 0).
    """

    sigma: float
    rows: np.ndarray
    p_factor: float  # γσ²: P̃ = p_factor P
    q_factor: float  # γσ: q̃ = q_factor q; the multipliers come back divided by it

    @property
    def gamma(self) -> float:
        """The objective's factor ``γ`` (informative: the solve uses :attr:`p_factor` and :attr:`q_factor`)."""
        return self.q_factor / self.sigma

    # ---------------------------------------------------------------- problem data
    def matrices(self, qp: QP) -> tuple[Any, Any]:
        """``(P̃, C̃)``."""
        P = qp.P * self.p_factor
        C = sp.diags(self.rows) @ qp.C if sp.issparse(qp.C) else qp.C * self.rows[:, None]
        return (sp.csc_matrix(P) if sp.issparse(qp.P) else P), (sp.csc_matrix(C) if sp.issparse(qp.C) else C)

    def vectors(self, **vecs: np.ndarray) -> dict[str, np.ndarray]:
        """Normalised ``q, l, u, lb, ub`` (any of them; single vectors or batches)."""
        out = {}
        for k, v in vecs.items():
            if k == "q":
                out[k] = v * self.q_factor
            elif k in ("l", "u"):
                out[k] = v * self.rows / self.sigma
            else:
                out[k] = v / self.sigma
        return out

    def problem(self, qp: QP) -> QP:
        """The normalised QP (P and C validated once already: no re-validation)."""
        P, C = self.matrices(qp)
        new = qp.with_vectors(validate=False, **self.vectors(**{k: getattr(qp, k) for k in _VECTORS}))
        object.__setattr__(new, "P", P)
        object.__setattr__(new, "C", C)
        return new

    # ---------------------------------------------------------------- results
    def _dual(self) -> float:
        return 1.0 / self.q_factor

    def warm_start(self, ws: Any) -> dict[str, np.ndarray] | None:
        """A warm start (Solution or dict with x, z, z_box) in normalised units."""
        if ws is None:
            return None
        get = ws.get if isinstance(ws, dict) else (lambda k: getattr(ws, k, None))
        x, z, zb = get("x"), get("z"), get("z_box")
        out = {}
        if x is not None:
            out["x"] = np.asarray(x, dtype=np.float64) / self.sigma
        if z is not None:
            out["z"] = np.asarray(z, dtype=np.float64) / (self.rows * self._dual())
        if zb is not None:
            out["z_box"] = np.asarray(zb, dtype=np.float64) / self._dual()
        return out or None

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        return {**info, "scaling": {"sigma": self.sigma, "gamma": self.gamma,
                                    "note": "solved in normalised units: tolerances relative to the data's scale"}}

    def solution(self, sol: Solution, qp: QP) -> Solution:
        """A normalised problem's Solution in the original units (attached to the original ``qp``)."""
        from dataclasses import replace

        x, z, zb = (np.asarray(a, dtype=np.float64) for a in (sol.x, sol.z, sol.z_box))
        if x.shape != (qp.n,) or z.shape != (qp.m,) or zb.shape != (qp.n,):
            return replace(sol, qp=qp)  # the validation names the wrong shapes
        return replace(sol, x=x * self.sigma, z=z * self.rows * self._dual(), z_box=zb * self._dual(), qp=qp,
                       info=self._info(sol.info))

    def batch(self, bs: BatchSolution, qps: Any) -> BatchSolution:
        """A normalised batch's result in the original units."""
        from dataclasses import replace

        x, z, zb = (np.asarray(a, dtype=np.float64) for a in (bs.x, bs.z, bs.z_box))
        if x.ndim != 2 or z.ndim != 2 or zb.ndim != 2 or z.shape[1] != self.rows.size:
            return replace(bs, qps=qps)
        return replace(bs, x=x * self.sigma, z=z * self.rows * self._dual(), z_box=zb * self._dual(), qps=qps,
                       info=self._info(bs.info))


def _matrix_part(qp: QP) -> tuple[float, np.ndarray, np.ndarray, bool]:
    """``(max|P|, row norms of C, their inverses (1 for zero rows), whether they lie in [LOW, HIGH])``."""
    norms = _row_norms(qp.C)
    nonzero = norms[norms > 0]
    rows = np.where(norms > 0, 1.0 / np.where(norms > 0, norms, 1.0), 1.0)
    rows_ok = nonzero.size == 0 or (LOW <= float(nonzero.min()) and float(nonzero.max()) <= HIGH)
    return _absmax(qp.P), norms, rows, rows_ok


#: a solve whose |x| lies this far below the σ it was normalised with is solved again (:func:`replan`), at most
#: REPLAN_ROUNDS times
REPLAN, REPLAN_ROUNDS = 1e1, 3


def needs_replan(qp: QP, sigma: float, x_max: Any, **batched: np.ndarray) -> Any:
    """Whether solves normalised by ``sigma`` whose answers have ``max|x| = x_max`` must be solved again.

    σ takes ``|q| / |P|`` (the unconstrained minimiser's size) when no right-hand side or bound is larger, but
    constraints can hold x far smaller: ``min ½x² + 1e8 x`` on ``[−1, 1]`` got σ = 1e8, tolerances relative
    to it, and SOLVED points 47 % outside the box from four backends. Again when ``x_max`` (and the
    right-hand sides and bounds that exclude the origin, and 1 where one that contains it is larger) lie below
    ``σ / REPLAN``: a side the origin satisfies caps x, it does not make x large (a box at ±1e8 around an
    optimum at 1e4 set σ = 1e8, and three backends returned SOLVED objectives 8-19 % above the optimum).
    ``x_max`` a number, or one per element of a batch (``batched`` then holds the batch's vectors, one row per
    element): a bool or a (b,) bool array.
    """
    x = np.asarray(x_max, dtype=np.float64)
    size = _constraint_sizes(qp, **batched)
    out = np.isfinite(x) & (np.asarray(sigma) > REPLAN * np.maximum(np.maximum(x, size), 1e-300))
    return out if x.ndim else bool(out)


def replan(qp: QP, x_max: float, sigma: float, **batched: np.ndarray) -> Scaling:
    """The normalisation from an answer's size ``x_max`` (in place of ``|q| / |P|``), whatever the band.

    ``sigma`` is the normalisation that answer came from. The right-hand sides and bounds that contain the
    origin only cap x: they count up to 1 (:func:`_unit_floor`) and ``sigma / REPLAN``, a floor for an answer
    near 0 (one of 0 in a box of ±1e-3 is normalised by the box, one of 0 in a box of ±1e8 by 1, one of 1e4 by
    2e4: a box of ±1e8 kept σ at 1e8 and three backends returned SOLVED objectives 8-19 % above the optimum).
    The objective keeps its normalisation (|q| ~ 1e8 left as given stalled OSQP and the ADMM).
    """
    return plan(qp, magnitude=max(2.0 * x_max, 1e-300), force=True, _bounds_cap=sigma / REPLAN, **batched)


def _rhs_sizes(v: np.ndarray, norms: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``|v_i| / ||row_i||``: right-hand sides as sizes of x, 0 on a zero row.

    A zero row's right-hand side says nothing about x (0 <= 0·x <= 1e8 set σ = 1e8, and five backends returned
    SOLVED answers off by 1 to 6659 in those units).
    """
    return np.where(norms > 0, np.abs(v * rows), 0.0)


def _sides(qp: QP, norms: np.ndarray, rows: np.ndarray, **batched: np.ndarray) -> tuple[np.ndarray, ...]:
    """The sizes of x the finite sides suggest (below IGNORE), the last axis reduced (one per batch element).

    ``(rows that exclude the origin, rows that contain it, bounds that exclude it, bounds that contain it)``:
    a side the origin violates (``l_i > 0``, ``u_i < 0``, ``lb_j > 0``, ``ub_j < 0``) can hold x as far out as
    its right-hand side (relative to its row), one the origin satisfies only caps x.
    """
    l, u, lb, ub = (np.asarray(batched.get(k, getattr(qp, k)), dtype=np.float64) for k in ("l", "u", "lb", "ub"))

    def size(*arrays):
        out = np.zeros(())
        for a in arrays:
            out = np.maximum(out, np.where(np.isfinite(a) & (a < IGNORE), a, 0.0).max(axis=-1, initial=0.0))
        return out

    with np.errstate(invalid="ignore"):
        rl, ru = _rhs_sizes(l, norms, rows), _rhs_sizes(u, norms, rows)
        return (size(np.where(l > 0, rl, 0.0), np.where(u < 0, ru, 0.0)),
                size(np.where(l > 0, 0.0, rl), np.where(u < 0, 0.0, ru)),
                size(np.where(lb > 0, lb, 0.0), np.where(ub < 0, -ub, 0.0)),
                size(np.where(lb > 0, 0.0, np.abs(lb)), np.where(ub < 0, 0.0, np.abs(ub))))


def _constraint_sizes(qp: QP, **batched: np.ndarray) -> np.ndarray:
    """The largest finite right-hand side (relative to its row) or bound that excludes the origin (or 1, below).

    Where a side that contains the origin is larger, 1 (:func:`_unit_floor`). One number, or one per element
    where ``batched`` holds a batch's vectors (one row per element).
    """
    _, norms, rows, _ = converted("scaling", (qp.P, qp.C), None, lambda: _matrix_part(qp))
    rows_out, rows_in, bounds_out, bounds_in = _sides(qp, norms, rows, **batched)
    return np.maximum(np.maximum(rows_out, bounds_out), _unit_floor(np.maximum(rows_in, bounds_in)))


def _unit_floor(inside: Any) -> Any:
    """What the sides the origin satisfies (largest size ``inside``) say of x's size: up to 1.

    And 1 where none has a size (a bound at 0, or none): an answer near 0 is confirmed at σ = 1
    (:func:`needs_replan`, :func:`replan`; without the floor their test never ended, and every x* = 0 came out
    SOLVED_INACCURATE).
    """
    return np.where(inside > 0, np.minimum(inside, 1.0), 1.0)


#: a batch whose elements' sizes (``|q|``, and the sizes of x their sides suggest) spread more than this factor is
#: normalised in groups (:func:`groups`)
SPREAD = 1e2


def groups(qp: QP, scale: Scaling | None, size: int, **batched: np.ndarray) -> list[np.ndarray] | None:
    """The groups of a batch's elements to normalise separately (index arrays), or None for one normalisation.

    :func:`plan` of a batch takes its largest sizes, so an element far smaller than the largest would be held
    to tolerances relative to the largest. Elements are grouped by ``|q|`` and by the sizes of x their sides
    suggest, each within a factor :data:`SPREAD` (zero a group of its own), where the batch is normalised or
    an element's sizes lie below ``LOW`` (its own solve would be normalised); else None.
    """
    if not batched or size < 2:
        return None
    _, norms, rows, _ = converted("scaling", (qp.P, qp.C), None, lambda: _matrix_part(qp))
    rows_out, rows_in, bounds_out, bounds_in = _sides(qp, norms, rows, **batched)  # each () or (size,)
    side = np.broadcast_to(np.maximum(np.maximum(rows_out, rows_in), np.maximum(bounds_out, bounds_in)), (size,))
    q = batched.get("q")
    mags = [side] + ([np.max(np.abs(q), axis=1, initial=0.0)] if q is not None else [])
    spread = [m for m in mags if _spread(m)]
    if not spread:
        return None
    positive = np.concatenate([m[m > 0] for m in mags])
    if scale is None and (positive.size == 0 or float(positive.min()) >= LOW):
        return None
    key = np.zeros(size, dtype=np.int64)
    for m in spread:  # one integer key per element (each class count is at most ~660: log_SPREAD of the range)
        c = _classes(m)
        key = key * (int(c.max()) + 2) + (c + 1)
    _, label = np.unique(key, return_inverse=True)
    label = label.reshape(-1)
    return [np.flatnonzero(label == k) for k in range(int(label.max()) + 1)]


def _spread(m: np.ndarray) -> bool:
    """Whether sizes ``m`` mix zero with nonzero or spread more than :data:`SPREAD`."""
    pos = m[m > 0]
    return bool(pos.size and (pos.size < m.size or float(pos.max()) > SPREAD * float(pos.min())))


def _classes(m: np.ndarray) -> np.ndarray:
    """Class labels of sizes ``m``: ascending runs each within a factor :data:`SPREAD` of its smallest; 0 is −1."""
    order = np.argsort(m, kind="stable")
    v = m[order]
    out = np.full(m.size, -1, dtype=np.int64)
    i, label = int(np.searchsorted(v, 0.0, side="right")), 0
    while i < v.size:  # one pass per class
        j = int(np.searchsorted(v, SPREAD * v[i], side="right"))
        out[order[i:j]] = label
        i, label = j, label + 1
    return out


def _box(lb: np.ndarray, ub: np.ndarray) -> float:
    """The largest |bound| when every variable has both bounds finite (below IGNORE), else inf: a bound on |x|."""
    both = np.isfinite(lb) & np.isfinite(ub) & (np.abs(lb) < IGNORE) & (np.abs(ub) < IGNORE)
    if not lb.size or not bool(both.all()):
        return np.inf
    return float(max(np.abs(lb).max(), np.abs(ub).max()))


#: σ is kept within [1 / LIMIT, LIMIT] (its factors' products stay finite there)
LIMIT = 1e300


def plan(qp: QP, *, magnitude: float | None = None, force: bool = False, _bounds_cap: float = np.inf,
         **batched: np.ndarray) -> Scaling | None:
    """The normalisation for ``qp`` (and batched vectors replacing its own), or None when not needed.

    It applies when the magnitude of x suggested by the data (``σ``), a row norm of C or the objective's
    own scale at that magnitude (``max(|P|, |q| / σ)``, 1 for a projection) is outside ``[LOW, HIGH]``, or
    ``|q|`` (the dual residual's scale at x = 0) above ``HIGH``;
    all-zero data is left alone. (A finer trigger, on the rounding of the data
    against ``eps_abs``, was tried and dropped: its estimate is pessimistic, and normalising
    QFFFFF80, whose rows span 1 to 1e5, made Clarabel fail a problem it solves to 1e-10 as given.)
    """
    vec = {k: batched.get(k, getattr(qp, k)) for k in _VECTORS}
    # the matrix part is computed once per (P, C): projections and batches share them
    p_max, norms, rows, rows_ok = converted("scaling", (qp.P, qp.C), None, lambda: _matrix_part(qp))
    q_max = float(np.max(np.abs(vec["q"]), initial=0.0))
    # x's size: the right-hand sides relative to their rows, and |q| / |P| (the unconstrained minimiser's) capped
    # by the box where every variable has one (P = 1e-35 I, |q| = 1 on [−1, 1]²: σ = 1e35 let SOLVED points at
    # 1e3-1e18 pass), or the size of an answer already found (``magnitude``, :func:`replan`) in place of the latter
    lb, ub = (np.asarray(vec[k], dtype=np.float64) for k in ("lb", "ub"))
    rows_out, rows_in, bounds_out, bounds_in = (float(np.max(v)) for v in _sides(qp, norms, rows, **batched))
    if magnitude is None:  # the rows' sides that contain the origin count as bounds do (below)
        core = max(rows_out, min(q_max / p_max, _box(lb, ub)) if p_max > 0 else 0.0)
        bounds = max(bounds_out, bounds_in, rows_in)
    else:  # a replan: the sides that contain the origin count up to 1 (:func:`_unit_floor`) and the cap only
        core = max(rows_out, magnitude)
        bounds = max(bounds_out, min(float(_unit_floor(np.asarray(max(rows_in, bounds_in)))), _bounds_cap))
    # bounds beyond HIGH and far beyond the rest of the data (LOOSE times) are big-M stand-ins for "no bound",
    # not the scale of x: σ from them made γ shrink the objective's gradient below eps_abs, and every backend
    # returned "solved" points off by orders of magnitude (x0 + x1 <= 1 with a box at ±1e8 to ±1e14); so are the
    # rows' sides that contain the origin (l = −1e12 on rows that bind at u ~ 1 made σ 7.8e11). A side that
    # excludes the origin is not capped so: one that binds (x0 >= 1e8 with x* = (1e8, 1)) is the scale of x, and
    # capped it left the problem unnormalised (PRIMAL_INFEASIBLE and MAX_ITER from five backends)
    if core > 0 and bounds > HIGH:
        bounds = min(bounds, max(LOOSE * core, HIGH))
    sigma = max(core, bounds)
    sigma = min(max(sigma, 1.0 / LIMIT), LIMIT) if sigma > 0 else 1.0
    # the objective's own scale at x's: max(|P|, |q| / σ) (1 for a projection). At 1e-12 every point is
    # "optimal" to an absolute dual tolerance, at 1e12 none is: a trigger as well (γ alone changes nothing
    # else)
    curvature = max(p_max, q_max / sigma)
    # and |q| itself, the dual residual's scale at x = 0: |q| = 4.7e7 (an LP whose σ an inactive row set at 11,
    # |q| / σ = 4.3e6) has its rounding near an absolute 1e-8, and ProxSuite ran 3e6 iterations on it. (Not
    # |P| σ: γ from |P| σ² loosened the dual tolerance past a HiGHS answer 0.13 above the optimum.)
    if not force and LOW <= sigma <= HIGH and rows_ok and (curvature == 0 or LOW <= curvature <= HIGH) \
            and q_max <= HIGH:
        return None
    # γ = 1 / max(|P| σ², |q| σ) makes the largest entry of P̃ and q̃ one; its products with σ² and σ are formed
    # from the sizes directly (γ and σ² alone leave the double range first)
    pf, qf = max(p_max, q_max / sigma), max(p_max * sigma, q_max)
    return Scaling(sigma=float(sigma), rows=rows, p_factor=1.0 / pf if pf > 0 else 1.0,
                   q_factor=1.0 / qf if qf > 0 else 1.0)
