"""DIF engine: answers invariant to the objective's scale (the QP normalised before the backend, the SQP's
convexification relative to H), and a module's buffers and frozen parameters checked against the problem's."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, KKTPoint, Loss, solve
from polyproj.errors import ProblemError

pytestmark = pytest.mark.usefixtures("one_torch_thread", "quiet_polyproj_warnings")


def _logloss(th, b):
    z = b[0] @ th
    return nn.functional.softplus(z) - b[1] * z


@pytest.fixture(scope="module")
def logistic():
    """Logistic regression (strictly convex, H ~ 0.1) and its unconstrained minimiser."""
    rng = np.random.default_rng(0)
    X = torch.as_tensor(rng.normal(size=(120, 4)))
    p = torch.sigmoid(X @ torch.tensor([1.5, -2.0, 0.5, 1.0], dtype=torch.float64))
    y = (p > torch.as_tensor(rng.uniform(size=120))).double()
    th = solve(ConstrainedProblem(torch.zeros(4), Loss(_logloss, (X, y))), tol=1e-12).theta
    return X, y, th


def _scaled(X, y, s, cap):
    """The problem with objective and constraint multiplied by s: the same KKT points, λ the same (both scale)."""
    return ConstrainedProblem(torch.zeros(4), Loss(lambda th, b: s * _logloss(th, b), (X, y)),
                              [Constraint(lambda th: s * th[0], None, tau=s * cap, name="cap")])


# ----------------------------------------------------------------------------- scale invariance
@pytest.mark.parametrize("where", ["weakly_active", "inactive", "binding"])
def test_dense_dif_is_invariant_to_the_objective_scale(logistic, where):
    """ω and the influence do not change when the problem is multiplied by s (DUAL_INFEASIBLE at 1e-4…1e-6 before)."""
    X, y, th = logistic
    cap = {"weakly_active": float(th[0]), "inactive": 10.0, "binding": 0.7 * float(th[0])}[where]
    base = _scaled(X, y, 1.0, cap)
    ref_k = solve(base, tol=1e-13) if where == "binding" else KKTPoint.from_params(base, th)
    assert ref_k.status == (where,)
    removals = [{"objective": [i]} for i in range(6)] + [{"objective": [3, 50, 91]}]
    Xt = torch.as_tensor(np.random.default_rng(1).normal(size=(9, 4)))

    def test_fn(t):
        return _logloss(t, (Xt, torch.ones(9, dtype=torch.float64))).mean()

    ref = DIF(base, ref_k, method="dense")
    om_ref, inf_ref = ref.delta_theta(removals).numpy(), ref.influence(test_fn, removals).numpy()
    assert np.abs(om_ref).max() > 1e-3
    for s in (1e-4, 1e-6, 1e4):
        p = _scaled(X, y, s, cap)
        k = KKTPoint.from_params(p, ref_k.theta, ref_k.lambdas, tol=1e-6 * s, active_tol=1e-6 * s,
                                 mult_tol=1e-7 * s)
        assert k.status == (where,)
        dif = DIF(p, k, method="dense")
        np.testing.assert_allclose(dif.delta_theta(removals).numpy(), om_ref, rtol=0, atol=1e-10 * np.abs(om_ref).max())
        np.testing.assert_allclose(dif.influence(test_fn, removals).numpy(), inf_ref, rtol=0,
                                   atol=1e-10 * np.abs(inf_ref).max())


@pytest.mark.parametrize("s", [1e-4, 1e-6])
def test_solve_reaches_tol_on_a_small_objective(logistic, s):
    """SQP at the stated tolerance on logistic regression × s (stalled at 1.5e-6 with "raise max_iter" before)."""
    X, y, th = logistic
    prob = ConstrainedProblem(torch.zeros(4), Loss(lambda t, b: s * _logloss(t, b), (X, y)))
    k = solve(prob, tol=1e-10 * s)
    assert k.residual <= 1e-10 * s
    assert k.info["iterations"] <= 10
    np.testing.assert_allclose(k.theta.numpy(), th.numpy(), rtol=0, atol=1e-9)


def test_sqp_convexification_scales_with_the_hessian():
    """The SQP's P for s·H is s times that for H: a small positive definite H is not flattened to shift·I."""
    from polyproj.adapters.dif.kkt import _convexified

    rng = np.random.default_rng(2)
    Q, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    no_rows = (np.zeros((0, 5)), np.zeros(0), np.zeros(0, bool))
    for eig in ([0.05, 0.1, 0.15, 0.2, 0.3], [-0.2, 1e-3, 0.1, 0.2, 0.3]):  # positive definite; indefinite
        H, grad = (Q * np.array(eig)) @ Q.T, rng.normal(size=5)
        P1, q1 = _convexified(H, grad, *no_rows, 1e-4)
        for s in (1e-4, 1e-6, 1e4):
            Ps, qs = _convexified(s * H, s * grad, *no_rows, 1e-4)
            np.testing.assert_allclose(Ps / s, P1, rtol=0, atol=1e-12)
            np.testing.assert_allclose(qs / s, q1, rtol=0, atol=1e-12)
    np.testing.assert_allclose(_convexified(1e-4 * H, grad, *no_rows, 1e-4)[0], 1e-4 * P1, atol=1e-16)


