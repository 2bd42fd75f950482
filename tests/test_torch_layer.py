"""The torch projection layer: exactness, HS-Jacobian gradients (gradcheck), batching, errors, training."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import polyproj as pp  # noqa: E402
from polyproj.adapters.torch import ProjectionLayer, choose_backend, project  # noqa: E402
from tests.helpers import random_polytope  # noqa: E402

BACKENDS = ["admm", "ipm", "proxsuite"] + [b for b in ("osqp", "highs") if b in pp.available_backends()]


def _polytope(rng, n=6, m=8, p=1, box=True):
    x0 = rng.normal(size=n)
    A = rng.normal(size=(m, n))
    a = A @ x0 + rng.uniform(0.2, 1.0, size=m)
    B = rng.normal(size=(p, n))
    lb, ub = (x0 - 1.5, x0 + 1.5) if box else (None, None)
    return pp.Polyhedron(A=A, a=a, B=B, b=B @ x0, lb=lb, ub=ub)


def _nondegenerate_point(P, rng, scale=2.0, margin=1e-3, tries=200):
    """x whose projection has strictly complementary multipliers and well-separated inactive rows."""
    for _ in range(tries):
        x = scale * rng.normal(size=P.n) + P.lb.clip(-1e9, 1e9) * 0
        res = pp.project(x, P)
        slack = P.ineq_slack(res.y)[0]
        lam = res.multipliers[: P.n_ineq]
        act = res.active
        if np.all(lam[act] > margin) and np.all(slack[~act] > margin) and act.sum() >= 1:
            return x, res
    raise AssertionError("no non-degenerate point found")


def _tensors(P, dtype=torch.float64, requires_grad=False):
    def t(v):
        return torch.tensor(v, dtype=dtype, requires_grad=requires_grad)

    return dict(A=t(P.A), a=t(P.a), B=t(P.B), b=t(P.b), lb=t(P.lb), ub=t(P.ub))


# ----------------------------------------------------------------------------- forward
@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_matches_pp_project_and_is_feasible(backend, rng):
    P = _polytope(rng, n=12, m=20, p=2)
    X = 2.5 * rng.normal(size=(16, P.n))
    ref = pp.project(X, P)
    y = project(torch.tensor(X), backend=backend, **_tensors(P))
    assert y.dtype == torch.float64 and y.shape == (16, P.n)
    assert np.max(np.abs(y.numpy() - ref.y)) < 1e-9
    assert P.violation(y.numpy()).max() < 1e-10


@pytest.mark.parametrize("start_dtype", ["float32", "float64"])
def test_admm_start_dtype_only_changes_the_start(start_dtype, rng):
    # the ADMM (float32 by default) only identifies the face; the polished result is float64-exact,
    # also with a zero row of A (its row scaling must not underflow in float32)
    P = _polytope(rng, n=12, m=20, p=2)
    A = np.vstack([P.A, np.zeros((1, P.n))])
    P = pp.Polyhedron(A=A, a=np.append(P.a, 1.0), B=P.B, b=P.b, lb=P.lb, ub=P.ub)
    X = 2.5 * rng.normal(size=(16, P.n))
    ref = pp.project(X, P)
    y = project(torch.tensor(X), backend="admm", start_dtype=start_dtype, **_tensors(P))
    assert y.dtype == torch.float64
    assert np.max(np.abs(y.numpy() - ref.y)) < 1e-9
    with pytest.raises(pp.SettingsError, match="start_dtype"):
        project(torch.tensor(X), backend="admm", start_dtype="float16", **_tensors(P))


def test_leading_batch_dims_and_single_point(rng):
    P = _polytope(rng)
    X = rng.normal(size=(2, 3, P.n)) * 2
    y = project(torch.tensor(X), **_tensors(P))
    assert y.shape == (2, 3, P.n)
    ref = pp.project(X.reshape(6, P.n), P).y.reshape(2, 3, P.n)
    assert np.max(np.abs(y.numpy() - ref)) < 1e-9
    y1 = project(torch.tensor(X[0, 0]), **_tensors(P))
    assert y1.shape == (P.n,) and np.max(np.abs(y1.numpy() - ref[0, 0])) < 1e-9


def test_float32(rng):
    P = _polytope(rng, n=10, m=15)
    X = 2 * rng.normal(size=(8, P.n))
    x = torch.tensor(X, dtype=torch.float32, requires_grad=True)
    y = project(x, **_tensors(P, torch.float32))
    assert y.dtype == torch.float32
    assert P.violation(y.detach().double().numpy()).max() < 1e-5
    assert np.max(np.abs(y.detach().double().numpy() - pp.project(X.astype(np.float32).astype(float), P).y)) < 1e-5
    (y * torch.arange(P.n, dtype=torch.float32)).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.dtype == torch.float32


@pytest.mark.parametrize("bounds", ["none", "lower", "partial"])
def test_admm_without_some_bounds_matches_pp_project(bounds, rng):
    """The ADMM drops its bound rows when no coordinate has a finite bound and keeps all of them
    otherwise (infinite ones never clip): both start the exact polish."""
    n, m = 15, 30
    x0 = rng.normal(size=n)
    A = rng.normal(size=(m, n))
    a = A @ x0 + rng.uniform(0.1, 1.0, size=m)
    B = rng.normal(size=(1, n))
    lb = {"none": None, "lower": x0 - 1.0, "partial": np.where(rng.random(n) < 0.5, x0 - 1.0, -np.inf)}[bounds]
    P = pp.Polyhedron(A=A, a=a, B=B, b=B @ x0, lb=lb)
    X = x0 + 3.0 * rng.normal(size=(40, n))
    ref = pp.project(X, P, eps_abs=1e-10)
    t = _tensors(P)
    if bounds == "none":
        t["lb"] = t["ub"] = None
    y = project(torch.tensor(X), backend="admm", **t)
    assert np.max(np.abs(y.numpy() - ref.y)) < 1e-9
    assert P.violation(y.numpy()).max() < 1e-10


@pytest.mark.parametrize("bounds", [True, False])
def test_admm_torch_loop_gives_the_generic_iterates_bitwise(bounds, rng, monkeypatch):
    """The torch loop with views bound once per check interval is the generic step, operation for operation."""
    from polyproj.solvers import admm

    P = random_polytope(rng, 12, 24, 1, bounds=bounds)
    X = torch.tensor(3.0 * rng.normal(size=(32, 12)))
    fast = pp.project(X, P, backend="admm", polish=False).y

    def generic(S, k, Kq, it, buf, count):
        for _ in range(count):
            admm._step(S, k, Kq, it, buf)

    monkeypatch.setattr(admm, "_steps", generic)
    assert torch.equal(fast, pp.project(X, P, backend="admm", polish=False).y)


@pytest.mark.parametrize("bounds", [True, False])
def test_admm_numpy_loop_equals_the_generic_step(bounds, rng):
    """The NumPy loop (regrouped: α C scaled once, β z + s formed before the products) gives the generic
    step's iterates up to rounding, and the same start through the backend."""
    from polyproj.solvers import admm

    P = random_polytope(rng, 12, 24, 1, bounds=bounds)
    n = 12
    C = np.vstack([P.A, P.B])
    N = 32
    lo = np.concatenate([np.full((24, N), -np.inf), np.repeat(P.b[:, None], N, axis=1)]
                        + ([np.repeat(P.lb[:, None], N, axis=1)] if bounds else []))
    hi = np.concatenate([np.repeat(P.a[:, None], N, axis=1), np.repeat(P.b[:, None], N, axis=1)]
                        + ([np.repeat(P.ub[:, None], N, axis=1)] if bounds else []))
    nb = n if bounds else 0
    S = admm.setup(np.eye(n), C, lo, hi, nb, eq_tol=1e-12)
    qT = np.ascontiguousarray(-3.0 * rng.normal(size=(n, N)))
    Kq = -(S.Kinv @ qT)
    runs = []
    for fused in (False, True):
        z = np.minimum(np.maximum(admm._rows_product(S, -qT), S.lo), S.hi)
        it = admm._Iterate(None, z, np.zeros_like(z))
        buf = admm._buffers(np, S, N, np.float64, None)
        if fused:
            admm._steps_numpy(S, np, Kq, it, buf, 60)
        else:
            for _ in range(60):
                admm._step(S, admm._Kernels(np), Kq, it, buf)
        runs.append((it.z.copy(), it.s.copy()))
    (z0, s0), (z1, s1) = runs
    scale = 1.0 + np.abs(z0).max()
    assert np.abs(z1 - z0).max() <= 1e-11 * scale and np.abs(s1 - s0).max() <= 1e-11 * scale
    assert np.abs(s0).max() > 0  # some row active: the multipliers are compared, not two zeros


def test_infinite_rows_and_no_inequalities(rng):
    n = 5
    x = torch.tensor(rng.normal(size=(4, n)) * 3)
    a = torch.tensor([1.0, np.inf], dtype=torch.float64)
    A = torch.tensor(rng.normal(size=(2, n)))
    y = project(x, A=A, a=a)
    assert (y @ A[0] <= 1 + 1e-10).all()
    # only bounds
    y = project(x, lb=torch.zeros(n, dtype=torch.float64), ub=torch.ones(n, dtype=torch.float64))
    assert torch.allclose(y, x.clamp(0, 1), atol=1e-14)


# ----------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("backend", ["admm", "proxsuite"])
def test_gradcheck_x_a_b_bounds(backend, rng):
    P = _polytope(rng)
    x, _ = _nondegenerate_point(P, rng)
    d = _tensors(P, requires_grad=True)
    X = torch.tensor(x[None, :], requires_grad=True)

    def f(X, a, b, lb, ub):
        return project(X, d["A"].detach(), a, d["B"].detach(), b, lb, ub, backend=backend)

    assert torch.autograd.gradcheck(f, (X, d["a"], d["b"], d["lb"], d["ub"]), eps=1e-6, atol=1e-7)


def test_gradcheck_matrices(rng):
    P = _polytope(rng)
    x, _ = _nondegenerate_point(P, rng)
    d = _tensors(P, requires_grad=True)
    X = torch.tensor(x[None, :], requires_grad=True)

    def f(X, A, B):
        return project(X, A, d["a"].detach(), B, d["b"].detach(), d["lb"].detach(), d["ub"].detach())

    assert torch.autograd.gradcheck(f, (X, d["A"], d["B"]), eps=1e-6, atol=1e-7)


