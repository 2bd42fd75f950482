"""GPU code off the default device (a probe, session 54): array_api_strict's extra devices stand in for a GPU.

``"device1"`` / ``"device2"`` refuse NumPy conversion and mixing, as CuPy and CUDA tensors do; ``"no_float64"`` is
torch's MPS; ``"no_x64"`` has no int64 (JAX's default).
"""

from __future__ import annotations

import numpy as np
import pytest

import polyproj as pp
from polyproj.linalg import cholesky
from polyproj.projection.faces import put_rows
from polyproj.solvers.ipm import solve_qp_batch

xs = pytest.importorskip("array_api_strict")
CPU, D1, D2 = xs.Device("CPU_DEVICE"), xs.Device("device1"), xs.Device("device2")
NF, NX = xs.Device("no_float64"), xs.Device("no_x64")


def host(a):
    return np.asarray(a.to_device(CPU)) if hasattr(a, "to_device") and not isinstance(a, np.ndarray) else a


def _polyhedron(seed=0, n=6):
    rng = np.random.default_rng(seed)
    C, u = rng.standard_normal((6, n)), rng.random(6) + 0.1
    return pp.Polyhedron(A=C[1:], a=u[1:], B=C[:1], b=u[:1]), rng


# ----------------------------------------------------------------------------- put_rows: unsorted indices
def test_put_rows_takes_rows_in_the_order_of_idx_on_every_namespace():
    """The generic branch (CuPy, array_api_strict) gave the rows of ``part`` to the rows of ``full`` in row order, not
    in idx's: with idx [2, 0] row 0 received part's first row (meant for row 2)."""
    full, part, idx = np.zeros((4, 2)), np.array([[1.0, 1.0], [2.0, 2.0]]), np.array([2, 0])
    want = put_rows(np, full, idx, part)
    np.testing.assert_array_equal(want, [[2.0, 2.0], [0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    got = put_rows(xs, xs.asarray(full, device=D1), xs.asarray(idx, device=D1), xs.asarray(part, device=D1))
    np.testing.assert_array_equal(host(got), want)


@pytest.mark.parametrize("dev", [CPU, D1], ids=["cpu", "device1"])
def test_partial_matching_backward_off_numpy_matches_numpy(dev):
    """A PartialMatching batch with several dependent faces: their eigen parts are merged unsorted ([1, 3, 5, 2, 0, 4])
    and ``J g`` of sample 0 came out 1.2 off (sample 5: 0.15) on array_api_strict — CuPy takes the same branch."""
    S = pp.sets.PartialMatching(3, 4, max_matches=2.5)
    rng = np.random.default_rng(1)
    X = rng.standard_normal((6, S.n)).astype(np.float32).astype(np.float64)
    X[::2] *= 1e5
    G = rng.standard_normal((6, S.n))
    ref = pp.project(X, S)
    gref = S.vjp(ref, G)
    r = pp.project(xs.asarray(X, device=dev), S)
    g = S.vjp(r, xs.asarray(G, device=dev))
    assert g.device == dev
    np.testing.assert_allclose(host(r.y), ref.y, atol=1e-12)
    np.testing.assert_allclose(host(g), gref, atol=1e-10)
    # the degeneracy report agrees too (every face had been called dependent off NumPy)
    np.testing.assert_array_equal(host(r.degenerate.dependent), np.asarray(ref.degenerate.dependent))


def test_cholesky_off_numpy_marks_only_the_failed_elements():
    """array_api_strict's linalg.cholesky raises for the whole batch: every element had been reported failed."""
    K = np.stack([np.eye(3) * 2.0, np.diag([1.0, -1.0, 1.0]), np.array([[4.0, 2, 0], [2, 3, 0], [0, 0, 1]])])
    for n_pad in (0, 20):  # the entrywise recurrence (small) and the per-element factorisations (larger)
        Kp = np.stack([np.block([[k, np.zeros((3, n_pad))], [np.zeros((n_pad, 3)), np.eye(n_pad)]]) for k in K])
        L, ok = cholesky(xs, xs.asarray(Kp, device=D1))
        np.testing.assert_array_equal(host(ok), [True, False, True])
        Lh = host(L)
        for i in (0, 2):
            np.testing.assert_allclose(Lh[i] @ Lh[i].T, Kp[i], atol=1e-12)
        np.testing.assert_array_equal(Lh[1], np.eye(3 + n_pad))


# ----------------------------------------------------------------------------- arrays off the host as inputs
def test_hs_functions_read_active_and_v_off_the_host():
    """pp.hs_vjp / hs_jacobian on a projection of device arrays raised array_api_strict's RuntimeError (CuPy's
    TypeError): np.asarray of an array off the host."""
    poly, rng = _polyhedron()
    X, V = rng.standard_normal((5, 6)), rng.standard_normal((5, 6))
    ref = pp.project(X, poly)
    r = pp.project(xs.asarray(X, device=D1), poly)
    np.testing.assert_array_equal(host(r.active), ref.active)
    g = pp.hs_vjp(poly, r.active, xs.asarray(V, device=D1))
    assert isinstance(g, np.ndarray) and g.dtype == np.float64
    np.testing.assert_allclose(g, pp.hs_vjp(poly, ref.active, V), atol=1e-12)
    np.testing.assert_allclose(pp.hs_jacobian(poly, r.active), pp.hs_jacobian(poly, ref.active), atol=1e-12)
    g32 = pp.hs_vjp(poly, r.active, xs.asarray(V, device=NF, dtype=xs.float32))
    assert g32.dtype == np.float32


@pytest.mark.parametrize("shape", [(), (5,)])
def test_a_total_on_another_device_is_moved_to_the_points(shape):
    """A total on device2 with points on device1 raised the namespace's RuntimeError (np.asarray of it)."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((5, 6))
    t = np.full(shape, 1.5) if shape == () else np.linspace(1.0, 2.0, 5)
    for cls in (pp.sets.Simplex, pp.sets.CappedSimplex):
        args = (0.6,) if cls is pp.sets.CappedSimplex else ()
        S = cls(6, xs.asarray(t, device=D2), *args)
        r = pp.project(xs.asarray(X, device=D1), S)
        assert r.y.device == D1
        ref = np.stack([pp.project(X[i], cls(6, float(np.broadcast_to(t, (5,))[i]), *args)).y for i in range(5)])
        np.testing.assert_allclose(host(r.y), ref, atol=1e-12)


def test_a_cotangent_on_another_device_is_moved_to_the_result():
    """S.vjp(result on device1, G on device2) failed inside the set with the namespace's ValueError."""
    poly, rng = _polyhedron(3)
    for S in (pp.sets.Polyhedral(poly), pp.sets.Simplex(6), pp.sets.Birkhoff(3)):
        X, G = rng.standard_normal((4, S.n)), rng.standard_normal((4, S.n))
        r = pp.project(xs.asarray(X, device=D1), S)
        g = S.vjp(r, xs.asarray(G, device=D2))
        assert g.device == D1
        np.testing.assert_allclose(host(g), S.vjp(pp.project(X, S), G), atol=1e-10)


def test_box_bounds_given_on_a_device():
    """Box(lb=<device array>) raised array_api_strict's RuntimeError (CuPy: TypeError) from np.asarray."""
    X = np.random.default_rng(4).standard_normal((3, 5))
    S = pp.sets.Box(xs.asarray(np.full(5, -0.3), device=D1), xs.asarray(np.full(5, 0.3), device=D2))
    r = pp.project(xs.asarray(X, device=D1), S)
    assert r.y.device == D1
    np.testing.assert_array_equal(host(r.y), np.clip(X, -0.3, 0.3))


# ----------------------------------------------------------------------------- devices that lack a dtype
def test_a_device_without_int64_is_a_problem_error():
    """Every projection and the raw IPM raised the namespace's ValueError (int64 indices) on "no_x64"."""
    poly, rng = _polyhedron()
    X = xs.asarray(rng.standard_normal((3, 6)).astype(np.float32), device=NX)
    for S in (poly, pp.sets.Simplex(6), pp.sets.Box(-1.0, 1.0, n=6)):
        with pytest.raises(pp.ProblemError, match="no int64"):
            pp.project(X, S)
    with pytest.raises(pp.ProblemError, match="no int64"):
        solve_qp_batch(xs.eye(6, dtype=xs.float32, device=NX), X, None, None, None)


def test_integer_points_on_a_device_without_float64_are_solved_in_float32():
    """Integer inputs were cast to float64, which the device refuses (the namespace's ValueError)."""
    poly, _ = _polyhedron()
    Xi = np.array([[1, 2, 3, 0, -1, 2], [0, 0, 1, 1, 0, 0]])
    for S in (pp.sets.Simplex(6), poly):
        r = pp.project(xs.asarray(Xi, device=NF), S)
        assert r.y.dtype == xs.float32 and r.y.device == NF
        np.testing.assert_allclose(host(r.y), pp.project(Xi.astype(np.float64), S).y, atol=1e-5)
    res = solve_qp_batch(xs.eye(3, dtype=xs.int32, device=NF), xs.ones((2, 3), dtype=xs.int32, device=NF),
                         None, None, None)
    assert res.x.dtype == xs.float32 and all(s is pp.Status.SOLVED for s in res.statuses())
    np.testing.assert_allclose(host(res.x), -np.ones((2, 3)), atol=1e-4)


@pytest.mark.parametrize("name", ["birkhoff", "matching", "simplex", "capped", "capped_per_sample"])
def test_far_float32_points_on_a_device_without_float64(name):
    """Far float32 samples are solved in float64 (float32 faces are wrong there): on a device without float64 that
    raised the namespace's ValueError (Birkhoff from |x| 1024). They are solved on the host now: the float64
    projection of the float32 points, rounded, with the float64 backward."""
    rng = np.random.default_rng(5)
    totals = np.linspace(1.0, 4.0, 6).astype(np.float32)
    sets = {"birkhoff": lambda t: pp.sets.Birkhoff(4),
            "matching": lambda t: pp.sets.PartialMatching(3, 4, max_matches=2.5),
            "simplex": lambda t: pp.sets.Simplex(8, 3.0), "capped": lambda t: pp.sets.CappedSimplex(8, 3.0, 0.7),
            "capped_per_sample": lambda t: pp.sets.CappedSimplex(8, t, 0.7)}
    S_dev, S_ref = sets[name](xs.asarray(totals, device=NF)), sets[name](totals.astype(np.float64))
    X = rng.standard_normal((6, S_ref.n)).astype(np.float32)
    X[::2] *= 1e5  # far and near samples in one batch
    G = rng.standard_normal((6, S_ref.n)).astype(np.float32)
    r = pp.project(xs.asarray(X, device=NF), S_dev)
    assert r.y.dtype == xs.float32 and r.y.device == NF and r.multipliers.device == NF
    assert all(s is pp.Status.SOLVED for s in r.status)
    ref = pp.project(X.astype(np.float64), S_ref)
    np.testing.assert_allclose(host(r.y), ref.y, atol=1e-6)
    np.testing.assert_array_equal(host(r.active), ref.active)
    g = S_dev.vjp(r, xs.asarray(G, device=NF))
    assert g.dtype == xs.float32 and g.device == NF
    np.testing.assert_allclose(host(g), S_ref.vjp(ref, G.astype(np.float64)), atol=1e-5)


def test_a_warm_start_from_another_device():
    """Polyhedral.project_batch(X on device1, warm_start=a result on device2) raised the namespace's ValueError (a
    NumPy result was already moved)."""
    poly, rng = _polyhedron(6)
    S = pp.sets.Polyhedral(poly)
    X = rng.standard_normal((5, 6))
    warm = S.project_batch(xs.asarray(X, device=D2))
    r = S.project_batch(xs.asarray(X, device=D1), warm_start=warm)
    assert r.y.device == D1
    np.testing.assert_allclose(host(r.y), pp.project(X, poly).y, atol=1e-12)
