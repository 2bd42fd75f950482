"""Assembly of the DIF QP (DESIGN §10) and its exact solution through the polyproj registry.

For a removal Zʳ and a KKT point (θ̄, λ̄) the directional derivative ω* = Dθ(ε̄; Δε) solves::

    min_ω  ⟨c, ω⟩ + ½ ωᵀHω
    s.t.   ∇gⱼ(θ̄)ᵀω + rⱼ = 0   (binding, λ̄ⱼ > 0, and equality constraints)
           ∇gⱼ(θ̄)ᵀω + rⱼ <= 0  (weakly active, λ̄ⱼ = 0 = gⱼ)
    H = ∇²f₀ + Σ λ̄ⱼ∇²gⱼ,   c = Σₖ wₖ Σ_{z∈Zʳₖ} Δεₖ(z) ∇ℓₖ(z, θ̄),   rⱼ = Σ_{z∈Zʳⱼ} Δεⱼ(z) ℓⱼ(z, θ̄)

with w₀ = 1, wⱼ = λ̄ⱼ. The QP goes to any registered backend, then an exact active-set polish (the
equality-constrained KKT system on the identified active rows, accepted when primal and dual
feasible) makes the answer exact to rounding whatever the backend's tolerance, as in
:func:`polyproj.project`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import SolverError
from ...problem import QP
from ...registry import get_backend
from ...solution import Status

__all__ = ["QPResult", "kkt_solve", "solve_qp_exact", "solve_qp_exact_batch"]


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


def kkt_solve(P: np.ndarray, q: np.ndarray, C: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Solve ``[[P, Cᵀ], [C, 0]] [x; z] = [-q; u]`` (least squares when singular)."""
    n, k = P.shape[0], C.shape[0]
    K = np.zeros((n + k, n + k))
    K[:n, :n], K[:n, n:], K[n:, :n] = P, C.T, C
    rhs = np.concatenate([-q, u])
    try:
        sol = np.linalg.solve(K, rhs)
        if not np.all(np.isfinite(sol)) or np.linalg.norm(K @ sol - rhs) > 1e-8 * (1 + np.linalg.norm(rhs)):
            raise np.linalg.LinAlgError
    except np.linalg.LinAlgError:
        sol = np.linalg.lstsq(K, rhs, rcond=None)[0]
    return sol[:n], sol[n:]


def _polish(P, q, C, u, eq, x, z, max_rounds: int = 50) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Exact active-set polish started from the backend's (x, z); None when it does not settle."""
    m = C.shape[0]
    scale = 1.0 + float(np.max(np.abs(u), initial=0.0)) + float(np.max(np.abs(q), initial=0.0))
    slack = u - C @ x
    zscale = 1.0 + float(np.max(np.abs(z), initial=0.0))
    act = eq | (slack <= 1e-6 * scale) | (z > 1e-6 * zscale)
    seen = set()
    for _ in range(max_rounds):
        key = act.tobytes()
        if key in seen:
            return None
        seen.add(key)
        xa, za = kkt_solve(P, q, C[act], u[act])
        zf = np.zeros(m)
        zf[act] = za
        viol = C @ xa - u
        viol[eq] = 0.0
        viol[act] = 0.0
        feas_tol = 1e-12 * (1.0 + float(np.max(np.abs(u), initial=0.0)) + float(np.max(np.abs(C @ xa), initial=0.0)))
        neg = np.where(act & ~eq, -zf, 0.0)
        dual_tol = 1e-12 * (1.0 + float(np.max(np.abs(zf), initial=0.0)))
        worst_v, worst_d = float(np.max(viol, initial=0.0)), float(np.max(neg, initial=0.0))
        if worst_v <= feas_tol and worst_d <= dual_tol:
            zf[~eq] = np.maximum(zf[~eq], 0.0)
            return xa, zf, act
        act = act.copy()
        if worst_d > dual_tol and (worst_d / dual_tol >= worst_v / feas_tol or worst_v <= feas_tol):
            act[int(np.argmax(neg))] = False
        else:
            act[int(np.argmax(viol))] = True
    return None


