"""The result of a projection: :class:`ProjectionResult` (what every :class:`~polyproj.sets.Projector` returns)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..solution import Status

__all__ = ["Degeneracy", "ProjectionResult"]


def _own_copy(a: Any) -> Any:
    """A copy of an array of any namespace (NumPy, torch, CuPy, ...), on its device."""
    if isinstance(a, np.ndarray):
        return a.copy()
    from array_api_compat import array_namespace

    return array_namespace(a).asarray(a, copy=True)


class Degeneracy:
    """Where the HS-Jacobian element was chosen among several: per sample, in the result's namespace.

    At a degenerate point several active sets ``K`` satisfy the HS set's conditions and give different
    elements ``I − M_K⁺M_K``; the element used (the projector onto the null space of *all* active rows)
    is one of them. Two causes are reported:

    Attributes
    ----------
    weak : (batch,) bool
        A weakly active row: active with a zero multiplier (to rounding at the sample's scale), so that
        a nearby point can have it inactive.
    dependent : (batch,) bool
        Active rows linearly dependent beyond what the set's structure implies (LICQ fails there: the
        multipliers are not unique), e.g. a Birkhoff face whose support splits into several blocks.
        A set may give it as a function, evaluated on first access (it can cost a factorisation of
        every face, which a training step that never reads the report should not pay).
    """

    __slots__ = ("_dependent", "_dependent_fn", "weak")

    def __init__(self, weak: Any, dependent: Any = None, *, dependent_fn: Callable[[], Any] | None = None) -> None:
        if (dependent is None) == (dependent_fn is None):
            raise TypeError("Degeneracy takes dependent or dependent_fn (one of them)")
        self.weak, self._dependent, self._dependent_fn = weak, dependent, dependent_fn

    @property
    def dependent(self) -> Any:
        """(batch,) bool: dependent active rows (computed on first access when given as a function)."""
        if self._dependent is None:
            self._dependent, self._dependent_fn = self._dependent_fn(), None
        return self._dependent

    @property
    def any(self) -> Any:
        """``weak | dependent``: the samples where the element was a choice."""
        return self.weak | self.dependent

    def single(self) -> Degeneracy:
        """The report of a batch of one as plain booleans."""
        if self._dependent is None:
            weak, fn = self.weak, self._dependent_fn
            return Degeneracy(bool(weak[0]), dependent_fn=lambda: bool(fn()[0]))
        return Degeneracy(bool(self.weak[0]), bool(self.dependent[0]))

    def __repr__(self) -> str:
        dep = "(not computed)" if self._dependent is None else repr(self._dependent)
        return f"Degeneracy(weak={self.weak!r}, dependent={dep})"

    def __getstate__(self) -> tuple:
        """Pickled with ``dependent`` computed: the lazy test is a closure over the batch (not picklable)."""
        return (self.weak, self.dependent)

    def __setstate__(self, state: tuple) -> None:
        self.weak, self._dependent = state
        self._dependent_fn = None


@dataclass(frozen=True, eq=False)  # array fields: no elementwise ==, which has no truth value
class ProjectionResult:
    """Projections of a batch onto a set, with what the HS-Jacobian needs.

    Arrays are in the namespace and on the device of the input. For a single point ``x`` of shape
    ``(n,)`` the batch dimension is dropped from every array and ``status`` / ``polished`` are scalars.

    Attributes
    ----------
    y : (batch, n)
        The projections.
    active : (batch, n_ineq) bool
        Active inequality rows, numbered as in the set's :meth:`~polyproj.sets.Projector.as_polyhedron`
        (rows of A, then finite lb, then finite ub).
    multipliers : (batch, n_ineq + m_eq)
        KKT multipliers: ``>= 0`` for inequality rows, free for the rows of B, with
        ``y − x + A_Iᵀλ_I + Bᵀμ − λ_lb + λ_ub = 0``.
    status : Status or tuple of Status
    max_violation : float
        Largest constraint violation over the batch.
    violation : (batch,)
        Largest constraint violation of each returned point (in its dtype: a float32 result includes its
        rounding).
    polished : bool or (batch,) bool
        The KKT conditions were verified (the exact polish, or a closed form).
    backend : str
        The QP backend, or the name of the closed-form method.
    solution : BatchSolution or Solution or None
        What a QP backend returned (NumPy inputs).
    degenerate : Degeneracy or None
        Samples where the HS element was chosen among several: a weakly active row (zero multiplier
        on an active row) or dependent active rows (LICQ fails); ``degenerate.any`` (batch,) bool.
    face : object
        What the set's VJP needs (internal to the set).
    """

    y: Any
    active: Any
    multipliers: Any
    status: Any
    max_violation: float
    violation: Any
    polished: Any
    backend: str
    solution: Any = field(default=None, repr=False)
    degenerate: Any = field(default=None, repr=False)
    face: Any = field(default=None, repr=False, compare=False)
    #: for the result of a single point, the batch of one it came from (what a set's vjp computes on)
    batch_of_one: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The face is what the set's vjp (and a warm start) reads later; the fields are the user's to read and
        # edit. A face that is one of those arrays (the simplices' face is their ``active`` mask) is given its own
        # copy, so an edit of ``result.active`` (or of a single point's, a view of its batch's) cannot change J g.
        face = self.face
        if face is None or not hasattr(face, "shape"):
            return
        public = (self.y, self.active, self.multipliers, self.violation, self.polished)
        if any(v is face or (isinstance(v, np.ndarray) and isinstance(face, np.ndarray)
                             and np.may_share_memory(v, face)) for v in public):
            object.__setattr__(self, "face", _own_copy(face))

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickling (and ``copy.deepcopy``) keeps the face apart from the fields, as construction does."""
        self.__dict__.update(state)
        self.__post_init__()

    @property
    def batched(self) -> bool:
        """False for the result of a single point (no batch dimension)."""
        return not isinstance(self.status, Status)

    def single(self) -> ProjectionResult:
        """The result of a batch of one as the result of a single point (batch dimension dropped)."""
        from ..errors import PolyprojError

        if not self.batched:
            raise PolyprojError("single() takes the result of a batch of one; this is already a single point's")
        if len(self.status) != 1:
            raise PolyprojError(f"single() takes the result of a batch of one, not of {len(self.status)} points "
                                "(index the arrays, e.g. result.y[i], for one of them)")
        sol = self.solution
        if sol is not None and hasattr(sol, "solution"):
            sol = sol.solution(0)
        # [0, ...]: the array API standard (array_api_strict) indexes every axis
        return replace(self, y=self.y[0, ...], active=self.active[0, ...], multipliers=self.multipliers[0, ...],
                       status=self.status[0], violation=self.violation[0], polished=bool(self.polished[0]),
                       solution=sol, degenerate=None if self.degenerate is None else self.degenerate.single(),
                       batch_of_one=self)
