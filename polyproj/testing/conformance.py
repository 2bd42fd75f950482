"""The backend contract, as checks any backend (a third party's included) can run.

``CHECKS`` maps a check name to ``check(solver, rng)``: the check builds its own random problem(s)
from the NumPy generator, runs ``solver`` and raises :class:`AssertionError` with the sizes, the
residuals found and the expected value when the backend breaks the contract. A check that needs a
capability the backend does not declare (``solver.capabilities``) raises :class:`CheckSkipped`
(a :class:`unittest.SkipTest`, so pytest reports it as skipped). No pytest needed::

    import numpy as np, polyproj as pp
    from polyproj.testing.conformance import CHECKS, CheckSkipped
    solver = pp.get_backend("osqp", eps_abs=1e-9)
    for name, check in CHECKS.items():
        try:
            check(solver, np.random.default_rng(0))
        except CheckSkipped as why:
            print(name, "skipped:", why)

What is checked (docs/architecture.md "Conventions", docs/checking_a_backend.md):
KKT residuals (primal, dual — which fixes the multiplier sign
convention ``Px + q + Cᵀz + z_box = 0`` — and duality gap) on feasible random QPs, dense and
sparse, equality-only, bounds-only and degenerate (redundant rows); the sign of the multipliers of
rows known to be active on their upper / lower side; PRIMAL_INFEASIBLE / DUAL_INFEASIBLE statuses on
certified problems; NON_CONVEX (or any non-solved status) for an indefinite P; fewer iterations
with a warm start on a perturbed problem; and agreement with an exact reference (active-set
enumeration in float64, independent of every backend).
"""

from __future__ import annotations

import itertools
import unittest
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from ..backends.base import QPSolver
from ..errors import SolverError
from ..problem import QP
from ..solution import Solution, Status

__all__ = [
    "CHECKS",
    "CheckSkipped",
    "infeasible_qp_with_certificate",
    "kkt_tolerance",
    "random_degenerate_qp",
    "random_feasible_qp",
    "random_infeasible_qp",
    "random_nonconvex_qp",
    "random_unbounded_qp",
    "reference_solution",
]


class CheckSkipped(unittest.SkipTest):
    """The check does not apply to this backend (missing capability)."""


# --------------------------------------------------------------------------- generators
def _pd(rng: np.random.Generator, n: int, cond: float = 1e2) -> np.ndarray:
    """Random symmetric positive definite matrix with condition number about ``cond``."""
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    ev = np.logspace(0, np.log10(cond), n)
    M = (Q * ev) @ Q.T
    # exactly symmetric: the product is symmetric only to rounding, and the sparse variant masks
    # entries by magnitude (an entry at the threshold was kept on one side and dropped on the other
    # with some BLAS builds: P[4, 23] = 3.58, P[23, 4] = 0)
    return (M + M.T) / 2


def random_feasible_qp(rng: np.random.Generator, n: int, m: int, p: int = 0, sparse: bool = False,
                       bounds: bool = True, density: float = 0.3) -> QP:
    """A strictly convex QP feasible by construction, with active constraints at its solution.

    ``x0`` is drawn first; equalities ``Bx = Bx0`` (``p`` rows); inequality rows (``m``) are
    two-sided or one-sided (``±inf`` sides) and contain ``x0`` with margins in [0, 1]; variable bounds
    (when ``bounds``) contain ``x0``. ``q = -P x_far`` with ``x_far`` far from ``x0`` makes several
    constraints active at the optimum.

    Parameters
    ----------
    rng : numpy.random.Generator
    n, m, p : int
        Variables, inequality rows, equality rows (``p < n``).
    sparse : bool
        Return scipy.sparse ``P`` and ``C`` (``C`` with the given ``density``).
    bounds : bool
        Add finite variable bounds on about half of the variables.
    """
    P = _pd(rng, n)
    x0 = rng.standard_normal(n)
    if sparse:
        A = sp.random(m, n, density=density, random_state=rng, data_rvs=rng.standard_normal).toarray()
        A[np.arange(m), rng.integers(0, n, m)] += 1.0  # no empty row
        off = P * (np.abs(P) > np.quantile(np.abs(P), 0.5))
        off -= np.diag(np.diag(off))  # sparse; strictly diagonally dominant, hence positive definite:
        P = off + np.diag(np.abs(off).sum(axis=1) + 1.0)
    else:
        A = rng.standard_normal((m, n))
    B = rng.standard_normal((p, n))
    ax = A @ x0
    l = ax - rng.uniform(0, 1, m)
    u = ax + rng.uniform(0, 1, m)
    kind = rng.integers(0, 3, m)  # 0 two-sided, 1 upper only, 2 lower only
    l[kind == 1] = -np.inf
    u[kind == 2] = np.inf
    C = np.vstack([A, B])
    l = np.concatenate([l, B @ x0])
    u = np.concatenate([u, B @ x0])
    lb = ub = None
    if bounds:
        lb = np.where(rng.random(n) < 0.5, x0 - rng.uniform(0, 1, n), -np.inf)
        ub = np.where(rng.random(n) < 0.5, x0 + rng.uniform(0, 1, n), np.inf)
    q = -P @ (x0 + 3.0 * rng.standard_normal(n))
    if sparse:
        return QP(P=sp.csc_matrix(P), q=q, C=sp.csc_matrix(C), l=l, u=u, lb=lb, ub=ub)
    return QP(P=P, q=q, C=C, l=l, u=u, lb=lb, ub=ub)


