"""Tests of the batched array-API interior-point method (polyproj.solvers.ipm) and the ipm / cupy backends.

Namespaces: NumPy, torch (CPU) and array_api_strict (which proves only the standard is used, hence
CuPy works). References: ProxSuite at tight tolerance (float64) and KKT conditions from scratch.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import polyproj as pp
from polyproj.solvers.ipm import CODES, code_to_status, solve_qp_batch
from tests.helpers import assert_active_sets_agree_up_to_weak_rows, kkt_distance_bound

torch = pytest.importorskip("torch")
xps = pytest.importorskip("array_api_strict")

NAMESPACES = ["numpy", "torch", "strict"]


def to_ns(ns, a, dtype=np.float64):
    if a is None:
        return None
    a = np.asarray(a, dtype=dtype)
    if ns == "numpy":
        return a
    if ns == "torch":
        return torch.from_numpy(a.copy())
    return xps.asarray(a)


def to_np(a):
    if hasattr(a, "detach"):
        return a.detach().cpu().numpy()
    return np.asarray(a)


def random_qp(rng, n=12, m=18, b=6, *, pd=True):
    """A feasible batch: equality, two-sided, one-sided and free rows, finite and infinite bounds."""
    A = rng.standard_normal((n, n))
    P = A @ A.T / n + (0.1 * np.eye(n) if pd else 0.0)
    C = rng.standard_normal((m, n))
    x0 = rng.uniform(-1, 1, n)
    cx = C @ x0
    l = cx - rng.uniform(0.1, 1.0, m)
    u = cx + rng.uniform(0.1, 1.0, m)
    l[:3] = -np.inf  # upper only
    u[3:6] = np.inf  # lower only
    l[6] = u[6] = cx[6]  # equality
    l[7], u[7] = -np.inf, np.inf  # free row
    lb = np.full(n, -2.0)
    ub = np.full(n, np.inf)
    ub[: n // 2] = 1.5
    q = 3.0 * rng.standard_normal((b, n))
    return P, q, C, l, u, lb, ub


def kkt_residuals(P, q, C, l, u, lb, ub, x, z, zb):
    """Primal residual, dual residual, gap and sign-convention violation (float64, from scratch)."""
    cx = C @ x
    pres = max(np.max(np.maximum(np.maximum(cx - u, l - cx), 0.0), initial=0.0),
               np.max(np.maximum(np.maximum(x - ub, lb - x), 0.0), initial=0.0))
    dres = np.max(np.abs(P @ x + q + C.T @ z + zb), initial=0.0)
    fin = lambda v: np.where(np.isfinite(v), v, 0.0)  # noqa: E731
    gap = abs(x @ P @ x + q @ x + fin(u) @ np.maximum(z, 0) - fin(l) @ np.maximum(-z, 0)
              + fin(ub) @ np.maximum(zb, 0) - fin(lb) @ np.maximum(-zb, 0))
    # sign convention: z > 0 only where u finite, z < 0 only where l finite
    sign = max(np.max(np.maximum(z, 0)[np.isposinf(u)], initial=0.0),
               np.max(np.maximum(-z, 0)[np.isneginf(l)], initial=0.0),
               np.max(np.maximum(zb, 0)[np.isposinf(ub)], initial=0.0),
               np.max(np.maximum(-zb, 0)[np.isneginf(lb)], initial=0.0))
    return pres, dres, gap, sign


def proxsuite_reference(P, q, C, l, u, lb, ub):
    solver = pp.get_backend("proxsuite", eps_abs=1e-11)
    qp = pp.QP(P, q[0], C, l, u, lb, ub)
    return [solver.solve(qp.with_vectors(q=qi)) for qi in q]


# --------------------------------------------------------------------------- random QPs vs ProxSuite
@pytest.mark.parametrize("ns", NAMESPACES)
def test_random_qps_agree_with_proxsuite(ns, rng):
    P, q, C, l, u, lb, ub = random_qp(rng)
    res = solve_qp_batch(*(to_ns(ns, a) for a in (P, q, C, l, u, lb, ub)), eps_abs=1e-9)
    assert [s.name for s in res.statuses()] == ["SOLVED"] * q.shape[0]
    x, z, zb = to_np(res.x), to_np(res.z), to_np(res.z_box)
    refs = proxsuite_reference(P, q, C, l, u, lb, ub)
    for i, ref in enumerate(refs):
        assert ref.status == pp.Status.SOLVED
        pres, dres, gap, sign = kkt_residuals(P, q[i], C, l, u, lb, ub, x[i], z[i], zb[i])
        assert pres <= 1e-9 and dres <= 1e-9 and gap <= 1e-9 and sign == 0.0
        # both inexact: x agrees to the sum of the KKT distance bounds (the multipliers are checked by
        # the residuals above, not against ProxSuite's)
        _assert_close_by_kkt(P, q[i], C, l, u, lb, ub, (x[i], z[i], zb[i]), (ref.x, ref.z, ref.z_box))


@pytest.mark.parametrize("ns", NAMESPACES)
def test_outputs_stay_in_the_input_namespace(ns, rng):
    P, q, C, l, u, lb, ub = random_qp(rng, b=3)
    args = [to_ns(ns, a) for a in (P, q, C, l, u, lb, ub)]
    res = solve_qp_batch(*args)
    kind = type(args[1])
    for a in (res.x, res.z, res.z_box, res.status, res.iterations, res.prim_res):
        assert type(a) is kind
    assert tuple(res.x.shape) == q.shape and tuple(res.z.shape) == (3, C.shape[0])


@pytest.mark.parametrize("b", [4, 40])  # a few elements (per-matrix paths) and a batch (batched kernels)
def test_torch_path_has_no_numpy_round_trip(rng, monkeypatch, b):
    P, q, C, l, u, lb, ub = random_qp(rng, b=b)
    args = [torch.from_numpy(a.copy()) for a in (P, q, C, l, u, lb, ub)]
    expected = solve_qp_batch(P, q, C, l, u, lb, ub)

    def forbidden(*_a, **_k):
        raise AssertionError("a torch tensor was converted to NumPy inside the IPM")

    monkeypatch.setattr(torch.Tensor, "numpy", forbidden)
    monkeypatch.setattr(torch.Tensor, "__array__", forbidden)
    monkeypatch.setattr(torch.Tensor, "tolist", forbidden)
    res = solve_qp_batch(*args)
    monkeypatch.undo()
    assert isinstance(res.x, torch.Tensor) and res.x.dtype == torch.float64
    assert all(s == pp.Status.SOLVED for s in res.statuses())
    # both stop at eps_abs 1e-8 on residuals and gap, possibly at different iterations: each is within its
    # KKT distance bound of the optimum (1.1e-6 was seen), so they agree to the sum of the two bounds
    _assert_within_kkt_bounds(P, q, C, l, u, lb, ub, expected, res)


def _assert_close_by_kkt(P, q, C, l, u, lb, ub, a, b):
    """Two inexact answers ``(x, z, z_box)`` of one QP agree to the sum of their KKT distance bounds."""
    bounds = [kkt_distance_bound(P, q, C, l, u, lb, ub, *(np.asarray(v, float) for v in r)) for r in (a, b)]
    dist = float(np.linalg.norm(np.asarray(a[0], float) - np.asarray(b[0], float)))
    assert dist <= sum(bounds), (dist, bounds)


def _assert_within_kkt_bounds(P, q, C, l, u, lb, ub, a, b):
    """Two inexact batches of answers agree to what their KKT residuals guarantee (tests.helpers)."""
    xa, xb = to_np(a.x), to_np(b.x)
    for i in range(xa.shape[0]):
        qi = q[i] if q.ndim == 2 else q
        bounds = [kkt_distance_bound(P, qi, C, l, u, lb, ub, *(to_np(v)[i] for v in (r.x, r.z, r.z_box)))
                  for r in (a, b)]
        assert np.linalg.norm(xa[i] - xb[i]) <= sum(bounds), (i, np.linalg.norm(xa[i] - xb[i]), bounds)


def test_torch_inputs_requiring_grad_are_accepted(rng):
    P, q, C, l, u, _, _ = random_qp(rng, b=2)
    qt = torch.from_numpy(q.copy()).requires_grad_(True)
    res = solve_qp_batch(torch.from_numpy(P), qt, torch.from_numpy(C), torch.from_numpy(l), torch.from_numpy(u))
    assert not res.x.requires_grad


# --------------------------------------------------------------------------- projections (P = I, q = -x)
@pytest.mark.parametrize("ns", NAMESPACES)
def test_batched_projection_direct_call(ns, rng):
    n, m, b = 15, 30, 40
    A = rng.standard_normal((m - 1, n))
    y0 = rng.standard_normal(n)
    a = A @ y0 + rng.uniform(0.0, 1.0, m - 1)
    Beq = rng.standard_normal((1, n))
    poly = pp.Polyhedron(A=A, a=a, B=Beq, b=Beq @ y0, lb=-3 * np.ones(n), ub=3 * np.ones(n))
    X = 3.0 * rng.standard_normal((b, n))
    Cm, lo, hi, lbv, ubv = poly.constraint_form()
    res = solve_qp_batch(*(to_ns(ns, v) for v in (np.eye(n), -X, Cm, lo, hi, lbv, ubv)), eps_abs=1e-11)
    assert all(s == pp.Status.SOLVED for s in res.statuses())
    ref = pp.project(X, poly, backend="proxsuite", eps_abs=1e-10)  # exact (polished)
    x, z, zb = (to_np(v) for v in (res.x, res.z, res.z_box))
    for i in range(b):
        bound = kkt_distance_bound(np.eye(n), -X[i], Cm, lo, hi, lbv, ubv, x[i], z[i], zb[i])
        assert np.linalg.norm(x[i] - ref.y[i]) <= bound


def test_project_with_ipm_backend_matches_proxsuite_after_polish(rng):
    n, b = 20, 64
    A = rng.standard_normal((2 * n - 1, n))
    y0 = rng.standard_normal(n)
    a = A @ y0 + rng.uniform(0.0, 1.0, 2 * n - 1)
    B = np.ones((1, n))
    poly = pp.Polyhedron(A=A, a=a, B=B, b=B @ y0, lb=-4 * np.ones(n))
    X = 4.0 * rng.standard_normal((b, n))
    r_ipm = pp.project(X, poly, backend="ipm")
    r_ref = pp.project(X, poly, backend="proxsuite")
    assert np.all(r_ipm.polished)
    np.testing.assert_allclose(r_ipm.y, r_ref.y, atol=1e-7)
    assert_active_sets_agree_up_to_weak_rows(poly, r_ref.y, [r_ipm, r_ref])
    assert r_ipm.max_violation <= 1e-9
    assert r_ipm.backend == "ipm"


# --------------------------------------------------------------------------- infeasible / unbounded elements
def infeasible_elements(rng, n, m, b, bad):
    """Shared C with a duplicated row; per-element bounds, empty for the elements ``bad``
    (c·x <= u0 and c·x >= u0 + 1)."""
    C = rng.standard_normal((m, n))
    C[1] = C[0]
    x0 = rng.standard_normal(n)
    l = np.tile(C @ x0 - 1.0, (b, 1))
    u = np.tile(C @ x0 + 1.0, (b, 1))
    for i in bad:
        l[i, 1], u[i, 1] = u[i, 0] + 1.0, u[i, 0] + 2.0
    return C, l, u


def test_primal_infeasible_elements_are_flagged_per_element(rng):
    n, m, b = 8, 12, 5
    C, l, u = infeasible_elements(rng, n, m, b, [2])
    q = rng.standard_normal((b, n))
    for ns in NAMESPACES:
        res = solve_qp_batch(*(to_ns(ns, v) for v in (np.eye(n), q, C, l, u)))
        st = res.statuses()
        assert st[2] == pp.Status.PRIMAL_INFEASIBLE
        assert all(s == pp.Status.SOLVED for i, s in enumerate(st) if i != 2)
        x = to_np(res.x)
        assert np.all(np.isnan(x[2]))
        for i in (0, 1, 3, 4):
            pres, dres, gap, _ = kkt_residuals(np.eye(n), q[i], C, l[i], u[i], -np.inf * np.ones(n),
                                               np.inf * np.ones(n), x[i], to_np(res.z)[i], to_np(res.z_box)[i])
            assert max(pres, dres, gap) <= 1e-8


def test_dual_infeasible_elements_are_flagged_per_element(rng):
    n, m, b = 10, 15, 5
    A = rng.standard_normal((n, n))
    P = A @ A.T / n
    P[-1, :] = 0.0
    P[:, -1] = 0.0  # no curvature along e_n
    C = rng.standard_normal((m, n))
    C[:, -1] = 0.0
    x0 = rng.standard_normal(n)
    l, u = C @ x0 - 1.0, C @ x0 + 1.0
    lb, ub = np.full(n, -5.0), np.full(n, 5.0)
    lb[-1], ub[-1] = 0.0, np.inf  # x_n >= 0 only
    q = rng.standard_normal((b, n))
    q[:, -1] = 1.0
    q[3, -1] = -1.0  # element 3: x_n -> +inf decreases the objective without bound
    res = solve_qp_batch(P, q, C, l, u, lb, ub)
    st = res.statuses()
    assert st[3] == pp.Status.DUAL_INFEASIBLE
    assert all(s == pp.Status.SOLVED for i, s in enumerate(st) if i != 3)
    assert np.all(np.isnan(res.x[3])) and np.all(np.isfinite(res.x[[0, 1, 2, 4]]))


# --------------------------------------------------------------------------- float32
@pytest.mark.parametrize("ns", ["numpy", "torch", "strict"])
def test_float32_inputs(ns, rng):
    P, q, C, l, u, lb, ub = random_qp(rng, b=4)
    res = solve_qp_batch(*(to_ns(ns, a, np.float32) for a in (P, q, C, l, u, lb, ub)))
    assert str(res.x.dtype).endswith("float32")
    assert all(s == pp.Status.SOLVED for s in res.statuses())
    ref = solve_qp_batch(P, q, C, l, u, lb, ub, eps_abs=1e-10)
    scale = 1.0 + np.max(np.abs(ref.x))
    # float32: eps ≈ 1.2e-7, IPM conditioning near the solution costs a few digits
    np.testing.assert_allclose(to_np(res.x).astype(np.float64), ref.x, atol=1e-2 * scale)
    assert np.max(to_np(res.prim_res)) <= 1e-3 * scale


# --------------------------------------------------------------------------- structure
def test_per_sample_P_and_C_and_bounds(rng):
    n, m, b = 6, 9, 4
    Ps = np.stack([(lambda A: A @ A.T / n + 0.05 * np.eye(n))(rng.standard_normal((n, n))) for _ in range(b)])
    Cs = rng.standard_normal((b, m, n))
    x0 = rng.uniform(-1, 1, (b, n))
    x0[2, 0] = 0.25  # feasible by construction, with the fixed variable below
    cx = np.einsum("bmn,bn->bm", Cs, x0)
    l, u = cx - 0.5, cx + 0.5
    l[1, 2] = u[1, 2] = cx[1, 2]  # an equality in element 1 only
    lb = np.full((b, n), -3.0)
    ub = np.full((b, n), 3.0)
    lb[2, 0] = ub[2, 0] = 0.25  # a fixed variable in element 2 only
    q = rng.standard_normal((b, n))
    res = solve_qp_batch(Ps, q, Cs, l, u, lb, ub, eps_abs=1e-9)
    assert all(s == pp.Status.SOLVED for s in res.statuses())
    for i in range(b):
        ref = pp.solve_qp(pp.QP(Ps[i], q[i], Cs[i], l[i], u[i], lb[i], ub[i]), eps_abs=1e-11)
        _assert_close_by_kkt(Ps[i], q[i], Cs[i], l[i], u[i], lb[i], ub[i], (res.x[i], res.z[i], res.z_box[i]),
                             (ref.x, ref.z, ref.z_box))
        pres, dres, gap, sign = kkt_residuals(Ps[i], q[i], Cs[i], l[i], u[i], lb[i], ub[i], res.x[i], res.z[i],
                                              res.z_box[i])
        assert max(pres, dres, gap) <= 1e-9 and sign == 0.0
    assert res.x[2, 0] == pytest.approx(0.25, abs=1e-10)


def test_rank_deficient_equalities_and_lp(rng):
    n, m = 8, 6
    C = rng.standard_normal((m, n))
    C[1] = 2.0 * C[0]  # dependent, consistent equality rows
    x0 = rng.uniform(0.2, 0.8, n)
    l = u = C @ x0
    q = rng.standard_normal((3, n))
    P = np.zeros((n, n))  # an LP
    res = solve_qp_batch(P, q, C, l, u, np.zeros(n), np.ones(n), eps_abs=1e-9)
    assert all(s == pp.Status.SOLVED for s in res.statuses())
    for i in range(3):
        ref = pp.solve_qp(pp.QP(P, q[i], C, l, u, np.zeros(n), np.ones(n)), backend="highs")
        assert q[i] @ res.x[i] == pytest.approx(q[i] @ ref.x, abs=1e-7)
        pres, dres, gap, _ = kkt_residuals(P, q[i], C, l, u, np.zeros(n), np.ones(n), res.x[i], res.z[i],
                                           res.z_box[i])
        assert max(pres, dres, gap) <= 1e-8


def test_no_constraints_and_only_bounds(rng):
    n = 5
    q = rng.standard_normal((3, n))
    res = solve_qp_batch(np.eye(n), q, None, None, None)
    np.testing.assert_allclose(res.x, -q, atol=1e-10)
    res = solve_qp_batch(np.eye(n), q, None, None, None, lb=np.zeros(n), ub=np.ones(n), eps_abs=1e-10)
    np.testing.assert_allclose(res.x, np.clip(-q, 0, 1), atol=1e-8)


def test_chunked_batch_equals_unchunked(rng):
    P, q, C, l, u, lb, ub = random_qp(rng, b=10)
    a = solve_qp_batch(P, q, C, l, u, lb, ub, eps_abs=1e-11)
    c = solve_qp_batch(P, q, C, l, u, lb, ub, batch_chunk=3, eps_abs=1e-11)
    # the cost scaling depends on the chunk's q, so the iterates differ at the tolerance level
    _assert_within_kkt_bounds(P, q, C, l, u, lb, ub, a, c)
    np.testing.assert_array_equal(a.status, c.status)


def test_max_iter_is_a_status_not_solved(rng):
    P, q, C, l, u, lb, ub = random_qp(rng, b=3)
    res = solve_qp_batch(P, q, C, l, u, lb, ub, max_iter=2)
    assert all(s in (pp.Status.MAX_ITER, pp.Status.SOLVED_INACCURATE) for s in res.statuses())
    assert np.all(np.isfinite(res.x))
    assert code_to_status(CODES["TIME_LIMIT"]) == pp.Status.TIME_LIMIT


def test_warm_start_is_accepted(rng):
    P, q, C, l, u, lb, ub = random_qp(rng, b=3)
    a = solve_qp_batch(P, q, C, l, u, lb, ub)
    w = solve_qp_batch(P, q, C, l, u, lb, ub, warm_start={"x": a.x})
    _assert_within_kkt_bounds(P, q, C, l, u, lb, ub, w, a)
    # Mehrotra's start from any x is the same point (the KKT residuals are affine in x): the warm start is not
    # used, and a far one costs nothing (from x0 = 1e12 it took 11-17 iterations more and lost accuracy)
    far = solve_qp_batch(P, q, C, l, u, lb, ub, warm_start={"x": np.full_like(a.x, 1e12)})
    np.testing.assert_array_equal(far.iterations, a.iterations)
    np.testing.assert_array_equal(far.x, a.x)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"q": np.zeros((2, 4))}, "q has 4 columns but P is"),
        ({"l": np.zeros(5)}, "l must have shape"),
        ({"lb": np.zeros((3, 3))}, "lb must have shape"),
        ({"q": np.full((2, 3), np.nan)}, "q contains NaN"),
        ({"C": np.full((2, 3), np.inf)}, "C contains NaN or inf"),
    ],
)
def test_bad_input_is_a_problem_error(kwargs, match):
    args = dict(P=np.eye(3), q=np.zeros((2, 3)), C=np.ones((2, 3)), l=np.zeros(2), u=np.ones(2))
    args.update(kwargs)
    with pytest.raises(pp.ProblemError, match=match):
        solve_qp_batch(**args)


# --------------------------------------------------------------------------- hypothesis: feasible by construction
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 9), m=st.integers(0, 12), b=st.integers(1, 5),
       pd=st.booleans())
def test_property_feasible_qps_are_solved_to_kkt(seed, n, m, b, pd):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, n))
    P = A @ A.T / n + (1e-2 * np.eye(n) if pd else 0.0)
    C = rng.standard_normal((m, n))
    x0 = rng.uniform(-1, 1, n)
    kinds = rng.integers(0, 4, m)  # 0 two-sided, 1 upper, 2 lower, 3 equality
    cx = C @ x0
    l = np.where(kinds == 1, -np.inf, cx - rng.uniform(0, 1, m))
    u = np.where(kinds == 2, np.inf, cx + rng.uniform(0, 1, m))
    l = np.where(kinds == 3, cx, l)
    u = np.where(kinds == 3, cx, u)
    lb, ub = np.full(n, -2.0), np.full(n, 2.0)  # bounded: never dual infeasible
    q = rng.standard_normal((b, n))
    res = solve_qp_batch(P, q, C, l, u, lb, ub, eps_abs=1e-8)
    assert all(s == pp.Status.SOLVED for s in res.statuses())
    for i in range(b):
        pres, dres, gap, sign = kkt_residuals(P, q[i], C, l, u, lb, ub, res.x[i], res.z[i], res.z_box[i])
        assert pres <= 1e-8 and dres <= 1e-8 and gap <= 1e-8 and sign == 0.0


# --------------------------------------------------------------------------- backends
def test_ipm_backend_solve_and_native_batch(rng):
    P, q, C, l, u, lb, ub = random_qp(rng, b=5)
    qp = pp.QP(P, q[0], C, l, u, lb, ub)
    solver = pp.get_backend("ipm", eps_abs=1e-9)
    assert solver.capabilities.batch and solver.capabilities.infeasibility
    sol = solver.solve(qp)
    assert sol.status == pp.Status.SOLVED and sol.backend == "ipm"
    assert max(sol.primal_residual(), sol.dual_residual(), sol.duality_gap()) <= 1e-9
    batch = solver.solve_batch(qp, q=q)
    assert len(batch) == 5 and all(s == pp.Status.SOLVED for s in batch.status)
    for i in range(5):
        s_i = batch.solution(i)
        assert max(s_i.primal_residual(), s_i.dual_residual(), s_i.duality_gap()) <= 1e-9
    torch_solver = pp.get_backend("ipm", namespace="torch", eps_abs=1e-9)
    _assert_within_kkt_bounds(P, q, C, l, u, lb, ub, torch_solver.solve_batch(qp, q=q), batch)


def test_ipm_backend_settings_are_validated():
    with pytest.raises(pp.SettingsError):
        pp.get_backend("ipm", namespace="jax")
    with pytest.raises(pp.SettingsError):
        pp.get_backend("ipm", rho=1.0)


def test_ipm_backend_batch_flags_infeasible_elements(rng):
    n = 4
    qp = pp.QP(np.eye(n), np.zeros(n), C=np.ones((1, n)), l=[0.0], u=[1.0])
    l = np.array([[0.0], [2.0], [0.5]])
    u = np.array([[1.0], [3.0], [0.5]])
    solver = pp.get_backend("ipm")
    sols = solver.solve_batch(qp, q=rng.standard_normal((3, n)), l=l, u=u)
    assert sols.status[0] == pp.Status.SOLVED and sols.status[2] == pp.Status.SOLVED
    assert sols.status[1] == pp.Status.SOLVED  # 2 <= sum(x) <= 3 is feasible
    bad_l = np.array([[0.0], [0.0], [0.0]])
    lb = np.array([[0.0] * n, [1.0] * n, [0.0] * n])
    ub = np.array([[1.0] * n, [1.0] * n, [1.0] * n])
    sols = solver.solve_batch(qp, l=bad_l, lb=lb, ub=ub)  # element 1: x = 1 forces sum(x) = 4 > 1
    assert sols.status[1] == pp.Status.PRIMAL_INFEASIBLE
    assert sols.status[0] == pp.Status.SOLVED and sols.status[2] == pp.Status.SOLVED


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed: gpu_check.sh tests it")
def test_cupy_backend_unavailable_without_cupy():
    info = {r.name: r for r in pp.backend_info()}
    assert not info["cupy"].available and "polyproj[cupy]" in info["cupy"].reason
    with pytest.raises(pp.BackendUnavailable, match=r"polyproj\[cupy\]"):
        pp.get_backend("cupy")


# --------------------------------------------------------------------------- compaction and batch threads
@pytest.mark.parametrize("ns", NAMESPACES)
def test_compacted_batch_keeps_per_element_results(ns, rng):
    """A batch large enough to be compacted as elements finish: infeasible and slow elements are
    carried over to the smaller batches with their state and come back in their own places."""
    n, m, b = 8, 12, 48
    bad = [5, 17, 40]
    C, l, u = infeasible_elements(rng, n, m, b, bad)
    q = rng.standard_normal((b, n)) * np.exp(rng.uniform(-3, 3, (b, 1)))  # spread of iteration counts
    res = solve_qp_batch(*(to_ns(ns, v) for v in (np.eye(n), q, C, l, u)), eps_abs=1e-10)
    st = res.statuses()
    assert [i for i, s in enumerate(st) if s == pp.Status.PRIMAL_INFEASIBLE] == bad
    assert all(s == pp.Status.SOLVED for i, s in enumerate(st) if i not in bad)
    it = to_np(res.iterations)
    assert it.min() < it.max()  # the batch was not uniform, so compaction happened
    x, z, zb = to_np(res.x), to_np(res.z), to_np(res.z_box)
    inf = np.full(n, np.inf)
    for i in range(b):
        if i in bad:
            assert np.all(np.isnan(x[i]))
            continue
        pres, dres, gap, _ = kkt_residuals(np.eye(n), q[i], C, l[i], u[i], -inf, inf, x[i], z[i], zb[i])
        assert max(pres, dres, gap) <= 1e-9 * (1 + np.abs(q[i]).max())


def test_compaction_with_per_sample_P_and_C(rng):
    n, m, b = 6, 9, 32
    Ps = np.stack([(lambda A: A @ A.T / n + 0.05 * np.eye(n))(rng.standard_normal((n, n))) for _ in range(b)])
    Cs = rng.standard_normal((b, m, n))
    x0 = rng.standard_normal((b, n))
    cx = np.einsum("bmn,bn->bm", Cs, x0)
    q = rng.standard_normal((b, n)) * np.exp(rng.uniform(-2, 2, (b, 1)))
    res = solve_qp_batch(Ps, q, Cs, cx - 0.3, cx + 0.3, eps_abs=1e-10)
    assert all(s == pp.Status.SOLVED for s in res.statuses())
    for i in range(0, b, 5):
        one = solve_qp_batch(Ps[i], q[i], Cs[i], cx[i] - 0.3, cx[i] + 0.3, eps_abs=1e-10)
        inf = np.full(n, np.inf)
        _assert_close_by_kkt(Ps[i], q[i], Cs[i], cx[i] - 0.3, cx[i] + 0.3, -inf, inf,
                             (res.x[i], res.z[i], res.z_box[i]), (one.x[0], one.z[0], one.z_box[0]))


@pytest.mark.parametrize("ns", ["numpy", "torch"])
def test_batch_threads_give_the_same_answers(ns, rng):
    n, m, b = 10, 20, 160
    A = rng.standard_normal((m, n))
    y0 = rng.standard_normal(n)
    a = A @ y0 + rng.uniform(0.0, 1.0, m)
    X = 3.0 * rng.standard_normal((b, n))
    args = [to_ns(ns, v) for v in (np.eye(n), -X, A, np.full(m, -np.inf), a)]
    before = torch.get_num_threads()
    # 1e-8: at 1e-9 the normal equations' rounding floor already holds single elements just above the
    # tolerance (then MAX_ITER) with some changes of the linear-algebra path — threads change the parts
    # and compactions, torch's batched triangular solves differ from substitution at ~1e-11 — on 3 of
    # 20 seeds of this problem (a known IPM limitation, docs/ipm.md); at 1e-8 on none
    eps = 1e-8
    one = solve_qp_batch(*args, eps_abs=eps, threads=1)
    two = solve_qp_batch(*args, eps_abs=eps, threads=2)
    assert type(two.x) is type(one.x)
    assert one.statuses() == two.statuses() == (pp.Status.SOLVED,) * b
    # both within ‖x − x*‖² <= 2·gap (P = I) of the solution
    np.testing.assert_allclose(to_np(two.x), to_np(one.x), atol=2.0 * np.sqrt(2.0 * eps) * 1.01)
    assert torch.get_num_threads() == before  # the intra-op setting is restored
    with pytest.raises(pp.ProblemError, match="threads"):
        solve_qp_batch(*args, threads=0)


def test_numpy_path_without_torch_kernels(rng, monkeypatch):
    """With torch loaded the NumPy IPM solves with torch's batched triangular solves; without it,
    by substitution. Both reach the same statuses and KKT points."""
    import sys

    P, q, C, l, u, lb, ub = random_qp(rng, n=14, m=20, b=40)
    kw = dict(eps_abs=1e-8)
    with_torch = solve_qp_batch(P, q, C, l, u, lb, ub, **kw)
    monkeypatch.setitem(sys.modules, "torch", None)
    plain = solve_qp_batch(P, q, C, l, u, lb, ub, **kw)
    assert with_torch.statuses() == plain.statuses() == (pp.Status.SOLVED,) * 40
    for i in range(40):
        for res in (with_torch, plain):
            pres, dres, gap, sign = kkt_residuals(P, q[i], C, l, u, lb, ub, res.x[i], res.z[i], res.z_box[i])
            assert max(pres, dres, gap) <= 1e-7 and sign <= 1e-9
    _assert_within_kkt_bounds(P, q, C, l, u, lb, ub, with_torch, plain)


@pytest.mark.parametrize("ns", NAMESPACES)
def test_adaptive_refinement_and_presolved_predictor(ns, rng, monkeypatch):
    """Refinement steps are taken only while a running element's Newton residual is above
    REFINE_TOL (relative), and with equality rows the predictor is solved in the factorisation's
    pass. Both change rounding only: the same statuses and KKT points as refining always, in every
    namespace; and they save triangular solves (counted on NumPy)."""
    from polyproj.solvers.ipm import kkt

    P, q, C, l, u, lb, ub = random_qp(rng, n=14, m=20, b=24)
    args = [to_ns(ns, v) for v in (P, q, C, l, u, lb, ub)]
    calls = []
    real = kkt.cho_solve

    def counting(xp, L, R):
        calls.append(L.shape[-1])
        return real(xp, L, R)

    monkeypatch.setattr(kkt, "cho_solve", counting)
    out = {}
    for tol in (0.0, kkt.REFINE_TOL):
        monkeypatch.setattr(kkt, "REFINE_TOL", tol)
        calls.clear()
        res = solve_qp_batch(*args, eps_abs=1e-9)
        out[tol] = (res, sum(1 for k in calls if k == 14))
    (always, n_always), (adaptive, n_adaptive) = out.values()
    assert adaptive.statuses() == always.statuses() == (pp.Status.SOLVED,) * 24
    _assert_within_kkt_bounds(P, q, C, l, u, lb, ub, adaptive, always)
    for i in range(24):
        pres, dres, gap, sign = kkt_residuals(P, q[i], C, l, u, lb, ub, *(to_np(a)[i] for a in
                                                                        (adaptive.x, adaptive.z, adaptive.z_box)))
        assert max(pres, dres, gap, sign) <= 1e-8
    if ns != "strict":  # the generic path solves with linalg.solve, not cho_solve
        assert 0 < n_adaptive < n_always


@pytest.mark.parametrize("ns", NAMESPACES)
def test_shared_start_by_one_eigendecomposition(ns, rng, monkeypatch):
    """With C shared, P shared, diagonal and definite, and one constraint pattern, the starting step's
    K of every element is S + c_i P: one eigendecomposition replaces the batch of Cholesky
    factorisations. Same statuses, iterations (in total) and KKT points as the Cholesky start; a
    per-element pattern (or a singular P) takes the Cholesky start."""
    from polyproj.solvers.ipm import kkt

    n, m, b = 10, 16, 40
    _, q, C, l, u, lb, ub = random_qp(rng, n=n, m=m, b=b)
    P = np.diag(rng.uniform(0.5, 3.0, n))
    args = [to_ns(ns, v) for v in (P, q, C, l, u, lb, ub)]
    used = []

    class Spy(kkt.EigFactor):
        def __init__(self, *a):
            used.append(1)
            super().__init__(*a)

    monkeypatch.setattr(kkt, "EigFactor", Spy)
    eig = solve_qp_batch(*args, eps_abs=1e-9)
    assert used
    monkeypatch.setattr(kkt, "EIG_MIN_BATCH", 10**9)
    chol = solve_qp_batch(*args, eps_abs=1e-9)
    assert eig.statuses() == chol.statuses() == (pp.Status.SOLVED,) * b
    # rounding differences may cost an element near the precision floor an iteration or two
    assert abs(int(np.sum(to_np(eig.iterations))) - int(np.sum(to_np(chol.iterations)))) <= 0.05 * b * 10
    _assert_within_kkt_bounds(P, q, C, l, u, lb, ub, eig, chol)  # an IPM stops inside
    for i in range(b):
        r = kkt_residuals(P, q[i], C, l, u, lb, ub, *(to_np(a)[i] for a in (eig.x, eig.z, eig.z_box)))
        assert max(r) <= 1e-8
    monkeypatch.setattr(kkt, "EIG_MIN_BATCH", 32)
    used.clear()
    u2 = np.tile(u, (b, 1))
    u2[0, 0] = np.inf  # element 0 has a different pattern
    solve_qp_batch(*[to_ns(ns, v) for v in (P, q, C, l, u2, lb, ub)], eps_abs=1e-9)
    P0 = P.copy()
    P0[0, 0] = 0.0
    solve_qp_batch(*[to_ns(ns, v) for v in (P0, q, C, l, u, lb, ub)], eps_abs=1e-9)
    assert not used


@pytest.mark.parametrize("ns", NAMESPACES)
def test_small_batches_are_compacted(ns, rng, monkeypatch):
    """Compaction goes down to batches of 2 (a few slow elements no longer drag the finished ones
    through their iterations), with the merge done on the device; answers as without compaction."""
    from polyproj.solvers.ipm import batch, iteration

    P, q, C, l, u, lb, ub = random_qp(rng, b=8)
    args = [to_ns(ns, v) for v in (P, q, C, l, u, lb, ub)]
    sizes = []
    real = iteration.run

    def spy(xp, qp, *a, **k):
        sizes.append(qp.q.shape[0])
        return real(xp, qp, *a, **k)

    monkeypatch.setattr(iteration, "run", spy)
    res = solve_qp_batch(*args, eps_abs=1e-9)
    assert sizes[0] == 8 and len(sizes) > 1 and sizes[-1] < 8
    monkeypatch.setattr(batch, "COMPACT_MIN", 10**9)
    whole = solve_qp_batch(*args, eps_abs=1e-9)
    assert res.statuses() == whole.statuses() == (pp.Status.SOLVED,) * 8
    # other batch shapes take other linear-algebra paths: iteration counts and iterates may differ at
    # the tolerance level, so the answers agree to what the KKT residuals guarantee
    _assert_within_kkt_bounds(P, q, C, l, u, lb, ub, res, whole)


def test_automatic_thread_count_keeps_small_parts_on_one_thread(monkeypatch):
    """threads=None: below n 64 a thread needs a part with at least THREAD_MIN_SIZE array entries
    (small parts are dominated by per-operation costs that hold the GIL); explicit counts are kept."""
    from polyproj import runtime
    from polyproj.solvers.ipm.batch import workers

    monkeypatch.setattr(runtime, "cpu_count", lambda: 2)
    q = np.zeros((1, 1))
    assert workers(np, q, 1024, None, n=20, m=40) == 1  # parts of 512 x 60 entries
    assert workers(np, q, 2048, None, n=20, m=40) == 2
    assert workers(np, q, 128, None, n=100, m=200) == 2  # factorisations dominate
    assert workers(np, q, 1024, 2, n=20, m=40) == 2  # asked for
    assert workers(np, q, 100, None, n=100, m=200) == 1  # fewer than 64 a thread


def test_float32_numpy_batch_raises_no_runtime_warnings():
    """float32 iterates at their limits overflow in NumPy's kernels; the IPM's statuses and masks handle them,
    but the RuntimeWarnings made the solve fail under -W error (pytest's filterwarnings = error)."""
    import warnings

    rng = np.random.default_rng(4)
    n, m, b = 10, 20, 9
    C = rng.standard_normal((m, n))
    x0 = rng.standard_normal(n)
    u = C @ x0 + rng.random(m)
    l = np.full(m, -np.inf)
    l[:4] = u[:4]
    L = rng.standard_normal((n, n))
    P = L @ L.T / n + 0.01 * np.eye(n)
    Q = 3 * rng.standard_normal((b, n))
    args = [a.astype(np.float32) for a in (P, Q, C, l, u, -2 * np.ones(n), 2 * np.ones(n))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = solve_qp_batch(*args, eps_abs=1e-6)
    assert all(s.name == "SOLVED" for s in res.statuses())


def test_float32_array_api_strict_batch_raises_no_runtime_warnings():
    """The same for array_api_strict, which runs NumPy's kernels underneath: the warnings were silenced for the
    NumPy namespace only, and under -W error the solve raised (a probe)."""
    import warnings

    xs = pytest.importorskip("array_api_strict")
    rng = np.random.default_rng(0)
    n, m, b = 5, 6, 40
    C, u, Q = rng.standard_normal((m, n)), rng.random(m) + 0.1, 3 * rng.standard_normal((b, n))
    l = np.full(m, -np.inf)
    l[0] = u[0] = 0.2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = solve_qp_batch(*(xs.asarray(a, dtype=xs.float32) for a in (np.eye(n), Q, C, l, u)))
    assert all(s.name == "SOLVED" for s in res.statuses())


def test_crossing_bounds_are_refused_by_the_batch_solver():
    """solve_qp_batch with lb > ub (or a side at the wrong infinity) ran 100 iterations and said MAX_ITER; the
    QP path refuses such data when built: so does the batch solver now."""
    for lo, hi in (([1.0], [0.0]), ([np.inf], [np.inf]), ([-np.inf], [-np.inf])):
        with pytest.raises(pp.ProblemError, match="crossing or infinite sides"):
            solve_qp_batch(np.eye(1), np.zeros((1, 1)), None, None, None, lo, hi)
    with pytest.raises(pp.ProblemError, match="l <= u"):
        solve_qp_batch(np.eye(1), np.zeros((2, 1)), np.ones((1, 1)), [[0.0], [2.0]], [[1.0], [1.0]], None, None)


def test_batch_solver_input_errors_name_the_problem():
    """A q of the wrong width was blamed on P; an empty batch of per-element matrices raised a bare ValueError;
    NumPy beside torch a bare TypeError from array_api_compat."""
    with pytest.raises(pp.ProblemError, match=r"q has 4 columns but P is 3 × 3"):
        solve_qp_batch(np.eye(3), np.zeros((2, 4)), None, None, None, None, None)
    res = solve_qp_batch(np.zeros((0, 3, 3)), np.zeros((0, 3)), np.zeros((0, 2, 3)), None, np.zeros((0, 2)),
                         None, None)
    assert res.x.shape == (0, 3) and len(res.statuses()) == 0
    torch = pytest.importorskip("torch")
    with pytest.raises(pp.ProblemError, match="one array library"):
        solve_qp_batch(torch.eye(3, dtype=torch.float64), np.zeros((2, 3)), None, None, None, None, None)


def test_an_unfinished_element_returns_the_closest_point_it_passed(rng):
    """MAX_ITER / TIME_LIMIT returned the last iterate, which near the precision floor can be worse than one
    passed before (a new user's n 300 QP: dual residual 1.4e-7 returned after 1.2e-8). The point returned is
    now the closest to the tolerances: with one more iteration allowed it is never further (eps_abs 1e-14,
    which no iterate meets, so every run ends MAX_ITER)."""
    P, q, C, l, u, lb, ub = random_qp(rng, n=20, m=30, b=4)
    eps = 1e-14
    prev = None
    for k in range(2, 16):
        res = solve_qp_batch(P, q, C, l, u, lb, ub, eps_abs=eps, eps_rel=0.0, max_iter=k)
        dist = np.maximum(np.maximum(res.prim_res, res.dual_res), res.gap)
        assert np.all(np.isfinite(dist))
        if prev is not None:
            assert np.all(dist <= prev), (k, dist, prev)
        prev = dist


def test_solve_qp_batch_names_its_bad_arguments():
    """Each of these ran (a silent MAX_ITER, a setting ignored, a warm start dropped) or raised a raw
    AttributeError / ValueError from inside the solver."""
    P, q, C = np.eye(2), np.array([[1.0, -1.0]]), np.array([[1.0, 1.0]])
    args = (P, q, C, np.array([-1.0]), np.array([1.0]))
    for kw, what in ((dict(batch_chunk=-1), "batch_chunk must be an integer"),
                     (dict(batch_chunk=0), "batch_chunk must be an integer"),
                     (dict(eps_abs=0.0, eps_rel=0.0), "both 0"),
                     (dict(eps_abs=-1.0), "eps_abs must be a finite number >= 0"),
                     (dict(eps_abs=float("nan")), "eps_abs must be a finite number >= 0"),
                     (dict(time_limit=float("nan")), "time_limit must be"),
                     (dict(max_iter=-5), "max_iter must be an integer"),
                     (dict(warm_start={"x": torch.zeros(1, 2, dtype=torch.float64)}), "warm_start x is a torch"),
                     (dict(warm_start=np.zeros((1, 2))), "warm_start must be a dict or an object with x")):
        with pytest.raises(pp.ProblemError, match=what):
            solve_qp_batch(*args, **kw)
    with pytest.raises(pp.ProblemError, match="l <= u must hold"):  # +1e20 reads as +inf, as QP reads it
        solve_qp_batch(P, q, C, np.array([1e20]), np.array([np.inf]))
    res = solve_qp_batch([[1.0, 0.0], [0.0, 1.0]], [[1.0, -1.0]], [[1.0, 1.0]], [-1.0], [1.0])  # lists: NumPy's
    assert res.statuses() == (pp.Status.SOLVED,)


def test_a_singular_system_on_the_generic_namespace_path_is_a_status():
    """On namespaces other than NumPy and torch (``array_api_strict``, CuPy) the KKT solve is the standard's
    ``linalg.solve``, which raises for a singular element: NumPy's LinAlgError came out of ``pp.project`` (a row
    of norm 1.4e8 against points at 1e6). The batch is solved element by element then, failures as NaN that the
    iteration reports; the projection matches NumPy's."""
    xs = pytest.importorskip("array_api_strict")
    poly = pp.Polyhedron(A=np.array([[1e8, 1e8, 0.0, 0.0]]), a=[1e8])
    X = np.array([[3e6, 1e6, 0.0, 0.0]])
    ref = pp.project(X, poly, backend="ipm").y
    got = pp.project(xs.asarray(X), poly, backend="ipm").y
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-12)


def test_solve_qp_batch_refuses_what_it_cannot_solve_with_problem_errors():
    """n = 0 raised ZeroDivisionError (the batch's parts are sized by n²), P = None AttributeError, arrays on two
    devices the namespace's ValueError from deep inside."""
    with pytest.raises(pp.ProblemError, match="no variables"):
        solve_qp_batch(np.zeros((0, 0)), np.zeros((2, 0)), None, None, None)
    with pytest.raises(pp.ProblemError, match="P is required"):
        solve_qp_batch(None, np.ones((2, 3)), None, None, None)
    d1 = xps.Device("device1")
    with pytest.raises(pp.ProblemError, match="one device"):
        solve_qp_batch(xps.eye(3, dtype=xps.float64), xps.ones((2, 3), dtype=xps.float64, device=d1), None, None, None)


def test_float32_floor_follows_the_terms_at_the_point_not_an_inactive_box():
    """float32: the tolerances were floored at 1e3 eps32 (1 + max|q|, max|finite bound|): an inactive box at ±1e4
    .. ±1e6 made the floor 1.2 .. 120 and points 0.21 .. 5.2 off were SOLVED. The floor scales with each residual's
    own terms at the point now."""
    torch = pytest.importorskip("torch")
    P, q = torch.eye(3, dtype=torch.float32), torch.tensor([[-3.0, -3.0, 5.0]])
    C, u = torch.tensor([[1.0, 1.0, 0.0]]), torch.tensor([1.0])
    for box in (1e3, 1e4, 1e6):
        lb, ub = torch.full((3,), -box), torch.full((3,), box)
        res = solve_qp_batch(P, q, C, torch.tensor([-float("inf")]), u, lb, ub)
        assert code_to_status(int(res.status[0])).ok
        np.testing.assert_allclose(res.x[0].numpy(), [0.5, 0.5, -5.0], atol=1e-3)


def test_a_one_dimensional_c_is_one_row_and_meta_tensors_are_named():
    """solve_qp_batch read a 1-D C with C.shape[-2] (IndexError; polyproj.QP reads it as one row) and met torch
    meta tensors with a RuntimeError from .item() (a probe)."""
    one = solve_qp_batch(np.eye(3), np.ones((2, 3)), np.ones(3), [-1.0], [1.0])
    two = solve_qp_batch(np.eye(3), np.ones((2, 3)), np.ones((1, 3)), [-1.0], [1.0])
    np.testing.assert_array_equal(one.x, two.x)
    assert all(s is pp.Status.SOLVED for s in one.statuses())
    torch = pytest.importorskip("torch")
    with pytest.raises(pp.ProblemError, match="'meta' device"):
        solve_qp_batch(torch.eye(3, device="meta"), torch.ones(2, 3, device="meta"), None, None, None)
