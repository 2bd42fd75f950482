"""The torch layer the way a training loop uses it, over several optimiser steps (a probe).

Found and fixed: ``ProjectionLayer(S)`` registered a set's tensor that needs no gradient (a simplex's total) as
its buffer *itself*, so ``load_state_dict`` (or ``layer.set_data.total.fill_``) wrote into the caller's tensor
and changed the set the caller still held. The rest pins what held: warm starts equal cold calls at every step
(batch size changing, points moving far, learned data stepped, train/eval, no_grad, inference_mode), state_dict /
deepcopy / pickle / torch.save round trips with no stale set after in-place edits, gradcheck over SGD steps, one
layer twice in a graph with retain_graph, float32 models and mixed dtypes, batch shapes with several leading
dimensions and empty batches.
"""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.autograd import gradcheck  # noqa: E402
from torch.func import functional_call  # noqa: E402

import polyproj as pp  # noqa: E402
import polyproj.adapters.torch as pt  # noqa: E402
from polyproj.adapters.torch import ProjectionLayer, project  # noqa: E402
from polyproj.errors import ProblemError  # noqa: E402

DT = torch.float64
PARTS = ("A", "a", "B", "b", "lb", "ub")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _data(n=6, m=10, seed=0):
    """A polytope around x0 (feasible by construction) with every kind of constraint."""
    rng = np.random.default_rng(seed)
    x0 = 0.1 * rng.standard_normal(n)
    A = rng.standard_normal((m, n))
    B = rng.standard_normal((1, n))
    return dict(A=A, a=A @ x0 + rng.random(m) + 0.1, B=B, b=B @ x0, lb=x0 - 2, ub=x0 + 3)


def _step(layer, opt, x, W):
    """One training step: the output, dL/dx and the data gradients (before the optimiser's step)."""
    xx = x.clone().requires_grad_(True)
    for p in layer.parameters():
        p.grad = None
    y = layer(xx)
    ((y * W).sum() + 0.5 * (y ** 2).sum()).div(max(1, x[..., 0].numel())).backward()
    out = [y.detach(), xx.grad] + [p.grad.clone() for p in layer.parameters()]
    if opt is not None:
        opt.step()
    return out


def _assert_same(r1, r2, tol=1e-12):
    for u, v in zip(r1, r2, strict=True):
        torch.testing.assert_close(u, v, rtol=0, atol=tol * (1 + float(v.detach().abs().amax()) if v.numel() else 1))


def _fresh(layer):
    """A cold layer built from ``layer``'s data as they are now."""
    d = {k: getattr(layer, k).detach().clone() for k in PARTS if getattr(layer, k, None) is not None}
    return ProjectionLayer(**d, learn=tuple(k for k, _ in layer.named_parameters(recurse=False)),
                           structured=False)


# ----------------------------------------------------------------------------- 1. warm starts in training
@pytest.mark.parametrize("host", [True, False])
def test_warm_start_equals_cold_over_a_training_loop(host, monkeypatch):
    """Warm and cold layers stepped by SGD side by side: outputs, dL/dx and data gradients equal at every step while
    the batch size changes (1, 7, 40, 1100: direct path and pipeline), the points move far (x 1e3), the layer is
    switched to eval, and calls under no_grad / inference_mode come between (host: NumPy views; else torch)."""
    if not host:
        monkeypatch.setattr(pt, "HOST_BATCH", 0)
    kw = _data(seed=1)
    learn = ("A", "a", "b", "lb")
    Lw = ProjectionLayer(**kw, learn=learn, warm_start=True)
    Lc = ProjectionLayer(**kw, learn=learn)
    ow, oc = (torch.optim.SGD(L.parameters(), lr=1e-2) for L in (Lw, Lc))
    g = _gen(2)
    plan = [(7, 1.0), (7, 1.0), (40, 3.0), (40, 1e3), (1, 1.0), (1100, 2.0), (1100, 2.0), (7, 1.0)]
    for step, (N, scale) in enumerate(plan):
        for L in (Lw, Lc):
            L.train(step % 3 != 1)
        x = scale * torch.randn(N, 6, dtype=DT, generator=g)
        W = torch.randn(N, 6, dtype=DT, generator=g)
        _assert_same(_step(Lw, ow, x, W), _step(Lc, oc, x, W))
        with torch.no_grad():
            _assert_same([Lw(x)], [Lc(x)])
        with torch.inference_mode():
            _assert_same([Lw(x)], [Lc(x)])
    # the stepped data are the cold layer's too: the warm layer used no stale set
    _assert_same([Lw(x)], [_fresh(Lc)(x)])


