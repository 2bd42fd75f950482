"""The torch layer's higher derivatives, from a probe (each failing before its fix): forward mode in x of the
gradient with respect to A (jacfwd, eager forward-over-reverse) was silently wrong; eager forward-over-reverse
dropped the tangent of dL/dx on the NumPy path; torch.autograd.functional.hvp (the double-backward trick) returned
zeros; a create_graph backward under forward AD raised torch's NotImplementedError."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.autograd.forward_ad as fwAD  # noqa: E402
import torch.autograd.functional as AF  # noqa: E402
from torch.func import grad, hessian, jacfwd  # noqa: E402

import polyproj as pp  # noqa: E402
from polyproj.adapters.torch import project  # noqa: E402

DT = torch.float64


def _data(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(3, n, dtype=DT, generator=g)
    a = torch.rand(3, dtype=DT, generator=g) + 0.2
    return A, a, -0.7 * torch.ones(n, dtype=DT), g


def test_jacfwd_of_the_gradient_in_a_is_refused_in_b_and_rhs_kept():
    A, a, lb, g = _data()
    x, w = 2 * torch.randn(5, 4, dtype=DT, generator=g), torch.randn(5, 4, dtype=DT, generator=g)

    def L(x, A, a):
        return ((project(x, A, a, lb=lb) ** 2) * w).sum()

    with pytest.raises(pp.ProblemError, match="forward-mode derivatives .* with respect to A"):
        jacfwd(lambda xx: grad(L, argnums=1)(xx, A, a))(x)
    # the gradient in a is linear in g with coefficients fixed by the active set: its jacfwd in x is right
    ga = lambda xx: grad(L, argnums=2)(xx, A, a)  # noqa: E731
    J = jacfwd(ga)(x)
    h = 1e-6
    fd = torch.stack([(ga(x + h * e.view_as(x)) - ga(x - h * e.view_as(x))) / (2 * h)
                      for e in torch.eye(x.numel(), dtype=DT)], -1).reshape(J.shape)
    np.testing.assert_allclose(J.numpy(), fd.numpy(), atol=1e-6)


def test_eager_forward_over_reverse():
    A, a, lb, g = _data()
    x, t, w = (torch.randn(2, 4, dtype=DT, generator=g) * s for s in (2.0, 1.0, 1.0))

    def gA(xx):  # per-sample A: the torch path
        Ar = A.expand(2, 3, 4).clone().requires_grad_()
        return torch.autograd.grad(((project(xx, Ar, a.expand(2, 3), lb=lb) ** 2) * w).sum(), Ar)[0]

    with fwAD.dual_level(), pytest.raises(pp.ProblemError, match="with respect to A"):
        gA(fwAD.make_dual(x, t))

    def gx(xx):  # shared data: the NumPy path; dL/dx = J (3 y² w), its tangent H t
        return torch.autograd.grad(((project(xx, A, a, lb=lb) ** 3) * w).sum(), xx)[0]

    with fwAD.dual_level():
        xd = fwAD.make_dual(x.clone().requires_grad_(), t)
        tan = fwAD.unpack_dual(gx(xd)).tangent
    assert tan is not None
    h = 1e-6
    fd = (gx((x + h * t).requires_grad_()) - gx((x - h * t).requires_grad_())) / (2 * h)
    np.testing.assert_allclose(tan.numpy(), fd.numpy(), atol=1e-6)
    assert float(fd.abs().max()) > 1e-3
    with fwAD.dual_level():  # a graph of the backward under forward AD: the same tangent, not NotImplementedError
        xd = fwAD.make_dual(x.clone().requires_grad_(), t)
        out = torch.autograd.grad(((project(xd, A, a, lb=lb) ** 3) * w).sum(), xd, create_graph=True)[0]
        np.testing.assert_allclose(fwAD.unpack_dual(out).tangent.detach().numpy(), fd.numpy(), atol=1e-6)


@pytest.mark.parametrize("kind", ["polyhedron", "simplex"])
def test_autograd_functional_hvp_equals_the_hessian(kind):
    A, a, lb, g = _data()
    w, v = torch.randn(4, dtype=DT, generator=g), torch.randn(4, dtype=DT, generator=g)
    if kind == "polyhedron":
        x = 2 * torch.randn(4, dtype=DT, generator=g)

        def phi(z):
            return ((project(z, A, a, lb=lb) ** 3) * w).sum()
    else:
        x = torch.tensor([0.5, 0.3, 0.4, -1.0], dtype=DT)

        def phi(z):
            return ((project(z, pp.sets.Simplex(4)) ** 3) * w).sum()

    want = hessian(phi)(x) @ v
    assert float(want.abs().max()) > 1e-3
    np.testing.assert_allclose(AF.hvp(phi, x, v)[1].numpy(), want.numpy(), atol=1e-12)
    np.testing.assert_allclose(AF.vhp(phi, x, v)[1].numpy(), want.numpy(), atol=1e-12)


def test_the_layer_s_set_cache_follows_the_registry():
    """A set cached for a backend name kept the class registered first after the name was registered again or
    removed (the NumPy path raised BackendNotFound)."""
    from polyproj.backends.clarabel import ClarabelSolver
    from polyproj.backends.osqp import OSQPSolver

    calls = []

    class First(ClarabelSolver):
        name = "probe_s46_mine"

        def solve(self, qp, warm_start=None):
            calls.append("First")
            return super().solve(qp, warm_start)

    class Second(OSQPSolver):
        name = "probe_s46_mine"

        def solve(self, qp, warm_start=None):
            calls.append("Second")
            return super().solve(qp, warm_start)

    A, a = torch.tensor([[1.0, 1.0]], dtype=DT), torch.tensor([1.0], dtype=DT)
    lb, x = torch.zeros(2, dtype=DT), torch.tensor([[2.0, 2.0]], dtype=DT)
    pp.register_backend("probe_s46_mine", First)
    try:
        project(x, A, a, lb=lb, backend="probe_s46_mine")
        assert calls == ["First"]
        calls.clear()
        pp.register_backend("probe_s46_mine", Second, overwrite=True)
        project(x, A, a, lb=lb, backend="probe_s46_mine")
        assert calls == ["Second"]
    finally:
        pp.unregister_backend("probe_s46_mine")
    with pytest.raises(pp.BackendNotFound):
        project(x, A, a, lb=lb, backend="probe_s46_mine")


def test_read_only_problem_arrays_reach_torch_without_a_warning():
    """A problem's arrays are read-only (problem._read_only); torch warns (once a process) on a read-only NumPy
    buffer it would share: every conversion copies such an array first. In a fresh process: torch's warning is
    given once per process, so a test in this one could not see it after any other test."""
    import subprocess
    import sys

    code = """
