"""Top-level functions: :func:`solve_qp` and :func:`project`."""

from __future__ import annotations

from typing import Any

import numpy as np

from .backends.defaults import PROJECTION_DEFAULT
from .errors import ProblemError
from .problem import QP, Polyhedron
from .projection.result import ProjectionResult
from .registry import get_backend
from .sets.base import Projector
from .sets.detect import recognise
from .sets.polyhedral import Polyhedral
from .solution import Solution

__all__ = ["project", "solve_qp"]

_UNSET: Any = object()


def solve_qp(qp: QP, backend: Any = None, *, warm_start: Any = None, **settings: Any) -> Solution:
    """Solve a convex QP with the chosen backend.

    Parameters
    ----------
    qp : QP
    backend : str, QPSolver or QPSolver subclass, optional
        Default ``polyproj.registry.DEFAULT_BACKEND`` (``"piqp"``, chosen on the Maros–Meszaros
        benchmark: README); see :func:`polyproj.available_backends`.
    warm_start : Solution or dict with ``x`` (and ``z``, ``z_box``), or bool, optional
        The start to use; ``False`` turns the backend's warm starts off (the ``warm_start`` setting of
        :func:`polyproj.get_backend`, whose name this keyword takes here), ``True`` leaves them on.
    **settings
        ``eps_abs``, ``eps_rel``, ``max_iter``, ``time_limit``, ``verbose`` and backend-specific options.

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
    if isinstance(warm_start, (bool, np.bool_)):  # the setting, not a start
        settings["warm_start"], warm_start = bool(warm_start), None
    return get_backend(backend, **settings).solve(qp, warm_start=warm_start)


def check_flags(**flags: Any) -> None:
    """A ProblemError for a flag that is not True or False (a string such as "no" is truthy: it read as True)."""
    for name, flag in flags.items():
        if not isinstance(flag, (bool, np.bool_)):
            raise ProblemError(f"{name} must be True or False, got {flag!r}")


def project(X: Any, S: Polyhedron | Projector, backend: Any = _UNSET, *, polish: bool = True, tol: float = 1e-9,
            max_polish_iter: int | None = None, structured: bool = True, **settings: Any) -> ProjectionResult:
    """Project points onto a set exactly, with the active set.

    Parameters
    ----------
    X : (n,) or (batch, n) array of any namespace
        NumPy, PyTorch (any device), CuPy, ``array_api_strict``: the result's arrays are of the same
        namespace, device and (floating) dtype.
    S : Polyhedron or Projector
        A polyhedron (projected by a QP backend, then polished exactly) or any
        :class:`~polyproj.sets.Projector` (``pp.sets.Simplex(n)``, ``pp.sets.Box(lb, ub)``, a set of yours).
    backend : str or QPSolver, optional
        For a Polyhedron: any registered backend, or ``"auto"`` (default, also for None): chosen per call by measurement
        (:func:`polyproj.backends.defaults.auto_projection`: the ADMM start for a batch, DAQP per point
        for a few points or on long thin polytopes (m >= 3n), the batched IPM for per-sample data); batches use
        the backend's native batch path. Not for other Projectors.
    polish : bool
        Polish to the exact projection on the identified active face (default True).
    tol : float
        Relative tolerance of the polish's KKT checks.
    max_polish_iter : int, optional
        Active-set corrections allowed during polish.
    structured : bool
        A Polyhedron that is a structured set (box, simplex, capped simplex, Birkhoff polytope, partial
        matchings, up to row order and scaling: :mod:`polyproj.sets.detect`) is projected by that set's
        exact method when no backend or backend setting is given (default True); False: by a QP backend.
    **settings
        Backend settings (``eps_abs``, ``max_iter``, ...).

    Returns
    -------
    ProjectionResult

    Raises
    ------
    ProblemError
        X of the wrong shape, or holding NaN/inf; settings given for a closed-form set.
    InfeasibleError
        The polyhedron is empty (``.solution`` holds the backend's answer).

    Examples
    --------
    >>> import numpy as np, polyproj as pp
    >>> simplex = pp.Polyhedron(B=np.ones((1, 3)), b=[1.0], lb=np.zeros(3))
    >>> res = pp.project(np.array([0.9, 0.5, -1.0]), simplex)
    >>> np.round(res.y, 12), res.active
    (array([0.7, 0.3, 0. ]), array([False, False,  True]))
    """
    check_flags(polish=polish, structured=structured)
    if backend is None:  # None is "the default", as in solve_qp: here the projection default ("auto"), not the QP one
        backend = _UNSET
    if "warm_start" in settings and not isinstance(settings["warm_start"], (bool, np.bool_)):
        # (the backend's on/off setting; its message printed the whole result given)
        raise ProblemError(f"pp.project's warm_start is the backend's on/off setting, got a "
                           f"{type(settings['warm_start']).__name__}; to start from a previous result's active "
                           "sets use pp.sets.Polyhedral(P).project_batch(X, warm_start=result)")
    if isinstance(S, Polyhedron):
        generic = (backend not in (_UNSET, "auto") or bool(settings) or not polish or tol != 1e-9
                   or max_polish_iter is not None)
        found = None if generic or not structured else recognise(S)
        S = found if found is not None else Polyhedral(S, PROJECTION_DEFAULT if backend is _UNSET else backend,
                                                       polish=polish, tol=tol, max_polish_iter=max_polish_iter,
                                                       **settings)
    elif not isinstance(S, Projector):
        raise ProblemError(f"S must be a polyproj.Polyhedron or a polyproj.Projector, got {type(S).__name__}")
    elif backend is not _UNSET or settings or not polish or tol != 1e-9 or max_polish_iter is not None:
        hint = "" if isinstance(S, Polyhedral) else " (pass S.as_polyhedron() to project with a QP backend)"
        raise ProblemError(f"{type(S).__name__} carries its own method: backend and polish settings go to its "
                           f"constructor{hint}")
    return S.project(X)