def _scale(q: np.ndarray, u: np.ndarray) -> float:
    s = max(float(np.max(np.abs(q), initial=0.0)), float(np.max(np.abs(u[np.isfinite(u)]), initial=0.0)))
    return s if s > 0 else 1.0


def _qp(P, q, C, u, eq) -> QP:
    lo = np.where(eq, u, -np.inf)
    return QP(P=P, q=q, C=C if C.shape[0] else None, l=lo if C.shape[0] else None,
              u=u if C.shape[0] else None, check_psd=False)


def _finish(P, q, C, u, eq, x, z, status, backend, s) -> QPResult:
    if status.ok or np.all(np.isfinite(x)):
        pol = _polish(P, q / s, C, u / s, eq, np.nan_to_num(x), np.nan_to_num(z))
    else:
        pol = None
    if pol is not None:
        xa, za, act = pol
        return QPResult(x=xa * s, z=za * s, status=Status.SOLVED, active=act, polished=True, backend=backend)
    return QPResult(x=x * s, z=z * s, status=status, active=np.zeros(C.shape[0], bool), polished=False,
                    backend=backend)


def solve_qp_exact(P: np.ndarray, q: np.ndarray, C: np.ndarray, u: np.ndarray, eq: np.ndarray,
                   backend: Any = "proxsuite", **settings: Any) -> QPResult:
    """Solve the QP with ``backend`` (data scaled to unit size), then polish it exactly.

    Parameters
    ----------
    P : (n, n) symmetric PSD;  q : (n,);  C : (k, n);  u : (k,);  eq : (k,) bool (rows ``Cx = u``)
    backend : name or QPSolver instance (any registered backend)
    **settings : unified solver settings (default ``eps_abs=1e-10``)

    Returns
    -------
    QPResult
        ``status`` SOLVED when the polish was accepted; otherwise the backend's status.
    """
    settings.setdefault("eps_abs", 1e-10)
    s = _scale(q, u)
    qp = _qp(P, q / s, C, u / s, eq)
    sol = get_backend(backend, **settings).solve(qp)
    if sol.status in (Status.PRIMAL_INFEASIBLE, Status.DUAL_INFEASIBLE, Status.NON_CONVEX):
        return QPResult(x=sol.x, z=sol.z, status=sol.status, active=np.zeros(C.shape[0], bool), polished=False,
                        backend=sol.backend)
    return _finish(P, q, C, u, eq, sol.x, sol.z, sol.status, sol.backend, s)


def solve_qp_exact_batch(P: np.ndarray, Q: np.ndarray, C: np.ndarray, U: np.ndarray, eq: np.ndarray,
                         backend: Any = "proxsuite", **settings: Any) -> list[QPResult]:
    """Many QPs sharing P and C (``Q`` (b, n), ``U`` (b, k)) via the backend's ``solve_batch``.

    Each element is scaled by one common factor (the batch maximum), solved, then polished.
    """
    settings.setdefault("eps_abs", 1e-10)
    if Q.shape[0] == 0:
        return []
    s = max(_scale(Q.ravel(), U.ravel()), 1e-300)
    base = _qp(P, Q[0] / s, C, U[0] / s, eq)
    kw: dict[str, Any] = {"q": Q / s}
    if C.shape[0]:
        kw["u"] = U / s
        kw["l"] = np.where(eq[None, :], U / s, -np.inf)
    bs = get_backend(backend, **settings).solve_batch(base, **kw)
    if len(bs) != Q.shape[0]:
        raise SolverError(f"backend {bs.backend!r} returned {len(bs)} solutions for a batch of {Q.shape[0]}")
    return [_finish(P, Q[i], C, U[i], eq, bs.x[i], bs.z[i], bs.status[i], bs.backend, s) for i in range(Q.shape[0])]