def test_gradient_is_hs_jacobian_on_batch(rng):
    P = _polytope(rng, n=15, m=25, p=2)
    X = 2 * rng.normal(size=(32, P.n))
    V = rng.normal(size=(32, P.n))
    x = torch.tensor(X, requires_grad=True)
    (project(x, **_tensors(P)) * torch.tensor(V)).sum().backward()
    res = pp.project(X, P)
    ref = np.einsum("bij,bj->bi", pp.hs_jacobian(P, res.active), V)
    assert np.max(np.abs(x.grad.numpy() - ref)) < 1e-10


def _weakly_active_point(rng):
    """x whose projection has an active row with a zero multiplier (a kink of Π_P)."""
    n = 4
    A = np.array([[1.0, 1.0, 0, 0], [1.0, -1.0, 0, 0], [0, 0, 1.0, 0]])
    a = np.array([1.0, 0.0, 0.5])
    P = pp.Polyhedron(A=A, a=a, lb=-3 * np.ones(n), ub=3 * np.ones(n))
    y = np.array([0.5, 0.5, 0.5, 0.2])  # rows 0, 1, 2 active
    x = y + 0.7 * A[0] + 0.0 * A[1] + 0.3 * A[2]  # row 1 weakly active: multiplier 0
    return P, x


def test_degenerate_point_gradient_is_hs_element_finite_deterministic(rng):
    P, x = _weakly_active_point(rng)
    V = rng.normal(size=(3, P.n))
    grads = []
    for _ in range(2):
        xt = torch.tensor(np.tile(x, (3, 1)), requires_grad=True)
        (project(xt, **_tensors(P)) * torch.tensor(V)).sum().backward()
        grads.append(xt.grad.numpy().copy())
    assert np.all(np.isfinite(grads[0])) and np.array_equal(grads[0], grads[1])
    res = pp.project(x, P)
    J = pp.hs_jacobian(P, res.active)
    assert np.max(np.abs(grads[0] - V @ J)) < 1e-12
    # J is an element of the HS set: projector onto null(M_K) with supp(λ) ⊆ K ⊆ I(x)
    I_x = np.flatnonzero(np.abs(P.ineq_slack(res.y)[0]) < 1e-9)
    K = np.flatnonzero(res.active)
    assert set(K) <= set(I_x) and {0, 2} <= set(K)
    M = np.vstack([P.A, -np.eye(P.n)[P.lb_idx], np.eye(P.n)[P.ub_idx]])[K]
    assert np.linalg.matrix_rank(M) == len(K)
    assert np.max(np.abs(J - (np.eye(P.n) - M.T @ np.linalg.solve(M @ M.T, M)))) < 1e-12


def test_licq_failure_duplicated_rows(rng):
    """Duplicated active rows: the HS projector is unchanged, gradients finite (SVD fallback)."""
    n = 5
    A1 = rng.normal(size=(3, n))
    A = np.vstack([A1, A1[:1], 2 * A1[1:2]])
    a = np.concatenate([np.zeros(3), [0.0], [0.0]])
    x = torch.tensor(A1.sum(0)[None, :] * 2.0, requires_grad=True)
    y = project(x, A=torch.tensor(A), a=torch.tensor(a), backend="proxsuite")
    (y * torch.arange(n, dtype=torch.float64)).sum().backward()
    P1 = pp.Polyhedron(A=A1, a=np.zeros(3))
    y1 = pp.project(x.detach().numpy()[0], P1)
    assert np.max(np.abs(y.detach().numpy()[0] - y1.y)) < 1e-9
    J = pp.hs_jacobian(P1, y1.active)
    assert np.max(np.abs(x.grad.numpy()[0] - J @ np.arange(n))) < 1e-9


def test_licq_failure_in_part_of_a_batch(rng):
    """Samples with dependent active rows take the SVD path, the others the Cholesky solve: both exact."""
    n = 5
    A1 = rng.normal(size=(3, n))
    A = np.vstack([A1, A1[:1], 2 * A1[1:2]])
    X = np.vstack([A1.sum(0) * 2.0, rng.normal(size=(3, n)) * 0.3, A1[2] * 3.0])
    x = torch.tensor(X, requires_grad=True)
    y = project(x, A=torch.tensor(A), a=torch.zeros(5, dtype=torch.float64), backend="proxsuite")
    V = rng.normal(size=X.shape)
    (y * torch.tensor(V)).sum().backward()
    P1 = pp.Polyhedron(A=A1, a=np.zeros(3))
    for i in range(X.shape[0]):
        r1 = pp.project(X[i], P1)
        assert np.max(np.abs(y.detach().numpy()[i] - r1.y)) < 1e-9
        assert np.max(np.abs(x.grad.numpy()[i] - pp.hs_jacobian(P1, r1.active) @ V[i])) < 1e-9


def test_batched_constraints_match_per_sample_and_shared_sum(rng):
    P = _polytope(rng, n=6, m=8, p=1)
    batch = 5
    X = 2 * rng.normal(size=(batch, P.n))
    d = _tensors(P)
    # per-sample A (batched) built from shared data plus per-sample perturbations
    A = (d["A"][None] + 0.05 * torch.tensor(rng.normal(size=(batch, 8, P.n)))).requires_grad_()
    a = d["a"].clone().requires_grad_()  # shared rhs: summed gradient
    x = torch.tensor(X, requires_grad=True)
    V = torch.tensor(rng.normal(size=(batch, P.n)))
    (project(x, A, a, d["B"], d["b"], d["lb"], d["ub"]) * V).sum().backward()
    ga = torch.zeros_like(a)
    for i in range(batch):
        xi = torch.tensor(X[i:i + 1], requires_grad=True)
        Ai = A.detach()[i].clone().requires_grad_()
        ai = d["a"].clone().requires_grad_()
        (project(xi, Ai, ai, d["B"], d["b"], d["lb"], d["ub"]) * V[i:i + 1]).sum().backward()
        assert torch.allclose(xi.grad[0], x.grad[i], atol=1e-10)
        assert torch.allclose(Ai.grad, A.grad[i], atol=1e-10)
        ga += ai.grad
    assert torch.allclose(ga, a.grad, atol=1e-10)


