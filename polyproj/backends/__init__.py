"""Solver backends: one module per solver, each a :class:`~polyproj.backends.base.QPSolver`.

Modules here import their solver package lazily (inside methods), so importing
``polyproj.backends`` never imports an optional dependency.
"""

from .base import Capabilities, QPSolver

__all__ = ["Capabilities", "QPSolver"]
