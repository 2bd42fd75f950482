"""Checks of backend-specific option values, run when a backend is built.

A backend declares ``option_checks = {"rho": positive, ...}``; :class:`~polyproj.backends.base.QPSolver`
calls each check on the value a user gave (``None`` means the solver's own default and is not checked).
A value a solver would reject later, or silently ignore, becomes a
:class:`~polyproj.errors.SettingsError` naming the option, the backend and what it accepts.

Each check takes the value and returns ``None`` when it is acceptable, else the phrase "must be …". A check
may carry ``convert``, the type the solver is handed: what passes ``positive_int`` (an integral float such as
``1e3`` or ``2.0``) reaches the solver as ``int``, what passes ``boolean`` (0 or 1) as ``bool``, a number as
``float`` (solvers bound in C / Rust refused ``2.0`` for an integer, ``0`` for a flag, at the first solve).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["Check", "boolean", "check_options", "fraction", "nonnegative", "nonnegative_int", "one_of",
           "positive", "positive_int", "text", "unit_interval", "within"]

Check = Callable[[Any], "str | None"]


def _real(v: Any) -> bool:
    if not isinstance(v, numbers.Real) or isinstance(v, (bool, np.bool_)):
        return False
    try:  # a Python int past float's range (10**400) overflows; one past int64's made np.isfinite raise
        return math.isfinite(float(v))
    except (OverflowError, ValueError, TypeError):
        return False


def _integral(v: Any) -> bool:
    return _real(v) and float(v) == int(v)


def _converts(to: type) -> Callable[[Check], Check]:
    def mark(check: Check) -> Check:
        check.convert = to  # type: ignore[attr-defined]
        return check

    return mark


@_converts(float)
def positive(v: Any) -> str | None:
    """A finite number > 0."""
    return None if _real(v) and v > 0 else "must be a finite number > 0"


@_converts(float)
def nonnegative(v: Any) -> str | None:
    """A finite number >= 0."""
    return None if _real(v) and v >= 0 else "must be a finite number >= 0"


@_converts(float)
def fraction(v: Any) -> str | None:
    """A number in (0, 1]."""
    return None if _real(v) and 0 < v <= 1 else "must be a number in (0, 1]"


@_converts(float)
def unit_interval(v: Any) -> str | None:
    """A number in [0, 1]."""
    return None if _real(v) and 0 <= v <= 1 else "must be a number in [0, 1]"


def within(lo: float, hi: float) -> Check:
    """A number in the open interval (lo, hi)."""

    @_converts(float)
    def check(v: Any) -> str | None:
        return None if _real(v) and lo < v < hi else f"must be a number in ({lo:g}, {hi:g})"

    return check


#: the largest count a solver takes: its C / Rust integer (32 bits; OSQP, Clarabel and DAQP failed beyond it
#: with an OverflowError or a TypeError at the first solve)
INT_MAX = 2**31 - 1


@_converts(int)
def positive_int(v: Any) -> str | None:
    """An integer in [1, INT_MAX] (an integral float such as 1e3 is accepted)."""
    return None if _integral(v) and 1 <= v <= INT_MAX else f"must be an integer in [1, {INT_MAX}]"


@_converts(int)
def nonnegative_int(v: Any) -> str | None:
    """An integer in [0, INT_MAX]."""
    return None if _integral(v) and 0 <= v <= INT_MAX else f"must be an integer in [0, {INT_MAX}]"


@_converts(bool)
def boolean(v: Any) -> str | None:
    """True or False (0 and 1 are accepted: some solvers take their flags as integers)."""
    if isinstance(v, (bool, np.bool_)) or (_integral(v) and v in (0, 1)):
        return None
    return "must be True or False"


def text(v: Any) -> str | None:
    """A non-empty string (the solver checks its value)."""
    return None if isinstance(v, str) and v else "must be a non-empty string"


def one_of(*values: Any) -> Check:
    """One of the given values."""

    def check(v: Any) -> str | None:
        return None if any(v == w and type(v) is type(w) for w in values) else f"must be one of {list(values)}"

    return check


def check_options(backend: str, given: dict[str, Any], checks: dict[str, Check]) -> dict[str, Any]:
    """The options as the solver takes them: each checked and converted (``convert``).

    ``None`` is left out (the solver's own default); SettingsError for the first given option whose check fails.
    """
    from ..errors import SettingsError

    out = {}
    for k, v in given.items():
        if v is None:
            continue
        check = checks.get(k)
        if check is not None:
            why = check(v)
            if why is not None:
                raise SettingsError(f"option {k!r} of backend {backend!r} {why}, got {v!r}")
            convert = getattr(check, "convert", None)
            v = convert(v) if convert is not None else v
        out[k] = v
    return out