def test_batched_rhs_gradcheck(rng):
    P = _polytope(rng, n=5, m=6)
    x, _ = _nondegenerate_point(P, rng)
    X = torch.tensor(np.stack([x, x + 0.01 * rng.normal(size=P.n)]), requires_grad=True)
    a = torch.tensor(np.tile(P.a, (2, 1)), requires_grad=True)
    d = _tensors(P)
    assert torch.autograd.gradcheck(lambda X, a: project(X, d["A"], a, d["B"], d["b"], d["lb"], d["ub"]),
                                    (X, a), eps=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------- errors
def test_sparse_constraint_tensors_are_densified():
    """COO and CSR constraint tensors give the dense tensor's projection (torch's sparse layouts had no
    comparison ops: a raw NotImplementedError); a learned COO tensor gets the dense gradient on its pattern."""
    rng = np.random.default_rng(0)
    A = torch.tensor(rng.normal(size=(6, 8)) * (rng.random((6, 8)) < 0.5))
    a = torch.ones(6, dtype=torch.float64)
    X = torch.tensor(3 * rng.normal(size=(5, 8)))
    dense = project(X, A, a)
    for sparse in (A.to_sparse(), A.to_sparse_csr()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch: "Sparse CSR tensor support is in beta state"
            assert torch.equal(project(X, sparse, a), dense)
    As, Ad = A.to_sparse().requires_grad_(), A.clone().requires_grad_()
    project(X, As, a).sum().backward()
    project(X, Ad, a).sum().backward()
    assert As.grad.layout == torch.sparse_coo
    torch.testing.assert_close(As.grad.to_dense(), Ad.grad * (A != 0), rtol=0, atol=0)
    # SciPy sparse matrices too (a raw ValueError in the layer before), and the layer stores them dense
    import scipy.sparse as sp

    assert torch.equal(project(X, sp.csr_matrix(A.numpy()), a), dense)
    for given in (A.to_sparse(), sp.csr_matrix(A.numpy())):
        for learn in ((), ("A",)):
            layer = ProjectionLayer(A=given, a=a, learn=learn)
            assert layer.A.layout == torch.strided and torch.equal(layer(X), dense)


def test_errors(rng):
    P = _polytope(rng)
    d = _tensors(P)
    x = torch.tensor(rng.normal(size=(2, P.n)))
    with pytest.raises(pp.ProblemError, match="dtype"):
        project(x.float(), **d)
    with pytest.raises(pp.ProblemError, match="NaN"):
        project(x * torch.nan, **d)
    with pytest.raises(pp.ProblemError, match="columns|shape"):
        project(x[:, :3], **d)
    with pytest.raises(pp.ProblemError, match="together"):
        project(x, A=d["A"])
    with pytest.raises(pp.ProblemError, match="NaN"):
        project(x, A=d["A"], a=d["a"] * torch.nan)
    with pytest.raises(pp.InfeasibleError):
        project(x, lb=torch.ones(P.n, dtype=torch.float64), ub=torch.zeros(P.n, dtype=torch.float64))
    empty = dict(A=torch.tensor([[1.0, 0, 0, 0, 0, 0], [-1.0, 0, 0, 0, 0, 0]], dtype=torch.float64),
                 a=torch.tensor([-1.0, -1.0], dtype=torch.float64))
    for backend in ("proxsuite", "admm"):
        with pytest.raises(pp.InfeasibleError):
            project(x, backend=backend, **empty)
    with pytest.raises(pp.ProblemError, match="rank"):
        ProjectionLayer(B=np.ones((2, 3)), b=[1.0, 1.0])
    with pytest.raises(pp.ProblemError, match="learn"):
        ProjectionLayer(lb=np.zeros(3), learn=["C"])


def test_auto_rule():
    x = torch.zeros(64, 4, dtype=torch.float64)
    assert choose_backend(x, shared=True) == "admm"
    few = torch.zeros(3, 4, dtype=torch.float64)
    assert choose_backend(few, shared=True) == ("daqp" if "daqp" in pp.available_backends() else "admm")
    assert choose_backend(x, shared=False) in ("ipm", "proxsuite")


class _Spy:
    """Record which backends solve which projection batches (every backend's public entry point)."""

    def __init__(self, monkeypatch):
        self.calls = []
        from polyproj.backends.base import QPSolver

        for name in ("admm", "ipm", "proxsuite", "daqp"):
            if name not in pp.available_backends():
                continue
            cls = type(pp.get_backend(name))
            real = cls.solve_projections

            def spy(solver, X, data, *, rough=False, _real=real, _name=name):
                self.calls.append((_name, X.shape[0], rough))
                return _real(solver, X, data, rough=rough)

            monkeypatch.setattr(cls, "solve_projections", spy)
        assert QPSolver  # the base default is only used by backends without their own entry


@pytest.mark.parametrize("fallback", ["auto", "ipm", "proxsuite"])
def test_fallback_solves_what_the_admm_start_leaves(fallback, rng, monkeypatch):
    # two ADMM iterations and one polish correction: most samples go to the fallback, which must
    # return the same exact projection whichever solver it is
    from polyproj.backends.defaults import fallback_for

    P = _polytope(rng, n=12, m=20, p=2)
    X = 2.5 * rng.normal(size=(16, P.n))
    ref = pp.project(X, P)
    spy = _Spy(monkeypatch)
    y = project(torch.tensor(X), backend="admm", max_iter=2, check=1000, fallback=fallback, **_tensors(P))
    assert np.max(np.abs(y.numpy() - ref.y)) < 1e-9
    assert spy.calls[0] == ("admm", 16, True)  # the rough start of the whole batch
    name, count, _ = spy.calls[1]  # the fallback was asked once, for the refused points
    assert count <= 16
    assert name == (fallback_for(True, P.n, count, {}) if fallback == "auto" else fallback)


def test_auto_fallback_rule(monkeypatch):
    from polyproj.backends import defaults
    from polyproj.backends.defaults import exact_points, fallback_for

    have_daqp = "daqp" in pp.available_backends()
    if have_daqp:  # DAQP one point at a time, for fewer points as n grows
        assert exact_points(50) == 64 and exact_points(10) == 256 and exact_points(100) == 11
        assert exact_points(400) == 0
        assert fallback_for(True, 50, 64, {}) == "daqp"
        assert fallback_for(True, 100, 11, {}) == "daqp"
        assert fallback_for(False, 50, 1, {}) == "ipm"
    monkeypatch.setattr(defaults, "EXACT_POINTS", 0)  # without the exact fallback: ProxSuite, then the IPM
    assert exact_points(50) == 0
    assert fallback_for(True, 50, 2, {}) == ("proxsuite" if "proxsuite" in pp.available_backends() else "ipm")
    assert fallback_for(True, 50, 9, {}) == "ipm"
    assert fallback_for(True, 400, 1, {}) == "ipm"
    assert fallback_for(False, 50, 1, {}) == "ipm"
    assert fallback_for(True, 50, 1, {"not_a_proxsuite_setting": 1}) == "ipm"


# ----------------------------------------------------------------------------- module
def test_projection_layer_state_dict_and_repr(rng):
    P = _polytope(rng)
    layer = ProjectionLayer(P.A, P.a, P.B, P.b, P.lb, P.ub, learn=["a"])
    assert "inequalities=8" in repr(layer) and "learned=['a']" in repr(layer)
    assert [k for k, _ in layer.named_parameters()] == ["a"]
    X = torch.tensor(2 * rng.normal(size=(4, P.n)))
    y = layer(X)
    y.sum().backward()
    assert layer.a.grad is not None and torch.isfinite(layer.a.grad).all()
    state = layer.state_dict()
    other = ProjectionLayer(np.zeros_like(P.A), np.ones_like(P.a), P.B, np.zeros(1), P.lb, P.ub, learn=["a"])
    other.load_state_dict(state)
    assert torch.equal(other(X), y.detach())
    assert set(state) == {"A", "a", "B", "b", "lb", "ub"}
    layer32 = ProjectionLayer(P.A, P.a, P.B, P.b, P.lb, P.ub).to(torch.float32)
    assert layer32(X.float()).dtype == torch.float32


# ----------------------------------------------------------------------------- training
def test_training_portfolio_feasible_and_loss_decreases():
    """A network learns portfolio weights on {w >= 0, Σw = 1, Σ_{i in S} w_i >= 0.5}."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n_assets, n_feat, N = 12, 6, 128
    chosen = np.zeros(n_assets)
    chosen[:5] = 1.0  # "a chosen five"
    F = torch.tensor(rng.normal(size=(N, n_feat)))
    W_true = torch.tensor(rng.normal(size=(n_feat, n_assets)))
    R = F @ W_true * 0.05 + 0.01 * torch.tensor(rng.normal(size=(N, n_assets)))  # synthetic returns
    layer = ProjectionLayer(A=-chosen[None, :], a=[-0.5], B=np.ones((1, n_assets)), b=[1.0], lb=np.zeros(n_assets))
    net = torch.nn.Sequential(torch.nn.Linear(n_feat, 32), torch.nn.Tanh(), torch.nn.Linear(32, n_assets)).double()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        w = layer(net(F))
        loss = -(w * R).sum(1).mean() + 0.5 * (w ** 2).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        Wn = w.detach().numpy()
        assert Wn.min() >= -1e-8 and np.abs(Wn.sum(1) - 1).max() <= 1e-8 and (Wn @ chosen).min() >= 0.5 - 1e-8
    assert np.mean(losses[-5:]) < losses[0] - 0.1 * abs(losses[0])


def test_backward_reuses_the_forward_factors_and_matches_refactoring(rng, monkeypatch):
    # the backward takes the factorisations of the faces the forward's polish accepted; the
    # gradients (to every input) are those of a backward that factors the final active sets anew
    from polyproj.projection import polish as polish_mod

    P = _polytope(rng, n=12, m=20, p=2)
    X = 2.5 * rng.normal(size=(64, P.n))
    X[:4] = pp.project(X[:4], P).y  # points on the boundary: weakly active rows, not the polish's face
    V = torch.tensor(rng.normal(size=X.shape))

    def grads(reuse):
        t = _tensors(P, requires_grad=True)
        x = torch.tensor(X, requires_grad=True)
        if not reuse:  # a polish that records no face: the backward factors every sample itself
            real = polish_mod.polish
            monkeypatch.setattr("polyproj.projection.pipeline.polish",
                                lambda *a, **k: real(*a, **{**k, "record": False}))
        y = project(x, backend="admm", **t)
        monkeypatch.undo()
        (y * V).sum().backward()
        return [x.grad] + [t[k].grad for k in ("A", "a", "B", "b", "lb", "ub")]

    g_reuse = grads(True)
    g_fresh = grads(False)
    for u, v in zip(g_reuse, g_fresh, strict=True):
        torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-12)


def test_fallback_survives_a_false_infeasibility_report(rng, monkeypatch):
    # ProxSuite's dense solver misreports PRIMAL_INFEASIBLE on a few feasible points; the pipeline then
    # asks an independent backend (the IPM) instead of raising InfeasibleError on a feasible polyhedron
    from dataclasses import replace

    pytest.importorskip("proxsuite")
    P = _polytope(rng, n=12, m=20, p=2)
    X = 2.5 * rng.normal(size=(6, P.n))
    ref = pp.project(X, P)
    cls = type(pp.get_backend("proxsuite"))
    real = cls.solve_projections
    asked = []

    def lying(solver, Xb, data, *, rough=False):
        asked.append(Xb.shape[0])
        start = real(solver, Xb, data, rough=rough)
        return replace(start, status=(pp.Status.PRIMAL_INFEASIBLE,) * len(start.status))

    monkeypatch.setattr(cls, "solve_projections", lying)
    with pytest.warns(pp.PolyprojWarning, match="'ipm' found them feasible"):
        y = project(torch.tensor(X), backend="admm", max_iter=2, check=1000, fallback="proxsuite", **_tensors(P))
    assert np.max(np.abs(y.numpy() - ref.y)) < 1e-9
    assert asked  # the fallback was asked first, then the IPM answered


# ----------------------------------------------------------------------------- hardening
def test_layer_copies_the_callers_data(rng):
    P = _polytope(rng)
    A = torch.tensor(P.A)
    A0 = A.clone()
    layer = ProjectionLayer(A, P.a, P.B, P.b, P.lb, P.ub, learn=("A",))
    other = ProjectionLayer(A, P.a, P.B, P.b, P.lb, P.ub)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer(torch.tensor(2 * rng.normal(size=(4, P.n)))).sum().backward()
    opt.step()
    assert torch.equal(A, A0) and torch.equal(other.A, A0)  # neither the caller's tensor nor another layer moved
    assert not torch.equal(layer.A.detach(), A0)
    with pytest.raises(pp.ProblemError, match="not given"):
        ProjectionLayer(A=P.A, a=P.a, learn=("lb",))


def test_a_zero_row_of_per_sample_constraints_is_an_empty_set(rng):
    """One sample's zero row ``0 y <= -1``: InfeasibleError naming the row and the sample (the layer's own data
    path does not build a Polyhedron)."""
    x = torch.tensor(rng.normal(size=(3, 2)))
    A = torch.tensor(rng.normal(size=(3, 2, 2)))
    A[1, 1] = 0.0
    with pytest.raises(pp.InfeasibleError, match="row 1 of sample 1 of A is zero with a = -1"):
        project(x, A, torch.tensor([1.0, -1.0], dtype=torch.float64))
    A[1, 1] = torch.tensor([1.0, 1.0])
    assert project(x, A, torch.tensor([1.0, -1.0], dtype=torch.float64)).shape == (3, 2)


def test_empty_batch_and_huge_points(rng):
    P = _polytope(rng)
    d = _tensors(P)
    x = torch.zeros(0, P.n, dtype=torch.float64, requires_grad=True)
    y = project(x, **d)
    assert y.shape == (0, P.n)
    y.sum().backward()
    assert x.grad.shape == (0, P.n)
    # finite |x| >= 1e20 (read as "infinite" in QP data) is projected, not refused as an infinite q: the
    # answer holds its constraints at the scale of y, or the warning says it could not be verified (the
    # component of y along a face is lost to cancellation at eps |x| in float64); the layer returns an
    # unverified point only when it is feasible, else raises InfeasibleError
    big = torch.tensor(np.full((2, P.n), 1e21) * np.sign(rng.normal(size=(2, P.n))))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = pp.project(big.numpy(), P)
    assert res.polished.all() or any("polish refused" in str(w.message) for w in caught)
    usable = res.polished | (res.violation <= 1e-6 * (1 + np.abs(res.y).max(axis=1)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        if usable.all():
            y = project(big, **d)
            np.testing.assert_allclose(y.numpy(), res.y, atol=1e-9)
            for i in range(2):
                if res.polished[i]:
                    assert P.violation(y.numpy()[i]) < 1e-9
        else:
            with pytest.raises(pp.InfeasibleError, match="could not be projected"):
                project(big, **d)


@pytest.mark.parametrize("kind", ["polyhedron", "simplex"])
def test_torch_func_transforms(kind, rng):
    P = _polytope(rng, n=5, m=6) if kind == "polyhedron" else pp.sets.Simplex(5)
    poly = P if kind == "polyhedron" else P.as_polyhedron()

    def f(x):
        return project(x, P)

    X = torch.tensor(2 * rng.normal(size=(3, 4, 5)))
    np.testing.assert_allclose(torch.func.vmap(f)(X).numpy(), f(X.reshape(12, 5)).reshape(3, 4, 5).numpy(),
                               atol=1e-12)
    x1 = X[1, 2]
    J = pp.hs_jacobian(poly, pp.project(x1.numpy(), P).active)
    np.testing.assert_allclose(torch.func.jacrev(f)(x1).numpy(), J, atol=1e-12)
    np.testing.assert_allclose(torch.func.jacfwd(f)(x1).numpy(), J, atol=1e-12)
    if kind == "polyhedron":
        d = _tensors(P)
        with pytest.raises(pp.ProblemError, match="vmap over constraint tensors"):
            torch.func.vmap(lambda a: project(X[0], d["A"], a, d["B"], d["b"], d["lb"], d["ub"]))(
                torch.stack([d["a"], d["a"]]))
        # under vmap(jacrev(...)) and vmap(grad(...)) the data are gradient-tracking wrappers of batched tensors
        # (the test looked at the outer wrapper only: torch's RuntimeError about .item() came from the library)
        for transform in (lambda g: torch.func.jacrev(g, argnums=1),
                          lambda g: torch.func.grad(lambda x, a: g(x, a).sum(), argnums=1)):
            with pytest.raises(pp.ProblemError, match="vmap over constraint tensors"):
                torch.func.vmap(transform(lambda x, a: project(x, d["A"], a, d["B"], d["b"], d["lb"], d["ub"])))(
                    X[0, :2], torch.stack([d["a"], d["a"]]))


@pytest.mark.parametrize("kind", ["polyhedron", "simplex"])
@pytest.mark.parametrize("batch", [5, 20, 40])  # the direct path (<= 16) and the pipeline
def test_per_sample_derivatives_under_vmap(kind, batch, rng):
    """vmap(jacrev / jacfwd / grad): the mapped level is folded into one batch forward, and its backward
    maps each slice's cotangent onto that slice's rows (per-sample, not summed over the batch)."""
    from torch.func import grad, jacfwd, jacrev, vmap

    P = _polytope(rng, n=4, m=5) if kind == "polyhedron" else pp.sets.Simplex(4)
    poly = P if kind == "polyhedron" else P.as_polyhedron()
    f = lambda x: project(x, P)  # noqa: E731
    X = torch.tensor(2 * rng.normal(size=(batch, 4)))
    ref = np.stack([pp.hs_jacobian(poly, pp.project(x.numpy(), P).active) for x in X])
    np.testing.assert_allclose(vmap(jacrev(f))(X).numpy(), ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(vmap(jacfwd(f))(X).numpy(), ref, rtol=0, atol=1e-12)
    for h in (lambda x: (f(x) ** 2).sum(), lambda x: f(x).sum()):  # a cotangent that is mapped, and one not
        loop = torch.stack([grad(h)(x) for x in X])
        np.testing.assert_allclose(vmap(grad(h))(X).numpy(), loop.numpy(), rtol=0, atol=1e-12)
    if kind == "polyhedron":  # per-sample gradients of the constraint data
        d = _tensors(P)
        ha = lambda x, a: (project(x, d["A"], a, d["B"], d["b"], d["lb"], d["ub"]) ** 2).sum()  # noqa: E731
        per = vmap(grad(ha, argnums=1), in_dims=(0, None))(X, d["a"])
        loop = torch.stack([grad(ha, argnums=1)(x, d["a"]) for x in X])
        np.testing.assert_allclose(per.numpy(), loop.numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("rows", [1, 6])
def test_per_slice_data_gradients_under_vmap_take_one_backward(rows, rng, monkeypatch):
    """vmap(grad) of every data part over slices of ``rows`` points each: equal to the loop over slices,
    from one backward over the folded batch (not one per slice)."""
    from torch.func import grad, vmap

    import polyproj.adapters.torch as adapter

    P = _polytope(rng, n=5, m=7, p=1)
    d = _tensors(P)
    names = ("A", "a", "B", "b", "lb", "ub")
    X = torch.tensor(2 * rng.normal(size=(8, rows, 5)))
    W = torch.tensor(rng.normal(size=(8, rows, 5)))

    def h(x, w, *data):
        y = project(x, *data)
        return (y * w).sum() + (y ** 2).sum()

    argnums = tuple(range(2, 8))
    calls = []
    real = adapter._backward_parts
    monkeypatch.setattr(adapter, "_backward_parts", lambda *a, **k: calls.append(a[2].shape[0]) or real(*a, **k))
    per = vmap(grad(h, argnums=argnums), in_dims=(0, 0, *([None] * 6)))(X, W, *(d[k] for k in names))
    assert calls == [8 * rows]  # one backward for the 8 slices
    calls.clear()
    loop = [grad(h, argnums=argnums)(X[v], W[v], *(d[k] for k in names)) for v in range(8)]
    for i, k in enumerate(names):
        ref = torch.stack([g[i] for g in loop])
        assert per[i].shape == ref.shape == (8, *d[k].shape)
        np.testing.assert_allclose(per[i].numpy(), ref.numpy(), rtol=0, atol=1e-11, err_msg=k)


@pytest.mark.parametrize("rows", [5, 7])  # a slice of n points, of m points
def test_vmap_over_slices_of_n_or_m_points_keeps_the_data_shared(rows, rng):
    """Shared polyhedral data whose first dimension equals the points in a slice (lb (n,), A (m, n)) are not
    taken for one entry per point: vmap equals the whole batch, vmap(grad) the loop over slices (the data
    were tiled: a ProblemError naming lb's shape for n points, a torch RuntimeError for m)."""
    from torch.func import grad, vmap

    P = _polytope(rng, n=5, m=7, p=1)
    d = _tensors(P)
    names = ("A", "a", "B", "b", "lb", "ub")
    X = torch.tensor(2 * rng.normal(size=(3, rows, 5)))
    data = [d[k] for k in names]
    y = vmap(lambda z: project(z, *data))(X)
    np.testing.assert_allclose(y.numpy(), project(X, *data).numpy(), rtol=0, atol=1e-12)

    def h(x, *dd):
        return (project(x, *dd) ** 2).sum()

    argnums = tuple(range(1, 7))
    per = vmap(grad(h, argnums=argnums), in_dims=(0, *([None] * 6)))(X, *data)
    loop = [grad(h, argnums=argnums)(X[v], *data) for v in range(3)]
    for i, k in enumerate(names):
        np.testing.assert_allclose(per[i].numpy(), torch.stack([g[i] for g in loop]).numpy(), rtol=0, atol=1e-11,
                                   err_msg=k)


def test_vmap_of_a_warm_started_layer():
    """vmap of ProjectionLayer(warm_start=True) (and of its jacrev): the folded result is no warm start for a
    later call (it raised AttributeError), and the next plain call is still exact."""
    from torch.func import jacrev, vmap

    x = torch.tensor([[[2.0, 1.0], [0.2, 0.1], [0.3, 0.3]], [[0.5, 0.9], [3.0, -1.0], [0.0, 0.0]]],
                     dtype=torch.float64)
    cold = ProjectionLayer(A=[[1.0, 1.0]], a=[1.0], lb=[0.0, 0.0])
    warm = ProjectionLayer(A=[[1.0, 1.0]], a=[1.0], lb=[0.0, 0.0], warm_start=True)
    np.testing.assert_allclose(vmap(warm)(x).numpy(), vmap(cold)(x).numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(vmap(jacrev(warm))(x[0]).numpy(), vmap(jacrev(cold))(x[0]).numpy(), rtol=0,
                               atol=1e-12)
    np.testing.assert_allclose(warm(x[1]).numpy(), cold(x[1]).numpy(), rtol=0, atol=1e-12)


def test_torch_compile_runs_the_layer_eagerly(rng):
    """torch.compile of a model holding the layer (and of a function calling project): the projection is a graph
    break, compiled code around it, so every batch — degenerate points that leave the direct path too — gives
    the eager output and gradient (traced, Dynamo failed inside polyproj's NumPy code on such batches)."""
    import logging

    torch._logging.set_logs(dynamo=logging.ERROR)
    torch._dynamo.reset()
    layer = ProjectionLayer(A=[[1.0, 1.0]], a=[1.0], lb=[0.0, 0.0])
    model = torch.nn.Sequential(torch.nn.Linear(3, 2, dtype=torch.float64), layer)
    compiled = torch.compile(model, backend="eager")
    fn = torch.compile(lambda z: project(z.sin(), torch.ones(1, 2, dtype=torch.float64),
                                         torch.ones(1, dtype=torch.float64), lb=0.0) * 2, backend="eager")
    batches = [torch.tensor([[2.0, 1.0]], dtype=torch.float64)]  # y = (1, 0): weakly active lower bound
    batches += [torch.tensor(3 * rng.normal(size=(k, 2))) for k in (1, 7, 40)]
    for xb in batches:
        inp = torch.cat([xb, xb[:, :1]], dim=1)
        for f_c, f_e, z in ((compiled, model, inp), (fn, None, xb)):
            ze, zc = z.clone().requires_grad_(), z.clone().requires_grad_()
            ref = f_e(ze) if f_e is not None else project(ze.sin(), torch.ones(1, 2, dtype=torch.float64),
                                                          torch.ones(1, dtype=torch.float64), lb=0.0) * 2
            out = f_c(zc)
            np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=0, atol=1e-12)
            w = torch.tensor(rng.normal(size=tuple(ref.shape)))
            (ref * w).sum().backward()
            (out * w).sum().backward()
            np.testing.assert_allclose(zc.grad.numpy(), ze.grad.numpy(), rtol=0, atol=1e-12)
    torch._dynamo.reset()


def test_scalar_bounds_in_the_layer(rng):
    """``lb=0``, ``ub=1`` (numbers or 0-d tensors) bound every coordinate; a 0-d tensor's gradient is the sum."""
    A = rng.normal(size=(8, 6))
    d = dict(A=torch.tensor(A), a=torch.tensor(A @ np.full(6, 0.5) + 0.2))  # [0, 1]^6 holds 0.5: feasible
    x = torch.tensor(3 * rng.normal(size=(5, 6)))
    ref = project(x, d["A"], d["a"], lb=torch.zeros(6, dtype=torch.float64), ub=torch.ones(6, dtype=torch.float64))
    np.testing.assert_allclose(project(x, d["A"], d["a"], lb=0, ub=1.0).numpy(), ref.numpy(), atol=1e-12)
    np.testing.assert_allclose(ProjectionLayer(d["A"], d["a"], lb=0.0, ub=1)(x).numpy(), ref.numpy(), atol=1e-12)
    lb = torch.tensor(-0.3, dtype=torch.float64, requires_grad=True)
    full = torch.full((6,), -0.3, dtype=torch.float64, requires_grad=True)
    V = torch.tensor(rng.normal(size=(5, 6)))
    (project(x, d["A"], d["a"], lb=lb) * V).sum().backward()
    (project(x, d["A"], d["a"], lb=full) * V).sum().backward()
    assert lb.grad.shape == () and float(lb.grad) == pytest.approx(float(full.grad.sum()), abs=1e-12)


def test_warm_start_from_the_previous_step_gives_the_same_projection(rng):
    """A layer with warm_start=True starts its polish from the last call's active sets; the answer (and the
    gradient) is the exact projection whatever the guess: close steps, a far step, another batch size."""
    P = _polytope(rng, n=12, m=20, p=2)
    layer = ProjectionLayer(P, warm_start=True)
    cold = ProjectionLayer(P)
    X = 2.5 * rng.normal(size=(32, P.n))
    for step in (0.0, 1e-3, 1e-3, 3.0):
        X = X + step * rng.normal(size=X.shape)
        xw, xc = torch.tensor(X, requires_grad=True), torch.tensor(X, requires_grad=True)
        yw, yc = layer(xw), cold(xc)
        np.testing.assert_allclose(yw.detach().numpy(), yc.detach().numpy(), atol=1e-10)
        V = torch.tensor(rng.normal(size=X.shape))
        (yw * V).sum().backward()
        (yc * V).sum().backward()
        np.testing.assert_allclose(xw.grad.numpy(), xc.grad.numpy(), atol=1e-10)
    y = layer(torch.tensor(X[:5]))  # another batch size: no guess, the cold path
    np.testing.assert_allclose(y.numpy(), cold(torch.tensor(X[:5])).numpy(), atol=1e-10)


def test_a_poor_warm_start_is_given_up_after_one_round(rng, monkeypatch):
    """A guess far from the answers costs one polish round: its samples then go without it (the whole
    pipeline, or DAQP per point when few are left); a good guess takes no backend solve at all."""
    from polyproj.projection import pipeline, polish
    from polyproj.sets import polyhedral

    P = _polytope(rng, n=12, m=20, p=2)
    X = 2.5 * rng.normal(size=(64, P.n))
    near = X + 1e-6 * rng.normal(size=X.shape)
    far = -X[::-1].copy()  # the same batch size, unrelated points
    ref_near, ref_far = pp.project(near, P).y, pp.project(far, P).y
    layer = ProjectionLayer(P, warm_start=True, backend="admm")
    layer(torch.tensor(X))
    rounds, runs = [], []
    real_round, real_run = polish._round, pipeline.run

    def count_round(xp, state, *a, **k):
        rounds.append(int(xp.sum(xp.astype(state.todo, xp.int64))))
        return real_round(xp, state, *a, **k)

    def count_run(X, *a, **k):
        runs.append((X.shape[0], k.get("warm") is not None))
        return real_run(X, *a, **k)

    monkeypatch.setattr(polish, "_round", count_round)
    monkeypatch.setattr(pipeline, "run", count_run)
    monkeypatch.setattr(polyhedral, "run", count_run)
    y = layer(torch.tensor(near))
    np.testing.assert_allclose(y.numpy(), ref_near, atol=1e-10)
    assert runs == [(64, True)] and rounds == [64]  # verified from the guess in one round, no backend solve
    rounds.clear(), runs.clear()
    y = layer(torch.tensor(far))
    np.testing.assert_allclose(y.numpy(), ref_far, atol=1e-10)
    assert rounds[1] > pipeline.WARM_GIVE_UP * 64  # the guess is useless for these points ...
    assert runs[1] == (rounds[1], False)  # ... so after one round they go through the pipeline without it


@pytest.mark.parametrize("make", [lambda: pp.sets.Simplex(5), lambda: pp.Polyhedron(B=np.ones((1, 5)), b=[1.0],
                                                                                      lb=np.zeros(5))],
                         ids=["simplex", "polyhedron"])
def test_the_graph_and_the_result_are_freed_after_backward(make):
    """No reference cycle through autograd: the output is not the tensor the kept result holds (training leaked)."""
    import weakref

    S = make()
    layer = ProjectionLayer(S, structured=False) if isinstance(S, pp.Polyhedron) else ProjectionLayer(S)
    x = torch.randn(8, 5, dtype=torch.float64, requires_grad=True)
    y = layer(2.0 * x)
    node = y.grad_fn
    while not hasattr(node, "result"):  # through the reshape to the projection's node
        node = node.next_functions[0][0]
    kept = weakref.ref(node.result)
    del node
    (y * y).sum().backward()
    del y
    assert kept() is None  # freed by reference counting, without waiting for (or relying on) the cycle collector


def test_constraint_tensors_reused_only_while_equal(rng):
    """The set built from constraint tensors is reused across calls only while their contents are equal:
    an in-place change (through ``.data`` too) gives the new polyhedron's projection, tensors that need a
    gradient are never cached (their gradient reaches them), and a cache hit returns the same answer."""
    from polyproj.adapters.torch import _SETS

    _SETS.clear()
    P = _polytope(rng, n=5, m=7)
    t = {k: torch.tensor(getattr(P, k)) for k in ("A", "a", "B", "b", "lb", "ub")}
    x = torch.tensor(2.0 * rng.normal(size=(4, 5)))
    y1 = project(x, t["A"], t["a"], t["B"], t["b"], t["lb"], t["ub"])
    y2 = project(x, t["A"], t["a"], t["B"], t["b"], t["lb"], t["ub"])
    assert torch.equal(y1, y2) and len(_SETS._items) == 1
    np.testing.assert_allclose(y1.numpy(), pp.project(x.numpy(), P).y, atol=1e-9)
    t["a"].data.sub_(0.3)  # not seen by the version counter
    t["A"][0].mul_(1.5)
    P2 = pp.Polyhedron(A=t["A"].numpy(), a=t["a"].numpy(), B=P.B, b=P.b, lb=P.lb, ub=P.ub)
    y3 = project(x, t["A"], t["a"], t["B"], t["b"], t["lb"], t["ub"])
    np.testing.assert_allclose(y3.numpy(), pp.project(x.numpy(), P2).y, atol=1e-9)
    assert float(np.max(P2.violation(y3.numpy()))) < 1e-9
    a = t["a"].clone().requires_grad_()
    _SETS.clear()
    y4 = project(x, t["A"], a, t["B"], t["b"], t["lb"], t["ub"])
    assert not _SETS._items
    y4.sum().backward()
    assert a.grad is not None and torch.isfinite(a.grad).all()


@pytest.mark.parametrize("batch", [5, 70])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpu_batches_on_numpy_equal_the_torch_path(dtype, batch, rng, monkeypatch):
    """CPU batches run the pipeline on NumPy views (HOST_BATCH; 5 points: the direct path, 70: the ADMM
    start and the polish): the projection, the gradients with respect to x and to learned constraint
    data, and the warm start equal those of the torch path."""
    import polyproj.adapters.torch as pt

    P = _polytope(rng, n=6, m=9)
    X = 2.0 * rng.normal(size=(batch, 6))
    V = rng.normal(size=(batch, 6))

    def run():
        x = torch.tensor(X, dtype=dtype, requires_grad=True)
        a = torch.tensor(P.a, dtype=dtype, requires_grad=True)
        parts = [torch.tensor(getattr(P, k), dtype=dtype) for k in ("A", "B", "b", "lb", "ub")]
        y = project(x, parts[0], a, *parts[1:])
        (y * torch.tensor(V, dtype=dtype)).sum().backward()
        layer = ProjectionLayer(P, warm_start=True, dtype=dtype)
        y2 = layer(x.detach())
        y3 = layer(x.detach())  # from the previous call's active sets
        return y.detach(), x.grad, a.grad, y2, y3

    host = run()
    assert isinstance(host[0], torch.Tensor) and host[0].dtype == dtype
    monkeypatch.setattr(pt, "HOST_BATCH", 0)
    dev = run()
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    for h, d in zip(host, dev, strict=True):
        assert h.dtype == d.dtype
        np.testing.assert_allclose(h.numpy(), d.numpy(), atol=tol, rtol=0)
    ref = pp.project(X, P)
    np.testing.assert_allclose(host[0].numpy(), ref.y, atol=tol)


def test_layer_edge_cases_from_a_new_users_trial():
    """Empty batches (warm start, per-sample data), a recognised set after load_state_dict / in-place
    changes, and points without an answer (inconsistent equalities) raising instead of returning NaN."""
    dt = torch.float64
    gen = torch.Generator().manual_seed(0)
    # an empty batch is no warm-start guess for the next call
    L = ProjectionLayer(A=torch.randn(3, 4, dtype=dt, generator=gen), a=torch.ones(3, dtype=dt),
                        lb=torch.zeros(4, dtype=dt), warm_start=True)
    x = torch.randn(8, 4, dtype=dt, generator=gen)
    y0 = L(x)
    assert L(torch.zeros(0, 4, dtype=dt)).shape == (0, 4)
    torch.testing.assert_close(L(x), y0, rtol=0, atol=1e-12)
    # batch 0 with per-sample constraint data
    empty = project(torch.zeros(0, 4, dtype=dt), torch.zeros(0, 3, 4, dtype=dt), torch.zeros(0, 3, dtype=dt))
    assert empty.shape == (0, 4)
    # a recognised structured set follows its buffers
    n = 4
    saved = ProjectionLayer(B=torch.ones(1, n), b=[2.0], lb=torch.zeros(n))
    fresh = ProjectionLayer(B=torch.ones(1, n), b=[1.0], lb=torch.zeros(n))
    fresh.load_state_dict(saved.state_dict())
    z = torch.randn(3, n, dtype=dt, generator=gen)
    torch.testing.assert_close(fresh(z).sum(1), torch.full((3,), 2.0, dtype=dt))
    saved.b.fill_(3.0)
    torch.testing.assert_close(saved(z).sum(1), torch.full((3,), 3.0, dtype=dt))
    # a warm-start layer pickles after a call (the last result is not part of its state); float storage only
    import pickle

    torch.testing.assert_close(pickle.loads(pickle.dumps(L))(x), y0, rtol=0, atol=1e-12)
    for dtype in (torch.int64, torch.float16, torch.bfloat16):  # float storage the projection computes in only
        with pytest.raises(pp.ProblemError, match="float32 or torch.float64"):
            ProjectionLayer(A=torch.randn(3, 4), a=torch.ones(3), dtype=dtype)
    # inconsistent equalities the backend does not report: no NaN output
    B = torch.tensor([[1.0, 0, 0], [1, 0, 0]], dtype=dt)
    b = torch.tensor([0.0, 1.0], dtype=dt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        for backend in ("auto", "admm"):
            with pytest.raises(pp.InfeasibleError):
                project(torch.randn(4, 3, dtype=dt, generator=gen), B=B, b=b, backend=backend)


def test_forward_mode_with_respect_to_constraint_data_is_refused(rng):
    """jvp / jacfwd / make_dual on the constraint tensors raise (they were silently zero); forward mode in
    x and reverse mode in the data still work."""
    import torch.autograd.forward_ad as fwAD
    from torch.func import jacfwd, jacrev, jvp

    P = _polytope(rng, n=4, m=5)
    d = _tensors(P)
    X = torch.tensor(2 * rng.normal(size=(3, 4)))
    f = lambda a: project(X, d["A"], a, d["B"], d["b"], d["lb"], d["ub"])  # noqa: E731
    with pytest.raises(pp.ProblemError, match="forward-mode"):
        jvp(f, (d["a"],), (torch.ones_like(d["a"]),))
    with pytest.raises(pp.ProblemError, match="forward-mode"):
        jacfwd(f)(d["a"])
    with fwAD.dual_level(), pytest.raises(pp.ProblemError, match="forward-mode"):
        f(fwAD.make_dual(d["a"], torch.ones_like(d["a"])))
    g = lambda x: project(x, **d)  # noqa: E731
    np.testing.assert_allclose(jacfwd(g)(X[0]).numpy(), jacrev(g)(X[0]).numpy(), rtol=0, atol=1e-12)
    assert float(jacrev(f)(d["a"]).abs().max()) > 0


def test_create_graph_gradient_penalty_and_data_second_derivatives(rng):
    """With create_graph the input gradient depends on x (zero second derivative: J is piecewise constant),
    gradgradcheck passes in x, and a second derivative through learned constraint data raises."""
    P = _polytope(rng, n=4, m=5)
    d = _tensors(P)
    x = torch.tensor(2 * rng.normal(size=(5, 4)), requires_grad=True)
    g, = torch.autograd.grad(project(x, **d)[:, 0].sum(), x, create_graph=True)
    assert g.requires_grad
    second, = torch.autograd.grad((g ** 2).sum(), x)
    assert float(second.abs().max()) == 0.0
    assert torch.autograd.gradgradcheck(lambda z: project(z, **d), (x,))
    B = torch.tensor(rng.normal(size=(1, 4)), requires_grad=True)
    v = torch.tensor(rng.normal(size=(5, 4)))
    gx, = torch.autograd.grad(project(x, B=B, b=torch.zeros(1, dtype=torch.float64)), x, grad_outputs=v,
                              create_graph=True)
    with pytest.raises(pp.ProblemError, match="second derivatives through the constraint data"):
        torch.autograd.grad((gx ** 2).sum(), B)


def test_recognised_layer_sees_changes_through_data_and_jacfwd_with_a_scalar_bound(rng):
    """A recognised layer compared its buffers by identity and version only: a change through ``.data``
    (which bumps neither) kept the old set silently. A scalar bound became a tensor inside the
    transform, which jacfwd took for a differentiated constraint tensor (misleading ProblemError)."""
    from torch.func import jacfwd, jacrev

    n = 4
    L = ProjectionLayer(B=torch.ones(1, n, dtype=torch.float64), b=torch.tensor([1.0], dtype=torch.float64),
                        lb=torch.zeros(n, dtype=torch.float64))
    assert L.set is not None  # recognised: a simplex
    x = torch.tensor(rng.normal(size=(3, n)))
    np.testing.assert_allclose(L(x).sum(dim=1).numpy(), 1.0)
    L.b.data.fill_(3.0)
    np.testing.assert_allclose(L(x).sum(dim=1).numpy(), 3.0)
    L.lb.data.fill_(0.5)
    y = L(x)
    np.testing.assert_allclose(y.sum(dim=1).numpy(), 3.0)
    assert float(y.min()) >= 0.5 - 1e-15
    A, a = torch.tensor(rng.normal(size=(5, 3))), torch.tensor(rng.uniform(0.2, 1.0, size=5))
    f = lambda v: project(v, A, a, lb=-1.0, ub=1.0)  # noqa: E731
    v = torch.tensor(rng.normal(size=3) * 2)
    np.testing.assert_allclose(jacfwd(f)(v).numpy(), jacrev(f)(v).numpy(), atol=1e-12)


def test_piqp_is_quiet_on_rows_infinite_on_both_sides(capfd):
    pytest.importorskip("piqp")
    P = pp.Polyhedron(A=[[1.0, 1.0], [1.0, -1.0]], a=[1.0, np.inf])
    r = pp.project(np.array([[2.0, 2.0]]), P, backend="piqp")
    np.testing.assert_allclose(r.y, [[0.5, 0.5]], atol=1e-12)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_layer_leaves_torch_batched_lu_exact():
    """The layer runs small work on one torch thread and restores the caller's count after it. Restoring it
    with torch.set_num_threads (which also sets MKL's count) made every later batched LU of the process
    wrong on MKL builds of torch: pivots 0, residuals 1e17, qpth failing after a polyproj layer."""
    from polyproj.runtime import set_torch_threads

    prev = torch.get_num_threads()
    gen = torch.Generator().manual_seed(0)
    M = torch.randn(4, 251, 251, dtype=torch.float64, generator=gen)
    eye = torch.eye(251, dtype=torch.float64)
    try:
        set_torch_threads(2)
        A = torch.tensor(np.random.default_rng(0).normal(size=(30, 10)))
        x = torch.randn(8, 10, dtype=torch.float64, generator=gen, requires_grad=True)
        project(x, A, torch.ones(30, dtype=torch.float64)).sum().backward()
        assert torch.get_num_threads() == 2
        LU, piv = torch.linalg.lu_factor(M)
        assert int(piv.min()) >= 1
        assert float((M @ torch.linalg.lu_solve(LU, piv, eye) - eye).abs().max()) < 1e-8
    finally:
        set_torch_threads(prev)


@pytest.mark.parametrize("transform", ["hessian", "jacrev_jacrev", "jacfwd_jacrev", "jacrev_jacfwd", "vmap_hessian"])
@pytest.mark.parametrize("kind", ["polyhedron", "simplex"])
def test_second_derivatives_compose_with_torch_func(transform, kind, rng):
    """Second derivatives through the layer by torch.func (the cotangent of the backward carries the outer
    transform's levels): each equals torch.autograd.functional.hessian, J symmetric and piecewise constant
    (so d²/dx² Σ y³ = Jᵀ diag(6y) J), twice in a row (the set cache holds plain copies, not a transform's)."""
    from torch.func import hessian, jacfwd, jacrev, vmap

    P = _polytope(rng, n=4, m=5)
    if kind == "polyhedron":
        data = [torch.tensor(v) for v in (P.A, P.a, P.B, P.b, P.lb, P.ub)]
        f = lambda v: (project(v, *data) ** 3).sum()  # noqa: E731
    else:
        S = pp.sets.Simplex(4)
        f = lambda v: (project(v, S) ** 3).sum()  # noqa: E731
    X = torch.tensor(np.stack([_nondegenerate_point(P, rng)[0] for _ in range(2)]))
    ref = torch.stack([torch.autograd.functional.hessian(f, x) for x in X])
    make = {"hessian": hessian, "jacrev_jacrev": lambda g: jacrev(jacrev(g)),
            "jacfwd_jacrev": lambda g: jacfwd(jacrev(g)), "jacrev_jacfwd": lambda g: jacrev(jacfwd(g))}
    for _ in range(2):
        if transform == "vmap_hessian":
            H = vmap(hessian(f))(X)
        else:
            H = torch.stack([make[transform](f)(x) for x in X])
        torch.testing.assert_close(H, ref, rtol=0, atol=1e-12)
    assert float(ref.abs().max()) > 0  # the test sees a nonzero second derivative


def test_layer_takes_a_polyhedral_set_and_checks_its_arguments_when_built():
    P = pp.Polyhedron(A=[[1.0, 2.0, 3.0]], a=[1.0], lb=-np.ones(3))
    layer = ProjectionLayer(pp.sets.Polyhedral(P, "daqp"))
    x = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(layer(x), torch.as_tensor(pp.project(x.numpy(), P).y))
    with pytest.raises(pp.ProblemError, match="give its Polyhedron"):
        ProjectionLayer(pp.sets.Polyhedral(P), learn=("a",))
    with pytest.raises(pp.ProblemError, match="carries its own method"):
        ProjectionLayer(pp.sets.Polyhedral(P), backend="ipm")
    # learn: one name as a string; misspelt backends and fallbacks fail when the layer is built
    assert isinstance(ProjectionLayer(lb=[0.0, 0.0, 0.0], learn="lb").lb, torch.nn.Parameter)
    with pytest.raises(pp.ProblemError, match="lbx"):
        ProjectionLayer(lb=[0.0, 0.0, 0.0], learn="lbx")
    with pytest.raises(pp.BackendNotFound, match="nope"):
        ProjectionLayer(lb=[0.0, 0.0, 0.0], backend="nope")
    with pytest.raises(pp.BackendNotFound, match="proxsuite"):
        ProjectionLayer(lb=[0.0, 0.0, 0.0], backend="admm", fallback="proxsutie")
    with pytest.raises(pp.BackendNotFound, match="proxsuite"):  # the functional form: at once, not when needed
        project(x, lb=torch.zeros(3, dtype=torch.float64), backend="admm", fallback="proxsutie")
    # data that are not numbers: ProblemError naming the part
    with pytest.raises(pp.ProblemError, match="A must be an array.*Simplex"):
        project(x, "simplex")
    with pytest.raises(pp.ProblemError, match="lb must be an array"):
        project(x, lb="zero")
    with pytest.raises(pp.ProblemError, match="A must be an array"):
        project(x, [[1.0, "x", 2.0]], [1.0])


def test_forward_mode_and_vmap_over_a_sets_total_are_refused_not_silent():
    """A per-sample total is one of the set's data: reverse mode differentiates it; forward mode (jacfwd,
    forward_ad) raises as for constraint tensors (it gave a zero tangent, silently); vmap over it raises a
    ProblemError (a bare data-dependent-control-flow error of torch before)."""
    import torch.autograd.forward_ad as fwAD
    from torch.func import jacfwd, jacrev, vmap

    x = torch.randn(3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    for Set in (lambda tt: pp.sets.Simplex(6, total=tt), lambda tt: pp.sets.CappedSimplex(6, total=tt, upper=1.0)):
        f = lambda tt, Set=Set: project(x, Set(tt))  # noqa: E731
        torch.testing.assert_close(jacrev(f)(t).sum(1).diagonal(), torch.ones(3, dtype=torch.float64))
        with pytest.raises(pp.ProblemError, match="forward-mode"):
            jacfwd(f)(t)
        with fwAD.dual_level(), pytest.raises(pp.ProblemError, match="forward-mode"):
            f(fwAD.make_dual(t, torch.ones(3, dtype=torch.float64)))
        with pytest.raises(pp.ProblemError, match="vmap over a set's total"):
            vmap(lambda z, tt, Set=Set: project(z, Set(tt[None])))(x, t)


def test_layer_under_inference_mode_scalar_right_hand_sides_and_legacy_batching(rng):
    """A second new user's trial: a layer built or moved under ``torch.inference_mode`` (its buffers have no
    version counter) works in and out of that mode; scalar ``a`` / ``b`` are stored with one entry per row
    (the layer could not be called before); torch's legacy batching through a NumPy backward is a
    ProblemError pointing to torch.func, and the simplex's torch backward still runs there."""
    dt = torch.float64
    A, a = [[1.0, 1.0]], [1.0]
    x = torch.tensor(3 * rng.normal(size=(5, 2)))
    ref = project(x, torch.tensor(A, dtype=dt), torch.tensor(a, dtype=dt))
    with torch.inference_mode():
        built = ProjectionLayer(A=A, a=a)
        torch.testing.assert_close(built(x), ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(built(x), ref, rtol=0, atol=1e-12)
    moved = ProjectionLayer(A=A, a=a)
    with torch.inference_mode():
        moved.float()
    torch.testing.assert_close(moved(x.float()), ref.float(), rtol=0, atol=1e-6)
    moved.A = torch.tensor([[1.0, -1.0]])  # a new buffer is still seen after the inference copy
    assert moved(torch.tensor([[3.0, 0.0]])).tolist() == [[2.0, 1.0]]

    for kw, rows in ((dict(A=A, a=1.0), "a"), (dict(B=A, b=1.0), "b")):
        for structured in (True, False):
            layer = ProjectionLayer(**kw, lb=0.0, structured=structured)
            assert getattr(layer, rows).shape == (1,) and layer.lb.shape == (2,)
            want = project(x, *(torch.tensor(A, dtype=dt), torch.ones(1, dtype=dt)) if rows == "a" else (),
                           **({} if rows == "a" else dict(B=torch.tensor(A, dtype=dt), b=torch.ones(1, dtype=dt))),
                           lb=torch.zeros(2, dtype=dt))
            torch.testing.assert_close(layer(x), want, rtol=0, atol=1e-12)
    assert "lower bounds=2" in repr(ProjectionLayer(A=A, a=1.0, lb=0.0, structured=False))

    def poly(z):
        return project(z, torch.tensor(A, dtype=dt), torch.tensor(a, dtype=dt))

    with pytest.raises(pp.ProblemError, match="legacy batching.*torch.func"):
        torch.autograd.functional.jacobian(poly, x, vectorize=True)
    J = torch.autograd.functional.jacobian(poly, x)  # the loop of torch.autograd works
    torch.testing.assert_close(J, torch.func.jacrev(poly)(x), rtol=0, atol=1e-12)

    def simplex(z):
        return project(z, pp.sets.Simplex(2))

    torch.testing.assert_close(torch.autograd.functional.jacobian(simplex, x, vectorize=True),
                               torch.func.jacrev(simplex)(x), rtol=0, atol=1e-12)


def test_vmap_over_x_with_a_per_sample_total_serves_every_slice():
    """A (batch,) total given outside the vmapped function, as the refusal of vmap over a total advises: each
    slice of the vmap has that batch, and the fold gave the set 8 points for 2 totals (a ProblemError)."""
    x = torch.randn(4, 2, 3, dtype=torch.float64)
    t = torch.tensor([1.0, 2.0], dtype=torch.float64, requires_grad=True)
    S = pp.sets.Simplex(3, total=t)
    y = torch.func.vmap(lambda z: project(z, S))(x)
    loop = torch.stack([project(xi, S) for xi in x])
    torch.testing.assert_close(y, loop)
    (g_vmap,) = torch.autograd.grad((y ** 2).sum(), t)
    (g_loop,) = torch.autograd.grad((torch.stack([project(xi, S) for xi in x]) ** 2).sum(), t)
    torch.testing.assert_close(g_vmap, g_loop)
    fixed = pp.sets.Simplex(3, total=np.array([1.0, 2.0]))  # a NumPy total: no gradient, the same tiling
    torch.testing.assert_close(torch.func.vmap(lambda z: project(z, fixed))(x).sum(-1),
                               torch.tensor([[1.0, 2.0]] * 4, dtype=torch.float64))


def test_box_bounds_that_require_grad_are_refused_not_dropped():
    """Box holds its bounds as NumPy: lb.grad and ub.grad stayed None without a word."""
    lb = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(pp.ProblemError, match="Box holds fixed bounds.*project\\(x, lb=lb, ub=ub\\)"):
        pp.sets.Box(lb, torch.ones(3, dtype=torch.float64))
    x = torch.tensor([[-2.0, 0.5, 3.0]], dtype=torch.float64, requires_grad=True)
    ub = torch.ones(3, dtype=torch.float64, requires_grad=True)
    project(x, lb=lb, ub=ub).sum().backward()  # the form that differentiates the bounds
    assert lb.grad.tolist() == [1.0, 0.0, 0.0] and ub.grad.tolist() == [0.0, 0.0, 1.0]


def test_data_gradient_at_a_vertex_does_not_grow_with_the_distance():
    """At a vertex J = 0 and dL/dA = −r yᵀ, whatever x; J g computed as g − Mᵀr left ~eps |g|, which the gradient
    of A multiplies by the row's multiplier (~|x|): 1e-3 relative error at |x| 1e12, on both paths."""
    A0 = torch.tensor([[1.0, 0.3], [0.2, 1.0]], dtype=torch.float64)
    a = torch.tensor([1.0, 1.0], dtype=torch.float64)
    g = torch.tensor([0.7, -1.3], dtype=torch.float64)
    vertex = torch.linalg.solve(A0, a)
    exact = -torch.outer(torch.linalg.solve(A0.T, g), vertex)
    for scale in (1.0, 1e6, 1e12):
        for N in (1, 2000):  # the direct path and the pipeline
            x = (scale * torch.tensor([[3.0, 2.0]], dtype=torch.float64)).expand(N, 2).contiguous()
            A = A0.clone().requires_grad_(True)
            y = project(x, A, a)
            G = torch.zeros(N, 2, dtype=torch.float64)
            G[0] = g
            y.backward(G)
            assert float((y[0] - vertex).abs().max()) <= 1e-14
            assert float((A.grad - exact).abs().max() / exact.abs().max()) <= 1e-12, (scale, N)


def test_layer_names_x_when_its_last_dimension_is_wrong():
    """A layer's constraints are its own: x of the wrong width is what is wrong. The message blamed the layer's
    data (``A must have shape (r, 5) ... to match x, got (5, 4)``; a bounds-only layer: ``lb must have shape``)."""
    x = torch.ones(2, 5, dtype=torch.float64)
    for layer in (ProjectionLayer(A=np.ones((5, 4)), a=np.ones(5), lb=-np.ones(4)),
                  ProjectionLayer(lb=-np.ones(4), ub=np.ones(4), structured=False)):
        with pytest.raises(pp.ProblemError, match=r"x must have shape \(\.\.\., 4\).*got \(2, 5\)"):
            layer(x)


def test_hessian_vectorize_true_names_torch_func():
    """The graph of the backward (create_graph, as hessian differentiates the gradient) meets torch's legacy
    batching too: the same ProblemError as jacobian's, not torch's 'Batching rule not implemented'."""
    A, a = torch.tensor([[1.0, 1.0]], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    x = torch.tensor([[2.0, 0.5]], dtype=torch.float64)
    with pytest.raises(pp.ProblemError, match="legacy batching.*torch.func"):
        torch.autograd.functional.hessian(lambda z: (project(z, A, a) ** 2).sum(), x, vectorize=True)
    H = torch.autograd.functional.hessian(lambda z: (project(z, A, a) ** 2).sum(), x)  # the loop works
    torch.testing.assert_close(H, torch.func.hessian(lambda z: (project(z, A, a) ** 2).sum())(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("S", ["polyhedron", "simplex"])
def test_torch_func_vjp_function(S):
    """The function torch.func.vjp returns runs after the transform (grad enabled, nothing saved for a graph
    of the backward): J g as the autograd backward gives it."""
    A = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, -1.0]], dtype=torch.float64)
    a = torch.tensor([1.0, 0.5], dtype=torch.float64)
    f = (lambda z: project(z, A, a)) if S == "polyhedron" else (lambda z: project(z, pp.sets.Simplex(3)))
    x = torch.tensor([[2.0, 0.3, -1.0], [0.1, 0.2, 0.3]], dtype=torch.float64)
    g = torch.tensor([[1.0, -2.0, 0.5], [0.3, 0.1, -1.0]], dtype=torch.float64)
    xx = x.clone().requires_grad_()
    f(xx).backward(g)
    _, vjp_fn = torch.func.vjp(f, x)
    torch.testing.assert_close(vjp_fn(g)[0], xx.grad, rtol=0, atol=1e-14)
    torch.testing.assert_close(torch.func.vmap(vjp_fn)(g[None])[0][0], xx.grad, rtol=0, atol=1e-14)


def test_torch_func_on_an_empty_batch():
    A, a = torch.tensor([[1.0, 1.0]], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    f = lambda z: project(z, A, a)  # noqa: E731
    assert torch.func.jacrev(f)(torch.zeros(0, 2, dtype=torch.float64)).shape == (0, 2, 0, 2)
    assert torch.func.vmap(f)(torch.zeros(0, 2, dtype=torch.float64)).shape == (0, 2)
    assert torch.func.vmap(f)(torch.zeros(3, 0, 2, dtype=torch.float64)).shape == (3, 0, 2)
    x = torch.zeros(0, 2, dtype=torch.float64)
    Ar = A.clone().requires_grad_()
    J = torch.func.jacrev(lambda B: project(x, B, a), argnums=0)(Ar)
    assert J.shape == (0, 2, 1, 2)


def test_layer_refuses_a_polyhedron_with_more_data():
    P = pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0])
    with pytest.raises(pp.ProblemError, match="not both"):
        ProjectionLayer(P, lb=torch.zeros(2, dtype=torch.float64))
    with pytest.raises(pp.ProblemError, match="not both"):
        project(torch.zeros(1, 2, dtype=torch.float64), P, lb=torch.zeros(2, dtype=torch.float64))


def test_meta_tensors_are_named_not_raw_torch_errors():
    """Tensors on the 'meta' device (a shape, no values) were read by .item() / .numpy() inside the library and
    raised torch's own RuntimeError / NotImplementedError; now a ProblemError naming the tensor, on every entry."""
    n = 4
    meta = {"device": "meta", "dtype": torch.float64}
    calls = {
        "x": lambda: project(torch.randn(4, n, **meta), pp.sets.Simplex(n)),
        "A": lambda: project(torch.randn(4, n, dtype=torch.float64), torch.randn(2, n, **meta), torch.ones(2)),
        "lb": lambda: project(torch.randn(4, n, dtype=torch.float64), lb=torch.zeros(n, **meta), ub=torch.ones(n)),
        "A ": lambda: ProjectionLayer(A=torch.randn(2, n, **meta), a=torch.ones(2, **meta)),
        "the layer's A": lambda: ProjectionLayer(A=torch.randn(2, n), a=torch.ones(2)).to("meta")(
            torch.randn(4, n, dtype=torch.float64)),
    }
    for name, call in calls.items():
        with pytest.raises(pp.ProblemError, match=f"{name.strip()} is on the 'meta' device"):
            call()


def test_a_recognised_layer_passes_gradients_to_its_data_and_forward_mode_in_x_with_learned_data():
    """Probe, 2026-12-06. (1) A layer recognised as a structured set (here the simplex) projected through host
    copies of its buffers: b made to require grad or swapped for a parameter by functional_call got no gradient
    (None, silently) or torch's RuntimeError about a tensor without storage; such data go the general way now.
    (2) torch fills a zero tangent for Function inputs that require grad: jacfwd / hessian in x were refused on
    layers with learned data ("forward-mode derivatives with respect to constraint tensors")."""
    n = 4
    ones, zeros = torch.ones(1, n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    x = torch.tensor([[0.3, -0.2, 0.9, 0.1], [1.5, 0.2, -0.4, 0.7]], dtype=torch.float64)
    W = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    project(x, B=ones, b=ref, lb=zeros).mul(W).sum().backward()
    L = ProjectionLayer(B=ones, b=[1.0], lb=zeros)
    assert L.set is not None  # recognised
    L.b.requires_grad_(True)
    L(x).mul(W).sum().backward()
    torch.testing.assert_close(L.b.grad, ref.grad)
    b = torch.tensor([1.0], dtype=torch.float64)
    g = torch.func.grad(lambda p: torch.func.functional_call(L, p, (x,)).mul(W).sum())({"b": b})
    torch.testing.assert_close(g["b"], ref.grad)
    A = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, -1.0, 0.5]], dtype=torch.float64)
    a = torch.tensor([0.8, 0.3], dtype=torch.float64)
    learned, fixed = ProjectionLayer(A=A, a=a, lb=zeros, learn=("a",)), ProjectionLayer(A=A, a=a, lb=zeros)
    x0 = torch.tensor([0.9, 0.4, -0.3, 0.2], dtype=torch.float64)
    torch.testing.assert_close(torch.func.jacfwd(learned)(x0), torch.func.jacfwd(fixed)(x0))
    torch.testing.assert_close(torch.func.jacfwd(learned)(x0), torch.func.jacrev(fixed)(x0))
    H = torch.func.hessian(lambda z: (learned(z) ** 3).sum())(x0)
    assert H.shape == (n, n) and torch.isfinite(H).all()


# ------------------------------------------------------------------ a probe: second order, threads, odd layers
def test_torch_func_second_derivatives_through_the_data_are_refused_not_zero():
    """jacrev(jacrev(f)) in the constraint data returned zeros (the backward's products, a Function of the output
    gradient alone, looked constant in the data); an inner torch.func.grad in x then an eager backward to A gave a
    gradient without J's own dependence on A. Eager create_graph refused both: now every path does. A derivative
    in x alone of a layer with learned data is not such a derivative: it is given (eager double backward refused
    it because the data require grad)."""
    from torch.func import grad, jacrev

    A = torch.tensor([[1.0, 2.0, 0.5], [0.3, -1.0, 1.0]], dtype=torch.float64)
    a0 = torch.tensor([1.0, 0.5], dtype=torch.float64)
    x = torch.tensor([[0.9, 0.8, -0.3], [1.2, -0.5, 0.9]], dtype=torch.float64)

    def f(a):
        return (project(x, A, a) ** 2).sum()

    with pytest.raises(pp.ProblemError, match="second derivatives through the constraint data"):
        jacrev(jacrev(f))(a0)
    with pytest.raises(pp.ProblemError, match="second derivatives through the constraint data"):
        jacrev(jacrev(lambda t: (project(x[:1], pp.sets.Simplex(3, t)) ** 2).sum()))(
            torch.tensor([2.0], dtype=torch.float64))
    A_ = A.clone().requires_grad_()
    gx = grad(lambda xx: (project(xx, A_, a0) ** 3).sum())(x)
    with pytest.raises(pp.ProblemError, match="second derivatives through the constraint data"):
        (gx * torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)).sum().backward()
    # first derivatives in the data are unchanged: jacrev(f) equals the eager gradient
    a = a0.clone().requires_grad_()
    f(a).backward()
    torch.testing.assert_close(jacrev(f)(a0), a.grad)
    # a Hessian-vector product in x with learned data, eager and torch.func alike
    w = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    xs = x.clone().requires_grad_()
    hv = {}
    for learn in ((), ("a",)):
        layer = ProjectionLayer(A=A, a=a0, lb=[-1.0] * 3, learn=learn)
        g, = torch.autograd.grad((layer(xs) ** 3).sum(), xs, create_graph=True)
        hv[learn], = torch.autograd.grad((g * w).sum(), xs)
    torch.testing.assert_close(hv[()], hv[("a",)])


def test_silenced_stdout_of_interleaved_threads_is_restored():
    """Two threads' silenced blocks interleaved (OSQP / HiGHS solves from a thread pool): each saved the other's
    redirection and restored it last, leaving fd 1 at /dev/null and sys.stdout a discarded buffer for good."""
    import os
    import sys
    import threading

    from polyproj.backends.quiet import c_stdout_silenced

    before, out = os.fstat(1), sys.stdout
    entered, leave = threading.Event(), threading.Event()

    def first():
        with c_stdout_silenced():
            entered.set()
            leave.wait(5)

    t = threading.Thread(target=first)
    t.start()
    entered.wait(5)
    with c_stdout_silenced():  # enters while the first is open, leaves after it
        leave.set()
        t.join(5)
    after = os.fstat(1)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino) and sys.stdout is out


