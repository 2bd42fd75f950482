"""Solver results: the :class:`Status` enum and the :class:`Solution` / :class:`BatchSolution` records.

Sign convention (docs/architecture.md, "Conventions"): with ``z`` one multiplier per row of ``C`` and ``z_box`` one per
variable bound, stationarity reads ``P x + q + Cᵀ z + z_box = 0``; ``z_i > 0`` means the upper side
``u_i`` is active, ``z_i < 0`` the lower side ``l_i``. Every backend maps its multipliers to this.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import ProblemError

if TYPE_CHECKING:  # pragma: no cover
    from .problem import QP

__all__ = ["BatchSolution", "Solution", "Status"]


class Status(enum.Enum):
    """Outcome of a solve. ``status.message`` says what it means and what to try."""

    SOLVED = "solved"
    SOLVED_INACCURATE = "solved_inaccurate"
    PRIMAL_INFEASIBLE = "primal_infeasible"
    DUAL_INFEASIBLE = "dual_infeasible"
    MAX_ITER = "max_iter"
    TIME_LIMIT = "time_limit"
    NUMERICAL_ERROR = "numerical_error"
    NON_CONVEX = "non_convex"

    @property
    def message(self) -> str:
        """Human-readable explanation with a fix-it hint."""
        return _MESSAGES[self]

    @property
    def ok(self) -> bool:
        """True for SOLVED and SOLVED_INACCURATE (a usable x)."""
        return self in (Status.SOLVED, Status.SOLVED_INACCURATE)


_MESSAGES = {
    Status.SOLVED: "solved to the requested tolerance",
    Status.SOLVED_INACCURATE: "a solution was found but not to the requested tolerance; "
    "loosen eps_abs/eps_rel, raise max_iter, or try another backend",
    Status.PRIMAL_INFEASIBLE: "the constraints admit no point; check l <= u, the bounds and "
    "the consistency of the equalities",
    Status.DUAL_INFEASIBLE: "the objective is unbounded below on the feasible set; add bounds "
    "or make P positive definite on the feasible directions",
    Status.MAX_ITER: "the iteration limit was reached; raise max_iter or loosen the tolerances",
    Status.TIME_LIMIT: "the time limit was reached; raise time_limit",
    Status.NUMERICAL_ERROR: "the solver failed numerically; rescale the data or try another backend",
    Status.NON_CONVEX: "P is not positive semidefinite; polyproj solves convex QPs only",
}


def all_finite(v: np.ndarray) -> bool:
    """True when every entry of ``v`` is finite (the method form: ``np.all`` costs twice as much)."""
    return bool(np.isfinite(v).all())


def _pos(v: np.ndarray) -> np.ndarray:
    return np.maximum(v, 0.0)


def _finite_dot(bound: np.ndarray, mult: np.ndarray) -> float:
    """Sum of bound * mult over entries where the bound is finite (0 * inf counted as 0)."""
    fin = np.isfinite(bound)
    return float(np.dot(bound[fin], mult[fin]))


@dataclass(frozen=True, eq=False)  # array fields: identity, not an ambiguous elementwise ==
class Solution:
    """Result of one QP solve.

    Attributes
    ----------
    x : ndarray (n,)
        Primal solution (NaN when the solver produced none).
    z : ndarray (m,)
        Multipliers of ``l <= C x <= u`` (the sign convention above).
    z_box : ndarray (n,)
        Multipliers of ``lb <= x <= ub``.
    status : Status
    iterations : int
        The backend's own count, summed over its solves in one call (a retry, a second phase): ProxSuite counts
        its inner iterations (``max_iter`` bounds the outer ones), HiGHS its QP and simplex iterations together,
        so ``iterations`` may exceed ``max_iter``.
    solve_time, setup_time : float
        Seconds, as measured around the solver call.
    backend : str
    qp : QP or None
        The problem that was solved; the residual methods use it.
    info : dict
        Backend-specific extras (raw status, infeasibility certificates, ...).
    """

    x: np.ndarray
    z: np.ndarray
    z_box: np.ndarray
    status: Status
    iterations: int = 0
    solve_time: float = 0.0
    setup_time: float = 0.0
    backend: str = ""
    qp: QP | None = field(default=None, repr=False, compare=False)
    info: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True when the status is SOLVED or SOLVED_INACCURATE."""
        return self.status.ok

    @property
    def objective(self) -> float:
        """½ xᵀPx + qᵀx (NaN without a problem attached)."""
        if self.qp is None:
            return float("nan")
        return self.qp.objective(self.x)

    def _problem(self, qp: QP | None, duals: bool = True) -> QP:
        from .errors import PolyprojError, ProblemError

        qp = qp if qp is not None else self.qp
        if qp is None:
            raise PolyprojError("this Solution carries no problem; pass qp= to the residual method")
        from .problem import QP, _shape

        if not isinstance(qp, QP):
            raise ProblemError(f"qp must be a polyproj.QP, got {type(qp).__name__}")
        sizes = {"x": (self.x, (qp.n,))}
        if duals:
            sizes.update(z=(self.z, (qp.m,)), z_box=(self.z_box, (qp.n,)))
        shapes = {k: None if v is None else _shape(v, f"this Solution's {k}") for k, (v, _) in sizes.items()}
        bad = [f"{k} {'missing' if shapes[k] is None else shapes[k]} (the problem's: {want})"
               for k, (_, want) in sizes.items() if shapes[k] != want]
        if bad:
            raise ProblemError(f"this Solution does not fit the problem: {', '.join(bad)}")
        for k in ("x", "z", "z_box") if duals else ("x",):  # a Solution built by hand may hold lists
            if not isinstance(getattr(self, k), np.ndarray):
                raise ProblemError(f"this Solution's {k} is a {type(getattr(self, k)).__name__}, not a NumPy array")
        return qp

    def primal_residual(self, qp: QP | None = None) -> float:
        """Largest violation of ``l <= Cx <= u`` and ``lb <= x <= ub`` (inf-norm)."""
        return self._problem(qp, duals=False).primal_violation(self.x)

    def dual_residual(self, qp: QP | None = None) -> float:
        """Inf-norm of ``Px + q + Cᵀz + z_box`` plus multipliers on infinite bounds."""
        qp = self._problem(qp)
        x, z, zb = self.x, self.z, self.z_box
        r = qp.P @ x + qp.q
        if qp.m:
            r = r + qp.C.T @ z
        r = r + zb
        worst = float(np.max(np.abs(r))) if r.size else 0.0
        # a multiplier pushing against an infinite bound is a dual infeasibility
        for mult, lo, hi in ((z, qp.l, qp.u), (zb, qp.lb, qp.ub)):
            if mult.size:
                bad = np.concatenate([_pos(mult)[np.isposinf(hi)], _pos(-mult)[np.isneginf(lo)]])
                if bad.size:
                    worst = max(worst, float(np.max(bad)))
        return worst

    def duality_gap(self, qp: QP | None = None) -> float:
        """|xᵀPx + qᵀx + uᵀz⁺ − lᵀz⁻ + ubᵀz_box⁺ − lbᵀz_box⁻| (qpbenchmark's definition)."""
        qp = self._problem(qp)
        x, z, zb = self.x, self.z, self.z_box
        gap = float(x @ (qp.P @ x) + qp.q @ x)
        gap += _finite_dot(qp.u, _pos(z)) - _finite_dot(qp.l, _pos(-z))
        gap += _finite_dot(qp.ub, _pos(zb)) - _finite_dot(qp.lb, _pos(-zb))
        return abs(gap)

    def residuals(self, qp: QP | None = None) -> dict[str, float]:
        """All three residuals as a dict (primal, dual, gap)."""
        return {
            "primal": self.primal_residual(qp),
            "dual": self.dual_residual(qp),
            "gap": self.duality_gap(qp),
        }


