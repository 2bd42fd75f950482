"""DIF engine: what a probe of new situations found (a Hessian singular to rounding on the dense path, the
``requires_grad`` idiom in values with a plain θ, the plain perturbed form of a Σw-normalised loss, builtins as
data-free constraints), each failing before its fix."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, Loss, solve  # noqa: E402
from polyproj.adapters.dif.matfree import DenseInverse  # noqa: E402
from polyproj.errors import ProblemError  # noqa: E402


def _spd(n, cond):
    Q = np.linalg.qr(np.random.default_rng(n).standard_normal((n, n)))[0]
    return (Q * np.logspace(0, -np.log10(cond), n)) @ Q.T


def test_a_hessian_singular_to_rounding_is_refused_where_h_inverse_is_needed():
    """Cholesky succeeds on a rank-deficient H with a pivot at rounding; its solves carried an arbitrary
    null-space component (a softmax model's free biases: +0.64 there, a test score 0.32 against 0.004)."""
    rng = np.random.default_rng(0)
    for _ in range(10):
        A = rng.standard_normal((6, 5))
        inv = DenseInverse(A @ A.T)
        assert inv.singular
        with pytest.raises(ProblemError, match="H is singular"):
            inv.solve(np.ones(6), "a test")
    # badly scaled or ill-conditioned but not singular: solved (the test is on H equilibrated, D^-½ H D^-½)
    for H in (np.diag([1e7, 1e-7]), _spd(200, 1e10)):
        inv = DenseInverse(H)
        assert not inv.singular
        b = H @ np.ones(H.shape[0])
        np.testing.assert_allclose(inv.solve(b, "a test"), np.ones(H.shape[0]), rtol=1e-4)
    # an indefinite H clear of zero is solved (LU), exactly
    H = np.diag([3.0, -1.0, 2.0])
    np.testing.assert_allclose(DenseInverse(H).solve(np.array([3.0, 1.0, 4.0]), "a test"), [1.0, -1.0, 2.0])


@pytest.mark.filterwarnings("ignore::polyproj.PolyprojWarning")
def test_a_multiclass_model_with_free_biases_refuses_order_2_on_the_dense_path():
    rng = np.random.default_rng(9)
    N, K = 60, 4
    X, lab = torch.tensor(rng.normal(size=(N, 3))), torch.tensor(rng.integers(0, K, N))

    def ce(th, b):
        return torch.nn.functional.cross_entropy(b[0] @ th[:12].reshape(3, K) + th[12:], b[1], reduction="none")

    def obj(th, b):
        return ce(th, b) + 1e-2 * (th[:12] ** 2).sum()  # the biases are not penalised: H is singular along 1

    G = (X[:20], lab[:20])
    k0 = solve(ConstrainedProblem(torch.zeros(16), Loss(obj, (X, lab))))
    kg = solve(ConstrainedProblem(torch.zeros(16), Loss(ce, G)))
    with torch.no_grad():
        tau = 0.5 * (float(ce(k0.theta, G).mean()) + float(ce(kg.theta, G).mean()))
    p = ConstrainedProblem(torch.zeros(16), Loss(obj, (X, lab)), [Constraint(ce, G, tau=tau, name="g")])
    kkt = solve(p, theta0=k0.theta)
    with pytest.raises(ProblemError, match="H is singular"):
        DIF(p, kkt, method="dense").delta_theta({"objective": [0]}, order=2)
    # the regularised answer the error suggests agrees with the matrix-free path off the null direction
    a = DIF(p, kkt, method="dense", damping="auto").delta_theta({"objective": [0]}).numpy()
    ones = np.r_[np.zeros(12), np.ones(4)] / 2.0
    m = DIF(p, kkt, method="matrix-free").delta_theta({"objective": [0]}).numpy()
    np.testing.assert_allclose(a - (a @ ones) * ones, m - (m @ ones) * ones, atol=1e-6 * np.abs(m).max())


def test_values_with_a_plain_theta_see_the_requires_grad_idiom():
    """A weight decay written ``... for p in m.parameters() if p.requires_grad``: in grad mode with a plain θ
    the module's parameters said requires_grad False and the values left it out (g = −τ at a binding point)."""
    nn = torch.nn
    torch.manual_seed(0)
    X, y = torch.randn(30, 4, dtype=torch.float64), torch.randn(30, dtype=torch.float64)
    net = nn.Linear(4, 1).double()

    def wd(m):
        return sum((p ** 2).sum() for p in m.parameters() if p.requires_grad)

    def obj(m, b):
        return (m(b[0]).squeeze(-1) - b[1]) ** 2 + 0.1 * wd(m)

    prob = ConstrainedProblem(net, Loss(obj, (X, y)), [Constraint(wd, None, tau=0.05, name="wd")])
    kkt = solve(prob)
    g = prob.constraint_values(kkt.theta)
    assert g.dtype == torch.float64 and abs(float(g[0]) - float(kkt.g[0])) <= 1e-12
    with torch.no_grad():
        f_nograd = float(prob.objective_value(kkt.theta))
    assert float(prob.objective_value(kkt.theta)) == f_nograd
    # a θ that asks for a gradient still gets one, as with the filter left out
    plain = ConstrainedProblem(net, Loss(lambda m, b: (m(b[0]).squeeze(-1) - b[1]) ** 2
                                         + 0.1 * sum((p ** 2).sum() for p in m.parameters()), (X, y)))
    grads = []
    for P in (prob, plain):
        th = kkt.theta.clone().requires_grad_(True)
        P.objective_value(th).backward()
        grads.append(th.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-14)


def test_the_plain_perturbed_form_at_t_0_is_the_problem():
    """perturbed(..., renormalize=False) put a loss normalised by its weights' sum (12.8) over N (10): at t = 0
    the constraint read +0.15 (violated) where the problem has −0.0076, unlike DIF(renormalize=False)."""
    rng = np.random.default_rng(3)
    X = torch.tensor(rng.normal(size=(30, 3)))
    y = torch.tensor((rng.random(30) < 0.5).astype(float))

    def nll(th, b):
        return torch.nn.functional.softplus(b[0] @ th) - b[1] * (b[0] @ th)

    wg = rng.uniform(0.5, 2, size=10)
    p = ConstrainedProblem(torch.zeros(3), Loss(lambda th, b: nll(th, b) + 0.01 * (th ** 2).sum(), (X, y)),
                           [Constraint(nll, (X[:10], y[:10]), tau=0.62, name="g", weights=wg)])
    th = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64)
    for renormalize in (True, False):
        q = p.perturbed({"g": [4]}, 0.0, renormalize=renormalize)
        torch.testing.assert_close(q.constraint_values(th), p.constraint_values(th), rtol=1e-14, atol=1e-15)
        torch.testing.assert_close(q.objective_value(th), p.objective_value(th), rtol=1e-14, atol=1e-15)
    # and its slope in t is the plain form's: Σw̄ stays the normaliser, the removed sample's weight falls
    h = 1e-3
    gp = p.perturbed({"g": [4]}, h, renormalize=False).constraint_values(th)
    with torch.no_grad():
        loss = nll(th, (X[:10], y[:10]))
    want = -float(wg[4] * loss[4]) / wg.sum()
    assert abs(float(gp[0] - p.constraint_values(th)[0]) / h - want) <= 1e-10


