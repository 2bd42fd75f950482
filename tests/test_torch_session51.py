"""The torch adapter, from a probe (each failing before its fix): vmap(grad) with respect to a per-point simplex
total raised torch's shape error; eager forward-over-reverse in x was refused on a layer with learned a or bounds;
vmap tiled a third party's shared parameter whose length was the points of a slice; a layer did not own its set's
learnable total (not in parameters(), state_dict(), not moved by .to()); a per-sample buffer swapped in by
functional_call was refused unless it required grad."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.autograd.forward_ad as fwAD  # noqa: E402
from torch.func import functional_call, grad, jacrev, vmap  # noqa: E402

import polyproj as pp  # noqa: E402
from polyproj.adapters.torch import ProjectionLayer, project  # noqa: E402

DT = torch.float64


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- 1. vmap(grad) of a per-point total
@pytest.mark.parametrize("capped", [False, True])
def test_vmap_grad_of_a_per_point_total_is_each_slices_own(capped):
    """3 slices of 4 points, one total per point of a slice: the per-slice gradients (3, 4), as one eager backward
    per slice and as the rule dL/dt_i = mean of g over point i's free coordinates (torch raised "invalid gradient
    ... got [12] but expected [4]": the folded set's gradient was never cut back to the slice's own rows)."""
    n, N = 5, 4
    X = torch.randn(3, N, n, dtype=DT, generator=_gen(0))
    t = torch.rand(N, dtype=DT, generator=_gen(1)) + 0.5

    def mk(tt):
        return pp.sets.CappedSimplex(n, total=tt, upper=0.6) if capped else pp.sets.Simplex(n, total=tt)

    def f(x, tt):
        return project(x, mk(tt)).pow(3).sum()

    eager, rule = [], []
    for i in range(3):
        tt = t.clone().requires_grad_()
        f(X[i], tt).backward()
        eager.append(tt.grad)
        y = pp.project(X[i].numpy(), mk(t.numpy())).y
        free = (y > 1e-12) & (y < (0.6 - 1e-12 if capped else np.inf))
        rule.append(torch.tensor((3 * y ** 2 * free).sum(1) / free.sum(1)))
    eager, rule = torch.stack(eager), torch.stack(rule)
    torch.testing.assert_close(eager, rule, rtol=0, atol=1e-12)
    g = vmap(grad(f, argnums=1), in_dims=(0, None))(X, t)
    assert g.shape == (3, N)
    torch.testing.assert_close(g, rule, rtol=0, atol=1e-12)
    gx, gt = vmap(grad(f, argnums=(0, 1)), in_dims=(0, None))(X, t)  # with x: the mixed case
    torch.testing.assert_close(gt, rule, rtol=0, atol=1e-12)
    torch.testing.assert_close(gx, torch.stack([grad(f)(X[i], t) for i in range(3)]), rtol=0, atol=1e-12)
    torch.testing.assert_close(vmap(jacrev(f, argnums=1), in_dims=(0, None))(X, t), rule, rtol=0, atol=1e-12)
    t0 = torch.tensor(1.3, dtype=DT)  # a 0-d total: each slice's gradient is the sum over its own points
    shared = [pp.project(X[i].numpy(), mk(1.3)).y for i in range(3)]
    want = [(3 * y ** 2 * ((y > 1e-12) & (y < (0.6 - 1e-12 if capped else np.inf)))).sum(1)
            / ((y > 1e-12) & (y < (0.6 - 1e-12 if capped else np.inf))).sum(1) for y in shared]
    torch.testing.assert_close(vmap(grad(f, argnums=1), in_dims=(0, None))(X, t0),
                               torch.tensor([w.sum() for w in want], dtype=DT), rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- 2. eager forward-over-reverse
@pytest.mark.parametrize("learn", [("a",), ("lb",), ("a", "ub")])
def test_eager_forward_over_reverse_in_x_with_learned_right_hand_sides(learn):
    """Only x carries a tangent: the layer's learned a / bounds do not make the Hessian-vector product a second
    derivative through the data (it was refused: the graph node of the backward read zero-filled tangents on the
    data as tangents). The reference: Jᵀ (6 y ⊙ J v) with each point's Jacobian J (the map is piecewise linear)."""
    n, m, N = 4, 3, 3
    A = torch.randn(m, n, dtype=DT, generator=_gen(2))
    a = torch.rand(m, dtype=DT, generator=_gen(3))
    x = 2 * torch.randn(N, n, dtype=DT, generator=_gen(4))
    v = torch.randn(N, n, dtype=DT, generator=_gen(5))
    lb, ub = -torch.ones(n, dtype=DT), 2 * torch.ones(n, dtype=DT)

    def hvp(layer):
        with fwAD.dual_level():
            xd = fwAD.make_dual(x.clone().requires_grad_(), v)
            (g,) = torch.autograd.grad((layer(xd) ** 3).sum(), xd, create_graph=True)
            return fwAD.unpack_dual(g).tangent

    fixed = ProjectionLayer(A=A, a=a, lb=lb, ub=ub)
    y = fixed(x)
    J = torch.stack([torch.autograd.functional.jacobian(lambda z: fixed(z[None])[0], x[i]) for i in range(N)])
    want = torch.einsum("bji,bj->bi", J, 6 * y * torch.einsum("bij,bj->bi", J, v))
    torch.testing.assert_close(hvp(ProjectionLayer(A=A, a=a, lb=lb, ub=ub, learn=learn)), want, rtol=0, atol=1e-10)
    with pytest.raises(pp.ProblemError, match="with respect to A are not supported"):  # A still refused (docs)
        hvp(ProjectionLayer(A=A, a=a, lb=lb, ub=ub, learn=("A",)))


# ----------------------------------------------------------------------------- 3. a third party's parameters
class _HalfSpace(pp.Projector):
    """{y : w.y <= c}: w a shared (n,) tensor, c a number, a 0-d tensor or one per point (batch,)."""

    def __init__(self, w, c):
        self.w, self.c = w, c

    @property
    def n(self):
        return self.w.shape[-1]

    def parameters(self):
        return {"w": self.w, "c": self.c}

    def with_parameters(self, **v):
        return _HalfSpace(v.get("w", self.w), v.get("c", self.c))

    def project_batch(self, X):
        w = torch.as_tensor(self.w, dtype=X.dtype)
        ex = X @ w - torch.as_tensor(self.c, dtype=X.dtype)
        step = ex.clamp(min=0) / (w @ w)
        act = (ex >= 0)[:, None]
        return self.result(X, X - step[:, None] * w[None], active=act, multipliers=step[:, None], face=act)

    def vjp(self, res, G):
        w = torch.as_tensor(self.w, dtype=G.dtype)
        nrm = w / w.norm()
        return torch.where(res.face, G - (G @ nrm)[:, None] * nrm, G)

    def parameter_vjp(self, res, G, names):
        w = torch.as_tensor(self.w, dtype=G.dtype)
        per_point = torch.where(res.face[:, 0], G @ w, torch.zeros((), dtype=G.dtype)) / (w @ w)  # dy/dc = w/|w|²
        return {"c": per_point if torch.as_tensor(self.c).ndim else per_point.sum()}

    def as_polyhedron(self):
        return pp.Polyhedron(A=self.w.detach().numpy()[None], a=[0.0])


def _halfspace(X, w, c):
    """The projection onto {y : w.y <= c} in closed form (c broadcast over the points)."""
    return X - ((X @ w - c).clamp(min=0) / (w @ w))[..., None] * w


def test_vmap_keeps_a_third_party_sets_shared_parameter_shared():
    """A shared w of shape (n,) under vmap of slices of n points: w was tiled ("size mismatch"), as if one entry
    per point; a third party's set is projected slice by slice with its parameters as given (shared or per
    point), its derivatives per slice."""
    n = 3
    w = torch.tensor([1.0, -2.0, 0.5], dtype=DT)
    for N in (n, 4):
        X = torch.randn(2, N, n, dtype=DT, generator=_gen(N))
        torch.testing.assert_close(vmap(lambda z: project(z, _HalfSpace(w, 0.5)))(X), _halfspace(X, w, 0.5),
                                   rtol=0, atol=1e-14)
    X = torch.randn(2, n, n, dtype=DT, generator=_gen(7))  # a per-point c of length n: one per point of a slice
    c = torch.tensor([0.2, -0.1, 0.4], dtype=DT)
    torch.testing.assert_close(vmap(lambda z: project(z, _HalfSpace(w, c)))(X), _halfspace(X, w, c),
                               rtol=0, atol=1e-14)

    def loss(z, cc):
        return project(z, _HalfSpace(w, cc)).pow(2).mul(torch.arange(1.0, n + 1, dtype=DT)).sum()

    def by_hand(z, cc):  # d/dc of Σ k y² = Σ 2 k y_k w_k / |w|² on the points beyond the plane
        y = _halfspace(z, w, cc)
        return torch.where(z @ w - cc >= 0, (2 * y * torch.arange(1.0, n + 1, dtype=DT)) @ w / (w @ w), 0.0)

    torch.testing.assert_close(vmap(grad(loss, argnums=1), in_dims=(0, None))(X, c),
                               torch.stack([by_hand(X[i], c) for i in range(2)]), rtol=0, atol=1e-12)
    c0 = torch.tensor(0.1, dtype=DT)
    torch.testing.assert_close(vmap(grad(loss, argnums=1), in_dims=(0, None))(X, c0),
                               torch.stack([by_hand(X[i], c0).sum() for i in range(2)]), rtol=0, atol=1e-12)
    gx = vmap(grad(loss), in_dims=(0, None))(X, c)  # x's gradient per slice, as one eager backward each
    for i in range(2):
        xi = X[i].clone().requires_grad_()
        loss(xi, c).backward()
        torch.testing.assert_close(gx[i], xi.grad, rtol=0, atol=1e-14)


# ----------------------------------------------------------------------------- 4. the layer owns the set's tensors
def test_a_layer_owns_its_sets_learnable_total():
    """A Parameter total is the layer's parameter (an optimiser over model.parameters() steps it), a plain tensor
    total its buffer; both are in state_dict, moved by .float(), loaded by load_state_dict and swapped by
    functional_call, and the projection reads them (it had kept the set's own tensor)."""
    total = torch.nn.Parameter(torch.tensor(1.5, dtype=DT))
    layer = ProjectionLayer(pp.sets.Simplex(5, total=total))
    model = torch.nn.Sequential(torch.nn.Linear(3, 5).double(), layer)
    assert any(p is total for p in model.parameters()) and "1.set_data.total" in model.state_dict()
    x = torch.randn(8, 3, dtype=DT, generator=_gen(8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    (-model(x)[:, 0].sum()).backward()
    y = pp.project(model[0](x).detach().numpy(), pp.sets.Simplex(5, total=1.5)).y  # dy_i0/dt = [y_i0 > 0] / |F_i|
    g = -((y[:, 0] > 0) / (y > 0).sum(1)).sum()
    assert total.grad.item() == pytest.approx(g, abs=1e-12) and g != 0
    opt.step()
    assert total.item() == pytest.approx(1.5 - 0.1 * g, abs=1e-15) and total.item() != 1.5
    torch.testing.assert_close(model(x).sum(1), torch.full((8,), total.item(), dtype=DT), rtol=0, atol=1e-12)

    model.float()
    assert total.dtype == torch.float32
    torch.testing.assert_close(model(x.float()).sum(1), torch.full((8,), total.item()), rtol=0, atol=1e-5)

    per_point = torch.tensor([1.0, 2.0, 3.0], dtype=DT)  # a (batch,) total that needs no gradient: a buffer
    L = ProjectionLayer(pp.sets.Simplex(4, total=per_point))
    assert list(L.state_dict()) == ["set_data.total"] and not list(L.parameters())
    z = torch.randn(3, 4, dtype=DT, generator=_gen(9))
    L.load_state_dict({"set_data.total": torch.tensor([0.5, 0.25, 4.0], dtype=DT)})
    torch.testing.assert_close(L(z), torch.tensor(pp.project(z.numpy(), pp.sets.Simplex(4, total=np.array(
        [0.5, 0.25, 4.0]))).y), rtol=0, atol=1e-14)
    swapped = torch.tensor([2.0, 2.0, 2.0], dtype=DT, requires_grad=True)
    functional_call(L, {"set_data.total": swapped}, (z,)).sum().backward()
    torch.testing.assert_close(swapped.grad, torch.ones(3, dtype=DT), rtol=0, atol=1e-12)  # d Σy / dt = 1


def test_a_per_sample_buffer_swapped_in_without_grad_goes_the_general_way():
    """functional_call with a per-sample a (N, m): refused as "a must have shape (3,)" when it did not require
    grad (read as a Polyhedron to recognise a set in), accepted when it did."""
    n, m, N = 4, 3, 5
    A = torch.randn(m, n, dtype=DT, generator=_gen(10))
    a = torch.rand(m, dtype=DT, generator=_gen(11))
    x = 2 * torch.randn(N, n, dtype=DT, generator=_gen(12))
    ab = torch.rand(N, m, dtype=DT, generator=_gen(13))
    want = np.stack([pp.project(x[i].numpy(), pp.Polyhedron(A=A.numpy(), a=ab[i].numpy(), lb=-np.ones(n))).y
                     for i in range(N)])
    layer = ProjectionLayer(A=A, a=a, lb=-torch.ones(n, dtype=DT))
    for rg in (False, True):
        y = functional_call(layer, {"a": ab.clone().requires_grad_(rg)}, (x,))
        np.testing.assert_allclose(y.detach().numpy(), want, rtol=0, atol=1e-10)
    simplex = ProjectionLayer(B=[[1.0, 1.0, 1.0, 1.0]], b=[1.0], lb=[0.0] * 4)  # recognised: a simplex
    b = torch.tensor([[0.5], [1.0], [2.0], [3.0], [0.1]], dtype=DT)
    torch.testing.assert_close(functional_call(simplex, {"b": b}, (x,)).sum(1), b[:, 0], rtol=0, atol=1e-12)