# ----------------------------------------------------------------------------- the module's buffers
def _mse(m, b):
    return (m(b[0]).squeeze(-1) - b[1]) ** 2


def _obj(m, b):
    return _mse(m, b) + 1e-3 * sum((p ** 2).sum() for p in m.parameters() if p.requires_grad)


@pytest.fixture(scope="module")
def bn_data():
    rng = np.random.default_rng(3)
    X = torch.as_tensor(rng.normal(size=(80, 3)))
    y = torch.sin(X[:, 0]) + 0.5 * X[:, 1] - 0.3 * X[:, 2] ** 2 + 0.1 * torch.as_tensor(rng.normal(size=80))
    return X, y


def _bn_net(freeze=False):
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(3, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 1)).double()
    if freeze:
        m[0].bias.requires_grad_(False)
    return m.eval()


def _build(model, X, y):
    return ConstrainedProblem(model, Loss(_obj, (X, y)), [Constraint(_mse, (X[:20], y[:20]), tau=0.006, name="group")])


def _set_theta(model, theta):
    with torch.no_grad():
        nn.utils.vector_to_parameters(theta.to(next(model.parameters()).dtype),
                                      [p for p in model.parameters() if p.requires_grad])


def test_module_with_other_buffers_is_refused_and_built_after_training_agrees(bn_data):
    """The Cooper flow: problem built, then training moves BatchNorm's running statistics."""
    X, y = bn_data
    m = _bn_net()
    before = _build(m, X, y)
    m.train()
    m(X)  # training updates the running statistics
    m.eval()
    after = _build(m, X, y)
    k = solve(after, tol=1e-11)
    assert k.classification == {"group": "binding"}
    _set_theta(m, k.theta)
    # the problem built before training: a clear error naming the buffer, not a wrong KKT point
    with pytest.raises(ProblemError, match=r"buffer '1\.running_mean'.*build the ConstrainedProblem"):
        KKTPoint.from_params(before, m, tol=1e-8)
    with pytest.raises(ProblemError, match=r"buffer '1\.running_mean'"):
        solve(before, theta0=m)  # what from_cooper(..., refine=True) does: moved θ to another net's KKT point
    # built after training: from_params and a warm re-solve from the module agree with solve
    kp = KKTPoint.from_params(after, m, tol=1e-8)
    assert kp.residual <= 1e-8 and kp.classification == {"group": "binding"}
    np.testing.assert_array_equal(kp.theta.numpy(), k.theta.numpy())
    k2 = solve(after, theta0=m, lambdas0=k.lambdas, tol=1e-11)
    np.testing.assert_allclose(k2.theta.numpy(), k.theta.numpy(), rtol=0, atol=1e-8)
    # BatchNorm's batch counter is not read in evaluation mode: a copy differing only there is accepted
    m2 = copy.deepcopy(m)
    m2[1].num_batches_tracked += 5
    assert KKTPoint.from_params(after, m2, tol=1e-8).residual <= 1e-8


def test_module_with_other_frozen_parameter_is_refused(bn_data):
    X, y = bn_data
    m = _bn_net(freeze=True)
    prob = _build(m, X, y)
    k = solve(prob, tol=1e-11)
    net = copy.deepcopy(m).float()  # the problem's own state in float32: accepted (compared in float32)
    _set_theta(net, k.theta)
    assert KKTPoint.from_params(prob, net, tol=1e-5).residual <= 1e-5
    with torch.no_grad():
        net[0].bias.add_(0.01)  # a frozen parameter changed after the problem was built
    with pytest.raises(ProblemError, match=r"frozen parameter '0\.bias'"):
        KKTPoint.from_params(prob, net, tol=1e-5)
    net[0].bias.requires_grad_(True)  # θ's layout differs from the problem's with as many entries (6 each)
    net[3].weight.requires_grad_(False)
    with pytest.raises(ProblemError, match="trainable parameters"):
        KKTPoint.from_params(prob, net, tol=1e-5)
