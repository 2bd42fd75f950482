"""Structured sets: per-sample totals solved in two passes, float32 thresholds, matrix cotangents at fallback
samples, degenerate faces of partial matchings (near permutations).
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest

import polyproj as pp
from tests.helpers import kkt_residuals

F32 = float(np.finfo(np.float32).eps)


# ------------------------------------------------------------------ per-sample totals, rows solved twice
def _row_by_row(X, S_of, totals):
    return np.stack([np.asarray(pp.project(X[i], S_of(float(t))).y) for i, t in enumerate(totals)])


# rows whose (K+1)-th largest entry lies above the threshold are solved again on all their entries: a large
# total (many positive entries) or a flat row; the others end on the prefilter's candidates
TOTAL_CASES = {
    "simplex": (40, lambda n, t: pp.sets.Simplex(n, t), [1.0, 100.0, 0.5]),
    "capped": (200, lambda n, t: pp.sets.CappedSimplex(n, t, 0.5), [0.5, 8.0, 30.0]),
    "capped-one-total": (100, lambda n, t: pp.sets.CappedSimplex(n, t, 0.5), [2.0, 2.0, 2.0]),
}


@pytest.mark.parametrize("name", sorted(TOTAL_CASES))
def test_totals_of_rows_solved_again_equal_each_row_alone(name, rng):
    """The weak-activity tolerance of the rows solved again was computed with the whole batch's totals:
    a shape error (NumPy ValueError, torch RuntimeError) whenever some rows needed the full solve and
    others did not — with per-sample totals, and with one total once two rows or more needed it."""
    n, make, totals = TOTAL_CASES[name]
    X = 0.1 * rng.standard_normal((3, n))
    X[0] *= 20.0  # spread out: the candidates decide it
    X[2] = 1e-3 * rng.standard_normal(n)  # nearly flat: every entry positive, the prefilter fails
    t = np.array(totals)
    S = make(n, t) if len(set(totals)) > 1 else make(n, float(t[0]))
    ref = _row_by_row(X, lambda v: make(n, v), totals)
    scale = 1.0 + np.abs(X).max() + t.max()
    res = pp.project(X, S)
    np.testing.assert_array_less(np.abs(np.asarray(res.y) - ref).max(), 1e-12 * scale)
    np.testing.assert_array_less(np.abs(np.asarray(res.y).sum(axis=1) - t), 1e-12 * scale)
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    St = make(n, torch.tensor(t)) if len(set(totals)) > 1 else S
    y = project(torch.tensor(X), St).numpy()
    np.testing.assert_array_less(np.abs(y - ref).max(), 1e-12 * scale)


def test_the_prefilter_start_is_below_every_rows_root(monkeypatch, rng):
    """The start taken from the smallest of the per-sample totals (the m-th largest candidate less u,
    m = ⌈min t / u⌉) is below the root only of rows with t <= m u; the rows with larger totals start at the
    usual bound (``_newton``'s ``lower`` must satisfy f(lower) >= t)."""
    import polyproj.sets.threshold as th

    seen = []
    inner = th._newton

    def spy(X, total, upper, max_iter, lower=None):
        if lower is not None:
            seen.append((X, total, upper, lower))
        return inner(X, total, upper, max_iter, lower)

    monkeypatch.setattr(th, "_newton", spy)
    X = 0.1 * rng.standard_normal((3, 200))
    t = np.array([0.5, 8.0, 20.0])
    y = pp.project(X, pp.sets.CappedSimplex(200, t, 0.5)).y
    np.testing.assert_allclose(y.sum(axis=1), t, rtol=0, atol=1e-12 * (1 + t.max()))
    assert seen
    for C, total, upper, lower in seen:
        f = np.clip(C - np.where(np.isfinite(lower), lower, -np.inf), 0.0, upper).sum(axis=1, keepdims=True)
        assert np.all(f >= total * (1 - 1e-12)), (f, total)


# ------------------------------------------------------------------ float32 thresholds
@pytest.mark.parametrize(("n", "t", "u", "seeds"), [
    (1000, 19.5, 0.02, (35, 0, 33)),  # float32 sums had been 5.8e-3 off, entries 2.9e-3 (15 % of the cap)
    (3000, 25.0, 0.01, (0, 1, 2)),
    (300, 5.0, 0.05, (3, 4)),
    (100, 2.0, 0.5, (5, 6)),
    (1000, 600.0, 0.7, (7,)),
    (1000, 40.0, float("inf"), (8,)),
])
def test_float32_thresholds_meet_the_float32_tolerance(n, t, u, seeds):
    """``θ`` was taken from a wrong linear piece: ``f`` summed ``u`` once per capped entry (rounding n eps t)
    and the stop test allowed that much, wider than the pieces near the root. The float32 answer must be
    within ``8 √n eps (1 + max|x| + t)`` of the float64 one (float32 inputs are exact in float64), in
    every namespace; the sum is reported SOLVED only when it holds."""
    S = pp.sets.CappedSimplex(n, t, u) if u != float("inf") else pp.sets.Simplex(n, t)
    X = np.stack([np.random.default_rng(s).standard_normal(n) for s in seeds]).astype(np.float32)
    ref = pp.project(X.astype(np.float64), S).y
    tol = 8.0 * np.sqrt(n) * F32 * (1.0 + np.abs(X).max(axis=1) + t)
    inputs = [("numpy", X)]
    torch = pytest.importorskip("torch")
    inputs.append(("torch", torch.tensor(X)))
    try:
        import array_api_strict as xps

        inputs.append(("array_api_strict", xps.asarray(X)))
    except ImportError:
        pass
    for name, x in inputs:
        res = pp.project(x, S)
        y = np.asarray(res.y).astype(np.float64)
        assert all(s is pp.Status.SOLVED for s in res.status)
        assert np.all(np.abs(y - ref).max(axis=1) <= tol), (name, np.abs(y - ref).max(axis=1) / tol)
        assert np.all(np.abs(y.sum(axis=1) - t) <= tol), (name, np.abs(y.sum(axis=1) - t) / tol)


# ------------------------------------------------------------------ VJP at fallback samples
def test_matrix_cotangents_at_fallback_samples(monkeypatch, rng):
    """``S.vjp(res, G)`` with G of shape (b, k, k) raised a bare ValueError (in the generic VJP) when some
    sample had gone to the generic path; (b, k²) worked. Both give the same J g on every path."""
    import polyproj.sets.birkhoff as bk

    inner = bk.finish

    def refuse_first(xp, S, face, rounding):  # sample 0 unverified: it takes the generic path
        out = inner(xp, S, face, rounding)
        first = np.arange(out.accepted.shape[0]) == 0
        return replace(out, accepted=out.accepted & ~first)

    X = rng.standard_normal((3, 4, 4))
    G = rng.standard_normal((3, 4, 4))
    for S in (pp.sets.Birkhoff(4), pp.sets.PartialMatching(4, 4, 2.5)):
        plain = S.vjp(pp.project(X, S), G.reshape(3, 16))
        with monkeypatch.context() as m:
            m.setattr(bk, "finish", refuse_first)
            res = pp.project(X, S)
        assert list(np.asarray(res.face.fallback_idx)) == [0]
        flat, square = S.vjp(res, G.reshape(3, 16)), S.vjp(res, G)
        assert flat.shape == square.shape == (3, 16)
        np.testing.assert_array_equal(flat, square)
        # the same face either way (the generic path's polish is exact): the same J g to rounding
        np.testing.assert_allclose(square, plain, rtol=0, atol=1e-9 * (1 + np.abs(G).max()))
    P = pp.sets.Polyhedral(pp.sets.Simplex(6).as_polyhedron())
    r = pp.project(rng.standard_normal((2, 6)), P)
    g = rng.standard_normal((2, 6))
    np.testing.assert_array_equal(P.vjp(r, g.reshape(2, 2, 3)), P.vjp(r, g))


# ------------------------------------------------------------------ degenerate faces of partial matchings
@pytest.mark.parametrize("k", [8, 20, 40])
@pytest.mark.parametrize("noise", [1e-12, 1e-9])
def test_near_permutations_are_projected_on_the_structured_path(k, noise, rng):
    """At ``P + δN`` every line sum is 1 ± δ and every multiplier is of order δ, below the KKT test's
    tolerance: the face's rounds must find the exactly feasible face (rows off it were held only to
    ``tol``, then made exact by the final correction, which turned support entries negative; and 6 rounds
    were too few). All eight went to the generic path (12 s at k = 60)."""
    for mm in (None, float(k)):
        S = pp.sets.PartialMatching(k, k, mm)
        P = S.as_polyhedron()
        X = np.stack([np.eye(k)[rng.permutation(k)] + noise * rng.standard_normal((k, k)) for _ in range(3)])
        with warnings.catch_warnings():
            warnings.simplefilter("error", pp.PolyprojWarning)
            res = pp.project(X, S)
        assert np.asarray(res.face.fallback_idx).size == 0
        assert res.polished.all() and all(s is pp.Status.SOLVED for s in res.status)
        scale = 1.0 + np.abs(X).max(axis=(1, 2))
        for i in range(3):  # the set's KKT test: primal at rounding, the rest at tol = 1e-9 of the scale
            r = kkt_residuals(P, X[i].ravel(), np.asarray(res.y[i]).ravel(), np.asarray(res.multipliers[i]))
            assert r["primal"] <= 4 * (2 * k) * np.finfo(float).eps * scale[i], r
            assert r["dual_feasibility"] == 0.0 and r["complementarity"] <= 1e-9 * scale[i] ** 2, r
            assert r["stationarity"] <= 2e-9 * scale[i], r


def test_a_face_that_cannot_change_is_not_solved_again(monkeypatch):
    """A failed face whose KKT test names nothing to change (here its equations are inconsistent: the rows
    held fix ΣX below the total α it also holds) would be solved again to the same point for every
    remaining round (12 here, ``r + c`` for the last try); it goes to the generic path at once."""
    import polyproj.sets.bipartite as bp

    x = np.array([[2150.0, 4640.75, 3460.5, 3267.75, 7445.75, -11191.25, 163.0],
                  [-9155.75, 1833.0, -8773.0, -7103.5, -361.5, 10558.5, 4421.5],
                  [2318.25, 10613.25, -6986.75, -15581.25, -3078.0, -1985.75, 9353.5],
                  [16132.25, -9865.25, 18668.0, 11826.75, 6387.25, 2861.5, 18285.75],
                  [707.25, -3446.25, 1146.5, -10157.5, 3642.25, -718.0, 2582.5]])
    calls = []
    inner = bp._face_solve
    monkeypatch.setattr(bp, "_face_solve", lambda *a, **k: calls.append(1) or inner(*a, **k))
    S = pp.sets.PartialMatching(5, 7, 2.5)
    res = pp.project(x, S)
    assert len(calls) <= 2
    assert res.polished and res.status is pp.Status.SOLVED
    assert S.as_polyhedron().violation(res.y.ravel()) <= 1e-12 * np.abs(x).max()


def test_a_total_at_the_rounding_of_n_times_the_cap_ends_at_once():
    """``total`` may exceed ``n·u`` by its rounding (``CappedSimplex`` admits it): every entry is at the cap,
    on the flat piece where ``f = n u < t``; the stop test, now at the rounding of ``f`` alone, must not
    send such a row through every step to the sort."""
    from polyproj.sets.threshold import threshold

    n, u = 10, 0.1
    t = n * u * (1 + 30 * np.finfo(float).eps)
    X = np.random.default_rng(0).standard_normal((4, n))
    th = threshold(X, np.full((4, 1), t), u)
    assert th.iterations == 1
    np.testing.assert_array_equal(np.clip(X - th.theta, 0.0, u), u)
    assert np.all(pp.project(X, pp.sets.CappedSimplex(n, t, u)).y == u)


def test_capped_simplex_far_rows_are_shifted_by_an_entry():
    """At |x| ~ 1e16 the capped simplex's first pass fell back to the sorted breakpoints, whose ``x − u`` round to
    ``x``; the far-row shift took that pass's wrong θ (2.5e15 for a root near 1e16) and the answers came out
    SOLVED with sums 2 and 0 for totals 1.5. The shift is the row's largest entry (exact differences)."""
    cases = [(np.array([1e16, 1e16, 0.0]), pp.sets.CappedSimplex(3, total=1.5, upper=1.0), [0.75, 0.75, 0.0]),
             (np.array([1e16, 1e16, 0.0, 1e16]), pp.sets.CappedSimplex(4, total=1.5, upper=1.0), [0.5, 0.5, 0.0, 0.5]),
             (np.array([1e17, 3.0, 0.0]), pp.sets.Simplex(3), [1.0, 0.0, 0.0])]
    for x, S, y in cases:
        r = pp.project(x, S)
        assert r.status is pp.Status.SOLVED
        np.testing.assert_allclose(r.y, y, atol=1e-15)
        try:
            import torch
        except ImportError:  # the floors' environment has no torch
            continue
        np.testing.assert_allclose(pp.project(torch.tensor(x[None]), S).y.numpy()[0], y, atol=1e-15)
    rng = np.random.default_rng(3)
    for e in (15, 16, 17, 19):  # ties at 10^e: every sum to its total
        X = np.round(rng.uniform(0, 3, (50, 6))) * 10.0**e
        r = pp.project(X, pp.sets.CappedSimplex(6, total=1.47, upper=0.9))
        np.testing.assert_allclose(r.y.sum(axis=1), 1.47, rtol=1e-14)
        assert r.y.min() >= 0.0 and r.y.max() <= 0.9


def test_a_point_whose_arithmetic_overflows_is_not_reported_solved():
    """``(1.7e308, −1.7e308, 1e308)`` on a capped simplex: x − θ overflows and the point came back NaN, SOLVED and
    verified; it is NUMERICAL_ERROR now."""
    r = pp.project(np.array([[1.7e308, -1.7e308, 1e308], [0.3, 0.2, 0.1]]), pp.sets.CappedSimplex(3, 1.5, 1.0))
    if not np.all(np.isfinite(r.y[0])):
        assert r.status[0] is pp.Status.NUMERICAL_ERROR and not r.polished[0]
    assert r.status[1] is pp.Status.SOLVED


def test_sorted_thresholds_of_the_capped_simplex_are_exact_and_linear_in_memory():
    """The capped branch of the sorted threshold evaluated f at its 2n breakpoints directly, a (b, 2n, n) array
    (2.5 GB, 10 s at n = 9000 on integer-valued points, which reach it); by cumulative sums now."""
    from polyproj.sets.threshold import sorted_threshold

    rng = np.random.default_rng(0)
    for _ in range(200):
        n, u = int(rng.integers(1, 60)), float(rng.uniform(0.01, 3.0))
        X = np.round(rng.normal(0.0, 1.5, (3, n)), int(rng.integers(0, 3)))
        t = rng.uniform(0.0, n * u, (3, 1))
        th = sorted_threshold(X, t, u)
        assert np.all(np.abs(np.clip(X - th, 0.0, u).sum(axis=1, keepdims=True) - t) <= 1e-13 * (1 + t))
    X = np.round(rng.normal(0.0, 1.45, (2, 20000)))
    th = sorted_threshold(X, np.array([[147.2], [3.0]]), 0.0774)
    np.testing.assert_allclose(np.clip(X - th, 0.0, 0.0774).sum(axis=1), [147.2, 3.0], rtol=1e-13)


def test_vjp_refuses_a_flat_cotangent_for_a_batch():
    """A 1-D G with as many entries as a batched result's y passed the check and failed in NumPy's broadcasting
    (a bare ValueError)."""
    X = np.array([[0.3, 0.1, 0.5, 0.2], [1.0, 0.0, 0.2, 0.1]])
    for S in (pp.sets.Simplex(4), pp.sets.Box(np.zeros(4), np.ones(4))):
        r = pp.project(X, S)
        with pytest.raises(pp.ProblemError, match="one entry per entry"):
            S.vjp(r, np.arange(8.0))
        assert S.vjp(r, np.arange(8.0).reshape(2, 4)).shape == (2, 4)
    one = pp.project(X[0], pp.sets.Simplex(4))
    assert np.shape(pp.sets.Simplex(4).vjp(one, np.arange(4.0))) == (4,)


def test_a_recognised_polyhedron_reports_its_own_violation():
    """Recognition takes right-hand sides within 1e-12 of the set's (a row sum <= 1 − 9e-13 for <= 1); the result
    reported the inner set's violation (8.9e-16) instead of the polyhedron's (9e-13)."""
    r, c = 3, 3
    A = np.vstack([np.kron(np.eye(r), np.ones((1, c))), np.kron(np.ones((1, r)), np.eye(c))])
    a = np.ones(r + c)
    a[0] -= 9e-13
    P = pp.Polyhedron(A=A, a=a, lb=np.zeros(r * c))
    x = np.random.default_rng(0).uniform(0.0, 1.0, r * c) + 0.5
    res = pp.project(x, P)
    assert res.max_violation == pytest.approx(max(0.0, float(np.max(A @ res.y - a))), rel=1e-6, abs=1e-18)


@pytest.mark.parametrize("kind", ["matching", "birkhoff"])
@pytest.mark.parametrize("big", [1e8, 1e10])
def test_one_far_entry_leaves_the_rest_of_a_matrix_set_exact(kind, big):
    """One entry at 1e8: the answer is 1 there, 0 on the rest of its row and column, and the projection of the
    rest. Newton's residual was judged at C's size (stopping at its start), the face's dual tests too (0.1 at
    1e8), and the inequality start X = C₊ sent every row's multiplier to ~1e5-1e8: SOLVED answers 0.2 off on
    16-31 of 40 partial matchings and 3-14 of 40 Birkhoff matrices (a probe, checked in exact arithmetic)."""
    make = (lambda k: pp.sets.PartialMatching(k, k)) if kind == "matching" else pp.sets.Birkhoff
    for k in (4, 6):
        for seed in range(8):
            C = np.random.default_rng(seed).standard_normal((k, k))
            C[0, 0] = big
            ref = np.zeros((k, k))
            ref[0, 0] = 1.0
            ref[1:, 1:] = pp.project(C[1:, 1:], make(k - 1)).y
            res = pp.project(C, make(k))
            assert res.status is pp.Status.SOLVED
            np.testing.assert_allclose(res.y, ref, atol=1e-9, err_msg=f"{kind} k={k} seed={seed}")



def test_a_per_sample_total_is_checked_at_every_projection():
    """The caller's total array changed after construction (or a learned total stepped past n·upper) gave
    points outside the set with status SOLVED (a probe)."""
    t = np.array([1.0, 2.0])
    S = pp.sets.Simplex(3, t)
    t[0] = -5.0
    with pytest.raises(pp.ProblemError, match="every total must be"):
        pp.project(np.zeros((2, 3)), S)
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    total = torch.tensor([1.0, 10.8], dtype=torch.float64, requires_grad=True)  # n·upper = 1.5
    with pytest.raises(pp.ProblemError, match="every total must be"):
        project(torch.zeros(2, 3, dtype=torch.float64), pp.sets.CappedSimplex(3, total.detach() * 0 + 1.0, 0.5)
                .with_parameters(total=total))


@pytest.mark.parametrize("bad", [np.array([1 + 1j, 2.0]), np.array([True, False])])
def test_complex_and_bool_totals_are_refused(bad):
    with pytest.raises(pp.ProblemError, match="real numbers"):
        pp.sets.Simplex(3, bad)


def test_the_total_gradient_at_a_kink_is_a_clarke_element():
    """At total = k·upper no coordinate is free and d(Σy)/dt is 1 on both sides; 0 was reported (a learned total
    started there never moved). Now the mean of the one-sided derivatives."""
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    x = torch.tensor([[3.0, 0.1, 2.0, -0.3]], dtype=torch.float64)
    for t0, want in ((2.0, [0.0, 0.5, 0.5, 0.0]), (4.0, [0.0, 0.0, 0.0, 1.0]), (0.0, [1.0, 0.0, 0.0, 0.0])):
        total = torch.tensor([t0], dtype=torch.float64, requires_grad=True)
        S = pp.sets.CappedSimplex(4, total.detach(), 1.0).with_parameters(total=total)
        V = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
        (project(x, S) * V).sum().backward()
        assert abs(float(total.grad[0]) - float(V[0] @ torch.tensor(want, dtype=torch.float64))) <= 1e-12, t0
        # one-sided differences bracket it; Σy = t makes every element sum to 1
        h = 1e-6
        sides = []
        for s in (h, -h):
            if 0.0 <= t0 + s <= 4.0:
                yp = pp.project(x.numpy(), pp.sets.CappedSimplex(4, np.array([t0 + s]), 1.0)).y
                y0 = pp.project(x.numpy(), pp.sets.CappedSimplex(4, np.array([t0]), 1.0)).y
                sides.append((yp - y0)[0] / s)
        np.testing.assert_allclose(np.mean(sides, axis=0), want, atol=1e-9)


def test_the_full_capped_simplex_is_its_one_point_with_every_cap_active():
    """total = n·upper: y missed u by rounding and a cap row was reported inactive (306 of 2,000 random rows)."""
    rng = np.random.default_rng(5)
    for u in (0.6, 0.725714634548927):
        for _ in range(50):
            x = rng.normal(size=5) * rng.choice([1.0, 1e3])
            r = pp.project(x, pp.sets.CappedSimplex(5, 5 * u, u))
            np.testing.assert_array_equal(r.y, np.full(5, u))
            assert r.active[5:].all() and not r.active[:5].any() and r.degenerate.dependent


def test_a_total_just_below_n_upper_is_not_the_full_point():
    """The full point's band was n times too wide: at n = 1e5 a total 6.7e-6 below n·u was set to u·1 (a review)."""
    n = 100_000
    t = n - 6.66e-6
    x = np.random.default_rng(0).normal(size=n)
    r = pp.project(x, pp.sets.CappedSimplex(n, t, 1.0))
    assert abs(r.y.sum() - t) <= 1e-9 and r.max_violation <= 1e-9
    assert int(r.active[n:].sum()) == n - 1


def test_a_per_sample_total_beyond_float32_is_solved_in_float64():
    X = np.array([[0.5, -1.0, 2.0]], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = pp.sets.CappedSimplex(3, np.array([1e39]), 1e39).project(X).y
        np.testing.assert_allclose(y, np.full((1, 3), 1e39 / 3), rtol=1e-6)
        np.testing.assert_array_equal(pp.sets.CappedSimplex(3, np.array([1.0]), 1e39).project(X).y, [[0.0, 0.0, 1.0]])


def test_an_implied_max_matches_is_not_solved_and_gives_the_same_answers():
    """max_matches >= min(rows, cols) is implied; solved as a row it made faces dependent: 15x slower, and
    SOLVED_INACCURATE / NUMERICAL_ERROR statuses at answers equal to those without it (a probe)."""
    rng = np.random.default_rng(2)
    X = 1e4 * rng.normal(size=(60, 5, 7))
    a = pp.project(X, pp.sets.PartialMatching(5, 7))
    for alpha in (5.0, 12.5):
        b = pp.project(X, pp.sets.PartialMatching(5, 7, max_matches=alpha))
        assert all(s is pp.Status.SOLVED for s in b.status)
        # both exact to rounding (not bitwise: a point's face can be solved by another route, -6.8e-26 against 0
        # seen on one machine)
        np.testing.assert_allclose(b.y, a.y, rtol=0, atol=1e-13 * np.abs(X).max())
        assert b.active.shape == (60, 5 + 7 + 1 + 35) and b.multipliers.shape == (60, 5 + 7 + 1 + 35)
        full = np.abs(a.y.reshape(60, -1).sum(axis=1) - alpha) <= 1e-12 * alpha
        assert not (b.active[:, 12] & ~full).any()  # active only where the sum reaches α (weakly: either way there)
        P = pp.sets.PartialMatching(5, 7, max_matches=alpha).as_polyhedron()
        for i in range(60):  # multipliers in the polyhedron's numbering, the total's included
            r = kkt_residuals(P, X[i].ravel(), b.y[i].ravel(), b.multipliers[i])
            assert max(r.values()) <= 1e-10 * (1 + np.abs(X[i]).max()) ** 2, (alpha, i, r)


@pytest.mark.parametrize("make", [lambda: (pp.sets.Simplex(3), (0, 3)),
                                  lambda: (pp.sets.CappedSimplex(3, 1.0, 0.5), (0, 3)),
                                  lambda: (pp.sets.Birkhoff(3), (0, 3, 3)),
                                  lambda: (pp.sets.PartialMatching(2, 3), (0, 2, 3))])
def test_vjp_of_an_empty_batch_is_empty(make):
    S, shape = make()
    res = pp.project(np.zeros(shape), S)
    assert S.vjp(res, np.zeros(shape)).shape == shape


def test_half_precision_points_onto_per_sample_totals_and_totals_beyond_the_dtype():
    """float16 / bfloat16 points onto a set with per-sample totals failed (their violation went through
    as_polyhedron, which such a set has not); a total beyond float32's range raised a raw OverflowError; an
    answer beyond float16's range came back as inf (a probe)."""
    S = pp.sets.Simplex(3, np.array([1.0, 2.0]))
    y = pp.project(np.ones((2, 3), np.float16), S).y
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype(float).sum(axis=1), [1.0, 2.0], rtol=2e-3)
    r = pp.project(np.ones(3, np.float32), pp.sets.CappedSimplex(3, 1e39, 1e39))
    assert r.y.dtype == np.float32 and np.all(np.isfinite(r.y))
    np.testing.assert_allclose(r.y, np.full(3, 1e39 / 3), rtol=1e-6)
    with pytest.raises(pp.ProblemError, match="beyond the range of float16"):
        pp.project(np.ones(3, np.float16), pp.sets.Simplex(3, 1e20))
    torch = pytest.importorskip("torch")
    yt = pp.project(torch.ones((2, 3), dtype=torch.bfloat16), S).y
    assert yt.dtype == torch.bfloat16