def test_layers_of_meta_or_bfloat16_data_are_refused_by_name():
    kw = dict(A=[[1.0, 2.0, 0.0]], a=[1.0], lb=[0.0] * 3)
    x = torch.randn(4, 3, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            layer = ProjectionLayer(**kw)
    with pytest.raises(pp.ProblemError, match="'meta' device"):
        layer(x.double())
    with pytest.raises(pp.ProblemError, match="has dtype torch.bfloat16"):
        ProjectionLayer(**kw).bfloat16()(x)


def test_the_conversion_cache_is_safe_across_threads():
    """An entry evicted by one thread between another's lookup and its move_to_end raised KeyError there."""
    import sys
    import threading

    from polyproj.backends.cache import converted

    class Obj:
        pass

    errors: list[str] = []

    def worker():
        keep = [Obj() for _ in range(6)]
        try:
            for it in range(30000):
                converted("race", (keep[it % 6],), None, lambda: 1)
                if it % 50 == 0:
                    keep[it % 6] = Obj()
        except Exception as exc:  # what the race raised is the finding
            errors.append(repr(exc))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []


def test_derivatives_in_x_alone_after_torch_func_with_learned_data():
    """torch.func.grad in x, then an eager derivative in x only; the double-vjp trick on a learned layer: both were
    refused once the backward took the data as inputs (a review): only a pass that reaches the data is."""
    from torch.func import grad, vjp

    A = torch.tensor([[1.0, 2.0, 0.5], [0.3, -1.0, 1.0]], dtype=torch.float64)
    a0 = torch.tensor([1.0, 0.5], dtype=torch.float64)
    x = torch.tensor([[0.9, 0.8, -0.3], [1.2, -0.5, 0.9]], dtype=torch.float64)
    hv = {}
    for learned in (False, True):
        A_ = A.clone().requires_grad_(learned)
        x_ = x.clone().requires_grad_()
        gx = grad(lambda xx, A_=A_: (project(xx, A_, a0) ** 3).sum())(x_)
        hv[learned], = torch.autograd.grad(gx.sum(), x_)
    torch.testing.assert_close(hv[True], hv[False])
    jv = {}
    v = torch.tensor([[1.0, -1.0, 0.5], [0.2, 0.3, -0.4]], dtype=torch.float64)
    for learn in ((), ("a",)):
        layer = ProjectionLayer(A=A, a=a0, lb=[-1.0] * 3, learn=learn)
        y, f = vjp(layer, x)
        u = torch.zeros_like(y, requires_grad=True)
        g, = f(u)
        jv[learn], = torch.autograd.grad(g, u, grad_outputs=v)
    torch.testing.assert_close(jv[()], jv[("a",)])


def test_a_forked_child_is_not_held_by_another_threads_silenced_block():
    """A fork while another thread held the silencing lock left the child's first silenced block waiting forever."""
    import os
    import signal
    import threading

    from polyproj.backends.quiet import c_stdout_silenced

    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            with c_stdout_silenced():
                pass

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    hung = 0
    try:
        for _ in range(10):
            pid = os.fork()
            if pid == 0:  # the child: one silenced block, a watchdog for a hang
                signal.alarm(5)
                with c_stdout_silenced():
                    pass
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            hung += os.WIFSIGNALED(status)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert hung == 0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.trace's own
def test_a_given_twice_is_refused_and_tracing_is_named():
    """A positionally and as A=: the keyword was dropped silently; torch.jit.trace and torch.export failed with
    torch's own internal errors (a probe)."""
    A1, A2 = np.ones((1, 3)), 2.0 * np.ones((1, 3))
    x = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(pp.ProblemError, match="A is given twice"):
        project(x, A1, [1.0], A=A2)
    with pytest.raises(pp.ProblemError, match="A is given twice"):
        ProjectionLayer(A1, [1.0], A=A2)
    layer = ProjectionLayer(A=A1, a=[1.0], lb=np.zeros(3))
    with pytest.raises(pp.ProblemError, match="torch.compile works"):
        torch.jit.trace(layer, x, check_trace=False)
    with pytest.raises(pp.ProblemError, match="torch.compile works"):
        torch.export.export(layer, (x,))
