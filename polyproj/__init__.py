"""polyproj: hard linear constraints as first-class citizens in deep learning.

One interface to QP solvers (pluggable backends selected by name), exact projection onto
polyhedra with the active set, and the HS-Jacobian for backpropagation. See DESIGN §3.
"""

from .api import solve_qp
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
from .hs_jacobian import hs_jacobian, hs_vjp
from .problem import QP, Polyhedron
from .projector import ProjectionResult, project
from .registry import available_backends, backend_info, get_backend, register_backend, unregister_backend
from .solution import BatchSolution, Solution, Status

__version__ = "0.1.0"

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
    "solve_qp",
    "unregister_backend",
]
