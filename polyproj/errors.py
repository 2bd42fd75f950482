"""Error hierarchy of polyproj.

Every error raised on purpose by polyproj derives from :class:`PolyprojError`, so
``except pp.PolyprojError`` catches all of them; each also derives from the matching
built-in exception (``ValueError``, ``LookupError``, ...) so generic handlers still work.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .solution import Solution

__all__ = [
    "BackendNotFound",
    "BackendUnavailable",
    "InfeasibleError",
    "PolyprojError",
    "PolyprojWarning",
    "ProblemError",
    "SettingsError",
    "SolverError",
    "close_matches",
]


class PolyprojError(Exception):
    """Base class of every error raised by polyproj."""


class PolyprojWarning(UserWarning):
    """Warning category used by polyproj (inaccurate solves, refused polish, ...)."""


class BackendNotFound(PolyprojError, LookupError):
    """No backend is registered under the requested name."""

    def __str__(self) -> str:  # LookupError would repr() the message
        return str(self.args[0]) if self.args else ""


class BackendUnavailable(PolyprojError, ImportError):
    """The backend is known but its solver package cannot be imported here."""


class ProblemError(PolyprojError, ValueError):
    """Invalid problem data: shapes, dtypes, NaN/inf, non-symmetric or non-PSD P, ..."""


class SettingsError(PolyprojError, TypeError):
    """Unknown or invalid solver setting."""


class SolverError(PolyprojError, RuntimeError):
    """The solver failed in a way that is not a status (crash, broken contract)."""


class InfeasibleError(PolyprojError):
    """A result was required but the problem is infeasible; ``.solution`` holds the details."""

    def __init__(self, message: str, solution: Solution | Any | None = None) -> None:
        super().__init__(message)
        self.solution = solution


def close_matches(name: str, candidates: list[str] | tuple[str, ...]) -> str:
    """Return a ``did you mean ...?`` phrase for ``name`` among ``candidates`` (or '')."""
    by_lower = {c.lower(): c for c in candidates}  # 'OSQP' is 'osqp'
    found = [by_lower[f] for f in difflib.get_close_matches(str(name).lower(), list(by_lower), n=3, cutoff=0.5)]
    if not found:
        return ""
    return " Did you mean " + " or ".join(repr(f) for f in found) + "?"
