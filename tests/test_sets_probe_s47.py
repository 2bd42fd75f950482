"""Structured sets: defects found by a probe (session 47).

pp.project attached to the autograd graph of a total that required grad; a partial matching with ``max_matches``
just below ``min(r, c)`` accepted an inconsistent face; a cap at or beyond 1e20 numbered its rows unlike its
``as_polyhedron()``; long double and meta inputs raised raw errors; ``check_projector``'s float32 bound ignored
the answer's size; ``S.vjp``'s dtype depended on the set.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import polyproj as pp
from polyproj.testing import check_projector
from tests.helpers import kkt_residuals


# ----------------------------------------------------------------------------- 1: parameters detached
def test_pp_project_detaches_a_total_that_requires_grad_and_the_layer_still_differentiates_it():
    """The answer, multipliers and violation were built into the graph of a per-sample total that required grad
    (a backward through them gave NaN on a far row); the layer's gradient must stay that of finite differences."""
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 6, dtype=torch.float64, generator=gen)
    x[2] *= 1e5  # a far row (the shifted path)
    g = torch.randn(3, 6, dtype=torch.float64, generator=gen)
    for make, t0 in ((lambda t: pp.sets.Simplex(6, t), [0.5, 1.3, 2.2]),
                     (lambda t: pp.sets.CappedSimplex(6, t, 0.7), [0.5, 1.3, 2.2])):
        t = torch.tensor(t0, dtype=torch.float64, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (CappedSimplex warned: a tensor that requires grad made a scalar)
            r = pp.project(x, make(t))
        ref = pp.project(x, make(t.detach()))
        for what in ("y", "multipliers", "violation"):
            assert not getattr(r, what).requires_grad, what
            torch.testing.assert_close(getattr(r, what), getattr(ref, what), rtol=0, atol=0)
        (project(x, make(t)) * g).sum().backward()
        h = 1e-5
        fd = []
        for i in range(3):
            e = torch.zeros(3, dtype=torch.float64)
            e[i] = h
            up = (pp.project(x, make(t.detach() + e)).y * g).sum()
            down = (pp.project(x, make(t.detach() - e)).y * g).sum()
            fd.append(float(up - down) / (2 * h))
        assert torch.isfinite(t.grad).all()
        np.testing.assert_allclose(t.grad.numpy(), fd, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- 2: inconsistent faces
def test_partial_matching_just_below_min_rows_cols_rejects_the_inconsistent_face():
    """Every row sum = 1 and ΣX = α < 3 together have no solution; their least-squares point (ΣX − α = 6.7e-10)
    was accepted by the generic path the structured one fell back to, SOLVED and polished."""
    alpha = 3 - 1e-9
    S = pp.sets.PartialMatching(3, 3, max_matches=alpha)
    res = pp.project(5 * np.eye(3), S)
    assert res.status is pp.Status.SOLVED and res.polished
    assert res.face.fallback_idx.shape[0] == 0  # the structured path's own face
    # the closed form: by symmetry X = s·I; the rows are slack (s < 1), the total binds: s = α/3
    np.testing.assert_allclose(res.y, alpha / 3 * np.eye(3), rtol=0, atol=1e-15)
    assert res.y.sum() - alpha <= 4e-15 and res.max_violation <= 4e-15
    P = S.as_polyhedron()
    r = kkt_residuals(P, 5 * np.eye(3).ravel(), res.y.ravel(), res.multipliers)
    assert max(r.values()) <= 1e-13, r
    G = np.random.default_rng(0).normal(size=(3, 3))  # the backward is the HS-Jacobian of the reported face
    np.testing.assert_allclose(S.vjp(res, G).ravel(), pp.hs_vjp(P, res.active, G.ravel()), atol=1e-13)


@pytest.mark.parametrize(("r", "c", "alpha", "ones"), [(3, 3, 3 - 1e-9, 3), (3, 4, 3 - 1e-8, 3),
                                                       (4, 4, 2 - 1e-9, 2)])
def test_points_near_an_inconsistent_face_satisfy_kkt(r, c, alpha, ones):
    """Near-permutation inputs whose support holds ``ones`` rows at 1, with ``α`` just below ``ones``: every
    point verified from scratch (its total's row had been missed by up to 1e-8)."""
    rng = np.random.default_rng(1)
    S = pp.sets.PartialMatching(r, c, max_matches=alpha)
    X = 5 * np.diag([1.0] * ones + [0.0] * (min(r, c) - ones))
    X = np.pad(X, ((0, r - X.shape[0]), (0, c - X.shape[1]))) + 0.01 * rng.normal(size=(20, r, c))
    res = pp.project(X, S)
    assert all(s is pp.Status.SOLVED for s in res.status)
    P = S.as_polyhedron()
    for i in range(X.shape[0]):
        k = kkt_residuals(P, X[i].ravel(), res.y[i].ravel(), res.multipliers[i])
        assert max(k.values()) <= 1e-13, (i, k)


def test_partial_matching_just_below_min_float32():
    """float32 at α = 3 − 1e-5: the structured path itself accepted ``I`` (ΣX − α = 1e-5, 84 eps)."""
    torch = pytest.importorskip("torch")
    alpha = 3 - 1e-5
    S = pp.sets.PartialMatching(3, 3, max_matches=alpha)
    eps = float(np.finfo(np.float32).eps)
    for X in (5 * np.eye(3, dtype=np.float32), 5 * torch.eye(3)):
        res = pp.project(X, S)
        y = np.asarray(res.y, dtype=np.float64)
        assert res.status is pp.Status.SOLVED and str(res.y.dtype).endswith("float32")
        assert y.sum() - alpha <= 4 * eps * alpha, y.sum() - alpha
        np.testing.assert_allclose(y, alpha / 3 * np.eye(3), atol=8 * eps * 6)


# ----------------------------------------------------------------------------- 3: caps and totals beyond 1e20
def test_a_cap_at_or_beyond_1e20_is_no_cap_and_the_numbering_is_as_polyhedron():
    S = pp.sets.CappedSimplex(3, total=1.0, upper=1e25)
    assert S.upper == float("inf") and S.row_counts() == (3, 1)
    x = np.array([0.3, 0.2, -1.0])
    res = pp.project(x, S)
    P = S.as_polyhedron()
    assert P.n_ineq == 3 and res.active.shape == (3,) and res.multipliers.shape == (4,)
    np.testing.assert_allclose(res.y, [0.55, 0.45, 0.0], atol=1e-15)  # the simplex's projection by hand
    G = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(pp.hs_vjp(P, res.active, G), S.vjp(res, G), atol=1e-15)
    assert check_projector(S, examples=4, seed=0).passed
    with pytest.raises(pp.ProblemError, match="upper"):  # the cap would bind: not the simplex
        pp.sets.CappedSimplex(3, 2.5e20, 1e20)
    with pytest.raises(pp.ProblemError, match="every total"):
        pp.project(np.zeros((2, 3)), pp.sets.CappedSimplex(3, np.array([1.0, 2e20]), 1e20))
    np.testing.assert_array_equal(pp.project(np.zeros(3), pp.sets.CappedSimplex(3, 1e20, 1e20)).y,
                                  np.full(3, 1e20 / 3))


def test_a_total_at_or_beyond_1e20_projects_but_has_no_polyhedron():
    S = pp.sets.Simplex(3, 1e25)
    np.testing.assert_allclose(pp.project(np.array([1.0, 0.0, -1.0]), S).y, 1e25 / 3 + np.array([1.0, 0.0, -1.0]),
                               rtol=1e-15)
    with pytest.raises(pp.ProblemError, match="total = 1e[+]25 has no Polyhedron form"):
        S.as_polyhedron()


# ----------------------------------------------------------------------------- 4: long double, meta
def test_long_double_points_are_solved_in_float64_as_the_generic_path_does():
    X = np.random.default_rng(0).standard_normal((2, 3, 3)) * 2  # a Birkhoff face that needs the linalg fallback
    for S, Xs in ((pp.sets.Birkhoff(3), X), (pp.sets.PartialMatching(3, 3), X), (pp.sets.Simplex(9), X.reshape(2, 9)),
                  (pp.sets.Box(np.zeros(9), np.ones(9)), X.reshape(2, 9))):
        r, r64 = pp.project(Xs.astype(np.longdouble), S), pp.project(Xs, S)
        for what in ("y", "multipliers", "violation"):
            assert getattr(r, what).dtype == np.longdouble, (S, what)
            np.testing.assert_array_equal(getattr(r, what).astype(np.float64), getattr(r64, what))
        G = np.ones(Xs.shape, np.longdouble)
        j = S.vjp(r, G)
        assert j.dtype == np.longdouble
        np.testing.assert_array_equal(j.astype(np.float64), S.vjp(r64, np.ones(Xs.shape)))
    # the rule of the generic path
    g = pp.project(X.reshape(2, 9).astype(np.longdouble), pp.sets.Birkhoff(3).as_polyhedron(), structured=False)
    assert g.y.dtype == np.longdouble


def test_a_meta_tensor_is_refused():
    torch = pytest.importorskip("torch")
    X = torch.empty(2, 9, dtype=torch.float64, device="meta")
    for S in (pp.sets.Simplex(9), pp.sets.Birkhoff(3), pp.sets.Box(np.zeros(9), np.ones(9))):
        with pytest.raises(pp.ProblemError, match="meta tensor"):
            pp.project(X, S)
    with pytest.raises(pp.ProblemError, match="meta tensor"):
        pp.project(X, pp.sets.Simplex(9).as_polyhedron(), structured=False)


# ----------------------------------------------------------------------------- 5: check_projector's float32
class _Scaled(pp.Projector):
    """A set of size ~3e5 (a capped simplex), its float32 answers ``off`` (relative) from the right ones."""

    def __init__(self, off=0.0):
        self.inner, self.off = pp.sets.CappedSimplex(3, 1e6, 1e6), off

    @property
    def n(self):
        return 3

    def project_batch(self, X):
        from dataclasses import replace

        res = self.inner.project_batch(X)
        if self.off and X.dtype == np.float32:
            res = replace(res, y=res.y * np.float32(1 + self.off))
        return res

    def vjp(self, result, G):
        return self.inner.vjp(result, G)

    def as_polyhedron(self):
        return self.inner.as_polyhedron()


def test_the_float32_check_counts_the_answers_size():
    """The correct CappedSimplex(3, 1e6, 1e6) failed (float32 spacing at y = 333333 is 0.03, the bound was 1e-4);
    an answer 1e-3 off (relative) at that size still fails."""
    from polyproj.testing.projector import _float32

    X = np.vstack([np.zeros(3), np.random.default_rng(0).normal(size=(6, 3))])
    assert _float32(pp.sets.CappedSimplex(3, 1e6, 1e6), X.copy(), 1.0) == {"points": 7}
    assert _float32(_Scaled(), X.copy(), 1.0) == {"points": 7}
    with pytest.raises(AssertionError, match="differs from the float64 one"):
        _float32(_Scaled(1e-3), X.copy(), 1.0)


# ----------------------------------------------------------------------------- 6: vjp dtype
@pytest.mark.parametrize("make", [lambda: (pp.sets.Simplex(4), (3, 4)),
                                  lambda: (pp.sets.CappedSimplex(4, 1.5, 0.5), (3, 4)),
                                  lambda: (pp.sets.Box(np.zeros(4), np.ones(4)), (3, 4)),
                                  lambda: (pp.sets.Birkhoff(2), (3, 2, 2)),
                                  lambda: (pp.sets.PartialMatching(2, 2, max_matches=1.5), (3, 2, 2))])
def test_vjp_returns_the_cotangents_dtype_as_polyhedral_does(make):
    S, shape = make()
    X = np.random.default_rng(0).standard_normal(shape)
    G = np.random.default_rng(1).standard_normal(shape)
    gen = pp.sets.Polyhedral(S.as_polyhedron())
    for xd, gd in ((np.float64, np.float32), (np.float16, np.float16), (np.float32, np.float64),
                   (np.float64, np.float16)):
        r = pp.project(X.astype(xd), S)
        j = S.vjp(r, G.astype(gd))
        rg = gen.project_batch(X.reshape(3, -1).astype(xd), record=True)
        assert j.dtype == gd == gen.vjp(rg, G.reshape(3, -1).astype(gd)).dtype, (xd, gd, j.dtype)
        ref = S.vjp(pp.project(X.astype(xd), S), G.astype(gd).astype(np.float64))
        eps = float(np.finfo(gd).eps)  # (the simplices compute in G's dtype, the others in the promoted one)
        np.testing.assert_allclose(j.astype(np.float64), ref, rtol=4 * eps, atol=4 * eps * np.abs(G).max())
    j = S.vjp(pp.project(X, S), np.ones(shape, dtype=np.int64))  # an integer G: the result's dtype
    assert j.dtype == np.float64
    torch = pytest.importorskip("torch")
    rt = pp.project(torch.tensor(X), S)
    assert S.vjp(rt, torch.tensor(G, dtype=torch.float32)).dtype == torch.float32