import warnings
warnings.simplefilter("error")
import numpy as np, torch, polyproj as pp
from polyproj.polydata import PolyData
from polyproj.sets.base import as_namespace
poly = pp.Polyhedron(A=[[1.0, 1.0]], a=[1.0], lb=[0.0, 0.0], ub=[2.0, 2.0])
X = torch.tensor([[2.0, 2.0], [0.1, -1.0]], dtype=torch.float64)
pp.sets.Box(poly.lb, poly.ub).project(X)
pp.project(X, poly)
PolyData.from_polyhedron(poly, like=X)
as_namespace(poly.a, X)
qp = pp.QP(P=np.eye(2), q=[-1.0, -1.0], C=[[1.0, 1.0]], l=[-np.inf], u=[1.0])
pp.solve_qp(qp, backend=pp.get_backend("ipm", namespace="torch"))
pp.solve_qp(qp, backend="daqp")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_recognised_layer_checks_dtypes_like_the_general_path():
    """A float32 simplex layer (recognised) took float64 x and returned float64, where one more constraint (the
    general path) raised: both raise."""
    from polyproj.adapters.torch import ProjectionLayer

    x = torch.randn(3, 4, dtype=DT)
    for structured in (True, False):
        layer = ProjectionLayer(B=[[1.0] * 4], b=[1.0], lb=[0.0] * 4, dtype=torch.float32, structured=structured)
        assert (layer.set is not None) == structured
        with pytest.raises(pp.ProblemError, match="B has dtype torch.float32 but x has torch.float64"):
            layer(x)
        assert layer(x.float()).dtype == torch.float32


def test_the_layer_s_flags_must_be_booleans():
    from polyproj.adapters.torch import ProjectionLayer

    P = pp.Polyhedron(B=np.ones((1, 4)), b=[1.0], lb=np.zeros(4))
    with pytest.raises(pp.ProblemError, match="structured must be True or False"):
        ProjectionLayer(P, structured="no")
    with pytest.raises(pp.ProblemError, match="warm_start must be True or False"):
        ProjectionLayer(P, warm_start="no")
    with pytest.raises(pp.ProblemError, match="structured must be True or False"):
        project(torch.zeros(1, 4, dtype=DT), P, structured="no")
