"""The projection pipeline after a 2026-12-07 probe: time_limit, merged statuses, tiny points, empty samples.

Each test failed before its fix (see the docstrings)."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

import polyproj as pp
from polyproj.polydata import PolyData


def _reference(X, poly):
    """DAQP's pipeline without settings: the exact projections (KKT verified)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        return pp.project(X, poly, backend="daqp", structured=False)


def _distance_violation(y, A, a, B, b, lb, ub):
    """Largest distance of ``y`` outside a row (rows normalised), a bound or an equality."""
    out = [0.0]
    if A.shape[0]:
        out.append(float(np.max((A @ y - a) / np.linalg.norm(A, axis=1))))
    if B.shape[0]:
        out.append(float(np.max(np.abs(B @ y - b) / np.linalg.norm(B, axis=1))))
    out += [float(np.max(lb - y)), float(np.max(y - ub))]
    return max(out)


# ----------------------------------------------------------------------------- 1. time_limit
@pytest.mark.filterwarnings("ignore:time_limit reached:polyproj.errors.PolyprojWarning")
def test_a_spent_time_limit_starts_no_polish_of_a_start_that_shows_no_face(monkeypatch):
    """pp.project(..., backend="ipm", time_limit=0.1) on 2,000 points (n 40, m 80, a box) took 4-22 s, every point
    TIME_LIMIT: the late polish rounds started from the IPM's early iterate, whose multipliers put ~90 of 160 rows on
    every face (SVDs of inconsistent faces). A late start that shows more active rows than coordinates now gets no
    round (300 points here: 1.7 s before, 0.06 s after, on one loaded core)."""
    from polyproj.projection import pipeline

    rng = np.random.default_rng(2)
    n, m, b = 40, 80, 300
    C = rng.standard_normal((m, n))
    poly = pp.Polyhedron(A=C, a=C @ (0.3 * rng.uniform(-1, 1, n)) + 0.5, lb=-np.ones(n), ub=np.ones(n))
    X = 2 * rng.standard_normal((b, n))
    pp.project(X[:2], poly, backend="ipm")  # (imports and first-call set-up out of the timing)
    work = []  # (samples, rounds) of every polish
    real = pipeline.polish

    def counted(Xp, *args, **kw):
        work.append((Xp.shape[0], kw["max_iter"]))
        return real(Xp, *args, **kw)

    monkeypatch.setattr(pipeline, "polish", counted)
    limit = 1e-3  # the IPM stops at its first check: every start is its early iterate, on any machine
    t0 = time.perf_counter()
    r = pp.project(X, poly, backend="ipm", time_limit=limit)
    wall = time.perf_counter() - t0
    assert wall < 20 * limit + 1.0, wall
    status = list(r.status)
    assert all(s is pp.Status.TIME_LIMIT for s, ok in zip(status, r.polished, strict=True) if not ok)
    assert all(s is pp.Status.SOLVED for s, ok in zip(status, r.polished, strict=True) if ok)
    ref = _reference(X, poly)
    np.testing.assert_allclose(r.y[r.polished], ref.y[r.polished], rtol=0, atol=1e-9)
    if all(s is pp.Status.TIME_LIMIT for s in status):  # the early iterate everywhere: no face, no round
        assert sum(k * rounds for k, rounds in work) == 0, work


@pytest.mark.filterwarnings("ignore:polish refused:polyproj.errors.PolyprojWarning")
def test_no_retry_starts_once_the_time_limit_has_passed(monkeypatch):
    """Refused points of a backend that finished in time went to the fallback and retry backends even when the
    caller's time_limit had passed during the polish (each with a fresh limit of its own). The pipeline's clock
    starts with the call now; past it the refused points keep the backend's point (DAQP's: SOLVED_INACCURATE,
    unverified) and nothing more is solved."""
    from polyproj.projection import pipeline

    rng = np.random.default_rng(0)
    n, m = 6, 12
    A = rng.standard_normal((m, n))
    poly = pp.Polyhedron(A=A, a=A @ (0.2 * rng.standard_normal(n)) + 0.3, lb=-np.ones(n), ub=np.ones(n))
    X = 2 * rng.standard_normal((20, n))
    limit = 0.05
    real = pipeline._polish

    def slow_polish(*args, **kw):  # a polish that outlasts the caller's limit
        time.sleep(limit)
        return real(*args, **kw)

    def no_retry(*args, **kw):
        raise AssertionError("a retry or fallback started after the time limit")

    monkeypatch.setattr(pipeline, "_polish", slow_polish)
    for name in ("_backed_retry", "_failed_retry", "_resolve"):
        monkeypatch.setattr(pipeline, name, no_retry)
    with pytest.warns(pp.PolyprojWarning, match="time_limit reached: not solved again"):
        r = pp.project(X, poly, backend="daqp", time_limit=limit, max_polish_iter=0)  # every point refused
    assert not r.polished.any()
    assert all(s is pp.Status.SOLVED_INACCURATE for s in r.status)  # DAQP's SOLVED, unverified
    np.testing.assert_allclose(r.y, _reference(X, poly).y, rtol=0, atol=1e-8)  # DAQP's own points, kept


