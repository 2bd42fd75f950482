"""Top-level solve function."""

from __future__ import annotations

from typing import Any

from .errors import ProblemError
from .problem import QP
from .registry import get_backend
from .solution import Solution

__all__ = ["solve_qp"]


def solve_qp(qp: QP, backend: Any = None, *, warm_start: Any = None, **settings: Any) -> Solution:
    """Solve a convex QP with the chosen backend.

    Parameters
    ----------
    qp : QP
    backend : str, QPSolver or QPSolver subclass, optional
        Default ``polyproj.registry.DEFAULT_BACKEND`` (``"piqp"``, chosen on the Maros–Meszaros
        benchmark: README); see :func:`polyproj.available_backends`.
    warm_start : Solution or dict with ``x`` (and ``z``, ``z_box``), optional
    **settings
        ``eps_abs``, ``eps_rel``, ``max_iter``, ``time_limit``, ``verbose``, ``warm_start`` and
        backend-specific options.

    Returns
    -------
    Solution
        Infeasibility and limits are statuses, never exceptions.

    Examples
    --------
    >>> import numpy as np, polyproj as pp
    >>> qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
    >>> sol = pp.solve_qp(qp)
    >>> sol.status.name, np.round(sol.x, 6)
    ('SOLVED', array([0.5, 0.5]))
    """
    if not isinstance(qp, QP):
        raise ProblemError(f"solve_qp takes a polyproj.QP, got {type(qp).__name__}")
    return get_backend(backend, **settings).solve(qp, warm_start=warm_start)
