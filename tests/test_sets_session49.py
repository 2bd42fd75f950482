"""Structured sets, session 49: far points of the matrix sets stay on their structured method (continuation in
the scale), float32 samples those sets cannot verify are solved in float64, a 0-d total of the simplices.
"""

from __future__ import annotations

import numpy as np
import pytest

import polyproj as pp
import polyproj.sets.birkhoff as bk

EPS = float(np.finfo(np.float64).eps)
F32 = float(np.finfo(np.float32).eps)


def _count_fallbacks(monkeypatch) -> list[int]:
    """Samples sent to the generic QP path (recorded; the structured result is kept, so a miss fails fast)."""
    calls: list[int] = []
    monkeypatch.setattr(bk.SumsProjector, "_fall_back", lambda self, X, result, idx: (calls.append(len(idx)),
                                                                                       result)[1])
    return calls


def _tied_blocks(rng, k: int, s: float, b: int) -> np.ndarray:
    """Points ``s·A + B`` (``A``: 2 × 2 blocks of ones, rows and columns permuted; ``B`` ~ 0.3 N(0, 1))."""
    A = np.kron(np.eye(k // 2), np.ones((2, 2)))
    C = np.empty((b, k, k))
    for i in range(b):
        pr, pc = rng.permutation(k), rng.permutation(k)
        C[i] = A[np.ix_(pr, pc)] * s + 0.3 * rng.standard_normal((k, k))
    return C


def _block_answer(C: np.ndarray, s: float) -> np.ndarray:
    """The projection of :func:`_tied_blocks`' points onto Birkhoff(k), in closed form (from the points themselves).

    Within a block ``[[a, 1 − a], [1 − a, a]]``, ``a = clip((B11 − B12 − B21 + B22 + 2)/4, 0, 1)``, 0 elsewhere
    (``s`` dwarfs B: ``Z < 0`` off the blocks). The differences ``C − s`` are exact in float64 (Sterbenz).
    """
    C = np.asarray(C, dtype=np.float64)
    Y = np.zeros_like(C)
    for i in range(C.shape[0]):
        on = C[i] > s / 2
        rows, cols = np.nonzero(on)
        for r in np.unique(rows):
            c = cols[rows == r]
            r2 = next(q for q in np.unique(rows) if q != r and set(cols[rows == q]) == set(c))
            if r2 < r:
                continue
            d = (C[i, r, c[0]] - s) - (C[i, r, c[1]] - s) - (C[i, r2, c[0]] - s) + (C[i, r2, c[1]] - s)
            a = min(max((d + 2.0) / 4.0, 0.0), 1.0)
            Y[i, r, c[0]], Y[i, r, c[1]], Y[i, r2, c[0]], Y[i, r2, c[1]] = a, 1.0 - a, 1.0 - a, a
    return Y


# ----------------------------------------------------------------------------- far points (defect 1)
def test_far_points_of_the_matrix_sets_stay_on_the_structured_path(monkeypatch, rng):
    """Newton's steps grow with |C| (Birkhoff(30): 45-150 at 1e8, 200-460 at 1e10): past max_iter the samples
    went to the generic QP path, seconds each (Birkhoff(20) at 1e10 and 16 × 16 matchings at 1e8: 3 of 3).
    The continuation in the scale takes them all; the answers are the generic path's (DAQP, detection off)."""
    calls = _count_fallbacks(monkeypatch)
    for S, scale in ((pp.sets.Birkhoff(20), 1e10), (pp.sets.PartialMatching(16, 16), 1e8),
                     (pp.sets.PartialMatching(10, 14), 1e12)):
        X = rng.standard_normal((3, S.n)) * scale
        res = pp.project(X, S)
        assert calls == [], (S, calls)
        assert res.polished.all() and all(s is pp.Status.SOLVED for s in res.status)
        ref = pp.project(X, S.as_polyhedron(), backend="daqp")  # a backend named: no structure detection
        assert not ref.backend.startswith("semismooth")
        r, c = S.event_shape
        tol = 4 * (r + c) * EPS * (1 + np.abs(X).max(axis=1))  # the rounding of C's arithmetic
        err = np.abs(np.asarray(res.y).reshape(3, -1) - ref.y).max(axis=1)
        assert np.all(err <= tol), (S, err / tol)
        assert res.max_violation <= 4 * (r + c) * EPS
    # a far point whose projection is not a vertex (2 × 2 blocks of ties at 1e10): exact to C's rounding (the
    # generic path's answers are vertices there, 0.49 off, reported SOLVED: the closed form is the reference)
    s = 1e10
    C = _tied_blocks(rng, 12, s, 3)
    res = pp.project(C, pp.sets.Birkhoff(12))
    assert calls == []
    Y = _block_answer(C, s)
    assert 0 < np.sum((Y > 1e-3) & (Y < 1 - 1e-3))  # fractional entries: not a vertex
    assert np.abs(res.y - Y).max() <= 16 * EPS * s


# ----------------------------------------------------------------------------- float32 (defect 2)
def test_float32_points_the_matrix_sets_cannot_verify_are_solved_in_float64(monkeypatch, rng):
    """float32 at |C| 1e6: no face passes the float32 KKT test (its rounding ~ 2 (r + c) eps₃₂ |C| > 1), and all
    went to the generic path (Birkhoff(30) at 1e4: 7 of 16, 24 s, against 0.4 s in float64). Solved in float64:
    float32 answers within float32 rounding of the closed form, the backward that of the float64 face."""
    calls = _count_fallbacks(monkeypatch)
    s, S = 1e6, pp.sets.Birkhoff(6)
    C = _tied_blocks(rng, 6, s, 3)
    C32 = C.astype(np.float32)
    Y = _block_answer(C32, s)  # the projection of the float32 points
    res = pp.project(C32, S)
    assert calls == [] and res.y.dtype == np.float32 and res.multipliers.dtype == np.float32
    assert np.abs(res.y - Y).max() <= 4 * F32
    active = Y.reshape(3, -1) == 0
    G = rng.standard_normal((3, S.n)).astype(np.float32)
    J = pp.hs_jacobian(S.as_polyhedron(), active)
    ref_jg = np.einsum("bij,bj->bi", J, G.astype(np.float64))
    jg = S.vjp(res, G)
    assert jg.dtype == np.float32
    np.testing.assert_allclose(jg, ref_jg, rtol=0, atol=8 * F32 * np.abs(ref_jg).max())
    # random points of a partial matching at 1e4 (4 of 4 to the generic path before), torch float32
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    P = pp.sets.PartialMatching(12, 12)
    X = (rng.standard_normal((3, 12, 12)) * 1e4).astype(np.float32)
    x = torch.tensor(X, requires_grad=True)
    y = project(x, P)
    assert calls == [] and y.dtype == torch.float32 and y.shape == (3, 12, 12)
    ref = pp.project(X.reshape(3, -1).astype(np.float64), P.as_polyhedron(), backend="daqp")
    assert np.abs(y.detach().numpy().reshape(3, -1) - ref.y).max() <= 4 * F32
    g = torch.tensor(rng.standard_normal((3, 12, 12)), dtype=torch.float32)
    (y * g).sum().backward()
    J = pp.hs_jacobian(P.as_polyhedron(), ref.active)
    np.testing.assert_allclose(x.grad.numpy().reshape(3, -1), np.einsum("bij,bj->bi", J, g.numpy().reshape(3, -1)),
                               rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- a 0-d total (defect 3)
@pytest.mark.parametrize("make", [lambda t: pp.sets.Simplex(5, t), lambda t: pp.sets.CappedSimplex(5, t, 0.45)])
def test_a_0d_total_is_the_one_number(make, rng):
    """``np.array(1.3)`` / ``torch.tensor(1.3)`` were refused ("must have shape (batch,), got ()")."""
    torch = pytest.importorskip("torch")
    X = rng.standard_normal((4, 5))
    for t in (np.array(1.3), torch.tensor(1.3, dtype=torch.float64), torch.tensor(1.3, dtype=torch.float32)):
        S, want = make(t), pp.project(X, make(float(t)))  # (1.3 in float32 is another number)
        assert not S.per_sample
        np.testing.assert_allclose(pp.project(X, S).y, want.y, rtol=0, atol=1e-15)
        np.testing.assert_allclose(pp.project(torch.tensor(X), S).y.numpy(), want.y, rtol=0, atol=1e-15)
        np.testing.assert_array_equal(S.as_polyhedron().b, [float(t)])
    with pytest.raises(pp.ProblemError, match="total"):
        make(np.ones((2, 2)))
    with pytest.raises(pp.ProblemError, match="total"):
        make(np.array(-1.0))


@pytest.mark.parametrize("make", [lambda t: pp.sets.Simplex(5, t), lambda t: pp.sets.CappedSimplex(5, t, 0.45)])
def test_a_0d_total_that_requires_grad_learns_the_sum_over_the_batch(make, rng):
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    x = torch.tensor(rng.standard_normal((4, 5)), requires_grad=True)
    t = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: project(a, make(b)), (x, t), eps=1e-7, atol=1e-6)
    # the reference: the same total given per point, its gradients summed
    g = torch.tensor(rng.standard_normal((4, 5)))
    (project(x, make(t)) * g).sum().backward()
    tb = t.detach().expand(4).clone().requires_grad_(True)
    (project(x, make(tb)) * g).sum().backward()
    assert t.grad.shape == () and float(tb.grad.abs().sum()) > 0
    torch.testing.assert_close(t.grad, tb.grad.sum(), rtol=0, atol=1e-12)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("k", [1, 3])
def test_a_non_finite_sample_is_not_continued_in_scale(k):
    """``project_batch`` called directly (``pp.project`` and the layer refuse NaN/inf before it): a sample holding
    inf had scale inf, counted as far, and its continuation factor 100/inf = 0 never grew to 1, an endless loop.
    Non-finite samples take no continuation; the call ends (with the error it raised before the continuation)."""
    C = np.random.default_rng(0).standard_normal((2, k * k))
    C[0, 0] = np.inf
    with pytest.raises((OverflowError, pp.PolyprojError)):
        pp.sets.Birkhoff(k).project_batch(C)
