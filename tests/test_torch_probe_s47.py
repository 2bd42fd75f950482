"""The torch adapter, from a probe (each failing before its fix): points the polish did not verify got the
gradient of a face guessed from slacks within 100x the tolerance setting (dy/dx 0 where it is 1); polish=False
was accepted silently; crossing bounds raised ProblemError or InfeasibleError by path; extra_repr crashed on meta
tensors; an iterator for learn was consumed by its check; allow_dependent_rows was advised but refused by the
layer; a sparse x crashed inside torch; choose_backend crashed on simple inputs; learned data made under
torch.inference_mode failed with torch's own message."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import polyproj as pp  # noqa: E402
from polyproj.adapters.torch import ProjectionLayer, choose_backend, project  # noqa: E402
from polyproj.sets.polyhedral import Polyhedral  # noqa: E402

DT = torch.float64


def _jacobians(f, x):
    """(batch, n, n): each point's Jacobian of the row-wise map f (one backward per output coordinate)."""
    x = x.clone().requires_grad_()
    y = f(x)
    rows = [torch.autograd.grad(y[:, j].sum(), x, retain_graph=True)[0] for j in range(x.shape[1])]
    return torch.stack(rows, dim=1)


# ----------------------------------------------------------------------------- 1. unverified points
@pytest.mark.filterwarnings("ignore::polyproj.PolyprojWarning")
def test_an_unverified_point_inside_the_box_gets_the_identity():
    """x strictly inside the box, the sum row 8 away: no row is active, J = I (it was 0 in the first row: the
    upper bound 0.005 away counted active under a slack tolerance of 100 x eps_abs)."""
    pytest.importorskip("osqp")
    x = torch.tensor([[0.995, 0.5]], dtype=DT, requires_grad=True)
    A, a = torch.tensor([[1.0, 1.0]], dtype=DT), torch.tensor([10.0], dtype=DT)
    with pytest.warns(pp.PolyprojWarning, match="polish refused.*gradient .* approximate active set"):
        y = project(x, A, a, lb=-1.0, ub=1.0, backend="osqp", eps_abs=1e-4, eps_rel=1e-4, max_polish_iter=0)
    np.testing.assert_allclose(y.detach().numpy(), x.detach().numpy(), atol=1e-4)  # the backend's accuracy
    y[0, 0].backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[1.0, 0.0]])


@pytest.mark.filterwarnings("ignore::polyproj.PolyprojWarning")
def test_unverified_points_get_the_jacobian_of_the_exact_face():
    """OSQP at 1e-4 without polish rounds: every unverified point's Jacobian is the exact projection's (verified by
    the default path); before, points 5 and 19 were 0.44 and 0.57 off (a lower bound 0.013 away counted)."""
    pytest.importorskip("osqp")
    torch.manual_seed(40)
    n, m = 6, 8
    A = torch.randn(m, n, dtype=DT)
    a = torch.rand(m, dtype=DT) + 0.2
    x = torch.randn(20, n, dtype=DT) * 2
    S = Polyhedral(pp.Polyhedron(A=A.numpy(), a=a.numpy(), lb=-np.ones(n), ub=np.ones(n)), "osqp", eps_abs=1e-4,
                   eps_rel=1e-4, max_polish_iter=0)
    assert (~np.asarray(S.project_batch(x.numpy()).polished)).sum() >= 10  # the case at hand: unverified points
    J = _jacobians(lambda z: project(z, A, a, lb=-1.0, ub=1.0, backend="osqp", eps_abs=1e-4, eps_rel=1e-4,
                                     max_polish_iter=0), x)
    J0 = _jacobians(lambda z: project(z, A, a, lb=-1.0, ub=1.0), x)
    np.testing.assert_allclose(J.numpy(), J0.numpy(), atol=1e-8)


def test_an_interior_point_answer_shows_its_active_rows():
    """pp.project(polish=False) with the IPM: the active set is the exact one. At eps 1e-3 the IPM stops 0.019 from
    an inactive bound (multiplier 0.014 < slack: inactive; it was active by slack); at its default accuracy the
    active rows keep a slack mu / multiplier, which a slack rule alone misses (19 of 200 points)."""
    P1 = pp.Polyhedron(A=[[1.0, 1.0]], a=[10.0], lb=-np.ones(2), ub=np.ones(2))
    r = pp.project(np.array([[0.995, 0.5]]), P1, backend="ipm", eps_abs=1e-3, polish=False)
    assert abs(r.y[0, 0] - 0.995) > 1e-2  # the backend's point is loose
    np.testing.assert_array_equal(r.active, np.zeros((1, 5), dtype=bool))  # no row is active at 0.995 in [-1, 1]
    rng = np.random.default_rng(0)
    n, m = 10, 20
    P = pp.Polyhedron(A=rng.normal(size=(m, n)), a=rng.random(m) + 0.3, B=np.ones((1, n)), b=[0.5],
                      lb=-np.ones(n), ub=np.ones(n))
    X = 2 * rng.normal(size=(60, n))
    ref = pp.project(X, P)
    assert ref.polished.all() and ref.active.any(1).all()
    np.testing.assert_array_equal(pp.project(X, P, backend="ipm", polish=False).active, ref.active)


