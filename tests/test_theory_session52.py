"""Theory probe (session 52): DESIGN §6, §6b, §9 on the structured sets and the public strategies.

Independent float64 references: the KKT conditions of the projection solved from scratch (bounded least squares
on the rows of ``as_polyhedron()`` tight at the answer), and the HS-Jacobian as the projector onto the null space
of the reported active rows (an SVD), never the sets' own code.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize as so

import polyproj as pp
from polyproj.testing import strategies as S

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

QUICK = settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))


def _rows(P: pp.Polyhedron):
    n, E = P.n, np.eye(P.n)
    G = np.vstack([P.A_dense, -E[P.lb_idx], E[P.ub_idx]]).reshape(-1, n)
    h = np.concatenate([P.a, -P.lb[P.lb_idx], P.ub[P.ub_idx]])
    B = P.B_dense if P.m_eq else np.zeros((0, n))
    b = P.b if P.m_eq else np.zeros(0)
    return G, h, B, b


def _kkt_residual(P: pp.Polyhedron, x: np.ndarray, y: np.ndarray, act_tol: float = 1e-9) -> float:
    """``min |x − y − G_Aᵀλ − Bᵀμ|_∞`` over ``λ >= 0`` on the rows tight at ``y`` (0 iff y = Π(x), y feasible)."""
    G, h, B, b = _rows(P)
    slack = h - G @ y
    assert slack.min(initial=0.0) >= -1e-12 and (not B.size or np.abs(B @ y - b).max() <= 1e-12)
    tight = slack <= act_tol
    M = np.vstack([G[tight], B]).T
    if M.shape[1] == 0:
        return float(np.abs(x - y).max())
    lo = np.concatenate([np.zeros(int(tight.sum())), np.full(B.shape[0], -np.inf)])
    sol = so.lsq_linear(M, x - y, bounds=(lo, np.inf), method="bvls", tol=1e-14)
    return float(np.abs(M @ sol.x - (x - y)).max())


def _null_projector(P: pp.Polyhedron, active: np.ndarray) -> np.ndarray:
    G, _, B, _ = _rows(P)
    H = np.vstack([G[np.asarray(active, bool)], B])
    if not H.shape[0]:
        return np.eye(P.n)
    _, s, Vt = np.linalg.svd(H)
    V = Vt[: int((s > max(H.shape) * s.max() * 1e-12).sum())].T
    return np.eye(P.n) - V @ V.T


# --------------------------------------------------------------------------- partial matchings far out
# Integer ties at 1e8: the structured face rounds ran out and the samples went to the generic path, whose KKT
# tolerance (1e-9 of |x| = 0.2) let faces 0.17-0.375 off the projection pass, SOLVED and polished.
TIED_FAR = 1e8 * np.array([[1.0, -2.0, 1.0, 0.0, -1.0], [0.0, 2.0, 2.0, -1.0, 2.0]])


def test_partial_matching_far_ties_exact():
    S_ = pp.sets.PartialMatching(2, 5, max_matches=1.0)
    res = S_.project(TIED_FAR)
    assert res.status == pp.Status.SOLVED and res.polished
    # three tied entries of 2e8 in the second row share the total 1: by symmetry 1/3 each
    np.testing.assert_allclose(np.asarray(res.y)[1], [0, 1 / 3, 1 / 3, 0, 1 / 3], atol=1e-12)
    assert _kkt_residual(S_.as_polyhedron(), TIED_FAR.ravel(), np.asarray(res.y).ravel()) <= 1e-6
    r32 = S_.project(TIED_FAR.astype(np.float32))  # via float64, then the same fallback
    np.testing.assert_allclose(np.asarray(r32.y, dtype=float)[1], [0, 1 / 3, 1 / 3, 0, 1 / 3], atol=1e-7)


@pytest.mark.parametrize(("rows", "cols", "alpha"), [(2, 5, 1.0), (3, 4, None), (4, 4, 2.5)])
def test_partial_matching_far_ties_match_scale_invariant_reference(rows, cols, alpha):
    """On a fixed face ``X(sC)`` is constant once bounded; where ``C·1e3`` and ``C·1e5`` agree, so does ``C·1e8``."""
    S_ = pp.sets.PartialMatching(rows, cols, max_matches=alpha)
    Z = np.random.default_rng(2).integers(-2, 3, size=(60, S_.n)).astype(float)
    ref3 = np.asarray(S_.project(Z * 1e3).y).reshape(60, -1)
    ref5 = np.asarray(S_.project(Z * 1e5).y).reshape(60, -1)
    settled = np.abs(ref3 - ref5).max(axis=1) < 1e-12
    res = S_.project(Z * 1e8)
    y = np.asarray(res.y).reshape(60, -1)
    assert all(s == pp.Status.SOLVED for s in res.status) and bool(np.all(res.polished))
    assert settled.sum() >= 40
    assert np.abs(y - ref5)[settled].max() <= 1e-6  # (rounding: (r + c) eps 1e8 ~ 2e-7)


def test_partial_matching_far_reports_every_row_at_its_bound():
    """I(x) holds every row with aᵢᵀy = aᵢ (DESIGN §6): two column sums exactly 1 after finish were left off."""
    S_ = pp.sets.PartialMatching(4, 4, max_matches=2.5)
    x = 1e8 * np.array([[0.0, -2, 2, 0], [2, 1, 0, 2], [0, 1, 2, 0], [1, 1, 0, 2]])
    res = S_.project(x)
    P = S_.as_polyhedron()
    G, h, _, _ = _rows(P)
    y = np.asarray(res.y).ravel()
    active = np.asarray(res.active)
    assert _kkt_residual(P, x.ravel(), y) <= 1e-6
    np.testing.assert_array_equal(active, np.abs(h - G @ y) <= 1e-12)
    assert active[6] and active[7]  # the column sums of columns 2 and 3
    V = np.random.default_rng(0).normal(size=S_.n)
    np.testing.assert_allclose(np.asarray(S_.vjp(res, V)).ravel(), _null_projector(P, active) @ V, atol=1e-12)


# --------------------------------------------------------------------------- every set against references
SETS = [
    pp.sets.Box(np.array([-1.0, 0, -np.inf, 0.5, -2]), np.array([1.0, 0, 1, np.inf, -1])),
    pp.sets.Simplex(6, 1.0),
    pp.sets.Simplex(4, 0.0),
    pp.sets.CappedSimplex(6, 2.5, 0.7),
    pp.sets.CappedSimplex(4, 2.0, 0.5),
    pp.sets.CappedSimplex(5, 0.3, 10.0),
    pp.sets.Birkhoff(1),
    pp.sets.Birkhoff(3),
    pp.sets.Birkhoff(22),
    pp.sets.PartialMatching(3, 4),
    pp.sets.PartialMatching(4, 4, max_matches=2.5),
    pp.sets.PartialMatching(3, 3, max_matches=3.0),
]


def _points(S_, rng):
    n = S_.n
    inside = np.asarray(S_.project(rng.normal(size=(3, n)) * 3).y).reshape(3, n)
    return np.vstack([rng.normal(size=(3, n)), rng.integers(-2, 3, size=(3, n)) / 2.0,
                      rng.normal(size=(2, n)) * 1e8, rng.integers(-2, 3, size=(2, n)) * 1e8,
                      rng.normal(size=(2, n)) * 1e-8, inside])


@pytest.mark.parametrize("S_", SETS, ids=repr)
def test_set_projection_kkt_and_vjp_independent(S_):
    rng = np.random.default_rng(11)
    P = S_.as_polyhedron()
    X = _points(S_, rng)
    res = S_.project(X)
    Y = np.asarray(res.y).reshape(X.shape[0], -1)
    V = rng.normal(size=X.shape)
    JV = np.asarray(S_.vjp(res, V)).reshape(X.shape)
    for i in range(X.shape[0]):
        sc = 1.0 + np.abs(X[i]).max()
        assert _kkt_residual(P, X[i], Y[i]) <= 1e-12 * sc * P.n, (i, X[i])
        np.testing.assert_allclose(JV[i], _null_projector(P, np.asarray(res.active)[i]) @ V[i], atol=1e-12)


@pytest.mark.parametrize("S_", [SETS[0], SETS[3], SETS[7], SETS[10]], ids=repr)
def test_set_conservativity_fd_and_path_integral(S_):
    """``d/dt Π(x0 + t d) = J d`` at random t, and ``∫ J d dt`` (midpoint rule) is the chord to its step size."""
    rng = np.random.default_rng(5)
    n, N, h = S_.n, 2000, 1e-7
    for _ in range(2):
        x0, d = rng.normal(size=n) * 2, rng.normal(size=n) * 3
        t = (np.arange(N) + 0.5) / N
        X = x0[None] + t[:, None] * d[None]
        Jd = np.asarray(S_.vjp(S_.project(X), np.tile(d, (N, 1)))).reshape(N, n)
        ends = np.asarray(S_.project(np.stack([x0, x0 + d])).y).reshape(2, n)
        # each kink costs the midpoint rule at most one step |d|/N per coordinate
        assert np.abs(Jd.mean(axis=0) - (ends[1] - ends[0])).max() <= 2 * n * np.abs(d).max() / N
        ts = rng.uniform(0, 1, 50)
        Xs = x0[None] + ts[:, None] * d[None]
        fd = (np.asarray(S_.project(Xs + h * d).y) - np.asarray(S_.project(Xs - h * d).y)).reshape(50, n) / (2 * h)
        Js = np.asarray(S_.vjp(S_.project(Xs), np.tile(d, (50, 1)))).reshape(50, n)
        assert np.mean(np.abs(fd - Js).max(axis=1) <= 1e-5) >= 0.95


# --------------------------------------------------------------------------- strategies
@QUICK
@given(S.degenerate_points(S.polyhedron_cases(min_n=1, max_n=5, licq=False)))
def test_degenerate_point_kind_counts_independent_rows(pt):
    """``kind`` is the face of ``y*`` by its dimension (the null space of its tight rows and B, from an SVD), not by
    the count of tight rows: a point is a vertex, one dimension below the set's affine hull a facet."""
    import scipy.linalg

    P = pt.polyhedron
    G, _, B, _ = _rows(P)
    M = np.vstack([G[pt.case.active], B])
    dim_face = scipy.linalg.null_space(M).shape[1] if M.shape[0] else P.n
    dim_set = scipy.linalg.null_space(B).shape[1] if P.m_eq else P.n
    want = "vertex" if dim_face == 0 else "facet" if dim_face == dim_set - 1 else "edge"
    assert pt.kind == want
    assert _kkt_residual(P, pt.x, pt.y, act_tol=1e-12) <= 1e-12  # and Π(x) = y*