class LazyQPs(Sequence):
    """A batch's element QPs, each built on access: a subclass gives ``__len__`` and ``_item(i)``, 0 <= i < len."""

    def _item(self, i: int) -> Any:
        raise NotImplementedError

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        if not -len(self) <= i < len(self):
            raise IndexError(f"element {i} of a batch of {len(self)}")
        return self._item(int(i) % len(self))


class ElementQPs(LazyQPs):
    """The QPs of a batch, built on access: element ``i`` is ``qp.with_vectors(**{k: v[i]})``.

    A batch of projections solves thousands of QPs that differ only in ``q``; building a QP record
    per element up front costs ~20 µs each, and most callers never look at them.
    """

    def __init__(self, qp: Any, vectors: dict[str, np.ndarray], size: int) -> None:
        self._qp, self._vectors, self._size = qp, vectors, size

    def __len__(self) -> int:
        return self._size

    def _item(self, i: int) -> Any:
        return self._qp.with_vectors(validate=False, **{k: v[i] for k, v in self._vectors.items()})


@dataclass(frozen=True, eq=False)  # array fields: identity, not an ambiguous elementwise ==
class BatchSolution:
    """Results of many QPs sharing P and C (one row per element).

    ``status`` holds one :class:`Status` per element; one failed element never spoils the
    others. ``solution(i)`` returns element ``i`` as a :class:`Solution`.
    """

    x: np.ndarray
    z: np.ndarray
    z_box: np.ndarray
    status: tuple[Status, ...]
    iterations: np.ndarray
    solve_time: float = 0.0
    setup_time: float = 0.0
    backend: str = ""
    qps: Sequence[QP] | None = field(default=None, repr=False, compare=False)
    info: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.status)

    @property
    def ok(self) -> np.ndarray:
        """Boolean mask of elements with a usable solution."""
        return np.array([s.ok for s in self.status], dtype=bool)

    def solution(self, i: int) -> Solution:
        """Element ``i`` as a :class:`Solution` (its ``info``: the batch's ``info["elements"][i]`` where given)."""
        # one integer position (negative from the end), as take() reads them: a float, a bool or an array indexed
        # the arrays otherwise (NumPy's or a list's bare IndexError, or a record of several elements as one)
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise ProblemError(f"solution(i) takes one integer position in the batch, got {type(i).__name__} {i!r:.40}"
                               " (take(idx) selects several)")
        if not -len(self) <= i < len(self):
            raise ProblemError(f"solution({i}): position out of range for a batch of {len(self)}")
        i = int(i) % len(self)
        elements = _element_infos(self)
        info = elements[i] if elements is not None and isinstance(elements[i], dict) else {}
        return Solution(
            x=self.x[i],
            z=self.z[i],
            z_box=self.z_box[i],
            status=self.status[i],
            iterations=int(self.iterations[i]),
            solve_time=self.solve_time / max(len(self), 1),
            backend=self.backend,
            qp=None if self.qps is None else self.qps[i],
            info=dict(info),
        )

    def take(self, idx: Sequence[int] | np.ndarray) -> BatchSolution:
        """The elements ``idx`` as a batch record of their own (times shared out by count)."""
        idx = _indices(idx, len(self))
        share = len(idx) / max(len(self), 1)
        info = dict(self.info)
        elements = _element_infos(self)
        if elements is not None:  # per-element extras follow their elements (a permutation paired them wrongly)
            info["elements"] = [elements[i] for i in idx.tolist()]
        return BatchSolution(self.x[idx], self.z[idx], self.z_box[idx], tuple(self.status[i] for i in idx),
                             self.iterations[idx], self.solve_time * share, self.setup_time * share, self.backend,
                             None if self.qps is None else tuple(self.qps[i] for i in idx), info)

    def put(self, idx: Sequence[int] | np.ndarray, other: BatchSolution) -> BatchSolution:
        """A copy with the elements ``idx`` replaced by those of ``other`` (in order): the inverse of :meth:`take`."""
        idx = _indices(idx, len(self))
        if not isinstance(other, BatchSolution):  # (a Solution's bare TypeError before)
            raise ProblemError(f"put takes a BatchSolution (a batch's take(idx), or BatchSolution.stack([...])), got "
                               f"{type(other).__name__}")
        if len(other) != len(idx):
            raise ProblemError(f"put: {len(idx)} positions but {len(other)} elements to put there")
        # the elements put must be of this batch's problems: other sizes were NumPy's bare broadcast ValueError
        for k in ("x", "z", "z_box"):
            mine, theirs = np.shape(getattr(self, k))[1:], np.shape(getattr(other, k))[1:]
            if mine != theirs:
                raise ProblemError(f"put: the elements' {k} have shape {theirs}, this batch's {mine}")
        x, z, z_box, its = (np.array(v, copy=True) for v in (self.x, self.z, self.z_box, self.iterations))
        x[idx], z[idx], z_box[idx], its[idx] = other.x, other.z, other.z_box, other.iterations
        status = list(self.status)
        for k, i in enumerate(idx.tolist()):
            status[i] = other.status[k]
        # what else describes an element is replaced with it: its extras (info["elements"]) and its problem, so that
        # solution(i) pairs the new x with the new element's info and the residual methods with its QP
        info, mine, theirs = dict(self.info), _element_infos(self), _element_infos(other)
        if mine is not None or theirs is not None:
            elements = list(mine) if mine is not None else [{} for _ in range(len(self))]
            for k, i in enumerate(idx.tolist()):
                elements[i] = theirs[k] if theirs is not None else {}
            info["elements"] = elements
        qps = self.qps
        if qps is not None and other.qps is not None and len(idx):
            qps = _ReplacedQPs(qps, {i: other.qps[k] for k, i in enumerate(idx.tolist())})
        return replace(self, x=x, z=z, z_box=z_box, status=tuple(status), iterations=its, info=info, qps=qps)

    @classmethod
    def stack(cls, sols: list[Solution], backend: str = "", **kw: Any) -> BatchSolution:
        """Stack single solutions into a batch record (at least one)."""
        if not sols:
            raise ProblemError("BatchSolution.stack needs at least one Solution")
        # Solutions of one problem size each: anything else was a bare AttributeError or NumPy's stack ValueError
        bad = next((i for i, s in enumerate(sols) if not isinstance(s, Solution)), None)
        if bad is not None:
            raise ProblemError(f"BatchSolution.stack takes Solutions; element {bad} is a {type(sols[bad]).__name__}")
        for k in ("x", "z", "z_box"):
            shapes = [np.shape(getattr(s, k)) for s in sols]
            odd = next((i for i, shp in enumerate(shapes) if shp != shapes[0]), None)
            if odd is not None:
                raise ProblemError(f"BatchSolution.stack: solution {odd}'s {k} has shape {shapes[odd]}, solution 0's "
                                   f"{shapes[0]} (a batch holds solutions of one problem size)")
        return cls(
            x=np.stack([s.x for s in sols]),
            z=np.stack([s.z for s in sols]),
            z_box=np.stack([s.z_box for s in sols]),
            status=tuple(s.status for s in sols),
            iterations=np.array([s.iterations for s in sols], dtype=np.int64),
            solve_time=kw.pop("solve_time", sum(s.solve_time for s in sols)),
            setup_time=kw.pop("setup_time", sum(s.setup_time for s in sols)),
            backend=backend or (sols[0].backend if sols else ""),
            qps=tuple(s.qp for s in sols) if sols and sols[0].qp is not None else None,
            **kw,
        )