def test_polish_false_is_refused_by_the_adapter():
    """polish=False returned the IPM's point 1.4e-2 off with a zero gradient and no warning."""
    x = torch.tensor([[0.995, 0.5]], dtype=DT)
    A, a = torch.tensor([[1.0, 1.0]], dtype=DT), torch.tensor([10.0], dtype=DT)
    with pytest.raises(pp.SettingsError, match="polish=False .* torch adapter"):
        project(x, A, a, lb=-1.0, ub=1.0, backend="ipm", eps_abs=1e-3, polish=False)
    with pytest.raises(pp.SettingsError, match="polish=False"):
        ProjectionLayer(A, a, lb=-1.0, ub=1.0, backend="ipm", polish=False)
    P = pp.Polyhedron(A=A.numpy(), a=a.numpy(), lb=-np.ones(2), ub=np.ones(2))
    with pytest.raises(pp.SettingsError, match="Polyhedral set"):
        project(x, Polyhedral(P, "ipm", polish=False))
    with pytest.raises(pp.SettingsError, match="polish=False"):
        ProjectionLayer(Polyhedral(P, "ipm", polish=False))
    # polish=True is the default: the exact projection (x itself, inside the box)
    y = project(x, A, a, lb=-1.0, ub=1.0, backend="ipm", eps_abs=1e-3, polish=True)
    np.testing.assert_allclose(y.numpy(), x.numpy(), atol=1e-13)


# ----------------------------------------------------------------------------- 2. crossing bounds
def test_crossing_bounds_are_infeasible_on_every_path():
    x = torch.zeros(2, 3, dtype=DT)
    with pytest.raises(pp.InfeasibleError):
        project(x, lb=1.0, ub=0.0)
    with pytest.raises(pp.InfeasibleError, match=r"lb\[1\] = 2 > ub\[1\] = 0.5 \(1 such"):
        ProjectionLayer(lb=[0.0, 2.0, 0.0], ub=[1.0, 0.5, 1.0])
    for kw in ({"structured": True}, {"structured": False}, {"learn": ("lb",)}):
        L = ProjectionLayer(lb=[0.0] * 3, ub=[1.0] * 3, **kw)
        with torch.no_grad():
            L.lb.fill_(2.0)
        with pytest.raises(pp.InfeasibleError):
            L(x)
    # a shape error stays a ProblemError
    with pytest.raises(pp.ProblemError, match="ub must have shape"):
        ProjectionLayer(lb=[1.0, 1.0, 1.0], ub=[0.0, 0.0])


# ----------------------------------------------------------------------------- 3.-5. the layer
def test_extra_repr_on_meta():
    L = ProjectionLayer(torch.randn(3, 4, dtype=DT), torch.ones(3, dtype=DT), lb=-1.0)
    assert "inequalities=3" in repr(L) and "lower bounds=4" in repr(L) and "upper bounds=0" in repr(L)
    L.to("meta")
    text = repr(L)
    assert "inequalities=3" in text and "lower bounds=meta(4,)" in text and "upper bounds=0" in text


def test_learn_takes_any_iterable_once():
    A, a = torch.randn(3, 4, dtype=DT), torch.ones(3, dtype=DT)
    L = ProjectionLayer(A, a, learn=(k for k in ["A", "a"]))
    assert [k for k, _ in L.named_parameters()] == ["A", "a"]
    L(torch.randn(2, 4, dtype=DT) * 3).sum().backward()
    assert L.A.grad is not None and L.a.grad is not None
    assert [k for k, _ in ProjectionLayer(A, a, learn=iter(["a"])).named_parameters()] == ["a"]
    with pytest.raises(pp.ProblemError, match="learn takes an iterable"):
        ProjectionLayer(A, a, learn=5)


