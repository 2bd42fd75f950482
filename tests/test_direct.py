"""The direct path for small NumPy batches (polyproj/projection/direct.py) against the pipeline.

The pipeline's answers are the reference: the direct path is switched off by setting
``direct.DIRECT_BATCH = 0``. Projections must agree to 1e-12, the HS-Jacobian products and the
constraint-data gradients to 1e-10; degenerate points must go to the pipeline and give its answer.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import polyproj as pp
from polyproj.projection import direct
from polyproj.sets.polyhedral import Polyhedral

torch = pytest.importorskip("torch")
pytest.importorskip("daqp")

from polyproj.adapters.torch import ProjectionLayer, project  # noqa: E402

PARTS = ("A", "a", "B", "b", "lb", "ub")


def problem(n: int, m: int, batch: int, seed: int):
    """A bounded polytope with an interior point x0 and points around it (as the layer benchmark's)."""
    rng = np.random.default_rng(seed)
    x0 = rng.normal(size=n)
    A = rng.normal(size=(m, n))
    a = A @ x0 + rng.uniform(0.1, 1.0, size=m)
    B = rng.normal(size=(1, n))
    b = B @ x0
    d = dict(A=A, a=a, B=B, b=b, lb=x0 - 2.0, ub=x0 + 2.0)
    return d, x0 + 3.0 * rng.normal(size=(batch, n)), rng.normal(size=(batch, n))


def taken(S: Polyhedral, X: np.ndarray) -> np.ndarray:
    """(batch,) the samples the direct path served (their face record is a DirectFace)."""
    res = S.project_batch(X, record=True)
    out = np.zeros(X.shape[0], dtype=bool)
    for rec in res.face.faces:
        if isinstance(rec.face, direct.DirectFace):
            out[np.arange(X.shape[0]) if rec.idx is None else rec.idx] = True
    return out


def layer_run(d, X, V, dtype, learn: bool):
    """y, dL/dx and the constraint gradients of L = <V, project(x)> through the torch layer."""
    cons = [torch.tensor(d[k], dtype=dtype).requires_grad_(learn) for k in PARTS]
    x = torch.tensor(X, dtype=dtype).requires_grad_()
    y = project(x, *cons)
    (y * torch.tensor(V, dtype=dtype)).sum().backward()
    return y.detach().double(), x.grad.double(), [c.grad.double() if learn else None for c in cons]


def pipeline_too(monkeypatch, fn):
    """``fn()`` with the direct path switched off."""
    with monkeypatch.context() as mp:
        mp.setattr(direct, "DIRECT_BATCH", 0)
        return fn()


# float64: projections 1e-12, gradients 1e-10; float32: both paths compute in float64 and round to
# float32, so they are at most one float32 rounding apart
CASES = [(torch.float64, 50, 100, seed, 1e-12, 1e-10) for seed in (0, 1, 2)] + \
    [(torch.float32, 20, 40, 3, 2e-7, 2e-7)]


@pytest.mark.parametrize("batch", [1, 4, 16])
@pytest.mark.parametrize(("dtype", "n", "m", "seed", "y_tol", "g_tol"), CASES)
def test_direct_equals_pipeline(monkeypatch, batch, dtype, n, m, seed, y_tol, g_tol):
    d, X, V = problem(n, m, batch, seed)
    S = Polyhedral(pp.Polyhedron(**d))
    Xs = X if dtype == torch.float64 else X.astype(np.float32)
    assert taken(S, Xs).sum() >= max(1, batch - 2)  # the clean points go the direct way
    y1, g1, c1 = layer_run(d, X, V, dtype, learn=True)
    y0, g0, c0 = pipeline_too(monkeypatch, lambda: layer_run(d, X, V, dtype, learn=True))
    assert float((y1 - y0).abs().max()) <= y_tol * (1 + float(y0.abs().max()))
    assert float((g1 - g0).abs().max()) <= g_tol * (1 + float(g0.abs().max()))
    for k, a, b in zip(PARTS, c1, c0, strict=True):
        assert float((a - b).abs().max()) <= g_tol * (1 + float(b.abs().max())), k


def test_direct_numpy_result_semantics(monkeypatch):
    """The result's arrays (active sets, multipliers, statuses, report) are the pipeline's."""
    d, X, V = problem(30, 60, 8, 4)
    S = Polyhedral(pp.Polyhedron(**d))
    assert taken(S, X).all()
    r1 = S.project_batch(X, record=True)
    r0 = pipeline_too(monkeypatch, lambda: Polyhedral(pp.Polyhedron(**d)).project_batch(X, record=True))
    np.testing.assert_allclose(r1.y, r0.y, rtol=0, atol=1e-12 * (1 + np.abs(r0.y).max()))
    np.testing.assert_array_equal(r1.active, r0.active)
    np.testing.assert_allclose(r1.multipliers, r0.multipliers, rtol=0, atol=1e-10 * (1 + np.abs(r0.multipliers).max()))
    assert r1.status == r0.status and bool(np.all(r1.polished))
    np.testing.assert_array_equal(r1.degenerate.weak, r0.degenerate.weak)
    np.testing.assert_array_equal(r1.degenerate.dependent, r0.degenerate.dependent)
    assert r1.max_violation <= 1e-12 * (1 + np.abs(X).max())
    # the backward without recorded faces (record=False) factors the active faces itself: same product
    g_rec = S.vjp(r1, V)
    g_unrec = S.vjp(S.project_batch(X), V)
    np.testing.assert_allclose(g_rec, g_unrec, rtol=0, atol=1e-12 * (1 + np.abs(V).max()))
    np.testing.assert_allclose(g_rec, S.vjp(r0, V), rtol=0, atol=1e-10 * (1 + np.abs(V).max()))


@pytest.mark.parametrize("batch", [1, 8])
def test_direct_violation_and_report_are_the_generic_ones(batch):
    """The direct path hands over the violations and the (empty) degeneracy report its verification implies:
    they equal what ``PolyData.violation`` and ``degeneracy`` compute from the result."""
    from polyproj.sets.polyhedral import degeneracy

    d, X, _ = problem(30, 60, batch, 7)
    X = X.copy()
    X[0] = (d["lb"] + d["ub"]) / 2  # inside P: nothing active, violation 0
    S = Polyhedral(pp.Polyhedron(**d))
    assert taken(S, X).all()
    res = S.project_batch(X, record=True)
    scale = 1 + np.abs(X).max() + np.abs(d["a"]).max()
    np.testing.assert_allclose(res.violation, S.data.violation(res.y), rtol=0, atol=1e-14 * scale)
    assert res.max_violation == float(np.max(res.violation))
    generic = degeneracy(X, res.face, S.options.tol, S._eq_deficiency())
    np.testing.assert_array_equal(res.degenerate.weak, generic.weak)
    np.testing.assert_array_equal(res.degenerate.dependent, generic.dependent)
    assert not res.degenerate.any.any()


def degenerate_points(d):
    """Points whose projection has a row at zero slack with a zero (or tiny) multiplier.

    ``on``: the point of P nearest the interior point ``x0 = (lb + ub) / 2`` on the hyperplane of the
    row nearest x0, strictly inside every other row (y = x there, the row active with multiplier 0);
    ``weak``: that point moved off P along the row's normal by 1e-13 (multiplier ~1e-13, weakly
    active). Returns them and the row.
    """
    A, a, B, b = d["A"], d["a"], d["B"], d["b"]
    x0 = (d["lb"] + d["ub"]) / 2
    for i in np.argsort((a - A @ x0) / np.linalg.norm(A, axis=1)):
        M, c = np.vstack([A[i], B]), np.r_[a[i], b]
        on = x0 - M.T @ np.linalg.solve(M @ M.T, M @ x0 - c)
        others = np.delete(A @ on - a, i)
        if np.all(others < -1e-3) and np.all(on > d["lb"] + 1e-3) and np.all(on < d["ub"] - 1e-3):
            return on, on + 1e-13 * A[i] / np.linalg.norm(A[i]), int(i)
    raise AssertionError("no row gives a degenerate point")


def test_degenerate_points_go_to_the_pipeline(monkeypatch):
    n, m = 10, 20
    d, X, V = problem(n, m, 4, 5)
    on, weak, i = degenerate_points(d)
    assert abs(d["A"][i] @ on - d["a"][i]) <= 1e-12 * (1 + abs(d["a"][i]))
    Xd = np.vstack([on, X[:2], weak, X[2:]])
    S = Polyhedral(pp.Polyhedron(**d))
    t = taken(S, Xd)
    assert not t[0] and not t[3]  # the degenerate points go to the pipeline
    r1 = S.project_batch(Xd, record=True)
    r0 = pipeline_too(monkeypatch, lambda: Polyhedral(pp.Polyhedron(**d)).project_batch(Xd, record=True))
    np.testing.assert_array_equal(r1.active, r0.active)
    np.testing.assert_array_equal(r1.degenerate.weak, r0.degenerate.weak)
    assert bool(r1.degenerate.weak[0])  # the report still sees them, as the pipeline does
    np.testing.assert_allclose(r1.y, r0.y, rtol=0, atol=1e-12 * (1 + np.abs(r0.y).max()))
    Vd = np.vstack([V[:1], V, V[:1]])
    np.testing.assert_allclose(S.vjp(r1, Vd), S.vjp(r0, Vd), rtol=0, atol=1e-10)
    # through the layer, with every gradient
    y1, g1, c1 = layer_run(d, Xd, Vd, torch.float64, learn=True)
    y0, g0, c0 = pipeline_too(monkeypatch, lambda: layer_run(d, Xd, Vd, torch.float64, learn=True))
    assert float((y1 - y0).abs().max()) <= 1e-12 * (1 + float(y0.abs().max()))
    assert float((g1 - g0).abs().max()) <= 1e-10
    for k, a, b in zip(PARTS, c1, c0, strict=True):
        assert float((a - b).abs().max()) <= 1e-10 * (1 + float(b.abs().max())), k


def test_single_degenerate_point_is_the_pipelines(monkeypatch):
    n, m = 10, 20
    d, _, _ = problem(n, m, 1, 6)
    on, _, _ = degenerate_points(d)
    S = Polyhedral(pp.Polyhedron(**d))
    assert not taken(S, on[None, :])[0]
    r1 = S.project_batch(on[None, :], record=True)
    r0 = pipeline_too(monkeypatch, lambda: Polyhedral(pp.Polyhedron(**d)).project_batch(on[None, :], record=True))
    np.testing.assert_array_equal(r1.y, r0.y)
    np.testing.assert_array_equal(r1.active, r0.active)
    np.testing.assert_array_equal(r1.multipliers, r0.multipliers)


def test_handed_points_are_solved_by_daqp_once(monkeypatch):
    """The pipeline starts the points the direct path hands over from the direct path's own DAQP solves."""
    import daqp

    d, X, _ = problem(10, 20, 4, 5)
    on, weak, _ = degenerate_points(d)
    Xd = np.vstack([on, X[:2], weak, X[2:]])
    calls = []
    real, Model = daqp.solve, daqp.Model

    class Counted:  # DAQP's workspace (a batch's solves), counting its solves
        def __init__(self):
            self._m = Model()

        def __getattr__(self, k):
            return getattr(self._m, k)

        def __setattr__(self, k, v):
            object.__setattr__(self, k, v) if k == "_m" else setattr(self._m, k, v)

        def solve(self):
            calls.append(1)
            return self._m.solve()

    monkeypatch.setattr(daqp, "solve", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(daqp, "Model", Counted)
    S = Polyhedral(pp.Polyhedron(**d))
    t = taken(S, Xd)
    assert not t[0] and not t[3] and t[1:3].all()
    assert len(calls) == len(Xd)  # one solve a point, the handed two included
    r0 = pipeline_too(monkeypatch, lambda: Polyhedral(pp.Polyhedron(**d)).project_batch(Xd, record=True))
    r1 = S.project_batch(Xd, record=True)
    np.testing.assert_array_equal(r1.active, r0.active)
    np.testing.assert_allclose(r1.y, r0.y, rtol=0, atol=1e-12 * (1 + np.abs(r0.y).max()))


@pytest.mark.parametrize("ratio", [0.5, 30.0, 1e3])
def test_row_near_its_hyperplane(monkeypatch, ratio):
    """A row placed at ``ratio`` times its feasibility tolerance from a point's projection: the direct path
    takes the point only beyond SEPARATION, and either way the answer is the pipeline's."""
    d, X, V = problem(20, 40, 4, 11)
    r = Polyhedral(pp.Polyhedron(**d)).project_batch(X)
    j = int(np.flatnonzero(~r.active[0, :40])[0])
    tol = Polyhedral(pp.Polyhedron(**d)).options.tol
    row_tol = tol * (abs(d["a"][j]) + np.abs(d["A"][j]).sum() * np.abs(r.y[0]).max())
    d["a"] = d["a"].copy()
    d["a"][j] = d["A"][j] @ r.y[0] + ratio * row_tol  # y stays the projection: the row is not active there
    S = Polyhedral(pp.Polyhedron(**d))
    assert bool(taken(S, X)[0]) == (ratio > direct.SEPARATION)
    r1 = S.project_batch(X, record=True)
    r0 = pipeline_too(monkeypatch, lambda: Polyhedral(pp.Polyhedron(**d)).project_batch(X, record=True))
    np.testing.assert_array_equal(r1.active, r0.active)
    np.testing.assert_allclose(r1.y, r0.y, rtol=0, atol=1e-12 * (1 + np.abs(r0.y).max()))
    np.testing.assert_allclose(S.vjp(r1, V), S.vjp(r0, V), rtol=0, atol=1e-10)
    assert r1.max_violation <= 1e-9


@pytest.mark.slow
def test_rows_near_their_hyperplanes_stress(monkeypatch):
    """The stress behind SEPARATION: inactive rows moved to slacks 1e-12 .. 1e-3 of a point's projection
    (10 seeds, 6 rows each); direct path and pipeline agree on the active set, y to 1e-12 and J v to 1e-10
    at every one, and no point is left unverified."""
    slacks = 10.0 ** np.arange(-12, -2)
    seen, direct_served = 0, 0
    for seed in range(10):
        d0, X, V = problem(12, 24, 1, seed)
        ref = Polyhedral(pp.Polyhedron(**d0)).project_batch(X)
        for j in np.flatnonzero(~ref.active[0, :24])[:6]:
            for slack in slacks:
                d = dict(d0, a=d0["a"].copy())
                d["a"][j] = d["A"][j] @ ref.y[0] + slack * (1 + np.abs(ref.y[0]).max())
                S = Polyhedral(pp.Polyhedron(**d))
                r1 = S.project_batch(X, record=True)
                r0 = pipeline_too(monkeypatch,
                                  lambda d=d, X=X: Polyhedral(pp.Polyhedron(**d)).project_batch(X, record=True))
                where = f"seed {seed}, row {j}, slack {slack:g}"
                assert bool(r1.polished[0]) and bool(r0.polished[0]), where
                np.testing.assert_array_equal(r1.active, r0.active, err_msg=where)
                np.testing.assert_allclose(r1.y, r0.y, rtol=0, atol=1e-12 * (1 + np.abs(r0.y).max()), err_msg=where)
                np.testing.assert_allclose(S.vjp(r1, V), S.vjp(r0, V), rtol=0, atol=1e-10, err_msg=where)
                seen += 1
                direct_served += any(isinstance(rec.face, direct.DirectFace) for rec in r1.face.faces)
    assert seen >= 500 and 0.2 * seen < direct_served < seen  # both paths were exercised


@pytest.mark.parametrize("backend", ["daqp", "highs"])
def test_degenerate_vertex_is_polished(monkeypatch, backend):
    """A row within tolerance of a vertex's projection: the pipeline's first candidates (backed and near
    rows) are dependent and the corrections cycle; the second try from the backed rows verifies it."""
    if backend == "highs":
        pytest.importorskip("highspy")
    d, X, _ = problem(20, 40, 4, 11)
    ref = Polyhedral(pp.Polyhedron(**d)).project_batch(X)
    j = int(np.flatnonzero(~ref.active[0, :40])[0])
    row_tol = 1e-9 * (abs(d["a"][j]) + np.abs(d["A"][j]).sum() * np.abs(ref.y[0]).max())
    d["a"] = d["a"].copy()
    d["a"][j] = d["A"][j] @ ref.y[0] + 0.5 * row_tol
    with monkeypatch.context() as mp:
        mp.setattr(direct, "DIRECT_BATCH", 0)
        r = Polyhedral(pp.Polyhedron(**d), backend=backend).project_batch(X[:1])  # no "polish refused" warning
    assert bool(r.polished[0]) and r.status[0] is pp.Status.SOLVED
    np.testing.assert_allclose(r.y[0], ref.y[0], rtol=0, atol=1e-12 * (1 + np.abs(ref.y[0]).max()))
    assert bool(r.active[0, j]) and bool(r.degenerate.weak[0])  # reported: a row at zero slack, no multiplier


def test_warm_start_layer(monkeypatch):
    d, X, V = problem(20, 40, 4, 7)
    ys = []
    for off in (False, True):
        def run():
            layer = ProjectionLayer(**d, warm_start=True)
            x = torch.tensor(X, requires_grad=True)
            out = [layer(x) for _ in range(3)]
            (out[-1] * torch.tensor(V)).sum().backward()
            return [o.detach() for o in out], x.grad
        ys.append(pipeline_too(monkeypatch, run) if off else run())
    for a, b in zip(ys[0][0], ys[1][0], strict=True):
        assert float((a - b).abs().max()) <= 1e-12 * (1 + float(b.abs().max()))
    assert float((ys[0][1] - ys[1][1]).abs().max()) <= 1e-10


def test_gradcheck_direct_path():
    d, X, _ = problem(6, 8, 2, 8)
    S = Polyhedral(pp.Polyhedron(**d))
    assert taken(S, X).all()
    A, a, B, b = (torch.tensor(d[k], requires_grad=True) for k in ("A", "a", "B", "b"))
    lb, ub = torch.tensor(d["lb"]), torch.tensor(d["ub"])
    x = torch.tensor(X, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, A, a, B, b: project(x, A, a, B, b, lb, ub), (x, A, a, B, b),
                                    eps=1e-6, atol=1e-6)


def test_settings_or_other_backends_skip_the_direct_path():
    d, X, _ = problem(10, 20, 2, 9)
    P = pp.Polyhedron(**d)
    assert not taken(Polyhedral(P, "admm"), X).any()
    assert not taken(Polyhedral(P, eps_abs=1e-7), X).any()
    assert not taken(Polyhedral(P, max_polish_iter=3), X).any()
    assert taken(Polyhedral(P, "daqp"), X).all()
    many = np.vstack([X] * (direct.DIRECT_BATCH // 2 + 1))
    assert not taken(Polyhedral(P), many).any()  # more than DIRECT_BATCH points
    assert taken(Polyhedral(P), many[: direct.DIRECT_BATCH]).all()


def test_direct_points_grow_as_n_shrinks(monkeypatch):
    """Under "auto" the direct path takes up to direct_points(n) points (the measured crossover with the
    batched start): many at small n, as many as the per-point rule at large n; its answers and backward
    at a batch far past 16 are the pipeline's."""
    from polyproj.backends.defaults import direct_points, per_point_limit

    ns = (10, 20, 30, 50, 80, 100, 200, 300)
    limits = [direct_points(n) for n in ns]
    assert limits == sorted(limits, reverse=True)
    assert all(direct_points(n) >= per_point_limit(n) for n in ns)
    assert direct_points(10) >= direct.DIRECT_BATCH and direct_points(300) == 0
    d, X, V = problem(20, 40, 96, 11)
    S = Polyhedral(pp.Polyhedron(**d))
    assert taken(S, X).sum() >= 90
    y1, g1, c1 = layer_run(d, X, V, torch.float64, learn=True)
    y0, g0, c0 = pipeline_too(monkeypatch, lambda: layer_run(d, X, V, torch.float64, learn=True))
    assert float((y1 - y0).abs().max()) <= 1e-12 * (1 + float(y0.abs().max()))
    assert float((g1 - g0).abs().max()) <= 1e-10 * (1 + float(g0.abs().max()))
    for k, a, b in zip(PARTS, c1, c0, strict=True):
        assert float((a - b).abs().max()) <= 1e-10 * (1 + float(b.abs().max())), k
    d, X, _ = problem(50, 100, direct_points(50) + 1, 12)
    assert not taken(Polyhedral(pp.Polyhedron(**d)), X).any()


def test_per_point_solves_are_limited_by_dimension():
    """"auto" solves point by point (direct path, DAQP) only while that beats one batched start: up to 16
    points at n <= 50, fewer as n grows, none from n ~ 230; an explicit DAQP keeps the direct path."""
    from polyproj.backends.defaults import auto_projection, per_point_limit

    limits = [per_point_limit(n) for n in (10, 50, 100, 150, 200, 300, 500)]
    assert limits == sorted(limits, reverse=True) and limits[:2] == [16, 16] and limits[-2:] == [0, 0]
    assert auto_projection(True, 4, n=50) == "daqp" and auto_projection(True, 4, n=200) == "admm"
    d, X, _ = problem(200, 400, 3, 5)
    P = pp.Polyhedron(**d)
    assert not taken(Polyhedral(P), X).any() and taken(Polyhedral(P), X[:1]).all()
    assert taken(Polyhedral(P, "daqp"), X).all()
    ref = pp.project(X, P, backend="daqp")
    res = pp.project(X, P)  # ADMM start + polish: the same exact projections
    assert bool(res.polished.all())
    np.testing.assert_allclose(res.y, ref.y, rtol=0, atol=1e-10 * (1 + np.abs(ref.y).max()))


def test_double_backward_on_the_direct_path():
    """create_graph builds the backward as a Function of the output gradient (J is symmetric)."""
    d, X, _ = problem(6, 8, 2, 8)
    cons = [torch.tensor(d[k]) for k in PARTS]
    x = torch.tensor(X, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x: project(x, *cons), (x,), eps=1e-6, atol=1e-6)
    v = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad((project(x, *cons) * v).sum(), x, create_graph=True)
    (gv,) = torch.autograd.grad(g.sum(), v)  # d/dv <1, J v> = J 1
    (j1,) = torch.autograd.grad(project(x, *cons), x, torch.ones_like(x))
    assert float((gv - j1).abs().max()) <= 1e-12


@pytest.mark.parametrize("variant", ["no_equality", "no_inequality", "one_sided_bounds", "no_bounds", "interior"])
def test_direct_structures(monkeypatch, variant):
    """Missing parts (no B, no A, infinite bounds) on the direct path equal the pipeline's answers."""
    d, X, V = problem(12, 24, 4, 10)
    if variant in ("no_equality", "interior"):
        d = {k: v for k, v in d.items() if k not in ("B", "b")}
        if variant == "interior":  # no active row: y = x, J = I
            X = (d["lb"] + d["ub"]) / 2 + 1e-3 * X
    elif variant == "no_inequality":
        d = {k: v for k, v in d.items() if k not in ("A", "a")}
    elif variant == "one_sided_bounds":
        d["lb"] = np.where(np.arange(12) % 2 == 0, -np.inf, d["lb"])
        d["ub"] = np.where(np.arange(12) % 3 == 0, np.inf, d["ub"])
        d["a"] = np.where(np.arange(24) % 5 == 0, np.inf, d["a"])
    else:
        d = {k: v for k, v in d.items() if k not in ("lb", "ub")}
    S = Polyhedral(pp.Polyhedron(**d))
    assert taken(S, X).sum() >= 3
    r1 = S.project_batch(X, record=True)
    if variant == "interior":
        np.testing.assert_array_equal(r1.y, X)
        np.testing.assert_array_equal(S.vjp(r1, V), V)
    r0 = pipeline_too(monkeypatch, lambda: Polyhedral(pp.Polyhedron(**d)).project_batch(X, record=True))
    np.testing.assert_allclose(r1.y, r0.y, rtol=0, atol=1e-12 * (1 + np.abs(r0.y).max()))
    np.testing.assert_array_equal(r1.active, r0.active)
    np.testing.assert_allclose(S.vjp(r1, V), S.vjp(r0, V), rtol=0, atol=1e-10 * (1 + np.abs(V).max()))
    names = tuple(k for k in PARTS if k in d)
    g1, g0 = S.parameter_vjp(r1, V, names), S.parameter_vjp(r0, V, names)
    for k in names:
        np.testing.assert_allclose(g1[k], g0[k], rtol=0, atol=1e-10 * (1 + np.abs(g0[k]).max()), err_msg=k)


def test_without_daqp_the_pipeline_projects(monkeypatch):
    from polyproj.backends.daqp import DAQPSolver

    d, X, _ = problem(10, 20, 2, 11)
    S = Polyhedral(pp.Polyhedron(**d), "daqp")
    # the direct path builds polyproj's own DAQP glue (not the registry's entry, which a user may replace)
    monkeypatch.setattr(DAQPSolver, "unavailable_reason", classmethod(lambda cls: "daqp is not installed"))
    assert not taken(S, X).any()
    assert bool(np.all(S.project_batch(X).polished))


# ----------------------------------------------------------------------------- warm starts
def _count_daqp(monkeypatch):
    """Record the batch sizes DAQP's per-point solves are called with."""
    from polyproj.backends.daqp import DAQPSolver

    sizes, real = [], DAQPSolver.solve_points

    def counted(self, X, arrays, *norms):
        sizes.append(X.shape[0])
        return real(self, X, arrays, *norms)

    monkeypatch.setattr(DAQPSolver, "solve_points", counted)
    return sizes


def _same(res, ref, G, S):
    scale = 1 + np.abs(ref.y).max()
    np.testing.assert_allclose(res.y, ref.y, rtol=0, atol=1e-12 * scale)
    np.testing.assert_array_equal(res.active, ref.active)
    np.testing.assert_allclose(res.multipliers, ref.multipliers, rtol=0, atol=1e-10 * scale)
    np.testing.assert_allclose(S.vjp(res, G), S.vjp(ref, G), rtol=0, atol=1e-10)
    assert all(st is pp.Status.SOLVED for st in res.status) and bool(np.all(res.polished))


def test_warm_direct_path_takes_the_guess_without_daqp(monkeypatch):
    d, X, V = problem(30, 60, 24, 11)
    S = Polyhedral(pp.Polyhedron(**d))
    cold = S.project_batch(X, record=True)
    assert taken(S, X).all()
    Xm = X + 1e-7 * np.random.default_rng(0).normal(size=X.shape)  # a training step's small move
    ref = pipeline_too(monkeypatch, lambda: S.project_batch(Xm, record=True))
    sizes = _count_daqp(monkeypatch)
    res = S.project_batch(Xm, record=True, warm_start=cold)
    assert sizes == []  # every guess verified: no DAQP solve
    _same(res, ref, V, S)
    np.testing.assert_allclose(res.solution.x, res.y, rtol=0, atol=0)
    assert (res.solution.iterations == 0).all()


def test_warm_direct_path_solves_only_the_wrong_guesses(monkeypatch):
    d, X, V = problem(30, 60, 24, 12)
    S = Polyhedral(pp.Polyhedron(**d))
    cold = S.project_batch(X, record=True)
    Xm = X.copy()
    moved = np.arange(0, 24, 3)
    Xm[moved] += 2.0 * np.random.default_rng(1).normal(size=(moved.size, X.shape[1]))  # new active sets
    ref = pipeline_too(monkeypatch, lambda: S.project_batch(Xm, record=True))
    wrong = int((ref.active != cold.active).any(axis=1).sum())
    assert 0 < wrong <= moved.size
    sizes = _count_daqp(monkeypatch)
    res = S.project_batch(Xm, record=True, warm_start=cold)
    assert sizes == [wrong]
    _same(res, ref, V, S)
    # a guess of nothing active anywhere (the interior point's result): every point the cold way
    inside = S.project_batch(np.tile((d["lb"] + d["ub"]) / 2, (24, 1)), record=True)
    assert not bool(np.any(inside.active))
    del sizes[:]
    res = S.project_batch(Xm, record=True, warm_start=inside)
    assert sizes == [24]
    _same(res, ref, V, S)


def test_warm_direct_path_with_degenerate_points(monkeypatch):
    """Points on the boundary (rows at zero slack, zero multiplier) go to the pipeline with their guesses."""
    d, X, V = problem(12, 24, 10, 13)
    S = Polyhedral(pp.Polyhedron(**d))
    cold = S.project_batch(X, record=True)
    Xd = X.copy()
    Xd[::2] = cold.y[::2]  # projections of projections: weakly active rows
    ref = pipeline_too(monkeypatch, lambda: S.project_batch(Xd, record=True))
    assert bool(np.all(ref.degenerate.weak[::2]))
    res = S.project_batch(Xd, record=True, warm_start=cold)
    np.testing.assert_allclose(res.y, ref.y, rtol=0, atol=1e-12 * (1 + np.abs(ref.y).max()))
    assert bool(np.all(res.polished)) and not bool(np.any(res.degenerate.weak[1::2]))
    np.testing.assert_allclose(S.vjp(res, V)[1::2], S.vjp(ref, V)[1::2], rtol=0, atol=1e-10)
    # the record of the backends: the guessed faces where taken, the pipeline's statuses elsewhere
    assert res.solution.status == res.status
    np.testing.assert_array_equal(res.solution.x[1::2], res.y[1::2])


@pytest.mark.parametrize("torch_loaded", [True, False])
@pytest.mark.parametrize("singular", [False, True])
def test_batched_factorisation_equals_per_point(singular, torch_loaded, monkeypatch):
    """Batches of faces are factorised and solved by polyproj.linalg; the factors, the refusals (a pivot below
    PIVOT, a face marked ill-posed, with ``singular`` a matrix that is not positive definite) and the solves
    equal the per-point LAPACK path's — with torch loaded (its batched triangular solves) and without
    (substitution over the batch)."""
    if not torch_loaded:
        monkeypatch.setitem(sys.modules, "torch", None)
    rng = np.random.default_rng(5)
    b, k = 24, 6
    M = rng.normal(size=(b, k, k + 4))
    G = M @ np.swapaxes(M, 1, 2)
    G /= np.sqrt(np.einsum("bii->bi", G))[:, :, None] * np.sqrt(np.einsum("bii->bi", G))[:, None, :]
    if singular:
        G[3, :, 5] = G[3, 5, :] = G[3, 4]  # rows 4 and 5 equal: singular
        G[3, 5, 5] = 1.0
    refused = [3, 7, 11] if singular else [7, 11]
    w = rng.normal(size=k + 4)
    M[7, 1] = M[7, 0] + 1e-4 * w / np.linalg.norm(w)  # nearly dependent rows: a pivot ~3e-5 < PIVOT
    G[7] = M[7] @ M[7].T
    G[7] /= np.sqrt(np.outer(np.diag(G[7]), np.diag(G[7])))
    ok0 = np.ones(b, dtype=bool)
    ok0[11] = False  # refused before the factorisation
    R = rng.normal(size=(b, k))
    s = rng.uniform(0.5, 2.0, size=(b, k))
    out = []
    from polyproj import linalg

    for few in (b, linalg._FEW):  # the whole batch counted as "a few" (LAPACK per point), then the default
        ok = ok0.copy()
        with monkeypatch.context() as mp:
            mp.setattr(linalg, "_FEW", few)
            L, batched = direct._factor(G.copy(), ok)
            faces = direct._Faces(np.zeros((b, k, 1)), np.ones((b, 1)), s, L, k, batched)
            x = faces.solve(R)
        assert batched == (few < b)
        out.append((ok, L, x))
    (ok1, L1, x1), (ok2, L2, x2) = out
    assert not ok1[refused].any() and ok1.sum() == b - len(refused)
    assert np.array_equal(ok1, ok2)
    np.testing.assert_allclose(L2, L1, rtol=0, atol=1e-13)
    for i in np.flatnonzero(ok1):  # s ⊙ G⁻¹ (s ⊙ R) by both
        ref = s[i] * np.linalg.solve(G[i], s[i] * R[i])
        np.testing.assert_allclose(x1[i], ref, rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(x2[i], ref, rtol=1e-11, atol=1e-11)
    for i in refused:  # refused: the identity
        assert np.array_equal(L2[i], np.eye(k))


def test_rows_of_mixed_scale_take_the_direct_path(monkeypatch):
    """DAQP sees ``[A; B]`` with unit rows (the same set): a row of norm 1e-6 beside rows of norm ~1 made it
    call every point infeasible (the IPM then solved them, with a warning). Now the direct path takes the
    points, with the pipeline's answer, multipliers of the rows as given and no warning."""
    import warnings

    d, X, _ = problem(6, 8, 16, 7)
    d["A"][0] *= 1e-6
    d["a"][0] *= 1e-6
    S = Polyhedral(pp.Polyhedron(**d))
    with warnings.catch_warnings():
        warnings.simplefilter("error", pp.PolyprojWarning)
        r1 = S.project_batch(X, record=True)
        assert taken(S, X).sum() >= 14
    r0 = pipeline_too(monkeypatch, lambda: Polyhedral(pp.Polyhedron(**d)).project_batch(X, record=True))
    np.testing.assert_allclose(r1.y, r0.y, rtol=0, atol=1e-12 * (1 + np.abs(r0.y).max()))
    np.testing.assert_array_equal(r1.active, r0.active)
    np.testing.assert_allclose(r1.multipliers, r0.multipliers, rtol=1e-8, atol=1e-10)
    # DAQP's own multipliers, returned for the rows as given: stationarity y − x + Aᵀλ + Bᵀμ + z_box = 0
    from polyproj.backends.daqp import DAQPSolver

    solver = pp.get_backend("daqp")
    arrays, norms = DAQPSolver.projection_arrays(*(np.asarray(d[k], dtype=np.float64) for k in PARTS))
    sol, flags = solver.solve_points(X, arrays, norms)
    assert (flags == 1).all()
    C = np.vstack([d["A"], d["B"]])
    res = sol.x - X + sol.z @ C + sol.z_box
    assert np.abs(res).max() <= 1e-9 * (1 + np.abs(X).max())


def test_daqp_parts_on_threads_give_the_serial_answers(monkeypatch):
    """DAQP's per-point loop shared by threads (one workspace per part) returns what one loop returns, bitwise:
    every point is solved from the cold working set either way. A time limit still leaves points unsolved."""
    import polyproj.backends.daqp as dq

    d, X, _ = problem(12, 20, 37, 3)
    solver = pp.get_backend("daqp")
    arrays, norms = dq.DAQPSolver.projection_arrays(*(np.asarray(d[k], dtype=np.float64) for k in PARTS))
    monkeypatch.setattr(dq, "POINT_WORK", 10**15)
    serial, flags = solver.solve_points(X, arrays, norms)
    parts = []
    real = dq.parallel_map
    monkeypatch.setattr(dq, "parallel_map", lambda fn, items: parts.append(len(items)) or real(fn, items))
    from polyproj import runtime

    for mod in (dq, runtime):  # three cores: the parts run on the caller and two pool threads
        monkeypatch.setattr(mod, "cpu_count", lambda: 3)
    monkeypatch.setattr(dq, "POINT_WORK", 0)
    threaded, flags_t = solver.solve_points(X, arrays, norms)
    assert parts == [3]
    monkeypatch.setattr(dq, "PART_POINTS", 5)
    small, _ = solver.solve_points(X, arrays, norms)  # 8 parts of 4-5 points
    assert parts[-1] == 8
    np.testing.assert_array_equal(small.x, serial.x)
    np.testing.assert_array_equal(flags_t, flags)
    for k in ("x", "z", "z_box", "iterations"):
        np.testing.assert_array_equal(getattr(threaded, k), getattr(serial, k))
    assert threaded.status == serial.status
    limited = pp.get_backend("daqp", time_limit=1e-9)
    sol, fl = limited.solve_points(X, arrays, norms)
    assert (fl == 0).all() and all(s is pp.Status.TIME_LIMIT for s in sol.status)
