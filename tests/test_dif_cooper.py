"""KKTPoint.from_cooper: a model trained with Cooper gives the same DIF as one trained by `solve`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import polyproj as pp
from polyproj.adapters.dif import DIF, ConstrainedProblem, Constraint, KKTPoint, Loss, solve

cooper = pytest.importorskip("cooper")
pytestmark = pytest.mark.filterwarnings("ignore::polyproj.errors.PolyprojWarning")


def _sq(m, b):
    return (m(b[0]).squeeze(-1) - b[1]) ** 2


@pytest.fixture(scope="module")
def trained():
    from polyproj.runtime import set_torch_threads

    set_torch_threads(1)
    rng = np.random.default_rng(4)
    X = torch.as_tensor(rng.normal(size=(80, 4)))
    y = torch.as_tensor(X.numpy() @ np.array([1.0, -2.0, 0.5, 1.0]) + 0.3 * rng.normal(size=80))
    grp = torch.arange(25)
    y[grp] += 1.5
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    p0 = ConstrainedProblem(model, Loss(_sq, (X, y)))
    r0 = float(_sq(p0.wrap(solve(p0).theta), (X[grp], y[grp])).mean())
    tau = 0.7 * r0
    problem = ConstrainedProblem(model, Loss(_sq, (X, y)), [Constraint(_sq, (X[grp], y[grp]), tau=tau, name="group")])

    class GroupRisk(cooper.ConstrainedMinimizationProblem):
        def __init__(self):
            super().__init__()
            mult = cooper.multipliers.DenseMultiplier(num_constraints=1, dtype=torch.float64)
            self.group = cooper.Constraint(constraint_type=cooper.ConstraintType.INEQUALITY, multiplier=mult)

        def compute_cmp_state(self, model, X, y):
            loss = _sq(model, (X, y)).mean()
            viol = _sq(model, (X[grp], y[grp])).mean() - tau
            return cooper.CMPState(loss=loss, observed_constraints={self.group: cooper.ConstraintState(violation=viol)})

    cmp = GroupRisk()
    primal = torch.optim.SGD(model.parameters(), lr=0.05)
    dual = torch.optim.SGD(cmp.dual_parameters(), lr=0.05, maximize=True)
    opt = cooper.optim.SimultaneousOptimizer(cmp=cmp, primal_optimizers=primal, dual_optimizers=dual)
    for _ in range(4000):
        opt.roll(compute_cmp_state_kwargs={"model": model, "X": X, "y": y})
    return problem, cmp, model


def test_from_cooper_matches_solve(trained):
    problem, cmp, model = trained
    ref = solve(problem)
    assert ref.classification == {"group": "binding"}
    k = KKTPoint.from_cooper(problem, cmp, model, tol=1e-6)
    assert k.residual <= 1e-6 and k.classification == ref.classification
    np.testing.assert_allclose(k.info["from_cooper"]["lambdas"], ref.lambdas.numpy(), rtol=1e-3)
    removal = {"objective": [30, 31], "group": [2]}
    om_ref = DIF(problem, ref).delta_theta(removal).numpy()
    om = DIF(problem, k).delta_theta(removal).numpy()
    # Cooper's point is KKT to ~1e-6 (residual above); DIF moves with it to first order
    np.testing.assert_allclose(om, om_ref, atol=1e-3 * np.max(np.abs(om_ref)))
    exact = KKTPoint.from_cooper(problem, cmp, model, tol=1e-10, refine=True)
    np.testing.assert_allclose(DIF(problem, exact).delta_theta(removal).numpy(), om_ref,
                               atol=1e-8 * np.max(np.abs(om_ref)))


def test_from_cooper_names_must_match(trained):
    problem, cmp, model = trained
    other = ConstrainedProblem(model, problem.objective, [Constraint(_sq, problem.constraints[0].data, tau=1.0,
                                                                     name="grup")])
    with pytest.raises(pp.ProblemError, match="Did you mean 'grup'"):
        KKTPoint.from_cooper(other, cmp, model)


def test_a_diverged_or_implicit_cooper_multiplier_is_named():
    """A probe: a NaN multiplier (a diverged Cooper run) was reported as a missing constraint; a multiplier model
    (ImplicitMultiplier) with a parameter named weight had that parameter read as λ (7.0 for a true 1.33)."""
    torch.manual_seed(0)
    X = torch.randn(40, 3, dtype=torch.float64)
    y = X.sum(1) + 1.0
    prob = ConstrainedProblem(torch.zeros(3, dtype=torch.float64), Loss(lambda th, b: (b[0] @ th - b[1]) ** 2, (X, y)),
                              [Constraint(lambda th: th[0], None, tau=0.5, name="group")])
    theta = solve(prob).theta

    class MultModel(cooper.multipliers.ImplicitMultiplier):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.full((1,), 7.0, dtype=torch.float64))

        def forward(self):
            return torch.nn.functional.softplus(self.weight).mean()

        def post_step_(self):
            pass

    class CMP(cooper.ConstrainedMinimizationProblem):
        def __init__(self, multiplier):
            super().__init__()
            self.group = cooper.Constraint(cooper.ConstraintType.INEQUALITY, multiplier=multiplier)

        def compute_cmp_state(self):
            pass

    nan = cooper.multipliers.DenseMultiplier(init=torch.tensor([float("nan")], dtype=torch.float64))
    with pytest.raises(pp.ProblemError, match="multiplier.*'group' are not finite.*diverged"):
        KKTPoint.from_cooper(prob, CMP(nan), theta)
    with pytest.raises(pp.ProblemError, match="'group' has no explicit multiplier"):
        KKTPoint.from_cooper(prob, CMP(MultModel()), theta)
