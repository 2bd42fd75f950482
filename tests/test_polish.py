"""The polish's face solve: Cholesky path, SVD path and the factor/operator formulation agree on every namespace."""

from __future__ import annotations

import numpy as np
import pytest

import polyproj as pp
from polyproj.polydata import PolyData
from polyproj.projection.polish import face_solve, polish


def _face_data(rng, batch=6, n=8, m=12, p=1):
    A = rng.normal(size=(m, n))
    x0 = rng.uniform(-0.5, 0.5, size=n)
    a = A @ x0 + rng.uniform(0.1, 1.0, size=m)
    a[1] = np.inf  # an ignored row
    B = rng.normal(size=(p, n))
    b = B @ x0
    lb, ub = -np.ones(n), np.ones(n)
    lb[2] = -np.inf
    X = 2.0 * rng.normal(size=(batch, n))
    S = np.zeros((batch, m + 2 * n), dtype=bool)
    S[:, :m] = rng.random((batch, m)) < 0.3
    S[:, 1] = False
    S[:, m:] = rng.random((batch, 2 * n)) < 0.15
    S[:, m + 2] = False
    S[0, :m] = False  # only bounds and B
    S[1, m:] = False  # no bound active
    S[2, 0] = S[2, 3] = True
    A[3] = A[0]  # duplicated row active in sample 2: LICQ fails, the SVD fallback takes over
    a[3] = a[0]
    return X, PolyData(A, a, B, b, lb, ub), S


def _reference(X, d: PolyData, S):
    """The projection onto each face by an independent dense least-squares KKT solve.

    Fixed coordinates sit at their bound (upper bound when both are listed); the active rows of A and all
    of B hold as equalities, in the least-squares sense of the rows normalised on the free coordinates when
    they are inconsistent; multipliers are the minimum-norm ones.
    """
    n, m = X.shape[1], d.m
    Ys, mults, mus, conss = [], [], [], []
    for i in range(X.shape[0]):
        at_ub, at_lb = S[i, m + n:], S[i, m: m + n] & ~S[i, m + n:]
        fixed = at_lb | at_ub
        val = np.where(at_ub, d.ub, np.where(at_lb, d.lb, 0.0))
        rows = np.flatnonzero(S[i, :m])
        M = np.vstack([d.A[rows], d.B])
        c = np.concatenate([d.a[rows], d.b]) - M[:, fixed] @ val[fixed]
        F = ~fixed
        MF = M[:, F]
        z = np.zeros(n)
        z[fixed] = val[fixed]
        norms = np.linalg.norm(MF, axis=1)
        D = np.where(norms > 0, 1.0 / np.where(norms > 0, norms, 1.0), 0.0)
        Mn = D[:, None] * MF
        lam = D * (np.linalg.pinv(Mn @ Mn.T) @ (D * (MF @ X[i, F] - c))) if MF.size else np.zeros(M.shape[0])
        z[F] = X[i, F] - MF.T @ lam
        zb = (X[i] - z - M.T @ lam) * fixed
        lamA = np.zeros(m)
        lamA[rows] = lam[: rows.size]
        Ys.append(z)
        mults.append(np.concatenate([lamA, -zb * at_lb, zb * at_ub]))
        mus.append(lam[rows.size:])
        c = np.concatenate([d.a[rows], d.b])  # the consistency relative to each row's terms |M_i||z| + |c_i|
        size = np.abs(M) @ np.abs(z) + np.abs(c)
        conss.append(np.max(np.abs(M @ z - c) / np.where(size > 0, size, 1.0), initial=0.0))
    return np.array(Ys), np.array(mults), np.array(mus), np.array(conss)