def random_degenerate_qp(rng: np.random.Generator, n: int, m: int) -> QP:
    """A feasible QP with redundant rows: duplicated rows, a scaled copy and a sum of two rows.

    LICQ fails (the multipliers are not unique) but the primal solution is; a backend must still
    return a KKT point.
    """
    base = random_feasible_qp(rng, n, m, p=1, bounds=False)
    C, l, u = base.C, base.l, base.u
    i, j = 0, 1
    extra_C = np.vstack([C[i], 2.0 * C[i], C[i] + C[j], C[-1]])
    with np.errstate(invalid="ignore"):
        extra_l = np.array([l[i], 2.0 * l[i], -np.inf, l[-1]])
        extra_u = np.array([u[i], 2.0 * u[i], np.inf if not np.isfinite(u[i] + u[j]) else u[i] + u[j], u[-1]])
    return QP(P=base.P, q=base.q, C=np.vstack([C, extra_C]), l=np.concatenate([l, extra_l]),
              u=np.concatenate([u, extra_u]))


def random_infeasible_qp(rng: np.random.Generator, n: int, m: int) -> QP:
    """A QP whose constraints admit no point, with a Farkas certificate by construction.

    Signed multipliers in polyproj's convention, ``y_i > 0`` on the upper side ``u_i`` and ``< 0`` on the lower
    side ``l_i`` of row ``i`` (each row's side drawn at random), and ``y_box`` on up to ``n // 2`` variable
    bounds (``ub_j`` where ``> 0``, ``lb_j`` where ``< 0``), with ``Cᵀy + y_box = 0`` (the last row closes it)
    and support ``uᵀy⁺ − lᵀy⁻ + ubᵀy_box⁺ − lbᵀy_box⁻ = −1``: any x of the constraints would give
    ``0 = (Cᵀy + y_box)ᵀx <= support < 0``. The other side of each row and bound is infinite, a finite value
    beyond the certificate's (a two-sided row, a box) or equal to it (an equality, a fixed variable).
    ``m >= 2``.
    """
    return infeasible_qp_with_certificate(rng, n, m)[0]