def test_warm_start_after_in_place_edits_and_load_state_dict():
    """A warm layer whose learned and fixed data are edited in place (add_, copy_, through .data, optimizer.step,
    load_state_dict) projects onto the new data: equal to a layer built cold from them."""
    kw = _data(seed=3)
    x = 2 * torch.randn(12, 6, dtype=DT, generator=_gen(4))
    W = torch.randn(12, 6, dtype=DT, generator=_gen(5))
    for learn in (("A", "a", "b"), ()):
        L = ProjectionLayer(**kw, learn=learn, warm_start=True, structured=False)
        L(x)
        with torch.no_grad():
            L.a.add_(0.3)
        _assert_same(_step(L, None, x, W), _step(_fresh(L), None, x, W))
        with torch.no_grad():
            L.A.copy_(L.A + 0.1 * torch.randn(10, 6, dtype=DT, generator=_gen(6)))
        _assert_same(_step(L, None, x, W), _step(_fresh(L), None, x, W))
        L.b.data.mul_(1.5)
        _assert_same(_step(L, None, x, W), _step(_fresh(L), None, x, W))
        if learn:
            torch.optim.SGD(L.parameters(), lr=1e-2).step()  # with the gradients of the last step
            _assert_same(_step(L, None, x, W), _step(_fresh(L), None, x, W))
        sd = {k: v + 0.05 for k, v in L.state_dict().items()}
        L.load_state_dict(sd)
        _assert_same(_step(L, None, x, W), _step(_fresh(L), None, x, W))


# ----------------------------------------------------------------------------- 2. saving and copying
@pytest.mark.parametrize("learn", [("A", "a", "b", "lb"), ()])
def test_state_dict_deepcopy_pickle_and_torch_save_round_trips(learn):
    """Each restored copy of a used warm layer gives the same outputs and gradients; editing a copy leaves the
    original as it was."""
    kw = _data(seed=7)
    L = ProjectionLayer(**kw, learn=learn, warm_start=True, structured=False)
    x = 2 * torch.randn(9, 6, dtype=DT, generator=_gen(8))
    W = torch.randn(9, 6, dtype=DT, generator=_gen(9))
    want = _step(L, None, x, W)
    buf = io.BytesIO()
    torch.save(L, buf)
    buf.seek(0)
    other = ProjectionLayer(**_data(seed=70), learn=learn, warm_start=True, structured=False)
    other(x)
    other.load_state_dict(L.state_dict())
    for restored in (copy.deepcopy(L), pickle.loads(pickle.dumps(L)), torch.load(buf, weights_only=False), other):
        assert restored._last is None or restored is other
        _assert_same(_step(restored, None, x, W), want)
    twin = copy.deepcopy(L)
    with torch.no_grad():
        twin.a.add_(0.5)
    _assert_same(_step(L, None, x, W), want)
    _assert_same(_step(twin, None, x, W), _step(_fresh(twin), None, x, W))


def test_a_layer_copies_the_sets_plain_tensor_total():
    """A tensor total that needs no gradient is copied into the layer's buffer: load_state_dict and in-place edits of
    the buffer change the layer's projection, not the caller's tensor or the set the caller still holds (they wrote
    into both). An nn.Parameter total stays the caller's own object (an optimiser steps it). The repr shows the total
the layer projects with (a meta one by name)."""
    per_point = torch.tensor([1.0, 2.0, 3.0], dtype=DT)
    S = pp.sets.Simplex(4, total=per_point)
    L = ProjectionLayer(S)
    z = torch.randn(3, 4, dtype=DT, generator=_gen(10))
    L.load_state_dict({"set_data.total": torch.tensor([0.5, 0.25, 4.0], dtype=DT)})
    torch.testing.assert_close(per_point, torch.tensor([1.0, 2.0, 3.0], dtype=DT), rtol=0, atol=0)
    torch.testing.assert_close(L(z).sum(1), torch.tensor([0.5, 0.25, 4.0], dtype=DT), rtol=0, atol=1e-12)
    torch.testing.assert_close(project(z, S).sum(1), per_point, rtol=0, atol=1e-12)
    scalar = torch.tensor(2.0, dtype=DT)
    L0 = ProjectionLayer(pp.sets.Simplex(4, total=scalar))
    L0.set_data.total.fill_(7.0)
    assert scalar.item() == 2.0
    assert "total=7" in repr(L0)  # the repr shows the layer's own total, the one it projects with
    torch.testing.assert_close(L0(z).sum(1), torch.full((3,), 7.0, dtype=DT), rtol=0, atol=1e-12)
    learned = torch.nn.Parameter(torch.tensor(1.5, dtype=DT))
    layer = ProjectionLayer(pp.sets.Simplex(4, total=learned))
    assert layer.set_data.total is learned
    for meta in (L0.to("meta"), layer.to("meta")):  # no value to show (Tensor.item() on a meta tensor had raised)
        assert "total on the 'meta' device" in repr(meta)


