"""The Projector interface: every set through pp.project, every namespace, the torch layer, the property suite."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from array_api_compat import array_namespace, device

import polyproj as pp
from polyproj.testing import check_projector
from tests.helpers import random_polytope

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- a user's set (docs/architecture.md)
class HalfSpace(pp.Projector):
    """{y : wᵀy <= c}."""

    def __init__(self, w, c):
        self.w, self.c = np.asarray(w, dtype=float), float(c)

    @property
    def n(self):
        return self.w.size

    def project_batch(self, X):
        xp = array_namespace(X)
        w = xp.asarray(self.w, dtype=X.dtype, device=device(X))
        excess = X @ w - self.c  # (batch,)
        step = xp.where(excess > 0, excess, xp.zeros_like(excess)) / float(self.w @ self.w)
        Y = X - step[:, None] * w[None, :]
        active = (excess >= 0)[:, None]  # on the hyperplane or beyond: the row is active
        return self.result(X, Y, active=active, multipliers=step[:, None], face=active)

    def vjp(self, result, G):
        xp = array_namespace(G)
        w = xp.asarray(self.w, dtype=G.dtype, device=device(G))
        normal = w / float(self.w @ self.w) ** 0.5
        coef = xp.sum(G * normal, axis=1, keepdims=True)
        return xp.where(result.face, G - coef * normal, G)  # J = I − n nᵀ where active

    def as_polyhedron(self):
        return pp.Polyhedron(A=self.w[None, :], a=[self.c])


def test_the_documented_example_is_this_one():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    here = Path(__file__).read_text()
    block = here[here.index("class HalfSpace"):here.index("def test_the_documented_example_is_this_one")].strip()
    assert block in doc, "docs/architecture.md must show the HalfSpace example exactly as tested here"


def _sort_reference(X, total):
    """Simplex projection by bisection on θ in Σ max(x − θ, 0) = total (independent of the sort formula)."""
    out = np.empty_like(X)
    for i, x in enumerate(X):
        lo, hi = x.min() - total - 1.0, x.max()
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if np.maximum(x - mid, 0).sum() > total else (lo, mid)
        out[i] = np.maximum(x - 0.5 * (lo + hi), 0.0)
    return out


# ----------------------------------------------------------------------------- the sets
@pytest.mark.parametrize("total", [1.0, 3.5, 0.0])
def test_simplex_matches_a_reference_and_the_qp_projection(rng, total):
    S = pp.sets.Simplex(7, total=total)
    X = np.vstack([3 * rng.normal(size=(20, 7)), np.round(rng.normal(size=(5, 7))), np.zeros((1, 7))])
    res = pp.project(X, S)
    np.testing.assert_allclose(res.y, _sort_reference(X, total), atol=1e-12)
    assert res.polished.all() and res.status == (pp.Status.SOLVED,) * X.shape[0]
    qp = pp.project(X, S.as_polyhedron(), eps_abs=1e-10)
    np.testing.assert_allclose(res.y, qp.y, atol=1e-10)
    assert res.max_violation <= 1e-12 * (1 + total)


def test_box_clips_and_reports_both_bounds_of_a_fixed_coordinate(rng):
    lb, ub = np.array([0.0, -np.inf, 1.0, -1.0]), np.array([1.0, 2.0, 1.0, np.inf])
    S = pp.sets.Box(lb, ub)
    X = 3 * rng.normal(size=(30, 4))
    res = pp.project(X, S)
    np.testing.assert_array_equal(res.y, np.clip(X, lb, ub))
    P = S.as_polyhedron()
    # compact rows: finite lb (coordinates 0, 2, 3), then finite ub (0, 1, 2); coordinate 2 has lb = ub
    assert res.active.shape == (30, P.n_ineq) and res.active[:, [1, 5]].all()
    np.testing.assert_allclose(res.y, pp.project(X, P).y, atol=1e-12)


def test_property_suite_passes_on_every_set(projector):
    report = check_projector(projector, examples=12, seed=3)
    assert report.passed, str(report)


def test_property_suite_passes_on_a_users_set():
    report = check_projector(HalfSpace([1.0, -2.0, 0.5, 1.0], 0.7), examples=12, seed=3)
    assert report.passed, str(report)


def test_property_suite_on_a_random_polyhedron_with_every_backend(rng, backend):
    P = random_polytope(rng, 5, 8, 1)
    report = check_projector(pp.sets.Polyhedral(P, backend), examples=8, seed=1)
    assert report.passed, (backend, str(report))


def test_property_suite_catches_a_wrong_vjp():
    class Wrong(HalfSpace):
        def vjp(self, result, G):
            return G  # ignores the active row

    report = check_projector(Wrong([1.0, 1.0, 0.0], 0.2), examples=8)
    assert not report.passed and report["vjp"].status == "failed"
    assert report["conservativity"].status in ("failed", "passed")  # segments may all stay inside


@pytest.mark.parametrize("band", [1e-3, 1e-6])
def test_property_suite_catches_a_set_that_leaves_points_just_outside_unprojected(band):
    """`excess > band` instead of `excess > 0`: pp.project([0.5005, 0], S) was SOLVED 5e-4 outside the set, and
    check_projector passed it (no sample came that close to the boundary)."""
    class Lazy(HalfSpace):
        def project_batch(self, X):
            xp = array_namespace(X)
            w = xp.asarray(self.w, dtype=X.dtype, device=device(X))
            excess = X @ w - self.c
            step = xp.where(excess > band, excess, xp.zeros_like(excess)) / float(self.w @ self.w)
            active = (excess >= 0)[:, None]
            return self.result(X, X - step[:, None] * w[None, :], active=active, multipliers=step[:, None],
                               face=active)

    S = Lazy([1.0, -2.0], 0.5)
    assert S.as_polyhedron().violation(pp.project(np.array([0.5 + band / 2, 0.0]), S).y) > 0  # the defect
    report = check_projector(S, examples=20, seed=0)
    assert not report.passed
    assert report["agreement"].status == "failed" or report["projection"].status == "failed", str(report)


def test_boundary_points_lie_just_outside_just_inside_and_on_the_boundary(rng):
    from polyproj.testing.projector import BOUNDARY_DISTANCES, boundary_points

    S = HalfSpace([1.0, -2.0, 0.5], 0.7)
    X = 3 * rng.normal(size=(12, 3)) + S.w  # most of them outside
    near = boundary_points(S, X, 1.0, 3)  # per base point: y, then (outside, inside) at each distance
    per = 1 + 2 * len(BOUNDARY_DISTANCES)
    assert near.shape == (3 * per, 3)
    signed = (near @ S.w - S.c) / np.linalg.norm(S.w)  # signed distance to the hyperplane
    t = np.tile(BOUNDARY_DISTANCES, 3)
    assert np.all(np.abs(signed[::per]) < 1e-12)  # the projections: on the boundary
    out = np.concatenate([np.arange(k * per + 1, (k + 1) * per, 2) for k in range(3)])
    np.testing.assert_allclose(signed[out], t, rtol=1e-6)
    assert np.all(signed[out + 1] < 0) and np.all(signed[out + 1] >= -t * (1 + 1e-9))  # inside, within t
    # a point outside along the normal projects back onto its base point
    np.testing.assert_allclose(pp.project(near[out], S).y, np.repeat(near[::per], per // 2, axis=0), atol=1e-12)


def test_property_suite_catches_a_set_that_writes_into_its_input_and_takes_a_polyhedron(rng):
    class Writes(HalfSpace):
        def project_batch(self, X):
            r = super().project_batch(X)
            X[...] = 0.0  # the caller's points
            return r

    report = check_projector(Writes([1.0, 1.0, 0.0], 0.2), examples=8)
    assert not report.passed and report["input kept"].status == "failed"
    # pp.project and the torch layer hand a third party's set a copy: the caller's points stay (they were zeroed,
    # the layer's leaf tensor too; a probe)
    X = np.full((2, 3), 3.0)
    y = pp.project(X, Writes([1.0, 1.0, 0.0], 0.2)).y
    assert np.all(X == 3.0) and np.all(np.isfinite(y))
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        from polyproj.adapters.torch import project

        x = torch.full((2, 3), 3.0, dtype=torch.float64, requires_grad=True)
        project(x, Writes([1.0, 1.0, 0.0], 0.2))
        assert bool((x == 3.0).all())
    assert check_projector(random_polytope(rng, 4, 6, 1), examples=6).passed  # the generic path of pp.project
    with pytest.raises(pp.ProblemError, match="Projector or a pp.Polyhedron"):
        check_projector("simplex")


# ----------------------------------------------------------------------------- namespaces
@pytest.mark.parametrize("backend", [None, "ipm", "admm"])
def test_project_keeps_torch_tensors(rng, backend):
    torch = pytest.importorskip("torch")
    P = random_polytope(rng, 8, 14, 1)
    X = 3 * rng.normal(size=(12, 8))
    kw = {} if backend is None else {"backend": backend}
    ref = pp.project(X, P, **kw)
    res = pp.project(torch.tensor(X), P, **kw)
    assert isinstance(res.y, torch.Tensor) and res.y.dtype == torch.float64
    assert isinstance(res.active, torch.Tensor) and isinstance(res.multipliers, torch.Tensor)
    np.testing.assert_allclose(res.y.numpy(), ref.y, atol=1e-12)
    np.testing.assert_array_equal(res.active.numpy(), ref.active)
    one = pp.project(torch.tensor(X[3]), P, **kw)
    assert one.y.shape == (8,) and one.status is pp.Status.SOLVED
    np.testing.assert_allclose(one.y.numpy(), ref.y[3], atol=1e-12)


@pytest.mark.parametrize("backend", [None, "ipm"])
def test_project_through_array_api_strict(rng, backend):
    xps = pytest.importorskip("array_api_strict")
    P = random_polytope(rng, 6, 10, 1)
    X = 3 * rng.normal(size=(9, 6))
    kw = {} if backend is None else {"backend": backend}
    ref = pp.project(X, P, **kw)
    res = pp.project(xps.asarray(X), P, **kw)
    assert type(res.y).__module__.startswith("array_api_strict")
    np.testing.assert_allclose(np.asarray(res.y), ref.y, atol=1e-12)


def test_float32_input_stays_float32(rng):
    P = random_polytope(rng, 6, 10, 1)
    X = (3 * rng.normal(size=(5, 6))).astype(np.float32)
    res = pp.project(X, P)
    assert res.y.dtype == np.float32
    assert P.violation(res.y.astype(np.float64)).max() < 1e-5
    s = pp.project(X, pp.sets.Simplex(6))
    assert s.y.dtype == np.float32 and abs(float(s.y.sum(1).max()) - 1.0) < 1e-6


# ----------------------------------------------------------------------------- the torch layer over any set
@pytest.mark.parametrize("make", [lambda: pp.sets.Simplex(5), lambda: HalfSpace([1.0, -1.0, 2.0, 0.0, 1.0], 0.3),
                                  lambda: pp.sets.Box(np.zeros(5), np.ones(5))])
def test_layer_gradient_is_the_hs_jacobian_and_passes_gradcheck(make, rng):
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import ProjectionLayer, project

    S = make()
    X = 2 * rng.normal(size=(6, 5))
    x = torch.tensor(X, requires_grad=True)
    V = torch.tensor(rng.normal(size=X.shape))
    (project(x, S) * V).sum().backward()
    res = pp.project(X, S)
    J = pp.hs_jacobian(S.as_polyhedron(), res.active)
    np.testing.assert_allclose(x.grad.numpy(), np.einsum("bij,bj->bi", J, V.numpy()), atol=1e-12)
    # away from kinks the projection is differentiable and the HS-Jacobian is its Jacobian
    Y = res.y
    P = S.as_polyhedron()
    slack = P.ineq_slack(Y)
    ok = ~np.any((np.abs(slack) < 1e-3) & ~res.active, axis=1) & ~np.any(res.active & (res.multipliers[:, :P.n_ineq]
                                                                                      < 1e-3), axis=1)
    xs = torch.tensor(X[ok], requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: project(t, S), (xs,), eps=1e-7, atol=1e-6)
    layer = ProjectionLayer(S)
    assert torch.allclose(layer(torch.tensor(X)), torch.tensor(res.y))
    assert re.search(type(S).__name__, repr(layer))


def test_layer_keeps_leading_dims_for_a_set(rng):
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    X = torch.tensor(rng.normal(size=(2, 3, 4)))
    y = project(X, pp.sets.Simplex(4))
    assert y.shape == (2, 3, 4)
    np.testing.assert_allclose(y.sum(-1).numpy(), 1.0, atol=1e-12)


class _WithWeight(HalfSpace):
    """HalfSpace with a differentiable offset ``c`` (a tensor), its vjp and parameter_vjp broken as ``broken`` says."""

    def __init__(self, w, c, broken=""):
        super().__init__(w, 0.0)
        self.c_t, self.broken = c, broken
        self.c = float(c.detach())

    def vjp(self, result, G):
        out = super().vjp(result, G)
        return {"none": None, "short": out[:, :-1], "list": None if out is None else out.tolist(),
                "numpy": np.asarray(out)}.get(self.broken, out)

    def parameters(self):
        return {"c": self.c_t}

    def with_parameters(self, **values):
        return _WithWeight(self.w, values["c"], self.broken)

    def parameter_vjp(self, result, G, names):
        import torch

        w = torch.as_tensor(self.w, dtype=G.dtype)
        grad = (torch.where(result.face[:, 0], G @ w, torch.zeros(())) / float(self.w @ self.w)).sum()
        return {"none": None, "missing": {}, "shape": {"c": grad.reshape(1, 1)}}.get(self.broken, {"c": grad})


@pytest.mark.parametrize(("broken", "match"), [
    ("none", "vjp returned NoneType"), ("short", r"vjp returned shape \(4, 2\)"), ("list", "vjp returned list"),
    ("numpy", "vjp returned ndarray"), ("missing", "no gradient for 'c'"),
    ("shape", r"shape \(1, 1\) for 'c'; the parameter has shape \(\)"),
    ("none param", None)])
def test_layer_checks_what_a_third_party_backward_returns(rng, broken, match):
    """A custom set's vjp returning None was read by autograd as a zero gradient (silently); a wrong shape, a
    list or a NumPy array failed inside autograd without naming the set."""
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    c = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    S = _WithWeight([1.0, -1.0, 2.0], c, "none" if broken == "none param" else broken)
    x = torch.tensor(rng.normal(size=(4, 3)) + 1.0, requires_grad=broken != "none param")
    y = project(x, S)
    if match is None:  # x needs no gradient, so vjp is not called; the parameter's gradient is still checked
        with pytest.raises(pp.ProblemError, match="parameter_vjp returned NoneType, not a dict"):
            y.sum().backward()
        return
    if broken in ("missing", "shape"):
        x = x.detach()
        y = project(x, S)
    with pytest.raises(pp.ProblemError, match=match):
        y.sum().backward()
    ok = _WithWeight([1.0, -1.0, 2.0], c)
    X = rng.normal(size=(4, 3)) + 1.0
    V = np.arange(12.0).reshape(4, 3)
    (project(torch.tensor(X), ok) * torch.tensor(V)).sum().backward()
    w = np.array([1.0, -1.0, 2.0])  # y = x − max(wᵀx − c, 0) w / |w|²: dy/dc = w / |w|² where wᵀx > c
    assert c.grad is not None
    np.testing.assert_allclose(c.grad.item(), ((X @ w > 0.2) * (V @ w)).sum() / (w @ w), rtol=1e-12)


# ----------------------------------------------------------------------------- errors
def test_bad_input_is_a_clear_error(rng):
    S = pp.sets.Simplex(3)
    with pytest.raises(pp.ProblemError, match="shape"):
        pp.project(np.zeros((2, 4)), S)
    with pytest.raises(pp.ProblemError, match="NaN"):
        pp.project(np.array([1.0, np.nan, 0.0]), S)
    with pytest.raises(pp.ProblemError, match="real numbers"):
        pp.project(np.array(["a", "b", "c"]), S)
    with pytest.raises(pp.ProblemError, match="closed form|own method"):
        pp.project(np.zeros(3), S, backend="osqp")
    with pytest.raises(pp.ProblemError, match="total"):
        pp.sets.Simplex(3, total=-1.0)
    with pytest.raises(pp.ProblemError, match="Polyhedron or a polyproj.Projector"):
        pp.project(np.zeros(3), "simplex")
    assert pp.project(np.zeros((0, 3)), S).y.shape == (0, 3)


class _Box01(pp.Projector):
    """[0, 1]^n, correct unless ``broken`` says how not."""

    def __init__(self, n, broken=""):
        self._n, self.broken = n, broken

    @property
    def n(self):
        return self._n

    def project_batch(self, X):
        from array_api_compat import is_numpy_array

        if self.broken == "raises":
            raise RuntimeError("kaboom")
        if self.broken == "none":
            return None
        xp = array_namespace(X)
        Y = xp.clip(X, 0.0, 1.0)
        if self.broken == "nan outside numpy" and not is_numpy_array(X):
            Y = Y * float("nan")
        if self.broken == "1e-10 off outside numpy" and not is_numpy_array(X):
            Y = Y + 1e-10
        if self.broken == "float64 for float32":
            Y = xp.astype(Y, xp.float64)
        if self.broken == "1e-3 off in float32" and Y.dtype == xp.float32:
            Y = Y + 1e-3
        active = xp.concat([X <= 0, X >= 1], axis=1)
        mult = xp.concat([xp.clip(-X, 0.0, None), xp.clip(X - 1, 0.0, None)], axis=1)
        return self.result(X, Y, active=active, multipliers=mult)

    def vjp(self, result, G):
        if self.broken == "vjp none":
            return None
        if self.broken == "vjp nan":
            return G * float("nan")
        from array_api_compat import is_numpy_array

        if self.broken == "vjp wrong on torch" and not is_numpy_array(G):
            return G
        if self.broken == "vjp numpy for torch" and not is_numpy_array(G):
            return np.asarray(G)
        xp = array_namespace(G)
        act = result.active[:, : self._n] | result.active[:, self._n:]
        return xp.where(act, xp.zeros_like(G), G)

    def as_polyhedron(self):
        k = self._n + (1 if self.broken == "wrong n" else 0)
        return pp.Polyhedron(lb=np.zeros(k), ub=np.ones(k))


@pytest.mark.parametrize(("broken", "row", "what"), [
    ("vjp none", "vjp", "S.vjp returned None"),
    ("vjp nan", "vjp", "differs from the HS-Jacobian"),
    ("nan outside numpy", "namespaces", "differ by nan"),
    # exact answers (a box's) are compared to rounding, also near the boundary, where the generic path's are not
    ("1e-10 off outside numpy", "namespaces", "an exact NumPy answer"),
    ("raises", "set-up", "kaboom"),
    ("none", "set-up", "ProjectionResult"),
    ("wrong n", "set-up", "has 4 variables but S.n is 3"),
    # the layer's backward calls vjp on torch: a NumPy-only check passed these (silently wrong gradients), and
    # float32 was never tried (a probe)
    ("vjp wrong on torch", "torch vjp", "S.vjp on torch differs from S.vjp on NumPy"),
    ("vjp numpy for torch", "torch vjp", "expected a tensor"),
    ("float64 for float32", "float32", "expected float32"),
    ("1e-3 off in float32", "float32", "differs from the float64 one"),
])
def test_check_projector_fails_broken_sets_in_its_report(broken, row, what):
    """NaN compared False against the tolerances (a NaN vjp or a NaN torch answer passed), and a set that raised
    escaped check_projector as a raw exception."""
    if row == "torch vjp":
        pytest.importorskip("torch")
    assert check_projector(_Box01(3), examples=8, seed=0).passed
    report = check_projector(_Box01(3, broken), examples=8, seed=0)
    assert not report.passed
    assert report[row].status in ("failed", "error") and what in report[row].message, str(report)


def test_a_vjp_that_writes_into_its_cotangent_is_caught_and_the_layer_keeps_the_gradient():
    """``G -= …; return G``: check_projector passed it (its reference was computed from the changed G, and J is
    idempotent), and the torch layer handed it the autograd gradient itself, which it then changed."""
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    class InPlace(HalfSpace):
        def vjp(self, result, G):
            xp = array_namespace(G)
            w = xp.asarray(self.w, dtype=G.dtype, device=device(G))
            normal = w / float(self.w @ self.w) ** 0.5
            G -= xp.where(result.face, xp.sum(G * normal, axis=1, keepdims=True) * normal, xp.zeros_like(G))
            return G

    S = InPlace([1.0, -2.0], 0.5)
    report = check_projector(S, examples=8, seed=0)
    assert not report.passed and "wrote into the cotangent" in report["vjp"].message
    x = torch.tensor([[3.0, 0.0], [0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    g = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    project(x, S).backward(g)
    assert g.tolist() == [[1.0, 0.0], [1.0, 0.0]]
    assert torch.allclose(x.grad, torch.tensor([[0.8, 0.4], [1.0, 0.0]], dtype=torch.float64))


def test_check_projector_samples_far_points():
    """A set wrong only beyond |x| = 30 passed check_projector at any number of examples (its samples never left
    |x| < 16); far samples at 1e2 and 1e4 times the set's scale catch it, and a correct set still passes."""
    class WrongFar(HalfSpace):
        def project_batch(self, X):
            res = super().project_batch(X)
            xp = array_namespace(X)
            far = xp.max(xp.abs(X), axis=1, keepdims=True) > 30.0
            return self.result(X, xp.where(far, 0.9 * res.y, res.y), active=res.active,
                               multipliers=res.multipliers, face=res.face)

    assert check_projector(HalfSpace([1.0, -2.0], 0.5), examples=20, seed=0).passed
    report = check_projector(WrongFar([1.0, -2.0], 0.5), examples=20, seed=0)
    assert not report.passed and report["agreement"].status == "failed"


