"""Property checks: the backend contract, the projection, conservativity and LICQ equivalence.

Every ``check_*`` function takes concrete data (no hypothesis inside), raises ``AssertionError``
with a readable message when the property fails, and returns a small ``dict`` of counts when it
holds. :mod:`polyproj.testing.check` drives them with the strategies of
:mod:`polyproj.testing.strategies`; tests may call them directly.

Notation: ``G`` (``n_ineq × n``) and ``h`` are the inequality form of a polyhedron (rows of A,
then ``-e_j`` for finite lower bounds, then ``e_j`` for finite upper bounds), ``B y = b`` the
equalities, ``I(x)`` the active rows at ``y = Π_P(x)``.

The HS set (Han & Sun 1997; polyproj/projection/faces.py)::

    ∂_HS Π_P(x) = { I − M_Kᵀ(M_K M_Kᵀ)⁻¹M_K :  K ⊆ I(x),  M_K = [G_K; B] has independent rows,
                    ∃ multiplier λ >= 0 of the projection with supp(λ) ⊆ K }

is enumerated by :func:`hs_set` directly from this definition: for every subset ``K`` with
independent rows, the unique least-squares solution of ``M_Kᵀ ν = x − y`` is a multiplier with
``supp ⊆ K`` iff the residual vanishes and ``ν_G >= 0``.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..api import project
from ..problem import QP, Polyhedron
from ..projection.hs_jacobian import hs_jacobian, hs_vjp
from ..projection.result import ProjectionResult
from ..solution import Solution, Status

__all__ = [
    "HSElement",
    "b_subdifferential_samples",
    "check_b_subdifferential_in_hs",
    "check_batch_contract",
    "check_conservativity",
    "check_infeasible_contract",
    "check_licq_equivalence",
    "check_projection",
    "check_projection_contract",
    "check_qp_batch_contract",
    "check_qp_contract",
    "check_solution_kkt",
    "contract_tolerance",
    "exact_certificate",
    "find_kinks",
    "hs_set",
    "ineq_form",
    "nonlicq_example",
    "project_checked",
    "reference_objective",
]


# --------------------------------------------------------------------------- helpers
def ineq_form(P: Polyhedron) -> tuple[np.ndarray, np.ndarray]:
    """Dense inequality form ``(G, h)``: ``G y <= h`` (rows of A, then -lb rows, then ub rows)."""
    E = np.eye(P.n)
    G = np.vstack([P.A_dense, -E[P.lb_idx], E[P.ub_idx]]).reshape(-1, P.n)
    h = np.concatenate([P.a, -P.lb[P.lb_idx], P.ub[P.ub_idx]])
    return G, h


def _arr(v: np.ndarray, digits: int = 6) -> str:
    return np.array2string(np.asarray(v, dtype=float), precision=digits, separator=", ",
                           suppress_small=True, max_line_width=200)


def finite_or_fail(X: np.ndarray, Y: np.ndarray) -> None:
    """An AssertionError naming the first point whose projection is not finite (NaN answers are failures)."""
    bad = ~np.all(np.isfinite(Y.reshape(Y.shape[0], -1)), axis=1)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise AssertionError(f"the set returned NaN (or inf) at x = {X[i].tolist()}: y = {Y[i].tolist()}")


def project_checked(X: np.ndarray, P: Polyhedron, backend: Any) -> ProjectionResult:
    """``pp.project`` on a batch; a refused polish (unverifiable KKT) is an AssertionError.

    ``backend`` is a QP backend (the projection onto ``P``) or a :class:`~polyproj.sets.Projector`
    (its own projection; ``P`` is its ``as_polyhedron()``).
    """
    from ..sets.base import Projector

    X2 = np.atleast_2d(np.asarray(X, dtype=float))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = backend.project(X2) if isinstance(backend, Projector) else project(X2, P, backend=backend)
    Y = np.asarray(res.y, dtype=float).reshape(X2.shape[0], -1)
    if isinstance(backend, Projector):  # a set's NaN: its failure, named as such
        finite_or_fail(X2, Y)
    if not np.all(res.polished):
        bad = int(np.flatnonzero(~np.asarray(res.polished))[0])
        got = Y[bad] if res.solution is None else res.solution.x[bad]  # a closed-form result has no solution
        raise AssertionError(
            f"the projection of x = {_arr(X2[bad])} could not be verified: polish refused "
            f"(backend status {res.status[bad].name}, backend x = {_arr(got)}); "
            f"{'; '.join(str(w.message) for w in caught)[:300]}"
        )
    return res


def _rank(M: np.ndarray) -> int:
    return int(np.linalg.matrix_rank(M, tol=1e-9 * max(1.0, float(np.abs(M).max(initial=0.0))))) if M.size else 0


def _null_projector(M: np.ndarray, n: int) -> np.ndarray:
    if M.shape[0] == 0:
        return np.eye(n)
    Q, _ = np.linalg.qr(M.T)
    return np.eye(n) - Q @ Q.T


@dataclass(frozen=True)
class HSElement:
    """One element ``I − M_Kᵀ(M_K M_Kᵀ)⁻¹M_K`` of the HS set with the index set ``K``."""

    K: tuple[int, ...]
    J: np.ndarray
    multiplier: np.ndarray  # (n_ineq,) a multiplier with supp ⊆ K


def hs_set(P: Polyhedron, x: np.ndarray, y: np.ndarray, active: np.ndarray, *, tol: float = 1e-9,
           max_active: int = 14, rng: np.random.Generator | None = None, samples: int = 64) -> list[HSElement]:
    """Enumerate the HS set at ``x`` (``y = Π_P(x)``, ``active`` = I(x)) from its definition.

    Distinct index sets giving the same projector are merged (the first ``K`` is kept). Every subset of the
    active rows is tried where there are at most 8 of them. Beyond, under LICQ (``[G_I; B]`` independent: the
    multiplier is unique) the sets between its support and ``I`` are all of them, tried where at most
    ``max_active`` rows are weakly active (a 20-dimensional simplex has 16 active rows: 2^16 subsets per point
    took minutes). Otherwise every subset up to ``max_active`` active rows; beyond that a ValueError without
    ``rng``, and with it ``samples`` candidates (:func:`_index_sets`), each tested as above.
    """
    G, _ = ineq_form(P)
    B = _independent_rows(P.B_dense)  # a set's structure may imply dependent equalities (Birkhoff)
    I = np.flatnonzero(active)
    r = np.asarray(x, float) - np.asarray(y, float)
    scale = 1.0 + float(np.abs(r).max(initial=0.0)) + float(np.abs(G).max(initial=0.0))
    every = (K for size in range(I.size + 1) for K in itertools.combinations(I.tolist(), size))
    candidates = None if I.size <= 8 else _index_sets(G, B, I, r, tol * scale, max_active, None, samples)
    if candidates is None and I.size <= max_active:
        candidates = every
    elif candidates is None and rng is None:
        raise ValueError(f"{I.size} active rows: enumerating 2^{I.size} subsets is too costly")
    elif candidates is None:
        candidates = _index_sets(G, B, I, r, tol * scale, max_active, rng, samples)
    out: list[HSElement] = []
    for K in candidates:
        size = len(K)
        M = np.vstack([G[list(K)], B]).reshape(-1, P.n)
        if _rank(M) < M.shape[0]:
            continue
        nu = np.linalg.lstsq(M.T, r, rcond=None)[0] if M.shape[0] else np.zeros(0)
        resid = float(np.abs(M.T @ nu - r).max(initial=0.0)) if M.shape[0] else float(np.abs(r).max(initial=0.0))
        if resid > tol * scale or np.any(nu[:size] < -tol * scale):
            continue
        J = _null_projector(M, P.n)
        if any(np.abs(J - e.J).max() < 1e-9 for e in out):
            continue
        lam = np.zeros(G.shape[0])
        lam[list(K)] = nu[:size]
        out.append(HSElement(tuple(K), J, lam))
    return out


def _index_sets(G: np.ndarray, B: np.ndarray, I: np.ndarray, r: np.ndarray, eps: float, max_active: int,
                rng: np.random.Generator | None, samples: int) -> list[tuple[int, ...]] | None:
    """Candidate index sets ``K ⊆ I`` of the HS set, in order of size, where ``I`` is too large for every subset.

    Under LICQ (``[G_I; B]`` independent) the multiplier is unique and the ``K`` between its support and ``I``
    are the ones that qualify: all of them where at most ``max_active`` rows are weakly active (multiplier
    within ``eps`` of 0), else (with ``rng``) ``samples`` random ones. Without LICQ (with ``rng``): the support of
    a non-negative least-squares multiplier (its columns independent) and ``samples`` random maximal independent
    sets of active rows containing it. None where ``rng`` is needed and not given.
    """
    from ..linalg import nnls

    M = np.vstack([G[I], B]).reshape(-1, G.shape[1])
    out: list[tuple[int, ...]] = [tuple(I.tolist())]
    if _rank(M) == M.shape[0]:
        nu = np.linalg.lstsq(M.T, r, rcond=None)[0][: I.size]
        strong, weak = I[nu > eps].tolist(), I[nu <= eps]
        if weak.size <= max_active:
            subsets = itertools.chain.from_iterable(itertools.combinations(weak.tolist(), k)
                                                    for k in range(weak.size + 1))
        elif rng is None:
            return None
        else:
            subsets = (weak[rng.random(weak.size) < 0.5].tolist() for _ in range(samples))
        return sorted(dict.fromkeys([tuple(sorted(strong + list(W))) for W in subsets] + out), key=len)
    if rng is None:
        return None
    lam, _ = nnls(np.vstack([G[I], B, -B]).T, r)
    base = I[lam[: I.size] > eps].tolist()
    out.append(tuple(sorted(base)))
    rest = [i for i in I.tolist() if i not in base]
    for _ in range(samples):
        K = list(base)
        for i in rng.permutation(rest).tolist():
            if _rank(np.vstack([G[[*K, i]], B])) == len(K) + 1 + B.shape[0]:
                K.append(i)
        out.append(tuple(sorted(K)))
    return sorted(dict.fromkeys(out), key=len)


def _independent_rows(B: np.ndarray) -> np.ndarray:
    """A maximal set of linearly independent rows of ``B`` (the same row space, hence the same HS set)."""
    keep: list[int] = []
    for i in range(B.shape[0]):
        if _rank(B[[*keep, i]]) == len(keep) + 1:
            keep.append(i)
    return B[keep].reshape(len(keep), B.shape[1])


def _match(J: np.ndarray, elements: list[HSElement], tol: float) -> int | None:
    for i, e in enumerate(elements):
        if np.abs(J - e.J).max() <= tol:
            return i
    return None


def _scale(*arrays: np.ndarray) -> float:
    return 1.0 + max(float(np.abs(np.nan_to_num(np.asarray(a, float), posinf=0, neginf=0)).max(initial=0.0))
                     for a in arrays)


# --------------------------------------------------------------------------- backend contract (raw)
def contract_tolerance(solver: Any, tol: float | None = None) -> float:
    """The tolerance of the raw contract checks: ``tol`` when given, else the backend's own.

    A backend stops when its residuals are near its ``eps_abs``; the contract allows ``max(1e-6, 100 eps_abs)``,
    the rule of the conformance checks (:func:`polyproj.testing.conformance.kkt_tolerance`), so that a correct
    backend with a looser default (ProxSuite at ``eps_abs = 1e-5``: a violation of 2.6e-6) is not failed by one
    suite and passed by the other.
    """
    from .conformance import kkt_tolerance

    return kkt_tolerance(solver) if tol is None else float(tol)


def reference_objective(qp: QP) -> float:
    """The optimal value of a feasible QP by polyproj's IPM at 1e-10, its own KKT residuals checked.

    The yardstick of a primal-only backend, whose x has no multipliers to certify it.
    """
    from ..registry import get_backend

    ref = get_backend("ipm", eps_abs=1e-10, eps_rel=1e-10).solve(qp)
    res = ref.residuals(qp)
    lim = 1e-7 * _scale(*(lambda d: (d.P, d.q, d.C, d.l, d.u, d.lb, d.ub))(qp.dense()))
    if ref.status is not Status.SOLVED or not all(v <= lim for v in res.values()):
        raise RuntimeError(f"the reference solve of {qp!r} is not certified: {ref.status.name}, {res}")
    return float(qp.objective(ref.x))


def check_solution_kkt(qp: QP, sol: Solution, tol: float = 1e-6, what: str = "", *, duals: bool = True) -> None:
    """The raw Solution of a feasible QP: status, feasibility, stationarity, sign convention, gap.

    Residuals are compared with ``tol · (1 + max |data|)``. A wrong multiplier sign is named as
    such (stationarity holds with ``-z``). ``duals=False`` (a backend declaring ``Capabilities(duals=False)``):
    the multipliers are not checked; ``x`` must be feasible with an objective within the same bound of the
    optimum (:func:`reference_objective`).
    """
    where = f" ({what})" if what else ""
    qd = qp.dense()
    scale = _scale(qd.P, qd.q, qd.C, qd.l, qd.u, qd.lb, qd.ub)
    lim = tol * scale
    claimed = sol.info.get("claimed_status")  # what the backend said, where polyproj's output check changed it
    demoted = claimed == Status.SOLVED.name
    if claimed is not None and not demoted and claimed != sol.status.name:  # e.g. a false PRIMAL_INFEASIBLE
        raise AssertionError(f"the backend claimed {claimed} on a feasible, bounded QP{where}; polyproj's output "
                             f"check made it {sol.status.name}: {sol.info.get('validation')}")
    if sol.status is not Status.SOLVED and not demoted:
        raise AssertionError(f"status {sol.status.name} on a feasible, bounded QP{where}; expected SOLVED")
    x = np.asarray(sol.x, float)
    if x.shape != (qp.n,) or np.asarray(sol.z).shape != (qp.m,) or np.asarray(sol.z_box).shape != (qp.n,):
        raise AssertionError(f"shapes x {x.shape}, z {np.shape(sol.z)}, z_box {np.shape(sol.z_box)}; "
                             f"expected ({qp.n},), ({qp.m},), ({qp.n},){where}")
    pr = qp.primal_violation(x)
    if not pr <= lim:
        raise AssertionError(f"x = {_arr(x, 10)} violates the constraints by {pr:.3g} > {lim:.3g}{where}")
    if duals:
        _check_multipliers(qp, sol, x, lim, scale, where)
    else:
        best = reference_objective(qp)
        if not qp.objective(x) <= best + lim * scale:
            raise AssertionError(f"x = {_arr(x, 10)} is feasible but not optimal: objective {qp.objective(x):.10g} "
                                 f"against the optimum {best:.10g} (bound {lim * scale:.3g}){where}")
    if demoted:
        raise AssertionError(f"the backend claimed SOLVED, polyproj's output check made it {sol.status.name}"
                             f"{where}: {sol.info.get('validation')}")


def _check_multipliers(qp: QP, sol: Solution, x: np.ndarray, lim: float, scale: float, where: str) -> None:
    """Stationarity (a wrong sign named as such) and the duality gap of a solution with multipliers."""
    dr = sol.dual_residual(qp)
    if not dr <= lim:
        flipped = Solution(x=x, z=-np.asarray(sol.z), z_box=-np.asarray(sol.z_box), status=sol.status)
        if flipped.dual_residual(qp) <= lim:
            raise AssertionError(
                f"multipliers have the wrong sign{where}: stationarity P x + q + Cᵀz + z_box = 0 fails by "
                f"{dr:.3g} but holds with -z, -z_box (z = {_arr(sol.z)}, z_box = {_arr(sol.z_box)}); "
                "polyproj's convention: z_i > 0 when the upper side u_i is active, z_i < 0 for l_i")
        raise AssertionError(f"dual residual |P x + q + Cᵀz + z_box| (plus multipliers on infinite bounds) "
                             f"= {dr:.3g} > {lim:.3g} at x = {_arr(x, 10)}, z = {_arr(sol.z)}, "
                             f"z_box = {_arr(sol.z_box)}{where}")
    gap = sol.duality_gap(qp)
    if not gap <= lim * scale:
        raise AssertionError(f"duality gap {gap:.3g} > {lim * scale:.3g}: x = {_arr(x, 10)} is not optimal "
                             f"for the multipliers returned{where}")


def check_qp_contract(case: Any, solver: Any, tol: float = 1e-6) -> dict[str, int]:
    """``solver.solve`` on a feasible QP (a :class:`~polyproj.testing.strategies.QPCase`)."""
    sol = solver.solve(case.qp)
    check_solution_kkt(case.qp, sol, tol, what="solve", duals=solver.capabilities.duals)
    return {"qps": 1}


def check_infeasible_contract(case: Any, solver: Any, tol: float = 1e-6) -> dict[str, int]:
    """An infeasible QP is never reported solved; PRIMAL_INFEASIBLE when the backend detects it."""
    sol = solver.solve(case.qp)
    if sol.status.ok:
        raise AssertionError(f"status {sol.status.name} with x = {_arr(sol.x)} on a certified-infeasible QP "
                             f"(primal violation {case.qp.primal_violation(sol.x):.3g})")
    if sol.info.get("claimed_status") == Status.SOLVED.name:  # whatever the backend declares: a false claim
        raise AssertionError(f"the backend claimed SOLVED on a certified-infeasible QP; polyproj's output check made "
                             f"it {sol.status.name}: {sol.info.get('validation')}")
    if solver.capabilities.infeasibility and sol.status is not Status.PRIMAL_INFEASIBLE:
        raise AssertionError(f"status {sol.status.name} on a certified-infeasible QP; the backend declares "
                             "infeasibility detection, so PRIMAL_INFEASIBLE is expected")
    return {"qps": 1}


def check_batch_contract(P: Polyhedron, X: np.ndarray, solver: Any, tol: float = 1e-6) -> dict[str, int]:
    """``solver.solve_batch`` on projection QPs: the KKT contract for every element.

    Each element's x must also be the exact (polished) projection to within ``sqrt(tol)``.
    """
    qp = P.projection_qp()
    X = np.atleast_2d(X)
    bs = solver.solve_batch(qp, q=-X)
    if len(bs) != X.shape[0]:
        raise AssertionError(f"solve_batch returned {len(bs)} results for {X.shape[0]} problems")
    ref = project_checked(X, P, solver).y
    for i in range(X.shape[0]):
        qpi = qp.with_vectors(q=-X[i])
        check_solution_kkt(qpi, bs.solution(i), tol, what=f"solve_batch element {i}, projection of x = {_arr(X[i])}",
                           duals=solver.capabilities.duals)
        err = float(np.abs(bs.x[i] - ref[i]).max())
        if err > np.sqrt(tol) * _scale(X[i]):
            raise AssertionError(f"solve_batch element {i}: x = {_arr(bs.x[i], 10)} is {err:.3g} away from the "
                                 f"exact projection {_arr(ref[i], 10)} of {_arr(X[i])}")
    return {"qps": X.shape[0]}


def check_projection_contract(P: Polyhedron, X: np.ndarray, solver: Any, tol: float = 1e-6) -> dict[str, int]:
    """``solver.solve_projections`` (``rough=False``) on a polyhedron's data: the raw start of the polish.

    The projection entry a backend may override (array-API backends do; the default solves the projection QPs by
    ``solve_batch`` on the host). ``pp.project`` polishes a wrong start into the exact projection, so its answers
    cannot show a broken entry. The start must hold one answer per point (``y (N, n)``, ``mult (N, m + 2n)``,
    ``mu (N, p)``, ``N`` statuses), and each point, read as a Solution of its projection QP (``z = [mult_A, mu]``,
    ``z_box`` from the bound rows: :func:`~polyproj.polydata.rows_to_qp_multipliers`), must meet the contract of
    :func:`check_solution_kkt` at ``tol``: SOLVED (the set holds ``y*``, the projection exists: anything else
    on these small, exact data is a false verdict or a failure), feasible, its multipliers stationary with the
    right signs and no duality gap. Its ``y`` must also be the exact (polished) projection to within
    ``sqrt(tol)`` (scaled as in :func:`check_batch_contract`).
    """
    from ..backends.projection import ProjectionStart
    from ..polydata import PolyData, rows_to_qp_multipliers

    qp = P.projection_qp()
    X = np.atleast_2d(np.asarray(X, float))
    N, m, p = X.shape[0], P.m_ineq, P.m_eq
    start = solver.solve_projections(X, PolyData.from_polyhedron(P, like=X), rough=False)
    if not isinstance(start, ProjectionStart):
        raise AssertionError(f"solve_projections returned {type(start).__name__}; expected a ProjectionStart")
    Y, mult, mu = (np.asarray(v, dtype=float) for v in (start.y, start.mult, start.mu))
    status = tuple(start.status)
    want = {"y": (N, P.n), "mult": (N, m + 2 * P.n), "mu": (N, p)}
    got = {"y": Y.shape, "mult": mult.shape, "mu": mu.shape}
    if got != want or len(status) != N or not all(isinstance(s, Status) for s in status):
        raise AssertionError(f"solve_projections of {N} points returned shapes {got} and {len(status)} statuses "
                             f"{[getattr(s, 'name', s) for s in status]}; expected {want} and {N} Status values")
    z, z_box = rows_to_qp_multipliers(np, mult, mu, m)
    ref = project_checked(X, P, solver).y
    for i in range(N):
        what = f"solve_projections point {i}, projection of x = {_arr(X[i])}"
        qpi = qp.with_vectors(q=-X[i])
        check_solution_kkt(qpi, Solution(x=Y[i], z=z[i], z_box=z_box[i], status=status[i]), tol, what=what,
                           duals=solver.capabilities.duals)
        err = float(np.abs(Y[i] - ref[i]).max())
        if err > np.sqrt(tol) * _scale(X[i]):
            raise AssertionError(f"{what}: y = {_arr(Y[i], 10)} is {err:.3g} away from the exact projection "
                                 f"{_arr(ref[i], 10)}")
    return {"points": N}


def check_qp_batch_contract(case: Any, solver: Any, tol: float = 1e-6) -> dict[str, int]:
    """``solver.solve_batch`` on feasible QPs sharing a general ``P`` and ``C``, some or all vectors batched.

    ``case`` is a :class:`~polyproj.testing.strategies.QPBatchCase` (``qp_batches(subsets=True)`` in the kit:
    a random non-empty subset of ``q``, ``l``, ``u``, ``lb``, ``ub`` batched, the others shared; ``solve_batch``
    allows any, and a batch path that drops a shared vector answers other problems). The batch is solved cold,
    then again warm-started from the cold answers in reverse order (element ``i`` from element ``size − 1 − i``'s:
    a start that is not the answer). Each element of both raw BatchSolutions must

    - meet the contract of its own QP (:func:`check_solution_kkt` at ``tol``; a point the output check demoted
      to SOLVED_INACCURATE fails it like any other);
    - agree with the same backend's ``solve`` of that element (itself held to the contract): objectives within
      ``2 tol·scale²`` (each answer's duality gap is within ``tol·scale²``, so each objective is that close to
      the optimum), and, where ``P ≻ 0`` (the solution is unique), ``x`` within ``2 sqrt(2 tol·scale² / μ)``,
      ``μ`` the smallest eigenvalue of ``P``: for a feasible ``x``, ``½ μ |x − x*|² <= f(x) − f(x*)``.

    A batch path that replaces ``P`` by ``I`` (a projection fast path), ignores the batched ``l``, ``u``,
    ``lb``, ``ub`` or drops the shared ones answers other problems and fails here; ``batch_contract``
    (projection QPs, only ``q`` batched) cannot see any of them.
    """
    vecs = case.vectors
    size = case.size
    duals = solver.capabilities.duals
    mu = float(np.linalg.eigvalsh(case.qp.dense().P).min()) if case.strictly_convex else 0.0
    qps = [case.element(i) for i in range(size)]
    refs = []
    for i, qpi in enumerate(qps):
        ref = solver.solve(qpi)
        check_solution_kkt(qpi, ref, tol, what=f"solve of element {i}, the reference of solve_batch", duals=duals)
        refs.append(ref)
    cold = solver.solve_batch(case.qp, **vecs)
    _check_batch_elements("solve_batch", cold, qps, refs, tol, duals, mu)
    warm = solver.solve_batch(case.qp, warm_start=cold.take(range(size)[::-1]), **vecs)
    _check_batch_elements("warm-started solve_batch", warm, qps, refs, tol, duals, mu, reversed_start=True)
    return {"qps": size, "batches": 2}


def _check_batch_elements(label: str, bs: Any, qps: list[QP], refs: list[Solution], tol: float, duals: bool,
                          mu: float, reversed_start: bool = False) -> None:
    """The elements of a raw BatchSolution: the contract of each QP, agreement with ``solve`` (see the caller)."""
    size = len(qps)
    if len(bs) != size:
        raise AssertionError(f"{label} returned {len(bs)} results for {size} problems")
    for i, (qpi, ref) in enumerate(zip(qps, refs, strict=True)):
        what = f"{label} element {i}" + (f", started from element {size - 1 - i}'s answer" if reversed_start else "")
        sol = bs.solution(i)
        check_solution_kkt(qpi, sol, tol, what=what, duals=duals)
        d = qpi.dense()
        scale = _scale(d.P, d.q, d.C, d.l, d.u, d.lb, d.ub)
        lim = tol * scale * scale  # the duality-gap bound of check_solution_kkt
        fb, fs = qpi.objective(sol.x), qpi.objective(ref.x)
        if not abs(fb - fs) <= 2 * lim:
            raise AssertionError(f"{what}: objective {fb:.10g} at x = {_arr(sol.x, 10)} but solve of the same QP "
                                 f"gives {fs:.10g} at x = {_arr(ref.x, 10)} (bound {2 * lim:.3g})")
        if mu > 0:
            err = float(np.abs(np.asarray(sol.x, float) - ref.x).max())
            bound = 2 * np.sqrt(2 * lim / mu)
            if not err <= bound:
                raise AssertionError(f"{what}: x = {_arr(sol.x, 10)} is {err:.3g} away from solve's x = "
                                     f"{_arr(ref.x, 10)} of the same strictly convex QP (bound {bound:.3g})")


# --------------------------------------------------------------------------- projection
def check_projection(P: Polyhedron, X: np.ndarray, solver: Any, tol: float = 1e-8,
                     feasible: np.ndarray | None = None, unit: float = 1.0) -> dict[str, int]:
    """KKT optimality, idempotence, firm non-expansiveness and the variational inequality.

    - KKT: ``y − x + Gᵀλ + Bᵀμ = 0``, ``λ >= 0``, ``λ·(h − Gy) = 0``, ``y ∈ P``;
    - idempotence: ``Π(Π(x)) = Π(x)``;
    - firm non-expansiveness: ``‖Π(x) − Π(x')‖² <= ⟨Π(x) − Π(x'), x − x'⟩``;
    - variational inequality: ``⟨x − Π(x), z − Π(x)⟩ <= 0`` for every feasible ``z`` (the other
      projections and ``feasible``).

    Stationarity, the multipliers' signs and the violation are lengths, held per point to ``tol`` times that point's
    own scale: ``unit`` plus the largest term of its sum, ``|y| + |x| + |G|ᵀ|λ| + |B|ᵀ|μ|`` (a multiplier's sign as
    its row's term ``λ_i |G_i|``). One bound for the batch, ``tol`` times the square of its largest entry (far
    samples included), allowed ~1 at unit scale: zero multipliers on rows active by 0.5 passed. ``unit`` (default 1)
    is the floor of that scale: the set's size where smaller (the violation also allows ``tol`` times the largest
    right-hand side). The other tests hold at ``tol · scale²``, ``scale`` the largest entry of the batch and the
    data.
    """
    X = np.atleast_2d(np.asarray(X, float))
    res = project_checked(X, P, solver)
    Y, mult = np.asarray(res.y, float), np.asarray(res.multipliers, float)
    G, h = ineq_form(P)
    ni = P.n_ineq
    if mult.shape != (X.shape[0], ni + P.m_eq):
        raise AssertionError(f"multipliers of shape {mult.shape} for {X.shape[0]} points; expected "
                             f"({X.shape[0]}, {ni + P.m_eq}): the {ni} inequality rows, then the {P.m_eq} rows of B")
    Bd = P.B_dense.reshape(-1, P.n)
    sc = _scale(X, G, np.where(np.isfinite(h), h, 0.0), P.B_dense, P.b)
    lim = tol * sc * sc
    g_size = np.abs(G).max(axis=1, initial=0.0)
    # a row's violation |G_i y − h_i| rounds at |G_i| |y| + |h_i|
    row_size = max(1.0, float(g_size.max(initial=0.0)), float(np.abs(P.B_dense).max(initial=0.0)))
    rhs_size = float(np.abs(np.concatenate([h[np.isfinite(h)], P.b])).max(initial=0.0))
    for i in range(X.shape[0]):
        lam, mu = mult[i, :ni], mult[i, ni:]
        stat = Y[i] - X[i] + G.T @ lam + (Bd.T @ mu if P.m_eq else 0.0)
        terms = np.abs(Y[i]) + np.abs(X[i]) + np.abs(G).T @ np.abs(lam) + (np.abs(Bd).T @ np.abs(mu) if P.m_eq else 0)
        own = tol * (unit + float(np.nan_to_num(terms, nan=0.0).max(initial=0.0)))
        slack = np.where(np.isfinite(h), h - G @ Y[i], 0.0)
        checks = {
            "stationarity |y − x + Gᵀλ + Bᵀμ|": (float(np.abs(stat).max()), own),
            "dual feasibility max(−λ_i |G_i|)": (float(max(0.0, (-lam * g_size).max(initial=0.0))), own),
            "complementarity |λ·slack|": (float(np.abs(lam * slack).max(initial=0.0)), lim),
            "primal violation": (float(P.violation(Y[i])), own * row_size + tol * rhs_size),
        }
        for name, (v, bound) in checks.items():
            if not v <= bound:
                flipped = Y[i] - X[i] - G.T @ lam - (Bd.T @ mu if P.m_eq else 0.0)
                sign = (" (it holds with the multipliers negated: wrong sign; λ_i >= 0 on an active inequality "
                        "row, y − x + Gᵀλ + Bᵀμ = 0)" if name.startswith(("stationarity", "dual"))
                        and float(np.abs(flipped).max()) <= own else "")
                raise AssertionError(f"projection KKT fails: {name} = {v:.3g} > {bound:.3g} for x = {_arr(X[i])}, "
                                     f"y = {_arr(Y[i], 10)}, multipliers = {_arr(mult[i])}{sign}")
    Y2 = project_checked(Y, P, solver).y
    err = np.abs(Y2 - Y).max(axis=1)
    if np.any(err > lim):
        i = int(np.argmax(err))
        raise AssertionError(f"idempotence fails: Π(Π(x)) − Π(x) = {err[i]:.3g} for x = {_arr(X[i])}, "
                             f"Π(x) = {_arr(Y[i], 10)}, Π(Π(x)) = {_arr(Y2[i], 10)}")
    dY = Y[:, None, :] - Y[None, :, :]
    dX = X[:, None, :] - X[None, :, :]
    fne = np.einsum("ijk,ijk->ij", dY, dY) - np.einsum("ijk,ijk->ij", dY, dX)
    if np.any(fne > lim):
        i, j = np.unravel_index(int(np.argmax(fne)), fne.shape)
        raise AssertionError(f"firm non-expansiveness fails: ‖Π(x)−Π(x')‖² − ⟨Π(x)−Π(x'), x−x'⟩ = {fne[i, j]:.3g} "
                             f"for x = {_arr(X[i])}, x' = {_arr(X[j])}")
    Z = Y if feasible is None else np.vstack([Y, np.atleast_2d(feasible)])
    vi = np.einsum("ik,ijk->ij", X - Y, Z[None, :, :] - Y[:, None, :])
    if np.any(vi > lim):
        i, j = np.unravel_index(int(np.argmax(vi)), vi.shape)
        raise AssertionError(f"variational inequality fails: ⟨x − Π(x), z − Π(x)⟩ = {vi[i, j]:.3g} > 0 for "
                             f"x = {_arr(X[i])}, feasible z = {_arr(Z[j])}")
    return {"points": X.shape[0]}


# --------------------------------------------------------------------------- kinks and conservativity
def find_kinks(P: Polyhedron, x0: np.ndarray, D: np.ndarray, solver: Any, *, grid: int = 33,
               width: float = 1e-11, extra_t: np.ndarray | None = None, max_rounds: int = 60) -> list[np.ndarray]:
    """Kinks of ``t ↦ Π_P(x0_j + t d_j)`` on ``[0, 1]``: where the active set changes.

    A grid of ``grid`` points (plus ``extra_t[j]``, e.g. the degenerate point) gives brackets whose
    end points have different active sets; all brackets of all segments are bisected together
    (one batched projection per round) until narrower than ``width``. Independent of the Jacobian.

    Returns
    -------
    list of sorted arrays, one per segment, of kink parameters (merged within ``1e3 · width``).
    """
    x0 = np.atleast_2d(x0)
    D = np.atleast_2d(D)
    S = x0.shape[0]
    # each bracket holds a change of the active set: a segment crosses a few kinks per row (a 50-dimensional
    # simplex's segments, dozens; a fixed 20 per segment called them "not reproducible"); more than that is
    # the exponential growth of an active set that flips at random
    cap = S * (20 + 2 * (P.n_ineq + P.m_eq)) + 50
    T = np.tile(np.linspace(0.0, 1.0, grid), (S, 1))
    if extra_t is not None:
        T = np.sort(np.hstack([T, np.asarray(extra_t, float).reshape(S, -1)]), axis=1)
    pts = (x0[:, None, :] + T[:, :, None] * D[:, None, :]).reshape(-1, P.n)
    act = project_checked(pts, P, solver).active.reshape(S, T.shape[1], -1)
    brackets = []  # (segment, ta, tb, Sa, Sb)
    for j in range(S):
        for g in range(T.shape[1] - 1):
            if T[j, g + 1] > T[j, g] and not np.array_equal(act[j, g], act[j, g + 1]):
                brackets.append((j, T[j, g], T[j, g + 1], act[j, g], act[j, g + 1]))
    done: list[tuple[int, float]] = []
    for _ in range(max_rounds):
        live = [b for b in brackets if b[2] - b[1] > width]
        done += [(b[0], 0.5 * (b[1] + b[2])) for b in brackets if b[2] - b[1] <= width]
        if not live:
            break
        mids = np.array([0.5 * (b[1] + b[2]) for b in live])
        segs = np.array([b[0] for b in live])
        am = project_checked(x0[segs] + mids[:, None] * D[segs], P, solver).active
        brackets = []
        for b, tm, sm in zip(live, mids, am):
            if not np.array_equal(sm, b[3]):
                brackets.append((b[0], b[1], tm, b[3], sm))
            if not np.array_equal(sm, b[4]):
                brackets.append((b[0], tm, b[2], sm, b[4]))
        if len(brackets) > cap:
            raise AssertionError(f"the active set flips too often along the segments ({len(brackets)} brackets, "
                                 f"more than {cap}: 20 + 2 per row of the polyhedron per segment): the backend's "
                                 "active sets are not reproducible")
    else:
        done += [(b[0], 0.5 * (b[1] + b[2])) for b in brackets]
    out = []
    for j in range(S):
        ks = np.sort([t for s, t in done if s == j])
        merged: list[float] = []
        for t in ks:
            if not merged or t - merged[-1] > 1e3 * width:
                merged.append(float(t))
        out.append(np.array(merged))
    return out


def check_conservativity(case: Any, solver: Any, tol: float = 1e-7, rng: np.random.Generator | None = None,
                         every_element: bool = True) -> dict[str, int]:
    """Conservativity of the HS-Jacobian along segments through a degenerate point.

    ``case`` is a :class:`~polyproj.testing.strategies.SegmentCase`. For each segment
    ``x(t) = x0 + t d`` the kinks are found (:func:`find_kinks`), and

    1. path integral: ``Σ_pieces J(x(t_mid)) d Δt = Π(x(1)) − Π(x(0))`` (J is constant on a piece);
    2. a.e. derivative: at a random interior ``t`` of every piece, the central difference of
       ``t ↦ Π(x(t))`` equals ``J(x(t)) d`` — for **every** element of the HS set at ``x(t)``
       (enumerated by :func:`hs_set`) when ``every_element``.

    The derivative is compared at points where the backend's answer is an exact KKT point to rounding
    (:func:`exact_certificate`). Within the polish's tolerance of a kink (a row crossing its hyperplane
    at a slow rate along ``d``: slack ``1e-9`` over a piece ``1e-6`` wide) the backend may return the
    neighbouring piece's face, verified to ``tol`` but not exact. There the central difference is that
    face's derivative, and the HS set enumerated at tolerance also holds the elements of the true face.
    The backend's face may also differ between the points of the difference stencil. So the point and
    its stencil must be exact; the others are counted in ``band_points`` (``derivative_points`` counts all).
    """
    rng = np.random.default_rng(0) if rng is None else rng
    P = case.point.polyhedron
    D = np.asarray(case.directions, float)
    x0 = case.x0
    S = D.shape[0]
    kinks = find_kinks(P, x0, D, solver, extra_t=case.s)
    ends = project_checked(np.vstack([x0, x0 + D]), P, solver).y
    pieces = []  # (segment, ta, tb)
    for j in range(S):
        br = np.concatenate([[0.0], kinks[j], [1.0]])
        pieces += [(j, br[i], br[i + 1]) for i in range(br.size - 1) if br[i + 1] - br[i] > 1e-9]
    seg = np.array([p[0] for p in pieces])
    ta = np.array([p[1] for p in pieces])
    tb = np.array([p[2] for p in pieces])
    tm = 0.5 * (ta + tb)
    res_m = project_checked(x0[seg] + tm[:, None] * D[seg], P, solver)
    Jd = hs_vjp(P, res_m.active, D[seg])
    n_kinks = 0
    for j in range(S):
        sel = seg == j
        integral = np.sum(Jd[sel] * (tb[sel] - ta[sel])[:, None], axis=0)
        chord = ends[S + j] - ends[j]
        lim = tol * _scale(D[j], x0[j]) * (1 + kinks[j].size)
        err = float(np.abs(integral - chord).max())
        n_kinks += kinks[j].size
        if err > lim:
            raise AssertionError(
                f"path integral fails on segment {j} (x0 = {_arr(x0[j])}, d = {_arr(D[j])}): "
                f"Σ J d Δt = {_arr(integral, 10)} but Π(x(1)) − Π(x(0)) = {_arr(chord, 10)} (error {err:.3g}); "
                f"kinks at t = {_arr(kinks[j], 8)}")
    # a.e. derivative on pieces wide enough for a central difference
    wide = (tb - ta) > 1e-6
    u = rng.uniform(0.25, 0.75, size=wide.sum())
    tr = ta[wide] + u * (tb[wide] - ta[wide])
    hh = np.minimum(1e-6, 0.05 * (tb[wide] - ta[wide]))
    sw, Dw = seg[wide], D[seg[wide]]
    Xr = x0[sw] + tr[:, None] * Dw
    Xs = np.vstack([Xr, Xr + hh[:, None] * Dw, Xr - hh[:, None] * Dw])
    res = project_checked(Xs, P, solver)
    k = tr.size
    fd = (res.y[k:2 * k] - res.y[2 * k:]) / (2 * hh[:, None])
    Jr = hs_vjp(P, res.active[:k], Dw)
    checked_elements = band_points = 0
    for i in range(k):
        if not all(exact_certificate(P, Xs[j], res.y[j], res.active[j]) for j in (i, k + i, 2 * k + i)):
            band_points += 1  # within the polish's tolerance of a kink: the difference is not J d's to test
            continue
        lim = 1e-6 * _scale(Dw[i], Xr[i])
        err = float(np.abs(fd[i] - Jr[i]).max())
        if err > lim:
            raise AssertionError(
                f"derivative fails at t = {tr[i]:.9g} on segment {sw[i]} (x0 = {_arr(x0[sw[i]])}, d = {_arr(Dw[i])}): "
                f"d/dt Π(x(t)) = {_arr(fd[i], 8)} but J(x(t)) d = {_arr(Jr[i], 8)} "
                f"(active set {np.flatnonzero(res.active[i]).tolist()})")
        if every_element:
            els = hs_set(P, Xr[i], res.y[i], res.active[i], rng=rng)  # sampled beyond 14 active rows
            if not els:
                act_i = np.flatnonzero(res.active[i]).tolist()
                raise AssertionError(f"empty HS set at x = {_arr(Xr[i])} (active {act_i})")
            for e in els:
                checked_elements += 1
                if np.abs(e.J @ Dw[i] - fd[i]).max() > lim:
                    raise AssertionError(
                        f"HS element K = {list(e.K)} at t = {tr[i]:.9g} on segment {sw[i]} gives J d = "
                        f"{_arr(e.J @ Dw[i], 8)} but d/dt Π(x(t)) = {_arr(fd[i], 8)}")
    return {"segments": S, "kinks": n_kinks, "pieces": len(pieces), "hs_elements": checked_elements,
            "band_points": band_points, "derivative_points": k}


#: rounding level of :func:`exact_certificate`, relative to the point's scale
ROUNDING = 1e-12


def exact_certificate(P: Polyhedron, x: np.ndarray, y: np.ndarray, active: np.ndarray) -> bool:
    """Whether ``active`` certifies ``y = Π_P(x)`` to rounding, not only to the polish's tolerance.

    True when ``y`` is feasible and tight on the active rows, and ``x − y = G_Iᵀ ν + Bᵀ μ`` has a
    solution with ``ν >= 0`` (non-negative least squares, so dependent active rows are no obstacle),
    each within :data:`ROUNDING` times ``1 + max |x| + max |y| + max |G|``.
    """
    from ..linalg import nnls

    G, h = ineq_form(P)
    Bm = P.B_dense.reshape(-1, P.n)
    x, y = np.asarray(x, float), np.asarray(y, float)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):  # a NaN answer certifies nothing
        return False
    act = np.asarray(active, bool)
    scale = 1.0 + float(np.abs(x).max(initial=0.0)) + float(np.abs(y).max(initial=0.0)) + \
        float(np.abs(G).max(initial=0.0))
    eps = ROUNDING * scale
    slack = h - G @ y
    if np.any(slack < -eps) or np.any(np.abs(slack[act]) > eps):
        return False
    if Bm.shape[0] and np.abs(Bm @ y - P.b).max() > eps:
        return False
    M = np.vstack([G[act], Bm, -Bm])  # μ = μ⁺ − μ⁻, both non-negative
    if not M.shape[0]:
        return bool(np.abs(x - y).max(initial=0.0) <= eps)
    _, resid = nnls(M.T, x - y)
    return bool(resid <= eps)


# --------------------------------------------------------------------------- B-subdifferential and LICQ
def _fd_jacobians(P: Polyhedron, Xs: np.ndarray, solver: Any, h: float):
    """Central-difference Jacobians at the rows of Xs; also whether each stencil stays on one piece."""
    s, n = Xs.shape
    E = np.eye(n)
    pts = np.vstack([Xs, (Xs[:, None, :] + h * E[None]).reshape(-1, n), (Xs[:, None, :] - h * E[None]).reshape(-1, n)])
    res = project_checked(pts, P, solver)
    Yp = res.y[s: s + s * n].reshape(s, n, n)
    Ym = res.y[s + s * n:].reshape(s, n, n)
    Jfd = np.swapaxes((Yp - Ym) / (2 * h), 1, 2)
    act_c = res.active[:s]
    same = np.all(res.active[s: s + s * n].reshape(s, n, -1) == act_c[:, None, :], axis=(1, 2))
    same &= np.all(res.active[s + s * n:].reshape(s, n, -1) == act_c[:, None, :], axis=(1, 2))
    return Jfd, act_c, same, res


def b_subdifferential_samples(P: Polyhedron, x: np.ndarray, solver: Any, rng: np.random.Generator, *,
                              n_random: int = 16, delta: float = 1e-4) -> tuple[list[np.ndarray], int]:
    """Jacobians of Π_P (central differences) at random differentiable points within ``delta`` of ``x``.

    Returns the Jacobians and the number of samples discarded because the difference stencil
    crossed a kink (a measure-zero event made likely only by a huge ``delta``).
    """
    n = P.n
    dirs = rng.normal(size=(n_random, n))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    dl = delta * _scale(x)
    Jfd, _, same, _ = _fd_jacobians(P, x[None, :] + dl * dirs, solver, 1e-3 * dl)
    return [Jfd[i] for i in range(n_random) if same[i]], int((~same).sum())


def _licq_holds(P: Polyhedron, active: np.ndarray) -> bool:
    G, _ = ineq_form(P)
    M = np.vstack([G[active], P.B_dense]).reshape(-1, P.n)
    return _rank(M) == M.shape[0]


def check_licq_equivalence(point: Any, solver: Any, rng: np.random.Generator | None = None, *,
                           n_random: int = 16, delta: float = 1e-4, tol: float = 1e-6) -> dict[str, int]:
    """Under LICQ at a degenerate ``x``: the B-subdifferential equals the HS set.

    ``point`` is a :class:`~polyproj.testing.strategies.DegeneratePoint` (LICQ at ``y*``).

    - ⊆: the Jacobian (central differences) at every random differentiable point within ``delta``
      is an HS element (and equals ``hs_jacobian`` at that point);
    - ⊇: every HS element ``K`` is reached: at ``x' = x + δ(t + G_Kᵀ1)``, where ``t`` solves
      ``G_K t = 0, B t = 0, G_{I∖K} t = −1`` (it exists under LICQ), ``Π`` is differentiable with
      active set ``K`` and its Jacobian is measured by central differences (Theorem 1's sequence);
    - the element used for backpropagation, ``hs_jacobian(P, I(x))``, is in the HS set.
    """
    rng = np.random.default_rng(0) if rng is None else rng
    P = point.polyhedron
    x = np.asarray(point.x, float)
    r0 = project_checked(x, P, solver)
    y, act = r0.y[0], r0.active[0]
    if float(np.abs(y - point.y).max()) > 1e-9 * _scale(y):
        raise AssertionError(f"Π(x) = {_arr(y, 10)} but the exact projection is {_arr(point.y)} for x = {_arr(x)}")
    if not np.array_equal(act, point.case.active):
        raise AssertionError(f"active set {np.flatnonzero(act).tolist()} at x = {_arr(x)}; "
                             f"expected {np.flatnonzero(point.case.active).tolist()}")
    if not _licq_holds(P, act):
        raise ValueError("LICQ fails at this point; use check_b_subdifferential_in_hs")
    els = hs_set(P, x, y, act)
    J_used = hs_jacobian(P, act)
    if _match(J_used, els, 1e-9) is None:
        raise AssertionError(f"hs_jacobian at I(x) = {np.flatnonzero(act).tolist()} is not in the HS set")
    G, _ = ineq_form(P)
    I = np.flatnonzero(act)
    dl = delta * _scale(x)
    targets = []
    for e in els:
        K = list(e.K)
        rest = [i for i in I if i not in K]
        M = np.vstack([G[I], P.B_dense]).reshape(-1, P.n)
        rhs = np.concatenate([np.where(np.isin(I, rest), -1.0, 0.0), np.zeros(P.m_eq)])
        t = np.linalg.lstsq(M, rhs, rcond=None)[0]
        push = G[K].sum(axis=0) if K else np.zeros(P.n)
        jitter = 1e-3 * rng.normal(size=P.n)
        targets.append(x + dl * (t + push + jitter))
    Jt, act_t, same_t, _ = _fd_jacobians(P, np.array(targets), solver, 1e-4 * dl)
    for e, Jfd, ok, a in zip(els, Jt, same_t, act_t):
        if not ok or np.abs(Jfd - e.J).max() > tol:
            raise AssertionError(
                f"HS element K = {list(e.K)} is not reached: at the nearby point built for it Π has "
                f"active set {np.flatnonzero(a).tolist()} and Jacobian\n{_arr(Jfd)}\n(expected\n{_arr(e.J)})")
    Jr, discarded = b_subdifferential_samples(P, x, solver, rng, n_random=n_random, delta=delta)
    for Jfd in Jr:
        if _match(Jfd, els, tol) is None:
            raise AssertionError(f"a Jacobian at a random point near x = {_arr(x)} is not in the HS set "
                                 f"({len(els)} elements):\n{_arr(Jfd)}")
    return {"points": 1, "hs_elements": len(els), "random_samples": len(Jr), "discarded": discarded}


def check_b_subdifferential_in_hs(point: Any, solver: Any, rng: np.random.Generator | None = None, *,
                                  n_random: int = 16, delta: float = 1e-4, tol: float = 1e-6) -> dict[str, int]:
    """Without LICQ: nearby Jacobians still lie in the HS set, and so does the element we use.

    (The converse may fail: see :func:`nonlicq_example`.)
    """
    rng = np.random.default_rng(0) if rng is None else rng
    P = point.polyhedron
    x = np.asarray(point.x, float)
    r0 = project_checked(x, P, solver)
    y, act = r0.y[0], r0.active[0]
    els = hs_set(P, x, y, act)
    if not els:
        raise AssertionError(f"empty HS set at x = {_arr(x)} (active {np.flatnonzero(act).tolist()})")
    if _match(hs_jacobian(P, act), els, 1e-9) is None:
        raise AssertionError(f"hs_jacobian at I(x) = {np.flatnonzero(act).tolist()} is not in the HS set "
                             f"{[list(e.K) for e in els]}")
    Jr, discarded = b_subdifferential_samples(P, x, solver, rng, n_random=n_random, delta=delta)
    for Jfd in Jr:
        if _match(Jfd, els, tol) is None:
            raise AssertionError(f"a Jacobian at a random point near x = {_arr(x)} is not in the HS set:\n{_arr(Jfd)}")
    return {"points": 1, "hs_elements": len(els), "random_samples": len(Jr), "discarded": discarded}


def nonlicq_example() -> tuple[Polyhedron, np.ndarray, str]:
    """A point where LICQ fails and the HS set is strictly larger than the B-subdifferential.

    ``P = {y ∈ R² : y₁ <= 0, y₂ <= 0, y₁ + y₂ <= 0}`` (the third row is redundant) and ``x = (1, 1)``:
    ``Π(x) = 0`` with all three rows active. The multipliers ``λ`` solving ``x = λ₁e₁ + λ₂e₂ +
    λ₃(1, 1)``, ``λ >= 0`` are ``(s, s, 1 − s)``, ``s ∈ [0, 1]``. Independent index sets containing
    the support of one of them: ``{1,2}``, ``{1,3}``, ``{2,3}`` (projector 0) and ``{3}``
    (projector ``I − ½ 11ᵀ``), so ``∂_HS Π(x) = {0, I − ½11ᵀ}``. But ``x`` is in the interior of the
    normal cone (the positive quadrant): every point nearby projects to 0, so ``∂_B Π(x) = {0}``.
    The element used for backpropagation, the projector onto the null space of all active rows,
    is 0 — in both sets.
    """
    P = Polyhedron(A=np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), a=np.zeros(3))
    return P, np.array([1.0, 1.0]), nonlicq_example.__doc__ or ""
