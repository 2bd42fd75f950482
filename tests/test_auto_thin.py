"""``backend="auto"`` on long thin polytopes (m >= AUTO_THIN n rows of A): DAQP per point at any batch size.

The ADMM start identifies faces poorly there (docs/performance.md, "Long thin polytopes"): its polish took
many rounds and left samples to the batched IPM, 10-75x slower than DAQP from 1,025 points on. The rule
only picks the backend; the answers are the exact projections either way.
"""

from __future__ import annotations

import numpy as np
import pytest

import polyproj as pp
from polyproj.backends.defaults import AUTO_THIN, auto_projection, direct_points, thin
from polyproj.projection import direct

pytest.importorskip("daqp")


def polytope(n: int, m: int, batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x0 = rng.normal(size=n)
    A = rng.normal(size=(m, n))
    a = A @ x0 + rng.uniform(0.1, 1.0, size=m)
    return pp.Polyhedron(A=A, a=a, lb=x0 - 2.0, ub=x0 + 2.0), x0 + 3.0 * rng.normal(size=(batch, n))


def test_thin_rule():
    assert thin(10, int(AUTO_THIN * 10)) and not thin(10, int(AUTO_THIN * 10) - 1)
    assert not thin(None, 100) and not thin(10, None)
    assert not thin(2, 8) and thin(2, 16) and thin(4, 12)  # tiny n: the batched start up to 8n rows
    # thin: DAQP on the CPU whatever the batch; not thin: the batch rule as before; per-sample data: the IPM
    assert auto_projection(True, 4096, n=50, m=150) == "daqp"
    assert auto_projection(True, 4096, n=50, m=100) == "admm"
    assert auto_projection(True, 4096, on_cpu=False, n=50, m=500) == "admm"
    assert auto_projection(False, 4096, n=50, m=500) == "ipm"
    assert auto_projection(True, None, n=50, m=500) == "admm"  # no batch known: the batched start
    assert auto_projection(True, 4, n=50) == "daqp"  # small batches unchanged


@pytest.mark.parametrize(("n", "m", "batch"), [(10, 200, direct.DIRECT_BATCH + 3), (40, 160, 200)])
def test_thin_polytope_projects_by_daqp_and_exactly(n, m, batch):
    """Past the direct path's batch limits a thin polytope still goes point by point, polished exactly; the
    answers agree with the ADMM start's (both polished: the exact projection) and satisfy the KKT sign test."""
    P, X = polytope(n, m, batch)
    assert batch > direct_points(n) or batch > direct.DIRECT_BATCH
    res = pp.project(X, P)
    assert res.backend == "daqp" and bool(np.all(res.polished))
    ref = pp.project(X[:40], P, backend="admm")
    assert bool(np.all(ref.polished))
    scale = 1 + np.abs(ref.y).max()
    np.testing.assert_allclose(res.y[:40], ref.y, rtol=0, atol=1e-9 * scale)
    assert res.max_violation <= 1e-9 * scale
    # variational inequality at vertices of the set: <x - y, v - y> <= 0 for feasible v (the other projections)
    Y = np.asarray(res.y)
    R = X - Y
    G = R @ Y.T - np.sum(R * Y, axis=1)[:, None]
    assert G.max() <= 1e-8 * scale ** 2 * (1 + np.abs(X).max())


def test_thin_polytope_through_the_layer():
    """The torch layer takes the same rule (Polyhedral's choice) and its backward is the HS-Jacobian's."""
    torch = pytest.importorskip("torch")
    from polyproj.adapters.torch import ProjectionLayer

    P, X = polytope(8, 64, 40, seed=3)
    x = torch.tensor(X, requires_grad=True)
    V = torch.randn(40, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = ProjectionLayer(P)(x)
    (y * V).sum().backward()
    res = pp.project(X, P)
    np.testing.assert_allclose(y.detach().numpy(), res.y, rtol=0, atol=1e-10)
    ref = pp.hs_vjp(P, res.active, V.numpy())
    np.testing.assert_allclose(x.grad.numpy(), ref, rtol=0, atol=1e-9)
