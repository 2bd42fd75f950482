"""The torch adapter's interoperability with torch's tracers, from a probe (each failing before its fix):
``torch.func.linearize`` and ``make_fx`` raised torch's "trying to get value out of a tracing tensor",
``torch.func.functionalize`` "NYI: Functionalize rule for custom_function_call", ``torch.jit.script`` a
TorchScript error naming a lambda of the adapter; each is now a ProblemError naming the tracer, and what works
(eager, torch.func's transforms, torch.compile) still gives the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.func import functionalize, jacrev, jvp, linearize, vmap  # noqa: E402
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import polyproj as pp  # noqa: E402
from polyproj.adapters.torch import ProjectionLayer, project  # noqa: E402

DT = torch.float64
N_ = 4


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _sets():
    """A structured set, a recognised layer and a polyhedral layer (the NumPy path)."""
    A = torch.tensor([[1.0, -1.0, 0.5, 0.0]], dtype=DT)
    return {
        "simplex": lambda z: project(z, pp.sets.Simplex(N_)),
        "polyhedral": ProjectionLayer(A=A, a=[0.2], B=torch.ones(1, N_, dtype=DT), b=[1.0],
                                      lb=torch.zeros(N_, dtype=DT)),
        "learned": ProjectionLayer(A=A, a=[0.2], B=torch.ones(1, N_, dtype=DT), b=[1.0], lb=torch.zeros(N_, dtype=DT),
                                   learn=("a",)),
    }


@pytest.mark.parametrize("name", ["simplex", "polyhedral", "learned"])
def test_linearize_and_make_fx_are_refused_by_name(name):
    """make_fx (real, fake, symbolic) and torch.func.linearize run the forward under a proxy dispatch mode: the
    projection cannot read x's values there (torch's RuntimeError from a .item() before)."""
    f = _sets()[name]
    x = torch.randn(3, N_, dtype=DT, generator=_gen(0))
    with pytest.raises(pp.ProblemError, match=r"linearize.*cannot record the projection layer"):
        linearize(f, x)
    for mode in ("real", "fake", "symbolic"):
        with pytest.raises(pp.ProblemError, match=r"make_fx.*cannot record"):
            make_fx(f, tracing_mode=mode)(x)
    # the forward-mode product it stands for, by torch.func.jvp, against finite differences in float64
    t = torch.randn(3, N_, dtype=DT, generator=_gen(1))
    y, jt = jvp(f, (x,), (t,))
    h = 1e-6
    fd = (f(x + h * t) - f(x - h * t)) / (2 * h)
    torch.testing.assert_close(jt, fd, rtol=0, atol=1e-8)
    torch.testing.assert_close(y, f(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["simplex", "polyhedral", "learned"])
def test_functionalize_is_refused_by_name(name):
    """torch.func.functionalize has no rule for a custom autograd.Function (torch's "NYI" RuntimeError before),
    also inside or around vmap."""
    f = _sets()[name]
    x = torch.randn(3, N_, dtype=DT, generator=_gen(2))
    with pytest.raises(pp.ProblemError, match="functionalize cannot record"):
        functionalize(f)(x)
    with pytest.raises(pp.ProblemError, match="functionalize cannot record"):
        vmap(functionalize(f))(x[None].repeat(2, 1, 1))
    with pytest.raises(pp.ProblemError, match="functionalize cannot record"):
        functionalize(vmap(f))(x[None].repeat(2, 1, 1))
    # vmap alone works: each slice's projection
    X = torch.randn(2, 3, N_, dtype=DT, generator=_gen(3))
    torch.testing.assert_close(vmap(f)(X), torch.stack([f(X[0]), f(X[1])]), rtol=0, atol=1e-15)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.script's own
def test_jit_script_and_fx_symbolic_trace_are_refused_by_name():
    """torch.jit.script of the layer, of a module holding it, or of a function calling project (TorchScript's
    "Lambda aren't supported" on a line of the adapter before); torch.fx.symbolic_trace (was: "x must be a
    torch.Tensor, got Proxy")."""
    layer = _sets()["learned"]
    with pytest.raises(pp.ProblemError, match="torch.jit.script cannot compile"):
        torch.jit.script(layer)
    with pytest.raises(pp.ProblemError, match="torch.jit.script cannot compile"):
        torch.jit.script(torch.nn.Sequential(torch.nn.Linear(3, N_).double(), layer))

    def f(x: torch.Tensor) -> torch.Tensor:
        return project(x, torch.ones(1, 4, dtype=torch.float64), torch.ones(1, dtype=torch.float64))

    with pytest.raises(pp.ProblemError, match="torch.jit.script cannot compile"):
        torch.jit.script(f)
    with pytest.raises(pp.ProblemError, match="torch.fx.symbolic_trace cannot record"):
        torch.fx.symbolic_trace(layer)
    # the layer itself is untouched by the hook: it projects, pickles and deep-copies as before
    import copy
    import pickle

    x = torch.randn(5, N_, dtype=DT, generator=_gen(4))
    want = pp.project(x.numpy(), pp.Polyhedron(A=[[1.0, -1.0, 0.5, 0.0]], a=[0.2], B=np.ones((1, N_)), b=[1.0],
                                               lb=np.zeros(N_))).y
    for other in (layer, copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        np.testing.assert_allclose(other(x).detach().numpy(), want, rtol=0, atol=1e-13)


def test_what_works_is_unchanged_by_the_tracer_checks():
    """jacrev and torch.compile (a graph break) still run, with the float64 finite-difference Jacobian."""
    layer = _sets()["polyhedral"]
    x = torch.randn(N_, dtype=DT, generator=_gen(5))
    J = jacrev(layer)(x)
    h = 1e-6
    fd = torch.stack([(layer(x + h * e) - layer(x - h * e)) / (2 * h) for e in torch.eye(N_, dtype=DT)], dim=1)
    torch.testing.assert_close(J, fd, rtol=0, atol=1e-8)
    compiled = torch.compile(layer, backend="eager")
    X = torch.randn(3, N_, dtype=DT, generator=_gen(6))
    torch.testing.assert_close(compiled(X), layer(X), rtol=0, atol=0)


# ----------------------------------------------------------------------------- data gradients at dependent faces
def _mean_one_sided(x, parts, g, h=1e-7):
    """The mean of the one-sided derivatives of ``<g, Π(x)>`` in each entry of each part (float64, pp.project)."""

    def f(q):
        P = pp.Polyhedron(**{k: np.asarray(v, float) for k, v in q.items()})
        return float((pp.project(np.asarray(x, float), P).y * np.asarray(g, float)).sum())

    base = {k: np.asarray(v, float) for k, v in parts.items()}
    out = {}
    for k, v in base.items():
        G = np.zeros_like(v)
        for idx in np.ndindex(*v.shape):
            sides = []
            for s in (1.0, -1.0):
                q = {kk: vv.copy() for kk, vv in base.items()}
                q[k][idx] += s * h
                sides.append(s * (f(q) - f(base)) / h)
            G[idx] = np.mean(sides)
        out[k] = G
    return out


def _layer_grads(x, parts, g, dtype=DT, per_sample=False):
    ins = {}
    for k, v in parts.items():
        t = torch.as_tensor(np.asarray(v, float), dtype=dtype)
        if per_sample:
            t = t.expand(x.shape[0], *t.shape).clone()
        ins[k] = t.requires_grad_()
    y = project(torch.as_tensor(x, dtype=dtype), structured=False, **ins)
    (y * torch.as_tensor(np.asarray(g, float), dtype=dtype)).sum().backward()
    return {k: (t.grad.sum(0) if per_sample else t.grad).double().numpy() for k, t in ins.items()}


#: points whose active rows and active bounds are dependent (y not differentiable in the data there, on an open set
#: of x): a capped simplex with b = 2 ub (two coordinates at the cap, the others at 0), an inequality row fixed by
#: two caps (a free coordinate left: J g != 0), two such blocks (two dependencies), a one-hot point of the simplex
#: with ub = 1, a scaled equality row with an inequality row and caps
_DEPENDENT = {
    "capped simplex b = 2 ub": ([[2.0, 1.5, -0.05, -0.1, -0.2]],
                                dict(B=[[1.0] * 5], b=[1.0], lb=[0.0] * 5, ub=[0.5] * 5), [[1.0, 2.0, 3.0, 4.0, 5.0]]),
    "row fixed by two caps": ([[2.0, 1.5, 0.3]], dict(A=[[1.0, 1.0, 0.0]], a=[1.0], ub=[0.5, 0.5, 5.0]),
                              [[1.0, 2.0, 3.0]]),
    "two blocks, two dependencies": ([[2.0, 1.5, -0.1, 3.0, 2.0, -0.3]],
                                     dict(B=[[1.0, 1, 1, 0, 0, 0], [0.0, 0, 0, 1, 1, 1]], b=[1.0, 1.0], lb=[0.0] * 6,
                                          ub=[0.5] * 6), [[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]),
    "one-hot under a redundant ub = 1": ([[3.0, 0.0, 0.1]], dict(B=[[1.0] * 3], b=[1.0], lb=[0.0] * 3, ub=[1.0] * 3),
                                         [[1.0, 2.0, 3.0]]),
    "scaled equality and a row": ([[3.0, 2.5, 0.1, -1.0]],
                                  dict(A=[[0.0, 0.0, 1.0, 1.0]], a=[0.5], B=[[2.0, 2.0, 2.0, 2.0]], b=[2.0],
                                       lb=[0.0] * 4, ub=[0.5, 0.5, 9.0, 9.0]), [[1.0, -2.0, 0.5, 3.0]]),
}


@pytest.mark.parametrize("name", sorted(_DEPENDENT))
@pytest.mark.parametrize("path", ["host", "torch", "float32", "per-sample"])
def test_data_gradients_at_dependent_faces_are_the_mean_of_the_one_sided_derivatives(name, path, monkeypatch):
    """Where the active rows and bounds are dependent, no data near the given ones keep them all active: the
    gradients of a piece that keeps them all (r = 0 for the rows that the bounds determine) were ∂L/∂b = 0 and
    ∂L/∂ub_i = g_i at the capped simplex (O(1) off, against 1ᵀy = b). Each is now the mean of the two one-sided
    derivatives (the adjacent pieces that drop a row a multiplier leaves at zero), as CappedSimplex's total."""
    import polyproj.adapters.torch as adapter

    x, parts, g = _DEPENDENT[name]
    x = np.asarray(x, float)
    if path == "torch":  # the pipeline in the torch namespace (as on CUDA)
        monkeypatch.setattr(adapter, "HOST_BATCH", 0)
    got = _layer_grads(x, parts, g, dtype=torch.float32 if path == "float32" else DT, per_sample=path == "per-sample")
    want = _mean_one_sided(x, parts, g)
    tol = 2e-6 if path == "float32" else 1e-6
    for k in parts:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=tol, err_msg=k)


def test_learned_budget_at_a_capped_vertex_obeys_the_budget_identity():
    """1ᵀy = b for every b: with L = Σy the gradient is exactly 1 for b and 0 for every bound (was 0 and 1s), and a
    learned b through the general path equals CappedSimplex's learned total (the structured path)."""
    n = 5
    x = torch.tensor([[2.0, 1.5, -0.05, -0.1, -0.2], [3.0, 0.2, 2.9, -1.0, 0.1]], dtype=DT)
    b = torch.ones(1, dtype=DT, requires_grad=True)
    lb = torch.zeros(n, dtype=DT, requires_grad=True)
    ub = torch.full((n,), 0.5, dtype=DT, requires_grad=True)
    y = project(x, B=torch.ones(1, n, dtype=DT), b=b, lb=lb, ub=ub, structured=False)
    y.sum().backward()
    torch.testing.assert_close(b.grad, torch.full((1,), 2.0, dtype=DT), rtol=0, atol=1e-12)  # two points
    torch.testing.assert_close(lb.grad, torch.zeros(n, dtype=DT), rtol=0, atol=1e-12)
    torch.testing.assert_close(ub.grad, torch.zeros(n, dtype=DT), rtol=0, atol=1e-12)
    w = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=DT)
    b.grad = None
    y = project(x, B=torch.ones(1, n, dtype=DT), b=b, lb=lb.detach(), ub=ub.detach(), structured=False)
    (y * w).sum().backward()
    t = torch.ones((), dtype=DT, requires_grad=True)
    (project(x, pp.sets.CappedSimplex(n, total=t, upper=0.5)) * w).sum().backward()
    torch.testing.assert_close(b.grad[0], t.grad, rtol=0, atol=1e-12)
    # the point's x-gradient is untouched: y is locally constant in x there (J = 0)
    xx = x.clone().requires_grad_()
    (project(xx, B=torch.ones(1, n, dtype=DT), b=b, lb=lb, ub=ub, structured=False) * w).sum().backward()
    torch.testing.assert_close(xx.grad[0], torch.zeros(n, dtype=DT), rtol=0, atol=1e-12)


def test_recognised_layer_gradcheck_in_its_data_at_capped_vertices():
    """torch.autograd.gradcheck (central differences: the mean of the one-sided derivatives at a kink) of a layer
    recognised as a capped simplex, its b and ub swapped in by functional_call (the general path), at points two
    of whose coordinates sit at the cap (failed for b before)."""
    n = 5
    layer = ProjectionLayer(B=torch.ones(1, n, dtype=DT), b=torch.ones(1, dtype=DT), lb=torch.zeros(n, dtype=DT),
                            ub=0.5 * torch.ones(n, dtype=DT))
    x = torch.tensor([[2.0, 1.5, -0.05, -0.1, -0.2], [0.1, 1.7, 0.0, 2.2, -0.4], [0.3, 0.1, 0.25, -0.3, 0.45]],
                     dtype=DT, requires_grad=True)

    def f(z, bb, u):
        return torch.func.functional_call(layer, {"b": bb, "ub": u}, (z,))

    assert torch.autograd.gradcheck(f, (x, torch.ones(1, dtype=DT, requires_grad=True),
                                        torch.full((n,), 0.5, dtype=DT, requires_grad=True)), atol=1e-6)


# ----------------------------------------------------------------------------- the review's cases
def test_a_fixed_coordinate_at_a_dependent_face_stays_fixed():
    # lb_3 == ub_3 is an equality row (+e_3 = 0.3), never a loosened bound, whichever side x is on: d/db is the mean
    # of its one-sided derivatives (2 and 1), and d/dc of the pair moved together that of the pair's value
    parts = dict(B=[[1.0, 1.0, 1.0]], b=[1.0], lb=[0.0, 0.0, 0.3], ub=[0.7, 1.0, 0.3])
    g = [[1.0, 2.0, 3.0]]
    for x in ([[2.0, -1.0, -1.0]], [[2.0, -1.0, 3.0]], [[2.0, -1.0, 0.31]]):
        got = _layer_grads(x, parts, g)
        assert got["b"][0] == pytest.approx(1.5, abs=1e-9)
        h, base = 1e-7, {k: np.asarray(v, float) for k, v in parts.items()}

        def f(c, x=x, base=base):
            q = {k: v.copy() for k, v in base.items()}
            q["lb"][2] = q["ub"][2] = c
            return float((pp.project(np.asarray(x, float), pp.Polyhedron(**q)).y * np.asarray(g, float)).sum())

        pair = 0.5 * ((f(0.3 + h) - f(0.3)) / h + (f(0.3) - f(0.3 - h)) / h)
        assert got["lb"][2] + got["ub"][2] == pytest.approx(pair, abs=1e-6)


def test_data_gradients_at_dependent_faces_do_not_depend_on_a_rows_scale():
    # two proportional equality rows (a dependency of B's own) beside the caps' dependency: scaling a row and its
    # right-hand side by alpha divides that row's gradient by alpha and leaves the other's unchanged
    x, g = [[2.0, 1.5, -0.05, -0.1]], [[1.0, 2.0, 3.0, 4.0]]
    out = {}
    for alpha in (1.0, 10.0):
        parts = dict(B=[[1.0] * 4, [alpha] * 4], b=[1.0, alpha], lb=[0.0] * 4, ub=[0.5] * 4)
        out[alpha] = _layer_grads(x, parts, g)["b"]
    assert out[10.0][0] == pytest.approx(out[1.0][0], abs=1e-9)
    assert 10.0 * out[10.0][1] == pytest.approx(out[1.0][1], abs=1e-9)


def test_four_separate_dependencies_each_get_the_mean_of_their_one_sided_derivatives():
    # four blocks y_2i + y_2i+1 = 1 with one coordinate at its cap and one at 0: 16 adjacent pieces, every block's
    # d/db_i the mean of its two sides (a budget of pieces that stopped at 8 left one block one-sided)
    k = 4
    B = np.zeros((k, 2 * k))
    for i in range(k):
        B[i, 2 * i: 2 * i + 2] = 1.0
    x = [[2.0, -1.0, 3.0, -0.5, 1.5, -2.0, 4.0, -0.1]]
    g = [[1.0, 5.0, -2.0, 3.0, 4.0, 0.5, -1.0, 2.0]]
    parts = dict(B=B, b=[1.0] * k, lb=[0.0] * (2 * k), ub=[1.0] * (2 * k))
    got, want = _layer_grads(x, parts, g), _mean_one_sided(x, parts, g)
    np.testing.assert_allclose(got["b"], want["b"], atol=1e-6)


def test_learned_marginals_of_a_transport_polytope_follow_each_support_component():
    # row and column sums (6 rows of rank 5: B's own dependency, kept out of the pieces) at a point whose support
    # splits into two components (one more dependency, through the bounds): along every change of the marginals
    # that keeps them consistent, the gradient gives the mean of the one-sided derivatives
    k, n = 3, 9
    B = np.zeros((2 * k, n))
    for i in range(k):
        B[i, i * k:(i + 1) * k] = 1.0
        B[k + i, i::k] = 1.0
    x = np.array([[3.0, -1, -1.5, -1, 3, 2.6, -0.7, 2.2, 3.1]])
    g = np.arange(1.0, 10.0)[None, :]
    got = _layer_grads(x, dict(B=B, b=np.ones(2 * k), lb=np.zeros(n)), g)["b"]

    def f(b):
        P = pp.Polyhedron(B=B, b=b, lb=np.zeros(n), allow_dependent_rows=True)
        return float(pp.project(x, P).y[0] @ g[0])

    h, b0 = 1e-7, np.ones(2 * k)
    for d in (np.eye(6)[0] + np.eye(6)[3], np.eye(6)[1] + np.eye(6)[4], np.eye(6)[0] + np.eye(6)[4], np.ones(6)):
        mean = 0.5 * ((f(b0 + h * d) - f(b0)) / h + (f(b0) - f(b0 - h * d)) / h)
        assert got @ d == pytest.approx(mean, abs=1e-5)


def test_a_symmetric_tie_drops_both_rows_together():
    # x = (5, 5, -5) on sum = 2, 0 <= y <= 1: both caps' multipliers reach zero at one ratio-test step; dropping
    # them together gives d/db (0.25) and each bound's gradient the mean of its one-sided derivatives (dropping one
    # kept its twin active: d/db 0.5, d/dub (0.5, -0.5, 0) for a symmetric point)
    x, g = [[5.0, 5.0, -5.0]], [[1.0, 0.0, 0.0]]
    parts = dict(B=[[1.0, 1.0, 1.0]], b=[2.0], lb=[0.0] * 3, ub=[1.0] * 3)
    got, want = _layer_grads(x, parts, g), _mean_one_sided(x, parts, g)
    for k in ("b", "lb", "ub"):
        np.testing.assert_allclose(got[k], want[k], atol=1e-6)
