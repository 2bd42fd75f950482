"""Assembly of the DIF QP (docs/dif.md) and its exact solution through the polyproj registry.

For a removal Zʳ and a KKT point (θ̄, λ̄) the directional derivative ω* = Dθ(ε̄; Δε) solves::

    min_ω  ⟨c, ω⟩ + ½ ωᵀHω
    s.t.   ∇gⱼ(θ̄)ᵀω + rⱼ = 0   (binding, λ̄ⱼ > 0, and equality constraints)
           ∇gⱼ(θ̄)ᵀω + rⱼ <= 0  (weakly active, λ̄ⱼ = 0 = gⱼ)
    H = ∇²f₀ + Σ λ̄ⱼ∇²gⱼ,   c = Σₖ wₖ Σ_{z∈Zʳₖ} Δεₖ(z) ∇ℓₖ(z, θ̄),   rⱼ = Σ_{z∈Zʳⱼ} Δεⱼ(z) ℓⱼ(z, θ̄)

with w₀ = 1, wⱼ = λ̄ⱼ. The QP goes to any registered backend, then the exact active-set polish of the
projections (the QP is a projection in the metric of H: :func:`_polish`) makes the answer exact to
rounding whatever the backend's tolerance, as in :func:`polyproj.project`.

The backend sees the QP normalised: its objective (P and q together) divided by ``σ ≈ max|P|`` (a
power of two, so exactly), which moves neither the minimiser nor the active set, then q and u by their
size. An objective multiplied by a positive constant (a loss in other units) thus gives the backend
the same QP, whose absolute tests (ProxSuite's dual infeasibility ``‖Px‖ <= ε‖x‖``) would otherwise
call a small but positive definite P unbounded; the multipliers are scaled back (by σ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import SolverError
from ...problem import QP
from ...projection.qp_polish import metric_factor as _metric_factor
from ...projection.qp_polish import polish_qp as _polish
from ...registry import get_backend
from ...solution import Status

__all__ = ["QPResult", "solve_qp_exact", "solve_qp_exact_batch"]


@dataclass(frozen=True)
class QPResult:
    """Solution of ``min ½xᵀPx + qᵀx  s.t. Cx = u (eq rows), Cx <= u (other rows)``.

    ``z`` follows the polyproj sign convention (Px + q + Cᵀz = 0, z >= 0 on inequality rows);
    ``active`` marks the rows the polish solved as equalities; ``polished`` says whether the exact
    polish was accepted (otherwise x, z are the backend's).
    """

    x: np.ndarray
    z: np.ndarray
    status: Status
    active: np.ndarray
    polished: bool
    backend: str


def _convexified(P: np.ndarray, C: np.ndarray, eq: np.ndarray) -> tuple[np.ndarray, float] | None:
    """``(P + ρ C_eqᵀC_eq, ρ)``, positive semidefinite, or None when no ρ makes it so.

    On the QP's feasible set ``C_eq x = u_eq`` the term ``½ρ‖C_eq x − u_eq‖²`` vanishes, so adding it (with
    ``q − ρ C_eqᵀu_eq``) changes neither the solution nor the multipliers; it makes P positive definite
    exactly when P is positive definite on the null space of C_eq (Finsler's lemma): an indefinite
    Hessian of the Lagrangian with second-order sufficiency on the binding constraints. ρ = 0 when P
    is already positive semidefinite.
    """
    if _metric_factor(P) is not None:
        return P, 0.0
    E = C[eq]
    if E.shape[0] == 0:
        return None
    _, sv, Vt = np.linalg.svd(E)
    rank = int(np.sum(sv > 1e-12 * sv[0])) if sv.size else 0
    Z = Vt[rank:].T  # null space of C_eq
    top = max(1.0, float(np.max(np.abs(P), initial=0.0)))
    if Z.shape[1] and float(np.linalg.eigvalsh(Z.T @ P @ Z)[0]) <= 1e-10 * top:
        return None
    rho = 4.0 * (top + max(0.0, -float(np.linalg.eigvalsh(P)[0]))) / sv[rank - 1] ** 2
    for _ in range(6):
        Pc = P + rho * (E.T @ E)
        if _metric_factor(Pc) is not None:
            return Pc, rho
        rho *= 10.0
    return None


def _not_convex(n: int, C: np.ndarray, batch: int | None):
    res = QPResult(x=np.full(n, np.nan), z=np.full(C.shape[0], np.nan), status=Status.NON_CONVEX,
                   active=np.zeros(C.shape[0], bool), polished=False, backend="")
    return res if batch is None else [res] * batch


def _objective_scale(P: np.ndarray) -> float:
    """σ ≈ max|Pᵢⱼ|, a power of two (exact division), 1 for P = 0 or a non-finite P.

    ``(P/σ, q/σ)`` has the QP's minimiser and multipliers ``z/σ``.
    """
    s = float(np.max(np.abs(P), initial=0.0))
    return float(np.ldexp(1.0, int(np.clip(np.round(np.log2(s)), -1022, 1023)))) if 0.0 < s < np.inf else 1.0


def _scale(q: np.ndarray, u: np.ndarray) -> float:
    s = max(float(np.max(np.abs(q), initial=0.0)), float(np.max(np.abs(u[np.isfinite(u)]), initial=0.0)))
    return s if s > 0 else 1.0


def _qp(P, q, C, u, eq) -> QP:
    lo = np.where(eq, u, -np.inf)
    return QP(P=P, q=q, C=C if C.shape[0] else None, l=lo if C.shape[0] else None,
              u=u if C.shape[0] else None, check_psd=False)


#: statuses that say the QP has no solution: returned as they are, never polished into one
_NO_SOLUTION = (Status.PRIMAL_INFEASIBLE, Status.DUAL_INFEASIBLE, Status.NON_CONVEX)


def _finish(P, q, C, u, eq, x, z, status, backend, s, sigma) -> QPResult:
    """Polish the backend's answer to the QP scaled by ``s`` (P, q already divided by σ); x and z of the original.

    A backend's certificate that the QP has no solution (:data:`_NO_SOLUTION`) is its answer: a finite x beside
    it (ProxSuite's, on an unbounded QP) is not polished into a solution.
    """
    if status in _NO_SOLUTION:
        return QPResult(x=x * s, z=z * (s * sigma), status=status, active=np.zeros(C.shape[0], bool),
                        polished=False, backend=backend)
    if status.ok or np.all(np.isfinite(x)):
        pol = _polish(P, q / s, C, u / s, eq, np.nan_to_num(x), np.nan_to_num(z))
    else:
        pol = None
    if pol is not None:
        xa, za, act = pol
        return QPResult(x=xa * s, z=za * (s * sigma), status=Status.SOLVED, active=act, polished=True,
                        backend=backend)
    return QPResult(x=x * s, z=z * (s * sigma), status=status, active=np.zeros(C.shape[0], bool), polished=False,
                    backend=backend)


def solve_qp_exact(P: np.ndarray, q: np.ndarray, C: np.ndarray, u: np.ndarray, eq: np.ndarray,
                   backend: Any = "proxsuite", **settings: Any) -> QPResult:
    """Solve the QP with ``backend`` (objective and data scaled to unit size), then polish it exactly.

    Parameters
    ----------
    P : (n, n) symmetric, positive semidefinite or on the null space of the eq rows (:func:`_convexified`)
    q : (n,);  C : (k, n);  u : (k,);  eq : (k,) bool (rows ``Cx = u``)
    backend : name or QPSolver instance (any registered backend)
    **settings : unified solver settings (default ``eps_abs=1e-10``)

    Returns
    -------
    QPResult
        ``status`` SOLVED when the polish was accepted; otherwise the backend's status.
    """
    settings.setdefault("eps_abs", 1e-10)
    sigma = _objective_scale(P)
    conv = _convexified(P / sigma, C, eq)
    if conv is None:
        return _not_convex(P.shape[0], C, None)
    P, rho = conv
    q = q / sigma - rho * (C[eq].T @ u[eq]) if rho else q / sigma
    s = _scale(q, u)
    qp = _qp(P, q / s, C, u / s, eq)
    sol = get_backend(backend, **settings).solve(qp)
    return _finish(P, q, C, u, eq, sol.x, sol.z, sol.status, sol.backend, s, sigma)


def solve_qp_exact_batch(P: np.ndarray, Q: np.ndarray, C: np.ndarray, U: np.ndarray, eq: np.ndarray,
                         backend: Any = "proxsuite", **settings: Any) -> list[QPResult]:
    """Many QPs sharing P and C (``Q`` (b, n), ``U`` (b, k)) via the backend's ``solve_batch``.

    Each element is scaled by one common factor (the batch maximum), solved, then polished.
    """
    settings.setdefault("eps_abs", 1e-10)
    if Q.shape[0] == 0:
        return []
    sigma = _objective_scale(P)
    conv = _convexified(P / sigma, C, eq)
    if conv is None:
        return _not_convex(P.shape[0], C, Q.shape[0])
    P, rho = conv
    Q = Q / sigma - rho * (U[:, eq] @ C[eq]) if rho else Q / sigma
    s = max(_scale(Q.ravel(), U.ravel()), 1e-300)
    base = _qp(P, Q[0] / s, C, U[0] / s, eq)
    kw: dict[str, Any] = {"q": Q / s}
    if C.shape[0]:
        kw["u"] = U / s
        kw["l"] = np.where(eq[None, :], U / s, -np.inf)
    bs = get_backend(backend, **settings).solve_batch(base, **kw)
    if len(bs) != Q.shape[0]:
        raise SolverError(f"backend {bs.backend!r} returned {len(bs)} solutions for a batch of {Q.shape[0]}")
    return [_finish(P, Q[i], C, U[i], eq, bs.x[i], bs.z[i], bs.status[i], bs.backend, s,
                    sigma) for i in range(Q.shape[0])]
