"""Convexity check shared by backends whose solver would silently accept an indefinite P.

``QP(check_psd=False)`` (used on hot paths such as projections, where ``P = I``) skips the
eigenvalue check; a backend calls :func:`is_nonconvex` before solving and returns
``Status.NON_CONVEX`` instead of a silent answer. Diagonal P (projections) costs O(n²) at most,
and the answer is cached per P.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..problem import QP
from .cache import converted

__all__ = ["is_nonconvex"]


def is_nonconvex(qp: QP, always: bool = False) -> bool:
    """True when P has an eigenvalue below ``-1e-8 max|P|`` (checked only if ``QP`` did not, or ``always``)."""
    if (qp.check_psd and not always) or qp.n == 0:
        return False
    # cached per P (projections solve many QPs sharing P = I: the check runs once)
    return converted("nonconvex", (qp.P,), None, lambda: _min_eigenvalue_negative(qp.P, qp.n))


def _min_eigenvalue_negative(P, n: int) -> bool:
    scale = max(1.0, float(abs(P).max()))
    diag = P.diagonal() if sp.issparse(P) else np.diag(P)
    if np.any(diag < -1e-8 * scale):
        return True
    offdiag = (P - sp.diags(diag)).count_nonzero() if sp.issparse(P) else np.count_nonzero(P - np.diag(diag))
    if offdiag == 0:
        return False
    from scipy.linalg import eigvalsh
    from scipy.sparse.linalg import eigsh

    if n <= 3000:
        lam = eigvalsh(P.toarray() if sp.issparse(P) else P, subset_by_index=[0, 0])[0]
    else:
        lam = eigsh(sp.csc_matrix(P), k=1, which="SA", return_eigenvectors=False)[0]
    return bool(lam < -1e-8 * scale)


def is_strictly_convex(qp: QP) -> bool:
    """True when P is positive definite (then the QP cannot be unbounded); False if unknown."""
    if qp.n == 0:
        return False
    P = qp.P
    diag = P.diagonal() if sp.issparse(P) else np.diag(P)
    offdiag = (P - sp.diags(diag)).count_nonzero() if sp.issparse(P) else np.count_nonzero(P - np.diag(diag))
    if offdiag == 0:
        return bool(np.all(diag > 0))
    if qp.n > 3000:
        return False
    from scipy.linalg import eigvalsh

    lam = eigvalsh(P.toarray() if sp.issparse(P) else P, subset_by_index=[0, 0])[0]
    return bool(lam > 1e-12 * max(1.0, float(abs(P).max())))
