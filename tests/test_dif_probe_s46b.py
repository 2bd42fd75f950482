"""DIF: terms and test functions must be computed from θ (structurally); MINRES reaches rtol on a
well-conditioned H; from_params names a violated constraint; a test function with a wrong signature."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import polyproj as pp
from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, KKTPoint, Loss, solve
from polyproj.adapters.dif.krylov import solve_hessian

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _data(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 3, dtype=torch.float64, generator=g)
    return X, X @ torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)


def _msq(m, b):
    return (m(b[0]).reshape(-1) - b[1]) ** 2


def _vsq(th, b):
    return (b[0] @ th - b[1]) ** 2


# ----------------------------------------------------------------------------- 1. terms of the problem
def test_terms_calling_the_users_module_from_outside_are_refused():
    """``out.requires_grad`` is True there (the outer module's parameters require grad), but θ is not in the
    graph: the term is a constant to the engine (a constraint silently dropped, or called infeasible)."""
    X, y = _data()
    torch.manual_seed(0)
    model = nn.Linear(3, 1).double()
    with pytest.raises(pp.ProblemError, match="constraint 'grp'.*does not depend on its parameter"):
        ConstrainedProblem(model, Loss(_msq, (X, y)),
                           [Constraint(lambda m, b: _msq(model, b), (X[:10], y[:10]), tau=0.01, name="grp")])
    with pytest.raises(pp.ProblemError, match="objective.*does not depend on its parameter"):
        ConstrainedProblem(model, Loss(lambda m, b: _msq(model, b), (X, y)))
    # a term computed from θ whose gradient is exactly 0 (structural dependence, numeric zero) is accepted,
    # also when it also reads the outer module
    ConstrainedProblem(model, Loss(_msq, (X, y)),
                       [Constraint(lambda m: 0.0 * m.weight.sum() + model.bias.sum(), None, tau=1.0, name="z")])


# ----------------------------------------------------------------------------- 1b. test functions
@pytest.fixture(scope="module")
def module_case():
    X, y = _data()
    torch.manual_seed(0)
    model = nn.Linear(3, 1).double()
    prob = ConstrainedProblem(model, Loss(_msq, (X, y)),
                              [Constraint(lambda m: m.weight[0, 0], None, tau=0.5, name="cap")])
    kkt = solve(prob)
    return model, X, y, DIF(prob, kkt)


def test_test_fn_calling_the_users_module_from_outside_is_refused(module_case):
    model, X, y, dif = module_case
    good = dif.influence(lambda m: _msq(m, (X[:5], y[:5])).mean())
    assert float(good.abs().max()) > 0
    outside = lambda m: _msq(model, (X[:5], y[:5])).mean()  # noqa: E731
    with pytest.raises(pp.ProblemError, match="test_fn's value is not differentiable in its argument"):
        dif.influence(outside)
    # order 2 scores by value, F(θ̄ + ω) − F(θ̄): a piecewise constant F (an accuracy) is a test function there
    acc = lambda m: ((m(X[:5]).squeeze(-1) > 0) == (y[:5] > 0)).double().mean()  # noqa: E731
    assert dif.influence(acc, removals=[{"objective": [0]}, {"objective": [1]}], order=2).shape == (2,)
    with pytest.raises(pp.ProblemError, match="test_fn's value is not differentiable in its argument"):
        dif.influence(lambda m: m.weight.detach().sum())


def test_test_fn_detached_is_refused_and_a_zero_gradient_is_not():
    X, y = _data(30)
    prob = ConstrainedProblem(torch.zeros(3), Loss(_vsq, (X, y)))
    dif = DIF(prob, solve(prob))
    with pytest.raises(pp.ProblemError, match="test_fn's value is not differentiable in its argument"):
        dif.influence(lambda th: (th.detach() ** 2).sum())
    # computed from θ, stationary at θ̄: warned, scores exactly 0
    with pytest.warns(pp.PolyprojWarning, match="exactly zero"):
        s = dif.influence(lambda th: 0.0 * th.sum())
    assert not bool(s.any())


# ----------------------------------------------------------------------------- 2. MINRES
class _Dense:
    def __init__(self, H):
        self.H, self.dim = H, H.shape[0]

    def matvec(self, v):
        return self.H @ v


def test_minres_reaches_rtol_on_a_well_conditioned_hessian():
    """SciPy's MINRES stops on ‖r‖/(‖H‖‖x‖) <= rtol; restarting from x0 = x stalled at ~1e-9 (cond 872); the
    correction solve H dx = b − Hx reaches the target, and the reported residual is the true one."""
    rng = np.random.default_rng(0)
    d = 20
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    H = Q @ np.diag(np.logspace(0, np.log10(871.0), d)) @ Q.T
    b = rng.normal(size=d)
    x, info = solve_hessian(_Dense(H), b, method="minres", rtol=1e-10)
    true = float(np.linalg.norm(H @ x - b) / np.linalg.norm(b))
    assert info.converged and info.residual <= 1e-10
    assert info.residual == pytest.approx(true, rel=1e-6, abs=1e-16)
    np.testing.assert_allclose(x, np.linalg.solve(H, b), rtol=1e-8, atol=1e-10)


@pytest.mark.filterwarnings("ignore::polyproj.PolyprojWarning")
def test_minres_matrix_free_scores_match_dense():
    torch.manual_seed(0)
    N, d = 60, 20
    X = torch.randn(N, d, dtype=torch.float64) * torch.logspace(0, -3, d, dtype=torch.float64)
    y = (torch.randn(N, dtype=torch.float64) > 0).double()

    def lg(th, b):
        return torch.nn.functional.softplus(-(2 * b[1] - 1) * (b[0] @ th)) + 1e-4 * (th ** 2).sum()

    prob = ConstrainedProblem(torch.zeros(d), Loss(lg, (X, y)),
                              [Constraint(lambda th: th[:3].sum(), None, tau=0.0, name="s", kind="eq")])
    k = solve(prob)
    bt = torch.as_tensor(np.random.default_rng(0).normal(size=d))
    ref = DIF(prob, k, method="dense").influence(lambda th: th @ bt)
    dif = DIF(prob, k, method="matrix-free", krylov="minres")
    s = dif.influence(lambda th: th @ bt)
    np.testing.assert_allclose(s.numpy(), ref.numpy(), rtol=0, atol=1e-7 * float(ref.abs().max()))


# ----------------------------------------------------------------------------- 3. from_params
@pytest.mark.filterwarnings("ignore::polyproj.PolyprojWarning")
def test_from_params_names_the_violated_constraint_whatever_active_tol():
    X, y = _data(30)
    theta = solve(ConstrainedProblem(torch.zeros(3), Loss(_vsq, (X, y)))).theta
    p = ConstrainedProblem(torch.zeros(3), Loss(_vsq, (X, y)),
                           [Constraint(lambda th: th[0], None, tau=float(theta[0]) - 0.3, name="cap")])
    for active_tol in (1e-6, 1.0):
        with pytest.raises(pp.ProblemError, match=r"constraint 'cap' is violated .*feasibility residual 3\.000e-01 "
                                                  r"exceeds tol = 1e-06"):
            KKTPoint.from_params(p, theta, active_tol=active_tol)
    # at a looser tol the point is accepted (feasibility 0.3 <= 0.5)
    k = KKTPoint.from_params(p, theta, active_tol=1.0, tol=0.5)
    assert k.residuals["feasibility"] == pytest.approx(0.3)


# ----------------------------------------------------------------------------- 4. test_fn signature
def test_test_fn_with_a_wrong_signature_is_a_problem_error():
    X, y = _data(30)
    prob = ConstrainedProblem(torch.zeros(3), Loss(_vsq, (X, y)))
    dif = DIF(prob, solve(prob))
    with pytest.raises(pp.ProblemError, match=r"test_fn\(th, b\) cannot be called as test_fn\(params_or_model\)"):
        dif.influence(lambda th, b: th.sum())
    with pytest.raises(pp.ProblemError, match="test_fn"):
        dif.influence(lambda: 0.0)
    # a second argument with a default, or *args, is callable with one
    assert dif.influence(lambda th, j=0: th[j]).shape == (30,)
    assert dif.influence(lambda *a: a[0].sum()).shape == (30,)