def test_the_layer_accepts_dependent_rows_when_asked():
    B, b = [[1.0, 1, 1, 1], [2.0, 2, 2, 2]], [1.0, 2.0]
    with pytest.raises(pp.ProblemError, match="allow_dependent_rows=True"):
        ProjectionLayer(B=B, b=b)
    L = ProjectionLayer(B=B, b=b, allow_dependent_rows=True)
    x = torch.tensor([[0.0, 1.0, 2.0, -1.0]], dtype=DT, requires_grad=True)
    y = L(x)
    # the hyperplane sum(y) = 1: y = x + (1 - sum x) / 4
    np.testing.assert_allclose(y.detach().numpy(), [[-0.25, 0.75, 1.75, -1.25]], atol=1e-12)
    np.testing.assert_allclose(y.detach().numpy(), project(x.detach(), B=torch.tensor(B, dtype=DT),
                                                           b=torch.tensor(b, dtype=DT)).numpy(), atol=1e-12)
    y[0, 0].backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0.75, -0.25, -0.25, -0.25]], atol=1e-12)
    assert isinstance(ProjectionLayer(B=[[1.0, 1, 1, 1]], b=[1.0], allow_dependent_rows=True), ProjectionLayer)
    with pytest.raises(pp.ProblemError, match="allow_dependent_rows must be True or False"):
        ProjectionLayer(B=B, b=b, allow_dependent_rows="yes")


# ----------------------------------------------------------------------------- 6.-8. inputs
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta", "ignore:The PyTorch API of nested tensors")
def test_a_sparse_x_is_used_dense():
    A, a = torch.tensor([[1.0, 1, 1, 1]], dtype=DT), torch.ones(1, dtype=DT)
    xd = torch.tensor([[0.5, 0.5, 0.0, 0.3], [0.0, 0.0, 2.0, 0.0]], dtype=DT)
    ref = project(xd, A, a, lb=0.0)
    # the simplex-like set {sum <= 1, y >= 0}: row 0 moves by (1.3 - 1) / 3 on its 3 positive coordinates
    np.testing.assert_allclose(ref.numpy(), [[0.4, 0.4, 0.0, 0.2], [0.0, 0.0, 1.0, 0.0]], atol=1e-12)
    for xs in (xd.to_sparse(), xd.to_sparse_csr()):
        np.testing.assert_allclose(project(xs, A, a, lb=0.0).numpy(), ref.numpy(), atol=1e-14)
    xs = xd.to_sparse().requires_grad_()
    project(xs, A, a, lb=0.0)[:, 0].sum().backward()
    # the dense gradient on x's pattern: row 0's face {sum = 1, y_2 = 0}, d y_0 / d x = [2/3, -1/3, 0, -1/3]
    np.testing.assert_allclose(xs.grad.to_dense().numpy(), [[2 / 3, -1 / 3, 0.0, -1 / 3], [0.0, 0.0, 0.0, 0.0]],
                               atol=1e-12)
    nested = torch.nested.nested_tensor([torch.zeros(4, dtype=DT), torch.zeros(4, dtype=DT)])
    with pytest.raises(pp.ProblemError, match="nested tensor"):
        project(nested, A, a)


def test_choose_backend_validates_its_inputs():
    for x in (torch.tensor(1.0), np.zeros((3, 5)), torch.zeros(3, 0)):
        with pytest.raises(pp.ProblemError, match="choose_backend: x must be a torch.Tensor"):
            choose_backend(x, True)
    with pytest.raises(pp.ProblemError, match="shared must be True or False"):
        choose_backend(torch.zeros(2, 3), "yes")
    from polyproj.backends.defaults import auto_projection

    assert choose_backend(torch.zeros(200, 3), True) == auto_projection(True, 200, True, n=3)
    assert choose_backend(torch.zeros(3), False) == auto_projection(False, 1, True, n=3)


def test_learned_data_made_under_inference_mode():
    A, a = torch.randn(3, 4, dtype=DT), torch.ones(3, dtype=DT)
    with torch.inference_mode():
        L = ProjectionLayer(A, a, learn=("A",))
    x = 3 * torch.randn(2, 4, dtype=DT)
    with pytest.raises(pp.ProblemError, match=r"A are inference tensors .* outside torch.inference_mode"):
        L(x)
    with pytest.raises(pp.ProblemError, match="inference tensors"):
        project(x, L.A, a)
    ref = project(x, A, a)
    with torch.inference_mode():  # inside the mode it projects
        np.testing.assert_allclose(L(x).numpy(), ref.numpy(), atol=1e-12)
    L.A = torch.nn.Parameter(L.A.clone())  # the advised fix
    y = L(x)
    np.testing.assert_allclose(y.detach().numpy(), ref.numpy(), atol=1e-12)
    y.sum().backward()
    assert L.A.grad is not None