def test_a_sets_result_of_the_wrong_shape_or_kind_is_named():
    """pp.project returned a custom set's y of the wrong shape (or a NumPy y for a torch input) as it was, and the
    torch layer failed on it with torch's RuntimeError / AttributeError (a probe)."""
    from dataclasses import replace

    class WrongWidth(_Box01):
        def project_batch(self, X):
            res = super().project_batch(X)
            return replace(res, y=res.y[:, :2])

    class NumpyOut(_Box01):
        def project_batch(self, X):
            return super().project_batch(np.asarray(X))

    X = np.full((5, 3), 3.0)
    with pytest.raises(pp.SolverError, match=r"WrongWidth.project_batch returned y as ndarray of shape \(5, 2\)"):
        pp.project(X, WrongWidth(3))
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    for S in (WrongWidth(3), NumpyOut(3)):
        with pytest.raises(pp.SolverError, match="y must be an array of X's kind and shape"):
            project(torch.tensor(X), S)


def test_a_set_of_matrix_points_gets_its_cotangent_as_batch_by_n():
    """S.vjp at the result of points of shape (k, k) handed the set's vjp G of that shape, not (batch, n) as
    project_batch takes X: a set written for (batch, n) failed with NumPy's broadcast error (a probe)."""

    class MatBox(_Box01):
        @property
        def event_shape(self):
            return (2, 2)

    S = MatBox(4)
    X = np.random.default_rng(0).standard_normal((3, 2, 2)) * 2.0
    ref = S.vjp(pp.project(X.reshape(3, 4), S), np.ones((3, 4)))
    np.testing.assert_array_equal(S.vjp(pp.project(X, S), np.ones((3, 2, 2))), ref)  # a batch's J g: (batch, n)
    np.testing.assert_array_equal(S.vjp(pp.project(X[0], S), np.ones((2, 2))), ref[0].reshape(2, 2))


def test_an_event_shape_that_is_not_n_entries_is_named():
    """A set whose event_shape does not flatten to n entries is named (NumPy's reshape error came out of
    pp.project; the layer took a (5, 3) batch by n and its reshape back failed later)."""

    class Odd(HalfSpace):
        @property
        def event_shape(self):
            return (2, 2)

    S = Odd([1.0, 2.0, 3.0], 0.5)
    with pytest.raises(pp.ProblemError, match=r"event_shape \(2, 2\) has 4 entries, but its n is 3"):
        pp.project(np.zeros((2, 2)), S)
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import project

    with pytest.raises(pp.ProblemError, match="event_shape"):
        project(torch.zeros(5, 3, dtype=torch.float64), S)