def infeasible_qp_with_certificate(rng: np.random.Generator, n: int, m: int) -> tuple[QP, np.ndarray, np.ndarray]:
    """:func:`random_infeasible_qp` with its certificate: ``(qp, y, y_box)``.

    ``qp.is_primal_infeasibility_certificate(y, y_box)`` holds.
    """
    A = rng.standard_normal((m, n))
    y = rng.choice([-1.0, 1.0], m) * rng.uniform(0.5, 1.5, m)
    cols = rng.choice(n, int(rng.integers(0, n // 2 + 1)), replace=False)
    y_box = np.zeros(n)
    y_box[cols] = rng.choice([-1.0, 1.0], cols.size) * rng.uniform(0.5, 1.5, cols.size)
    A[-1] = -(y[:-1] @ A[:-1] + y_box) / y[-1]
    side = rng.uniform(-1, 1, m)  # the sides the certificate uses: u_i where y_i > 0, l_i where y_i < 0
    bound = rng.uniform(-1, 1, n)  # likewise ub_j / lb_j where y_box_j ≠ 0
    side[-1] = (-1.0 - (y[:-1] @ side[:-1] + y_box @ bound)) / y[-1]  # the support is −1

    def other(used: np.ndarray, upper: np.ndarray) -> np.ndarray:
        """The opposite sides: infinite, beyond the used one, or equal to it."""
        kind = rng.integers(0, 3, used.size)
        gap = np.where(kind == 1, rng.uniform(0.5, 2.0, used.size), 0.0)
        return np.where(kind == 0, np.where(upper, -np.inf, np.inf), np.where(upper, used - gap, used + gap))

    up = y > 0
    lo_rows = other(side, up)
    l, u = np.where(up, lo_rows, side), np.where(up, side, lo_rows)
    lb, ub = np.full(n, -np.inf), np.full(n, np.inf)
    bup = y_box[cols] > 0
    rest = other(bound[cols], bup)
    lb[cols], ub[cols] = np.where(bup, rest, bound[cols]), np.where(bup, bound[cols], rest)
    return QP(P=_pd(rng, n), q=rng.standard_normal(n), C=A, l=l, u=u, lb=lb, ub=ub), y, y_box


def random_unbounded_qp(rng: np.random.Generator, n: int, m: int) -> QP:
    """A feasible QP whose objective is unbounded below (dual infeasible).

    ``P`` is PSD with a null direction ``d``; ``qᵀd < 0``; every row has ``c_iᵀd <= 0`` and only an
    upper side ``u_i >= 0``, so ``x = t d`` (t >= 0) is feasible with objective ``t qᵀd → -∞``.
    """
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    d = Q[:, 0]
    P = (Q[:, 1:] * rng.uniform(1, 10, n - 1)) @ Q[:, 1:].T
    P = (P + P.T) / 2
    q = -d + 0.1 * Q[:, 1:] @ rng.standard_normal(n - 1)
    C = rng.standard_normal((m, n))
    C -= np.outer(C @ d + rng.uniform(0.1, 1, m), d)  # c_iᵀd = -uniform(0.1, 1)
    return QP(P=P, q=q, C=C, l=np.full(m, -np.inf), u=rng.uniform(0, 1, m), check_psd=False)


def random_nonconvex_qp(rng: np.random.Generator, n: int, m: int) -> QP:
    """A bounded QP with an indefinite P (built with ``check_psd=False``; a backend must not solve it)."""
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    ev = rng.uniform(1, 5, n)
    ev[0] = -3.0
    P = (Q * ev) @ Q.T
    P = (P + P.T) / 2
    return QP(P=P, q=rng.standard_normal(n), C=rng.standard_normal((m, n)), l=-np.ones(m), u=np.ones(m),
              lb=-np.ones(n), ub=np.ones(n), check_psd=False)


# --------------------------------------------------------------------------- exact reference
def reference_solution(qp: QP) -> np.ndarray:
    """Exact solution of a small strictly convex QP by enumeration of active sets (float64).

    Every row of ``C`` and every finite bound is an inequality side; for each subset of sides
    (equalities always in) the equality-constrained KKT system is solved, and the point that is
    feasible with multipliers of the right sign is returned. Exponential: for n, m <= ~8 only.

    The chosen point is exact to rounding: its KKT system ``K s = r`` is refined with residuals computed in
    exact (rational) arithmetic (:func:`_refined`). A float64 solve alone is off by ~cond(K) eps, more than a
    solver exact to an ulp may be held to.
    """
    P = qp.P.toarray() if sp.issparse(qp.P) else qp.P
    C = qp.C.toarray() if sp.issparse(qp.C) else qp.C
    n = qp.n
    rows, rhs, sign, eq = [], [], [], []
    for i in range(qp.m):
        if qp.l[i] == qp.u[i]:
            rows.append(C[i]); rhs.append(qp.u[i]); sign.append(0.0); eq.append(True)  # noqa: E702
            continue
        for bound, s in ((qp.u[i], 1.0), (qp.l[i], -1.0)):
            if np.isfinite(bound):
                rows.append(C[i]); rhs.append(bound); sign.append(s); eq.append(False)  # noqa: E702
    for j in range(n):
        for bound, s in ((qp.ub[j], 1.0), (qp.lb[j], -1.0)):
            if np.isfinite(bound):
                rows.append(np.eye(n)[j]); rhs.append(bound); sign.append(s); eq.append(False)  # noqa: E702
    G = np.array(rows).reshape(-1, n)
    h, sgn, iseq = np.array(rhs), np.array(sign), np.array(eq, dtype=bool)
    ineq = np.flatnonzero(~iseq)
    best = None
    for k in range(len(ineq) + 1):
        for S in itertools.combinations(ineq, k):
            act = np.concatenate([np.flatnonzero(iseq), np.array(S, dtype=int)])
            Ga = G[act]
            K = np.block([[P, Ga.T], [Ga, np.zeros((act.size, act.size))]])
            sol, *_ = np.linalg.lstsq(K, np.concatenate([-qp.q, h[act]]), rcond=None)
            x, lam = sol[:n], sol[n:]
            if np.max(np.abs(K @ sol - np.concatenate([-qp.q, h[act]])), initial=0) > 1e-8:
                continue
            if qp.primal_violation(x) > 1e-9:
                continue
            if np.any(lam[iseq[act] == False] * sgn[act][iseq[act] == False] < -1e-9):  # noqa: E712
                continue
            if best is None or qp.objective(x) < qp.objective(best[0]) - 1e-12:
                best = (x, K, np.concatenate([-qp.q, h[act]]), sol)
        if best is not None:
            return _refined(*best[1:])[:n]
    raise ValueError("reference_solution: no KKT point found (is the QP feasible and strictly convex?)")


def _refined(K: np.ndarray, r: np.ndarray, s: np.ndarray, steps: int = 3) -> np.ndarray:
    """``s`` (a float64 solution of ``K s = r``) after iterative refinement with exact residuals.

    Each step solves ``K d = r − K s`` in float64, the residual computed exactly (fractions of the float64 entries)
    and rounded once: the error shrinks by ~cond(K) eps a step (mixed-precision refinement), to the rounding of
    ``s`` itself where cond(K) eps is well below 1. A singular ``K`` (dependent equality rows) is refined in its
    range (least squares).
    """
    from fractions import Fraction

    Kf = [[Fraction(v) for v in row] for row in K.tolist()]
    rf = [Fraction(v) for v in r.tolist()]
    for _ in range(steps):
        sf = [Fraction(v) for v in s.tolist()]
        res = np.array([float(ri - sum(k * v for k, v in zip(row, sf, strict=True)))
                        for row, ri in zip(Kf, rf, strict=True)])
        if not np.any(res):
            break
        s = s + np.linalg.lstsq(K, res, rcond=None)[0]
    return s


# --------------------------------------------------------------------------- checks
def kkt_tolerance(solver: QPSolver) -> float:
    """Residual bound the checks accept: ``max(1e-6, 100 eps_abs)`` (solvers stop near eps_abs)."""
    return max(1e-6, 100.0 * float(solver.settings.get("eps_abs", 1e-8)))


def _describe(qp: QP) -> str:
    return f"{qp!r} (n={qp.n}, m={qp.m}, bounded vars={int(np.sum(np.isfinite(qp.lb) | np.isfinite(qp.ub)))})"


def _assert_not_demoted(solver: QPSolver, sol: Solution, what: str) -> None:
    """The backend's own answer held: polyproj's output check did not have to change its status."""
    note = sol.info.get("validation")
    assert not note, (f"[{solver.name}] {what}: the backend claimed {sol.info.get('claimed_status')}, "
                      f"polyproj's output check made it {sol.status.name}: {note}")


def _assert_kkt(solver: QPSolver, qp: QP, sol: Solution, what: str) -> None:
    tol = kkt_tolerance(solver)
    _assert_not_demoted(solver, sol, what)
    raw = sol.info.get("raw_status")  # the solver's own word for it, where the backend gave one
    assert sol.status is Status.SOLVED, (
        f"[{solver.name}] {what}: expected status SOLVED on {_describe(qp)}, got {sol.status.name}"
        + (f" ({raw})" if raw not in (None, "") else ""))
    shapes_ok = sol.x.shape == (qp.n,) and sol.z.shape == (qp.m,) and sol.z_box.shape == (qp.n,)
    assert shapes_ok, (
        f"[{solver.name}] {what}: shapes x {sol.x.shape}, z {sol.z.shape}, z_box {sol.z_box.shape}; expected "
        f"({qp.n},), ({qp.m},), ({qp.n},)")
    if not solver.capabilities.duals:  # a primal-only backend: feasible, and optimal by the objective
        from .properties import reference_objective

        pr, best = sol.primal_residual(qp), reference_objective(qp)
        scale = 1.0 + max(1.0, abs(best))
        assert pr <= tol, f"[{solver.name}] {what}: primal residual {pr:.3g} > {tol:.1g} on {_describe(qp)}"
        assert qp.objective(sol.x) <= best + tol * scale, (
            f"[{solver.name}] {what}: objective {qp.objective(sol.x):.10g} against the optimum {best:.10g} on "
            f"{_describe(qp)}: a feasible point, not an optimal one")
        return
    res = sol.residuals(qp)
    bad = {k: v for k, v in res.items() if not v <= tol}
    assert not bad, (
        f"[{solver.name}] {what}: KKT residuals {', '.join(f'{k}={v:.3g}' for k, v in res.items())} on "
        f"{_describe(qp)}; expected all <= {tol:.1g} (a dual residual of the size of z means the sign "
        "convention Px + q + Cᵀz + z_box = 0 is broken)")


def _need(solver: QPSolver, capability: str) -> None:
    if not getattr(solver.capabilities, capability):
        raise CheckSkipped(f"backend {solver.name!r} does not declare the {capability!r} capability")


def check_feasible_dense(solver: QPSolver, rng: np.random.Generator) -> None:
    """Feasible random dense QPs (equalities, two- and one-sided rows, bounds) reach tolerance."""
    _need(solver, "dense")
    for n, m, p in ((5, 4, 1), (20, 15, 3), (40, 30, 0)):
        qp = random_feasible_qp(rng, n, m, p)
        _assert_kkt(solver, qp, solver.solve(qp), "feasible dense QP")


def check_feasible_sparse(solver: QPSolver, rng: np.random.Generator) -> None:
    """Feasible random sparse (scipy.sparse) QPs reach tolerance."""
    _need(solver, "sparse")
    for n, m, p in ((30, 20, 2), (80, 60, 5)):
        qp = random_feasible_qp(rng, n, m, p, sparse=True, density=0.1)
        _assert_kkt(solver, qp, solver.solve(qp), "feasible sparse QP")


def check_equality_only(solver: QPSolver, rng: np.random.Generator) -> None:
    """Equality-only QP: x and the multipliers match the KKT linear system solved by NumPy."""
    n, p = 12, 5
    P, B = _pd(rng, n), rng.standard_normal((p, n))
    q, b = rng.standard_normal(n), rng.standard_normal(p)
    qp = QP(P=P, q=q, C=B, l=b, u=b)
    sol = solver.solve(qp)
    _assert_kkt(solver, qp, sol, "equality-only QP")
    ref = np.linalg.solve(np.block([[P, B.T], [B, np.zeros((p, p))]]), np.concatenate([-q, b]))
    tol = 100 * kkt_tolerance(solver)
    err_x = float(np.max(np.abs(sol.x - ref[:n])))
    err_z = float(np.max(np.abs(sol.z - ref[n:]))) if solver.capabilities.duals else 0.0
    close = err_x <= tol and err_z <= tol
    assert close, (
        f"[{solver.name}] equality-only QP (n={n}, p={p}): |x - x_ref| = {err_x:.3g}, |z - z_ref| = {err_z:.3g}; "
        f"expected <= {tol:.1g} (z is the multiplier of Bx = b with Px + q + Bᵀz = 0)")


def check_bounds_only(solver: QPSolver, rng: np.random.Generator) -> None:
    """Box-constrained QP with diagonal P: x = clip(-q/d, lb, ub), z_box = -(d x + q)."""
    n = 15
    d = rng.uniform(1, 3, n)
    q = 3 * rng.standard_normal(n)
    lb, ub = -np.ones(n), np.ones(n)
    lb[0], ub[1] = -np.inf, np.inf
    qp = QP(P=np.diag(d), q=q, lb=lb, ub=ub)
    sol = solver.solve(qp)
    _assert_kkt(solver, qp, sol, "bounds-only QP")
    x_ref = np.clip(-q / d, lb, ub)
    zb_ref = -(d * x_ref + q)
    tol = 100 * kkt_tolerance(solver)
    err_x = float(np.max(np.abs(sol.x - x_ref)))
    err_z = float(np.max(np.abs(sol.z_box - zb_ref))) if solver.capabilities.duals else 0.0
    close = err_x <= tol and err_z <= tol
    assert close, (
        f"[{solver.name}] bounds-only QP (n={n}): |x - clip(-q/d)| = {err_x:.3g}, |z_box - z_ref| = {err_z:.3g}; "
        f"expected <= {tol:.1g}")


def check_degenerate(solver: QPSolver, rng: np.random.Generator) -> None:
    """Redundant (duplicated, scaled, summed) rows: still a KKT point, x equal to the reference."""
    qp = random_degenerate_qp(rng, 6, 5)
    sol = solver.solve(qp)
    _assert_kkt(solver, qp, sol, "degenerate QP (redundant rows, LICQ fails)")
    x_ref = reference_solution(qp)
    err = float(np.max(np.abs(sol.x - x_ref)))
    tol = 1e3 * kkt_tolerance(solver)
    assert err <= tol, f"[{solver.name}] degenerate QP {_describe(qp)}: |x - x_ref| = {err:.3g}, expected <= {tol:.1g}"


def check_sign_convention(solver: QPSolver, rng: np.random.Generator) -> None:
    """Rows known active on their upper (lower) side get z > 0 (z < 0); the same for bounds."""
    _need(solver, "duals")
    n = 4
    # min ½|x - t|² with t outside: x1 + x2 <= 1 (upper active), x3 - x4 >= 1 (lower active),
    # x1 <= 0.1 bound (upper active), x4 >= -0.2 bound (lower active)
    t = np.array([2.0, 2.0, -1.0, -1.0]) + 0.01 * rng.standard_normal(n)
    C = np.array([[1.0, 1.0, 0, 0], [0, 0, 1.0, -1.0]])
    qp = QP(P=np.eye(n), q=-t, C=C, l=[-np.inf, 1.0], u=[1.0, np.inf],
            lb=[-np.inf, -np.inf, -np.inf, -0.2], ub=[0.1, np.inf, np.inf, np.inf])
    sol = solver.solve(qp)
    _assert_kkt(solver, qp, sol, "sign-convention QP")
    got = (sol.z[0], sol.z[1], sol.z_box[0], sol.z_box[3])
    ok = got[0] > 0 and got[1] < 0 and got[2] > 0 and got[3] < 0
    assert ok, (
        f"[{solver.name}] sign convention: multipliers (row upper-active, row lower-active, ub active, lb active) "
        f"= {tuple(f'{v:.3g}' for v in got)}; expected signs (+, -, +, -) with Px + q + Cᵀz + z_box = 0")


def _expect_status(solver: QPSolver, rng: np.random.Generator, make: Callable[..., QP], expected: Status,
                   what: str) -> None:
    """Random problems of two sizes from ``make`` must end in ``expected``.

    A backend without the ``infeasibility`` capability need not say which failure it is, but it must not claim
    an answer: a SOLVED there (which polyproj's output check demotes) fails whatever the backend declares.
    """
    detects = solver.capabilities.infeasibility
    for n, m in ((5, 3), (10, 6)):
        qp = make(rng, n, m)
        if not detects:
            try:
                sol = solver.solve(qp)
            except SolverError:  # an error is no claim of an answer
                continue
            claimed = sol.info.get("claimed_status", sol.status.name)
            assert claimed not in (Status.SOLVED.name, Status.SOLVED_INACCURATE.name), (
                f"[{solver.name}] {what} {_describe(qp)}: the backend claimed {claimed}; polyproj's output check "
                f"made it {sol.status.name}" + (f": {sol.info['validation']}" if sol.info.get("validation") else ""))
            continue
        sol = solver.solve(qp)
        _assert_not_demoted(solver, sol, what)
        assert sol.status is expected, (
            f"[{solver.name}] {what} {_describe(qp)}: got {sol.status.name}, expected {expected.name}")
    _need(solver, "infeasibility")  # its status is not judged: no claim of an answer was found


def check_primal_infeasible(solver: QPSolver, rng: np.random.Generator) -> None:
    """Certified-infeasible constraints give PRIMAL_INFEASIBLE (never SOLVED)."""
    _expect_status(solver, rng, random_infeasible_qp, Status.PRIMAL_INFEASIBLE,
                   "infeasible QP (Farkas certificate by construction)")


def check_dual_infeasible(solver: QPSolver, rng: np.random.Generator) -> None:
    """An objective unbounded below on the feasible set gives DUAL_INFEASIBLE."""
    _expect_status(solver, rng, random_unbounded_qp, Status.DUAL_INFEASIBLE,
                   "unbounded QP (P d = 0, qᵀd < 0, C d <= 0)")


def check_nonconvex(solver: QPSolver, rng: np.random.Generator) -> None:
    """An indefinite P (QP built with check_psd=False) is never reported as solved."""
    qp = random_nonconvex_qp(rng, 6, 3)
    sol = solver.solve(qp)
    _assert_not_demoted(solver, sol, "non-convex QP")
    assert not sol.status.ok, (
        f"[{solver.name}] non-convex QP (eigenvalue -3 in P, n=6, m=3): got {sol.status.name}, expected "
        "NON_CONVEX (or another failure status), never a silent answer")


def check_warm_start(solver: QPSolver, rng: np.random.Generator) -> None:
    """Warm start from the solution of a nearby problem takes fewer iterations than a cold start."""
    _need(solver, "warm_start")
    qp = random_feasible_qp(rng, 30, 20, 2)
    first = solver.solve(qp)
    _assert_kkt(solver, qp, first, "warm-start base QP")
    pert = qp.with_vectors(q=qp.q + 1e-4 * np.linalg.norm(qp.q) * rng.standard_normal(qp.n) / np.sqrt(qp.n))
    cold = solver.solve(pert)
    warm = solver.solve(pert, warm_start=first)
    _assert_kkt(solver, pert, warm, "warm-started QP")
    assert warm.iterations < cold.iterations or cold.iterations <= 1, (
        f"[{solver.name}] warm start (n=30, m=22, q perturbed by 1e-4 relative): {warm.iterations} iterations "
        f"warm vs {cold.iterations} cold; expected fewer when warm")


def check_agreement(solver: QPSolver, rng: np.random.Generator) -> None:
    """The primal solution agrees with an exact float64 reference (active-set enumeration) on small random QPs."""
    for n, m, p in ((4, 3, 1), (6, 4, 0), (5, 5, 2)):
        qp = random_feasible_qp(rng, n, m, p)
        sol = solver.solve(qp)
        _assert_kkt(solver, qp, sol, "agreement QP")
        x_ref = reference_solution(qp)
        err = float(np.max(np.abs(sol.x - x_ref)))
        obj = abs(qp.objective(sol.x) - qp.objective(x_ref))
        tol = 1e3 * kkt_tolerance(solver)
        assert err <= tol, (
            f"[{solver.name}] agreement on {_describe(qp)}: |x - x_ref| = {err:.3g} (objective difference "
            f"{obj:.3g}); expected <= {tol:.1g}")


#: name -> check(solver, rng); iterated by ``polyproj check`` and the test suite
CHECKS: dict[str, Callable[[QPSolver, np.random.Generator], None]] = {
    "feasible_dense": check_feasible_dense,
    "feasible_sparse": check_feasible_sparse,
    "equality_only": check_equality_only,
    "bounds_only": check_bounds_only,
    "degenerate": check_degenerate,
    "sign_convention": check_sign_convention,
    "primal_infeasible": check_primal_infeasible,
    "dual_infeasible": check_dual_infeasible,
    "nonconvex": check_nonconvex,
    "warm_start": check_warm_start,
    "agreement": check_agreement,
}
