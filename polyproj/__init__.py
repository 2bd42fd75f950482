"""polyproj: hard linear constraints as first-class citizens in deep learning.

One interface to QP solvers (pluggable backends selected by name), exact projection onto polyhedra and
structured sets with the active set, and the HS-Jacobian for backpropagation. The layout and the rules
of the house are in ``docs/architecture.md``.
"""

from . import sets
from ._version import __version__
from .api import project, solve_qp
from .backends.base import Capabilities, QPSolver
from .errors import (
    BackendNotFound,
    BackendUnavailable,
    InfeasibleError,
    PolyprojError,
    PolyprojWarning,
    ProblemError,
    SettingsError,
    SolverError,
)
from .problem import QP, Polyhedron
from .projection import ProjectionResult, hs_jacobian, hs_vjp
from .registry import available_backends, backend_info, get_backend, register_backend, unregister_backend
from .sets import Projector
from .solution import BatchSolution, Solution, Status

__all__ = [
    "QP",
    "BackendNotFound",
    "BackendUnavailable",
    "BatchSolution",
    "Capabilities",
    "InfeasibleError",
    "Polyhedron",
    "PolyprojError",
    "PolyprojWarning",
    "ProblemError",
    "ProjectionResult",
    "Projector",
    "QPSolver",
    "SettingsError",
    "Solution",
    "SolverError",
    "Status",
    "__version__",
    "available_backends",
    "backend_info",
    "get_backend",
    "hs_jacobian",
    "hs_vjp",
    "project",
    "register_backend",
    "sets",
    "solve_qp",
    "unregister_backend",
]