def _element_infos(bs: BatchSolution) -> list | tuple | None:
    """The batch's per-element extras, ``info["elements"]``, where given as one dict per element (else None)."""
    elements = bs.info.get("elements") if isinstance(bs.info, dict) else None
    if isinstance(elements, (list, tuple)) and len(elements) == len(bs):
        return elements
    return None


class _ReplacedQPs(LazyQPs):
    """The QPs of a batch with some elements' replaced (:meth:`BatchSolution.put`), without building the others."""

    def __init__(self, base: Sequence, replaced: dict[int, Any]) -> None:
        self._base, self._replaced = base, replaced

    def __len__(self) -> int:
        return len(self._base)

    def _item(self, i: int) -> Any:
        return self._replaced[i] if i in self._replaced else self._base[i]


def _indices(idx: Any, size: int) -> np.ndarray:
    """Positions in a batch of ``size``: integers (negative from the end) or a boolean mask of length ``size``."""
    arr = np.asarray(idx)
    if arr.dtype == bool:
        if arr.shape != (size,):
            raise ProblemError(f"a boolean mask of a batch of {size} must have shape ({size},), got {arr.shape}")
        return np.flatnonzero(arr)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ProblemError(f"batch positions must be integers or a boolean mask, got dtype {arr.dtype}")
    arr = arr.astype(np.intp).reshape(-1)
    if arr.size and (arr.max() >= size or arr.min() < -size):
        raise ProblemError(f"batch positions {arr.tolist()[:5]} out of range for a batch of {size}")
    return np.where(arr < 0, arr + size, arr)