@QUICK
@given(S.polyhedron_cases(min_n=1, max_n=5, licq=None))
def test_polyhedron_cases_licq_claim(case):
    P = case.polyhedron
    G, h, B, _ = _rows(P)
    slack = h - G @ case.y_star
    assert slack.min(initial=0.0) >= 0 and np.array_equal(case.active, slack == 0)
    M = np.vstack([G[case.active], B])
    assert (np.linalg.matrix_rank(M) == M.shape[0]) == case.licq


def _lp_status(qp: pp.QP) -> int:
    q = qp.dense()
    A, ub, Ae, be = [], [], [], []
    for i in range(q.m):
        if q.l[i] == q.u[i]:
            Ae.append(q.C[i])
            be.append(q.u[i])
            continue
        if np.isfinite(q.u[i]):
            A.append(q.C[i])
            ub.append(q.u[i])
        if np.isfinite(q.l[i]):
            A.append(-q.C[i])
            ub.append(-q.l[i])
    bounds = [(None if np.isinf(lo) else lo, None if np.isinf(hi) else hi) for lo, hi in zip(q.lb, q.ub)]
    n = q.n
    return so.linprog(np.zeros(n), A_ub=np.array(A).reshape(-1, n) if A else None, b_ub=ub or None,
                      A_eq=np.array(Ae).reshape(-1, n) if Ae else None, b_eq=be or None, bounds=bounds,
                      method="highs").status


@QUICK
@given(S.feasible_qps())
def test_feasible_qps_are_feasible_by_lp(case):
    assert case.qp.primal_violation(case.x_feasible) == 0 and _lp_status(case.qp) == 0


@QUICK
@given(S.infeasible_qps())
def test_infeasible_qps_are_infeasible_by_lp(case):
    assert _lp_status(case.qp) == 2