@pytest.mark.parametrize("make", ["recognised", "learned_total", "polyhedron"])
def test_structured_and_fixed_set_layers_survive_copies(make):
    """Layers of a recognised simplex, a learned simplex total and a Polyhedron: deepcopy, pickle, torch.save and
    state_dict give the same outputs; a recognised layer's loaded data are recognised again."""
    n = 5
    mk = {"recognised": lambda: ProjectionLayer(B=[[1.0] * n], b=[1.0], lb=[0.0] * n, warm_start=True),
          "learned_total": lambda: ProjectionLayer(pp.sets.Simplex(n, total=torch.nn.Parameter(
              torch.tensor(2.0, dtype=DT)))),
          "polyhedron": lambda: ProjectionLayer(pp.Polyhedron(**{k: v for k, v in _data(n, 7, 11).items()}),
                                                warm_start=True)}[make]
    L = mk()
    x = 2 * torch.randn(6, n, dtype=DT, generator=_gen(12))
    y0 = L(x)
    L(x)
    buf = io.BytesIO()
    torch.save(L, buf)
    buf.seek(0)
    L2 = mk()
    L2.load_state_dict(L.state_dict())
    for restored in (copy.deepcopy(L), pickle.loads(pickle.dumps(L)), torch.load(buf, weights_only=False), L2):
        torch.testing.assert_close(restored(x), y0, rtol=0, atol=1e-14)
    if make == "recognised":
        L2.load_state_dict({**L.state_dict(), "b": torch.tensor([3.0], dtype=DT)})
        torch.testing.assert_close(L2(x).sum(1), torch.full((6,), 3.0, dtype=DT), rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- 3. gradcheck while training
def test_gradcheck_over_three_sgd_steps_on_the_data():
    """gradcheck (float64) of x and every learned part at random points, between three SGD steps on the data, through
    the warm layer (functional_call) and the functional form."""
    n = 4
    L = ProjectionLayer(A=torch.randn(5, n, dtype=DT, generator=_gen(13)),
                        a=torch.rand(5, dtype=DT, generator=_gen(14)) + 0.5, B=torch.ones(1, n, dtype=DT), b=[1.0],
                        lb=-2 * torch.ones(n, dtype=DT), ub=3 * torch.ones(n, dtype=DT), learn=PARTS, warm_start=True)
    opt = torch.optim.SGD(L.parameters(), lr=1e-2)
    g = _gen(15)
    for _ in range(3):
        x = (3 * torch.randn(3, n, dtype=DT, generator=g)).requires_grad_(True)
        params = tuple(getattr(L, k) for k in PARTS)
        assert gradcheck(lambda x, *ps: functional_call(L, dict(zip(PARTS, ps, strict=True)), (x,)), (x, *params),
                         eps=1e-7, atol=1e-6, rtol=1e-5)
        assert gradcheck(lambda x, *ps: project(x, *ps), (x, *params), eps=1e-7, atol=1e-6, rtol=1e-5)
        opt.zero_grad()
        (L(x) ** 2).sum().backward()
        opt.step()


# ----------------------------------------------------------------------------- 4. graphs
@pytest.mark.parametrize("warm", [False, True])
def test_one_layer_twice_in_a_graph_two_layers_and_retain_graph(warm):
    """L(2 L(x) + 1) + L(x2) (batch sizes 8 and 5), then a second backward with retain_graph (gradients doubled),
    autograd.grad twice, and an old graph's backward after newer forwards: all equal to cold functional calls."""
    n = 5
    kw = _data(n, 6, 16)
    L1 = ProjectionLayer(**kw, learn=("A", "a"), warm_start=warm)
    L2 = ProjectionLayer(**kw, learn=("A", "a"), warm_start=warm)
    x = (3 * torch.randn(8, n, dtype=DT, generator=_gen(17))).requires_grad_(True)
    x2 = 3 * torch.randn(5, n, dtype=DT, generator=_gen(18))
    w = torch.arange(n, dtype=DT)
    loss = (L1(2 * L1(x) + 1) ** 2).sum() + (L1(x2) * w).sum() + L2(L1(x)).sum()
    loss.backward(retain_graph=True)
    first = [x.grad.clone(), L1.A.grad.clone(), L1.a.grad.clone(), L2.A.grad.clone()]

    A1, a1, A2, a2 = (torch.as_tensor(kw[k], dtype=DT).clone().requires_grad_(True) for k in ("A", "a", "A", "a"))
    xr = x.detach().clone().requires_grad_(True)
    rest = {k: torch.as_tensor(kw[k], dtype=DT) for k in ("B", "b", "lb", "ub")}

    def p1(t):
        return project(t, A1, a1, **rest)

    ref = (p1(2 * p1(xr) + 1) ** 2).sum() + (p1(x2) * w).sum() + project(p1(xr), A2, a2, **rest).sum()
    ref.backward()
    _assert_same(first, [xr.grad, A1.grad, a1.grad, A2.grad])
    loss.backward()
    _assert_same([x.grad, L1.A.grad, L1.a.grad, L2.A.grad], [2 * f for f in first])

    y = L1(x)
    s = (y ** 3).sum()
    _assert_same(torch.autograd.grad(s, [x, L1.A], retain_graph=True), torch.autograd.grad(s, [x, L1.A]))
    y_old = L1(x)
    for k in range(3):
        L1(x.detach() * (k + 5))
    _assert_same(torch.autograd.grad(y_old.sum(), [x]), torch.autograd.grad(p1(x).sum(), [x]))


# ----------------------------------------------------------------------------- 5. dtypes
def test_float32_models_and_mixed_dtypes():
    """A float32 layer on float32 inputs: float32 outputs and gradients within float32 rounding of float64; mixed
    float32 / float64 tensors are a ProblemError (layer and functional form); NumPy data take x's dtype."""
    kw = _data(seed=19)
    x64 = 2 * torch.randn(8, 6, dtype=DT, generator=_gen(20))
    W = torch.randn(8, 6, dtype=DT, generator=_gen(21))
    ref = _step(ProjectionLayer(**kw, learn=("A", "a")), None, x64, W)
    for warm in (False, True):
        L32 = ProjectionLayer(**kw, learn=("A", "a"), dtype=torch.float32, warm_start=warm)
        for _ in range(2):
            got = _step(L32, None, x64.float(), W.float())
            assert all(t.dtype == torch.float32 for t in got)
            for u, v in zip(got, ref, strict=True):
                torch.testing.assert_close(u.double(), v, rtol=0, atol=2e-5 * (1 + float(v.abs().max())))
    L64 = ProjectionLayer(**kw, learn=("A", "a"))
    with pytest.raises(ProblemError, match="dtype"):
        L64(x64.float())
    with pytest.raises(ProblemError, match="dtype"):
        ProjectionLayer(**kw, dtype=torch.float32)(x64)
    t = {k: torch.as_tensor(v, dtype=DT) for k, v in kw.items()}
    with pytest.raises(ProblemError, match="dtype"):
        project(x64.float(), **t)
    with pytest.raises(ProblemError, match="dtype"):
        project(x64, **{**t, "a": t["a"].float()})
    y = project(x64.float(), **kw)  # NumPy data: taken in x's dtype (documented)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), ref[0], rtol=0, atol=1e-5)


# ----------------------------------------------------------------------------- 6. shapes
@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("shape", [(2, 3), (3, 1, 2), (0,), (2, 0), ()])
def test_leading_dimensions_and_empty_batches(shape, warm):
    """x (..., n) with several leading dimensions gives the flattened batch's outputs and gradients reshaped; an empty
    batch gives empty outputs and zero data gradients of the data's shapes."""
    kw = _data(4, 5, 22)
    L = ProjectionLayer(**kw, learn=("A", "a", "b"), warm_start=warm)
    x = 3 * torch.randn(*shape, 4, dtype=DT, generator=_gen(23))
    W = torch.randn(*shape, 4, dtype=DT, generator=_gen(24))
    got = _step(L, None, x, W)
    assert got[0].shape == x.shape and got[1].shape == x.shape
    assert [g.shape for g in got[2:]] == [p.shape for p in L.parameters()]
    flat = _step(ProjectionLayer(**kw, learn=("A", "a", "b")), None, x.reshape(-1, 4), W.reshape(-1, 4))
    _assert_same(got, [flat[0].reshape(x.shape), flat[1].reshape(x.shape), *flat[2:]])
    if x.numel() == 0:
        assert all(float(g.abs().sum()) == 0 for g in got[2:])


def test_crossed_learned_bounds_name_the_coordinate_and_sample():
    """Learned bounds that cross during training: the InfeasibleError names the first crossing and its values."""
    x = torch.zeros(2, 3, dtype=torch.float64)
    lb = torch.tensor([0.0, 2.0, 0.0], dtype=torch.float64)
    with pytest.raises(pp.InfeasibleError, match=r"coordinate 1 \(lb 2 > ub 1\)"):
        project(x, lb=lb, ub=torch.ones(3, dtype=torch.float64))
    ub = torch.tensor([[1.0, 1.0, 1.0], [1.0, -1.0, -2.0]], dtype=torch.float64)
    with pytest.raises(pp.InfeasibleError, match=r"coordinate 1 of sample 1 \(lb 0 > ub -1, and elsewhere\)"):
        project(x, lb=torch.zeros(2, 3, dtype=torch.float64), ub=ub)
