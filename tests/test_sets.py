"""Structured sets: Birkhoff, capped simplex, partial matching, per-sample simplex totals, detection, degeneracy.

Every structured projection is compared with the generic QP projection of its ``as_polyhedron()`` (ProxSuite,
polished: exact to rounding) on random and degenerate inputs, its KKT conditions are checked from scratch, the
layer is gradchecked, and float32 results are feasible to float32 rounding. The property suite runs on these
sets through the ``PROJECTORS`` table (tests/test_projectors.py).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import polyproj as pp
from polyproj.sets.detect import recognise
from tests.helpers import kkt_residuals

SETS = {
    "birkhoff-1": lambda: pp.sets.Birkhoff(1),  # the single point {1}: empty dual systems
    "birkhoff-2": lambda: pp.sets.Birkhoff(2),
    "birkhoff-3": lambda: pp.sets.Birkhoff(3),
    "birkhoff-4": lambda: pp.sets.Birkhoff(4),
    "birkhoff-8": lambda: pp.sets.Birkhoff(8),
    "capped-6": lambda: pp.sets.CappedSimplex(6, total=2.0, upper=0.5),
    "capped-7-tight": lambda: pp.sets.CappedSimplex(7, total=6.3, upper=1.0),
    "simplex-5": lambda: pp.sets.Simplex(5, total=2.5),
    "matching-3x4": lambda: pp.sets.PartialMatching(3, 4, max_matches=2.0),
    "matching-4x4-free": lambda: pp.sets.PartialMatching(4, 4),
    "matching-3x3-tight": lambda: pp.sets.PartialMatching(3, 3, max_matches=0.5),
    "matching-1x3": lambda: pp.sets.PartialMatching(1, 3),
    "simplex-1": lambda: pp.sets.Simplex(1, total=2.0),
    "capped-1": lambda: pp.sets.CappedSimplex(1, total=0.5, upper=1.0),
}


MATRIX_SETS = [k for k in sorted(SETS) if k.startswith(("birkhoff", "matching"))]


def _inputs(S, rng, count: int = 24) -> np.ndarray:
    """Random points at three scales, ties, points on the set (projections), exact bound values."""
    n = S.n
    X = [s * rng.normal(size=(count, n)) + 0.2 for s in (0.1, 1.0, 5.0)]
    X.append(np.round(2 * rng.normal(size=(count, n))) / 2)  # ties
    X.append(np.zeros((1, n)))
    X.append(np.full((1, n), 0.7))  # all equal
    Y = np.asarray(S.project(X[1]).y).reshape(count, n)
    X.append(Y)  # on the set: entries exactly at the bounds, rows exactly at their sums
    X.append(Y + 0.3 * (Y == 0))  # zero entries lifted to exact ties with others
    return np.vstack(X)


def _generic(P, X):
    return pp.project(X, P, backend="proxsuite", eps_abs=1e-10, structured=False)


@pytest.mark.parametrize("name", sorted(SETS))
def test_equals_the_generic_qp_projection_and_satisfies_kkt(name, rng):
    S = SETS[name]()
    P = S.as_polyhedron()
    X = _inputs(S, rng)
    res = S.project(X)
    Y = np.asarray(res.y).reshape(X.shape)
    ref = _generic(P, X)
    assert ref.polished.all()
    scale = 1.0 + np.abs(X).max(axis=1)
    np.testing.assert_array_less(np.abs(Y - ref.y).max(axis=1) / scale, 1e-10)
    assert res.polished.all() and all(s is pp.Status.SOLVED for s in res.status)
    for i in range(X.shape[0]):  # KKT from scratch, in the Polyhedron's numbering
        r = kkt_residuals(P, X[i], Y[i], np.asarray(res.multipliers[i]))
        assert max(r.values()) <= 1e-10 * scale[i] ** 2, (name, i, r)
        slack = P.ineq_slack(Y[i])[0]
        assert np.all(np.abs(slack[res.active[i]]) <= 1e-12 * scale[i]), "an active row off its bound"
    assert res.max_violation <= 1e-12 * scale.max()


@pytest.mark.parametrize("name", MATRIX_SETS)
def test_matrix_sets_factored_entrywise_equal_the_per_matrix_factors(name, rng, monkeypatch):
    """Both factorisations of the small systems: the same projection and backward, KKT multipliers.

    The multipliers agree where they are unique (not ``dependent``: there they are one choice among many,
    which rounding moves).
    """
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project
    from polyproj.linalg import SMALL

    S = SETS[name]()
    P = S.as_polyhedron()
    X = _inputs(S, rng)
    V = rng.normal(size=X.shape)
    out = []
    for entrywise in (False, True):
        monkeypatch.setattr("polyproj.sets.bipartite.entrywise", lambda b, n, e=entrywise: e and n <= SMALL)
        res = S.project(X)
        x = torch.tensor(X, requires_grad=True)
        (project(x, S).reshape(X.shape) * torch.tensor(V)).sum().backward()
        out.append((np.asarray(res.y).reshape(X.shape), x.grad.numpy(), res))
    scale = 1.0 + np.abs(X).max(axis=1, keepdims=True)
    for a, b in zip(out[0][:2], out[1][:2], strict=True):
        np.testing.assert_array_less(np.abs(a - b) / scale, 1e-10)
    res, unique = out[1][2], ~np.asarray(out[0][2].degenerate.dependent)
    dm = np.abs(np.asarray(res.multipliers) - np.asarray(out[0][2].multipliers))[unique]
    np.testing.assert_array_less(dm / scale[unique] ** 2, 1e-10)
    for i in range(X.shape[0]):  # KKT from scratch of the entrywise results
        r = kkt_residuals(P, X[i], out[1][0][i], np.asarray(res.multipliers[i]))
        assert max(r.values()) <= 1e-10 * scale[i, 0] ** 2, (name, i, r)
    res = S.project(X.astype(np.float32))  # entrywise, float32: feasible to float32 rounding
    viol = S.as_polyhedron().violation(np.asarray(res.y, dtype=np.float64).reshape(X.shape))
    assert np.all(viol <= 8 * np.sqrt(S.n) * np.finfo(np.float32).eps * scale[:, 0]), viol.max()


@pytest.mark.parametrize("name", ["birkhoff-4", "capped-6", "matching-3x4"])
def test_float32_is_feasible_to_float32_rounding(name, rng):
    S = SETS[name]()
    X = (_inputs(S, rng)).astype(np.float32)
    res = S.project(X)
    assert res.y.dtype == np.float32
    Y64 = np.asarray(res.y, dtype=np.float64).reshape(X.shape)
    eps = np.finfo(np.float32).eps
    scale = 1.0 + np.abs(X).max(axis=1)
    viol = S.as_polyhedron().violation(Y64)
    assert np.all(viol <= 8 * np.sqrt(S.n) * eps * scale), viol.max()
    ref = S.project(X.astype(np.float64)).y.reshape(X.shape)
    assert np.abs(Y64 - ref).max() <= 1e-4 * scale.max()


def test_birkhoff_keeps_the_matrix_layout_and_any_namespace(rng):
    torch = pytest.importorskip("torch")
    xps = pytest.importorskip("array_api_strict")
    S = pp.sets.Birkhoff(5)
    X = rng.normal(size=(7, 5, 5))
    res = pp.project(X, S)
    assert res.y.shape == (7, 5, 5)
    np.testing.assert_allclose(res.y.sum(axis=1), 1.0, atol=1e-13)
    np.testing.assert_allclose(res.y.sum(axis=2), 1.0, atol=1e-13)
    assert pp.project(X[0], S).y.shape == (5, 5)
    assert pp.project(X.reshape(7, 25), S).y.shape == (7, 25)
    t = pp.project(torch.tensor(X), S)
    assert isinstance(t.y, torch.Tensor) and t.y.shape == (7, 5, 5)
    np.testing.assert_allclose(t.y.numpy(), res.y, atol=1e-13)
    s = pp.project(xps.asarray(X), S)
    np.testing.assert_allclose(np.asarray(s.y), res.y, atol=1e-13)


@pytest.mark.parametrize("k", [20, 30])
def test_birkhoff_large_k_equals_the_generic_projection(k, rng):
    S = pp.sets.Birkhoff(k)
    X = np.vstack([rng.normal(size=(4, k * k)), 10 * rng.normal(size=(2, k * k)), np.eye(k).reshape(1, -1)])
    res = S.project(X)
    ref = _generic(S.as_polyhedron(), X)
    np.testing.assert_allclose(res.y, ref.y, atol=1e-10 * (1 + np.abs(X).max()))
    assert res.polished.all()


def test_birkhoff_input_exactly_a_permutation_and_ties(rng):
    S = pp.sets.Birkhoff(4)
    perm = np.eye(4)[[2, 0, 3, 1]]
    X = np.stack([perm, 3 * perm, np.full((4, 4), 0.25), np.ones((4, 4)), perm + 0.5 * np.eye(4)])
    res = S.project(X)
    np.testing.assert_array_equal(res.y[0], perm)  # already doubly stochastic: itself, exactly
    np.testing.assert_allclose(res.y[1], perm, atol=1e-15)
    np.testing.assert_allclose(res.y[2:4], 0.25, atol=1e-15)
    np.testing.assert_allclose(res.y, _generic(S.as_polyhedron(), X.reshape(5, 16)).y.reshape(5, 4, 4), atol=1e-12)
    # a permutation's support splits into 4 blocks: dependent rows, reported
    assert res.degenerate.dependent[:2].all() and not res.degenerate.dependent[2:4].any()


# three random 4 × 4 inputs on which the face rounds from the first dual point cycle (found among 1e5)
_CYCLING = np.array([
    [[1.3924033682590802, 0.8611860607305728, -1.7559580928544134, 0.3047392874026495],
     [-0.4074480995847734, -1.5521145379458876, 2.2781348685921894, -0.28373697067579434],
     [-2.0519324201348628, -1.4005659456275825, 2.593805414429489, -1.061577880642908],
     [0.8872231737165595, -0.2903276122928272, -2.1029692596725056, 0.8500623290682112]],
    [[-0.338213935303003, 0.14319637142455255, -0.23094854887615632, 0.6104356968496495],
     [-1.1775116387172027, -0.6925279738028614, 0.9487984629152091, 0.4875884955698444],
     [-1.3003441822623685, -0.3059462649727011, 0.8102330047545031, 0.3013898156782595],
     [2.760655436115483, -1.7598648889124004, -1.1276589952240288, 2.3707312537979264]],
    [[0.43958705499171713, -0.99277540956358, -0.2727461688273438, 0.7826503652784716],
     [0.17342235432610495, -0.7161592826859955, 1.124511622480394, -2.9589801765472705],
     [1.468044057566083, 0.8723695221731906, -0.2262911700448109, -1.787985328863534],
     [0.9929871298205949, -0.31914363571014254, 0.422133225581798, 1.0867235833096134]]])


def test_faces_that_fail_their_rounds_take_the_remaining_newton_steps(rng):
    from array_api_compat import array_namespace

    from polyproj.sets.bipartite import Sums, polish, start

    xp = array_namespace(_CYCLING)
    scale = 1.0 + np.abs(_CYCLING).reshape(3, -1).max(axis=1, keepdims=True)
    first = polish(_CYCLING, Sums(4, 4, True), start(xp, _CYCLING, Sums(4, 4, True)), scale, 1e-9, 3.6e-15)
    assert not first.accepted.any()  # the rounds alone do not end on these

    class FaceFirst(pp.sets.Birkhoff):  # the face straight from the first dual point
        def _first_steps(self):
            return 0

    X = np.vstack([_CYCLING, rng.normal(size=(5, 4, 4))])
    res = FaceFirst(4).project(X)
    assert res.face.fallback is None  # solved by the second Newton stage, not the generic path
    np.testing.assert_allclose(res.y, _generic(pp.sets.Birkhoff(4).as_polyhedron(), X.reshape(8, 16)).y.reshape(
        8, 4, 4), atol=1e-12)
    np.testing.assert_allclose(res.y, pp.sets.Birkhoff(4).project(X).y, atol=1e-14)


def test_unverifiable_faces_fall_back_to_the_generic_path(rng):
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    S = pp.sets.Birkhoff(3, tol=1e-300)  # no face passes this KKT test: every sample goes to the generic path
    X = rng.normal(size=(6, 9))
    res = S.project(X)
    np.testing.assert_allclose(res.y, pp.sets.Birkhoff(3).project(X).y, atol=1e-12)
    assert res.polished.all()
    x = torch.tensor(X, requires_grad=True)
    V = torch.tensor(rng.normal(size=X.shape))
    (project(x, S) * V).sum().backward()
    J = pp.hs_jacobian(S.as_polyhedron(), res.active)
    np.testing.assert_allclose(x.grad.numpy(), np.einsum("bij,bj->bi", J, V.numpy()), atol=1e-10)


# ----------------------------------------------------------------------------- the backward
def _away_from_kinks(S, X, margin=1e-4):
    """Rows of X whose projection is differentiable with some room (no near-zero multiplier or entry)."""
    P = S.as_polyhedron()
    res = S.project(X)
    slack = P.ineq_slack(np.asarray(res.y).reshape(X.shape))
    lam = np.asarray(res.multipliers)[:, : P.n_ineq]
    ok = ~np.any((np.abs(slack) < margin) & ~res.active, axis=1) & ~np.any(res.active & (lam < margin), axis=1)
    return X[ok & ~res.degenerate.any]


@pytest.mark.parametrize("name", ["birkhoff-1", "birkhoff-2", "birkhoff-3", "birkhoff-4", "capped-6", "matching-3x4",
                                  "matching-4x4-free", "matching-1x3", "simplex-1"])
def test_layer_gradient_is_the_hs_jacobian_and_passes_gradcheck(name, rng):
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import ProjectionLayer, project

    S = SETS[name]()
    X = 0.5 * rng.normal(size=(40, S.n)) + 0.2
    x = torch.tensor(X, requires_grad=True)
    V = torch.tensor(rng.normal(size=X.shape))
    (project(x, S) * V).sum().backward()
    res = S.project(X)
    J = pp.hs_jacobian(S.as_polyhedron(), res.active)
    np.testing.assert_allclose(x.grad.numpy(), np.einsum("bij,bj->bi", J, V.numpy()), atol=1e-10)
    Xs = _away_from_kinks(S, X)[:6]
    assert Xs.shape[0] >= 2
    xs = torch.tensor(Xs, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: project(t, S), (xs,), eps=1e-7, atol=1e-6)
    layer = ProjectionLayer(S)
    assert torch.allclose(layer(torch.tensor(X)).reshape(X.shape), torch.tensor(np.asarray(res.y).reshape(X.shape)))


def test_birkhoff_layer_on_matrices_and_float32(rng):
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    S = pp.sets.Birkhoff(4)
    x = torch.tensor(rng.normal(size=(2, 3, 4, 4)), dtype=torch.float32, requires_grad=True)
    y = project(x, S)
    assert y.shape == (2, 3, 4, 4) and y.dtype == torch.float32
    yd = y.detach()
    assert float((yd.sum(-1) - 1).abs().max()) <= 1e-6 and float((yd.sum(-2) - 1).abs().max()) <= 1e-6
    y[..., 0, 0].sum().backward()
    g = x.grad
    # J g has zero row and column sums (it lies in the null space of the equations)
    assert float(g.sum(-1).abs().max()) <= 1e-5 and float(g.sum(-2).abs().max()) <= 1e-5


# ----------------------------------------------------------------------------- per-sample totals
def test_per_sample_totals_match_scalar_totals_and_their_gradient(rng):
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    X = rng.normal(size=(9, 6))
    t = rng.uniform(0.2, 3.0, size=9)
    t[0] = 0.0
    res = pp.project(X, pp.sets.Simplex(6, total=t))
    for i in range(9):
        np.testing.assert_allclose(res.y[i], pp.project(X[i], pp.sets.Simplex(6, total=float(t[i]))).y, atol=1e-14)
    capped = pp.project(X, pp.sets.CappedSimplex(6, total=t, upper=0.8))
    for i in range(9):
        one = pp.project(X[i], pp.sets.CappedSimplex(6, total=float(t[i]), upper=0.8)).y
        np.testing.assert_allclose(capped.y[i], one, atol=1e-14)
    # the total as a differentiable parameter (away from kinks)
    xs = torch.tensor(X[1:5], requires_grad=True)
    ts = torch.tensor(t[1:5], requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: project(a, pp.sets.Simplex(6, total=b)), (xs, ts), eps=1e-7,
                                    atol=1e-6)
    assert torch.autograd.gradcheck(lambda a, b: project(a, pp.sets.CappedSimplex(6, total=b, upper=0.8)),
                                    (xs, ts), eps=1e-7, atol=1e-6)


def test_per_sample_totals_are_validated():
    with pytest.raises(pp.ProblemError, match="total"):
        pp.sets.Simplex(3, total=np.array([1.0, -1.0]))
    with pytest.raises(pp.ProblemError, match="n·upper"):
        pp.sets.CappedSimplex(3, total=np.array([1.0, 4.0]), upper=1.0)
    with pytest.raises(pp.ProblemError, match="3 points"):
        pp.project(np.zeros((3, 3)), pp.sets.Simplex(3, total=np.ones(2)))
    with pytest.raises(pp.ProblemError, match="per-sample"):
        pp.sets.Simplex(3, total=np.ones(2)).as_polyhedron()
    assert pp.project(np.zeros((0, 3)), pp.sets.Simplex(3, total=np.ones(0))).y.shape == (0, 3)


def test_bad_parameters_are_clear_errors():
    for bad in (lambda: pp.sets.Birkhoff(0), lambda: pp.sets.Birkhoff(2.5), lambda: pp.sets.Birkhoff(3, tol=-1.0),
                lambda: pp.sets.CappedSimplex(3, total=4.0, upper=1.0), lambda: pp.sets.CappedSimplex(3, upper=0.0),
                lambda: pp.sets.PartialMatching(0, 3), lambda: pp.sets.PartialMatching(2, 3, max_matches=-1.0)):
        with pytest.raises(pp.ProblemError):
            bad()
    with pytest.raises(pp.ProblemError, match="shape"):
        pp.project(np.zeros((2, 3, 4)), pp.sets.Birkhoff(3))


# ----------------------------------------------------------------------------- structure detection
def _birkhoff_rows(k):
    return np.vstack([np.kron(np.eye(k), np.ones((1, k))), np.kron(np.ones((1, k)), np.eye(k))])


def test_dependent_equalities_are_accepted_when_consistent_and_asked_for():
    B = _birkhoff_rows(3)
    with pytest.raises(pp.ProblemError, match="full row rank"):
        pp.Polyhedron(B=B, b=np.ones(6), lb=np.zeros(9))
    P = pp.Polyhedron(B=B, b=np.ones(6), lb=np.zeros(9), allow_dependent_rows=True)
    assert P.eq_rank == 5 and P.m_eq == 6
    b = np.ones(6)
    b[0] = 2.0  # rows sum to 4, columns to 3: no matrix has both
    with pytest.raises(pp.ProblemError, match="inconsistent"):
        pp.Polyhedron(B=B, b=b, lb=np.zeros(9), allow_dependent_rows=True)


@pytest.mark.parametrize("rows", ["all", "one dropped"])
def test_a_birkhoff_polyhedron_is_recognised_up_to_order_and_scaling(rows, rng):
    k = 4
    B, b = _birkhoff_rows(k), np.ones(2 * k)
    perm = rng.permutation(2 * k)
    s = rng.uniform(0.5, 3.0, 2 * k) * np.where(rng.random(2 * k) < 0.5, -1.0, 1.0)
    B, b = B[perm] * s[:, None], b[perm] * s
    if rows == "one dropped":
        B, b = B[1:], b[1:]
    P = pp.Polyhedron(B=B, b=b, lb=np.zeros(k * k), allow_dependent_rows=rows == "all")
    assert isinstance(recognise(P).inner, pp.sets.Birkhoff)
    X = rng.normal(size=(30, k * k))
    res = pp.project(X, P)
    gen = pp.project(X, P, structured=False)
    assert "Birkhoff" in res.backend and "Birkhoff" not in gen.backend
    np.testing.assert_allclose(res.y, gen.y, atol=1e-12)
    np.testing.assert_array_equal(res.active, gen.active)
    for i in range(X.shape[0]):  # multipliers in P's own rows and scaling
        assert max(kkt_residuals(P, X[i], res.y[i], res.multipliers[i]).values()) <= 1e-12


def test_matching_simplex_box_polyhedra_are_recognised(rng):
    S = pp.sets.PartialMatching(3, 4, max_matches=2.0)
    P0 = S.as_polyhedron()
    perm = rng.permutation(P0.m_ineq)
    s = rng.uniform(0.5, 3.0, P0.m_ineq)
    P = pp.Polyhedron(A=P0.A[perm] * s[:, None], a=P0.a[perm] * s, lb=np.zeros(12))
    assert isinstance(recognise(P).inner, pp.sets.PartialMatching)
    X = rng.normal(size=(20, 12)) + 0.3
    res, gen = pp.project(X, P), pp.project(X, P, structured=False)
    np.testing.assert_allclose(res.y, gen.y, atol=1e-12)
    for i in range(X.shape[0]):
        assert max(kkt_residuals(P, X[i], res.y[i], res.multipliers[i]).values()) <= 1e-12
    for P, kind in ((pp.Polyhedron(B=-2 * np.ones((1, 5)), b=[-3.0], lb=np.zeros(5)), pp.sets.Simplex),
                    (pp.sets.CappedSimplex(5, 2.0, 0.7).as_polyhedron(), pp.sets.CappedSimplex),
                    (pp.Polyhedron(lb=np.zeros(3), ub=np.ones(3)), pp.sets.Box)):
        assert type(recognise(P).inner) is kind
        X = rng.normal(size=(10, P.n))
        np.testing.assert_allclose(pp.project(X, P).y, pp.project(X, P, structured=False).y, atol=1e-12)
    # not one of the sets: nothing recognised
    assert recognise(pp.Polyhedron(B=np.array([[1.0, 2.0, 1.0]]), b=[1.0], lb=np.zeros(3))) is None
    assert recognise(pp.Polyhedron(A=np.ones((1, 4)), a=[1.0], lb=np.zeros(4))) is None


def test_explicit_backends_and_the_option_keep_the_generic_path(rng):
    P = pp.sets.Simplex(4).as_polyhedron()
    X = rng.normal(size=(3, 4))
    assert pp.project(X, P).backend.startswith("closed form")
    assert pp.project(X, P, backend="osqp").backend == "osqp"
    assert pp.project(X, P, eps_abs=1e-10).backend != pp.project(X, P).backend
    assert not pp.project(X, P, structured=False).backend.startswith("closed form")  # the default backend


def test_the_layer_uses_the_recognised_set(rng):
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import ProjectionLayer, project

    k = 3
    P = pp.Polyhedron(B=_birkhoff_rows(k), b=np.ones(2 * k), lb=np.zeros(k * k), allow_dependent_rows=True)
    layer = ProjectionLayer(P)
    assert isinstance(layer.set.inner, pp.sets.Birkhoff) and "structured=Birkhoff" in repr(layer)
    assert ProjectionLayer(P, structured=False).set is None
    X = torch.tensor(rng.normal(size=(5, 9)), requires_grad=True)
    y = layer(X)
    y2 = project(X, P, structured=False)
    assert torch.allclose(y, y2, atol=1e-10)
    (y * y).sum().backward()
    g1 = X.grad.clone()
    X.grad = None
    (y2 * y2).sum().backward()
    assert torch.allclose(g1, X.grad, atol=1e-8)


# ----------------------------------------------------------------------------- degeneracy report
def test_degeneracy_report_on_closed_forms_and_the_generic_path():
    P = pp.sets.Simplex(4).as_polyhedron()
    X = np.array([[0.5, 0.5, 0.0, -1.0],  # x_3 = θ = 0: y_3 = 0 with zero multiplier (weakly active)
                  [0.9, 0.2, 0.1, 0.0], [1.0, 1.0, 1.0, 1.0]])
    for res in (pp.project(X, pp.sets.Simplex(4)), pp.project(X, P, structured=False)):
        np.testing.assert_array_equal(res.degenerate.weak, [True, False, False])
        np.testing.assert_array_equal(res.degenerate.dependent, [False, False, False])
        np.testing.assert_array_equal(res.degenerate.any, [True, False, False])
    one = pp.project(X[0], pp.sets.Simplex(4))
    assert one.degenerate.weak is True and one.degenerate.any is True
    box = pp.project(np.array([[1.0, 0.5], [2.0, 0.5]]), pp.sets.Box(np.zeros(2), np.array([1.0, 0.5])))
    np.testing.assert_array_equal(box.degenerate.weak, [True, True])
    fixed = pp.project(np.array([[0.3, 2.0]]), pp.sets.Box(np.zeros(2), np.array([0.0, 1.0])))
    assert fixed.degenerate.dependent[0]  # lb = ub: both rows of coordinate 0 are active


def test_the_generic_degeneracy_rank_is_computed_on_first_access_only():
    P = pp.sets.Simplex(4).as_polyhedron()
    X = np.array([[0.5, 0.5, 0.0, -1.0], [0.9, 0.2, 0.1, 0.0]])
    res = pp.project(X, P, structured=False)
    assert "not computed" in repr(res.degenerate)  # a training step that never reads it pays nothing
    np.testing.assert_array_equal(res.degenerate.dependent, [False, False])
    assert "not computed" not in repr(res.degenerate)
    one = pp.project(X[0], P, structured=False).degenerate
    assert one.dependent is False and one.weak is True and one.any is True


def test_degeneracy_of_birkhoff_agrees_with_the_generic_path(rng):
    k = 4
    P = pp.Polyhedron(B=_birkhoff_rows(k), b=np.ones(2 * k), lb=np.zeros(k * k), allow_dependent_rows=True)
    X = np.vstack([rng.normal(size=(40, k * k)), np.eye(k).reshape(1, -1)])
    s, g = pp.project(X, P), pp.project(X, P, structured=False)
    # the generic path discounts the rank deficiency B itself has (2k rows of rank 2k - 1)
    np.testing.assert_array_equal(s.degenerate.dependent, g.degenerate.dependent)
    assert s.degenerate.dependent[-1] and not s.degenerate.dependent.all()
    free = ~s.degenerate.dependent  # unique multipliers: the weakly active rows are the same
    np.testing.assert_array_equal(s.degenerate.weak[free], g.degenerate.weak[free])


@pytest.mark.parametrize("scale", [1e6, 1e17, 1e300])
def test_simplices_of_far_points_are_exact(scale, rng):
    """Entries far above the set's size: the simplex's θ ≈ max x − t lost t to rounding (x = (1e17, 3, 0)
    came out 0 everywhere, Σy = 0, status SOLVED); the capped simplex's stop test, scaled by max |x|,
    called a wrong θ done (x = (1e17, 3, 0, 0, 0), t = 2, u = 1 came out 0 too). Checked against the
    projection with the far entries replaced by their known outcome."""
    X = rng.normal(size=(6, 5))
    X[:, 0] += scale
    X[:3, 1] -= scale
    s = pp.project(X, pp.sets.Simplex(5))
    np.testing.assert_array_equal(s.y, np.eye(5)[[0] * 6])  # all mass on the far entry
    assert s.max_violation == 0.0 and np.all(s.polished)
    c = pp.project(X, pp.sets.CappedSimplex(5, 2.0, upper=1.0))
    # the far entry is capped at 1; the rest is the capped-simplex projection of the others with t = 1
    # (a far-negative entry is 0); the generic path is exact on that smaller problem
    rest = np.where(X[:, 1:] < -1e5, -1e3, X[:, 1:])
    ref = pp.project(rest, pp.Polyhedron(B=np.ones((1, 4)), b=[1.0], lb=np.zeros(4), ub=np.ones(4)))
    np.testing.assert_allclose(c.y[:, 0], 1.0)
    np.testing.assert_allclose(c.y[:, 1:], ref.y, atol=1e-12)
    assert c.max_violation <= 1e-15


@pytest.mark.parametrize("scale", [1e4, 1e9, 1e12])
@pytest.mark.parametrize("name", ["birkhoff", "matching"])
def test_matrix_sets_of_far_points_are_exact(name, scale, rng):
    """Entries far above the set's size: the equations were verified at the input's scale (at |C| 1e9 a
    face whose column summed to 2 passed, 'polished'), and X = (C − u − v)⊙Ω keeps C's rounding in its
    sums. Now feasible to rounding at the point's own scale and equal to the generic path (DAQP, exact
    on its working set at any |x|)."""
    S = pp.sets.Birkhoff(3) if name == "birkhoff" else pp.sets.PartialMatching(3, 4, max_matches=2)
    X = scale * rng.normal(size=(12, S.n))
    r = pp.project(X, S)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        g = pp.project(X, S.as_polyhedron(), backend="daqp")
    assert np.all(r.polished) and np.all(g.polished)
    assert r.max_violation <= 1e-14
    np.testing.assert_allclose(r.y, g.y, atol=1e-9)


def test_far_shift_is_decided_per_row_and_for_tiny_capped_sets(rng):
    """The shift is decided on each row's own total (a batch whose other total was 1e15 left
    x = (1e17, 1e17 + 16, 1e17 + 32), t = 1 at y = 0); a capped simplex of size 1e-12 at |x| 1e3 missed
    its total by 10 % and its active set in 33 of 200 points (x − θ rounded at |θ|)."""
    x = np.array([1e17, 1e17 + 16.0, 1e17 + 32.0])
    r = pp.project(np.stack([x, x]), pp.sets.Simplex(3, total=np.array([1.0, 1e15])))
    np.testing.assert_array_equal(r.y[0], [0.0, 0.0, 1.0])
    S = pp.sets.CappedSimplex(5, 1e-12, upper=3e-13)
    X = 1e3 * rng.normal(size=(200, 5))
    r = pp.project(X, S)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        g = pp.project(X, S.as_polyhedron(), backend="daqp")
    assert np.all(g.polished)
    np.testing.assert_allclose(r.y.sum(axis=1), 1e-12, rtol=1e-14)
    np.testing.assert_allclose(r.y, g.y, atol=1e-15 * 3e-13 * 1e3)
    assert np.array_equal(r.active, g.active)


def test_edges_of_the_sets_api(rng):
    """Found by a new user's trial: each was a raw exception or a refusal."""
    torch = pytest.importorskip("torch")
    # a tensor that requires a gradient (torch's out= writes refused it); pp.project does not differentiate
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    for S in (pp.sets.Simplex(5), pp.sets.CappedSimplex(5, 2.0, upper=0.6)):
        r = pp.project(x, S)
        np.testing.assert_allclose(r.y.numpy(), pp.project(x.detach().numpy(), S).y, atol=1e-15)
        assert not r.y.requires_grad
    t = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64, requires_grad=True)
    r = pp.project(x.detach(), pp.sets.Simplex(5, total=t))
    np.testing.assert_allclose(r.y.sum(dim=1).detach().numpy(), [1.0, 2.0, 3.0, 4.0])
    # float16 / bfloat16: solved in float32, returned in the input's dtype (Birkhoff raised in linalg)
    for S in (pp.sets.Birkhoff(3), pp.sets.PartialMatching(2, 3, max_matches=1.5), pp.sets.Simplex(6)):
        X = rng.normal(size=(5, S.n))
        for dt in (torch.float16, torch.bfloat16):
            r = pp.project(torch.tensor(X, dtype=dt), S)
            assert r.y.dtype == dt and r.multipliers.dtype == dt
            y = r.y.reshape(5, -1).double().numpy()
            assert np.abs(y - pp.project(X, S).y.reshape(5, -1)).max() < 1e-2
            assert r.max_violation == pytest.approx(float(S.violation(torch.tensor(y)).max()), abs=1e-6)
        assert pp.project(X.astype(np.float16), S).y.dtype == np.float16
    # complex lists are refused like complex arrays (were a raw TypeError)
    with pytest.raises(pp.ProblemError, match="real numbers"):
        pp.project([1j, 1j, 1j], pp.sets.Simplex(3))
    # a capped simplex whose total is n·upper in decimals (3 · 0.3 < 0.9 in floats) is not empty
    r = pp.project(np.array([1.0, 0.0, -1.0]), pp.sets.CappedSimplex(3, 0.9, upper=0.3))
    np.testing.assert_allclose(r.y, 0.3)
    assert r.status is pp.Status.SOLVED
    with pytest.raises(pp.ProblemError, match="total"):
        pp.sets.CappedSimplex(3, 0.91, upper=0.3)
    # a partial-matching polyhedron with a negative total is empty (was: 'max_matches must be >= 0')
    Am = np.vstack([np.kron(np.eye(2), np.ones((1, 3))), np.kron(np.ones((1, 2)), np.eye(3)), np.ones((1, 6))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        with pytest.raises(pp.InfeasibleError):
            pp.project(rng.normal(size=(3, 6)), pp.Polyhedron(A=Am, a=np.r_[np.ones(5), -1.0], lb=np.zeros(6)))
    # the HS-Jacobian product refuses V of the wrong shape or kind (3-D: raw ValueError; complex: cast)
    P = pp.sets.Simplex(3).as_polyhedron()
    res = pp.project(rng.normal(size=(2, 3)), P)
    for V, match in ((np.ones((2, 2, 3)), "shape"), (np.ones((2, 3)) * 1j, "real")):
        with pytest.raises(pp.ProblemError, match=match):
            pp.hs_vjp(P, res.active, V)


def test_single_point_in_array_api_strict():
    xps = pytest.importorskip("array_api_strict")
    for S in (pp.sets.Simplex(3), pp.sets.Box(np.zeros(3), np.ones(3)), pp.sets.Simplex(3).as_polyhedron()):
        r = pp.project(xps.asarray([0.9, 0.5, -1.0]), S)
        assert r.y.shape == (3,)
        np.testing.assert_allclose(np.asarray(r.y), pp.project(np.array([0.9, 0.5, -1.0]), S).y, atol=1e-15)


def test_vjp_refuses_a_cotangent_of_another_size():
    """One entry of G per entry of y, for every set (a base-class check): broadcasting took a (2, n) G at a
    result of one point, and a wrong width failed inside the set's arithmetic with a bare NumPy error."""
    X = np.array([[0.9, 0.5, -1.0]])
    for S in (pp.sets.Simplex(3), pp.sets.Polyhedral(pp.sets.Simplex(3).as_polyhedron())):
        r = pp.project(X, S)
        for G in (np.ones((1, 4)), np.ones((2, 3)), np.ones((3, 3))):
            with pytest.raises(pp.ProblemError, match="one entry per entry"):
                S.vjp(r, G)
        assert S.vjp(r, np.ones((1, 3))).shape == (1, 3)
    B = pp.sets.Birkhoff(2)
    rb = B.project(np.random.default_rng(0).random((3, 2, 2)))
    assert B.vjp(rb, np.ones((3, 2, 2))).shape == B.vjp(rb, np.ones((3, 4))).shape
    with pytest.raises(pp.ProblemError, match="one entry per entry"):
        B.vjp(rb, np.ones((2, 4)))


def test_set_tolerances_take_numpy_scalars():
    assert pp.sets.Birkhoff(3, tol=np.float32(1e-6)) is not None
    assert pp.sets.Polyhedral(pp.sets.Simplex(3).as_polyhedron(), tol=np.float64(1e-9)).options.tol == 1e-9
    for bad in (True, -1.0, float("nan"), "x"):
        with pytest.raises(pp.ProblemError, match="tol must be a positive"):
            pp.sets.Birkhoff(3, tol=bad)


def test_caps_far_above_the_total_and_huge_max_matches_are_exact():
    """A new user's trial: CappedSimplex with upper 1e14…1e15 (a cap no entry can reach: each is at most the
    total) stopped Newton on the wrong piece (sums up to 10 % off, reported solved); PartialMatching with
    max_matches 1e9…1e14 put rows of sum 1 − 1e-7 on the face (off by up to 0.34). Both now equal the set
    without the redundant bound."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2000, 5))
    ref = pp.project(X, pp.sets.Simplex(5)).y
    for upper in (1.0, 1e3, 1e14, 1e15):
        res = pp.project(X, pp.sets.CappedSimplex(5, total=1.0, upper=upper))
        np.testing.assert_allclose(res.y, ref, rtol=0, atol=1e-14)
    tiny = pp.project(X, pp.sets.CappedSimplex(5, total=1e-6, upper=1e9)).y
    np.testing.assert_allclose(tiny, pp.project(X, pp.sets.Simplex(5, total=1e-6)).y, rtol=0, atol=1e-15)
    x = np.array([[0.5, 0.5 - 1e-7], [-1.0, -1.0]])
    for mm in (None, 2.0, 1e9, 1e14):
        np.testing.assert_allclose(pp.project(x, pp.sets.PartialMatching(2, 2, max_matches=mm)).y,
                                   [[0.5, 0.5 - 1e-7], [0.0, 0.0]], rtol=0, atol=1e-15)
    M = 0.4 * rng.standard_normal((200, 3, 4))
    free = pp.project(M, pp.sets.PartialMatching(3, 4)).y
    for mm in (1e13, 1e14):
        np.testing.assert_allclose(pp.project(M, pp.sets.PartialMatching(3, 4, max_matches=mm)).y, free,
                                   rtol=0, atol=1e-14)


def test_vjp_of_a_single_point_result_is_that_of_its_batch_of_one():
    """``S.vjp(pp.project(x, S), G)`` for one point: Birkhoff and PartialMatching raised a bare ValueError, a
    Polyhedral set another one, Simplex and Box returned (1, n) for an (n,) G. Now J g in the point's shape,
    equal to the batch of one's; a G of y's size in another shape is a ProblemError."""
    from polyproj.sets.polyhedral import Polyhedral

    rng = np.random.default_rng(0)
    P = pp.Polyhedron(A=rng.standard_normal((4, 3)), a=np.ones(4))
    for S in (pp.sets.Simplex(3), pp.sets.Box(np.zeros(3), np.ones(3)), pp.sets.Birkhoff(2),
              pp.sets.PartialMatching(2, 3), Polyhedral(P)):
        ev = tuple(S.event_shape)
        x, G = 2 * rng.standard_normal(ev), rng.standard_normal(ev)
        one = S.vjp(pp.project(x, S), G)
        batch = S.vjp(pp.project(x[None], S), G[None])
        assert np.shape(one) == ev
        np.testing.assert_allclose(np.asarray(one).reshape(-1), np.asarray(batch).reshape(-1), rtol=0, atol=1e-14)
    S = Polyhedral(P)
    with pytest.raises(pp.ProblemError, match="one entry per entry"):
        S.vjp(pp.project(rng.standard_normal((2, 3)), S), np.ones((3, 2)))
    # G of another namespace is taken into the result's (a NumPy G at a torch result raised AttributeError)
    torch = pytest.importorskip("torch")
    simplex = pp.sets.Simplex(3)
    X = rng.standard_normal((2, 3))
    want = simplex.vjp(pp.project(X, simplex), np.ones((2, 3)))
    got = simplex.vjp(pp.project(torch.tensor(X), simplex), np.ones((2, 3)))
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-15)
    box = pp.sets.Box(np.zeros(3), np.ones(3))
    assert isinstance(box.vjp(pp.project(X, box), torch.ones(2, 3, dtype=torch.float64)), np.ndarray)


def test_birkhoff_samples_newton_leaves_at_1e12_are_solved_exactly():
    """A batch of 300 Birkhoff(6) points at |x| ~ 1e12: Newton leaves about half to the generic path, whose IPM
    reports them infeasible; HiGHS' second opinion solved 3, the polish from x 147, and one came back NaN (the
    layer returned it). Samples two backends fail now go to the exact per-point DAQP before the polish from x."""
    pytest.importorskip("daqp")
    rng = np.random.default_rng(6)
    for _ in range(14):
        rng.standard_normal((300, 6, 6))
    X = rng.standard_normal((300, 6, 6)) * 1e12
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        res = pp.project(X, pp.sets.Birkhoff(6))
    assert np.isfinite(res.y).all() and all(s is pp.Status.SOLVED for s in res.status) and res.polished.all()
    assert np.allclose(res.y.sum(axis=-1), 1.0, atol=1e-9) and np.allclose(res.y.sum(axis=-2), 1.0, atol=1e-9)
    assert res.y.min() >= -1e-12


def test_far_points_no_backend_resolves_are_not_reported_solved():
    """At |x| ~ 1e24 (eps |x| ~ 1e8 against a set of size 1) the Birkhoff projection came back as SOLVED with row
    sums off by 5.8e8 (pp.project) and the layer returned it. Now the refused point goes to the fallback
    backend first; what stays unverified is not SOLVED, and the layer returns only a point within
    UNVERIFIED_VIOLATION of the set (or raises)."""
    C = np.array([[1.0e24, -2.0e24], [3.0e24, 0.5e24]])
    for S in (pp.sets.Birkhoff(2), pp.sets.Birkhoff(2).as_polyhedron()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", pp.PolyprojWarning)
            res = pp.project(C if isinstance(S, pp.sets.Birkhoff) else C.reshape(4), S)
        assert res.polished or res.status is not pp.Status.SOLVED
        assert res.polished or res.max_violation <= 1e-6 or res.status is pp.Status.NUMERICAL_ERROR
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        try:
            Y = project(torch.tensor(C)[None], pp.sets.Birkhoff(2))
        except pp.InfeasibleError:
            return
    assert float((Y.sum(-1) - 1).abs().max()) <= 1e-5 and float((Y.sum(-2) - 1).abs().max()) <= 1e-5
    assert float(Y.min()) >= -1e-5


def test_capped_simplex_far_points_in_float32_and_caps_above_a_tiny_total():
    """float32 points at |x| ~ 1e8: the first threshold pass stopped short (θ 2.34e7 against 2.9e7) and the one
    shift inherited its piece: sums 2.8 for a total of 3 with a cap of 0.4 (now shifted until θ is near 0). A cap
    of 1000 above a total of 1e-12 made the shift rule see a set of size 1000: [0, 0, 0] (sum 0) where the
    simplex gives [1e-12, 0, 0]."""
    x = np.array([1.05311576e+08, 1.77649136e+08, -2.55329184e+08, -1.37965060e+07, 1.01371944e+08,
                  1.35214176e+08, 6.53788400e+07, 1.49711792e+08, 2.89957600e+07, 5.51267120e+07,
                  1.78737680e+07, -1.07385872e+08], dtype=np.float32)
    S = pp.sets.CappedSimplex(12, total=3.0, upper=0.4)
    r32, r64 = pp.project(x, S), pp.project(x.astype(np.float64), S)
    assert r32.y.dtype == np.float32 and abs(float(r32.y.sum()) - 3.0) <= 1e-5
    np.testing.assert_allclose(r32.y, r64.y, atol=1e-6)
    rng = np.random.default_rng(0)
    X = (rng.standard_normal((200, 12)) * 1e8).astype(np.float32)
    assert np.abs(pp.project(X, S).y.sum(axis=1) - 3.0).max() <= 1e-5
    x = np.array([100000.3, 7.0, -2.0])
    for S in (pp.sets.CappedSimplex(3, total=1e-12, upper=1000.0), pp.sets.CappedSimplex(3, total=1e-12, upper=1.0)):
        np.testing.assert_array_equal(pp.project(x, S).y, pp.project(x, pp.sets.Simplex(3, total=1e-12)).y)


def test_a_cap_above_the_total_sets_no_weak_tolerance():
    """CappedSimplex(5, 1, u) with u from 1e13 up reported points 0.03 to 0.2 from every breakpoint as weakly
    active (the tolerance grew with u, which never binds); the simplex and the generic path say they are not."""
    X = np.array([[0.3, -1.2, 0.8, 0.1, -0.4], [1.5, 0.2, -0.7, 0.05, 0.9]])
    for u in (10.0, 1e13, 1e15):
        res = pp.project(X, pp.sets.CappedSimplex(5, total=1.0, upper=u))
        assert not np.asarray(res.degenerate.weak).any()
        np.testing.assert_allclose(res.y, pp.project(X, pp.sets.Simplex(5)).y, atol=1e-15)
