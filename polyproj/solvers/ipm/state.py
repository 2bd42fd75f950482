"""The IPM's state as named structures: the iterate, the best point so far, the loop and its resumption.

The structures built in every iteration (:class:`Iterate`, :class:`KKTPoint`, :class:`LoopState`)
are slotted, not frozen, dataclasses (a frozen one costs several times more to build): they are
never changed in place; every step builds new ones.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .arrays import take_rows
from .scaling import Scaling

__all__ = ["Iterate", "KKTPoint", "LoopState", "ResumeState"]


def _map(obj: Any, f: Any) -> Any:
    """``obj`` with ``f`` applied to every field (None stays None)."""
    return type(obj)(*(None if (v := getattr(obj, k.name)) is None else f(v) for k in fields(obj)))


@dataclass(slots=True)
class Iterate:
    """A primal–dual point of the scaled problem, or a Newton direction (the same fields as increments).

    Attributes
    ----------
    x : (b, n)
    sl, zl : (b, M)
        Slacks and multipliers of the lower sides of the rows of ``G`` (1 and 0 where there is none).
    su, zu : (b, M)
        The same for the upper sides.
    y : (b, p) or None
        Multipliers of the equality rows (None in a direction without equality rows).
    """

    x: Any
    sl: Any
    zl: Any
    su: Any
    zu: Any
    y: Any

    def take(self, xp: Any, idx: Any) -> Iterate:
        """The elements ``idx``."""
        return _map(self, lambda a: take_rows(xp, a, idx))


@dataclass(slots=True)
class KKTPoint:
    """An unscaled point with its residuals and tolerances (qpbenchmark's definitions, see :mod:`.termination`).

    Attributes
    ----------
    x, z, z_box : (b, n), (b, m), (b, n)
    pres, dres, gap : (b,)
        Primal residual, dual residual and duality gap.
    tp, td, tg : (b,)
        Their tolerances (with the float32 floor).
    conv : (b,) bool
        Within the tolerances, or within their floor (the float64 rounding of the residuals' largest terms, the
        float32 floor): converged.
    near : (b,) bool
        Within 1000 times the tolerances, or within their floor once (SOLVED_INACCURATE when the iteration ends
        there unfinished).
    """

    x: Any
    z: Any
    z_box: Any
    pres: Any
    dres: Any
    gap: Any
    tp: Any
    td: Any
    tg: Any
    conv: Any
    near: Any

    def take(self, xp: Any, idx: Any) -> KKTPoint:
        """The elements ``idx``."""
        return _map(self, lambda a: take_rows(xp, a, idx))

    def update(self, xp: Any, mask: Any, new: KKTPoint) -> KKTPoint:
        """``new`` where ``mask`` (b,), else ``self``."""
        m2 = mask[:, None]
        return KKTPoint(xp.where(m2, new.x, self.x), xp.where(m2, new.z, self.z), xp.where(m2, new.z_box, self.z_box),
                        *(xp.where(mask, a, o) for a, o in ((new.pres, self.pres), (new.dres, self.dres),
                                                             (new.gap, self.gap), (new.tp, self.tp),
                                                             (new.td, self.td), (new.tg, self.tg),
                                                             (new.conv, self.conv), (new.near, self.near))))


@dataclass(slots=True)
class LoopState:
    """The state of the iteration between two steps.

    Attributes
    ----------
    it : int
        The iteration whose termination test comes next.
    iterate : Iterate
    best : KKTPoint or None
        The last finite unscaled point of each element (returned for MAX_ITER / TIME_LIMIT).
    status : (b,) int32
        Codes of :data:`~.result.CODES`, :data:`~.result.RUNNING` while iterating.
    iterations : (b,) int32
    pin_cnt, din_cnt : (b,) int32
        Consecutive iterations with a primal / dual infeasibility certificate.
    stale : (b,) int32
        Iterations since the best point's distance to the tolerances was last halved (:func:`~.termination.record`:
        an element near them that stays stale has stalled).
    ref : (b,) float or None
        That distance when it was last halved (None before the first point).
    """

    it: int
    iterate: Iterate
    best: KKTPoint | None
    status: Any
    iterations: Any
    pin_cnt: Any
    din_cnt: Any
    stale: Any
    ref: Any = None

    def take(self, xp: Any, idx: Any) -> LoopState:
        """The elements ``idx``."""
        return LoopState(self.it, self.iterate.take(xp, idx), None if self.best is None else self.best.take(xp, idx),
                         *(take_rows(xp, a, idx) for a in (self.status, self.iterations, self.pin_cnt, self.din_cnt,
                                                            self.stale)),
                         None if self.ref is None else take_rows(xp, self.ref, idx))


@dataclass(frozen=True)
class ResumeState:
    """What a run needs to continue on a subset of its elements exactly where it stopped.

    Attributes
    ----------
    scaling : Scaling
        The scaling the run was made with.
    e_idx : array or None
        Its equality rows (the union over the original batch).
    loop : LoopState
    """

    scaling: Scaling
    e_idx: Any
    loop: LoopState

    def take(self, xp: Any, idx: Any) -> ResumeState:
        """The state of the elements ``idx``."""
        return ResumeState(self.scaling.take(xp, idx), self.e_idx, self.loop.take(xp, idx))
