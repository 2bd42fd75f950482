"""DIF, session 52: exact-truth probes on small convex problems (weakly active, binding, inactive group risks)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, Loss, retrain, solve
from polyproj.adapters.dif.engine import _multiplier_null_space
from polyproj.errors import PolyprojWarning, ProblemError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _logl(th, b):
    z = b[0] @ th
    return torch.nn.functional.softplus(z) - b[1] * z


def _obj(th, b):
    return _logl(th, b) + 0.05 * (th ** 2).sum()


def _twice(th, b):
    return 2.0 * _logl(th, b)


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(200, 4, generator=g, dtype=torch.float64)
    y = (X @ torch.randn(4, generator=g, dtype=torch.float64)
         + 0.5 * torch.randn(200, generator=g, dtype=torch.float64) > 0).double()
    free = solve(ConstrainedProblem(torch.zeros(4), Loss(_obj, (X, y))))
    r0 = float(_logl(free.theta, (X[:40], y[:40])).mean())  # the group's risk at the unconstrained solution
    return X, y, r0


def _duplicated(X, y, tau):
    """Two positively dependent group-risk rows (b = 2·a): LICQ fails at any point where they are active."""
    cons = [Constraint(_logl, (X[:40], y[:40]), tau=tau, name="a"),
            Constraint(_twice, (X[:40], y[:40]), tau=2.0 * tau, name="b")]
    return ConstrainedProblem(torch.zeros(4), Loss(_obj, (X, y)), cons)


def test_multiplier_null_space_keeps_only_directions_the_multipliers_can_take():
    """Rows with λ̄ⱼ = 0 bound the multiplier set from below: v = (1, −1) over two such rows is no split."""
    G = np.array([[1.0, 2.0, 0.0], [2.0, 4.0, 0.0], [0.0, 0.0, 1.0]])
    active = np.array([True, True, True])
    assert _multiplier_null_space(G, active).shape == (3, 1)  # no sign information: a free direction
    assert _multiplier_null_space(G, active, np.array([True, True, False])).shape == (3, 0)
    # one of the two rows binding (λ̄ > 0): λ̄ + t(−2, 1)/√5, t >= 0, stays a multiplier: still ambiguous
    v = _multiplier_null_space(G, active, np.array([False, True, False]))
    assert v.shape == (3, 1) and abs(abs(v[0, 0]) - 2 / np.sqrt(5)) < 1e-12 and abs(v[2, 0]) < 1e-12
    # opposite signs (a row and its negation, both at λ̄ = 0): (1, 1) keeps both >= 0, a real split
    assert _multiplier_null_space(np.array([[1.0, 0.0], [-1.0, 0.0]]), np.array([True, True]),
                                  np.array([True, True])).shape == (2, 1)


def test_finite_rule_accepts_dependent_weakly_active_rows_whose_multipliers_are_unique(data):
    """Both rows weakly active (λ̄ = 0, ∇f₀ = 0): the multipliers {λ >= 0 : λ_a∇g + 2λ_b∇g = 0} are {0}, so the
    finite rule's answer does not depend on a split. It refused {'a': [1]} ("not defined for this removal");
    now it answers, on both paths, as the derivative rule does, and near retraining."""
    X, y, r0 = data
    P = _duplicated(X, y, r0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        k = solve(P)
    assert k.status == ("weakly_active", "weakly_active")
    rem = {"a": [1]}
    truth = retrain(P, rem, warm_start=k).theta - k.theta
    deriv = DIF(P, k, method="dense").delta_theta(rem)
    for method in ("dense", "matrix-free"):
        w = DIF(P, k, method=method, rule="finite").delta_theta(rem)
        assert torch.allclose(w, deriv, rtol=1e-8, atol=1e-12)
        assert float((w - truth).norm()) < 0.1 * float(truth.norm())
    # the scores' path checks the split too (ScoreJob): answered, equal to the derivative rule's
    F = lambda th: _logl(th, (X[:10], y[:10])).mean()  # noqa: E731
    rems = [{"a": [i]} for i in range(4)] + [{"b": [2]}, {"objective": [5], "a": [5]}]
    ref = DIF(P, k, method="dense").influence(F, rems)
    for method in ("dense", "matrix-free"):
        s = DIF(P, k, method=method, rule="finite").influence(F, rems)
        assert torch.allclose(s, ref, rtol=1e-9, atol=1e-13)


def test_finite_rule_still_refuses_dependent_binding_rows(data):
    """Both rows binding (λ̄ = (λ, λ/2)): the split is not unique and {'a': [1]} is refused on both rules."""
    X, y, r0 = data
    P = _duplicated(X, y, r0 - 0.01)
    with pytest.warns(PolyprojWarning, match="LICQ fails"):
        k = solve(P)
    assert k.status == ("binding", "binding")
    for rule in ("derivative", "finite"):
        with pytest.raises(ProblemError, match="not defined for this removal"):
            DIF(P, k, rule=rule).delta_theta({"a": [1]})


def _sq(th, b):
    return (b[0] @ th - b[1]) ** 2


def test_warm_started_retrain_drops_an_inactive_row_from_the_sqp_convexification():
    """Nearly collinear least squares (cond H ≈ 3e6) with two binding group risks; removing sample 3 (in group a)
    makes a inactive. The warm start's λ_a > 0 kept a in the augmented-Lagrangian term of the SQP's convexified QP,
    which pulled the step towards a's boundary: an ascent direction of the merit, and retrain crawled at its
    start's residual 7.3e-3 for max_iter iterations ("SQP did not reach the KKT residual"), while the augmented
    Lagrangian and a cold start reach the same point. Now the row leaves the term and the SQP converges."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(200, 3, generator=g, dtype=torch.float64)
    X[:, 2] = X[:, 1] + 1e-3 * X[:, 2]
    y = X @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64) + 0.3 * torch.randn(200, generator=g,
                                                                                  dtype=torch.float64)
    free = solve(ConstrainedProblem(torch.zeros(3), Loss(_sq, (X, y))))
    ra = float(_sq(free.theta, (X[:40], y[:40])).mean())
    rb = float(_sq(free.theta, (X[40:100], y[40:100])).mean())
    P = ConstrainedProblem(torch.zeros(3), Loss(_sq, (X, y)),
                           [Constraint(_sq, (X[:40], y[:40]), tau=0.995 * ra, name="a"),
                            Constraint(_sq, (X[40:100], y[40:100]), tau=rb, name="b")])
    k = solve(P)
    assert k.status == ("binding", "binding")
    rem = {"objective": [3], "a": [3]}
    warm = retrain(P, rem, warm_start=k, method="sqp")
    cold = retrain(P, rem, warm_start=None, method="auglag")
    assert warm.status == ("inactive", "binding") and warm.residual <= 1e-10
    assert float((warm.theta - cold.theta).abs().max()) < 1e-6 * float(cold.theta.abs().max())