@pytest.mark.core
def test_face_solve_matches_an_independent_kkt_solve(rng):
    X, d, S = _face_data(rng)
    ref = _reference(X, d, S)
    for method in ("auto", "svd"):
        out = face_solve(X, d, S, method=method)[:4]
        for o, r in zip(out[:3], ref[:3], strict=True):
            np.testing.assert_allclose(o, r, atol=1e-10)
        np.testing.assert_allclose(out[3], ref[3], atol=1e-10)
    # stationarity on the face: Y − X + Aᵀλ_A − λ_lb + λ_ub + Bᵀμ = 0
    Y, mult, mu, _, _ = face_solve(X, d, S)
    m, n = d.m, X.shape[1]
    r = Y - X + mult[:, :m] @ d.A - mult[:, m: m + n] + mult[:, m + n:] + mu @ d.B
    assert np.max(np.abs(r)) < 1e-10


@pytest.mark.core
def test_face_solve_with_empty_face(rng):
    X, d, S = _face_data(rng, p=0)
    d = PolyData(d.A, d.a, np.zeros((0, X.shape[1])), np.zeros(0), d.lb, d.ub)
    S[:] = False
    Y, mult, mu, cons, _ = face_solve(X, d, S)
    np.testing.assert_array_equal(Y, X)
    assert mu.shape == (X.shape[0], 0) and not mult.any() and not cons.any()


def _polish_args(rng):
    X, d, _ = _face_data(rng, batch=10)
    y = pp.project(X, pp.Polyhedron(A=d.A, a=d.a, B=d.B, b=d.b, lb=d.lb, ub=d.ub)).y
    Y0 = y + 1e-3 * rng.normal(size=y.shape)  # a rough start: some samples need a second face
    mult0 = np.zeros((X.shape[0], d.m + 2 * X.shape[1]))
    return (X, d, Y0, mult0), dict(cand_tol=1e-7, dist_tol=1e-2, tol=1e-9, max_iter=50), y


FIELDS = ("Y", "active", "mult", "mu", "accepted")


@pytest.mark.parametrize("namespace", ["torch", "array_api_strict"])
def test_polish_agrees_across_namespaces(rng, namespace):
    (X, d, Y0, mult0), kw, y = _polish_args(rng)
    ref = polish(X, d, Y0, mult0, **kw)
    assert ref.accepted.all()
    np.testing.assert_allclose(ref.Y, y, atol=1e-10)
    if namespace == "torch":
        torch = pytest.importorskip("torch")
        conv, back = torch.from_numpy, (lambda t: t.numpy())
    else:
        xps = pytest.importorskip("array_api_strict")
        conv, back = xps.asarray, np.asarray

    def c(v):
        return conv(np.ascontiguousarray(v))

    out = polish(c(X), PolyData(*(c(v) for v in d.parts())), c(Y0), c(mult0), **kw)
    for f in FIELDS:
        o, r = back(getattr(out, f)), getattr(ref, f)
        if r.dtype == bool:
            np.testing.assert_array_equal(o, r)
        else:
            np.testing.assert_allclose(o, r, atol=1e-9)


def test_inconsistent_candidate_face_does_not_cycle():
    """Near-active rows taken as candidates on top of a vertex make the face inconsistent: the polish
    drops the candidate least supported by the backend instead of cycling (drop a truly active
    row on its least-squares slack, re-add it as violated, ...)."""
    rng = np.random.default_rng(3)
    n, m = 10, 40
    A = rng.normal(size=(m, n))
    a = A @ rng.normal(size=n) + rng.uniform(0.05, 1.0, size=m)
    B, b = rng.normal(size=(1, n)), np.zeros(1)
    b[:] = B @ np.linalg.lstsq(A, a - 1.0, rcond=None)[0]
    P = pp.Polyhedron(A=A, a=a, B=B, b=b)
    X = 20.0 * rng.normal(size=(64, n))
    ref = pp.project(X, P, eps_abs=1e-10)
    act = np.asarray(ref.active)
    slack = a - ref.y @ A.T
    vertex = act.sum(1) + 1 >= n
    assert vertex.sum() >= 5  # far points land on vertices of the polytope
    # start at the exact answer, multipliers unknown, with a distance threshold that also takes the
    # nearest inactive rows: an over-determined (inconsistent) candidate face for those samples
    near = np.where(act, np.inf, slack / np.linalg.norm(A, axis=1)).min(1)
    sig = np.maximum(np.abs(ref.y).max(1), np.abs(X).max(1))  # the polish's scale of a sample
    dist_tol = float(np.quantile((near / sig)[vertex], 0.5)) * 1.01
    lb, ub = np.full(n, -np.inf), np.full(n, np.inf)
    out = polish(X, PolyData(A, a, B, b, lb, ub), ref.y.copy(), np.zeros((64, m + 2 * n)),
                 cand_tol=1e-2, dist_tol=dist_tol, tol=1e-9, max_iter=8)
    assert out.accepted.all()
    np.testing.assert_allclose(out.Y, ref.y, atol=1e-9)
    np.testing.assert_array_equal(out.active[:, :m], act)


