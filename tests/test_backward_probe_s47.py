"""The backward's rounding rule for ``J g`` is per entry (a probe of degenerate faces, 2026-12-07)."""

import numpy as np
import pytest

import polyproj as pp

torch = pytest.importorskip("torch")
from polyproj.adapters.torch import project  # noqa: E402


def test_a_lopsided_gradient_keeps_the_exact_free_part_of_j_g():
    """J = diag(0, 1, 1) at a point beyond the upper bound of x₀; g = (1e13, 1, 1): J g = (0, 1, 1) exactly. Judged
    against the row's largest |g| (1e13) the free entries were 'rounding' and the gradient came back all zero."""
    P = pp.Polyhedron(lb=np.zeros(3), ub=np.ones(3))
    x = torch.tensor([[5.0, 0.5, 0.5]], dtype=torch.float64, requires_grad=True)
    g = torch.tensor([[1e13, 1.0, 1.0]], dtype=torch.float64)
    project(x, P, structured=False).backward(g)
    assert x.grad.tolist() == [[0.0, 1.0, 1.0]]
    res = pp.project(x.detach().numpy(), P)
    assert pp.hs_vjp(P, res.active, g.numpy()).tolist() == [[0.0, 1.0, 1.0]]


def test_a_lopsided_gradient_keeps_the_data_gradient_of_a_free_coordinate():
    """Projecting (3, 0) onto {x₀ <= 1}: y = (1, 0), λ = 2; with g = (1e13, 1), dL/dA = −λ (J g)ᵀ − r yᵀ =
    [[−1e13, −2]] (finite differences: −2 for A₀₁); the −2 was lost with J g zeroed."""
    A = torch.tensor([[1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    a = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    x = torch.tensor([[3.0, 0.0]], dtype=torch.float64)
    g = torch.tensor([[1e13, 1.0]], dtype=torch.float64)
    project(x, A, a).backward(g)
    assert A.grad.tolist() == [[-1e13, -2.0]]
    # the finite difference of the entry that was lost, in float64 at unit scale
    h = 1e-6

    def loss(A01):
        y = project(x, torch.tensor([[1.0, A01]], dtype=torch.float64), a)
        return float((y * torch.tensor([[0.0, 1.0]], dtype=torch.float64)).sum())

    assert abs((loss(h) - loss(-h)) / (2 * h) - (-2.0)) < 1e-6


def test_rounding_at_a_vertex_is_still_zeroed_entry_by_entry():
    """At a vertex J = 0: g − Mᵀr is rounding in every entry and comes back exactly 0 (the data gradient at |x|
    1e12 depends on it, tests/test_torch_layer.py::test_data_gradient_at_a_vertex_does_not_grow_with_the_distance)."""
    A = torch.tensor([[1.0, 0.3], [0.2, 1.0]], dtype=torch.float64)
    a = torch.tensor([1.0, 1.0], dtype=torch.float64)
    x = torch.tensor([[3e12, 2e12]], dtype=torch.float64, requires_grad=True)
    project(x, A, a).backward(torch.tensor([[0.7, -1.3]], dtype=torch.float64))
    assert x.grad.tolist() == [[0.0, 0.0]]
