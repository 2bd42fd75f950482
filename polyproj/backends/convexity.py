"""Convexity check shared by backends whose solver would silently accept an indefinite P.

``QP(check_psd=False)`` (used on hot paths such as projections, where ``P = I``) skips the
eigenvalue check; a backend calls :func:`is_nonconvex` before solving and returns
``Status.NON_CONVEX`` instead of a silent answer. Diagonal P (projections) costs O(n²) at most,
and the answer is cached per P.
"""

from __future__ import annotations

from ..problem import QP, matrix_scale, smallest_eigenvalue
from .cache import converted

__all__ = ["is_nonconvex", "is_strictly_convex"]


def is_nonconvex(qp: QP, always: bool = False) -> bool:
    """True when P has an eigenvalue below ``-1e-8 max|P|``.

    Checked only where the ``QP`` did not decide it (``psd_known``), or ``always``.
    """
    if (getattr(qp, "psd_known", qp.check_psd) and not always) or qp.n == 0:
        return False

    def check() -> bool:
        lam = smallest_eigenvalue(qp.P, iterative=True)
        return lam is not None and lam < -1e-8 * matrix_scale(qp.P)

    # cached per P (projections solve many QPs sharing P = I: the check runs once)
    return converted("nonconvex", (qp.P,), None, check)


def is_strictly_convex(qp: QP) -> bool:
    """True when P is positive definite (then the QP cannot be unbounded); False if unknown."""
    if qp.n == 0:
        return False

    def check() -> bool:
        lam = smallest_eigenvalue(qp.P)
        return lam is not None and lam > 1e-12 * matrix_scale(qp.P)

    return converted("strictly_convex", (qp.P,), None, check)  # cached per P, as is_nonconvex
