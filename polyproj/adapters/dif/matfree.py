"""The matrix-free DIF path: Schur complement over the active constraints, H⁻¹ by Krylov methods.

The DIF QP ``min cᵀω + ½ωᵀHω s.t. C_Bω = u_B, C_Wω <= u_W`` (B: binding and equality rows, W:
weakly active ones) has, for H non-singular, the solution ω = −H⁻¹(c + Cᵀμ) where μ solves the
KKT conditions of the *dual QP*

    min_μ ½μᵀSμ + hᵀμ   s.t.  μ_W >= 0 (μ_B free),   S = C H⁻¹ Cᵀ,  h = C H⁻¹ c + u.

V = H⁻¹Cᵀ is computed once per KKT point (k Krylov solves) and reused by every removal; each
removal then costs one solve H⁻¹c and a k-variable QP, sent to any registered backend and polished
exactly (:func:`~polyproj.adapters.dif.qp.solve_qp_exact`).

When H is positive definite S is too, and the dual QP is convex as written. When H is indefinite
but positive definite on null(C_B) (negative curvature removed by the binding constraints: the
MINRES path), S is indefinite (it has as many negative eigenvalues as H) and the free μ_B are
eliminated first: μ_B = −S_BB⁻¹(h_B + S_BW μ_W) leaves the QP in μ_W >= 0 with the Schur complement
T = S_WW − S_WB S_BB⁻¹ S_BW, which is then positive semidefinite. If it is not, H is not positive
definite on the critical cone (second-order sufficiency fails) and the DIF is not defined.

Under the finite-removal rule (``DIF(..., rule="finite")``) every inequality row is sign-constrained
with a floor, μⱼ >= −λ̄ⱼ (the new multiplier λ̄ⱼ + μⱼ stays >= 0), and B holds the equality rows only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import ProblemError, SolverError
from ...solution import Status
from .krylov import IndefiniteHessianError

__all__ = ["DualQP"]


def _psd(S: np.ndarray) -> bool:
    """S positive semidefinite to rounding, judged on D S D (:func:`_equilibrated`).

    D S D has the inertia of S (Sylvester's law) with every row on one scale: a constraint scaled by 1e-8
    keeps the sign of its eigenvalue.
    """
    if S.shape[0] == 0:
        return True
    w = np.linalg.eigvalsh(_equilibrated(S)[1])
    return bool(w[0] >= -1e-10 * max(1.0, float(np.max(np.abs(w)))))


@dataclass(frozen=True, eq=False)
class DualQP:
    """The dual QP of the DIF at one KKT point: ``S`` (k, k) and which rows are binding (``eq``).

    Use :meth:`build`. ``reduced`` says whether the binding multipliers are eliminated first
    (indefinite S, see the module docstring).
    """

    S: np.ndarray
    eq: np.ndarray
    reduced: bool
    backend: object
    settings: dict
    floor: np.ndarray | None = None

    @classmethod
    def build(cls, S: np.ndarray, eq: np.ndarray, backend: object, settings: dict,
              floor: np.ndarray | None = None) -> DualQP:
        """Check S and choose the full or the reduced form.

        ``floor`` (k,), optional: sign-constrained rows are bounded by μⱼ >= −floorⱼ instead of 0
        (the finite-removal rule: floor = λ̄, so that λ̄ + μ stays >= 0); ignored on ``eq`` rows.
        """
        S = 0.5 * (S + S.T)
        floor = None if floor is None or not np.any(np.asarray(floor)[~eq]) else \
            np.where(eq, 0.0, np.asarray(floor, dtype=np.float64))
        if _psd(S):
            return cls(S, eq, False, backend, dict(settings), floor)
        B, W = np.flatnonzero(eq), np.flatnonzero(~eq)
        SBB = S[np.ix_(B, B)]
        T = S[np.ix_(W, W)] - S[np.ix_(W, B)] @ _pinv(SBB) @ S[np.ix_(B, W)] if B.size else S
        if not _psd(T):
            raise IndefiniteHessianError(
                "the DIF is not defined here: H is not positive definite on the critical cone (second-order "
                "sufficiency fails; the reduced dual matrix has a negative eigenvalue "
                f"{float(np.linalg.eigvalsh(T)[0]):.3e}); add damping", float(np.linalg.eigvalsh(T)[0]))
        return cls(S, eq, True, backend, dict(settings), floor)

    @property
    def k(self) -> int:
        """Number of active rows."""
        return int(self.eq.size)

    def solve_batch(self, Hd: np.ndarray) -> np.ndarray:
        """μ (n, k) for each row of h (n, k)."""
        Hd = np.atleast_2d(Hd)
        if Hd.shape[0] == 0:
            return np.zeros((0, self.k))
        if not self.reduced:
            return self._sign_constrained_qp(self.S, Hd, ~self.eq, self.floor)
        P, Q, B, W, SBBinv_SBW, SBBinv = self._reduction(Hd)
        mu = np.zeros((Hd.shape[0], self.k))
        mu[:, W] = self._sign_constrained_qp(P, Q, np.ones(W.size, bool),
                                             None if self.floor is None else self.floor[W])
        mu[:, B] = -(SBBinv @ Hd[:, B].T).T - mu[:, W] @ SBBinv_SBW.T
        return mu

    def _sign_constrained_qp(self, P: np.ndarray, Q: np.ndarray, signed: np.ndarray,
                             floor: np.ndarray | None = None) -> np.ndarray:
        """``min ½μᵀPμ + qᵀμ s.t. μ_signed >= −floor`` (floor 0 by default) for each row q of Q.

        By the backend + exact polish; with a floor, in ν = μ + floor (ν_signed >= 0, q − P·floor).
        """
        from .qp import solve_qp_exact_batch

        if P.shape[0] == 0:
            return np.zeros((Q.shape[0], 0))
        if not signed.any():
            return _consistent_solve(P, -Q.T).T
        if floor is not None:
            return self._sign_constrained_qp(P, Q - floor @ P, signed) - floor
        Cd = -np.eye(P.shape[0])[signed]
        sols = solve_qp_exact_batch(P, Q, Cd, np.zeros((Q.shape[0], Cd.shape[0])), np.zeros(Cd.shape[0], bool),
                                    backend=self.backend, **self.settings)
        bad = [i for i, s in enumerate(sols) if not s.status.ok]
        if any(sols[i].status is Status.DUAL_INFEASIBLE for i in bad):
            # P = C H⁻¹ Cᵀ is positive semidefinite: this QP in the multipliers is unbounded below exactly when the
            # removal's QP in ω has no point, i.e. dependent rows asked to move inconsistently (the dense path's
            # PRIMAL_INFEASIBLE, engine._qp_error)
            from .engine import INCONSISTENT

            raise ProblemError(INCONSISTENT)
        if bad:
            s = sols[bad[0]]
            raise SolverError(f"the DIF dual QP failed for {len(bad)} of {len(sols)} removals "
                              f"(first #{bad[0]}: {s.status.name}, {s.status.message})")
        return np.array([s.x for s in sols]).reshape(Q.shape[0], -1)

    def _reduction(self, Hd: np.ndarray):
        B, W = np.flatnonzero(self.eq), np.flatnonzero(~self.eq)
        S = self.S
        SBBinv = _pinv(S[np.ix_(B, B)]) if B.size else np.zeros((0, 0))
        SBBinv_SBW = SBBinv @ S[np.ix_(B, W)]
        T = S[np.ix_(W, W)] - S[np.ix_(W, B)] @ SBBinv_SBW
        Q = Hd[:, W] - (S[np.ix_(W, B)] @ (SBBinv @ Hd[:, B].T)).T
        return 0.5 * (T + T.T), Q, B, W, SBBinv_SBW, SBBinv

    def solve(self, h: np.ndarray) -> np.ndarray:
        """μ (k,) for one h (k,)."""
        return self.solve_batch(h[None, :])[0]


def _equilibrated(S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(D, D S D)``, D = diag(1/√|S_ii|) (1 where S_ii = 0): a unit diagonal whatever the rows' scales."""
    s = np.sqrt(np.abs(np.diagonal(S)))
    D = np.where(s > 0, 1.0 / np.where(s > 0, s, 1.0), 1.0)
    return D, D[:, None] * S * D[None, :]


def _pinv(S: np.ndarray) -> np.ndarray:
    """A generalised inverse S⁻ (S S⁻ S = S) of a symmetric matrix: D (D S D)⁺ D, D = :func:`_equilibrated`.

    Dependent active constraints (LICQ failing) make the dual matrix singular; ω = −H⁻¹(c + Gᵀμ) is the
    same for every μ of the solution set, so any solution serves. The pseudo-inverse's cut-off is relative
    to the largest eigenvalue: taken of S itself, it truncated a constraint scaled by 1e-8 against the
    others (eigenvalues 3.6e-18 and 21: "LICQ fails" at 1e-7, ω off by 8e-2 at 1e-8), while equilibrated the
    cut-off sees only true dependence.
    """
    D, Se = _equilibrated(S)
    return D[:, None] * np.linalg.pinv(Se, hermitian=True) * D[None, :]


def _consistent_solve(S: np.ndarray, R: np.ndarray) -> np.ndarray:
    """μ = S⁻R (columns of R); a clear error when S μ = R has no solution (singular S, R off its range).

    Tested on the equilibrated system (D S D)(D⁻¹μ) = D R, where every row has the same scale.
    """
    D, Se = _equilibrated(S)
    Re = D[:, None] * R
    nu = np.linalg.pinv(Se, hermitian=True) @ Re
    res = np.abs(Se @ nu - Re).max(axis=0, initial=0.0)
    scale = np.abs(Re).max(axis=0, initial=0.0) + np.abs(Se).max(initial=0.0) * np.abs(nu).max(axis=0, initial=0.0)
    if (res > 1e-8 * np.maximum(scale, np.finfo(float).tiny)).any():
        from .engine import INCONSISTENT

        raise ProblemError(INCONSISTENT)
    return D[:, None] * nu


#: dimension up to which :func:`reduced_curvature` forms Zᵀ H Z by Hessian-vector products (Lanczos above)
REDUCED_DENSE_DIM = 200


def null_basis(CB: np.ndarray, d: int) -> np.ndarray:
    """An orthonormal basis (d, k) of null(C_B) (the identity when there is no row)."""
    if not CB.shape[0]:
        return np.eye(d)
    _, sv, Vt = np.linalg.svd(CB, full_matrices=True)
    return Vt[int((sv > 1e-12 * sv.max(initial=0.0)).sum()):].T


def reduced_curvature(op, CB: np.ndarray) -> tuple[float, float]:
    """(λ_min, λ_max) of H on null(C_B): the second-order condition MINRES needs and does not check itself.

    MINRES solves with any non-singular H; the DIF is defined only where H is positive definite on the
    null space of the binding rows C_B (second-order sufficiency). For d <= :data:`REDUCED_DENSE_DIM`:
    Zᵀ H Z exactly (Z an orthonormal basis of null(C_B), one product a column); above, the extreme
    eigenvalues of P H P (P the orthogonal projector onto null(C_B)) by Lanczos (``eigsh``): its
    eigenvalues are those of Zᵀ H Z and rank(C_B) zeros, which are shifted above the largest for the
    smallest. NaN where Lanczos does not converge. ``op``: ``matvec``, ``dim``. (inf, 0) when null(C_B) = {0}.
    """
    import scipy.sparse.linalg as spla

    d = int(op.dim)
    if d <= REDUCED_DENSE_DIM:
        Z = null_basis(CB, d)
        if not Z.shape[1]:
            return np.inf, 0.0
        HZ = np.column_stack([op.matvec(Z[:, i]) for i in range(Z.shape[1])])
        w = np.linalg.eigvalsh(0.5 * (Z.T @ HZ + HZ.T @ Z))
        return float(w[0]), float(w[-1])
    Q = np.zeros((d, 0))
    if CB.shape[0]:
        U, sv, _ = np.linalg.svd(CB.T, full_matrices=False)
        Q = U[:, sv > 1e-12 * sv.max(initial=0.0)]

    def pv(v):
        v = np.asarray(v).reshape(-1)
        v = v - Q @ (Q.T @ v)
        hv = op.matvec(v)
        return hv - Q @ (Q.T @ hv)

    A = spla.LinearOperator((d, d), matvec=pv, rmatvec=pv, dtype=np.float64)
    kw = dict(k=1, tol=1e-6, maxiter=max(1000, 20 * d), return_eigenvectors=False)
    try:
        top = float(spla.eigsh(A, which="LA", **kw)[0])
        # P H P has rank(C_B) exact zeros (range(C_Bᵀ)), which would read as a singular H: shifted to c > top,
        # the smallest eigenvalue left is Zᵀ H Z's (or c, when all of them exceed it)
        c = 2.0 * abs(top) if top != 0.0 else 1.0

        def shifted(v):
            v = np.asarray(v).reshape(-1)
            return pv(v) + c * (Q @ (Q.T @ v))

        B = spla.LinearOperator((d, d), matvec=shifted, rmatvec=shifted, dtype=np.float64)
        low = float(spla.eigsh(B, which="SA", **kw)[0])
    except spla.ArpackNoConvergence:
        return np.nan, np.nan
    return low, top


class KrylovInverse:
    """x = H⁻¹b by CG or MINRES on Hessian-vector products, every solve logged.

    Parameters
    ----------
    op : HessianOperator
    method : {"cg", "minres"}
    rtol : float
        Relative residual of every solve.
    maxiter : int, optional
    preconditioner : LinearOperator or callable, optional
        ≈ H⁻¹, symmetric positive definite (passed to SciPy as ``M``).

    Attributes
    ----------
    log : list of (what, KrylovInfo)
        One entry per solve: what it was for, iterations, true residual.
    """

    def __init__(self, op, method: str = "cg", rtol: float = 1e-10, maxiter: int | None = None,
                 preconditioner=None) -> None:
        self.op, self.method, self.rtol, self.maxiter = op, method, float(rtol), maxiter
        self.preconditioner = preconditioner
        self.log: list = []

    def solve(self, b: np.ndarray, what: str) -> np.ndarray:
        """H⁻¹b; raises :class:`SolverError` when the Krylov method does not reach ``rtol``."""
        from .krylov import check_converged, solve_hessian

        x, info = solve_hessian(self.op, b, method=self.method, rtol=self.rtol, maxiter=self.maxiter,
                                M=self.preconditioner)
        self.log.append((what, info))
        check_converged(info, what, self.rtol)
        return x

    def solve_many(self, B: np.ndarray, what: str) -> np.ndarray:
        """H⁻¹Bᵀ for the rows of B (k, d), as columns (d, k)."""
        return np.column_stack([self.solve(b, f"{what}[{i}]") for i, b in enumerate(B)]) if B.shape[0] else \
            np.zeros((self.op.dim, 0))


def _norm1(H: np.ndarray, d: np.ndarray) -> float:
    """The 1-norm of ``D^-½ H D^-½`` (``d`` the square roots of D)."""
    return float(np.abs(H / np.outer(d, d)).sum(axis=0).max()) if H.size else 0.0


class DenseInverse:
    """x = H⁻¹b with H formed (the exact path's Hessian; Cholesky when positive definite)."""

    def __init__(self, H: np.ndarray) -> None:
        import scipy.linalg

        from .krylov import SINGULAR_CURVATURE

        self.H = H
        #: H singular to rounding: the reciprocal condition number (LAPACK's 1-norm estimate) of H equilibrated
        #: symmetrically, D^-½ H D^-½, at most SINGULAR_CURVATURE / n (the estimate is within n of the 2-norm's).
        #: Cholesky succeeds on such an H (a pivot at rounding) and its solves carry an arbitrary component along
        #: the null space; a badly scaled but well-conditioned H (diag(1e7, 1e-7)) is not singular
        self.singular, self._lu = False, None
        n = H.shape[0]
        try:
            self._chol = scipy.linalg.cho_factor(H)
            factor, lower = self._chol
            d = np.sqrt(np.diag(H))  # positive: H is positive definite here
            # the factor of D^-½ H D^-½ is D^-½ L (rows of L, columns of U scaled)
            eq = factor / d[:, None] if lower else factor / d[None, :]
            rcond = scipy.linalg.lapack.dpocon(eq, _norm1(H, d), uplo="L" if lower else "U")[0] if n else 1.0
        except np.linalg.LinAlgError:  # not positive definite: LU (an indefinite H + δI clear of zero)
            import warnings

            self._chol = None
            d = np.sqrt(np.max(np.abs(H), axis=1, initial=0.0)) if n else np.ones(0)
            d = np.where(d > 0, d, 1.0)
            with warnings.catch_warnings():  # an exactly singular H: its rcond of 0 below says so
                warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
                # one LU, of D^-½ H D^-½: its rcond, and the solves (H⁻¹b = D^-½ (D^-½ H D^-½)⁻¹ D^-½ b)
                self._lu = (scipy.linalg.lu_factor(H / np.outer(d, d), check_finite=False), d)
            rcond = scipy.linalg.lapack.dgecon(self._lu[0][0], _norm1(H, d), norm="1")[0] if n else 1.0
        self.singular = not rcond > SINGULAR_CURVATURE / max(n, 1)
        #: Cholesky succeeded and H is not singular to rounding
        self.positive_definite = self._chol is not None and not self.singular
        self.log: list = []

    def solve(self, b: np.ndarray, what: str) -> np.ndarray:
        """H⁻¹b; a singular H is a :class:`ProblemError` (this product, for ``what``, needs H⁻¹ itself)."""
        import scipy.linalg

        if not np.all(np.isfinite(b)):
            raise ProblemError(f"the right-hand side of H x = b for {what} is not finite (NaN or inf): a gradient of "
                               "the loss, a constraint or the test function is not finite at θ̄")
        try:
            if self.singular:
                raise np.linalg.LinAlgError("singular to rounding")
            if self._chol is not None:
                return scipy.linalg.cho_solve(self._chol, b)
            lu, d = self._lu
            dd = d.reshape(-1, *([1] * (np.ndim(b) - 1)))
            return scipy.linalg.lu_solve(lu, b / dd) / dd
        except np.linalg.LinAlgError as exc:
            raise ProblemError(
                f"H is singular at θ̄, and {what} needs H⁻¹ (the paths through the Schur complement: an executor, "
                "order=2, score jobs). The DIF QP may still be defined (H positive definite on the binding rows' "
                "null space): call influence in process without an executor, or pass damping='auto' (or a "
                "damping of your own) for a nearby, regularised answer") from exc

    def solve_many(self, B: np.ndarray, what: str) -> np.ndarray:
        """H⁻¹Bᵀ (d, k)."""
        return self.solve(B.T, what).reshape(self.H.shape[0], -1) if B.shape[0] else np.zeros((self.H.shape[0], 0))
