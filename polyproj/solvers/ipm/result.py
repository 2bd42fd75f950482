"""Status codes of the IPM and its result type."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...solution import Status

__all__ = ["CODES", "FIELDS", "RUNNING", "IPMResult", "StatusCodes", "code_to_status"]

#: integer status codes of :attr:`IPMResult.status`
CODES: dict[str, int] = {
    "SOLVED": 0,
    "SOLVED_INACCURATE": 1,
    "PRIMAL_INFEASIBLE": 2,
    "DUAL_INFEASIBLE": 3,
    "MAX_ITER": 4,
    "NUMERICAL_ERROR": 5,
    "TIME_LIMIT": 6,
}
#: code of an element still iterating (never in a final result)
RUNNING = -1
_STATUS_OF_CODE = {v: Status[k] for k, v in CODES.items()}


def code_to_status(code: int) -> Status:
    """Map an integer code of :attr:`IPMResult.status` to :class:`polyproj.Status`."""
    return _STATUS_OF_CODE.get(int(code), Status.NUMERICAL_ERROR)


class StatusCodes:
    """The codes of :data:`CODES` (and :data:`RUNNING`) as (b,) int32 arrays of one batch.

    Made once per run, so that setting a status is one ``where`` (no new constant arrays).
    """

    def __init__(self, xp: Any, b: int, dev: Any) -> None:
        self.xp = xp
        self._arrays = {v: xp.full((b,), v, dtype=xp.int32, device=dev) for v in (*CODES.values(), RUNNING)}
        #: (b,) int32 zeros
        self.zeros = xp.zeros((b,), dtype=xp.int32, device=dev)

    @property
    def running(self) -> Any:
        """All elements :data:`RUNNING`."""
        return self._arrays[RUNNING]

    def set(self, status: Any, mask: Any, name: str) -> Any:
        """``status`` with the code ``CODES[name]`` where ``mask`` (both (b,))."""
        return self.xp.where(mask, self._arrays[CODES[name]], status)


def host_list(a: Any) -> list:
    """Small array -> Python list (one device sync)."""
    if hasattr(a, "tolist"):
        return a.tolist()
    return [a[i].__index__() if hasattr(a[i], "__index__") else float(a[i]) for i in range(a.shape[0])]


@dataclass(frozen=True)
class IPMResult:
    """Result of :func:`~polyproj.solvers.ipm.solve_qp_batch`, in the namespace and on the device of the input.

    Attributes
    ----------
    x : (b, n)
        Primal solutions (NaN for PRIMAL_INFEASIBLE, DUAL_INFEASIBLE and NUMERICAL_ERROR elements).
    z : (b, m)
        Multipliers of ``l <= Cx <= u`` (``z > 0``: upper side active, ``z < 0``: lower side).
    z_box : (b, n)
        Multipliers of ``lb <= x <= ub``; ``Px + q + Cᵀz + z_box = 0``.
    status : (b,) int array
        Codes of :data:`CODES`; :meth:`statuses` maps them to :class:`polyproj.Status`.
    iterations : (b,) int array
        Iterations each element took.
    prim_res, dual_res, gap : (b,)
        Unscaled primal residual, dual residual and duality gap at the returned point.
    """

    x: Any
    z: Any
    z_box: Any
    status: Any
    iterations: Any
    prim_res: Any = field(default=None, repr=False)
    dual_res: Any = field(default=None, repr=False)
    gap: Any = field(default=None, repr=False)

    def statuses(self) -> tuple[Status, ...]:
        """The statuses as :class:`polyproj.Status` (one host transfer of the code array)."""
        return tuple(code_to_status(c) for c in host_list(self.status))


#: the array fields of :class:`IPMResult`, in order
FIELDS = ("x", "z", "z_box", "status", "iterations", "prim_res", "dual_res", "gap")