def test_polish_hands_the_last_samples_off_after_two_rounds(rng):
    # the polish stops once at most `handoff` samples are left (never before HANDOFF_AFTER rounds) and
    # returns them not accepted; with handoff=0 it runs its rounds to the end
    from polyproj.projection.polish import HANDOFF_AFTER

    X, d, _ = _face_data(rng, batch=40)
    Y0 = np.zeros_like(X)  # a bad start: many rounds needed
    mult0 = np.zeros((X.shape[0], d.m + 2 * d.n))
    kw = dict(cand_tol=1e-7, dist_tol=1e-9, tol=1e-9)
    full = polish(X, d, Y0, mult0, max_iter=60, **kw)
    assert full.accepted.all()
    for rounds in range(HANDOFF_AFTER, 8):  # the samples left after `rounds` rounds of the full polish
        left = int((~polish(X, d, Y0, mult0, max_iter=rounds, **kw).accepted).sum())
        if 0 < left:
            break
    else:
        pytest.skip("every sample was accepted within the hand-off rounds")
    part = polish(X, d, Y0, mult0, max_iter=60, handoff=left, **kw)
    assert 0 < int((~part.accepted).sum()) <= left  # stopped with the samples left to the caller
    assert not part.active[~part.accepted].any()
    ok = part.accepted  # what it accepted is the exact projection
    assert np.allclose(part.Y[ok], full.Y[ok], atol=1e-10)


def test_layer_hands_the_admm_tail_to_daqp(rng, monkeypatch):
    # the samples the ADMM start's polish leaves after two rounds go to DAQP one at a time (exact faces)
    pytest.importorskip("daqp")
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project
    from polyproj.backends import defaults

    n, m = 20, 40
    A = rng.normal(size=(m, n))
    x0 = rng.normal(size=n)
    a = A @ x0 + rng.uniform(0.1, 1.0, size=m)
    X = x0 + 3.0 * rng.normal(size=(256, n))
    P = pp.Polyhedron(A=A, a=a, lb=x0 - 2.0, ub=x0 + 2.0)
    ref = pp.project(X, P, backend="proxsuite", eps_abs=1e-10)
    names = []
    real = defaults.fallback_for
    monkeypatch.setattr(defaults, "fallback_for", lambda *args: names.append(real(*args)) or names[-1])
    t = {k: torch.tensor(v) for k, v in dict(A=A, a=a, lb=P.lb, ub=P.ub).items()}
    y = project(torch.tensor(X), backend="admm", **t)
    assert np.max(np.abs(y.numpy() - ref.y)) < 1e-9
    assert names and all(nm == "daqp" for nm in names)  # asked once at most, and it chose DAQP


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("share_fixed", [0.0, 0.25, 0.75, 1.0])
def test_face_gram_of_shared_rows_equals_the_masked_product(rng, lib, share_fixed):
    """The Gram matrices of gathered shared rows (table gather, per-sample products for samples with
    fixed columns, or one product for all when most have them) equal ``M_n M_nᵀ`` formed directly."""
    from polyproj.projection.faces import gather_active_rows

    b, m, p, n = 12, 9, 2, 6
    A, B = rng.standard_normal((m, n)), rng.standard_normal((p, n))
    active = rng.random((b, m)) < 0.4
    free = np.ones((b, n))
    for i in range(round(share_fixed * b)):
        free[i, rng.choice(n, size=2, replace=False)] = 0.0
    if lib == "torch":
        torch = pytest.importorskip("torch")
        A, B, active, free = (torch.from_numpy(v) for v in (A, B, active, free))
    R = gather_active_rows(A, B, active, free)
    G = np.asarray(R.gram())
    Mn = np.asarray(R.Mn)
    np.testing.assert_allclose(G, Mn @ Mn.transpose(0, 2, 1), rtol=0, atol=1e-13)
    for i in range(b):  # the rows themselves: active rows of A then B, on the free columns, unit norm
        rows = np.concatenate([np.asarray(A)[np.asarray(active)[i]], np.asarray(B)]) * np.asarray(free)[i]
        rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        k = int(np.asarray(active)[i].sum())
        kk = G.shape[1]
        want = np.zeros((kk, kk))
        idx = list(range(k)) + list(range(kk - p, kk))
        want[np.ix_(idx, idx)] = rows @ rows.T
        np.testing.assert_allclose(G[i], want, rtol=0, atol=1e-13)