# ----------------------------------------------------------------------------- 2. merged statuses
@pytest.mark.filterwarnings("ignore::polyproj.errors.PolyprojWarning")
def test_an_unverified_point_inside_the_polyhedron_keeps_its_backends_status():
    """backend="ipm", max_iter=2: points inside the polyhedron (violation 3e-11) came back NUMERICAL_ERROR: the
    retry chain (ipm, daqp, piqp, clarabel at max_iter=2) merged its last backend's status while the IPM's point
    was kept. The status is now that point's: the IPM's MAX_ITER, NUMERICAL_ERROR only for points outside."""
    rng = np.random.default_rng(7)
    n, m = 10, 20
    x0 = 0.2 * rng.standard_normal(n)
    A = rng.standard_normal((m, n))
    a, B, b, lb, ub = A @ x0 + 0.3, np.ones((1, n)), np.array([x0.sum()]), -np.ones(n), np.ones(n)
    poly = pp.Polyhedron(A=A, a=a, B=B, b=b, lb=lb, ub=ub)
    X = 3 * rng.standard_normal((40, n))[[2, 5, 9, 34]]  # the probe's unverified points (a short polish: fast)
    r = pp.project(X, poly, backend="ipm", max_iter=2, max_polish_iter=5)
    inside = outside = 0
    for y, s, ok in zip(r.y, r.status, r.polished, strict=True):
        if ok:
            continue
        v = _distance_violation(y, A, a, B, b, lb, ub)
        if v <= 1e-9:
            inside += 1
            assert s is pp.Status.MAX_ITER, (s, v)  # the IPM's own status at max_iter=2
        elif v >= 1e-4:
            outside += 1
            assert s is pp.Status.NUMERICAL_ERROR, (s, v)
    assert inside >= 1 and outside >= 1, (inside, outside)


# ----------------------------------------------------------------------------- 3. tiny points
@pytest.mark.parametrize(("scale", "backend"), [(1e-310, "ipm"), (1e-200, "admm")])
def test_tiny_points_with_a_box_raise_no_floating_point_warning(scale, backend):
    """Points of 1e-310 (1e-200) onto {y₀ + y₁ <= 0} in a box of ±1: the unit scale 2^1030 put the box's bounds
    beyond the float64 range (IPM: "overflow encountered in multiply"), and the ADMM's float32 start cast bounds
    of 2^664 ("overflow in cast", a SolverError under -W error). Exact answers, and now no warning."""
    poly = pp.Polyhedron(A=np.array([[1.0, 1.0]]), a=[0.0], lb=[-1, -1], ub=[1, 1])
    X = np.array([[1.0, 2.0], [3.0, -1.0], [-2.0, -1.0]]) * scale
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = pp.project(X, poly, backend=backend)
    over = np.maximum(X.sum(axis=1), 0.0) / 2  # Π(x) = x − max(0, x₀ + x₁)/2 (1, 1): the box is far
    expected = X - over[:, None]
    assert all(s is pp.Status.SOLVED for s in r.status)
    np.testing.assert_allclose(r.y, expected, rtol=1e-12, atol=0)


def test_the_admm_float32_start_takes_bounds_beyond_float32_silently():
    """The ADMM's rough start in float32 with a bound of 1e300 (beyond float32's ~3.4e38: no limit there)."""
    from polyproj.registry import get_backend

    # PolyData as the pipeline hands it over (a Polyhedron reads |v| >= 1e20 as no bound; scaled data need not)
    d = PolyData(np.array([[1.0, 1.0]]), np.array([1.0]), np.zeros((0, 2)), np.zeros(0), np.array([-1e300, -1.0]),
                 np.array([1e300, 1.0]))
    X = np.array([[2.0, 0.5], [-3.0, 0.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st = get_backend("admm").solve_projections(X, d, rough=True)
    # Π: (2, 0.5) → (1.25, −0.25) onto y₀ + y₁ <= 1; (−3, 0) is inside; the start is at its rough accuracy
    np.testing.assert_allclose(st.y, [[1.25, -0.25], [-3.0, 0.0]], atol=2e-2)


# ----------------------------------------------------------------------------- 4. empty samples named
def _per_sample(empty):
    rng = np.random.default_rng(5)
    N, n, m = 6, 4, 5
    X = 2 * rng.standard_normal((N, n))
    A = rng.standard_normal((N, m, n))
    a = np.einsum("bmn,bn->bm", A, 0.2 * rng.standard_normal((N, n))) + 0.3
    for i in empty:  # A₀ y <= a₀ and A₀ y >= a₀ + 1: no point
        A[i, 1], a[i, 1] = -A[i, 0], -a[i, 0] - 1.0
    d = PolyData(A, a, np.zeros((0, n)), np.zeros(0), np.full(n, -np.inf), np.full(n, np.inf))
    return X, pp.sets.Polyhedral(d, "ipm")


@pytest.mark.parametrize("empty", [(2,), (1, 4)])
def test_an_empty_per_sample_polyhedron_flagged_by_the_backend_is_named(empty):
    """Per-sample data with sample 2 empty, which the batched IPM reports PRIMAL_INFEASIBLE: the InfeasibleError
    said "the polyhedron is empty" without naming the sample (docs/architecture.md: the error names it; only the
    LP's path did). The backend's path names the samples no backend found a point of now."""
    X, S = _per_sample(empty)
    with pytest.raises(pp.InfeasibleError) as err:
        S.project(X)
    msg = str(err.value)
    if len(empty) == 1:
        assert f"sample {empty[0]}'s polyhedron is empty" in msg, msg
    else:
        assert "the polyhedra of samples " + ", ".join(map(str, empty)) + " are empty" in msg, msg
    status = err.value.solution.status
    assert [i for i, s in enumerate(status) if s is pp.Status.PRIMAL_INFEASIBLE] == list(empty)