def test_a_builtin_is_a_data_free_constraint_of_theta():
    """torch.linalg.vector_norm (no inspectable signature) was called fn(θ, None): a TypeError on its second
    argument, though fn(θ) is the documented form."""
    import functools

    X, y = torch.randn(20, 3, dtype=torch.float64), torch.randn(20, dtype=torch.float64)
    obj = Loss(lambda th, b: (b[0] @ th - b[1]) ** 2, (X, y))
    a = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    p = ConstrainedProblem(torch.zeros(3, dtype=torch.float64), obj,
                           [Constraint(torch.linalg.vector_norm, None, tau=1.0, name="ball"),
                            Constraint(functools.partial(torch.dot, a), None, tau=0.5, name="plane")])
    th = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(p.constraint_values(th),
                               torch.stack([th.norm() - 1.0, a @ th - 0.5]), rtol=1e-14, atol=1e-15)


def test_a_test_function_cannot_change_the_problems_module():
    """A test function's ``m.eval(); ...; m.train()`` switched the problem's own copy to training mode for good
    (dropout live: later scores random, silently); ``m.float()`` crashed the interpreter (a probe)."""
    torch.manual_seed(0)
    X = torch.randn(60, 3, dtype=torch.float64)
    y = torch.sin(X[:, 0])
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Dropout(0.5),
                              torch.nn.Linear(4, 1)).double().eval()

    def loss(m, b):
        return (m(b[0]).squeeze(-1) - b[1]) ** 2 + 1e-2 * sum((p * p).sum() for p in m.parameters())

    prob = ConstrainedProblem(net, Loss(loss, (X, y)))
    kkt = solve(prob)
    dif = DIF(prob, kkt, method="dense", damping="auto")

    def F(m):
        return ((m(X[:10]).squeeze(-1) - y[:10]) ** 2).mean()

    def evaluate(m):
        m.eval()
        out = F(m)
        m.train()
        return out

    a = dif.influence(F)
    torch.testing.assert_close(dif.influence(evaluate), a, rtol=0, atol=0)
    torch.testing.assert_close(dif.influence(F), a, rtol=0, atol=0)
    assert not prob.wrap(kkt.theta).training
    with pytest.raises(ProblemError, match=r"m.float\(...\) would convert"):
        dif.influence(lambda m: (m.float()(X[:5].float()) ** 2).mean(), [{"objective": [0]}])


def test_progress_bars_stay_off_a_redirected_stdout(capsys):
    """The transient bar wrote a blank line into stdout when it was not a terminal (a CSV got empty rows)."""
    from polyproj.runtime import map_jobs

    assert map_jobs(lambda i: i * i, list(range(10)), progress=True, bar_from=1, description="x") == [
        i * i for i in range(10)]
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_a_users_error_on_a_thread_pool_is_not_called_a_pickling_failure():
    from concurrent.futures import ThreadPoolExecutor

    from polyproj.runtime import map_jobs

    def job(i):
        raise RuntimeError("could not unpickle embeddings.pkl")

    with ThreadPoolExecutor(1) as pool, pytest.raises(RuntimeError, match="embeddings.pkl"):
        map_jobs(job, [1, 2], executor=pool, bar_from=100, description="x")