# ----------------------------------------------------------------------------- degenerate vertices
#: backends whose starts are inexact (the default's DAQP ends on the exact working set by itself)
INEXACT_STARTS = ["ipm", "clarabel", "piqp", "proxsuite", "osqp", "highs", "admm"]


def _project_recorded(X, P, backend):
    """``pp.project`` with its warnings recorded: ``(result, messages)``."""
    import warnings

    if backend not in pp.available_backends():
        pytest.skip(f"{backend} not installed")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = pp.project(X, P, backend=backend)
    return res, [str(w.message) for w in caught]


def _assert_verified_kkt(P, X, res, Y):
    """Polished, no refusal, the exact answer ``Y``, and the KKT conditions from scratch on the result's
    multipliers (rows of A, finite lower bounds, finite upper bounds; then the rows of B)."""
    assert np.asarray(res.polished).all()
    np.testing.assert_allclose(res.y, Y, rtol=0, atol=1e-12 * (1.0 + np.abs(X).max()))
    n = X.shape[1]
    lo, hi = np.isfinite(P.lb), np.isfinite(P.ub)
    G = np.vstack([P.A, -np.eye(n)[lo], np.eye(n)[hi]])
    k = G.shape[0]
    lam, mu = np.asarray(res.multipliers)[:, :k], np.asarray(res.multipliers)[:, k:]
    assert (lam >= 0).all()
    stat = res.y - X + lam @ G + mu @ P.B
    assert np.abs(stat).max() <= 1e-12 * (1.0 + np.abs(X).max())
    assert P.violation(res.y).max() <= 1e-13


def _no_refusal(messages):
    assert not [m for m in messages if "polish refused" in m], messages


@pytest.mark.parametrize("backend", INEXACT_STARTS)
def test_vertex_at_the_origin_with_a_fixed_coordinate_and_a_weakly_active_row(backend):
    """The projection is the origin: a vertex of a fixed coordinate (lb == ub == 0), a lower bound, the
    equality and a weakly active row (zero multiplier). Every right-hand side of the face is 0 and so
    is y: the face point's rounding noise (eps² |x| after the refinement) is judged at the scale eps |x|,
    not at |y| = 0, where no computed point passes."""
    inf = np.inf
    P = pp.Polyhedron(A=[[1.0, 2.0, 1.0, 2.0]], a=[0.0], B=[[-1.0, -1.0, 1.0, 1.0]], b=[0.0],
                      lb=[0.0, 0.0, -inf, -inf], ub=[inf, 0.0, 1.0, inf])
    X = np.array([[0.5, -0.5, -1.5, -1.5], [2.0, -1.0, -3.0, -3.0]])
    res, messages = _project_recorded(X, P, backend)
    _no_refusal(messages)
    _assert_verified_kkt(P, X, res, np.zeros_like(X))
    # active: the row of A (weakly), both lower bounds at 0 and the upper bound fixing coordinate 1
    np.testing.assert_array_equal(np.asarray(res.active), [[True, True, True, True, False]] * 2)


def test_vertex_at_the_origin_through_the_torch_layer():
    torch = pytest.importorskip("torch")
    import warnings

    from polyproj.adapters.torch import project

    def t(v):
        return torch.tensor(v, dtype=torch.float64)

    inf = float("inf")
    args = (t([[1.0, 2, 1, 2]]), t([0.0]), t([[-1.0, -1, 1, 1]]), t([0.0]), t([0.0, 0, -inf, -inf]),
            t([inf, 0, 1, inf]))
    x = t([[0.5, -0.5, -1.5, -1.5]])
    for backend in ["auto"] + [b for b in INEXACT_STARTS if b in pp.available_backends()]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = project(x, *args, backend=backend)
        _no_refusal([str(w.message) for w in caught])
        assert float(y.abs().max()) <= 1e-14, backend


def _pyramid(apex_z):
    """Square pyramid with apex (0, 0, apex_z): four facets through the apex (LICQ fails there), base
    ``z >= apex_z - 1``."""
    N = np.array([[1.0, 0.0, 1.0], [-1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [0.0, -1.0, 1.0]])
    return pp.Polyhedron(A=N, a=np.full(4, apex_z), lb=[-np.inf, -np.inf, apex_z - 1.0]), N


@pytest.mark.parametrize("apex_z", [1.0, 0.0])
@pytest.mark.parametrize("backend", INEXACT_STARTS)
def test_apex_of_a_square_pyramid_is_verified(rng, backend, apex_z):
    """Points whose projection is the apex, where four facets meet in R^3 (dependent active rows):
    x = apex + Nᵀc with c >= 0, some c_i = 0 (weakly active facets) — the apex by construction."""
    P, N = _pyramid(apex_z)
    apex = np.array([0.0, 0.0, apex_z])
    C = rng.uniform(0.0, 2.0, size=(12, 4)) * (rng.random((12, 4)) < 0.7)
    X = np.vstack([[0.1, -0.05, apex_z + 4.0], [0.0, 0.0, apex_z + 2.0], apex + C @ N])
    res, messages = _project_recorded(X, P, backend)
    _no_refusal(messages)
    _assert_verified_kkt(P, X, res, np.broadcast_to(apex, X.shape))
    assert np.asarray(res.active)[:2, :4].all()  # x − apex inside the normal cone: every facet active


@pytest.mark.parametrize("backend", INEXACT_STARTS)
def test_degenerate_vertices_at_the_origin_are_verified(backend):
    """More rows through the vertex than dimensions, a coordinate fixed by lb == ub, equality rows and
    rows with zero multipliers, all at the origin: the exact answer is the vertex (x − v in its normal
    cone by construction)."""
    rng = np.random.default_rng(7)
    for _ in range(3):
        n = 4
        d = rng.normal(size=n)
        N = 0.6 * rng.normal(size=(n + 2, n)) + d / np.linalg.norm(d)  # a pointed cone of n + 2 rows
        E = rng.normal(size=(3, n))
        Bm = rng.normal(size=(1, n))
        lb, ub = np.full(n, -np.inf), np.full(n, np.inf)
        lb[1] = ub[1] = 0.0
        P = pp.Polyhedron(A=np.vstack([N, E]), a=np.r_[np.zeros(n + 2), rng.uniform(0.5, 2.0, 3)], B=Bm, b=[0.0],
                          lb=lb, ub=ub)
        C = rng.uniform(0.0, 2.0, size=(10, n + 2)) * (rng.random((10, n + 2)) < 0.6)
        X = C @ N + rng.normal(size=(10, 1)) @ Bm + rng.normal(size=(10, 1)) * np.eye(n)[1]
        res, messages = _project_recorded(X, P, backend)
        _no_refusal(messages)
        _assert_verified_kkt(P, X, res, np.zeros_like(X))
